"""``--accounting trtllm`` for Mamba / linear-attention hybrids (issue 35): ``CppMambaHybridCacheManager``'s unified
pool, hand-computed from TensorRT-LLM's sources read through the code index (the tensorrt-llm wheel on the package
index is a stub; no 1.2.1 release commit could be listed, so each fact names the commit or stored copy read):

- ``tensorrt_llm/_torch/pyexecutor/config_utils.py`` @ 00679c66c3e38f6d2651ad0a5bef0f94d862e36c:
  ``is_nemotron_hybrid`` (``hybrid_override_pattern``), ``is_qwen3_next`` / ``is_qwen3_5`` (architectures),
  ``extract_mamba_kv_cache_params`` (Nemotron-H: ``ssm_state_size, conv_kernel, mamba_num_heads, n_groups,
  mamba_head_dim``; Qwen3 hybrids: ``linear_key_head_dim, linear_conv_kernel_dim, linear_num_value_heads,
  linear_num_key_heads, linear_value_head_dim``; any other config raises "is not a supported hybrid Mamba config"),
  ``resolve_ssm_cache_dtype`` (only ``mamba_ssm_cache_dtype``; ``mamba_ssm_dtype`` is ignored) and
  ``MambaKVCacheParams.get_states_bytes_per_layer``: ``conv_dim = (head_dim x num_heads + 2 x n_groups x
  state_size) // tp``, ``conv = conv_dim x (conv_kernel - 1) x dtype``, ``ssm = num_heads // tp x head_dim x
  state_size x ssm_dtype``;
- ``tensorrt_llm/_torch/pyexecutor/kv_cache/mamba_cache_manager.py`` (stored copies, code-index ids 56688095080 and
  68572734154; the file @ 151c21c6a0034712a71fb0352cf7c75ea07b7b5b has the same V2 counterpart):
  ``_estimate_mamba_hybrid_cache_cost`` (``slope = KVCacheManager.get_cache_size_per_token(num_layers=<local
  attention layers>)``, ``intercept = (max_batch_size x pp_size + num_reserved_dummy_slots) x local_mamba_layers x
  state bytes`` without snapshots) and ``CppMambaHybridCacheManager.get_cache_size_per_token``
  (``num_reserved_dummy_slots=1``); ``CppMambaHybridCacheManager.__init__`` (conv and SSM shapes, "mamba_num_heads
  must be divisible by tp_size");
- ``tensorrt_llm/_torch/pyexecutor/resource_manager.py`` (stored copies, ids 56108752801 and 54765218664):
  ``KVCacheManager._calculate_max_num_blocks_for_linear_attention`` (``primary = max_gpu_total_bytes``, ``slope =
  get_cache_bytes_per_token()``, ``intercept = max_batch_size x pp_size x state bytes``, ``max_tokens = min(config
  max_tokens, (primary - intercept) // slope)``, ``max_snapshots = max_batch_size x pp_size + 1``, host blocks in
  the same proportion) -- pinned by TensorRT-LLM's own test ``test_cpp_mamba_estimator_handles_disabled_snapshots_
  without_attention`` (stored copy id 56672441098: ``max_batch_size=4`` -> ``RECURRENT_STATES: (5, 0)``);
- ``tensorrt_llm/_torch/pyexecutor/_util.py`` @ 0004396720054fd8e205cbf616f21f0b57c6b412: ``get_kv_cache_manager_cls``
  (``use_kv_cache_manager_v2`` false -> ``CppMambaHybridCacheManager``), ``KvCacheCreator._get_kv_size_per_token``
  (the manager's ``CacheCost``), ``_cal_max_memory``.
"""

from __future__ import annotations

import pytest

from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.engines.trtllm.hybrid import HybridCost
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parts.trtllm import TrtllmMambaState
from kvpools_core.planning.capacity_record import trtllm_capacity_document
from kvpools_core.values import Serving

BUDGET_40 = 38_654_705_664  # int(40 GiB x 0.9)

