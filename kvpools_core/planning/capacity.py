"""Capacity answers for a plan as sized: how many requests of a length fit, and what context N requests reach.

A KV planner is asked "how many concurrent requests of my lengths fit, and
what context can I promise", not "how many tokens".  On hybrid models part of
the cost is per request rather than per token (a sliding-window request holds
at most its window, a recurrent request a state slot whatever its length), so
the answer is a minimum over every limit of the plan, each in closed form
(integer division, never a search), read from :attr:`Plan.counts` and the
serving options — no plugin is named:

* **full tokens** — a request of context ``L`` holds ``ceil(L / page) * page``
  slots of the ``"full"`` token space: SGLang's paged allocator hands out whole
  pages and keeps nothing else per request (page 0, the padding page, is
  outside the plan's token count; ``alloc_extend`` takes ``ceil(seq / P) -
  ceil(prefix / P)`` new pages per request, ``sglang-pools.md`` §2.3).
* **<space> tokens** of a windowed space (one the sizing plugin recorded a
  :class:`~kvpools_core.values.TokenWindow` for, ``Plan.windows``; the swa
  and dsv4 plugins' ``"swa"``) — a request holds its tokens up to the engine's worst
  case per request, ``TokenWindow.per_request`` (SGLang's
  ``window + eviction_interval * draft_tokens + page + decode_alloc``,
  ``SWAChunkCapPoolConfigurator``, ``002_50706b73e02ffb67.txt`` lines 425-445).
  Once requests outgrow that, the prefill chunks in flight come on top, as
  SGLang's cap charges them (lines 453-458: ``chunks * chunked_prefill_size +
  page``): a request being prefilled holds a chunk beyond its worst case, no
  more of them than there are requests, and no chunk longer than the rest of
  its prompt (without chunked prefill the whole prompt is one chunk).  On a
  decode node nothing is prefilled and the reserve is its pre-allocated slots.
  The terms are the plugin's; only their inversion is here.
* **<space> tokens** of a compressed space (one the sizing plugin recorded a
  ratio ``r`` for, ``Plan.compression``; DeepSeek-V4's ``"c4"`` 4 and
  ``"c128"`` 128) — its slot of full slot ``s`` is ``s // r`` (SGLang has no
  allocator for it), so a request of ``ceil(L / page)`` full pages holds
  ``ceil(L / page) * page / r`` of its slots: page rounding is in full pages
  (``r`` divides the page).  With the space counting ``full / r`` slots (the
  dsv4 plugin's) its limit equals the full limit, and the full tokens are
  named on the tie.  A compressed space with a paged allocator of its own
  (``Plan.compression_pages``: SGLang's NPU DeepSeek-V4 c128 pool, page
  ``c128_page_size``) holds ``ceil((L // r) / p) * p`` of its slots instead
  (``seq_len // r`` compressed slots in pages of ``p``), and none below ``r``.
* **state slots** — ``state_slots // state_slots_per_request``, the slots a
  running request may hold at its peak as the sizing plugin recorded them
  (``PoolSizing.state_slots_per_request``; the mamba plugin's SGLang
  ``_calculate_mamba_ratio``, ``000_fbd4f47288598fb9.txt`` lines 2271-2300);
  SGLang caps ``max_running_requests`` by the same quotient (lines 2348-2362).
* **request cap** — ``max_running_requests`` of the plan (per DP worker).
* **context length** — no request is longer than the plan's context length.

Every count is per DP-attention worker, as the plan's are.  A token space
that is neither full, windowed nor compressed (DeepSeek-V4's ``c4`` under
HiSparse, whose device pool has an allocator of its own) is refused, naming it.

``tests/replay/test_replay_matches_capacity.py`` replays fixed-length
workloads through the plan's allocators (:mod:`kvpools_core.planning.replay`): the
peak concurrency equals these answers where full tokens, the request cap,
state slots, an unoutgrown window or SGLang's chunk cap bind, and past a
window the replay reaches more (these answers are the engine's worst case).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from kvpools_core.errors import ConfigError, InsufficientMemoryError, UnsupportedCombinationError, short_repr
from kvpools_core.options import option
from kvpools_core.values import FULL_TOKENS, Plan, TokenWindow, frozen_mapping

__all__ = [
    "CONTEXT_LADDER",
    "CONTEXT_LIMIT",
    "REQUEST_CAP",
    "STATE_SLOTS",
    "Capacity",
    "ContextAnswer",
    "EngineFlags",
    "Limits",
    "concurrency",
    "concurrency_within",
    "engine_flags",
    "largest_past_window",
    "limits_of",
    "max_context",
    "parse_context_len",
    "prefill_extra",
    "requests_past_window",
    "state_slots_per_request",
    "token_limit",
    "why_none",
    "window_pool_sizing",
]

CONTEXT_LADDER = tuple(1024 * 2**k for k in range(11))
"""The default context lengths asked about: 1k, 2k, 4k, ... 512k, 1M (powers of two, as models state them)."""
STATE_SLOTS = "state slots"
REQUEST_CAP = "request cap"
CONTEXT_LIMIT = "context length"


def token_limit(space: str) -> str:
    """The name of a token space's limit, as tables and JSON show it: ``"full tokens"``, ``"swa tokens"``."""
    return f"{space} tokens"


