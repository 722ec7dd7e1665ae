"""``--engine-version ENGINE==X.Y`` (issue 34): picks the accounting and, for vLLM, the runtime profile; refuses a
version or an engine without a profile and a flag that names something else; leaves the exact path (``--memory``)
unchanged; and a plan made with a profile other than the installed engine's says so."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.engines.vllm import runtime_memory

GiB = 1 << 30
BASE = ("plan", "llama-3.1-8b", "--gpu", "h100", "--weights-memory", "15GiB", "--json")


@pytest.fixture(autouse=True)
def _no_installed_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: None)


def _plan(*args: str) -> dict:
    result = CliRunner().invoke(main, [*BASE, *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def _refused(*args: str, base: tuple[str, ...] = BASE) -> str:
    result = CliRunner().invoke(main, [*base, *args])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    return result.output


@pytest.mark.parametrize("version", ["0.15", "0.16", "0.19", "0.33"])
def test_vllm_engine_version_is_accounting_vllm_with_that_runtime_profile(version: str) -> None:
    assert _plan("--engine-version", f"vllm=={version}") == _plan("--accounting", "vllm", "--runtime-profile", version)


def test_vllm_016_leaves_less_kv_than_019_by_the_sort() -> None:
    """Llama-3.1-8B (vocab 128,256) on vllm serve's H100 defaults (1024 rows): 0.16's peak is (36 - 12) x 1024 x
    128,256 = 3,152,019,456 B above 0.19's, less the top-k/top-p kernel's cached buffer only 0.19 keeps (132 SMs x
    128,256 x 4 B = 67,719,168, ``topk_topp_triton.py`` L1010-1019): 3,084,300,288 B, and the KV budget is smaller
    by exactly that."""
    old, new = _plan("--engine-version", "vllm==0.16"), _plan("--engine-version", "vllm==0.19")
    assert old["runtime_memory"]["profile"] == "vllm-0.16"
    peak = {
        data["runtime_memory"]["profile"]: data["runtime_memory"]["terms"]["activation peak"]["bytes"]
        for data in (old, new)
    }
    assert peak["vllm-0.16"] - peak["vllm-0.19"] == 24 * 1024 * 128_256 - 132 * 128_256 * 4 == 3_084_300_288
    kv_old = old["budget"][0]["available_kv_cache_memory"]
    kv_new = new["budget"][0]["available_kv_cache_memory"]
    assert kv_new - kv_old == 3_084_300_288


def test_the_plan_says_which_vllm_it_models() -> None:
    """``plan_vllm`` reproduces vLLM 0.33's sizing: a 0.16 profile's plan says it was made with 0.16's profile."""
    note = _plan("--engine-version", "vllm==0.16")["runtime_memory"]["note"]
    assert note == "made with vLLM 0.16's calibrated profile for vLLM 0.33"
    assert _plan("--engine-version", "vllm==0.33")["runtime_memory"]["note"] == ""


def test_installed_vllm_other_than_the_profile_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: "0.19.1")
    note = _plan("--engine-version", "vllm==0.33")["runtime_memory"]["note"]
    assert note == "the profile (vLLM 0.33) is newer than the installed vLLM 0.19.1"
    note = _plan("--engine-version", "vllm==0.16")["runtime_memory"]["note"]
    assert "the profile (vLLM 0.16) is older than the installed vLLM 0.19.1" in note


def test_memory_keeps_the_exact_path() -> None:
    """With ``--memory`` (vLLM's --kv-cache-memory-bytes) the KV budget is given: the plan is the one without
    ``--engine-version``, byte for byte."""
    base = ("plan", "llama-3.1-8b", "--memory", "40GiB", "--json")
    runner = CliRunner()
    exact = runner.invoke(main, [*base, "--accounting", "vllm"])
    versioned = runner.invoke(main, [*base, "--engine-version", "vllm==0.16"])
    assert exact.exit_code == 0 and versioned.exit_code == 0, exact.output + versioned.output
    assert json.loads(exact.output) == json.loads(versioned.output)
    assert json.loads(versioned.output)["budget"][0]["available_kv_cache_memory"] == 40 * GiB


def test_sglang_engine_version_is_accounting_sglang() -> None:
    base = ("plan", "llama-3.1-8b", "--gpu", "h100", "--json")
    runner = CliRunner()
    versioned = runner.invoke(main, [*base, "--engine-version", "sglang==0.5.23"])
    plain = runner.invoke(main, [*base, "--accounting", "sglang"])
    assert versioned.exit_code == 0 and plain.exit_code == 0, versioned.output + plain.output
    assert json.loads(versioned.output) == json.loads(plain.output)


def test_capacity_takes_it_too() -> None:
    args = ("capacity", "llama-3.1-8b", "--gpu", "h100", "--json", "--context", "8192")
    runner = CliRunner()
    versioned = runner.invoke(main, [*args, "--engine-version", "vllm==0.16"])
    plain = runner.invoke(main, [*args, "--accounting", "vllm", "--runtime-profile", "0.16"])
    assert versioned.exit_code == 0, versioned.output
    assert json.loads(versioned.output) == json.loads(plain.output)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--engine-version", "0.19"), "--engine-version must look like ENGINE==X.Y"),
        (("--engine-version", "vllm=="), "--engine-version must look like ENGINE==X.Y"),
        (("--engine-version", "vllm==0.14"), "no calibrated runtime-memory profile for vLLM '0.14'"),
        (("--engine-version", "sglang==0.5.9"), "no runtime-memory profile for SGLang '0.5.9'"),
        (("--engine-version", "trtllm==1.2"), "kvpools does not model trtllm's per-version runtime memory yet"),
        (("--engine-version", "vllm==0.33", "--accounting", "sglang"), "plans for vllm but --accounting is sglang"),
        (
            ("--engine-version", "vllm==0.19", "--runtime-profile", "0.33"),
            "takes vLLM 0.19's runtime profile but --runtime-profile is 0.33",
        ),
    ],
)
def test_refusals(args: tuple[str, ...], message: str) -> None:
    assert message in _refused(*args)
