"""Plans on every rank of a serving job, agreed on one token count.

An engine runs one model runner per rank; SGLang numbers them
``rank = tp_size * pp_rank + tp_rank`` (``runtime_context.spawn_world_rank``,
0.5.23) and every rank sizes its own pools from its own layers and memory.
The ranks must end with the same token count (a request's slots are the same
on every rank), so they agree on the smallest:

* SGLang reduces the *free memory* over the world in ``float32``
  (``get_available_gpu_memory(distributed=True)``, ``utils/common.py``: a
  ``torch.float32`` all-reduce MIN of bytes, whose spacing at 141 GiB is
  16 KiB), both before the weights load (the runtime slack's base) and after
  (``_profile_available_bytes``), then MINs the token capacity over the
  pipeline in ``int64`` (``_apply_token_constraints``).  ``--accounting
  sglang`` reproduces both reductions.
* ``--accounting exact`` plans each rank on its own budget and agrees with one
  ``int64`` MIN of the token counts: exact, and no rank is charged another
  rank's rounding.

Two entry points compute the same agreement: :func:`plan_all_ranks` without a
process group (every rank's inputs given, for a report of all of them:
``kvpools plan --all-ranks``), and :func:`plan_on_group` on each rank of a
``torch.distributed`` group (any backend), whose ranks exchange their values
through the group's key-value store in bounded time, so that a rank that
fails, exits, lags or plans other inputs stops every rank within seconds with
an error naming it (:mod:`kvpools_core.planning.rank_exchange`).  Under pipeline
parallelism the binding stage is the one with the least memory *per layer*;
:func:`suggest_partition` finds the layer split (``--pp-layer-partition``,
SGLang's ``SGLANG_PP_LAYER_PARTITION``) that holds the most tokens with every
stage's budget as it is.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from kvpools_core.errors import ConfigError, KvpoolsError, RankMismatchError
from kvpools_core.models import load_model
from kvpools_core.options import option
from kvpools_core.parallel import pp_layer_range
from kvpools_core.parts.sizing import summarize_notes
from kvpools_core.pipeline import measure_free_bytes, plan, resolve_budget
from kvpools_core.pipeline.gpus import GPU
from kvpools_core.planning.rank_exchange import (
    DEFAULT_TIMEOUT_S,
    RankExchange,
    describe_ranks,
    fingerprint,
    fingerprint_document,
    mismatch_error,
)
from kvpools_core.registry import Registry, get_registry
from kvpools_core.units import parse_bytes
from kvpools_core.values import Budget, ModelSpec, Plan, PlatformTraits, Serving

PerRank = Any
"""A budget input for every rank: one value for all, a sequence with one per pipeline stage, or a mapping
from global rank to value (ranks it leaves out get nothing)."""


@attrs.frozen(kw_only=True)
class RankId:
    """Where one process sits: its global rank and its place in each parallel group (SGLang 0.5.23).

    ``tp_rank = rank % tp_size`` and ``pp_rank = rank // tp_size``
    (``derive_spawn_ranks``); attention ranks are laid out ``(dp, cp, tp)``
    with tp fastest (``derive_attention_ranks``); decode-context-parallel
    groups are contiguous blocks of ``dcp_size`` inside the TP group
    (``initialize_model_parallel``), so ``dcp_rank = tp_rank % dcp_size``.
    """

    rank: int
    pp_rank: int
    tp_rank: int
    attn_dp_rank: int
    attn_tp_rank: int
    dcp_rank: int

    @classmethod
    def of(cls, rank: int, serving: Serving) -> RankId:
        tp_rank = rank % serving.tp_size
        return cls(
            rank=rank,
            pp_rank=rank // serving.tp_size,
            tp_rank=tp_rank,
            attn_dp_rank=tp_rank // (serving.attn_tp_size * serving.attn_cp_size),
            attn_tp_rank=tp_rank % serving.attn_tp_size,
            dcp_rank=tp_rank % serving.dcp_size,
        )


def rank_ids(serving: Serving) -> tuple[RankId, ...]:
    """Every rank of one engine: ``tp_size * pp_size`` processes (data-parallel replicas without DP
    attention are separate engines, which never agree with each other)."""
    return tuple(RankId.of(rank, serving) for rank in range(serving.tp_size * serving.pp_size))


@attrs.frozen(kw_only=True)
class RankRow:
    """One rank's side of the agreement: what it could hold alone, and what the agreed count leaves unused."""

    id: RankId
    layers: tuple[int, int]
    """The ``[start, end)`` layers of its pipeline stage."""
    bytes_per_token: int
    budget_bytes: int
    own_tokens: int
    """The tokens this rank's budget holds on its own."""
    planned_bytes: int
    """What the rank's pools take at the agreed token count."""

    @property
    def unused_bytes(self) -> int:
        """Budget the agreement leaves idle on this rank (memory the binding rank denies it)."""
        return self.budget_bytes - self.planned_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            **attrs.asdict(self.id),
            "layers": list(self.layers),
            "bytes_per_token": self.bytes_per_token,
            "budget_bytes": self.budget_bytes,
            "own_tokens": self.own_tokens,
            "planned_bytes": self.planned_bytes,
            "unused_bytes": self.unused_bytes,
        }


