"""``kvpools_core.integrations.aiconfigurator.estimate_num_gpu_blocks``: aiconfigurator's signature, SGLang's blocks."""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import Serving, plan
from kvpools_core.errors import ConfigError
from kvpools_core.integrations.aiconfigurator import estimate_num_gpu_blocks
from kvpools_core.pipeline.weights import estimate_weights

CONFIGS = Path(__file__).resolve().parents[1] / "weights" / "configs"
LLAMA = str(CONFIGS / "meta-llama--Meta-Llama-3.1-8B.json")
GPT_OSS = str(CONFIGS / "openai--gpt-oss-120b.json")

AIC_SIGNATURE = (
    "(model_path: 'str', system: 'str', backend: 'str', backend_version: 'str | None' = None, *, "
    "scheduler_block_size: 'int', max_num_tokens: 'int', max_batch_size: 'int', memory_fraction_kind: 'str', "
    "memory_fraction_value: 'float', tp_size: 'int' = 1, pp_size: 'int' = 1, attention_dp_size: 'int' = 1, "
    "moe_tp_size: 'int | None' = None, moe_ep_size: 'int | None' = None, gemm_quant_mode: 'str | None' = None, "
    "moe_quant_mode: 'str | None' = None, kvcache_quant_mode: 'str | None' = None, "
    "fmha_quant_mode: 'str | None' = None, comm_quant_mode: 'str | None' = None, nextn: 'int' = 0, "
    "systems_path: 'str | None' = None, gpu_memory_capacity_bytes_override: 'int | None' = None, "
    "tolerance_fraction: 'float | None' = None, naive_kv_reservation: 'float' = 0.8, "
    "allow_naive_fallback: 'bool' = False, allow_hf_config_download: 'bool' = False) -> 'int'"
)
"""``aiconfigurator_core.sdk.memory.estimate_num_gpu_blocks`` as ``inspect.signature`` prints it (the module has
``from __future__ import annotations``): aiconfigurator-core 0.12.0 (PyPI), identical at
https://github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/aic-core/src/aiconfigurator_core/sdk/memory.py
(line 1069)."""

H100 = 80 * 2**30
"""A GPU of 80 GiB (``gpu_memory_capacity_bytes_override``)."""


def sglang(model: str = LLAMA, **overrides: Any) -> dict[str, Any]:
    """The arguments Dynamo's mocker passes for an SGLang worker (``memory_fraction_kind='of_total'``)."""
    arguments: dict[str, Any] = dict(
        model_path=model,
        system="h100_sxm",
        backend="sglang",
        scheduler_block_size=16,
        max_num_tokens=8_192,
        max_batch_size=256,
        memory_fraction_kind="of_total",
        memory_fraction_value=0.9,
        gpu_memory_capacity_bytes_override=H100,
    )
    arguments.update(overrides)
    return arguments


def test_the_signature_is_aiconfigurators() -> None:
    assert str(inspect.signature(estimate_num_gpu_blocks)) == AIC_SIGNATURE


def test_llama_blocks_by_hand() -> None:
    """Llama-3.1-8B on 80 GiB at --mem-fraction-static 0.9: weights 8,030,261,248 x 2 B = 16,060,522,496 B, so
    SGLang's budget is 80 GiB x 0.9 - weights = 61,248,888,832 B; its cell 32 x 8 x 256 x 2 = 131,072 B gives
    61,248,888,832 // 131,072 = 467,292 tokens, 467,280 page aligned = 29,205 blocks of 16."""
    assert estimate_weights(LLAMA, Serving()).bytes_per_rank == 16_060_522_496
    assert estimate_num_gpu_blocks(**sglang()) == 29_205


def test_it_is_the_plans_total_kv_blocks() -> None:
    """The same request planned by hand: SGLang's accounting, the profile over the GPU's memory and the weights."""
    serving = Serving(page_size=16, chunked_prefill_size=8_192, max_running_requests=256, accounting="sglang")
    weights = estimate_weights(LLAMA, serving).bytes_per_rank
    p = plan(LLAMA, serving, free_memory=H100, weights_memory=weights)
    assert estimate_num_gpu_blocks(**sglang()) == p.max_total_num_tokens // 16


