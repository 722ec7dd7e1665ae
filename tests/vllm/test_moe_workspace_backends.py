"""vLLM's fused-MoE workspace per backend (issue 34): which backend vLLM 0.33 picks for a checkpoint's experts on a
GPU, and the ``WorkspaceManager`` bytes that backend's ``workspace_shapes`` take in the profile run.

Sources (vLLM 0.33 wheel, ``model_executor/layers/fused_moe/``): the oracles ``oracle/unquantized.py`` L69-80
(CUDA order FLASHINFER_TRTLLM, FLASHINFER_CUTLASS, TRITON; both FlashInfer ones behind TRITON on SM 9.x),
``oracle/fp8.py`` L88-132 (block FP8 on SM 9.0: TRITON first), ``oracle/nvfp4.py`` L203-212 (FLASHINFER_TRTLLM,
FLASHINFER_CUTEDSL(_BATCHED), FLASHINFER_CUTLASS, VLLM_CUTLASS, MARLIN), ``oracle/int_wna16.py`` L126-143, and
``quantization/utils/humming/priority.py`` L11-23 (HUMMING ahead of MARLIN on SM 9.0); the kernels' devices and
schemes ``experts/trtllm_bf16_moe.py`` L98-101, ``experts/trtllm_nvfp4_moe.py`` L203-211 (family 100),
``experts/flashinfer_cutlass_moe.py`` L128-138 (SM 9.0, families 100 and 120), L155-161 (unquantised from 9.0),
L172-180 (NVFP4 W4A4 from 10.0), ``experts/cutlass_moe.py`` L716-733 (families 100 / 110 / 120, W4A4 only),
``experts/marlin_moe.py`` L592-595, L601-620 (from SM 7.5, any activation); the workspaces
``experts/triton_moe.py`` L240-255, ``experts/marlin_moe.py`` L691-718, ``experts/flashinfer_cutlass_moe.py``
L208-243, ``modular_kernel.py`` L1124-1220 and ``v1/worker/workspace.py`` L181-207 (each part to 256 B).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from kvpools_core.config import read_config_file
from kvpools_core.engines.vllm.runtime_memory import (
    MOE_QUANT_SCHEMES,
    ModelShape,
    activation_peak,
    load_profile,
    model_shape_from_config,
    model_shape_of,
    moe_quant_scheme,
    moe_workspace_bytes,
    vllm_moe_backend,
)
from kvpools_core.errors import ConfigError

CONFIGS = Path(__file__).parents[1] / "weights" / "configs"
CUBLAS = 33_554_432

QWEN3_30B = ModelShape(hidden_size=2048, num_experts_per_tok=8, moe_intermediate_size=768)
"""Qwen3-30B-A3B's experts: hidden 2048, 128 experts 768 wide, top-8."""

TRITON_BYTES = 8192 * 8 * max(768, 2048) * 2 + 8192 * 8 * max(2 * 768, 2048) * 2
"""The Triton experts' (and Marlin's) workspace at 8192 tokens: workspace13 (8192, 8, max(768, 2048)) against the
(8192, 2048) output, workspace2 (8192, 8, max(1536, 2048)), bf16: 268,435,456 + 268,435,456."""

FLASHINFER_CUTLASS_BYTES = 8192 * 2048 * 2
"""FlashInferExperts' workspace13 (M, K') against its (M, 2K') output for NVFP4 (K' = 2048 / 2 packed) or (M, K')
unquantised (K' = 2048), no workspace2: 8192 x 2048 bf16 values."""


