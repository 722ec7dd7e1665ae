"""Plan a grid of models x serving options x budgets, and read each plan's tokens, bytes and concurrency.

``kvpools sweep`` (and :func:`run_sweep`) answer "which TP, dtype, page and
memory serve my models best" in one run: every point of a :class:`SweepGrid`
is one :func:`kvpools_core.pipeline.plan`, summed up in one :class:`SweepRow`
— the tokens of each token space, the request count, the bytes per token of
each group (pool) of the plan's cost model, and how many requests of each
asked context run at once (:func:`kvpools_core.planning.capacity.concurrency`).  A point
that does not plan (a page size the platform refuses, a budget too small) is a
row with its ``error``, never an abort; a plugin bug (:class:`PluginError`
other than "nobody answers") still raises.

Nothing is approximated: each row is what ``plan`` answers for its point.  The
speed comes from doing once what does not change: each model is parsed once,
and the budget-independent steps (platform, validation, cell size:
:class:`~kvpools_core.pipeline.PlanBasis`) run once per model and serving
options, then the pools are sized per budget.  Larger sweeps run in a
standard-library process pool, in chunks of whole configurations; rows come
back in grid order whatever the number of jobs.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

import attrs

from kvpools_core.errors import ConfigError, KvpoolsError, NoProviderError, PluginError, short_repr
from kvpools_core.options import cli_surface, on_cli, option
from kvpools_core.planning.capacity import concurrency_within, limits_of, parse_context_len, why_none
from kvpools_core.units import parse_bytes
from kvpools_core.values import ModelSpec, Plan, Serving

__all__ = [
    "BUDGET_KEYWORDS",
    "MIN_POINTS_PER_JOB",
    "SweepGrid",
    "SweepPoint",
    "SweepRow",
    "axis_names",
    "columns",
    "context_label",
    "default_jobs",
    "parse_axis_values",
    "record",
    "rows_from_csv",
    "rows_to_csv",
    "rows_to_json",
    "run_sweep",
    "worker_count",
]

BUDGET_KEYWORDS: tuple[str, ...] = ("memory", "gpu")
"""The :func:`~kvpools_core.pipeline.plan` keywords a budget of the grid may set: each budget is a mapping of
exactly one of them, passed to ``plan`` as it is, and each keyword is a CSV column.  ``memory`` budgets reuse
one :class:`~kvpools_core.pipeline.PlanBasis` per configuration; a ``gpu`` budget (a catalogue name,
:mod:`kvpools_core.pipeline.gpus`) is planned whole, since the GPU chooses the platform and its weights are estimated
from the model's complete config."""

MIN_POINTS_PER_JOB = 1000
"""The fewest points a worker process is started for: below ~1,000 points (about a second of planning) a
worker's start and the rows' trip back cost more than the worker saves."""

_NOT_AXES = frozenset({"plugin_options", "pp_layer_partition", "platform_traits", "workspaces"})
"""Serving fields a sweep axis cannot vary: mappings and tuples (no one-word value), and what the pipeline resolves."""

Pairs = tuple[tuple[str, Any], ...]


def axis_names() -> tuple[str, ...]:
    """The Serving fields a sweep axis may vary (every field with a one-word value)."""
    return tuple(field.name for field in attrs.fields(Serving) if field.name not in _NOT_AXES)


def _field_kind(name: str) -> Any:
    kind = typing.get_type_hints(Serving)[name]
    args = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    return args[0] if args else kind


def parse_axis_values(name: str, values: Iterable[Any]) -> tuple[Any, ...]:
    """``values`` of Serving field ``name`` (text as people write it, or typed), checked by the field's own rules.

    Text is read as the field's type (``1``/``true``/``none``); each value then
    goes through the field's converter and validator, so a value no serving
    could take is refused here, naming the axis, not planned into a row of
    errors.  Combinations of valid values that clash are rows with an error.
    """
    key = name.replace("-", "_")
    if key not in axis_names():
        raise ConfigError(
            f"{option('axis')} {name!r} is not a Serving field a sweep can vary; "
            f"valid names: {', '.join(axis_names())}."
        )
    field = attrs.fields_dict(Serving)[key]
    kind = _field_kind(key)
    parsed = []
    for raw in values:
        value = _read(raw, kind, key) if isinstance(raw, str) else raw
        if field.converter is not None and value is not None:
            value = typing.cast(Callable[[Any], Any], field.converter)(value)
        if field.validator is not None:
            field.validator(Serving(), field, value)
        parsed.append(value)
    if not parsed:
        raise ConfigError(f"{option('axis')} {key} has no values; give at least one (e.g. {key}=1,2).")
    return tuple(dict.fromkeys(parsed))


