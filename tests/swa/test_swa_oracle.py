"""kvpools ``--accounting sglang`` against SGLang's own SWA sizing code (the oracle), token-exact.

Every case plans with kvpools and runs SGLang's ``HybridSWAPoolConfigurator`` /
``SWAChunkCapPoolConfigurator`` (through ``kv_cache_configurator.py``'s
profiling, token constraints and ``resolve_max_num_reqs``) on the same
inputs; they must agree on ``max_total_num_tokens``, ``max_running_requests``,
``full_max_total_num_tokens``, ``swa_max_total_num_tokens`` and the cell
size, warn alike, and fail together (``support.compare_swa``).  The cases are
the issue's Checks list, then hypothesis-generated hybrid models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvpools_core.errors import InsufficientMemoryError
from kvpools_core.pipeline import plan
from kvpools_core.values import Serving
from tests.draft_shape import as_sglang_runs
from tests.oracle.locate import require_oracle

from .support import (
    CHECKS,
    GiB,
    aimed_budgets,
    compare_swa,
    hybrid_configs,
    oracle_model,
    parse,
    preset_config,
    sglang_hybrid_swa,
    swa_servings,
    write_config,
)

require_oracle()

pytestmark = pytest.mark.oracle

EAGLE: dict[str, Any] = {
    "speculative_algorithm": "EAGLE",
    "speculative_draft_num_layers": 1,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 4,
    "speculative_num_draft_tokens": 8,
}
CHUNK_CAP: dict[str, Any] = {"max_running_requests": 64, "disable_radix_cache": True}


def check(preset: str, serving: Serving, memory: int) -> tuple[int, ...] | None:
    """Compare one preset case; the agreed (total, requests, full, SWA) tokens, or None when both fail."""
    return compare_swa(preset, oracle_model(preset_config(preset)), serving, memory).fields


@pytest.mark.parametrize("ratio", (0.8, 0.25, 1.5, 4.0))
@pytest.mark.parametrize("preset", ("gpt-oss-20b", "gpt-oss-120b"))
def test_gpt_oss_ratio_at_page_16(preset: str, ratio: float) -> None:
    for memory in (3 * GiB + 12345, 40 * GiB, 60 * GiB, 140 * GiB):
        fields = check(preset, Serving(page_size=16, swa_full_tokens_ratio=ratio), memory)
        assert fields is not None
        _total, _requests, full, swa = fields
        assert swa == int(full * ratio) // 16 * 16


def test_gpt_oss_120b_the_numbers() -> None:
    """60 GiB, page 16, ratio 0.8: cell = 18 x 2048 + 0.8 x 2048 x 18 = 66355.2 B per full token;
    64424509440 // 66355.2 = 970904 → 970896 (page 16); SWA int(970896 x 0.8) = 776716 → 776704."""
    assert check("gpt-oss-120b", Serving(page_size=16), 60 * GiB) == (970896, 3792, 970896, 776704)


def test_llama_4_maverick_chunked_local_attention() -> None:
    """Llama-4 Maverick (``llama-4-maverick``): 36 chunked-local layers in the SWA pool and 12 full ones (SGLang's
    fixed split), 8 KV heads of 128: 12 x 2048 x 2 = 49 152 B a full token, 36 x 4096 = 147 456 B an SWA token."""
    for page, ratio in ((1, 0.8), (64, 0.8), (16, 0.25)):
        for memory in (20 * GiB, 60 * GiB):
            fields = check("llama-4-maverick", Serving(page_size=page, swa_full_tokens_ratio=ratio), memory)
            assert fields is not None
    model = plan("llama-4-maverick", memory="40GiB").model
    assert [layer.index for layer in model.layers if layer.sliding_window] == [i for i in range(48) if (i + 1) % 4]
    assert {layer.sliding_window for layer in model.layers if layer.sliding_window} == {8192}


@pytest.mark.parametrize("page", (1, 64))
@pytest.mark.parametrize("kv", ("auto", "fp8_e4m3"))
def test_mimo_v2_flash_at_tp4_asymmetric(page: int, kv: str) -> None:
    """Full layers: 4 KV heads (1 per TP-4 rank) x (192 + 128); SWA layers: 8 heads (2 per rank) x (192 + 128)."""
    for memory in (10 * GiB, 60 * GiB, 150 * GiB):
        check("mimo-v2-flash", Serving(tp_size=4, page_size=page, kv_cache_dtype=kv), memory)


