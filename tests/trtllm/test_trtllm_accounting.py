"""``--accounting trtllm``: TensorRT-LLM 1.2's PyTorch ``KVCacheManager`` sizing, against hand-computed numbers.

The TensorRT-LLM wheel cannot be installed here (PyPI's ``tensorrt-llm==1.2.1`` is a 10 kB stub that downloads the
real wheel from NVIDIA's own index), so there is no differential run: each expected number is worked out beside
its assertion from the TensorRT-LLM source it restates (``tensorrt_llm/_torch/pyexecutor/resource_manager.py``
``KVCacheManager`` and ``_torch/pyexecutor/_util.py`` ``KvCacheCreator``; ``docs/trtllm.md`` quotes each step),
and three public TensorRT-LLM threads are reproduced (``test_public_*``).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpools_core.engines import engine_for, engines
from kvpools_core.engines.trtllm import ENGINE, plan_trtllm
from kvpools_core.engines.trtllm.manager import (
    TrtllmLayer,
    adjust_window_sizes_for_vswa,
    cache_bytes_per_token,
    estimated_size_per_token,
    pp_layers,
    window_shares,
    window_upper_bound,
    window_vector,
)
from kvpools_core.errors import ConfigError, KvpoolsError, UnsupportedCombinationError
from kvpools_core.values import Serving

GiB = 1 << 30
LLAMA70_TP4 = 2 * 80 * 2 * 128 * 2
"""llama-3.1-70b per token on one of 4 TP ranks: K+V x 80 layers x ceil(8 KV heads / 4) x head_dim 128 x 2 B."""


def test_engine_found_through_its_entry_point() -> None:
    """The trtllm engine is a plugin of the kvpools entry-point group (pyproject.toml), found by the registry's
    engine_accountings hook, not a list inside the core (issue 35)."""
    from kvpools_core.registry import get_registry

    assert get_registry().plugin("trtllm").module == "kvpools_core.engines.trtllm"
    assert engines()["trtllm"] is ENGINE
    engine = engine_for("trtllm")
    assert engine is ENGINE
    assert (engine.name, engine.version, engine.accountings, engine.docs) == (
        "trtllm",
        "1.2.1",
        ("trtllm",),
        "docs/trtllm.md",
    )
    assert Serving(accounting="trtllm").accounting == "trtllm"


def test_sglang_pipeline_refuses_trtllm_accounting() -> None:
    from kvpools_core import plan

    with pytest.raises(
        UnsupportedCombinationError,
        match=re.escape(
            "plans TensorRT-LLM's KV cache, not SGLang's pools: use kvpools_core.engines.trtllm.plan_trtllm"
        ),
    ):
        plan("llama-3.1-8b", Serving(accounting="trtllm"), memory="10GiB")


@pytest.mark.parametrize(
    ("tp", "dtype", "expected"),
    [
        (4, "auto", LLAMA70_TP4),
        (8, "auto", 2 * 80 * 1 * 128 * 2),
        (4, "fp8_e4m3", LLAMA70_TP4 // 2),
        # NVFP4: e = 2 x 80 x 2 x 128 = 40960 elements -> e/2 data + e/16 fp8 scales
        # (get_cache_bytes_per_token + calculate_scaling_factor_size_bytes, quant_vector_size=16)
        (4, "fp4_e2m1", 40960 // 2 + 40960 // 16),
    ],
)
def test_bytes_per_token_gqa(tp: int, dtype: str, expected: int) -> None:
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=tp, kv_cache_dtype=dtype), memory="40GiB")
    assert result.ranks[0].cache_bytes_per_token == expected
    assert result.ranks[0].estimated_size_per_token == expected


def test_estimate_floors_heads_the_manager_ceils() -> None:
    """8 KV heads on TP 16: ``get_cache_size_per_token`` takes ``head_dim x heads // tp`` = 128 x 8 // 16 = 64
    elements (half a head) while ``KVCacheManager.__init__`` keeps ``ceil(8/16)`` = 1 head of 128; the manager's
    own ``min(max_tokens, fraction x free / bytes)`` then binds (``calculate_max_num_blocks``)."""
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=16), memory="40GiB")
    rank = result.ranks[0]
    assert rank.estimated_size_per_token == 2 * 80 * 64 * 2 == 20480
    assert rank.cache_bytes_per_token == 2 * 80 * 128 * 2 == 40960
    free = 40 * GiB
    assert rank.max_tokens == int(0.9 * free / 40960)  # 943718, not int(0.9 x free) // 20480 = 1887436
    assert result.pools[0].primary_blocks == int(0.9 * free / 40960) // 32


def test_mla_latent_row_is_not_sharded() -> None:
    """DeepSeek-V3 (MLA): ``kv_lora_rank + qk_rope_head_dim`` = 512 + 64, kv_factor 1 (SELFKONLY), 61 layers,
    bf16: 61 x 576 x 2 = 70272 B on every TP rank."""
    for tp in (1, 8):
        result = plan_trtllm("deepseek-v3", Serving(tp_size=tp), memory="40GiB")
        assert result.ranks[0].cache_bytes_per_token == 61 * 576 * 2 == 70272
        assert result.ranks[0].estimated_size_per_token == 70272


def test_budget_is_fraction_of_memory_free_after_warmup() -> None:
    """``_cal_max_memory``: int((total - peak + temporary KV) x fraction); --memory states that free memory.
    40 GiB x 0.9 = 38654705664 B; // 81920 = 471859 tokens; // 32 = 14745 blocks."""
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), memory="40GiB")
    assert result.ranks[0].available_kv_memory == 38654705664
    assert result.ranks[0].max_tokens == 471859
    assert result.kv_cache_capacity() == {"maxNumBlocks": 14745, "tokensPerBlock": 32, "maxNumTokens": 471840}
    half = plan_trtllm(
        "llama-3.1-70b", Serving(tp_size=4), memory="40GiB", kv_cache_free_gpu_memory_fraction=0.5
    ).kv_cache_capacity()
    assert half is not None and half["maxNumBlocks"] == int(40 * GiB * 0.5) // LLAMA70_TP4 // 32 == 8192


