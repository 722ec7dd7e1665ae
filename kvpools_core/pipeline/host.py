"""The host KV tier (SGLang HiCache): host pools derived from the device plan, checked against the node.

A pure step after sizing: every host pool mirrors one device pool of the plan
and is sized from that pool's slots and bytes per slot, as SGLang 0.5.23 does
(``srt/mem_cache/pool_host/base.py`` ``HostKVCache.__init__``,
``pool_host/mamba.py`` ``MambaPoolHost.__init__``, ``pool_host/dsa.py``
``DSAIndexerPoolHost``, ``hybrid_cache/hybrid_pool_assembler.py``
``_split_hicache_size``):

* requested slots: ``int(device_slots x ratio)``, or with ``--hicache-size S``
  (GB) ``int(share x 1e9 // bytes_per_slot)``, ``share`` the pool's part of
  ``S`` in proportion to its device bytes (``_split_hicache_size``; one pool
  alone takes all of ``S``);
* allocated slots: ``(requested // page_size + 1) x page_size`` (a Mamba state
  pool's page is 1), all usable; bytes ``slots x bytes_per_slot``;
* a pool laid out in whole pages with slack (the DSA indexer) rides on the
  latent pool's host slots: ``(slots + page + extra) // page`` pages
  (``DSAIndexerPoolHost.indexer_page_num``) and takes no share of ``S``.

Which device pools have a mirror, and which ride on another's host slots, the
``host_mirrors`` hook answers (the core's default: token pools of kind ``"kv"``
(K/V, latent, SWA) and state-slot pools of kind ``"state"`` (Mamba conv + SSM
state), each its own; the dsa and minimax_sparse plugins' indexers ride on the
KV host pool); a :class:`PackedInto` answer packs a pool's rows into another
host pool's rows (the ``speculative`` plugin's MTP drafts).  An architecture
SGLang sizes by rules of its own answers ``host_pools`` with every host pool
sized (DeepSeek-V4's paged mirrors, ``plugins/dsv4/host.py``); one whose host
pools kvpools does not model refuses ``--enable-hierarchical-cache`` in its
``validate`` hook.  With ``--dcp-size D`` the (MLA) host pool keeps physical
rows sized as without DCP (``HostKVCache``: ``page_size // dcp_size`` of the
widened page), ``D`` logical tokens each (:attr:`HostTier.dcp_size`).
``--hicache-mamba-ratio`` (SGLang PR #39851, not in 0.5.23) sizes the state
pools by their own ratio; the KV pools then share all of ``--hicache-size``.

The node check follows ``host_memory_budget_bytes``: a rank may pin
``(available - reserve) // ranks_per_node``; the reserve is SGLang's
``HICACHE_HOST_MEMORY_RESERVE_BYTES`` (10 GiB).  ``available`` is
``MemAvailable`` of ``/proc/meminfo`` (what ``psutil.virtual_memory().available``
reports on Linux), bounded by the cgroup v2 ``memory.max - memory.current``
when one is set; no dependency is needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import attrs

from kvpools_core.errors import ConfigError, InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parts.sizing import pool_rows, req_to_token_row_len
from kvpools_core.registry import Registry, get_registry
from kvpools_core.units import format_bytes, parse_bytes
from kvpools_core.values import (
    DEFAULT_HICACHE_RATIO,
    STATE_SLOT,
    TOKEN,
    HostMemory,
    HostPool,
    HostTier,
    PackedInto,
    Plan,
    PoolSpec,
    Serving,
)

HICACHE_HOST_MEMORY_RESERVE_BYTES = 10 * 1024**3
"""SGLang's ``HICACHE_HOST_MEMORY_RESERVE_BYTES`` (``pool_host/base.py``): host RAM left to the OS and others."""

STATE_HOST_LAYOUTS = ("page_first", "page_first_direct")
"""The layouts ``MambaPoolHost`` accepts (it asserts them)."""


