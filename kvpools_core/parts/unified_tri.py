"""Planning SGLang 0.5.23's unified tri-pool: state (grow-up END) | SWA KV (floating middle) | full KV (grow-down END).

A model that is both a Mamba hybrid and a sliding-window hybrid (Inkling-class) gets, under
``--enable-unified-memory``, one arena of three sub-pools (``init_unified_mamba_swa_pools`` in
``mem_cache/unified_memory_pool.py``; ``UnifiedMambaSWATokenToKVPoolAllocator`` in
``allocator/unified_hybrid_swa.py``): the state slots at the bottom, the full KV at the top, the SWA KV floating
between them.  :func:`unified_tri_sizing` turns a plugin's static answer into that plan, as
:func:`~kvpools_core.parts.unified_plan.unified_sizing` does for the two-END arenas:

* the arena is ``unified_total_bytes`` (the KV budget left after ``_handle_max_mamba_cache``, floored to
  4,096 B by ``config_from_budget``) plus ``max_mamba_cache_size`` state entries on top (the factory's profiled
  branch); under ``--accounting exact`` it is the budget less every other pool and the allocators' tables;
* the sink is ``_reserved_floor_bytes`` over the three entries; each sub-pool spans the whole arena;
* the boot labels are the configurator's (``HybridSWAPoolConfigurator._max_unified_full_tokens`` for
  ``full_max_total_num_tokens``, its ratio split for ``swa_max_total_num_tokens``), the composite's
  ``mamba_slot_full_token_cost`` (``ceil(state entry / (full entry + SWA entry))``) and K;
* the batch-size-1 floor is one sliding window of SWA KV (+ a page, clamped to the context), three state slots
  and the sink.

The plan's ``max_total_num_tokens`` is the boot corner as for the other arenas: the full END's reach in the empty
arena (the parked float is transparent, so the full END reaches down to the state END's first page).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvpools_core.parts.unified import (
    SubPoolEntry,
    SubPoolGeometry,
    arena_bytes,
    bs1_floor_terms,
    empty_end_available_tokens,
    mamba_arena_bytes,
    mamba_slot_full_token_cost,
    sink_bytes,
    sub_pool_geometry,
)
from kvpools_core.parts.unified_plan import (
    allocator_table_bytes,
    arena_member,
    arena_notes,
    arena_pools,
    arena_too_small,
    geometry_or_fail,
)
from kvpools_core.values import (
    FULL_TOKENS,
    PoolSizing,
    Serving,
)

__all__ = ["TriPoolMembers", "tri_allocator_table_bytes", "unified_tri_sizing"]


@attrs.frozen
class TriPoolMembers:
    """The three static pools that become the tri-pool's sub-pools, with their entries; ``swa_space`` is the
    SWA sub-pool's token space."""

    full_pool: str
    full: SubPoolEntry
    swa_pool: str
    swa: SubPoolEntry
    state_pool: str
    state: SubPoolEntry
    swa_space: str

    @property
    def entries(self) -> tuple[SubPoolEntry, SubPoolEntry, SubPoolEntry]:
        return (self.full, self.swa, self.state)


def tri_geometry(total: int, members: TriPoolMembers, page_size: int) -> dict[str, SubPoolGeometry]:
    sink = sink_bytes(members.entries, page_size)
    return {e.name: sub_pool_geometry(total, e, sink, page_size) for e in members.entries}


def tri_allocator_table_bytes(geometry: dict[str, SubPoolGeometry], members: TriPoolMembers) -> int:
    """The tri composite's int64 tables at boot: the full END owns the token virtual ids and the floating SWA
    binds them (:func:`allocator_table_bytes` with shared ids), the state END owns its own."""
    kv = {members.full.name: geometry[members.full.name], members.swa.name: geometry[members.swa.name]}
    state = {members.state.name: geometry[members.state.name]}
    return allocator_table_bytes(kv, members.full.name, shared_ids=True) + allocator_table_bytes(
        state, members.state.name, shared_ids=False
    )


