"""Sizing two token spaces: hand-computed numbers, SGLang's real logs, and the exact accounting's promises."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from hypothesis import assume, event, given
from hypothesis import strategies as st
from kvpools_plugins.swa.pool import SWAKVPool
from kvpools_plugins.swa.sizing import spec_decode_alloc_len_per_request

from kvpools_core.building import build
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.parts.sizing import alloc_len_per_decode
from kvpools_core.pipeline import plan
from kvpools_core.pools.kv import LayerGeometry
from kvpools_core.pools.quant import codec_for
from kvpools_core.values import Plan, Serving, TokenWindow

from .support import CHECKS, GiB, aimed_budgets, hybrid_configs, parse, swa_servings

MiB = 1 << 20


def test_gpt_oss_20b_exact_by_hand() -> None:
    """gpt-oss-20b, 20 GiB, page 1, ratio 0.8, exact accounting.

    Per token: 12 full layers x 8 heads x (64 + 64) x 2 B = 24,576 B; the same for the 12 SWA layers.
    Full tokens F = 460,932 and SWA tokens S = int(0.8 F) = 368,745:
      kv_full      (F + 1) x 24,576               = 11,327,889,408
      kv_swa       (S + 1) x 24,576               =  9,062,301,696
      full_to_swa  (F + 1 + 1) x 8                 =      3,687,472
      req_to_token (2,048 + 1) x (131,072 + 4) x 4 =  1,074,298,896
      allocator    8 F                             =      3,687,456
      swa_allocator 8 S                            =      2,949,960
    total 21,474,814,888 of 21,474,836,480: 21,592 B left, less than one more full token (24,576 B alone)."""
    p = plan("gpt-oss-20b", Serving(), memory=20 * GiB)
    assert (p.max_total_num_tokens, p.sizing.sglang_config["swa_max_total_num_tokens"]) == (460932, 368745)
    assert {pool.name: pool.bytes for pool in p.pools} == {
        "kv_full": 11_327_889_408,
        "kv_swa": 9_062_301_696,
        "full_to_swa": 3_687_472,
        "req_to_token": 1_074_298_896,
        "allocator": 3_687_456,
        "swa_allocator": 2_949_960,
    }
    assert p.planned_bytes == 21_474_814_888 <= 20 * GiB
    assert p.cell.sglang_bytes_per_token == 24576 + 0.8 * 2048 * 12  # 44,236.8
    assert p.sizing.sglang_estimate_bytes == 460932 * 24576 + 368745 * 24576


def test_gpt_oss_20b_sglang_by_hand() -> None:
    """SGLang: 30 GiB // 44,236.8 = 728,177 full tokens; SWA int(728,177 x 0.8) = 582,541;
    requests clamp(int(728,177 / 131,072 x 512), 2048, 4096) = 2,844."""
    p = plan("gpt-oss-20b", Serving(accounting="sglang"), memory=30 * GiB)
    assert dict(p.sizing.sglang_config) == {
        "max_total_num_tokens": 728177,
        "max_running_requests": 2844,
        "full_max_total_num_tokens": 728177,
        "swa_max_total_num_tokens": 582541,
    }


def test_mimo_v2_flash_real_logs_tp4() -> None:
    """SGLang's logs of MiMo-V2-Flash at TP 4 (bf16 KV), reproduced from kvpools' per-token bytes.

    Per SWA layer: 8 KV heads / TP 4 = 2 heads: K 2 x 192 x 2 B = 768 B, V 2 x 128 x 2 B = 512 B per token;
    per full layer: 4 KV heads / TP 4 = 1 head: K 384 B, V 256 B.
    Log 1 (page 64): SWA pool of 300,288 tokens, K 8.38 GiB, V 5.59 GiB:
      39 layers x (300,288 + 64) rows x 768 B = 8,996,143,104 B = 8.38 GiB; x 512 B = 5.59 GiB.
    Log 2 (B200): 1,496,958 tokens in each pool, SWA K 41.76 / V 27.84 GiB, full K 4.82 / V 3.21 GiB."""
    model = parse_preset("mimo-v2-flash")
    cell = plan(model, Serving(tp_size=4, page_size=64), memory=60 * GiB).cell
    parts = {part.name: part.bytes_per_token for part in cell.parts}
    assert parts == {"full_k": 9 * 384, "full_v": 9 * 256, "swa_k": 39 * 768, "swa_v": 39 * 512}

    def kv_gib(size: int, size_swa: int, page: int) -> tuple[float, float, float, float]:
        full = {i: LayerGeometry(1, 192, 128) for i in range(9)}
        swa = {i: LayerGeometry(2, 192, 128) for i in range(9, 48)}
        codec = codec_for(resolve_kv_dtype("bf16", "bfloat16"))
        pool = SWAKVPool(
            size=size,
            size_swa=size_swa,
            page_size=page,
            full_layers=full,
            swa_layers=swa,
            codec=codec,
            device="meta",
            model_dtype=torch.bfloat16,
        )
        assert pool.full_kv_pool is not None
        fk, fv = pool.full_kv_pool.get_kv_size_bytes()
        sk, sv = pool.swa_kv_pool.get_kv_size_bytes()
        return tuple(round(b / GiB, 2) for b in (sk, sv, fk, fv))

    assert kv_gib(300_288, 300_288, 64)[:2] == (8.38, 5.59)
    assert kv_gib(1_496_958, 1_496_958, 1) == (41.76, 27.84, 4.82, 3.21)


def parse_preset(name: str) -> Any:
    from .support import preset_config

    return attrs.evolve(parse(preset_config(name), f"preset:{name}"), name=name)


def test_all_swa_has_one_pool_and_no_mapping() -> None:
    p = plan("mistral-7b-v0.1", Serving(page_size=16), memory=20 * GiB)
    assert [pool.name for pool in p.pools] == ["kv_swa", "req_to_token", "allocator"]
    assert p.sizing.sglang_config["full_max_total_num_tokens"] == 0
    assert p.max_total_num_tokens == p.sizing.sglang_config["swa_max_total_num_tokens"]
    assert any("all 32 layers slide" in note for note in p.sizing.notes)


def test_draft_pool_follows_max_total_tokens() -> None:
    """EAGLE on gpt-oss-20b: one draft layer of full geometry (8 x 128 x 2 = 2,048 B/token), (F + page) rows;
    SGLang's cell adds it to the full term: 2,048 x (12 + 1) + 0.8 x 2,048 x 12."""
    serving = Serving(page_size=16, speculative_algorithm="EAGLE", speculative_draft_num_layers=1)
    p = plan("gpt-oss-20b", serving, memory=20 * GiB)
    draft = p.pool("draft_kv")
    assert (draft.slots, draft.padding_slots, draft.bytes_per_slot) == (p.max_total_num_tokens, 16, 2048)
    assert p.cell.sglang_bytes_per_token == 2048 * 13 + 0.8 * 2048 * 12
    dflash = plan(
        "gpt-oss-20b",
        attrs.evolve(serving, speculative_algorithm="DFLASH", speculative_num_draft_tokens=16),
        memory=20 * GiB,
    )
    assert not dflash.pool("draft_kv").sglang_charged  # SGLang's SWA configurator charges no DFLASH draft
    assert dflash.cell.sglang_bytes_per_token == 2048 * 12 + 0.8 * 2048 * 12


