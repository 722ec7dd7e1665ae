"""Capacity answers worked out by hand from a plan's counts: every number is an integer division shown here."""

from __future__ import annotations

import attrs
import pytest

from kvpools_core import Plan, Serving, plan
from kvpools_core.errors import ConfigError, InvalidValueError, UnsupportedCombinationError
from kvpools_core.planning.capacity import (
    CONTEXT_LIMIT,
    REQUEST_CAP,
    STATE_SLOTS,
    concurrency,
    engine_flags,
    limits_of,
    max_context,
    parse_context_len,
    state_slots_per_request,
)
from kvpools_core.values import TokenWindow


@pytest.fixture(scope="module")
def llama_sglang() -> Plan:
    """Llama-3.1-8B, bf16, page 16, 4 GiB, SGLang's accounting.

    Cell: 32 layers x 8 KV heads x (128 + 128) x 2 B = 131,072 B per token, so
    tokens = 4 x 2^30 // 131,072 = 32,768 (page aligned: 2,048 pages of 16);
    requests = clamp(int(32,768 / 131,072 x 512) = 128, 2048, 4096) = 2,048 (<= 32,768 // 2).
    """
    return plan("llama-3.1-8b", Serving(page_size=16, accounting="sglang"), memory="4GiB")


def test_llama_counts_are_the_hand_computed_ones(llama_sglang: Plan) -> None:
    assert llama_sglang.counts == {"tokens": {"full": 32_768}, "requests": 2_048, "state_slots": 0}


@pytest.mark.parametrize(
    ("context_len", "held", "expected"),
    [
        (1_000, 1_008, 32),  # ceil(1000 / 16) = 63 pages = 1,008 tokens; 32,768 // 1,008 = 32
        (1_024, 1_024, 32),  # 64 pages; 32,768 // 1,024 = 32
        (3_000, 3_008, 10),  # 188 pages; 32,768 // 3,008 = 10
        (16_385, 16_400, 1),  # 1,025 pages; 32,768 // 16,400 = 1
        (32_768, 32_768, 1),  # the whole pool
        (32_769, 32_784, 0),  # one page more than the pool
    ],
)
def test_llama_concurrency_by_hand(llama_sglang: Plan, context_len: int, held: int, expected: int) -> None:
    answer = concurrency(llama_sglang, context_len)
    assert answer.tokens_per_request == {"full": held}
    assert answer.concurrent_requests == expected
    assert answer.binding == "full tokens"
    assert answer.limits == {"full tokens": expected, REQUEST_CAP: 2_048}


def test_llama_short_requests_hit_the_request_cap(llama_sglang: Plan) -> None:
    """16-token requests: 32,768 // 16 = 2,048 = the request cap; the tokens are named (the cap derives from them)."""
    assert concurrency(llama_sglang, 16).concurrent_requests == 2_048
    assert concurrency(llama_sglang, 16).binding == "full tokens"
    # 1 token still takes a page: 2,048 by tokens, 2,048 by the cap
    assert concurrency(llama_sglang, 1).concurrent_requests == 2_048


def test_llama_beyond_the_context_length(llama_sglang: Plan) -> None:
    """The model's context is 131,072: a longer request does not run at all."""
    answer = concurrency(llama_sglang, 131_073)
    assert (answer.concurrent_requests, answer.binding) == (0, CONTEXT_LIMIT)


@pytest.mark.parametrize(
    ("requests", "context_len", "binding"),
    [
        (1, 32_768, "full tokens"),  # 32,768 // 1 = 32,768 (below the context length 131,072)
        (3, 10_912, "full tokens"),  # 32,768 // 3 = 10,922 -> 682 whole pages = 10,912
        (10, 3_264, "full tokens"),  # 32,768 // 10 = 3,276 -> 204 pages = 3,264
        (2_048, 16, "full tokens"),  # one page each
        (2_049, 0, "full tokens"),  # 32,768 // 2,049 = 15 < one page
    ],
)
def test_llama_max_context_by_hand(llama_sglang: Plan, requests: int, context_len: int, binding: str) -> None:
    answer = max_context(llama_sglang, requests)
    assert (answer.context_len, answer.binding) == (context_len, binding)


