"""``kvpools build`` end to end, through the installed console script."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from kvpools_core import Plan

Run = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run(kvpools_exe: str, cli_env: dict[str, str]) -> Run:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kvpools_exe, *args], capture_output=True, text=True, timeout=120, check=False, env=cli_env
        )

    return run


@pytest.fixture
def build_json(run: Run) -> Callable[..., dict[str, Any]]:
    def build_json(*args: str) -> dict[str, Any]:
        result = run("build", *args, "--json")
        assert result.returncode == 0, result.stderr
        data: dict[str, Any] = json.loads(result.stdout)
        return data

    return build_json


def test_meta_build_of_a_140_gb_plan(build_json: Callable[..., dict[str, Any]]) -> None:
    data = build_json("llama-3.1-70b", "--memory", "140GB", "--device", "meta")
    assert data["device"] == "meta"
    assert data["budget_bytes"] == 140 * 10**9
    assert data["allocated_bytes"] == data["planned_bytes"] <= data["budget_bytes"]
    assert data["allocated_by_pool"] == data["planned_by_pool"]
    assert set(data["planned_by_pool"]) == {"kv", "req_to_token", "allocator"}
    assert data["matches_plan"] is True
    assert data["budget_used"] >= 0.999 and data["budget_explanation"] == []
    assert data["provenance"] == {
        "build_req_to_token_pool": ["core"],
        "build_pool": ["mha"],
        "build_allocator": ["core"],
    }
    # llama-3.1-70b: 80 layers x 8 KV heads x (128 + 128) x 2 B = 327,680 B per token, plus the padding row
    assert data["planned_by_pool"]["kv"] == (data["max_total_num_tokens"] + 1) * 327_680
    plan = Plan.from_dict(data)
    assert plan.planned_bytes == data["planned_bytes"]


def test_meta_build_with_draft_and_quantised_kv(build_json: Callable[..., dict[str, Any]]) -> None:
    data = build_json(
        "qwen3-8b", "--memory", "40GiB", "--device", "meta", "--kv-cache-dtype", "fp4_e2m1", "--page-size", "64",
        "--tp-size", "2", "--pp-size", "2", "--pp-rank", "1",
        "--speculative-algorithm", "EAGLE", "--speculative-draft-num-layers", "1",
    )  # fmt: skip
    assert data["allocated_by_pool"] == data["planned_by_pool"]
    assert set(data["planned_by_pool"]) == {"kv", "draft_kv", "req_to_token", "allocator"}
    assert data["allocated_bytes"] == data["planned_bytes"] <= data["budget_bytes"]


def test_cpu_build_and_explained_cap(build_json: Callable[..., dict[str, Any]]) -> None:
    data = build_json("llama-3.1-8b", "--memory", "1GiB", "--device", "cpu", "--max-total-tokens", "64",
                      "--context-length", "256")  # fmt: skip
    assert data["device"] == "cpu" and data["max_total_num_tokens"] == 64
    assert data["allocated_bytes"] == data["planned_bytes"]
    assert data["budget_used"] < 0.999
    assert data["budget_explanation"] == ["--max-total-tokens 64 caps the KV pools at 64 tokens."]


def test_human_report(run: Run) -> None:
    result = run("build", "llama-3.1-8b", "--memory", "3MiB", "--device", "meta", "--context-length", "128")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "kvpools build — llama-3.1-8b on meta: 22 tokens, 11 requests"
    assert any(line.startswith("total") and line.rstrip().endswith("ok") for line in lines), result.stdout
    assert "because one more page (1 token) would need 131,080 B" in result.stdout


def test_meta_needs_a_stated_budget(run: Run) -> None:
    result = run("build", "llama-3.1-8b", "--device", "meta")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "Error: --device meta measures no memory: pass the budget as --memory, --free-memory SIZE, or --gpu NAME."
    )
    assert result.stdout == ""


def test_device_is_required(run: Run) -> None:
    result = run("build", "llama-3.1-8b", "--memory", "1GiB")
    assert result.returncode != 0
    assert "--device" in result.stderr and "Traceback" not in result.stderr


def test_checked_allocators_are_reported_apart_from_the_plan(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    """--checked-allocators adds the allocated-map (slots + 1 bytes); the plan still matches pool by pool."""
    args = ("build", "llama-3.1-8b", "--memory", "1GiB", "--device", "meta", "--checked-allocators", "--json")
    out = subprocess.run(
        [kvpools_exe, *args],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["checked_allocators"] is True and data["matches_plan"] is True
    assert data["checking_bytes"] == 2 * (data["max_total_num_tokens"] + 1)  # int16 per slot id 0..tokens
    assert data["allocated_by_pool"]["allocator_checked"] == data["checking_bytes"]
    assert data["allocated_bytes"] == data["planned_bytes"] + data["checking_bytes"]
