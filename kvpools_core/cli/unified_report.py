"""``kvpools capacity --enable-unified-memory``: requests per context length in the arena, what binds, and the
three modes side by side (SGLang's static split, the best static split for the workload, unified memory)."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from kvpools_core.cli.common import _console
from kvpools_core.planning.split import Workload
from kvpools_core.values import Serving


def _answer(
    model: str, serving: Serving, budget: dict[str, Any], lengths: list[int], workload: Workload | None
) -> tuple[Any, list[Any], tuple[Any, ...]]:
    from kvpools_core.pipeline import plan as make_plan
    from kvpools_core.planning.unified import three_modes, unified_concurrency

    result = make_plan(model, serving, **budget)
    answers = [unified_concurrency(result, length) for length in lengths]
    return result, answers, three_modes(model, serving, budget, lengths, workload=workload)


def _summary(result: Any, answers: list[Any], modes: tuple[Any, ...], workload: Workload | None) -> dict[str, Any]:
    arena = result.sizing.arenas[0]
    return {
        "model": result.model.name,
        "arena": {
            "bytes": arena.bytes,
            "sink_bytes": arena.sink_bytes,
            "labels": dict(arena.labels),
            "floor_bytes": arena.floor_bytes,
            "sub_pools": [
                {"pool": s.pool, "entry_bytes": s.entry_bytes, "max_slots": s.max_slots, "grows": s.grows}
                for s in arena.sub_pools
            ],
        },
        "max_running_requests": result.max_running_requests,
        "capacity": [a.to_dict() for a in answers],
        "modes": [m.to_dict() for m in modes],
        "workload": None if workload is None else workload.source,
    }


def unified_summary(
    model: str, serving: Serving, budget: dict[str, Any], lengths: list[int], workload: Workload | None
) -> tuple[dict[str, Any], Any]:
    """The ``--json`` answer (the arena, each length's requests, the three modes) and the plan it was read from:
    what ``kvpools capacity --enable-unified-memory --json`` prints and ``kvpools serve``'s capacity answers."""
    result, answers, modes = _answer(model, serving, budget, lengths, workload)
    return _summary(result, answers, modes, workload), result


def unified_capacity(
    model: str, serving: Serving, budget: dict[str, Any], lengths: list[int], workload: Workload | None, as_json: bool
) -> None:
    """Plan once with the arena, answer each length, and compare the three modes."""
    result, answers, modes = _answer(model, serving, budget, lengths, workload)
    if as_json:
        click.echo(json.dumps(_summary(result, answers, modes, workload), indent=2))
        return
    arena = result.sizing.arenas[0]
    console = _console()
    console.print(
        f"kvpools capacity — {result.model.name}, unified memory: one {arena.bytes:,} B arena "
        f"(sink {arena.sink_bytes:,} B), request cap {result.max_running_requests:,} (per DP worker)"
    )
    table = Table("context", "requests", "binds", "bytes/request", "full tokens", "other side", title="in the arena")
    for a in answers:
        other = f"{a.other_units:,} {'state slots' if 'state' in a.other_pool else 'SWA tokens'}"
        table.add_row(
            f"{a.context_len:,}",
            f"{a.concurrent_requests:,}",
            a.binding,
            f"{a.request_bytes:,}",
            f"{a.full_tokens:,}",
            other,
        )
    console.print(table)
    modes_table = Table(
        "context",
        "SGLang static split",
        "best static split",
        "unified memory",
        "best static flags",
        title="three modes, same budget",
    )
    for m in modes:
        label = f"{m.context_len:,}" if m.context_len else (workload.source if workload else "workload")
        modes_table.add_row(
            label,
            f"{m.static:,} ({m.static_binding})",
            f"{m.best_static:,}",
            f"{m.unified:,} ({m.unified_binding})",
            m.best_static_flags,
        )
    console.print(modes_table)
    console.print(
        "note: the arena's split moves at run time: the unified column is what the arena holds with no split "
        "chosen ahead; free ids are not schedulable bytes (docs/unified-memory.md)."
    )
