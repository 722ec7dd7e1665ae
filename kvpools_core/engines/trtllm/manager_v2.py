"""TensorRT-LLM's ``KVCacheManagerV2`` runtime, restated: life cycles, pool groups, the pool-ratio solve of one GPU
quota, slot counts, the ``max_seq_len`` clamp and the page-index bound ``get_kv_cache_capacity()`` publishes.

No TensorRT-LLM code runs here; each step names the function it reproduces.  Sources (the code index's stored copies
of ``NVIDIA/TensorRT-LLM``; commits where the index names one):

- ``tensorrt_llm/runtime/kv_cache_manager_v2/_life_cycle_registry.py`` (stored @``1548780d``): a life cycle is a
  layer buffer's sliding window (and sink blocks, none here); ``AttnLifeCycle.get_stale_range(history, tpb)`` =
  ``[0, max(0, (history + 1 - window) // tpb))`` blocks, empty without a window;
- ``_storage/_config.py`` ``create_storage_config`` (stored @``1148a82f``): buffers grouped by life cycle, then by
  block size into coalesced buffers (one pool each, sorted by coalesced size, largest first); life cycles with the
  same list of pool sizes share one pool group;
- ``_storage_manager.py`` ``StorageManager.__init__`` (stored @``00f6bd61``): ``min_slots`` from the constraints
  (``_compute_min_slots_from_constraints``, at least one slot per life cycle), the initial ratio from the typical
  batch (``ratio_from_batch`` -> ``_compute_slots_for_batch`` -> ``_slots_to_bytes``, each pool rounded up to the
  granularity), the level's quota ``max(min quota, round_up(quota, granularity))`` (``_compute_slot_count_for_level``);
  ``CacheLevelManager.cache_tier_granularity``: ``2 MiB << min(4, max(0, int(log2(quota / 1 GiB))))`` on the GPU;
- ``_storage/_core.py`` ``CacheLevelStorage.ratio_to_slot_count_list`` / ``_grains_to_slots`` / ``_grains_for_slots``
  (stored copy): the quota in grains divided by ratio, pool groups below their ``min_slots`` pinned to it and the rest
  re-divided, then each group's slot count bumped while its grains allow;
- ``_core/_kv_cache_manager.py`` ``clamp_max_seq_len_for_mem`` and ``get_page_index_upper_bound`` (stored copies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from kvpools_core.parts.trtllm import TrtllmLayer

MiB = 1 << 20
GPU_PAGE_BYTES = 2 << 20
"""``cache_tier_granularity``'s GPU page (2 MiB), shifted up to 16x for large quotas."""


