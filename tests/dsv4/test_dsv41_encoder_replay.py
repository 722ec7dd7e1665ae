"""DeepSeek-V4.1's encoder SWA bounded replay (``--enable-encoder-swa-bounded-replay``; issue 33, ledger 000-119).

The synthetic DeepSeek-V4.1 config (``configs/dsv41_synthetic.json``: DeepSeek-V4-Flash's dims, 8 layers with
ratios 0, 0, 1, 1, 2, 2, 4, 128, window 128), TP 1, 20 GiB, SGLang's defaults for DeepSeek-V4: page 256, 256
requests (``apply_deepseek_v4_defaults``), chunked prefill 8192.  The numbers, by hand:

* ``request_window_bytes`` (``model_executor/pool_configurator.py`` lines 1211-1241): slots 256 + 1 = 257,
  capacity ``ceil_align(128 + 0, 256)`` = 256, scratch ``max(8192, 257 x 128) + 257 x 128 + 256`` = 66,048;
  ``(257 x 256 + 256) x 8 x (584 + 16)`` = 317,030,400, ``4 x 66,048 x 600`` = 158,515,200,
  ``257 x 3 x 16 x 512 x 8`` = 50,528,256: 526,073,856 B;
* the bytes per full token with the SWA ratio 0 (lines 1242-1243), SGLang 0.5.23's ``_get_bytes_per_full_token``
  over the owners ``collect_sources_by_ratio`` gives (c4 layer 4, c128 layer 5, kv_source layers 1 (ratio 1)
  and 2 (ratio 2)), each row page padded (``_get_paged_kv_bytes_per_token``: ``KVLayout.page_bytes(P // r) /
  (P // r)``, V4 rows of 584 B in strides of 576): c4 ``1/4 x 585 + 1/4 x 132`` = 179.25, c128 ``1/128 x 864``
  (two 584 B rows padded to 1,728) = 6.75, ratio 1 ``(585 + 68) / 1`` = 653 (fp4 indexer 64 + 4 B), ratio 2
  ``(585 + 68) / 2`` = 326.5: 1,165.5 B; the c128 state: ``ceil((257 x 128 + 128 + 1) / 128) x 128 x 2 x 512 x
  4`` = 135,790,592 B; the ratio-2 pair state (``_get_c2_state_fixed_bytes``): ``ceil((257 x 2 + 2 + 1) / 2) x
  2`` = 518 rows x 2 x 512 x 4 B = 2,121,728 B; full tokens ``int((21,474,836,480 - 135,790,592 - 2,121,728 -
  526,073,856) / 1,165.5)`` = 17,855,727, page aligned 17,855,488; the reserved pages
  (``_get_low_ratio_kv_padding_bytes``): ratio 1 ``256 x 585 + (17,855,808 - 17,855,488) x 68`` = 171,520,
  ratio 2 ``256 x 585 + (8,927,936 - 8,927,744) x 68`` = 162,816, and ``17,855,488 x 1,165.5 + 334,336`` =
  20,810,905,600 exceeds the 20,810,850,304 B left, so one page comes off: 17,855,232 (``17,855,232 x 1,165.5
  + 334,336`` = 20,810,607,232 fits).  (ref-002's configurator, which kvpools followed before, charged the
  ratio-1/2 layers nothing here: 183.5625 B a token, 113,383,424 full tokens, 622 % of the budget built.)
* the window (``dsv41_request_window.py`` lines 226-264, ``deepseek_v4_memory_pool.py`` lines 1137-1180): 257
  request-table rows, capacity 256, rows 65,792; state ``_make_kv_pool(65,792 + 256)``: ``ceil((66,048 + 256) /
  256)`` = 259 pages of ``ceil(256 x 584 / 576) x 576`` = 149,760 B per layer, x 8 = 310,302,720 B; tags int64
  ``(8, 66,048)`` = 4,227,072 B; workspace ``258 x 128 + max(8192, 0, 258 x 1)`` = 41,216 rows (161 pages): 162
  pages x 149,760 = 24,261,120 B.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvpools_plugins.dsv4.encoder_replay import (
    REPLAY_WORKSPACE_POOL,
    REQUEST_WINDOW_POOL,
    REQUEST_WINDOW_TAGS_POOL,
    SGLANG_REQUIRES_V41_MESSAGE,
)

from kvpools_core import Serving, build, plan
from kvpools_core.allocators.paged import PagedAllocator
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.planning.capacity import REQUEST_CAP, concurrency
from kvpools_core.values import Plan

V41 = str(Path(__file__).with_name("configs") / "dsv41_synthetic.json")
REPLAY = Serving(enable_encoder_swa_bounded_replay=True)
BUDGET = 20 * 2**30


def _plan(accounting: str = "sglang", **changes: Any) -> Plan:
    return plan(V41, attrs.evolve(REPLAY, accounting=accounting, **changes), memory="20GiB")


def test_the_configurator_sets_the_request_window_aside() -> None:
    p = _plan()
    config = p.sizing.sglang_config
    assert config["request_window_bytes"] == 317_030_400 + 158_515_200 + 50_528_256 == 526_073_856
    assert config["request_window_bytes"] == 526_073_856
    assert p.cell.sglang_bytes_per_token == 1 / 4 * 585 + 1 / 4 * 132 + 864 / 128 + 653 + 326.5 == 1165.5
    assert int((BUDGET - 135_790_592 - 2_121_728 - 526_073_856) / 1165.5) == 17_855_727
    assert BUDGET - 135_790_592 - 2_121_728 - 526_073_856 < 17_855_488 * 1165.5 + 171_520 + 162_816
    assert p.max_total_num_tokens == config["full_max_total_num_tokens"] == 17_855_232
    assert p.max_running_requests == 256
    # the SWA ratio 0 and cap 0: no SWA tokens, and the c4 states priced per SWA slot have none either
    assert config["swa_max_total_num_tokens"] == 0 and config["c4_state_pool_size"] == 0
    assert any("ratio-2 pair state 2,121,728" in note for note in p.sizing.notes)
    assert any("request window 526,073,856" in note for note in p.sizing.notes)


def test_the_window_pools_by_hand() -> None:
    p = _plan()
    assert p.pool(REQUEST_WINDOW_POOL).bytes == 8 * 259 * 149_760 == 310_302_720
    assert p.pool(REQUEST_WINDOW_TAGS_POOL).bytes == 8 * 66_048 * 8 == 4_227_072
    assert p.pool(REPLAY_WORKSPACE_POOL).bytes == 162 * 149_760 == 24_261_120
    # per request: one capacity of rows (one page) on every layer, and its tags
    assert p.pool(REQUEST_WINDOW_POOL).bytes_per_slot == 8 * 149_760
    assert p.pool(REQUEST_WINDOW_TAGS_POOL).bytes_per_slot == 8 * 256 * 8


def test_no_paged_swa_pool_mapping_or_allocator() -> None:
    """ref-000 L2097-2108: without a paged SWA allocator SGLang builds no SWA pool, no full-to-SWA mapping and no
    SWA allocator; the plan counts no SWA token space (the window is per request slot)."""
    names = {pool.name for pool in _plan().sizing.pools}
    assert not names & {"kv_swa", "full_to_swa", "swa_allocator"}
    assert {REQUEST_WINDOW_POOL, REQUEST_WINDOW_TAGS_POOL, REPLAY_WORKSPACE_POOL} <= names
    p = _plan()
    assert "swa" not in p.sizing.token_counts and p.windows == ()
    without = plan(
        V41, attrs.evolve(REPLAY, enable_encoder_swa_bounded_replay=False, accounting="sglang"), memory="20GiB"
    )
    assert {"kv_swa", "full_to_swa", "swa_allocator"} <= {pool.name for pool in without.sizing.pools}


@pytest.mark.parametrize("accounting", ["sglang", "exact"])
def test_meta_build_allocates_the_plan_with_the_full_only_allocator(accounting: str) -> None:
    p = _plan(accounting)
    pools = build(p, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.sizing.pools}
    alloc = pools.allocator
    assert type(alloc) is PagedAllocator  # not SWATokenToKVPoolAllocator: no SWA side, no mapping
    assert alloc.size == p.max_total_num_tokens and alloc.page_size == 256
    window = pools.kv_pool.request_window
    assert window is not None and pools.kv_pool.full_to_swa_index_mapping is None
    assert window.capacity == 256 and tuple(window.tags.shape) == (8, 66_048)
    if accounting == "exact":
        assert p.planned_bytes <= BUDGET


def test_the_exact_plan_charges_every_window_byte() -> None:
    p = _plan("exact")
    assert p.pool(REQUEST_WINDOW_POOL).bytes == 310_302_720
    assert p.pool(REPLAY_WORKSPACE_POOL).bytes == 24_261_120
    assert p.sizing.sglang_config["swa_max_total_num_tokens"] == 0


def test_capacity_is_bounded_by_the_request_cap_not_a_swa_space() -> None:
    """Each running request holds one window slot (257 rows for 256 requests): short requests are bounded by the
    request cap, as SGLang's ``max_running_requests`` bounds the window's slots."""
    answer = concurrency(_plan(), 4096)
    assert answer.concurrent_requests == 256 and answer.binding == REQUEST_CAP
    assert "swa tokens" not in answer.limits
    # full tokens: 17,855,232 // 4096 = 4,359 requests of 4k; the request cap binds far below
    assert answer.limits["full tokens"] == 17_855_232 // 4096


def test_a_smaller_request_cap_shrinks_the_window() -> None:
    """64 requests: slots 65, scratch max(8192, 65 x 128) + 65 x 128 + 256 = 16,896 (the slots' scratch now
    exceeds the chunk); (65 x 256 + 256) x 8 x 600 + 4 x 16,896 x 600 + 65 x 3 x 16 x 512 x 8 = 81,100,800 +
    40,550,400 + 12,779,520 = 134,430,720 B; the pool: 65 x 256 + 256 = 16,896 rows, 67 pages a layer; workspace
    66 x 128 + max(8192, 66) = 16,640 rows (65 pages, 66 allocated)."""
    p = _plan(max_running_requests=64)
    assert p.sizing.sglang_config["request_window_bytes"] == 81_100_800 + 40_550_400 + 12_779_520
    assert p.pool(REQUEST_WINDOW_POOL).bytes == 8 * 67 * 149_760
    assert p.pool(REQUEST_WINDOW_TAGS_POOL).bytes == 8 * 16_896 * 8
    assert p.pool(REPLAY_WORKSPACE_POOL).bytes == 66 * 149_760


# -- what SGLang refuses, in its words, and what kvpools does not model ----------------------------------


def _refused(serving: Serving, model: str = V41) -> str:
    with pytest.raises((ConfigError, UnsupportedCombinationError)) as caught:
        plan(model, serving, memory="20GiB")
    return str(caught.value)


def test_a_deepseek_v4_checkpoint_is_refused_in_sglangs_words() -> None:
    assert SGLANG_REQUIRES_V41_MESSAGE in _refused(REPLAY, "deepseek-v4-flash")


def test_another_architecture_is_refused_in_sglangs_words() -> None:
    message = _refused(REPLAY, "llama-3.1-8b")
    assert SGLANG_REQUIRES_V41_MESSAGE in message and "[core]" in message


def test_another_engines_accounting_is_refused() -> None:
    with pytest.raises(ConfigError, match=re.escape("SGLang's DeepSeek-V4.1 encoder SWA replay")):
        attrs.evolve(REPLAY, accounting="vllm")


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        (
            {"chunked_prefill_size": 256},
            "encoder SWA replay requires --max-running-requests > 0 and at least 384 chunked prefill tokens per "
            "attention DP rank (128 replay tokens plus one page)",
        ),
        ({"chunked_prefill_size": None}, "at least 384 chunked prefill tokens"),
        ({"disaggregation_mode": "decode"}, "--enable-encoder-swa-bounded-replay does not support PD decode yet"),
        ({"enable_unified_memory": True}, "--enable-encoder-swa-bounded-replay does not support unified memory yet"),
        (
            {"tp_size": 2, "attn_cp_size": 2},
            "--enable-encoder-swa-bounded-replay does not support context parallelism yet",
        ),
        (
            {"dsv4_attn_backend": "trtllm", "kv_cache_dtype": "fp8_e4m3"},
            "DeepSeek-V4.1 does not support TRT-LLM with encoder SWA bounded replay yet",
        ),
        ({"enable_hierarchical_cache": True}, "kvpools does not model DeepSeek-V4's host tier with"),
    ],
    ids=["small-chunk", "no-chunk", "pd-decode", "unified-memory", "cp", "trtllm", "hicache"],
)
def test_what_sglang_refuses_is_refused(changes: dict[str, Any], words: str) -> None:
    assert words in _refused(attrs.evolve(REPLAY, **changes))


def test_the_chunk_is_per_dp_attention_rank() -> None:
    """DP attention divides the chunk (``_handle_data_parallelism``): 8192 over 32 ranks is 256 < 384."""
    serving = attrs.evolve(REPLAY, tp_size=32, dp_size=32, enable_dp_attention=True, max_running_requests=256)
    assert re.search(r"at least 384 chunked prefill tokens.*over 32 DP-attention ranks", _refused(serving))


@settings(max_examples=12, deadline=None)
@given(
    requests=st.integers(min_value=1, max_value=600),
    chunk_pages=st.integers(min_value=2, max_value=64),
    accounting=st.sampled_from(["sglang", "exact"]),
)
def test_the_build_is_the_plan_for_any_request_cap_and_chunk(requests: int, chunk_pages: int, accounting: str) -> None:
    """Whatever the request cap and chunk: ``meta`` allocates every planned byte; the window holds one capacity per
    request-table row (``S x C + P`` rows, ``C`` the window in whole pages); the workspace holds at least the
    replay rows ``(S + 1) x window + max(chunk, S + 1)``; the exact plan fits its budget."""
    p = _plan(accounting, max_running_requests=requests, chunked_prefill_size=256 * chunk_pages)
    pools = build(p, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.sizing.pools}
    window = pools.kv_pool.request_window
    slots = p.max_running_requests + 1
    assert tuple(window.tags.shape) == (8, slots * 256 + 256)
    workspace = window.workspace
    assert workspace.geo.tokens >= (slots + 1) * 128 + max(256 * chunk_pages, slots + 1)
    assert workspace.geo.tokens % 256 == 0
    if accounting == "exact":
        assert p.planned_bytes <= BUDGET


def test_the_replay_reaches_the_capacity_answer() -> None:
    """Through the plan's own full-only allocator, 200 requests of 4,096 + 256 tokens peak at the request cap the
    capacity answer gives (no SWA space to run out of: the window holds a slot per running request)."""
    from kvpools_core.planning.replay import fixed_trace, replay

    p = plan(
        V41, attrs.evolve(REPLAY, accounting="sglang", context_length=16384, max_running_requests=64), memory="3GiB"
    )
    stats = replay(p, fixed_trace(4096, 256, 200))
    answer = concurrency(p, 4096 + 256)
    assert stats.peak_concurrency == answer.concurrent_requests == 64 and answer.binding == REQUEST_CAP
    assert "swa" not in stats.token_capacity
