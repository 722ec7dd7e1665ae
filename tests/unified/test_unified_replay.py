"""The unified replay (issue 31): a request trace through a unified-memory plan's own allocators achieves the
concurrency the closed form predicts, and lazy compaction trades page copies for holes.

Qwen3-Next-80B-A3B at TP 4, bf16 (12,288 B full entries, 19,316,736 B state entries; ``docs/unified-memory.md``)
with the radix cache's 3 state slots a request.  A request of 7,168 + 1,024 tokens at page 16 draws
512 x 16 x 12,288 + 3 x 19,316,736 = 158,613,504 B of the arena.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kvpools_core as kv
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.planning.replay import fixed_trace, uniform_trace
from kvpools_core.planning.unified import ARENA_BYTES, unified_concurrency
from kvpools_core.planning.unified_replay import replay_unified
from kvpools_core.values import Plan, Serving

QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"


def _plan(memory: str, *, lazy: bool = True, **serving: Any) -> Plan:
    serving = {"tp_size": 4, "page_size": 16, **serving}
    return kv.plan(
        QWEN3_NEXT,
        Serving(enable_unified_memory=True, disable_lazy_compaction=not lazy, **serving),
        memory=memory,
    )


@pytest.mark.parametrize("lazy", [True, False])
@pytest.mark.parametrize(
    ("memory", "prompt", "output", "binding"),
    [("3GiB", 7_168, 1_024, ARENA_BYTES), ("12GiB", 30_000, 200, ARENA_BYTES), ("2GiB", 3_000, 96, "request cap")],
)
def test_replay_achieves_the_predicted_concurrency(
    lazy: bool, memory: str, prompt: int, output: int, binding: str
) -> None:
    """Identical requests, twice as many as fit: the peak the allocators reach is the closed form's answer, with
    no refusal by an allocator the byte reservation let through and no retraction."""
    p = _plan(memory, lazy=lazy)
    predicted = unified_concurrency(p, prompt + output)
    assert predicted.binding == binding
    if prompt == 7_168:
        assert predicted.request_bytes == 158_613_504
        assert predicted.concurrent_requests == predicted.room_bytes // 158_613_504 == 20
    stats = replay_unified(p, fixed_trace(prompt, output, 2 * predicted.concurrent_requests + 3))
    assert stats.peak_concurrency == stats.predicted_concurrency == predicted.concurrent_requests
    assert stats.completed == stats.requests and stats.admissions == stats.requests
    assert stats.retractions == 0 and stats.allocator_refusals == 0
    assert stats.lazy_compaction is lazy


def test_lazy_holes_hide_bytes_eager_compaction_copies_pages() -> None:
    """A mixed trace, both modes: the reservation (bytes, not placement) makes the same decisions, so admissions,
    steps and peak are equal; eager compaction copies pages at every free and never hides bytes, lazy compaction
    copies none here and leaves the state END's holes hidden from ``available_size()`` (only
    ``schedulable_available_size()`` counts them)."""
    trace = uniform_trace(40, input_range=(500, 6_000), output_range=(100, 1_500), seed=1)
    lazy = replay_unified(_plan("3GiB", lazy=True), trace)
    eager = replay_unified(_plan("3GiB", lazy=False), trace)
    for stats in (lazy, eager):
        assert stats.completed == 40 and stats.retractions == 0 and stats.allocator_refusals == 0
    assert (lazy.steps, lazy.peak_concurrency, lazy.admissions) == (eager.steps, eager.peak_concurrency, 40)
    assert eager.page_moves > 0 and eager.max_hidden_tokens == 0 and eager.steps_with_hidden_tokens == 0
    assert lazy.page_moves == 0 and lazy.max_hidden_tokens > 0
    # free virtual ids are not bytes: the id space outruns the schedulable tokens in both modes
    assert lazy.max_free_ids_over_schedulable > 0 and eager.max_free_ids_over_schedulable > 0


def _swa_plan(lazy: bool) -> Plan:
    serving = Serving(enable_unified_memory=True, page_size=16, disable_lazy_compaction=not lazy)
    return kv.plan("gpt-oss-20b", serving, memory="2GiB")


@pytest.mark.parametrize("lazy", [True, False])
def test_the_swa_replay_achieves_the_predicted_concurrency(lazy: bool) -> None:
    """gpt-oss-20b, 2 GiB, page 16 (before issue 31's SWA replay: refused).  24,576 B full and SWA entries (12 layers
    x 8 heads x 64 x 2 B x K and V; ``test_ascend_carves_the_arena_as_sglangs_npu_does``); the SWA window's worst
    case is 128 + 128 x 1 + 16 + 16 = 288 tokens (``TokenWindow.per_request``).  A request of 100 + 1,900 tokens
    draws 125 x 16 x 24,576 + 18 x 16 x 24,576 = 56,229,888 B, and the 1,072,300,032 B room holds 19.  The replay
    reaches 19 with no allocator refusal and no retraction: without releasing the out-of-window SWA pages each
    request would hold 125 SWA pages, and the allocators would refuse long before."""
    p = _swa_plan(lazy)
    predicted = unified_concurrency(p, 2_000)
    assert (predicted.request_bytes, predicted.room_bytes) == (56_229_888, 1_072_300_032)
    assert (predicted.concurrent_requests, predicted.binding) == (19, ARENA_BYTES)
    stats = replay_unified(p, fixed_trace(100, 1_900, 41))
    assert stats.peak_concurrency == stats.predicted_concurrency == 19
    assert stats.completed == stats.admissions == 41
    assert stats.retractions == 0 and stats.allocator_refusals == 0
    assert (stats.page_moves == 0) is lazy


def test_a_whole_prompt_prefill_past_the_window_is_refused_until_decode_evicts() -> None:
    """Prompts longer than the window's 288 tokens: a whole-prompt prefill holds all 3,000 SWA tokens until the first
    decode step releases them (SGLang's chunk term ``prefills_in_flight x prefill_chunk``, which the closed form's
    per-request bytes leave out), so the allocators refuse a few admissions the byte reservation allows; they are
    admitted a step later and the peak is still the prediction (11)."""
    p = _swa_plan(True)
    predicted = unified_concurrency(p, 3_500)
    assert predicted.concurrent_requests == 1_072_300_032 // (219 * 16 * 24_576 + 18 * 16 * 24_576) == 11
    stats = replay_unified(p, fixed_trace(3_000, 500, 25))
    assert stats.peak_concurrency == 11 and stats.completed == 25 and stats.retractions == 0
    assert stats.allocator_refusals > 0


def test_replay_refuses_what_it_does_not_model() -> None:
    tri = kv.plan("inkling-defaults", Serving(enable_unified_memory=True), memory="40GiB")
    with pytest.raises(UnsupportedCombinationError, match="three-pool chain's floating middle"):
        replay_unified(tri, fixed_trace(100, 10, 2))
    static = kv.plan(QWEN3_NEXT, Serving(tp_size=4), memory="3GiB")
    with pytest.raises(UnsupportedCombinationError, match="--enable-unified-memory"):
        replay_unified(static, fixed_trace(100, 10, 2))
    with pytest.raises(ConfigError, match="more than its"):
        replay_unified(_plan("1GiB"), fixed_trace(100_000, 10, 1))
    with pytest.raises(ConfigError, match="no requests"):
        replay_unified(_plan("1GiB"), [])


def test_compare_lines_up_unified_memory_and_vllms_shared_block_pool() -> None:
    """``kvpools compare --enable-unified-memory``: per context, SGLang's static split, its unified arena and
    vLLM's shared block pool.  Qwen3-Next TP 4, 20 GiB: an 8k request draws 8,192 x 12,288 + 3 x 19,316,736 =
    158,613,504 B of the 21,455,519,744 B arena (920,754 static tokens x 12,288 + 525 state slots; see
    test_unified_plan), whose room is 1,746,054 full slots x 12,288 B less the one-state-entry sink
    (19,316,736 B) = 21,436,194,816 B: 135 requests; the static split's 920,754 tokens hold 112
    (920,754 // 8,192); vLLM's 5,460 usable 320-token blocks hold 156 requests of 35 blocks."""
    from click.testing import CliRunner

    import kvpools_core.cli as cli

    result = CliRunner().invoke(
        cli.main,
        [
            *("compare", QWEN3_NEXT, "--tp-size", "4", "--memory", "20GiB", "--context", "8k,32k"),
            *("--enable-unified-memory", "--json"),
        ],
    )
    assert result.exit_code == 0, result.output
    import json

    data = json.loads(result.stdout)["unified"]
    assert data["arena"]["bytes"] == 21_455_519_744 and data["max_total_num_tokens"] == 1_744_482
    row = data["contexts"][0]
    assert row["sglang_unified_request_bytes"] == 158_613_504
    assert (row["sglang_static"], row["sglang_unified"], row["vllm_requests"]) == (112, 135, 156)
    assert row["vllm_blocks_per_request"] == 35
    assert [r["sglang_unified"] for r in data["contexts"]] == [135, 46]
    text = CliRunner().invoke(
        cli.main, ["compare", "gemma-3-27b-it", "--memory", "20GiB", "--context", "8k", "--enable-unified-memory"]
    )
    assert text.exit_code == 1 and "this model is neither" in text.stderr and "Traceback" not in text.output


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.integers(1, 40_000),
    output=st.integers(1, 48),
    page=st.sampled_from([1, 16, 64]),
    lazy=st.booleans(),
    memory=st.sampled_from(["1GiB", "2GiB", "5GiB"]),
)
def test_any_fixed_trace_reaches_the_prediction(prompt: int, output: int, page: int, lazy: bool, memory: str) -> None:
    """For any identical requests the arena can hold, the replay's peak is the closed form's answer (whichever
    limit binds: the arena's bytes, an END's index space or the request cap) and every request completes."""
    p = _plan(memory, lazy=lazy, page_size=page)
    predicted = unified_concurrency(p, prompt + output)
    assume(predicted.concurrent_requests >= 1)
    stats = replay_unified(p, fixed_trace(prompt, output, predicted.concurrent_requests + 2))
    assert stats.peak_concurrency == predicted.concurrent_requests, (predicted.binding, stats)
    assert stats.completed == stats.requests and stats.retractions == 0


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.integers(1, 128),
    output=st.integers(1, 700),
    page=st.sampled_from([1, 16, 64]),
    lazy=st.booleans(),
    memory=st.sampled_from(["1GiB", "2GiB"]),
)
def test_any_swa_trace_within_the_window_reaches_the_prediction(
    prompt: int, output: int, page: int, lazy: bool, memory: str
) -> None:
    """Prompts within gpt-oss-20b's 128-token window (so a prefill never holds more SWA pages than the reservation):
    for any identical requests the hybrid-SWA replay's peak is the closed form's answer, with no allocator refusal
    and no retraction."""
    serving = Serving(enable_unified_memory=True, page_size=page, disable_lazy_compaction=not lazy)
    p = kv.plan("gpt-oss-20b", serving, memory=memory)
    predicted = unified_concurrency(p, prompt + output)
    assume(1 <= predicted.concurrent_requests <= 400)
    stats = replay_unified(p, fixed_trace(prompt, output, predicted.concurrent_requests + 2))
    assert stats.peak_concurrency == predicted.concurrent_requests, (predicted.binding, stats)
    assert stats.completed == stats.requests and stats.retractions == 0 and stats.allocator_refusals == 0
