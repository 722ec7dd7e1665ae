"""The conformance checks an architecture plugin must pass, as plain functions.

Each check raises :class:`ConformanceFailure` with what broke and the
``kvpools plan`` command line that reproduces it (the case's config written
beside it), so a hypothesis-shrunk failure is one copy-paste from a
debugger.  The pytest suite (:mod:`kvpools_core.testing.suite`) drives them;
plugin authors may call them from their own tests too.

The invariants are the ones every built-in plugin obeys: an exact plan never
exceeds its budget and fills a large one; ``build(plan, "meta")`` allocates
exactly the planned bytes per pool; more memory never gives fewer tokens; a
larger TP never gives more bytes per token per rank; token counts are whole
pages; a plan survives JSON; provenance names the plugin; a plugin declines
configs it does not own, names the field of a malformed config, names an
option in every refusal, and honours the kv dtype and TP.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from kvpools_core.errors import ConfigError, InsufficientMemoryError, KvpoolsError, UnsupportedCombinationError
from kvpools_core.registry import Registry
from kvpools_core.values import ModelSpec, Plan, Serving

__all__ = [
    "FULL_USE",
    "MALFORMABLE_FIELDS",
    "Case",
    "ConformanceFailure",
    "check_arenas",
    "check_build",
    "check_claims",
    "check_declines",
    "check_fills_a_large_budget",
    "check_honours_kv_dtype_and_tp",
    "check_malformed_field",
    "check_more_memory",
    "check_plan",
    "check_tp_monotone",
    "model_of",
    "option_names",
    "parse_alone",
]

FULL_USE = 0.999
"""An exact plan of a large budget uses at least this share of it."""
MALFORMABLE_FIELDS = (
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "sliding_window",
    "index_head_dim",
)
"""Config fields whose malformed value (a string, a negative number) the owning plugin must name."""
_RESOLVED = {"platform_traits", "workspaces"}


class ConformanceFailure(AssertionError):
    """A broken invariant, with the case that breaks it and the command line that replays it."""


@attrs.frozen
class Case:
    """One generated case: a plugin's config (a preset, perhaps changed), serving options, a budget."""

    plugin: str
    name: str
    config: Mapping[str, Any] = attrs.field(eq=False)
    serving: Serving
    memory: int

    def config_path(self) -> Path:
        """The config written to a stable temporary file (named by its content), for the command line."""
        text = json.dumps(self.config, indent=2, sort_keys=True, default=str)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        folder = Path(tempfile.gettempdir()) / "kvpools-conformance"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}-{digest}.json"
        if not path.exists():
            path.write_text(text)
        return path

    def command_line(self, memory: int | None = None, **changes: Any) -> str:
        """``kvpools plan <config> --memory N --platform P ...``: this case, as a user would type it."""
        serving = attrs.evolve(self.serving, **changes) if changes else self.serving
        return _command_line(str(self.config_path()), serving, memory if memory is not None else self.memory)

    def fail(self, message: str, memory: int | None = None, **changes: Any) -> ConformanceFailure:
        return ConformanceFailure(
            f"plugin {self.plugin!r}, config {self.name!r}: {message}\n"
            f"  reproduce: {self.command_line(memory, **changes)}"
        )


def _command_line(model: str, serving: Serving, memory: int) -> str:
    defaults = Serving()
    args = ["kvpools", "plan", model, "--memory", str(memory)]
    for field in attrs.fields(Serving):
        value = getattr(serving, field.name)
        if field.name in _RESOLVED or value == getattr(defaults, field.name):
            continue
        flag = "--" + field.name.replace("_", "-")
        if field.name == "plugin_options":
            args += [f"--plugin-option {key}={item}" for key, item in value.items()]
        elif field.name == "pp_layer_partition":
            args += [flag, ",".join(map(str, value))]
        elif value is True:
            args.append(flag)
        else:
            args += [flag, str(value)]
    return " ".join(args)


def option_names() -> set[str]:
    """Every serving option as users spell it (``page_size``, ``--page-size``) and the budget options."""
    names = {field.name for field in attrs.fields(Serving)} - _RESOLVED
    names |= {"memory", "free_memory", "device", "draft_model", "weights_memory", "reserved_memory"}
    return names | {"--" + name.replace("_", "-") for name in names}


# -- parsing ------------------------------------------------------------------------------