@pytest.mark.parametrize(
    ("overrides", "blocks"),
    [
        # fp8 KV halves the cell: 61,248,888,832 // 65,536 = 934,584 tokens -> 58,411 blocks
        ({"kvcache_quant_mode": "fp8"}, 58_411),
        ({"kvcache_quant_mode": "bfloat16"}, 29_205),
        # a 10% margin: floor(61,248,888,832 x 0.9) = 55,123,999,948 B // 131,072 = 420,562 tokens -> 26,285 blocks
        ({"tolerance_fraction": 0.1}, 26_285),
        ({"tolerance_fraction": 0.0}, 29_205),
        # blocks of 64: 467,292 // 64 = 7,301
        ({"scheduler_block_size": 64}, 7_301),
        # the fallback knobs do not change a model kvpools plans
        ({"allow_naive_fallback": True, "allow_hf_config_download": True, "naive_kv_reservation": 0.5}, 29_205),
        ({"backend_version": "0.5.6"}, 29_205),
    ],
)
def test_llama_arguments_by_hand(overrides: dict[str, Any], blocks: int) -> None:
    assert estimate_num_gpu_blocks(**sglang(**overrides)) == blocks


def test_tensor_parallel_ranks_hold_more_tokens() -> None:
    """TP 2: 4 KV heads a rank (cell 65,536 B) and about half the weights, so more than twice the blocks."""
    serving = Serving(tp_size=2, page_size=16, max_running_requests=256, accounting="sglang")
    weights = estimate_weights(LLAMA, serving).bytes_per_rank
    budget = math.floor(H100 * 0.9) - weights
    assert estimate_num_gpu_blocks(**sglang(tp_size=2)) == budget // 65_536 // 16 > 2 * 29_205


def test_gpt_oss_expert_parallelism_changes_only_the_weights() -> None:
    """gpt-oss-120b at TP 2, page 64, 141 GB: EP 2 keeps half the experts whole instead of halving every expert;
    the blocks are the plan's full tokens over 64 either way."""
    for ep in (1, 2):
        serving = Serving(tp_size=2, page_size=64, max_running_requests=256, accounting="sglang")
        weights = estimate_weights(GPT_OSS, serving, ep_size=ep).bytes_per_rank
        p = plan(GPT_OSS, serving, free_memory=141 * 10**9, weights_memory=weights)
        arguments = sglang(
            GPT_OSS, tp_size=2, moe_ep_size=ep, scheduler_block_size=64, gpu_memory_capacity_bytes_override=141 * 10**9
        )
        assert estimate_num_gpu_blocks(**arguments) == p.max_total_num_tokens // 64


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"backend": "vllm"}, "backend='vllm'"),
        ({"memory_fraction_kind": "of_free"}, "memory_fraction_kind='of_free'"),
        ({"backend_version": "0.4.9"}, "backend_version='0.4.9'"),
        ({"memory_fraction_value": 1.5}, "memory_fraction_value must be finite and in [0, 1]"),
        ({"memory_fraction_value": 0.0}, "memory_fraction_value 0 leaves no KV budget"),
        ({"tolerance_fraction": 1.0}, "tolerance_fraction must be finite and in [0, 1)"),
        ({"naive_kv_reservation": -0.1}, "naive_kv_reservation must be finite"),
        ({"scheduler_block_size": 0}, "scheduler_block_size must be a positive integer"),
        ({"max_batch_size": 0}, "max_batch_size must be a positive integer"),
        ({"pp_size": 2}, "pp_size=2"),
        ({"attention_dp_size": 4}, "attention_dp_size=4"),
        ({"nextn": 1}, "nextn=1"),
        ({"gemm_quant_mode": "fp8"}, "gemm_quant_mode='fp8'"),
        ({"moe_quant_mode": "fp8"}, "moe_quant_mode='fp8'"),
        ({"fmha_quant_mode": "fp8"}, "fmha_quant_mode='fp8'"),
        ({"comm_quant_mode": "half"}, "comm_quant_mode='half'"),
        ({"systems_path": "/systems"}, "systems_path='/systems'"),
        ({"kvcache_quant_mode": "int8"}, "kvcache_quant_mode='int8'"),
        ({"gpu_memory_capacity_bytes_override": None}, "system='h100_sxm'"),
        ({"tp_size": 2, "moe_ep_size": 3}, "moe_ep_size=3"),
        ({"tp_size": 4, "moe_ep_size": 2, "moe_tp_size": 4}, "moe_tp_size=4"),
        # 16 GiB x 0.9 = 14.4 GiB < 14.96 GiB of weights
        ({"gpu_memory_capacity_bytes_override": 16 * 2**30}, "no KV budget"),
    ],
)
def test_what_kvpools_cannot_honour_is_refused_by_name(overrides: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError) as raised:
        estimate_num_gpu_blocks(**sglang(**overrides))
    assert named in str(raised.value)
    assert isinstance(raised.value, ValueError)  # what aiconfigurator's callers catch


def test_a_preset_without_the_full_shapes_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"intermediate_size|vocab_size"):
        estimate_num_gpu_blocks(**sglang("mistral-7b-v0.1"))
