"""``kvpools plan``: one plan (or every rank's with ``--all-ranks``), as a report, JSON or a capacity record."""

from __future__ import annotations

import json
from typing import Any

import click

from kvpools_core.cli.common import (
    _budget_options,
    _capacity_json,
    _compare,
    _compare_option,
    _comparison_json,
    _console,
    _format_option,
    _gpu_defaults,
    _host_args,
    _make_serving,
    _output_format,
    _refuse_with_trtllm,
    _refuse_with_vllm,
    _render_comparison,
    _serving_options,
    _trtllm_args,
    _trtllm_options,
    _trtllm_plan,
    _user_facing,
    _vllm_args,
    _vllm_options,
    main,
    resolve_accounting,
)
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.planning.engine_version import plan_vllm
from kvpools_core.values import (
    Serving,
)


@main.command()
@click.argument("model")
@_budget_options
@_serving_options
@_format_option("Print one JSON object (loads back with Plan.from_json).")
@click.option(
    "--context",
    "context",
    default=None,
    metavar="L",
    help="The context length the capacity record states its concurrency at (32768, 32k, 1M); only with "
    "--format capacity-json.  [default: the model's context length]",
)
@_compare_option
@_vllm_options
@_trtllm_options
@click.option(
    "--all-ranks",
    is_flag=True,
    help="Plan every (PP, TP) rank and show what they agree on; --memory, --free-memory and --weights-memory "
    "then take one value or one per pipeline stage (comma separated).",
)
@_user_facing
def plan(
    model: str,
    memory: str | None,
    device: str | None,
    free_memory: str | None,
    weights_memory: str | None,
    reserved_memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    runtime_memory: str | None,
    draft_model: str | None,
    output_format: str | None,
    as_json: bool,
    context: str | None,
    compare_platform: str | None,
    all_ranks: bool,
    **options: Any,
) -> None:
    """Plan the KV-cache pools of MODEL (a preset, a config.json or a directory holding one)."""
    from kvpools_core.cli.plan_report import plan_summary, render_plan
    from kvpools_core.engines import engine_for
    from kvpools_core.planning.capacity import parse_context_len

    fmt = _output_format(output_format, as_json)
    trtllm_args = _trtllm_args(options)
    vllm_args = _vllm_args(options)
    if options["accounting"] == "vllm":
        _refuse_with_vllm(
            device=device,
            free_memory=free_memory,
            reserved_memory=reserved_memory,
            runtime_memory=runtime_memory,
            speculative_draft_model_path=draft_model,
            context=context,
            compare_platform=compare_platform,
            all_ranks=all_ranks,
            format_capacity_json=fmt == "capacity-json",
        )
        result = plan_vllm(model, _make_serving(options, None), memory, gpu, gpu_memory, weights_memory, vllm_args)
        if fmt == "json":
            click.echo(json.dumps(result.to_dict(), indent=2))
        else:
            from kvpools_core.cli.vllm_report import render_vllm_plan

            render_vllm_plan(result, _console())
        return
    if options["accounting"] == "trtllm":
        _refuse_with_trtllm(
            device=device,
            free_memory=free_memory,
            reserved_memory=reserved_memory,
            runtime_memory=runtime_memory,
            speculative_draft_model_path=draft_model,
            context=context if fmt != "capacity-json" else None,
            compare_platform=compare_platform,
            all_ranks=all_ranks,
        )
        trt = _trtllm_plan(model, _make_serving(options, None), memory, gpu, gpu_memory, weights_memory, trtllm_args)
        if fmt == "capacity-json":
            from kvpools_core.planning.capacity_record import trtllm_capacity_document

            if getattr(trt, "context_parallel", None) is not None:
                raise UnsupportedCombinationError(
                    "kvpools does not model the capacity record of helix context parallelism yet (a request's "
                    "blocks split over the CP ranks); use kvpools plan --accounting trtllm --json or kvpools capacity."
                )

            length = parse_context_len(context) if context is not None else None
            click.echo(json.dumps(trtllm_capacity_document(trt, context_len=length), indent=2))
            return
        if fmt == "json":
            click.echo(json.dumps(trt.to_dict(), indent=2))
        else:
            from kvpools_core.cli.trtllm_report import render_trtllm_plan

            render_trtllm_plan(trt, _console())
        return
    engine = resolve_accounting(options["accounting"]) if options["accounting"] else None
    if engine is not None and engine.distribution != "kvpools":
        _plan_other_engine(
            engine,
            model,
            options,
            memory,
            fmt,
            others={
                "--device": device,
                "--free-memory": free_memory,
                "--weights-memory": weights_memory,
                "--reserved-memory": reserved_memory,
                "--gpu": gpu,
                "--gpu-memory": gpu_memory,
                "--runtime-memory": runtime_memory,
                "--speculative-draft-model-path": draft_model,
                "--context": context,
                "--compare-platform": compare_platform,
                "--all-ranks": all_ranks or None,
            },
        )
        return
    if context is not None and fmt != "capacity-json":
        raise ConfigError("--context states the context of the capacity record: use it with --format capacity-json.")
    if compare_platform is not None and fmt == "capacity-json":
        raise ConfigError("--compare-platform reports on the plan: use it with --format table or json.")
    _gpu_defaults(options, gpu, gpu_memory)
    host = _host_args(options)
    serving = _make_serving(options, device)
    if all_ranks:
        _plan_all_ranks(
            model,
            serving,
            memory,
            device,
            free_memory,
            weights_memory,
            reserved_memory,
            draft_model,
            fmt,
            parse_context_len(context) if context is not None else None,
            compare_platform,
            gpu=gpu,
            gpu_memory=gpu_memory,
            runtime_memory=runtime_memory,
        )
        return
    budget: dict[str, Any] = dict(
        memory=memory,
        device=device,
        free_memory=free_memory,
        weights_memory=weights_memory,
        reserved_memory=reserved_memory,
        draft_model=draft_model,
        gpu=gpu,
        gpu_memory=gpu_memory,
        runtime_memory=runtime_memory,
    )
    if fmt == "capacity-json":
        _capacity_json(model, serving, {**budget, **host}, parse_context_len(context) if context is not None else None)
        return
    as_json = fmt == "json"
    result = engine_for(serving.accounting).plan(model, serving, **budget, **host)
    comparison = _compare(model, serving, {**budget, **host}, compare_platform)
    if as_json:
        summary = plan_summary(result)
        if comparison is not None:
            summary["comparison"] = _comparison_json(result, comparison)
        click.echo(json.dumps(summary, indent=2))
    else:
        render_plan(result, _console())
        _render_comparison(result, comparison)


