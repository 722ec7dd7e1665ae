"""``kvpools capacity``: how many requests of each context length fit, under every engine's accounting."""

from __future__ import annotations

import json
from typing import Any

import click

from kvpools_core.cli.common import (
    _budget_options,
    _capacity_json,
    _console,
    _format_option,
    _gpu_defaults,
    _host_args,
    _make_serving,
    _output_format,
    _refuse_with_trtllm,
    _refuse_with_vllm,
    _serving_options,
    _trtllm_args,
    _trtllm_options,
    _trtllm_plan,
    _user_facing,
    _vllm_args,
    _vllm_options,
    main,
)
from kvpools_core.errors import ConfigError, KvpoolsError
from kvpools_core.planning.engine_version import plan_vllm
from kvpools_core.values import (
    Serving,
)


@main.command()
@click.argument("model")
@_budget_options
@_serving_options
@click.option(
    "--context",
    "contexts",
    multiple=True,
    metavar="L",
    help="Context lengths to ask about (repeatable or comma separated; 32768, 32k, 1M) instead of the default "
    "ladder 1k ... 1M.",
)
@click.option(
    "--requests",
    "requests",
    type=int,
    default=None,
    help="Also print the largest context this many concurrent requests all reach.",
)
@click.option(
    "--headroom",
    type=float,
    default=0.1,
    show_default=True,
    help="Fraction of the binding pool the recommended SGLang flags leave free.",
)
@click.option(
    "--workload",
    default=None,
    metavar="SPEC",
    help="Also choose the split of the budget that runs the most requests of this workload at once: a context "
    "length (8k), 'lognormal:median=4096,p99=32768', 'uniform:1k..32k', or a JSONL trace of "
    '{"input_len": ..., "output_len": ...} records.',
)
@_format_option("Print one JSON object.")
@_vllm_options
@_trtllm_options
@_user_facing
def capacity(
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
    contexts: tuple[str, ...],
    requests: int | None,
    headroom: float,
    workload: str | None,
    output_format: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """How many concurrent requests of each context length fit MODEL's planned pools, and what binds.

    Also the largest context N requests all reach (--requests N), the largest single-request context, and
    --max-running-requests / --context-length flags for SGLang with --headroom of the binding pool free.
    With --workload, the split of the budget (SWA ratio, mamba state slots) that runs the most requests of
    that workload at once, against SGLang's default split, and the flags that realise it.
    """
    from kvpools_core.cli.capacity_report import CapacityReport, capacity_summary, render_capacity
    from kvpools_core.pipeline import plan as make_plan
    from kvpools_core.planning.capacity import CONTEXT_LADDER, concurrency, engine_flags, limits_of, max_context
    from kvpools_core.planning.capacity import parse_context_len as parse
    from kvpools_core.planning.split import choose_split, parse_workload

    asked = [parse(item) for text in contexts for item in text.split(",")]
    fmt = _output_format(output_format, as_json)
    if fmt == "capacity-json" and (len(asked) > 1 or requests is not None or workload is not None):
        raise ConfigError(
            "--format capacity-json states one context (--context L, default the model's context length); "
            "--requests and --workload belong to the table and --json."
        )
    as_json = fmt == "json"
    if requests is not None and requests < 1:
        raise ConfigError(f"--requests must be at least 1, got {requests}.")
    if not 0 <= headroom < 1:
        raise ConfigError(f"--headroom must be a fraction in [0, 1), e.g. 0.1 for 10%; got {headroom}.")
    trtllm_args = _trtllm_args(options)
    vllm_args = _vllm_args(options)
    if options["accounting"] == "vllm":
        _refuse_with_vllm(
            device=device,
            free_memory=free_memory,
            reserved_memory=reserved_memory,
            runtime_memory=runtime_memory,
            speculative_draft_model_path=draft_model,
            requests=requests,
            workload=workload,
            format_capacity_json=fmt == "capacity-json",
        )
        _vllm_capacity(
            model, _make_serving(options, None), memory, gpu, gpu_memory, weights_memory, vllm_args, asked, as_json
        )
        return
    if options["accounting"] == "trtllm":
        _refuse_with_trtllm(
            device=device,
            free_memory=free_memory,
            reserved_memory=reserved_memory,
            runtime_memory=runtime_memory,
            speculative_draft_model_path=draft_model,
            requests=requests,
            workload=workload,
            format_capacity_json=fmt == "capacity-json",
        )
        _trtllm_capacity(
            model, _make_serving(options, None), memory, gpu, gpu_memory, weights_memory, trtllm_args, asked, as_json
        )
        return
    parsed_workload = parse_workload(workload) if workload is not None else None
    _gpu_defaults(options, gpu, gpu_memory)
    host = _host_args(options)
    serving = _make_serving(options, device)
    budget: dict[str, Any] = {
        "memory": memory,
        "device": device,
        "free_memory": free_memory,
        "weights_memory": weights_memory,
        "reserved_memory": reserved_memory,
        "draft_model": draft_model,
        "gpu": gpu,
        "gpu_memory": gpu_memory,
        "runtime_memory": runtime_memory,
    }
    if serving.enable_unified_memory:
        if fmt == "capacity-json" or requests is not None:
            raise ConfigError(
                "--enable-unified-memory answers the table and --json (requests per context length in the arena and "
                "the three-mode comparison); --format capacity-json and --requests are not modelled for it yet."
            )
        from kvpools_core.cli.unified_report import unified_capacity

        unified_capacity(model, serving, budget, asked or [8192, 32768], parsed_workload, as_json)
        return
    if fmt == "capacity-json":
        _capacity_json(model, serving, {**budget, **host}, asked[0] if asked else None)
        return
    result = make_plan(model, serving, **budget, **host)
    limits = limits_of(result)
    flags_context = max([c for c in asked if c <= limits.context_len], default=limits.context_len)
    try:
        flags, flags_error = engine_flags(result, flags_context, headroom), None
    except KvpoolsError as error:
        flags, flags_error = None, str(error)
    report = CapacityReport(
        plan=result,
        limits=limits,
        ladder=tuple(concurrency(result, length) for length in (asked or CONTEXT_LADDER)),
        single_request=max_context(result, 1),
        concurrent=max_context(result, requests) if requests is not None else None,
        flags=flags,
        flags_error=flags_error,
        split=choose_split(model, serving, budget, parsed_workload) if parsed_workload is not None else None,
    )
    if as_json:
        click.echo(json.dumps(capacity_summary(report), indent=2))
    else:
        render_capacity(report, _console())


def _vllm_capacity(
    model: str,
    serving: Serving,
    memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    weights_memory: str | None,
    args: dict[str, Any],
    asked: list[int],
    as_json: bool,
) -> None:
    """``kvpools capacity --accounting vllm``: vLLM's ``max_concurrency`` at each context length."""
    from kvpools_core.cli.vllm_report import render_vllm_capacity
    from kvpools_core.engines.vllm.deployment import capacity_dict
    from kvpools_core.planning.capacity import CONTEXT_LADDER

    result = plan_vllm(model, serving, memory, gpu, gpu_memory, weights_memory, args)
    contexts = asked or [length for length in CONTEXT_LADDER if length <= result.max_model_len]
    if as_json:
        click.echo(json.dumps(capacity_dict(result, contexts), indent=2))
    else:
        render_vllm_capacity(result, contexts, _console())


def _trtllm_capacity(
    model: str,
    serving: Serving,
    memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    weights_memory: str | None,
    args: dict[str, Any],
    asked: list[int],
    as_json: bool,
) -> None:
    """``kvpools capacity --accounting trtllm``: the requests TensorRT-LLM's pools hold at each context length."""
    from kvpools_core.cli.trtllm_report import render_trtllm_capacity
    from kvpools_core.engines.trtllm.deployment import capacity_dict
    from kvpools_core.planning.capacity import CONTEXT_LADDER

    result = _trtllm_plan(model, serving, memory, gpu, gpu_memory, weights_memory, args)
    contexts = asked or [length for length in CONTEXT_LADDER if length <= result.max_seq_len]
    if as_json:
        click.echo(json.dumps(capacity_dict(result, contexts), indent=2))
    else:
        render_trtllm_capacity(result, contexts, _console())
