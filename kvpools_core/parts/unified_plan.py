"""Planning SGLang 0.5.23's unified memory pool: serving refusals and the arena plan any architecture can answer.

:mod:`kvpools_core.parts.unified` is the arithmetic from plain values; this
module turns it into plan values.  An architecture plugin that SGLang builds
the unified pool for (it names ``"unified_memory"`` in ``engine_features``)
sizes its static pools as usual, then answers ``size_pools`` with
:func:`unified_sizing`: the pools it names as sub-pools become members of one
:class:`~kvpools_core.values.Arena` (``PoolSpec.arena``), the arena becomes one
pool of its own, and the boot labels, the sink and the batch-size-1 floor are
recorded.  The plugins' static pools that stay (request table, request
mapping) are kept; the static allocators' free lists give way to the unified
allocators' page tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from kvpools_core.errors import InsufficientMemoryError, InvalidValueError, UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parts.unified import (
    ENTRY_ALIGN_BYTES,
    SubPoolEntry,
    SubPoolGeometry,
    UnifiedRequest,
    arena_bytes,
    bs1_floor_problem,
    bs1_floor_terms,
    empty_end_available_tokens,
    hybrid_swa_token_capacity,
    mamba_arena_bytes,
    mamba_size_full,
    mamba_slot_full_token_cost,
    row_alignment_problems,
    sink_bytes,
    sub_pool_geometry,
    unified_memory_problems,
)
from kvpools_core.values import (
    FIXED,
    FULL_TOKENS,
    STATE_SLOT,
    TOKEN,
    Arena,
    ArenaSubPool,
    CellSize,
    PoolSizing,
    PoolSpec,
    Serving,
)

__all__ = [
    "ALLOCATOR_POOL",
    "ARENA_POOL",
    "UNIFIED_FEATURE",
    "ArenaMember",
    "allocator_table_bytes",
    "arena_member",
    "arena_notes",
    "arena_pools",
    "arena_rows",
    "arena_too_small",
    "geometry_or_fail",
    "kv_entry_from_cell",
    "serving_problems",
    "state_entry_from_cell",
    "unified_request",
    "unified_sizing",
]

ARENA_POOL = "unified_arena"
"""The plan pool (kind ``"arena"``) that allocates the one ``uint8`` buffer."""
ALLOCATOR_POOL = "unified_allocator"
"""The unified allocators' page tables (virtual-to-physical, physical-to-virtual, free virtual ids, offsets)."""
UNIFIED_FEATURE = "unified_memory"
"""The ``engine_features`` name of ``--enable-unified-memory``."""
_I64 = 8


@attrs.frozen
class ArenaMember:
    """A static pool that becomes a sub-pool of the arena: its plan name, its entry, where it grows.

    ``token_space`` is the token space a KV sub-pool's slots are tokens of; a state sub-pool's slots are state slots.
    """

    pool: str
    entry: SubPoolEntry
    grows: str
    token_space: str = FULL_TOKENS