def test_gpu_budget_takes_the_fraction_of_free_not_total() -> None:
    """A whole H100: free after warm-up = torch's total - weights - the estimation forward's MLP activation (the
    memory outside torch not derived, 0); the fraction multiplies that, not the total as vLLM's
    --gpu-memory-utilization does (runtime_memory.py; _util.py configure_kv_cache_capacity / _cal_max_memory)."""
    total = 85_029_615_043  # torch's H100 total, round(79.19 GiB): 'total_memory=79.19GiB' (parts/device_memory.py)
    # Llama-3.1-70B, TP 4, max_num_tokens 8192: 8192 x (3 x 28672 / 4 + 2 x 8192) x 2 B
    # (gated_mlp.py: h1 and h2, the layer input and the residual)
    activation = 8192 * (3 * 28672 // 4 + 2 * 8192) * 2
    assert activation == 620_756_992
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), gpu="h100", weights_memory="30GiB")
    free = total - 30 * GiB - activation
    assert result.ranks[0].free_after_warmup == free
    assert result.ranks[0].available_kv_memory == int(free * 0.9)
    assert result.pools[0].primary_blocks == int(free * 0.9) // LLAMA70_TP4 // 32
    # vLLM's reading (fraction of the total, less the weights) would leave less: 0.9 x 30 GiB < 30 GiB
    assert result.pools[0].primary_blocks > int(total * 0.9 - 30 * GiB) // LLAMA70_TP4 // 32
    terms = result.runtime[0]
    assert terms.total.bytes == total and terms.activation.bytes == activation and terms.outside_torch.bytes == 0
    assert terms.upper_bound


def test_max_tokens_clamps_the_budget() -> None:
    """``max_tokens`` limits the byte budget to ``bytes_for_tokens(max_tokens)``: 100000 tokens -> 3125 blocks."""
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), memory="40GiB", max_tokens=100_000)
    assert result.pools[0].primary_blocks == 100_000 // 32


