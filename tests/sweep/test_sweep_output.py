"""CSV and JSON of a sweep: stable columns, and rows that read back equal."""

from __future__ import annotations

import csv
import io
import json

from kvpools_core.planning.sweep import (
    SweepGrid,
    SweepRow,
    columns,
    rows_from_csv,
    rows_to_csv,
    rows_to_json,
    run_sweep,
)

GRID = SweepGrid(
    models=["llama-3.1-8b", "gemma-3-12b-it", "deepseek-v4-flash"],
    axes={"kv_cache_dtype": ["auto", "fp8_e4m3"], "page_size": [1, 256], "enable_dp_attention": [False]},
    budgets=[{"memory": "24GiB"}, {"memory": 48 * 2**30}],
    contexts=["8k", "128k"],
)


def test_csv_columns_are_stable_and_documented() -> None:
    rows = run_sweep(GRID)
    names = columns(rows)
    assert names[:6] == ["model", "kv_cache_dtype", "page_size", "enable_dp_attention", "memory", "budget_bytes"]
    assert names[6:12] == ["planned_bytes", "tokens.full", "tokens.swa", "tokens.c4", "tokens.c128", "running_requests"]
    assert "bytes_per_token.full.kv" in names and "bytes_per_token.swa.kv_swa" in names
    assert names[-8:] == [
        "concurrency.8192",
        "concurrency.131072",
        "binding.8192",
        "binding.131072",
        "reason.8192",
        "reason.131072",
        "capacity_error",
        "error",
    ]
    parsed = list(csv.DictReader(io.StringIO(rows_to_csv(rows))))
    assert len(parsed) == len(GRID) == 24
    first = parsed[0]
    assert first["model"] == "llama-3.1-8b" and first["memory"] == "24GiB" and first["tokens.swa"] == ""
    assert int(first["tokens.full"]) == rows[0].tokens["full"]
    refused = [line for line in parsed if line["error"]]
    assert refused and all(line["model"] == "deepseek-v4-flash" and line["page_size"] == "1" for line in refused)


def test_csv_round_trip() -> None:
    rows = run_sweep(GRID)
    back = rows_from_csv(rows_to_csv(rows))
    assert back == rows


def test_json_is_a_list_of_records_that_round_trips() -> None:
    rows = run_sweep(GRID)
    records = json.loads(rows_to_json(rows))
    assert isinstance(records, list) and len(records) == len(rows)
    assert records[0]["serving"] == {"kv_cache_dtype": "auto", "page_size": 1, "enable_dp_attention": False}
    assert records[0]["budget"] == {"memory": "24GiB"} and records[1]["budget"] == {"memory": 48 * 2**30}
    assert records[0]["concurrency"]["8192"] == rows[0].concurrency[8192]
    assert [SweepRow.from_dict(record) for record in records] == rows
