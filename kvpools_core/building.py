"""Building a plan: request table, KV pool and allocator, each through its hook.

``build(plan, device)`` allocates real tensors on ``cpu``, ``cuda[:N]``,
``npu`` or ``meta`` (shapes and bytes without memory, so any plan can be
measured exactly on a laptop).  Every built object reports ``nbytes``
measured from its tensors; ``allocated_bytes`` is their sum, which the exact
accounting promises equals ``plan.planned_bytes`` (``checked=True`` adds the
checked allocators' maps on top, reported apart: see ``build``).  A plan whose
pools share an arena (``--enable-unified-memory``) is built by the core itself
(:func:`build_arena`): one arena tensor, its sub-pools' views, the unified allocators.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parts.names import DRAFT_PREFIX, draft_name
from kvpools_core.pipeline.host import build_host_pools
from kvpools_core.registry import CORE_PLUGIN, Registry, get_registry
from kvpools_core.values import Plan, PoolSizing, PoolSpec


@attrs.define
class Pools:
    """What ``build`` returns: the three objects an engine needs, and who built them."""

    plan: Plan
    device: str
    req_to_token_pool: Any
    kv_pool: Any
    allocator: Any
    provenance: dict[str, tuple[str, ...]]
    checked: bool = False
    layout: Any = None
    """The buffer layout the KV pool was built through (``buffer_layout``; the core's is ``per_layer``)."""
    workspaces: dict[str, Any] = attrs.field(factory=dict)
    """The platform workspaces of the plan (``Serving.workspaces``), one tensor each, by pool name."""
    draft_pool: Any = None
    """The KV pool of a draft model of its own (``plan.cell.draft``), built by the draft architecture's
    ``build_pool`` from :func:`draft_plan`; its pools are the plan's ``draft_*`` pools.  None without one (a
    draft in the target's geometry is part of ``kv_pool``)."""
    host: dict[str, Any] = attrs.field(factory=dict)
    """The host tier's pools (``plan.host``), one CPU tensor each (pinned where CUDA is available; ``meta`` on a
    meta build), by host pool name: outside the device's ``allocated_bytes``, measured by :attr:`host_bytes`."""

    @property
    def host_bytes(self) -> int:
        """Bytes of the host pools built, measured from their tensors (``plan.host.bytes_per_rank`` when exact)."""
        return sum(int(t.nbytes) for t in self.host.values())

    def host_by_pool(self) -> dict[str, int]:
        """Measured bytes per host pool name."""
        return {name: int(tensor.nbytes) for name, tensor in self.host.items()}

    CHECKED_SUFFIX = "_checked"
    """Pools named ``<free list>_checked`` are a checked allocator's maps: built on request, never planned."""

    @property
    def checking_bytes(self) -> int:
        """Bytes of the checked-mode maps (0 unless built with ``checked=True``)."""
        return sum(n for name, n in self.allocated_by_pool().items() if name.endswith(self.CHECKED_SUFFIX))

    @property
    def allocated_bytes(self) -> int:
        """Bytes of every tensor built, measured from the tensors themselves."""
        built = int(self.req_to_token_pool.nbytes) + int(self.kv_pool.nbytes) + int(self.allocator.nbytes)
        draft = 0 if self.draft_pool is None else int(self.draft_pool.nbytes)
        return built + draft + sum(int(t.nbytes) for t in self.workspaces.values())

    def allocated_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name.

        The KV pool reports its own sub-pools; so does an allocator made of
        several free lists (``nbytes_by_pool``), else it is the ``allocator`` pool,
        and a request table that owns per-request state (SGLang's
        ``HybridReqToTokenPool`` owns the mamba state pool), else it is ``req_to_token``.
        """
        measured: dict[str, int] = dict(self.kv_pool.nbytes_by_pool())
        if self.draft_pool is not None:
            measured.update({draft_name(name): int(n) for name, n in self.draft_pool.nbytes_by_pool().items()})
        req_by_pool = getattr(self.req_to_token_pool, "nbytes_by_pool", None)
        measured.update(
            req_by_pool() if req_by_pool is not None else {"req_to_token": int(self.req_to_token_pool.nbytes)}
        )
        by_pool = getattr(self.allocator, "nbytes_by_pool", None)
        measured.update(by_pool() if by_pool is not None else {"allocator": int(self.allocator.nbytes)})
        measured.update({name: int(tensor.nbytes) for name, tensor in self.workspaces.items()})
        return measured


def build(plan: Plan, device: str = "cpu", *, registry: Registry | None = None, checked: bool = False) -> Pools:
    """Allocate the pools and allocator a plan describes on ``device``.

    Every allocator refuses frees of out-of-range ids (padding 0, -1, past the
    pool).  ``checked=True`` asks the ``build_allocator`` hook for checked
    allocators, which also refuse double frees and frees of never-allocated ids:
    for tests and debugging (slower; synchronises on an accelerator).  Their
    "allocated" map is not in the plan: it adds ``2 * (pages + 1)`` bytes per free
    list (``pages`` = the slots or pages it hands out; the SWA allocator has
    two), reported as pools of their own (``allocator_checked``,
    ``swa_allocator_checked``) in ``allocated_by_pool()``, so ``allocated_bytes``
    then exceeds ``plan.planned_bytes`` by exactly those bytes.

    A plan with a host tier (``plan.host``) also gets its host pools, as CPU
    tensors (``meta`` ones on ``meta``) of the planned bytes (``Pools.host``).

    The KV pool's buffers are carved by the layout the ``buffer_layout`` hook
    answers for ``device`` (resolved once, passed to ``build_pool``); the
    provenance names the plugin that chose it unless it is the core's default.
    """
    registry = registry or get_registry()
    check_build_device(plan, device, registry)
    if plan.sizing.arenas:
        return build_arena(plan, device, checked=checked, registry=registry)
    name = plan.model.name
    layout, layout_by = registry.call_first(
        "buffer_layout", f"no plugin chooses a buffer layout for {name} on {device}.", plan=plan, device=device
    )
    req_pool, req_by = registry.call_first(
        "build_req_to_token_pool",
        f"no plugin builds the request table of {name}.",
        plan=plan,
        device=device,
        checked=checked,
        layout=layout,
    )
    kv_pool, pool_by = registry.call_first(
        "build_pool",
        f"no plugin builds the KV pool of {name} (architecture {plan.model.architecture!r}) on {device}.",
        plan=plan,
        device=device,
        layout=layout,
    )
    allocator, alloc_by = registry.call_first(
        "build_allocator",
        f"no plugin builds an allocator for {name} on {device}.",
        plan=plan,
        pool=kv_pool,
        device=device,
        checked=checked,
    )
    bind = getattr(allocator, "bind_req_to_token_pool", None)
    if bind is not None:  # a per-request SWA ring counts its capacity in the request table's free slots
        bind(req_pool)
    draft_pool, draft_by = build_draft_pool(plan, device, registry)
    workspaces = build_workspaces(plan, device)
    host = build_host_pools(plan, "meta" if str(device) == "meta" else "cpu")
    provenance = {"build_req_to_token_pool": req_by}
    if layout_by != (CORE_PLUGIN,):  # the default per-layer layout is left out, so such builds report as before
        provenance["buffer_layout"] = layout_by
    provenance.update(build_pool=pool_by, build_allocator=alloc_by)
    if draft_by:
        provenance["draft_build_pool"] = draft_by
    return Pools(
        plan,
        device,
        req_pool,
        kv_pool,
        allocator,
        provenance,
        checked=checked,
        layout=layout,
        workspaces=workspaces,
        host=host,
        draft_pool=draft_pool,
    )


class _RequestSide:
    """An arena plan's request table and the request-side pools kept from the static plan (SGLang's request
    to state-slot mapping), as plain tensors: ``nbytes`` / ``nbytes_by_pool`` like any request table."""

    def __init__(self, plan: Plan, device: str) -> None:
        import torch

        from kvpools_core.pools.req_to_token import ReqToTokenPool

        self.table = ReqToTokenPool.from_plan(plan, device)
        self.extra = {
            p.name: torch.empty(p.bytes, dtype=torch.uint8, device=device)
            for p in plan.pools
            if p.arena is None and p.kind == "request" and p.name != "req_to_token"
        }

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes) + sum(int(t.nbytes) for t in self.extra.values())

    def nbytes_by_pool(self) -> dict[str, int]:
        return {"req_to_token": int(self.table.nbytes), **{n: int(t.nbytes) for n, t in self.extra.items()}}


def build_arena(plan: Plan, device: str, *, checked: bool = False, registry: Registry | None = None) -> Pools:
    """Build a plan whose pools share an arena (``--enable-unified-memory``): the one arena tensor with every
    sub-pool's per-layer views (:class:`kvpools_core.pools.unified.UnifiedArenaPool`), SGLang's unified
    allocators over it (Mamba or hybrid SWA composite), and the request table.  The core builds them (provenance
    ``core``); the views are carved by the platform's buffer layout (``buffer_layout``, asked as ``build`` asks it;
    ``BufferLayout.carve_arena``, SGLang's token-major carving unless the layout overrides it), whose plugin the
    provenance names unless it is the core's."""
    from kvpools_core.allocators.unified import UnifiedArena, UnifiedMambaAllocator, UnifiedSWAAllocator
    from kvpools_core.parts.unified import SubPoolEntry
    from kvpools_core.pools.unified import UnifiedArenaPool

    (arena,) = plan.sizing.arenas
    if len(arena.sub_pools) == 3:
        return _build_tri_arena(plan, device, checked=checked)
    if len(arena.sub_pools) != 2:
        raise UnsupportedCombinationError(
            f"kvpools does not build arena {arena.name!r} of {len(arena.sub_pools)} sub-pools: plan it only."
        )
    registry = registry or get_registry()
    layout, layout_by = registry.call_first(
        "buffer_layout",
        f"no plugin chooses a buffer layout for {plan.model.name} on {device}.",
        plan=plan,
        device=device,
    )
    pool = UnifiedArenaPool(arena, device, layout=layout)
    entries = [
        (SubPoolEntry(s.pool, s.kind, s.layer_num, s.entry_bytes), s.grows)
        for s in sorted(arena.sub_pools, key=lambda s: s.grows)
    ]
    geometry = UnifiedArena.build(arena.bytes, entries, plan.serving.page_size)
    full = next(s.pool for s in arena.sub_pools if s.grows == "down")
    other = next(s for s in arena.sub_pools if s.grows == "up")
    common: dict[str, Any] = {"lazy_compaction": arena.lazy_compaction, "kvcache": pool, "device": device}
    allocator: Any
    if other.kind == "state":
        allocator = UnifiedMambaAllocator(geometry, full=full, mamba=other.pool, checked=checked, **common)
    else:
        allocator = UnifiedSWAAllocator(geometry, full=full, swa=other.pool, checked=checked, **common)
    provenance: dict[str, tuple[str, ...]] = {"build_req_to_token_pool": (CORE_PLUGIN,)}
    if layout_by != (CORE_PLUGIN,):
        provenance["buffer_layout"] = layout_by
    provenance.update(build_pool=(CORE_PLUGIN,), build_allocator=(CORE_PLUGIN,))
    return Pools(plan, device, _RequestSide(plan, device), pool, allocator, provenance, checked=checked, layout=layout)