def test_max_gpu_total_bytes_does_not_shrink_single_window_tokens() -> None:
    """``configure_kv_cache_capacity`` sets ``kv_cache_config.max_tokens`` before clamping by
    ``max_gpu_total_bytes`` and the V1 single-window manager reads ``max_tokens`` only, so the cap is not seen
    (flagged in NVIDIA/TensorRT-LLM PR #5933's review and left in #7923); the VSWA pools honour it."""
    plain = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), memory="40GiB")
    capped = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), memory="40GiB", max_gpu_total_bytes="10GiB")
    assert capped.pools[0].primary_blocks == plain.pools[0].primary_blocks == 14745
    assert capped.ranks[0].max_gpu_total_bytes == 10 * GiB
    vswa = plan_trtllm(
        "gpt-oss-120b", Serving(), memory="40GiB", max_attention_window="128,131072", max_gpu_total_bytes="10GiB"
    )
    # 36 layers alternate 128 / full: 18 per window, 8 KV heads x 64 x 2 (K, V) x 2 B = 2048 B each -> 36864 B
    assert [pool.primary_blocks for pool in vswa.pools] == [int(10 * GiB * 0.5 / 36864) // 32] * 2


def test_pp_layers_give_the_first_stages_the_remainder() -> None:
    """``Mapping.pp_layers``: torch.tensor_split, the first num_layers % pp stages hold one layer more."""
    assert [len(pp_layers(10, 4, r)) for r in range(4)] == [3, 3, 2, 2]
    assert list(pp_layers(10, 4, 2)) == [6, 7]
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=4, pp_size=3), memory="40GiB")
    assert [len(rank.layers) for rank in result.ranks] == [27, 27, 26]
    # MIN all-reduce across ranks: the 27-layer stages bind
    per_token = 2 * 27 * 2 * 128 * 2
    assert result.pools[0].primary_blocks == int(40 * GiB * 0.9) // per_token // 32


def test_attention_dp_keeps_every_head() -> None:
    """With attention DP the manager shards no heads (tp = 1; NVIDIA/TensorRT-LLM PR #10330 fixed VSWA's OOM when
    the binding still divided by TP): llama-3.1-70b keeps 8 heads -> 2 x 80 x 8 x 128 x 2 B."""
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), memory="40GiB", enable_attention_dp=True)
    assert result.ranks[0].cache_bytes_per_token == 2 * 80 * 8 * 128 * 2
    assert "enable_attention_dp: true" in result.extra_options_yaml()


