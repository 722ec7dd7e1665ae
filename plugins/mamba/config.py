"""Reading hybrid linear-attention configs: which layers keep KV, which keep a recurrent state, its geometry.

Five families, each read the way SGLang's config class reads it
(``configs/qwen3_next.py``, ``qwen3_5.py``, ``nemotron_h.py``, ``jamba.py``,
``falcon_h1.py``, ``granitemoehybrid.py``):

* Gated DeltaNet (Qwen3-Next, Qwen3.5): ``layer_types`` (``linear_attention`` /
  ``full_attention``, in ``text_config`` for the multimodal wrappers) or
  ``full_attention_interval`` (layer ``i`` is full attention when
  ``(i + 1) % interval == 0``); state from the ``linear_*`` fields.
* Mamba2 (Nemotron-H): ``hybrid_override_pattern`` (``M`` mamba, ``*``
  attention, ``-`` MLP and ``E`` MoE keep no cache) or ``layers_block_type``.
* Mamba-1 (Jamba): attention where ``(i - attn_layer_offset) % attn_layer_period == 0``.
* Falcon-H1: a parallel hybrid, every layer keeps attention KV *and* a Mamba2 state.
* Granite-4.0-H: ``layer_types`` of ``mamba`` / ``attention``, Mamba2 state.
* Kimi-Linear (``configs/kimi_linear.py``): KDA layers and MLA full-attention
  layers; ``linear_attn_config.kda_layers`` lists the KDA layers *1-based*
  (layer ``i`` is KDA when ``i + 1`` is listed, every other layer is MLA), the
  state from ``linear_attn_config``'s ``num_heads``, ``head_dim`` and
  ``short_conv_kernel_size``, the latent from ``kv_lora_rank`` and ``qk_rope_head_dim``.

A field that decides the state's size is never guessed: when it is missing the
config is rejected with a message naming it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvpools_core.config import (
    LAYERS,
    ConfigReader,
    context_length,
    derived_head_dim,
    describe,
    grouped_kv_heads,
    is_deepseek_dsa,
    model_dtype,
)
from kvpools_core.parts.latent import MLADims
from kvpools_core.values import LayerSpec, ModelSpec

from .dsa import GLM5_NEXT, dsa_full_side
from .qsa import parse_qsa_profile

ATTENTION = "attention"
"""A full-attention layer: K and V for every token."""
LINEAR_ATTENTION = "linear_attention"
"""A Gated DeltaNet layer: a fixed-size recurrent state per request."""
MAMBA = "mamba"
"""A Mamba2 or Mamba-1 layer: a fixed-size conv + SSM state per request."""
ATTENTION_MAMBA = "attention_mamba"
"""A parallel-hybrid layer (Falcon-H1): attention KV and a Mamba2 state."""
MLA_ATTENTION = "mla_attention"
"""A full-attention MLA layer (Kimi-Linear): one latent row per token, whatever the TP."""
NO_CACHE = "none"
"""An MLP / MoE block that caches nothing (Nemotron-H ``-`` and ``E``)."""

KV_KINDS = frozenset({ATTENTION, ATTENTION_MAMBA, MLA_ATTENTION})
STATE_KINDS = frozenset({LINEAR_ATTENTION, MAMBA, ATTENTION_MAMBA})

GDN, MAMBA2, MAMBA1, KDA = "gdn", "mamba2", "mamba1", "kda"
"""The recurrent mixers: their state shapes are in :mod:`.state`."""

_FAMILY_BY_MODEL_TYPE = {
    "qwen3_next": "qwen_gdn",
    "qwen3_5": "qwen_gdn",
    "qwen3_5_text": "qwen_gdn",
    "qwen3_5_moe": "qwen_gdn",
    "qwen3_5_moe_text": "qwen_gdn",
    # Qwen4ExpTextConfig subclasses Qwen3NextConfig (sglang/srt/configs/qwen4_exp.py): the same GDN state, plus
    # the PLE request state (:func:`_ple_geometry`).
    "qwen4_exp": "qwen_gdn",
    "qwen4_exp_text": "qwen_gdn",
    "nemotron_h": "nemotron_h",
    "jamba": "jamba",
    "falcon_h1": "falcon_h1",
    "granitemoehybrid": "granite",
    "kimi_linear": "kimi_linear",
    "glm5_next": "glm5_next",
    "glm5_next_text": "glm5_next",
}
_FAMILY_BY_ARCHITECTURE = {
    "Qwen3NextForCausalLM": "qwen_gdn",
    "Qwen3_5ForCausalLM": "qwen_gdn",
    "Qwen3_5MoeForCausalLM": "qwen_gdn",
    "Qwen3_5ForConditionalGeneration": "qwen_gdn",
    "Qwen3_5MoeForConditionalGeneration": "qwen_gdn",
    "Qwen4ExpForConditionalGeneration": "qwen_gdn",
    "NemotronHForCausalLM": "nemotron_h",
    "JambaForCausalLM": "jamba",
    "FalconH1ForCausalLM": "falcon_h1",
    "GraniteMoeHybridForCausalLM": "granite",
    "KimiLinearForCausalLM": "kimi_linear",
    "Glm5NextForConditionalGeneration": "glm5_next",
}
_MIXER = {
    "qwen_gdn": GDN,
    "nemotron_h": MAMBA2,
    "jamba": MAMBA1,
    "falcon_h1": MAMBA2,
    "granite": MAMBA2,
    "kimi_linear": KDA,
    "glm5_next": KDA,
}
# Families whose full-attention layers are MLA (SGLang's ``use_mla_backend``): one latent row per token.
MLA_FAMILIES = frozenset({"kimi_linear", "glm5_next"})
# Families whose SGLang config class passes itself to ``mamba2_state_dtype`` (so ``mamba_ssm_dtype`` counts).
_READS_SSM_DTYPE = frozenset({"qwen_gdn", "nemotron_h", "jamba"})
_SSM_DTYPES = ("float32", "bfloat16", "float16")

_LAYER_TYPE_KINDS = {
    "full_attention": ATTENTION,
    "attention": ATTENTION,
    "linear_attention": LINEAR_ATTENTION,
    "mamba": MAMBA,
    "mlp": NO_CACHE,
    "moe": NO_CACHE,
    # Qwen4-Exp's QSA layers are attention (Qwen4ExpTextConfig.layers_block_type) with a QSA profile (.qsa)
    "qwen_sparse_attention": ATTENTION,
    "indexed_attention": ATTENTION,
}
_SWA_LAYER_TYPE = "sliding_attention"
# Qwen4-Exp's QSA layer types (``Qwen4ExpTextConfig.layers_block_type`` maps them to attention; SGLang then builds a
# ``QSATokenToKVPool`` from ``parse_qsa_profile``, ``layers/attention/qsa/config.py``: :mod:`.qsa`).
_QSA_LAYER_TYPES = ("qwen_sparse_attention", "indexed_attention")
QWEN4_EXP_MODEL_TYPES = frozenset({"qwen4_exp", "qwen4_exp_text"})
"""The model types whose text config is SGLang's ``Qwen4ExpTextConfig`` (``_get_ple_req_pool_kwargs``' test)."""
_LINEAR_ATTN_FIX = (
    "Kimi-Linear's KDA layers and state geometry are read from it (kda_layers, full_attn_layers, num_heads, "
    "head_dim, short_conv_kernel_size)."
)
_PATTERN_KINDS = {"M": MAMBA, "*": ATTENTION, "-": NO_CACHE, "E": NO_CACHE}
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
_KV_HEAD_KEYS = ("num_key_value_heads", "num_kv_heads")


def hybrid_family(config: Mapping[str, Any], source: str) -> str | None:
    """The hybrid family a config belongs to, or ``None`` when it is not a hybrid this plugin owns.

    Known model types and architectures first, then the unambiguous layout
    fields (a ``layer_types`` with sliding-window entries is another plugin's).
    """
    outer = ConfigReader(config, source)
    reader = outer.text()
    kinds = _listed_kinds(reader)
    if kinds is not None and _SWA_LAYER_TYPE in kinds:
        return None  # a sliding-window layer list: the swa plugin's
    for candidate in (reader, outer):
        family = _FAMILY_BY_MODEL_TYPE.get(candidate.string("model_type"))
        if family:
            return family
    architectures = outer.string_list("architectures") or reader.string_list("architectures")
    if architectures and architectures[0] in _FAMILY_BY_ARCHITECTURE:
        return _FAMILY_BY_ARCHITECTURE[architectures[0]]
    if kinds is not None and not set(kinds) <= set(_LAYER_TYPE_KINDS):
        return None  # layer types no hybrid family here knows, in a config no family here claims
    states = kinds is not None and bool({"linear_attention", "mamba"} & set(kinds))
    if reader.has("linear_num_value_heads") and (states or reader.has("full_attention_interval")):
        return "qwen_gdn"
    if reader.has("hybrid_override_pattern") or (states and reader.has("mamba_num_heads")):
        return "nemotron_h"
    if reader.has("attn_layer_period") and reader.has("mamba_d_state"):
        return "jamba"
    if states and reader.has("mamba_n_heads"):
        return "granite"
    if reader.has("linear_attn_config"):
        return "kimi_linear"
    return None


def hybrid_model_spec(config: Mapping[str, Any], source: str, *, architecture: str, family: str) -> ModelSpec:
    """The :class:`ModelSpec` of a hybrid config: per-layer kinds, KV geometry, and the state geometry in ``params``."""
    outer = ConfigReader(config, source)
    reader = outer.text()
    qsa = _qsa_profile(reader)
    kinds = _layer_kinds(reader, family)
    if not any(kind in STATE_KINDS for kind in kinds):
        raise reader.error(
            _layout_field(reader, family),
            "names no linear-attention or mamba layer",
            "A model without recurrent layers is not a hybrid; check the layer layout.",
        )
    if not any(kind in KV_KINDS for kind in kinds):
        raise reader.error(
            _layout_field(reader, family),
            "names no full-attention layer",
            "kvpools sizes hybrids by their full-attention KV (SGLang divides by it); pure recurrent models are "
            "not supported.",
        )
    if reader.has("num_hidden_layers") and len(kinds) != reader.integer("num_hidden_layers"):
        raise reader.error(
            _layout_field(reader, family),
            f"describes {len(kinds)} layers but num_hidden_layers is {reader.integer('num_hidden_layers')}",
            "Give one entry per layer.",
        )
    heads = reader.integer("num_attention_heads")
    layers = _mla_layers(reader, kinds, family) if family in MLA_FAMILIES else _mha_layers(reader, kinds, heads)
    model_params: dict[str, Any] = {}
    if family == GLM5_NEXT and is_deepseek_dsa(outer):  # SGLang's HybridLinearKVPool(use_dsa=True) (.dsa)
        layers, model_params = dsa_full_side(outer, reader, layers)
    dtype_reader = reader if reader.has("torch_dtype") or reader.has("dtype") else outer
    return ModelSpec(
        name=source,
        architecture=architecture,
        layers=layers,
        context_len=context_length(reader, _CONTEXT_KEYS),
        dtype=model_dtype(dtype_reader),
        num_attention_heads=heads,
        model_type=reader.string("model_type") or outer.string("model_type"),
        hf_architectures=outer.string_list("architectures") or reader.string_list("architectures"),
        source=source,
        num_nextn_predict_layers=_nextn_layers(reader),
        is_multimodal=reader is not outer,
        params={
            "family": family,
            "mixer": _MIXER[family],
            "state": _state_geometry(reader, family),
            "ssm_dtype": _ssm_dtype(reader, family),
            # Falcon-H1 shards its state over the whole TP group, the others over attention TP.
            "state_tp": "tensor" if family == "falcon_h1" else "attention",
            "vllm": _vllm_readings(outer, reader, family),
            "ple": _ple_geometry(outer, reader, len(kinds)),
            "qsa": qsa,
            "trtllm": _trtllm_readings(config, source),
            **model_params,
        },
    )


def _trtllm_readings(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    from .trtllm_config import trtllm_readings  # the TensorRT-LLM answer's own readings (plugins/mamba/trtllm.py)

    return trtllm_readings(config, source)


def _qsa_profile(reader: ConfigReader) -> dict[str, int] | None:
    """A QSA profile (``indexer_n_heads``, SGLang's ``parse_qsa_profile``) gets SGLang's QSA pool (:mod:`.qsa`);
    QSA layers (Qwen4-Exp's ``qwen_sparse_attention`` / ``indexed_attention``) without one are refused."""
    profile = parse_qsa_profile(reader)
    kinds = _listed_kinds(reader)
    qsa = sorted(set(kinds or ()) & set(_QSA_LAYER_TYPES))
    if qsa and profile is None:
        raise reader.error(
            _layout_field(reader, "qwen_gdn"),
            f"names {', '.join(qsa)} layer(s)",
            "kvpools does not model QSA (Qwen sparse attention) layers without a QSA profile: SGLang 0.5.23 gives "
            "them a QSATokenToKVPool from the text config's indexer_* fields (layers/attention/qsa/config.py), "
            "which this config lacks; add them.",
        )
    return profile


def _ple_geometry(outer: ConfigReader, reader: ConfigReader, num_layers: int) -> dict[str, Any] | None:
    """Qwen4-Exp's PLE request state (``Qwen4ExpTextConfig``, ``sglang/srt/configs/qwen4_exp.py``), or None.

    ``short_conv_layer_ids`` = the sorted 1-based ``ple_layer_ids`` minus one; each such layer keeps a short-conv
    window of ``(hidden_size x hc_count, (ple_conv_kernel_size - 1) x ngram_size)`` per state slot; the request
    keeps ``ngram_size - 1`` int64 token ids of n-gram context (``ngram_context_len``).  Defaults are the class's:
    ``hc_count`` 4 (which must exceed 1), ``ple_conv_kernel_size`` 4, ``ngram_size`` 3, no PLE layers.
    """
    if (reader.string("model_type") or outer.string("model_type")) not in QWEN4_EXP_MODEL_TYPES:
        return None
    hc_count = reader.integer("hc_count", 4, minimum=0)
    if hc_count <= 1:
        raise reader.error(
            "hc_count", f"is {hc_count}", "SGLang's Qwen4ExpTextConfig requires hc_count > 1 (it raises otherwise)."
        )
    ple_ids = reader.integer_list(
        "ple_layer_ids", minimum=1, maximum=num_layers, fix=f"List the PLE layers 1-based (1..{num_layers})."
    )
    ngram_size = reader.integer("ngram_size", 3, minimum=0)
    kernel = reader.integer("ple_conv_kernel_size", 4, minimum=1)
    short_conv = sorted({i - 1 for i in ple_ids})
    return {
        "short_conv_layer_ids": short_conv,
        "channels": reader.integer("hidden_size") * hc_count,
        "state_len": (kernel - 1) * ngram_size,
        "ngram_context_len": max(ngram_size - 1, 0) if ple_ids else 0,
    }


def _mha_layers(reader: ConfigReader, kinds: Sequence[str], heads: int) -> list[LayerSpec]:
    head_dim = _head_dim(reader, heads)
    kv_heads = grouped_kv_heads(reader, heads, _KV_HEAD_KEYS)
    return [
        LayerSpec(
            index=i,
            kind=kind,
            num_kv_heads=kv_heads if kind in KV_KINDS else 0,
            head_dim=head_dim if kind in KV_KINDS else 0,
            v_head_dim=head_dim if kind in KV_KINDS else 0,
        )
        for i, kind in enumerate(kinds)
    ]


def _mla_layers(reader: ConfigReader, kinds: Sequence[str], family: str) -> list[LayerSpec]:
    """MLA full-attention layers in the parts library's latent convention (key row = latent + rope, value = latent).

    GLM5-Next's ``Glm5NextTextConfig`` defaults ``kv_lora_rank`` 512 and ``qk_rope_head_dim`` 0."""
    if family == GLM5_NEXT:
        dims = MLADims(reader.integer("kv_lora_rank", 512), reader.integer("qk_rope_head_dim", 0, minimum=0))
    else:
        dims = MLADims(reader.integer("kv_lora_rank"), reader.integer("qk_rope_head_dim"))
    params = {"kv_lora_rank": dims.kv_lora_rank, "qk_rope_head_dim": dims.qk_rope_head_dim}
    return [
        LayerSpec(
            index=i, kind=kind, num_kv_heads=1, head_dim=dims.kv_cache_dim, v_head_dim=dims.kv_lora_rank, params=params
        )
        if kind in KV_KINDS
        else LayerSpec(index=i, kind=kind, num_kv_heads=0, head_dim=0, v_head_dim=0)
        for i, kind in enumerate(kinds)
    ]


# ---------------------------------------------------------------------------
# layer layout
# ---------------------------------------------------------------------------


def _listed_kinds(reader: ConfigReader) -> tuple[str, ...] | None:
    for key in ("layer_types", "layers_block_type"):
        if reader.has(key):
            return reader.string_list(key)
    return None


def _layout_field(reader: ConfigReader, family: str) -> str:
    if family == "kimi_linear" or (family == GLM5_NEXT and reader.has("linear_attn_config")):
        return "linear_attn_config"
    for key in ("layer_types", "layers_block_type", "hybrid_override_pattern", "full_attention_interval"):
        if reader.has(key):
            return key
    return "attn_layer_period" if family == "jamba" else "layer_types"


def _layer_kinds(reader: ConfigReader, family: str) -> list[str]:
    """Every layer's kind, from the first layout field the config has."""
    if family == "falcon_h1":
        if reader.has("attn_layer_indices"):
            raise reader.error(
                "attn_layer_indices",
                f"is {describe(reader.get('attn_layer_indices'))}",
                "SGLang's Falcon-H1 keeps attention and a Mamba2 state in every layer; a partial attention "
                "layout is not supported.",
            )
        return [ATTENTION_MAMBA] * reader.integer("num_hidden_layers")
    if family == "kimi_linear":
        return _kimi_linear_kinds(reader)
    if family == GLM5_NEXT:
        return _glm5_next_kinds(reader)
    state = LINEAR_ATTENTION if family == "qwen_gdn" else MAMBA
    for key in ("layer_types", "layers_block_type"):
        if reader.has(key):
            return _kinds_from_list(reader, key, state)
    if reader.has("hybrid_override_pattern"):
        pattern = reader.string("hybrid_override_pattern")
        if len(pattern) > LAYERS.maximum:
            raise reader.error(
                "hybrid_override_pattern",
                f"has {len(pattern):,} characters, above {LAYERS.maximum:,}, kvpools' bound for a layer count",
                "Fix the value in the config.",
            )
        bad = sorted(set(pattern) - set(_PATTERN_KINDS))
        if bad or not pattern:
            raise reader.error(
                "hybrid_override_pattern",
                f"is {pattern!r}" + (f" with unknown character(s) {bad}" if bad else ""),
                "Use 'M' (mamba), '*' (attention), '-' (MLP) and 'E' (MoE), one per layer.",
            )
        return [_PATTERN_KINDS[c] for c in pattern]
    if reader.has("full_attention_interval"):
        interval = reader.integer("full_attention_interval")
        return [ATTENTION if (i + 1) % interval == 0 else state for i in range(reader.integer("num_hidden_layers"))]
    if reader.has("attn_layer_period"):
        period = reader.integer("attn_layer_period")
        offset = reader.integer("attn_layer_offset", minimum=0)
        return [ATTENTION if (i - offset) % period == 0 else state for i in range(reader.integer("num_hidden_layers"))]
    needed = "attn_layer_period" if family == "jamba" else "layer_types"
    raise reader.error(
        needed,
        "is missing",
        "kvpools cannot tell which layers keep KV and which keep a recurrent state without it "
        "(layer_types, layers_block_type, hybrid_override_pattern, full_attention_interval or "
        "attn_layer_period/attn_layer_offset).",
    )


def _kimi_linear_kinds(reader: ConfigReader) -> list[str]:
    """``KimiLinearConfig.is_kda_layer``: layer ``i`` is KDA when ``i + 1`` is in ``kda_layers``, else MLA."""
    linear = reader.child("linear_attn_config", _LINEAR_ATTN_FIX)
    num_layers = reader.integer("num_hidden_layers")
    kda, full = (_one_based_layers(linear, key, num_layers) for key in ("kda_layers", "full_attn_layers"))
    if kda & full:
        raise linear.error(
            "kda_layers",
            f"and full_attn_layers both list layer(s) {sorted(kda & full)}",
            "A layer is either KDA or full attention; fix the config.",
        )
    return [LINEAR_ATTENTION if i + 1 in kda else MLA_ATTENTION for i in range(num_layers)]


def _glm5_next_kinds(reader: ConfigReader) -> list[str]:
    """``Glm5NextTextConfig.is_kda_layer``: layer ``i`` (0-based, unlike Kimi-Linear) is KDA when it is in
    ``linear_attn_config.kda_layers``; without ``linear_attn_config`` the KDA layers are the ``layer_types``
    entries ``"linear_attention"``, else every layer with ``i % 4 != 3``; every other layer is full attention."""
    num_layers = reader.integer("num_hidden_layers", 45)
    if reader.has("linear_attn_config"):
        linear = reader.child("linear_attn_config", _LINEAR_ATTN_FIX)
        kda = set(
            linear.integer_list(
                "kda_layers", minimum=0, maximum=num_layers - 1, fix=f"List the layers 0-based (0..{num_layers - 1})."
            )
        )
    elif reader.has("layer_types"):
        kda = {i for i, kind in enumerate(reader.string_list("layer_types")) if kind == "linear_attention"}
    else:
        kda = {i for i in range(num_layers) if i % 4 != 3}
    return [LINEAR_ATTENTION if i in kda else MLA_ATTENTION for i in range(num_layers)]


def _one_based_layers(linear: ConfigReader, key: str, num_layers: int) -> set[int]:
    fix = f"List the layers 1-based (1..{num_layers}), as Kimi-Linear's config.json does."
    if not linear.has(key):
        raise linear.error(key, "is missing", fix)
    values = linear.integer_list(key, minimum=-LAYERS.maximum, maximum=LAYERS.maximum, fix=fix)
    bad = sorted({v for v in values if not 1 <= v <= num_layers})
    if bad:
        raise linear.error(key, f"has layer number(s) {describe(bad)} outside 1..{num_layers}", fix)
    return set(values)


def _kinds_from_list(reader: ConfigReader, key: str, state: str) -> list[str]:
    values = reader.string_list(key, choices=_LAYER_TYPE_KINDS)
    if not values:
        raise reader.error(key, "is empty", "Give one layer type per layer.")
    return [state if _LAYER_TYPE_KINDS[v] in (LINEAR_ATTENTION, MAMBA) else _LAYER_TYPE_KINDS[v] for v in values]


# ---------------------------------------------------------------------------
# the recurrent state's geometry (unsharded; :mod:`.state` shards it per TP rank)
# ---------------------------------------------------------------------------


def _state_geometry(reader: ConfigReader, family: str) -> dict[str, int]:
    if family == GLM5_NEXT and not reader.has("linear_attn_config"):  # Glm5NextTextConfig's own defaults
        return {
            "num_heads": reader.integer("linear_num_heads", 64),
            "head_dim": reader.integer("linear_head_dim", 128),
            "conv_kernel": reader.integer("linear_conv_kernel_dim", 4, minimum=2),
        }
    if family in MLA_FAMILIES:  # KimiLinearConfig.mamba2_cache_params: K heads and dims default to V's
        linear = reader.child("linear_attn_config", _LINEAR_ATTN_FIX)
        return {
            "num_heads": linear.integer("num_heads"),
            "head_dim": linear.integer("head_dim"),
            "conv_kernel": linear.integer("short_conv_kernel_size", minimum=2),
        }
    if family == "qwen_gdn":
        return {
            "num_k_heads": reader.integer("linear_num_key_heads"),
            "num_v_heads": reader.integer("linear_num_value_heads"),
            "k_head_dim": reader.integer("linear_key_head_dim"),
            "v_head_dim": reader.integer("linear_value_head_dim"),
            "conv_kernel": reader.integer("linear_conv_kernel_dim", minimum=2),
        }
    if family == "jamba":
        return {
            "intermediate_size": reader.integer("mamba_expand") * reader.integer("hidden_size"),
            "state_size": reader.integer("mamba_d_state"),
            "conv_kernel": reader.integer("mamba_d_conv", minimum=2),
        }
    if family == "nemotron_h":
        heads = reader.integer("mamba_num_heads")
        head_dim = reader.integer("mamba_head_dim")
        return {
            "intermediate_size": heads * head_dim,
            "n_groups": _first_integer(reader, ("n_groups", "mamba_n_groups")),
            "num_heads": heads,
            "head_dim": head_dim,
            "state_size": reader.integer("ssm_state_size"),
            "conv_kernel": _first_integer(reader, ("conv_kernel", "mamba_d_conv"), minimum=2),
        }
    heads = reader.integer("mamba_n_heads")
    if family == "falcon_h1":
        intermediate, head_dim = _falcon_inner(reader, heads)
    else:  # granite: the intermediate size is mamba_expand x hidden_size and must split into the heads
        intermediate = reader.integer("mamba_expand") * reader.integer("hidden_size")
        head_dim = reader.integer("mamba_d_head")
        if head_dim * heads != intermediate:
            raise reader.error(
                "mamba_d_head",
                f"is {head_dim}, but mamba_d_head x mamba_n_heads ({heads}) must equal mamba_expand x hidden_size "
                f"({intermediate})",
                "Fix the config.",
            )
    return {
        "intermediate_size": intermediate,
        "n_groups": reader.integer("mamba_n_groups"),
        "num_heads": heads,
        "head_dim": head_dim,
        "state_size": reader.integer("mamba_d_state"),
        "conv_kernel": reader.integer("mamba_d_conv", minimum=2),
    }


def _falcon_inner(reader: ConfigReader, heads: int) -> tuple[int, int]:
    """Falcon-H1's Mamba2 inner size and head dim: ``mamba_d_ssm`` = heads x ``mamba_d_head``.

    Either field gives the other exactly; ``mamba_expand x hidden_size`` does
    not (Falcon-H1-0.5B: 24 x 64 = 1536, not 2 x 1024), so it is never used.
    """
    d_ssm = reader.optional_integer("mamba_d_ssm")
    d_head = reader.get("mamba_d_head")
    if d_head == "auto" or d_head is None:
        if d_ssm is None:
            raise reader.error(
                "mamba_d_ssm",
                "is missing (and mamba_d_head does not give it)",
                "Add mamba_d_ssm (= mamba_n_heads x mamba_d_head) from the checkpoint's config.json; "
                "kvpools does not derive it from mamba_expand x hidden_size.",
            )
        if d_ssm % heads:
            raise reader.error("mamba_d_ssm", f"({d_ssm}) is not divisible by mamba_n_heads ({heads})", "Fix it.")
        return d_ssm, d_ssm // heads
    head_dim = reader.integer("mamba_d_head")
    if d_ssm is not None and d_ssm != head_dim * heads:
        raise reader.error(
            "mamba_d_ssm",
            f"is {d_ssm}, but mamba_n_heads x mamba_d_head is {heads} x {head_dim} = {heads * head_dim}",
            "Fix the config.",
        )
    return head_dim * heads, head_dim


def _ssm_dtype(reader: ConfigReader, family: str) -> str | None:
    """The config's ``mamba_ssm_dtype`` where SGLang reads it (``mamba2_state_dtype(config)``), else ``None``."""
    if family not in _READS_SSM_DTYPE or not reader.has("mamba_ssm_dtype"):
        return None
    value = reader.string("mamba_ssm_dtype")
    if value not in _SSM_DTYPES:
        raise reader.error("mamba_ssm_dtype", f"is {value!r}", f"Use one of {', '.join(_SSM_DTYPES)}.")
    return value


# Where vLLM 0.33 reads the SSM state dtype (``model_executor/models/config.py``): NemotronH's
# ``mamba_ssm_cache_dtype`` (default float32, L812-839), Qwen3.5's ``mamba_ssm_dtype`` (L953-978); the other
# families keep ``--mamba-ssm-cache-dtype auto``, the conv state's (model) dtype.
_VLLM_SSM_DTYPE_KEYS = {"nemotron_h": ("mamba_ssm_cache_dtype", "float32")}
_QWEN3_5_ARCHITECTURES = frozenset(
    {
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
    }
)
_VLLM_SSM_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _vllm_readings(outer: ConfigReader, reader: ConfigReader, family: str) -> dict[str, Any]:
    """The config fields vLLM reads differently from SGLang, for ``--accounting vllm`` (``plugins/mamba/vllm.py``).

    ``ssm_dtype``: the ``mamba_ssm_cache_dtype`` vLLM's config hooks set (``"auto"``: the conv state's dtype).
    ``d_ssm``: Falcon-H1's ``mamba_d_ssm`` as given (``None`` when absent: vLLM then reads transformers'
    default, which kvpools does not guess).
    ``mla_use_nope`` / ``use_full_rank_gate``: Kimi-Linear's switches that pick (or refuse) vLLM's layer classes
    (``KimiLinearConfig`` default ``mla_use_nope=False``; ``linear_attn_config.use_full_rank_gate`` default False,
    ``models/kimi_k3/nvidia/model.py`` L716-742).
    """
    architectures = outer.string_list("architectures") or reader.string_list("architectures")
    key, default = _VLLM_SSM_DTYPE_KEYS.get(family, ("", "auto"))
    if family == "qwen_gdn" and architectures and architectures[0] in _QWEN3_5_ARCHITECTURES:
        key, default = "mamba_ssm_dtype", "auto"
    ssm_dtype = default
    if key and reader.has(key):
        ssm_dtype = reader.string(key)
        if ssm_dtype not in _VLLM_SSM_DTYPES:
            raise reader.error(key, f"is {ssm_dtype!r}", f"Use one of {', '.join(_VLLM_SSM_DTYPES)}.")
    readings: dict[str, Any] = {
        "ssm_dtype": ssm_dtype,
        "d_ssm": reader.optional_integer("mamba_d_ssm") if family == "falcon_h1" else None,
        "architecture": architectures[0] if architectures else "",
    }
    if family == "kimi_linear":
        linear = reader.child("linear_attn_config", _LINEAR_ATTN_FIX)
        readings["mla_use_nope"] = reader.boolean("mla_use_nope", False)
        readings["use_full_rank_gate"] = linear.boolean("use_full_rank_gate", False)
    return readings


# ---------------------------------------------------------------------------
# small readers
# ---------------------------------------------------------------------------


def _first_integer(reader: ConfigReader, keys: Sequence[str], *, minimum: int = 1) -> int:
    for key in keys:
        if reader.has(key):
            return reader.integer(key, minimum=minimum)
    raise reader.error(keys[0], "is missing", f"Add {keys[0]!r} (or {', '.join(map(repr, keys[1:]))}) to the config.")


def _head_dim(reader: ConfigReader, heads: int) -> int:
    for key in ("head_dim", "attention_head_dim"):
        if reader.has(key):
            return reader.integer(key)
    return derived_head_dim(reader, heads)


def _nextn_layers(reader: ConfigReader) -> int:
    for key in ("num_nextn_predict_layers", "mtp_num_hidden_layers"):
        if reader.has(key):
            return reader.integer(key, minimum=0)
    return 0
