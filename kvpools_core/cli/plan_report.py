"""What a person (and a script) reads about a plan: the JSON summary and the human report."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.parts.names import DRAFT_PREFIX
from kvpools_core.units import format_bytes
from kvpools_core.values import Plan, Serving, to_dict


def plan_summary(plan: Plan) -> dict[str, Any]:
    """The ``--json`` object: SGLang's ``MemoryPoolConfig`` names at top level, the full plan under ``plan``.

    ``cost_model`` / ``cost_lines`` are the cost per group; ``windows`` the worst-case window terms of each
    windowed token space (:class:`~kvpools_core.values.TokenWindow`, with its ``per_request`` total).
    """
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
        windows=[{**to_dict(window), "per_request": window.per_request} for window in plan.windows],
        host=host_summary(plan),
        draft=draft_summary(plan),
        plan=plan.to_dict(),
    )
    return summary


def draft_summary(plan: Plan) -> dict[str, Any] | None:
    """A draft model of its own in ``--json``: who sized it, its exact bytes per token beside what SGLang's
    layer-count scaling charges, and the tokens each gives under this budget (None without one)."""
    charge, draft = plan.cell.draft, plan.serving.speculative_draft
    if charge is None or draft is None:
        return None
    sglang_tokens, own_tokens = charge.tokens(plan.budget.budget_bytes, plan.serving.page_size)
    return {
        "model": charge.model,
        "architecture": charge.architecture,
        "num_layers": charge.num_layers,
        "parsed_by": draft.parsed_by,
        "estimated_by": list(draft.estimated_by),
        "pools": [p.name for p in plan.pools if p.name.startswith(DRAFT_PREFIX)],
        "exact_bytes_per_token": charge.exact_bytes_per_token,
        "sglang_draft_bytes_per_token": charge.sglang_draft_bytes_per_token,
        "target_cell_size_bytes": charge.target_sglang_bytes_per_token,
        "own_cell_size_bytes": charge.own_sglang_bytes_per_token,
        "sglang_tokens": sglang_tokens,
        "own_cell_tokens": own_tokens,
        "token_difference": own_tokens - sglang_tokens,
    }


def render_draft(plan: Plan, facts: Table) -> None:
    """The "draft" rows: the draft model, the plugin that sized it, exact vs SGLang's scaling, and the tokens."""
    summary = draft_summary(plan)
    if summary is None:
        return
    facts.add_row(
        "draft",
        f"{summary['model']} ({summary['architecture']}; parsed by {summary['parsed_by']}, cell by "
        f"{', '.join(summary['estimated_by'])}): {summary['num_layers']} layers in "
        f"{', '.join(summary['pools'])}, {summary['exact_bytes_per_token']:,} B/token of its own geometry; "
        f"SGLang's layer-count scaling charges {_grouped(summary['sglang_draft_bytes_per_token'])} B/token",
    )
    facts.add_row(
        "",
        f"SGLang's count under this budget: {summary['sglang_tokens']:,} tokens (cell "
        f"{_grouped(plan.cell.sglang_bytes_per_token)} B); with the draft's own cell "
        f"({_grouped(summary['target_cell_size_bytes'])} + {_grouped(summary['own_cell_size_bytes'])} B): "
        f"{summary['own_cell_tokens']:,} tokens ({summary['token_difference']:+,})",
    )


def host_summary(plan: Plan) -> dict[str, Any] | None:
    """The host tier in ``--json``: its pools, what one rank and one node pin, the node check (None without)."""
    host = plan.host
    if host is None:
        return None
    return {
        "pools": [{**to_dict(pool), "pages": pool.pages} for pool in host.pools],
        "bytes_per_rank": host.bytes_per_rank,
        "ranks_per_node": host.ranks_per_node,
        "bytes_per_node": host.bytes_per_node,
        "host_tokens": host.tokens,
        "dcp_size": host.dcp_size,
        "unused_bytes_per_rank": host.unused_bytes_per_rank,
        "pinned": host.pinned,
        "hicache_ratio": host.hicache_ratio,
        "auto_sized": host.auto_sized,
        "retraction_backup": host.retraction_backup,
        "memory": None if host.memory is None else {**to_dict(host.memory), "usable_bytes": host.memory.usable_bytes},
        "notes": list(host.notes),
    }