def test_mimo_v2_flash_at_tp4_the_numbers() -> None:
    """cell = 1 x 320 x 2 x 9 + 0.8 x 2 x 320 x 2 x 39 = 5760 + 39936 = 45696 B per full token;
    60 GiB // 45696 = 1409836 → 1409792 (page 64); SWA int(1409792 x 0.8) = 1127833 → 1127808."""
    assert check("mimo-v2-flash", Serving(tp_size=4, page_size=64), 60 * GiB) == (1409792, 2753, 1409792, 1127808)


@pytest.mark.parametrize("algorithm", ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "DFLASH", "NGRAM"))
def test_hybrid_swa_with_drafts(algorithm: str) -> None:
    """EAGLE-family drafts join the full term (full x (full + draft layers)); DFLASH and NGRAM are not charged."""
    serving = Serving(page_size=16, **as_sglang_runs({**EAGLE, "speculative_algorithm": algorithm}))
    for preset in ("gpt-oss-20b", "mimo-v2-flash"):
        for memory in (7 * GiB, 50 * GiB):
            check(preset, serving, memory)


def test_user_cap_and_constraint_path() -> None:
    """A cap below the profile re-solves through ``calculate_pool_sizes_from_max_tokens``; above it, SGLang warns."""
    for cap in (1, 16, 100, 1000, 123457, 10**9):
        for preset, page in (("gpt-oss-20b", 1), ("gpt-oss-120b", 16), ("mistral-7b-v0.1", 64)):
            check(preset, Serving(page_size=page, max_total_tokens=cap), 30 * GiB)
    assert check("gpt-oss-20b", Serving(max_total_tokens=100000), 30 * GiB) == (100000, 2048, 100000, 80000)


def test_stock_sglang_serves_mistral_and_gemma_2_3_with_one_dense_pool() -> None:
    """SGLang 0.5.23 builds no hybrid SWA pools for Mistral (``MistralForCausalLM`` is not in
    ``is_hybrid_swa_model``, ``configs/model_config.py`` lines 2651-2696) nor Gemma-2/3 (``gemma2_gemma3.py``
    line 26 declares ``disable_hybrid_swa_memory``; lines 1215-1218 then make ``is_hybrid_swa`` false): every layer
    keeps every token.  Mistral-7B: 32 layers x 8 heads x (128 + 128) x 2 B = 131072 B/token, 20 GiB // 131072 =
    163840 tokens, clamp(int(163840 / 32768 x 512), 2048, 4096) = 2560 requests, no full / SWA split; the ratio
    changes nothing."""
    for page in (1, 16, 64):
        for ratio in (0.8, 0.25):
            for memory in (GiB, 20 * GiB, 75 * GiB + 3):
                fields = check("mistral-7b-v0.1", Serving(page_size=page, swa_full_tokens_ratio=ratio), memory)
                assert fields is not None and fields[2:] == (0, 0)
    assert check("mistral-7b-v0.1", Serving(), 20 * GiB) == (163840, 2560, 0, 0)
    check("mistral-7b-v0.1", Serving(**EAGLE), 20 * GiB)
    # Gemma-3-12B: 48 layers x 8 heads x (256 + 256) x 2 B = 393216 B/token; 20 GiB // 393216 = 54613
    assert check("gemma-3-12b-it", Serving(), 20 * GiB) == (54613, 2048, 0, 0)
    for preset in ("gemma-2-9b", "gemma-3-27b-it"):
        check(preset, Serving(page_size=64, tp_size=2), 20 * GiB)


def test_all_swa_mistral_opted_into_hybrid_pools(tmp_path: Path) -> None:
    """A config with ``is_hybrid_swa: true`` opts in (``configs/model_config.py`` lines 2693-2696): no full layer,
    one SWA pool, tokens = budget // (8 x 256 x 2 x 32 = 131072), no ratio."""
    config = {**preset_config("mistral-7b-v0.1"), "is_hybrid_swa": True}
    path = write_config(tmp_path, config)
    oracle = oracle_model(config)
    for page in (1, 16, 64):
        for ratio in (0.8, 0.25):
            for memory in (GiB, 20 * GiB, 75 * GiB + 3):
                fields = compare_swa(path, oracle, Serving(page_size=page, swa_full_tokens_ratio=ratio), memory).fields
                assert fields is not None and fields[2] == 0 and fields[0] == fields[3]
    assert compare_swa(path, oracle, Serving(), 20 * GiB).fields == (163840, 2560, 0, 163840)
    compare_swa(path, oracle, Serving(**EAGLE), 20 * GiB)


