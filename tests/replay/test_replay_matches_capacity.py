"""The proof of ``kvpools capacity``: for fixed-length workloads the concurrency it predicts is what the replay reaches.

``concurrency(plan, L)`` is a closed form over the plan's counts; ``replay(plan, fixed_trace(I, O, n))`` runs
SGLang's scheduler loop over the plan's real allocators.  For requests of one length ``L = I + O`` the replay's
peak (the most requests decoding in one step) must be capacity's answer wherever both model the same engine:

* **full tokens** — every request ends holding ``ceil(L / page)`` pages and the replay admits a request only when
  all running ones can reach their end, so both are ``T // pages(L)`` (MHA, a hybrid's full pool, Mamba's KV);
* **request cap** and **state slots** (the radix cache off: one state slot per request in SGLang's
  ``_calculate_mamba_ratio`` and in ``HybridReqToTokenPool.alloc``) — one count each;
* **a sliding window not yet outgrown** — a request of ``L <= window`` never evicts, so it holds ``pages(L)``
  SWA tokens in both;
* **SGLang's SWA chunk cap** — the pool is sized for ``--max-running-requests`` worst cases plus the chunks in
  flight, and both give back exactly that many when every prompt is one chunk.

Past the window, where the SWA pool binds, the two legitimately differ and capacity is the lower: it is the
engine's guaranteed worst case (``TokenWindow``: what SGLang's ``SWAChunkCapPoolConfigurator`` sizes the pool by),
the replay one faithful schedule.  (1) Capacity charges each request ``window + eviction interval x draft tokens +
page + decode allocation`` SWA tokens — the page that aligns the eviction point and the next decode step's
allocation, outstanding under the overlap schedule — while a replayed request, which evicts before it allocates
one step at a time, holds at most ``swa_window_bound = max(ceil_page(window + interval), ceil_page(window) +
page)``.  (2) Capacity charges ``min(N, chunks in flight)`` requests a prefill chunk beyond that, as long as the
context allows (``min(pages(L) - w, chunk)``: it cannot know how much of ``L`` is prompt), while the replay
holds a prompt of ``I < L`` tokens whole only until its first eviction and admits a newcomer whenever its prompt
fits beside the running requests' steady holdings.  Every prompt here is within ``--chunked-prefill-size``, so
the replay and SGLang prefill each in one pass; prompts of several chunks, where the replay holds one chunk beside
the chunked request's window only while it is prefilled, are compared in ``test_replay_chunked.py``.
"""

from __future__ import annotations

import pytest

from kvpools_core import Plan, Serving, plan
from kvpools_core.planning.capacity import REQUEST_CAP, STATE_SLOTS, concurrency, token_limit
from kvpools_core.planning.replay import ReplayStats, fixed_trace, replay, swa_window_bound

FULL = token_limit("full")
SWA = token_limit("swa")


def replayed(p: Plan, input_len: int, output_len: int, predicted: int) -> ReplayStats:
    """Replay two waves and one more request than ``predicted`` concurrent requests: enough to exceed it."""
    stats = replay(p, fixed_trace(input_len, output_len, 2 * predicted + 1))
    assert stats.completed == stats.requests
    assert stats.free_tokens_at_end == {
        space: count // p.serving.page_size * p.serving.page_size for space, count in p.counts["tokens"].items()
    }
    return stats


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize(("input_len", "output_len"), [(100, 61), (1_000, 24), (33, 31), (2_000, 48)])
def test_mha_full_tokens(page: int, input_len: int, output_len: int) -> None:
    """Llama-3.1-8B, 1 GiB, context 4,096: ``T // pages(L)`` requests in the closed form and in the replay."""
    p = plan("llama-3.1-8b", Serving(page_size=page, context_length=4_096), memory="1GiB")
    answer = concurrency(p, input_len + output_len)
    assert answer.binding == FULL
    assert answer.concurrent_requests == p.counts["tokens"]["full"] // (-(-(input_len + output_len) // page) * page)
    stats = replayed(p, input_len, output_len, answer.concurrent_requests)
    assert stats.peak_concurrency == answer.concurrent_requests
    assert stats.retractions == 0