def test_llama_more_requests_than_the_cap(llama_sglang: Plan) -> None:
    """2,049 requests fail both on tokens (15 < a page) and on the request cap of 2,048."""
    answer = max_context(llama_sglang, 2_049)
    assert answer.limits[REQUEST_CAP] == 0


def test_llama_exact_accounting_uses_the_plans_tokens() -> None:
    """Exact accounting at 2 GiB, page 16, context 4,096: T = the plan's full tokens (page aligned, above 4,096).
    A request of 4,096 holds 256 pages, so T // 4,096 fit; one request reaches the context length itself;
    5 requests reach min(4,096, page_floor(T // 5))."""
    p = plan("llama-3.1-8b", Serving(page_size=16, context_length=4_096), memory="2GiB")
    tokens = p.counts["tokens"]["full"]
    assert tokens % 16 == 0 and tokens > 4_096
    assert concurrency(p, 4_096).concurrent_requests == tokens // 4_096
    assert concurrency(p, 4_097).binding == CONTEXT_LIMIT
    assert max_context(p, 1).context_len == 4_096
    assert max_context(p, 1).binding == CONTEXT_LIMIT
    assert max_context(p, 5).context_len == min(4_096, tokens // 5 // 16 * 16)


def test_engine_flags_by_hand() -> None:
    """10% headroom of 32,768 tokens: 29,491 -> 1,843 pages = 29,488 tokens; at 3,000 (188 pages = 3,008):
    29,488 // 3,008 = 9 requests (and 10 without headroom)."""
    p = plan("llama-3.1-8b", Serving(page_size=16, accounting="sglang"), memory="4GiB")
    flags = engine_flags(p, 3_000, 0.1)
    assert (flags.max_running_requests, flags.context_length, flags.binding) == (9, 3_000, "full tokens")
    assert flags.args() == ("--max-running-requests", "9", "--context-length", "3000")
    assert engine_flags(p, 3_000, 0).max_running_requests == 10


def test_an_engine_given_the_flags_keeps_the_headroom() -> None:
    """Exact accounting: re-planned with the flags, the request table shrinks (fewer rows, shorter rows), so the
    same budget holds at least the tokens it did, and the flagged requests leave 10% of them free."""
    p = plan("llama-3.1-8b", Serving(page_size=16), memory="4GiB")
    flags = engine_flags(p, 3_000, 0.1)
    assert flags.max_running_requests >= 1
    serving = Serving(
        page_size=16, max_running_requests=flags.max_running_requests, context_length=flags.context_length
    )
    again = plan("llama-3.1-8b", serving, memory="4GiB")
    tokens = again.counts["tokens"]["full"]
    assert tokens >= p.counts["tokens"]["full"]
    assert again.max_running_requests == flags.max_running_requests
    assert flags.max_running_requests * 3_008 <= 0.9 * tokens
    assert concurrency(again, 3_000).concurrent_requests >= flags.max_running_requests


def test_engine_flags_shorten_the_context_when_not_one_request_fits() -> None:
    """At 131,072 not one request fits 29,488 tokens: the flags promise the largest single-request context."""
    p = plan("llama-3.1-8b", Serving(page_size=16, accounting="sglang"), memory="4GiB")
    flags = engine_flags(p, 131_072, 0.1)
    assert (flags.max_running_requests, flags.context_length) == (1, 29_488)


def test_engine_flags_count_every_dp_worker() -> None:
    """SGLang divides --max-running-requests over the DP-attention workers: the flag is per worker x workers."""
    p = plan("llama-3.1-8b", Serving(page_size=16, tp_size=2, dp_size=2, enable_dp_attention=True), memory="4GiB")
    per_worker = engine_flags(p, 8_192, 0.1)
    limits = limits_of(p).scaled(0.9)
    assert per_worker.max_running_requests == 2 * (limits.tokens["full"] // 8_192)


def test_gemma_short_contexts_bind_on_the_window_pool() -> None:
    """Gemma-2-9B (window 4,096), page 16, 8 GiB: the SWA pool is 0.8 x the full pool, so while a request is
    inside the window it holds as many SWA slots as full ones, and the SWA pool binds first."""
    p = plan("gemma-2-9b", Serving(page_size=16), memory="8GiB")
    full, swa = p.counts["tokens"]["full"], p.counts["tokens"]["swa"]
    assert swa < full
    answer = concurrency(p, 2_048)
    assert answer.binding == "swa tokens"
    assert answer.limits == {"full tokens": full // 2_048, "swa tokens": swa // 2_048, REQUEST_CAP: 2_048}
    assert answer.concurrent_requests == swa // 2_048
    assert max_context(p, 10).context_len == swa // 10 // 16 * 16
    assert max_context(p, 10).binding == "swa tokens"


def test_gemma_requests_past_the_window_hold_sglangs_worst_case() -> None:
    """Past the window a request holds window 4,096 + eviction interval 128 x 1 draft token + page 16 + decode
    page 16 = 4,256 SWA slots; each of the 2 requests prefilled at once (overlap schedule) holds up to a chunk
    more — at 8,192: min(8,192 - 4,256, 8,192) = 3,936, so 8,192 — and a page stays reserved:
    n = 2 + (S - 16 - 2 x 8,192) // 4,256."""
    p = plan("gemma-2-9b", Serving(page_size=16), memory="8GiB")
    swa = p.counts["tokens"]["swa"]
    window = limits_of(p).windowed["swa"]
    assert (window.window, window.per_request, window.prefill_chunk) == (4_096, 4_256, 8_192)
    assert (window.prefills_in_flight, window.reserved) == (2, 16)
    answer = concurrency(p, 8_192)
    assert answer.tokens_per_request == {"full": 8_192, "swa": 4_256}
    assert swa - 16 >= 2 * 8_192
    assert answer.limits["swa tokens"] == 2 + (swa - 16 - 2 * 8_192) // 4_256


def test_mistral_all_swa_long_requests_cost_the_window() -> None:
    """Mistral-7B-v0.1 slides on every layer (window 4,096, page 1): past 4,096 + 128 + 1 + 1 = 4,226 a request
    costs the same whatever its length. S SWA tokens, 1 reserved: at 32,768 a request in prefill holds
    4,226 + a chunk of 8,192 = 12,418, so n = 2 + (S - 1 - 2 x 12,418) // 4,226 when two such fit, else
    (S - 1) // 12,418. One request reaches the whole context when 4,226 + 8,192 + 1 <= S; two reach
    4,226 + (S - 1 - 2 x 4,226) // 2 (each prefilling its own tail beyond 4,226)."""
    p = plan("mistral-7b-v0.1", Serving(), memory="2GiB")
    swa = p.counts["tokens"]["swa"]
    assert set(p.counts["tokens"]) == {"swa"}
    room = swa - 1
    expected = 2 + (room - 2 * 12_418) // 4_226 if room >= 2 * 12_418 else room // 12_418
    answer = concurrency(p, 32_768)
    assert (answer.concurrent_requests, answer.binding) == (expected, "swa tokens")
    assert 4_226 + 8_192 <= room < 2 * 4_226 + 2 * 8_192  # this budget: one prefill chunk fits, two do not
    assert max_context(p, 1).context_len == 32_768
    assert max_context(p, 1).binding == CONTEXT_LIMIT
    two = 4_226 + (room - 2 * 4_226) // 2
    assert max_context(p, 2).context_len == two
    assert concurrency(p, two).concurrent_requests == 2
    assert concurrency(p, two + 1).concurrent_requests == 1


def test_without_chunked_prefill_a_prompt_is_one_chunk() -> None:
    """Chunked prefill off: a request being prefilled holds its whole prompt in the window pool."""
    p = plan("mistral-7b-v0.1", Serving(chunked_prefill_size=None), memory="2GiB")
    room = p.counts["tokens"]["swa"] - 1
    assert limits_of(p).windowed["swa"].prefill_chunk is None
    # one request of the whole context is prefilled in one go: 32,768 slots, more than this pool holds
    assert room < 32_768
    assert concurrency(p, 32_768).concurrent_requests == 0
    assert max_context(p, 1).context_len == room


def test_a_decode_node_prefills_nothing_and_keeps_its_preallocated_slots() -> None:
    """On a decode node no chunk is prefilled; each of its 2 pre-allocated slots holds window + page
    = 4,112 SWA slots (SGLang's chunk cap on a decode node): n = (S - 2 x 4,112) // 4,256 past the window."""
    serving = Serving(page_size=16, disaggregation_mode="decode", disaggregation_decode_extra_slots=2)
    p = plan("gemma-2-9b", serving, memory="8GiB")
    window = limits_of(p).windowed["swa"]
    assert (window.prefills_in_flight, window.reserved) == (0, 8_224)
    swa = p.counts["tokens"]["swa"]
    assert concurrency(p, 8_192).limits["swa tokens"] == (swa - 8_224) // 4_256
    assert max_context(p, (swa - 8_224) // 4_256).limits["swa tokens"] == p.model.context_len


def test_gpt_oss_chunk_cap_admits_exactly_its_requests_in_the_window_pool() -> None:
    """SGLang's chunk cap sizes the SWA pool for --max-running-requests requests past the window, so inverting it
    gives back exactly that many (gpt-oss-20b, window 128, page 64, 64 requests, radix cache off)."""
    serving = Serving(page_size=64, max_running_requests=64, disable_radix_cache=True)
    p = plan("gpt-oss-20b", serving, memory="20GiB")
    window = limits_of(p).windowed["swa"]
    assert window.per_request == 128 + 128 + 64 + 64
    assert concurrency(p, 32_768).limits["swa tokens"] == 64 == p.max_running_requests
    assert max_context(p, 64).limits["swa tokens"] == p.model.context_len


@pytest.mark.parametrize("overlap_off", [False, True], ids=["spec-v2", "spec-v1"])
@pytest.mark.parametrize("topk", [1, 4])
def test_the_window_worst_case_is_the_one_sglangs_chunk_cap_sizes(overlap_off: bool, topk: int) -> None:
    """With EAGLE (8 draft tokens) the worst case per request adds 128 x 8 evicted-late tokens and the speculative
    decode allocation; SGLang's chunk cap (the swa plugin, oracle-tested) sizes the pool as
    ceil_align(32 x worst case + chunks x 8,192 + 64, 64) — the same worst case, and 32 requests fit back."""
    serving = Serving(
        page_size=64,
        max_running_requests=32,
        disable_radix_cache=True,
        speculative_algorithm="EAGLE",
        speculative_num_steps=7 if topk == 1 else 3,  # top-k 1: SGLang makes the draft tokens steps + 1 (issue 32)
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=8,
        speculative_draft_num_layers=1,
        disable_overlap_schedule=overlap_off,
        accounting="sglang",
    )
    p = plan("gpt-oss-20b", serving, memory="20GiB")
    window = limits_of(p).windowed["swa"]
    chunks = 1 if overlap_off else 2
    assert window.per_request > 128 + 128 * 8 + 64
    assert p.counts["tokens"]["swa"] == -(-(32 * window.per_request + chunks * 8_192 + 64) // 64) * 64
    assert concurrency(p, 65_536).limits["swa tokens"] == 32


def test_qwen3_next_binds_on_state_slots() -> None:
    """Qwen3-Next-80B-A3B, 60 GiB: 393 state slots, 3 per running request with the radix cache on
    (SGLang's ratio), so 393 // 3 = 131 requests — the cap SGLang derives from them; short requests bind there."""
    p = plan("qwen3-next-80b-a3b-thinking", Serving(), memory="60GiB")
    slots, full = p.counts["state_slots"], p.counts["tokens"]["full"]
    assert state_slots_per_request(p) == 3
    answer = concurrency(p, 4_096)
    assert (answer.concurrent_requests, answer.binding) == (slots // 3, STATE_SLOTS)
    assert answer.limits["full tokens"] == full // 4_096 > slots // 3
    # long requests bind on the tokens again
    assert concurrency(p, 262_144).binding == "full tokens"
    assert concurrency(p, 262_144).concurrent_requests == full // 262_144
    # more requests than the slots hold reach no context at all
    assert max_context(p, slots // 3 + 1).context_len == 0
    assert max_context(p, slots // 3 + 1).binding == STATE_SLOTS


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"disable_radix_cache": True}, 1),
        ({}, 3),
        ({"mamba_skip_decode_lock": True}, 3),
        ({"enable_mamba_extra_buffer": True}, 5),
        ({"enable_mamba_extra_buffer": True, "enable_mamba_extra_buffer_lazy": True}, 4),
        ({"enable_mamba_extra_buffer": True, "disable_overlap_schedule": True}, 4),
        ({"enable_mamba_extra_buffer": True, "mamba_skip_decode_lock": True}, 4),
    ],
)
def test_state_slots_per_request_is_sglangs_ratio(changes: dict[str, bool], expected: int) -> None:
    """The mamba plugin records SGLang's ``_calculate_mamba_ratio`` on the plan; capacity divides by it."""
    p = plan("qwen3-next-80b-a3b-thinking", attrs.evolve(Serving(), **changes), memory="60GiB")
    assert p.sizing.state_slots_per_request == state_slots_per_request(p) == expected


def test_a_windowed_space_is_whatever_the_plan_records() -> None:
    """Capacity names no plugin: the window terms come from ``Plan.windows``.  Gemma-2's plan without them has an
    ``swa`` space capacity cannot model (refused, naming it); any token space given a ``TokenWindow`` is modelled
    by the same inversion — here a made-up ``ring`` space of 10,000 tokens beside Llama's full tokens, a worst
    case of 100 + 28 + 16 + 16 = 160 per request, one prefill of up to 64 in flight and 16 reserved:
    past 160, n = 1 + (10,000 - 16 - 224) // 160 = 62."""
    gemma = plan("gemma-2-9b", Serving(page_size=16), memory="8GiB")
    bare = attrs.evolve(gemma, sizing=attrs.evolve(gemma.sizing, windows=()))
    with pytest.raises(UnsupportedCombinationError, match="'swa'"):
        concurrency(bare, 1_024)
    llama = plan("llama-3.1-8b", Serving(page_size=16, accounting="sglang"), memory="4GiB")
    ring = TokenWindow(
        token_space="ring",
        window=100,
        eviction_interval=28,
        draft_tokens=1,
        page_size=16,
        decode_alloc=16,
        prefill_chunk=64,
        prefills_in_flight=1,
        reserved=16,
    )
    sizing = attrs.evolve(llama.sizing, token_counts={"full": 32_768, "ring": 10_000}, windows=(ring,))
    ringed = attrs.evolve(llama, sizing=sizing)
    answer = concurrency(ringed, 1_024)
    assert answer.tokens_per_request == {"full": 1_024, "ring": 160}
    assert answer.limits["ring tokens"] == 1 + (10_000 - 16 - 224) // 160 == 62
    assert answer.limits["full tokens"] == 32
    assert concurrency(ringed, 160).limits["ring tokens"] == 10_000 // 160
    assert Plan.from_json(ringed.to_json()).windows == (ring,)


def test_a_window_must_name_a_counted_space() -> None:
    llama = plan("llama-3.1-8b", Serving(page_size=16, accounting="sglang"), memory="4GiB")
    gemma = plan("gemma-2-9b", Serving(page_size=16), memory="8GiB")
    with pytest.raises(InvalidValueError, match="windows"):
        attrs.evolve(llama.sizing, windows=gemma.windows)
    with pytest.raises(InvalidValueError, match="windows"):
        attrs.evolve(gemma.sizing, windows=gemma.windows * 2)


def test_a_space_neither_windowed_nor_compressed_is_refused() -> None:
    """DeepSeek-V4's plan records ratios for c4 / c128 and a window for swa; without the ratios c4 is refused."""
    p = plan("deepseek-v4-flash", Serving(page_size=256), memory="60GiB")
    assert concurrency(p, 1_024).concurrent_requests >= 1
    bare = attrs.evolve(p, sizing=attrs.evolve(p.sizing, compression={"c128": 128}))
    with pytest.raises(UnsupportedCombinationError, match=r"\['c4'\]"):
        concurrency(bare, 1_024)


@pytest.mark.parametrize(("text", "value"), [("32k", 32_768), ("1M", 1_048_576), ("8192", 8_192), (" 2K ", 2_048)])
def test_parse_context_len(text: str, value: int) -> None:
    assert parse_context_len(text) == value


@pytest.mark.parametrize("text", ["abc", "0", "1.5k", "-3", "1G", ""])
def test_parse_context_len_refuses(text: str) -> None:
    with pytest.raises(ConfigError, match="context"):
        parse_context_len(text)


def test_bad_arguments_are_errors(llama_sglang: Plan) -> None:
    for call in (lambda: concurrency(llama_sglang, 0), lambda: max_context(llama_sglang, 0)):
        with pytest.raises(ConfigError):
            call()
    with pytest.raises(ConfigError, match="headroom"):
        engine_flags(llama_sglang, 1_024, 1.0)
