"""vLLM's profile-run activation peak per family (issue 34): every term hand-computed from the cited lines, then
checked against the peaks llm-d-planner's vLLM 0.19.0 H100 report logged (``benchmarks/data/startup_logs.json``).

Sources (vLLM 0.19.0 sdist unless said; vLLM 0.33 where installed beside kvpools):

* ``v1/worker/gpu_model_runner.py``: ``profile_run`` L5782-5795 keeps ``_dummy_run``'s ``[tokens, hidden]`` hidden
  states and their ``[rows, hidden]`` gather (L5553) while ``_dummy_sampler_run`` (L5556-5600) takes a
  ``torch.rand_like`` of the gather (L5569) and holds the model's logits (L5571); only the last pipeline stage
  samples; other stages than the first allocate ``make_empty_intermediate_tensors`` (L5440-5448).
* ``v1/sample/sampler.py`` L90 (fp32 copy), ``v1/sample/ops/topk_topp_sampler.py`` ``forward_native`` L94-112
  (softmax), ``random_sample`` L325-334 (exponential noise), ``topk_topp_triton.py`` L1010-1019 (the per-program
  ``[min(next_power_of_2(min(SMs, rows)), SMs), vocab]`` fp32 buffer cached in ``_TRITON_BUFFER_CACHE``).
* ``fused_moe/fused_moe.py`` ``TritonExperts.workspace_shapes`` L1976-1991, ``modular_kernel.py`` L1062-1067,
  ``v1/worker/workspace.py`` L175-176 (persistent ``torch.empty``); 0.33 ``fused_moe/experts/triton_moe.py``
  L240-255 is the same.
* torch ``aten/src/ATen/cuda/CublasHandlePool.cpp`` ``getChosenWorkspaceSize``: 4096 x 8 KiB on compute capability
  9 / 10 / 12, ``:4096:2:16:8`` otherwise.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from benchmarks.startup_logs import load_startup_logs
from kvpools_core.config import read_config_file
from kvpools_core.engines.vllm.runtime_memory import (
    CUBLAS_WORKSPACE_BYTES,
    CUBLAS_WORKSPACE_OLDER_BYTES,
    ModelShape,
    VisionShape,
    activation_peak,
    cublas_workspace_bytes,
    estimate_runtime_memory,
    load_profile,
    max_tokens_per_item,
    mm_encoder_profile,
    model_shape_from_config,
    moe_workspace_bytes,
    sampler_program_buffer_bytes,
    vision_shape_from_config,
    vision_shape_of,
    vocab_size_of,
)
from kvpools_core.errors import ConfigError
from kvpools_core.pipeline.gpus import find_gpu
from kvpools_core.values import Serving

GiB = 1 << 30
CUBLAS = 33_554_432
CONFIGS = Path(__file__).parents[1] / "weights" / "configs"


def shape(name: str) -> ModelShape:
    found = model_shape_from_config(dict(read_config_file(CONFIGS / f"{name}.json")))
    assert found is not None
    return found


def peak(vocab: int, model: ModelShape | None, **options: object) -> int:
    return activation_peak(
        vocab_size=vocab,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        profile=load_profile(str(options.pop("version", "0.19"))),
        shape=model,
        **options,  # type: ignore[arg-type]
    ).bytes


def test_cublas_workspace_is_torchs_default() -> None:
    assert CUBLAS_WORKSPACE_BYTES == 4096 * 8 * 1024 == CUBLAS
    assert CUBLAS_WORKSPACE_OLDER_BYTES == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8_519_680
    assert cublas_workspace_bytes((9, 0)) == cublas_workspace_bytes((12, 0)) == cublas_workspace_bytes(None) == CUBLAS
    assert cublas_workspace_bytes((8, 0)) == cublas_workspace_bytes((8, 9)) == 8_519_680


@pytest.mark.parametrize(
    ("rows", "sms", "buffer_rows"),
    [(1024, 132, 132), (100, 132, 128), (5, 132, 8), (1024, 82, 82), (64, 82, 64)],
)
def test_the_top_k_top_p_buffer(rows: int, sms: int, buffer_rows: int) -> None:
    # min(next_power_of_2(min(SMs, rows)), SMs) rows of the vocabulary, fp32
    assert sampler_program_buffer_bytes(rows=rows, vocab_size=1000, sm_count=sms) == buffer_rows * 1000 * 4


def test_shapes_of_the_cited_configs() -> None:
    # heads and head size (the attention backend's FlashInfer workspace): 32 x 128, hidden / heads
    assert shape("meta-llama--Meta-Llama-3.1-8B") == ModelShape(
        hidden_size=4096, dense_intermediate_size=14336, num_attention_heads=32, head_dim=128
    )
    # every Qwen3-30B-A3B layer is sparse (mlp_only_layers [], decoder_sparse_step 1), no shared expert
    assert shape("Qwen--Qwen3-30B-A3B") == ModelShape(
        hidden_size=2048,
        dense_intermediate_size=0,
        num_experts_per_tok=8,
        moe_intermediate_size=768,
        moe_quant="",
        num_attention_heads=32,
        head_dim=128,
    )
    # DeepSeek-V2-Lite: first_k_dense_replace 1 keeps one dense MLP of intermediate_size; MLA (kv_lora_rank): no
    # paged-attention head size
    assert shape("deepseek-ai--DeepSeek-V2-Lite") == ModelShape(
        hidden_size=2048,
        dense_intermediate_size=10944,
        num_experts_per_tok=6,
        moe_intermediate_size=1408,
        moe_quant="",
        num_attention_heads=16,
        head_dim=0,
    )
    # Mixtral: the experts are intermediate_size wide, no dense MLP
    assert shape("mistralai--Mixtral-8x7B-v0.1") == ModelShape(
        hidden_size=4096,
        dense_intermediate_size=0,
        num_experts_per_tok=2,
        moe_intermediate_size=14336,
        moe_quant="",
        num_attention_heads=32,
        head_dim=128,
    )
    # Qwen1.5-MoE: the shared expert is the widest non-expert MLP
    assert shape("Qwen--Qwen1.5-MoE-A2.7B").dense_intermediate_size == 5632
    assert model_shape_from_config({"vocab_size": 10}) is None


def test_moe_workspace_by_hand() -> None:
    """workspace13 = (M, topk, max(N / 2, K)) shared with the (M, K) output, workspace2 = (M, topk, max(N, K)),
    N = 2 x moe_intermediate / tp, K = hidden, M = 8192 tokens, bf16."""
    qwen = shape("Qwen--Qwen3-30B-A3B")
    assert moe_workspace_bytes(shape=qwen, tokens=8192) == 8192 * 8 * 2048 * 2 + 8192 * 8 * 2048 * 2 == 536_870_912
    deepseek = shape("deepseek-ai--DeepSeek-V2-Lite")
    assert moe_workspace_bytes(shape=deepseek, tokens=8192) == 8192 * 6 * 2048 * 2 + 8192 * 6 * 2816 * 2 == 478_150_656
    mixtral = shape("mistralai--Mixtral-8x7B-v0.1")
    assert moe_workspace_bytes(shape=mixtral, tokens=8192, tp_size=2) == 8192 * 2 * 7168 * 2 + 8192 * 2 * 14336 * 2
    assert moe_workspace_bytes(shape=shape("meta-llama--Meta-Llama-3.1-8B"), tokens=8192) == 0
    # one token: the (M, K) output is larger than (M, topk, max(N / 2, K)) only when topk is 1; each part to 256 B
    single = ModelShape(hidden_size=100, num_experts_per_tok=1, moe_intermediate_size=40)
    assert moe_workspace_bytes(shape=single, tokens=1) == 256 + 256


@pytest.mark.parametrize(
    ("capability", "held"),
    [
        (None, False),
        ((9, 0), False),
        ((10, 0), False),
        ((10, 3), False),
        ((8, 0), True),
        ((8, 9), True),
        ((12, 0), True),
    ],
)
def test_mxfp4_moe_workspace_only_off_the_monolithic_kernels(capability: tuple[int, int] | None, held: bool) -> None:
    """gpt-oss-20b (``quant_method`` mxfp4; hidden 2880, experts 2880 wide, top-4) at TP 2, 8192 tokens: on SM 9.0 to
    10.x vLLM 0.19 / 0.33 pick a monolithic experts kernel (TRITON's ``OAITritonMxfp4ExpertsMonolithic``, SM 10.x
    with FlashInfer TRT-LLM's; ``oracle/mxfp4.py`` L80-110, L169-183), which takes no ``WorkspaceManager``
    workspace: 0 (None is the H100's, as the profile's other terms).  On Ampere / Ada / SM 12.x vLLM falls to
    ``MarlinExperts``, whose workspace_shapes are the Triton experts' with N the expert width (0.19
    ``fused_marlin_moe.py`` L666-696, 0.33 ``experts/marlin_moe.py`` L691-718), both padded for Marlin's mxfp4
    tiles (0.33 ``oracle/mxfp4.py`` L865-870: the width 1440 to 1536, the hidden size 2880 to 3072):
    (8192 x 4, max(1536, 3072)) + (8192 x 4 x max(3072, 3072)) x 2 B = 402,653,184 B.  The unquantised experts
    keep the Triton path's unpadded workspace off SM 10.x / 12.x (vLLM 0.33 ``oracle/unquantized.py`` L69-80:
    FlashInfer behind Triton on SM 9.x, not run on Ampere / Ada)."""
    gpt_oss = shape("openai--gpt-oss-20b")
    assert gpt_oss.quant_method == "mxfp4"
    expected = 8192 * 4 * 3072 * 2 + 8192 * 4 * 3072 * 2 if held else 0
    assert expected in (0, 402_653_184)
    workspace = moe_workspace_bytes(shape=gpt_oss, tokens=8192, tp_size=2, compute_capability=capability)
    assert workspace == expected
    unquantised = attrs.evolve(gpt_oss, quant_method="", moe_quant="")
    if capability is None or capability[0] in (8, 9):
        assert moe_workspace_bytes(shape=unquantised, tokens=8192, tp_size=2, compute_capability=capability) == (
            377_487_360
        )
    assert shape("Qwen--Qwen3-30B-A3B").quant_method == ""


def test_llama_3_1_8b_by_hand() -> None:
    """1024 x 128256 = 131,334,144 logits x 14 B (2 held bf16 + 4 fp32 + 4 softmax + 4 noise) = 1,838,678,016;
    buffer 132 x 128256 x 4 = 67,719,168; held hidden states (8192 + 2 x 1024) x 4096 x 2 = 83,886,080: sampler
    1,990,283,264 above the forward 8192 x (3 x 4096 + 3 x 14336) x 2 = 905,969,664; + cuBLAS = 2,023,837,696 B
    (1.885 GiB, logged 1.89)."""
    llama = shape("meta-llama--Meta-Llama-3.1-8B")
    assert peak(128256, llama) == 1_838_678_016 + 67_719_168 + 83_886_080 + CUBLAS == 2_023_837_696
    # TP shards the MLP, not the gathered logits: the same peak at TP 2 and 4 (all logged 1.89)
    assert peak(128256, llama, tp_size=4) == 2_023_837_696
    # a float32 model holds 4 B logits and makes no fp32 copy: 12 B per logit, the hidden states at 4 B, a sampler
    # of 1,811,501,056 B just under the forward pass at 4 B, 8192 x 55296 x 4 = 1,811,939,328
    wide = ModelShape(hidden_size=4096, dense_intermediate_size=14336, dtype_bytes=4)
    assert 131_334_144 * 12 + 67_719_168 + 83_886_080 * 2 == 1_811_501_056
    assert peak(128256, wide) == 8192 * 55296 * 4 + CUBLAS == 1_845_493_760
    assert peak(256000, wide) == 262_144_000 * 12 + 132 * 256000 * 4 + 83_886_080 * 2 + CUBLAS


def test_moe_and_mla_by_hand() -> None:
    """Qwen3-30B-A3B: 155,582,464 logits x 14 = 2,178,154,496 + buffer 80,222,208 + held 10240 x 2048 x 2 =
    41,943,040, + workspace 536,870,912 + cuBLAS = 2,870,745,088 B (2.674 GiB, logged 2.68).
    DeepSeek-V2-Lite (MLA + MoE): 104,857,600 x 14 = 1,468,006,400 + 54,067,200 + 41,943,040 + 478,150,656 + cuBLAS
    = 2,075,721,728 B (1.933 GiB, logged 1.93)."""
    assert peak(151936, shape("Qwen--Qwen3-30B-A3B")) == 2_870_745_088
    assert peak(102400, shape("deepseek-ai--DeepSeek-V2-Lite")) == 2_075_721_728


def test_a_small_vocabulary_peaks_in_the_forward_pass() -> None:
    """CodeLlama-7b (vocab 32064, hidden 4096, intermediate 11008): the sampler, 32,833,536 x 14 + 132 x 32064 x 4 +
    83,886,080 = 560,498,240 B, is below the forward 8192 x (3 x 4096 + 3 x 11008) x 2 = 742,391,808."""
    term = activation_peak(
        vocab_size=32064,
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        profile=load_profile("0.19"),
        shape=ModelShape(hidden_size=4096, dense_intermediate_size=11008),
    )
    assert term.bytes == 742_391_808 + CUBLAS
    assert "forward" in term.formula.split(")")[0].split(":")[-1]


def test_pipeline_stages() -> None:
    """Only the last stage samples (``get_pp_group().is_last_rank``); every stage but the first also holds the
    receive buffers, hidden states and residual, 2 x 8192 x 4096 x 2 = 134,217,728 B."""
    llama = shape("meta-llama--Meta-Llama-3.1-8B")
    assert peak(128256, llama, pp_size=2, pp_stage="first") == 905_969_664 + CUBLAS
    assert peak(128256, llama, pp_size=4, pp_stage="middle") == 905_969_664 + 134_217_728 + CUBLAS
    assert peak(128256, llama, pp_size=2) == 2_023_837_696 + 134_217_728
    with pytest.raises(ConfigError, match="pp_stage must be one of last, first, middle, got 'second'"):
        peak(128256, llama, pp_size=2, pp_stage="second")


def test_the_gpu_sets_the_buffer_rows_and_the_cublas_workspace() -> None:
    """An A100 (108 SMs, compute capability 8.0): buffer 108 x 128256 x 4, cuBLAS 8,519,680."""
    llama = shape("meta-llama--Meta-Llama-3.1-8B")
    a100 = estimate_runtime_memory(gpu=find_gpu("a100-80gb"), vocab_size=128256, shape=llama)
    expected = 1_838_678_016 + 108 * 128256 * 4 + 83_886_080 + 8_519_680
    assert a100.term("activation peak").bytes == expected


LOGGED = {
    "llmd-v0.19-llama-3.1-8b-tp1-len2048": ("meta-llama--Meta-Llama-3.1-8B", 1),
    "llmd-v0.19-activation-qwen3": ("Qwen--Qwen3-8B", 1),
    "llmd-v0.19-activation-gemma2": ("google--gemma-2-9b", 1),
    "llmd-v0.19-activation-granite": ("ibm-granite--granite-3.3-8b", 1),
    "llmd-v0.19-activation-phi3": ("microsoft--phi-4", 1),
    "llmd-v0.19-activation-qwen3moe": ("Qwen--Qwen3-30B-A3B", 1),
    "llmd-v0.19-activation-deepseekv2": ("deepseek-ai--DeepSeek-V2-Lite", 1),
    # Mixtral-8x7B's bf16 weights (46.7e9 parameters, ~87 GiB) do not fit one 79.19 GiB H100: the report's run was
    # at TP 2 at least; the record states no TP (its flags say 1)
    "llmd-v0.19-activation-mixtral": ("mistralai--Mixtral-8x7B-v0.1", 2),
}


@pytest.mark.parametrize("record", sorted(LOGGED))
def test_logged_activation_peaks_within_one_percent(record: str) -> None:
    """The per-architecture rows of llm-d-planner's vLLM 0.19.0 report (the MoE and MLA ones were -18 % to -36 %
    before the workspace and the held logits; gemma-2's 256k vocabulary -8 %; granite's +22 %)."""
    log = next(log for log in load_startup_logs() if log.id == record)
    name, tp = LOGGED[record]
    predicted = peak(int(log.vocab_size or 0), shape(name), tp_size=tp) / GiB
    logged = log.logged["activation_gib"]
    assert abs(predicted - logged) / logged < 0.01, (predicted, logged)


def test_plan_vllm_charges_each_pipeline_stage_its_own_peak() -> None:
    """Llama-3.1-8B at PP 4 on an H100 with the 0.19 profile: stage 0 the forward pass (905,969,664 B) + cuBLAS, the
    middle stages + the receive buffers (134,217,728 B), the last stage the sampler (2,023,837,696 B) + the receive
    buffers.  Each stage's budget differs from the last stage's by its weights and by those peaks; before, every
    stage was charged the last stage's sampler."""
    from kvpools_core.engines.vllm.deployment import plan_vllm

    result = plan_vllm(
        "llama-3.1-8b", gpu="h100", serving=Serving(pp_size=4), max_num_batched_tokens=8192, runtime_profile="0.19"
    )
    first, middle, last = 905_969_664 + CUBLAS, 905_969_664 + 134_217_728 + CUBLAS, 2_023_837_696 + 134_217_728
    assert result.stage_activation_peaks == (first, middle, middle, last)
    assert result.runtime_memory is not None
    assert result.runtime_memory.term("activation peak").bytes == last
    budgets = [budget.available_kv_cache_memory for budget in result.budgets]
    weights = result.weights_memory
    for stage, peak in enumerate(result.stage_activation_peaks):
        assert budgets[stage] - budgets[3] == (weights[3] - weights[stage]) + (last - peak)
    assert result.to_dict()["runtime_memory"]["stage_activation_peaks"] == [first, middle, middle, last]