def render_host(plan: Plan, console: Console) -> None:
    """The "Host tier" section: one row per host pool, then per rank, per node, and the node check."""
    host = plan.host
    if host is None:
        return
    serving = plan.serving
    title = "Host tier (decode retraction backup, a HiCache pool)" if host.retraction_backup else "Host tier (HiCache)"
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in ("host pool", "device slots", "host slots", "page", "bytes/slot", "bytes", "sized by"):
        table.add_column(column, justify="left" if column in ("host pool", "sized by") else "right")
    for pool in host.pools:
        table.add_row(
            pool.name,
            f"{pool.device_slots:,}",
            f"{pool.slots:,}",
            f"{pool.page_size}",
            f"{pool.page_bytes:,}/page" if pool.page_bytes else f"{pool.bytes_per_slot:,}",
            f"{pool.bytes:,} ({format_bytes(pool.bytes)})",
            pool.sized_by,
        )
    console.print(table)
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="bold")
    facts.add_column()
    facts.add_row(
        "host tier",
        (
            f"layout {serving.hicache_mem_layout} · write policy {serving.hicache_write_policy} · "
            f"{host.tokens:,} host tokens per rank"
            if host.tokens is not None
            else f"layout {serving.hicache_mem_layout}"
        )
        + (f" · ratio {host.hicache_ratio:.6g} (auto-sized to the node)" if host.auto_sized else ""),
    )
    facts.add_row(
        "pinned",
        f"{host.bytes_per_rank:,} B ({format_bytes(host.bytes_per_rank)}) per rank x {host.ranks_per_node} rank(s) "
        f"= {host.bytes_per_node:,} B ({format_bytes(host.bytes_per_node)}) per node",
    )
    if host.unused_bytes_per_rank:
        facts.add_row(
            "unreachable",
            f"{host.unused_bytes_per_rank:,} B ({format_bytes(host.unused_bytes_per_rank)}) per rank are pinned but "
            f"never hold data (padding of the padded host pages)",
        )
    if host.dcp_size > 1:
        facts.add_row(
            "DCP",
            f"host tokens are logical (HostKVCache.logical_size): each rank's host row holds its 1/{host.dcp_size} "
            f"of a token, {host.dcp_size} tokens per physical row",
        )
    if host.memory is not None:
        memory = host.memory
        share = host.bytes_per_node / memory.usable_bytes * 100 if memory.usable_bytes else 0.0
        facts.add_row(
            "node",
            f"{format_bytes(memory.available_bytes)} available ({memory.source}) - "
            f"{format_bytes(memory.reserve_bytes)} reserve = {format_bytes(memory.usable_bytes)}; "
            f"the tier uses {share:.1f}%",
        )
    console.print(facts)
    for note in host.notes:
        console.print(f"[yellow]note[/yellow]: {note}")


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
    facts.add_row("platform", platform_line(plan))
    for i, step in enumerate(plan.budget.steps or (f"{plan.budget.budget_bytes} B",)):
        facts.add_row("budget" if i == 0 else "", step)
    breakdown = " + ".join(
        f"{p.name} {p.bytes_per_token}" + (f" x {p.slot_scale} slots" if p.slot_scale > 1 else "")
        for p in cell.parts_of("token")
    )
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
    render_draft(plan, facts)
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
    for i, window in enumerate(plan.windows):
        cost.add_row("worst case" if i == 0 else "", window.describe())
    console.print(cost)

    budget = plan.budget.budget_bytes
    used = plan.planned_bytes / budget * 100 if budget else 0.0
    left_out = plan.planned_bytes - sizing.sglang_estimate_bytes
    gap = f"leaves out {left_out:,} B" if left_out >= 0 else f"overcharges {-left_out:,} B"
    console.print(
        f"[bold]planned[/bold] {plan.planned_bytes:,} B ({format_bytes(plan.planned_bytes)}) of the "
        f"{budget:,} B budget ({used:.2f}%); SGLang's estimate ({sizing.sglang_estimate_bytes:,} B) {gap}."
    )
    for note in list(cell.notes) + list(sizing.notes):
        console.print(f"[yellow]note[/yellow]: {note}")
    render_host(plan, console)
    decided = "; ".join(f"{hook}: {', '.join(plugins)}" for hook, plugins in plan.provenance.items())
    console.print(f"[bold]decided by[/bold] {decided}")


