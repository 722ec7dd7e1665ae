"""vLLM 0.33's runtime-memory profile (issue 34): the CUDA-graph estimate vLLM 0.33 subtracts, hand-computed from
its sources (the peers venv's ``vllm/config/vllm.py`` ``_set_cudagraph_sizes`` L2452-2605,
``vllm/v1/worker/gpu_model_runner.py`` ``profile_cudagraph_memory`` L6268-6415, ``vllm/envs.py`` L2219-2220), the
profile file's fit against the logs it names, and the note a profile older or newer than the installed vLLM gives.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.engines.vllm import runtime_memory
from kvpools_core.engines.vllm.runtime_memory import (
    PROFILE_VERSIONS,
    GraphShape,
    cudagraph_capture_sizes,
    cudagraph_memory,
    estimate_runtime_memory,
    load_profile,
)
from kvpools_core.errors import ConfigError
from kvpools_core.pipeline.gpus import find_gpu

GiB = 1 << 30
H100_DEFAULT_SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
"""``vllm serve`` on an H100 (``max_num_seqs`` 1024, ``max_num_batched_tokens`` 8192): ceiling min(1024 x 2, 512)
= 512; 1, 2, 4, every 8 to 248, every 16 from 256 to 512 = 3 + 31 + 17 = 51 sizes; 1024 > 512 adds no decode size."""


def test_the_capture_sizes_by_hand() -> None:
    assert len(H100_DEFAULT_SIZES) == 51
    assert cudagraph_capture_sizes(max_num_seqs=1024, max_num_batched_tokens=8192) == H100_DEFAULT_SIZES
    # a smaller GPU's defaults (2048 / 256): ceiling min(512, 512) = 512, the decode size 256 is already there
    assert cudagraph_capture_sizes(max_num_seqs=256, max_num_batched_tokens=2048) == H100_DEFAULT_SIZES
    # max_num_seqs 20: ceiling 40; 1, 2, 4, 8, 16, 24, 32, 40 and the decode size 20 (L2549-2550, L2598-2603)
    assert cudagraph_capture_sizes(max_num_seqs=20, max_num_batched_tokens=8192) == [1, 2, 4, 8, 16, 20, 24, 32, 40]
    # max_num_batched_tokens within the ceiling is captured (L2593-2597): 100 tokens, ceiling min(2048, 512) -> 100
    assert cudagraph_capture_sizes(max_num_seqs=1024, max_num_batched_tokens=100)[-2:] == [96, 100]
    # a Blackwell's ceiling is 1024 (L2462-2464)
    assert cudagraph_capture_sizes(max_num_seqs=1024, max_num_batched_tokens=8192, blackwell=True)[-1] == 1024


LLAMA_8B = GraphShape(layers=32, attention_heads=32, value_head_dim=128, mlp_width=14336)
"""Llama-3.1-8B (its preset): 32 layers, 32 heads of 128, MLP 14336, bf16, FlashAttention."""
LLAMA_8B_H100_BYTES = 939_171_742
"""vllm-0.33.json's term for Llama-3.1-8B on the H100 defaults (51 PIECEWISE + 51 FULL graphs, largest 512), by
hand: per graph PIECEWISE round(0.218 MiB x 32) = 7,314,866 B, FULL round(0.177 MiB x 32) = 5,939,134 B; PIECEWISE
first round(64.3 MiB) + round(2.43 x 512 x 2 x 14336 x 2 B) = 67,423,437 + 71,345,111 = 138,768,548 B; FULL first
= the split-KV accumulators 32 x 512 x 32 x (128 + 1) x 4 B = 270,532,608 B + 5,939,134 = 276,471,742 B; total
276,471,742 + 50 x 7,314,866 + 50 x 5,939,134 = 939,171,742 B (895.7 MiB; vLLM 0.19.0 logged 860 MiB for it)."""


def test_the_033_cudagraph_term_by_hand() -> None:
    profile = load_profile("vllm==0.33")
    assert profile.cudagraph_subtracted
    term = cudagraph_memory(profile=profile, max_num_seqs=1024, max_num_batched_tokens=8192, graph=LLAMA_8B)
    assert term.bytes == LLAMA_8B_H100_BYTES
    assert "(PIECEWISE 51 - 1) x 6.98 MiB" in term.formula and "(FULL 51 - 1) x 5.66 MiB" in term.formula
    # 0.19 subtracts nothing (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS off in its logs)
    assert cudagraph_memory(profile=load_profile("0.19"), max_num_seqs=1024, max_num_batched_tokens=8192).bytes == 0


def test_the_profile_reproduces_the_logs_it_was_fitted_on() -> None:
    """The profile's four CUDA-graph constants are ``benchmarks.cudagraph_logs.fit`` of the data file's calibration
    records, to the rounding the profile states them with."""
    from benchmarks.cudagraph_logs import fit, load

    fitted = fit(load()["records"])
    data = json.loads((Path(runtime_memory.__file__).parent / "profiles" / "vllm-0.33.json").read_text())
    for name, digits in (
        ("cudagraph_piecewise_first_mib", 1),
        ("cudagraph_piecewise_first_per_mlp_output", 2),
        ("cudagraph_piecewise_per_graph_mib_per_layer", 3),
        ("cudagraph_full_per_graph_mib_per_layer", 3),
    ):
        assert data[name] == round(fitted[name], digits), name


def test_every_profile_exists() -> None:
    assert PROFILE_VERSIONS == ("0.16", "0.17", "0.19", "0.24", "0.26", "0.28", "0.29", "0.32", "0.33")
    for version in PROFILE_VERSIONS:
        profile = load_profile(version)
        assert profile.version == version and profile.fitted_on


@pytest.mark.parametrize(
    ("installed", "profile", "says"),
    [
        ("0.33.0", "0.19", "the profile (vLLM 0.19) is older than the installed vLLM 0.33.0"),
        ("0.19.1", "0.33", "the profile (vLLM 0.33) is newer than the installed vLLM 0.19.1"),
        ("0.33.2", "0.33", ""),
    ],
)
def test_a_profile_other_than_the_installed_engine_says_so(
    monkeypatch: pytest.MonkeyPatch, installed: str, profile: str, says: str
) -> None:
    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: installed)
    memory = estimate_runtime_memory(gpu=find_gpu("h100"), vocab_size=1000, engine_version=profile, graph=LLAMA_8B)
    assert memory.note == says


def test_cli_runtime_profile_033(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--runtime-profile vllm==0.33``: the CUDA-graph term is in the budget; 0.33 leaves less KV than 0.19 on the
    same GPU at the same utilization by that term (the other terms are the same constants; the default utilization
    differs, 0.9 against 0.92: ``tests/vllm/test_profile_versions.py``)."""
    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: None)
    base = ["plan", "llama-3.1-8b", "--accounting", "vllm", "--gpu", "h100", "--weights-memory", "15GiB", "--json"]
    base += ["--gpu-memory-utilization", "0.92"]
    runner = CliRunner()
    new = runner.invoke(main, [*base, "--runtime-profile", "vllm==0.33"])
    old = runner.invoke(main, [*base, "--runtime-profile", "0.19"])
    assert new.exit_code == 0 and old.exit_code == 0, new.output + old.output
    new_data, old_data = json.loads(new.output), json.loads(old.output)
    graphs = new_data["runtime_memory"]["terms"]["CUDA graphs"]["bytes"]
    assert graphs == LLAMA_8B_H100_BYTES
    kv_new = new_data["budget"][0]["available_kv_cache_memory"]
    kv_old = old_data["budget"][0]["available_kv_cache_memory"]
    assert kv_old - kv_new == graphs


