"""Chunked prefill in the replay: a prompt prefilled ``chunked_prefill_size`` tokens a pass, one chunked request at
a time, its out-of-window SWA tokens freed between chunks (``kvpools_core.planning.replay._Engine._evict_chunked``)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from kvpools_core import Plan, Serving, plan
from kvpools_core.errors import ConfigError
from kvpools_core.planning.capacity import concurrency, token_limit
from kvpools_core.planning.replay import fixed_trace, replay

FULL = token_limit("full")
SWA = token_limit("swa")
WINDOW = 128  # gpt-oss-20b's sliding window
CHUNK = 1_024


def small_swa_pool(chunk: int | None, **fields: Any) -> Plan:
    """gpt-oss-20b with an SWA pool of a few thousand tokens beside a full pool of ~70k (1 GiB, page 16)."""
    serving = Serving(page_size=16, context_length=16_384, swa_full_tokens_ratio=0.05, chunked_prefill_size=chunk)
    return plan("gpt-oss-20b", attrs.evolve(serving, **fields), memory="1GiB")


def ceil_page(tokens: int, page: int = 16) -> int:
    return -(-tokens // page) * page


def test_a_prompt_longer_than_the_swa_pool_completes_in_chunks() -> None:
    """A prompt of more SWA tokens than the pool holds is served prefilled in chunks (each pass evicts what slid
    out of the window before allocating the next chunk), and refused whole: the whole prompt's SWA tokens are
    held until its first decode."""
    chunked = small_swa_pool(CHUNK)
    swa_tokens = chunked.counts["tokens"]["swa"]
    prompt = swa_tokens + 2_000
    assert prompt + 64 <= 16_384 and swa_tokens > CHUNK + WINDOW + 16
    stats = replay(chunked, fixed_trace(prompt, 64, 3))
    assert stats.completed == 3 and stats.retractions == 0
    assert stats.prefill_chunks == 3 * -(-prompt // CHUNK)
    # the full pool holds the whole prompt (and its output): one request's pages at its end, nothing evicted there
    assert stats.peak_tokens_held["full"] >= ceil_page(prompt + 64)
    assert stats.peak_tokens_held["swa"] < swa_tokens
    with pytest.raises(ConfigError, match="does not fit the plan's pools alone"):
        replay(small_swa_pool(None), fixed_trace(prompt, 64, 1))


@pytest.mark.parametrize(
    ("radix_cache_off", "overlap_off", "chunks_held"),
    [(False, False, 1), (True, True, 1), (True, False, 2)],
    ids=["radix", "chunk-cache", "chunk-cache-overlap"],
)
def test_swa_held_by_the_chunked_request_is_its_window_and_chunk(
    radix_cache_off: bool, overlap_off: bool, chunks_held: int
) -> None:
    """Between chunks the chunked request keeps only its window: the radix cache locks the trailing
    ``ceil_page(window)`` tokens of what it inserted, the chunk cache frees below ``pre_len - window`` (under the
    overlap schedule ``pre_len`` lags a chunk, the previous chunk still running).  So right after a chunk's
    allocation it holds its window plus the chunk (two with the chunk cache under overlap), never more than the
    window plus the chunks and a page; with 1,024-token chunks on 16-token pages the bound is reached exactly."""
    p = small_swa_pool(
        CHUNK, swa_full_tokens_ratio=0.2, disable_radix_cache=radix_cache_off, disable_overlap_schedule=overlap_off
    )
    prompt = 6 * CHUNK + 300
    stats = replay(p, fixed_trace(prompt, 32, 4))
    assert stats.completed == 4
    assert stats.peak_swa_tokens_chunked_request == ceil_page(WINDOW) + chunks_held * CHUNK
    assert stats.peak_swa_tokens_chunked_request <= WINDOW + chunks_held * CHUNK + 16


def test_whole_prompts_hold_their_swa_until_the_first_decode() -> None:
    """Without chunked prefill a prompt's SWA tokens are all held until its first decode: the SWA peak is at least
    a whole prompt, where chunked prefill keeps it to a window and a chunk beside the other requests."""
    prompt = 4 * CHUNK + 300
    whole = replay(small_swa_pool(None, swa_full_tokens_ratio=0.2), fixed_trace(prompt, 32, 4))
    chunked = replay(small_swa_pool(CHUNK, swa_full_tokens_ratio=0.2), fixed_trace(prompt, 32, 4))
    assert whole.prefill_chunks == 0 and whole.peak_tokens_held["swa"] >= ceil_page(prompt)
    assert chunked.prefill_chunks >= 4 * 5  # a last chunk's leftover budget starts the next prompt: more cuts
    assert chunked.peak_tokens_held["swa"] < ceil_page(prompt)


@pytest.mark.parametrize("radix_cache_off", [False, True])
@pytest.mark.parametrize(("input_len", "output_len"), [(3_000, 200), (2_200, 1_000)])
def test_capacity_is_the_guaranteed_worst_case_with_chunked_prefill(
    radix_cache_off: bool, input_len: int, output_len: int
) -> None:
    """gpt-oss-20b, ``--swa-full-tokens-ratio 0.08``, chunks of 1,024: prompts of two to three chunks, the SWA pool
    binding in capacity's answer.  The replay's peak is at least capacity's (``capacity <= replay < full-token
    limit``).  What separates them: capacity charges every request SGLang's per-request worst case (window +
    interval + page + the decode page outstanding under overlap) and, beside them, two whole chunks and a page
    (the chunk cache's rule under the overlap schedule, ``SWAChunkCapPoolConfigurator``) at all times; the replay
    holds ``swa_window_bound`` per decoding request, and one chunk beside the chunked request's window (two with
    the chunk cache under overlap) only while a prompt is being prefilled."""
    serving = Serving(
        page_size=16,
        context_length=4_096,
        swa_full_tokens_ratio=0.08,
        chunked_prefill_size=CHUNK,
        disable_radix_cache=radix_cache_off,
    )
    p = plan("gpt-oss-20b", serving, memory="1GiB")
    length = input_len + output_len
    answer = concurrency(p, length)
    assert answer.binding == SWA
    assert input_len > CHUNK
    stats = replay(p, fixed_trace(input_len, output_len, 2 * answer.limits[FULL] + 1))
    assert stats.completed == stats.requests and stats.prefill_chunks > 0
    assert answer.concurrent_requests <= stats.peak_concurrency < answer.limits[FULL]


@pytest.mark.parametrize(("page", "chunk"), [(1, 1_000), (1, 1_024), (16, 1_024), (64, 1_024)])
@pytest.mark.parametrize(("input_len", "output_len"), [(3_000, 500), (2_100, 50)])
def test_full_tokens_bind_exactly_with_chunked_prompts(page: int, chunk: int, input_len: int, output_len: int) -> None:
    """Llama-3.1-8B, prompts of two to three chunks: the full pool holds every chunked prompt whole, so the
    replay's peak is still capacity's ``T // pages(L)``, with each prompt cut into its chunks and no request
    retracted.  (A chunk that splits a page, 1,000 tokens at page 16, is refused, as SGLang refuses it.)"""
    p = plan("llama-3.1-8b", Serving(page_size=page, context_length=4_096, chunked_prefill_size=chunk), memory="2GiB")
    answer = concurrency(p, input_len + output_len)
    assert answer.binding == FULL
    stats = replay(p, fixed_trace(input_len, output_len, 2 * answer.concurrent_requests + 1))
    assert stats.completed == stats.requests and stats.retractions == 0
    assert stats.peak_concurrency == answer.concurrent_requests
    assert stats.prefill_chunks >= stats.requests * -(-input_len // chunk)
