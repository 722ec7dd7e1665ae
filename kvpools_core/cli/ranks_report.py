"""The ``kvpools plan --all-ranks`` report: every rank's layers, budget and tokens, and what they agree on."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from kvpools_core.options import option
from kvpools_core.planning.distributed import RankPlans
from kvpools_core.units import format_bytes


def ranks_summary(result: RankPlans) -> dict[str, Any]:
    """The ``--json`` object: the agreement (every rank's row) and the agreed plan of each distinct stage."""
    agreement = result.agreement
    stages: dict[int, Any] = {}
    for row, stage_plan in zip(agreement.ranks, result.plans, strict=True):
        stages.setdefault(row.id.pp_rank, stage_plan)
    return {
        **agreement.to_dict(),
        "max_total_num_tokens": agreement.tokens,
        "stage_plans": {str(stage): p.to_dict() for stage, p in sorted(stages.items())},
    }


def render_ranks(result: RankPlans, console: Console) -> None:
    agreement = result.agreement
    first = result.plans[0]
    serving = first.serving
    console.print(
        f"[bold]kvpools plan --all-ranks[/bold] — {first.model.name}: TP {serving.tp_size} x PP {serving.pp_size} = "
        f"{len(agreement.ranks)} ranks (attention DP {serving.attn_dp_size}, DCP {serving.dcp_size}); "
        f"accounting {agreement.accounting}"
    )
    table = Table(show_edge=False, pad_edge=False)
    for column in (
        "rank",
        "pp",
        "tp",
        "attn dp",
        "attn tp",
        "dcp",
        "layers",
        "bytes/token",
        "budget",
        "own tokens",
        "agreed",
        "unused",
    ):
        table.add_column(column, justify="right")
    for row in agreement.ranks:
        rid = row.id
        mark = " *" if rid.rank == agreement.bound_by else ""
        table.add_row(
            f"{rid.rank}{mark}",
            str(rid.pp_rank),
            str(rid.tp_rank),
            str(rid.attn_dp_rank),
            str(rid.attn_tp_rank),
            str(rid.dcp_rank),
            f"{row.layers[0]}-{row.layers[1] - 1}",
            f"{row.bytes_per_token:,}",
            format_bytes(row.budget_bytes),
            f"{row.own_tokens:,}",
            f"{agreement.tokens:,}",
            format_bytes(row.unused_bytes),
        )
    console.print(table)
    binding = agreement.binding
    console.print(
        f"agreed max_total_num_tokens = {agreement.tokens:,} on every rank (int64 MIN), bound by rank "
        f"{agreement.bound_by} (*) of pipeline stage {binding.id.pp_rank}."
    )
    if agreement.reduced_free_bytes is not None:
        console.print(
            f"SGLang's float32 MIN over the ranks: free memory after loading {agreement.reduced_free_bytes:,} B, "
            f"before loading {agreement.reduced_pre_load_bytes:,} B; every rank plans with them."
        )
    if serving.pp_size > 1:
        per_layer = agreement.stage_bytes_per_layer()
        listing = ", ".join(f"stage {s}: {format_bytes(v)}" for s, v in sorted(per_layer.items()))
        console.print(f"budget per layer — {listing}; the stage with the least per layer binds.")
        if agreement.suggestion is not None:
            s = agreement.suggestion
            console.print(
                f"{option('pp_layer_partition')} {','.join(map(str, s.partition))} would hold {s.tokens:,} tokens "
                f"(+{s.gained_tokens:,}) with every stage's budget as it is; weights move with their layers, so "
                f"re-plan a profiled budget with it to confirm."
            )
        else:
            console.print("No other layer split holds more tokens with these budgets.")