def test_whole_gpu_benchmark_reports_held_out_per_version_and_sglangs_refusal() -> None:
    """``benchmarks/whole_gpu_accuracy.py`` (no peers): the held-out rows per engine version, the CUDA-graph term on
    the held-out logs that name a kvpools model (16; the hybrid GGUF one names none): the per-model formula of
    vllm-0.33.json (runtime_memory.cudagraph_memory) against vLLM 0.19.0's logged estimate, mean +10.27 %, worst
    +41.99 % (phi-2); the former two constants were +136.18 % on average, +291.51 % at worst), and SGLang's own
    refusal (DeepSeek-V4-Pro on 8 x H200 at --mem-fraction-static 0.88, 125.65 GB of
    weights) refused by kvpools too."""
    from benchmarks.whole_gpu_accuracy import run

    report = run(None)
    runtime = report["tools"]["kvpools-runtime (logged weights)"]
    assert "vllm 0.19.0" in runtime["held_out"]
    assert report["terms"]["CUDA graphs"]["held_out"] == "n=16 mean +10.27 %, mean abs 21.29 %, worst +41.99 %"
    sglang = report["tools"]["kvpools-sglang (logged weights)"]
    reason = sglang["refused"]["sglang-inferencex-2128-dsv4-pro-h200-tp8"]
    assert "Loaded weights leave no memory for the KV cache under mem_fraction_static=0.88" in reason
    # Qwen3-235B-A22B-FP8, TP 4, H100, --mem-fraction-static 0.93, weights estimated as fp8: 360,785 tokens against
    # SGLang's logged 367,404 (-1.80 %)
    # the peers run only with --peers-venv: without it each says so instead of predicting
    for peer in ("aiconfigurator 0.12.0", "llm-d-planner 0.3.3 (logged weights)"):
        assert all(
            reason.startswith("not run: pass --peers-venv") for reason in report["tools"][peer]["refused"].values()
        )
    run_ = report["tools"]["kvpools-sglang (estimated weights)"]["runs"]["sglang-21348-qwen3-235b-fp8-tp4-h100"]
    assert run_["predicted"]["tokens"] == 360_785
    assert round(run_["errors_pct"]["kv_tokens"], 2) == -1.80


def test_the_exact_path_takes_no_profile() -> None:
    """Given ``memory`` (vLLM's --kv-cache-memory-bytes) the budget is that memory, whatever profiles exist: the
    0.33 profile is refused beside it, and without one the plan carries no runtime terms; 40 GiB / 2 MiB blocks of
    llama-3.1-8b (32 layers x 16 tokens x 4096 B) = 20,480 blocks."""
    from kvpools_core.engines.vllm.deployment import plan_vllm

    with pytest.raises(ConfigError, match="does not apply to it"):
        plan_vllm("llama-3.1-8b", memory="40GiB", runtime_profile="vllm==0.33")
    exact = plan_vllm("llama-3.1-8b", memory="40GiB")
    assert exact.runtime_memory is None
    assert [budget.available_kv_cache_memory for budget in exact.budgets] == [40 * GiB]
    assert exact.plan.num_gpu_blocks == 40 * GiB // (2 << 20)
