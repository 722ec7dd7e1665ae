"""Reading MLA-family configs: which flavour a config is, and its latent dimensions.

SGLang decides the flavour from ``architectures[0]`` and a few fields
(``configs/model_config.py``): DeepSeek V3.2-style sparse attention (DSA) is a
DSA architecture *with* ``index_topk`` (``is_deepseek_dsa``); DeepSeek-V4
(compressed attention) is its own family.  Every other config with an MLA
latent (``kv_lora_rank`` and ``qk_rope_head_dim``) is plain MLA.  The MLA and
DSA plugins both read their configs here, so each claims exactly the configs
the other declines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvpools_core.config import ConfigReader, context_length, model_dtype
from kvpools_core.values import LayerSpec, ModelSpec

DSA_ARCHITECTURES = frozenset(
    {
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "PixtralForConditionalGeneration",
        "GlmMoeDsaForCausalLM",
    }
)
"""``is_deepseek_dsa``'s architectures: DSA when the config also sets ``index_topk``."""

DSV4_ARCHITECTURES = frozenset({"DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN"})
"""DeepSeek-V4 compressed attention: another family (``is_deepseek_v4``)."""

# SGLang's ModelConfig.get_context_length order.
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
# Hybrid layouts (sliding-window or recurrent layers beside MLA) belong to hybrid plugins
# (Kimi-Linear's ``linear_attn_config`` names its KDA layers: the ``mamba`` plugin's).
_HYBRID_MARKERS = (
    "swa_kv_lora_rank",
    "hybrid_layer_pattern",
    "hybrid_override_pattern",
    "layers_block_type",
    "linear_attn_config",
)
_HYBRID_MODEL_TYPES = frozenset({"kimi_linear"})


@attrs.frozen
class MLADims:
    """The latent one MLA layer caches per token: ``kv_lora_rank`` values plus ``qk_rope_head_dim`` rope values."""

    kv_lora_rank: int
    qk_rope_head_dim: int

    @property
    def kv_cache_dim(self) -> int:
        """SGLang's default MLA row: ``kv_lora_rank + qk_rope_head_dim`` elements."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @classmethod
    def of(cls, layer: LayerSpec) -> MLADims:
        return cls(layer.params["kv_lora_rank"], layer.params["qk_rope_head_dim"])


def first_architecture(outer: ConfigReader) -> str | None:
    """``architectures[0]`` of the top-level config (``None`` when it lists none)."""
    architectures = outer.string_list("architectures")
    return architectures[0] if architectures else None


def is_deepseek_dsa(outer: ConfigReader) -> bool:
    """SGLang's ``is_deepseek_dsa``: a DSA architecture with ``index_topk`` set (top level or ``text_config``)."""
    if first_architecture(outer) not in DSA_ARCHITECTURES:
        return False
    return outer.has("index_topk") or outer.text().has("index_topk")


def is_deepseek_v4(outer: ConfigReader) -> bool:
    return first_architecture(outer) in DSV4_ARCHITECTURES


def has_mla_latent(reader: ConfigReader) -> bool:
    """An MLA latent and no hybrid layout: the configs the MLA family may claim."""
    if not (reader.has("kv_lora_rank") and reader.has("qk_rope_head_dim")):
        return False
    if any(reader.has(key) for key in _HYBRID_MARKERS) or reader.string("model_type") in _HYBRID_MODEL_TYPES:
        return False
    return all(kind == "full_attention" for kind in reader.string_list("layer_types"))


def mla_model_spec(
    config: Mapping[str, Any],
    source: str,
    *,
    architecture: str,
    kind: str,
    layer_params: Mapping[str, Any] | None = None,
) -> ModelSpec:
    """The ``ModelSpec`` of an MLA-family config: every layer caches one latent row of ``kind``.

    ``LayerSpec.head_dim`` is the key row (latent + rope) and ``v_head_dim``
    the value view (latent), as SGLang's ``get_key_buffer`` /
    ``get_value_buffer``; the latent dims are in ``params``.
    """
    outer = ConfigReader(config, source)
    reader = outer.text()
    dims = MLADims(reader.integer("kv_lora_rank"), reader.integer("qk_rope_head_dim"))
    num_layers = reader.integer("num_hidden_layers")
    params = {"kv_lora_rank": dims.kv_lora_rank, "qk_rope_head_dim": dims.qk_rope_head_dim, **(layer_params or {})}
    layers = [
        LayerSpec(
            index=i, kind=kind, num_kv_heads=1, head_dim=dims.kv_cache_dim, v_head_dim=dims.kv_lora_rank, params=params
        )
        for i in range(num_layers)
    ]
    # Attention dims the pools do not store but reports show (absent ones are left out).
    attention = {
        key: value
        for key in ("qk_nope_head_dim", "v_head_dim", "q_lora_rank")
        if (value := reader.optional_integer(key)) is not None
    }
    return ModelSpec(
        name=source,
        architecture=architecture,
        layers=layers,
        context_len=context_length(reader, _CONTEXT_KEYS),
        dtype=model_dtype(reader),
        num_attention_heads=reader.integer("num_attention_heads", 0, minimum=0),
        model_type=reader.string("model_type") or outer.string("model_type"),
        hf_architectures=outer.string_list("architectures"),
        source=source,
        num_nextn_predict_layers=reader.integer("num_nextn_predict_layers", 0, minimum=0),
        is_multimodal=reader is not outer,
        params=attention,
    )
