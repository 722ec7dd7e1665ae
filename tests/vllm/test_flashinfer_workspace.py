"""The FlashInfer attention workspace in vLLM's CUDA-graph estimate and vLLM 0.24's runtime profile (issue 34).

Hand-computed from the vLLM 0.24.0 wheel (``pip download vllm==0.24.0``), the 0.26.0 wheel and the 0.33.0 in the
peers venv:

* backend: ``platforms/cuda.py`` ``_get_backend_priorities`` L143-159 (FlashInfer first on 10.x, FlashAttention
  first elsewhere); ``flash_attn.py`` ``supports_kv_cache_dtype`` L183-193 (fp8 only as FA3 on Hopper) and
  ``supports_head_size`` L173-180 (at most 256 without FA4).
* workspace: ``VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE`` 394 MiB (0.24.0 ``envs.py`` L1549-1551), allocated by
  ``FlashInferMetadataBuilder._get_workspace_buffer`` (0.24.0 ``v1/attention/backends/flashinfer.py`` L785-793) when
  the FULL capture's warm-up builds the decode wrapper (L1293); the wrapper's 8 MiB int workspace (flashinfer-python
  0.6.12 ``decode.py`` L756-758); from 0.26.0 at least ``max_num_batched_tokens x heads x head_dim x 16``
  (0.26.0 ``flashinfer.py`` L85, L936-958).
* estimate: ``profile_cudagraph_memory`` (0.24.0 ``gpu_model_runner.py`` L6447-6593): per mode the free-memory drop of
  the first two captures, ``max(first) + sum(per graph x (n - 1))``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.engines.vllm import runtime_memory
from kvpools_core.engines.vllm.runtime_memory import (
    FLASHINFER_INT_WORKSPACE_BYTES,
    FLASHINFER_WORKSPACE_BYTES,
    GraphShape,
    ModelShape,
    attention_backend,
    cudagraph_memory,
    estimate_runtime_memory,
    flashinfer_workspace_bytes,
    graph_shape_of,
    load_profile,
    model_shape_of,
)
from kvpools_core.pipeline.gpus import find_gpu
from kvpools_core.registry import Registry

GiB = 1 << 30
MiB = 1 << 20
QWEN36 = "qwen3.6-35b-a3b-nvfp4"


@pytest.mark.parametrize(
    ("capability", "kv", "head_dim", "backend"),
    [
        ((12, 0), "fp8", 256, "FLASHINFER"),  # the RTX 5090 records: FlashAttention refuses fp8 off Hopper
        ((12, 0), "auto", 256, "FLASH_ATTN"),
        ((9, 0), "fp8", 128, "FLASH_ATTN"),  # FA3 takes fp8 on Hopper
        ((9, 0), "fp8_e5m2", 128, "FLASHINFER"),
        ((8, 6), "fp8_e4m3", 128, "FLASHINFER"),  # an RTX 3090 with an fp8 cache
        ((8, 9), "auto", 128, "FLASH_ATTN"),
        ((10, 0), "auto", 128, "FLASHINFER"),  # Blackwell datacenter: FlashInfer first
        ((9, 0), "auto", 512, "FLASHINFER"),  # above FlashAttention's 256 without FA4
        ((9, 0), "auto", 0, None),  # MLA (no paged-attention head size)
        ((7, 5), "auto", 128, None),
        (None, "auto", 128, None),
    ],
)
def test_the_attention_backend(capability: tuple[int, int] | None, kv: str, head_dim: int, backend: str) -> None:
    assert attention_backend(compute_capability=capability, kv_cache_dtype=kv, head_dim=head_dim) == backend


def test_the_workspace_size_per_version() -> None:
    assert (394 * MiB, 8 * MiB) == (FLASHINFER_WORKSPACE_BYTES, FLASHINFER_INT_WORKSPACE_BYTES)
    v024, v033 = load_profile("0.24"), load_profile("0.33")
    # 0.24: fixed, whatever the batch
    assert flashinfer_workspace_bytes(profile=v024, max_num_batched_tokens=8192, num_qo_heads=16, head_dim=256) == (
        394 * MiB
    )
    # 0.26 on: Qwen3.6 at 8192 tokens: 8192 x 16 x 256 x 16 = 536,870,912 B = 512 MiB > 394 MiB
    assert 512 * MiB == 8192 * 16 * 256 * 16
    assert flashinfer_workspace_bytes(profile=v033, max_num_batched_tokens=8192, num_qo_heads=16, head_dim=256) == (
        512 * MiB
    )
    # 2048 x 32 x 128 x 16 = 128 MiB: the 394 MiB floor
    assert flashinfer_workspace_bytes(profile=v033, max_num_batched_tokens=2048, num_qo_heads=32, head_dim=128) == (
        394 * MiB
    )


QWEN36_GRAPH = GraphShape(layers=40, attention_heads=16, value_head_dim=256, mlp_width=8 * 512)
"""Qwen3.6-35B-A3B (its preset): 40 layers, 16 heads of 256, 8 experts of 512 a token."""
PER_PIECEWISE, PER_FULL = 9_143_583, 7_423_918
"""vllm-0.24.json's (= 0.33's) per-graph terms at 40 layers: round(0.218 MiB x 40), round(0.177 MiB x 40)."""
FIRST_PIECEWISE = 67_503_063
"""round(64.3 MiB) + round(2.43 x (2 x 2 x 4096 x 2 B)) = 67,423,437 + 79,626 (largest capture size 2)."""


def test_the_cuda_graph_estimate_carries_the_workspace_by_hand() -> None:
    """max_num_seqs 1, 8192 batched tokens: capture sizes [1, 2] (ceiling min(1 x 2, 512) = 2), PIECEWISE 2, FULL 1
    (size 1).  With FlashAttention the FULL first capture is the split-KV accumulators 32 x 1 x 16 x 257 x 4 B =
    526,336 B + a FULL graph = 7,950,254 B, below the PIECEWISE first: 67,503,063 + 1 x 9,143,583 = 76,646,646 B.
    With FlashInfer the FULL first capture holds the 394 MiB float workspace + 8 MiB int workspace + a FULL graph
    (no accumulators) = 428,951,470 B: + 9,143,583 = 438,095,053 B.  max_num_seqs 4: sizes [1, 2, 4, 8], FULL 3
    (1, 2, 4: three decode wrappers): 428,951,470 + 3 x 9,143,583 + 2 x (7,423,918 + 8 MiB) = 488,007,271 B."""
    profile = load_profile("0.24")
    common: dict[str, Any] = {"profile": profile, "max_num_batched_tokens": 8192, "graph": QWEN36_GRAPH}
    plain = cudagraph_memory(max_num_seqs=1, attention="FLASH_ATTN", **common)
    assert plain.bytes == FIRST_PIECEWISE + PER_PIECEWISE == 76_646_646
    one = cudagraph_memory(max_num_seqs=1, flashinfer_workspace=394 * MiB, attention="FLASHINFER", **common)
    assert one.bytes == 394 * MiB + 8 * MiB + PER_FULL + PER_PIECEWISE == 438_095_053
    assert "[FlashInfer workspace 394 MiB + 8 MiB a FULL graph]" in one.formula
    four = cudagraph_memory(max_num_seqs=4, flashinfer_workspace=394 * MiB, attention="FLASHINFER", **common)
    assert four.bytes == 402 * MiB + PER_FULL + 3 * PER_PIECEWISE + 2 * (PER_FULL + 8 * MiB) == 488_007_271
    # vLLM 0.19 subtracts no estimate: nothing to carry
    assert cudagraph_memory(profile=load_profile("0.19"), flashinfer_workspace=394 * MiB).bytes == 0


def test_qwen3_6_on_the_rtx_5090_per_version(monkeypatch: pytest.MonkeyPatch) -> None:
    """The records' configuration: 16 heads x 256 (the preset's config), fp8 cache, RTX 5090 (12.0): the 0.24
    profile's FULL first capture holds 394 + 8 MiB, the 0.33 profile's 512 + 8 MiB; an H100 (FA3 takes the fp8
    cache) or a bf16 cache holds FlashAttention's accumulators instead, which at one token are below the PIECEWISE
    first capture."""
    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: None)
    shape = model_shape_of(QWEN36)
    assert shape is not None and (shape.num_attention_heads, shape.head_dim) == (16, 256)
    assert graph_shape_of(QWEN36) == QWEN36_GRAPH
    flash_attn = FIRST_PIECEWISE + PER_PIECEWISE
    common: dict[str, Any] = {
        "vocab_size": 248320,
        "max_num_seqs": 1,
        "max_num_batched_tokens": 8192,
        "shape": shape,
        "graph": QWEN36_GRAPH,
    }

    def graphs(gpu: str, version: str, kv: str) -> int:
        memory = estimate_runtime_memory(gpu=find_gpu(gpu), engine_version=version, kv_cache_dtype=kv, **common)
        return memory.term("CUDA graphs").bytes

    assert graphs("rtx-5090", "0.24", "fp8") == 402 * MiB + PER_FULL + PER_PIECEWISE
    assert graphs("rtx-5090", "0.25", "fp8") == 402 * MiB + PER_FULL + PER_PIECEWISE
    assert graphs("rtx-5090", "0.33", "fp8") == 520 * MiB + PER_FULL + PER_PIECEWISE
    assert graphs("rtx-5090", "0.24", "auto") == flash_attn
    assert graphs("h100", "0.24", "fp8") == flash_attn
    # a Blackwell datacenter GPU picks FlashInfer, but decodes with TRTLLM-gen when its cubins are reachable: not
    # modelled, no workspace charged
    assert attention_backend(compute_capability=(10, 0), kv_cache_dtype="auto", head_dim=256) == "FLASHINFER"
    assert graphs("b200", "0.24", "fp8") == flash_attn
    # without heads (a hand-made shape) the backend is not known: no workspace
    bare = ModelShape(hidden_size=2048)
    memory = estimate_runtime_memory(
        gpu=find_gpu("rtx-5090"), engine_version="0.24", kv_cache_dtype="fp8", **{**common, "shape": bare}
    )
    assert memory.term("CUDA graphs").bytes == flash_attn


def test_the_0_24_profile_is_0_33s_constants_with_its_own_flags() -> None:
    v024, v033 = load_profile("0.24"), load_profile("vllm==0.25")
    assert v033.version == "0.24" and v024.covers == ("0.20", "0.21", "0.22", "0.23", "0.24", "0.25")
    v033 = load_profile("0.33")
    for field in (
        "non_torch_bytes_by_tp",
        "non_torch_pp_bytes",
        "cudagraph_subtracted",
        "cudagraph",
        "sampler_bytes_per_logit",
    ):
        assert getattr(v024, field) == getattr(v033, field), field
    assert (v024.flashinfer_workspace_scales, v024.gdn_prefill_checkpoint) == (False, False)
    assert (v033.flashinfer_workspace_scales, v033.gdn_prefill_checkpoint) == (True, True)


def test_cli_engine_version_024_reproduces_the_logged_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvpools plan qwen3.6-35b-a3b-nvfp4 --engine-version vllm==0.24``: with club-3090#652's logged budget
    (``--memory 6.01GiB``) the 0.24 layout gives its 569,878 tokens (2096-token blocks, 300 blocks / 69 a request);
    from the GPU (``--gpu rtx-5090``, utilization 0.92) the budget carries the 402 MiB of FlashInfer workspaces in
    the CUDA-graph estimate and gives 303 blocks, 575,577 tokens (+1.00 %)."""
    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: None)
    base = [
        "plan",
        QWEN36,
        "--engine-version",
        "vllm==0.24",
        "--kv-cache-dtype",
        "fp8",
        "--quantization",
        "modelopt",
        "--max-model-len",
        "131072",
        "--max-num-seqs",
        "1",
        "--max-num-batched-tokens",
        "8192",
        "--json",
    ]
    runner = CliRunner()
    given = runner.invoke(main, [*base, "--memory", "6.01GiB"])
    assert given.exit_code == 0, given.output
    data = json.loads(given.output)
    assert data["kv_cache_size_tokens"] == 569_878
    whole = runner.invoke(
        main, [*base, "--gpu", "rtx-5090", "--gpu-memory-utilization", "0.92", "--limit-mm-per-prompt", '{"image": 2}']
    )
    assert whole.exit_code == 0, whole.output
    data = json.loads(whole.output)
    terms = data["runtime_memory"]["terms"]
    assert terms["CUDA graphs"]["bytes"] == 438_095_053
    assert data["kv_cache_size_tokens"] == 575_577
    # the same plan in vLLM 0.33's layout and workspace: 2112-token blocks, 3 Mamba blocks a request, 512 MiB
    new = runner.invoke(
        main,
        [
            *[arg if arg != "vllm==0.24" else "vllm==0.33" for arg in base],
            "--gpu",
            "rtx-5090",
            "--gpu-memory-utilization",
            "0.92",
            "--limit-mm-per-prompt",
            '{"image": 2}',
        ],
    )
    assert new.exit_code == 0, new.output
    assert json.loads(new.output)["runtime_memory"]["terms"]["CUDA graphs"]["bytes"] == (
        520 * MiB + PER_FULL + PER_PIECEWISE
    )


