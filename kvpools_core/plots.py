"""Plots of a sweep (``kvpools sweep --plot``), drawn with matplotlib, an optional extra (``kvpools[plot]``).

Each plot is built by a function that returns the :class:`matplotlib.figure.Figure`
(``concurrency_figure``, ``tokens_figure``, ``bytes_per_token_figure``), so what
is drawn can be read back and compared with the rows; :func:`write_plots`
saves them.  matplotlib is imported only here, only when a plot is asked for,
and figures are drawn on the Agg canvas directly: no GUI backend, no pyplot
state shared between calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.sweep import SweepPoint, SweepRow, context_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "PLOTS",
    "bytes_per_token_figure",
    "concurrency_figure",
    "plot_path",
    "require_matplotlib",
    "tokens_figure",
    "write_plots",
]

INSTALL_HINT = "pip install 'kvpools[plot]' (from a kvpools checkout: pip install -e '.[plot]')"
LEGEND_LIMIT = 20
"""More lines than this get no legend (it would cover the plot); their labels stay on the lines' artists."""


def require_matplotlib() -> None:
    """Fail early, with the install hint, when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(f"Plots need matplotlib, an optional extra of kvpools: {INSTALL_HINT}.") from None


def _figure(title: str) -> tuple[Figure, Any]:
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 5.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.set_title(title)
    return figure, axes


def _planned(rows: Iterable[SweepRow]) -> list[SweepRow]:
    return [row for row in rows if row.error is None]


def _label(row: SweepRow, budget: bool = True) -> str:
    """The row's configuration, with its budget (``memory=40GiB``) unless the plot's axis is the budget."""
    point: SweepPoint = row.point
    parts = [point.label()]
    if budget:
        parts += [f"{name}={value}" for name, value in point.budget]
    return " ".join(parts)


def _legend(axes: Any, count: int) -> None:
    if 0 < count <= LEGEND_LIMIT:
        axes.legend(fontsize="small")


def concurrency_figure(rows: Sequence[SweepRow]) -> Figure:
    """Concurrent requests against context length: one line per planned point (configuration and budget),
    x on a log2 scale, y the row's ``concurrency`` at each of its contexts."""
    figure, axes = _figure("Concurrent requests by context length")
    drawn = 0
    for row in _planned(rows):
        if not row.concurrency:
            continue
        contexts = sorted(row.concurrency)
        axes.plot(contexts, [row.concurrency[c] for c in contexts], marker="o", label=_label(row))
        drawn += 1
    axes.set_xscale("log", base=2)
    contexts = sorted({context for row in rows for context in row.concurrency})
    axes.set_xticks(contexts, [context_label(context) for context in contexts])
    axes.set_xlabel("context length (tokens)")
    axes.set_ylabel("concurrent requests")
    _legend(axes, drawn)
    return figure


def tokens_figure(rows: Sequence[SweepRow]) -> Figure:
    """Full tokens against the KV budget: one line per configuration (model and axis settings), its points in
    budget order; x the row's ``budget_bytes`` in GiB, y its ``tokens["full"]``."""
    figure, axes = _figure("KV tokens by memory budget")
    lines: dict[tuple[str, Any], list[SweepRow]] = {}
    for row in _planned(rows):
        lines.setdefault(row.point.configuration, []).append(row)
    for members in lines.values():
        members = sorted(members, key=lambda row: row.budget_bytes or 0)
        axes.plot(
            [(row.budget_bytes or 0) / 2**30 for row in members],
            [row.tokens.get("full", 0) for row in members],
            marker="o",
            label=_label(members[0], budget=False),
        )
    axes.set_xlabel("KV budget (GiB)")
    axes.set_ylabel("full tokens")
    _legend(axes, len(lines))
    return figure


def bytes_per_token_figure(rows: Sequence[SweepRow]) -> Figure:
    """Bytes per token by group, stacked: one bar per configuration (the bytes do not depend on the budget, so
    its first planned row), one segment per group of the plan's cost model (``kv_swa (swa)``: per SWA token)."""
    figure, axes = _figure("Bytes per token by layer group")
    first: dict[tuple[str, Any], SweepRow] = {}
    for row in _planned(rows):
        first.setdefault(row.point.configuration, row)
    groups = list(dict.fromkeys(group for row in first.values() for group in row.bytes_per_token))
    labels = [row.point.label() for row in first.values()]
    bottoms = [0.0] * len(first)
    for group in groups:
        heights = [float(row.bytes_per_token.get(group, 0)) for row in first.values()]
        space = next(row.token_spaces[group] for row in first.values() if group in row.token_spaces)
        name = group if space == "full" else f"{group} ({space})"
        axes.bar(range(len(labels)), heights, bottom=bottoms, label=name)
        bottoms = [bottom + height for bottom, height in zip(bottoms, heights, strict=True)]
    axes.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize="x-small")
    axes.set_ylabel("bytes per token")
    _legend(axes, len(groups))
    return figure


PLOTS = {
    "concurrency": concurrency_figure,
    "tokens": tokens_figure,
    "bytes-per-token": bytes_per_token_figure,
}
"""The plot kinds ``--plot`` takes, and the function that builds each."""


def plot_path(directory: str | Path, kind: str, fmt: str) -> Path:
    """Where plot ``kind`` is written: ``<directory>/sweep-<kind>.<fmt>`` (the same name every run)."""
    return Path(directory) / f"sweep-{kind}.{fmt}"


def write_plots(rows: Sequence[SweepRow], kinds: Iterable[str], directory: str | Path, fmt: str = "png") -> list[Path]:
    """Draw each plot of ``kinds`` and save it as ``fmt`` (png or svg) in ``directory``; the paths written."""
    if fmt not in ("png", "svg"):
        raise ConfigError(f"{option('plot_format')} must be png or svg, got {fmt!r}.")
    unknown = sorted(set(kinds) - set(PLOTS))
    if unknown:
        raise ConfigError(f"{option('plot')} takes {', '.join(PLOTS)}; got {', '.join(unknown)}.")
    Path(directory).mkdir(parents=True, exist_ok=True)
    written = []
    for kind in dict.fromkeys(kinds):
        path = plot_path(directory, kind, fmt)
        PLOTS[kind](rows).savefig(path, format=fmt)
        written.append(path)
    return written