@attrs.frozen(kw_only=True)
class PartitionSuggestion:
    """A layer split that holds more tokens, every stage keeping the budget it has."""

    partition: tuple[int, ...]
    tokens: int
    gained_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return {"partition": list(self.partition), "tokens": self.tokens, "gained_tokens": self.gained_tokens}


@attrs.frozen(kw_only=True)
class Agreement:
    """The token count every rank keeps, who bound it, and what it costs the others."""

    accounting: str
    tokens: int
    bound_by: int
    """The global rank whose own count is the smallest (the lowest such rank on a tie)."""
    ranks: tuple[RankRow, ...]
    reduced_free_bytes: int | None = None
    """``--accounting sglang``: the world's float32 MIN of the free memory after the weights load."""
    reduced_pre_load_bytes: int | None = None
    """``--accounting sglang``: the world's float32 MIN of the free memory before the weights load."""
    suggestion: PartitionSuggestion | None = None

    @property
    def binding(self) -> RankRow:
        return next(row for row in self.ranks if row.id.rank == self.bound_by)

    def stage_bytes_per_layer(self) -> dict[int, int]:
        """Each pipeline stage's smallest budget per layer: the stage with the least binds."""
        per_stage: dict[int, int] = {}
        for row in self.ranks:
            layers = max(1, row.layers[1] - row.layers[0])
            value = row.budget_bytes // layers
            stage = row.id.pp_rank
            per_stage[stage] = min(per_stage.get(stage, value), value)
        return per_stage

    def to_dict(self) -> dict[str, Any]:
        return {
            "accounting": self.accounting,
            "tokens": self.tokens,
            "bound_by": self.bound_by,
            "bottleneck_stage": self.binding.id.pp_rank,
            "stage_budget_bytes_per_layer": {str(k): v for k, v in self.stage_bytes_per_layer().items()},
            "reduced_free_bytes": self.reduced_free_bytes,
            "reduced_pre_load_bytes": self.reduced_pre_load_bytes,
            "suggestion": self.suggestion.to_dict() if self.suggestion else None,
            "ranks": [row.to_dict() for row in self.ranks],
        }


@attrs.frozen(kw_only=True)
class RankPlans:
    """Every rank's plan after the agreement (one per global rank), and the agreement."""

    plans: tuple[Plan, ...]
    agreement: Agreement

    def to_dict(self) -> dict[str, Any]:
        return {"agreement": self.agreement.to_dict(), "plans": [p.to_dict() for p in self.plans]}


@attrs.frozen(kw_only=True)
class RankPlan:
    """This process's plan after agreeing with its group, and the agreement every rank saw."""

    rank: int
    plan: Plan
    agreement: Agreement


# ---------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------


def _for_rank(value: PerRank, rank: RankId, pp_size: int, name: str) -> Any:
    """The value of a per-rank input for one rank."""
    if value is None or isinstance(value, (int, float, str)):
        return value
    if isinstance(value, Mapping):
        return value.get(rank.rank)
    if isinstance(value, Sequence):
        if len(value) != pp_size:
            raise ConfigError(
                f"{option(name)} lists {len(value)} values; give one per pipeline stage ({option('pp_size')} "
                f"{pp_size}), a single value, or a mapping from global rank to value."
            )
        return value[rank.pp_rank]
    raise ConfigError(f"{option(name)} must be a size, a list with one per stage, or a mapping, got {value!r}.")


