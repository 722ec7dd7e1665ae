"""The workload-aware split: the value of a hybrid model's split knob that runs the most requests of a workload at once.

SGLang splits a hybrid budget with fixed knobs (``--swa-full-tokens-ratio`` 0.8, ``--mamba-full-memory-ratio``
0.9) whatever the traffic.  ``choose_split(model, serving, budget, workload)`` finds the value that maximises
the requests of ``workload`` running at once, on real plans (:func:`kvpools_core.pipeline.plan`) and the
capacity limits of :mod:`kvpools_core.planning.capacity`.

**The knob.**  A plan has, beside its ``"full"`` token space, one resource a request holds a bounded amount of:
a sliding-window token space (a request holds at most SGLang's worst case per request,
``TokenWindow.per_request`` on the plan) or state slots (``state_slots_per_request`` per request).  The Serving
field that sizes that resource is the knob: ``swa_full_tokens_ratio`` for a windowed token space (SWA tokens =
``int(full x ratio)``, ``002_50706b73e02ffb67.txt``) and ``max_mamba_cache_size`` for state slots (SGLang's
``_handle_max_mamba_cache`` takes K slots as given and sizes the KV tokens from the rest,
``000_fbd4f47288598fb9.txt`` lines 2271-2362) — an integer, so it lands exactly where a float ratio would not.
No plugin is named: the resource is read from the plan's counts, and a knob that does not move it (the plan
of a model the field does not apply to) is reported as no split.  A plan with neither resource (dense
models), or an all-SWA model (one token space, nothing to split), gets no split.  Compressed token spaces
(``Plan.compression``: DeepSeek-V4's ``c4`` / ``c128``, a fixed fraction of the full tokens) are no resource of
their own: they move with the full tokens, so DeepSeek-V4's knob is the ratio that sizes its windowed SWA
space (``swa_full_tokens_ratio``, read by its ``DSV4PoolConfigurator`` as by the hybrid-SWA one).

**A workload's concurrency.**  A workload is the context lengths (prompt + output) of its requests.  "Requests
of that workload that run at once" is the largest n such that n requests of the workload's *mean footprint*
fit every limit: a full token space holds ``mean(ceil(L / page) x page)`` per request (a compressed one
``1 / ratio`` of that); a windowed space
``mean(min(pages(L), per_request))`` plus, while requests outgrow the window, the mean prefill chunk in flight
for each of the prefills the engine runs at once and its reserve (the plan's ``TokenWindow``); state slots and
the request cap do not depend on the length.  For one length this is exactly ``capacity.concurrency(plan, L)``
(it is what is called).  A mean footprint is the steady state of a long run of the distribution: a running set
is a sample of it, so its holdings sum to n x the mean.

**The optimum, in closed form.**  The full limit ``F // e_full`` falls as the resource grows and the resource's
limit rises, so the best split is where both hold the same n: the resource needs ``need(n) = n x e_x + c``
(``e_x`` the mean per-request holding, ``c`` the prefill chunks and reserve of a windowed space), and the full
tokens follow the plan's affine cost model (:attr:`Plan.cost`): each resource unit costs ``q`` full tokens
(bytes per resource unit / bytes per full token, a full token's bytes including its share of every compressed
space), ``F(X) = F0 - q (X - X0)``.  Then
``n* = floor((F0 + q X0 - q c) / (e_full + q e_x))``.  The knob is set to give ``need(n*)`` (a ratio: that
over the full tokens it leaves, rounded up to 4 decimals and re-solved once against the planned full tokens),
and n* - 1, n*, n* + 1 and SGLang's default are planned (a ratio re-solved once) and measured; the best of
them (the default on a tie) is the choice, so it never loses to the default and never exceeds the budget
(every candidate is a plan).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs

from kvpools_core.errors import ConfigError, KvpoolsError, short_repr
from kvpools_core.options import option
from kvpools_core.planning.capacity import (
    REQUEST_CAP,
    STATE_SLOTS,
    Limits,
    concurrency,
    limits_of,
    parse_context_len,
    prefill_extra,
    token_limit,
)
from kvpools_core.values import FULL_TOKENS, Plan, Serving

__all__ = [
    "SAMPLES",
    "SplitChoice",
    "Workload",
    "WorkloadCapacity",
    "choose_split",
    "parse_workload",
    "workload_concurrency",
]

SAMPLES = 4096
"""Lengths drawn from a distribution spec (seed 0): the sample mean of a log-normal with p99 = 8 x median
(sigma 0.89) has a relative standard error of 1.7 %, and one seed gives one answer on every machine."""
RATIO_DECIMALS = 4
RATIO_KNOB = "swa_full_tokens_ratio"
SLOTS_KNOB = "max_mamba_cache_size"


def _lengths(values: Iterable[int]) -> tuple[int, ...]:
    lengths = tuple(int(value) for value in values)
    if not lengths or min(lengths) < 1:
        raise ConfigError(f"A workload needs at least one length of at least one token, got {lengths[:4]!r}.")
    return lengths


@attrs.frozen
class Workload:
    """The context lengths (prompt + output) of a workload's requests, and the spec they came from.

    ``clamp``: lengths were drawn from a distribution, and one past a plan's context length is clamped
    to it (a client truncates); a fixed length or a trace is refused instead.
    """

    lengths: tuple[int, ...] = attrs.field(converter=_lengths)
    source: str
    clamp: bool = False

    @classmethod
    def from_trace(cls, trace: Any) -> Workload:
        """The workload of a replay trace (``kvpools_core.planning.replay.Trace``): each request's final length."""
        return cls(tuple(r.context_len for r in trace.requests), trace.source)

    def within(self, context_len: int) -> Workload:
        """The lengths a plan of ``context_len`` serves (clamped for a distribution, refused otherwise)."""
        longest = max(self.lengths)
        if longest <= context_len:
            return self
        if not self.clamp:
            raise ConfigError(
                f"{option('workload')}: the workload {self.source} holds requests of up to {longest:,} tokens, more "
                f"than the model's context length {context_len:,}; give shorter lengths (or raise "
                f"{option('context_length')} where the model allows it)."
            )
        return attrs.evolve(self, lengths=tuple(min(length, context_len) for length in self.lengths))


