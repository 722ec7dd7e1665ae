"""The human table of a sweep: one row per point, the columns a reader compares (CSV and JSON carry them all)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.table import Table

from kvpools_core.planning.sweep import SweepRow, context_label


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def _joined(values: Mapping[str, int | float]) -> str:
    """``full 127,783 · swa 102,226``; a lone full-space count without its name."""
    if list(values) == ["full"]:
        return _cell(values["full"])
    return " · ".join(f"{name} {_cell(value)}" for name, value in values.items())


def _per_space(row: SweepRow) -> dict[str, int | float]:
    """The row's bytes per token summed over the groups of each token space (CSV and JSON keep each group)."""
    sums: dict[str, int | float] = {}
    for group, per_token in row.bytes_per_token.items():
        space = row.token_spaces.get(group, "full")
        sums[space] = sums.get(space, 0) + per_token
    return dict(sorted(sums.items(), key=lambda item: item[0] != "full"))  # the full space first, like tokens


def render_sweep(rows: Sequence[SweepRow], console: Console) -> None:
    """The table: the point, tokens and bytes per token of each token space, running requests and the
    requests that run at once at each context.  A point that does not plan refers to its error, and a context
    where not one request runs to why, each printed once below the table; CSV and JSON carry every column (the
    binding limits too)."""
    axes = list(dict.fromkeys(name for row in rows for name, _ in row.point.settings))
    budgets = list(dict.fromkeys(name for row in rows for name, _ in row.point.budget))
    contexts = list(dict.fromkeys(context for row in rows for context in row.concurrency))
    state = any(row.state_slots for row in rows)
    table = Table(show_edge=False, pad_edge=False)
    for header in ("model", *axes, *budgets):
        table.add_column(header.replace("_", " "))
    table.add_column("tokens", justify="right")
    table.add_column("requests", justify="right")
    if state:
        table.add_column("state slots", justify="right")
    table.add_column("bytes per token")
    for context in contexts:
        table.add_column(f"@{context_label(context)}", justify="right")
    errors: dict[str, int] = {}
    for row in rows:
        settings, budget = dict(row.point.settings), dict(row.point.budget)
        point = [row.point.model, *(_cell(settings.get(a)) for a in axes), *(_cell(budget.get(b)) for b in budgets)]
        problem = row.error or row.capacity_error
        mark = f"[{errors.setdefault(problem, len(errors) + 1)}]" if problem else ""
        if row.error:
            table.add_row(*point, f"error {mark}", *[""] * (2 + state + len(contexts)))
            continue
        counts = [_joined(row.tokens), _cell(row.max_running_requests)]
        counts += [_cell(row.state_slots)] if state else []
        counts.append(_joined(_per_space(row)))
        for context in contexts:
            why = row.reason.get(context)
            if why is not None:  # not one request: say why, once below the table
                counts.append(f"0 [{errors.setdefault(f'@{context_label(context)}: {why}', len(errors) + 1)}]")
            else:
                counts.append(_cell(row.concurrency.get(context)) or mark)
        table.add_row(*point, *counts)
    planned = sum(row.error is None for row in rows)
    console.print(f"[bold]kvpools sweep[/bold] — {len(rows)} point(s), {planned} planned")
    console.print(table)
    for problem, number in errors.items():
        console.print(f"[{number}] {problem}", markup=False, highlight=False)