# Qwen3-Next-80B-A3B: 48 layers, every 4th full attention (12), 36 Gated DeltaNet layers; 2 KV heads of 256;
# linear_num_key_heads 16, linear_num_value_heads 32, key/value head dim 128, conv kernel 4; bf16, no
# mamba_ssm_cache_dtype.  Per layer, TP 1: conv_dim = 128 x 32 + 2 x 16 x 128 = 8,192 -> conv 8,192 x 3 x 2 =
# 49,152 B; SSM 32 x 128 x 128 x 2 = 1,048,576 B; 1,097,728 B; x 36 layers = 39,518,208 B per request.
QWEN3_NEXT_STATE = 1_097_728
QWEN3_NEXT_REQUEST = 36 * QWEN3_NEXT_STATE


def test_state_bytes_per_layer() -> None:
    """``get_states_bytes_per_layer`` for Qwen3-Next at TP 1 and 2, and with an fp32 SSM cache."""
    state = TrtllmMambaState(
        state_size=128, conv_kernel=4, num_heads=32, n_groups=16, head_dim=128, conv_dtype_bytes=2, ssm_dtype_bytes=2
    )
    assert state.bytes_per_rank(1) == QWEN3_NEXT_STATE
    assert state.bytes_per_rank(2) == 4_096 * 3 * 2 + 16 * 128 * 128 * 2  # 24,576 + 524,288
    fp32 = TrtllmMambaState(
        state_size=128, conv_kernel=4, num_heads=32, n_groups=16, head_dim=128, conv_dtype_bytes=2, ssm_dtype_bytes=4
    )
    assert fp32.bytes_per_rank(1) == 49_152 + 2_097_152
    with pytest.raises(UnsupportedCombinationError, match="mamba_num_heads must be divisible by tp_size"):
        state.bytes_per_rank(3)


def test_affine_cost() -> None:
    """``CacheCost.tokens_for_budget`` / ``bytes_for_tokens``."""
    cost = HybridCost(slope=100, intercept=1_000)
    assert cost.tokens_for_budget(10_999) == 99
    assert cost.tokens_for_budget(999) == 0
    assert cost.bytes_for_tokens(99) == 10_900


def test_qwen3_next_unified_pool() -> None:
    """Qwen3-Next, --memory 40GiB, max_batch_size 64, TP 1.

    Estimate: slope = 2 x 12 x (256 x 2) x 2 = 24,576 B/token; intercept = (64 + 1) x 39,518,208 = 2,568,683,520;
    max_tokens = (38,654,705,664 - 2,568,683,520) // 24,576 = 1,468,344.  Manager: intercept 64 x 39,518,208 =
    2,529,165,312 -> 1,469,952 tokens, min 1,468,344 -> 45,885 blocks of 32; recurrent pool 64 + 1 = 65 blocks.
    """
    result = plan_trtllm("qwen3-next-80b-a3b-thinking", memory="40GiB", max_batch_size=64)
    stage = result.hybrid_stages[0]
    assert result.hybrid_manager == "CppMambaHybridCacheManager"
    assert stage.state_bytes == QWEN3_NEXT_REQUEST == 39_518_208
    assert (stage.estimate.slope, stage.estimate.intercept) == (24_576, 2_568_683_520)
    assert (stage.manager.slope, stage.manager.intercept) == (24_576, 2_529_165_312)
    assert stage.budget == BUDGET_40
    assert stage.config_tokens == 1_468_344 and stage.max_tokens == 1_468_344
    attention, recurrent = result.pools
    assert attention.primary_blocks == 45_885 and attention.window == 262_144 and len(attention.layers) == 12
    assert recurrent.recurrent and recurrent.primary_blocks == 65 and len(recurrent.layers) == 36
    assert recurrent.recurrent_state_bytes == 39_518_208
    assert result.max_kv_tokens == 45_885 * 32
    # 32,768 tokens: 1,024 blocks per request -> 45,885 // 1,024 = 44 requests; 8,192 tokens: capped at 64
    assert result.concurrency_at(32_768) == 44 and result.concurrency_at(8_192) == 64
    assert result.kv_cache_capacity() is None
    # the unified pool never exceeds the budget: 45,885 x 32 x 24,576 + 65 x 39,518,208 = 38,654,115,840
    assert sum(pool.primary_bytes(32) for pool in result.pools) == 38_654_115_840 <= BUDGET_40
    assert result.extra_llm_api_options()["kv_cache_config"]["use_kv_cache_manager_v2"] is False