@pytest.mark.parametrize("page", [1, 16])
def test_the_request_cap(page: int) -> None:
    """``--max-running-requests 5`` below what the tokens hold: 5 in both."""
    p = plan("llama-3.1-8b", Serving(page_size=page, context_length=4_096, max_running_requests=5), memory="1GiB")
    answer = concurrency(p, 100)
    assert (answer.concurrent_requests, answer.binding) == (5, REQUEST_CAP)
    assert answer.limits[FULL] > 5
    assert replayed(p, 60, 40, 5).peak_concurrency == 5


@pytest.mark.parametrize(
    ("page", "input_len", "output_len"),
    [(1, 40, 60), (16, 40, 60), (16, 64, 64), (64, 40, 24), (16, 100, 100)],
)
def test_swa_within_the_window(page: int, input_len: int, output_len: int) -> None:
    """gpt-oss-20b (window 128, interval 128), 1 GiB: the SWA pool is 0.8 of the full pool, so short requests bind
    on it.  A request never evicts while ``L - window < interval`` (here ``L <= 200``), so it holds ``pages(L)``
    SWA tokens, and capacity charges ``pages(L)`` while that is within the worst case (288 tokens at page 16):
    ``S // pages(L)`` in both."""
    p = plan("gpt-oss-20b", Serving(page_size=page, context_length=4_096), memory="1GiB")
    length = input_len + output_len
    assert length - 128 < 128
    answer = concurrency(p, length)
    assert answer.binding == SWA
    assert answer.concurrent_requests == p.counts["tokens"]["swa"] // (-(-length // page) * page)
    stats = replayed(p, input_len, output_len, answer.concurrent_requests)
    assert stats.peak_concurrency == answer.concurrent_requests
    assert stats.retractions == 0