def _build_tri_arena(plan: Plan, device: str, *, checked: bool = False) -> Pools:
    """The tri-pool arena (state up | SWA float | full down): SGLang's ``UnifiedMambaSWATokenToKVPoolAllocator``
    over the one arena, its sub-pools under SGLang's names (``mamba``, ``swa``, ``full``)."""
    from kvpools_core.allocators.unified import UnifiedArena
    from kvpools_core.allocators.unified_float import UnifiedMambaSWAAllocator
    from kvpools_core.parts.unified import SubPoolEntry
    from kvpools_core.pools.unified import UnifiedArenaPool

    (arena,) = plan.sizing.arenas
    names = {"down": "full", "float": "swa", "up": "mamba"}
    order = {"up": 0, "float": 1, "down": 2}
    pool = UnifiedArenaPool(arena, device)
    entries = [
        (SubPoolEntry(names[s.grows], s.kind, s.layer_num, s.entry_bytes), s.grows)
        for s in sorted(arena.sub_pools, key=lambda s: order[s.grows])
    ]
    geometry = UnifiedArena.build(arena.bytes, entries, plan.serving.page_size)
    allocator = UnifiedMambaSWAAllocator(
        geometry,
        full_max_total_num_tokens=int(arena.labels["full_max_total_num_tokens"]),
        swa_max_total_num_tokens=int(arena.labels["swa_max_total_num_tokens"]),
        lazy_compaction=arena.lazy_compaction,
        kvcache=pool,
        device=device,
        checked=checked,
    )
    provenance: dict[str, tuple[str, ...]] = {
        hook: (CORE_PLUGIN,) for hook in ("build_req_to_token_pool", "build_pool", "build_allocator")
    }
    return Pools(plan, device, _RequestSide(plan, device), pool, allocator, provenance, checked=checked)


