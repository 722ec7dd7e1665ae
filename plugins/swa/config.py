"""Reading which layers slide, and what each layer stores, from every form real configs use.

Forms, in the order they are tried (the first that applies decides):

* Llama-4 (``model_type`` ``llama4`` / ``llama4_text`` with ``attention_chunk_size``): SGLang's fixed split,
  layer ``i`` full when ``(i + 1) % 4 == 0``, the others chunked local attention with the chunk as the window.
* ``layer_types`` (gpt-oss, Gemma-3/4, Step-3.5): ``"sliding_attention"`` /
  ``"full_attention"`` per layer; any other entry (``linear_attention``,
  mamba) belongs to another plugin.
* ``hybrid_layer_pattern`` (MiMo-V2-Flash): ``1`` = SWA, ``0`` = full.
* ``sliding_window_pattern`` (Gemma-3), or the family's fixed pattern when
  the config states none (transformers' defaults: Gemma-2 alternates, even
  layers slide; Gemma-3 makes every 6th layer full): layer ``i`` is full when
  ``(i + 1) % pattern == 0``.
* Qwen-style ``use_sliding_window: true``: layers from ``max_window_layers`` on slide.
* A ``sliding_window`` on a dense family with no layer list: every layer
  slides (Mistral-7B-v0.1, "all-SWA").

Geometry: full layers use ``num_key_value_heads`` / ``head_dim`` /
``v_head_dim``; SWA layers use ``swa_num_key_value_heads`` / ``swa_head_dim`` /
``swa_v_head_dim`` when present (MiMo-V2-Flash; absent ones follow the full
layers' ``num_key_value_heads`` / ``head_dim`` / ``v_head_dim``, as MiMo's own config class).  Gemma-4's full layers
use ``global_head_dim`` for K and V and, with ``attention_k_eq_v``,
``num_global_key_value_heads``.  ``attention_k_eq_v`` ties the K and V
*projections*, not the cached values: K is normed and rotated, V only
normed, so both are cached and both are charged.

Hybrid MLA-SWA (SGLang's ``_build_hybrid_mla_swa_kv_pool``): a config with an
MLA latent (``kv_lora_rank``, ``qk_rope_head_dim``) and an explicit layer list
(``layer_types`` or ``hybrid_layer_pattern``).  Full layers cache the MLA
latent row, or DSA's row and indexer key when SGLang's ``is_deepseek_dsa``
says so; sliding layers cache an MLA row of their own dims
(``swa_kv_lora_rank`` / ``swa_qk_rope_head_dim``, absent ones follow the full
layers', as the Dots3 config classes do).  Layers follow the parts library's
latent convention (:func:`kvpools_core.parts.latent.latent_model_spec`: one
"head" of ``kv_lora_rank + qk_rope_head_dim``, the latent dims in
``params``); ``params["latent"]`` names the full layers' storage.  The
``mla`` and ``dsa`` plugins decline these configs (``has_mla_latent``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvpools_core.config import (
    ConfigReader,
    context_length,
    derived_head_dim,
    describe,
    grouped_kv_heads,
    is_deepseek_dsa,
    is_deepseek_v4,
    model_dtype,
    sliding_window_active,
)
from kvpools_core.parts.latent import MLADims
from kvpools_core.values import LayerSpec, ModelSpec

ARCHITECTURE = "swa"
FULL = "attention"
SLIDING = "sliding_attention"

FAMILY_PATTERNS = {"gemma2": 2, "gemma3": 6, "gemma3_text": 6}
"""transformers' fixed sliding pattern of families whose configs may state none."""
LLAMA4_MODEL_TYPES = frozenset({"llama4", "llama4_text"})
"""Llama-4: chunked local attention in three of every four layers (``attention_chunk_size``), full attention in
every fourth; SGLang 0.5.23 serves ``Llama4ForConditionalGeneration`` with hybrid SWA pools whose layer split is
fixed (``get_hybrid_layer_ids``, configs/model_config.py L2705-2711) and whose window is the chunk size
(``sliding_window_size = attention_chunk_size``, model_executor/model_runner_components/load_model_utils.py
L152-153)."""
FAMILY_CONTEXT = {"gemma3": 131072, "gemma3_text": 131072}
"""transformers' default ``max_position_embeddings`` of families whose sparse configs omit it."""
WINDOW_LAYER_FAMILIES = frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "mimo"})
"""Families whose ``use_sliding_window`` slides the layers from ``max_window_layers`` on."""
ALL_SWA_FAMILIES = frozenset(
    {"mistral", "mixtral", "llama", "phi3", "starcoder2", "gemma", "internlm2", "granite", "olmo2", "exaone", "glm4"}
)
"""Dense families where a ``sliding_window`` with no layer list slides every layer."""
_FOREIGN = ("compress_ratios", "hybrid_override_pattern", "layers_block_type", "linear_attn_config")
"""Markers of configs other plugins own (DeepSeek-V4, mamba and Kimi-Linear hybrids)."""
_LATENT = "kv_lora_rank"
"""An MLA latent: the hybrid MLA-SWA form with an explicit layer list, else the ``mla`` / ``dsa`` plugins'."""
_EXPLICIT_PATTERNS = ("layer_types", "hybrid_layer_pattern")
LATENT = "latent"
"""``ModelSpec.params`` key of a hybrid MLA-SWA model: the full layers' storage, ``"mla"`` or ``"dsa"``."""
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
_LAYER_TYPES = {"sliding_attention": True, "full_attention": False}

