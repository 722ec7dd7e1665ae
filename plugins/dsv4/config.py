"""Reading DeepSeek-V4 configs: which layer compresses how, and the dims its pools need.

Claims exactly the configs SGLang's ``is_deepseek_v4`` recognises
(``DeepseekV4ForCausalLM`` / ``…NextN`` first in ``architectures``), reading
the language model from ``text_config`` where a config nests one.

``compress_ratios`` names each layer's kind: ``0`` a sliding-window-only layer
(``"swa"``), ``4`` a c4 layer (one compressed row per 4 tokens, with the
lightning indexer), ``128`` a c128 layer, and DeepSeek-V4.1's low ratios ``1``
(``"c1"``) and ``2`` (``"c2"``), whose compressed rows only the layers named in
``kv_source_layer_ids`` own (SGLang's ``collect_sources_by_ratio``; the other
ratio-1/2 layers read the nearest preceding source's rows).  Real configs list one ratio per
decoder layer *and* per MTP layer (DeepSeek-V4-Flash: 43 layers + 1 MTP = 44
ratios); SGLang slices ``compress_ratios[start_layer:end_layer]``, so the
decoder layers are the first ``num_hidden_layers`` entries.

The contract the pool side reads (keep it): ``ModelSpec.architecture ==
"dsv4"``; each ``LayerSpec.kind`` is ``"swa"``, ``"c4"`` or ``"c128"``; each
layer's ``params`` holds ``compress_ratio``, ``qk_nope_head_dim``,
``qk_rope_head_dim``, ``window_size`` (the SWA page) and, on c4 layers,
``index_head_dim`` and ``index_n_heads``; ``ModelSpec.num_nextn_predict_layers``
the MTP layers.

SGLang's ``ModelConfig`` derives ``qk_nope_head_dim = head_dim -
qk_rope_head_dim`` (``head_dim`` includes the rope part) and takes the SWA
window from ``sliding_window`` (the inference-format config calls it
``window_size``); a config that states ``qk_nope_head_dim`` / ``window_size``
itself is read as stated.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpools_core.config import ConfigReader, context_length, is_deepseek_v4, model_dtype
from kvpools_core.values import LayerSpec, ModelSpec

ARCHITECTURE = "dsv4"
SWA, C4, C128 = "swa", "c4", "c128"
C1, C2 = "c1", "c2"
"""DeepSeek-V4.1's low compress ratios (SGLang 0.5.23 ``collect_sources_by_ratio``)."""
KIND_OF_RATIO = {0: SWA, 1: C1, 2: C2, 4: C4, 128: C128}
"""``compress_ratios`` entry → layer kind."""
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