@pytest.mark.parametrize(
    ("scheme", "capability", "backend"),
    [
        # unquantised: FlashInfer behind Triton on Hopper; not run on Ampere / Ada; TRT-LLM's needs family 100,
        # FlashInfer CUTLASS leaves SM 11.0 out
        ("", (8, 0), "TRITON"),
        ("", (8, 9), "TRITON"),
        ("", (9, 0), "TRITON"),
        ("", (10, 0), "FLASHINFER_TRTLLM (monolithic)"),
        ("", (10, 3), "FLASHINFER_TRTLLM (monolithic)"),
        ("", (11, 0), "TRITON"),
        ("", (12, 0), "FLASHINFER_CUTLASS"),
        # NVFP4 W4A4: TRT-LLM on family 100, FlashInfer CUTLASS on family 120, vLLM CUTLASS on 110, Humming on
        # Hopper (ahead of Marlin), Marlin below
        ("nvfp4", (10, 0), "FLASHINFER_TRTLLM (monolithic)"),
        ("nvfp4", (12, 0), "FLASHINFER_CUTLASS"),
        ("nvfp4", (12, 1), "FLASHINFER_CUTLASS"),
        ("nvfp4", (11, 0), "VLLM_CUTLASS"),
        ("nvfp4", (9, 0), "HUMMING"),
        ("nvfp4", (8, 9), "MARLIN"),
        # NVFP4 weights, 16-bit activations: only Marlin (Humming on Hopper) takes no activation key
        ("nvfp4-a16", (12, 0), "MARLIN"),
        ("nvfp4-a16", (10, 0), "MARLIN"),
        ("nvfp4-a16", (9, 0), "HUMMING"),
        # FP8 (oracle/fp8.py L88-132): dynamic per-tensor scales, which no FlashInfer kernel takes: Triton from
        # SM 8.9 (supports_fp8), Marlin below
        ("fp8", (9, 0), "TRITON"),
        ("fp8", (10, 0), "TRITON"),
        ("fp8", (12, 0), "TRITON"),
        ("fp8", (8, 9), "TRITON"),
        ("fp8", (8, 0), "MARLIN"),
        # static per-tensor scales: TRT-LLM's monolithic kernel on family 100, FlashInfer CUTLASS on 9.0 / 120
        ("fp8-static", (10, 0), "FLASHINFER_TRTLLM (monolithic)"),
        ("fp8-static", (9, 0), "FLASHINFER_CUTLASS"),
        ("fp8-static", (12, 0), "FLASHINFER_CUTLASS"),
        ("fp8-static", (8, 9), "TRITON"),
        ("fp8-static", (11, 0), "TRITON"),
        # block FP8: Triton moved to the front under TP on Hopper; TRT-LLM on family 100; DeepGEMM on family 120
        ("fp8-block", (9, 0), "TRITON"),
        ("fp8-block", (10, 0), "FLASHINFER_TRTLLM (monolithic)"),
        ("fp8-block", (12, 0), "DEEPGEMM"),
        ("fp8-block", (8, 9), "TRITON"),
        ("fp8-block", (8, 6), "MARLIN"),
        # mxfp4: monolithic on SM 9.0-10.x, Marlin elsewhere
        ("mxfp4", (9, 0), "monolithic"),
        ("mxfp4", (10, 0), "monolithic"),
        ("mxfp4", (12, 0), "MARLIN"),
        ("mxfp4", (8, 6), "MARLIN"),
        # AWQ / GPTQ: Marlin, Humming on Hopper
        ("wna16", (8, 6), "MARLIN"),
        ("wna16", (12, 0), "MARLIN"),
        ("wna16", (9, 0), "HUMMING"),
        ("other", (9, 0), "other"),
    ],
)
def test_the_backend_vllm_picks(scheme: str, capability: tuple[int, int], backend: str) -> None:
    assert scheme in MOE_QUANT_SCHEMES
    assert vllm_moe_backend(scheme, capability) == backend


@pytest.mark.parametrize(
    ("scheme", "capability", "expected"),
    [
        ("", None, TRITON_BYTES),  # None: the H100's
        ("", (8, 0), TRITON_BYTES),
        ("", (10, 0), 0),
        ("", (12, 0), FLASHINFER_CUTLASS_BYTES),
        ("nvfp4", (10, 0), 0),
        ("nvfp4", (12, 0), FLASHINFER_CUTLASS_BYTES),
        ("nvfp4", (8, 9), TRITON_BYTES),  # Marlin: the Triton experts' bytes
        ("nvfp4", (9, 0), TRITON_BYTES),  # Humming: not modelled, the Triton experts' bytes charged
        ("nvfp4", (11, 0), TRITON_BYTES),  # vLLM CUTLASS: not modelled
        ("nvfp4-a16", (12, 0), TRITON_BYTES),
        ("fp8-block", (9, 0), TRITON_BYTES),
        ("fp8-block", (10, 0), 0),
        ("fp8-block", (12, 0), TRITON_BYTES),  # DeepGEMM: not modelled
        ("fp8-static", (9, 0), FLASHINFER_CUTLASS_BYTES),
        ("fp8-static", (10, 0), 0),
        ("fp8", (12, 0), TRITON_BYTES),
        ("wna16", (8, 6), TRITON_BYTES),
        ("mxfp4", (9, 0), 0),
    ],
)
def test_workspace_bytes_per_backend(scheme: str, capability: tuple[int, int] | None, expected: int) -> None:
    """Qwen3-30B-A3B's experts at 8192 tokens, bf16: 536,870,912 B for the Triton / Marlin workspace, 33,554,432 B
    for FlashInfer CUTLASS's, 0 for a monolithic kernel."""
    assert TRITON_BYTES == 536_870_912 and FLASHINFER_CUTLASS_BYTES == 33_554_432
    shape = attrs.evolve(QWEN3_30B, moe_quant=scheme)
    assert moe_workspace_bytes(shape=shape, tokens=8192, compute_capability=capability) == expected


