"""The replay: what a plan's allocators achieve on a trace, checked against counts worked out by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpools_core.errors import ConfigError
from kvpools_core.pipeline import plan
from kvpools_core.planning.replay import (
    Request,
    fixed_trace,
    load_jsonl_trace,
    lognormal_trace,
    replay,
    swa_window_bound,
    uniform_trace,
)
from kvpools_core.values import Serving


def _pages(tokens: int, page: int) -> int:
    return -(-tokens // page)


def test_fixed_length_peak_is_the_pages_the_full_pool_holds() -> None:
    """Llama-3.1-8B, page 16, 1 GiB: 100-token prompts, 61 output tokens.

    Each request ends at 161 tokens, ceil(161 / 16) = 11 pages = 176 slots.  The replay admits a
    request only when every running one can still reach its final length (``admission="reserve"``),
    so the peak — the most requests decoding in one step — is the number of such requests the full
    pool holds at their final length: ``max_total_num_tokens // 176``.  They are admitted at prompt
    length (7 pages each), so fewer pages are in use then; at their last step they hold all of them.
    """
    p = plan("llama-3.1-8b", Serving(page_size=16), memory="1GiB")
    per_request = _pages(100 + 61, 16) * 16
    expected = p.max_total_num_tokens // per_request
    assert 2 <= expected < p.max_running_requests  # the full pool binds, not the request table
    stats = replay(p, fixed_trace(100, 61, 3 * expected + 1))
    assert stats.peak_concurrency == expected
    assert stats.peak_tokens_held["full"] == expected * per_request
    assert stats.retractions == 0
    assert stats.completed == 3 * expected + 1
    assert stats.tokens_served == (3 * expected + 1) * 161
    assert stats.steps == 4 * 61  # three full waves, then the last request alone
    assert stats.free_tokens_at_end == stats.token_capacity == {"full": p.max_total_num_tokens}


def test_fixed_length_waves_run_at_the_peak() -> None:
    """A trace of whole waves runs every step at the peak: mean concurrency equals it."""
    p = plan("llama-3.1-8b", Serving(page_size=16), memory="1GiB")
    expected = p.max_total_num_tokens // (_pages(100 + 61, 16) * 16)
    stats = replay(p, fixed_trace(100, 61, 2 * expected))
    assert stats.mean_concurrency == stats.peak_concurrency == expected


def test_page_size_one_peak() -> None:
    """Page 1 (the token allocator): a request of 300 + 200 holds exactly 500 slots at its end."""
    p = plan("llama-3.1-8b", Serving(), memory="1GiB")
    expected = p.max_total_num_tokens // 500
    stats = replay(p, fixed_trace(300, 200, 2 * expected))
    assert stats.peak_concurrency == expected
    assert stats.free_tokens_at_end == {"full": p.max_total_num_tokens}


def test_greedy_admission_retracts_and_still_completes() -> None:
    """Admitting on the prompt alone (page 16: 7 pages for a 100-token prompt) fits more requests than can
    grow to 161 tokens (11 pages); decode then runs out, SGLang's ``retract_decode`` sends the requests with
    the fewest output tokens back to the queue, and every request still completes with all its tokens."""
    p = plan("llama-3.1-8b", Serving(page_size=16), memory="1GiB")
    count = 60
    stats = replay(p, fixed_trace(100, 61, count), admission="greedy")
    assert stats.peak_concurrency > p.max_total_num_tokens // (11 * 16)  # more than can finish together
    assert stats.peak_concurrency <= p.max_total_num_tokens // (7 * 16)  # what the prompts alone allow
    assert stats.retractions > 0
    assert stats.completed == count
    assert stats.generated_tokens == count * 61
    assert stats.prompt_tokens == count * 100
    assert stats.free_tokens_at_end == {"full": p.max_total_num_tokens}


def test_request_table_binds() -> None:
    """``--max-running-requests 3``: no more than 3 requests run, whatever room the pool has."""
    p = plan("llama-3.1-8b", Serving(page_size=16, max_running_requests=3), memory="1GiB")
    stats = replay(p, fixed_trace(32, 8, 10))
    assert stats.peak_concurrency == 3
    assert stats.completed == 10


def test_swa_eviction_lets_the_full_pool_bind() -> None:
    """gpt-oss-20b, page 16, ratio 0.3, 1 GiB: an SWA pool far smaller than what the requests hold.

    Requests of 512 + 512 tokens: the full pool holds ``full // 1024`` of them at their end; without
    eviction they would need that many x 1024 SWA tokens too, more than the SWA pool has.  With SGLang's
    eviction (window 128, interval 128, radix cache: keep ``ceil16(max(128, 16))`` = 128) a request past
    its first decode holds at most ``max(ceil16(128 + 128), 128 + 2 x 16)`` = 256 SWA tokens, so every
    request runs and the full pool binds.
    """
    p = plan("gpt-oss-20b", Serving(page_size=16, swa_full_tokens_ratio=0.3), memory="1GiB")
    full, swa = p.counts["tokens"]["full"], p.counts["tokens"]["swa"]
    expected = full // 1024
    assert expected >= 2
    assert expected * 1024 > swa  # no eviction: the SWA pool overflows
    stats = replay(p, fixed_trace(512, 512, 3 * expected))
    assert stats.completed == 3 * expected
    assert stats.peak_concurrency == expected
    assert stats.peak_tokens_held["swa"] <= swa
    assert 128 < stats.peak_swa_tokens_per_request <= 256  # more than the window, never past the bound
    assert swa_window_bound(128, 16, 128) == 256
    assert stats.free_tokens_at_end == {"full": full, "swa": swa // 16 * 16}


def test_swa_eviction_with_the_chunk_cache_and_a_short_interval() -> None:
    """``--disable-radix-cache`` (the chunk cache keeps exactly the window) and ``--swa-eviction-interval 16``:
    a request past its first decode holds at most ``max(ceil16(128 + 16), ceil16(128) + 16)`` = 144 SWA tokens."""
    serving = Serving(page_size=16, swa_full_tokens_ratio=0.3, disable_radix_cache=True, swa_eviction_interval=16)
    p = plan("gpt-oss-20b", serving, memory="1GiB")
    stats = replay(p, fixed_trace(512, 512, 6))
    assert swa_window_bound(128, 16, 16) == 144
    assert 128 < stats.peak_swa_tokens_per_request <= 144
    assert stats.completed == 6


def test_mamba_state_slots_bind() -> None:
    """Qwen3-Next with the radix cache off and ``--max-running-requests 24``: SGLang sizes 24 state slots (one
    per request: ratio 1 without the radix cache, and no ping-pong slots — the extra buffer asked for is inert
    without the radix cache, ``mamba_extra_buffer_of``), so 30 requests run 24 at a time, every slot held at the
    peak, while the KV tokens stay far from full: the state slots bind (with the table rows, sized alike)."""
    serving = Serving(page_size=64, disable_radix_cache=True, max_running_requests=24, enable_mamba_extra_buffer=True)
    p = plan("qwen3-next-80b-a3b-thinking", serving, memory="8GiB")
    assert p.counts["state_slots"] == 24 and p.max_running_requests == 24
    stats = replay(p, fixed_trace(200, 20, 30))
    assert stats.peak_concurrency == 24
    assert stats.peak_state_slots_held == 24
    assert stats.peak_tokens_held["full"] < p.max_total_num_tokens // 2
    assert stats.free_state_slots_at_end == 24
    assert stats.completed == 30


def test_mamba_default_rows_bind() -> None:
    """By default SGLang caps requests at state slots // 3 (the radix cache's copies), so the table binds
    and each running request holds one slot."""
    p = plan("qwen3-next-80b-a3b-thinking", Serving(page_size=64), memory="8GiB")
    rows = p.max_running_requests
    assert p.counts["state_slots"] >= 3 * rows
    stats = replay(p, fixed_trace(100, 10, 2 * rows))
    assert stats.peak_concurrency == rows
    assert stats.peak_state_slots_held == rows


def test_request_over_context_or_pool_is_refused() -> None:
    p = plan("llama-3.1-8b", Serving(page_size=16, context_length=1024), memory="1GiB")
    with pytest.raises(ConfigError, match=r"request 1 holds 1,025 tokens .* context length 1,024"):
        replay(p, [Request(10, 10), Request(1000, 25)])
    small = plan("llama-3.1-8b", Serving(page_size=16, max_total_tokens=256), memory="1GiB")
    with pytest.raises(ConfigError, match=r"request 0 .* does not fit the plan's pools alone"):
        replay(small, [Request(200, 100)])


def test_meta_device_is_refused() -> None:
    p = plan("llama-3.1-8b", Serving(page_size=16), memory="1GiB")
    with pytest.raises(ConfigError, match="replay on 'cpu'"):
        replay(p, fixed_trace(10, 10, 1), device="meta")


def test_jsonl_trace(tmp_path: Path) -> None:
    good = tmp_path / "trace.jsonl"
    good.write_text('{"input_len": 5, "output_len": 3}\n\n{"input_len": 7, "output_len": 1, "id": "x"}\n')
    trace = load_jsonl_trace(good)
    assert trace.requests == (Request(5, 3), Request(7, 1))
    assert trace.tokens == 16


@pytest.mark.parametrize(
    ("third_line", "message"),
    [
        ('{"input_len": 4, "output_len": "many"}', r"trace\.jsonl:3: 'output_len' must be a positive integer"),
        ('{"input_len": 0, "output_len": 2}', r"trace\.jsonl:3: 'input_len' must be a positive integer, got 0"),
        ('{"input_len": 4}', r"trace\.jsonl:3: the record has no 'output_len' field"),
        ("[4, 2]", r"trace\.jsonl:3: a record must be a JSON object"),
        ('{"input_len": 4,', r"trace\.jsonl:3: not a JSON record"),
    ],
)
def test_jsonl_trace_malformed_record_names_line_and_field(tmp_path: Path, third_line: str, message: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text('{"input_len": 5, "output_len": 3}\n{"input_len": 6, "output_len": 3}\n' + third_line + "\n")
    with pytest.raises(ConfigError, match=message):
        load_jsonl_trace(path)


def test_generated_traces_are_seeded() -> None:
    a = lognormal_trace(200, input_median=1000, input_p99=8000, output_median=200, output_p99=2000, seed=7)
    assert a == lognormal_trace(200, input_median=1000, input_p99=8000, output_median=200, output_p99=2000, seed=7)
    assert a != lognormal_trace(200, input_median=1000, input_p99=8000, output_median=200, output_p99=2000, seed=8)
    inputs = sorted(r.input_len for r in a.requests)
    assert 600 < inputs[100] < 1600  # the median lands near its target
    u = uniform_trace(50, input_range=(10, 20), output_range=(1, 3), seed=1)
    assert all(10 <= r.input_len <= 20 and 1 <= r.output_len <= 3 for r in u.requests)
    with pytest.raises(ConfigError, match="median <= p99"):
        lognormal_trace(3, input_median=10, input_p99=5, output_median=1, output_p99=1)
