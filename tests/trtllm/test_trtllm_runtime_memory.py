"""TensorRT-LLM's whole-GPU terms (issue 34, ``kvpools_core.engines.trtllm.runtime_memory``), by hand.

Sources: ``tensorrt_llm/_torch/pyexecutor/_util.py``@``00043967`` (``KvCacheCreator.configure_kv_cache_capacity``:
``total_gpu_memory`` from ``torch.cuda.mem_get_info()``, ``peak_memory = torch_peak + extra_cost``,
``_cal_max_memory``: ``(total - peak + allocated_bytes) x fraction``; ``_create_dummy_context_requests``: the dummy
requests hold ``max_num_tokens`` tokens), ``_torch/modules/gated_mlp.py`` (``h1 = gate_up_proj(x)``, ``h2 =
swiglu(h1)``)."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.engines.trtllm.manager import available_kv_memory
from kvpools_core.engines.trtllm.runtime_memory import MlpShape, mlp_activation, mlp_shape_from_config
from kvpools_core.engines.vllm import runtime_memory as vllm_runtime
from kvpools_core.parts import device_memory
from kvpools_core.pipeline.gpus import find_gpu
from kvpools_core.values import Serving

GIB = 1 << 30
H100_TORCH_TOTAL = 85_029_615_043  # round(79.19 GiB): "total_memory=79.19GiB" (parts/device_memory.py)
LLAMA8_ACTIVATION = 8192 * (3 * 14336 + 2 * 4096) * 2  # max_num_tokens x (3 I + 2 H) x 2 B


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), terminal_width=400)


def test_the_device_total_is_shared_with_vllm() -> None:
    """One ``torch_total_memory`` for both engines: vLLM's module re-exports the shared one (the same object), the
    H100 measured (79.19 GiB), the H200 the catalogue's total less the 0.46 GiB nvidia-smi-to-torch gap."""
    assert vllm_runtime.torch_total_memory is device_memory.torch_total_memory
    assert vllm_runtime.TotalMemory is device_memory.TotalMemory
    assert device_memory.torch_total_memory(find_gpu("h100")).bytes == H100_TORCH_TOTAL
    h200 = find_gpu("h200")
    total = device_memory.torch_total_memory(h200)
    assert (total.bytes, total.measured) == (h200.total_bytes - round(0.46 * GIB), False)


def test_mlp_activation_by_hand() -> None:
    """Llama-3.1-8B (hidden 4096, intermediate 14336, bf16) at max_num_tokens 8192: ``h1`` 8192 x 28672, ``h2``
    8192 x 14336, the input and the residual 8192 x 4096 each, 2 B: 838,860,800 B (800 MiB).  TP 2 halves the
    column-parallel ``h1`` and ``h2`` only: 8192 x (21504 + 8192) x 2 = 486,539,264 B."""
    shape = MlpShape(hidden_size=4096, intermediate_size=14336, dtype_bytes=2, is_moe=False)
    assert mlp_activation(shape, max_num_tokens=8192, tp_size=1).bytes == LLAMA8_ACTIVATION == 838_860_800
    assert mlp_activation(shape, max_num_tokens=8192, tp_size=2).bytes == 486_539_264
    term = mlp_activation(shape, max_num_tokens=4096, tp_size=1)
    assert term.bytes == LLAMA8_ACTIVATION // 2 and not term.complete  # a floor of the activation peak
    moe = MlpShape(hidden_size=2880, intermediate_size=2880, dtype_bytes=2, is_moe=True)
    assert mlp_activation(moe, max_num_tokens=8192, tp_size=1).bytes == 0
    assert mlp_activation(None, max_num_tokens=8192, tp_size=1).bytes == 0


def test_mlp_shape_from_config() -> None:
    """A dense config; a config naming routed experts is MoE; the text config of a multimodal one; float32."""
    dense = mlp_shape_from_config({"hidden_size": 4096, "intermediate_size": 14336}, "bfloat16")
    assert dense == MlpShape(hidden_size=4096, intermediate_size=14336, dtype_bytes=2, is_moe=False)
    moe = mlp_shape_from_config({"hidden_size": 2880, "intermediate_size": 2880, "num_local_experts": 128}, "bfloat16")
    assert moe is not None and moe.is_moe
    nested = mlp_shape_from_config({"text_config": {"hidden_size": 8, "intermediate_size": 16}}, "float32")
    assert nested == MlpShape(hidden_size=8, intermediate_size=16, dtype_bytes=4, is_moe=False)
    assert mlp_shape_from_config({"hidden_size": 8}, "bfloat16") is None


def test_llama_8b_on_an_h100_by_hand() -> None:
    """79.19 GiB - weights (kvpools' estimate) - 838,860,800 B - 0 = free after warm-up; x 0.9 // 131,072 // 32."""
    result = plan_trtllm("llama-3.1-8b", gpu="h100")
    rank, terms = result.ranks[0], result.runtime[0]
    assert (terms.total.bytes, terms.total.measured) == (H100_TORCH_TOTAL, True)
    assert terms.activation.bytes == LLAMA8_ACTIVATION and terms.outside_torch.bytes == 0
    free = H100_TORCH_TOTAL - rank.weights_memory - LLAMA8_ACTIVATION  # type: ignore[operator]
    assert rank.free_after_warmup == free == 68_130_231_747
    assert rank.available_kv_memory == int(free * 0.9) == 61_317_208_572
    assert result.pools[0].primary_blocks == 61_317_208_572 // 131_072 // 32 == 14_619
    assert terms.upper_bound and any("upper bound" in note for note in result.notes)
    # docs/trtllm.md's "before": the catalogue's 81559 MiB less the weights, nothing else: 14,904 blocks
    catalogue = find_gpu("h100").total_bytes
    assert int((catalogue - rank.weights_memory) * 0.9) // 131_072 // 32 == 14_904  # type: ignore[operator]