def _plan_other_engine(
    engine: Any, model: str, options: dict[str, Any], memory: str | None, fmt: str, others: dict[str, Any]
) -> None:
    """``--accounting`` of an installed third-party engine plugin: its ``plan`` at ``--memory`` (the KV budget
    per rank as that engine reads it), shown through its ``capacity`` summary; kvpools' own budget and report
    flags have no meaning for an engine kvpools does not ship, and are refused by name."""
    from kvpools_core.models import load_model
    from kvpools_core.registry import get_registry

    given = [flag for flag, value in others.items() if value is not None]
    if given or memory is None or fmt == "capacity-json":
        refused = ", ".join(given) or ("--format capacity-json" if fmt == "capacity-json" else "no --memory")
        raise ConfigError(
            f"--accounting {options['accounting']} is the {engine.name!r} engine's ({engine.distribution} "
            f"{engine.version}): kvpools plans it from --memory SIZE (its KV budget per rank) alone, with "
            f"--format table or json; got {refused}."
        )
    registry = get_registry()
    spec, _ = load_model(model, registry)
    serving = _make_serving(options, None)
    summary = engine.capacity(engine.plan(spec, serving, memory=memory, registry=registry))
    if fmt == "json":
        click.echo(json.dumps({"engine": engine.name, "version": engine.version, **summary.to_dict()}, indent=2))
        return
    click.echo(
        f"{spec.name} under --accounting {summary.accounting} ({engine.name} {engine.version}, {engine.summary})"
    )
    click.echo(f"  KV budget:   {summary.budget_bytes:,} B")
    click.echo(f"  KV cache:    {summary.kv_bytes:,} B")
    click.echo(f"  max tokens:  {summary.max_tokens:,}")
    if summary.max_requests is not None:
        click.echo(f"  max requests: {summary.max_requests:,}")


def _per_stage(value: str | None) -> str | list[str] | None:
    """``--all-ranks`` sizes: one value for every rank, or a comma-separated list with one per stage."""
    if value is None or "," not in value:
        return value
    return [item.strip() for item in value.split(",")]


def _plan_all_ranks(
    model: str,
    serving: Serving,
    memory: str | None,
    device: str | None,
    free_memory: str | None,
    weights_memory: str | None,
    reserved_memory: str | None,
    draft_model: str | None,
    fmt: str,
    context_len: int | None,
    compare_platform: str | None,
    *,
    gpu: str | None,
    gpu_memory: str | None,
    runtime_memory: str | None,
) -> None:
    """``--all-ranks``: the rank table, its JSON, or the capacity record of the agreed stage plans."""
    from kvpools_core.cli.ranks_report import ranks_summary, render_ranks
    from kvpools_core.planning.distributed import plan_all_ranks

    if device is not None or compare_platform is not None:
        flag = "--device" if device is not None else "--compare-platform"
        raise ConfigError(
            f"{flag} does not combine with --all-ranks: state each stage's memory with --memory or --free-memory "
            f"(one value, or one per stage); a process group measures its own "
            f"(kvpools_core.planning.distributed.plan_on_group)."
        )
    result = plan_all_ranks(
        model,
        serving,
        memory=_per_stage(memory),
        free_memory=_per_stage(free_memory),
        weights_memory=_per_stage(weights_memory),
        reserved_memory=_per_stage(reserved_memory),
        draft_model=draft_model,
        gpu=gpu,
        gpu_memory=gpu_memory,
        runtime_memory=runtime_memory,
    )
    if fmt == "capacity-json":
        from kvpools_core.planning.capacity_record import capacity_document

        stages = {p.serving.pp_rank: p for p in result.plans}
        click.echo(json.dumps(capacity_document(list(stages.values()), context_len=context_len), indent=2))
    elif fmt == "json":
        click.echo(json.dumps(ranks_summary(result), indent=2))
    else:
        render_ranks(result, _console())