def platform_line(plan: Plan) -> str:
    """``ascend (by ascend): every model page 128; int32 slots; workspaces ...``: what the platform decided."""
    serving = plan.serving
    traits = serving.traits
    by = ", ".join(plan.provenance.get("platform_traits", ("core",)))
    facts = [
        f"{'every model' if not r.kernels else '/'.join(r.kernels)} page {r.describe()}" for r in traits.page_size_rules
    ]
    if traits.raw_mla_row_backends:
        facts.append(f"raw MLA rows for {', '.join(sorted(traits.raw_mla_row_backends))}")
    facts.append(f"{traits.slot_index_dtype} slots")
    facts += [f"workspace {w.name} ({w.owner}): {w.purpose}" for w in serving.workspaces]
    return f"{serving.platform} (traits by {by}): {'; '.join(facts)}"


def comparison_summary(plan: Plan, other: Plan | None, error: str | None, platform: str) -> dict[str, Any]:
    """The ``--compare-platform`` JSON: the same request planned on ``platform``, pool by pool, or why it fails."""
    if other is None:
        return {"platform": platform, "error": error}
    adjusted = {"adjusted": error} if error else {}
    names = list(dict.fromkeys([p.name for p in plan.pools] + [p.name for p in other.pools]))
    mine, theirs = {p.name: p.bytes for p in plan.pools}, {p.name: p.bytes for p in other.pools}
    return {
        "platform": platform,
        "max_total_num_tokens": other.max_total_num_tokens,
        "max_running_requests": other.max_running_requests,
        "bytes_per_token": other.cell.bytes_per_token,
        "planned_bytes": other.planned_bytes,
        "pools": {n: {"this": mine.get(n), platform: theirs.get(n)} for n in names if mine.get(n) != theirs.get(n)},
        "notes_only_here": [n for n in _notes(plan) if n not in _notes(other)],
        "notes_only_there": [n for n in _notes(other) if n not in _notes(plan)],
        **adjusted,
    }


def render_comparison(plan: Plan, other: Plan | None, error: str | None, platform: str, console: Console) -> None:
    """Where this plan differs from the same request on ``platform`` (``--compare-platform``), and why."""
    here = plan.serving.platform
    console.print(f"[bold]versus {platform}[/bold] (the same model, serving options and budget):")
    if other is None:
        console.print(f"  {platform} refuses it: {error}")
        return
    if error:
        console.print(f"  {platform} refuses it as it is: {error}")
    console.print(f"  platform {platform}: {platform_line(other).split(': ', 1)[1]}")
    rows = [
        ("bytes/token", plan.cell.bytes_per_token, other.cell.bytes_per_token),
        ("tokens", plan.max_total_num_tokens, other.max_total_num_tokens),
        ("requests", plan.max_running_requests, other.max_running_requests),
    ]
    table = Table(show_edge=False, pad_edge=False)
    for column in ("", here, platform, "difference"):
        table.add_column(column, justify="left" if not column else "right")
    for name, mine, theirs in rows:
        table.add_row(name, f"{mine:,}", f"{theirs:,}", f"{mine - theirs:+,}")
    diff = comparison_summary(plan, other, None, platform)["pools"]
    for name, both in diff.items():
        mine, theirs = both["this"] or 0, both[platform] or 0
        table.add_row(f"pool {name}", f"{mine:,}", f"{theirs:,}", f"{mine - theirs:+,}")
    if len(table.rows) == len(rows) and not diff and plan.cell == other.cell:
        console.print("  identical pools and counts.")
    else:
        console.print(table)
    for note in comparison_summary(plan, other, None, platform)["notes_only_here"]:
        console.print(f"  why: {note}")


def _notes(plan: Plan) -> list[str]:
    return [*plan.cell.notes, *plan.sizing.notes]


def _speculative(serving: Serving) -> str:
    if not serving.speculative:
        return ""
    draft = serving.speculative_draft
    own = f": {draft.model.name}, {draft.model.architecture}" if draft is not None else ""
    return f" · {serving.speculative_algorithm} ({serving.speculative_draft_num_layers} draft layers{own})"


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.4f}"


def _grouped(value: float) -> str:
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.4f}"