def test_vswa_pools_split_memory_equally_by_default() -> None:
    """``calculate_max_num_blocks_for_vswa``: each window size gets ``budget x share / bytes of its layers``."""
    result = plan_trtllm("gpt-oss-120b", Serving(), memory="40GiB", max_attention_window="128,131072")
    budget = int(40 * GiB * 0.9)
    assert result.is_vswa
    assert [(pool.window, len(pool.layers), pool.bytes_per_token) for pool in result.pools] == [
        (128, 18, 36864),
        (131072, 18, 36864),
    ]
    assert [pool.primary_blocks for pool in result.pools] == [int(budget * 0.5 / 36864) // 32] * 2
    assert result.kv_cache_capacity() is None


def test_window_size_shares() -> None:
    """``TRTLLM_WINDOW_SIZE_SHARES=0.25,0.75``: 25% of the memory to the 128 window, 75% to the full one."""
    result = plan_trtllm(
        "gpt-oss-120b", Serving(), memory="40GiB", max_attention_window="128,131072", window_size_shares="0.25,0.75"
    )
    budget = int(40 * GiB * 0.9)
    assert [pool.primary_blocks for pool in result.pools] == [
        int(budget * 0.25 / 36864) // 32,
        int(budget * 0.75 / 36864) // 32,
    ]
    assert result.serve_command().startswith("TRTLLM_WINDOW_SIZE_SHARES=0.25,0.75 trtllm-serve openai/gpt-oss-120b")


@pytest.mark.parametrize(
    ("shares", "message"),
    [((0.5,), "must match number of window sizes"), ((0.3, 0.6), "must be 1.0")],
)
def test_window_shares_refused_as_trtllm_asserts(shares: tuple[float, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        window_shares([128, 131072], shares)


def test_without_max_attention_window_sliding_layers_are_full() -> None:
    """The V1 manager reads no model windows: gpt-oss without ``max_attention_window`` is one pool at max_seq_len
    (every layer full), and kvpools says so, suggesting the pattern."""
    result = plan_trtllm("gpt-oss-120b", Serving(), memory="40GiB")
    assert not result.is_vswa
    assert [(pool.window, len(pool.layers)) for pool in result.pools] == [(131072, 36)]
    assert result.ranks[0].cache_bytes_per_token == 2 * 36 * 8 * 64 * 2
    assert any("--max_attention_window 128,131072" in note for note in result.notes)


def test_window_vector_pattern_and_per_layer() -> None:
    """A list as long as the model is per layer (global index); any other is a pattern over a rank's local layers;
    each window clamped to max_seq_len."""
    assert window_vector(4, range(2, 4), 1000, [10, 20, 30, 4000]) == (30, 1000)
    assert window_vector(4, range(2, 4), 1000, [10, 4000]) == (10, 1000)
    assert window_vector(4, range(4), 1000, None) == (1000,) * 4


def test_adjust_window_sizes_for_vswa_shrinks_from_the_smallest() -> None:
    """Two layers of 100 B/token, windows 128 and 1024, a 50,000 B pool: one sequence needs 115,200 B. The 128
    window takes min(50000 // 200, 128) = 128 tokens for both layers (25,600 B); the 1024 window's one layer gets
    min(24400 // 100, 896) = 244 more: it runs with 372 tokens."""
    adjusted = adjust_window_sizes_for_vswa({128: [0], 1024: [1]}, {0: 100, 1: 100}, 50_000, None)
    assert adjusted == {128: 128, 1024: 372}
    assert adjust_window_sizes_for_vswa({128: [0], 1024: [1]}, {0: 100, 1: 100}, 200_000, None) == {
        128: 128,
        1024: 1024,
    }


def test_public_8802_window_reduced_to_blocks_upper_bound() -> None:
    """NVIDIA/TensorRT-LLM#8802 (https://github.com/NVIDIA/TensorRT-LLM/issues/8802), EXAONE-4.0-32B with
    ``max_attention_window: [4096,4096,4096,131072]``: the log reads "tokens per block=32, primary blocks=257" and
    then "[window size=8224]" -- ``get_max_atten_window_upper_bound``: 257 blocks x 32 tokens = 8224, so the
    131072 window is reduced to 8224 (``_validate_and_adjust_attention_windows``)."""
    assert window_upper_bound(257, 32) == 8224
    with pytest.raises(UnsupportedCombinationError, match="Impossible to fit in any sequence in kvCache"):
        window_upper_bound(0, 32)


def test_public_8802_plan_reduces_max_seq_len() -> None:
    """The same rule through a plan: a budget of 257 blocks per window pool lowers the full window and max_seq_len
    to 8224 and warns as TensorRT-LLM does.  (Outside the estimation dry run of #8802's log, one sequence not
    fitting the pool first makes ``adjust_window_sizes_for_vswa`` shrink 131072 to what the memory holds:
    (pool - 128 x 36 layers' bytes) // 18 layers' bytes + 128 = 16321; the upper bound then lowers it to 8224.)"""
    layers_per_window = 18  # gpt-oss: 36 layers, 128 / full alternating
    per_token = layers_per_window * 2 * 8 * 64 * 2
    memory = int((257 * 32 * per_token * 2 + per_token) / 0.9) + 1
    result = plan_trtllm("gpt-oss-120b", Serving(), memory=memory, max_attention_window="128,131072")
    assert [pool.primary_blocks for pool in result.pools] == [257, 257]
    assert [pool.window for pool in result.pools] == [128, 8224]
    assert result.max_seq_len == 8224
    assert any("shrinks them to [128, 16321]" in warning for warning in result.warnings)
    assert "Attention window size 16321 exceeds upper bound 8224 for available blocks. Reducing to 8224." in (
        result.warnings
    )


def test_public_dynamo_capacity_fields() -> None:
    """ai-dynamo/dynamo#12023 and NVIDIA/TensorRT-LLM#15385 read ``LLM.get_kv_cache_capacity()`` at start-up:
    ``PyExecutor.get_kv_cache_capacity`` returns ``maxNumBlocks`` (``blocks_in_primary_pool``), ``tokensPerBlock``
    and ``maxNumTokens = maxNumBlocks x tokensPerBlock``."""
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), memory="40GiB", tokens_per_block=64)
    capacity = result.kv_cache_capacity()
    assert capacity == {"maxNumBlocks": 471859 // 64, "tokensPerBlock": 64, "maxNumTokens": 471859 // 64 * 64}


def test_cache_bytes_and_estimate_helpers() -> None:
    layers = [TrtllmLayer(index=i, num_kv_heads=8, head_dim=128, kv_factor=2) for i in range(4)]
    assert cache_bytes_per_token(layers, "auto", 2, 3, False) == 2 * 4 * 3 * 128 * 2  # ceil(8/3) = 3 heads
    assert estimated_size_per_token(layers, 4, "auto", 2, 3, False) == 2 * 4 * (128 * 8 // 3) * 2  # 341 elements


@pytest.mark.parametrize(
    ("model", "serving", "match"),
    [
        # DeepseekV4CacheManager asserts tokens_per_block in [128, 256] (sparse/deepseek_v4/cache_manager.py@10ce7685).
        ("deepseek-v4-flash", Serving(), "TensorRT-LLM refuses --tokens_per_block 32"),
        ("falcon-h1-0.5b", Serving(), "kvpools does not model the falcon_h1 hybrid family"),
        ("llama-3.1-8b", Serving(kv_cache_dtype="fp8_e5m2"), "not a KV cache TensorRT-LLM"),
        ("llama-3.1-8b", Serving(platform="rocm"), "NVIDIA GPUs only"),
        ("llama-3.1-8b", Serving(mem_fraction_static=0.8), "--kv_cache_free_gpu_memory_fraction"),
    ],
)
def test_refused_with_reason(model: str, serving: Serving, match: str) -> None:
    with pytest.raises(KvpoolsError, match=match):
        plan_trtllm(model, serving, memory="40GiB")


def test_fraction_refused_outside_trtllm_range() -> None:
    with pytest.raises(ConfigError, match=r"smaller than 1\.0"):
        plan_trtllm("llama-3.1-8b", Serving(), memory="40GiB", kv_cache_free_gpu_memory_fraction=1.0)


def test_impossible_to_fit_refused() -> None:
    with pytest.raises(UnsupportedCombinationError, match="Impossible to fit"):
        plan_trtllm("llama-3.1-70b", Serving(tp_size=4), memory="1MiB")


def test_one_budget() -> None:
    with pytest.raises(ConfigError, match="needs one budget"):
        plan_trtllm("llama-3.1-8b", Serving())
    with pytest.raises(ConfigError, match="needs one budget"):
        plan_trtllm("llama-3.1-8b", Serving(), memory="10GiB", gpu="h100")


def test_host_cache_size_is_the_secondary_pool() -> None:
    """``calculate_max_num_blocks``: ``host_cache_size // bytes_per_token // tokens_per_block`` host blocks:
    10 GiB // 81,920 B = 131,072 tokens // 32 = 4,096."""
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), memory="40GiB", host_cache_size="10GiB")
    assert result.pools[0].secondary_blocks == 4096
    assert "host_cache_size: 10737418240" in result.extra_options_yaml()


@settings(max_examples=40, deadline=None)
@given(
    free=st.integers(min_value=2 * GiB, max_value=200 * GiB),
    fraction=st.floats(min_value=0.05, max_value=0.95),
    tokens_per_block=st.sampled_from([16, 32, 64, 128]),
    vswa=st.booleans(),
)
def test_pools_never_exceed_the_budget(free: int, fraction: float, tokens_per_block: int, vswa: bool) -> None:
    """Whatever the memory, fraction and block size, the pools' bytes stay within ``int(free x fraction)`` and more
    memory never gives fewer blocks."""
    windows = "128,131072" if vswa else None
    kwargs: dict[str, Any] = {"kv_cache_free_gpu_memory_fraction": fraction, "tokens_per_block": tokens_per_block}
    result = plan_trtllm("gpt-oss-20b", Serving(), memory=free, max_attention_window=windows, **kwargs)
    used = sum(pool.primary_blocks * tokens_per_block * pool.bytes_per_token for pool in result.pools)
    assert used <= int(free * fraction)
    more = plan_trtllm("gpt-oss-20b", Serving(), memory=free + GiB, max_attention_window=windows, **kwargs)
    assert all(a.primary_blocks <= b.primary_blocks for a, b in zip(result.pools, more.pools, strict=True))
