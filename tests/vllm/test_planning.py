"""kvpools' model of vLLM 0.33's KV-cache planning, checked by hand (no vLLM needed).

Each expected number is worked out in the comment beside it from the vLLM formula the docstrings of
``kvpools_core/vllm`` cite; ``test_differential.py`` checks the same functions against vLLM's own code.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from kvpools_core.engines.vllm import (
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    VllmLimits,
    VllmMemoryError,
    align_hybrid_block_size,
    available_kv_cache_memory,
    get_kv_cache_groups,
    mamba_cache_mode_of,
    plan_kv_cache,
    pp_layer_ranges,
    unify_kv_cache_spec_page_size,
)
from kvpools_core.errors import ConfigError, InvalidValueError, UnsupportedCombinationError

GiB = 1 << 30
MiB = 1 << 20


def full(block_size: int = 16, heads: int = 8, head: int = 128, dtype_bytes: int = 2) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=heads, head_size=head, head_size_v=head, dtype_bytes=dtype_bytes
    )


def sliding(window: int, block_size: int = 16, heads: int = 8, head: int = 128) -> SlidingWindowSpec:
    return SlidingWindowSpec(
        block_size=block_size,
        num_kv_heads=heads,
        head_size=head,
        head_size_v=head,
        dtype_bytes=2,
        sliding_window=window,
    )


def test_dense_model_blocks_concurrency_and_logged_tokens() -> None:
    # page = 16 tokens x 8 heads x (128 + 128) x 2 B = 65536; a block spans 32 layers: 2 MiB; 10 GiB -> 5120 blocks
    specs = {f"layers.{i}": full() for i in range(32)}
    plan = plan_kv_cache([specs], [10 * GiB], VllmLimits(max_model_len=8192))
    assert len(plan.groups) == 1 and plan.page_sizes == (65536,)
    assert plan.bytes_per_block == (2 * MiB,)
    assert plan.num_gpu_blocks == 5120
    assert plan.blocks_per_request == 512  # 8192 / 16
    assert plan.max_concurrency == 10.0
    assert plan.kv_cache_size_tokens == 81920
    assert plan.kv_cache_tensor_bytes == (10 * GiB,)
    assert plan.log_line == "GPU KV cache size: 81,920 tokens, Maximum concurrency for 8,192 tokens per request: 10.00x"


def test_sliding_hybrid_groups_share_one_pool() -> None:
    # 36 layers alternating window-128 / full, 8 heads x 64, bf16: page 16 x 8 x 128 x 2 = 32768 for both kinds.
    # 18 + 18 layers: group size 18 -> one sliding and one full group; a block spans 18 layers: 589824 B.
    specs = {f"layers.{i}": sliding(128, head=64) if i % 2 == 0 else full(head=64) for i in range(36)}
    limits = VllmLimits(max_model_len=131072, max_num_batched_tokens=2048)
    # sliding: cdiv(min(128 - 1 + 2048, L), 16) + 1 = 136 + 1 = 137 blocks; full: 131072 / 16 = 8192
    blocks = 137 + 8192
    plan = plan_kv_cache([specs], [(2 * blocks + 1) * 589824], limits)  # + the null block
    assert [len(g.layer_names) for g in plan.groups] == [18, 18]
    assert plan.bytes_per_block == (589824,)
    assert plan.blocks_per_request == blocks
    assert plan.num_gpu_blocks == 2 * blocks + 1
    assert plan.max_concurrency == (2 * blocks + 1) / blocks
    assert plan.kv_cache_size_tokens == int((2 * blocks + 1) / blocks * 131072)


def test_uneven_layer_counts_are_split_into_equal_groups() -> None:
    # 10 full + 20 sliding: group size 10 -> (full x10), (sliding 0,2,4..), (sliding 1,3,5..): vLLM's layers[i::n]
    specs = {f"f{i}": full() for i in range(10)} | {f"s{i}": sliding(512) for i in range(20)}
    groups = get_kv_cache_groups(specs)
    assert [g.layer_names for g in groups] == [
        tuple(f"f{i}" for i in range(10)),
        tuple(f"s{i}" for i in range(0, 20, 2)),
        tuple(f"s{i}" for i in range(1, 20, 2)),
    ]


def test_page_sizes_unified_by_block_size_and_by_padding() -> None:
    # full page 65536; a 4-head sliding page 32768 divides it: block size 16 -> 32
    grown = unify_kv_cache_spec_page_size({"f": full(), "s": sliding(128, heads=4)})
    assert grown["s"].block_size == 32 and grown["s"].page_size_bytes == 65536
    # a 3-head sliding page (49152) does not divide 65536: padded, block size kept
    padded = unify_kv_cache_spec_page_size({"f": full(), "s": sliding(128, heads=3)})
    assert padded["s"].block_size == 16 and padded["s"].page_size_bytes == 65536
    # a Mamba state is padded to the attention page whatever its size
    mamba = MambaSpec(block_size=16, shapes=[(3, 4096), (32, 64, 16)], dtype_bytes=[2, 4])
    assert mamba.page_size_bytes == 3 * 4096 * 2 + 32 * 64 * 16 * 4  # 155648
    unified = unify_kv_cache_spec_page_size({"f": full(block_size=64), "m": mamba})  # attention page 262144
    assert unified["m"].page_size_bytes == 262144


def test_mla_page_that_cannot_be_unified_is_refused() -> None:
    # MLA page 576 x 2 B x 16 = 18432 does not divide the larger Mamba page (155648 = 8.44 x 18432); MLA cannot pad
    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype_bytes=2)
    mamba = MambaSpec(block_size=16, shapes=[(3, 4096), (32, 64, 16)], dtype_bytes=[2, 4])
    with pytest.raises(UnsupportedCombinationError, match="Padding is only supported for non-MLA attention layers"):
        get_kv_cache_groups({"a": mla, "m": mamba})


def test_fp8_ds_mla_row_and_dsa_indexer_pages() -> None:
    # FlashMLA-sparse stores 656 B per token (deepseek_v2 / flashmla_sparse.py); the indexer 128 + 4 B
    mla = MLAAttentionSpec(
        block_size=64,
        num_kv_heads=1,
        head_size=576,
        dtype_bytes=1,
        state_content_bytes=656,
        cache_dtype_str="fp8_ds_mla",
    )
    indexer = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=132, dtype_bytes=1, cache_role="indexer")
    assert (mla.page_size_bytes, indexer.page_size_bytes) == (64 * 656, 64 * 132)
    # both full-attention typed with one block size: one uniform-type group, page = their sum per layer pair
    groups = get_kv_cache_groups({"l0.attn": mla, "l0.indexer": indexer, "l1.attn": mla, "l1.indexer": indexer})
    assert len(groups) == 1 and groups[0].kv_cache_spec.page_size_bytes == 2 * 64 * (656 + 132)


def test_memory_check_text_and_estimate() -> None:
    # 2 layers, page 65536, block 128 KiB: 262144 tokens need 16384 blocks = 2 GiB; the 1 GiB left after the null
    # block holds 8192 blocks = 131072 tokens
    specs = {"a": full(), "b": full()}
    with pytest.raises(VllmMemoryError) as error:
        plan_kv_cache([specs], [GiB + 2 * 65536], VllmLimits(max_model_len=262144))
    assert str(error.value) == (
        "To serve at least one request with the model's max seq len (262144), (2.0 GiB KV cache is needed, which "
        "is larger than the available KV cache memory (1.0 GiB). Based on the available memory, the estimated "
        "maximum model length is 131072. Try increasing `gpu_memory_utilization` (which also controls CPU memory "
        "on the CPU backend) or decreasing `max_model_len` when initializing the engine. See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )
    with pytest.raises(VllmMemoryError, match=r"^No available memory for the cache blocks"):
        plan_kv_cache([specs], [2 * 65536], VllmLimits(max_model_len=16))


def test_auto_fit_and_override_and_null_block() -> None:
    specs = {"a": full(), "b": full()}
    auto = plan_kv_cache([specs], [GiB + 2 * 65536], VllmLimits(max_model_len=262144), auto_fit_max_model_len=True)
    assert auto.max_model_len == 131072 and auto.num_gpu_blocks == 8193  # the null block is one of them
    override = plan_kv_cache([specs], [GiB], VllmLimits(max_model_len=16), num_gpu_blocks_override=100)
    assert override.num_gpu_blocks == 100 and override.kv_cache_tensor_bytes == (100 * 2 * 65536,)
    with pytest.raises(VllmMemoryError, match=r"^Cannot auto-fit max_model_len"):
        plan_kv_cache([specs], [2 * 65536 + 1], VllmLimits(max_model_len=64), auto_fit_max_model_len=True)


def test_pipeline_stages_plan_with_the_smallest_stage() -> None:
    # get_pp_indices: 10 layers over 4 stages -> 2, 3, 3, 2 (remainder to the ranks before the last)
    assert [len(r) for r in pp_layer_ranges(10, 4)] == [2, 3, 3, 2]
    stages = [{f"l{i}": full() for i in r} for r in pp_layer_ranges(10, 4)]
    plan = plan_kv_cache(stages, [GiB] * 4, VllmLimits(max_model_len=1024))
    # the 3-layer stages' blocks are 196608 B: 1 GiB // 196608 = 5461 blocks for every stage
    assert plan.bytes_per_block == (131072, 196608, 196608, 131072)
    assert plan.num_gpu_blocks == GiB // 196608


def test_bad_values_name_the_field() -> None:
    with pytest.raises(ConfigError, match="--max-model-len"):
        VllmLimits(max_model_len=0)
    with pytest.raises(ConfigError, match="--mamba-cache-mode"):
        VllmLimits(max_model_len=16, mamba_cache_mode="sometimes")
    with pytest.raises(InvalidValueError, match="block_size"):
        full(block_size=0)
    with pytest.raises(ConfigError, match="--num-gpu-blocks-override"):
        plan_kv_cache([{"a": full()}], [GiB], VllmLimits(max_model_len=16), num_gpu_blocks_override=0)


def test_mamba_cache_mode_comes_from_the_specs_and_checkpoints_keep_groups_apart() -> None:
    def state(**fields: Any) -> MambaSpec:
        return MambaSpec(block_size=64, shapes=[(3, 256), (8, 64, 64)], dtype_bytes=[2, 2], **fields)

    aligned = state(mamba_cache_mode="align")
    assert mamba_cache_mode_of([{"a": full()}]) == "none"
    assert mamba_cache_mode_of([{"a": full(), "m": aligned}, {"n": aligned}]) == "align"
    with pytest.raises(ConfigError, match="different mamba_cache_mode values"):
        mamba_cache_mode_of([{"m": aligned, "n": state()}])
    with pytest.raises(InvalidValueError, match="mamba_type"):
        state(mamba_type="kda")
    # a checkpoint block costs one more page per request in align mode: 2 + 1 pages of 3 x 256 x 2 + 8 x 64 x 64 x 2
    page = 3 * 256 * 2 + 8 * 64 * 64 * 2
    checkpoint = state(mamba_cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=64)
    assert checkpoint.max_memory_usage_bytes(VllmLimits(max_model_len=16, mamba_cache_mode="align")) == 3 * page
    # specs differing only in their checkpoint alignment are not one uniform-type group (vLLM's is_uniform_with_...)
    other = state(mamba_cache_mode="align", num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=128)
    groups = get_kv_cache_groups({"a": checkpoint, "b": other})
    assert [group.layer_names for group in groups] == [("a",), ("b",)]


def test_mamba_hybrid_block_size_is_raised_to_hold_a_state() -> None:
    # Nemotron-Nano-9B-v2 at TP 1 (vllm#24280 reports its 672-token attention blocks): Mamba2 conv state
    # (3, 128 x 80 + 2 x 8 x 128) and SSM state (128, 80, 128), both bf16: 73728 + 2621440 = 2695168 B; attention
    # 8 KV heads x (128 + 128) x 2 B = 4096 B per token; FlashAttention's smallest kernel block 16:
    # 16 x cdiv(2695168, 16 x 4096) = 16 x 42 = 672 tokens, and the Mamba page padded to 672 x 4096 = 2752512 B.
    mamba = MambaSpec(block_size=16, shapes=[(3, 12288), (128, 80, 128)], dtype_bytes=[2, 2])
    assert mamba.page_size_bytes == 2695168
    block_size, padded = align_hybrid_block_size(
        block_size=16, attn_page_size_1_token=4096, mamba_page_size=mamba.page_size_bytes, kernel_block_size=16
    )
    assert (block_size, padded) == (672, 2752512)
    # MLA hybrids align to 128 tokens: 128 x cdiv(2695168, 128 x 1152) = 128 x 19 = 2432
    assert align_hybrid_block_size(
        block_size=16, attn_page_size_1_token=1152, mamba_page_size=2695168, kernel_block_size=16, use_mla=True
    ) == (2432, 2432 * 1152)
    # a configured block already large enough is kept; an attention-free state (page 0) changes nothing
    assert align_hybrid_block_size(
        block_size=1024, attn_page_size_1_token=4096, mamba_page_size=2695168, kernel_block_size=16
    ) == (1024, 1024 * 4096)
    assert align_hybrid_block_size(
        block_size=16, attn_page_size_1_token=4096, mamba_page_size=0, kernel_block_size=16
    ) == (16, None)
    # planned with the aligned sizes, attention and Mamba pages are equal: one page size, no unification
    attention = full(block_size=672)
    state = MambaSpec(block_size=672, shapes=mamba.shapes, dtype_bytes=mamba.dtype_bytes, page_size_padded=padded)
    specs = {f"l{i}": attention if i % 7 == 3 else state for i in range(56)}
    plan = plan_kv_cache([specs], [40 * GiB], VllmLimits(max_model_len=131072))
    assert set(plan.page_sizes) == {2752512}


def test_budget_is_a_fraction_of_total_memory() -> None:
    # H200 141 GiB at the default 0.92: ceil(141 GiB x 0.92); minus weights, non-torch, activation peak, CUDA graphs
    total = 141 * GiB
    budget = available_kv_cache_memory(
        total_memory=total,
        weights_memory=60 * GiB,
        non_torch_memory=GiB,
        activation_peak_memory=3 * GiB,
        cudagraph_memory_estimate=GiB // 2,
    )
    assert budget.requested_memory == math.ceil(total * 0.92)
    assert budget.available_kv_cache_memory == math.ceil(total * 0.92) - 64 * GiB - GiB // 2
    unprofiled = available_kv_cache_memory(total_memory=total, cudagraph_memory_estimate=GiB, estimate_cudagraphs=False)
    assert unprofiled.available_kv_cache_memory == math.ceil(total * 0.92)
    # --kv-cache-memory-bytes ignores the utilization
    fixed = available_kv_cache_memory(total_memory=total, gpu_memory_utilization=0.5, kv_cache_memory_bytes=7 * GiB)
    assert (fixed.available_kv_cache_memory, fixed.source) == (7 * GiB, "kv_cache_memory_bytes")
    # a budget below zero reaches vLLM's "No available memory" error in the plan
    short = available_kv_cache_memory(total_memory=80 * GiB, weights_memory=80 * GiB)
    with pytest.raises(VllmMemoryError, match=r"^No available memory for the cache blocks"):
        plan_kv_cache([{"a": full()}], [short.available_kv_cache_memory], VllmLimits(max_model_len=16))
    with pytest.raises(ConfigError, match="--gpu-memory-utilization"):
        available_kv_cache_memory(total_memory=total, gpu_memory_utilization=1.5)
    with pytest.raises(ConfigError, match="total memory"):
        available_kv_cache_memory(weights_memory=GiB)


def test_mla_beside_sliding_window_falls_back_to_full_allocation() -> None:
    # MLA page 16 x 576 x 2 = 18432 does not divide the sliding page 65536 and cannot be padded: vLLM allocates the
    # sliding layers as full attention instead, all layers in one uniform-type group (page 18432 + 65536 per pair)
    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype_bytes=2)
    groups = get_kv_cache_groups({"l0": mla, "l1": sliding(128)})
    assert len(groups) == 1 and groups[0].kv_cache_spec.page_size_bytes == 18432 + 65536
    promoted = groups[0].layer_spec("l1")
    assert type(promoted) is FullAttentionSpec and promoted.page_size_bytes == 65536
    # now priced as full attention: cdiv(4096, 16) = 256 blocks for the pair at max_model_len 4096
    assert groups[0].blocks_per_request(VllmLimits(max_model_len=4096)) == 256