def unified_tri_sizing(
    static: PoolSizing,
    serving: Serving,
    *,
    budget_bytes: int,
    token_budget_bytes: int,
    members: TriPoolMembers,
    drop: Sequence[str],
    owner: str,
    model_name: str,
    context_len: int,
    sliding_window: int,
    max_mamba_cache_size: int,
    full_max_total_num_tokens: int,
    swa_max_total_num_tokens: int,
) -> PoolSizing:
    """The ``size_pools`` answer of a tri-pool model under ``--enable-unified-memory``, from its static answer.

    ``token_budget_bytes`` is SGLang's profiled budget after the state carve-out; ``full_max_total_num_tokens``
    and ``swa_max_total_num_tokens`` are the configurator's unified boot labels (the plugin computes them);
    ``drop`` are the static pools the arena and the unified allocators replace.
    """
    page = serving.page_size
    names = {members.full_pool, members.swa_pool, members.state_pool, *drop}
    kept = [p for p in static.pools if p.name not in names]

    def geometry(total: int) -> dict[str, SubPoolGeometry]:
        return tri_geometry(total, members, page)

    if serving.accounting == "sglang":
        total = mamba_arena_bytes(arena_bytes(token_budget_bytes), max_mamba_cache_size, members.state)
    else:
        rest = budget_bytes - sum(p.bytes for p in kept)
        first = arena_bytes(max(rest, 0))
        tables = tri_allocator_table_bytes(
            geometry_or_fail(lambda t: tri_geometry(t, members, page), first, model_name), members
        )
        total = arena_bytes(max(rest - tables, 0))
    geo = geometry_or_fail(geometry, total, model_name)
    g_full, g_state = geo[members.full.name], geo[members.state.name]
    tokens = empty_end_available_tokens(g_full, g_state)
    terms = bs1_floor_terms(
        entries=members.entries,
        page_size=page,
        state=members.state,
        swa=members.swa,
        context_len=context_len,
        sliding_window=sliding_window,
    )
    arena_too_small(total, terms, tokens, page, where="init_unified_mamba_swa_pools", model_name=model_name)
    labels = {
        "full_max_total_num_tokens": full_max_total_num_tokens,
        "swa_max_total_num_tokens": swa_max_total_num_tokens,
        "max_mamba_cache_size": max_mamba_cache_size,
        "mamba_slot_full_token_cost": mamba_slot_full_token_cost(members.state, members.full, swa=members.swa),
    }
    grows = {members.full.name: "down", members.swa.name: "float", members.state.name: "up"}
    pools_of = {members.full.name: members.full_pool, members.swa.name: members.swa_pool}
    pools_of[members.state.name] = members.state_pool
    spaces = {members.full.name: FULL_TOKENS, members.swa.name: members.swa_space, members.state.name: ""}
    sub_pools, member_pools = [], []
    for entry in members.entries:
        sub_pool, member_pool = arena_member(
            entry,
            geo[entry.name],
            pool=pools_of[entry.name],
            grows=grows[entry.name],
            slots=tokens if entry is members.full else 0,
            owner=owner,
            token_space=spaces[entry.name] or FULL_TOKENS,
        )
        sub_pools.append(sub_pool)
        member_pools.append(member_pool)
    arena, pools = arena_pools(
        total=total,
        sink=sink_bytes(members.entries, page),
        sub_pools=sub_pools,
        labels=labels,
        terms=terms,
        serving=serving,
        owner=owner,
        member_pools=member_pools,
        kept=kept,
        tables=tri_allocator_table_bytes(geo, members),
    )
    notes = [
        *arena_notes(
            f"unified memory tri-pool (--enable-unified-memory, init_unified_mamba_swa_pools): one {total:,} B arena",
            arena,
            terms,
        ),
        "the SWA sub-pool floats between the state END and the full END: the split between full tokens, SWA "
        "tokens and state slots moves at run time; max_total_num_tokens is the full side's reach in the empty "
        "arena (kvpools capacity)",
    ]
    if serving.accounting == "sglang":
        notes.append(
            f"SGLang's arena: unified_total_bytes (the budget after the state cache, floored to 4,096 B) + "
            f"max_mamba_cache_size x state entry = {max_mamba_cache_size:,} x {members.state.entry_bytes:,} B on top"
        )
    return attrs.evolve(
        static,
        max_total_num_tokens=tokens,
        pools=pools,
        token_counts={FULL_TOKENS: tokens, members.swa_space: 0},
        state_slots=0,
        arenas=(arena,),
        notes=(*static.notes, *notes),
        sglang_config={
            **static.sglang_config,
            "max_total_num_tokens": tokens,
            "full_max_total_num_tokens": full_max_total_num_tokens,
            "swa_max_total_num_tokens": swa_max_total_num_tokens,
            "unified_total_bytes": total,
        },
    )
