"""``--compare-platform``: the same request under another platform's rules, where the plans differ and why."""

from __future__ import annotations

import json
import subprocess


def run(kvpools_exe: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([kvpools_exe, *args], capture_output=True, text=True, env=env, timeout=180)


ROCM_MLA = ["deepseek-v3", "--platform", "rocm", "--memory", "60GiB", "--max-running-requests", "64"]


def test_a_workspace_shows_as_the_difference(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, "build", *ROCM_MLA, "--device", "meta", "--compare-platform", "cuda")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "platform rocm (traits by rocm): dsa page 1 or a multiple of 16" in " ".join(text.split())
    versus = text.split("versus cuda")[1]
    tokens = next(line for line in versus.splitlines() if line.startswith("tokens"))
    assert tokens.split()[-1] == "-597"  # 41,943,040 B of AITER page indices displace 597 tokens of 70,272 B
    workspace = next(line for line in versus.splitlines() if "aiter_mla_kv_indices" in line)
    assert workspace.split()[-1] == "+41,943,040"


def test_the_json_comparison(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, "plan", *ROCM_MLA, "--compare-platform", "cuda", "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    comparison = summary["comparison"]
    assert comparison["platform"] == "cuda"
    assert summary["max_total_num_tokens"] - comparison["max_total_num_tokens"] == -597
    assert comparison["pools"]["aiter_mla_kv_indices"] == {"this": 41_943_040, "cuda": None}
    assert summary["plan"]["serving"]["workspaces"][0]["owner"] == "rocm"


def test_a_page_rule_refusal_is_compared_at_a_page_the_other_platform_accepts(
    kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    args = ["plan", "deepseek-v3.2", "--platform", "rocm", "--page-size", "16", "--memory", "8GiB"]
    out = run(kvpools_exe, cli_env, *args, "--compare-platform", "cuda")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "cuda refuses it as it is: DSA models need --page-size 64 on cuda" in text
    assert "Compared at --page-size 64, which cuda accepts." in text
    summary = json.loads(run(kvpools_exe, cli_env, *args, "--compare-platform", "cuda", "--json").stdout)
    assert "Compared at --page-size 64" in summary["comparison"]["adjusted"]


def test_a_platform_that_refuses_outright(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    args = ["plan", "deepseek-v3.2", "--platform", "rocm", "--page-size", "16", "--memory", "8GiB"]
    out = run(kvpools_exe, cli_env, *args, "--compare-platform", "tpu")
    assert out.returncode == 0, out.stderr
    assert "tpu refuses it: Unknown platform 'tpu'" in " ".join(out.stdout.split())
    summary = json.loads(run(kvpools_exe, cli_env, *args, "--compare-platform", "tpu", "--json").stdout)
    assert "Unknown platform 'tpu'" in summary["comparison"]["error"]


def test_identical_plans_say_so(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(
        kvpools_exe,
        cli_env,
        "plan",
        "llama-3.1-8b",
        "--platform",
        "rocm",
        "--memory",
        "8GiB",
        "--compare-platform",
        "cuda",
    )
    assert out.returncode == 0, out.stderr
    assert "identical pools and counts." in out.stdout