def float32(value: int) -> int:
    """``value`` rounded to the nearest float32, as SGLang's ``torch.tensor(free, dtype=torch.float32)``."""
    return int(struct.unpack("f", struct.pack("f", float(value)))[0])


@attrs.frozen
class _Inputs:
    memory: Any = None
    free_memory: Any = None
    weights_memory: Any = None
    reserved_memory: Any = None


def _inputs(rank: RankId, pp_size: int, **values: PerRank) -> _Inputs:
    return _Inputs(**{name: _for_rank(value, rank, pp_size, name) for name, value in values.items()})


def _budgets(
    serving: Serving,
    ranks: Sequence[RankId],
    inputs: Sequence[_Inputs],
    free_bytes: Sequence[int | None],
    registry: Registry,
    multimodal: bool,
) -> tuple[list[Budget], int | None, int | None]:
    """Each rank's budget; under ``--accounting sglang`` from the world's float32 MINs of free memory."""
    o = option
    for rank, given in zip(ranks, inputs, strict=True):
        if given.memory is None and free_bytes[rank.rank] is None:
            raise ConfigError(
                f"Rank {rank.rank} (pipeline stage {rank.pp_rank}) has no budget: give it {o('memory')} or "
                f"{o('free_memory')}."
            )
    profiled = [free is not None for free in free_bytes]
    if any(profiled) and not all(profiled):
        raise ConfigError(
            f"Give every rank a profiled budget ({o('free_memory')}) or every rank an explicit one ({o('memory')}), "
            f"not a mix: the engine profiles all ranks alike."
        )
    weights = [parse_bytes(given.weights_memory or 0, o("weights_memory")) for given in inputs]
    reduced_free = reduced_pre = None
    if all(profiled) and serving.accounting == "sglang":
        reduced_pre = min(float32(free) for free in free_bytes if free is not None)
        reduced_free = min(float32(free - w) for free, w in zip(free_bytes, weights, strict=True) if free is not None)
    budgets = []
    for rank, given, free, weight in zip(ranks, inputs, free_bytes, weights, strict=True):
        stage = attrs.evolve(serving, pp_rank=rank.pp_rank)
        if free is None:
            budgets.append(resolve_budget(stage, registry, memory=given.memory, multimodal=multimodal))
            continue
        if reduced_free is not None:
            free, pre = reduced_free + weight, reduced_pre
        else:
            pre = free
        budgets.append(
            resolve_budget(
                stage,
                registry,
                free_memory=free,
                weights_memory=weight,
                reserved_memory=given.reserved_memory,
                pre_model_load_memory=pre,
                multimodal=multimodal,
            )
        )
    return budgets, reduced_free, reduced_pre


# ---------------------------------------------------------------------------
# planning
# ---------------------------------------------------------------------------


def _stage_plan(
    model: str | ModelSpec,
    serving: Serving,
    budget: Budget,
    draft_model: str | ModelSpec | None,
    registry: Registry,
) -> Plan:
    return plan(model, serving, budget=budget, draft_model=draft_model, registry=registry, sync_stages=False)


def _agreed_plan(
    own: Plan,
    agreed: int,
    model: str | ModelSpec,
    serving: Serving,
    budget: Budget,
    draft_model: str | ModelSpec | None,
    registry: Registry,
    bound_by: int,
) -> Plan:
    """``own`` capped to the agreed tokens (re-solved, as SGLang re-runs its configurator after the MIN)."""
    if own.max_total_num_tokens <= agreed:
        return own
    cap = agreed if serving.max_total_tokens is None else min(agreed, serving.max_total_tokens)
    capped = _stage_plan(model, attrs.evolve(serving, max_total_tokens=cap), budget, draft_model, registry)
    note = (
        f"the ranks agree on {agreed:,} tokens, bound by rank {bound_by}; this rank alone could hold "
        f"{own.max_total_num_tokens:,}."
    )
    extra = [n for n in capped.sizing.notes if not n.startswith("max_total_tokens=")]
    sizing = attrs.evolve(capped.sizing, notes=summarize_notes(own.sizing.notes, [note], extra))
    # the cap is the agreement's, not an option the engine is started with: the plan keeps the rank's own serving
    return attrs.evolve(capped, serving=own.serving, sizing=sizing)


