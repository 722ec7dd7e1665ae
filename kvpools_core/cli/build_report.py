"""What ``kvpools build`` reports: planned vs allocated bytes per pool, and why budget is left over.

The left-over explanation is computed, not guessed: the plan is re-sized
(through the same ``size_pools`` hook) at one more page of tokens, and the
extra bytes that page would need, pool by pool, are set against what remains
of the budget.
"""

from __future__ import annotations

from typing import Any

import attrs
from rich.console import Console
from rich.table import Table

from kvpools_core.building import Pools
from kvpools_core.cli.plan_report import platform_line
from kvpools_core.errors import KvpoolsError
from kvpools_core.options import option
from kvpools_core.registry import Registry, get_registry
from kvpools_core.units import format_bytes
from kvpools_core.values import Budget, Plan

__all__ = ["FULL_USE", "build_summary", "explain_unused_budget", "render_build"]

FULL_USE = 0.999
"""A build using at least this fraction of its budget needs no explanation."""

_HUGE_BUDGET = 1 << 62


def build_summary(pools: Pools, registry: Registry | None = None) -> dict[str, Any]:
    """The ``kvpools build --json`` object (the full plan under ``plan``, so it loads with ``Plan.from_dict``)."""
    plan = pools.plan
    budget = plan.budget.budget_bytes
    allocated = pools.allocated_bytes
    allocated_by_pool = pools.allocated_by_pool()
    planned_by_pool = {p.name: p.bytes for p in plan.pools if p.arena is None}  # an arena counts its members once
    checking = pools.checking_bytes
    planned_kinds = {name: n for name, n in allocated_by_pool.items() if not name.endswith(Pools.CHECKED_SUFFIX)}
    used = allocated / budget if budget else 1.0
    return {
        "model_name": plan.model.name,
        "device": pools.device,
        "max_total_num_tokens": plan.max_total_num_tokens,
        "max_running_requests": plan.max_running_requests,
        "allocated_bytes": allocated,
        "planned_bytes": plan.planned_bytes,
        "budget_bytes": budget,
        "budget_used": used,
        "budget_unused_bytes": budget - allocated,
        "budget_explanation": [] if FULL_USE <= used <= 1 else explain_unused_budget(plan, registry),
        # checked-mode maps are requested extras, reported apart and outside the comparison
        "matches_plan": planned_kinds == planned_by_pool and allocated - checking == plan.planned_bytes,
        "checked_allocators": pools.checked,
        "checking_bytes": checking,
        "allocated_by_pool": allocated_by_pool,
        "planned_by_pool": planned_by_pool,
        "accounting": plan.serving.accounting,
        "provenance": {hook: list(plugins) for hook, plugins in pools.provenance.items()},
        "plan_provenance": {hook: list(plugins) for hook, plugins in plan.provenance.items()},
        "host": _host_build(pools),
        "plan": plan.to_dict(),
    }


def _host_build(pools: Pools) -> dict[str, Any] | None:
    """The host tier built: planned vs allocated bytes per host pool (None without a tier)."""
    host = pools.plan.host
    if host is None:
        return None
    planned = {pool.name: pool.bytes for pool in host.pools}
    allocated = pools.host_by_pool()
    return {
        "planned_by_pool": planned,
        "allocated_by_pool": allocated,
        "planned_bytes": host.bytes_per_rank,
        "allocated_bytes": pools.host_bytes,
        "matches_plan": planned == allocated,
    }


def explain_unused_budget(plan: Plan, registry: Registry | None = None) -> list[str]:
    """Why a plan leaves budget unused (or, under SGLang accounting, exceeds it), one sentence per cause.

    Asked when less than :data:`FULL_USE` of the budget is used, or more than all of it.
    """
    serving = plan.serving
    budget, planned = plan.budget.budget_bytes, plan.planned_bytes
    remain = budget - planned
    tokens, page = plan.max_total_num_tokens, serving.page_size
    pages = f"one more page ({page} token{'s' if page > 1 else ''})"
    reasons: list[str] = []
    cap = serving.max_total_tokens
    capped = cap is not None and tokens >= cap // page * page
    if capped:
        reasons.append(f"--max-total-tokens {cap} caps the KV pools at {tokens:,} tokens.")
    pipeline = [n for n in plan.sizing.notes if n.startswith("pipeline stages")] if serving.pp_size > 1 else []
    if serving.accounting == "sglang":
        if not capped and not pipeline:
            scaled = [p for p in plan.cell.parts_of("token") if p.slot_scale > 1]
            replicated = sum(p.bytes_per_token * (p.slot_scale - 1) for p in scaled)
            reasons.append(
                f"{option('accounting')} sglang sizes tokens as budget // SGLang's cell size "
                f"({plan.cell.sglang_bytes_per_token:g} B/token), page aligned, and leaves the padding page, "
                f"request table and allocator out of it"
                + (
                    f", and the {replicated:,} B/token by which pools spanning several slots per token (the DCP "
                    f"draft pools) exceed it"
                    if replicated
                    else ""
                )
                + ": the pools "
                + (f"exceed the budget by {-remain:,} B." if remain < 0 else f"leave {remain:,} B of it unused.")
            )
        return reasons + pipeline
    step = _next_page_cost(plan, registry)
    if step is None:
        reasons.append(f"{remain:,} B remain; the sizing plugin could not say what {pages} would need.")
    elif step[0] > remain:
        need, by_pool = step
        parts = ", ".join(f"{name} +{delta:,} B" for name, delta in by_pool.items() if delta)
        reasons.append(f"{pages} would need {need:,} B ({parts}); only {remain:,} B ({format_bytes(remain)}) remain.")
    elif not capped and not pipeline:
        notes = "; ".join(plan.sizing.notes) or "none given"
        reasons.append(
            f"{pages} would need only {step[0]:,} B of the {remain:,} B remaining; "
            f"the sizing stopped at {tokens:,} tokens for a reason of its own: {notes}."
        )
    return reasons + pipeline