_PAIR = re.compile(r"^\s*(\w+)\s*=\s*(\S+)\s*$")


def _bad(spec: str, why: str) -> ConfigError:
    return ConfigError(
        f"{option('workload')} {short_repr(spec)}: {why}. It takes a context length (8192, 8k), "
        f"'lognormal:median=4096,p99=32768', 'uniform:1k..32k', or a JSONL file of "
        f'{{"input_len": ..., "output_len": ...}} records.'
    )


def _length(spec: str, text: str) -> int:
    try:
        return parse_context_len(text)
    except ConfigError:
        raise _bad(spec, f"{short_repr(text)} is not a length in tokens") from None


def parse_workload(spec: str) -> Workload:
    """A workload from its spec: ``8k``, ``lognormal:median=4096,p99=32768``, ``uniform:1k..32k`` or a JSONL path.

    Distributions are sampled (:data:`SAMPLES` lengths, seed 0) with :mod:`kvpools_core.planning.replay`'s generators;
    their lengths are context lengths (the generators' prompt lengths, outputs drawn as 1 token and dropped).
    """
    from kvpools_core.planning.replay import load_jsonl_trace, lognormal_trace, uniform_trace

    text = spec.strip()
    kind, sep, rest = text.partition(":")
    if sep and kind.lower() == "lognormal":
        pairs = {}
        for item in rest.split(","):
            match = _PAIR.match(item)
            if not match:
                raise _bad(spec, f"{short_repr(item)} is not KEY=LENGTH")
            pairs[match.group(1).lower()] = _length(spec, match.group(2))
        if set(pairs) != {"median", "p99"}:
            raise _bad(spec, "a log-normal takes median= and p99=")
        if pairs["median"] > pairs["p99"]:
            raise _bad(spec, "the median must not exceed the p99")
        trace = lognormal_trace(
            SAMPLES, input_median=pairs["median"], input_p99=pairs["p99"], output_median=1, output_p99=1
        )
        return Workload(tuple(r.input_len for r in trace.requests), text, clamp=True)
    if sep and kind.lower() == "uniform":
        low, dots, high = rest.partition("..")
        if not dots:
            raise _bad(spec, "a uniform range is LOW..HIGH")
        lo, hi = _length(spec, low), _length(spec, high)
        if lo > hi:
            raise _bad(spec, "the range's low end exceeds its high end")
        trace = uniform_trace(SAMPLES, input_range=(lo, hi), output_range=(1, 1))
        return Workload(tuple(r.input_len for r in trace.requests), text, clamp=True)
    if Path(text).suffix.lower() in (".jsonl", ".json") or _is_file(text):
        try:
            trace = load_jsonl_trace(text)
        except ConfigError as error:
            raise ConfigError(f"{option('workload')}: {error}") from None
        return Workload.from_trace(trace)
    return Workload((_length(spec, text),), text)