def _read(text: str, kind: Any, name: str) -> Any:
    text = text.strip()
    if text.lower() in ("none", "null"):
        return None
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes", "on")
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
    except ValueError:
        raise ConfigError(f"{option(name)} takes {kind.__name__} values, got {short_repr(text)}.") from None
    return text


@attrs.frozen(kw_only=True)
class SweepPoint:
    """One point of a grid: a model, the Serving fields its axes set, and the budget keywords of ``plan``."""

    model: str
    settings: Pairs = ()
    budget: Pairs = ()

    @property
    def configuration(self) -> tuple[str, Pairs]:
        """The point without its budget: points that share it share their cell size (one line on a plot)."""
        return self.model, self.settings

    def label(self) -> str:
        """``model tp_size=2 kv_cache_dtype=fp8_e4m3``: the configuration, as plots name it."""
        return " ".join([self.model, *(f"{name}={value}" for name, value in self.settings)])


def _pairs(value: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> Pairs:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((str(key), item) for key, item in items)


def _axes(
    value: Mapping[str, Iterable[Any]] | Iterable[tuple[str, Iterable[Any]]],
) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    axes: dict[str, tuple[Any, ...]] = {}
    for name, values in items:
        key = name.replace("-", "_")
        if key in axes:
            raise ConfigError(f"{option('axis')} {key} is given twice; give its values once (e.g. {key}=1,2).")
        axes[key] = parse_axis_values(key, [values] if isinstance(values, (str, int, float)) else values)
    return tuple(axes.items())


def _budgets(value: Iterable[Mapping[str, Any]]) -> tuple[Pairs, ...]:
    budgets = []
    for budget in value:
        unknown = sorted(set(budget) - set(BUDGET_KEYWORDS))
        if unknown or not budget:
            raise ConfigError(
                f"A sweep budget sets {', '.join(BUDGET_KEYWORDS)} (the plan keywords), got {dict(budget)!r}."
            )
        if len(budget) > 1:
            raise ConfigError(f"A sweep budget is one of {', '.join(BUDGET_KEYWORDS)}, got {dict(budget)!r}.")
        if "memory" in budget:
            parse_bytes(budget["memory"], option("memory"))
        if "gpu" in budget:
            from kvpools_core.pipeline.gpus import find_gpu

            find_gpu(str(budget["gpu"]))
        budgets.append(_pairs(budget))
    if not budgets:
        raise ConfigError(f"A sweep needs at least one budget: {option('memory')} SIZE (e.g. 40GiB,80GiB).")
    return tuple(budgets)


def context_label(context: int) -> str:
    """``8192`` → ``8k``, ``1048576`` → ``1M``: a context length as tables and plots name it."""
    if context % (1 << 20) == 0:
        return f"{context >> 20}M"
    return f"{context >> 10}k" if context % 1024 == 0 else str(context)


def _contexts(value: Iterable[int | str]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(parse_context_len(item) for item in value))


def _models(value: Iterable[str]) -> tuple[str, ...]:
    models = tuple(dict.fromkeys(value))
    if not models:
        raise ConfigError(f"A sweep needs at least one {option('model')} (a preset, a config.json or a directory).")
    return models


@attrs.frozen(kw_only=True)
class SweepGrid:
    """Models x axes (Serving fields, in order) x budgets, and the context lengths each row's concurrency is asked at.

    ``serving`` holds the Serving fields every point shares (including
    ``platform``); an axis overrides them.  Points are ordered models first,
    then the axes as given, then budgets (innermost, so the points of one
    configuration are adjacent and share its cell size).
    """

    models: tuple[str, ...] = attrs.field(converter=_models)
    axes: tuple[tuple[str, tuple[Any, ...]], ...] = attrs.field(default=(), converter=_axes)
    budgets: tuple[Pairs, ...] = attrs.field(converter=_budgets)
    contexts: tuple[int, ...] = attrs.field(default=(), converter=_contexts)
    serving: Pairs = attrs.field(default=(), converter=_pairs)

    def __attrs_post_init__(self) -> None:
        Serving(**dict(self.serving))  # the shared fields must make a Serving on their own

    def __len__(self) -> int:
        count = len(self.models) * len(self.budgets)
        for _, values in self.axes:
            count *= len(values)
        return count

    def configurations(self) -> Iterator[tuple[str, Pairs]]:
        """Every (model, axis settings) in grid order."""
        names = [name for name, _ in self.axes]
        for model in self.models:
            for values in itertools.product(*(values for _, values in self.axes)):
                yield model, tuple(zip(names, values, strict=True))

    def points(self) -> Iterator[SweepPoint]:
        """Every point, in grid order."""
        for model, settings in self.configurations():
            for budget in self.budgets:
                yield SweepPoint(model=model, settings=settings, budget=budget)

    def serving_for(self, point: SweepPoint) -> Serving:
        """The point's Serving: the shared fields, its axis settings on top (a clash raises ConfigError)."""
        return Serving(**{**dict(self.serving), **dict(point.settings)})


@attrs.frozen(kw_only=True)
class SweepRow:
    """What one point plans to: tokens per token space, requests, bytes per token per group, concurrency per context.

    ``bytes_per_token`` maps each group (pool) of the plan's cost model that
    grows with tokens to its bytes per token of its own token space
    (:attr:`~kvpools_core.values.GroupCost.bytes_per_token`: ``kv_swa`` per SWA
    token); ``concurrency`` / ``binding`` map each asked context length to
    :func:`~kvpools_core.planning.capacity.concurrency`'s answer and what binds, ``reason`` each context where not one
    request runs to why (:func:`~kvpools_core.planning.capacity.why_none`: the tokens one request needs and the
    plan holds,
    or the context length it exceeds).
    ``error`` is why the point does not plan (every count then empty);
    ``capacity_error`` why a plan's concurrency cannot be answered.
    """

    point: SweepPoint
    budget_bytes: int | None = None
    planned_bytes: int | None = None
    tokens: dict[str, int] = attrs.field(factory=dict)
    max_running_requests: int | None = None
    state_slots: int | None = None
    bytes_per_token: dict[str, int | float] = attrs.field(factory=dict)
    token_spaces: dict[str, str] = attrs.field(factory=dict)
    """The token space each ``bytes_per_token`` group is paid per (``"full"``, ``"swa"``, ...)."""
    concurrency: dict[int, int] = attrs.field(factory=dict)
    binding: dict[int, str] = attrs.field(factory=dict)
    reason: dict[int, str] = attrs.field(factory=dict)
    capacity_error: str | None = None
    error: str | None = None

    @classmethod
    def of_plan(cls, point: SweepPoint, plan: Plan, contexts: Sequence[int]) -> SweepRow:
        """The row of a planned point (concurrency from :func:`~kvpools_core.planning.capacity.limits_of` read once)."""
        counts = plan.counts
        token_groups = [group for group in plan.cost.groups if group.token_bytes]
        concurrency: dict[int, int] = {}
        binding: dict[int, str] = {}
        reason: dict[int, str] = {}
        per_space: dict[str, int | float] = {}
        for group in token_groups:
            per_space[group.token_space] = per_space.get(group.token_space, 0) + group.bytes_per_token
        capacity_error = None
        if contexts:
            try:
                limits = limits_of(plan)
            except KvpoolsError as error:
                capacity_error = str(error)
            else:
                for context in contexts:
                    answer = concurrency_within(limits, context)
                    concurrency[context], binding[context] = answer.concurrent_requests, answer.binding
                    why = why_none(limits, answer, per_space, plan.budget.budget_bytes)
                    if why is not None:
                        reason[context] = why
        return cls(
            point=point,
            budget_bytes=plan.budget.budget_bytes,
            planned_bytes=plan.planned_bytes,
            tokens=dict(counts["tokens"]),
            max_running_requests=plan.max_running_requests,
            state_slots=int(counts["state_slots"]),
            bytes_per_token={group.group: group.bytes_per_token for group in token_groups},
            token_spaces={group.group: group.token_space for group in token_groups},
            concurrency=concurrency,
            binding=binding,
            reason=reason,
            capacity_error=capacity_error,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON record: the point as ``model``, ``serving`` and ``budget`` objects, then the answers."""
        return {
            "model": self.point.model,
            "serving": dict(self.point.settings),
            "budget": dict(self.point.budget),
            "budget_bytes": self.budget_bytes,
            "planned_bytes": self.planned_bytes,
            "tokens": dict(self.tokens),
            "max_running_requests": self.max_running_requests,
            "state_slots": self.state_slots,
            "bytes_per_token": dict(self.bytes_per_token),
            "token_spaces": dict(self.token_spaces),
            "concurrency": {str(context): count for context, count in self.concurrency.items()},
            "binding": {str(context): limit for context, limit in self.binding.items()},
            "reason": {str(context): why for context, why in self.reason.items()},
            "capacity_error": self.capacity_error,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepRow:
        """A row back from its JSON record (:meth:`to_dict`)."""
        point = SweepPoint(model=data["model"], settings=_pairs(data["serving"]), budget=_pairs(data["budget"]))
        return cls(
            point=point,
            budget_bytes=data["budget_bytes"],
            planned_bytes=data["planned_bytes"],
            tokens=dict(data["tokens"]),
            max_running_requests=data["max_running_requests"],
            state_slots=data["state_slots"],
            bytes_per_token=dict(data["bytes_per_token"]),
            token_spaces=dict(data["token_spaces"]),
            concurrency={int(context): count for context, count in data["concurrency"].items()},
            binding={int(context): limit for context, limit in data["binding"].items()},
            reason={int(context): why for context, why in data.get("reason", {}).items()},
            capacity_error=data["capacity_error"],
            error=data["error"],
        )


# ---------------------------------------------------------------------------
# running
# ---------------------------------------------------------------------------


def _is_user_error(error: KvpoolsError) -> bool:
    """A point's own problem (a row's ``error``), not a plugin's bug (raised): nobody answering is the former."""
    return not isinstance(error, PluginError) or isinstance(error, NoProviderError)


def _plan_configuration(
    grid: SweepGrid, points: Sequence[SweepPoint], specs: dict[str, ModelSpec | KvpoolsError], registry: Any
) -> list[SweepRow]:
    """The rows of the points of one configuration: its basis once, then one sizing per budget."""
    from kvpools_core.models import load_model
    from kvpools_core.pipeline import plan_basis

    model = points[0].model
    if model not in specs:
        try:
            specs[model] = load_model(model, registry)[0]
        except KvpoolsError as error:
            if not _is_user_error(error):
                raise
            specs[model] = error
    try:
        spec = specs[model]
        if isinstance(spec, KvpoolsError):
            raise spec
        basis = plan_basis(spec, grid.serving_for(points[0]), registry=registry)
    except KvpoolsError as error:
        if not _is_user_error(error):
            raise
        return [SweepRow(point=point, error=str(error)) for point in points]
    rows = []
    for point in points:
        try:
            budget = dict(point.budget)
            if "gpu" in budget:  # the GPU picks the platform and the weights: a whole plan, from the model's name
                from kvpools_core.pipeline import plan as whole_plan

                plan = whole_plan(point.model, grid.serving_for(point), gpu=str(budget["gpu"]), registry=registry)
            else:
                plan = basis.plan(**budget)
        except KvpoolsError as error:
            if not _is_user_error(error):
                raise
            rows.append(SweepRow(point=point, error=str(error)))
            continue
        rows.append(SweepRow.of_plan(point, plan, grid.contexts))
    return rows


def _groups(grid: SweepGrid, start: int = 0, stop: int | None = None) -> list[list[SweepPoint]]:
    """The grid's points, one list per configuration (its budgets), in grid order; configurations
    ``start:stop`` only (a worker's chunk builds its own points, not the whole grid's)."""
    return [
        [SweepPoint(model=model, settings=settings, budget=budget) for budget in grid.budgets]
        for model, settings in itertools.islice(grid.configurations(), start, stop)
    ]


def _run_groups(
    grid: SweepGrid,
    groups: Sequence[Sequence[SweepPoint]],
    registry: Any = None,
    advance: Callable[[int], None] | None = None,
) -> list[SweepRow]:
    from kvpools_core.registry import get_registry

    registry = registry or get_registry()
    specs: dict[str, ModelSpec | KvpoolsError] = {}
    rows: list[SweepRow] = []
    for points in groups:
        rows += _plan_configuration(grid, points, specs, registry)
        if advance is not None:
            advance(len(points))
    return rows


def _worker_chunk(grid: SweepGrid, start: int, stop: int, cli: bool) -> list[SweepRow]:
    """One worker's chunk (configurations ``start:stop``), planned with the default registry of the worker's
    process (forked: a copy of the parent's; spawned: created from the entry points, as ``kvpools`` does);
    errors name options as flags when the sweep runs under the command line."""
    groups = _groups(grid, start, stop)
    if cli:
        with cli_surface():
            return _run_groups(grid, groups)
    return _run_groups(grid, groups)


def default_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def worker_count(points: int, configurations: int, jobs: int, min_points_per_job: int = MIN_POINTS_PER_JOB) -> int:
    """Worker processes for a sweep: at most ``jobs``, one per ``min_points_per_job`` points and one per
    configuration (a configuration is never split); 1 means this process."""
    return max(1, min(jobs, points // max(1, min_points_per_job), configurations))


def run_sweep(
    grid: SweepGrid,
    *,
    jobs: int | None = 1,
    registry: Any = None,
    advance: Callable[[int], None] | None = None,
    min_points_per_job: int = MIN_POINTS_PER_JOB,
    executor: Executor | None = None,
) -> list[SweepRow]:
    """Plan every point of ``grid``; one :class:`SweepRow` per point, in grid order.

    ``jobs``: worker processes (``None``: :func:`default_jobs`), fewer for a
    small sweep (:func:`worker_count`); with one, the sweep runs in this
    process.  Workers plan with their process's default registry (the
    installed plugins), so a custom ``registry`` plans in this process only.
    ``advance(n)`` is called as ``n`` more points are done (a progress bar).

    ``executor``: any :class:`concurrent.futures.Executor` to run the chunks on instead of a process pool of
    this machine -- a Dask ``distributed.Client(...).get_executor()`` or a Ray pool spreads a grid over a
    cluster without kvpools owning a scheduler. Its workers need kvpools and the plugins installed (they plan
    with their own default registry); ``jobs`` is then how many workers to cut the grid for (``None``: as
    many as this machine has cores), and the caller owns the executor (it is not shut down here).
    """
    if jobs is None:
        jobs = default_jobs()
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"{option('jobs')} must be a positive integer, got {jobs!r}.")
    if executor is not None and not isinstance(executor, Executor):
        raise ConfigError(
            f"executor must be a concurrent.futures.Executor (a process pool, a Dask Client's get_executor(), a "
            f"Ray pool), got {type(executor).__name__}."
        )
    configurations = len(grid) // len(grid.budgets)
    workers = worker_count(len(grid), configurations, jobs, min_points_per_job)
    if workers == 1 and executor is None:
        return _run_groups(grid, _groups(grid), registry, advance)
    if registry is not None:
        where = "on the executor's workers" if executor is not None else "in worker processes"
        raise ConfigError(
            f"A sweep with {option('jobs')} {jobs} plans {where} with the installed plugins; "
            f"a custom registry plans in this process only (jobs=1, no executor)."
        )
    # chunks of whole configurations, a few per worker so that one slow chunk does not hold the others back
    per_chunk = max(1, -(-configurations // (workers * 4)))
    bounds = [(start, min(start + per_chunk, configurations)) for start in range(0, configurations, per_chunk)]
    if executor is not None:
        return _run_chunks(executor, grid, bounds, advance)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return _run_chunks(pool, grid, bounds, advance)


def _run_chunks(
    executor: Executor,
    grid: SweepGrid,
    bounds: Sequence[tuple[int, int]],
    advance: Callable[[int], None] | None,
) -> list[SweepRow]:
    """Every chunk of ``bounds`` planned on ``executor``; rows in the grid's order (the submission order)."""
    rows: list[SweepRow] = []
    futures = [executor.submit(_worker_chunk, grid, start, stop, on_cli()) for start, stop in bounds]
    try:
        for future in futures:
            chunk = future.result()
            rows += chunk
            if advance is not None:
                advance(len(chunk))
    finally:
        for future in futures:
            future.cancel()  # a failed chunk stops the sweep: the rest is not waited for
    return rows


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------


def _union(rows: Sequence[SweepRow], read: Callable[[SweepRow], Iterable[Any]]) -> list[Any]:
    return list(dict.fromkeys(key for row in rows for key in read(row)))


def columns(rows: Sequence[SweepRow]) -> list[str]:
    """The CSV columns of ``rows``, in this order (see docs/sweep.md):

    ``model``; one per axis (the Serving field's name); one per budget keyword
    (``memory``); ``budget_bytes``, ``planned_bytes``; ``tokens.<space>`` per
    token space; ``running_requests`` (the plan's ``max_running_requests``: a Serving axis keeps that name),
    ``state_slots``; ``bytes_per_token.<space>.<group>`` per group (its bytes per token of that token
    space); ``concurrency.<context>``, ``binding.<context>`` and ``reason.<context>`` (why not one request
    runs, where none does) per context; ``capacity_error``, ``error``.
    """
    names = ["model"]
    names += _union(rows, lambda row: (name for name, _ in row.point.settings))
    names += _union(rows, lambda row: (name for name, _ in row.point.budget))
    names += ["budget_bytes", "planned_bytes"]
    names += [f"tokens.{space}" for space in _union(rows, lambda row: row.tokens)]
    names += ["running_requests", "state_slots"]
    names += [
        f"bytes_per_token.{row_space}.{group}"
        for group, row_space in _union(rows, lambda row: row.token_spaces.items())
    ]
    contexts = _union(rows, lambda row: row.concurrency)
    names += [f"concurrency.{context}" for context in contexts]
    names += [f"binding.{context}" for context in contexts]
    names += [f"reason.{context}" for context in contexts]
    return [*names, "capacity_error", "error"]


def record(row: SweepRow) -> dict[str, Any]:
    """One flat record of :func:`columns` (absent values are ``None``)."""
    flat: dict[str, Any] = {"model": row.point.model, **dict(row.point.settings), **dict(row.point.budget)}
    flat.update(budget_bytes=row.budget_bytes, planned_bytes=row.planned_bytes)
    flat.update({f"tokens.{space}": count for space, count in row.tokens.items()})
    flat.update(running_requests=row.max_running_requests, state_slots=row.state_slots)
    flat.update(
        {f"bytes_per_token.{row.token_spaces[group]}.{group}": per for group, per in row.bytes_per_token.items()}
    )
    flat.update({f"concurrency.{context}": count for context, count in row.concurrency.items()})
    flat.update({f"binding.{context}": limit for context, limit in row.binding.items()})
    flat.update({f"reason.{context}": why for context, why in row.reason.items()})
    flat.update(capacity_error=row.capacity_error, error=row.error)
    return flat


def rows_to_csv(rows: Sequence[SweepRow]) -> str:
    """The rows as CSV (:func:`columns`; an absent value is an empty field)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns(rows), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({key: "" if value is None else value for key, value in record(row).items()})
    return out.getvalue()


def rows_from_csv(text: str) -> list[SweepRow]:
    """Rows back from :func:`rows_to_csv`: a column named after a Serving field is an axis (read as that field's
    type), one named after a budget keyword a budget value (a number, or the size as written)."""
    rows = []
    for flat in csv.DictReader(io.StringIO(text)):
        axes = [name for name in flat if name in axis_names()]
        settings = tuple((name, parse_axis_values(name, [flat[name] or "none"])[0]) for name in axes)
        budget = tuple((key, _number(flat[key])) for key in BUDGET_KEYWORDS if flat.get(key))
        per_token = {
            tuple(key.split(".", 2)[1:]): _bytes_per_token(value)
            for key, value in flat.items()
            if key.startswith("bytes_per_token.") and value
        }

        def prefixed(prefix: str, flat: dict[str, str] = flat) -> dict[str, str]:
            return {key[len(prefix) :]: value for key, value in flat.items() if key.startswith(prefix) and value}

        rows.append(
            SweepRow(
                point=SweepPoint(model=flat["model"], settings=settings, budget=budget),
                budget_bytes=_optional_int(flat["budget_bytes"]),
                planned_bytes=_optional_int(flat["planned_bytes"]),
                tokens={space: int(count) for space, count in prefixed("tokens.").items()},
                max_running_requests=_optional_int(flat["running_requests"]),
                state_slots=_optional_int(flat["state_slots"]),
                bytes_per_token={group: per for (_, group), per in per_token.items()},
                token_spaces={group: space for (space, group) in per_token},
                concurrency={int(context): int(count) for context, count in prefixed("concurrency.").items()},
                binding={int(context): limit for context, limit in prefixed("binding.").items()},
                reason={int(context): why for context, why in prefixed("reason.").items()},
                capacity_error=flat["capacity_error"] or None,
                error=flat["error"] or None,
            )
        )
    return rows


def _optional_int(text: str) -> int | None:
    return int(text) if text else None


def _bytes_per_token(text: str) -> int | float:
    """``131072`` or ``0.125``, as :attr:`~kvpools_core.values.GroupCost.bytes_per_token` gives them."""
    digits = text.lstrip("-")
    return int(text) if digits.isascii() and digits.isdigit() else float(text)


def _number(text: str) -> int | float | str:
    try:
        return int(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return text


def rows_to_json(rows: Sequence[SweepRow]) -> str:
    """The rows as a JSON list of records (:meth:`SweepRow.to_dict`)."""
    return json.dumps([row.to_dict() for row in rows], indent=2)