def test_max_num_tokens_moves_the_gpu_budget_not_the_memory_one() -> None:
    """Under ``--gpu`` ``--max_num_tokens`` sizes the estimation forward (half the tokens, half the MLP term); with
    ``--memory`` the free memory after warm-up is given and it changes nothing."""
    full = plan_trtllm("llama-3.1-8b", gpu="h100")
    half = plan_trtllm("llama-3.1-8b", gpu="h100", max_num_tokens=4096)
    assert half.ranks[0].free_after_warmup - full.ranks[0].free_after_warmup == LLAMA8_ACTIVATION // 2
    given = [
        plan_trtllm("llama-3.1-8b", memory="40GiB", max_num_tokens=n).pools[0].primary_blocks for n in (4096, 8192)
    ]
    assert given[0] == given[1] and plan_trtllm("llama-3.1-8b", memory="40GiB").runtime == ()


def test_a_short_max_seq_len_and_batch_cap_the_estimation_step() -> None:
    """The dummy requests are at most max_seq_len - 1 tokens and a step takes at most max_batch_size of them:
    --max_seq_len 4096 --max_batch_size 1 runs 4,095 tokens, 8192 x ... becomes 4095 x (3 x 14336 + 2 x 4096) x 2."""
    capped = plan_trtllm("llama-3.1-8b", gpu="h100", max_seq_len=4096, max_batch_size=1)
    assert capped.runtime[0].activation.bytes == 4095 * (3 * 14336 + 2 * 4096) * 2
    two = plan_trtllm("llama-3.1-8b", gpu="h100", max_seq_len=4096, max_batch_size=2)
    assert two.runtime[0].activation.bytes == min(8192, 2 * 4095) * (3 * 14336 + 2 * 4096) * 2


def test_gpu_memory_is_torch_total_as_given() -> None:
    """``--gpu-memory 80GiB`` is taken as torch's total: 80 GiB - weights - 838,860,800 B."""
    result = plan_trtllm("llama-3.1-8b", gpu_memory="80GiB")
    terms = result.runtime[0]
    assert (terms.total.bytes, terms.total.source) == (80 * GIB, "given (--gpu-memory)")
    assert result.ranks[0].free_after_warmup == 80 * GIB - result.ranks[0].weights_memory - LLAMA8_ACTIVATION  # type: ignore[operator]


def test_pipeline_stages_each_pay_the_activation() -> None:
    """Every stage runs the estimation forward: each stage's free memory is torch's total less its own weights and
    the same MLP term (Llama-3.1-70B at TP 2 x PP 2: 8192 x (3 x 28672 / 2 + 2 x 8192) x 2 B)."""
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=2, pp_size=2), gpu="h100")
    activation = 8192 * (3 * 28672 // 2 + 2 * 8192) * 2
    for rank, terms in zip(result.ranks, result.runtime, strict=True):
        assert terms.activation.bytes == activation
        assert rank.free_after_warmup == H100_TORCH_TOTAL - rank.weights_memory - activation  # type: ignore[operator]


def test_cal_max_memory_on_a_cited_log() -> None:
    """TensorRT-LLM 1.1.0rc3, gpt-oss-120b on a DGX Spark (a public trtllm-serve log stored in the code index):
    "Peak memory during memory usage profiling (torch + non-torch): 113.65 GiB, available KV cache memory when
    calculating max tokens: 5.95 GiB, fraction is set 0.8999999761581421, kv size is 73728. device total memory
    119.70 GiB, , tmp kv_mem 0.56 GiB" and "[MemUsageChange] Allocated 0.56 GiB for max tokens in paged KV cache
    (8224)": the temporary cache is max_num_tokens 8192 + 1 rounded up to 32-token blocks, 8,224 x 73,728 B; the
    budget (total - peak + tmp) x fraction is what kvpools' ``available_kv_memory`` takes (the free memory given)."""
    assert round(8_224 * 73_728 / GIB, 2) == 0.56 and -(-(8192 + 1) // 32) * 32 == 8_224
    free = round((119.70 - 113.65 + 0.56) * GIB)
    assert round(available_kv_memory(free, 0.8999999761581421) / GIB, 2) == 5.95


def test_the_report_shows_every_term() -> None:
    """``kvpools plan --accounting trtllm --gpu h100`` prints the terms; ``--json`` carries them; ``capacity`` plans
    the same blocks."""
    shown = cli("plan", "llama-3.1-8b", "--accounting", "trtllm", "--gpu", "h100")
    assert shown.exit_code == 0, shown.output
    assert (
        "79.19 GiB (torch's total) - weights 14.96 GiB - activation 800.00 MiB - outside torch 0 B = 63.45 GiB free "
        "after warm-up" in shown.stdout
    )
    assert "activation: max_num_tokens 8,192 x (3 x intermediate 14,336 / tp 1 + 2 x hidden 4,096)" in shown.stdout
    assert "outside torch: not derived (0)" in shown.stdout
    data = json.loads(cli("plan", "llama-3.1-8b", "--accounting", "trtllm", "--gpu", "h100", "--json").stdout)
    (stage,) = data["runtime_memory"]
    assert stage["free_after_warmup"] == 68_130_231_747 and stage["upper_bound"] is True
    assert [(t["name"], t["bytes"]) for t in stage["terms"]][::2] == [
        ("total", H100_TORCH_TOTAL),
        ("activation", LLAMA8_ACTIVATION),
    ]
    capacity = cli("capacity", "llama-3.1-8b", "--accounting", "trtllm", "--gpu", "h100", "--context", "8k", "--json")
    assert capacity.exit_code == 0, capacity.output
    assert "14619" in capacity.stdout.replace(",", "")