def div_up(value: int, divisor: int) -> int:
    return -(-value // divisor)


def round_up(value: int, granularity: int) -> int:
    return div_up(value, granularity) * granularity


def gpu_granularity(quota: int) -> int:
    """``CacheLevelManager.cache_tier_granularity(GPU_MEM, quota)``: 2 MiB, doubled for each doubling of the quota
    past 1 GiB, at most 32 MiB (from a 16 GiB quota)."""
    return GPU_PAGE_BYTES << min(4, max(0, int(math.log(quota / (GPU_PAGE_BYTES * 512), 2))))


def stale_blocks(window: int | None, history: int, tokens_per_block: int) -> int:
    """The length of ``AttnLifeCycle.get_stale_range(history, tokens_per_block)`` (no sink tokens): blocks wholly
    behind the window once ``history`` tokens are in and one more is being attended."""
    if window is None:
        return 0
    return max(0, (history + 1 - window) // tokens_per_block)


@attrs.frozen(kw_only=True)
class Pool:
    """One coalesced buffer: the buffers of one life cycle with one block size, side by side in one slot."""

    block_bytes: int
    buffers: tuple[tuple[int, str], ...]
    """``(layer index, buffer kind)`` of each buffer, in the order the manager added them."""

    @property
    def slot_bytes(self) -> int:
        return self.block_bytes * len(self.buffers)


@attrs.frozen(kw_only=True)
class PoolGroup:
    """A pool group: the life cycles (windows) sharing one list of pool sizes; one slot holds one block of every
    buffer of one life cycle."""

    index: int
    windows: tuple[int | None, ...]
    """The life cycles' windows (None: no window), in the order the manager first met them."""
    pools: tuple[tuple[Pool, ...], ...]
    """Each life cycle's pools (same sizes in every life cycle of the group), largest first."""

    @property
    def slot_sizes(self) -> tuple[int, ...]:
        return tuple(pool.slot_bytes for pool in self.pools[0])

    @property
    def slot_bytes(self) -> int:
        return sum(self.slot_sizes)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted({layer for pools in self.pools for pool in pools for layer, _ in pool.buffers}))

    @property
    def kinds(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for pools in self.pools:
            for pool in pools:
                for _, kind in pool.buffers:
                    seen.setdefault(kind, None)
        return tuple(seen)

    def slots_for(self, capacity: int, history: int, tokens_per_block: int) -> int:
        """Slots one sequence of ``capacity`` tokens with ``history`` of them attended holds in this group
        (``_compute_slots_for_batch`` for one request, no shared system prompt, no SWA scratch reuse)."""
        blocks = div_up(capacity, tokens_per_block)
        return sum(blocks - stale_blocks(window, history, tokens_per_block) for window in self.windows)


def pool_groups(layers: Sequence[TrtllmLayer], tokens_per_block: int) -> tuple[PoolGroup, ...]:
    """``create_storage_config`` over the layers' V2 buffers: life cycles in order of first appearance, each one's
    buffers grouped by block size (pools, largest coalesced size first, ties in order of appearance), life cycles
    with equal pool-size lists merged into one pool group."""
    by_window: dict[int | None, dict[int, list[tuple[int, str]]]] = {}
    for layer in layers:
        assert layer.v2 is not None
        for buffer in layer.v2.buffers:
            sizes = by_window.setdefault(buffer.window, {})
            sizes.setdefault(buffer.block_bytes(tokens_per_block), []).append((layer.index, buffer.kind))
    grouped: dict[tuple[int, ...], list[tuple[int | None, tuple[Pool, ...]]]] = {}
    for window, sizes in by_window.items():
        pools = sorted(
            (Pool(block_bytes=size, buffers=tuple(buffers)) for size, buffers in sizes.items()),
            key=lambda pool: pool.slot_bytes,
            reverse=True,
        )
        grouped.setdefault(tuple(pool.slot_bytes for pool in pools), []).append((window, tuple(pools)))
    return tuple(
        PoolGroup(
            index=index,
            windows=tuple(window for window, _ in members),
            pools=tuple(pools for _, pools in members),
        )
        for index, members in enumerate(grouped.values())
    )


Batch = Sequence[tuple[int, int]]
"""``BatchDesc``: one ``(capacity, history_length)`` per sequence."""


def slots_for_batch(groups: Sequence[PoolGroup], batch: Batch, tokens_per_block: int) -> tuple[int, ...]:
    """``_compute_slots_for_batch``: each group's slots for every sequence of ``batch``."""
    return tuple(
        sum(group.slots_for(capacity, history, tokens_per_block) for capacity, history in batch) for group in groups
    )


def slots_to_bytes(groups: Sequence[PoolGroup], slots: Sequence[int], granularity: int) -> tuple[int, ...]:
    """``_slots_to_bytes``: each pool of each group rounded up to ``granularity``."""
    return tuple(
        sum(round_up(count * size, granularity) for size in group.slot_sizes)
        for group, count in zip(groups, slots, strict=True)
    )


def ratio_from_batch(
    groups: Sequence[PoolGroup], batch: Batch, tokens_per_block: int, granularity: int
) -> tuple[float, ...]:
    """``ratio_from_batch``: each group's share of the bytes the batch needs."""
    needed = slots_to_bytes(groups, slots_for_batch(groups, batch, tokens_per_block), granularity)
    total = sum(needed)
    return tuple(value / total for value in needed)


def min_slots_from_constraints(
    groups: Sequence[PoolGroup], constraints: Sequence[Batch], tokens_per_block: int
) -> tuple[int, ...]:
    """``_compute_min_slots_from_constraints``: one slot per life cycle at least, then the element-wise max of each
    constraint batch's slots."""
    floor = [len(group.windows) for group in groups]
    for batch in constraints:
        for index, count in enumerate(slots_for_batch(groups, batch, tokens_per_block)):
            floor[index] = max(floor[index], count)
    return tuple(floor)


def grains_for_slots(count: int, sizes: Sequence[int], granularity: int) -> int:
    """``_grains_for_slots``."""
    return sum(div_up(count * size, granularity) for size in sizes)


def grains_to_slots(grains: int, sizes: Sequence[int], granularity: int) -> tuple[int, int]:
    """``_grains_to_slots``: the most slots a group's ``grains`` hold (each pool at least its one-slot grains, the
    grains split over the pools smallest first in proportion to their sizes, then searched upwards), and the grains
    they take."""
    least = [div_up(size, granularity) for size in sizes]
    if grains < sum(least):
        return 0, 0
    count = 1 << 63
    left = grains
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for position, pool in enumerate(order):
        rest = sum(sizes[i] for i in order[position:])
        share = max(least[pool], round(left * (sizes[pool] / rest)))
        count = min(count, share * granularity // sizes[pool])
        left -= share
    low, step = count, 1
    high = low + step
    while grains_for_slots(high, sizes, granularity) <= grains:
        low = high
        step *= 2
        high = low + step
    while low + 1 < high:
        middle = (low + high) // 2
        if grains_for_slots(middle, sizes, granularity) <= grains:
            low = middle
        else:
            high = middle
    return low, grains_for_slots(low, sizes, granularity)


def ratio_to_slot_counts(
    quota: int,
    sizes: Sequence[Sequence[int]],
    ratios: Sequence[float],
    granularity: int,
    min_slots: Sequence[int],
) -> tuple[int, ...]:
    """``CacheLevelStorage.ratio_to_slot_count_list``: the quota's grains divided among the groups by ratio (smallest
    ratio first, each taking ``round(budget x its share of the rest)``); groups at or below their ``min_slots`` are
    pinned to it and the others re-divided what is left; finally each group's count is raised while its grains
    allow."""
    if any(ratio <= 0 for ratio in ratios) or quota % granularity:
        raise ValueError("ratios must be positive and the quota a multiple of the granularity")
    counts = [0] * len(ratios)
    remaining = quota // granularity
    active = list(range(len(ratios)))
    while active:
        active_ratio = [ratios[group] for group in active]
        slots = [0] * len(active)
        budget = remaining
        order = sorted(range(len(active)), key=lambda i: active_ratio[i])
        for position, index in enumerate(order):
            share = active_ratio[index] / sum(active_ratio[i] for i in order[position:])
            slots[index], used = grains_to_slots(round(budget * share), sizes[active[index]], granularity)
            budget -= used
        pinned = [i for i in range(len(active)) if slots[i] <= min_slots[active[i]]]
        if not pinned:
            for i, group in enumerate(active):
                counts[group] = slots[i]
            break
        for i in pinned:
            group = active[i]
            least = grains_for_slots(min_slots[group], sizes[group], granularity)
            counts[group], used = grains_to_slots(least, sizes[group], granularity)
            remaining -= used
        rest = [active[i] for i in range(len(active)) if i not in pinned]
        if not rest:
            break
        if remaining <= 0:
            raise ValueError("Insufficient quota to satisfy min_slots constraints")
        active = rest
    for group, count in enumerate(counts):
        grains = grains_for_slots(count, sizes[group], granularity)
        while grains_for_slots(counts[group] + 1, sizes[group], granularity) <= grains:
            counts[group] += 1
    return tuple(counts)


def clamp_max_seq_len(
    groups: Sequence[PoolGroup], slots: Sequence[int], tokens_per_block: int, upper: int, batch_size: int = 1
) -> int:
    """``KVCacheManager.clamp_max_seq_len_for_mem(batch_size, upper)``: the longest sequence (a multiple of
    ``tokens_per_block``, at most ``upper``) whose slots fit every group beside ``batch_size - 1`` one-token
    sequences; 0 when not even one block fits (TensorRT-LLM asserts there)."""

    def needed(length: int) -> tuple[int, ...]:
        return tuple(group.slots_for(length, length, tokens_per_block) for group in groups)

    left = [count - needed(1)[i] * (batch_size - 1) for i, count in enumerate(slots)]

    def enough(blocks: int) -> bool:
        return all(need <= have for need, have in zip(needed(blocks * tokens_per_block), left, strict=True))

    if not enough(1):
        return 0
    low, high = 1, div_up(upper, tokens_per_block)
    if enough(high):
        return upper
    while low < high - 1:
        middle = (low + high) // 2
        if enough(middle):
            low = middle
        else:
            high = middle
    return min(low * tokens_per_block, upper)


def page_index_upper_bound(group: PoolGroup, slots: int, layer: int, kind: str) -> int:
    """``get_page_index_upper_bound(layer_id, KEY)`` of one buffer: the pages of its pool (slot bytes / buffer
    bytes x slots) less its offset in the slot, in buffers."""
    for pools in group.pools:
        for pool in pools:
            if (layer, kind) in pool.buffers:
                return len(pool.buffers) * slots - pool.buffers.index((layer, kind))
    raise KeyError((layer, kind))


@attrs.frozen(kw_only=True)
class V2Solve:
    """One ``KVCacheManagerV2``'s GPU level as its runtime sizes it."""

    manager: str
    tokens_per_block: int
    quota: int
    """The GPU quota the manager passes (``GpuCacheTierConfig(quota)``)."""
    granularity: int
    level_quota: int
    """``max(min quota, round_up(quota, granularity))``: what the level divides."""
    min_quota: int
    groups: tuple[PoolGroup, ...]
    typical_step: tuple[tuple[int, int], ...]
    """The typical batch's ``(capacity, history)`` kinds, each once (``typical_batch_counts`` says how many)."""
    typical_batch_counts: tuple[int, ...]
    constraints: tuple[tuple[tuple[int, int], ...], ...]
    min_slots: tuple[int, ...]
    ratios: tuple[float, ...]
    slots: tuple[int, ...]

    def group_bytes(self, index: int) -> int:
        """The bytes the group's pools take (each pool rounded up to the granularity)."""
        return slots_to_bytes(self.groups[index : index + 1], self.slots[index : index + 1], self.granularity)[0]

    @property
    def total_bytes(self) -> int:
        return sum(self.group_bytes(index) for index in range(len(self.groups)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "manager": self.manager,
            "quota": self.quota,
            "granularity": self.granularity,
            "level_quota": self.level_quota,
            "min_quota": self.min_quota,
            "typical_step": [
                {"capacity": capacity, "history_length": history, "count": count}
                for (capacity, history), count in zip(self.typical_step, self.typical_batch_counts, strict=True)
            ],
            "constraints": [
                [{"capacity": capacity, "history_length": history} for capacity, history in batch]
                for batch in self.constraints
            ],
            "pool_groups": [
                {
                    "index": group.index,
                    "windows": list(group.windows),
                    "kinds": list(group.kinds),
                    "layers": len(group.layers),
                    "slot_sizes": list(group.slot_sizes),
                    "min_slots": self.min_slots[group.index],
                    "ratio": self.ratios[group.index],
                    "slots": self.slots[group.index],
                    "bytes": self.group_bytes(group.index),
                }
                for group in self.groups
            ],
            "total_bytes": self.total_bytes,
        }


def solve(
    *,
    manager: str,
    layers: Sequence[TrtllmLayer],
    tokens_per_block: int,
    quota: int,
    typical_step: Sequence[tuple[tuple[int, int], int]],
    constraints: Sequence[Batch],
) -> V2Solve:
    """``StorageManager.__init__`` for the GPU level: pool groups, ``min_slots`` from ``constraints``, the ratio from
    ``typical_step`` (``(capacity, history)`` kinds with their counts), the level quota and each group's slots."""
    groups = pool_groups(layers, tokens_per_block)
    granularity = gpu_granularity(quota)
    min_slots = min_slots_from_constraints(groups, constraints, tokens_per_block)
    needed = [
        sum(group.slots_for(capacity, history, tokens_per_block) * count for (capacity, history), count in typical_step)
        for group in groups
    ]
    needed_bytes = slots_to_bytes(groups, needed, granularity)
    ratios = tuple(value / sum(needed_bytes) for value in needed_bytes)
    min_quota = sum(
        round_up(count * size, granularity)
        for group, count in zip(groups, min_slots, strict=True)
        for size in group.slot_sizes
    )
    level_quota = max(min_quota, round_up(quota, granularity))
    slots = ratio_to_slot_counts(level_quota, [group.slot_sizes for group in groups], ratios, granularity, min_slots)
    return V2Solve(
        manager=manager,
        tokens_per_block=tokens_per_block,
        quota=quota,
        granularity=granularity,
        level_quota=level_quota,
        min_quota=min_quota,
        groups=groups,
        typical_step=tuple(entry for entry, _ in typical_step),
        typical_batch_counts=tuple(count for _, count in typical_step),
        constraints=tuple(tuple(batch) for batch in constraints),
        min_slots=min_slots,
        ratios=ratios,
        slots=slots,
    )


__all__ = [
    "Pool",
    "PoolGroup",
    "V2Solve",
    "clamp_max_seq_len",
    "gpu_granularity",
    "grains_for_slots",
    "grains_to_slots",
    "min_slots_from_constraints",
    "page_index_upper_bound",
    "pool_groups",
    "ratio_from_batch",
    "ratio_to_slot_counts",
    "slots_for_batch",
    "slots_to_bytes",
    "solve",
    "stale_blocks",
]