def prefill_extra(window: TokenWindow, held: int) -> int:
    """What a request of ``held`` slots holds beyond ``per_request`` while a chunk of it is prefilled."""
    beyond = max(0, held - window.per_request)
    return beyond if window.prefill_chunk is None else min(beyond, window.prefill_chunk)


def requests_past_window(window: TokenWindow, count: int, held: int) -> int:
    """The most requests n of ``held`` slots (past the worst case) with
    ``n x per_request + min(n, prefills_in_flight) x extra + reserved <= count``."""
    room = count - window.reserved
    if room < 0:
        return 0
    busy = window.per_request + prefill_extra(window, held)
    prefilling = window.prefills_in_flight
    if prefilling * busy <= room:
        return prefilling + (room - prefilling * busy) // window.per_request
    return room // busy


def largest_past_window(window: TokenWindow, count: int, requests: int, page: int, ceiling: int) -> int:
    """The longest context (past the worst case) at which ``requests`` fit ``count`` slots; 0 if none does.

    With ``k = min(requests, prefills_in_flight)`` it takes ``requests x per_request + k x extra + reserved <=
    count``: any length when ``extra`` is capped by a chunk that fits (or nothing is prefilled), else
    ``pages(L) <= per_request + room // k``.
    """
    room = count - window.reserved - requests * window.per_request
    if room < 0:
        return 0
    prefilling = min(requests, window.prefills_in_flight)
    if not prefilling or (window.prefill_chunk is not None and prefilling * window.prefill_chunk <= room):
        return ceiling
    return min(ceiling, (window.per_request + room // prefilling) // page * page)


@attrs.frozen(kw_only=True)
class Limits:
    """The counts one plan's capacity is computed from (per DP worker), with any headroom already taken off."""

    page_size: int
    context_len: int
    tokens: Mapping[str, int] = attrs.field(converter=frozen_mapping)
    windowed: Mapping[str, TokenWindow] = attrs.field(converter=frozen_mapping)
    """The worst-case window terms of each windowed token space, as the plan records them."""
    compressed: Mapping[str, int] = attrs.field(factory=dict, converter=frozen_mapping)
    """Full tokens per slot of each compressed token space (``Plan.compression``)."""
    compressed_pages: Mapping[str, int] = attrs.field(factory=dict, converter=frozen_mapping)
    """The allocator page of each compressed space that has one (``Plan.compression_pages``)."""
    state_slots: int
    slots_per_request: int
    request_cap: int

    def space_page(self, space: str) -> int:
        """Slots of ``space`` one full page holds: the page, or ``page / ratio`` of a compressed space (its own
        allocator's page where it has one)."""
        if space in self.compressed_pages:
            return self.compressed_pages[space]
        return self.page_size // self.compressed.get(space, 1)

    def compressed_held(self, space: str, context_len: int, held: int) -> int:
        """Slots of compressed ``space`` a request of ``context_len`` tokens (``held`` full slots) holds."""
        ratio = self.compressed[space]
        page = self.compressed_pages.get(space)
        if page is None:
            return held // ratio
        return -(-(context_len // ratio) // page) * page

    def scaled(self, keep: float) -> Limits:
        """The same limits with only ``keep`` of every pool usable (tokens page aligned, slots floored).

        The request cap is no pool (its table is sized for it), so it stays.  A compressed space's page is
        ``page / ratio`` of its slots.
        """
        return attrs.evolve(
            self,
            tokens={
                space: int(count * keep) // self.space_page(space) * self.space_page(space)
                for space, count in self.tokens.items()
            },
            state_slots=int(self.state_slots * keep),
        )


@attrs.frozen(kw_only=True)
class Capacity:
    """How many requests of ``context_len`` tokens run at once, and which limit binds.

    ``limits`` holds each limit's own answer (``"full tokens"``, ``"swa tokens"``,
    ``"state slots"``, ``"request cap"``); ``tokens_per_request`` the slots one
    request holds in each token space.  ``binding`` is ``"context length"``
    (and ``concurrent_requests`` 0) when ``context_len`` exceeds the plan's.
    """

    context_len: int
    concurrent_requests: int
    binding: str
    limits: Mapping[str, int] = attrs.field(converter=frozen_mapping)
    tokens_per_request: Mapping[str, int] = attrs.field(converter=frozen_mapping)

    def to_dict(self) -> dict[str, Any]:
        return {
            "context_len": self.context_len,
            "concurrent_requests": self.concurrent_requests,
            "binding": self.binding,
            "limits": dict(self.limits),
            "tokens_per_request": dict(self.tokens_per_request),
        }


@attrs.frozen(kw_only=True)
class ContextAnswer:
    """The largest context ``requests`` concurrent requests all reach, and which limit binds.

    ``limits`` holds the largest context each limit alone allows (a limit that
    does not depend on the length — state slots, the request cap, a window the
    requests outgrow — allows the plan's context length, or 0 when it cannot
    hold ``requests`` at all).  ``context_len`` 0: not even one page fits.
    """

    requests: int
    context_len: int
    binding: str
    limits: Mapping[str, int] = attrs.field(converter=frozen_mapping)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "context_len": self.context_len,
            "binding": self.binding,
            "limits": dict(self.limits),
        }


@attrs.frozen(kw_only=True)
class EngineFlags:
    """SGLang flags that serve ``context_length`` with ``headroom`` of the binding pool left free.

    ``max_running_requests`` is SGLang's server arg: the total over the
    DP-attention workers (SGLang divides it by them), so it is the per-worker
    answer times their number.
    """

    max_running_requests: int
    context_length: int
    headroom: float
    binding: str

    def args(self) -> tuple[str, ...]:
        return ("--max-running-requests", str(self.max_running_requests), "--context-length", str(self.context_length))

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_running_requests": self.max_running_requests,
            "context_length": self.context_length,
            "headroom": self.headroom,
            "binding": self.binding,
            "args": " ".join(self.args()),
        }


def state_slots_per_request(plan: Plan) -> int:
    """State slots one running request may hold at its peak, as the sizing plugin recorded it
    (``PoolSizing.state_slots_per_request``: SGLang's ``_calculate_mamba_ratio`` for the mamba plugin).

    A plan with state slots but no figure (written before plugins recorded it) counts one slot a request.
    """
    return max(1, plan.sizing.state_slots_per_request)


def limits_of(plan: Plan) -> Limits:
    """The counts a plan's capacity answers come from; refuses a token space it cannot model.

    A token space other than ``"full"`` is modelled when the plan records its
    worst-case window (:attr:`Plan.windows`, a :class:`TokenWindow` its sizing
    plugin filled in) or its compression ratio (:attr:`Plan.compression`, one
    that divides the page); any other is refused, naming it.  A plan whose pools
    share an arena (``--enable-unified-memory``) has no fixed split to read
    limits from: it is refused here, and answered by
    :mod:`kvpools_core.planning.unified` (``kvpools capacity``).
    """
    if plan.sizing.arenas:
        raise UnsupportedCombinationError(
            f"kvpools answers capacity under {option('enable_unified_memory')} only as `kvpools capacity` does "
            "(kvpools_core.planning.unified: the arena's split moves at run time); this planner does not model it "
            f"yet. Drop {option('enable_unified_memory')} here."
        )
    counts = plan.counts
    tokens: dict[str, int] = dict(counts["tokens"])
    windowed = {window.token_space: window for window in plan.windows}
    page = plan.serving.page_size
    compressed = {space: ratio for space, ratio in plan.compression.items() if space in tokens}
    unmodelled = [
        space for space in tokens if space != FULL_TOKENS and space not in windowed and space not in compressed
    ]
    if unmodelled:
        raise UnsupportedCombinationError(
            f"kvpools capacity models the full token space, windowed ones (a sliding window the plan records "
            f"the worst case of) and compressed ones (a ratio of full tokens the plan records); the plan of "
            f"{plan.model.name} also counts token space(s) {unmodelled} (how many tokens of each a request holds "
            f"is not modelled yet). `kvpools plan` gives its pools."
        )
    unpaged = {space: ratio for space, ratio in compressed.items() if page % ratio}
    if unpaged:
        raise UnsupportedCombinationError(
            f"kvpools capacity models a compressed token space whose ratio divides the page (a full page holds a "
            f"whole number of its slots); the plan of {plan.model.name} has page {page} and ratios {unpaged}."
        )
    state_slots = int(counts["state_slots"])
    return Limits(
        page_size=plan.serving.page_size,
        context_len=plan.model.context_len,
        tokens=tokens,
        windowed=windowed,
        compressed=compressed,
        compressed_pages={space: page for space, page in plan.compression_pages.items() if space in compressed},
        state_slots=state_slots,
        slots_per_request=state_slots_per_request(plan) if state_slots else 0,
        request_cap=plan.max_running_requests,
    )


def _check_positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{option(name)} must be a positive integer, got {value!r}.")


def _pick(limits: Mapping[str, int]) -> str:
    """The binding limit: the smallest; on a tie the first named — token spaces, state slots, the request cap,
    the context length — so a resource is named before the cap SGLang derives from it."""
    low = min(limits.values())
    return next(name for name, value in limits.items() if value == low)


def _pages(tokens: int, page: int) -> int:
    """Slots ``tokens`` tokens hold: whole pages."""
    return -(-tokens // page) * page


def _concurrency(limits: Limits, context_len: int) -> Capacity:
    page = limits.page_size
    held = _pages(context_len, page)
    by_limit: dict[str, int] = {}
    per_request: dict[str, int] = {}
    for space, count in limits.tokens.items():
        window = limits.windowed.get(space)
        ratio = limits.compressed.get(space)
        if ratio is not None:  # slot s // ratio of each full slot: whole full pages, compressed
            per_request[space] = limits.compressed_held(space, context_len, held)
            if per_request[space]:  # a paged space holds nothing below its ratio
                by_limit[token_limit(space)] = count // per_request[space]
        elif window is None or held <= window.per_request:
            per_request[space] = held
            by_limit[token_limit(space)] = count // held
        else:  # outgrown the window: the worst case per request, and the prefill chunks in flight on top
            per_request[space] = window.per_request
            by_limit[token_limit(space)] = requests_past_window(window, count, held)
    if limits.slots_per_request:
        by_limit[STATE_SLOTS] = limits.state_slots // limits.slots_per_request
    by_limit[REQUEST_CAP] = limits.request_cap
    if context_len > limits.context_len:
        return Capacity(
            context_len=context_len,
            concurrent_requests=0,
            binding=CONTEXT_LIMIT,
            limits=by_limit,
            tokens_per_request=per_request,
        )
    binding = _pick(by_limit)
    return Capacity(
        context_len=context_len,
        concurrent_requests=by_limit[binding],
        binding=binding,
        limits=by_limit,
        tokens_per_request=per_request,
    )


def concurrency(plan: Plan, context_len: int) -> Capacity:
    """How many requests of ``context_len`` tokens the plan's pools hold at once, and what binds.

    Each limit is one integer division (see the module docstring): full tokens
    ``tokens // (ceil(L / page) * page)``; a compressed space of ratio ``r``
    ``tokens // (ceil(L / page) * page / r)``; a windowed space the same until a
    request outgrows SGLang's per-request worst case, then that worst case per
    request with the prefill chunks in flight on top
    (:func:`requests_past_window`); ``state_slots // slots per
    request``; the request cap.
    """
    _check_positive("context_len", context_len)
    return _concurrency(limits_of(plan), context_len)


def concurrency_within(limits: Limits, context_len: int) -> Capacity:
    """:func:`concurrency` over limits already read from a plan (:func:`limits_of`): one read for many lengths."""
    _check_positive("context_len", context_len)
    return _concurrency(limits, context_len)


def why_none(
    limits: Limits,
    answer: Capacity,
    bytes_per_token: Mapping[str, int | float] | None = None,
    budget_bytes: int | None = None,
) -> str | None:
    """Why not one request of ``answer.context_len`` runs (None when one does), from the limit that binds.

    ``bytes_per_token`` (bytes per token of each token space, summed over its groups) and ``budget_bytes`` add
    the bytes: ``one request of 131,072 tokens needs 131,072 full tokens (17,180,917,760 B at 131,080 B/token);
    the plan holds 57,335 in its 8,589,934,592 B budget``.
    """
    if answer.concurrent_requests:
        return None
    length = answer.context_len
    if answer.binding == CONTEXT_LIMIT:
        return (
            f"{length:,} tokens exceed the context length {limits.context_len:,} (the model's, or "
            f"{option('context_length')})"
        )
    if answer.binding == STATE_SLOTS:
        return f"one request needs {limits.slots_per_request:,} state slots; the plan holds {limits.state_slots:,}"
    if answer.binding == REQUEST_CAP:
        return f"the request cap (max_running_requests) is {limits.request_cap:,}"
    space = next(space for space in limits.tokens if token_limit(space) == answer.binding)
    need, held = answer.tokens_per_request[space], limits.tokens[space]
    window = limits.windowed.get(space)
    past = window is not None and _pages(length, limits.page_size) > window.per_request
    needs = f"{need:,} {space} tokens{' (its worst case past the window) and a prefill chunk' if past else ''}"
    per = (bytes_per_token or {}).get(space)
    if per:
        needs += f" ({math.ceil(need * per):,} B at {per:,} B/token)"
    budget = f" in its {budget_bytes:,} B budget" if budget_bytes is not None else ""
    return f"one request of {length:,} tokens needs {needs}; the plan holds {held:,}{budget}"


def window_pool_sizing(plan: Plan, space: str) -> str | None:
    """What sized ``plan``'s windowed token space ``space`` where ``swa_full_tokens_ratio`` did not, as the plan
    records it: the plugin that answered ``size_pools`` (:attr:`Plan.provenance`) and how it says it sized the space
    (``PoolSizing.token_space_sizing[space]``).  None where the ratio did: the space holds SGLang's
    ratio split of the full tokens, ``int(full x ratio)`` page aligned (``002_50706b73e02ffb67.txt``), so
    ``swa_full_tokens_ratio`` is the option that moves it.

    The ratio does not size DeepSeek-V4.1's SWA pool in SGLang 0.5.23's cap mode (the ratio unset: the request cap
    does) nor without it (the configurator's 0.1, not the unset 0.8), the hybrid-SWA chunk cap's, or a model
    whose every layer slides (one pool, nothing to split).
    """
    tokens = plan.sizing.token_counts
    full, held = tokens.get(FULL_TOKENS), tokens.get(space)
    ratio, page = plan.serving.swa_full_tokens_ratio, plan.serving.page_size
    if full is not None and held is not None and int(full * ratio) // page * page == held:
        return None
    plugin = (plan.provenance.get("size_pools") or ("size_pools",))[0]
    if full is None:
        return f"every layer slides: the {plugin} plugin's {space} pool holds every token, no ratio splits it"
    note = plan.sizing.token_space_sizing.get(space)
    if note is None:
        return f"the {plugin} plugin sized it, not int(full x {option('swa_full_tokens_ratio')} {ratio:g})"
    return f"the {plugin} plugin sized it: {note.rstrip('.')}"


def _max_context(limits: Limits, requests: int) -> ContextAnswer:
    page, ceiling = limits.page_size, limits.context_len
    by_limit: dict[str, int] = {}
    for space, count in limits.tokens.items():
        # n requests of L fit while n * ceil(L / page) * page <= count, i.e. L <= page_floor(count // n);
        # a compressed space holds 1 / ratio of that: L <= page_floor(count // n * ratio)
        largest = count // requests * limits.compressed.get(space, 1) // page * page
        if space in limits.compressed_pages:  # whole pages of its own: seq // ratio slots fill them
            own = limits.compressed_pages[space]
            largest = ((count // requests // own * own + 1) * limits.compressed[space] - 1) // page * page
        window = limits.windowed.get(space)
        if window is not None:
            # within the worst case a request holds its own pages; past it (where fewer fit: the prefill
            # chunks come on top), its worst case and the chunks
            within = min(largest, window.per_request // page * page)
            past = largest_past_window(window, count, requests, page, ceiling)
            largest = past if past > window.per_request // page * page else within
        by_limit[token_limit(space)] = min(largest, ceiling)
    if limits.slots_per_request:
        by_limit[STATE_SLOTS] = ceiling if requests * limits.slots_per_request <= limits.state_slots else 0
    by_limit[REQUEST_CAP] = ceiling if requests <= limits.request_cap else 0
    by_limit[CONTEXT_LIMIT] = ceiling
    # every limit was capped at the context length: one that reaches it does not bind, the context length does
    binding = _pick(by_limit) if min(by_limit.values()) < ceiling else CONTEXT_LIMIT
    return ContextAnswer(requests=requests, context_len=by_limit[binding], binding=binding, limits=by_limit)


def max_context(plan: Plan, requests: int) -> ContextAnswer:
    """The largest context ``requests`` concurrent requests can all reach; ``requests=1``: one request alone.

    Closed form per limit: a full token space allows ``page_floor(tokens //
    requests)``, a compressed one of ratio ``r`` ``page_floor(tokens // requests
    * r)``; a windowed space, past its per-request worst case, the bound
    :func:`largest_past_window` gives (the context length once a
    whole prefill chunk fits beside the requests), else the same page floor
    within the worst case; state slots and the request cap allow the context
    length or nothing; the context length caps them all.
    """
    _check_positive("requests", requests)
    return _max_context(limits_of(plan), requests)


def engine_flags(plan: Plan, context_len: int, headroom: float) -> EngineFlags:
    """``--max-running-requests`` and ``--context-length`` that leave ``headroom`` of the binding pool free.

    The plan's pools are cut to ``1 - headroom`` (tokens page aligned, state
    slots floored; the request cap is no pool and stays); the context length is ``context_len`` or, when
    not even one such request fits, the largest context one request reaches;
    the requests are how many of that context fit.  Both flags keep the
    request table no larger than the plan's, so an engine given them starts
    within the plan's memory.
    """
    _check_positive("context_len", context_len)
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise ConfigError(f"{option('headroom')} must be a fraction in [0, 1), got {headroom!r}.")
    limits = limits_of(plan).scaled(1 - headroom)
    context = min(context_len, limits.context_len)
    if _concurrency(limits, context).concurrent_requests < 1:
        context = _max_context(limits, 1).context_len
    if context < 1:
        raise InsufficientMemoryError(
            f"With {option('headroom')} {headroom} not even one request of one page fits the plan's pools; "
            f"lower the headroom or raise the budget."
        )
    answer = _concurrency(limits, context)
    return EngineFlags(
        max_running_requests=answer.concurrent_requests * plan.serving.attn_dp_size,
        context_length=context,
        headroom=float(headroom),
        binding=answer.binding,
    )


_CONTEXT_TEXT = re.compile(r"^\s*(\d+)\s*([kKmM]?)\s*$")
_MAX_CONTEXT_DIGITS = 18
"""Digits a context length may have (leading zeros aside): 10**18 tokens is far past any model's context."""


def parse_context_len(text: str | int) -> int:
    """A context length as people write it: ``32768``, ``32k`` (x 1024) or ``1M`` (x 1024 x 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _CONTEXT_TEXT.match(str(text))
        if not match:
            raise ConfigError(
                f"{option('context')} takes a context length in tokens such as 32768, 32k or 1M, "
                f"got {short_repr(text)}."
            )
        digits = match.group(1).lstrip("0")
        if len(digits) > _MAX_CONTEXT_DIGITS:  # int() of 4,300+ digits would raise; no context comes near
            raise ConfigError(
                f"{option('context')} takes a context length in tokens such as 32768, 32k or 1M, got a "
                f"{len(digits):,}-digit number, beyond any model's context."
            )
        value = int(digits or "0") * {"": 1, "k": 1024, "m": 1024 * 1024}[match.group(2).lower()]
    if value < 1:
        raise ConfigError(f"{option('context')} must be at least one token, got {short_repr(text)}.")
    return value