def _is_file(text: str) -> bool:
    try:
        return Path(text).is_file()
    except (OSError, ValueError):  # a name no file system takes (too long): a length spec, or nothing
        return False


# ------------------------------------------------------------------------------------------- concurrency


@attrs.frozen(kw_only=True)
class WorkloadCapacity:
    """Requests of a workload that run at once under one plan, what binds, and each limit's answer."""

    concurrent_requests: int
    binding: str
    limits: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"concurrent_requests": self.concurrent_requests, "binding": self.binding, "limits": dict(self.limits)}


def _pages(tokens: int, page: int) -> int:
    return -(-tokens // page) * page


def _mean(values: Iterable[int]) -> Fraction:
    items = list(values)
    return Fraction(sum(items), len(items))


@attrs.frozen
class _Footprint:
    """Mean holdings of one request of the workload in each token space, and a windowed space's extras."""

    per_space: Mapping[str, Fraction]
    chunk: Mapping[str, Fraction]
    """Windowed spaces the requests outgrow: the mean prefill chunk beyond the worst case."""


def _footprint(limits: Limits, lengths: tuple[int, ...]) -> _Footprint:
    page = limits.page_size
    held = [_pages(length, page) for length in lengths]
    per_space: dict[str, Fraction] = {}
    chunk: dict[str, Fraction] = {}
    for space in limits.tokens:
        window = limits.windowed.get(space)
        ratio = limits.compressed.get(space)
        if ratio is not None:
            per_space[space] = _mean(held) / ratio
        elif window is None or all(h <= window.per_request for h in held):
            per_space[space] = _mean(held)
        else:
            per_space[space] = _mean(min(h, window.per_request) for h in held)
            chunk[space] = _mean(prefill_extra(window, h) if h > window.per_request else 0 for h in held)
    return _Footprint(per_space, chunk)


def _space_requests(limits: Limits, space: str, count: int, footprint: _Footprint) -> int:
    """Requests of the mean footprint a token space of ``count`` holds (the capacity module's forms)."""
    per = footprint.per_space[space]
    if space not in footprint.chunk:
        return math.floor(count / per)
    window = limits.windowed[space]
    room = count - window.reserved
    if room < 0:
        return 0
    busy = per + footprint.chunk[space]
    prefilling = window.prefills_in_flight
    if prefilling * busy <= room:
        return prefilling + math.floor((room - prefilling * busy) / per)
    return math.floor(room / busy)


def _space_needs(limits: Limits, space: str, requests: int, footprint: _Footprint) -> int:
    """Slots a token space needs for ``requests`` of the mean footprint (the inverse of ``_space_requests``)."""
    per = footprint.per_space[space]
    if space not in footprint.chunk:
        need = per * requests
    else:
        window = limits.windowed[space]
        need = window.reserved + per * requests + footprint.chunk[space] * min(requests, window.prefills_in_flight)
    return _pages(math.ceil(need), limits.page_size)


def workload_concurrency(plan: Plan, workload: Workload) -> WorkloadCapacity:
    """Requests of ``workload`` the plan's pools hold at once (its mean footprint, see the module docstring)."""
    limits = limits_of(plan)
    workload = workload.within(limits.context_len)
    if len(set(workload.lengths)) == 1:
        answer = concurrency(plan, workload.lengths[0])
        return WorkloadCapacity(
            concurrent_requests=answer.concurrent_requests, binding=answer.binding, limits=dict(answer.limits)
        )
    footprint = _footprint(limits, workload.lengths)
    by_limit = {
        token_limit(space): _space_requests(limits, space, count, footprint) for space, count in limits.tokens.items()
    }
    if limits.slots_per_request:
        by_limit[STATE_SLOTS] = limits.state_slots // limits.slots_per_request
    by_limit[REQUEST_CAP] = limits.request_cap
    low = min(by_limit.values())
    binding = next(name for name, value in by_limit.items() if value == low)
    return WorkloadCapacity(concurrent_requests=low, binding=binding, limits=by_limit)


# ------------------------------------------------------------------------------------------------- choice


@attrs.frozen(kw_only=True)
class SplitChoice:
    """The split chosen for a workload, against SGLang's default split of the same budget.

    ``knob`` is the Serving field (None: the model has no split to choose — ``reason`` says why);
    ``value`` its chosen value (SGLang's server-arg value: a ratio, or K slots over all DP workers).
    """

    workload: str
    knob: str | None
    default_value: float | int | None
    value: float | int | None
    default: WorkloadCapacity
    chosen: WorkloadCapacity
    plan: Plan
    default_plan: Plan
    reason: str = ""
    max_running_requests: int | None = None
    """``--max-running-requests`` that realises the split (planned with the knob: it still runs the chosen
    requests); None when no cap does (or none was checked: no split)."""

    @property
    def gain(self) -> float:
        return self.chosen.concurrent_requests / max(1, self.default.concurrent_requests)

    def flags(self) -> tuple[str, ...]:
        """SGLang flags that realise the split: the knob (when not SGLang's default) and ``--max-running-requests``
        (total over DP workers), checked by planning with both."""
        out: tuple[str, ...] = ()
        if self.knob is not None and self.value != self.default_value:
            out = (_flag(self.knob), str(self.value))
        requests = self.max_running_requests
        return (*out, "--max-running-requests", str(requests)) if requests else out

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "knob": self.knob,
            "default_value": self.default_value,
            "value": self.value,
            "default": self.default.to_dict(),
            "chosen": self.chosen.to_dict(),
            "gain": self.gain,
            "counts": {"default": self.default_plan.counts, "chosen": self.plan.counts},
            "planned_bytes": {"default": self.default_plan.planned_bytes, "chosen": self.plan.planned_bytes},
            "budget_bytes": self.plan.budget.budget_bytes,
            "flags": " ".join(self.flags()),
            "reason": self.reason,
        }


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _resource(limits: Limits) -> tuple[str, str] | tuple[None, str]:
    """(knob, resource) of a plan — the resource a request holds a bounded amount of — or (None, why not)."""
    if FULL_TOKENS not in limits.tokens:
        return None, "every layer slides: one token space, nothing to split"
    if limits.windowed:
        return RATIO_KNOB, next(iter(limits.windowed))
    if limits.slots_per_request:
        return SLOTS_KNOB, STATE_SLOTS
    return None, "the plan has one pool kind (no windowed token space, no state slots): nothing to split"