def _row(rank: RankId, own: Plan, final: Plan) -> RankRow:
    return RankRow(
        id=rank,
        layers=pp_layer_range(own.model.num_layers, rank.pp_rank, own.serving.pp_size, own.serving.pp_layer_partition),
        bytes_per_token=own.cell.bytes_per_token,
        budget_bytes=own.budget.budget_bytes,
        own_tokens=own.max_total_num_tokens,
        planned_bytes=final.planned_bytes,
    )


def _bound_by(own_tokens: Sequence[int]) -> int:
    smallest = min(own_tokens)
    return own_tokens.index(smallest)


def plan_all_ranks(
    model: str | ModelSpec,
    serving: Serving | None = None,
    *,
    memory: PerRank = None,
    free_memory: PerRank = None,
    weights_memory: PerRank = None,
    reserved_memory: PerRank = None,
    draft_model: str | ModelSpec | None = None,
    gpu: str | GPU | None = None,
    gpu_memory: int | str | None = None,
    runtime_memory: int | str | None = None,
    registry: Registry | None = None,
    suggest: bool = True,
) -> RankPlans:
    """Plan every rank of one engine from its own inputs, and agree as the ranks would.

    Each budget input is one value for all ranks, a sequence with one value per
    pipeline stage, or a mapping from global rank to value.  On a ``gpu`` (or
    ``gpu_memory``) every rank profiles that GPU with its own weights (estimated
    per stage unless ``weights_memory`` says).  Ranks with the same stage and
    inputs are planned once.  Under pipeline parallelism the result carries the
    layer split that would hold the most tokens (``suggest``).
    """
    registry = registry or get_registry()
    serving = serving or Serving()
    if gpu is not None or gpu_memory is not None:
        if memory is not None or free_memory is not None:
            raise ConfigError(
                f"Plan the ranks on {option('gpu')} or on stated memory ({option('memory')}, {option('free_memory')}), "
                f"not both."
            )
        serving, free_memory, weights_memory = _on_gpu(
            model, serving, gpu, gpu_memory, runtime_memory, weights_memory, reserved_memory, draft_model, registry
        )
    elif runtime_memory is not None:
        raise ConfigError(f"{option('runtime_memory')} applies to a GPU budget only: pass {option('gpu')} too.")
    ranks = rank_ids(serving)
    inputs = [
        _inputs(
            rank,
            serving.pp_size,
            memory=memory,
            free_memory=free_memory,
            weights_memory=weights_memory,
            reserved_memory=reserved_memory,
        )
        for rank in ranks
    ]
    free = [
        None if given.free_memory is None else parse_bytes(given.free_memory, option("free_memory")) for given in inputs
    ]
    multimodal = _spec(model, registry).is_multimodal
    budgets, reduced_free, reduced_pre = _budgets(serving, ranks, inputs, free, registry, multimodal)

    own_by_key: dict[tuple[int, Budget], Plan] = {}
    own_plans = []
    for rank, budget in zip(ranks, budgets, strict=True):
        key = (rank.pp_rank, budget)
        if key not in own_by_key:
            stage = attrs.evolve(serving, pp_rank=rank.pp_rank)
            own_by_key[key] = _stage_plan(model, stage, budget, draft_model, registry)
        own_plans.append(own_by_key[key])
    own_tokens = [p.max_total_num_tokens for p in own_plans]
    agreed = min(own_tokens)
    bound_by = _bound_by(own_tokens)

    final_by_key: dict[tuple[int, Budget], Plan] = {}
    finals = []
    for rank, budget, own in zip(ranks, budgets, own_plans, strict=True):
        key = (rank.pp_rank, budget)
        if key not in final_by_key:
            stage = attrs.evolve(serving, pp_rank=rank.pp_rank)
            final_by_key[key] = _agreed_plan(own, agreed, model, stage, budget, draft_model, registry, bound_by)
        finals.append(final_by_key[key])

    suggestion = None
    if suggest and serving.pp_size > 1:
        stage_budgets = [
            min((b for r, b in zip(ranks, budgets, strict=True) if r.pp_rank == s), key=lambda b: b.budget_bytes)
            for s in range(serving.pp_size)
        ]
        suggestion = suggest_partition(
            model, serving, stage_budgets, agreed, draft_model=draft_model, registry=registry
        )
    agreement = Agreement(
        accounting=serving.accounting,
        tokens=agreed,
        bound_by=bound_by,
        ranks=tuple(_row(r, o, f) for r, o, f in zip(ranks, own_plans, finals, strict=True)),
        reduced_free_bytes=reduced_free,
        reduced_pre_load_bytes=reduced_pre,
        suggestion=suggestion,
    )
    return RankPlans(plans=tuple(finals), agreement=agreement)