def test_flashinfer_cutlass_workspace_rounding_and_tp() -> None:
    """FlashInfer CUTLASS's ``(M, hidden)`` does not shrink with TP (the hidden size is not split) and is rounded
    up to 256 B: 3 tokens x 100 x 2 B = 600 -> 768; float32 activations double it (``workspace_dtype`` is the
    activations' dtype, ``modular_kernel.py`` L864-866)."""
    small = ModelShape(hidden_size=100, num_experts_per_tok=2, moe_intermediate_size=40, moe_quant="nvfp4")
    assert moe_workspace_bytes(shape=small, tokens=3, compute_capability=(12, 0)) == 768
    assert moe_workspace_bytes(shape=small, tokens=3, tp_size=4, compute_capability=(12, 0)) == 768
    wide = attrs.evolve(small, dtype_bytes=4)
    assert moe_workspace_bytes(shape=wide, tokens=3, compute_capability=(12, 0)) == 1280  # 1200 -> 1280


def _modelopt(algo: str) -> dict[str, object]:
    return {"quant_method": "modelopt", "quant_algo": algo}


def _group(weights: dict[str, object], inputs: dict[str, object] | None, targets: list[str]) -> dict[str, object]:
    return {"weights": weights, "input_activations": inputs, "targets": targets}


FP4 = {"num_bits": 4, "type": "float", "group_size": 16}
FP8_BLOCK = {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]}
FP8_CHANNEL = {"num_bits": 8, "type": "float", "strategy": "channel"}
FP8_TENSOR = {"num_bits": 8, "type": "float", "strategy": "tensor"}
FP8_STATIC_INPUT = {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False}
FP8_TOKEN_INPUT = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True}
INT4 = {"num_bits": 4, "type": "int", "group_size": 128, "symmetric": True}
INT8 = {"num_bits": 8, "type": "int", "strategy": "channel"}