@attrs.frozen
class _Mirror:
    device: PoolSpec
    page_size: int
    extra_slots: int
    rides_on: str | None
    packed: tuple[PoolSpec, ...] = ()

    @property
    def bytes_per_slot(self) -> int:
        """The host row: the device pool's, plus the rows packed into it (SGLang's ``get_size_per_token`` over
        ``layer_num = target_layer_num + drafts``)."""
        return self.device.bytes_per_slot + sum(pool.bytes_per_slot for pool in self.packed)


Mirrors = Mapping[str, str | PackedInto | None]
"""A ``host_mirrors`` answer: device pool name → None (own host pool), the pool it rides on, or ``PackedInto``."""


def mirrored_pools(plan: Plan, mirrors: Mirrors) -> list[_Mirror]:
    """The device pools ``mirrors`` (the ``host_mirrors`` answer) names, in plan order, with their host page.

    A token pool's host page is ``--page-size`` (a riding pool laid out in whole
    pages with slack keeps its ``extra_slots``); a state pool's is 1.  Pools
    packed into another (:class:`PackedInto`) add their rows to its host row.
    """
    names = {pool.name for pool in plan.pools}
    unknown = sorted(set(mirrors) - names)
    if unknown:
        raise ConfigError(f"host_mirrors names pool(s) {unknown} the plan does not have; it has {sorted(names)}.")
    extra = plan.cell.pool_extra_slots()
    by_name = {pool.name: pool for pool in plan.pools}
    packed: dict[str, list[PoolSpec]] = {}
    for name, value in mirrors.items():
        if isinstance(value, PackedInto):
            pool, into = by_name[name], by_name[value.pool]
            if (pool.unit, pool.token_space) != (into.unit, into.token_space):
                raise ConfigError(
                    f"host_mirrors packs {name!r} ({pool.unit}, {pool.token_space} space) into {into.name!r} "
                    f"({into.unit}, {into.token_space} space): packed rows must share the host pool's slots."
                )
            packed.setdefault(value.pool, []).append(pool)
    found = []
    for pool in plan.pools:
        if pool.name not in mirrors:
            continue
        value = mirrors[pool.name]
        if isinstance(value, PackedInto):
            continue
        if pool.unit not in (TOKEN, STATE_SLOT):
            raise ConfigError(
                f"Host pool {pool.name!r} mirrors a pool paid per {pool.unit}; only token and state-slot "
                f"pools have host mirrors."
            )
        page = plan.serving.page_size if pool.unit == TOKEN else 1
        extra_slots = extra.get(pool.name, 0) if pool.unit == TOKEN else 0
        found.append(_Mirror(pool, page, extra_slots, value, tuple(packed.get(pool.name, ()))))
    return found


