"""vLLM's CUDA-graph memory estimate per model (issue 34): ``runtime_memory.cudagraph_memory`` with vllm-0.33.json's
constants, hand-computed from vLLM's sources (0.33 ``v1/worker/gpu_model_runner.py`` ``profile_cudagraph_memory``
L6268-6415, the same procedure as 0.19.0's L5862-5960; ``v1/attention/backends/flash_attn.py`` L767-771 and
L855-865; ``config/attention.py`` L61; ``model_executor/models/config.py`` L544-562), the shapes read from configs,
the extraction of llm-d-planner's vLLM 0.19.0 DEBUG logs, and the held-out error the data file re-derives."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.cudagraph_logs import COMMIT, load, logged_mib, parse_log, predictions, summary, worst_worker
from kvpools_core.engines.vllm.runtime_memory import (
    FA_CUDAGRAPH_MAX_SPLITS,
    GraphShape,
    _cudagraph_constants,
    cudagraph_capture_sizes,
    cudagraph_memory,
    estimate_runtime_memory,
    graph_shape_from_config,
    graph_shape_of,
    load_profile,
    model_shape_of,
)
from kvpools_core.errors import ConfigError
from kvpools_core.pipeline.gpus import find_gpu

MiB = 1 << 20
PROFILE = load_profile("0.33")


def test_the_split_kv_accumulators_by_hand() -> None:
    """A FULL graph captured with FlashAttention keeps ``num_splits`` = 32 fp32 accumulators per head and token
    (output and log-sum-exp): Llama-3.1-8B at TP 2 (16 heads of 128), largest FULL size 512:
    32 x 512 x 16 x 129 x 4 B = 135,266,304 B (129 MiB; vLLM 0.19.0 logged a 132 MiB FULL first capture)."""
    assert FA_CUDAGRAPH_MAX_SPLITS == 32
    graph = GraphShape(layers=32, attention_heads=32, value_head_dim=128, mlp_width=14336)
    term = cudagraph_memory(profile=PROFILE, max_num_seqs=1024, max_num_batched_tokens=8192, graph=graph, tp_size=2)
    assert "[split-KV 129.0]" in term.formula
    # per graph: round(0.218 MiB x 32) = 7,314,866 B and round(0.177 MiB x 32) = 5,939,134 B; FULL first
    # 135,266,304 + 5,939,134 = 141,205,438 B; PIECEWISE first round(64.3 MiB) + round(2.43 x 512 x 2 x 7168 x 2 B)
    # = 67,423,437 + 35,672,556 = 103,095,993 B (logged 96 MiB); the FULL one is larger
    assert term.bytes == 141_205_438 + 50 * 7_314_866 + 50 * 5_939_134


def test_an_mla_model_accumulates_in_the_latent_space() -> None:
    """DeepSeek-V2-Lite (16 heads, kv_lora_rank 512): 32 x 512 x 16 x 513 x 4 B = 537,919,488 B (513 MiB; vLLM 0.19.0
    logged a 522 MiB FULL first capture with FLASH_ATTN_MLA)."""
    graph = graph_shape_of("deepseek-v2-lite")
    assert graph is not None and graph.value_head_dim == 512 and graph.split_kv
    term = cudagraph_memory(profile=PROFILE, max_num_seqs=1024, max_num_batched_tokens=8192, graph=graph)
    assert "[split-KV 513.0]" in term.formula


def test_gpt_oss_captures_to_1024_without_split_buffers() -> None:
    """gpt-oss: the config hook raises the capture ceiling to 1024 (83 sizes, as its logs state) and its FULL first
    capture holds no accumulators (attention sinks; the logs show 6-8 MiB).  TP 2, 24 layers, MLP 4 x 2880 / 2:
    per graph round(0.218 MiB x 24) = 5,486,150 B and round(0.177 MiB x 24) = 4,454,351 B; PIECEWISE first
    round(64.3 MiB) + round(2.43 x 1024 x 2 x 5760 x 2 B) = 67,423,437 + 57,330,893 = 124,754,330 B; total
    124,754,330 + 82 x 5,486,150 + 82 x 4,454,351 = 939,875,412 B (896.3 MiB; logged 1112 MiB)."""
    graph = graph_shape_of("gpt-oss-20b")
    assert graph is not None and graph.max_capture_size == 1024 and not graph.split_kv
    assert graph.mlp_width == 4 * 2880
    assert len(cudagraph_capture_sizes(max_num_seqs=1024, max_num_batched_tokens=8192, max_capture_size=1024)) == 83
    term = cudagraph_memory(profile=PROFILE, max_num_seqs=1024, max_num_batched_tokens=8192, graph=graph, tp_size=2)
    assert term.bytes == 939_875_412


def test_a_set_capture_size_adds_no_decode_size() -> None:
    """``max_cudagraph_capture_size`` set before ``_set_cudagraph_sizes``: the ceiling is that size (within
    ``max_num_batched_tokens``) and ``max_num_seqs`` is not added (0.33 ``config/vllm.py`` L2457-2460)."""
    sizes = cudagraph_capture_sizes(max_num_seqs=20, max_num_batched_tokens=8192, max_capture_size=1024)
    assert 20 not in sizes and sizes[-1] == 1024
    assert cudagraph_capture_sizes(max_num_seqs=20, max_num_batched_tokens=300, max_capture_size=1024)[-2:] == [
        288,
        300,
    ]


def test_pipeline_stages_hold_their_share_of_layers_and_a_graph_at_least_1_mib() -> None:
    """PP 4 of Llama-3.1-8B: ceil(32 / 4) = 8 layers a stage, round(0.218 MiB x 8) = 1,828,717 B a PIECEWISE graph,
    round(0.177 MiB x 8) = 1,484,784 B a FULL one; a 2-layer stage would read below vLLM's 1 MiB floor."""
    graph = GraphShape(layers=32, attention_heads=32, value_head_dim=128, mlp_width=14336)
    term = cudagraph_memory(profile=PROFILE, max_num_seqs=1024, max_num_batched_tokens=8192, graph=graph, pp_size=4)
    assert "8 layers" in term.formula
    # FULL first = 270,532,608 + 1,484,784 (the PIECEWISE one, 138,768,548 B, is smaller)
    assert term.bytes == 270_532_608 + 1_484_784 + 50 * 1_828_717 + 50 * 1_484_784
    tiny = GraphShape(layers=2, attention_heads=1, value_head_dim=8, mlp_width=8)
    small = cudagraph_memory(profile=PROFILE, max_num_seqs=8, max_num_batched_tokens=8192, graph=tiny)
    assert "x 1.00 MiB" in small.formula


