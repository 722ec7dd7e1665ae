"""HiSparse's sizing, shared by the architectures SGLang 0.5.23 runs it on (DSA, MiniMax-M3 sparse).

With ``--enable-hisparse`` SGLang keeps ``S = max_total_num_tokens`` device slots for the attention rows the
sparse kernels read through the HiSparse mapping, but sizes some pools for ``S x r`` *logical* slots (``r =
host_to_device_ratio``, ``--hisparse-config``, default 2), and builds ``HiSparseTokenToKVPoolAllocator``
(``mem_cache/allocator/hisparse.py``): a logical paged allocator of ``size_full = S x r`` (what
``ModelRunner.max_token_pool_size`` reports), a device paged allocator of ``S`` and an int64
``full_to_hisparse_device_index_mapping`` of ``S r + P + 1`` entries (the last ``-1``).  Which pools are
logical is the architecture's: DSA's index keys (``HiSparseDSATokenToKVPool``: ``index_buf_size = S x r``),
MiniMax-M3's dense-layer K/V and indexer pools (``MiniMaxSparseKVPool(enable_hisparse)``).

The plan keeps ``max_total_num_tokens = S`` (the ``"full"`` token space) and counts the logical space
:data:`LOGICAL_TOKENS` = ``S x r``.  Under ``--accounting sglang`` ``S`` is the configurator's count from its
own cell size (which the architecture's plugin gives); the exact accounting takes the most ``S`` whose pools
all fit.  The allocator's store is :class:`kvpools_core.pools.hisparse.HiSparseAllocator`.
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from kvpools_core.parts.sizing import (
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
    parse_hisparse_config,
)

__all__ = [
    "DEFAULT_RATIO",
    "LOGICAL_ALLOCATOR_POOL",
    "LOGICAL_TOKENS",
    "MAPPING_POOL",
    "hisparse_ratio",
    "mapping_pool",
    "size_hisparse_pools",
]

LOGICAL_TOKENS = "hisparse_logical"
"""The token space of HiSparse's logical slots: ``S x host_to_device_ratio`` (the allocator's ``size_full``)."""
LOGICAL_ALLOCATOR_POOL = "logical_allocator"
"""``HiSparseTokenToKVPoolAllocator.logical_attn_allocator``: a paged allocator of ``S x r`` slots."""
MAPPING_POOL = "hisparse_mapping"
"""``full_to_hisparse_device_index_mapping``: int64, ``S x r + page + 1`` entries."""
MAPPING_ENTRY_BYTES = 8
DEFAULT_RATIO = 2
"""``SparseConfig.host_to_device_ratio`` when ``--hisparse-config`` does not set it."""


def hisparse_ratio(serving: Serving) -> int:
    """HiSparse's ``host_to_device_ratio`` (SGLang's default 2) with ``--enable-hisparse``, else 1."""
    if not serving.enable_hisparse:
        return 1
    return int(parse_hisparse_config(serving.hisparse_config).get("host_to_device_ratio", DEFAULT_RATIO))


def size_hisparse_pools(
    model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget, *, owner: str, logical_pools: Collection[str]
) -> PoolSizing:
    """``S`` device tokens (SGLang's count, or the most whose pools fit), and every HiSparse pool for them.

    The cell's token pools named in ``logical_pools`` hold ``S x r`` slots (their parts' bytes per slot and
    ``extra_slots``), the others ``S``.
    """
    page, ratio = serving.page_size, hisparse_ratio(serving)
    context_len = serving.context_length or model.context_len
    per_slot, extra = cell.pool_bytes_per_token(), cell.pool_extra_slots()
    logical_names = [name for name in per_slot if name in logical_pools]
    device_cell = attrs.evolve(
        cell, parts=tuple(part for part in cell.parts if part.unit != TOKEN or part.pool not in logical_pools)
    )

    def layout(tokens: int) -> tuple[list[PoolSpec], int]:
        limit = resolve_max_num_reqs(tokens, context_len, serving)
        logical = tokens * ratio
        pools = token_pools(device_cell, tokens, page, owner)
        pools += [
            token_pool(name, logical, page, per_slot[name], owner, extra_slots=extra[name], token_space=LOGICAL_TOKENS)
            for name in logical_names
        ]
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
        f"HiSparse (host_to_device_ratio {ratio}): {tokens:,} device tokens, {tokens * ratio:,} logical tokens "
        f"(SGLang's max_token_pool_size, HiSparseTokenToKVPoolAllocator.size_full): {', '.join(logical_names)}, "
        "the logical allocator and the int64 device mapping are sized for the logical ones"
    )
    if serving.accounting == "sglang":
        planned = sum(pool.bytes for pool in pools)
        if planned > budget.budget_bytes:
            notes.append(
                f"SGLang's cell size charges the logical pools ({', '.join(logical_names)}) per device token, not "
                f"{ratio} times: its pools "
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


def mapping_pool(
    logical: int,
    page_size: int,
    owner: str,
    *,
    name: str = MAPPING_POOL,
    token_space: str = LOGICAL_TOKENS,
    slot_space: str | None = None,
    slots_per_token: int = 1,
) -> PoolSpec:
    """``full_to_hisparse_device_index_mapping``: ``logical + page_size`` zeros and one ``-1``, int64.

    ``logical`` entries are ``slots_per_token`` per token of ``token_space`` (DeepSeek-V4's: 32 c4 slots per c128
    token, ``slot_space`` ``"c4"``; DSA's: one per logical token)."""
    padding = page_size + 1
    pool = PoolSpec(
        name=name,
        kind="allocator",
        slots=logical,
        padding_slots=padding,
        bytes_per_slot=MAPPING_ENTRY_BYTES,
        bytes=(logical + padding) * MAPPING_ENTRY_BYTES,
        sglang_charged=False,
        owner=owner,
        unit=TOKEN,
        token_space=token_space,
    )
    cost = GroupCost(
        group=name,
        token_space=token_space,
        token_bytes=slots_per_token * MAPPING_ENTRY_BYTES,
        fixed_bytes=padding * MAPPING_ENTRY_BYTES,
        slot_space=slot_space,
        slots_per_token=slots_per_token,
    )
    return with_cost(pool, cost)
