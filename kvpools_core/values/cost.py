"""What a token, a request and a state slot cost: ``CellPart``, ``CellSize``, ``GroupCost``, ``CostModel``."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from kvpools_core.errors import ConfigError, InvalidValueError
from kvpools_core.values._fields import (
    _flag,
    _str_tuple,
    non_negative,
    one_of,
    positive,
    positive_ratio,
    to_dict,
)
from kvpools_core.values.loading import load_value, wrong
from kvpools_core.values.model import ModelSpec


def _part_tuple(items: Iterable[CellPart]) -> tuple[CellPart, ...]:
    return tuple(items)


def _group_tuple(items: Iterable[GroupCost]) -> tuple[GroupCost, ...]:
    return tuple(items)


TOKEN = "token"
REQUEST = "request"
STATE_SLOT = "state_slot"
FIXED = "fixed"
COST_UNITS = (TOKEN, REQUEST, STATE_SLOT, FIXED)
"""What a cell part's bytes (and a pool's slots) are paid per: a token, a running request, a state slot, or once."""
FULL_TOKENS = "full"
"""The token space of every token a request holds for its whole context (``max_total_num_tokens``)."""

_LEGACY_REQUEST_POOL = "request_state"
_LEGACY_FIXED_POOL = "fixed"


@attrs.frozen
class CellPart:
    """One named share of the cell's bytes, the pool that stores it, and what it is paid per.

    ``unit`` says what ``bytes_per_token`` is paid per: ``"token"`` (the
    default: bytes every cached token stores), ``"request"`` (state one running
    request holds whatever its length), ``"state_slot"`` (one slot of a state
    cache whose size the sizing plugin decides, e.g. SGLang's
    ``max_mamba_cache_size`` recurrent-state slots, about ratio x requests) or
    ``"fixed"`` (bytes the plan holds once).  The field keeps the name
    ``bytes_per_token`` whatever the unit, as plans on disk spell it;
    :attr:`bytes_per_unit` reads it by its meaning.  The parts of one pool
    share one unit.

    A token pool allocates ``tokens + page_size`` slots (page 0 pads).  A pool
    laid out in whole pages with more slack names it in ``extra_slots``: it
    then allocates ``(tokens + page_size + extra_slots) // page_size`` pages
    (SGLang's DSA indexer: ``extra_slots=1``, two padding slots at page size 1).
    The parts of one pool share one layout (the pool takes their largest value).
    Only token parts have ``extra_slots``.

    A pool whose slots are not the plan's tokens one for one says how many it
    spans per plan token in ``slot_scale``: it then holds ``tokens x
    slot_scale`` slots in pages of ``page_size x slot_scale``, i.e. ``(tokens +
    page_size) x slot_scale`` rows (SGLang's draft worker under decode context
    parallelism: its replicated draft pools address the shared allocator's
    virtual slots ``[0, max_total x dcp)`` untranslated, ``loc_space_scale``,
    ``000_fbd4f47288598fb9.txt`` lines 405-433).  The parts of one pool share
    one ``slot_scale``; only token parts have one other than 1.
    """

    name: str
    bytes_per_token: int = attrs.field(validator=non_negative)
    pool: str = "kv"
    extra_slots: int = attrs.field(default=0, validator=non_negative)
    unit: str = attrs.field(default=TOKEN, validator=one_of(*COST_UNITS))
    slot_scale: int = attrs.field(default=1, validator=positive)

    def __attrs_post_init__(self) -> None:
        for field, value, default in (("extra_slots", self.extra_slots, 0), ("slot_scale", self.slot_scale, 1)):
            if value != default and self.unit != TOKEN:
                raise InvalidValueError(
                    f"CellPart.{field} applies to token parts only; part {self.name!r} is paid per {self.unit} "
                    f"and has {field}={value}."
                )

    @property
    def bytes_per_unit(self) -> int:
        """The bytes paid per one ``unit`` (the ``bytes_per_token`` field, read by its meaning)."""
        return self.bytes_per_token

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellPart:
        return load_value(cls, data)


def _draft_charge_or_none(value: DraftCharge | Mapping[str, Any] | None) -> DraftCharge | None:
    return DraftCharge.from_dict(value) if isinstance(value, Mapping) else value


@attrs.frozen(kw_only=True)
class CellSize:
    """What one token, one request and one state slot cost, and what is fixed.

    ``parts`` are the bytes kvpools really stores, grouped by the pool they
    live in and paid per their ``unit``: ``bytes_per_token``,
    ``bytes_per_request``, ``bytes_per_state_slot`` and ``fixed_bytes`` are the
    sums of the parts of each unit (the last three were constructor fields
    before parts had units; :meth:`from_dict` still reads them from an older
    plan, as parts of pools ``request_state`` and ``fixed``).
    ``sglang_bytes_per_token`` is SGLang's cell size for the
    same model (its configurator's ``cell_size``, a float for hybrid pools),
    which ``--accounting sglang`` divides the budget by.  ``num_layers`` is the
    number of layers the token cost covers on this rank, so wrappers (draft
    scaling) can derive a per-layer cost; ``draft_included`` tells them an
    architecture already charged the draft model itself.  ``draft_layer_parts``
    is what one draft-model layer stores per token, for architectures whose
    draft layer is not the average of the token ``parts`` over ``num_layers`` (mixed
    layer kinds, layer-split storage); empty means that average.
    """

    parts: tuple[CellPart, ...] = attrs.field(converter=_part_tuple)
    sglang_bytes_per_token: float = attrs.field()
    num_layers: int = attrs.field(validator=non_negative)
    draft_included: bool = False
    notes: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    draft_layer_parts: tuple[CellPart, ...] = attrs.field(default=(), converter=_part_tuple)
    draft: DraftCharge | None = attrs.field(default=None, converter=_draft_charge_or_none)
    """Set by the speculative plugin when it composed a draft model of its own (``Serving.speculative_draft``):
    the draft's exact bytes per token beside what SGLang's layer-count scaling charges for it."""

    @sglang_bytes_per_token.validator
    def _check_sglang(self, _attribute: attrs.Attribute[Any], value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ConfigError(
                f"CellSize.sglang_bytes_per_token (a cell size) must be a positive finite number, got {value!r}."
            )

    @parts.validator
    def _check_units(self, _attribute: attrs.Attribute[Any], parts: tuple[object, ...]) -> None:
        units: dict[str, str] = {}
        scales: dict[str, int] = {}
        for part in parts:
            if not isinstance(part, CellPart):
                return  # not a part at all: the hook contract names the plugin that built it
            seen = units.setdefault(part.pool, part.unit)
            if seen != part.unit:
                raise InvalidValueError(
                    f"CellSize.parts: pool {part.pool!r} mixes parts paid per {seen} and per {part.unit} "
                    f"(part {part.name!r}); give parts of another unit a pool of their own."
                )
            scale = scales.setdefault(part.pool, part.slot_scale)
            if scale != part.slot_scale:
                raise InvalidValueError(
                    f"CellSize.parts: pool {part.pool!r} mixes parts of slot_scale {scale} and {part.slot_scale} "
                    f"(part {part.name!r}); the parts of one pool span one number of slots per token."
                )

    def parts_of(self, unit: str) -> tuple[CellPart, ...]:
        """The parts paid per ``unit`` (``"token"``, ``"request"``, ``"state_slot"`` or ``"fixed"``)."""
        return tuple(part for part in self.parts if part.unit == unit)

    @property
    def bytes_per_token(self) -> int:
        """Bytes per plan token: the sum of the token parts, each times the slots it spans (``slot_scale``)."""
        return sum(part.bytes_per_token * part.slot_scale for part in self.parts_of(TOKEN))

    @property
    def bytes_per_request(self) -> int:
        """Bytes per running request: the sum of the request parts."""
        return sum(part.bytes_per_token for part in self.parts_of(REQUEST))

    @property
    def bytes_per_state_slot(self) -> int:
        """Bytes per state slot: the sum of the state-slot parts (how many slots, the sizing plugin decides)."""
        return sum(part.bytes_per_token for part in self.parts_of(STATE_SLOT))

    @property
    def fixed_bytes(self) -> int:
        """Bytes held once: the sum of the fixed parts."""
        return sum(part.bytes_per_token for part in self.parts_of(FIXED))

    def pool_bytes(self, unit: str) -> dict[str, int]:
        """Bytes per ``unit`` of each pool whose parts are paid per it, in first-seen order."""
        pools: dict[str, int] = {}
        for part in self.parts_of(unit):
            pools[part.pool] = pools.get(part.pool, 0) + part.bytes_per_token
        return pools

    def pool_bytes_per_token(self) -> dict[str, int]:
        """Bytes per token of each token pool, in first-seen order."""
        return self.pool_bytes(TOKEN)

    def pool_extra_slots(self) -> dict[str, int]:
        """Each token pool's ``extra_slots`` (the largest of its parts'), in first-seen order."""
        extra: dict[str, int] = {}
        for part in self.parts_of(TOKEN):
            extra[part.pool] = max(extra.get(part.pool, 0), part.extra_slots)
        return extra

    def pool_slot_scale(self) -> dict[str, int]:
        """Each token pool's slots per plan token (its parts' ``slot_scale``), in first-seen order."""
        return {part.pool: part.slot_scale for part in self.parts_of(TOKEN)}

    @property
    def cost(self) -> CostModel:
        """The cell's own cost, one group per pool of its parts: what the parts store, before any padding.

        A plan's :attr:`Plan.cost` adds what the pools allocate beyond the
        parts (padding pages and rows, the request table, the allocators).
        """
        groups: dict[str, dict[str, int]] = {}
        for part in self.parts:
            paid = groups.setdefault(part.pool, dict.fromkeys(COST_UNITS, 0))
            paid[part.unit] += part.bytes_per_token * part.slot_scale
        return CostModel(
            GroupCost(
                group=pool,
                token_bytes=paid[TOKEN],
                bytes_per_request=paid[REQUEST],
                bytes_per_state_slot=paid[STATE_SLOT],
                fixed_bytes=paid[FIXED],
            )
            for pool, paid in groups.items()
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellSize:
        return load_value(cls, data)

    @classmethod
    def _prepare_loaded(cls, data: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        """A plan written before parts had units records ``bytes_per_request`` and ``fixed_bytes``: read them as
        parts of pools ``request_state`` and ``fixed`` (:func:`kvpools_core.values.loading.load_value` calls this)."""
        if "bytes_per_request" not in data and "fixed_bytes" not in data:
            return data
        data = dict(data)
        legacy = []
        for field, pool, unit in (
            ("bytes_per_request", _LEGACY_REQUEST_POOL, REQUEST),
            ("fixed_bytes", _LEGACY_FIXED_POOL, FIXED),
        ):
            if field in data:
                value = data.pop(field)
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise wrong(f"{path}.{field}", value, "a non-negative integer (bytes of an older plan's part)")
                if value:
                    legacy.append({"name": pool, "bytes_per_token": value, "pool": pool, "unit": unit})
        parts = data.get("parts", [])
        if legacy and isinstance(parts, (list, tuple)):
            data["parts"] = [*parts, *legacy]
        return data


def _page_tokens(budget_bytes: int, cell_bytes: float, page_size: int) -> int:
    """SGLang's ``budget // cell``, page aligned (``kvpools_core.parts.sizing.sglang_tokens``, which imports
    this module)."""
    return int(budget_bytes // cell_bytes) // page_size * page_size


@attrs.frozen(kw_only=True)
class DraftCharge:
    """A speculative draft model of its own, composed into a cell: what it stores, and what SGLang charges for it.

    SGLang sizes its token count with the target's cell scaled by the draft's
    layer count (``pool_configurator.py``: ``int(cell * (1 + D / L))`` for the
    EAGLE family, ``ceil(cell * (L + D) / L)`` for DFLASH), "assuming the draft
    shares the target's per-layer KV size"; its draft worker then allocates the
    draft's *own* pools (``KVCacheConfigurator`` with ``is_draft_worker``, the
    draft's model config), of ``exact_bytes_per_token``.  ``sglang_bytes_per_token``
    is the scaled cell SGLang divides its budget by; :meth:`tokens` compares
    the count it gives with the count the draft's own cell would give.
    """

    model: str
    """The draft model's name (``ModelSpec.name``)."""
    architecture: str
    """The draft's architecture family (``ModelSpec.architecture``): the plugin family that sized its pools."""
    num_layers: int = attrs.field(validator=positive)
    """``D``: the draft's layers, SGLang's ``eagle_draft_num_layers`` / ``dflash_draft_num_layers``."""
    exact_bytes_per_token: int = attrs.field(validator=non_negative)
    """What the draft's own pools store per token (its cell's token parts, the ``draft_*`` parts of the cell)."""
    own_sglang_bytes_per_token: float = attrs.field(validator=positive_ratio)
    """The draft's own SGLang cell size (its configurator's ``cell_size`` were it the served model)."""
    target_sglang_bytes_per_token: float = attrs.field(validator=positive_ratio)
    """The target's SGLang cell size before the draft was added."""
    sglang_bytes_per_token: float = attrs.field(validator=positive_ratio)
    """The composed cell SGLang computes from the layer-count scaling (``CellSize.sglang_bytes_per_token``)."""

    @property
    def sglang_draft_bytes_per_token(self) -> float:
        """What SGLang's scaling charges for the draft per token: the scaled cell less the target's."""
        return self.sglang_bytes_per_token - self.target_sglang_bytes_per_token

    def tokens(self, budget_bytes: int, page_size: int) -> tuple[int, int]:
        """(SGLang's token count under its scaling, the count under the draft's own cell), for one budget."""
        own = self.target_sglang_bytes_per_token + self.own_sglang_bytes_per_token
        return (
            _page_tokens(budget_bytes, self.sglang_bytes_per_token, page_size),
            _page_tokens(budget_bytes, own, page_size),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DraftCharge:
        return load_value(cls, data)


@attrs.frozen(kw_only=True)
class DraftModel:
    """A speculative draft model of its own (``--speculative-draft-model-path``), as the pipeline resolved it.

    ``model`` is parsed by the architecture plugin that claims its config
    (``parsed_by``), exactly as a served model is; ``cell`` is that
    architecture's ``estimate_cell_size`` answer under the draft worker's
    serving (:func:`kvpools_core.pipeline.draft_worker_serving`), by
    ``estimated_by``.  The speculative plugin composes its token parts into the
    target's cell as ``draft_*`` pools; ``build`` builds them through the
    draft's own ``build_pool``.
    """

    model: ModelSpec
    cell: CellSize
    parsed_by: str = ""
    estimated_by: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DraftModel:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# cost model
# ---------------------------------------------------------------------------


def _token_space(inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidValueError(f"{_flag(inst, attribute)} must name a token space (e.g. 'full'), got {value!r}.")


@attrs.frozen(kw_only=True)
class GroupCost:
    """What one group of a plan (one pool) costs, as an affine function of the counts it scales with::

        bytes = token_bytes * (tokens // token_block) + bytes_per_request * requests
                + bytes_per_state_slot * state_slots + fixed_bytes

    ``tokens`` is the count of the token space ``token_space`` names:
    ``"full"`` (:data:`FULL_TOKENS`) is every token a request holds for its
    whole context (``max_total_num_tokens``); the SWA plugin adds ``"swa"``,
    the tokens inside the sliding window.  A group that grows in whole pages
    says so with ``token_block``: it pays ``token_bytes`` per page of
    ``token_block`` tokens (the allocator's free list: 8 B per page), so
    :attr:`bytes_per_token` may be a fraction.  A pool laid out in whole pages
    with slack (the DSA indexer, ``CellPart.extra_slots``) is charged per page
    too, and its slack pages are in ``fixed_bytes``: exact for page-aligned
    token counts, which every plan's are (a count between pages is charged for
    its whole pages only).  ``requests`` are the running requests of one DP
    worker (``max_running_requests``); ``state_slots`` the slots of a state
    cache (the mamba plugin's ``max_mamba_cache_size``).  The request table's
    row is the context length's, so its bytes per request hold for the plan's
    context length.  A group whose slots are tokens of another space than the
    one it is sized by says so with ``slot_space`` and ``slots_per_token``
    (the dsv4 c4 indexer: ``c4_logical_size = c128 tokens x 32``, so
    ``token_space`` ``"c128"``, ``slot_space`` ``"c4"``, 32), and
    :meth:`describe` prices its slots: ``2,772 B/c4 token``.
    """

    group: str
    token_space: str = attrs.field(default=FULL_TOKENS, validator=_token_space)
    token_bytes: int = attrs.field(default=0, validator=non_negative)
    token_block: int = attrs.field(default=1, validator=positive)
    bytes_per_request: int = attrs.field(default=0, validator=non_negative)
    bytes_per_state_slot: int = attrs.field(default=0, validator=non_negative)
    fixed_bytes: int = attrs.field(default=0, validator=non_negative)
    slot_space: str | None = attrs.field(default=None, validator=attrs.validators.optional(_token_space))
    slots_per_token: int = attrs.field(default=1, validator=positive)
    arena: str | None = None
    """The arena (:class:`~kvpools_core.values.plan.Arena`) this group's entries are carved from, or None.

    An arena member's bytes are a *draw* on the arena, not an allocation of their own: the arena's pool pays
    them (fixed bytes), so :meth:`CostModel.bytes_for` leaves member groups out and
    :meth:`CostModel.arena_draw` sums them for one arena (SGLang's ``--enable-unified-memory``)."""

    @property
    def bytes_per_token(self) -> float:
        """Bytes per token: ``token_bytes / token_block`` (an integer unless the group is paged)."""
        per = self.token_bytes / self.token_block
        return int(per) if per.is_integer() else per

    def bytes_for(self, *, tokens: int = 0, requests: int = 0, state_slots: int = 0) -> int:
        """The group's bytes for ``tokens`` of its token space, ``requests`` and ``state_slots``."""
        return (
            self.token_bytes * (tokens // self.token_block)
            + self.bytes_per_request * requests
            + self.bytes_per_state_slot * state_slots
            + self.fixed_bytes
        )

    def __add__(self, other: GroupCost) -> GroupCost:
        """Two costs of one group summed (target + draft parts of the same pool)."""
        if not isinstance(other, GroupCost):
            return NotImplemented
        if (self.group, self.token_space, self.token_block, self.arena) != (
            other.group,
            other.token_space,
            other.token_block,
            other.arena,
        ):
            raise InvalidValueError(
                f"GroupCost: cannot add group {other.group!r} ({other.token_space} tokens in blocks of "
                f"{other.token_block}) to {self.group!r} ({self.token_space} tokens in blocks of {self.token_block})."
            )
        return attrs.evolve(
            self,
            token_bytes=self.token_bytes + other.token_bytes,
            bytes_per_request=self.bytes_per_request + other.bytes_per_request,
            bytes_per_state_slot=self.bytes_per_state_slot + other.bytes_per_state_slot,
            fixed_bytes=self.fixed_bytes + other.fixed_bytes,
        )

    def describe(self) -> str:
        """One affine line: ``N B/token + M B/request + S B/state slot + F B fixed`` (zero terms left out).

        A token is one of ``slot_space`` when the group names one (``N B/c4 token (... per c128 token)``), else
        of ``token_space`` (``B/token`` for full tokens, ``B/swa token``, ``B/c128 token``)."""
        space = self.token_space if self.slot_space is None else self.slot_space
        label = "token" if space == FULL_TOKENS else f"{space} token"
        block = self.token_block * self.slots_per_token
        terms = []
        if self.token_bytes:
            per = self.token_bytes / block
            shown = f"{int(per):,}" if per.is_integer() else f"{per:,.4g}"
            paged = f"{self.token_bytes:,} B per {block}-token page" if block > 1 else ""
            if self.slot_space is not None:
                sized = f"{self.slots_per_token} per {self.token_space} token"
                paged = f"{paged}, {sized}" if paged else sized
            terms.append(f"{shown} B/{label}{f' ({paged})' if paged else ''}")
        if self.bytes_per_request:
            terms.append(f"{self.bytes_per_request:,} B/request")
        if self.bytes_per_state_slot:
            terms.append(f"{self.bytes_per_state_slot:,} B/state slot")
        if self.fixed_bytes or not terms:
            terms.append(f"{self.fixed_bytes:,} B fixed")
        return " + ".join(terms)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GroupCost:
        return load_value(cls, data)


@attrs.frozen
class CostModel:
    """What a plan costs as a function of its counts: one :class:`GroupCost` per group (pool).

    ``bytes_for(tokens=..., requests=..., state_slots=...)`` answers "how many
    bytes would these counts take" for any counts, whichever plugin sized the
    plan; ``a + b`` composes two models (target and draft), summing the groups
    they share by name.  Every plan carries one (:attr:`Plan.cost`), derived
    from its pools.
    """

    groups: tuple[GroupCost, ...] = attrs.field(default=(), converter=_group_tuple)

    @groups.validator
    def _check_groups(self, _attribute: attrs.Attribute[Any], groups: tuple[GroupCost, ...]) -> None:
        names = [group.group for group in groups]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise InvalidValueError(f"CostModel.groups names group(s) {repeated} more than once; add them instead.")

    def __add__(self, other: CostModel) -> CostModel:
        if not isinstance(other, CostModel):
            return NotImplemented
        merged = {group.group: group for group in self.groups}
        for group in other.groups:
            merged[group.group] = merged[group.group] + group if group.group in merged else group
        return CostModel(merged.values())

    @property
    def token_spaces(self) -> tuple[str, ...]:
        """The token spaces the groups scale with, in first-seen order."""
        return tuple(dict.fromkeys(g.token_space for g in self.groups if g.token_bytes))

    @property
    def bytes_per_request(self) -> int:
        return sum(g.bytes_per_request for g in self.groups)

    @property
    def bytes_per_state_slot(self) -> int:
        return sum(g.bytes_per_state_slot for g in self.groups)

    @property
    def fixed_bytes(self) -> int:
        return sum(g.fixed_bytes for g in self.groups)

    def group(self, name: str) -> GroupCost:
        for group in self.groups:
            if group.group == name:
                return group
        raise KeyError(f"cost model has no group named {name!r}; groups: {[g.group for g in self.groups]}")

    @property
    def arenas(self) -> tuple[str, ...]:
        """The arenas the member groups are carved from, in first-seen order."""
        return tuple(dict.fromkeys(g.arena for g in self.groups if g.arena is not None))

    def arena_draw(
        self, arena: str, *, tokens: int | Mapping[str, int] = 0, requests: int = 0, state_slots: int = 0
    ) -> int:
        """Bytes the member groups of ``arena`` draw from it for these counts (the arena's sink not included)."""
        members = CostModel(g for g in self.groups if g.arena == arena)
        if not members.groups:
            raise KeyError(f"cost model has no group in arena {arena!r}; arenas: {list(self.arenas)}")
        return members._sum(tokens, requests, state_slots)

    def bytes_for(self, *, tokens: int | Mapping[str, int] = 0, requests: int = 0, state_slots: int = 0) -> int:
        """Bytes of every group for these counts.

        ``tokens`` is one count for every token space, or a mapping from each
        token space (``{"full": ..., "swa": ...}``) to its count; a space the
        model scales with must be in it.  Groups carved from an arena are left
        out: the arena's own group holds their bytes (:meth:`arena_draw`).
        """
        own = CostModel(g for g in self.groups if g.arena is None)
        return own._sum(tokens, requests, state_slots)

    def _sum(self, tokens: int | Mapping[str, int], requests: int, state_slots: int) -> int:
        counts = tokens if isinstance(tokens, Mapping) else dict.fromkeys(self.token_spaces, tokens)
        missing = [space for space in self.token_spaces if space not in counts]
        if missing:
            raise ConfigError(f"CostModel.bytes_for: no token count for token space(s) {missing}.")
        for what, value in (*((f"tokens[{k!r}]", v) for k, v in counts.items()), ("requests", requests)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"CostModel.bytes_for: {what} must be a non-negative integer, got {value!r}.")
        if isinstance(state_slots, bool) or not isinstance(state_slots, int) or state_slots < 0:
            raise ConfigError(f"CostModel.bytes_for: state_slots must be a non-negative integer, got {state_slots!r}.")
        return sum(
            g.bytes_for(tokens=counts.get(g.token_space, 0), requests=requests, state_slots=state_slots)
            for g in self.groups
        )

    def lines(self) -> tuple[str, ...]:
        """One affine line per group: ``name: N B/token + M B/request + S B/state slot + F B fixed``."""
        return tuple(
            f"{g.group}: {g.describe()}{'' if g.arena is None else f' (drawn from arena {g.arena})'}"
            for g in self.groups
        )

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        return load_value(cls, data)