@pytest.mark.parametrize("preset", ["qwen3-next-80b-a3b-thinking", "qwen3.5-35b-a3b", "qwen3.5-397b-a17b", QWEN36])
@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("tp", [1, 2])
def test_the_pre_0_33_gdn_layout_is_the_smallest_16_token_block_holding_the_state(
    preset: str, kv: str, tp: int, registry: Registry
) -> None:
    """``layouts.without_gdn_prefill_checkpoint`` on every Gated DeltaNet preset: the attention block is the smallest
    multiple of 16 tokens whose page holds the GDN state (``_align_hybrid_block_size`` with no checkpoint grid), at
    most 0.33's 64-aligned block, the state page padded to the attention page, no checkpoint block; the non-GDN specs
    keep their kind."""
    from kvpools_core.engines.vllm.layouts import without_gdn_prefill_checkpoint
    from kvpools_core.engines.vllm.model import worker_kv_cache_specs
    from kvpools_core.models import load_model, served_model
    from kvpools_core.parts.vllm.specs import MambaSpec
    from kvpools_core.values import Serving

    serving = Serving(accounting="vllm", kv_cache_dtype=kv, tp_size=tp)
    model = served_model(load_model(preset, registry)[0], serving)
    (v033,) = worker_kv_cache_specs(model, serving, registry, block_size=16)
    old = without_gdn_prefill_checkpoint(v033, 16)
    assert old.keys() == v033.keys()
    state = next(spec for spec in v033.values() if isinstance(spec, MambaSpec))
    attention = next(spec for spec in old.values() if not isinstance(spec, MambaSpec))
    per_token = attention.page_size_bytes // attention.block_size
    block = attention.block_size
    assert block % 16 == 0 and block * per_token >= state.state_bytes > (block - 16) * per_token
    assert block <= state.block_size and state.block_size % 64 == 0
    for name, spec in old.items():
        assert type(spec) is type(v033[name]) and spec.block_size == block
        if isinstance(spec, MambaSpec):
            assert spec.num_prefill_checkpoint_blocks == 0 and spec.prefill_checkpoint_alignment is None
            assert spec.page_size_bytes == block * per_token