def test_chunk_cap_exact_keeps_swa_within_full() -> None:
    """Under the chunk cap the exact plan sizes the SWA pool min(cap, full): an SWA slot pairs a live full slot."""
    serving = Serving(page_size=64, max_running_requests=64, disable_radix_cache=True)
    big = plan("gpt-oss-120b", serving, memory=60 * GiB)
    assert big.sizing.sglang_config["swa_max_total_num_tokens"] == 41024  # the cap (see test_swa_oracle)
    small = plan("gpt-oss-120b", serving, memory=2 * GiB)
    config = small.sizing.sglang_config
    assert config["swa_max_total_num_tokens"] == config["full_max_total_num_tokens"] < 41024
    assert small.planned_bytes <= 2 * GiB


def test_spec_decode_alloc_len_matches_sglangs_test() -> None:
    """SGLang's test: page 4, 3 steps, topk 2, 5 draft tokens → max(ceil_align(3 + 4, 4) x 2, ceil_align(5, 4)) = 16."""
    serving = Serving(
        page_size=4,
        speculative_algorithm="EAGLE",
        speculative_draft_num_layers=1,
        speculative_num_steps=3,
        speculative_eagle_topk=2,
        speculative_num_draft_tokens=5,
    )
    assert spec_decode_alloc_len_per_request(serving) == 16