@pytest.mark.parametrize(
    ("config", "runtime", "scheme"),
    [
        ({}, None, ""),
        ({}, "fp8", "fp8"),  # --quantization fp8 on an unquantised checkpoint: Fp8Config quantises per tensor
        ({}, "bitsandbytes", "other"),
        ({"quant_method": "fp8"}, None, "fp8"),
        ({"quant_method": "fp8", "activation_scheme": "dynamic"}, None, "fp8"),
        ({"quant_method": "fp8", "activation_scheme": "static"}, None, "fp8-static"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, None, "fp8-block"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8", "fp8-block"),  # the checkpoint's
        (_modelopt("FP8"), None, "fp8-static"),
        (_modelopt("FP8_BLOCK_SCALES"), None, "fp8-block"),
        (_modelopt("NVFP4"), None, "nvfp4"),
        ({"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4"}}, None, "nvfp4"),  # hf_quant_config
        (_modelopt("W4A16_NVFP4"), None, "nvfp4-a16"),
        (_modelopt("MXFP8"), None, "other"),
        ({"quant_method": "modelopt"}, None, "other"),
        ({"quant_method": "modelopt_fp4"}, None, "nvfp4"),
        (
            {
                "quant_method": "modelopt",
                "quant_algo": "MIXED_PRECISION",
                "quantized_layers": {
                    "model.layers.0.self_attn.q_proj": {"quant_algo": "FP8"},
                    "model.layers.0.mlp.experts": {"quant_algo": "NVFP4", "group_size": 16},
                },
            },
            None,
            "nvfp4",
        ),
        ({"quant_method": "mxfp4"}, None, "mxfp4"),
        ({"quant_method": "awq", "bits": 4}, None, "wna16"),
        ({"quant_method": "gptq_marlin", "bits": 4}, None, "wna16"),
        ({"quant_method": "bitsandbytes"}, None, "other"),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": _group(FP4, FP4, ["Linear"])}}, None, "nvfp4"),
        (
            {"quant_method": "compressed-tensors", "config_groups": {"g": _group(FP4, None, ["Linear"])}},
            None,
            "nvfp4-a16",
        ),
        (
            {"quant_method": "compressed-tensors", "config_groups": {"g": _group(FP8_BLOCK, {}, ["Linear"])}},
            None,
            "fp8-block",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": _group(FP8_TENSOR, FP8_STATIC_INPUT, ["Linear"])},
            },
            None,
            "fp8-static",
        ),
        (
            # FP8_DYNAMIC (per-channel weights, dynamic per-token inputs): vLLM's CUTLASS FP8 experts may run it
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": _group(FP8_CHANNEL, FP8_TOKEN_INPUT, ["Linear"])},
            },
            None,
            "other",
        ),
        ({"quant_method": "compressed-tensors", "config_groups": {"g": _group(INT4, None, ["Linear"])}}, None, "wna16"),
        (
            {"quant_method": "compressed-tensors", "config_groups": {"g": _group(INT8, INT8, ["Linear"])}},
            None,
            "other",  # int8 W8A8: oracle/int8.py, not told apart
        ),
        (
            # the group that names the experts wins over the generic one
            {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "attention": _group(FP8_CHANNEL, FP8_TOKEN_INPUT, ["re:.*self_attn.*"]),
                    "experts": _group(FP4, FP4, ["re:.*mlp.experts.*"]),
                },
            },
            None,
            "nvfp4",
        ),
        ({"quant_method": "compressed-tensors"}, None, "other"),
        (
            # MXFP4 weights (groups of 32) are not NVFP4
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": _group({**FP4, "group_size": 32}, None, ["Linear"])},
            },
            None,
            "other",
        ),
    ],
)
def test_the_experts_scheme_of_a_quantization_config(
    config: dict[str, object], runtime: str | None, scheme: str
) -> None:
    assert moe_quant_scheme(config, runtime=runtime) == scheme


def test_a_moe_config_carries_its_experts_scheme() -> None:
    """``model_shape_from_config`` keeps the experts' scheme of a MoE config (top level or ``text_config``) and of
    ``--quantization``; without it (a hand-built shape) ``quant_method`` alone names it."""
    qwen = dict(read_config_file(CONFIGS / "Qwen--Qwen3-30B-A3B.json"))
    assert "quantization_config" not in qwen
    plain = model_shape_from_config(qwen)
    assert plain is not None and plain.moe_quant == "" and plain.experts_scheme == ""
    runtime = model_shape_from_config(qwen, quantization="fp8")
    assert runtime is not None and runtime.experts_scheme == "fp8"
    nvfp4 = model_shape_from_config({**qwen, "quantization_config": _modelopt("NVFP4")})
    assert nvfp4 is not None and (nvfp4.quant_method, nvfp4.experts_scheme) == ("modelopt", "nvfp4")
    assert ModelShape(hidden_size=8, quant_method="mxfp4").experts_scheme == "mxfp4"
    assert ModelShape(hidden_size=8, quant_method="modelopt").experts_scheme == "other"
    assert ModelShape(hidden_size=8).experts_scheme == ""
    with pytest.raises(ConfigError, match=r"ModelShape.moe_quant must be None or one of .* got 'int3'"):
        ModelShape(hidden_size=8, moe_quant="int3")