def draft_plan(plan: Plan) -> Plan | None:
    """The plan of a draft model of its own as its draft worker sees it, or None when the plan has none.

    SGLang's draft worker sizes its token pool for the draft's model config
    with the target's ``max_total_num_tokens`` and ``max_running_requests``
    (``000_fbd4f47288598fb9.txt`` lines 361-366) and shares the target's
    request table and allocator (lines 577-583, 2178): so the draft's plan has
    the target's counts and budget, the draft's model, serving
    (:func:`~kvpools_core.pipeline.draft_worker_serving`) and cell, and only
    the draft's token pools, under the draft architecture's own names (the
    target's plan calls them ``draft_<name>``).
    """
    from kvpools_core.pipeline import draft_worker_serving

    draft = plan.serving.speculative_draft
    if plan.cell.draft is None or draft is None:
        return None
    own = set(draft.cell.pool_bytes_per_token())
    pools = [_own_name(p) for p in plan.pools if is_draft_pool(p.name, own)]
    sizing = PoolSizing(
        max_total_num_tokens=plan.max_total_num_tokens,
        max_running_requests=plan.max_running_requests,
        pools=pools,
    )
    return Plan(
        model=draft.model,
        serving=draft_worker_serving(plan.serving),
        budget=plan.budget,
        cell=draft.cell,
        sizing=sizing,
        provenance={"estimate_cell_size": draft.estimated_by},
    )


