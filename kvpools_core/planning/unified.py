"""Capacity under SGLang's unified memory pool: requests that fit when KV and state draw on one arena.

A plan with an arena (``PoolSizing.arenas``, ``--enable-unified-memory``) has no
fixed split: its sub-pools grow towards each other from the arena's two ends.
The grow-down END (the full KV) starts at the top of its last whole page,
``num_pages x page x entry``; the grow-up END (state slots, or SWA pages) at its
first slot past the sink.  ``N`` running requests of context ``L`` fit while the
two frontiers do not cross::

    N x (full_pages x page x full_entry + other_units x other_unit_bytes) <= top - bottom

where a request holds ``ceil(L / page)`` full pages, and on the other END
either ``state_slots_per_request`` state entries (Mamba: SGLang's 3 with the radix
cache, 1 without, the sizing plugin's :attr:`PoolSizing.state_slots_per_request`)
or the SWA pages its worst case holds, ``ceil(min(L, window.per_request) / page)``
(the swa plugin's :class:`~kvpools_core.values.TokenWindow`; prefill chunks in
flight are not charged, so past the window this is the decode steady state).
Each END's own index space bounds it too, as do the request cap (the static
configurator's ``max_running_requests``, which SGLang keeps under unified
memory) and the context length.  Every answer is closed form.

:func:`three_modes` puts it beside SGLang's static split of the same budget and
the best static split for the workload (:func:`kvpools_core.planning.split.choose_split`).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import attrs

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.planning.capacity import concurrency
from kvpools_core.planning.split import Workload, choose_split, parse_workload
from kvpools_core.planning.unified_tri import tri_concurrency
from kvpools_core.values import Arena, ArenaSubPool, Plan, Serving

__all__ = ["ARENA_BYTES", "ModeRow", "UnifiedCapacity", "three_modes", "unified_concurrency", "unified_workload"]

ARENA_BYTES = "arena bytes"
_CAP = "request cap"
_CONTEXT = "context length"


@attrs.frozen
class UnifiedCapacity:
    """Requests of one context length that run at once in the arena, what binds, and the arithmetic."""

    context_len: int
    concurrent_requests: int
    binding: str
    limits: Mapping[str, int]
    request_bytes: int
    """Bytes one request draws from the arena: its full pages and its state slots or SWA pages."""
    room_bytes: int
    """Bytes between the two ENDs' starting frontiers in the empty arena."""
    full_tokens: int
    other_units: int
    """State slots (Mamba) or SWA tokens (hybrid SWA) one request holds."""
    other_pool: str

    def to_dict(self) -> dict[str, Any]:
        return {**attrs.asdict(self), "limits": dict(self.limits)}


def _ends(arena: Arena) -> tuple[ArenaSubPool, ArenaSubPool]:
    down = [s for s in arena.sub_pools if s.grows == "down"]
    up = [s for s in arena.sub_pools if s.grows == "up"]
    if len(down) != 1 or len(up) != 1 or len(arena.sub_pools) != 2:
        raise UnsupportedCombinationError(
            f"kvpools does not model the capacity of arena {arena.name!r} with sub-pools "
            f"{[(s.pool, s.grows) for s in arena.sub_pools]} yet (the three-pool chain's floating middle)."
        )
    return down[0], up[0]