@pytest.mark.parametrize(
    ("config", "dtype_bytes", "split_kv"),
    [
        ({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}, 2, True),
        # float32: FlashAttention has no fp32 kernel (supported_dtypes, flash_attn.py L289): TRITON_ATTN
        ({"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32}, 4, False),
        # a PrefixLM multimodal model (model_arch_config_convertor.py L357-366) needs FA 4, not on a Hopper
        (
            {
                "model_type": "gemma3",
                "architectures": ["Gemma3ForConditionalGeneration"],
                "text_config": {"hidden_size": 3840, "num_hidden_layers": 48, "num_attention_heads": 16},
            },
            2,
            False,
        ),
        (
            {
                "model_type": "gpt_oss",
                "architectures": ["GptOssForCausalLM"],
                "hidden_size": 2880,
                "num_hidden_layers": 24,
                "num_attention_heads": 64,
            },
            2,
            False,
        ),
    ],
)
def test_which_models_capture_split_kv_buffers(config: dict[str, object], dtype_bytes: int, split_kv: bool) -> None:
    graph = graph_shape_from_config(config, dtype_bytes=dtype_bytes)
    assert graph is not None and graph.split_kv is split_kv


def test_the_shape_is_read_from_the_config() -> None:
    graph = graph_shape_of("qwen3-30b-a3b")
    assert graph == GraphShape(layers=48, attention_heads=32, value_head_dim=128, mlp_width=8 * 768)
    assert graph_shape_from_config({"hidden_size": 64}) is None


def test_a_subtracting_profile_without_a_shape_is_refused() -> None:
    with pytest.raises(ConfigError, match="pass the model by name or config path"):
        cudagraph_memory(profile=PROFILE, max_num_seqs=1024, max_num_batched_tokens=8192)
    with pytest.raises(ConfigError, match="subtracts its CUDA-graph estimate"):
        estimate_runtime_memory(gpu=find_gpu("h100"), vocab_size=1000, engine_version="0.33")
    # a profile that does not subtract it needs no shape
    assert estimate_runtime_memory(gpu=find_gpu("h100"), vocab_size=1000).term("CUDA graphs").bytes == 0


def test_a_profile_missing_a_constant_is_refused() -> None:
    data = {"cudagraph_subtracted": True, "cudagraph_piecewise_first_mib": 64.3}
    with pytest.raises(ConfigError, match="cudagraph_piecewise_first_per_mlp_output must be a non-negative number"):
        _cudagraph_constants(data, "vllm-x.json")
    assert _cudagraph_constants({"cudagraph_subtracted": False}, "vllm-x.json") is None


QWEN3_8B_LINES = """\
(EngineCore pid=243) DEBUG 04-22 01:04:39 [engine/arg_utils.py:2232] Defaulting max_num_batched_tokens to 8192 for \
OPENAI_API_SERVER usage context.
(EngineCore pid=243) DEBUG 04-22 01:04:39 [engine/arg_utils.py:2242] Defaulting max_num_seqs to 1024 for \
OPENAI_API_SERVER usage context.
(EngineCore pid=243) INFO 04-22 01:04:50 [v1/engine/core.py:105] Initializing a V1 LLM engine (v0.19.0) with config: \
model='Qwen/Qwen3-8B', speculative_config=None, dtype=torch.bfloat16, max_seq_len=8192, tensor_parallel_size=1, \
pipeline_parallel_size=1, quantization=None, kv_cache_dtype=auto
(EngineCore pid=243) INFO 04-22 01:04:52 [platforms/cuda.py:1] Using FLASH_ATTN attention backend out of potential \
backends: ['FLASH_ATTN']
(EngineCore pid=243) INFO 04-22 01:05:29 [v1/worker/gpu_model_runner.py:5876] Profiling CUDA graph memory: \
PIECEWISE=51 (largest=512), FULL=51 (largest=512)
(EngineCore pid=243) DEBUG 04-22 01:05:30 [v1/worker/gpu_model_runner.py:5928] Estimated PIECEWISE CUDA graph memory: \
130.00 MiB first-capture + (51-1) \u00d7 8.00 MiB per-graph
(EngineCore pid=243) DEBUG 04-22 01:05:30 [v1/worker/gpu_model_runner.py:5928] Estimated FULL CUDA graph memory: \
262.00 MiB first-capture + (51-1) \u00d7 4.00 MiB per-graph
(EngineCore pid=243) INFO 04-22 01:05:30 [v1/worker/gpu_model_runner.py:5955] Estimated CUDA graph memory: \
0.84 GiB total
"""


def test_a_log_is_read_into_a_record() -> None:
    """The Qwen3-8B log's lines: 262 + 50 x 8 + 50 x 4 = 862 MiB, the logged 0.84 GiB."""
    record = parse_log("qwen-qwen3-8b--h100-80gb--tp1pp1dp1--8192.log", QWEN3_8B_LINES)
    assert record is not None
    assert (record["model"], record["tp"], record["pp"], record["dtype"]) == ("Qwen/Qwen3-8B", 1, 1, "bfloat16")
    assert (record["max_num_seqs"], record["max_num_batched_tokens"]) == (1024, 8192)
    assert record["attention_backend"] == "FLASH_ATTN"
    worker = record["workers"]["EngineCore"]
    assert worker["modes"]["PIECEWISE"] == {
        "graphs": 51,
        "largest": 512,
        "first_capture_mib": 130.0,
        "per_graph_mib": 8.0,
    }
    assert worker["modes"]["FULL"]["first_capture_mib"] == 262.0 and worker["modes"]["FULL"]["per_graph_mib"] == 4.0
    assert logged_mib(worker) == 862.0
    assert parse_log("x.log", "no estimate here") is None


def test_the_data_file_is_cited_and_consistent() -> None:
    """Every record cites its file at the sweep's commit; each worker's MiB lines give its logged 0.01-GiB total."""
    data = load()
    assert len(data["records"]) == 61
    for record in data["records"]:
        assert record["url"].endswith(f"/blob/{COMMIT}/accuracy/results/v0.19.0/logs/{record['file']}")
        for worker in record["workers"].values():
            assert abs(logged_mib(worker) / 1024 - worker["total_gib"]) <= 0.005 + 1e-9, record["file"]
    splits = {record["split"] for record in data["records"]}
    assert splits == {None, "calibration", "held_out", "held_out_extra"}


def test_the_held_out_error_does_not_worsen() -> None:
    """The data file's held-out logs (models the fit never saw) against ``cudagraph_memory``: mean abs 141 MiB
    (15.7 %), worst +319 MiB (gemma-3-27b-it) and +41.3 % (phi-2), where the former two constants (0.0433 GiB +
    0.0211 GiB a graph) were 870 MiB (97.4 %) and +1639 MiB off; the logs found after the split (held_out_extra)
    255 MiB (25.1 %) against 1230 MiB (140.2 %)."""
    rows = predictions(load())
    held = [row for row in rows if row["split"] == "held_out"]
    new, former = summary(held, "predicted_mib"), summary(held, "former_mib")
    assert new["n"] == 7
    assert new["mean_abs_mib"] <= 141.5 and new["mean_abs_pct"] <= 15.8
    assert abs(new["worst_mib"]) <= 319.5 and abs(new["worst_pct"]) <= 41.4
    assert round(former["mean_abs_mib"]) == 870 and round(former["worst_mib"]) == 1639
    extra = summary([row for row in rows if row["split"] == "held_out_extra"], "predicted_mib")
    assert extra["n"] == 7 and extra["mean_abs_mib"] <= 255.5 and extra["mean_abs_pct"] <= 25.2


def test_the_largest_worker_is_the_one_compared() -> None:
    record = {"workers": {"PP0": {"total_gib": 0.5}, "PP1": {"total_gib": 0.54}}}
    assert worst_worker(record)["total_gib"] == 0.54


def test_no_split_kv_accumulators_under_flashinfer() -> None:
    """The accumulators are FlashAttention's: where the backend is FlashInfer the FULL first capture is a FULL graph,
    5,939,134 B, below the PIECEWISE first 138,768,548 B: 138,768,548 + 50 x 7,314,866 + 50 x 5,939,134 =
    801,468,548 B for Llama-3.1-8B on the H100 defaults (939,171,742 B under FlashAttention).  A B200 (FlashInfer,
    its TRTLLM-gen workspace left out; capability family 100, so the capture ceiling is 1024: 83 sizes) adds the
    larger PIECEWISE first capture round(64.3 MiB) + round(2.43 x 1024 x 2 x 14336 x 2 B) = 67,423,437 +
    142,690,222 = 210,113,659 B: 210,113,659 + 82 x (7,314,866 + 5,939,134) = 1,296,941,659 B."""
    graph = GraphShape(layers=32, attention_heads=32, value_head_dim=128, mlp_width=14336)
    common: dict[str, Any] = {"profile": PROFILE, "max_num_seqs": 1024, "max_num_batched_tokens": 8192, "graph": graph}
    assert cudagraph_memory(attention="FLASHINFER", **common).bytes == 801_468_548
    assert cudagraph_memory(attention="FLASH_ATTN", **common).bytes == 939_171_742
    options: dict[str, Any] = {
        "vocab_size": 128256,
        "engine_version": "0.33",
        "shape": model_shape_of("llama-3.1-8b"),
        "graph": graph_shape_of("llama-3.1-8b"),
    }
    assert estimate_runtime_memory(gpu=find_gpu("h100"), **options).term("CUDA graphs").bytes == 939_171_742
    b200 = estimate_runtime_memory(gpu=find_gpu("b200"), **options).term("CUDA graphs")
    assert b200.bytes == 1_296_941_659 and "PIECEWISE 83 - 1" in b200.formula
