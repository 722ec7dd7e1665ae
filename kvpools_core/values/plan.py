"""What the plan is: ``Budget``, ``PoolSpec``, ``PoolSizing``, the host tier and ``Plan`` itself."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from kvpools_core.errors import InvalidValueError, KvpoolsError, PlanFormatError, short_repr
from kvpools_core.values._fields import (
    _int_tuple,
    _str_tuple,
    fraction,
    frozen_mapping,
    non_negative,
    one_of,
    optional_non_negative,
    optional_positive,
    positive,
    to_dict,
)
from kvpools_core.values.cost import (
    COST_UNITS,
    FIXED,
    FULL_TOKENS,
    REQUEST,
    STATE_SLOT,
    TOKEN,
    CellSize,
    CostModel,
    GroupCost,
    _token_space,
)
from kvpools_core.values.loading import load_value, parse_json, wrong
from kvpools_core.values.model import ModelSpec
from kvpools_core.values.serving import HICACHE_MEM_LAYOUTS, Serving, _optional_positive_ratio


def _pool_tuple(items: Iterable[PoolSpec]) -> tuple[PoolSpec, ...]:
    return tuple(items)


@attrs.frozen(kw_only=True)
class Budget:
    """The bytes the KV cache may use, and the arithmetic that produced them.

    ``explicit`` budgets are taken as given.  Measured budgets follow SGLang's
    ``_profile_available_bytes``: free memory after the weights load, minus
    ``pre_model_load * (1 - mem_fraction_static)`` of runtime slack, minus the
    multimodal reservation.
    """

    budget_bytes: int = attrs.field(validator=non_negative)
    source: str = "explicit"
    device: str | None = None
    free_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    weights_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    pre_model_load_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    mem_fraction_static: float | None = attrs.field(default=None, validator=attrs.validators.optional(fraction))
    slack_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    reserved_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    steps: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    gpu: str | None = None
    """The catalogue GPU (``kvpools_core.pipeline.gpus``) the budget was planned on, or ``"custom"``;
    ``None`` otherwise."""
    gpu_total_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    """That GPU's total memory as SGLang reads it (``get_device_memory_capacity``, MiB x 2^20)."""
    runtime_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    """What the runtime holds before the weights load (CUDA context, communicators): total - runtime = pre-load."""
    mem_fraction_source: str | None = None
    """Why ``mem_fraction_static`` has its value: ``"given"``, or SGLang's default and the terms behind it."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Budget:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# cell size and pools
# ---------------------------------------------------------------------------


def _unit_of_kind(pool: PoolSpec) -> str:
    """What a slot of a pool without a recorded unit is, from its kind (plans written before units)."""
    return {"request": REQUEST, "state": REQUEST, "fixed": FIXED}.get(pool.kind, TOKEN)


def _group_cost_or_none(value: GroupCost | Mapping[str, Any] | None) -> GroupCost | None:
    if value is None or type(value) is GroupCost:  # the common cases, without the ABC check of Mapping
        return value
    return GroupCost.from_dict(value) if isinstance(value, Mapping) else value


@attrs.frozen(kw_only=True)
class PoolSpec:
    """One physically separate allocation of the plan.

    ``slots`` are the usable slots (tokens, request rows, pages);
    ``padding_slots`` are allocated but never handed out (SGLang's page 0 and
    request row 0).  ``bytes`` is exactly what ``build`` allocates for it.
    ``sglang_charged`` says whether SGLang's own estimate counts it.

    ``unit`` is what the pool's size scales with (``"token"``, ``"request"``,
    ``"state_slot"`` or ``"fixed"``; unset, it follows ``kind``: request and
    state pools per request, fixed pools fixed, any other per token), and
    ``token_space`` which token count a token pool scales with (``"full"``;
    the SWA plugin's window pool ``"swa"``).  Its cost (:attr:`group_cost`)
    is then ``bytes_per_slot`` per unit plus the rest of ``bytes`` fixed, with
    ``slots`` counting units.  A pool whose bytes do not follow that (an
    allocator paying per page, a pool of whole pages with slack, a request
    table with rows beyond the requests) records its :class:`GroupCost` in
    ``cost``.
    """

    name: str
    kind: str
    slots: int = attrs.field(validator=non_negative)
    bytes_per_slot: int = attrs.field(validator=non_negative)
    bytes: int = attrs.field(validator=non_negative)
    padding_slots: int = attrs.field(default=0, validator=non_negative)
    sglang_charged: bool = True
    owner: str = ""
    unit: str = attrs.field(default=attrs.Factory(_unit_of_kind, takes_self=True), validator=one_of(*COST_UNITS))
    token_space: str = attrs.field(default=FULL_TOKENS, validator=_token_space)
    cost: GroupCost | None = attrs.field(default=None, converter=_group_cost_or_none)
    arena: str | None = None
    """The arena (:class:`Arena`, ``PoolSizing.arenas``) this pool's entries are carved from, or None for a pool
    allocated on its own.  A member's ``bytes`` are what it draws from the arena at the plan's counts, not an
    allocation: :attr:`PoolSizing.planned_bytes` counts the arena's own pool instead."""

    @cost.validator
    def _check_cost(self, _attribute: attrs.Attribute[Any], cost: GroupCost | None) -> None:
        if cost is None:
            return
        if not isinstance(cost, GroupCost):
            raise InvalidValueError(f"PoolSpec.cost of pool {self.name!r} must be a GroupCost, got {cost!r}.")
        if cost.group != self.name:
            raise InvalidValueError(f"PoolSpec.cost of pool {self.name!r} is named {cost.group!r}.")
        if cost.arena != self.arena:
            raise InvalidValueError(
                f"PoolSpec.cost of pool {self.name!r} (arena {self.arena!r}) is in arena {cost.arena!r}."
            )
        unit = self.unit
        if (
            (unit == TOKEN or not cost.token_bytes)
            and (unit == REQUEST or not cost.bytes_per_request)
            and (unit == STATE_SLOT or not cost.bytes_per_state_slot)
            and (unit != TOKEN or cost.token_space == self.token_space)
        ):
            return  # the common case, decided without building the message's parts (every plan builds many pools)
        paid = {
            TOKEN: cost.token_bytes,
            REQUEST: cost.bytes_per_request,
            STATE_SLOT: cost.bytes_per_state_slot,
        }
        other = [unit for unit, value in paid.items() if value and unit != self.unit]
        if other or (self.unit == TOKEN and cost.token_space != self.token_space):
            raise InvalidValueError(
                f"PoolSpec.cost of pool {self.name!r} (unit {self.unit}, token space {self.token_space}) "
                f"pays per {', '.join(other) or 'token of space ' + cost.token_space}."
            )

    @property
    def group_cost(self) -> GroupCost:
        """The pool's bytes as a function of its unit's count (see :class:`GroupCost`)."""
        if self.cost is not None:
            return self.cost
        if self.unit == FIXED:
            return GroupCost(group=self.name, fixed_bytes=self.bytes, arena=self.arena)
        fixed = self.bytes - self.bytes_per_slot * self.slots
        if fixed < 0:
            raise InvalidValueError(
                f"PoolSpec {self.name!r}: {self.bytes} B is less than {self.slots} slots x {self.bytes_per_slot} B; "
                f"record its cost (PoolSpec.cost)."
            )
        slot, unit = self.bytes_per_slot, self.unit
        return GroupCost(
            group=self.name,
            arena=self.arena,
            token_space=self.token_space,
            fixed_bytes=fixed,
            token_bytes=slot if unit == TOKEN else 0,
            bytes_per_request=slot if unit == REQUEST else 0,
            bytes_per_state_slot=slot if unit == STATE_SLOT else 0,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolSpec:
        return load_value(cls, data)


def _token_window_or_dict(value: TokenWindow | Mapping[str, Any]) -> TokenWindow:
    return TokenWindow.from_dict(value) if isinstance(value, Mapping) else value


def _window_tuple(items: Iterable[TokenWindow | Mapping[str, Any]]) -> tuple[TokenWindow, ...]:
    return tuple(_token_window_or_dict(item) for item in items)


@attrs.frozen(kw_only=True)
class TokenWindow:
    """The most tokens of one token space a request holds, whatever its length: a sliding window's worst case.

    SGLang frees a request's out-of-window tokens of a sliding-window pool as it
    decodes, so past the window a request costs that pool the same however long
    it grows.  The terms are those of SGLang's ``SWAChunkCapPoolConfigurator``
    (``002_50706b73e02ffb67.txt`` lines 412-458), recorded by the sizing plugin
    that knows the engine (through ``kvpools_core.parts.sizing.sliding_window_terms``:
    the swa plugin for its ``"swa"`` space, the dsv4 plugin for DeepSeek-V4's,
    whose SWA rows SGLang's scheduler evicts alike) so readers of a plan
    (``kvpools capacity``) need not re-derive them::

        per_request = window + eviction_interval x draft_tokens + page_size + decode_alloc   (lines 435, 445)

    Beyond that, ``prefills_in_flight`` requests are being prefilled at once,
    each holding up to ``prefill_chunk`` more (lines 454-458: two chunks with the
    overlap schedule, one without, none on a decode node), and ``reserved``
    tokens stay held whatever the requests (a page; on a decode node
    ``(window + page) x disaggregation_decode_extra_slots``, lines 448-452).
    SGLang's chunk cap sizes the pool as ``per_request x requests +
    prefills_in_flight x prefill_chunk + reserved``.
    """

    token_space: str = attrs.field(validator=_token_space)
    window: int = attrs.field(validator=positive)
    """The sliding window (``mr.sliding_window_size``, line 427)."""
    eviction_interval: int = attrs.field(validator=positive)
    """``max(1, SGLANG_SWA_EVICTION_INTERVAL)`` (line 429): out-of-window tokens wait this many decode steps."""
    draft_tokens: int = attrs.field(validator=positive)
    """``speculative_num_draft_tokens or 1`` (line 428): tokens one decode step writes."""
    page_size: int = attrs.field(validator=positive)
    """The page that keeps the eviction point page aligned (line 435)."""
    decode_alloc: int = attrs.field(validator=positive)
    """The next decode step's outstanding allocation (lines 436-444): a page; spec-v1
    ``spec_decode_alloc_len_per_request``; spec-v2 ``2 x get_alloc_len_per_decode``."""
    prefill_chunk: int | None = attrs.field(validator=optional_positive)
    """``--chunked-prefill-size``; None: a prompt is prefilled whole (one chunk as long as the prompt)."""
    prefills_in_flight: int = attrs.field(validator=non_negative)
    """Requests prefilled at once: 2 with the overlap schedule, 1 without, 0 on a decode node (line 454)."""
    reserved: int = attrs.field(validator=non_negative)
    """Tokens held whatever the requests: a page, or a decode node's pre-allocated slots (lines 448-458)."""

    @property
    def per_request(self) -> int:
        """The most tokens one decoding request holds: ``window + eviction_interval x draft_tokens + page_size +
        decode_alloc`` (SGLang's ``per_request``, lines 435 and 445)."""
        return self.window + self.eviction_interval * self.draft_tokens + self.page_size + self.decode_alloc

    def describe(self) -> str:
        """One line: the worst case per request and its terms, the prefills in flight, the reserve."""
        chunk = f"{self.prefill_chunk:,}" if self.prefill_chunk is not None else "a whole prompt"
        return (
            f"{self.token_space}: at most {self.per_request:,} tokens/request past the window (window {self.window:,} "
            f"+ eviction interval {self.eviction_interval:,} x {self.draft_tokens} draft token(s) + page "
            f"{self.page_size:,} + decode {self.decode_alloc:,}); + up to {chunk} for each of "
            f"{self.prefills_in_flight} prefill(s) in flight; {self.reserved:,} reserved"
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenWindow:
        return load_value(cls, data)


ARENA_GROWTH = ("up", "down", "float")
ARENA_ROW_ORDERS = ("layer", "part")


@attrs.frozen(kw_only=True)
class ArenaSubPool:
    """One sub-pool carved from an :class:`Arena`: its plan pool, its entry, its index space and where it grows.

    ``entry_bytes`` is one slot over all its layers (token-major); ``page_size``
    the sub-pool's page (the serving page for KV, 1 for state); ``max_slots``
    ``arena // entry`` (every sub-pool's views span the whole arena) and
    ``min_slot_index`` the first slot past the sink.  ``grows`` is ``"up"`` (from
    the arena's low end), ``"down"`` (from its high end) or ``"float"`` (between them).
    ``row_order`` says where row ``r`` of layer ``l`` lies in an entry: ``"layer"``
    (layer-major, SGLang's KV entry ``[K_0 | V_0 | K_1 | ...]``: ``l x sum(rows) +
    sum(rows[:r])``) or ``"part"`` (part-major, SGLang's Mamba entry ``[conv[0] x L |
    ... | temporal x L]``: ``L x sum(rows[:r]) + l x rows[r]``; a state entry only).
    """

    pool: str
    kind: str = attrs.field(validator=one_of("kv", "state"))
    entry_bytes: int = attrs.field(validator=positive)
    page_size: int = attrs.field(validator=positive)
    max_slots: int = attrs.field(validator=non_negative)
    min_slot_index: int = attrs.field(validator=non_negative)
    grows: str = attrs.field(validator=one_of(*ARENA_GROWTH))
    layer_num: int = attrs.field(default=1, validator=positive)
    """Layers one entry holds (token-major: all of them, one after the other)."""
    row_bytes: tuple[int, ...] = attrs.field(default=(), converter=_int_tuple)
    """One layer's rows within an entry, in order (K, V; the latent; a state entry's conv tensors then its temporal
    state); empty: the entry is one opaque row per layer (a state entry whose plugin does not say its parts)."""
    row_order: str = attrs.field(default="layer", validator=one_of(*ARENA_ROW_ORDERS))
    """``"layer"`` (every layer's rows together) or ``"part"`` (each row of every layer together); see above."""

    def __attrs_post_init__(self) -> None:
        used = self.layer_num * sum(self.row_bytes)
        if used > self.entry_bytes:
            raise InvalidValueError(
                f"ArenaSubPool {self.pool!r}: {self.layer_num} layer(s) of rows {self.row_bytes} B take {used:,} B, "
                f"more than the entry's {self.entry_bytes:,} B; give rows that fit the entry."
            )
        if self.row_order == "part" and (self.kind != "state" or not self.row_bytes):
            raise InvalidValueError(
                f"ArenaSubPool {self.pool!r}: row_order 'part' (SGLang's part-major Mamba entry) needs kind 'state' "
                f"and its rows, got kind {self.kind!r} and rows {self.row_bytes}; use row_order 'layer'."
            )

    def row_offset(self, layer: int, row: int) -> int:
        """Byte offset of layer ``layer``'s row ``row`` within an entry (``row_order``; one opaque row per layer
        when ``row_bytes`` is empty)."""
        rows = self.row_bytes or (self.entry_bytes // self.layer_num,)
        if self.row_order == "part":
            return self.layer_num * sum(rows[:row]) + layer * rows[row]
        return layer * sum(rows) + sum(rows[:row])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArenaSubPool:
        return load_value(cls, data)


def _sub_pool_tuple(items: Iterable[ArenaSubPool | Mapping[str, Any]]) -> tuple[ArenaSubPool, ...]:
    return tuple(ArenaSubPool.from_dict(item) if isinstance(item, Mapping) else item for item in items)


@attrs.frozen(kw_only=True)
class Arena:
    """Pools that share one allocation whose boundaries move at run time (SGLang's ``--enable-unified-memory``).

    ``bytes`` is the one buffer (a plan pool of the same ``name``, kind ``"arena"``,
    allocates it); ``sink_bytes`` the padding sink at its bottom; ``sub_pools`` the
    pools (``PoolSpec.arena`` = ``name``) carved from it.  At the plan's counts
    the members draw ``Plan.cost.arena_draw(name, ...)`` and ``sink + draw <=
    bytes``; other counts trade one sub-pool's entries for another's.
    ``labels`` are the figures the engine prints at boot under their engine
    names (``size_full``, ``mamba_slot_full_token_cost``, ...) and
    ``floor_bytes`` the batch-size-1 feasibility floor (SGLang refuses an arena
    below it).  Any architecture plugin may answer ``size_pools`` with arenas.
    """

    name: str
    bytes: int = attrs.field(validator=non_negative)
    sink_bytes: int = attrs.field(validator=non_negative)
    sub_pools: tuple[ArenaSubPool, ...] = attrs.field(converter=_sub_pool_tuple)
    labels: Mapping[str, int] = attrs.field(factory=dict, converter=frozen_mapping)
    floor_bytes: int = attrs.field(default=0, validator=non_negative)
    lazy_compaction: bool = True

    def sub_pool(self, pool: str) -> ArenaSubPool:
        for sub in self.sub_pools:
            if sub.pool == pool:
                return sub
        raise KeyError(f"arena {self.name!r} has no sub-pool {pool!r}; sub-pools: {[s.pool for s in self.sub_pools]}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Arena:
        return load_value(cls, data)


def _arena_tuple(items: Iterable[Arena | Mapping[str, Any]]) -> tuple[Arena, ...]:
    return tuple(Arena.from_dict(item) if isinstance(item, Mapping) else item for item in items)


@attrs.frozen(kw_only=True)
class PoolSizing:
    """The answer of ``size_pools``: token and request counts, and every pool.

    ``sglang_config`` holds SGLang's ``MemoryPoolConfig`` fields under their
    SGLang names (only those the model has).  ``token_counts`` are the tokens
    of each token space the pools scale with (unset: ``max_total_num_tokens``
    full tokens; the SWA plugin names ``"full"`` and ``"swa"``) and
    ``state_slots`` the slots of a state cache (the mamba plugin's
    ``max_mamba_cache_size``): with ``max_running_requests`` they are the
    :attr:`counts` the :attr:`cost` model reproduces the pools' bytes from.
    ``state_slots_per_request`` is how many of those slots one running
    request may hold at its peak (SGLang's ``_calculate_mamba_ratio``: 3 with
    the radix cache, 1 without), so capacity answers divide by the sizing
    plugin's own figure instead of re-deriving the engine's rule.
    ``windows`` are the :class:`TokenWindow` terms of each token space a
    request holds only up to a worst case (the swa and dsv4 plugins' ``"swa"``), for
    the same reason: capacity answers read them, no reader re-derives them.
    ``compression`` maps each *compressed* token space to its ratio ``r``:
    the space's slot of full-token slot ``s`` is ``s // r``, so it has no
    allocator of its own and a request holding ``k`` full pages holds
    ``k x page / r`` of its slots (``r`` divides the page; the dsv4 plugin's
    ``"c4"`` 4 and ``"c128"`` 128, SGLang's ``full slot // compress_ratio``).
    A token space other than ``"full"`` that is neither windowed nor
    compressed is one readers cannot say a request's holding of.
    ``compression_pages`` gives, for a compressed space that has a paged
    allocator of its own (SGLang's NPU DeepSeek-V4 c128 pool:
    ``NPUPagedTokenToKVPoolAllocator(c128_size, page_size=c128_page_size)``),
    its page ``p`` in slots of the space: a request of ``L`` tokens then
    holds ``ceil((L // r) / p)`` pages, ``p`` slots each, of it (the engine
    allocates ``seq_len // r - prefix_len // r`` slots per extend); a space
    not named there is slot-for-slot as above.
    ``token_space_sizing`` says, per token space, how the sizing plugin sized
    it, as a sentence a report prints (the swa and dsv4 plugins' ``"swa"``:
    SGLang's ratio split, the hybrid-SWA chunk cap, DeepSeek-V4.1's cap mode,
    with their numbers); readers that explain a space
    (:func:`kvpools_core.planning.capacity.window_pool_sizing`) ask it rather
    than search ``notes``, which may repeat the sentence for the report.
    """

    max_total_num_tokens: int = attrs.field(validator=non_negative)
    max_running_requests: int = attrs.field(validator=non_negative)
    pools: tuple[PoolSpec, ...] = attrs.field(converter=_pool_tuple)
    sglang_config: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)
    sglang_estimate_bytes: int = attrs.field(default=0, validator=non_negative)
    notes: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    token_counts: Mapping[str, int] = attrs.field(
        default=attrs.Factory(lambda self: {FULL_TOKENS: self.max_total_num_tokens}, takes_self=True),
        converter=frozen_mapping,
    )
    state_slots: int = attrs.field(default=0, validator=non_negative)
    state_slots_per_request: int = attrs.field(default=0, validator=non_negative)
    windows: tuple[TokenWindow, ...] = attrs.field(default=(), converter=_window_tuple)
    compression: Mapping[str, int] = attrs.field(factory=dict, converter=frozen_mapping)
    compression_pages: Mapping[str, int] = attrs.field(factory=dict, converter=frozen_mapping)
    arenas: tuple[Arena, ...] = attrs.field(default=(), converter=_arena_tuple)
    """The arenas pools are carved from (:class:`Arena`; ``PoolSpec.arena`` names one); empty without any."""
    token_space_sizing: Mapping[str, str] = attrs.field(factory=dict, converter=frozen_mapping)
    """How the sizing plugin sized a token space, by space, in a sentence a report prints (the rule and its numbers),
    where the plugin states it: the swa and dsv4 plugins' ``"swa"`` (SGLang's ratio split, the hybrid-SWA chunk cap,
    DeepSeek-V4.1's cap mode).  Readers ask it (:func:`kvpools_core.planning.capacity.window_pool_sizing`) instead
    of searching ``notes``, which may hold the same sentence for the report.  Each key is a counted token space."""

    @compression.validator
    def _check_compression(self, _attribute: attrs.Attribute[Any], compression: Mapping[str, int]) -> None:
        windowed = {window.token_space for window in self.windows}
        for space, ratio in compression.items():
            if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1:
                raise InvalidValueError(f"PoolSizing.compression[{space!r}] must be a positive integer, got {ratio!r}.")
            if space == FULL_TOKENS or space not in self.token_counts or space in windowed:
                raise InvalidValueError(
                    f"PoolSizing.compression: token space {space!r} must be counted (token_counts has "
                    f"{sorted(self.token_counts)}), not {FULL_TOKENS!r} and not windowed."
                )

    @token_space_sizing.validator
    def _check_token_space_sizing(self, _attribute: attrs.Attribute[Any], sizing: Mapping[str, str]) -> None:
        for space, sentence in sizing.items():
            if space not in self.token_counts or not isinstance(sentence, str) or not sentence.strip():
                raise InvalidValueError(
                    f"PoolSizing.token_space_sizing[{space!r}] must be a sentence (a non-empty string) about a "
                    f"counted token space (token_counts has {sorted(self.token_counts)}), got {sentence!r}."
                )

    @compression_pages.validator
    def _check_compression_pages(self, _attribute: attrs.Attribute[Any], pages: Mapping[str, int]) -> None:
        for space, page in pages.items():
            if isinstance(page, bool) or not isinstance(page, int) or page < 1 or space not in self.compression:
                raise InvalidValueError(
                    f"PoolSizing.compression_pages[{space!r}] must be a positive integer page of a compressed token "
                    f"space (compression has {sorted(self.compression)}), got {page!r}."
                )

    @windows.validator
    def _check_windows(self, _attribute: attrs.Attribute[Any], windows: tuple[TokenWindow, ...]) -> None:
        spaces = [window.token_space for window in windows]
        for space in spaces:
            if space not in self.token_counts or spaces.count(space) > 1:
                raise InvalidValueError(
                    f"PoolSizing.windows: token space {space!r} must be counted (token_counts has "
                    f"{sorted(self.token_counts)}) and given one window, got {spaces}."
                )

    def with_notes(self, notes: Iterable[str]) -> PoolSizing:
        """This sizing with ``notes`` instead of its own: the value ``attrs.evolve(self, notes=notes)`` makes.

        Only the notes change, and no validator reads them (``tests/core/test_pool_sizing_notes.py`` keeps it
        so), so the other fields' converters and validators, which held when this sizing was built (where a
        plugin's answer is checked), are not run again: the pipeline adds its notes to every plan's sizing, and
        that re-validation was a tenth of a DeepSeek-V4 sizing's cost (issue 37)."""
        cls = type(self)
        names = _POOL_SIZING_FIELDS if cls is PoolSizing else tuple(field.name for field in attrs.fields(cls))
        new = object.__new__(cls)
        for name in names:
            object.__setattr__(new, name, getattr(self, name))
        object.__setattr__(new, "notes", _str_tuple(notes))
        return new

    def window(self, token_space: str) -> TokenWindow | None:
        """The worst-case window of ``token_space``, or None when a request holds every token it has there."""
        return next((window for window in self.windows if window.token_space == token_space), None)

    @token_counts.validator
    def _check_token_counts(self, _attribute: attrs.Attribute[Any], counts: Mapping[str, int]) -> None:
        for space, count in counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise InvalidValueError(
                    f"PoolSizing.token_counts[{space!r}] must be a non-negative integer, got {count!r}."
                )
        for pool in self.pools:
            if isinstance(pool, PoolSpec) and pool.unit == TOKEN and pool.token_space not in counts:
                raise InvalidValueError(
                    f"PoolSizing.token_counts has no count for token space {pool.token_space!r} of pool "
                    f"{pool.name!r}; it counts {sorted(counts)}."
                )

    @property
    def planned_bytes(self) -> int:
        """Bytes ``build`` allocates: every pool's, an arena's members counted once, as the arena."""
        return sum(pool.bytes for pool in self.pools if pool.arena is None)

    def arena(self, name: str) -> Arena:
        for arena in self.arenas:
            if arena.name == name:
                return arena
        raise KeyError(f"plan has no arena named {name!r}; arenas: {[a.name for a in self.arenas]}")

    @property
    def counts(self) -> dict[str, Any]:
        """The counts the pools were sized for, as :meth:`CostModel.bytes_for` takes them."""
        return {
            "tokens": dict(self.token_counts),
            "requests": self.max_running_requests,
            "state_slots": self.state_slots,
        }

    @property
    def cost(self) -> CostModel:
        """The plan's cost model, one group per pool (:attr:`PoolSpec.group_cost`):
        ``cost.bytes_for(**counts) == planned_bytes``, and other counts give other plans' bytes."""
        return CostModel(pool.group_cost for pool in self.pools)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolSizing:
        return load_value(cls, data)


_POOL_SIZING_FIELDS = tuple(field.name for field in attrs.fields(PoolSizing))


# ---------------------------------------------------------------------------
# host tier (SGLang HiCache)
# ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class HostPool:
    """The host (CPU, pinned) mirror of one device pool, as SGLang's HiCache sizes it (``kvpools_core.pipeline.host``).

    ``slots`` are the host slots allocated (tokens, or state slots for a state
    pool): SGLang's ``size = (requested // page_size + 1) x page_size``, every one
    of them usable (its host allocator hands out all of ``size``);
    ``device_slots`` the device pool's capacity it was sized from
    (``device_capacity_tokens``).  ``bytes`` is what ``build`` allocates:
    ``rows x bytes_per_slot`` with ``rows`` = ``slots``, or, for a pool riding
    on another's slots (``rides_on``: the DSA indexer rides on the latent
    pool), its paged rows with slack.  ``sized_by`` says which rule sized it.
    """

    name: str
    device_pool: str
    unit: str = attrs.field(validator=one_of(TOKEN, STATE_SLOT))
    token_space: str = attrs.field(default=FULL_TOKENS, validator=_token_space)
    device_slots: int = attrs.field(validator=non_negative)
    page_size: int = attrs.field(validator=positive)
    slots: int = attrs.field(validator=non_negative)
    rows: int = attrs.field(validator=non_negative)
    bytes_per_slot: int = attrs.field(validator=non_negative)
    bytes: int = attrs.field(validator=non_negative)
    layout: str = attrs.field(validator=one_of(*HICACHE_MEM_LAYOUTS))
    sized_by: str = ""
    rides_on: str | None = None
    packed: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    """Device pools whose rows SGLang packs into this host pool's rows (MTP draft layers, :class:`PackedInto`):
    ``bytes_per_slot`` is this pool's device row plus theirs."""
    page_bytes: int = attrs.field(default=0, validator=non_negative)
    """Bytes of one host page over all its layers, for a pool SGLang lays out in whole padded pages, not rows
    (DeepSeek-V4's ``DeepSeekV4PagedHostPool`` / ``DeepSeekV4StateHostPool``): then ``bytes = pages x page_bytes``
    and ``bytes_per_slot`` is 0.  0 for a row pool (a page is ``page_size x bytes_per_slot``)."""
    unused_bytes: int = attrs.field(default=0, validator=non_negative)
    """Bytes of ``bytes`` that are pinned but never hold data (a padded page's padding), part of ``bytes``."""

    def __attrs_post_init__(self) -> None:
        if self.page_bytes:
            if self.bytes_per_slot or self.rows % self.page_size or self.bytes != self.pages * self.page_bytes:
                raise InvalidValueError(
                    f"HostPool {self.name!r}: a paged host pool needs bytes_per_slot 0, rows {self.rows} in whole "
                    f"pages of {self.page_size} and bytes {self.bytes} = pages {self.pages} x page_bytes "
                    f"{self.page_bytes}."
                )
        elif self.bytes != self.rows * self.bytes_per_slot:
            raise InvalidValueError(
                f"HostPool {self.name!r}: bytes {self.bytes} != rows {self.rows} x bytes_per_slot "
                f"{self.bytes_per_slot}."
            )
        if self.unused_bytes > self.bytes:
            raise InvalidValueError(f"HostPool {self.name!r}: unused_bytes {self.unused_bytes} > bytes {self.bytes}.")

    @property
    def pages(self) -> int:
        return self.rows // self.page_size

    @property
    def bytes_per_page(self) -> int:
        """One host page's bytes: ``page_bytes``, or ``page_size x bytes_per_slot`` for a row pool."""
        return self.page_bytes or self.page_size * self.bytes_per_slot

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostPool:
        return load_value(cls, data)


@attrs.frozen
class PackedInto:
    """A ``host_mirrors`` answer for a device pool whose rows SGLang packs into another pool's host rows.

    SGLang's packed MTP drafts (``HiCacheDraftMode.PACKED``,
    ``speculative/base_spec_worker.py`` ``_build_hicache_draft_plan``) hand the
    draft worker's one-layer KV pools to the target's host pool as extra layers
    (``draft_buffer_infos``: ``layer_num = target_layer_num + drafts``), so the
    host pool's bytes per token grow by the draft rows and no host pool of the
    draft's own exists.  ``pool`` names the mirrored pool it is packed into.
    """

    pool: str


@attrs.frozen(kw_only=True)
class HostMemory:
    """The node's host memory the host tier was checked against, and how it was known.

    ``available_bytes`` is measured (``psutil.virtual_memory().available``, or
    ``MemAvailable`` of ``/proc/meminfo`` without psutil) or stated
    (``--host-memory``); ``reserve_bytes`` is left to the OS and other processes
    (SGLang's ``HICACHE_HOST_MEMORY_RESERVE_BYTES``, 10 GiB, unless ``--host-reserve``).
    What the ranks of a node may pin is ``available - reserve``, each rank
    ``(available - reserve) // ranks_per_node`` (SGLang's ``host_memory_budget_bytes``).
    """

    available_bytes: int = attrs.field(validator=non_negative)
    reserve_bytes: int = attrs.field(validator=non_negative)
    source: str

    @property
    def usable_bytes(self) -> int:
        return max(self.available_bytes - self.reserve_bytes, 0)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostMemory:
        return load_value(cls, data)


def _host_pool_tuple(items: Iterable[HostPool | Mapping[str, Any]]) -> tuple[HostPool, ...]:
    return tuple(HostPool.from_dict(item) if isinstance(item, Mapping) else item for item in items)


def _host_memory_or_none(value: HostMemory | Mapping[str, Any] | None) -> HostMemory | None:
    return HostMemory.from_dict(value) if isinstance(value, Mapping) else value


@attrs.frozen(kw_only=True)
class HostTier:
    """The plan's host KV tier: every host pool of one rank, what one rank and one node pin, the check.

    Derived from the device plan by :func:`kvpools_core.pipeline.host.plan_host_tier`
    (SGLang's rules, ``docs/host-tier.md``).  ``ranks_per_node`` is
    :attr:`Serving.ranks_per_node`; ``memory`` the node check (None when the
    tier was sized without one).
    """

    pools: tuple[HostPool, ...] = attrs.field(converter=_host_pool_tuple)
    ranks_per_node: int = attrs.field(validator=positive)
    dcp_size: int = attrs.field(default=1, validator=positive)
    """Decode-context-parallel ranks sharing each token (``--dcp-size``): a host slot is one physical row of
    one rank, ``dcp_size`` logical tokens share it (``HostKVCache.logical_size = size x dcp_size``)."""
    pinned: bool = True
    memory: HostMemory | None = attrs.field(default=None, converter=_host_memory_or_none)
    notes: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    hicache_ratio: float | None = attrs.field(default=None, validator=_optional_positive_ratio)
    """The ratio the host pools were sized by: ``--hicache-ratio``, SGLang's default 2.0, or the auto-sized
    ratio (:attr:`auto_sized`); None under ``--hicache-size``."""
    auto_sized: bool = False
    """Whether SGLang's auto-sizing chose :attr:`hicache_ratio` (:attr:`Serving.hicache_auto_sized`)."""
    retraction_backup: bool = False
    """Whether the pools are a decode node's retraction backup alone (``host_pool`` without HiCache)."""

    @property
    def bytes_per_rank(self) -> int:
        """Host bytes one rank allocates (pins where CUDA is there): the sum of its host pools."""
        return sum(pool.bytes for pool in self.pools)

    @property
    def bytes_per_node(self) -> int:
        """Host bytes the node's ranks allocate together: ``bytes_per_rank x ranks_per_node``."""
        return self.bytes_per_rank * self.ranks_per_node

    @property
    def unused_bytes_per_rank(self) -> int:
        """Bytes one rank pins that never hold data (:attr:`HostPool.unused_bytes`, summed)."""
        return sum(pool.unused_bytes for pool in self.pools)

    @property
    def tokens(self) -> int | None:
        """The full tokens the host tier holds (its first full-token pool's slots x ``dcp_size``: the radix
        tree's logical host tokens, ``HostKVCache.logical_size``), or None."""
        slots = next((p.slots for p in self.pools if p.unit == TOKEN and p.token_space == FULL_TOKENS), None)
        return None if slots is None else slots * self.dcp_size

    def pool(self, name: str) -> HostPool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"host tier has no pool named {name!r}; pools: {[p.name for p in self.pools]}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostTier:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------

PLAN_FORMAT = 1


@attrs.frozen(kw_only=True)
class Plan:
    """The complete, frozen pool plan: what to build and why.

    ``provenance`` maps each hook to the plugins that shaped its result (the
    answering plugin first, then wrappers).
    """

    model: ModelSpec
    serving: Serving
    budget: Budget
    cell: CellSize
    sizing: PoolSizing
    provenance: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict, converter=frozen_mapping)
    format: int = PLAN_FORMAT
    host: HostTier | None = None
    """The host KV tier (``--enable-hierarchical-cache``), or None without one."""

    @property
    def host_kv_bytes(self) -> int | None:
        """Host bytes one rank pins for the host tier (:attr:`HostTier.bytes_per_rank`), None without a tier."""
        return None if self.host is None else self.host.bytes_per_rank

    @property
    def host_tokens(self) -> int | None:
        """Full tokens one rank's host tier holds (:attr:`HostTier.tokens`), None without a tier."""
        return None if self.host is None else self.host.tokens

    @property
    def max_total_num_tokens(self) -> int:
        return self.sizing.max_total_num_tokens

    @property
    def max_running_requests(self) -> int:
        return self.sizing.max_running_requests

    @property
    def pools(self) -> tuple[PoolSpec, ...]:
        return self.sizing.pools

    @property
    def planned_bytes(self) -> int:
        return self.sizing.planned_bytes

    @property
    def cost(self) -> CostModel:
        """What the plan costs per token (of each token space), per request, per state slot, and fixed."""
        return self.sizing.cost

    @property
    def counts(self) -> dict[str, Any]:
        """Tokens (per token space), requests and state slots the plan was sized for."""
        return self.sizing.counts

    @property
    def windows(self) -> tuple[TokenWindow, ...]:
        """The worst-case window terms of each windowed token space (:attr:`PoolSizing.windows`)."""
        return self.sizing.windows

    @property
    def compression(self) -> Mapping[str, int]:
        """Full tokens per token of each compressed token space (:attr:`PoolSizing.compression`)."""
        return self.sizing.compression

    @property
    def compression_pages(self) -> Mapping[str, int]:
        """The allocator page of each compressed token space that has one (:attr:`PoolSizing.compression_pages`)."""
        return self.sizing.compression_pages

    def pool(self, name: str) -> PoolSpec:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"plan has no pool named {name!r}; pools: {[p.name for p in self.pools]}")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def problems(self) -> list[str]:
        """What breaks an invariant every plan kvpools makes keeps, each naming its field (``plan.sizing....``).

        Empty for every plan :func:`kvpools_core.plan` returns; :meth:`from_dict` refuses a plan with any.
        Checked beyond each value's own validators because they relate values: the tokens are whole pages,
        every token space a pool holds has tokens, the pools' bytes are what their cost model gives for the
        plan's counts, an exact plan fits its budget, the host tier exists exactly when the serving options
        build one and mirrors plan pools.
        """
        sizing, page = self.sizing, self.serving.page_size
        found = []
        tokens = sizing.max_total_num_tokens
        if tokens < page or tokens % page:
            found.append(
                f"plan.sizing.max_total_num_tokens must be a positive whole number of pages of {page} "
                f"(serving.page_size), got {tokens}."
            )
        if sizing.max_running_requests < 1:
            found.append(f"plan.sizing.max_running_requests must be at least 1, got {sizing.max_running_requests}.")
        spaces = dict.fromkeys(pool.token_space for pool in sizing.pools if pool.unit == TOKEN and pool.arena is None)
        found.extend(
            f"plan.sizing.token_counts[{space!r}] must be positive: token pools hold its tokens, got {count}."
            for space in spaces
            if space != FULL_TOKENS and (count := sizing.token_counts.get(space, 0)) < 1
        )
        full = sizing.token_counts.get(FULL_TOKENS, tokens)
        if full != tokens:
            found.append(
                f"plan.sizing.token_counts['{FULL_TOKENS}'] ({full}) must equal "
                f"plan.sizing.max_total_num_tokens ({tokens})."
            )
        try:
            costed = self.cost.bytes_for(**self.counts)
        except KvpoolsError as exc:
            found.append(f"plan.sizing.pools: {exc}")
        else:
            if costed != self.planned_bytes:
                found.append(
                    f"plan.sizing.pools hold {self.planned_bytes:,} B in all, but their costs (PoolSpec.cost) give "
                    f"{costed:,} B for the plan's counts {self.counts}."
                )
        if self.serving.accounting == "exact" and self.planned_bytes > self.budget.budget_bytes:
            found.append(
                f"plan.sizing.pools need {self.planned_bytes:,} B, over plan.budget.budget_bytes "
                f"({self.budget.budget_bytes:,} B): an exact plan fits its budget."
            )
        found.extend(self._arena_problems())
        found.extend(self._host_problems())
        return found

    def _arena_problems(self) -> list[str]:
        """Every member names an arena; each arena is one pool of its bytes; sink + draws fit it."""
        sizing, found = self.sizing, []
        arenas = {arena.name: arena for arena in sizing.arenas}
        pools = {pool.name: pool for pool in sizing.pools}
        for i, pool in enumerate(sizing.pools):
            if pool.arena is not None and pool.arena not in arenas:
                found.append(f"plan.sizing.pools[{i}].arena {pool.arena!r} names no arena of plan.sizing.arenas.")
        for i, arena in enumerate(sizing.arenas):
            own = pools.get(arena.name)
            if own is None or own.arena is not None or own.bytes != arena.bytes:
                found.append(
                    f"plan.sizing.arenas[{i}] ({arena.name!r}, {arena.bytes:,} B) needs a pool of its name and bytes "
                    "that is no arena's member."
                )
                continue
            members = [pool.name for pool in sizing.pools if pool.arena == arena.name]
            subs = [sub.pool for sub in arena.sub_pools]
            if sorted(members) != sorted(subs):
                found.append(f"plan.sizing.arenas[{i}].sub_pools {subs} are not the pools carved from it {members}.")
                continue
            draw = self.cost.arena_draw(arena.name, **self.counts)
            if arena.sink_bytes + draw > arena.bytes:
                found.append(
                    f"plan.sizing.arenas[{i}] ({arena.name!r}): the sink ({arena.sink_bytes:,} B) and its sub-pools' "
                    f"draw at the plan's counts ({draw:,} B) exceed its {arena.bytes:,} B."
                )
        return found

    def _host_problems(self) -> list[str]:
        if (self.host is not None) != self.serving.host_tier:
            has = "has a host tier" if self.host is not None else "has no host tier (plan.host is null)"
            return [
                f"plan.host: the plan {has}, but serving.enable_hierarchical_cache is "
                f"{str(self.serving.enable_hierarchical_cache).lower()} and "
                f"serving.disaggregation_decode_retraction_backup is "
                f"{self.serving.disaggregation_decode_retraction_backup!r}: a host tier exists exactly when they "
                "build one."
            ]
        if self.host is None:
            return []
        names = {pool.name for pool in self.pools}
        return [
            f"plan.host.pools[{i}].device_pool {pool.device_pool!r} names no pool of plan.sizing.pools "
            f"({sorted(names)})."
            for i, pool in enumerate(self.host.pools)
            if pool.device_pool not in names
        ]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Load a plan from its plain-JSON form (or the CLI's ``--json`` summary, which wraps it under ``plan``).

        Every field is checked against its type and its validators, and the plan against :meth:`problems`;
        anything else raises :class:`~kvpools_core.errors.PlanFormatError` naming the field's path.
        """
        if isinstance(data, Mapping) and "plan" in data and "model" not in data:
            data = data["plan"]
        if isinstance(data, Mapping) and "format" in data:
            version = data["format"]
            if isinstance(version, bool) or not isinstance(version, int):
                raise wrong("plan.format", version, f"the integer {PLAN_FORMAT}")
            if version != PLAN_FORMAT:
                raise PlanFormatError(
                    f"plan.format {short_repr(version)} is not supported: this kvpools reads plan format "
                    f"{PLAN_FORMAT}. Load it with the kvpools that wrote it, or plan again.",
                    path="plan.format",
                )
        loaded = load_value(cls, data, "plan")
        found = loaded.problems()
        if found:
            raise PlanFormatError(" ".join(found), path=found[0].split(" ", 1)[0].split(":", 1)[0])
        return loaded

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        """Load a plan from ``to_json``'s text (or the CLI's ``--json`` output); see :meth:`from_dict`."""
        return cls.from_dict(parse_json(text))
