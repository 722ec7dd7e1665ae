"""Plots of a sweep (``kvpools sweep --plot``), drawn with matplotlib, an optional extra (``kvpools[plot]``).

Each plot is built by a function that returns the :class:`matplotlib.figure.Figure`
(``concurrency_figure``, ``tokens_figure``, ``bytes_per_token_figure``), so what
is drawn can be read back and compared with the rows; :func:`write_plots`
saves them.  matplotlib is imported only here, only when a plot is asked for,
and figures are drawn on the Agg canvas directly: no GUI backend, no pyplot
state shared between calls.  Every line gets its own (colour, linestyle, marker)
(:func:`line_styles`) and every figure a legend outside its axes, one entry per line.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.planning.sweep import SweepPoint, SweepRow, context_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "PLOTS",
    "bar_styles",
    "bytes_per_token_figure",
    "concurrency_figure",
    "line_styles",
    "plot_path",
    "require_matplotlib",
    "tokens_figure",
    "write_plots",
]

INSTALL_HINT = "pip install 'kvpools[plot]' (from a kvpools checkout: pip install -e '.[plot]')"
COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
"""matplotlib's ``tab10``: ten colours told apart in print and by most colour-blind readers."""
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h", "p")
HATCHES = ("", "//", "..", "xx", "\\\\", "++", "oo", "--")
LEGEND_ROWS = 30
"""Legend entries a column holds before the legend takes another column (the figure widens to keep the axes)."""
LEGEND_COLUMNS = 4
"""Past this many columns, the columns grow longer instead (the figure grows taller)."""


