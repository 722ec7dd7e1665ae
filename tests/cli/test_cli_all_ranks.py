"""``kvpools plan --all-ranks``: every rank's layers, budget and tokens, and the agreement, end to end."""

from __future__ import annotations

import json
import subprocess

PP4 = ["plan", "llama-3.1-70b", "--all-ranks", "--pp-size", "4", "--accounting", "sglang"]


def run(kvpools_exe: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kvpools_exe, *args], capture_output=True, text=True, env=env, timeout=180)


def test_the_rank_table_names_the_binding_stage_and_a_better_split(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, *PP4, "--memory", "20GiB,40GiB,40GiB,40GiB")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    # 20 layers x 81,920 B a token: 20 GiB hold 262,144 tokens, 40 GiB twice that; stage 0 binds every rank
    assert "agreed max_total_num_tokens = 262,144 on every rank (int64 MIN), bound by rank 0 (*)" in text
    assert "524,288" in text
    assert "--pp-layer-partition 11,23,23,23 would hold" in text


def test_json_carries_every_rank_and_the_stage_plans(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, *PP4, "--tp-size", "2", "--memory", "20GiB,40GiB,40GiB,40GiB", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["max_total_num_tokens"] == summary["tokens"] == 524_288  # TP 2 halves the heads per rank
    assert [row["rank"] for row in summary["ranks"]] == list(range(8))
    assert [row["pp_rank"] for row in summary["ranks"]] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert summary["bottleneck_stage"] == 0
    assert sorted(summary["stage_plans"]) == ["0", "1", "2", "3"]
    assert summary["suggestion"]["partition"] == [11, 23, 23, 23]


def test_bad_all_ranks_input_is_one_line(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, *PP4, "--memory", "20GiB,40GiB")
    assert out.returncode == 1
    assert out.stderr.startswith("Error: --memory lists 2 values; give one per pipeline stage (--pp-size 4)")
    assert "Traceback" not in out.stderr
    out = run(kvpools_exe, cli_env, *PP4, "--device", "cpu")
    assert out.returncode == 1
    assert "--device does not combine with --all-ranks" in out.stderr
