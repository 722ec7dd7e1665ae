"""A sweep's rows are the plans of its points: hand-computed counts, ``plan`` and ``capacity`` agree with them."""

from __future__ import annotations

import pytest

from kvpools_core import Serving, plan
from kvpools_core.errors import ConfigError, PluginHookError
from kvpools_core.planning.capacity import concurrency
from kvpools_core.planning.sweep import SweepGrid, SweepPoint, SweepRow, run_sweep, worker_count

LLAMA_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2
"""llama-3.1-8b: K and V x 32 layers x 8 KV heads x head_dim 128 x 2 B (bf16) = 131,072 B."""


def test_hand_computed_rows_under_sglang_accounting() -> None:
    """SGLang's arithmetic by hand: tokens = budget // 131,072 B, page aligned; requests clamp(tokens / 131,072
    x 512, 2048, 4096) = 2048; requests of L tokens at once = tokens // L (pages of 16 divide both)."""
    grid = SweepGrid(
        models=["llama-3.1-8b"],
        axes={"page_size": [16], "accounting": ["sglang"]},
        budgets=[{"memory": "4GiB"}, {"memory": "8GiB"}],
        contexts=["8k", "32k"],
    )
    four, eight = run_sweep(grid)
    assert four.tokens == {"full": 4 * 2**30 // LLAMA_BYTES_PER_TOKEN} == {"full": 32_768}
    assert eight.tokens == {"full": 65_536}
    assert four.max_running_requests == eight.max_running_requests == 2048
    assert four.concurrency == {8192: 4, 32768: 1}
    assert eight.concurrency == {8192: 8, 32768: 2}
    assert four.binding == {8192: "full tokens", 32768: "full tokens"}
    assert four.bytes_per_token["kv"] == LLAMA_BYTES_PER_TOKEN
    assert four.budget_bytes == 4 * 2**30 and four.error is None


@pytest.mark.parametrize("memory", ["40GiB", "80GiB"])
def test_rows_are_what_plan_and_capacity_answer(memory: str) -> None:
    """Under exact accounting (a search over every pool's bytes) the row is ``plan`` by name, per point."""
    grid = SweepGrid(
        models=["llama-3.1-8b", "gemma-3-12b-it"],
        axes={"tp_size": [1, 2], "page_size": [1, 64]},
        budgets=[{"memory": memory}],
        contexts=[4096, 32768, 1 << 20],
    )
    rows = run_sweep(grid)
    assert [row.point for row in rows] == list(grid.points())
    for row in rows:
        settings = dict(row.point.settings)
        expected = plan(row.point.model, Serving(**settings), memory=memory)
        assert row.tokens == dict(expected.counts["tokens"])
        assert row.max_running_requests == expected.max_running_requests
        assert row.planned_bytes == expected.planned_bytes <= row.budget_bytes
        groups = {group.group: group for group in expected.cost.groups if group.token_bytes}
        assert row.bytes_per_token == {name: group.bytes_per_token for name, group in groups.items()}
        assert row.token_spaces == {name: group.token_space for name, group in groups.items()}
        for context, count in row.concurrency.items():
            answer = concurrency(expected, context)
            assert (count, row.binding[context]) == (answer.concurrent_requests, answer.binding)
    gemma = rows[-1]
    assert gemma.token_spaces["kv_swa"] == "swa" and set(gemma.tokens) == {"full", "swa"}
    assert gemma.concurrency[1 << 20] == 0 and gemma.binding[1 << 20] == "context length"


def test_a_zero_says_why_in_the_row_table_csv_and_json() -> None:
    """Issue 29: a 0 at 128k had no reason. Under SGLang's accounting at 4 GiB, llama-3.1-8b holds
    4 GiB // 131,072 B = 32,768 tokens; one request of 131,072 tokens needs 131,072 of them, at 131,072 B (KV)
    + 8 B / 16 (the allocator's entry per page) = 131,072.5 B each, 17,179,934,720 B. 256k exceeds the model's
    context length, 131,072."""
    import csv
    import io
    import json

    from rich.console import Console

    from kvpools_core.cli.sweep_report import render_sweep
    from kvpools_core.planning.sweep import rows_to_csv, rows_to_json

    grid = SweepGrid(
        models=["llama-3.1-8b"],
        axes={"page_size": [16], "accounting": ["sglang"]},
        budgets=[{"memory": "4GiB"}],
        contexts=["8k", "128k", "256k"],
    )
    (row,) = run_sweep(grid)
    assert row.concurrency == {8192: 4, 131072: 0, 262144: 0}
    tokens_reason = (
        f"one request of 131,072 tokens needs 131,072 full tokens ({131_072 * 131_072.5:,.0f} B at 131,072.5 "
        f"B/token); the plan holds 32,768 in its {4 * 2**30:,} B budget"
    )
    context_reason = "262,144 tokens exceed the context length 131,072 (the model's, or context_length)"
    assert row.reason == {131072: tokens_reason, 262144: context_reason}  # none where requests run (8k)
    (line,) = csv.DictReader(io.StringIO(rows_to_csv([row])))
    assert (line["reason.8192"], line["reason.131072"], line["reason.262144"]) == ("", tokens_reason, context_reason)
    assert json.loads(rows_to_json([row]))[0]["reason"] == {"131072": tokens_reason, "262144": context_reason}
    console = Console(width=400, record=True)
    render_sweep([row], console)
    text = console.export_text()
    assert "│ 0 [1] │ 0 [2]" in text
    assert f"[1] @128k: {tokens_reason}" in text and f"[2] @256k: {context_reason}" in text


def test_a_point_that_does_not_plan_is_a_row_with_its_error() -> None:
    grid = SweepGrid(
        models=["deepseek-v4-flash"], axes={"page_size": [1, 256]}, budgets=[{"memory": "40GiB"}], contexts=[8192]
    )
    refused, planned = run_sweep(grid)
    assert refused.error is not None and "page_size 1" in refused.error and "256" in refused.error
    assert refused.tokens == {} and refused.concurrency == {} and refused.max_running_requests is None
    assert planned.error is None and planned.tokens["c4"] > 0


def test_too_small_a_budget_and_a_clashing_combination_are_rows() -> None:
    grid = SweepGrid(
        models=["llama-3.1-8b"],
        axes={"tp_size": [3], "dp_size": [2], "enable_dp_attention": [True]},
        budgets=[{"memory": "40GiB"}],
    )
    (clash,) = run_sweep(grid)
    assert clash.error is not None and "tp_size 3 must be divisible" in clash.error
    (tiny,) = run_sweep(SweepGrid(models=["llama-3.1-8b"], budgets=[{"memory": "64KiB"}]))
    assert tiny.error is not None and "Not enough memory" in tiny.error


def test_a_plugin_bug_is_raised_not_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvpools_core.planning.sweep as sweep_module

    def broken(*_args: object, **_kwargs: object) -> None:
        raise PluginHookError('Plugin "mha" failed in hook estimate_cell_size: ZeroDivisionError')

    monkeypatch.setattr("kvpools_core.pipeline.plan_basis", broken)
    with pytest.raises(PluginHookError):
        sweep_module.run_sweep(SweepGrid(models=["llama-3.1-8b"], budgets=[{"memory": "1GiB"}]))


def test_grid_order_and_size() -> None:
    grid = SweepGrid(
        models=["a", "b"], axes=[("tp_size", ["1", "2"]), ("page_size", [16])], budgets=[{"memory": 1}, {"memory": 2}]
    )
    points = list(grid.points())
    assert len(grid) == len(points) == 8
    assert points[0] == SweepPoint(model="a", settings=(("tp_size", 1), ("page_size", 16)), budget=(("memory", 1),))
    assert [p.budget for p in points[:2]] == [(("memory", 1),), (("memory", 2),)]  # budgets innermost
    assert points[-1].model == "b" and dict(points[-1].settings)["tp_size"] == 2


@pytest.mark.parametrize(
    ("axes", "budgets", "message"),
    [
        ({"tp_sise": [1]}, [{"memory": "1GiB"}], "not a Serving field a sweep can vary; valid names: kv_cache_dtype"),
        ({"tp_size": ["two"]}, [{"memory": "1GiB"}], "tp_size takes int values, got 'two'"),
        ({"tp_size": [0]}, [{"memory": "1GiB"}], "tp_size"),
        ({"kv_cache_dtype": ["fp9"]}, [{"memory": "1GiB"}], "fp9"),
        ({"plugin_options": ["x"]}, [{"memory": "1GiB"}], "not a Serving field a sweep can vary"),
        ({}, [{"memory": "lots"}], "memory 'lots' is not a size"),
        ({}, [{"gpu_memory": "1GiB"}], "A sweep budget sets memory"),
        ({}, [], "at least one budget"),
    ],
)
def test_bad_grids_are_refused_naming_the_axis(
    axes: dict[str, list[object]], budgets: list[dict[str, str]], message: str
) -> None:
    with pytest.raises(ConfigError, match=None) as caught:
        SweepGrid(models=["llama-3.1-8b"], axes=axes, budgets=budgets)
    assert message in str(caught.value)


def test_jobs_two_equals_jobs_one() -> None:
    grid = SweepGrid(
        models=["llama-3.1-8b", "qwen3-next-80b-a3b-thinking", "deepseek-v4-flash"],
        axes={"tp_size": [1, 2], "page_size": [1, 256]},
        budgets=[{"memory": "20GiB"}, {"memory": "60GiB"}],
        contexts=["8k"],
    )
    assert worker_count(len(grid), 12, 2, min_points_per_job=1) == 2  # the run below really uses two workers
    done: list[int] = []
    two = run_sweep(grid, jobs=2, min_points_per_job=1, advance=done.append)
    one = run_sweep(grid, jobs=1)
    assert two == one and len(one) == 24 and sum(done) == 24
    assert any(row.error for row in one) and any(not row.error for row in one)


def test_worker_count_keeps_small_sweeps_in_process() -> None:
    assert worker_count(10_000, 200, 2) == 2
    assert worker_count(1_500, 30, 8) == 1  # fewer than 1000 points per worker
    assert worker_count(50_000, 3, 8) == 3  # one configuration is never split
    with pytest.raises(ConfigError, match="jobs must be a positive integer"):
        run_sweep(SweepGrid(models=["llama-3.1-8b"], budgets=[{"memory": "1GiB"}]), jobs=0)


def test_a_custom_registry_plans_in_process_only(registry: object) -> None:
    grid = SweepGrid(models=["llama-3.1-8b"], axes={"tp_size": [1, 2]}, budgets=[{"memory": "1GiB"}])
    assert len(run_sweep(grid, registry=registry)) == 2
    with pytest.raises(ConfigError, match="custom registry plans in this process only"):
        run_sweep(grid, jobs=2, registry=registry, min_points_per_job=1)


def test_rows_round_trip_through_their_json_record() -> None:
    grid = SweepGrid(models=["gemma-3-12b-it"], budgets=[{"memory": "8GiB"}], contexts=["4k"])
    (row,) = run_sweep(grid)
    assert SweepRow.from_dict(row.to_dict()) == row


def test_a_gpu_budget_is_the_whole_gpu_plan() -> None:
    """A ``gpu`` budget plans the point on that GPU (SGLang's default fraction, weights from the preset's complete
    config), exactly as ``plan(model, serving, gpu=...)`` does; a misspelt GPU is refused before any point runs."""
    grid = SweepGrid(
        models=["llama-3.1-8b"], axes={"tp_size": [1, 2]}, budgets=[{"gpu": "h100"}, {"gpu": "h200"}], contexts=[8192]
    )
    rows = run_sweep(grid)
    for row in rows:
        expected = plan("llama-3.1-8b", Serving(**dict(row.point.settings)), gpu=dict(row.point.budget)["gpu"])
        assert row.tokens == dict(expected.counts["tokens"])
        assert row.budget_bytes == expected.budget.budget_bytes
    assert rows[1].tokens["full"] > rows[0].tokens["full"]  # an H200 holds more than an H100
    with pytest.raises(ConfigError, match="h1000"):
        SweepGrid(models=["llama-3.1-8b"], axes={}, budgets=[{"gpu": "h1000"}], contexts=[8192])