def _on_gpu(
    model: str | ModelSpec,
    serving: Serving,
    gpu: str | GPU | None,
    gpu_memory: int | str | None,
    runtime_memory: int | str | None,
    weights_memory: PerRank,
    reserved_memory: PerRank,
    draft_model: str | ModelSpec | None,
    registry: Registry,
) -> tuple[Serving, list[int], list[int]]:
    """Every stage's GPU profile as stated memory: the serving on the GPU's platform with the fraction SGLang
    would use there, each stage's free memory (total less the runtime) and its weights (per stage)."""
    free, weights = [], []
    fraction = platform = None
    for stage in range(serving.pp_size):
        rank = RankId.of(stage * serving.tp_size, serving)
        inputs = _inputs(rank, serving.pp_size, weights_memory=weights_memory, reserved_memory=reserved_memory)
        own = plan(
            model,
            attrs.evolve(serving, pp_rank=stage),
            gpu=gpu,
            gpu_memory=gpu_memory,
            runtime_memory=runtime_memory,
            weights_memory=inputs.weights_memory,
            reserved_memory=inputs.reserved_memory,
            draft_model=draft_model,
            registry=registry,
            sync_stages=False,
        )
        budget = own.budget
        assert budget.free_bytes is not None and budget.weights_bytes is not None
        free.append(budget.free_bytes)
        weights.append(budget.weights_bytes)
        fraction, platform = budget.mem_fraction_static, own.serving.platform
        capability = own.serving.platform_traits.compute_capability if own.serving.platform_traits else None
    assert platform is not None  # pp_size >= 1: at least one stage was planned
    # the GPU's compute capability stays known to the stages planned on the agreed budget (resolve_platform_traits)
    known = PlatformTraits(platform=platform, compute_capability=capability) if capability is not None else None
    on_gpu = attrs.evolve(
        serving, platform=platform, mem_fraction_static=fraction, platform_traits=known, workspaces=()
    )
    return on_gpu, free, weights


def _spec(model: str | ModelSpec, registry: Registry) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_model(model, registry)[0]


# ---------------------------------------------------------------------------
# the layer split
# ---------------------------------------------------------------------------


def suggest_partition(
    model: str | ModelSpec,
    serving: Serving,
    stage_budgets: Sequence[Budget],
    current_tokens: int,
    *,
    draft_model: str | ModelSpec | None = None,
    registry: Registry | None = None,
) -> PartitionSuggestion | None:
    """The contiguous layer split whose smallest stage holds the most tokens, or ``None`` if none beats
    ``current_tokens``.

    Each stage keeps ``stage_budgets[stage]`` (weights that move with their
    layers are not re-charged: re-plan with the split to confirm on a profiled
    budget).  A stage's tokens fall as it takes more layers, so for a target
    count the stages greedily take the most layers that still hold it, and a
    binary search finds the largest target some split reaches.  Every
    candidate is planned, never extrapolated, and the split returned is
    planned once more, stage by stage, as the engine would run it.
    """
    registry = registry or get_registry()
    layers, stages = _spec(model, registry).num_layers, serving.pp_size
    if layers < stages:
        return None
    cache: dict[tuple[tuple[int, ...], int], int] = {}

    def stage_tokens(head: tuple[int, ...], count: int) -> int:
        """Tokens of the stage after ``head`` holding ``count`` layers (the rest spread evenly); -1 if refused."""
        key = (head, count)
        if key not in cache:
            stage = len(head)
            rest, later = layers - sum(head) - count, stages - stage - 1
            tail = tuple(b - a for a, b in (pp_layer_range(rest, r, later) for r in range(later))) if later else ()
            cache[key] = _tokens_or_refused(
                model, serving, stage, (*head, count, *tail), stage_budgets[stage], draft_model, registry
            )
        return cache[key]

    def holds(head: tuple[int, ...], target: int, count: int) -> bool:
        return stage_tokens(head, count) >= target

    def split_for(target: int) -> tuple[int, ...] | None:
        head: tuple[int, ...] = ()
        for stage in range(stages - 1):
            most = layers - sum(head) - (stages - stage - 1)
            count = _largest(functools.partial(holds, head, target), most)
            if count == 0:
                return None
            head = (*head, count)
        last = layers - sum(head)
        return (*head, last) if stage_tokens(head, last) >= target else None

    best: tuple[int, ...] | None = None
    low, high = current_tokens + 1, 2 * current_tokens + 1
    while (found := split_for(high)) is not None:
        best, low, high = found, high + 1, 2 * high
    while low <= high:
        middle = (low + high) // 2
        found = split_for(middle)
        if found is None:
            high = middle - 1
        else:
            best, low = found, middle + 1
    if best is None:
        return None
    reached = min(
        _tokens_or_refused(model, serving, stage, best, stage_budgets[stage], draft_model, registry)
        for stage in range(stages)
    )
    if reached <= current_tokens:
        return None
    return PartitionSuggestion(partition=best, tokens=reached, gained_tokens=reached - current_tokens)