def line_styles(count: int) -> list[dict[str, Any]]:
    """``count`` (colour, linestyle, marker) combinations, no two alike: the colours cycle fastest, then the
    line styles, then the markers (480 combinations); past those, each further round of them is blended further
    towards white, so any number of lines stays distinct."""
    styles = []
    combinations = len(COLOURS) * len(LINESTYLES) * len(MARKERS)
    for i in range(count):
        colour = COLOURS[i % len(COLOURS)]
        linestyle = LINESTYLES[i // len(COLOURS) % len(LINESTYLES)]
        marker = MARKERS[i // (len(COLOURS) * len(LINESTYLES)) % len(MARKERS)]
        styles.append({"color": _lighter(colour, i // combinations), "linestyle": linestyle, "marker": marker})
    return styles


def bar_styles(count: int) -> list[dict[str, Any]]:
    """``count`` (colour, hatch) combinations for stacked segments, no two alike (colours fastest)."""
    combinations = len(COLOURS) * len(HATCHES)
    return [
        {
            "color": _lighter(COLOURS[i % len(COLOURS)], i // combinations),
            "hatch": HATCHES[i // len(COLOURS) % len(HATCHES)],
            "edgecolor": "white",
        }
        for i in range(count)
    ]


def require_matplotlib() -> None:
    """Fail early, with the install hint, when matplotlib is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(f"Plots need matplotlib, an optional extra of kvpools: {INSTALL_HINT}.") from None


def _lighter(colour: str, rounds: int) -> tuple[float, float, float]:
    """``colour`` blended towards white by ``1 - 1 / (rounds + 1)``: itself at round 0, distinct at every round."""
    red, green, blue = (int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5))
    keep = 1 / (rounds + 1)
    return (1 - (1 - red) * keep, 1 - (1 - green) * keep, 1 - (1 - blue) * keep)


def _columns(entries: int) -> int:
    return min(LEGEND_COLUMNS, max(1, math.ceil(entries / LEGEND_ROWS)))


def _figure(title: str, entries: int) -> tuple[Figure, Any]:
    """A figure wide enough for the axes and a legend of ``entries`` beside them."""
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = math.ceil(entries / _columns(entries))
    height = max(5.5, 1.5 + (0.19 if entries <= LEGEND_ROWS else 0.15) * rows)
    figure = Figure(figsize=(9 + 3.5 * _columns(entries), height), layout="constrained")
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


def _legend(figure: Figure, handles: Sequence[Any]) -> None:
    """Every entry, outside the axes on the right, in columns of :data:`LEGEND_ROWS`, read top down as the plot
    is: lines in the order they end on the right of the plot, top first; stacked segments top first."""
    if not handles:
        return
    if all(hasattr(handle, "get_ydata") for handle in handles):
        handles = sorted(handles, key=lambda line: -float(line.get_ydata()[-1]) if len(line.get_ydata()) else 0.0)
    else:
        handles = list(reversed(handles))
    figure.legend(
        handles=list(handles),
        labels=[handle.get_label() for handle in handles],
        loc="outside right upper",
        ncols=_columns(len(handles)),
        fontsize="small" if len(handles) <= LEGEND_ROWS else "x-small",
    )


def concurrency_figure(rows: Sequence[SweepRow]) -> Figure:
    """Concurrent requests against context length: one line per planned point (configuration and budget),
    x on a log2 scale, y the row's ``concurrency`` at each of its contexts."""
    drawn = [row for row in _planned(rows) if row.concurrency]
    figure, axes = _figure("Concurrent requests by context length", len(drawn))
    for row, style in zip(drawn, line_styles(len(drawn)), strict=True):
        contexts = sorted(row.concurrency)
        axes.plot(contexts, [row.concurrency[c] for c in contexts], label=_label(row), **style)
    axes.set_xscale("log", base=2)
    contexts = sorted({context for row in rows for context in row.concurrency})
    axes.set_xticks(contexts, [context_label(context) for context in contexts])
    axes.set_xlabel("context length (tokens)")
    axes.set_ylabel("concurrent requests")
    _legend(figure, axes.get_lines())
    return figure


def tokens_figure(rows: Sequence[SweepRow]) -> Figure:
    """Full tokens against the KV budget: one line per configuration (model and axis settings), its points in
    budget order; x the row's ``budget_bytes`` in GiB, y its ``tokens["full"]``."""
    lines: dict[tuple[str, Any], list[SweepRow]] = {}
    for row in _planned(rows):
        lines.setdefault(row.point.configuration, []).append(row)
    figure, axes = _figure("KV tokens by memory budget", len(lines))
    for members, style in zip(lines.values(), line_styles(len(lines)), strict=True):
        members = sorted(members, key=lambda row: row.budget_bytes or 0)
        axes.plot(
            [(row.budget_bytes or 0) / 2**30 for row in members],
            [row.tokens.get("full", 0) for row in members],
            label=_label(members[0], budget=False),
            **style,
        )
    axes.set_xlabel("KV budget (GiB)")
    axes.set_ylabel("full tokens")
    _legend(figure, axes.get_lines())
    return figure


def bytes_per_token_figure(rows: Sequence[SweepRow]) -> Figure:
    """Bytes per token by group, stacked: one bar per configuration (the bytes do not depend on the budget, so
    its first planned row), one segment per group of the plan's cost model (``kv_swa (swa)``: per SWA token)."""
    first: dict[tuple[str, Any], SweepRow] = {}
    for row in _planned(rows):
        first.setdefault(row.point.configuration, row)
    groups = list(dict.fromkeys(group for row in first.values() for group in row.bytes_per_token))
    figure, axes = _figure("Bytes per token by layer group", len(groups))
    labels = [row.point.label() for row in first.values()]
    bottoms = [0.0] * len(first)
    for group, style in zip(groups, bar_styles(len(groups)), strict=True):
        heights = [float(row.bytes_per_token.get(group, 0)) for row in first.values()]
        space = next(row.token_spaces[group] for row in first.values() if group in row.token_spaces)
        name = group if space == "full" else f"{group} ({space})"
        axes.bar(range(len(labels)), heights, bottom=bottoms, label=name, **style)
        bottoms = [bottom + height for bottom, height in zip(bottoms, heights, strict=True)]
    axes.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize="x-small")
    axes.set_ylabel("bytes per token")
    _legend(figure, axes.containers)
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
