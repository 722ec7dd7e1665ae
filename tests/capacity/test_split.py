"""The workload-aware split (kvpools_core.planning.split): the closed form by hand, the never-worse / within-budget
property over generated workloads, and ``kvpools capacity --workload`` through click."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpools_core.cli import main
from kvpools_core.errors import ConfigError
from kvpools_core.pipeline import plan
from kvpools_core.planning.capacity import concurrency
from kvpools_core.planning.split import SAMPLES, Workload, choose_split, parse_workload, workload_concurrency
from kvpools_core.values import Serving

SGLANG = Serving(accounting="sglang")


def test_swa_closed_form_by_hand() -> None:
    """gpt-oss-20b, bf16, page 1, SGLang's accounting, 20 GiB, 8k requests.

    12 full and 12 SWA layers of 8 KV heads x 64 x (K + V) x 2 B = 24,576 B per token in either pool, so
    F + S <= 20 GiB // 24,576 = 873,813.  A request of 8,192 tokens holds 8,192 full tokens and, past
    the window of 128, 128 + 128 (eviction interval) + 1 (page) + 1 (decode) = 258 SWA tokens, with two
    prefill chunks of min(8,192, 8,192 - 258) = 7,934 in flight and a page reserved: n requests need
    8,192 n full + (258 n + 15,869) SWA tokens, so n* = (873,813 - 15,869) // 8,450 = 101.  SGLang's
    0.8 gives F = 873,813 / 1.8 = 485,451 full tokens: 485,451 // 8,192 = 59.
    """
    choice = choose_split("gpt-oss-20b", SGLANG, {"memory": "20GiB"}, "8k")
    assert (873_813 - 15_869) // 8_450 == 101
    assert choice.default.concurrent_requests == 485_451 // 8192 == 59
    assert choice.chosen.concurrent_requests == 101
    assert choice.knob == "swa_full_tokens_ratio"
    swa = choice.plan.counts["tokens"]["swa"]
    assert swa >= 258 * 101 + 15_869  # the SWA pool holds the 101 requests' worst case and the chunks
    assert choice.plan.counts["tokens"]["full"] >= 101 * 8192
    assert choice.flags() == ("--swa-full-tokens-ratio", str(choice.value), "--max-running-requests", "101")
    # the closed form lands the optimum: one more request does not fit at any ratio (F + S <= 873,813)
    assert 102 * 8192 + 258 * 102 + 15_869 > 873_813


def test_mamba_slots_land_the_optimum() -> None:
    """qwen3-next at 60 GiB, 32k requests: K = 3 n slots (3 per request with the extra buffer), and n + 1
    requests do not fit with K = 3 (n + 1) — the budget then leaves fewer than n + 1 requests' full tokens."""
    choice = choose_split("qwen3-next-80b-a3b-thinking", SGLANG, {"memory": "60GiB"}, "32k")
    n = choice.chosen.concurrent_requests
    assert choice.knob == "max_mamba_cache_size"
    assert choice.value == 3 * n
    assert choice.default.concurrent_requests == 42 and n == 62
    more = plan(
        "qwen3-next-80b-a3b-thinking", Serving(accounting="sglang", max_mamba_cache_size=3 * (n + 1)), memory="60GiB"
    )
    assert concurrency(more, 32768).concurrent_requests <= n
    assert choice.flags() == ("--max-mamba-cache-size", str(3 * n), "--max-running-requests", str(n))


def test_one_length_is_capacity_concurrency() -> None:
    p = plan("gemma-2-9b", Serving(), memory="8GiB")
    for length in (1000, 4096, 8192):
        assert workload_concurrency(p, Workload((length,), "x")).concurrent_requests == (
            concurrency(p, length).concurrent_requests
        )


def test_specs_parse() -> None:
    assert parse_workload("8k").lengths == (8192,)
    uniform = parse_workload("uniform:1k..32k")
    assert len(uniform.lengths) == SAMPLES and min(uniform.lengths) >= 1024 and max(uniform.lengths) <= 32768
    lognormal = parse_workload("lognormal:median=4096,p99=32768")
    assert sorted(lognormal.lengths)[SAMPLES // 2] in range(3800, 4400)
    for bad in ("lognormal:median=4k", "uniform:32k..1k", "eight", "lognormal:median=8k,p99=4k"):
        with pytest.raises(ConfigError, match="workload"):
            parse_workload(bad)


MODELS = {
    "gpt-oss-20b": ("8GiB", "20GiB"),
    "gemma-2-9b": ("8GiB", "24GiB"),
    "qwen3-next-80b-a3b-thinking": ("30GiB", "60GiB"),
}
workloads = st.one_of(
    st.integers(256, 64 * 1024).map(lambda n: Workload((n,), f"{n}", clamp=True)),
    st.lists(st.integers(64, 64 * 1024), min_size=2, max_size=6).map(lambda ls: Workload(tuple(ls), "mix", clamp=True)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model=st.sampled_from(sorted(MODELS)), which=st.integers(0, 1), workload=workloads)
def test_chosen_split_within_budget_and_never_worse(model: str, which: int, workload: Workload) -> None:
    choice = choose_split(model, Serving(), {"memory": MODELS[model][which]}, workload)
    assert choice.plan.planned_bytes <= choice.plan.budget.budget_bytes
    assert choice.chosen.concurrent_requests >= choice.default.concurrent_requests
    # the reported answers are the plans' own
    assert workload_concurrency(choice.plan, workload) == choice.chosen
    assert workload_concurrency(choice.default_plan, workload) == choice.default


# ----------------------------------------------------------------------------------------------------- CLI


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["capacity", *args])


def test_cli_fixed_workload() -> None:
    out = run("gpt-oss-20b", "--memory", "20GiB", "--accounting", "sglang", "--context", "8k", "--workload", "8k")
    assert out.exit_code == 0, out.output
    assert "workload-aware split — workload 8k" in out.output
    assert "concurrent requests: 59 -> 101 (x1.71)" in out.output
    assert "--max-running-requests 101" in out.output


def test_cli_distribution_json() -> None:
    args = ("qwen3-next-80b-a3b-thinking", "--memory", "60GiB", "--context", "32k")
    out = run(*args, "--workload", "uniform:1k..32k", "--json")
    assert out.exit_code == 0, out.output
    split = json.loads(out.output)["split"]
    assert split["knob"] == "max_mamba_cache_size"
    assert split["chosen"]["concurrent_requests"] >= split["default"]["concurrent_requests"]
    assert split["planned_bytes"]["chosen"] <= split["budget_bytes"]
    assert f"--max-mamba-cache-size {split['value']}" in split["flags"]
    assert "split" not in json.loads(run(*args, "--json").output)


def test_cli_jsonl_trace(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"input_len": n, "output_len": 512}) for n in (2000, 7000, 30000)) + "\n")
    out = run("gemma-3-27b-it", "--memory", "40GiB", "--context", "8k", "--workload", str(trace), "--json")
    assert out.exit_code == 0, out.output
    split = json.loads(out.output)["split"]
    assert split["workload"] == str(trace)
    assert split["knob"] == "swa_full_tokens_ratio" and split["value"] < 0.8
    assert split["gain"] > 1


def test_cli_bad_spec_names_the_option() -> None:
    out = run("gpt-oss-20b", "--memory", "20GiB", "--workload", "lognormal:median=4k")
    assert out.exit_code == 1
    assert "--workload" in out.output and "p99=" in out.output
    assert "Traceback" not in out.output