def _resource_count(p: Plan, resource: str) -> int:
    counts = p.counts
    return int(counts["state_slots"]) if resource == STATE_SLOTS else int(counts["tokens"].get(resource, 0))


def _unit_bytes(p: Plan, resource: str) -> tuple[Fraction, Fraction]:
    """Bytes per full token and per resource unit, read off the plan's affine cost model at its counts.

    A full token brings its compressed spaces' slots with it (``1 / ratio`` of each, ``Plan.compression``).
    """
    counts = p.counts
    tokens = dict(counts["tokens"])
    compressed = {space: ratio for space, ratio in p.compression.items() if space in tokens}
    step = math.lcm(p.serving.page_size * 1024, *compressed.values())
    cost = p.cost

    def at(full: int = 0, extra: int = 0) -> int:
        spaces = dict(tokens)
        spaces[FULL_TOKENS] += full
        for space, ratio in compressed.items():
            spaces[space] += full // ratio
        slots = int(counts["state_slots"])
        if resource == STATE_SLOTS:
            slots += extra
        else:
            spaces[resource] += extra
        return cost.bytes_for(tokens=spaces, requests=int(counts["requests"]), state_slots=slots)

    base = at()
    per_full = Fraction(at(full=step) - base, step)
    per_unit = Fraction(at(extra=step) - base, step)
    return per_full, per_unit