def parse_dsv4_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    """The ``ModelSpec`` of a DeepSeek-V4 config; ``None`` for any other config."""
    outer = ConfigReader(config, source)
    if not is_deepseek_v4(outer):
        return None
    reader = outer.text()
    num_layers = reader.integer("num_hidden_layers")
    nextn = reader.integer("num_nextn_predict_layers", 0, minimum=0)
    ratios = _compress_ratios(reader, num_layers, nextn)
    rope = reader.integer("qk_rope_head_dim")
    nope = _qk_nope_head_dim(reader, rope)
    window_key = "window_size" if reader.has("window_size") else "sliding_window"
    if not reader.has(window_key):
        raise reader.error(
            "sliding_window",
            "is missing (and so is 'window_size')",
            "Add 'sliding_window' (the DeepSeek-V4 SWA window in tokens, 128 for V4-Flash/Pro) to the config.",
        )
    window = reader.integer(window_key)
    sources = _kv_source_layer_ids(reader)
    index: dict[str, int] = {}
    if {C1, C2, C4} & {KIND_OF_RATIO[r] for r in ratios[:num_layers]}:
        index = {
            "index_head_dim": reader.integer("index_head_dim"),
            "index_n_heads": reader.integer("index_n_heads", 0, minimum=0),
        }
    common = {"qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "window_size": window}
    layers = []
    for i, ratio in enumerate(ratios[:num_layers]):
        kind = KIND_OF_RATIO[ratio]
        params: dict[str, Any] = {"compress_ratio": ratio, **common}
        if kind in (C1, C2, C4):
            params.update(index)
        layers.append(
            LayerSpec(
                index=i,
                kind=kind,
                num_kv_heads=reader.integer("num_key_value_heads", 1),
                head_dim=nope + rope,
                v_head_dim=nope + rope,
                sliding_window=window,
                params=params,
            )
        )
    return ModelSpec(
        name=source,
        architecture=ARCHITECTURE,
        layers=layers,
        context_len=context_length(reader, _CONTEXT_KEYS),
        dtype=model_dtype(reader),
        num_attention_heads=reader.integer("num_attention_heads", 0, minimum=0),
        model_type=v41_model_type(reader, outer),
        hf_architectures=v41_architectures(outer),
        source=source,
        num_nextn_predict_layers=nextn,
        params={
            "compress_ratios": list(ratios),
            "window_size": window,
            "qk_nope_head_dim": nope,
            "qk_rope_head_dim": rope,
            "index_topk": reader.integer("index_topk", 0, minimum=0),
            "kv_source_layer_ids": list(sources),
            # vLLM 0.33's DeepSeek-V4.1 reads these too (deepseek_v41/attention.py L332-337, nvidia/model.py L1307)
            "index_source_layer_ids": list(_layer_ids(reader, "index_source_layer_ids")),
            "engram_layer_ids": list(_layer_ids(reader, "engram_layer_ids")),
            # SGLang 0.5.23's checkpoint_bundles_dspark_draft: a bundled DSpark head (dspark_* keys)
            "dspark_bundled": any(reader.has(key) or outer.has(key) for key in DSPARK_BUNDLE_KEYS),
            **index,
        },
    )


def _compress_ratios(reader: ConfigReader, num_layers: int, nextn: int) -> tuple[int, ...]:
    """``compress_ratios``: one of 0, 1, 2, 4, 128 per decoder layer (plus one per MTP layer, as real configs list)."""
    if not reader.has("compress_ratios"):
        raise reader.error(
            "compress_ratios",
            "is missing",
            "Add 'compress_ratios' (0, 1, 2, 4 or 128 per layer) to the DeepSeek-V4 config.",
        )
    raw = reader.get("compress_ratios")
    if not isinstance(raw, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in raw):
        raise reader.error("compress_ratios", "must be a list of integers", "Use 0, 1, 2, 4 or 128 per layer.")
    bad = sorted({v for v in raw if v not in KIND_OF_RATIO})
    if bad:
        raise reader.error(
            "compress_ratios",
            f"has ratio(s) {bad}; SGLang raises 'Unsupported compression ratio' (collect_sources_by_ratio): its "
            f"DeepSeek-V4 pools know 0 (SWA only), 1 and 2 (DeepSeek-V4.1), 4 (c4) and 128 (c128)",
            "Fix the value in the config.",
        )
    allowed = sorted({num_layers, num_layers + nextn})
    if len(raw) not in allowed:
        shown = " or ".join(str(n) for n in allowed)
        raise reader.error(
            "compress_ratios",
            f"has {len(raw)} entries; 'num_hidden_layers' is {num_layers} (+ {nextn} MTP layer(s)), so it needs "
            f"{shown}",
            "Give one ratio per decoder layer (and per MTP layer, as the released configs do).",
        )
    return tuple(raw)


def _kv_source_layer_ids(reader: ConfigReader) -> tuple[int, ...]:
    """``kv_source_layer_ids`` (SGLang's default ``()``): the layers that own ratio-1/2 compressed rows.

    SGLang keeps the ids in a stage whose ratio is 1 or 2 and ignores the rest (an MTP layer's id included)."""
    return _layer_ids(reader, "kv_source_layer_ids")


def _layer_ids(reader: ConfigReader, key: str) -> tuple[int, ...]:
    """A list of decoder layer ids (``()`` when the config leaves ``key`` out)."""
    if not reader.has(key):
        return ()
    raw = reader.get(key)
    if not isinstance(raw, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in raw):
        raise reader.error(key, "must be a list of layer ids", "List decoder layer indices.")
    bad = sorted({v for v in raw if v < 0})
    if bad:
        raise reader.error(key, f"has negative layer id(s) {bad}", "Use layer indices from 0.")
    return tuple(raw)


def _qk_nope_head_dim(reader: ConfigReader, rope: int) -> int:
    """``qk_nope_head_dim`` as stated, else SGLang's ``head_dim - qk_rope_head_dim``."""
    if reader.has("qk_nope_head_dim"):
        return reader.integer("qk_nope_head_dim")
    if not reader.has("head_dim"):
        raise reader.error(
            "head_dim",
            "is missing (and so is 'qk_nope_head_dim')",
            "Add 'head_dim' (nope + rope dims, 512 for DeepSeek-V4) or 'qk_nope_head_dim' to the config.",
        )
    head_dim = reader.integer("head_dim")
    if head_dim <= rope:
        raise reader.error(
            "head_dim",
            f"is {head_dim}, not above 'qk_rope_head_dim' {rope}: SGLang's qk_nope_head_dim = head_dim - "
            f"qk_rope_head_dim would be {head_dim - rope}",
            "Fix 'head_dim' (it includes the rope dims) or state 'qk_nope_head_dim'.",
        )
    return head_dim - rope


V41_MODEL_TYPE = "deepseek_v41"
V41_ARCHITECTURE = "DeepseekV41ForCausalLM"
DSPARK_BUNDLE_KEYS = ("dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids")
"""The keys ``checkpoint_bundles_dspark_draft`` (``speculative/dspark_components/dspark_config.py``) looks for."""


def v41_model_type(reader: ConfigReader, outer: ConfigReader) -> str:
    """The model type: a ``deepseek_v41`` config's is ``deepseek_v41`` whatever its ``text_config`` says (SGLang
    0.5.23's ``normalize_deepseek_v41_config`` drops the text config's ``model_type`` and sets ``deepseek_v41``)."""
    if outer.string("model_type") == V41_MODEL_TYPE:
        return V41_MODEL_TYPE
    return reader.string("model_type") or outer.string("model_type")


def v41_architectures(outer: ConfigReader) -> tuple[str, ...]:
    """``architectures`` as SGLang 0.5.23 sees them: a ``deepseek_v41`` config naming ``["DeepseekV41ForCausalLM"]``
    serves as ``["DeepseekV4ForCausalLM"]`` (``normalize_deepseek_v41_config``; vLLM 0.33 serves either name as
    its ``DeepseekV41ForCausalLM`` for that model type, :mod:`.vllm_v41`).  Any other config keeps its list."""
    architectures = tuple(outer.string_list("architectures"))
    if outer.string("model_type") == V41_MODEL_TYPE and architectures == (V41_ARCHITECTURE,):
        return ("DeepseekV4ForCausalLM",)
    return architectures
