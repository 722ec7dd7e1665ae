"""What a person (and a script) reads about a plan: the JSON summary and the human report."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.units import format_bytes
from kvpools_core.values import Plan, Serving


def plan_summary(plan: Plan) -> dict[str, Any]:
    """The ``--json`` object: SGLang's ``MemoryPoolConfig`` names at top level, the full plan under ``plan``."""
    sizing = plan.sizing
    charged = sum(p.bytes for p in plan.pools if p.sglang_charged)
    summary: dict[str, Any] = dict(sizing.sglang_config)
    summary.update(
        max_total_num_tokens=plan.max_total_num_tokens,
        max_running_requests=plan.max_running_requests,
        cell_size_bytes=plan.cell.sglang_bytes_per_token,
        bytes_per_token=plan.cell.bytes_per_token,
        budget_bytes=plan.budget.budget_bytes,
        planned_bytes=plan.planned_bytes,
        sglang_estimate_bytes=sizing.sglang_estimate_bytes,
        sglang_leaves_out_bytes=plan.planned_bytes - sizing.sglang_estimate_bytes,
        sglang_uncharged_pool_bytes=plan.planned_bytes - charged,
        accounting=plan.serving.accounting,
        pools=[
            {
                "name": p.name,
                "slots": p.slots,
                "bytes_per_slot": p.bytes_per_slot,
                "bytes": p.bytes,
                "padding_slots": p.padding_slots,
                "kind": p.kind,
                "sglang_charged": p.sglang_charged,
            }
            for p in plan.pools
        ],
        provenance={hook: list(plugins) for hook, plugins in plan.provenance.items()},
        notes=list(plan.sizing.notes),
        cost_model=plan.cost.to_dict(),
        cost_counts=plan.counts,
        cost_lines=list(plan.cost.lines()),
        plan=plan.to_dict(),
    )
    return summary


def render_plan(plan: Plan, console: Console) -> None:
    """The human report: model, budget arithmetic, bytes per token, tokens, requests, pools, provenance."""
    model, serving, cell, sizing = plan.model, plan.serving, plan.cell, plan.sizing
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    kinds = ", ".join(f"{n} {k}" for k, n in model.layer_kinds().items())
    arch = ", ".join(model.hf_architectures) or model.model_type
    console.print(f"[bold]kvpools plan[/bold] — {model.name} ({model.source})")

    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row(
        "model", f"{arch}: {model.num_layers} layers ({kinds}); context {model.context_len}; dtype {model.dtype}"
    )
    facts.add_row(
        "serving",
        f"kv {kv.name} · page {serving.page_size} · TP {serving.tp_size} (attention TP {serving.attn_tp_size}) · "
        f"PP {serving.pp_size} (rank {serving.pp_rank}) · DP {serving.dp_size}"
        f"{' attention' if serving.enable_dp_attention else ''} · DCP {serving.dcp_size}"
        f"{_speculative(serving)}"
        f" · accounting {serving.accounting}",
    )
    for i, step in enumerate(plan.budget.steps or (f"{plan.budget.budget_bytes} B",)):
        facts.add_row("budget" if i == 0 else "", step)
    breakdown = " + ".join(f"{p.name} {p.bytes_per_token}" for p in cell.parts_of("token"))
    facts.add_row(
        "bytes/token",
        f"{cell.bytes_per_token} B = {breakdown}   (SGLang's cell size: {_num(cell.sglang_bytes_per_token)} B)",
    )
    if cell.bytes_per_request or cell.fixed_bytes:
        facts.add_row("bytes/request", f"{cell.bytes_per_request} B; fixed {cell.fixed_bytes} B")
    if cell.bytes_per_state_slot:
        facts.add_row("bytes/state slot", f"{cell.bytes_per_state_slot} B")
    facts.add_row("tokens", f"max_total_num_tokens = {plan.max_total_num_tokens:,}")
    for key, value in sizing.sglang_config.items():
        if key not in ("max_total_num_tokens", "max_running_requests"):
            facts.add_row("", f"{key} = {value:,}" if isinstance(value, int) else f"{key} = {value}")
    facts.add_row("requests", f"max_running_requests = {plan.max_running_requests:,} (per DP worker)")
    console.print(facts)

    pools = Table(title="pools", title_justify="left", show_edge=False, pad_edge=False)
    for column in ("pool", "kind", "slots", "+padding", "bytes/slot", "bytes", "in SGLang's estimate"):
        pools.add_column(column, justify="left" if column in ("pool", "kind", "in SGLang's estimate") else "right")
    for p in plan.pools:
        pools.add_row(
            p.name,
            p.kind,
            f"{p.slots:,}",
            f"{p.padding_slots:,}",
            f"{p.bytes_per_slot:,}",
            f"{p.bytes:,} ({format_bytes(p.bytes)})",
            "yes" if p.sglang_charged else "no",
        )
    console.print(pools)

    cost = Table.grid(padding=(0, 2))
    cost.add_column(style="bold")
    cost.add_column()
    counts = plan.counts
    sized = ", ".join(f"{n:,} {space} tokens" for space, n in counts["tokens"].items())
    sized += f", {counts['requests']:,} requests" + (
        f", {counts['state_slots']:,} state slots" if counts["state_slots"] else ""
    )
    for i, group in enumerate(plan.cost.groups):
        cost.add_row("cost" if i == 0 else "", f"{group.group}: {group.describe()}")
    cost.add_row("", f"sized for {sized}: {plan.cost.bytes_for(**counts):,} B")
    console.print(cost)

    budget = plan.budget.budget_bytes
    used = plan.planned_bytes / budget * 100 if budget else 0.0
    console.print(
        f"[bold]planned[/bold] {plan.planned_bytes:,} B ({format_bytes(plan.planned_bytes)}) of the "
        f"{budget:,} B budget ({used:.2f}%); SGLang's estimate ({sizing.sglang_estimate_bytes:,} B) leaves out "
        f"{plan.planned_bytes - sizing.sglang_estimate_bytes:,} B."
    )
    for note in list(cell.notes) + list(sizing.notes):
        console.print(f"[yellow]note[/yellow]: {note}")
    decided = "; ".join(f"{hook}: {', '.join(plugins)}" for hook, plugins in plan.provenance.items())
    console.print(f"[bold]decided by[/bold] {decided}")


def _speculative(serving: Serving) -> str:
    if not serving.speculative:
        return ""
    return f" · {serving.speculative_algorithm} ({serving.speculative_draft_num_layers} draft layers)"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4f}"