def _requested_slots(device_slots: int, bytes_per_slot: int, ratio: float, share: float) -> int:
    """SGLang's requested host slots: ``int(host_size * 1e9 // size_per_token)`` or ``int(capacity * ratio)``."""
    if share > 0:
        return int(share * 1e9 // bytes_per_slot)
    return int(device_slots * ratio)


def size_host_pools(
    plan: Plan,
    *,
    ratio: float | None = None,
    size_gb: int | None = None,
    mamba_ratio: float | None = None,
    answer: Mirrors | None = None,
) -> tuple[HostPool, ...]:
    """Every host pool of one rank for ``ratio`` / ``size_gb`` (the serving options' unless given).

    ``answer`` is the ``host_mirrors`` hook's (asked of the default registry when None).
    """
    serving = plan.serving
    if ratio is None:
        ratio = default_hicache_ratio(plan) if serving.hicache_ratio is None else serving.hicache_ratio
    size_gb = serving.hicache_size if size_gb is None else size_gb
    mamba_ratio = serving.hicache_mamba_ratio if mamba_ratio is None else mamba_ratio
    layout = serving.hicache_mem_layout
    mirrors = mirrored_pools(plan, host_mirrors(plan) if answer is None else answer)
    own_ratio = mamba_ratio is not None

    def splits(mirror: _Mirror) -> bool:
        return mirror.rides_on is None and not (own_ratio and mirror.device.unit == STATE_SLOT)

    total = sum(m.device.bytes for m in mirrors if splits(m))
    built: dict[str, HostPool] = {}
    for mirror in sorted(mirrors, key=lambda m: m.rides_on is not None):  # anchors first, riders on their slots
        device = mirror.device
        per_slot = mirror.bytes_per_slot
        if mirror.rides_on is not None:
            anchor = built[mirror.rides_on]
            slots = anchor.slots
            rows = pool_rows(slots, mirror.page_size, mirror.extra_slots) if mirror.extra_slots else slots
            slack = f", {rows // mirror.page_size:,} pages with slack" if mirror.extra_slots else ""
            sized_by = f"rides on {anchor.name}'s {slots:,} host slots{slack}"
        else:
            state = device.unit == STATE_SLOT
            pool_ratio = mamba_ratio if state and mamba_ratio is not None else ratio
            share = size_gb * device.bytes / total if size_gb > 0 and splits(mirror) and total else 0.0
            requested = _requested_slots(device.slots, per_slot, pool_ratio, share)
            slots = rows = (requested // mirror.page_size + 1) * mirror.page_size
            if share > 0:
                sized_by = f"{option('hicache_size')} share {share:.4g} GB of {size_gb} GB (by device bytes)"
            else:
                flag = option("hicache_mamba_ratio" if state and mamba_ratio is not None else "hicache_ratio")
                sized_by = f"{flag} {pool_ratio:g} x {device.slots:,} device slots"
        built[device.name] = HostPool(
            name=device.name,
            device_pool=device.name,
            unit=device.unit,
            token_space=device.token_space,
            device_slots=device.slots,
            page_size=mirror.page_size,
            slots=slots,
            rows=rows,
            bytes_per_slot=per_slot,
            bytes=rows * per_slot,
            layout=layout,
            sized_by=sized_by + _packed_note(mirror),
            rides_on=mirror.rides_on,
            packed=tuple(pool.name for pool in mirror.packed),
        )
    return tuple(built[m.device.name] for m in mirrors)


def _packed_note(mirror: _Mirror) -> str:
    if not mirror.packed:
        return ""
    rows = " + ".join(f"{pool.name} {pool.bytes_per_slot:,} B" for pool in mirror.packed)
    return f"; host row {mirror.device.bytes_per_slot:,} B + packed {rows}"


def host_mirrors(plan: Plan, registry: Registry | None = None) -> Mirrors:
    """The ``host_mirrors`` hook's answer for ``plan`` (the architecture's, else the core's generic rule)."""
    answer, _ = _ask_mirrors(plan, registry or get_registry())
    return answer


def _ask_mirrors(plan: Plan, registry: Registry) -> tuple[Mirrors, tuple[str, ...]]:
    result: tuple[Mirrors, tuple[str, ...]] = registry.call_first(
        "host_mirrors", f"no plugin says which pools of {plan.model.name} have a host mirror.", plan=plan
    )
    return result


def plan_host_tier(
    plan: Plan,
    *,
    host_memory: int | float | str | None = None,
    host_reserve: int | float | str | None = None,
    check: bool = True,
    registry: Registry | None = None,
) -> tuple[HostTier, dict[str, tuple[str, ...]]]:
    """The host tier of ``plan`` (``serving.enable_hierarchical_cache``), checked against the node, and the
    provenance of the hook that placed its pools: ``{"host_pools": ...}`` (an architecture sizing its own) or
    ``{"host_mirrors": ...}``.

    ``host_memory`` states the node's available host memory (else it is
    measured here); ``host_reserve`` what to leave (SGLang's 10 GiB).  A tier
    that does not fit raises :class:`InsufficientMemoryError` naming both
    numbers and the largest ``--hicache-ratio`` / ``--hicache-size`` that fits.
    """
    serving = plan.serving
    if not serving.host_tier:
        raise ConfigError(
            f"The host tier needs {option('enable_hierarchical_cache')} (or a decode node's "
            f"{option('disaggregation_decode_retraction_backup')} host_pool)."
        )
    registry = registry or get_registry()
    own, own_by = registry.call("host_pools", plan=plan)
    sizer: _Sizer
    if own is not None:
        pools, by = tuple(own), {"host_pools": own_by}
        _check_own_pools(plan, pools)

        def sizer(ratio: float | None = None, size_gb: int | None = None) -> tuple[HostPool, ...]:
            changes: dict[str, float | int] = {}
            if ratio is not None:
                changes["hicache_ratio"] = ratio
            if size_gb is not None:
                changes["hicache_size"] = size_gb
            other = attrs.evolve(plan, serving=attrs.evolve(serving, **changes))  # type: ignore[arg-type]
            answer, _ = registry.call("host_pools", plan=other)
            return tuple(answer or ())

    else:
        answer, mirrors_by = _ask_mirrors(plan, registry)
        by = {"host_mirrors": mirrors_by}
        mirrors = mirrored_pools(plan, answer)
        if not mirrors:
            raise ConfigError(f"{plan.model.name}: the plan has no pool with a host mirror.")
        if any(m.device.unit == STATE_SLOT for m in mirrors) and serving.hicache_mem_layout not in STATE_HOST_LAYOUTS:
            raise ConfigError(
                f"{option('hicache_mem_layout')} {serving.hicache_mem_layout}: SGLang's Mamba host pool "
                f"(MambaPoolHost) supports {' and '.join(STATE_HOST_LAYOUTS)} only; {plan.model.name} has state "
                f"pools. Use {option('hicache_mem_layout')} page_first."
            )
        pools = size_host_pools(plan, answer=answer)

        def sizer(ratio: float | None = None, size_gb: int | None = None) -> tuple[HostPool, ...]:
            return size_host_pools(plan, ratio=ratio, size_gb=size_gb, answer=answer)

    memory = node_memory(host_memory, host_reserve) if check or serving.hicache_auto_sized else None
    default_ratio = default_hicache_ratio(plan)
    ratio: float | None = None if serving.hicache_size > 0 else (serving.hicache_ratio or default_ratio)
    auto_note: tuple[str, ...] = ()
    if serving.hicache_auto_sized:
        if own is not None:
            raise UnsupportedCombinationError(
                f"{plan.model.name}: SGLang's HiCache auto-sizing (no {option('hicache_ratio')} and no "
                f"{option('hicache_size')}) does not support this model's host pools (sized by "
                f"{', '.join(by['host_pools'])}): SGLang raises 'HiCache auto-sizing does not support ...; set "
                f"--hicache-ratio or --hicache-size explicitly.' Pass {option('hicache_ratio')} "
                f"{DEFAULT_HICACHE_RATIO:g} (the default before auto-sizing) or {option('hicache_size')}."
            )
        assert memory is not None
        ratio, line = auto_sized_ratio(plan, mirrors, memory, default_ratio)
        pools = tuple(
            pool if pool.rides_on else attrs.evolve(pool, sized_by=f"auto-sized {pool.sized_by}")
            for pool in size_host_pools(plan, ratio=ratio, answer=answer)
        )
        auto_note = (line,)
    tier = HostTier(
        pools=pools,
        ranks_per_node=serving.ranks_per_node,
        dcp_size=serving.dcp_size,
        notes=auto_note + _notes(pools, serving),
        hicache_ratio=ratio,
        auto_sized=serving.hicache_auto_sized,
        retraction_backup=serving.retraction_host_pool and not serving.enable_hierarchical_cache,
    )
    if check:
        tier = attrs.evolve(tier, memory=memory)
        check_fits(plan, tier, sizer)
    return tier, by


AUTO_SIZE_SLACK_FRACTION = 0.05
"""SGLang's ``_ALLOCATION_SLACK_FRACTION``: page rounding, allocator metadata and staging buffers the device
bytes leave out (``mem_cache/hicache_auto_size.py``)."""


def default_hicache_ratio(plan: Plan) -> float:
    """The ratio SGLang resolves when ``--hicache-ratio`` is unset, before auto-sizing.

    2.0 for HiCache; a decode node's retraction-only host pool takes ``BACKUP_ONLY_HICACHE_RATIO`` 0.2, raised
    (without ``--hicache-size``) to one maximum-length request: ``ceil_align(min(max_context_len - 1, size),
    page) / size`` with ``size`` the device KV pool's (full) tokens and ``max_context_len`` the request table's
    row (``resolve_decode_retraction_backup`` / ``decode_retraction_max_tokens``, ``mem_cache/kv_cache_builder.py``).
    """
    serving = plan.serving
    if serving.enable_hierarchical_cache or not serving.retraction_host_pool:
        return DEFAULT_HICACHE_RATIO
    return retraction_backup_ratio(plan)


def retraction_backup_ratio(plan: Plan) -> float:
    """A retraction-only decode host pool's ratio (see :func:`default_hicache_ratio`)."""
    serving = plan.serving
    ratio = BACKUP_ONLY_HICACHE_RATIO
    if serving.hicache_size == 0:
        size, page = plan.max_total_num_tokens, serving.page_size
        row = req_to_token_row_len(serving.context_length or plan.model.context_len, serving)
        one_request = -(-min(row - 1, size) // page) * page
        ratio = max(ratio, one_request / size)
    return ratio


def resolve_retraction_backup(plan: Plan, registry: Registry | None = None) -> Plan:
    """A decode plan's retraction backup, as SGLang 0.5.23's ``resolve_decode_retraction_backup`` decides it.

    An explicit ``host_pool`` on a plan whose KV pool SGLang cannot back up (the ``retraction_host_pool``
    hook answers False) is refused with SGLang's message; the pipeline then plans that host pool as the host
    tier.  Unset, SGLang picks ``host_pool`` on a platform that allows it by default
    (:attr:`PlatformTraits.decode_retraction_host_pool`), without DCP, for such a KV pool (and without decode
    radix cache, decode KV offload or priority preemption, which kvpools does not model), else ``cpu_tensor``;
    kvpools states the choice in a note and plans no host memory for it.
    """
    serving = plan.serving
    registry = registry or get_registry()
    supported, by = registry.call_first(
        "retraction_host_pool",
        f"no plugin says whether {plan.model.name}'s pool has a retraction host pool.",
        plan=plan,
    )
    flag = option("disaggregation_decode_retraction_backup")
    asked = serving.disaggregation_decode_retraction_backup
    if asked == "host_pool" and not supported:
        raise UnsupportedCombinationError(
            f"{flag} host_pool: SGLang raises '--disaggregation-decode-retraction-backup=host_pool requires an MHA "
            f"or hybrid-SWA HiCache host stack.' ({plan.model.name}'s pool, by {', '.join(by)}, is neither). Use "
            f"{flag} cpu_tensor."
        )
    if asked is not None:
        return plan
    traits = serving.platform_traits
    reasons = [
        why
        for why, applies in (
            (
                f"the {serving.platform} platform keeps host_pool opt-in",
                traits is not None and not traits.decode_retraction_host_pool,
            ),
            (f"{option('dcp_size')} {serving.dcp_size}", serving.dcp_size > 1),
            (f"{plan.model.name}'s pool is not an MHA or hybrid-SWA pool without recurrent state", not supported),
        )
        if applies
    ]
    if reasons:
        note = (
            f"decode retraction backup: SGLang picks cpu_tensor here ({'; '.join(reasons)}): a retracted request's "
            f"KV goes to per-request CPU tensors, no pinned host pool."
        )
    elif serving.enable_hierarchical_cache:
        note = "decode retraction backup: SGLang picks host_pool here, sharing the HiCache host pools planned below."
    else:
        ratio = retraction_backup_ratio(plan)
        note = (
            f"decode retraction backup: SGLang 0.5.23 picks host_pool here ({flag} unset) and pins a HiCache host "
            f"pool of ratio {ratio:.4g} (max(0.2, one request at the context length)), lowered to fit "
            f"{option('hicache_host_memory_fraction')} of the node, beside this plan. kvpools plans it with {flag} "
            f"host_pool (and {option('host_memory')} for the node); {flag} cpu_tensor keeps SGLang from pinning it."
        )
    return attrs.evolve(plan, sizing=attrs.evolve(plan.sizing, notes=(*plan.sizing.notes, note)))


BACKUP_ONLY_HICACHE_RATIO = 0.2
"""SGLang's host slots per device slot for a retraction-only decode host pool (``kv_cache_builder.py``)."""


def auto_sized_ratio(
    plan: Plan, mirrors: Sequence[_Mirror], memory: HostMemory, requested: float = DEFAULT_HICACHE_RATIO
) -> tuple[float, str]:
    """SGLang 0.5.23's ``auto_size_hicache``: the default ratio lowered until one rank's host pools fit its share.

    ``ratio = min(2.0, budget x (1 - 0.05) / device_bytes)`` where ``budget = int((available - reserve) //
    ranks_per_host x hicache_host_memory_fraction)`` (``host_memory_budget_bytes(auto_size=True)``,
    ``mem_cache/pool_host/base.py``) and ``device_bytes`` are the bytes of every device pool with a host mirror
    (``_estimate_hicache_bytes``: the KV pools with their indexer, both SWA pools, the Mamba state pool, the
    draft pools packed or beside them).  Every rank takes the minimum (one all-reduce); kvpools' ranks are alike.
    Returns the ratio and SGLang's log line.
    """
    serving = plan.serving
    device_bytes = sum(m.device.bytes + sum(p.bytes for p in m.packed) for m in mirrors)
    ranks = serving.ranks_per_node
    per_rank = (memory.available_bytes - memory.reserve_bytes) // ranks
    fraction = serving.hicache_host_memory_fraction
    budget = int(per_rank * fraction)
    ratio = min(requested, budget * (1 - AUTO_SIZE_SLACK_FRACTION) / device_bytes)
    if ratio <= 0:
        raise InsufficientMemoryError(
            f"No host memory is left for HiCache after the {format_bytes(memory.reserve_bytes)} reserve "
            f"({option('host_reserve')}): the node has {memory.available_bytes:,} B available ({memory.source}) "
            f"for {ranks} rank(s). SGLang raises 'No host memory is left for HiCache after the 10 GiB reserve; set "
            f"--hicache-ratio or --hicache-size explicitly.'"
        )
    line = (
        f"HiCache auto-sizing: ratio {requested:.3f} -> {ratio:.3f}; {budget / 1024**3:.1f} GiB host memory per "
        f"rank (fraction {fraction:.2f}, {ranks} ranks on this host), host pools {device_bytes * ratio / 1024**3:.1f} "
        f"GiB. (SGLang's log line: {option('hicache_ratio')} and {option('hicache_size')} unset, so the default "
        f"ratio is lowered to fit {option('hicache_host_memory_fraction')} of the node.)"
    )
    return ratio, line


class _Sizer(Protocol):
    def __call__(self, ratio: float | None = None, size_gb: int | None = None) -> tuple[HostPool, ...]: ...


def _check_own_pools(plan: Plan, pools: Sequence[HostPool]) -> None:
    """An architecture's own host pools mirror pools of the plan, each named once."""
    names = {pool.name for pool in plan.pools}
    unknown = sorted({pool.device_pool for pool in pools} - names)
    if unknown:
        raise ConfigError(f"host_pools mirrors pool(s) {unknown} the plan does not have; it has {sorted(names)}.")
    seen = [pool.name for pool in pools]
    if len(set(seen)) != len(seen):
        raise ConfigError(f"host_pools names a host pool twice: {seen}.")


def _notes(pools: Sequence[HostPool], serving: Serving) -> tuple[str, ...]:
    """SGLang's warning for host pools no larger than their device pool, and what write-through implies (for
    HiCache: a decode node's retraction-only pool is written when a request is retracted, not per page)."""
    notes = []
    # HostKVCache._allocate_host_buffer's warning; DeepSeek-V4's paged pools (page_bytes) and anchor never give it.
    small = [p for p in pools if p.rides_on is None and not p.page_bytes and p.bytes and p.slots <= p.device_slots]
    for pool in small:
        notes.append(
            f"host pool {pool.name} ({pool.slots:,} slots) is not larger than its device pool "
            f"({pool.device_slots:,}): SGLang warns that L2 effectiveness is reduced."
        )
    if serving.pp_size > 1 and serving.hicache_size > 0:
        notes.append(
            f"with {option('pp_size')} {serving.pp_size} SGLang keeps the smallest host token capacity of the "
            f"pipeline stages for a fixed {option('hicache_size')} (sync_fixed_hicache_size); these are stage "
            f"{serving.pp_rank}'s own, an upper bound when another stage stores more bytes per token."
        )
    if small and serving.hicache_write_policy.startswith("write_through") and serving.enable_hierarchical_cache:
        notes.append(
            f"{option('hicache_write_policy')} {serving.hicache_write_policy} copies every device page to the host "
            f"tier; a host tier smaller than the device pool evicts host pages still held on the device."
        )
    return tuple(notes)


def node_memory(host_memory: int | float | str | None, host_reserve: int | float | str | None) -> HostMemory:
    """The node's available host memory (stated, or measured here) and the reserve to leave."""
    reserve = (
        HICACHE_HOST_MEMORY_RESERVE_BYTES if host_reserve is None else parse_bytes(host_reserve, option("host_reserve"))
    )
    if host_memory is not None:
        return HostMemory(
            available_bytes=parse_bytes(host_memory, option("host_memory")), reserve_bytes=reserve, source="stated"
        )
    available, source = measure_host_available()
    return HostMemory(available_bytes=available, reserve_bytes=reserve, source=source)


def measure_host_available(proc: Path = Path("/proc"), cgroup: Path = Path("/sys/fs/cgroup")) -> tuple[int, str]:
    """``MemAvailable`` of ``/proc/meminfo``, bounded by the cgroup v2 headroom (``memory.max - memory.current``)."""
    try:
        lines = (proc / "meminfo").read_text().splitlines()
    except OSError:
        raise ConfigError(
            f"Cannot measure this machine's host memory (no /proc/meminfo); state it with {option('host_memory')} "
            f"(e.g. 2TiB)."
        ) from None
    fields = {line.split(":", 1)[0]: line.split(":", 1)[1].split() for line in lines if ":" in line}
    if "MemAvailable" not in fields:
        raise ConfigError(f"/proc/meminfo has no MemAvailable; state the host memory with {option('host_memory')}.")
    available = int(fields["MemAvailable"][0]) * 1024
    source = "measured: /proc/meminfo MemAvailable"
    try:
        limit = (cgroup / "memory.max").read_text().strip()
        current = int((cgroup / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return available, source
    if limit != "max" and limit.isascii() and limit.isdigit() and int(limit) - current < available:
        return max(int(limit) - current, 0), "measured: cgroup v2 memory.max - memory.current"
    return available, source


def check_fits(plan: Plan, tier: HostTier, sizer: _Sizer) -> None:
    """Refuse a tier whose ranks on one node pin more than the node's available memory minus the reserve."""
    memory = tier.memory
    if memory is None:
        return
    need = tier.bytes_per_node
    usable = memory.usable_bytes
    if need <= usable:
        return
    ranks = tier.ranks_per_node
    per_rank = usable // ranks
    available, reserve = memory.available_bytes, memory.reserve_bytes
    raise InsufficientMemoryError(
        f"The host tier needs {need:,} B ({format_bytes(need)}) on the node: {tier.bytes_per_rank:,} B "
        f"({format_bytes(tier.bytes_per_rank)}) per rank x {ranks} rank(s); the node has {available:,} B "
        f"({format_bytes(available)}) available ({memory.source}) minus the {format_bytes(reserve)} reserve "
        f"({option('host_reserve')}) = {usable:,} B ({format_bytes(usable)}), {per_rank:,} B per rank. "
        f"{_what_fits(plan, per_rank, sizer)}"
    )


def _what_fits(plan: Plan, per_rank: int, sizer: _Sizer) -> str:
    """The largest ``--hicache-size`` (GB) or ``--hicache-ratio`` (to 0.01) whose pools fit ``per_rank`` bytes."""
    serving = plan.serving

    def need(ratio: float | None = None, size_gb: int | None = None) -> int:
        return sum(p.bytes for p in sizer(ratio=ratio, size_gb=size_gb))

    if serving.hicache_size > 0:
        size = min(serving.hicache_size - 1, per_rank // 10**9)
        while size >= 1 and need(size_gb=size) > per_rank:
            size -= 1
        if size >= 1:
            return f"{option('hicache_size')} {size} (GB) fits."
        return f"No {option('hicache_size')} of 1 GB or more fits; fewer ranks per node or more host memory would."
    current = need()
    asked = default_hicache_ratio(plan) if serving.hicache_ratio is None else serving.hicache_ratio
    ratio = math.floor(asked * per_rank / current * 100) / 100 if current else 0.0
    while ratio > 0 and need(ratio=ratio) > per_rank:
        ratio = round(ratio - 0.01, 2)
    if ratio > 0:
        return f"{option('hicache_ratio')} {ratio:g} fits."
    return f"No {option('hicache_ratio')} of 0.01 or more fits; fewer ranks per node or more host memory would."


def check_room_to_build(tier: HostTier) -> None:
    """Refuse to allocate host pools this machine has no room for (a plan may come from another node's JSON)."""
    try:
        available, source = measure_host_available()
    except ConfigError:
        return  # nothing to measure here: built unchecked, as a device no plugin measures
    need = tier.bytes_per_rank
    if need > available:
        raise InsufficientMemoryError(
            f"Building the host tier needs {need:,} B ({format_bytes(need)}) of host memory, but this machine has "
            f"{available:,} B ({format_bytes(available)}) available ({source}). Build on 'meta' to measure the "
            f"exact bytes without allocating, or lower {option('hicache_ratio')} / {option('hicache_size')}."
        )


def build_host_pools(plan: Plan, device: str = "cpu") -> dict[str, object]:
    """One uint8 tensor per host pool of ``plan.host``, of the pool's exact bytes, page-major rows.

    On ``meta`` the tensors have shapes and bytes and no memory; otherwise they
    are CPU tensors, pinned where CUDA is available (SGLang pins its host pools
    for the copy engines), plain otherwise.  Each is ``(pages, page_size x
    bytes_per_slot)``: one page contiguous, as SGLang's ``page_first`` layouts
    keep it; the per-layer views SGLang's transfer kernels carve are not made.
    """
    import torch

    if plan.host is None:
        return {}
    meta = str(device) == "meta"
    if not meta:
        check_room_to_build(plan.host)
    pin = not meta and torch.cuda.is_available()
    built: dict[str, object] = {}
    for pool in plan.host.pools:
        shape = (pool.pages, pool.bytes_per_page)
        if meta:
            built[pool.name] = torch.empty(shape, dtype=torch.uint8, device="meta")
        else:
            # DeepSeek-V4's LogicalHostPool anchor has no bytes: nothing to pin (SGLang makes no tensor for it).
            built[pool.name] = torch.empty(shape, dtype=torch.uint8, device="cpu", pin_memory=pin and pool.bytes > 0)
    return built


def host_reserve_flag_check(host_memory: object, host_reserve: object, serving: Serving) -> None:
    """``host_memory`` / ``host_reserve`` describe the host tier's node: without the tier they would be ignored."""
    given = [option(n) for n, v in (("host_memory", host_memory), ("host_reserve", host_reserve)) if v is not None]
    if given and not serving.host_tier:
        raise ConfigError(
            f"{' and '.join(given)} check the host KV tier against a node, which only exists with "
            f"{option('enable_hierarchical_cache')} (or a decode node's "
            f"{option('disaggregation_decode_retraction_backup')} host_pool); add it, or drop {' and '.join(given)}."
        )


__all__ = [
    "HICACHE_HOST_MEMORY_RESERVE_BYTES",
    "build_host_pools",
    "check_fits",
    "host_mirrors",
    "measure_host_available",
    "mirrored_pools",
    "node_memory",
    "plan_host_tier",
    "size_host_pools",
]
