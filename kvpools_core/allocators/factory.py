"""Which allocator a plan gets, and what it costs, decided in one place.

The planner charges ``allocator_planned_nbytes`` and the builder constructs
``allocator_for_plan``; both go through ``allocator_class`` so the bytes
charged are the bytes held.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvpools_core.allocators.paged import PagedAllocator
from kvpools_core.allocators.sizes import allocator_planned_nbytes
from kvpools_core.allocators.token import TokenAllocator

if TYPE_CHECKING:
    from kvpools_core.values import Plan

__all__ = ["allocator_class", "allocator_for_plan", "allocator_planned_nbytes", "slot_index_dtype"]


def allocator_class(page_size: int) -> type[TokenAllocator] | type[PagedAllocator]:
    """SGLang's choice: the token allocator for page size 1, else the paged one."""
    return TokenAllocator if page_size == 1 else PagedAllocator


def allocator_for_plan(
    plan: Plan,
    device: str | torch.device,
    *,
    checked: bool = False,
    kvcache: object = None,
    widen_dcp: bool = True,
) -> TokenAllocator | PagedAllocator:
    """The allocator over the plan's ``max_total_num_tokens`` slots, holding the KV pool ``kvcache``.

    ``need_sort`` is on in PD disaggregation (prefill or decode), as in SGLang,
    so KV transfers see ascending slot ids.  ``checked`` builds it in checked
    mode (double frees refused; ``2 * (pages + 1)`` bytes beyond the plan).  The
    allocator's ``get_kvcache`` returns ``kvcache`` and its ``get_cpu_copy`` /
    ``load_cpu_copy`` go through it (``build`` passes the pool it built).

    Under decode context parallelism SGLang widens the id space: ``PagedTokenToKVPoolAllocator(S x dcp,
    page x dcp)`` even at page size 1 (ref-000 lines 2145-2164), so its ids are logical tokens, ``dcp`` per
    physical slot of each rank.  ``widen_dcp=False`` keeps the per-rank geometry (the capacity replay's).
    """
    dcp = plan.serving.dcp_size if widen_dcp else 1
    page_size = plan.serving.page_size * dcp
    need_sort = plan.serving.disaggregation_mode in ("prefill", "decode")
    tokens = plan.max_total_num_tokens * dcp
    if page_size == 1:
        return TokenAllocator(tokens, device=device, kvcache=kvcache, need_sort=need_sort, checked=checked)
    return PagedAllocator(
        tokens,
        page_size,
        device=device,
        kvcache=kvcache,
        need_sort=need_sort,
        checked=checked,
        index_dtype=slot_index_dtype(plan),
    )


def slot_index_dtype(plan: Plan) -> torch.dtype:
    """The dtype of the slot ids the plan's platform takes (``PlatformTraits.slot_index_dtype``): paged
    allocators hand them out in it (SGLang's NPU allocators return int32)."""
    return getattr(torch, plan.serving.traits.slot_index_dtype)  # type: ignore[no-any-return]