def _own_name(pool: PoolSpec) -> PoolSpec:
    """A ``draft_<name>`` pool under the draft's own name (its recorded cost's group renamed alike)."""
    name = pool.name[len(DRAFT_PREFIX) :]
    cost = None if pool.cost is None else attrs.evolve(pool.cost, group=name)
    return attrs.evolve(pool, name=name, cost=cost)


def is_draft_pool(name: str, own_pools: set[str]) -> bool:
    """Whether plan pool ``name`` is the ``draft_``-named copy of one of the draft's own pools."""
    return name.startswith(DRAFT_PREFIX) and name[len(DRAFT_PREFIX) :] in own_pools


def build_draft_pool(plan: Plan, device: str, registry: Registry) -> tuple[Any, tuple[str, ...]]:
    """The draft model's own KV pool, built by its architecture's ``build_pool`` (``(None, ())`` without one).

    The draft's plan gets the buffer layout its own plan asks for; the pool's
    bytes are checked against the plan's ``draft_*`` pools by the builder itself.
    """
    sub = draft_plan(plan)
    if sub is None:
        return None, ()
    name = sub.model.name
    layout, _ = registry.call_first(
        "buffer_layout", f"no plugin chooses a buffer layout for the draft {name} on {device}.", plan=sub, device=device
    )
    pool, by = registry.call_first(
        "build_pool",
        f"no plugin builds the KV pool of the draft model {name} (architecture {sub.model.architecture!r}) "
        f"on {device}.",
        plan=sub,
        device=device,
        layout=layout,
    )
    return pool, by