SGLANG_HYBRID_SWA_ARCHITECTURES = frozenset(
    {
        "BeamForCausalLM",
        "Llama4ForConditionalGeneration",
        "GptOssForCausalLM",
        "GraniteSWAForCausalLM",
        "GraniteMoeSWAForCausalLM",
        "IQuestQ1ForCausalLM",
        "MiMoV2ForCausalLM",
        "MiMoV2FlashForCausalLM",
        "Step3p5ForCausalLM",
        "Step3p7ForConditionalGeneration",
        "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedForConditionalGeneration",
        "EmbeddingGemma2Model",
        "DiffusionGemmaForBlockDiffusion",
        "LagunaForCausalLM",
        "MellumForCausalLM",
        "MuseGlimmerForCausalLM",
        "MuseGlimmerForConditionalGeneration",
        "InklingForConditionalGeneration",
        "UnlimitedOCRForCausalLM",
    }
)
"""Architectures SGLang 0.5.23 serves with hybrid SWA pools: ``is_hybrid_swa_model``'s list
(``configs/model_config.py`` lines 2651-2679, ``SWA_SINK_ARCHS`` and ``MIMO_V2_MODEL_ARCHS`` expanded; the
DeepSeek-V4 and draft-only entries belong elsewhere).  A config may also opt in with ``is_hybrid_swa: true``
(lines 2693-2696, :data:`SGLANG_HYBRID_SWA_FLAG`)."""
SGLANG_HYBRID_SWA_FLAG = "is_hybrid_swa"
"""``ModelSpec.params`` key (and the HF text config's field) that opts a config into SGLang's hybrid SWA pools."""
SGLANG_DISABLED_HYBRID_SWA = {
    "Gemma2ForCausalLM": "gemma2_gemma3.py",
    "Gemma3ForCausalLM": "gemma2_gemma3.py",
    "Gemma3ForConditionalGeneration": "gemma2_gemma3.py",
    "Gemma3nForCausalLM": "gemma2_gemma3.py",
    "Gemma3nForConditionalGeneration": "gemma2_gemma3.py",
    "Olmo2ForCausalLM": "olmo2.py",
}
"""Architectures whose SGLang 0.5.23 model override declares ``disable_hybrid_swa_memory`` unconditionally
(``arg_groups/model_overrides/gemma2_gemma3.py`` line 26, ``olmo2.py`` line 23; EXAONE's ``exaone.py`` line 22
does when the config states ``sliding_window_pattern``), so ``ModelConfig.is_hybrid_swa`` is false
(``configs/model_config.py`` lines 1215-1218) whatever the config says."""
SGLANG_EXAONE_ARCHITECTURES = frozenset({"Exaone4ForCausalLM", "ExaoneMoEForCausalLM", "ExaoneMoeForCausalLM"})


