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

import attrs

from kvpools_core.options import option
from kvpools_core.parts.indexer import INDEX_EXTRA_SLOTS, INDEX_POOL, hisparse_ratio, layer_split
from kvpools_core.sizing import (
    allocator_pool,
    apply_token_cap,
    largest_fitting_tokens,
    not_enough_memory,
    page_align,
    request_pools,
    request_state_pools,
    resolve_max_num_reqs,
    sglang_tokens,
    token_pool,
    token_pools,
    with_cost,
)
from kvpools_core.values import (
    FULL_TOKENS,
    TOKEN,
    Budget,
    CellSize,
    GroupCost,
    ModelSpec,
    PoolSizing,
    PoolSpec,
    Serving,
)

__all__ = [
    "LOGICAL_ALLOCATOR_POOL",
    "LOGICAL_TOKENS",
    "MAPPING_POOL",
    "hisparse_problems",
    "size_hisparse_pools",
]

LOGICAL_TOKENS = "hisparse_logical"
"""The token space of HiSparse's logical slots: ``S x host_to_device_ratio`` (the allocator's ``size_full``)."""
LOGICAL_ALLOCATOR_POOL = "logical_allocator"
"""``HiSparseTokenToKVPoolAllocator.logical_attn_allocator``: a paged allocator of ``S x r`` slots."""
MAPPING_POOL = "hisparse_mapping"
"""``full_to_hisparse_device_index_mapping``: int64, ``S x r + page + 1`` entries."""
MAPPING_ENTRY_BYTES = 8
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


def size_hisparse_pools(
    model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget, *, owner: str
) -> PoolSizing:
    """``S`` device tokens (SGLang's count, or the most whose pools fit), and every HiSparse pool for them."""
    page, ratio = serving.page_size, hisparse_ratio(serving)
    context_len = serving.context_length or model.context_len
    index_bytes = sum(part.bytes_per_token for part in cell.parts_of(TOKEN) if part.pool == INDEX_POOL)
    device_cell = attrs.evolve(cell, parts=tuple(part for part in cell.parts if part.pool != INDEX_POOL))

    def layout(tokens: int) -> tuple[list[PoolSpec], int]:
        limit = resolve_max_num_reqs(tokens, context_len, serving)
        logical = tokens * ratio
        pools = token_pools(device_cell, tokens, page, owner)
        pools.append(
            token_pool(
                INDEX_POOL, logical, page, index_bytes, owner, extra_slots=INDEX_EXTRA_SLOTS, token_space=LOGICAL_TOKENS
            )
        )
        pools += request_state_pools(cell, limit.max_running_requests, owner)
        pools += request_pools(limit.max_running_requests, context_len, serving)
        pools.append(
            allocator_pool(logical, page, token_space=LOGICAL_TOKENS, name=LOGICAL_ALLOCATOR_POOL, owner=owner)
        )
        pools.append(allocator_pool(tokens, page, owner=owner))
        pools.append(mapping_pool(logical, page, owner))
        return pools, limit.max_running_requests

    if serving.accounting == "sglang":
        profiled = sglang_tokens(budget.budget_bytes, cell.sglang_bytes_per_token, page)
    else:
        upper = budget.budget_bytes // max(1, cell.bytes_per_token)
        profiled = largest_fitting_tokens(
            budget.budget_bytes, page, upper, lambda t: sum(p.bytes for p in layout(t)[0])
        )
    tokens, cap_note = apply_token_cap(profiled, serving.max_total_tokens)
    tokens = page_align(tokens, page)
    if tokens <= 0:
        raise not_enough_memory(model, serving, cell, budget)
    pools, requests = layout(tokens)
    limit = resolve_max_num_reqs(tokens, context_len, serving)
    notes = [note for note in (cap_note, limit.note) if note]
    notes.append(
        f"HiSparse (host_to_device_ratio {ratio}): {tokens:,} device tokens (latent rows), {tokens * ratio:,} "
        f"logical tokens (SGLang's max_token_pool_size, HiSparseTokenToKVPoolAllocator.size_full): the index keys, "
        f"the logical allocator and the int64 device mapping are sized for them"
    )
    if serving.accounting == "sglang":
        planned = sum(pool.bytes for pool in pools)
        if planned > budget.budget_bytes:
            notes.append(
                f"SGLang's cell size charges the index keys once per device token, not {ratio} times: its pools "
                f"need {planned:,} B of the {budget.budget_bytes:,} B budget ({planned / budget.budget_bytes:.1%})"
            )
    return PoolSizing(
        max_total_num_tokens=tokens,
        max_running_requests=requests,
        pools=pools,
        sglang_config={"max_total_num_tokens": tokens, "max_running_requests": requests},
        sglang_estimate_bytes=int(tokens * cell.sglang_bytes_per_token),
        notes=notes,
        token_counts={FULL_TOKENS: tokens, LOGICAL_TOKENS: tokens * ratio},
    )


def mapping_pool(logical: int, page_size: int, owner: str) -> PoolSpec:
    """``full_to_hisparse_device_index_mapping``: ``logical + page_size`` zeros and one ``-1``, int64."""
    padding = page_size + 1
    pool = PoolSpec(
        name=MAPPING_POOL,
        kind="allocator",
        slots=logical,
        padding_slots=padding,
        bytes_per_slot=MAPPING_ENTRY_BYTES,
        bytes=(logical + padding) * MAPPING_ENTRY_BYTES,
        sglang_charged=False,
        owner=owner,
        unit=TOKEN,
        token_space=LOGICAL_TOKENS,
    )
    cost = GroupCost(
        group=MAPPING_POOL,
        token_space=LOGICAL_TOKENS,
        token_bytes=MAPPING_ENTRY_BYTES,
        fixed_bytes=padding * MAPPING_ENTRY_BYTES,
    )
    return with_cost(pool, cost)