def _pages(tokens: int, page: int) -> int:
    return -(-tokens // page)


def unified_concurrency(plan: Plan, context_len: int) -> UnifiedCapacity:
    """How many requests of ``context_len`` tokens run at once in ``plan``'s arena (see the module docstring)."""
    if not plan.sizing.arenas:
        raise UnsupportedCombinationError("the plan has no arena: plan it with --enable-unified-memory.")
    arena = plan.sizing.arenas[0]
    if len(arena.sub_pools) == 3:  # state | SWA float | full: the tri-pool (kvpools_core.planning.unified_tri)
        return UnifiedCapacity(
            **tri_concurrency(plan, context_len, arena_key=ARENA_BYTES, cap_key=_CAP, context_key=_CONTEXT)
        )
    full, other = _ends(arena)
    page = full.page_size
    full_pages = _pages(context_len, page)
    top = (full.max_slots // page) * page * full.entry_bytes
    if other.kind == "state":
        units = max(plan.sizing.state_slots_per_request, 1)
        other_bytes = units * other.entry_bytes
        bottom = other.min_slot_index * other.entry_bytes
        other_index = (other.max_slots - other.min_slot_index) // units
    else:
        window = plan.sizing.window(
            next(p.token_space for p in plan.pools if p.name == other.pool),
        )
        held = context_len if window is None else min(context_len, window.per_request)
        other_pages = _pages(held, other.page_size)
        units = other_pages * other.page_size
        other_bytes = other_pages * other.page_size * other.entry_bytes
        bottom = _pages(other.min_slot_index, other.page_size) * other.page_size * other.entry_bytes
        other_index = (other.max_slots // other.page_size - _pages(other.min_slot_index, other.page_size)) // max(
            other_pages, 1
        )
    request_bytes = full_pages * page * full.entry_bytes + other_bytes
    room = max(top - bottom, 0)
    full_index = (full.max_slots // page - _pages(full.min_slot_index, page)) // full_pages
    limits = {
        ARENA_BYTES: room // request_bytes,
        f"{full.pool} index space": full_index,
        f"{other.pool} index space": other_index,
        _CAP: plan.max_running_requests,
    }
    context = plan.serving.context_length or plan.model.context_len
    if context_len > context:
        limits[_CONTEXT] = 0
    binding = min(limits, key=lambda name: (limits[name], name != ARENA_BYTES))
    return UnifiedCapacity(
        context_len=context_len,
        concurrent_requests=limits[binding],
        binding=binding,
        limits=limits,
        request_bytes=request_bytes,
        room_bytes=room,
        full_tokens=full_pages * page,
        other_units=units,
        other_pool=other.pool,
    )


def unified_workload(plan: Plan, workload: Workload) -> tuple[int, str]:
    """Requests of a mixed workload that run at once in the arena: the room over the mean request's bytes
    (each length's :func:`unified_concurrency` terms), capped by the request cap; and what binds."""
    answers = [unified_concurrency(plan, length) for length in workload.lengths]
    mean = Fraction(sum(a.request_bytes for a in answers), len(answers))
    by_bytes = int(Fraction(answers[0].room_bytes) / mean)
    if by_bytes <= plan.max_running_requests:
        return by_bytes, ARENA_BYTES
    return plan.max_running_requests, _CAP


@attrs.frozen
class ModeRow:
    """One context length in the three modes: SGLang's static split, the best static split, unified memory."""

    context_len: int
    static: int
    static_binding: str
    best_static: int
    best_static_flags: str
    unified: int
    unified_binding: str

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def three_modes(
    model: Any,
    serving: Serving,
    budget: Mapping[str, Any],
    lengths: list[int],
    *,
    workload: Workload | None = None,
    registry: Any = None,
) -> tuple[ModeRow, ...]:
    """Each length's concurrency in the three modes, for the same model, serving options and budget; with a
    ``workload``, one more row for it (``context_len`` 0)."""
    from kvpools_core.pipeline import plan as make_plan

    static_serving = attrs.evolve(
        serving, enable_unified_memory=False, disable_lazy_compaction=False, enable_page_major_kv_layout=False
    )
    unified = make_plan(model, serving, registry=registry, **budget)
    static = make_plan(model, static_serving, registry=registry, **budget)
    rows = []
    for length in lengths:
        base = concurrency(static, length)
        best = choose_split(model, static_serving, budget, parse_workload(str(length)), registry=registry)
        ours = unified_concurrency(unified, length)
        rows.append(
            ModeRow(
                context_len=length,
                static=base.concurrent_requests,
                static_binding=base.binding,
                best_static=best.chosen.concurrent_requests,
                best_static_flags=" ".join(best.flags()),
                unified=ours.concurrent_requests,
                unified_binding=ours.binding,
            )
        )
    if workload is not None:
        best = choose_split(model, static_serving, budget, workload, registry=registry)
        count, binding = unified_workload(
            unified, workload.within(unified.serving.context_length or unified.model.context_len)
        )
        rows.append(
            ModeRow(
                context_len=0,
                static=best.default.concurrent_requests,
                static_binding=best.default.binding,
                best_static=best.chosen.concurrent_requests,
                best_static_flags=" ".join(best.flags()),
                unified=count,
                unified_binding=binding,
            )
        )
    return tuple(rows)