def test_a_shape_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"ModelShape\.hidden_size must be an integer >= 1, got 0"):
        ModelShape(hidden_size=0)
    with pytest.raises(ConfigError, match=r"ModelShape\.num_experts_per_tok must be an integer >= 0, got -1"):
        ModelShape(hidden_size=8, num_experts_per_tok=-1)


# The multimodal encoder's part of profile_run (issue 34): vLLM 0.33 v1/worker/gpu_model_runner.py L6072-6146 (0.19.0
# L5740-5795 the same), multimodal/encoder_budget.py L43-191, v1/core/encoder_cache_manager.py L333-380,
# config/scheduler.py L306-307, config/multimodal.py L696-709 (999 for a modality limit_mm_per_prompt does not name),
# qwen2_vl.py L1079-1139 (the item with the most features), qwen3_vl.py L959-1015 / L1040-1068 (tokens of an image /
# video), L862-905 (Qwen3_VisionTransformer.forward), qwen2_5_vl.py L406-465 (the vision attention; 0.19.0's is the
# same), multimodal/processing/context.py L366-367 (pixel values cast to the model dtype).

QWEN36 = "qwen3.6-35b-a3b-nvfp4"


def test_qwen3_6s_vision_shape() -> None:
    """plugins/mamba/presets/full/qwen3.6-35b-a3b-nvfp4.json vision_config: depth 27, hidden 1152, intermediate 4304,
    16 heads, out_hidden 2048, patch 16, temporal patch 2, merge 2; the processors' caps 16,777,216 (image) and
    25,165,824 (video) pixels."""
    vision = vision_shape_of(QWEN36)
    assert vision == VisionShape(
        hidden_size=1152,
        intermediate_size=4304,
        num_heads=16,
        out_hidden_size=2048,
        patch_size=16,
        temporal_patch_size=2,
        spatial_merge_size=2,
    )
    assert (vision.image_max_pixels, vision.video_max_pixels) == (16_777_216, 25_165_824)
    # a text-only model and a vision tower kvpools does not model have none
    assert vision_shape_from_config(dict(read_config_file(CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json"))) is None
    assert vision_shape_from_config({"model_type": "mistral3", "vision_config": {"hidden_size": 1024}}) is None


def test_max_tokens_per_item_by_hand() -> None:
    """unit = 16 x 2 = 32 pixels: an image 16,777,216 / 32^2 = 16,384 = 128 x 128 merged patches; a video
    25,165,824 / 2 (temporal patch) / 32^2 = 12,288 = 96 x 128; 401 (a prime: 1 x 401, aspect 401 > 200) falls to
    400 = 20 x 20."""
    vision = vision_shape_of(QWEN36)
    assert vision is not None
    assert max_tokens_per_item(vision, 16_777_216) == 16_384
    assert max_tokens_per_item(vision, 25_165_824 // 2) == 12_288
    assert max_tokens_per_item(vision, 401 * 1024) == 400
    assert max_tokens_per_item(vision, 1023) == 0


def test_the_encoder_profile_of_the_club_3090_runs_by_hand() -> None:
    """limit_mm_per_prompt {'image': 2, 'audio': 0} (video unnamed: 999), max_num_batched_tokens 8192,
    max_num_seqs 1, max_model_len 131072: the image's 16,384 tokens beat the video's 12,288; budget max(8192, 16384)
    = 16384 -> 1 item (16384 // 16384), decoder side 1 x min(2, 131072 // 16384); 65,536 patches x (pixels
    3 x 2 x 16^2 = 1536 + position 1152 + rotary 72 + attention 11 x 1152 = 12,672, above the MLP's 3 x 1152 +
    2 x 4304 = 12,064) x 2 B = 2,022,703,104 B; held: the pixels 65,536 x 1536 x 2 = 201,326,592 + the encoder cache
    16,384 x 2048 x 2 = 67,108,864."""
    vision = vision_shape_of(QWEN36)
    assert vision is not None
    options = {"max_num_batched_tokens": 8192, "max_num_seqs": 1, "max_model_len": 131072}
    profile = mm_encoder_profile(vision, mm_limits={"image": 2, "audio": 0}, **options)
    assert profile is not None
    assert (profile.modality, profile.items, profile.tokens_per_item) == ("image", 1, 16_384)
    assert profile.encoder_peak_bytes == 65_536 * (1536 + 1152 + 72 + 12_672) * 2 == 2_022_703_104
    assert profile.held_bytes == 201_326_592 + 67_108_864
    # --language-model-only (every limit 0) profiles no encoder; images off leaves the unnamed video at 999
    assert mm_encoder_profile(vision, mm_limits={"image": 0, "video": 0}, **options) is None
    video = mm_encoder_profile(vision, mm_limits={"image": 0}, **options)
    assert video is not None and (video.modality, video.items, video.tokens_per_item) == ("video", 1, 12_288)
    # a 32k batch and 4 sequences: 32768 // 16384 = 2 items; without chunked prefill the decoder side is
    # min(4, 8192 // 16384) = 0 requests, and the item count is floored at 1
    wide = mm_encoder_profile(vision, max_num_batched_tokens=32768, max_num_seqs=4, max_model_len=131072)
    assert wide is not None and wide.items == 2
    single = mm_encoder_profile(
        vision, chunked_prefill=False, max_num_batched_tokens=8192, max_num_seqs=4, max_model_len=131072
    )
    assert single is not None and single.items == 1


def test_the_encoder_bounds_the_club_3090_runs_activation_peak() -> None:
    """The language model's pass: sampler 1 x 248,320 x 14 = 3,476,480 + the kernel buffer 1 x 248,320 x 4 =
    993,280 + held hidden states (8192 + 2) x 2048 x 2 = 33,562,624, under the forward 8192 x (3 x 2048 + 3 x 512)
    x 2 = 125,829,120; + the fused-MoE workspace 536,870,912 = 662,700,032, + what the encoder left held 268,435,456
    = 931,135,488: the encoder's 2,022,703,104 binds; + cuBLAS = 2,056,257,536 B (1.915 GiB; 696,254,464 without the
    encoder).  The checkpoint's experts are ModelOpt ``W4A16_NVFP4``: no activation key, so every FlashInfer / vLLM
    CUTLASS NVFP4 kernel refuses and Marlin runs them (vLLM 0.24.0 ``quantization/modelopt.py`` L1403-1413, "only
    Marlin survives"; 0.33 L857-858), with the Triton experts' bytes (0.24.0 ``experts/marlin_moe.py`` L711-741)."""
    vision = vision_shape_of(QWEN36)
    common = {
        "vocab_size": 248_320,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 8192,
        "profile": load_profile("0.33"),
        "shape": ModelShape(
            hidden_size=2048,
            dense_intermediate_size=512,
            num_experts_per_tok=8,
            moe_intermediate_size=512,
            moe_quant="nvfp4-a16",
        ),
        "sm_count": 170,
        "compute_capability": (12, 0),
    }
    without = activation_peak(**common).bytes  # type: ignore[arg-type]
    assert without == 125_829_120 + 536_870_912 + CUBLAS == 696_254_464
    term = activation_peak(**common, vision=vision, max_model_len=131072, mm_limits={"image": 2})  # type: ignore[arg-type]
    assert term.bytes == 2_022_703_104 + CUBLAS == 2_056_257_536
    assert "encoder 1.884 GiB" in term.formula and ": encoder)" in term.formula
    # a 64k-token batch profiles 65536 // 16384 = 4 images at once: the larger phase binds, the held bytes go with
    # the language model's
    big = {**common, "max_num_batched_tokens": 65536}
    language = activation_peak(**big).bytes - CUBLAS  # type: ignore[arg-type]
    mm = activation_peak(**big, vision=vision, max_model_len=131072)  # type: ignore[arg-type]
    held = 4 * (201_326_592 + 67_108_864)  # 65536 // 16384 = 4 images
    assert mm.bytes == max(4 * 2_022_703_104, language + held) + CUBLAS
    # the encoder needs max_model_len; under pipeline parallelism it is left out
    with pytest.raises(ConfigError, match="needs max_model_len"):
        activation_peak(**common, vision=vision)  # type: ignore[arg-type]
    staged = activation_peak(**common, pp_size=2).bytes  # type: ignore[arg-type]
    assert activation_peak(**common, vision=vision, pp_size=2).bytes == staged  # type: ignore[arg-type]


# The Pixtral (Mistral-Small-3.1) and SigLIP (Gemma-3) towers (issue 34), vLLM 0.19.0: pixtral.py L945-994 (tokens of
# an image: ceil(1540 / 28)^2 = 3025), L997-1033 (PixtralHFMLP), L1075-1109 (PixtralHFAttention, HF rotary), L1134-1149
# (the block), L1243-1312 (PixtralHFVisionModel.forward: conv outputs kept in patch_embeds_list, ln_pre, cos / sin, the
# dense block mask of transformers' generate_block_attention_mask without xformers, L88-98); mistral3.py L186-201
# (the 1540 x 1540 dummy image), L125-170 (projector into the text hidden size); siglip.py L341-356 (embeddings, the
# position added in place), L420-431 (attention: qkv, the flash-attention output, out_proj), L471-476 (MLP), L505-519
# (the layer, residuals added in place), L554-571 (the pool keeps the embeddings); gemma3_mm.py L194-210 (256 tokens
# an image, no pan-and-scan), L420-460 (projector); multimodal/encoder_budget.py L15-40 (tokens = embeddings).

MISTRAL_SMALL = str(CONFIGS / "mistralai--Mistral-Small-3.1-24B-Instruct-2503.json")
GEMMA3 = str(CONFIGS / "google--gemma-3-12b-it.json")


def test_pixtral_and_siglip_vision_shapes() -> None:
    """Mistral-Small-3.1's Pixtral tower: hidden 1024, intermediate 4096, 16 heads of 64, patch 14, 1540-pixel
    images, merge 2, projected into the text's 5120; gemma-3-12b-it's SigLIP: 1152 / 4304 / 16 heads, patch 14,
    896-pixel images, 256 tokens an image, projected into 3840.  The tower is the plugin's trait of the class: the
    same config without ``architectures`` has none."""
    from kvpools_core.pipeline.gpus import VLLM_VISION_PIXTRAL, VLLM_VISION_SIGLIP

    assert vision_shape_of(MISTRAL_SMALL) == VisionShape(
        hidden_size=1024,
        intermediate_size=4096,
        num_heads=16,
        head_dim=64,
        out_hidden_size=5120,
        patch_size=14,
        temporal_patch_size=1,
        spatial_merge_size=2,
        image_size=1540,
        tower=VLLM_VISION_PIXTRAL,
    )
    gemma = dict(read_config_file(Path(GEMMA3)))
    assert vision_shape_from_config(gemma) == VisionShape(
        hidden_size=1152,
        intermediate_size=4304,
        num_heads=16,
        out_hidden_size=3840,
        patch_size=14,
        temporal_patch_size=1,
        spatial_merge_size=1,
        image_size=896,
        image_tokens=256,
        tower=VLLM_VISION_SIGLIP,
    )
    assert vision_shape_from_config({key: value for key, value in gemma.items() if key != "architectures"}) is None


def test_the_mistral_small_3_1_encoder_profile_by_hand() -> None:
    """vllm serve defaults (8192 tokens, 1024 sequences, max_model_len 8192): 3025 tokens an image, 8192 // 3025 = 2
    images, 2 x 110^2 = 24,200 patches.  Per patch: pixels 3 x 14^2 = 588 + the conv outputs and ln_pre output 2 x
    1024 + cos / sin 2 x 64 + the MLP's 5 x 1024 + 3 x 4096 = 17,408 (x, the attention's r, h, ffn_norm's output,
    gate_up, its activation, the down output; above the attention's 9 x 1024) = 20,172; on vLLM 0.19 the dense mask
    24,200^2 on top: (24,200 x 20,172 + 585,640,000) x 2 = 2,147,604,800 B (the mask alone 1.09 GiB); vLLM 0.33 packs
    the images (attention 10 x 1024, still under the MLP): 976,324,800 B.  Held: pixels 24,200 x 588 x 2 =
    28,459,200 + the projected outputs 6050 x 5120 x 2 = 61,952,000."""
    vision = vision_shape_of(MISTRAL_SMALL)
    assert vision is not None
    options = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024, "max_model_len": 8192}
    dense = mm_encoder_profile(vision, dense_block_mask=True, **options)
    assert dense is not None
    assert (dense.modality, dense.items, dense.tokens_per_item) == ("image", 2, 3025)
    assert dense.encoder_peak_bytes == (24_200 * 20_172 + 24_200**2) * 2 == 2_147_604_800
    assert dense.held_bytes == 28_459_200 + 61_952_000
    packed = mm_encoder_profile(vision, **options)
    assert packed is not None and packed.encoder_peak_bytes == 24_200 * 20_172 * 2 == 976_324_800
    assert "the dense block mask 24200 x 24200 x 2 B" in dense.formula and "mask" not in packed.formula


def test_the_gemma3_encoder_profile_by_hand() -> None:
    """256 tokens an image: 8192 // 256 = 32 images of 64^2 = 4096 patches, 131,072 patches x (pixels 588 + the
    embeddings 1152 + the MLP's 3 x 1152 + 2 x 4304 = 12,064, above the attention's 7 x 1152) x 2 = 3,618,635,776 B;
    held: pixels 131,072 x 588 x 2 = 154,140,672 + 32 x 256 x 3840 x 2 = 62,914,560."""
    vision = vision_shape_of(GEMMA3)
    assert vision is not None
    profile = mm_encoder_profile(vision, max_num_batched_tokens=8192, max_num_seqs=1024, max_model_len=8192)
    assert profile is not None
    assert (profile.modality, profile.items, profile.tokens_per_item) == ("image", 32, 256)
    assert profile.encoder_peak_bytes == 131_072 * (588 + 1152 + 12_064) * 2 == 3_618_635_776
    assert profile.held_bytes == 154_140_672 + 62_914_560
    # one sequence of 1024 tokens: 1 x min(999, 1024 // 256) = 4 images
    few = mm_encoder_profile(vision, max_num_batched_tokens=8192, max_num_seqs=1, max_model_len=1024)
    assert few is not None and few.items == 4


def test_the_gemma3_presets_get_the_siglip_encoder_term() -> None:
    """The gemma-3 presets name their checkpoints' complete configs (``_weights_config``, issue 34), so a plan from
    the preset name finds the SigLIP tower (before: no ``vision_config``, no encoder term and no vocabulary).
    gemma-3-12b-it's is its config's; gemma-3-27b-it's projects into 5376 (its text width), the tower the same."""
    assert vision_shape_of("gemma-3-12b-it") == vision_shape_of(GEMMA3)
    assert vocab_size_of("gemma-3-12b-it") == 262_208
    small, big = vision_shape_of(GEMMA3), vision_shape_of("gemma-3-27b-it")
    assert small is not None and big == attrs.evolve(small, out_hidden_size=5376)
    assert vocab_size_of("gemma-3-27b-it") == 262_208


MULTIMODAL_LOGGED = {
    # the language model's 1.912 GiB sampler + 86.2 MiB held is under the encoder's 2.000 GiB (its dense mask 1.09):
    # 2,181,159,232 B = 2.031 GiB, inside the row's 2.03-2.18 (-3.5 % of its midpoint; the baseline row's 2.030
    # +0.07 %); without the encoder 1.943 GiB (-7.7 %), without the config 1.846 (-12.3 %)
    "llmd-v0.19-activation-mistral3": (MISTRAL_SMALL, 2_181_159_232),
    # the sampler's 3.703 GiB + the held 207.0 MiB binds over the encoder's 3.370 GiB: 4,226,712,576 B = 3.936 GiB
    # (-0.09 % of gemma-3-12b-it's 3.94; 3.734 GiB, -5.2 %, without the encoder)
    "llmd-v0.19-activation-gemma3": (GEMMA3, 4_226_712_576),
}


def test_a_whole_gpu_plan_from_the_gemma3_preset_name_charges_the_encoder() -> None:
    """``plan_vllm("gemma-3-12b-it", gpu="h100", runtime_profile="0.19")`` with the llm-d v0.19 record's flags
    (max_model_len 8192, 8192 batched tokens, 1024 sequences): the weights are the preset's complete config's
    24,374,650,080 B (the SigLIP tower and projector 842,581,728 B of them) and the activation peak the record test's
    4,226,712,576 B (3.936 GiB against the logged 3.94, encoder and held pixels included); before, the preset had no
    complete config and the plan refused the weights."""
    from kvpools_core.engines.vllm.deployment import plan_vllm

    result = plan_vllm(
        "gemma-3-12b-it",
        gpu="h100",
        runtime_profile="0.19",
        max_model_len=8192,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
    )
    assert result.weights_memory == (24_374_650_080,)
    assert result.runtime_memory is not None
    assert result.runtime_memory.term("activation peak").bytes == MULTIMODAL_LOGGED["llmd-v0.19-activation-gemma3"][1]
    assert "multimodal encoder: 32 image item(s) x 256 tokens" in result.runtime_memory.term("activation peak").formula


@pytest.mark.parametrize("record", sorted(MULTIMODAL_LOGGED))
def test_logged_multimodal_activation_peaks(record: str) -> None:
    log = next(log for log in load_startup_logs() if log.id == record)
    model, expected = MULTIMODAL_LOGGED[record]
    term = activation_peak(
        vocab_size=int(log.vocab_size or 0),
        max_num_seqs=1024,
        max_num_batched_tokens=8192,
        profile=load_profile("0.19"),
        shape=model_shape_from_config(dict(read_config_file(Path(model)))),
        vision=vision_shape_of(model),
        max_model_len=log.flag("max_model_len"),
    )
    assert term.bytes == expected
    low, high = log.logged["activation_range_gib"]
    assert low <= term.bytes / GiB <= high
    assert abs(term.bytes / GiB - log.logged["activation_gib"]) / log.logged["activation_gib"] < 0.04