def _tokens_or_refused(
    model: str | ModelSpec,
    serving: Serving,
    stage: int,
    partition: tuple[int, ...],
    budget: Budget,
    draft_model: str | ModelSpec | None,
    registry: Registry,
) -> int:
    try:
        stage_serving = attrs.evolve(serving, pp_rank=stage, pp_layer_partition=partition)
        return _stage_plan(model, stage_serving, budget, draft_model, registry).max_total_num_tokens
    except KvpoolsError:
        return -1


def _largest(holds: Callable[[int], bool], most: int) -> int:
    """The largest ``n`` in ``1..most`` for which ``holds`` (monotone: true up to some n), else 0."""
    low, high, found = 1, most, 0
    while low <= high:
        middle = (low + high) // 2
        if holds(middle):
            found, low = middle, middle + 1
        else:
            high = middle - 1
    return found


# ---------------------------------------------------------------------------
# on a process group
# ---------------------------------------------------------------------------


_ROUNDS = {
    "inputs": "their budget inputs and the fingerprint of the model and serving options",
    "own": "the token count each rank holds alone",
    "agreed": "the bytes each rank plans at the agreed token count",
}


def plan_on_group(
    model: str | ModelSpec,
    serving: Serving | None = None,
    *,
    group: Any = None,
    memory: int | float | str | None = None,
    device: str | None = None,
    free_memory: int | float | str | None = None,
    weights_memory: int | float | str | None = None,
    reserved_memory: int | float | str | None = None,
    draft_model: str | ModelSpec | None = None,
    registry: Registry | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> RankPlan:
    """Plan this process's rank of a ``torch.distributed`` group and agree with the others.

    Every rank of ``group`` (the default group when ``None``) calls this with
    its own budget inputs — ``free_memory`` stated, or measured on ``device``
    by its platform plugin, ``weights_memory`` its own weights — and the same
    model and serving options.  Its rank in the group places it
    (:class:`RankId`); the group must have ``tp_size * pp_size`` ranks.  The
    ranks exchange their values through the group's key-value store in three
    rounds (:mod:`kvpools_core.planning.rank_exchange`), each rank's own work run inside
    a ``try`` and every wait bounded by ``timeout`` seconds; every rank returns
    the same token count and the same :class:`Agreement`, or raises the same
    :class:`~kvpools_core.errors.DistributedPlanError`, naming the ranks at
    fault: :class:`~kvpools_core.errors.RankFailedError` (a rank raised: its
    error type and message), :class:`~kvpools_core.errors.RankTimeoutError` (a
    rank exited, hangs or never called) or
    :class:`~kvpools_core.errors.RankMismatchError` (a rank plans another model
    or other serving options: the first field that differs).
    """
    registry = registry or get_registry()
    serving = serving or Serving()
    exchange = RankExchange.on_group(group, timeout, _ROUNDS)
    world, rank = exchange.world, exchange.rank

    def inputs() -> tuple[tuple[Serving, bool, int | None], dict[str, Any]]:
        if world != serving.tp_size * serving.pp_size:
            raise ConfigError(
                f"The process group has {world} ranks, but {option('tp_size')} {serving.tp_size} x "
                f"{option('pp_size')} {serving.pp_size} places {serving.tp_size * serving.pp_size}: plan on the "
                f"engine's own group."
            )
        stage = attrs.evolve(serving, pp_rank=RankId.of(rank, serving).pp_rank)
        free = None
        if memory is None:
            if free_memory is not None:
                free = parse_bytes(free_memory, option("free_memory"))
            elif device is not None:
                free, _ = measure_free_bytes(device, stage, registry)
            else:
                raise ConfigError(
                    f"Rank {rank} has no budget: give it {option('memory')}, {option('free_memory')} or "
                    f"{option('device')}."
                )
        weights = parse_bytes(weights_memory or 0, option("weights_memory"))
        spec = _spec(model, registry)
        document = fingerprint_document(spec, serving, None if draft_model is None else _spec(draft_model, registry))
        exchange.share("inputs", document)
        return (stage, spec.is_multimodal, free), {
            "fingerprint": fingerprint(document),
            "free": free,
            "weights": weights,
        }

    (stage, multimodal, free), shared = exchange.round("inputs", inputs)
    mismatch = mismatch_error(exchange, [s["fingerprint"] for s in shared], lambda r: exchange.shared("inputs", r))
    if mismatch is not None:
        raise mismatch
    _check_same_budget_kind(exchange, [s["free"] is not None for s in shared])
    reduced_free = reduced_pre = None
    if free is not None and serving.accounting == "sglang":  # SGLang's float32 MINs, before and after loading
        reduced_pre = min(float32(s["free"]) for s in shared)
        reduced_free = min(float32(s["free"] - s["weights"]) for s in shared)

    def own_plan() -> tuple[tuple[Budget, Plan], dict[str, int]]:
        if free is None:
            budget = resolve_budget(stage, registry, memory=memory, multimodal=multimodal)
        else:
            weights = shared[rank]["weights"]
            budget = resolve_budget(
                stage,
                registry,
                free_memory=free if reduced_free is None else reduced_free + weights,
                weights_memory=weights,
                reserved_memory=reserved_memory,
                pre_model_load_memory=free if reduced_pre is None else reduced_pre,
                multimodal=multimodal,
            )
        own = _stage_plan(model, stage, budget, draft_model, registry)
        row = {
            "tokens": own.max_total_num_tokens,
            "budget_bytes": own.budget.budget_bytes,
            "bytes_per_token": own.cell.bytes_per_token,
        }
        return (budget, own), row

    (budget, own), rows = exchange.round("own", own_plan)
    agreed = min(row["tokens"] for row in rows)
    bound_by = _bound_by([row["tokens"] for row in rows])

    def agreed_plan() -> tuple[Plan, int]:
        final = _agreed_plan(own, agreed, model, stage, budget, draft_model, registry, bound_by)
        return final, final.planned_bytes

    final, planned = exchange.round("agreed", agreed_plan)
    spec = own.model
    agreement = Agreement(
        accounting=serving.accounting,
        tokens=agreed,
        bound_by=bound_by,
        ranks=tuple(
            RankRow(
                id=(who := RankId.of(r, serving)),
                layers=pp_layer_range(spec.num_layers, who.pp_rank, serving.pp_size, serving.pp_layer_partition),
                bytes_per_token=rows[r]["bytes_per_token"],
                budget_bytes=rows[r]["budget_bytes"],
                own_tokens=rows[r]["tokens"],
                planned_bytes=planned[r],
            )
            for r in range(world)
        ),
        reduced_free_bytes=reduced_free,
        reduced_pre_load_bytes=reduced_pre,
    )
    return RankPlan(rank=rank, plan=final, agreement=agreement)


def _check_same_budget_kind(exchange: RankExchange, profiled: Sequence[bool]) -> None:
    """Every rank profiled (free memory stated or measured) or every rank on explicit memory: never a mix."""
    if all(profiled) or not any(profiled):
        return
    measured = [r for r, p in enumerate(profiled) if p]
    explicit = [r for r, p in enumerate(profiled) if not p]
    verb = "gives" if len(measured) == 1 else "give"
    raise RankMismatchError(
        f"{exchange.where()}: {describe_ranks(measured)} {verb} a profiled budget ({option('free_memory')} or "
        f"{option('device')}) and {describe_ranks(explicit)} an explicit one ({option('memory')}). "
        f"Give every rank the same kind: the engine profiles all ranks alike.",
        ranks=[r for r, p in enumerate(profiled) if p != profiled[0]],
    )
