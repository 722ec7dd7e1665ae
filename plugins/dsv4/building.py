"""DeepSeek-V4's build hooks: its KV pool and the dual full / SWA allocator SGLang pairs with it.

ref-000 ``_build_token_to_kv_pool_allocator`` (CUDA): a ``DeepSeekV4TokenToKVPool``
whose SWA rows are paged (``needs_paged_swa_allocator``, the separate-KV layout
built here) gets ``SWATokenToKVPoolAllocator(full, swa, page_size, ...)``; the
compressed pools need no allocator (a c4 / c128 slot is ``full slot // ratio``); with HiSparse SGLang wraps
that allocator in ``DeepSeekV4HiSparseTokenToKVPoolAllocator`` (:mod:`.hisparse_allocator`).  A pool with a
per-request SWA ring (the unified-KV layout sets ``swa_req_ring_size``) gets the same allocator in ring mode
(:mod:`.swa_req_ring`, ledger row 000-024).  Under encoder replay (:mod:`.encoder_replay`, row 000-119) the pool
keeps its SWA rows in a request window and gets the full-only paged allocator.
The request table is the core's (``_build_default_req_pool``: DSV4 has its own
only on NPU), so no ``build_req_to_token_pool`` here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvpools_core import for_architecture, hookimpl
from kvpools_core.values import Plan

from .config import ARCHITECTURE
from .hisparse import uses_hisparse_allocator

if TYPE_CHECKING:
    from kvpools_core.pools.layout import BufferLayout

__all__ = ["build_allocator", "build_pool"]


@hookimpl
@for_architecture(ARCHITECTURE)
def build_pool(plan: Plan, device: str, layout: BufferLayout | None) -> Any | None:
    from .pool import DSV4TokenToKVPool

    return DSV4TokenToKVPool.from_plan(plan, device, layout=layout)


@hookimpl
@for_architecture(ARCHITECTURE)
def build_allocator(plan: Plan, pool: Any, device: str, checked: bool) -> Any | None:
    from kvpools_core.allocators.factory import slot_index_dtype
    from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator

    from .pool import sizes_of

    if getattr(pool, "request_window", None) is not None:
        # encoder replay: needs_paged_swa_allocator is false, so ref-000 L2097-2108 builds
        # PagedTokenToKVPoolAllocator(full, page) alone (no DCP widening there)
        from kvpools_core.allocators.factory import allocator_for_plan

        return allocator_for_plan(plan, device, checked=checked, kvcache=pool, widen_dcp=False)
    if getattr(pool, "unified_kv_pool", None) is not None:  # swa_req_ring_size set: ring mode (row 000-024)
        from .swa_req_ring import ring_allocator

        return ring_allocator(plan, pool, device, checked, slot_index_dtype(plan))
    sizes = sizes_of(plan)
    page = plan.serving.page_size
    logical = SWATokenToKVPoolAllocator(
        sizes.full_tokens,
        sizes.swa_tokens // page * page,
        page,
        mapping=pool.full_to_swa_index_mapping,
        kvcache=pool,
        device=device,
        need_sort=plan.serving.disaggregation_mode in ("prefill", "decode"),
        checked=checked,
        index_dtype=slot_index_dtype(plan),
    )
    if not uses_hisparse_allocator(plan.model, plan.serving):
        return logical
    from .hisparse_allocator import DSV4HiSparseAllocator

    # ref-000 lines 2166-2170: DeepSeekV4HiSparseTokenToKVPoolAllocator(token_to_kv_pool_allocator)
    return DSV4HiSparseAllocator(logical, sizes.c4_tokens, sizes.c128_tokens, checked=checked)
