"""The plots draw the rows: data read back from each Figure equals the sweep's rows; files are real PNG/SVG."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvpools_core.sweep import SweepGrid, SweepRow, run_sweep

pytest.importorskip("matplotlib")

from kvpools_core.plots import (  # after the skip: the module needs matplotlib
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
    from kvpools_core.cli import PLOT_KINDS
    from kvpools_core.errors import ConfigError
    from kvpools_core.plots import PLOTS

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