def test_qwen36_nvfp4_experts_run_marlin_on_the_rtx_5090() -> None:
    """The club-3090 checkpoint (Qwen3.6-35B-A3B NVFP4, ModelOpt ``MIXED_PRECISION``) quantises its experts as
    ``W4A16_NVFP4``: NVFP4 weights without activation quantisation, which no FlashInfer or vLLM CUTLASS NVFP4
    kernel takes, so vLLM 0.24 and 0.33 run Marlin on the RTX 5090 (0.24.0 ``quantization/modelopt.py`` L1403-1413:
    "with activation_key=None every W4A4 backend's _supports_quant_scheme rejects itself ... only Marlin survives";
    0.33 L857-858), whose workspace is the Triton experts' bytes (0.24.0 ``experts/marlin_moe.py`` L711-741):
    8192 x 8 x max(512, 2048) x 2 + 8192 x 8 x max(1024, 2048) x 2 = 536,870,912 B.  The language model's own pass
    (``--language-model-only``) is therefore unchanged: forward 125,829,120 + 536,870,912 + cuBLAS = 696,254,464 B.
    A W4A4 NVFP4 checkpoint of the same shape would run FlashInfer CUTLASS: 8192 x 2048 x 2 = 33,554,432 B and a
    192,937,984 B peak."""
    shape = model_shape_of("qwen3.6-35b-a3b-nvfp4")
    assert shape is not None
    assert (shape.quant_method, shape.experts_scheme) == ("modelopt", "nvfp4-a16")
    assert vllm_moe_backend(shape.experts_scheme, (12, 0)) == "MARLIN"
    assert moe_workspace_bytes(shape=shape, tokens=8192, compute_capability=(12, 0)) == 536_870_912
    options = {
        "vocab_size": 248_320,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 8192,
        "profile": load_profile("0.33"),
        "sm_count": 170,
        "compute_capability": (12, 0),
    }
    marlin = activation_peak(**options, shape=shape)  # type: ignore[arg-type]
    assert marlin.bytes == 125_829_120 + 536_870_912 + CUBLAS == 696_254_464
    assert "fused-MoE workspace 512.0 MiB (MARLIN)" in marlin.formula
    w4a4 = activation_peak(**options, shape=attrs.evolve(shape, moe_quant="nvfp4"))  # type: ignore[arg-type]
    assert w4a4.bytes == 125_829_120 + 33_554_432 + CUBLAS == 192_937_984
    assert "fused-MoE workspace 32.0 MiB (FLASHINFER_CUTLASS)" in w4a4.formula
    # on an H100 Humming runs the W4A16 experts: not modelled, and the formula says the Triton bytes stand in
    hopper = activation_peak(**{**options, "compute_capability": (9, 0)}, shape=shape)  # type: ignore[arg-type]
    assert "fused-MoE workspace 512.0 MiB (TRITON's bytes: HUMMING not modelled)" in hopper.formula
    fp8 = attrs.evolve(shape, moe_quant="other")
    other = activation_peak(**{**options, "compute_capability": (9, 0)}, shape=fp8)  # type: ignore[arg-type]
    assert "fused-MoE workspace 512.0 MiB (TRITON's bytes: the experts' backend not modelled)" in other.formula


def test_plan_vllm_passes_runtime_fp8_to_the_moe_workspace() -> None:
    """``plan_vllm`` reads the experts' scheme with ``--quantization``: Qwen3-30B-A3B in bf16 on an RTX PRO 6000
    (SM 12.0) runs FlashInfer CUTLASS (8192 x 2048 x 2 B = 32 MiB); under ``--quantization fp8_per_tensor`` (and
    ``fp8``, which vLLM 0.33's loader serves as it) its experts are FP8 with dynamic per-tensor scales
    (``Fp8PerTensorOnlineMoEMethod``, quantization/online/fp8.py L594-615), which only the Triton experts take there
    (512 MiB)."""
    from kvpools_core.engines.vllm import plan_vllm
    from kvpools_core.values import Serving

    def workspace(serving: Serving) -> str:
        result = plan_vllm("qwen3-30b-a3b", serving, gpu="rtx-pro-6000", runtime_profile="0.33")
        assert result.runtime_memory is not None
        formula = result.runtime_memory.term("activation peak").formula
        return next(part for part in formula.split("; ") if part.startswith("fused-MoE workspace"))

    assert workspace(Serving()) == "fused-MoE workspace 32.0 MiB (FLASHINFER_CUTLASS)"
    assert (
        workspace(Serving(quantization="fp8_per_tensor", accounting="vllm")) == "fused-MoE workspace 512.0 MiB (TRITON)"
    )
    assert workspace(Serving(quantization="fp8")) == "fused-MoE workspace 512.0 MiB (TRITON)"