def test_smaller_batch_leaves_more_tokens() -> None:
    """The intercept scales with max_batch_size: 16 requests -> (38,654,705,664 - 17 x 39,518,208) // 24,576."""
    result = plan_trtllm("qwen3-next-80b-a3b-thinking", memory="40GiB", max_batch_size=16)
    assert result.hybrid_stages[0].config_tokens == (BUDGET_40 - 17 * QWEN3_NEXT_REQUEST) // 24_576 == 1_545_528
    assert result.pools[1].primary_blocks == 17


def test_pipeline_stages() -> None:
    """PP 2: each stage 24 layers (6 attention, 18 recurrent); resident = 64 x 2 = 128.
    Estimate slope 2 x 6 x 512 x 2 = 12,288, intercept 129 x 18 x 1,097,728 = 2,548,924,416 -> 2,938,296 tokens;
    manager intercept 128 x 18 x 1,097,728 -> 2,939,904; min -> 91,821 blocks; recurrent 129 blocks."""
    result = plan_trtllm("qwen3-next-80b-a3b-thinking", Serving(pp_size=2), memory="40GiB", max_batch_size=64)
    for stage in result.hybrid_stages:
        assert stage.estimate.intercept == 129 * 18 * QWEN3_NEXT_STATE == 2_548_924_416
        assert stage.config_tokens == 2_938_296
    assert result.pools[0].primary_blocks == 2_938_296 // 32 == 91_821
    assert result.pools[1].primary_blocks == 129


def test_tensor_parallel_and_attention_dp() -> None:
    """TP 4 shards the state (heads 8, conv_dim 2,048: 2,048 x 3 x 2 + 8 x 128 x 128 x 2 = 274,432 B per layer) and
    the KV heads (ceil(2/4) = 1); attention DP keeps the whole state per rank (tp 1)."""
    tp = plan_trtllm("qwen3-next-80b-a3b-thinking", Serving(tp_size=4), memory="40GiB", max_batch_size=64)
    assert tp.hybrid_stages[0].state_bytes == 36 * 274_432
    assert tp.hybrid_stages[0].manager.slope == 2 * 12 * 1 * 256 * 2
    dp = plan_trtllm(
        "qwen3-next-80b-a3b-thinking", Serving(tp_size=4), memory="40GiB", max_batch_size=64, enable_attention_dp=True
    )
    assert dp.hybrid_stages[0].state_bytes == QWEN3_NEXT_REQUEST


def test_ssm_cache_dtype_comes_from_mamba_ssm_cache_dtype_only() -> None:
    """Nemotron-3-Nano's config says mamba_ssm_cache_dtype float32: conv_dim 64 x 64 + 2 x 8 x 128 = 6,144 ->
    36,864 B + SSM 64 x 64 x 128 x 4 = 2,097,152 B, x 23 Mamba layers = 49,082,368 B.  Qwen3.5's mamba_ssm_dtype
    float32 is not read (resolve_ssm_cache_dtype): bf16, 1,097,728 B x 30 layers."""
    nano = plan_trtllm("nemotron-3-nano-30b-a3b", memory="40GiB", max_batch_size=64)
    assert nano.hybrid_stages[0].state_bytes == 23 * (36_864 + 2_097_152) == 49_082_368
    assert len(nano.pools[0].layers) == 6  # the pattern's '*' layers; '-' / 'E' blocks cache nothing
    qwen35 = plan_trtllm("qwen3.5-35b-a3b", memory="40GiB", max_batch_size=64)
    assert qwen35.hybrid_stages[0].state_bytes == 30 * QWEN3_NEXT_STATE


