"""The issue's acceptance runs: four architectures built for Ascend on ``meta``, compared with CUDA.

``kvpools build MODEL --platform ascend --device meta --memory 60GiB --page-size 128
--compare-platform cuda``: allocated == planned, the Ascend plugin built the pools (provenance
says so), and the report says where the plan differs from the CUDA plan and why.
"""

from __future__ import annotations

import json
import subprocess

import pytest

ARGS = ["--platform", "ascend", "--device", "meta", "--memory", "60GiB", "--page-size", "128"]


def build(kvpools_exe: str, env: dict[str, str], model: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [kvpools_exe, "build", model, *ARGS, "--compare-platform", "cuda", *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("model", "allocator"),
    [
        ("llama-3.1-70b", "ascend"),  # MHA: NPU paged allocator
        ("deepseek-v3.2-exp", "ascend"),  # DSA
        ("gpt-oss-120b", "swa"),  # SWA hybrids keep SGLang's SWA allocator on NPU too
        ("qwen3-next-80b-a3b-thinking", "ascend"),  # hybrid GDN: NPU paged allocator
    ],
)
def test_ascend_builds_allocate_what_they_plan(
    kvpools_exe: str, cli_env: dict[str, str], model: str, allocator: str
) -> None:
    out = build(kvpools_exe, cli_env, model, "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["allocated_bytes"] == summary["planned_bytes"] <= summary["budget_bytes"]
    assert summary["allocated_by_pool"] == summary["planned_by_pool"]
    built_by = summary["provenance"]
    assert built_by["buffer_layout"] == ["ascend"]
    assert built_by["build_allocator"] == [allocator]
    plan = summary["plan"]
    assert summary["plan_provenance"]["platform_traits"] == ["ascend"]
    assert plan["serving"]["platform_traits"]["slot_index_dtype"] == "int32"
    assert summary["comparison"]["platform"] == "cuda"


def test_the_dsa_report_says_why_it_differs(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = build(kvpools_exe, cli_env, "deepseek-v3.2-exp")
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "note: Ascend NPU" in text and "256 B per token per layer" in text and "CUDA stores 132 B" in text
    assert "cuda refuses it as it is: DSA models need --page-size 64 on cuda" in text
    assert "Compared at --page-size 64, which cuda accepts." in text
    bytes_per_token = next(line for line in out.stdout.splitlines() if line.startswith("bytes/token"))
    assert bytes_per_token.split()[-1] == "+7,564"  # (256 - 132) B x 61 layers: the NPU's indexer rows


def test_the_mha_report_finds_no_difference(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = build(kvpools_exe, cli_env, "llama-3.1-70b")
    assert out.returncode == 0, out.stderr
    assert "identical pools and counts." in out.stdout
    assert "platform ascend (traits by ascend): every model page 128; int32 slots" in " ".join(out.stdout.split())
