"""Capacity of a tri-pool arena (state up | SWA float | full down; SGLang's ``UnifiedMambaSWATokenToKVPoolAllocator``).

The two ENDs start at the arena's ends (the full END at the top of its last whole page, the state END at its
first slot past the sink) and the floating SWA band lives between them, so ``N`` running requests of context
``L`` fit while::

    N x (full_pages x page x full_entry + swa_pages x page x swa_entry + slots x state_entry) <= top - bottom

A request holds ``ceil(L / page)`` full pages, the SWA pages of its worst case
(``ceil(min(L, window.per_request) / page)``, the sizing plugin's
:class:`~kvpools_core.values.TokenWindow`; prefill chunks in flight are not charged, so past the window this is
the decode steady state) and ``state_slots_per_request`` state entries.  The float's pages sit on its own page
grid, but the composite moves the float on demand (``ensure_capacity``), so no alignment slack binds: driven to
the limit through ``UnifiedMambaSWAAllocator`` the arena holds exactly this many requests
(``tests/unified/test_unified_tri.py``).  Each sub-pool's index space, the request cap and the context length
bound it too.  :func:`kvpools_core.planning.unified.unified_concurrency` answers with this for a three-sub-pool
arena.
"""

from __future__ import annotations

from typing import Any

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.values import Arena, ArenaSubPool, Plan

__all__ = ["tri_concurrency"]


def _pages(tokens: int, page: int) -> int:
    return -(-tokens // page)


def tri_members(arena: Arena) -> tuple[ArenaSubPool, ArenaSubPool, ArenaSubPool]:
    """(full, SWA, state) of a tri-pool arena, or a refusal naming the sub-pools."""
    by = {s.grows: s for s in arena.sub_pools}
    if sorted(by) != ["down", "float", "up"] or len(arena.sub_pools) != 3 or by["up"].kind != "state":
        raise UnsupportedCombinationError(
            f"kvpools does not model the capacity of arena {arena.name!r} with sub-pools "
            f"{[(s.pool, s.grows) for s in arena.sub_pools]}: a three-sub-pool arena is state (up), SWA (float), "
            "full (down)."
        )
    return by["down"], by["float"], by["up"]


def tri_concurrency(plan: Plan, context_len: int, *, arena_key: str, cap_key: str, context_key: str) -> dict[str, Any]:
    """How many requests of ``context_len`` tokens run at once in ``plan``'s tri-pool arena (module docstring): the
    fields of :class:`kvpools_core.planning.unified.UnifiedCapacity`, whose limit names the caller gives."""
    arena = plan.sizing.arenas[0]
    full, swa, state = tri_members(arena)
    page = full.page_size
    full_pages = _pages(context_len, page)
    window = plan.sizing.window(next(p.token_space for p in plan.pools if p.name == swa.pool))
    held = context_len if window is None else min(context_len, window.per_request)
    swa_pages = _pages(held, swa.page_size)
    slots = max(plan.sizing.state_slots_per_request, 1)
    swa_page_bytes = swa.page_size * swa.entry_bytes
    request_bytes = full_pages * page * full.entry_bytes + swa_pages * swa_page_bytes + slots * state.entry_bytes
    top = (full.max_slots // page) * page * full.entry_bytes
    bottom = state.min_slot_index * state.entry_bytes
    room = max(top - bottom, 0)
    limits = {
        arena_key: room // request_bytes,
        f"{full.pool} index space": (full.max_slots // page - _pages(full.min_slot_index, page)) // full_pages,
        f"{swa.pool} index space": (swa.max_slots // swa.page_size - _pages(swa.min_slot_index, swa.page_size))
        // max(swa_pages, 1),
        f"{state.pool} index space": (state.max_slots - state.min_slot_index) // slots,
        cap_key: plan.max_running_requests,
    }
    if context_len > (plan.serving.context_length or plan.model.context_len):
        limits[context_key] = 0
    binding = min(limits, key=lambda name: (limits[name], name != arena_key))
    return dict(
        context_len=context_len,
        concurrent_requests=limits[binding],
        binding=binding,
        limits=limits,
        request_bytes=request_bytes,
        room_bytes=room,
        full_tokens=full_pages * page,
        other_units=swa_pages * swa.page_size,
        other_pool=swa.pool,
    )