def test_host_cache_split_like_the_primary_pool() -> None:
    """``kv_blocks_in_secondary_pool = int(primary x host / primary_bytes)``, the recurrent pool likewise."""
    result = plan_trtllm("qwen3-next-80b-a3b-thinking", memory="40GiB", max_batch_size=64, host_cache_size="8GiB")
    ratio = (8 << 30) / BUDGET_40
    assert result.pools[0].secondary_blocks == int(45_885 * ratio) == 10_196
    assert result.pools[1].secondary_blocks == int(65 * ratio) == 14


def test_state_of_every_request_must_fit() -> None:
    """Nemotron-H-56B keeps 54 x 8,511,488 B of state per request (bf16): (2,048 + 1) requests' worth is far past a
    40 GiB budget, so no attention block is left -- TensorRT-LLM asserts 'Impossible to fit in any sequence'."""
    with pytest.raises(UnsupportedCombinationError, match="Lower --max_batch_size"):
        plan_trtllm("nemotron-h-56b-base-8k", memory="40GiB")


@pytest.mark.parametrize(
    ("model", "kwargs", "match"),
    [
        ("falcon-h1-0.5b", {}, "falcon_h1 hybrid family"),
        ("jamba-1.5-mini", {}, "jamba hybrid family"),
        ("qwen3-next-80b-a3b-thinking", {"max_attention_window": "4096"}, "attention windows beside"),
        ("qwen3.5-35b-a3b", {"num_nextn_predict_layers": 1}, "MTP draft KV cache of a Mamba"),
        ("qwen3-next-80b-a3b-thinking", {"tokens_per_block": 32, "max_batch_size": 64}, None),
    ],
)
def test_refusals(model: str, kwargs: dict[str, object], match: str | None) -> None:
    if match is None:
        assert plan_trtllm(model, memory="40GiB", **kwargs).hybrid_manager  # type: ignore[arg-type]
        return
    with pytest.raises(UnsupportedCombinationError, match=match):
        plan_trtllm(model, memory="40GiB", max_batch_size=64, **kwargs)  # type: ignore[arg-type]


def test_capacity_record_carries_the_state_group() -> None:
    """The capacity record: the attention group and a ``state`` group of 65 blocks (64 requests + the dummy);
    ``gpu_kv_bytes`` counts both pools."""
    result = plan_trtllm("qwen3-next-80b-a3b-thinking", memory="40GiB", max_batch_size=64)
    record = trtllm_capacity_document(result, context_len=32_768)["records"][0]
    groups = {group["name"]: group for group in record["groups"]}
    assert groups["full"]["total_blocks"] == 45_885 and groups["full"]["max_requests"] == 44
    assert groups["state"]["total_blocks"] == 65 and groups["state"]["max_requests"] == 64
    assert record["max_concurrency"] == 44 and record["binding_group"] == "full"
    assert record["gpu_kv_bytes"] == 38_654_115_840
    assert record["total_kv_blocks"] == 45_885


def test_sweep_takes_mtp_and_max_batch_size() -> None:
    """``kvpools sweep --accounting trtllm`` plans every point with ``--num_nextn_predict_layers`` and
    ``--max_batch_size``: DeepSeek-V3 on 60 GiB free keeps 25,368 blocks with one MTP layer (docs/trtllm.md),
    25,784 without; at 8k a drafting request holds ceil((8,192 + 1) / 32) = 257 blocks: 98 requests.  Qwen3-Next
    with max_batch_size 64 keeps 45,885 blocks (above)."""
    from kvpools_core.planning.trtllm_sweep import sweep_trtllm

    mtp = sweep_trtllm(["deepseek-v3"], budgets=[{"memory": "60GiB"}], contexts=["8k"], num_nextn_predict_layers=1)
    plain = sweep_trtllm(["deepseek-v3"], budgets=[{"memory": "60GiB"}], contexts=["8k"])
    assert (mtp[0]["max_num_blocks"], mtp[0]["requests@8192"]) == (25_368, 98)
    assert plain[0]["max_num_blocks"] == 25_784
    hybrid = sweep_trtllm(
        ["qwen3-next-80b-a3b-thinking"], budgets=[{"memory": "40GiB"}], contexts=["32k"], max_batch_size=64
    )
    assert (hybrid[0]["max_kv_tokens"], hybrid[0]["requests@32768"]) == (45_885 * 32, 44)


