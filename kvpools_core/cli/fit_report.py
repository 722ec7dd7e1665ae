"""Rendering of ``kvpools fit``: the ranked configurations, or why nothing fits and what would."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kvpools_core.planning.fit import FitResult


def render_fit(result: FitResult, console: Console) -> None:
    """The fits on the fewest GPUs as a table with each launch line, then the skipped candidates' reasons."""
    gpu = result.gpu
    console.print(
        f"kvpools fit — {result.model}: {result.requests} requests of {result.context_len} tokens on "
        f"{gpu.label} ({gpu.total_bytes / (1 << 20):g} MiB), up to {result.max_gpus} GPUs"
    )
    if result.fits:
        table = Table(show_edge=False, pad_edge=False)
        for column in ("#", "GPUs", "configuration", "fraction", "KV tokens", "held", "headroom", "binds"):
            table.add_column(column, justify="right" if column not in ("configuration", "binds") else "left")
        for rank, found in enumerate(result.fits, 1):
            table.add_row(
                str(rank),
                str(found.gpus),
                found.describe(),
                f"{found.plan.budget.mem_fraction_static}",
                f"{found.plan.sizing.max_total_num_tokens:,}",
                f"{found.requests_held:,}",
                f"{found.headroom:.2f}x",
                found.capacity.binding,
            )
        console.print(table)
        console.print("launch:")
        for rank, found in enumerate(result.fits, 1):
            console.print(f"  {rank}. {found.launch_line}", soft_wrap=True)
    else:
        console.print(result.needed or "does not fit")
        if result.best is not None:
            best = result.best
            copies = f" ({best.replicas} replicas of this engine)" if "--dp-size" not in best.launch else ""
            console.print(f"  {best.launch_line}{copies}", soft_wrap=True)
    if result.skipped:
        console.print(f"tried {result.tried} engine configurations; skipped:")
        for reason, count in sorted(result.skipped.items(), key=lambda item: -item[1]):
            console.print(f"  {count} x {reason}", soft_wrap=True)
