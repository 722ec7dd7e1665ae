"""``kvpools plan`` prints one affine cost line per group, and ``--json`` carries the cost model."""

from __future__ import annotations

import json
import subprocess

from kvpools_core import CostModel, Plan


def run(exe: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)


def test_plan_prints_one_cost_line_per_group(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, "plan", "llama-3.1-8b", "--memory", "60GiB", "--page-size", "64")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "cost  kv: 131,072 B/token + 8,388,608 B fixed" in text
    assert "req_to_token: 524,304 B/request + 524,304 B fixed" in text
    assert "allocator: 0.125 B/token (8 B per 64-token page) + 512 B fixed" in text
    assert "sized for 483,200 full tokens, 2,048 requests: " in text


def test_plan_of_a_hybrid_prints_state_slots(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, "plan", "qwen3-next-80b-a3b-thinking", "--memory", "60GiB")
    assert out.returncode == 0, out.stderr
    assert "bytes/state slot  77266944 B" in out.stdout
    assert "mamba_state: 77,266,944 B/state slot + 77,266,944 B fixed" in out.stdout
    assert "393 state slots" in out.stdout


def test_plan_json_carries_the_cost_model(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, "plan", "gpt-oss-20b", "--memory", "20GiB", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    cost = CostModel.from_dict(data["cost_model"])
    counts = data["cost_counts"]
    assert set(counts["tokens"]) == {"full", "swa"}
    assert counts["tokens"]["swa"] == data["swa_max_total_num_tokens"]
    assert cost.bytes_for(**counts) == data["planned_bytes"]
    assert data["cost_lines"] == list(cost.lines())
    loaded = Plan.from_json(out.stdout)
    assert loaded.cost == cost
    assert loaded.counts == counts