def kv_entry_from_cell(cell: CellSize, pool: str, layer_num: int) -> SubPoolEntry:
    """A KV sub-pool's token-major entry from the cell's parts of ``pool``: their bytes per token over all
    ``layer_num`` layers, rounded up to 32 B; each part's per-layer row is checked against the 16 B rule."""
    parts = [p for p in cell.parts_of(TOKEN) if p.pool == pool]
    total = sum(p.bytes_per_token for p in parts)
    entry = -(-total // ENTRY_ALIGN_BYTES) * ENTRY_ALIGN_BYTES
    rows = tuple((p.name, p.bytes_per_token // layer_num) for p in parts)
    return SubPoolEntry(pool, "kv", layer_num, entry, rows)


def state_entry_from_cell(
    cell: CellSize, pool: str, layer_num: int, parts: Sequence[tuple[str, int]] = ()
) -> SubPoolEntry:
    """A state sub-pool's entry: the cell's state-slot parts of ``pool``, raw (no rounding).

    ``parts`` are one layer's state parts in the engine's entry order (``state_parts``: the conv tensors, then the
    temporal state), so the arena carves them where SGLang does (part-major); they must fill the entry exactly.
    """
    total = sum(p.bytes_per_token for p in cell.parts_of(STATE_SLOT) if p.pool == pool)
    layers = max(layer_num, 1)
    if parts and layers * sum(b for _, b in parts) != total:
        raise InvalidValueError(
            f"The state parts {list(parts)} of sub-pool {pool!r} take {layers} x {sum(b for _, b in parts):,} B, "
            f"not the cell's {total:,} B per state slot; give the parts of one layer's state on this rank."
        )
    return SubPoolEntry(pool, "state", layers, total, parts=tuple((n, int(b)) for n, b in parts))


def arena_rows(entry: SubPoolEntry) -> dict[str, Any]:
    """An entry's rows as an :class:`ArenaSubPool` states them: a KV entry's rows layer-major, a state entry's
    parts part-major (one opaque row per layer when its parts are not known)."""
    if entry.kind == "state" and entry.parts:
        return {"row_bytes": tuple(b for _, b in entry.parts), "row_order": "part"}
    return {"row_bytes": tuple(b for _, b in entry.rows)}


def unified_request(serving: Serving, *, is_mamba: bool, is_hybrid_swa: bool, is_mla: bool) -> UnifiedRequest:
    """The serving facts SGLang's unified-memory rules read, from a :class:`Serving` and the model class."""
    return UnifiedRequest(
        is_mamba=is_mamba,
        is_hybrid_swa=is_hybrid_swa,
        is_mla=is_mla,
        kv_cache_dtype=serving.kv_cache_dtype,
        speculative_algorithm=serving.speculative_algorithm,
        speculative_eagle_topk=serving.speculative_eagle_topk,
        enable_hierarchical_cache=serving.enable_hierarchical_cache,
        enable_hisparse=serving.enable_hisparse,
        lazy_compaction=serving.lazy_compaction,
        disaggregation_mode=serving.disaggregation_mode,
        disaggregation_decode_retraction_backup=serving.disaggregation_decode_retraction_backup,
        pp_size=serving.pp_size,
        dcp_size=serving.dcp_size,
    )


_NOT_MODELLED: tuple[tuple[str, Callable[[Serving], bool], str], ...] = (
    ("speculative_algorithm", lambda s: s.speculative, "the fused draft region a speculative draft takes in the arena"),
    ("enable_hierarchical_cache", lambda s: s.enable_hierarchical_cache, "the page-envelope host tier"),
    ("disaggregation_mode", lambda s: s.disaggregation_mode != "null", "PD disaggregation's whole-envelope transfer"),
    ("pp_size", lambda s: s.pp_size > 1, "a per-stage arena under pipeline parallelism"),
    ("dcp_size", lambda s: s.dcp_size > 1, "the DCP-widened virtual ids"),
    ("max_total_tokens", lambda s: s.max_total_tokens is not None, "an arena sized from a token cap"),
    ("accounting", lambda s: s.accounting not in ("exact", "sglang"), "another engine's accounting"),
)


def serving_problems(
    serving: Serving,
    *,
    model_name: str,
    is_mamba: bool,
    is_hybrid_swa: bool,
    is_mla: bool,
    entries: Sequence[SubPoolEntry] = (),
) -> list[str]:
    """Why ``--enable-unified-memory`` cannot be planned for this model and serving: SGLang's refusals first
    (:func:`~kvpools_core.parts.unified.unified_memory_problems`, the 16 B row rule on ``entries``), then what
    kvpools does not model yet.  Empty when it is off or accepted."""
    if not serving.enable_unified_memory:
        return []
    req = unified_request(serving, is_mamba=is_mamba, is_hybrid_swa=is_hybrid_swa, is_mla=is_mla)
    problems = [*unified_memory_problems(req), *row_alignment_problems(entries)]
    found = [f"SGLang 0.5.23 refuses it for {model_name}: {p.reason} {p.fix}" for p in problems]
    if found:
        return found
    o = option
    return [
        f"kvpools does not model {what} under {o('enable_unified_memory')} yet ({o(name)} "
        f"{getattr(serving, name)!r}). Drop {o(name)}, or plan without {o('enable_unified_memory')}."
        for name, applies, what in _NOT_MODELLED
        if applies(serving)
    ]


def allocator_table_bytes(geometry: Mapping[str, SubPoolGeometry], owner: str, *, shared_ids: bool) -> int:
    """The unified allocators' tables at boot (``kvpools_core.allocators.unified.MultiEndedAllocator``), int64 each.

    Per END: ``virtual_to_physical`` (its virtual pages + 1), ``physical_to_virtual`` (its pages + 1) and the
    in-page offsets (its page); an id owner also its free virtual ids (its pages past the sink).  With
    ``shared_ids`` (hybrid SWA) the other END binds ``owner``'s virtual pages and owns none; without (Mamba) each
    END owns its own.
    """
    own = geometry[owner]
    total = 0
    for name, g in geometry.items():
        owns = name == owner or not shared_ids
        virtual = g.num_pages if owns else own.num_pages
        total += (virtual + 1) + (g.num_pages + 1) + g.page_size
        if owns:
            total += g.num_pages - g.min_page_index
    return total * _I64


def unified_sizing(
    static: PoolSizing,
    serving: Serving,
    *,
    budget_bytes: int,
    members: Sequence[ArenaMember],
    drop: Sequence[str],
    owner: str,
    model_name: str,
    context_len: int,
    sliding_window: int | None = None,
    max_mamba_cache_size: int | None = None,
    token_budget_bytes: int | None = None,
) -> PoolSizing:
    """The ``size_pools`` answer under ``--enable-unified-memory``, from the plugin's static answer.

    ``members`` (the full side, grow down; the state or SWA side, grow up) become sub-pools of one arena;
    ``drop`` are static pools the unified allocators replace (free lists, slot allocators).  The arena is
    SGLang's under ``--accounting sglang``: ``unified_total_bytes``, the token side's budget
    (``token_budget_bytes``, SGLang's profiled budget after ``_handle_max_mamba_cache`` took the state cache out;
    the whole budget without a state cache) floored to 4,096 B, plus the ``max_mamba_cache_size`` state entries
    the Mamba factories put back on top.  Under ``exact`` it is the budget less every other pool, floored, so the
    plan fits its budget.  The plan's counts are the boot corner: the
    full side holds every token it can reach in the empty arena (the full END's availability), nothing else is
    live; other splits are the capacity planner's (:mod:`kvpools_core.planning.unified`).
    """
    page = serving.page_size
    if sorted(m.grows for m in members) != ["down", "up"]:
        raise UnsupportedCombinationError(
            f"kvpools does not plan the unified arena of {model_name} with sub-pools "
            f"{[(m.pool, m.grows) for m in members]} yet: only one grow-down and one grow-up sub-pool (the Mamba+SWA "
            f"chain's floating middle is not planned). Drop {option('enable_unified_memory')}."
        )
    full = next(m for m in members if m.grows == "down")
    others = [m for m in members if m is not full]
    names = {m.pool for m in members} | set(drop)
    kept = [p for p in static.pools if p.name not in names]
    entries = [m.entry for m in members]
    sink = sink_bytes(entries, page)
    state = next((m.entry for m in others if m.entry.kind == "state"), None)
    swa = next((m.entry for m in others if m.entry.kind == "kv"), None)

    def geometry(total: int) -> dict[str, SubPoolGeometry]:
        return {m.entry.name: sub_pool_geometry(total, m.entry, sink, page) for m in members}

    if serving.accounting == "sglang":
        total = arena_bytes(budget_bytes if token_budget_bytes is None else token_budget_bytes)
        if state is not None and max_mamba_cache_size is not None:
            total = mamba_arena_bytes(total, max_mamba_cache_size, state)
    else:
        rest = budget_bytes - sum(p.bytes for p in kept)
        first = arena_bytes(max(rest, 0))
        tables = allocator_table_bytes(
            geometry_or_fail(geometry, first, model_name), full.entry.name, shared_ids=swa is not None
        )
        total = arena_bytes(max(rest - tables, 0))
    geo = geometry_or_fail(geometry, total, model_name)
    g_full = geo[full.entry.name]
    tokens = empty_end_available_tokens(g_full, geo[others[0].entry.name])
    terms = bs1_floor_terms(
        entries=entries, page_size=page, state=state, swa=swa, context_len=context_len, sliding_window=sliding_window
    )
    arena_too_small(total, terms, tokens, page, where="unified memory pool", model_name=model_name)
    labels: dict[str, int] = {}
    if state is not None:
        labels["size_full"] = mamba_size_full(g_full)
        labels["size_mamba"] = geo[state.name].max_slots - 1
        labels["mamba_slot_full_token_cost"] = mamba_slot_full_token_cost(state, full.entry, swa=swa)
        if max_mamba_cache_size is not None:
            labels["max_mamba_cache_size"] = max_mamba_cache_size
    else:
        labels["size_full"] = tokens
        labels["hybrid_swa_token_capacity"] = hybrid_swa_token_capacity(tokens, serving.max_total_tokens)
        if "full_max_total_num_tokens" in static.sglang_config:
            labels["full_max_total_num_tokens"] = int(static.sglang_config["full_max_total_num_tokens"])
    counts: dict[str, int] = {FULL_TOKENS: tokens}
    sub_pools, member_pools = [], []
    for m in members:
        slots = tokens if m is full else 0
        if m.entry.kind == "kv":
            counts.setdefault(m.token_space, slots)
        sub_pool, member_pool = arena_member(
            m.entry, geo[m.entry.name], pool=m.pool, grows=m.grows, slots=slots, owner=owner, token_space=m.token_space
        )
        sub_pools.append(sub_pool)
        member_pools.append(member_pool)
    tables = allocator_table_bytes(geo, full.entry.name, shared_ids=swa is not None)
    arena, pools = arena_pools(
        total=total,
        sink=sink,
        sub_pools=sub_pools,
        labels=labels,
        terms=terms,
        serving=serving,
        owner=owner,
        member_pools=member_pools,
        kept=kept,
        tables=tables,
    )
    notes = [
        *arena_notes(f"unified memory (--enable-unified-memory): one {total:,} B arena", arena, terms),
        "the split between the sub-pools moves at run time: max_total_num_tokens is the full side's reach in the "
        "empty arena; each live state slot or SWA token takes its entry's bytes from it (kvpools capacity)",
    ]
    if serving.accounting == "sglang" and state is not None and max_mamba_cache_size:
        notes.append(
            f"SGLang's arena: unified_total_bytes (the budget after the state cache, floored to 4,096 B) + "
            f"max_mamba_cache_size x state entry = {max_mamba_cache_size:,} x {state.entry_bytes:,} B on top "
            "(init_unified_mamba_pools)"
        )
    return attrs.evolve(
        static,
        max_total_num_tokens=tokens,
        pools=pools,
        token_counts=counts,
        token_space_sizing={k: v for k, v in static.token_space_sizing.items() if k in counts},
        state_slots=0,
        arenas=(arena,),
        notes=(*static.notes, *notes),
        sglang_config={**static.sglang_config, "max_total_num_tokens": tokens, "unified_total_bytes": total},
    )


def arena_member(
    entry: SubPoolEntry,
    geometry: SubPoolGeometry,
    *,
    pool: str,
    grows: str,
    slots: int,
    owner: str,
    token_space: str,
) -> tuple[ArenaSubPool, PoolSpec]:
    """One sub-pool of the arena: its row in the arena's geometry, and its member pool in the plan (``slots`` of
    them live at the boot corner; a state member counts state slots, a KV member tokens of ``token_space``)."""
    sub_pool = ArenaSubPool(
        pool=pool,
        kind=entry.kind,
        entry_bytes=entry.entry_bytes,
        page_size=geometry.page_size,
        max_slots=geometry.max_slots,
        min_slot_index=geometry.min_slot_index,
        grows=grows,
        layer_num=entry.layer_num,
        **arena_rows(entry),
    )
    is_kv = entry.kind == "kv"
    member_pool = PoolSpec(
        name=pool,
        kind="kv" if is_kv else "state",
        slots=slots,
        bytes_per_slot=entry.entry_bytes,
        bytes=slots * entry.entry_bytes,
        owner=owner,
        unit=TOKEN if is_kv else STATE_SLOT,
        token_space=token_space,
        arena=ARENA_POOL,
    )
    return sub_pool, member_pool


def arena_pools(
    *,
    total: int,
    sink: int,
    sub_pools: Sequence[ArenaSubPool],
    labels: Mapping[str, int],
    terms: Sequence[tuple[str, int]],
    serving: Serving,
    owner: str,
    member_pools: Sequence[PoolSpec],
    kept: Sequence[PoolSpec],
    tables: int,
) -> tuple[Arena, list[PoolSpec]]:
    """The arena and the plan's pools around it: the arena as one pool, its members (which charge nothing of
    their own), the static pools that stay, and the unified allocators' tables (not in SGLang's budget)."""
    arena = Arena(
        name=ARENA_POOL,
        bytes=total,
        sink_bytes=sink,
        sub_pools=tuple(sub_pools),
        labels=dict(labels),
        floor_bytes=sum(b for _, b in terms),
        lazy_compaction=serving.lazy_compaction,
    )
    pools = [
        PoolSpec(name=ARENA_POOL, kind="arena", slots=1, bytes_per_slot=total, bytes=total, owner=owner, unit=FIXED),
        *member_pools,
        *kept,
        PoolSpec(
            name=ALLOCATOR_POOL,
            kind="allocator",
            slots=1,
            bytes_per_slot=tables,
            bytes=tables,
            owner=owner,
            sglang_charged=False,
            unit=FIXED,
        ),
    ]
    return arena, pools


def arena_notes(headline: str, arena: Arena, terms: Sequence[tuple[str, int]]) -> list[str]:
    """The plan's two notes on an arena: its sub-pools, and SGLang's boot labels with the batch-size-1 floor."""
    return [
        f"{headline}, sink {arena.sink_bytes:,} B; "
        + "; ".join(
            f"{s.pool} entry {s.entry_bytes:,} B, max_slots {s.max_slots:,}, grows {s.grows}" for s in arena.sub_pools
        ),
        "SGLang's boot labels: "
        + ", ".join(f"{k} = {v:,}" for k, v in arena.labels.items())
        + f"; the batch-size-1 floor is {sum(b for _, b in terms):,} B ("
        + " + ".join(f"{k} {v:,}" for k, v in terms)
        + ")",
    ]


def arena_too_small(
    total: int, terms: Sequence[tuple[str, int]], tokens: int, page: int, *, where: str, model_name: str
) -> None:
    """Refuse an arena under SGLang's batch-size-1 floor (``where`` names SGLang's check) or whose full side
    reaches less than one page."""
    floor = bs1_floor_problem(total, terms, where)
    if floor is not None or tokens < page:
        detail = floor.reason if floor is not None else f"the full side reaches {tokens} tokens, under one page"
        raise InsufficientMemoryError(
            f"The unified arena of {model_name} ({total:,} B) is too small: {detail} Raise {option('memory')} "
            f"(or {option('mem_fraction_static')}), or drop {option('enable_unified_memory')}."
        )


def geometry_or_fail(
    geometry: Callable[[int], dict[str, SubPoolGeometry]], total: int, model_name: str
) -> dict[str, SubPoolGeometry]:
    """The arena's geometry at ``total`` bytes, or a sizing error when no slot fits past the sink."""
    try:
        return geometry(total)
    except InvalidValueError as exc:  # no slot past the sink
        raise InsufficientMemoryError(
            f"The unified arena of {model_name} ({total:,} B) has no room past its sink: {exc}"
        ) from None
