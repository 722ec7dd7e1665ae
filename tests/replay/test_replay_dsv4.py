"""DeepSeek-V4 replayed: the dual full / SWA allocator, with its compressed ``c4`` / ``c128`` spaces following the
full pages (SGLang indexes them ``raw_out_loc // compress_ratio``: no allocator of their own).

deepseek-v4-flash at TP 8, page 256, context 8,192 and ``--max-running-requests 64`` on 3 GiB keeps the plans small
enough to replay in seconds.  Where the full tokens bind the replay's peak is capacity's answer exactly (every
request ends holding ``ceil(L / page)`` full pages, and the compressed spaces tie with them).  Where a small
``--swa-full-tokens-ratio`` makes the SWA space bind, capacity is SGLang's worst case and the replay one faithful
schedule that runs more: capacity charges each request ``window + interval + page + decode page`` = 768 SWA tokens
and two 8,192-token prefill chunks in flight beside them (``TokenWindow``), while a replayed request past its first
decode holds at most ``swa_window_bound`` = 512 and a whole prompt only until its first eviction (the hybrid-SWA
gap of ``test_replay_matches_capacity.py`` and docs/capacity.md).
"""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest
from kvpools_plugins.dsv4.building import build_allocator

from kvpools_core import Plan, Serving, plan
from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator, new_full_to_swa_mapping
from kvpools_core.errors import ConfigError
from kvpools_core.planning.capacity import concurrency, token_limit
from kvpools_core.planning.replay import ReplayStats, fixed_trace, replay, swa_window_bound

SMALL = Serving(tp_size=8, page_size=256, context_length=8_192, max_running_requests=64, swa_full_tokens_ratio=0.8)
"""SGLang's generic ratio 0.8, given (left unset, DeepSeek-V4 takes SGLang's 0.1)."""
MEMORY = "3GiB"


def replayed(p: Plan, input_len: int, output_len: int, count: int) -> ReplayStats:
    """Replay ``count`` requests and check the compressed rows and that every space is whole again at the end."""
    stats = replay(p, fixed_trace(input_len, output_len, count))
    page = p.serving.page_size
    tokens = p.counts["tokens"]
    assert stats.completed == stats.requests == count
    assert set(p.compression) == {"c4", "c128"}
    for space, ratio in p.compression.items():
        assert stats.token_capacity[space] == tokens[space]
        assert stats.peak_tokens_held[space] == stats.peak_tokens_held["full"] // ratio
        assert 0 < stats.peak_tokens_held[space] <= tokens[space]
    assert stats.free_tokens_at_end == {
        space: count if space in p.compression else count // page * page for space, count in tokens.items()
    }
    return stats


def test_full_tokens_bind_exactly() -> None:
    """SGLang's generic ratio (0.8): 4,096-token requests are bound by the full tokens, in both."""
    p = plan("deepseek-v4-flash", SMALL, memory=MEMORY)
    answer = concurrency(p, 4_096)
    assert answer.binding == token_limit("full")
    assert answer.concurrent_requests == p.counts["tokens"]["full"] // 4_096 < p.max_running_requests
    stats = replayed(p, 3_000, 1_096, 2 * answer.concurrent_requests + 1)
    assert stats.peak_concurrency == answer.concurrent_requests
    assert stats.peak_tokens_held["full"] == answer.concurrent_requests * 4_096
    assert stats.retractions == 0


def test_swa_binds_capacity_is_the_worst_case() -> None:
    """Ratio 0.05: the SWA space binds; capacity's worst case admits no more than the replay runs."""
    p = plan("deepseek-v4-flash", attrs.evolve(SMALL, swa_full_tokens_ratio=0.05), memory=MEMORY)
    answer = concurrency(p, 4_096)
    assert answer.binding == token_limit("swa")
    stats = replayed(p, 3_000, 1_096, 2 * answer.concurrent_requests + 1)
    assert answer.concurrent_requests <= stats.peak_concurrency
    assert stats.peak_tokens_held["swa"] <= stats.token_capacity["swa"]
    bound = swa_window_bound(128, 256, p.serving.swa_eviction_interval)
    assert stats.peak_swa_tokens_per_request <= bound


def test_the_dual_allocator_matches_the_plugins() -> None:
    """The replay's dual allocator is the one the dsv4 plugin builds (``build_allocator``): the same class over the
    same full and page-aligned SWA counts, so the replay hands out what SGLang's pools hold."""
    p = plan("deepseek-v4-flash", SMALL, memory=MEMORY)
    page = p.serving.page_size
    full = int(p.sizing.sglang_config["full_max_total_num_tokens"])
    pool = SimpleNamespace(full_to_swa_index_mapping=new_full_to_swa_mapping(full, page, "cpu"))
    plugins = build_allocator(plan=p, pool=pool, device="cpu", checked=True)
    assert type(plugins) is SWATokenToKVPoolAllocator
    stats = replay(p, fixed_trace(100, 28, 1))
    assert stats.token_capacity["full"] == plugins.full_available_size() == full
    assert stats.token_capacity["swa"] == plugins.swa_available_size()


def test_a_space_neither_full_windowed_nor_compressed_is_refused() -> None:
    """Under HiSparse the c4 device pool has an allocator of its own and no ratio: the replay refuses it."""
    p = plan(
        "deepseek-v4-flash",
        attrs.evolve(SMALL, enable_hisparse=True, disable_radix_cache=True, accounting="sglang"),
        memory="60GiB",
    )
    assert "c4" not in p.compression
    with pytest.raises(ConfigError, match="token spaces"):
        replay(p, fixed_trace(100, 28, 1))


def test_a_ratio_must_divide_the_page() -> None:
    p = plan("deepseek-v4-flash", SMALL, memory=MEMORY)
    odd = attrs.evolve(p, sizing=attrs.evolve(p.sizing, compression={"c4": 3, "c128": 128}))
    with pytest.raises(ConfigError, match="do not divide the page size"):
        replay(odd, fixed_trace(100, 28, 1))
