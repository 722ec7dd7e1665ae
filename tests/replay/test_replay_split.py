"""The split benchmark's command line: both plans replayed, and the numbers are the replay's."""

from __future__ import annotations

import json

import pytest

from benchmarks.replay_split import main, serving_fields
from kvpools_core.pipeline import plan
from kvpools_core.planning.replay import fixed_trace, replay
from kvpools_core.values import Serving


def test_json_compares_default_and_chosen_split(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["gpt-oss-20b", "--memory", "1GiB", "--serve", "page_size=16", "--fixed", "512:512", "--requests", "6"]
    assert main([*argv, "--split-b", "swa_full_tokens_ratio=0.3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    a, b = out["splits"]
    assert a["label"] == "SGLang's default" and b["label"] == "swa_full_tokens_ratio=0.3"
    chosen = plan("gpt-oss-20b", Serving(page_size=16, swa_full_tokens_ratio=0.3), memory="1GiB")
    assert b["pools"]["tokens"] == chosen.counts["tokens"]
    assert b["stats"] == replay(chosen, fixed_trace(512, 512, 6)).to_dict()
    assert a["pools"]["tokens"]["swa"] > b["pools"]["tokens"]["swa"]


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["llama-3.1-8b", "--memory", "1GiB", "--fixed", "100:20", "--requests", "5", "--split-b", "page_size=16"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "peak concurrency" in text and "B / A" in text


def test_serving_fields_are_typed_and_checked() -> None:
    assert serving_fields(["page_size=16,disable_radix_cache=true", "swa_full_tokens_ratio=0.5"], "--serve") == {
        "page_size": 16,
        "disable_radix_cache": True,
        "swa_full_tokens_ratio": 0.5,
    }
    with pytest.raises(SystemExit, match="not FIELD=VALUE"):
        serving_fields(["no_such_field=1"], "--serve")
    with pytest.raises(SystemExit, match="cannot read 'x' as int"):
        serving_fields(["page_size=x"], "--serve")


def test_auto_split_replays_the_chosen_split(capsys: pytest.CaptureFixture[str]) -> None:
    """``--split-b auto``: B is the split choose_split picks for the trace, and it serves more at once than A."""
    argv = ["gpt-oss-20b", "--memory", "2GiB", "--fixed", "3072:1024", "--requests", "40", "--split-b", "auto"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    chosen = out["chosen_split"]
    a, b = out["splits"]
    assert chosen["knob"] == "swa_full_tokens_ratio" and chosen["value"] < 0.8
    assert b["label"] == f"auto: swa_full_tokens_ratio={chosen['value']}"
    assert b["pools"] == chosen["counts"]["chosen"] and a["pools"] == chosen["counts"]["default"]
    # the replay reaches at least the predicted concurrency under each split
    assert a["stats"]["peak_concurrency"] >= chosen["default"]["concurrent_requests"]
    assert b["stats"]["peak_concurrency"] >= chosen["chosen"]["concurrent_requests"]
    assert b["stats"]["peak_concurrency"] > a["stats"]["peak_concurrency"]
    assert b["stats"]["completed"] == a["stats"]["completed"] == 40