def test_fit_takes_max_batch_size() -> None:
    """``kvpools fit --accounting trtllm --max_batch_size 64``: every configuration is launched with it (a hybrid's
    state is paid for each request it allows)."""
    from kvpools_core.planning.trtllm_fit import fit_trtllm

    result = fit_trtllm("qwen3-next-80b-a3b-thinking", 64, 32_768, gpu="h100", max_gpus=4, max_batch_size=64)
    assert result.fits and all(fit.result.max_batch_size == 64 for fit in result.fits)
    assert all("--max_batch_size 64" in fit.result.serve_command() for fit in result.fits)


@pytest.mark.parametrize("command", ["fit", "sweep"])
def test_trtllm_flags_refused_without_trtllm(command: str) -> None:
    from click.testing import CliRunner

    from kvpools_core.cli import main

    args = {
        "fit": ["fit", "llama-3.1-8b", "--requests", "4", "--context", "8k", "--gpu", "h100"],
        "sweep": ["sweep", "--model", "llama-3.1-8b", "--memory", "20GiB"],
    }[command]
    for flag in ("--max_batch_size", "--num_nextn_predict_layers"):
        result = CliRunner().invoke(main, [*args, flag, "1"])
        assert result.exit_code != 0 and "only with --accounting trtllm" in result.output + (result.stderr or "")
        assert "Traceback" not in result.output


def test_linear_attention_blocks_reproduce_tensorrt_llms_own_test() -> None:
    """TensorRT-LLM's ``test_cpp_mamba_estimator_handles_disabled_snapshots_without_attention`` (stored copy, id
    56672441098): primary 4,096 B, no host, one recurrent layer of 64 B, no attention (``get_cache_bytes_per_token``
    0), ``max_batch_size`` 4, ``pp_size`` 1, ``tokens_per_block`` 32, ``max_tokens`` 512 -> ``blocks[128] == (16,
    0)`` and ``blocks[RECURRENT_STATES] == (5, 0)``."""
    from kvpools_core.engines.trtllm.hybrid import linear_attention_blocks

    blocks = linear_attention_blocks(
        primary_bytes=4_096,
        secondary_bytes=0,
        attention_bytes_per_token=0,
        state_bytes=64,
        max_batch_size=4,
        pp_size=1,
        tokens_per_block=32,
        max_tokens=512,
    )
    assert (blocks.kv_blocks, blocks.kv_secondary_blocks) == (16, 0)
    assert (blocks.state_blocks, blocks.state_secondary_blocks) == (5, 0)
    # with an attention slope the budget binds: (4,096 - 4 x 64) // 10 = 384 tokens < 512 -> 12 blocks
    bound = linear_attention_blocks(
        primary_bytes=4_096,
        secondary_bytes=2_048,
        attention_bytes_per_token=10,
        state_bytes=64,
        max_batch_size=4,
        pp_size=1,
        tokens_per_block=32,
        max_tokens=512,
    )
    assert (bound.max_tokens, bound.kv_blocks, bound.kv_secondary_blocks, bound.state_secondary_blocks) == (
        384,
        12,
        6,
        2,
    )