def build_workspaces(plan: Plan, device: str) -> dict[str, Any]:
    """One tensor per workspace pool of the plan, of the workspace's dtype and the pool's planned bytes.

    The core builds them (no hook): a workspace is a plain buffer the
    platform's kernels fill, and building it makes the exact plan's promise
    (allocated == planned) cover it; an engine hands it to its backend.
    """
    import torch

    from kvpools_core.parts.sizing import WORKSPACE_KIND
    from kvpools_core.pools.layout import allocate
    from kvpools_core.values import WORKSPACE_DTYPES

    declared = {w.name: w for w in plan.serving.workspaces}
    built: dict[str, Any] = {}
    for pool in plan.pools:
        if pool.kind != WORKSPACE_KIND:
            continue
        workspace = declared[pool.name]
        elements = pool.bytes // WORKSPACE_DTYPES[workspace.dtype]
        built[pool.name] = allocate((elements,), getattr(torch, workspace.dtype), device)
    return built


def check_build_device(plan: Plan, device: str, registry: Registry) -> None:
    """Refuse a device torch cannot name, one that is not there, or one without room for the plan.

    Checked before the first tensor, so the answer is an error with the
    numbers rather than torch's assertion or the kernel's OOM killer.  The
    platform plugin that owns the device measures its free memory
    (``available_memory``); a device no plugin measures is built unchecked.
    ``meta`` allocates nothing and is always fine.
    """
    import torch

    from kvpools_core.errors import ConfigError, InsufficientMemoryError, NoProviderError
    from kvpools_core.options import option
    from kvpools_core.pipeline import measure_free_bytes
    from kvpools_core.units import format_bytes

    if not isinstance(device, (str, torch.device)):
        raise ConfigError(
            f"{option('device')} must be a device string such as 'cpu', 'cuda:0' or 'meta', got {device!r}."
        )
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"{option('device')} {device!r} is not a torch device. Use cpu, cuda, cuda:N, meta or a device type "
            f"an installed platform plugin provides."
        ) from exc
    if kind == "meta":
        return
    try:
        free, by = measure_free_bytes(str(device), plan.serving, registry)
    except NoProviderError:
        _check_unmeasured_device(str(device), registry)
        return
    need = plan.planned_bytes
    if need > free:
        raise InsufficientMemoryError(
            f"Building the plan on {device} needs {need:,} B ({format_bytes(need)}), but {by[0]} measures only "
            f"{free:,} B ({format_bytes(free)}) free there; allocating it would fail or be killed by the kernel. "
            f"Lower {option('memory')}, or build on 'meta' to measure the exact bytes without allocating."
        )


def _check_unmeasured_device(device: str, registry: Registry) -> None:
    """A device no platform plugin measures is built unchecked, but only if torch can allocate there at all.

    ``torch.zeros(..., device="xpu")`` on a torch built without XPU raises
    torch's ``AssertionError`` from inside a build hook; one empty tensor finds
    that out first, so the answer names the device and the platforms instead.
    """
    import torch

    from kvpools_core.errors import ConfigError
    from kvpools_core.options import option
    from kvpools_core.pipeline import installed_platforms

    try:
        torch.empty(0, device=device)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        described = registry.call_named("platforms", "Platform")
        platforms = "; ".join(f"{name} ({described[name][1]})" for name in sorted(installed_platforms(registry)))
        raise ConfigError(
            f"Cannot build on {option('device')} {device!r}: no installed platform plugin provides that device and "
            f"torch cannot allocate there ({type(exc).__name__}: {str(exc).strip()}). Platforms that can build: "
            f"{platforms or 'none'}. Build on one of their devices (cpu, cuda:N, ...), or on 'meta' to measure "
            f"the exact bytes without allocating."
        ) from exc
