"""``kvpools sweep`` end to end through click: table, CSV, JSON, --output, and one-line errors."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kvpools_core import Serving, plan
from kvpools_core.cli import main
from kvpools_core.planning.capacity import concurrency

GRID = ("--model", "llama-3.1-8b,deepseek-v4-flash", "--page-size", "1", "--page-size", "256", "--memory", "40GiB")


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["sweep", *args])


def test_csv_to_stdout_is_the_plans() -> None:
    result = run(*GRID, "--tp-size", "1,2", "--context", "8k", "--format", "csv")
    assert result.exit_code == 0, result.output
    lines = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(line["model"], line["tp_size"], line["page_size"]) for line in lines][:3] == [
        ("llama-3.1-8b", "1", "1"),
        ("llama-3.1-8b", "1", "256"),
        ("llama-3.1-8b", "2", "1"),
    ]
    llama = plan("llama-3.1-8b", Serving(tp_size=2, page_size=256), memory="40GiB")
    line = lines[3]
    assert int(line["tokens.full"]) == llama.max_total_num_tokens
    assert int(line["concurrency.8192"]) == concurrency(llama, 8192).concurrent_requests
    refused = [line for line in lines if line["error"]]
    assert len(refused) == 2 and all("--page-size 1" in line["error"] for line in refused)


def test_table_names_errors_once_below_it() -> None:
    result = run(*GRID, "--context", "8k,32k")
    assert result.exit_code == 0, result.output
    assert "kvpools sweep — 4 point(s), 3 planned" in result.stdout
    assert "@8k" in result.stdout and "@32k" in result.stdout and "error [1]" in result.stdout
    assert result.stdout.count("SGLang asserts 'page_size must be multiple of 128") == 1


def test_json_to_a_file(tmp_path: Path) -> None:
    out = tmp_path / "sweep.json"
    result = run(*GRID, "--axis", "accounting=sglang", "--format", "json", "--output", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    records = json.loads(out.read_text())
    assert [record["serving"]["accounting"] for record in records] == ["sglang"] * 4
    assert records[0]["concurrency"].keys() == {"8192", "32768", "131072"}  # the default contexts


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--axis", "tp_sise=1,2"), "Error: --axis 'tp_sise' is not a Serving field a sweep can vary; valid names:"),
        (("--axis", "tp_size"), "Error: --axis must look like NAME=V1,V2"),
        (("--tp-size", "one"), "Error: --tp-size takes int values, got 'one'."),
        (("--tp-size", "1", "--axis", "tp_size=2"), "Error: --axis tp_size is given twice"),
        (("--memory", "x"), "Error: --memory 'x' is not a size."),
        (("--model", "llama-3.1-8c"), "Error: Unknown model 'llama-3.1-8c'"),
        (("--jobs", "0"), "Error: --jobs must be a positive integer, got 0."),
        (("--plot", "tokens,pie"), "Error: --plot takes concurrency, tokens, bytes-per-token; got 'pie'."),
    ],
)
def test_bad_input_is_one_line_naming_the_flag(args: tuple[str, ...], message: str) -> None:
    result = run("--model", "llama-3.1-8b", "--memory", "1GiB", *args)
    assert result.exit_code == 1
    assert result.stderr.startswith(message), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output


def test_no_budget_is_an_error() -> None:
    result = run("--model", "llama-3.1-8b")
    assert result.exit_code == 1 and "needs budgets: --memory SIZE" in result.stderr and "--gpu NAME" in result.stderr


def test_forced_progress_goes_to_stderr_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpools_core.cli import sweep as cli

    monkeypatch.setattr(cli._LazyProgress, "DELAY_S", 0.0)
    result = run(*GRID, "--format", "csv", "--progress")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("model,page_size,memory,")
    quiet = run(*GRID, "--format", "csv", "--no-progress")
    assert quiet.stdout == result.stdout and quiet.stderr == ""


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    result = run("--model", "llama-3.1-8b", "--memory", "1GiB", "--plot", "tokens")
    assert result.exit_code == 1
    assert (
        "Error: Plots need matplotlib, an optional extra of kvpools: pip install 'kvpools[plot]' "
        "(from a kvpools checkout: pip install -e '.[plot]')." in result.stderr
    )


def test_table_to_a_file(tmp_path: Path) -> None:
    out = tmp_path / "sweep.txt"
    result = run(*GRID, "--context", "8k", "--output", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert result.stdout == "" and "kvpools sweep — 4 point(s), 3 planned" in text and "@8k" in text
    assert "\x1b[" not in text  # no colour codes in a file