def sglang_serves_hybrid_swa(model: ModelSpec) -> tuple[bool, str]:
    """Whether SGLang 0.5.23 builds hybrid SWA pools for ``model`` (``ModelConfig.is_hybrid_swa``), and why not."""
    archs = set(model.hf_architectures)
    for arch in model.hf_architectures:
        if arch in SGLANG_DISABLED_HYBRID_SWA:
            return False, (
                f"its model override declares disable_hybrid_swa_memory for {arch} "
                f"(arg_groups/model_overrides/{SGLANG_DISABLED_HYBRID_SWA[arch]})"
            )
        if arch in SGLANG_EXAONE_ARCHITECTURES and model.params.get("layer_pattern", "").startswith(
            "sliding_window_pattern"
        ):
            return False, (
                f"its model override declares disable_hybrid_swa_memory for {arch} with a sliding_window_pattern "
                "(arg_groups/model_overrides/exaone.py)"
            )
    if archs & SGLANG_HYBRID_SWA_ARCHITECTURES or model.params.get(SGLANG_HYBRID_SWA_FLAG):
        return True, ""
    arch = ", ".join(model.hf_architectures) or model.model_type
    return False, f"{arch} is not in is_hybrid_swa_model (configs/model_config.py) and its config sets no is_hybrid_swa"


@attrs.frozen
class Pattern:
    """Which layers slide, and the words that say where that came from."""

    sliding: tuple[bool, ...]
    source: str


def parse_swa_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    """The model of a sliding-window config, or ``None`` when the config is not one."""
    outer = ConfigReader(config, source)
    reader = outer.text()
    if any(reader.has(key) or outer.has(key) for key in _FOREIGN) or is_deepseek_v4(outer):
        return None
    latent = reader.has(_LATENT)
    if latent and not any(reader.has(key) for key in _EXPLICIT_PATTERNS):
        if reader.has("swa_kv_lora_rank"):
            raise reader.error(
                "swa_kv_lora_rank",
                "is set but the config has no layer_types or hybrid_layer_pattern saying which layers slide",
                "Add layer_types (full_attention / sliding_attention per layer).",
            )
        return None  # a plain MLA / DSA model: the mla or dsa plugin's
    if not latent and reader.has("index_topk"):
        return None  # DSA without a latent is no sliding-window model
    model_type = reader.string("model_type") or outer.string("model_type")
    pattern = sliding_pattern(reader, model_type)
    if pattern is None:
        return None
    num_layers = reader.integer("num_hidden_layers")
    if len(pattern.sliding) != num_layers:
        raise reader.error(
            "num_hidden_layers",
            f"is {num_layers} but the layer pattern ({pattern.source}) has {len(pattern.sliding)} entries",
            "Make the layer list one entry per layer.",
        )
    if not any(pattern.sliding):
        return None  # nothing slides: a plain attention model
    shared = reader.integer("num_kv_shared_layers", 0, minimum=0)
    if shared:
        raise reader.error(
            "num_kv_shared_layers",
            f"is {shared}: later layers reuse earlier layers' KV",
            "kvpools cannot size cross-layer KV sharing exactly; it supports configs with num_kv_shared_layers 0.",
        )
    window = sliding_window(reader)
    storage = ("dsa" if is_deepseek_dsa(outer) else "mla") if latent else None
    layers = (
        latent_layers(reader, pattern, window, storage == "dsa")
        if latent
        else attention_layers(reader, pattern, window)
    )
    context_len, context_note = family_context_length(reader, model_type)
    dtype_reader = reader if reader.has("torch_dtype") or reader.has("dtype") else outer
    return ModelSpec(
        name=source,
        architecture=ARCHITECTURE,
        layers=layers,
        context_len=context_len,
        dtype=model_dtype(dtype_reader, float32_served_as=float32_served_as(model_type)),
        num_attention_heads=reader.integer("num_attention_heads"),
        model_type=model_type,
        hf_architectures=outer.string_list("architectures"),
        source=source,
        num_nextn_predict_layers=reader.integer("num_nextn_predict_layers", 0, minimum=0),
        is_multimodal=reader is not outer,
        params={
            "sliding_window": window,
            "layer_pattern": pattern.source,
            "attention_k_eq_v": reader.boolean("attention_k_eq_v", False),
            "notes": [n for n in (context_note,) if n],
            **({SGLANG_HYBRID_SWA_FLAG: True} if reader.boolean(SGLANG_HYBRID_SWA_FLAG, False) else {}),
            **({LATENT: storage} if storage else {}),
        },
    )


