"""The plots draw the rows: data read back from each Figure equals the sweep's rows; files are real PNG/SVG."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvpools_core.planning.sweep import SweepGrid, SweepRow, run_sweep

pytest.importorskip("matplotlib")

from kvpools_core.cli.plots import (  # after the skip: the module needs matplotlib
    bytes_per_token_figure,
    concurrency_figure,
    plot_path,
    tokens_figure,
    write_plots,
)

GRID = SweepGrid(
    models=["llama-3.1-8b", "gemma-3-12b-it", "deepseek-v4-flash"],
    axes={"page_size": [1, 256]},
    budgets=[{"memory": "40GiB"}, {"memory": "20GiB"}],
    contexts=["4k", "32k", "128k"],
)


@pytest.fixture(scope="module")
def rows() -> list[SweepRow]:
    return run_sweep(GRID)


def test_concurrency_lines_are_the_rows(rows: list[SweepRow]) -> None:
    planned = [row for row in rows if row.error is None]
    lines = concurrency_figure(rows).axes[0].get_lines()
    assert len(lines) == len(planned) == 10  # deepseek-v4-flash at page 1 does not plan
    for line, row in zip(lines, planned, strict=True):
        assert list(line.get_xdata()) == [4096, 32768, 131072]
        assert list(line.get_ydata()) == [row.concurrency[c] for c in (4096, 32768, 131072)]
    assert concurrency_figure(rows).axes[0].get_xscale() == "log"


def test_tokens_lines_follow_the_budget(rows: list[SweepRow]) -> None:
    lines = tokens_figure(rows).axes[0].get_lines()
    assert len(lines) == 5  # one per planned configuration
    llama_page1 = [row for row in rows if row.point.configuration == ("llama-3.1-8b", (("page_size", 1),))]
    twenty, forty = sorted(llama_page1, key=lambda row: row.budget_bytes)
    assert list(lines[0].get_xdata()) == [20.0, 40.0]  # GiB, sorted by budget
    assert list(lines[0].get_ydata()) == [twenty.tokens["full"], forty.tokens["full"]]
    assert lines[0].get_label() == "llama-3.1-8b page_size=1"


def test_bytes_per_token_bars_stack_the_groups(rows: list[SweepRow]) -> None:
    axes = bytes_per_token_figure(rows).axes[0]
    firsts = {}
    for row in rows:
        if row.error is None:
            firsts.setdefault(row.point.configuration, row)
    groups = list(dict.fromkeys(group for row in firsts.values() for group in row.bytes_per_token))
    assert len(axes.containers) == len(groups)
    for container, group in zip(axes.containers, groups, strict=True):
        heights = [bar.get_height() for bar in container]
        assert heights == [float(row.bytes_per_token.get(group, 0)) for row in firsts.values()]
    tops = [sum(c[i].get_height() for c in axes.containers) for i in range(len(firsts))]
    assert tops == pytest.approx([sum(row.bytes_per_token.values()) for row in firsts.values()])
    assert "kv_swa (swa)" in [container.get_label() for container in axes.containers]


def test_the_cli_offers_every_plot_and_refuses_others(rows: list[SweepRow], tmp_path: Path) -> None:
    from kvpools_core.cli.plots import PLOTS
    from kvpools_core.cli.sweep import PLOT_KINDS
    from kvpools_core.errors import ConfigError

    assert tuple(PLOTS) == PLOT_KINDS
    with pytest.raises(ConfigError, match="plot takes concurrency, tokens, bytes-per-token; got pie"):
        write_plots(rows, ["pie"], tmp_path)
    with pytest.raises(ConfigError, match="plot_format must be png or svg, got 'jpg'"):
        write_plots(rows, ["tokens"], tmp_path, "jpg")


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_written_files_are_valid(rows: list[SweepRow], tmp_path: Path, fmt: str) -> None:
    paths = write_plots(rows, ["concurrency", "tokens", "bytes-per-token"], tmp_path / "plots", fmt)
    assert paths == [plot_path(tmp_path / "plots", kind, fmt) for kind in ("concurrency", "tokens", "bytes-per-token")]
    for path in paths:
        data = path.read_bytes()
        if fmt == "png":
            assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000
        else:
            assert ElementTree.fromstring(data).tag == "{http://www.w3.org/2000/svg}svg"


def test_cli_writes_the_plots(tmp_path: Path) -> None:
    from kvpools_core.cli import main

    sweep = ["sweep", "--model", "llama-3.1-8b", "--memory", "8GiB,16GiB", "--format", "csv"]
    plots = ["--plot", "tokens,concurrency", "--plot-dir", str(tmp_path), "--plot-format", "svg"]
    result = CliRunner().invoke(main, [*sweep, *plots])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep-concurrency.svg", "sweep-tokens.svg"]
    assert f"wrote {tmp_path / 'sweep-tokens.svg'}" in result.stderr


def _many_rows(count: int) -> list[SweepRow]:
    """``count`` configurations (page sizes), each at three contexts and two budgets, ``count - i`` requests at 4k
    (no two lines alike), and ``count`` bytes-per-token groups on the first: the plots with many lines."""
    from kvpools_core.planning.sweep import SweepPoint

    rows = []
    for i in range(count):
        for gib in (20, 40):
            point = SweepPoint(
                model="llama-3.1-8b", settings=(("page_size", i + 1),), budget=(("memory", f"{gib}GiB"),)
            )
            rows.append(
                SweepRow(
                    point=point,
                    budget_bytes=gib << 30,
                    tokens={"full": 1000 * (i + 1) * gib},
                    bytes_per_token={f"g{k}": k + 1 for k in range(count)} if i == 0 else {"g0": 1},
                    token_spaces={f"g{k}": "full" for k in range(count)},
                    concurrency={4096: (count - i) * gib, 32768: (count - i) * gib // 8, 131072: gib - i % 3},
                )
            )
    return rows


def _legend_entries(figure: Any) -> list[tuple[str, Any]]:
    (legend,) = figure.legends
    return [(text.get_text(), handle) for text, handle in zip(legend.get_texts(), legend.legend_handles, strict=True)]


def _style(artist: Any) -> tuple[Any, ...]:
    from matplotlib.colors import to_rgba

    return to_rgba(artist.get_color()), artist.get_linestyle(), artist.get_marker()


@pytest.mark.parametrize("count", [5, 11, 21, 45])
def test_many_lines_stay_distinct_and_every_legend_entry_is_its_line(count: int) -> None:
    """Issue 29: past 10 lines the colours repeated (two lines alike), past 20 the legend was dropped, and an
    entry could not be told to belong to its line. Every line now has its own (colour, linestyle, marker), the
    legend is always there with one entry per line, styled as its line, and the line of label X draws series X."""
    rows = _many_rows(count)
    by_point = {f"{row.point.label()} memory={row.point.budget[0][1]}": row for row in rows}
    by_configuration = {f"llama-3.1-8b page_size={i + 1}": i for i in range(count)}
    for figure, expected in ((concurrency_figure(rows), by_point), (tokens_figure(rows), by_configuration)):
        lines = figure.axes[0].get_lines()
        assert len(lines) == len(expected)
        assert len({_style(line) for line in lines}) == len(lines)  # no two lines alike
        entries = _legend_entries(figure)
        assert sorted(label for label, _ in entries) == sorted(expected)  # one entry per line, none dropped
        by_label = {line.get_label(): line for line in lines}
        for label, handle in entries:
            line = by_label[label]
            assert _style(handle) == _style(line)  # the entry looks like its line, and no other
            series = expected[label]
            if isinstance(series, SweepRow):  # concurrency: the row's requests at each context
                assert list(line.get_ydata()) == [series.concurrency[c] for c in (4096, 32768, 131072)]
            else:  # tokens: the configuration's full tokens at 20 and 40 GiB
                assert list(line.get_ydata()) == [1000 * (series + 1) * 20, 1000 * (series + 1) * 40]
        ends = [by_label[label].get_ydata()[-1] for label, _ in entries]
        assert ends == sorted(ends, reverse=True)  # read top down: the top line is the top entry
        figure.draw_without_rendering()  # lays the figure out
        (legend,) = figure.legends
        assert legend.get_window_extent().x0 >= figure.axes[0].get_window_extent().x1  # outside the axes


def test_many_bar_segments_stay_distinct_with_a_legend() -> None:
    """The stacked groups get (colour, hatch) pairs, no two alike, and a legend entry each, past 10 and 20."""
    rows = _many_rows(25)
    figure = bytes_per_token_figure(rows)
    containers = figure.axes[0].containers
    assert len(containers) == 25
    styles = {(container[0].get_facecolor(), container[0].get_hatch()) for container in containers}
    assert len(styles) == 25
    entries = _legend_entries(figure)
    assert [label for label, _ in entries] == [f"g{k}" for k in reversed(range(25))]  # the top of the stack first
    for (_, handle), container in zip(entries, reversed(containers), strict=True):
        assert (handle.get_facecolor(), handle.get_hatch()) == (container[0].get_facecolor(), container[0].get_hatch())


def test_styles_are_distinct_for_any_count() -> None:
    """Past the 480 (colour, linestyle, marker) combinations, further rounds are lighter: never two alike."""
    from matplotlib.colors import to_rgba

    from kvpools_core.cli.plots import bar_styles, line_styles

    lines = [(to_rgba(s["color"]), s["linestyle"], s["marker"]) for s in line_styles(2000)]
    assert len(set(lines)) == 2000
    assert len({s["color"] for s in line_styles(10)}) == 10  # ten lines: ten colours, before any dashes
    bars = [(to_rgba(s["color"]), s["hatch"]) for s in bar_styles(500)]
    assert len(set(bars)) == 500