def test_cpp_cost_reproduces_tensorrt_llms_own_test() -> None:
    """TensorRT-LLM's ``test_hybrid_mtp_layout_honors_explicit_base_partition`` (stored copy, id 56672441098):
    ``CppMambaHybridCacheManager.get_cache_size_per_token`` with ``max_batch_size=1`` over 2 pipeline stages, one
    local recurrent layer and ``rank + 1`` local attention layers of 64 B per token is ``(64 x (rank + 1), 2400)``
    on both stages: 2,400 = ``(1 x 2 + 1)`` slots x the layer's state, 800 B (the test's synthetic config is not in
    the stored copy; its V2 counterpart, ``(64, 6496)`` = 2,400 + one 4,096 B attention page, agrees)."""
    from kvpools_core.engines.trtllm.hybrid import cpp_hybrid_cache_cost

    for rank in range(2):
        cost = cpp_hybrid_cache_cost(
            attention_bytes_per_token=64 * (rank + 1), state_bytes=800, max_batch_size=1, pp_size=2
        )
        assert (cost.slope, cost.intercept) == (64 * (rank + 1), 2_400)


def test_compare_puts_the_recurrent_pool_in_the_state_row() -> None:
    """``kvpools compare qwen3-next-80b-a3b-thinking --gpu h100 --tp-size 4``: TensorRT-LLM's attention pool sits in
    the full row at 2 x 12 x ceil(2/4) x 256 x 2 = 12,288 B per token, its recurrent-state pool in the mamba-state
    row: 2,048 x 1 + 1 = 2,049 blocks of 36 x 274,432 = 9,879,552 B (TP 4).  Here the manager's own budget binds
    (the static estimate floors 256 x 2 / 4 = 128 elements per layer, half the manager's ceil(2/4) x 256, so
    KvCacheCreator's max_tokens is twice what fits), and the manager's intercept counts 2,048 states while it
    allocates 2,049 blocks: the pools overshoot max_gpu_total_bytes by less than one state block, as
    _calculate_max_num_blocks_for_linear_attention does."""
    from kvpools_core.planning.compare import compare_engines

    comparison = compare_engines("qwen3-next-80b-a3b-thinking", Serving(tp_size=4), gpu="h100")
    full = next(row for row in comparison.groups if row.trtllm_windows)
    state = next(row for row in comparison.groups if row.trtllm_blocks and not row.trtllm_windows)
    assert full.trtllm_bytes_per_token == 12_288 and full.trtllm_layers == 12
    assert state.trtllm_blocks == (2_049,) and state.trtllm_layers == 36
    assert any("recurrent-state pool of CppMambaHybridCacheManager" in line for line in state.why)
    result = comparison.trtllm
    assert result is not None and result.pools[1].recurrent_state_bytes == 9_879_552
    stage = result.hybrid_stages[0]
    assert stage.estimate.slope == 2 * 12 * (256 * 2 // 4) * 2 == 6_144 and stage.manager.slope == 12_288
    assert stage.config_tokens > stage.max_tokens == (stage.pool_bytes - 2_048 * 9_879_552) // 12_288
    used = full.trtllm_blocks[0] * 32 * 12_288 + 2_049 * 9_879_552
    assert 0 < used - stage.pool_bytes < 9_879_552


def test_cli_plan_shows_both_pools_and_the_manager_switch() -> None:
    from click.testing import CliRunner

    from kvpools_core.cli import main

    args = ["plan", "qwen3-next-80b-a3b-thinking", "--memory", "40GiB", "--accounting", "trtllm"]
    shown = CliRunner().invoke(main, [*args, "--max_batch_size", "64"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "recurrent state" in shown.stdout and "39,518,208 B/block" in shown.stdout
    assert "use_kv_cache_manager_v2: false" in shown.stdout and "--max_batch_size 64" in shown.stdout
    refused = CliRunner().invoke(main, args)  # the default 2,048 requests' state does not fit 36 GiB
    assert refused.exit_code == 1 and "Lower --max_batch_size" in refused.stderr
    assert "Traceback" not in refused.output
