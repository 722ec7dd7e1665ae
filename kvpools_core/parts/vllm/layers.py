"""What an architecture plugin uses to answer ``vllm_kv_cache_specs``: vLLM's per-layer arithmetic.

A public module (:data:`kvpools_core.PUBLIC_MODULES`): heads per TP rank, bytes per cache element, the
latent / indexer specs vLLM's MLA and DSA layers build, the block size a platform settles on for kernels that need
one (:func:`backend_block_size`) and for a Mamba hybrid (:func:`align_hybrid_block_size`), so every plugin answers
with the same formulas.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parts.vllm.specs import MLAAttentionSpec, cdiv

if TYPE_CHECKING:
    from kvpools_core.values import LayerSpec, ModelSpec, Serving


DEFAULT_BLOCK_SIZE = 16
"""``vllm.config.cache.DEFAULT_BLOCK_SIZE``: ``--block-size`` when neither the user nor the backend picks one."""


def backend_block_size(block_size: int, kernel_block_sizes: Sequence[Sequence[int]], backends: str) -> int:
    """The attention block size vLLM settles on for backends with these kernel block sizes (a ``MultipleOf(n)``
    given as ``n``, one sequence per backend).

    ``--block-size`` 16 (vLLM's default, which kvpools cannot tell from an explicit 16) is the backends'
    preferred size (``Platform._preferred_block_size_for_backends``, ``platforms/interface.py`` L700-747: the
    default when every backend supports it, else the smallest lcm of one size per backend that all support);
    any other size must be a multiple of one kernel size of every backend (``supports_block_size``,
    ``v1/attention/backend.py`` L122-138), or vLLM cannot run the kernels on it.
    """

    def supported(size: int) -> bool:
        return all(any(size % kernel == 0 for kernel in sizes) for sizes in kernel_block_sizes if sizes)

    if supported(block_size):
        return block_size
    if block_size == DEFAULT_BLOCK_SIZE:
        for candidate in sorted({math.lcm(*combo) for combo in itertools.product(*kernel_block_sizes)}):
            if supported(candidate):
                return candidate
    kernels = " and ".join(str(sorted(set(sizes))) for sizes in kernel_block_sizes)
    raise UnsupportedCombinationError(
        f"--block-size {block_size} is not a multiple of the kernel block sizes {kernels} of {backends}, which vLLM "
        "requires; pass a multiple of them (or leave --block-size out for the backends' choice)."
    )


def padded_page_block_size(
    block_size: int, kernel_block_sizes: Sequence[Sequence[int]], kernel: int, *, family: str, name: str
) -> int:
    """:func:`backend_block_size` for ``family``'s attention backends whose padded pages cannot be split into
    kernel blocks: the block must be the attention kernel's own ``kernel`` (vLLM's "Padded KV pages do not
    support kernel block splitting"), so any other settled size is refused, naming the one to pass."""
    block = backend_block_size(block_size, kernel_block_sizes, f"{family}'s attention backends")
    if block != kernel:
        raise UnsupportedCombinationError(
            f"{name}: --block-size {block} would be split into {kernel}-token kernel blocks, which vLLM does not "
            f"support for {family}'s padded pages ('Padded KV pages do not support kernel block splitting'); use "
            f"--block-size {kernel} or leave it out."
        )
    return block


def align_hybrid_block_size(
    *,
    block_size: int,
    attn_page_size_1_token: int,
    mamba_page_size: int,
    kernel_block_size: int,
    backend_block_alignment: int = 1,
    use_mla: bool = False,
    prefill_checkpoint_alignment: int | None = None,
) -> tuple[int, int | None]:
    """``Platform._align_hybrid_block_size`` (``platforms/interface.py`` L940-1132): the attention block size of a
    Mamba hybrid, and the padded Mamba page.

    The attention block grows until one attention page holds a Mamba state: ``align * cdiv(mamba_page, align *
    attn_page_per_token)`` tokens, ``align`` = the backend's smallest kernel block (at least the configured block
    size; at least 128 for MLA; a multiple of the prefill checkpoint alignment in ``align`` mode), then rounded up to
    ``backend_block_alignment`` (the lcm of every attention backend's smallest kernel block).  The Mamba page is then
    padded to the attention page ("Padding mamba page size by X% ..."); ``None`` when they are already equal.
    Returns ``(block_size, mamba_page_size_padded)``.
    """
    for name, value in (
        ("block_size", block_size),
        ("attn_page_size_1_token", attn_page_size_1_token),
        ("kernel_block_size", kernel_block_size),
        ("backend_block_alignment", backend_block_alignment),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}.")
    if mamba_page_size <= 0:
        return block_size, None
    align = max(kernel_block_size, block_size)
    if use_mla:
        align = max(align, 128)
    if prefill_checkpoint_alignment is not None:
        align = math.lcm(align, prefill_checkpoint_alignment or 1)
    attn_block_size = align * cdiv(mamba_page_size, align * attn_page_size_1_token)
    attn_block_size = backend_block_alignment * cdiv(attn_block_size, backend_block_alignment)
    block_size = max(block_size, attn_block_size)
    attn_page_size = block_size * attn_page_size_1_token
    return block_size, None if attn_page_size == mamba_page_size else attn_page_size


def layer_index(name: str) -> int | None:
    """``vllm.model_executor.models.utils.extract_layer_index``: the one integer dotted part of a layer name
    (``model.layers.7.self_attn.attn`` -> 7), or None when there is not exactly one."""
    numbers = [int(part) for part in name.split(".") if part.isascii() and part.isdigit()]
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


def pp_layer_ranges(num_layers: int, pp_size: int, partition: Sequence[int] | None = None) -> list[range]:
    """``vllm.distributed.utils.get_pp_indices`` for every rank: layers split evenly, the remainder given to the
    ranks before the last one (``VLLM_PP_LAYER_PARTITION`` when ``partition`` is given)."""
    if pp_size <= 0:
        raise ConfigError(f"--pipeline-parallel-size must be positive, got {pp_size}.")
    if partition is not None:
        if len(partition) != pp_size or sum(partition) != num_layers:
            raise ConfigError(
                f"VLLM_PP_LAYER_PARTITION {list(partition)} must have {pp_size} entries summing to {num_layers}."
            )
        sizes = list(partition)
    else:
        sizes = [num_layers // pp_size] * pp_size
        for i in range(2, num_layers % pp_size + 2):
            sizes[-i] += 1
    starts = [sum(sizes[:rank]) for rank in range(pp_size)]
    return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]