def parse_alone(registry: Registry, config: Mapping[str, Any], source: str) -> ModelSpec | None:
    """The claim of the one plugin in ``registry`` (``parse_model_config`` collects every claim)."""
    claims = registry.call_collect("parse_model_config", config=config, source=source)
    return claims[0][1] if claims else None


def check_claims(plugin: str, name: str, config: Mapping[str, Any], own: Registry) -> ModelSpec:
    """The plugin claims its own preset (``own``: a registry holding the plugin alone)."""
    try:
        spec = parse_alone(own, config, f"preset:{name}")
    except KvpoolsError as exc:
        raise ConformanceFailure(f"plugin {plugin!r} refuses its own preset {name!r}: {exc}") from exc
    if spec is None:
        raise ConformanceFailure(f"plugin {plugin!r} declines its own preset {name!r} (parse_model_config -> None)")
    return spec


def check_declines(plugin: str, name: str, config: Mapping[str, Any], own: Registry) -> None:
    """A config another plugin owns is declined (``None``): not claimed, not crashed on."""
    try:
        spec = parse_alone(own, config, f"preset:{name}")
    except Exception as exc:
        raise ConformanceFailure(
            f"plugin {plugin!r} crashed on {name!r}, a config it does not own ({type(exc).__name__}: {exc}); "
            f"parse_model_config returns None for configs it does not recognise."
        ) from exc
    if spec is not None:
        raise ConformanceFailure(
            f"plugin {plugin!r} claims {name!r}, a config another plugin owns (as architecture "
            f"{spec.architecture!r}); return None for configs it does not own."
        )


def check_malformed_field(plugin: str, name: str, config: Mapping[str, Any], field: str, own: Registry) -> None:
    """A malformed value of a field the plugin reads raises the project's ``ConfigError`` naming the field.

    A field the plugin does not read may be ignored (the spec is then unchanged).
    """
    baseline = parse_alone(own, config, f"preset:{name}")
    for bad in ("not-a-number", -1):
        broken = {**config, field: bad}
        try:
            spec = parse_alone(own, broken, f"preset:{name}")
        except ConfigError as exc:
            if field not in str(exc):
                raise ConformanceFailure(
                    f"plugin {plugin!r}: {field}={bad!r} in {name!r} raised a ConfigError that does not name "
                    f"the field: {exc}"
                ) from exc
            continue
        except Exception as exc:
            raise ConformanceFailure(
                f"plugin {plugin!r}: {field}={bad!r} in {name!r} raised {type(exc).__name__}: {exc}; a malformed "
                f"field raises kvpools_core.errors.ConfigError naming it (use kvpools_core.config.ConfigReader)."
            ) from exc
        if spec != baseline:
            raise ConformanceFailure(
                f"plugin {plugin!r} accepted {field}={bad!r} in {name!r} and produced a different model; a "
                f"malformed field raises kvpools_core.errors.ConfigError naming it."
            )


# -- planning -----------------------------------------------------------------------------


def check_plan(case: Case, registry: Registry) -> Plan | None:
    """Plan the case: refusals name an option; a plan is within budget, whole pages, JSON-stable, the plugin's.

    Returns the plan, or None when the plugin refused the combination or the
    budget holds no page (both legitimate answers for a generated case).
    """
    from kvpools_core.pipeline import plan

    try:
        result = plan(_spec(case, registry), case.serving, memory=case.memory, registry=registry)
    except UnsupportedCombinationError as exc:
        names = option_names()
        if not any(name in str(exc) for name in names):
            raise case.fail(f"a refusal names no serving option: {exc}") from exc
        return None
    except InsufficientMemoryError:
        return None
    except KvpoolsError as exc:
        raise case.fail(f"planning failed with {type(exc).__name__}: {exc}") from exc
    if result.provenance.get("parse_model_config") != (case.plugin,):
        raise case.fail(f"provenance says {result.provenance.get('parse_model_config')} parsed the model")
    if result.serving.accounting == "exact" and result.planned_bytes > result.budget.budget_bytes:
        raise case.fail(f"the exact plan needs {result.planned_bytes:,} B, over its {result.budget.budget_bytes:,} B")
    page = result.serving.page_size
    if result.max_total_num_tokens % page:
        raise case.fail(f"{result.max_total_num_tokens:,} tokens are not whole pages of {page}")
    if Plan.from_json(result.to_json()) != result:
        raise case.fail("the plan does not survive Plan.from_json(plan.to_json())")
    if result.cost.bytes_for(**result.counts) != result.planned_bytes:
        raise case.fail("the plan's cost model does not add up to its planned bytes")
    check_arenas(case, result)
    return result


