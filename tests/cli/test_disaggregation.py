"""``--disaggregation-mode prefill|decode`` end to end for every architecture, and what SGLang refuses.

A decode node's request table has ``max_running_requests + extra + 1`` rows (``DecodeReqToTokenPool``, ref-000
lines 1003-1022); unset, ``extra`` is SGLang 0.5.23's default ``2 x 8`` for 8 requests per worker
(``pd_disaggregation_hook.py`` lines 123-143).  Each plan is built on meta and must match pool by pool.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest

from kvpools_core import Plan

Run = Callable[..., subprocess.CompletedProcess[str]]

ARCHITECTURES = {
    "mha": ("llama-3.1-8b", ()),
    "mla": ("deepseek-v3", ()),
    "dsa": ("deepseek-v3.2", ()),
    "minimax_sparse": ("minimax-m3", ()),
    "swa": ("gpt-oss-120b", ()),
    "mamba": ("qwen3-next-80b-a3b-thinking", ()),
    "dsv4": ("deepseek-v4-flash", ("--page-size", "256")),
}
COMMON = ("--memory", "60GiB", "--tp-size", "8", "--max-running-requests", "8", "--accounting", "sglang")


@pytest.fixture
def run(kvpools_exe: str, cli_env: dict[str, str]) -> Run:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kvpools_exe, *args], capture_output=True, text=True, timeout=120, check=False, env=cli_env
        )

    return run


@pytest.mark.parametrize("mode", ["prefill", "decode"])
@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_every_architecture_plans_and_builds_each_role(run: Run, architecture: str, mode: str) -> None:
    preset, extra_args = ARCHITECTURES[architecture]
    page = () if extra_args else ("--page-size", "64")
    done = run(
        "build", preset, *COMMON, *page, *extra_args, "--disaggregation-mode", mode, "--device", "meta", "--json"
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["matches_plan"], data["allocated_by_pool"]
    plan = Plan.from_dict(data["plan"])
    assert plan.model.architecture == architecture
    assert plan.max_running_requests == 8
    table = plan.pool("req_to_token")
    assert (table.slots, table.padding_slots) == ((8 + 16, 1) if mode == "decode" else (8, 1))
    assert plan.serving.radix_cache_disabled is (mode == "decode")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("deepseek-v3.2", "--disaggregation-mode", "decode", "--enable-dsa-cache-layer-split"),
            "--enable-dsa-cache-layer-split is not supported on decode workers (--disaggregation-mode decode)",
        ),
        (
            ("deepseek-v3.2", "--enable-dsa-cache-layer-split"),
            "--enable-dsa-cache-layer-split is only supported on PD prefill workers",
        ),
        (
            ("deepseek-v3.2", "--disaggregation-mode", "decode", "--attn-cp-size", "2"),
            "--attn-cp-size 2 on a PD decode node (--disaggregation-mode decode)",
        ),
        (
            (
                "qwen3-next-80b-a3b-thinking",
                "--disaggregation-mode",
                "prefill",
                "--enable-mamba-extra-buffer",
                "--enable-mamba-extra-buffer-lazy",
            ),
            "--enable-mamba-extra-buffer-lazy is unsupported under PD disaggregation (--disaggregation-mode prefill)",
        ),
    ],
)
def test_what_sglang_refuses_is_refused_naming_the_flag(run: Run, args: tuple[str, ...], message: str) -> None:
    done = run("plan", *args, "--memory", "60GiB", "--tp-size", "8", "--page-size", "64")
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert message in done.stderr + done.stdout


def test_the_split_runs_on_a_prefill_node(run: Run) -> None:
    """``ceil(61 / 2) + 1`` = 32 of 61 layers stored per CP rank on the prefill node SGLang allows it on."""
    args = ("deepseek-v3.2", "--memory", "60GiB", "--tp-size", "2", "--attn-cp-size", "2", "--page-size", "64")
    done = run("plan", *args, "--enable-dsa-cache-layer-split", "--disaggregation-mode", "prefill", "--json")
    assert done.returncode == 0, done.stderr
    cell = Plan.from_dict(json.loads(done.stdout)).cell
    assert any("layer split over 2 CP ranks: 31 owned layer(s) of 61" in note for note in cell.notes)
