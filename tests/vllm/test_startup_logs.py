"""The collected start-up logs (``benchmarks/data/startup_logs.json``) and vLLM's memory outside the KV cache
(``kvpools_core.engines.vllm.runtime_memory``), issue 34.

The log numbers are the data's; the expected values below are computed by hand from them and from the cited
vLLM lines (``ceil(total x utilization)``, ``v1/worker/utils.py`` L724; ``non_kv_cache_memory``,
``utils/mem_utils.py`` L312-321).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.startup_logs import DATA, load_startup_logs
from kvpools_core.engines.vllm import VllmLimits, plan_kv_cache
from kvpools_core.engines.vllm.budget import available_kv_cache_memory
from kvpools_core.engines.vllm.model import worker_kv_cache_specs
from kvpools_core.engines.vllm.runtime_memory import estimate_runtime_memory, load_profile, model_shape_of
from kvpools_core.errors import ConfigError
from kvpools_core.models import load_model
from kvpools_core.parts.device_memory import SMI_TO_TORCH_GAP_BYTES, torch_total_memory
from kvpools_core.pipeline.gpus import find_gpu
from kvpools_core.pipeline.sglang_profile import load_sglang_profile
from kvpools_core.registry import Registry
from kvpools_core.values import Serving

GiB = 1 << 30


def _texts(value: float | int) -> set[str]:
    texts = {str(value), f"{value:,}", f"{value:.2f}"}
    if isinstance(value, float) and value.is_integer():
        texts |= {str(int(value)), f"{int(value):,}"}
    return texts


def test_at_least_thirty_cited_logs_of_both_engines() -> None:
    logs = load_startup_logs()
    assert len(logs) >= 30
    assert {log.engine for log in logs} == {"vllm", "sglang"}
    assert len({log.engine_version for log in logs if log.engine_version}) >= 4
    assert len({log.gpu for log in logs if log.gpu}) >= 4
    assert {log.family for log in logs} >= {"dense", "moe", "mla", "hybrid"}
    assert all(log.source.startswith("https://github.com/") for log in logs)


def test_every_logged_number_is_quoted_in_its_lines() -> None:
    """Cite, never invent: each number in ``logged`` appears, as the engine printed it, in the quoted lines."""
    for log in load_startup_logs():
        text = "\n".join(log.lines)
        for name in (
            "total_gib",
            "weights_gib",
            "available_kv_gib",
            "kv_tokens",
            "num_gpu_blocks",
            "max_concurrency",
            "cudagraph_gib",
            "cudagraph_piecewise",
        ):
            value = log.logged.get(name)
            if value is None:
                continue
            assert any(candidate in text for candidate in _texts(value)), (log.id, name, value)


def test_the_loader_refuses_a_record_without_a_source(tmp_path: Path) -> None:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    data["records"][0]["source"] = "from memory"
    path = tmp_path / "logs.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=r"source must be a github\.com URL"):
        load_startup_logs(path)


def test_calibration_and_held_out_runs_name_their_version() -> None:
    logs = load_startup_logs()
    split = [log for log in logs if log.split]
    assert {log.split for log in split} == {"calibration", "held_out"}
    assert all(log.engine_version for log in split)
    # each calibration record is named by the profile it calibrates: 0.19.0 runs by vllm-0.19.json, the others by
    # the source URLs vllm-0.33.json's fitted_on lists
    # the others by the source URLs vllm-0.33.json's fitted_on lists; an SGLang calibration record by the evidence
    # of profiles/sglang-0.5.23.json (the runtime before the weights it fits), every other SGLang record held out
    fitted_033 = load_profile("0.33").fitted_on
    sglang_evidence = {item["source"] for item in load_sglang_profile("0.5.23").evidence}
    for log in split:
        if log.engine == "sglang":
            assert (log.split == "calibration") == (log.source in sglang_evidence), log.id
        elif log.split == "calibration" and log.engine_version != "0.19.0":
            assert log.source.removeprefix("https://github.com/").split("/pull/")[0].split("/issues/")[0] in fitted_033


def test_every_record_has_a_source_flags_and_lines() -> None:
    """Data integrity: a github.com source, the flags as a mapping, at least one quoted line, a logged number."""
    for log in load_startup_logs():
        assert log.source.startswith("https://github.com/") and "/" in log.source[19:], log.id
        assert isinstance(log.flags, dict), log.id
        assert log.lines and all(line.strip() for line in log.lines), log.id
        assert any(value is not None for value in log.logged.values()), log.id


def test_h100_total_is_torchs_79_19_gib_not_nvidia_smis() -> None:
    h100 = find_gpu("h100")
    total = torch_total_memory(h100)
    assert total.measured and total.bytes == round(79.19 * GiB)
    assert h100.total_bytes == 81559 * (1 << 20)  # the catalogue keeps nvidia-smi's figure
    # vLLM 0.19's request at --gpu-memory-utilization 0.95: the log's 'worker requested memory: 75.23GiB'
    assert f"{math.ceil(total.bytes * 0.95) / GiB:.2f}" == "75.23"


def test_a_gpu_without_a_measured_total_is_derived_and_says_so() -> None:
    h200 = find_gpu("h200")
    total = torch_total_memory(h200)
    assert not total.measured and total.source.startswith("catalogue total")
    assert total.bytes == 143771 * (1 << 20) - SMI_TO_TORCH_GAP_BYTES


def test_llama_8b_h100_budget_from_the_gpu_matches_the_log(registry: Registry) -> None:
    """llm-d-planner's vLLM 0.19.0 run (calibration set): 14.99 GiB weights, 'Available KV cache memory' 58.11 GiB,
    476,016 tokens at max_model_len 2048.  Activation (``runtime_memory.activation_peak``, worked out in
    ``tests/vllm/test_runtime_terms.py``): 1024 rows x 128,256 x 14 B + the top-k/top-p buffer 132 x 128,256 x 4 B +
    the held hidden states (8192 + 2 x 1024) x 4096 x 2 B + the 32 MiB cuBLAS workspace = 2,023,837,696 B (1.885 GiB,
    logged 1.89); non-torch 0.25 GiB; request ceil(79.19 GiB x 0.95)."""
    runtime = estimate_runtime_memory(
        gpu=find_gpu("h100"), vocab_size=128256, engine_version="0.19.0", shape=model_shape_of("llama-3.1-8b")
    )
    assert runtime.term("activation peak").bytes == 1024 * 128256 * 14 + 132 * 128256 * 4 + 83_886_080 + (32 << 20)
    assert runtime.term("non-torch").bytes == round(0.25 * GiB)
    assert runtime.term("CUDA graphs").bytes == 0
    budget = available_kv_cache_memory(
        total_memory=runtime.total.bytes,
        gpu_memory_utilization=0.95,
        weights_memory=round(14.99 * GiB),
        activation_peak_memory=runtime.term("activation peak").bytes,
        non_torch_memory=runtime.term("non-torch").bytes,
    )
    assert f"{budget.available_kv_cache_memory / GiB:.2f}" == "58.11"
    model, _ = load_model("llama-3.1-8b", registry)
    (worker,) = worker_kv_cache_specs(model, Serving(tp_size=1), registry, block_size=16)
    plan = plan_kv_cache(
        [worker],
        [budget.available_kv_cache_memory],
        VllmLimits(max_model_len=2048, max_num_batched_tokens=8192, max_concurrent_batches=1),
    )
    assert abs(plan.kv_cache_size_tokens - 476_016) / 476_016 < 0.001


def test_held_out_qwen_activation_within_three_percent() -> None:
    """Qwen2.5-7B-Instruct (held out): the report's 2.21 GiB; the formula gives 1024 x 152,064 x 14 B + 132 x
    152,064 x 4 B + (8192 + 2 x 1024) x 3584 x 2 B + 32 MiB = 2.205 GiB (-0.24 %; the 12-byte formula with its fitted
    0.4126 GiB base gave 2.153, -2.6 %)."""
    shape = model_shape_of("qwen2.5-7b-instruct")
    runtime = estimate_runtime_memory(gpu=find_gpu("h100"), vocab_size=152064, shape=shape)
    assert abs(runtime.term("activation peak").bytes / GiB - 2.21) / 2.21 < 0.003


def test_non_torch_grows_with_tensor_parallelism() -> None:
    profile = load_profile("0.19")
    sizes = [
        estimate_runtime_memory(gpu=find_gpu("h100"), vocab_size=1000, tp_size=tp).term("non-torch").bytes
        for tp in (1, 2, 4, 8)
    ]
    assert sizes == [round(0.25 * GiB), round(2.07 * GiB), round(2.13 * GiB), round(2.13 * GiB)]
    assert profile.cudagraph_subtracted is False


def test_a_version_without_a_profile_is_refused_or_borrowed_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpools_core.engines.vllm import runtime_memory
    from kvpools_core.engines.vllm.runtime_memory import graph_shape_of

    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: None)
    with pytest.raises(ConfigError, match=r"no calibrated runtime-memory profile for vLLM .0\.34."):
        estimate_runtime_memory(gpu=find_gpu("h100"), vocab_size=1000, engine_version="0.34")
    # vLLM 0.27 has a profile since issue 34's vers34 work: vllm-0.26.json covers it, so no note
    graph = graph_shape_of("llama-3.1-8b")  # the CUDA-graph estimate's shape, which 0.20 on subtract
    assert estimate_runtime_memory(gpu=find_gpu("h100"), vocab_size=1000, engine_version="0.27", graph=graph).note == ""
    borrowed = estimate_runtime_memory(
        gpu=find_gpu("h100"), vocab_size=1000, engine_version="0.33", profile_version="0.19"
    )
    assert borrowed.note == "made with vLLM 0.19's calibrated profile for vLLM 0.33"


def test_whole_gpu_benchmark_held_out_kv_error_before_and_after() -> None:
    """``benchmarks/whole_gpu_accuracy.py`` without peers: on the held-out vLLM 0.19 runs with logged weights, the
    runtime profile brings the KV GiB error from the 79.65 GiB / weights-only budget's 4-7 % to under 0.15 % (1.5 % for
    the float32 and runtime-fp8 runs).  The bounds hold whether or not the benchmark passes the model's shape to the
    activation peak: without it (the hidden-state terms left out) the bf16 runs are +0.11 % and float32 +0.92 %; with
    it -0.01 % and +1.13 % (the float32 forward peak is under-estimated)."""
    from benchmarks.whole_gpu_accuracy import run

    report = run(None)
    logs = load_startup_logs()
    # the report-table rows this test was written for; the full logs of the same sweep (llmd-v0.19-log-*, logs34)
    # have their own test below
    split = {
        log.id: log.split if log.engine_version == "0.19.0" and log.evidence == "report_table" else None for log in logs
    }

    def held_out(tool: str) -> list[float]:
        runs = report["tools"][tool]["runs"]
        return [
            row["errors_pct"]["kv_gib"]
            for run_id, row in runs.items()
            if split[run_id] == "held_out" and row["errors_pct"]["kv_gib"] is not None
        ]

    # The --dtype float32 and --quantization fp8 runs are planned since issue 34's weights work; the profile was
    # calibrated on bf16 runs, so they are held to 1 % (float32 +0.75 %, runtime fp8 +0.00 %), the rest to 0.1 %.
    other_dtype = {"llmd-v0.19-llama-3.1-8b-float32", "llmd-v0.19-llama-3.1-8b-runtime-fp8"}
    runs = report["tools"]["kvpools-runtime (logged weights)"]["runs"]
    before, after = held_out("kvpools-before (logged weights)"), held_out("kvpools-runtime (logged weights)")
    assert len(after) >= 7
    assert min(before) > 3.5  # the old budget over-estimates every held-out run
    bf16 = [
        row["errors_pct"]["kv_gib"]
        for run_id, row in runs.items()
        if run_id not in other_dtype and split[run_id] == "held_out"
    ]
    assert max(abs(error) for error in bf16 if error is not None) < 0.15
    assert all(abs(runs[run_id]["errors_pct"]["kv_gib"]) < 1.5 for run_id in other_dtype)
    refused = report["tools"]["kvpools-runtime (logged weights)"]["refused"]
    assert not other_dtype & set(refused)


LLMD_LOGS = "https://github.com/llm-d-incubation/llm-d-planner/blob/d3121e059da88662db39a926a3ead964be97359b/"


def test_the_llmd_sweep_logs_are_held_out_and_planned_within_target() -> None:
    """llm-d-planner's full vLLM 0.19.0 H100 logs (commit d3121e0, ``llmd-v0.19-log-*``, logs34): 15 runs of 14
    checkpoints kvpools has a config for (dense, MoE, MLA, sliding-window, multimodal; TP 1/2/4), held out by the
    split rule (no profile is fitted on them).  Measured (fix34): with the logged weights the KV GiB error is at most
    0.45 % (granite-3.3-8b) and 0.066 % mean absolute (0.59 % and 0.105 % before gpt-oss's monolithic mxfp4 kernel
    held no MoE workspace); from the GPU alone 0.41 % mean absolute and every run within 2 % (Gemma-3 27B the worst,
    +1.87 %: vLLM's rotary caches, see test_gemma_3_weights_gap_is_the_rotary_caches; Mistral-Small-3.1 was +3.02 %
    before the Pixtral tower was counted, +0.12 % now)."""
    from benchmarks.whole_gpu_accuracy import run

    logs = [log for log in load_startup_logs() if log.id.startswith("llmd-v0.19-log-")]
    assert len(logs) == 15
    assert all(log.split == "held_out" and log.source.startswith(LLMD_LOGS) for log in logs)
    report = run(None)["tools"]
    logged = report["kvpools-runtime (logged weights)"]["runs"]
    estimated = report["kvpools-runtime (estimated weights)"]["runs"]
    for metric in ("kv_gib", "kv_tokens", "max_concurrency"):
        errors = [logged[log.id]["errors_pct"][metric] for log in logs]
        assert max(abs(error) for error in errors) < 0.5, metric
        assert sum(abs(error) for error in errors) / len(errors) < 0.1, metric
        errors = [estimated[log.id]["errors_pct"][metric] for log in logs]
        assert sum(abs(error) for error in errors) / len(errors) < 0.45, metric
        assert max(abs(error) for error in errors) < 2, metric


def test_mistral_small_3_1_weights_include_the_pixtral_tower() -> None:
    """vLLM 0.19.0 logs 'Model loading took 44.76 GiB' for Mistral-Small-3.1-24B-Instruct-2503 (record
    llmd-v0.19-log-mistral-small-3.1-24b-tp1); kvpools' estimate was the text model alone, 23,572,403,200 parameters
    (43.91 GiB).  vLLM's Mistral3ForConditionalGeneration also loads the Pixtral vision tower and the projector
    (model_executor/models/mistral3.py: init_vision_tower_for_mistral3 -> PixtralHFVisionModel, Mistral3PatchMerger,
    Mistral3MultiModalProjector; pixtral.py's PixtralHFTransformerBlock): patch_conv 3 x 14 x 14 x 1024 = 602,112,
    ln_pre 1,024, 24 layers x (4 x 1024^2 attention + 3 x 1024 x 4096 MLP + 2 x 1024 norms) = 402,702,336, the
    projector's norm 1,024, merging layer 4 x 1024 x 1024 = 4,194,304, linear_1 1024 x 5120 = 5,242,880 and linear_2
    5120 x 5120 = 26,214,400: 438,958,080 parameters, 0.818 GiB in bf16, which leaves 0.035 GiB of the logged 0.853
    GiB gap (3.1 MB of it the Pixtral rotary table, a buffer, not counted)."""
    from kvpools_core.pipeline.weights import estimate_weights

    model = "tests/weights/configs/mistralai--Mistral-Small-3.1-24B-Instruct-2503.json"
    estimate = estimate_weights(model, Serving(accounting="vllm"))
    assert estimate.parameters == 23_572_403_200 + 438_958_080
    assert estimate.bytes_per_rank == 2 * (23_572_403_200 + 438_958_080)
    assert 44.76 - 0.005 - estimate.bytes_per_rank / GiB == pytest.approx(0.035, abs=0.006)


@pytest.mark.parametrize("limits", [{"language_model_only": True}, {"limit_mm_per_prompt": {"image": 0}}])
def test_mistral_small_3_1_without_images_drops_the_pixtral_tower(limits: dict[str, object]) -> None:
    """``--language-model-only`` or ``{"image": 0}``: vLLM 0.33 does not build the tower it marked for the image
    modality (``mistral3.py`` L478, ``_mark_tower_model``); the plan's weights are the text model's,
    438,958,080 x 2 = 877,916,160 B less, and the KV budget gains them."""
    from kvpools_core.engines.vllm.deployment import plan_vllm

    model = "tests/weights/configs/mistralai--Mistral-Small-3.1-24B-Instruct-2503.json"
    default = plan_vllm(model, Serving(accounting="vllm"), gpu="h100")
    text = plan_vllm(model, Serving(accounting="vllm"), gpu="h100", **limits)  # type: ignore[arg-type]
    assert default.weights_memory[0] - text.weights_memory[0] == 877_916_160
    assert default.weights_memory[0] == 2 * (23_572_403_200 + 438_958_080)
    gained = text.budgets[0].available_kv_cache_memory - default.budgets[0].available_kv_cache_memory
    assert gained == 877_916_160
    assert "less the vision tower's 0.82 GiB" in text.weights_source


@pytest.mark.parametrize(
    ("model", "head_dim", "parameters", "left"),
    [("gemma-3-12b-it", 256, 12_187_325_040, 0.047), ("gemma-3-27b-it", 128, 27_432_406_640, 0.071)],
)
def test_gemma_3_weights_gap_is_the_rotary_caches(model: str, head_dim: int, parameters: int, left: float) -> None:
    """vLLM 0.19.0 logs 'Model loading took 23.31 GiB' (12B) and '51.45 GiB' (27B) where kvpools counts the
    parameters, 22.70 / 51.10 GiB in bf16: 0.61 / 0.35 GiB under.  Not a parameter: "Model loading took" is the
    allocated memory after ``load_model`` less before (``DeviceMemoryProfiler``), buffers included, and each
    Gemma3Attention builds its rotary embedding with ``get_rope`` (vLLM 0.19.0 ``models/gemma3.py`` L167-186; one
    instance per distinct parameter set, ``rotary_embedding/__init__.py`` L68-78, so two: the log's
    'rotary_embedding': 2).  Each registers a ``cos_sin_cache`` buffer in the model dtype (``base.py`` L58-63) of
    ``[positions, head_dim]``: the sliding layers' default RoPE (``rope_local_base_freq``) over
    ``max_position_embeddings`` = 131,072 positions, the global layers' linear-scaled RoPE (factor 8) over
    131,072 x 8 = 1,048,576 (``linear_scaling_rope.py`` L79-92).  12B (head_dim 256): (131,072 + 1,048,576) x 256
    x 2 B = 603,979,776 B = 0.5625 GiB; 27B (head_dim 128): 301,989,888 B = 0.28125 GiB, leaving 0.047 / 0.071
    GiB (±0.005, the log's rounding) unexplained.  kvpools' weights estimate counts parameters (and SGLang's weights
    the same way), so the caches stay out of it: this test pins the explanation, not a fitted term."""
    (log,) = [log for log in load_startup_logs() if log.id == f"llmd-v0.19-log-{model}-tp1"]
    from kvpools_core.pipeline.weights import estimate_weights

    assert estimate_weights(model, Serving(accounting="vllm")).bytes_per_rank == 2 * parameters
    caches = (131_072 + 131_072 * 8) * head_dim * 2
    assert caches == {256: 603_979_776, 128: 301_989_888}[head_dim]
    gap = log.logged["weights_gib"] - 2 * parameters / GiB
    assert gap - caches / GiB == pytest.approx(left, abs=0.006)


def test_the_version_sweep_is_held_out_with_the_nearest_profile() -> None:
    """llm-d-planner's Qwen3-14B H100 rows for vLLM 0.15.0 to 0.18.0 (never calibrated on): 0.17 with vllm-0.17.json
    and 0.18 with vllm-0.19.json (which covers it), both carrying 0.19's constants, within 0.3 % of the logged
    45.34 / 45.23 GiB.  0.15 and 0.16 with vllm-0.16.json, whose sampler sorts
    (36 B per logit, not 12) and whose activation peak is then 5.635 GiB against the logged 5.64 (0.19's profile gave
    +8 % KV).  What is left is the non-torch memory: 0.25 GiB from 0.19 against the 0.13 GiB 0.15-0.17 logged (not
    fitted: these rows are held out), so 0.15-0.17 come out under the log: -0.27 / -0.25 % with the model's shape,
    -0.04 / -0.03 % without it (the hidden-state terms left out, which happen to offset it)."""
    from benchmarks.whole_gpu_accuracy import profile_for, run

    assert [profile_for(f"0.{minor}.0") for minor in (15, 16, 17, 18, 19)] == ["0.16", "0.16", "0.17", "0.19", "0.19"]
    runs = run(None)["tools"]["kvpools-runtime (logged weights)"]["runs"]
    error = {
        version: runs[f"llmd-v{version}-qwen3-14b-tp1"]["errors_pct"]["kv_gib"]
        for version in ("0.15.0", "0.16.0", "0.17.0", "0.18.0")
    }
    assert abs(error["0.17.0"]) < 0.3 and abs(error["0.18.0"]) < 0.3
    assert -0.35 < error["0.15.0"] < 0 and -0.35 < error["0.16.0"] < 0


def test_plan_vllm_runtime_profile_is_an_explicit_switch() -> None:
    """``plan_vllm(..., runtime_profile="0.19")`` on the calibration run: the KV budget comes out as the log's
    58.11 GiB within the weights estimate's 0.03 GiB (14.96 GiB estimated, 14.99 GiB logged), 476,016 tokens
    within 0.1 %; without the switch the budget is the old 79.65 GiB x 0.95 less the weights."""
    from kvpools_core.engines.vllm.deployment import plan_vllm

    kwargs = dict(
        gpu="h100", gpu_memory_utilization=0.95, max_model_len=2048, max_num_batched_tokens=8192, max_num_seqs=1024
    )
    with_profile = plan_vllm("llama-3.1-8b", runtime_profile="0.19", **kwargs)  # type: ignore[arg-type]
    without = plan_vllm("llama-3.1-8b", **kwargs)  # type: ignore[arg-type]
    assert abs(with_profile.budgets[0].available_kv_cache_memory / GiB - 58.11) < 0.04
    assert abs(with_profile.plan.kv_cache_size_tokens - 476_016) / 476_016 < 0.001
    assert without.runtime_memory is None
    assert (
        without.budgets[0].available_kv_cache_memory == math.ceil(81559 * (1 << 20) * 0.95) - without.weights_memory[0]
    )
    assert "made with vLLM 0.19's calibrated profile for vLLM 0.33" in with_profile.notes


def test_runtime_profile_leaves_the_exact_path_alone() -> None:
    """Given ``memory`` (vLLM's --kv-cache-memory-bytes) a runtime profile has nothing to estimate: refused."""
    from kvpools_core.engines.vllm.deployment import plan_vllm

    with pytest.raises(ConfigError, match="does not apply to it"):
        plan_vllm("llama-3.1-8b", memory="40GiB", runtime_profile="0.19")


@given(
    vocab=st.integers(1, 300_000),
    extra_vocab=st.integers(0, 100_000),
    seqs=st.integers(1, 4096),
    batched=st.integers(1, 65536),
    tp=st.sampled_from([1, 2, 3, 4, 8, 16]),
)
def test_runtime_terms_grow_with_their_inputs(vocab: int, extra_vocab: int, seqs: int, batched: int, tp: int) -> None:
    """More vocabulary or more sampled rows never lowers the activation peak; more TP never lowers the non-torch
    memory; torch's total of every catalogue GPU is below its nvidia-smi total."""
    gpu = find_gpu("h100")
    small = estimate_runtime_memory(
        gpu=gpu, vocab_size=vocab, tp_size=tp, max_num_seqs=seqs, max_num_batched_tokens=batched
    )
    large = estimate_runtime_memory(
        gpu=gpu,
        vocab_size=vocab + extra_vocab,
        tp_size=tp * 2,
        max_num_seqs=seqs + 1,
        max_num_batched_tokens=batched + 1,
    )
    assert large.term("activation peak").bytes >= small.term("activation peak").bytes
    assert large.term("non-torch").bytes >= small.term("non-torch").bytes
    assert small.term("activation peak").bytes >= min(seqs, batched) * vocab * 12
    assert 0 < small.total.bytes < gpu.total_bytes


def test_cli_runtime_profile_switch() -> None:
    """``kvpools plan --accounting vllm --gpu h100 --runtime-profile 0.19``: the JSON budget's total is torch's
    79.19 GiB and the terms are listed; without the flag the JSON has no ``runtime_memory`` key and the catalogue's
    81559 MiB total; with ``--memory`` the flag is refused."""
    from click.testing import CliRunner

    from kvpools_core.cli import main

    base = ["plan", "llama-3.1-8b", "--accounting", "vllm", "--gpu-memory-utilization", "0.95", "--json"]
    runner = CliRunner()
    with_profile = runner.invoke(main, [*base, "--gpu", "h100", "--runtime-profile", "0.19"])
    assert with_profile.exit_code == 0, with_profile.output
    data = json.loads(with_profile.output)
    assert data["budget"][0]["total_memory"] == round(79.19 * GiB)
    assert set(data["runtime_memory"]["terms"]) == {"activation peak", "non-torch", "CUDA graphs"}
    default = json.loads(runner.invoke(main, [*base, "--gpu", "h100"]).output)
    assert "runtime_memory" not in default and default["budget"][0]["total_memory"] == 81559 * (1 << 20)
    refused = runner.invoke(main, [*base, "--memory", "40GiB", "--runtime-profile", "0.19"])
    assert refused.exit_code == 1 and "does not apply to it" in refused.output


def test_the_rtx_3090_records_plan_on_the_catalogue_entry(registry: Registry) -> None:
    """Issue 34 (gpus34): the RTX 3090 is catalogued (nvidia-smi 24576 MiB), so the vllm#10517 records plan from the
    GPU alone, no longer from the torch total their profiling line prints (``total_gpu_memory=23.58GiB``).  kvpools'
    budget without a runtime profile, by hand: 24576 MiB = 24.0 GiB x 0.90 - 14.9888 (the logged weights) = 6.6112
    GiB; the version is not stated, so the runtime profile refuses it."""
    from benchmarks.whole_gpu_accuracy import Prediction, Refusal, evaluable, kvpools, torch_total_given, vllm_gpu

    log = next(log for log in load_startup_logs() if log.id == "vllm-10517-llama-3.1-8b-3090-20k")
    gpu = vllm_gpu(log, registry)
    assert gpu.name == "rtx-3090" and gpu.total_bytes == 24576 * (1 << 20)
    assert not torch_total_given(log, registry)
    assert evaluable(log, registry) is None
    before = kvpools(log, registry, runtime=False, use_logged_weights=True)
    assert isinstance(before, Prediction)
    assert before.kv_gib == pytest.approx(24.0 * 0.9 - 14.9888, abs=1e-6)
    assert isinstance(kvpools(log, registry, runtime=True, use_logged_weights=True), Refusal)


def test_a_log_naming_no_catalogue_gpu_plans_with_the_total_it_prints(registry: Registry) -> None:
    """vllm#12529 names an '8 GB GPU' and prints torch's total (``total_gpu_memory (7.75GiB)``): the benchmark
    plans on that total as torch's (no nvidia-smi-to-torch gap taken off) rather than refusing the GPU; the
    record still has no model preset.  A record that names no GPU and prints no total is still refused."""
    from benchmarks.whole_gpu_accuracy import evaluable, logged_torch_total, torch_total_given, vllm_gpu

    logs = {log.id: log for log in load_startup_logs()}
    log = logs["vllm-12529-qwen-1.5b-8gb"]
    assert logged_torch_total(log) == 7.75
    gpu = vllm_gpu(log, registry)
    assert gpu.name == "custom" and gpu.total_bytes == round(7.75 * GiB)
    assert torch_total_given(log, registry)
    assert evaluable(log, registry) == "no kvpools model preset for this checkpoint"
    assert evaluable(logs["vllm-25350-fp8kv-100k"], registry) == "the log does not name the GPU"


def test_the_rtx_5090_vllm_024_records_are_held_out_and_planned_with_the_checkpoints_modelopt(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """club-3090#612 / #652: vLLM 0.24.0 on an RTX 5090 (catalogued since gpus34), utilization vLLM 0.24.0's default
    0.92 (their ``non-default args`` line has none), held out.  ``--quantization modelopt`` names the checkpoint's
    own method (vLLM's ModelOpt override resolves the MIXED_PRECISION checkpoint to ``modelopt_mixed``), so kvpools
    plans them from the GPU with the checkpoint's NVFP4 / FP8 storage (issue 34; they were refused before).  The
    runtime tool predicts them with the preset's vocab_size (248,320) and charges the vision encoder's profile
    pass their ``limit_mm_per_prompt`` flag asks for (one 16,384-token image: ``tests/vllm/test_runtime_terms.py``),
    2,056,257,536 B of activation peak where the language model alone is 696,254,464: 1,360,003,072 B less KV than
    without the encoder (6.42 GiB, +6.8 / +7.3 % over the logged 6.01 / 5.98; 7.68 GiB, +28 %, before).  On SM120
    with an fp8 cache vLLM 0.24's attention backend is FlashInfer (FlashAttention takes fp8 only as FA3 on Hopper),
    whose 394 MiB float workspace and the FULL decode graph's 8 MiB wrapper workspace the CUDA-graph estimate carries
    in its FULL first capture (``runtime_memory.cudagraph_memory``, graph34's per-model term: 421,527,552 + a FULL
    graph 7,423,918 = 428,951,470 B, where FlashAttention's would be max(PIECEWISE first 67,503,063 B, FULL first
    7,950,254 B): 361,448,407 B less); 6.0725 GiB, +1.04 / +1.55 % over the logs (+0.22 / +0.73 % with the former
    two constants); in vLLM 0.24's layout (``engines/vllm/layouts.py``) floor(6.0725 GiB / 21,463,040 B) = 303
    blocks / 69 a request x 131,072 = 575,577 tokens (+1.00 / +1.34 % over 569,878 / 567,978).  The logs state no
    weights, so the logged-weights tools refuse them."""
    import benchmarks.whole_gpu_accuracy as bench
    from benchmarks.whole_gpu_accuracy import Prediction, Refusal, evaluable, kvpools, vllm_gpu
    from kvpools_core.engines.vllm import runtime_memory

    logs = {log.id: log for log in load_startup_logs()}
    for run_id in ("vllm-club3090-652-qwen3.6-35b-a3b-nvfp4-5090", "vllm-club3090-612-qwen3.6-35b-a3b-nvfp4-5090"):
        log = logs[run_id]
        assert log.split == "held_out" and log.engine_version == "0.24.0"
        assert log.flag("gpu_memory_utilization") == 0.92 and log.flag("quantization") == "modelopt"
        assert "gpu_memory_utilization" not in log.lines[0] and "non-default args" in log.lines[0]
        assert vllm_gpu(log, registry).name == "rtx-5090"
        assert evaluable(log, registry) is None
        assert isinstance(kvpools(log, registry, runtime=False, use_logged_weights=False), Prediction)
        assert log.flag("limit_mm_per_prompt") == {"image": 2, "audio": 0}
        assert "'limit_mm_per_prompt': {'image': 2, 'audio': 0}" in log.lines[0]
        predicted = kvpools(log, registry, runtime=True, use_logged_weights=False)
        assert isinstance(predicted, Prediction)
        monkeypatch.setattr(bench, "runtime_mm_options", lambda *args: {})
        text_only = kvpools(log, registry, runtime=True, use_logged_weights=False)
        monkeypatch.undo()
        assert isinstance(text_only, Prediction)
        assert text_only.kv_gib - predicted.kv_gib == pytest.approx((2_056_257_536 - 696_254_464) / GiB, abs=1e-12)
        monkeypatch.setattr(runtime_memory, "attention_backend", lambda **kwargs: "FLASH_ATTN")
        no_flashinfer = kvpools(log, registry, runtime=True, use_logged_weights=False)
        monkeypatch.undo()
        assert isinstance(no_flashinfer, Prediction)
        # 394 MiB float workspace + 8 MiB decode-wrapper int workspace + a FULL graph (one FULL graph: max_num_seqs
        # 1), against FlashAttention's larger PIECEWISE first capture
        assert no_flashinfer.kv_gib - predicted.kv_gib == pytest.approx(361_448_407 / GiB, abs=1e-12)
        assert 0.009 < predicted.kv_gib / log.logged["available_kv_gib"] - 1 < 0.016
        assert math.floor(predicted.kv_gib * GiB / 21_463_040) == 303
        assert predicted.tokens == 303 * 131072 // 69 == 575_577
        assert 0.009 < predicted.tokens / log.logged["kv_tokens"] - 1 < 0.014
        for runtime in (False, True):
            refused = kvpools(log, registry, runtime=runtime, use_logged_weights=True)
            assert isinstance(refused, Refusal) and "states no weights" in refused.reason


@pytest.mark.parametrize(("run_id", "budget_gib"), [("652", 6.01), ("612", 5.98)])
def test_the_vllm_024_hybrid_layout_reproduces_the_rtx_5090_logs_exactly(
    registry: Registry, run_id: str, budget_gib: float
) -> None:
    """Given the logged KV budget, vLLM 0.24.0's Qwen3.6 GDN hybrid layout reproduces both logs' token counts and
    concurrencies exactly, where kvpools' vLLM 0.33 layout does not: 0.24 sizes the attention block to the Mamba
    page on the 16-token kernel grid (2096 tokens x 2 KV heads x 256 x 2 x 1 B fp8 = 2,146,304 B = the GDN state,
    conv 3 x 8192 x 2 B + SSM 32 x 128 x 128 x 4 B, unpadded) and holds 2 pages per Mamba group per request under
    prefix caching (``align``), where 0.33 aligns the GDN block to ``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT`` 64 (2112
    tokens, the state padded) and adds a prefill-checkpoint block (3 pages).  By hand: 10 layer tensors of
    2,146,304 B a block -> floor(6.01 GiB / 21,463,040) = 300 blocks (5.98 GiB: 299); a request needs
    cdiv(131072, 2096) = 63 attention blocks + 3 GDN groups x 2 = 69: 300 / 69 = 4.3478x, x 131072 = 569,878
    tokens (#652 logs 569,878 and 4.35x); 299 / 69 x 131072 = 567,978 (#612 logs 567,978 and 4.33x).  vllm#57329
    (2026-09) still describes align mode with "a 2096-token block".  The checkpoint grid is new in vLLM 0.33.0 (the
    0.24.0-0.32.0 wheels' ``gdn_attn.py`` has no ``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``; no layer of 0.29 / 0.30
    sets the ``MambaSpec`` checkpoint fields they added): ``engines/vllm/layouts.py`` gives the 0.24 profile's
    layout, which equals the layout built here by hand, and ``--engine-version vllm==0.24`` plans it, with or without
    ``--memory``."""
    import attrs

    from benchmarks.whole_gpu_accuracy import model_ref
    from kvpools_core.engines.vllm import plan_vllm
    from kvpools_core.engines.vllm.layouts import layout_for_version
    from kvpools_core.models import served_model
    from kvpools_core.parts.vllm.specs import MambaSpec

    log = {log.id: log for log in load_startup_logs()}[f"vllm-club3090-{run_id}-qwen3.6-35b-a3b-nvfp4-5090"]
    serving = Serving(kv_cache_dtype="fp8", dtype="bfloat16", quantization="modelopt", accounting="vllm")
    model = served_model(load_model(model_ref(log), registry)[0], serving)
    (v033,) = worker_kv_cache_specs(model, serving, registry, block_size=16)
    assert {spec.block_size for spec in v033.values()} == {2112}

    def v024(spec: object) -> object:
        if isinstance(spec, MambaSpec):
            assert spec.state_bytes == 3 * 8192 * 2 + 32 * 128 * 128 * 4 == 2096 * 2 * 256 * 2
            return attrs.evolve(
                spec,
                block_size=2096,
                page_size_padded=None,
                num_prefill_checkpoint_blocks=0,
                prefill_checkpoint_alignment=None,
            )
        return attrs.evolve(spec, block_size=2096)

    limits = VllmLimits(
        max_model_len=131072, max_num_batched_tokens=8192, max_concurrent_batches=1, mamba_cache_mode="align"
    )
    budget = [int(budget_gib * GiB)]
    by_hand = {name: v024(spec) for name, spec in v033.items()}
    assert layout_for_version([v033], load_profile("0.24"), 16) == [by_hand]
    assert layout_for_version([v033], load_profile("0.25"), 16) == [by_hand]
    assert layout_for_version([v033], load_profile("0.33"), 16) == [v033]
    plan = plan_kv_cache([by_hand], budget, limits)
    assert plan.kv_cache_size_tokens == log.logged["kv_tokens"]
    assert round(plan.max_concurrency, 2) == log.logged["max_concurrency"]
    # plan_vllm with the logged budget and vLLM 0.24's layout (what --engine-version vllm==0.24 --memory passes)
    planned = plan_vllm(
        model_ref(log),
        attrs.evolve(serving, dtype="auto"),  # --dtype is not a vLLM option of plan_vllm (bfloat16 is the model's)
        memory=f"{budget_gib}GiB",
        max_model_len=131072,
        max_num_seqs=1,
        max_num_batched_tokens=8192,
        layout_version="0.24",
        registry=registry,
    )
    assert planned.plan.kv_cache_size_tokens == log.logged["kv_tokens"]
    assert planned.effective_block_size == 2096
    assert "KV layout of vLLM 0.24" in planned.notes[-1]
    # kvpools' vLLM 0.33 layout on the same budget: 298 blocks / (63 + 3 x 3) -> about 5 % under the logs
    v033_plan = plan_kv_cache([v033], budget, limits)
    assert v033_plan.kv_cache_size_tokens < 0.96 * log.logged["kv_tokens"]


def test_llmd_planner_runner_reports_one_ranks_tokens(tmp_path: Path) -> None:
    """``benchmarks/peers/llmd_planner_runner.py`` against a stand-in ``planner.capacity_planner`` with llm-d-planner
    0.3.3's arithmetic (``total_kv_cache_blocks``: the deployment's allocatable GiB over one rank's bytes per block,
    ``per_token_memory_bytes / (tp * pp)``, capacity_planner.py L803-820).  At TP 4 with 40 GiB allocatable on the
    deployment (10 GiB a rank) and 131,072 B a token for the whole model (32,768 B a rank), a rank holds
    10 GiB / (32,768 B x 16) = 20,480 blocks = 327,680 tokens, vLLM's per-rank 'GPU KV cache size'; the runner
    reported the deployment's 4 x 20,480 blocks (1,310,720 tokens, concurrency x 4) before logs34."""
    import subprocess
    import sys

    planner = tmp_path / "planner"
    planner.mkdir()
    (planner / "__init__.py").write_text("", encoding="utf-8")
    (planner / "capacity_planner.py").write_text(
        "GiB = 1 << 30\n"
        "PER_TOKEN = 131072\n"
        "def model_memory_req(name, cfg, token=None):\n    raise AssertionError('replaced by the runner')\n"
        "def max_context_len(cfg):\n    return 8192\n"
        "def allocatable_kv_cache_memory(name, cfg, gpu, util, tp, pp, dp, max_model_len=None):\n"
        "    return 10.0 * tp * pp\n"
        "def total_kv_cache_blocks(name, cfg, ctx, gpu, util, batch, block, tp, pp, dp):\n"
        "    per_block = PER_TOKEN / (tp * pp) * block\n"
        "    return int(allocatable_kv_cache_memory(name, cfg, gpu, util, tp, pp, dp) * GiB // per_block)\n",
        encoding="utf-8",
    )
    runner = Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "llmd_planner_runner.py"
    request = [
        {"id": "tp4", "config": {}, "tp": 4, "pp": 1, "gpu_util": 0.95, "weights_gib": 3.77, "max_model_len": 8192}
    ]
    done = subprocess.run(
        [sys.executable, str(runner)],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(tmp_path)},
    )
    answer = json.loads(done.stdout)["tp4"]
    assert answer["kv_gib"] == 10.0
    assert answer["tokens"] == 327_680
    assert answer["concurrency"] == 327_680 / 8192


def test_gpt_oss_20b_activation_has_no_modular_moe_workspace() -> None:
    """vLLM 0.19.0, gpt-oss-20b at TP 2 on an H100 (record llmd-v0.19-log-gpt-oss-20b-tp2): 'torch peak memory
    increase: 2.87GiB'.  The log says "Using 'TRITON' Mxfp4 MoE backend" and "Using
    MoEPrepareAndFinalizeNoDPEPMonolithic": the monolithic OAITritonMxfp4ExpertsMonolithic (oracle/mxfp4.py
    TRITON -> [OAITritonMxfp4ExpertsMonolithic, OAITritonExperts], monolithic first), which allocates its buffers
    inside the kernel, not the modular kernel's persistent workspace.  kvpools charged TritonExperts' workspace13 +
    workspace2 = 2 x 8192 x 4 x 2880 x 2 B = 377,487,360 B (0.352 GiB) on top of the sampler peak (1024 x 201,088
    x 14 B + 132 x 201,088 x 4 B + (8192 + 2 x 1024) x 2880 x 2 B + 32 MiB = 2.869 GiB): 3.221 GiB, +12.2 %; the
    sampler peak alone is the log's 2.87 GiB (moe_workspace_bytes: mxfp4 on SM 9.0-10.x is monolithic)."""
    from benchmarks.whole_gpu_accuracy import runtime_shape

    (log,) = [log for log in load_startup_logs() if log.id == "llmd-v0.19-log-gpt-oss-20b-tp2"]
    runtime = estimate_runtime_memory(
        gpu=find_gpu("h100"),
        vocab_size=201088,
        tp_size=2,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        engine_version="0.19.0",
        shape=runtime_shape(log),
    )
    peak = runtime.term("activation peak")
    assert abs(peak.bytes / GiB - 2.87) / 2.87 < 0.01
    assert "fused-MoE workspace" not in peak.formula
