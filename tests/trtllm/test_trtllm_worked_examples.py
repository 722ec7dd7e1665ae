"""docs/trtllm.md's worked examples (issue 35), each number as the page states it, so the page cannot drift from the
code.  The GPU budgets take torch's device total (H100 79.19 GiB measured, H200 140.40 - 0.46 = 139.94 GiB derived:
parts/device_memory.py), kvpools' weights estimate (``estimate_weights``) and, for a dense model, the estimation
forward's MLP activation (engines/trtllm/runtime_memory.py); the steps are cited in docs/trtllm.md and
tests/trtllm/test_trtllm_accounting.py."""

from __future__ import annotations

from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.values import Serving

GIB = 1 << 30


def test_llama_31_70b_h100_tp4() -> None:
    """2 x 80 x 2 x 128 x 2 B = 81,920 B; 79.19 GiB - 32.86 GiB - activation 8192 x (3 x 28672 / 4 + 2 x 8192)
    x 2 B (620,756,992 B) = 45.76 GiB free; x 0.9 = 44,217,023,791 B; // 81,920 = 539,758 tokens; // 32 = 16,867
    blocks."""
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), gpu="h100")
    rank = result.ranks[0]
    assert rank.cache_bytes_per_token == 81_920
    assert (round(rank.weights_memory / GIB, 2), round(rank.free_after_warmup / GIB, 2)) == (32.86, 45.76)
    assert result.runtime[0].activation.bytes == 8192 * (3 * 28672 // 4 + 2 * 8192) * 2 == 620_756_992
    assert rank.available_kv_memory == 44_217_023_791
    assert rank.max_tokens == 44_217_023_791 // 81_920 == 539_758
    assert result.kv_cache_capacity() == {"maxNumBlocks": 16_867, "tokensPerBlock": 32, "maxNumTokens": 539_744}


def test_gpt_oss_120b_h100_vswa() -> None:
    """73,728 B per token over 36 layers; (79.19 GiB - 60.77 GiB) x 0.9 = 17,802,719,369 B (a MoE model: no activation
    term derived); all layers full: 7,545 blocks; with --max_attention_window 128,131072 each window's 18 layers
    (36,864 B) get half: 7,545 each; shares 0.25,0.75: 3,772 and 11,318 blocks, 2 requests of 128k instead of 1."""
    plain = plan_trtllm("gpt-oss-120b", gpu="h100")
    assert (round(plain.ranks[0].weights_memory / GIB, 2), plain.ranks[0].available_kv_memory) == (
        60.77,
        17_802_719_369,
    )
    assert plain.runtime[0].activation.bytes == 0 and not plain.runtime[0].activation.complete
    assert plain.ranks[0].cache_bytes_per_token == 73_728 and plain.pools[0].primary_blocks == 7_545
    vswa = plan_trtllm("gpt-oss-120b", gpu="h100", max_attention_window="128,131072")
    assert [(pool.window, pool.bytes_per_token, pool.primary_blocks) for pool in vswa.pools] == [
        (128, 36_864, 7_545),
        (131_072, 36_864, 7_545),
    ]
    assert int(17_802_719_369 * 0.5 / 36_864) // 32 == 7_545
    shared = plan_trtllm("gpt-oss-120b", gpu="h100", max_attention_window="128,131072", window_size_shares="0.25,0.75")
    assert [pool.primary_blocks for pool in shared.pools] == [3_772, 11_318]
    assert (vswa.concurrency_at(131_072), shared.concurrency_at(131_072)) == (1, 2)


def test_deepseek_v3_and_v32_h200_tp8() -> None:
    """DeepSeek-V3: 61 x 576 x 2 = 70,272 B; 139.94 GiB (torch's H200 total, derived) less the weights = 60.65 GiB
    free (MoE: no activation term derived); 58,608,691,208 B // 70,272 // 32 = 26,063 blocks (834,016 tokens).  With
    one MTP layer: // (70,272 + 1,152) = 820,574 tokens, 25,642 blocks in each manager, 99 requests of 8k (257
    blocks each).  DeepSeek-V3.2: 78,324 B; 59.83 GiB free; 57,816,938,340 B // 78,324 // 32 = 23,068 blocks
    (738,176 tokens)."""
    v3 = plan_trtllm("deepseek-v3", Serving(tp_size=8), gpu="h200")
    assert (round(v3.ranks[0].free_after_warmup / GIB, 2), v3.ranks[0].available_kv_memory) == (60.65, 58_608_691_208)
    assert (v3.pools[0].primary_blocks, v3.max_kv_tokens) == (26_063, 834_016)
    mtp = plan_trtllm("deepseek-v3", Serving(tp_size=8), gpu="h200", num_nextn_predict_layers=1)
    assert mtp.ranks[0].max_tokens == 58_608_691_208 // 71_424 == 820_574
    assert [pool.primary_blocks for pool in mtp.pools] == [25_642, 25_642]
    assert mtp.concurrency_at(8192) == 25_642 // 257 == 99
    v32 = plan_trtllm("deepseek-v3.2", Serving(tp_size=8), gpu="h200")
    assert (round(v32.ranks[0].free_after_warmup / GIB, 2), v32.ranks[0].available_kv_memory) == (59.83, 57_816_938_340)
    assert (v32.ranks[0].cache_bytes_per_token, v32.pools[0].primary_blocks, v32.max_kv_tokens) == (
        78_324,
        23_068,
        738_176,
    )