def render_build(pools: Pools, console: Console, registry: Registry | None = None) -> None:
    """The human report: a table planned vs allocated per pool, the budget use and who built what."""
    summary = build_summary(pools, registry)
    plan = pools.plan
    console.print(
        f"[bold]kvpools build[/bold] — {plan.model.name} on {pools.device}: "
        f"{plan.max_total_num_tokens:,} tokens, {plan.max_running_requests:,} requests"
    )
    table = Table(show_edge=False, pad_edge=False)
    for column in ("pool", "planned", "allocated", "match"):
        table.add_column(column, justify="left" if column == "pool" else "right")
    allocated_by_pool = summary["allocated_by_pool"]
    names = list(summary["planned_by_pool"]) + [n for n in allocated_by_pool if n not in summary["planned_by_pool"]]
    for name in names:
        planned = summary["planned_by_pool"].get(name)
        allocated = allocated_by_pool.get(name)
        if planned is None and name.endswith(Pools.CHECKED_SUFFIX):
            table.add_row(name, "-", _bytes(allocated), "checked mode, not planned")
            continue
        table.add_row(name, _bytes(planned), _bytes(allocated), "ok" if planned == allocated else "MISMATCH")
    table.add_row(
        "total",
        _bytes(summary["planned_bytes"]),
        _bytes(summary["allocated_bytes"]),
        "ok" if summary["matches_plan"] else "MISMATCH",
        style="bold",
    )
    console.print(table)
    host = summary["host"]
    if host is not None:
        hosted = Table(title="Host tier (HiCache)", title_justify="left", show_edge=False, pad_edge=False)
        for column in ("host pool", "planned", "allocated", "match"):
            hosted.add_column(column, justify="left" if column == "host pool" else "right")
        for name, planned in host["planned_by_pool"].items():
            allocated = host["allocated_by_pool"].get(name)
            hosted.add_row(name, _bytes(planned), _bytes(allocated), "ok" if planned == allocated else "MISMATCH")
        hosted.add_row(
            "total",
            _bytes(host["planned_bytes"]),
            _bytes(host["allocated_bytes"]),
            "ok" if host["matches_plan"] else "MISMATCH",
            style="bold",
        )
        console.print(hosted)
    console.print(
        f"[bold]budget[/bold] {summary['budget_bytes']:,} B ({format_bytes(summary['budget_bytes'])}): "
        f"{summary['budget_used'] * 100:.3f}% used, {summary['budget_unused_bytes']:,} B left"
    )
    for reason in summary["budget_explanation"]:
        console.print(f"  because {reason}")
    built = "; ".join(f"{hook}: {', '.join(by)}" for hook, by in pools.provenance.items())
    console.print(f"[bold]built by[/bold] {built}")
    console.print(f"[bold]platform[/bold] {platform_line(plan)}")
    for note in plan.cell.notes:
        console.print(f"[yellow]note[/yellow]: {note}")


def _next_page_cost(plan: Plan, registry: Registry | None) -> tuple[int, dict[str, int]] | None:
    """Extra bytes (total, per pool) of the same plan at one more page of tokens, from the sizing hook."""
    registry = registry or get_registry()
    more = plan.max_total_num_tokens + plan.serving.page_size
    serving = attrs.evolve(plan.serving, max_total_tokens=more)
    try:
        sizing, _ = registry.call_first(
            "size_pools",
            "no plugin sizes the pools.",
            model=plan.model,
            serving=serving,
            cell=plan.cell,
            budget=Budget(budget_bytes=_HUGE_BUDGET, source="explicit"),
        )
    except KvpoolsError:
        return None
    if sizing.max_total_num_tokens != more:
        return None
    before = {p.name: p.bytes for p in plan.pools}
    after = {p.name: p.bytes for p in sizing.pools}
    by_pool = {name: after.get(name, 0) - before.get(name, 0) for name in dict.fromkeys([*before, *after])}
    return sizing.planned_bytes - plan.planned_bytes, by_pool


def _bytes(value: int | None) -> str:
    return "-" if value is None else f"{value:,} ({format_bytes(value)})"