def choose_split(
    model: Any,
    serving: Serving | None = None,
    budget: Mapping[str, Any] | None = None,
    workload: Workload | str = "8k",
    *,
    registry: Any = None,
) -> SplitChoice:
    """The split knob's value that runs the most requests of ``workload`` at once within the budget.

    ``budget`` holds :func:`kvpools_core.pipeline.plan`'s budget arguments (``memory``, ``free_memory``,
    ...).  See the module docstring for the closed form and the handful of plans that land it exactly.
    """
    from kvpools_core.pipeline import plan as make_plan

    serving = serving or Serving()
    budget = dict(budget or {})
    work = parse_workload(workload) if isinstance(workload, str) else workload

    def plan_at(**fields: Any) -> Plan:
        return make_plan(model, attrs.evolve(serving, **fields), registry=registry, **budget)

    default_plan = make_plan(model, serving, registry=registry, **budget)
    limits = limits_of(default_plan)
    work = work.within(limits.context_len)
    default = workload_concurrency(default_plan, work)
    knob, resource = _resource(limits)

    def unchanged(reason: str) -> SplitChoice:
        value = None if knob is None else getattr(serving, knob)
        return SplitChoice(
            workload=work.source,
            knob=knob,
            default_value=value,
            value=value,
            default=default,
            chosen=default,
            plan=default_plan,
            default_plan=default_plan,
            reason=reason,
        )

    if knob is None:
        return unchanged(resource)
    dp = serving.attn_dp_size
    footprint = _footprint(limits, work.lengths)
    e_full = footprint.per_space[FULL_TOKENS]
    if resource == STATE_SLOTS:
        e_x, c = Fraction(limits.slots_per_request), Fraction(0)

        def need(requests: int) -> int:
            return requests * limits.slots_per_request
    else:
        window = limits.windowed[resource]
        prefills = window.prefills_in_flight
        e_x = footprint.per_space[resource]
        c = window.reserved + footprint.chunk.get(resource, Fraction(0)) * prefills

        def need(requests: int) -> int:
            return _space_needs(limits, resource, requests, footprint)

    per_full, per_unit = _unit_bytes(default_plan, resource)
    q = per_unit / per_full
    f0, x0 = limits.tokens[FULL_TOKENS], _resource_count(default_plan, resource)
    best_n = max(1, math.floor((f0 + q * x0 - q * c) / (e_full + q * e_x)))

    def value_for(requests: int) -> float | int:
        wanted = need(requests)
        if knob == SLOTS_KNOB:
            return wanted * dp
        full = f0 - q * (wanted - x0)
        return _ceil_ratio(Fraction(wanted) / max(full, Fraction(1)))

    candidates: list[tuple[float | int, Plan, WorkloadCapacity]] = [(getattr(serving, knob), default_plan, default)]
    for requests in (best_n - 1, best_n, best_n + 1):
        if requests < 1:
            continue
        value = value_for(requests)
        try:
            p = plan_at(**{knob: value})
            if knob == RATIO_KNOB:
                # a ratio applies to the full tokens it leaves: re-solve once against the planned count
                again = _ceil_ratio(Fraction(need(requests)) / p.counts["tokens"][FULL_TOKENS])
                if again != value:
                    q_plan = plan_at(**{knob: again})
                    if _resource_count(q_plan, resource) >= need(requests) or _resource_count(p, resource) < need(
                        requests
                    ):
                        value, p = again, q_plan
        except KvpoolsError:
            continue  # a split the budget cannot build is no candidate
        if _resource_count(p, resource) == x0 and value != getattr(serving, knob):
            return unchanged(f"{_flag(knob)} does not move the plan's {resource}: nothing to split")
        candidates.append((value, p, workload_concurrency(p, work)))
    value, chosen_plan, chosen = max(
        candidates, key=lambda item: (item[2].concurrent_requests, item[1] is default_plan)
    )
    return SplitChoice(
        max_running_requests=_realised_cap(plan_at, knob, value, chosen.concurrent_requests, work, dp),
        workload=work.source,
        knob=knob,
        default_value=getattr(serving, knob),
        value=value,
        default=default,
        chosen=chosen,
        plan=chosen_plan,
        default_plan=default_plan,
        reason=f"closed form n* = {best_n} requests; {_flag(knob)} planned at n* - 1, n*, n* + 1 and the default"
        + ("; SGLang's default split is already the best" if chosen_plan is default_plan else ""),
    )


def _realised_cap(plan_at: Any, knob: str, value: float | int, requests: int, work: Workload, dp: int) -> int | None:
    """``--max-running-requests`` for the flags, when planning with it beside the knob still runs ``requests``.

    The cap can change how SGLang sizes the pools (with the radix cache off and chunked prefill on, an explicit
    cap sizes the SWA pool by its worst case instead of the ratio), so the flags are planned as given; a cap
    that would not realise the split is left out (None).
    """
    if requests < 1:
        return None
    try:
        capped = plan_at(**{knob: value, "max_running_requests": requests * dp})
    except KvpoolsError:
        return None
    return requests * dp if workload_concurrency(capped, work).concurrent_requests >= requests else None


def _ceil_ratio(ratio: Fraction) -> float:
    scale = 10**RATIO_DECIMALS
    return float(max(1, math.ceil(ratio * scale)) / scale)