def attention_layers(reader: ConfigReader, pattern: Pattern, window: int) -> list[LayerSpec]:
    """MHA/GQA layers: each kind with its own KV heads and head dims (:func:`layer_geometries`)."""
    full, swa = layer_geometries(reader)
    return [
        LayerSpec(index=i, kind=SLIDING, num_kv_heads=swa[0], head_dim=swa[1], v_head_dim=swa[2], sliding_window=window)
        if slides
        else LayerSpec(index=i, kind=FULL, num_kv_heads=full[0], head_dim=full[1], v_head_dim=full[2])
        for i, slides in enumerate(pattern.sliding)
    ]


def latent_layers(reader: ConfigReader, pattern: Pattern, window: int, dsa: bool) -> list[LayerSpec]:
    """Hybrid MLA-SWA layers: full layers with the MLA latent (and DSA's indexer dims), sliding ones with their own."""
    full = MLADims(reader.integer("kv_lora_rank"), reader.integer("qk_rope_head_dim"))
    swa = MLADims(
        reader.integer("swa_kv_lora_rank", full.kv_lora_rank),
        reader.integer("swa_qk_rope_head_dim", full.qk_rope_head_dim),
    )
    indexer = (
        {
            "index_head_dim": reader.integer("index_head_dim"),
            "index_topk": reader.integer("index_topk"),
            "index_n_heads": reader.integer("index_n_heads", 0, minimum=0),
        }
        if dsa
        else {}
    )

    def layer(i: int, kind: str, dims: MLADims, extra: dict[str, int], slide: int | None) -> LayerSpec:
        params = {"kv_lora_rank": dims.kv_lora_rank, "qk_rope_head_dim": dims.qk_rope_head_dim, **extra}
        return LayerSpec(
            index=i,
            kind=kind,
            num_kv_heads=1,
            head_dim=dims.kv_cache_dim,
            v_head_dim=dims.kv_lora_rank,
            sliding_window=slide,
            params=params,
        )

    return [
        layer(i, SLIDING, swa, {}, window) if slides else layer(i, FULL, full, indexer, None)
        for i, slides in enumerate(pattern.sliding)
    ]


def sliding_pattern(reader: ConfigReader, model_type: str) -> Pattern | None:
    """Which layers slide, by the first form of the module docstring that applies; None for other models."""
    if model_type in LLAMA4_MODEL_TYPES and reader.get("attention_chunk_size") is not None:
        layers = reader.integer("num_hidden_layers")
        return Pattern(
            tuple((i + 1) % 4 != 0 for i in range(layers)),
            "Llama-4 chunked local attention (attention_chunk_size): layer i is full when (i+1)%4==0, as SGLang's "
            "get_hybrid_layer_ids fixes it",
        )
    if reader.has("layer_types"):
        types = reader.string_list("layer_types")
        if not types:
            raise reader.error("layer_types", "is an empty list", "Give one layer type per layer, or remove it.")
        unknown = sorted(set(types) - set(_LAYER_TYPES))
        if unknown and "sliding_attention" in types:
            raise reader.error(
                "layer_types",
                f"has layer type(s) {describe(unknown)} beside sliding_attention",
                "kvpools sizes sliding-window models whose layers are full_attention or sliding_attention.",
            )
        if unknown:
            return None  # linear attention, mamba, ...: another plugin's hybrid
        return Pattern(tuple(_LAYER_TYPES[t] for t in types), "layer_types")
    if reader.has("hybrid_layer_pattern"):
        values = reader.integer_list(
            "hybrid_layer_pattern", minimum=0, maximum=1, fix="Use 0 (full) and 1 (SWA), one per layer."
        )
        return Pattern(tuple(v == 1 for v in values), "hybrid_layer_pattern (1 = SWA)")
    if not window_active(reader):
        return None
    num_layers = reader.integer("num_hidden_layers")
    stated = reader.optional_integer("sliding_window_pattern") or reader.optional_integer("_sliding_window_pattern")
    if stated is not None or model_type in FAMILY_PATTERNS:
        every = stated or FAMILY_PATTERNS[model_type]
        how = f"sliding_window_pattern {every}" if stated else f"{model_type}'s fixed pattern {every} (transformers)"
        return Pattern(
            tuple((i + 1) % every != 0 for i in range(num_layers)), f"{how}: layer i is full when (i+1)%{every}==0"
        )
    if model_type in WINDOW_LAYER_FAMILIES:
        if not reader.boolean("use_sliding_window", False):
            return None  # transformers ignores the window unless use_sliding_window is true
        first = reader.integer("max_window_layers", minimum=0)
        return Pattern(tuple(i >= first for i in range(num_layers)), f"use_sliding_window: layers >= {first} slide")
    if model_type in ALL_SWA_FAMILIES:
        return Pattern((True,) * num_layers, "sliding_window on every layer (all-SWA)")
    return None