def test_gemma2_within_its_window() -> None:
    """Gemma-2-9B (window 4,096), page 16, 2 GiB: requests of 2,048 tokens bind on the SWA pool in both."""
    p = plan("gemma-2-9b", Serving(page_size=16, context_length=6_000), memory="2GiB")
    answer = concurrency(p, 2_048)
    assert answer.binding == SWA
    assert answer.concurrent_requests == p.counts["tokens"]["swa"] // 2_048
    assert replayed(p, 2_000, 48, answer.concurrent_requests).peak_concurrency == answer.concurrent_requests


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("radix_cache_off", [False, True])
def test_swa_past_the_window_the_full_pool_binds(page: int, radix_cache_off: bool) -> None:
    """gpt-oss-20b, 1 GiB, requests of 512 + 512: past the window each holds the worst case in the SWA pool, far
    fewer tokens than in the full pool, so the full pool binds in both: ``T // pages(1,024)``."""
    serving = Serving(page_size=page, context_length=4_096, disable_radix_cache=radix_cache_off)
    p = plan("gpt-oss-20b", serving, memory="1GiB")
    answer = concurrency(p, 1_024)
    assert answer.binding == FULL
    assert answer.limits[SWA] > answer.concurrent_requests
    assert answer.concurrent_requests == p.counts["tokens"]["full"] // 1_024
    assert replayed(p, 512, 512, answer.concurrent_requests).peak_concurrency == answer.concurrent_requests


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("overlap_off", [False, True])
def test_sglangs_chunk_cap_holds_its_requests(page: int, overlap_off: bool) -> None:
    """``--max-running-requests 16 --disable-radix-cache --chunked-prefill-size 512``: SGLang sizes the SWA pool
    for 16 worst cases plus the chunks in flight (2, or 1 without the overlap schedule) and a page; capacity
    inverts exactly that to 16, and the replay, whose 512-token prompts are each one chunk, runs 16 at once."""
    serving = Serving(
        page_size=page,
        context_length=4_096,
        max_running_requests=16,
        disable_radix_cache=True,
        chunked_prefill_size=512,
        disable_overlap_schedule=overlap_off,
    )
    p = plan("gpt-oss-20b", serving, memory="1GiB")
    (window,) = p.windows
    chunks = 1 if overlap_off else 2
    assert p.counts["tokens"]["swa"] == -(-(16 * window.per_request + chunks * 512 + page) // page) * page
    answer = concurrency(p, 1_024)
    assert answer.limits[SWA] == answer.concurrent_requests == 16 == p.max_running_requests
    assert answer.limits[FULL] > 16
    assert replayed(p, 512, 512, 16).peak_concurrency == 16


@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("radix_cache_off", [False, True])
@pytest.mark.parametrize(("input_len", "output_len"), [(512, 512), (200, 800), (1_000, 100)])
def test_swa_past_the_window_capacity_is_the_guaranteed_worst_case(
    page: int, radix_cache_off: bool, input_len: int, output_len: int
) -> None:
    """gpt-oss-20b, ``--swa-full-tokens-ratio 0.2``, 1 GiB: past the window the SWA pool binds in both, and the
    replay runs at least as many requests as capacity promises — more, since capacity charges SGLang's worst
    case per request and the chunks in flight (the module docstring says exactly what differs).  Every prompt
    is within the 8,192-token chunk, so both prefill it in one pass."""
    serving = Serving(
        page_size=page, context_length=4_096, swa_full_tokens_ratio=0.2, disable_radix_cache=radix_cache_off
    )
    p = plan("gpt-oss-20b", serving, memory="1GiB")
    length = input_len + output_len
    (window,) = p.windows
    assert input_len <= (window.prefill_chunk or 0)
    answer = concurrency(p, length)
    assert answer.binding == SWA
    assert answer.tokens_per_request["swa"] == window.per_request
    stats = replayed(p, input_len, output_len, answer.limits[FULL])
    assert answer.concurrent_requests < stats.peak_concurrency < answer.limits[FULL]
    assert stats.peak_swa_tokens_per_request <= swa_window_bound(128, page, 128) < window.per_request


@pytest.mark.parametrize("page", [1, 16])
@pytest.mark.parametrize(
    ("input_len", "output_len", "binding"),
    [(64, 64, STATE_SLOTS), (2_000, 48, STATE_SLOTS), (3_000, 1_096, FULL)],
)
def test_mamba_with_the_radix_cache_off(page: int, input_len: int, output_len: int, binding: str) -> None:
    """Qwen3-Next-80B-A3B, 6 GiB, ``--disable-radix-cache``: one state slot per running request (SGLang's ratio 1,
    and ``HybridReqToTokenPool.alloc`` takes one without the extra buffer), so short requests run as many as
    there are slots in both; at 4,096 tokens the full pool binds first."""
    serving = Serving(page_size=page, context_length=8_192, disable_radix_cache=True)
    p = plan("qwen3-next-80b-a3b-thinking", serving, memory="6GiB")
    answer = concurrency(p, input_len + output_len)
    assert answer.binding == binding
    assert p.sizing.state_slots_per_request == 1
    if binding == STATE_SLOTS:
        assert answer.concurrent_requests == p.counts["state_slots"]
    stats = replayed(p, input_len, output_len, answer.concurrent_requests)
    assert stats.peak_concurrency == answer.concurrent_requests
    assert stats.retractions == 0
    assert stats.free_state_slots_at_end == p.counts["state_slots"]


def test_mamba_extra_buffer_is_inert_with_the_radix_cache_off() -> None:
    """``--enable-mamba-extra-buffer --disable-radix-cache``: SGLang resolves the extra buffer off, its ratio is 1
    (``_calculate_mamba_ratio`` returns before the buffer's term) and the built request table takes no ping-pong
    slots (``mamba_extra_buffer_of``: the buffer needs the radix cache), so capacity's one slot per request is
    what the replay runs."""
    serving = Serving(page_size=16, context_length=8_192, disable_radix_cache=True, enable_mamba_extra_buffer=True)
    p = plan("qwen3-next-80b-a3b-thinking", serving, memory="6GiB")
    answer = concurrency(p, 128)
    assert (answer.concurrent_requests, answer.binding) == (p.counts["state_slots"], STATE_SLOTS)
    assert replayed(p, 64, 64, answer.concurrent_requests).peak_concurrency == answer.concurrent_requests
