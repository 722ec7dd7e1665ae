"""What an architecture plugin uses to answer ``vllm_kv_cache_specs``: vLLM's per-layer arithmetic.

A public module (:data:`kvpools_core.PUBLIC_MODULES`): heads per TP rank, bytes per cache element and the
latent / indexer specs vLLM's MLA and DSA layers build, so every plugin answers with the same formulas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.vllm.specs import MLAAttentionSpec

if TYPE_CHECKING:
    from kvpools_core.values import LayerSpec, ModelSpec, Serving


def layer_index(name: str) -> int | None:
    """``vllm.model_executor.models.utils.extract_layer_index``: the one integer dotted part of a layer name
    (``model.layers.7.self_attn.attn`` -> 7), or None when there is not exactly one."""
    numbers = [int(part) for part in name.split(".") if part.isdigit()]
    return numbers[0] if len(numbers) == 1 else None


def kv_heads_per_rank(total_kv_heads: int, tp_size: int) -> int:
    """vLLM's attention layers: ``max(1, total_num_kv_heads // tp_size)`` (heads are replicated past the TP size)."""
    return max(1, total_kv_heads // tp_size)


def kv_element_bytes(model: ModelSpec, serving: Serving) -> int:
    """``get_dtype_size`` of vLLM's cache dtype for ``--kv-cache-dtype`` (``auto``: the model dtype).

    fp4 and mxfp8 caches pack scales into vLLM-specific layouts (``nvfp4`` via the backend's
    ``customize_spec``) that kvpools does not model yet: refused by name.
    """
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    if kv.scale_block is not None:
        raise UnsupportedCombinationError(
            f"{option('kv_cache_dtype')} {serving.kv_cache_dtype} is not modelled for --accounting vllm "
            "(its scales live in a backend-specific layout); use auto, bf16, fp16, fp32 or fp8."
        )
    return kv.element_bytes


def latent_kv_cache_spec(layer: LayerSpec, model: ModelSpec, serving: Serving, block_size: int) -> MLAAttentionSpec:
    """``MLAAttention.get_kv_cache_spec`` (``mla_attention.py`` L1371): one latent row per token
    (``kv_lora_rank + qk_rope_head_dim``, ``LayerSpec.head_dim`` of the parts library's latent layers), one head
    on every TP rank (``max_tp_shards=1``)."""
    return MLAAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=layer.head_dim,
        dtype_bytes=kv_element_bytes(model, serving),
        cache_dtype_str=serving.kv_cache_dtype,
    )


INDEXER_QUANT_BLOCK = 128
"""``Indexer.quant_block_size`` (``deepseek_v2.py`` L724): one fp32 scale per 128 fp8 key values."""


def indexer_kv_cache_spec(index_head_dim: int, block_size: int) -> MLAAttentionSpec:
    """``DeepseekV32IndexerCache.get_kv_cache_spec`` (``deepseek_v2.py`` L658-666, L731-733): uint8 rows of
    ``index_head_dim + index_head_dim // 128 * 4`` bytes, whatever ``--kv-cache-dtype`` says."""
    return MLAAttentionSpec(
        block_size=block_size,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * 4,
        dtype_bytes=1,
        cache_role="indexer",
    )