def check_arenas(case: Case, planned: Plan) -> None:
    """Pools that share an arena (``PoolSizing.arenas``) keep the contract of ``docs/values.md``.

    The arena is one pool of its bytes and no arena's member; its sub-pools are exactly the pools that name it
    (``PoolSpec.arena``), their cost groups name it too, and each sub-pool's index space is ``bytes // entry``
    slots of which the first ``ceil(sink / entry)`` are the sink, with room past it, and a state sub-pool's parts
    (when it says them) fill its entry; at the plan's counts the
    sink and the members' draw fit the arena (``Plan.problems``).  Vacuous for a plan without arenas.
    """
    found = [problem for problem in planned.problems() if "arena" in problem]
    for arena in planned.sizing.arenas:
        for sub in arena.sub_pools:
            group = planned.cost.group(sub.pool)
            if group.arena != arena.name:
                found.append(f"the cost group of sub-pool {sub.pool!r} names arena {group.arena!r}, not {arena.name!r}")
            if sub.max_slots != arena.bytes // sub.entry_bytes:
                found.append(f"sub-pool {sub.pool!r}: max_slots {sub.max_slots} != {arena.bytes} // {sub.entry_bytes}")
            if sub.min_slot_index != -(-arena.sink_bytes // sub.entry_bytes) or sub.min_slot_index >= sub.max_slots:
                found.append(f"sub-pool {sub.pool!r}: first slot {sub.min_slot_index} is not just past the sink")
            if sub.kind == "state" and sub.row_bytes and sub.layer_num * sum(sub.row_bytes) != sub.entry_bytes:
                found.append(
                    f"state sub-pool {sub.pool!r}: {sub.layer_num} layer(s) of parts {sub.row_bytes} B do not fill "
                    f"its {sub.entry_bytes} B entry"
                )
    if found:
        raise case.fail("the plan's arena breaks its contract: " + " ".join(found))


def check_build(case: Case, planned: Plan, registry: Registry) -> Any:
    """``build(plan, "meta")`` allocates exactly the planned bytes, pool by pool; returns the built ``Pools``."""
    from kvpools_core.building import build

    try:
        pools = build(planned, "meta", registry=registry)
    except KvpoolsError as exc:
        raise case.fail(f"build(plan, 'meta') failed: {type(exc).__name__}: {exc}") from exc
    built, want = pools.allocated_by_pool(), {p.name: p.bytes for p in planned.pools if p.arena is None}
    if built != want:
        differ = {n: (want.get(n), built.get(n)) for n in set(built) | set(want) if built.get(n) != want.get(n)}
        raise case.fail(f"built bytes differ from the plan (pool: planned, built): {differ}")
    return pools


def check_more_memory(case: Case, planned: Plan, registry: Registry) -> None:
    """Twice the memory never gives fewer tokens (in any token space) or fewer requests."""
    from kvpools_core.pipeline import plan

    bigger = plan(_spec(case, registry), case.serving, memory=2 * case.memory, registry=registry)
    for space, tokens in planned.counts["tokens"].items():
        if bigger.counts["tokens"].get(space, 0) < tokens:
            raise case.fail(
                f"twice the memory gives fewer {space} tokens ({bigger.counts['tokens'].get(space, 0):,} < {tokens:,})",
                memory=2 * case.memory,
            )


def check_tp_monotone(case: Case, tp_sizes: list[int], registry: Registry) -> None:
    """A larger TP never gives more bytes per token per rank."""
    from kvpools_core.pipeline import plan

    previous: tuple[int, int] | None = None
    spec = _spec(case, registry)
    for tp in tp_sizes:
        serving = attrs.evolve(
            case.serving, tp_size=tp, dp_size=1, enable_dp_attention=False, max_running_requests=None
        )
        try:
            cell = plan(spec, serving, memory=case.memory, registry=registry).cell
        except (UnsupportedCombinationError, InsufficientMemoryError):
            continue
        if previous is not None and cell.bytes_per_token > previous[1]:
            raise case.fail(
                f"TP {tp} stores {cell.bytes_per_token:,} B per token per rank, more than TP {previous[0]} "
                f"({previous[1]:,} B)",
                tp_size=tp,
                dp_size=1,
                enable_dp_attention=False,
            )
        previous = (tp, cell.bytes_per_token)


def check_honours_kv_dtype_and_tp(case: Case, registry: Registry) -> None:
    """fp8 stores fewer bytes per token than bf16, and TP 2 fewer than TP 1 when the KV heads of every layer that
    stores them split (layers that store no K/V — recurrent, or reading another layer's cache — do not count)."""
    from kvpools_core.pipeline import plan

    spec = _spec(case, registry)
    model = model_of(case, registry)
    base = attrs.evolve(
        case.serving,
        tp_size=1,
        dp_size=1,
        enable_dp_attention=False,
        speculative_algorithm=None,
        speculative_num_steps=None,
        speculative_eagle_topk=None,
        speculative_num_draft_tokens=None,
        speculative_draft_num_layers=None,
    )

    def cell(**changes: Any) -> Any:
        try:
            return plan(spec, attrs.evolve(base, **changes), memory=case.memory, registry=registry).cell
        except (UnsupportedCombinationError, InsufficientMemoryError):
            return None

    def says(cell: Any, option: str) -> bool:
        """A cell note naming the option: the plugin ignores it on purpose, and says so (not silently)."""
        return any(option in note or "--" + option.replace("_", "-") in note for note in cell.notes)

    bf16, fp8 = cell(kv_cache_dtype="bf16"), cell(kv_cache_dtype="fp8_e4m3")
    ignored = bf16 is not None and fp8 is not None and fp8.bytes_per_token >= bf16.bytes_per_token
    if ignored and not (says(bf16, "kv_cache_dtype") or says(fp8, "kv_cache_dtype")):
        raise case.fail(
            f"--kv-cache-dtype fp8_e4m3 stores {fp8.bytes_per_token:,} B per token, not fewer than bf16 "
            f"({bf16.bytes_per_token:,} B), and no note says why: the plugin ignores the kv dtype silently",
            kv_cache_dtype="fp8_e4m3",
        )
    kv_layers = [layer for layer in model.layers if layer.num_kv_heads]  # recurrent or shared layers store none
    splits = (
        model.num_attention_heads % 2 == 0
        and bool(kv_layers)
        and all(layer.num_kv_heads >= 2 and layer.num_kv_heads % 2 == 0 for layer in kv_layers)
    )
    if splits:
        one, two = cell(tp_size=1), cell(tp_size=2)
        if (
            one is not None
            and two is not None
            and two.bytes_per_token >= one.bytes_per_token
            and not says(two, "tp_size")
        ):
            raise case.fail(
                f"TP 2 stores {two.bytes_per_token:,} B per token per rank, not fewer than TP 1 "
                f"({one.bytes_per_token:,} B) although every layer's KV heads split, and no note says why: "
                f"the plugin ignores TP silently",
                tp_size=2,
            )


def check_fills_a_large_budget(case: Case, registry: Registry) -> None:
    """An exact plan of a large budget, uncapped, uses at least :data:`FULL_USE` of it, or is maximal.

    Maximal: one more page of tokens (what the plugin's own sizing says it
    costs) would not fit in what is left, as when one page of a wide model at
    page 256 is more than 0.1 % of the budget.
    """
    from kvpools_core.cli.build_report import _next_page_cost, explain_unused_budget
    from kvpools_core.pipeline import plan

    serving = attrs.evolve(case.serving, accounting="exact", max_total_tokens=None)
    try:
        result = plan(_spec(case, registry), serving, memory=case.memory, registry=registry)
    except (UnsupportedCombinationError, InsufficientMemoryError):
        return
    budget = result.budget.budget_bytes
    used = result.planned_bytes / budget
    if used >= FULL_USE:
        return
    more = _next_page_cost(result, registry)
    if more is not None and more[0] > budget - result.planned_bytes:
        return  # maximal: one more page would not fit (a page of a wide model is more than 0.1 % of the budget)
    reasons = "; ".join(explain_unused_budget(result, registry)) or "no reason given"
    raise case.fail(f"the exact plan uses {used:.4%} of the budget, and is not maximal ({reasons})", accounting="exact")


def model_of(case: Case, registry: Registry) -> ModelSpec:
    """The case's model as the registry parses it."""
    from kvpools_core.models import load_model

    spec, _ = load_model(_spec(case, registry), registry)
    return spec


def _spec(case: Case, registry: Registry) -> str:
    """The case's model as a user names it: its config file (so the registry's parse decides, as for users)."""
    return str(case.config_path())
