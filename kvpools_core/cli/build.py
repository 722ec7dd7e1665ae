"""``kvpools build``: plan, allocate the pools on a device, and compare planned with allocated bytes."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from kvpools_core.cli.common import (
    _budget_options,
    _compare,
    _compare_option,
    _comparison_json,
    _console,
    _gpu_defaults,
    _host_args,
    _make_serving,
    _render_comparison,
    _serving_options,
    _user_facing,
    main,
)
from kvpools_core.errors import ConfigError

_BUILD_DEVICE_HELP = (
    "Build the pools on this device: cpu, cuda, cuda:N, or meta (shapes and exact bytes, nothing allocated). "
    "Without --memory/--free-memory/--gpu the budget is measured on it too; meta needs one of them (with --gpu NAME "
    "it is planned as on that GPU)."
)


def _build_device(command: Callable[..., Any]) -> Callable[..., Any]:
    """Make ``--device`` of the budget options the (required) build device."""
    for param in getattr(command, "__click_params__", []):
        if param.name == "device":
            param.help, param.required = _BUILD_DEVICE_HELP, True
    return command


@main.command()
@click.argument("model")
@_build_device
@_budget_options
@_serving_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: planned vs allocated bytes, the plan.")
@click.option(
    "--checked-allocators",
    is_flag=True,
    help="Allocators that also refuse double frees and frees of never-allocated slots (for tests and debugging; "
    "their maps are reported apart from the plan).",
)
@_compare_option
@_user_facing
def build(
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
    as_json: bool,
    checked_allocators: bool,
    compare_platform: str | None,
    **options: Any,
) -> None:
    """Plan MODEL, then allocate its pools on --device and compare every pool's bytes with the plan."""
    from kvpools_core.building import build as build_pools
    from kvpools_core.cli.build_report import build_summary, render_build
    from kvpools_core.pipeline import plan as make_plan

    if device is None:  # click does not enforce `required` on an option declared with default=None
        raise ConfigError("kvpools build needs --device: cpu, cuda, cuda:N or meta (nothing allocated).")
    on_gpu = gpu is not None or gpu_memory is not None
    if device == "meta" and memory is None and free_memory is None and not on_gpu:
        raise ConfigError(
            "--device meta measures no memory: pass the budget as --memory, --free-memory SIZE, or --gpu NAME."
        )
    _gpu_defaults(options, gpu, gpu_memory)
    host = _host_args(options)
    serving = _make_serving(options, None if on_gpu else device)
    budget: dict[str, Any] = dict(
        memory=memory,
        device=None if device == "meta" or on_gpu else device,
        free_memory=free_memory,
        weights_memory=weights_memory,
        reserved_memory=reserved_memory,
        draft_model=draft_model,
        gpu=gpu,
        gpu_memory=gpu_memory,
        runtime_memory=runtime_memory,
    )
    result = make_plan(model, serving, **budget, **host)
    pools = build_pools(result, device, checked=checked_allocators)
    comparison = _compare(model, serving, {**budget, **host}, compare_platform)
    if as_json:
        summary = build_summary(pools)
        if comparison is not None:
            summary["comparison"] = _comparison_json(result, comparison)
        click.echo(json.dumps(summary, indent=2))
    else:
        render_build(pools, _console())
        _render_comparison(result, comparison)
