"""docs/trtllm.md's worked examples (issue 35), each number as the page states it, so the page cannot drift from the
code.  The GPU budgets take kvpools' weights estimate (``estimate_weights``) as the weights; the steps are cited in
docs/trtllm.md and tests/trtllm/test_trtllm_accounting.py."""

from __future__ import annotations

from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.values import Serving

GIB = 1 << 30


def test_llama_31_70b_h100_tp4() -> None:
    """2 x 80 x 2 x 128 x 2 B = 81,920 B; 79.65 GiB - 32.86 GiB = 46.79 GiB free; x 0.9 = 45,217,780,531 B;
    // 81,920 = 551,974 tokens; // 32 = 17,249 blocks."""
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), gpu="h100")
    rank = result.ranks[0]
    assert rank.cache_bytes_per_token == 81_920
    assert (round(rank.weights_memory / GIB, 2), round(rank.free_after_warmup / GIB, 2)) == (32.86, 46.79)
    assert rank.available_kv_memory == 45_217_780_531
    assert rank.max_tokens == 45_217_780_531 // 81_920 == 551_974
    assert result.kv_cache_capacity() == {"maxNumBlocks": 17_249, "tokensPerBlock": 32, "maxNumTokens": 551_968}


def test_gpt_oss_120b_h100_vswa() -> None:
    """73,728 B per token over 36 layers; 18,244,794,816 B; all layers full: 7,733 blocks; with
    --max_attention_window 128,131072 each window's 18 layers (36,864 B) get half: 7,733 each; shares 0.25,0.75:
    3,866 and 11,599 blocks, 2 requests of 128k instead of 1."""
    plain = plan_trtllm("gpt-oss-120b", gpu="h100")
    assert (round(plain.ranks[0].weights_memory / GIB, 2), plain.ranks[0].available_kv_memory) == (
        60.77,
        18_244_794_816,
    )
    assert plain.ranks[0].cache_bytes_per_token == 73_728 and plain.pools[0].primary_blocks == 7_733
    vswa = plan_trtllm("gpt-oss-120b", gpu="h100", max_attention_window="128,131072")
    assert [(pool.window, pool.bytes_per_token, pool.primary_blocks) for pool in vswa.pools] == [
        (128, 36_864, 7_733),
        (131_072, 36_864, 7_733),
    ]
    assert int(18_244_794_816 * 0.5 / 36_864) // 32 == 7_733
    shared = plan_trtllm("gpt-oss-120b", gpu="h100", max_attention_window="128,131072", window_size_shares="0.25,0.75")
    assert [pool.primary_blocks for pool in shared.pools] == [3_866, 11_599]
    assert (vswa.concurrency_at(131_072), shared.concurrency_at(131_072)) == (1, 2)


def test_deepseek_v3_and_v32_h200_tp8() -> None:
    """DeepSeek-V3: 61 x 576 x 2 = 70,272 B; 61.11 GiB free; 59,053,220,323 B // 70,272 // 32 = 26,261 blocks
    (840,352 tokens).  With one MTP layer: // (70,272 + 1,152) = 826,797 tokens, 25,837 blocks in each manager,
    100 requests of 8k (257 blocks each).  DeepSeek-V3.2: 78,324 B; 60.29 GiB free; 58,261,467,456 B // 78,324
    // 32 = 23,245 blocks (743,840 tokens)."""
    v3 = plan_trtllm("deepseek-v3", Serving(tp_size=8), gpu="h200")
    assert (round(v3.ranks[0].free_after_warmup / GIB, 2), v3.ranks[0].available_kv_memory) == (61.11, 59_053_220_323)
    assert (v3.pools[0].primary_blocks, v3.max_kv_tokens) == (26_261, 840_352)
    mtp = plan_trtllm("deepseek-v3", Serving(tp_size=8), gpu="h200", num_nextn_predict_layers=1)
    assert mtp.ranks[0].max_tokens == 59_053_220_323 // 71_424 == 826_797
    assert [pool.primary_blocks for pool in mtp.pools] == [25_837, 25_837]
    assert mtp.concurrency_at(8192) == 25_837 // 257 == 100
    v32 = plan_trtllm("deepseek-v3.2", Serving(tp_size=8), gpu="h200")
    assert (round(v32.ranks[0].free_after_warmup / GIB, 2), v32.ranks[0].available_kv_memory) == (60.29, 58_261_467_456)
    assert (v32.ranks[0].cache_bytes_per_token, v32.pools[0].primary_blocks, v32.max_kv_tokens) == (
        78_324,
        23_245,
        743_840,
    )