@pytest.mark.parametrize("page", (1, 64))
def test_chunk_cap(page: int) -> None:
    for memory in (3 * GiB, 60 * GiB):
        check("gpt-oss-120b", Serving(page_size=page, **CHUNK_CAP), memory)
        check("mimo-v2-flash", Serving(page_size=page, tp_size=4, **CHUNK_CAP), memory)


def test_chunk_cap_the_numbers() -> None:
    """page 64, 64 requests: (128 window + 128 x 1 + 64 + 64 decode) x 64 + 2 x 8192 + 64 = 41024 SWA tokens;
    full = (60 GiB - 41024 x 2048 x 18) // (2048 x 18) = 1706598 → 1706560."""
    assert check("gpt-oss-120b", Serving(page_size=64, **CHUNK_CAP), 60 * GiB) == (1706560, 64, 1706560, 41024)


def test_chunk_cap_variants() -> None:
    """Overlap off (one chunk in flight), a decode node (extra slots instead of chunks), EAGLE spec-v1
    (overlap off) and spec-v2 (overlap on), another eviction interval, DP attention, a user cap."""
    variants: list[dict[str, Any]] = [
        {"disable_overlap_schedule": True},
        {"disaggregation_mode": "decode", "disaggregation_decode_extra_slots": 32},
        {"disaggregation_mode": "decode"},
        {"disaggregation_mode": "prefill"},
        {**EAGLE, "disable_overlap_schedule": True},
        {**EAGLE},
        as_sglang_runs({**EAGLE, "speculative_eagle_topk": 1}),  # SGLang: draft tokens steps + 1 = 4
        {"swa_eviction_interval": 16},
        {"swa_eviction_interval": 1024},
        {"tp_size": 8, "dp_size": 8, "enable_dp_attention": True, "max_running_requests": 512},
        {"max_total_tokens": 1000},
        {"max_total_tokens": 100000},
        {"chunked_prefill_size": 2048},
    ]
    for variant in variants:
        for page in (1, 64):
            for memory in (2 * GiB, 60 * GiB):
                check("gpt-oss-120b", Serving(page_size=page, **{**CHUNK_CAP, **variant}), memory)


def test_chunk_cap_numbers_of_each_mode() -> None:
    """The SWA term per mode at page 64, 64 requests, window 128, interval 128 (EAGLE: 8 draft tokens, 3 steps, topk 4):
    overlap off: 64 x 384 + 1 x 8192 + 64 = 32832; decode node, 32 slots: 64 x 384 + 32 x (128 + 64) = 30720;
    spec-v1 (overlap off, one chunk): decode = max(ceil_align(3 + 64, 64) x 4, 64) = 512
    → 64 x (128 + 128 x 8 + 64 + 512) + 8192 + 64 = 118848;
    spec-v2: decode = 2 x max(ceil((63 + 3) / 64) x 64 x 4, 8) = 1024 → 64 x 2240 + 16448 = 159808."""
    cases: list[tuple[dict[str, Any], int]] = [
        ({"disable_overlap_schedule": True}, 32832),
        ({"disaggregation_mode": "decode", "disaggregation_decode_extra_slots": 32}, 30720),
        ({**EAGLE, "disable_overlap_schedule": True}, 118848),
        ({**EAGLE}, 159808),
    ]
    for variant, swa in cases:
        fields = check("gpt-oss-120b", Serving(page_size=64, **{**CHUNK_CAP, **variant}), 60 * GiB)
        assert fields is not None and fields[3] == swa