def test_the_plan_records_sglangs_window_terms() -> None:
    """gpt-oss-120b, page 64, 64 requests, radix cache off: ``SWAChunkCapPoolConfigurator.__init__``
    (``002_50706b73e02ffb67.txt`` lines 427-458) adds window 128 (line 427) + max(1, interval 128) x 1 draft
    token (428-429) + page 64 (435) + decode page 64 (436-437) = 384 per request (445), and 2 chunks of 8,192 in
    flight + page 64 (454-458): 64 x 384 + 2 x 8,192 + 64 = 41,024, the oracle-tested cap.  The plan records
    those very terms, and its SWA pool is their sum."""
    serving = Serving(page_size=64, max_running_requests=64, disable_radix_cache=True)
    p = plan("gpt-oss-120b", serving, memory=60 * GiB)
    (window,) = p.windows
    assert window == TokenWindow(
        token_space="swa",
        window=128,
        eviction_interval=128,
        draft_tokens=1,
        page_size=64,
        decode_alloc=64,
        prefill_chunk=8_192,
        prefills_in_flight=2,
        reserved=64,
    )
    assert window.per_request == 128 + 128 * 1 + 64 + 64 == 384
    cap = 64 * window.per_request + window.prefills_in_flight * 8_192 + window.reserved
    assert cap == 41_024 == p.counts["tokens"]["swa"]
    assert p.sizing.window("swa") == window and p.sizing.window("full") is None
    assert Plan.from_json(p.to_json()) == p


