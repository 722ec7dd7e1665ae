"""DeepSeek-V4's per-request SWA ring on the target (SGLang 0.5.23, issue 33, ledger row 000-024), torch-free.

A ``DeepSeekV4TokenToKVPool`` that keeps its SWA rows in a ring per request slot sets ``swa_req_ring_size``
(``mem_cache/deepseek_v4_memory_pool.py`` lines 1196-1224: the unified-KV pool, ``swa_req_ring_size =
unified_swa_ring_size = get_swa_ring_size(window, speculative)``).  The target keeps the paged SWA allocator
(``needs_paged_swa_allocator``, line 1134, true without encoder replay), so ref-000's
``_build_token_to_kv_pool_allocator`` (lines 2118-2128) builds ``SWATokenToKVPoolAllocator(full, swa, ...,
req_to_token_pool=...)``, which reads ``kvcache.swa_req_ring_size`` and runs in ring mode
(``mem_cache/allocator/swa.py`` lines 128-151): the ring cost is the ring in whole pages,
``ceil(ring / page) x page`` (``swa_ring_cost_tokens``), and ``size_swa`` = the request table's free slots (all
of them at construction: ``ReqToTokenPool.available_size``) x that cost.  ref-000's ``configure`` (lines 377-387)
then reports that ring total as ``swa_max_total_num_tokens`` ("fixed per-request SWA ring capacity"), while the
sizer's paged count stays the vestigial SWA free list's (and the c4 states') size.

The plan keeps the sizer's count under ``swa_max_total_num_tokens`` (the pools are built from it) and records the
configured ring capacity beside it: ``swa_ring_cost_tokens`` and ``swa_ring_max_total_num_tokens``.  The build
pairs the pool with :class:`kvpools_core.allocators.swa_ring.SWARingTokenToKVPoolAllocator` (:func:`ring_allocator`).
A draft worker is excluded (``configure``: ``not self.is_draft_worker``), and encoder replay (row 000-119) is
refused by ``Serving`` before a plan gets here.
"""

from __future__ import annotations

from typing import Any

from kvpools_core.parts.sizing import req_to_token_rows
from kvpools_core.values import Plan, Serving

from .unified import UNIFIED_BF16, UNIFIED_FP8, dsv4_layout, swa_ring_size

__all__ = ["RING_COST", "RING_TOTAL", "ring_allocator", "ring_capacity", "ring_notes"]

RING_COST = "swa_ring_cost_tokens"
RING_TOTAL = "swa_ring_max_total_num_tokens"


def ring_capacity(serving: Serving, window: int, max_running_requests: int) -> dict[str, int]:
    """The configured SWA capacity of a ring-mode target: ``{swa_ring_cost_tokens, swa_ring_max_total_num_tokens}``
    (empty on the separate-KV layout, whose SWA rows are paged, and on a platform's own layout: Ascend's NPU pool
    pages its SWA rows too, ``DSV4NPUTokenToKVPool`` builds no unified ring)."""
    if dsv4_layout(serving) not in (UNIFIED_BF16, UNIFIED_FP8):
        return {}
    page = serving.page_size
    cost = -(-swa_ring_size(window, serving) // page) * page
    slots, _padding = req_to_token_rows(max_running_requests, serving)
    return {RING_COST: cost, RING_TOTAL: slots * cost}


def ring_notes(serving: Serving, window: int, max_running_requests: int, paged_swa: int) -> list[str]:
    """How the ring capacity was decided (nothing on the separate-KV layout)."""
    ring = ring_capacity(serving, window, max_running_requests)
    if not ring:
        return []
    slots, _padding = req_to_token_rows(max_running_requests, serving)
    return [
        f"SWA capacity: a per-request SWA ring (swa_req_ring_size {swa_ring_size(window, serving)}), so SGLang's SWA "
        f"allocator runs in ring mode: {slots:,} request slot(s) x ring cost {ring[RING_COST]:,} tokens (the ring "
        f"in whole pages of {serving.page_size}) = {ring[RING_TOTAL]:,} SWA tokens, the swa_max_total_num_tokens "
        f"SGLang reports; the sizer's paged {paged_swa:,} tokens only size the vestigial SWA free list."
    ]


def ring_allocator(plan: Plan, pool: Any, device: str, checked: bool, index_dtype: Any) -> Any:
    """``SWATokenToKVPoolAllocator`` in ring mode for a pool with a per-request SWA ring.

    The hook gets no request table, so the allocator counts the plan's request slots at construction (SGLang's
    ``req_to_token_pool.available_size()`` then: every slot free); :func:`kvpools_core.building.build` binds the
    table it built (``bind_req_to_token_pool``), so ``swa_available_size`` follows its free slots.
    """
    from kvpools_core.allocators.swa_ring import SWARingTokenToKVPoolAllocator

    from .pool import sizes_of

    sizes = sizes_of(plan)
    page = plan.serving.page_size
    slots, _padding = req_to_token_rows(plan.max_running_requests, plan.serving)
    return SWARingTokenToKVPoolAllocator(
        sizes.full_tokens,
        sizes.swa_tokens // page * page,
        page,
        mapping=pool.full_to_swa_index_mapping,
        kvcache=pool,
        device=device,
        need_sort=plan.serving.disaggregation_mode in ("prefill", "decode"),
        req_to_token_pool=_FreeSlots(slots),
        ring_size=pool.unified_kv_pool.geometry.ring,
        checked=checked,
        index_dtype=index_dtype,
    )


class _FreeSlots:
    """The request table as the allocator first reads it: every usable row free."""

    def __init__(self, slots: int) -> None:
        self.slots = slots

    def available_size(self) -> int:
        return self.slots
