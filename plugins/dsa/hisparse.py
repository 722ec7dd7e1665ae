"""HiSparse on DeepSeek sparse attention: SGLang 0.5.23's host-backed DSA pools, sized.

With ``--enable-hisparse`` SGLang builds (``_build_dsa_kv_pool``, ``000_fbd4f47288598fb9.txt`` lines
1639-1645, and the allocator at lines 2129-2144) for ``S = max_total_num_tokens`` and ``r =
host_to_device_ratio`` (``--hisparse-config``, default 2):

* ``HiSparseDSATokenToKVPool`` (``mem_cache/hisparse_memory_pool.py``): ``S + P`` latent rows per layer
  on the device, but an index-key cache for ``index_buf_size = S x r`` tokens, ``(S r + P + 1) // P``
  pages per layer (every layer: ``_should_elide_dsa_index_k`` is false under HiSparse);
* ``HiSparseTokenToKVPoolAllocator`` (``mem_cache/allocator/hisparse.py``): a logical paged allocator
  of ``size_full = S x r`` (what ``ModelRunner.max_token_pool_size`` reports), a device paged
  allocator of ``S`` and an int64 ``full_to_hisparse_device_index_mapping`` of ``S r + P + 1`` entries.

The plan keeps ``max_total_num_tokens = S`` (the device tokens, the ``"full"`` space) and counts the
logical space :data:`LOGICAL_TOKENS` = ``S x r``, which the index pages, the logical allocator and the
mapping scale with.  SGLang's configurator (ref-002 lines 193-220) charges the 132 B index key once per
layer whatever ``r`` is, so ``--accounting sglang`` plans its token count and pools past the budget
(a note says by how much); the exact accounting fits all of them.
"""

from __future__ import annotations

from kvpools_core.options import option
from kvpools_core.parts.hisparse import size_hisparse_pools
from kvpools_core.parts.indexer import INDEX_POOL, layer_split
from kvpools_core.values import Budget, CellSize, ModelSpec, PoolSizing, Serving

__all__ = ["dsa_hisparse_pools", "hisparse_problems"]

HISPARSE_KV_DTYPES = ("bf16", "fp8_e4m3")
"""``validate_hisparse_kv_cache_dtype`` (``arg_groups/hisparse_hook.py``): bfloat16 or fp8_e4m3 (or auto)."""


def hisparse_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """SGLang's DSA HiSparse refusals, and the combinations kvpools does not model yet."""
    if not serving.enable_hisparse:
        return []
    flag = option("enable_hisparse")
    problems = []
    if serving.kv_cache_dtype not in ("auto", *HISPARSE_KV_DTYPES):
        problems.append(
            f"SGLang refuses {flag} with {option('kv_cache_dtype')} {serving.kv_cache_dtype} on DeepSeek sparse "
            f"attention ('HiSparse requires one of ('bfloat16', 'fp8_e4m3') KV cache dtypes', "
            f"validate_hisparse_kv_cache_dtype in arg_groups/hisparse_hook.py). Use {option('kv_cache_dtype')} "
            "bf16 or fp8_e4m3."
        )
    unmodelled = [
        (
            serving.speculative_algorithm is not None,
            "speculative decoding (its draft pool and HiSparse's swap scratch)",
        ),
        (serving.dcp_size > 1, f"{option('dcp_size')} {serving.dcp_size}"),
        (layer_split(serving), option("enable_dsa_cache_layer_split")),
        (serving.enable_hierarchical_cache, option("enable_hierarchical_cache")),
        (serving.disaggregation_mode != "null", f"{option('disaggregation_mode')} {serving.disaggregation_mode}"),
    ]
    problems += [
        f"kvpools does not model {flag} with {what} on DeepSeek sparse attention yet. Drop one of them."
        for present, what in unmodelled
        if present
    ]
    return problems


def dsa_hisparse_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget, *, owner: str) -> PoolSizing:
    """The latent rows for ``S`` device tokens, the index keys for ``S x r`` logical ones."""
    return size_hisparse_pools(model, serving, cell, budget, owner=owner, logical_pools=(INDEX_POOL,))