def test_a_decode_node_is_chunk_capped_without_the_flag() -> None:
    """A decode node runs without the radix cache (SGLang resolves it so: ``Serving.radix_cache_disabled``), so 64
    explicit requests cap the SWA pool there without --disable-radix-cache: 64 x 384 + 32 x (128 + 64) = 30720
    SWA tokens, the same plan as with the flag; 16 requests take SGLang's default 2 x 16 extra slots."""
    decode = {"page_size": 64, "max_running_requests": 64, "disaggregation_mode": "decode"}
    fields = check("gpt-oss-120b", Serving(**decode, disaggregation_decode_extra_slots=32), 60 * GiB)
    assert fields is not None and fields[3] == 30720
    assert fields == check(
        "gpt-oss-120b", Serving(**decode, disaggregation_decode_extra_slots=32, disable_radix_cache=True), 60 * GiB
    )
    small = check("gpt-oss-120b", Serving(**{**decode, "max_running_requests": 16}), 60 * GiB)
    assert small is not None and small[3] == 16 * 384 + 32 * (128 + 64)


def test_chunk_cap_leaves_no_room() -> None:
    """SGLang's RuntimeError when the capped SWA pool eats the budget; kvpools raises the same, naming the cap."""
    serving = Serving(page_size=64, max_running_requests=6400, disable_radix_cache=True)
    compare_swa("gpt-oss-120b", oracle_model(preset_config("gpt-oss-120b")), serving, 2 * GiB)
    with pytest.raises(InsufficientMemoryError, match="SWA pool cap"):
        plan("gpt-oss-120b", attrs.evolve(serving, accounting="sglang"), memory=2 * GiB)


def test_not_enough_memory_and_degenerate_starts() -> None:
    """SGLang fails below one page; where it would start with no request or an empty SWA pool, kvpools refuses."""
    for memory in (0, 1, 4096, 100_000, 10**6):
        for preset in ("gpt-oss-20b", "mistral-7b-v0.1"):
            check(preset, Serving(page_size=16), memory)
    check("gpt-oss-20b", Serving(page_size=64, swa_full_tokens_ratio=0.1), 3 * 1 << 20)


def test_gemma_and_pipeline_stages() -> None:
    """Gemma-4 under SGLang's SWA configurator, Gemma-2/3 under its dense one (``disable_hybrid_swa_memory``), and PP
    (SGLang's SWA sizing counts the whole model's layers)."""
    for preset in ("gemma-2-9b", "gemma-3-12b-it", "gemma-3-27b-it", "gemma-4-26b-a4b"):
        for serving in (Serving(page_size=64), Serving(tp_size=2, page_size=1), Serving(page_size=16, **CHUNK_CAP)):
            check(preset, serving, 40 * GiB)
    a = check("gpt-oss-120b", Serving(page_size=16, pp_size=3, pp_rank=2), 40 * GiB)
    assert a == check("gpt-oss-120b", Serving(page_size=16), 40 * GiB)


@st.composite
def generated_cases(draw: st.DrawFn) -> tuple[dict[str, Any], Serving, int]:
    config = draw(hybrid_configs())
    return config, draw(swa_servings()), draw(aimed_budgets(config))


@settings(CHECKS, max_examples=250)
@given(case=generated_cases())
def test_generated_hybrid_models(case: tuple[dict[str, Any], Serving, int]) -> None:
    config, serving, memory = case
    model = parse(config)
    want = compare_swa(model, oracle_model(config, dtype=model.dtype), serving, memory)
    if want.error is not None or want.fields is None:
        event(f"both fail: {want.error}")
    elif want.fields[1] == 0 or (want.fields[3] < serving.page_size and sglang_hybrid_swa(config)):
        event("SGLang starts a server that cannot serve; kvpools refuses")
    else:
        shape = "dense (not hybrid in SGLang)" if not sglang_hybrid_swa(config) else "hybrid"
        shape = "all-SWA" if shape == "hybrid" and want.fields[2] == 0 else shape
        capped = serving.max_running_requests is not None and serving.radix_cache_disabled and shape == "hybrid"
        event(f"planned: {shape}{', chunk cap' if capped else ''}")
    event(f"page {serving.page_size}")


def test_a_config_file_round_trip(tmp_path: Path) -> None:
    """A config.json on disk (not a preset) through the CLI's loader, and through the oracle."""
    config = {**preset_config("gpt-oss-20b")}
    path = write_config(tmp_path, config)
    check_serving = Serving(page_size=16, swa_full_tokens_ratio=0.5)
    compare_swa(path, oracle_model(config), check_serving, 33 * GiB + 7)