def window_active(reader: ConfigReader) -> bool:
    """``sliding_window`` is stated and not switched off by ``use_sliding_window: false`` (Qwen2-style inert field).

    The core's test (:func:`kvpools_core.config.sliding_window_active`), which dense plugins decline by,
    so a config is claimed by exactly one plugin.
    """
    return sliding_window_active(reader)


def sliding_window(reader: ConfigReader) -> int:
    """The window of the sliding layers (``sliding_window``, or ``sliding_window_size``)."""
    if reader.string("model_type", "") in LLAMA4_MODEL_TYPES and reader.get("attention_chunk_size") is not None:
        return reader.integer("attention_chunk_size")  # SGLang's sliding_window_size (load_model_utils.py L152-153)
    key = "sliding_window" if reader.has("sliding_window") else "sliding_window_size"
    if not reader.has(key):
        raise reader.error(
            "sliding_window", "is missing but the config has sliding layers", "Add the window size (tokens)."
        )
    return reader.integer(key)


def layer_geometries(reader: ConfigReader) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(full layer, SWA layer) ``(num_kv_heads, head_dim, v_head_dim)``."""
    heads = reader.integer("num_attention_heads")
    kv_heads = grouped_kv_heads(reader, heads)
    head_dim = reader.optional_integer("head_dim") or derived_head_dim(reader, heads)
    v_head_dim = reader.optional_integer("v_head_dim") or head_dim
    swa = (
        reader.integer("swa_num_key_value_heads", kv_heads),
        reader.optional_integer("swa_head_dim") or head_dim,
        reader.optional_integer("swa_v_head_dim") or v_head_dim,
    )
    full_heads, full_dim, full_v_dim = kv_heads, head_dim, v_head_dim
    global_dim = reader.optional_integer("global_head_dim")
    if global_dim is not None:  # Gemma-4: full layers have their own head dim, for K and V alike
        full_dim = full_v_dim = global_dim
    if reader.boolean("attention_k_eq_v", False) and reader.has("num_global_key_value_heads"):
        full_heads = reader.integer("num_global_key_value_heads")
    return (full_heads, full_dim, full_v_dim), swa


def family_context_length(reader: ConfigReader, model_type: str) -> tuple[int, str | None]:
    """The context length, or the family's transformers default (with a note saying so)."""
    if model_type in FAMILY_CONTEXT and not any(reader.has(key) for key in _CONTEXT_KEYS):
        value = FAMILY_CONTEXT[model_type]
        return value, f"max_position_embeddings is absent; {model_type}'s transformers default {value} is used"
    return context_length(reader, _CONTEXT_KEYS), None


def float32_served_as(model_type: str) -> str:
    """SGLang's ``_get_and_verify_dtype`` (``configs/model_config.py`` L2284-2344): a float32 Gemma checkpoint is
    served in bfloat16, any other in float16."""
    return "bfloat16" if model_type.startswith("gemma") else "float16"