@pytest.mark.parametrize(
    ("changes", "decode_alloc", "prefills", "reserved"),
    [
        ({}, 16, 2, 16),  # a page decoded, 2 chunks with the overlap schedule, a page reserved
        ({"disable_overlap_schedule": True}, 16, 1, 16),  # one chunk without it (line 454)
        # a decode node prefills nothing and pre-allocates 3 slots of window + page (lines 448-452)
        ({"disaggregation_mode": "decode", "disaggregation_decode_extra_slots": 3}, 16, 0, 3 * (128 + 16)),
        # spec-v1 (overlap off): spec_decode_alloc_len_per_request, max(ceil16(3 + 16) x 2, ceil16(8)) = 64
        (
            {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 2, "disable_overlap_schedule": True},
            64,
            1,
            16,
        ),
        # spec-v2: 2 x get_alloc_len_per_decode (steps 7: top-k 1 makes SGLang's draft tokens steps + 1 = 8)
        ({"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1, "speculative_num_steps": 7}, -1, 2, 16),
    ],
    ids=["plain", "no-overlap", "decode-node", "spec-v1", "spec-v2"],
)
def test_every_swa_plan_records_the_window_terms(
    changes: dict[str, Any], decode_alloc: int, prefills: int, reserved: int
) -> None:
    """Whether or not the chunk cap sizes the pool (here the ratio does), the plan records SGLang's terms: they are
    the engine's eviction, read by ``kvpools capacity``; the draft tokens multiply the eviction interval."""
    speculative = {"speculative_num_steps": 3, "speculative_num_draft_tokens": 8, "speculative_draft_num_layers": 1}
    serving = attrs.evolve(
        Serving(page_size=16), **{**(speculative if "speculative_algorithm" in changes else {}), **changes}
    )
    p = plan("gpt-oss-20b", serving, memory=8 * GiB)
    (window,) = p.windows
    draft_tokens = 8 if serving.speculative else 1
    expected_decode = 2 * alloc_len_per_decode(serving) if decode_alloc < 0 else decode_alloc
    assert (window.window, window.eviction_interval, window.draft_tokens, window.page_size) == (
        128,
        128,
        draft_tokens,
        16,
    )
    assert (window.decode_alloc, window.prefills_in_flight, window.reserved) == (expected_decode, prefills, reserved)
    assert window.per_request == 128 + 128 * draft_tokens + 16 + expected_decode


def test_an_all_swa_model_records_its_window() -> None:
    """Mistral-7B-v0.1 slides on every layer: its one token space is windowed (window 4,096, page 1)."""
    p = plan("mistral-7b-v0.1", Serving(), memory=2 * GiB)
    assert [(w.token_space, w.window, w.per_request) for w in p.windows] == [("swa", 4_096, 4_096 + 128 + 1 + 1)]


def test_swa_pool_rounding_to_nothing_is_refused() -> None:
    with pytest.raises(InsufficientMemoryError, match="SWA pool"):
        plan("gpt-oss-20b", Serving(page_size=64, swa_full_tokens_ratio=0.1, accounting="sglang"), memory=3 * MiB)


def test_dcp_is_rejected_before_sizing() -> None:
    with pytest.raises(UnsupportedCombinationError, match="dcp_size 2"):
        plan("gpt-oss-20b", Serving(tp_size=2, dcp_size=2), memory=20 * GiB)


def test_sglang_constraint_path_swa_above_full_still_builds() -> None:
    """SGLang's chunk-cap constraint path keeps min(cap, max_total_tokens) unaligned SWA tokens (1,000 > 960 full
    tokens at page 64); the pool has 1,000 + 64 rows and the SWA allocator pages 960 of them, as SGLang's."""
    serving = Serving(
        page_size=64, max_running_requests=64, disable_radix_cache=True, max_total_tokens=1000, accounting="sglang"
    )
    p = plan("gpt-oss-120b", serving, memory=60 * GiB)
    assert (
        p.sizing.sglang_config["full_max_total_num_tokens"],
        p.sizing.sglang_config["swa_max_total_num_tokens"],
    ) == (960, 1000)
    pools = build(p, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools}
    assert pools.allocator.size_swa == 960


@st.composite
def exact_cases(draw: st.DrawFn) -> tuple[dict[str, Any], Serving, int]:
    config = draw(hybrid_configs())
    serving = draw(swa_servings())
    layers = config["num_hidden_layers"]
    pp = draw(st.sampled_from((1, 1, 2, 3)))
    if pp > layers:
        pp = 1
    serving = attrs.evolve(serving, accounting="exact", pp_size=pp, pp_rank=draw(st.integers(0, pp - 1)))
    return config, serving, draw(aimed_budgets(config))


@CHECKS
@given(case=exact_cases())
def test_exact_plans_fit_and_build_exactly(case: tuple[dict[str, Any], Serving, int]) -> None:
    """planned <= budget; the meta build allocates exactly the planned bytes per pool; one more page would not fit
    (unless --max-total-tokens or the pipeline's smallest stage stopped the plan)."""
    config, serving, memory = case
    model = parse(config)
    try:
        p = plan(model, serving, memory=memory)
    except InsufficientMemoryError:
        event("not enough memory")
        return
    assert p.planned_bytes <= memory
    pools = build(p, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools}
    assert pools.allocated_bytes == p.planned_bytes
    config_ = p.sizing.sglang_config
    # SWA tokens are int(full x ratio) page aligned (a ratio above 1 makes them more than full), or on SGLang's
    # chunk-cap constraint path min(cap, --max-total-tokens), which may exceed the page-aligned full tokens
    full = config_["full_max_total_num_tokens"]
    ceiling = max(
        int(full * serving.swa_full_tokens_ratio), full, p.max_total_num_tokens, serving.max_total_tokens or 0
    )
    assert config_["swa_max_total_num_tokens"] <= ceiling
    stopped = serving.max_total_tokens is not None or serving.pp_size > 1
    if not stopped:
        from kvpools_core.cli.build_report import explain_unused_budget

        reasons = explain_unused_budget(p)
        assert not any("for a reason of its own" in r for r in reasons), reasons
    event("planned, " + ("all-SWA" if config_["full_max_total_num_tokens"] == 0 else "hybrid"))


@CHECKS
@given(case=exact_cases())
def test_sglang_plans_build_what_they_plan(case: tuple[dict[str, Any], Serving, int]) -> None:
    config, serving, memory = case
    assume(serving.pp_size == 1)
    serving = attrs.evolve(serving, accounting="sglang")
    try:
        p = plan(parse(config), serving, memory=memory)
    except InsufficientMemoryError:
        return
    pools = build(p, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools}
