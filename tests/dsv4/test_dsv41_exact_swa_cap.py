"""DeepSeek-V4.1 under ``--accounting exact`` with ``--swa-full-tokens-ratio`` unset builds the SWA pool SGLang
0.5.23 builds (issue 33).

SGLang 0.5.23's ``DSV4PoolConfigurator`` (``srt/model_executor/pool_configurator.py``) sizes a V4.1 checkpoint's
SWA pool, the ratio left unset (no 0.1 engine default for ``model_type`` ``deepseek_v41``,
``_deepseek_v4_overrides``), from the request cap: ``_resolve_swa_cap_tokens`` = ``ceil_align(
compute_swa_request_cap(...) + swa_prefix_tails x (window + page), page)``, with ``--max-running-requests`` known
and chunked prefill on; without chunked prefill it keeps ratio sizing at ``DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO``
0.1.  ``--accounting sglang`` followed it (:func:`kvpools_plugins.dsv4.v41_budget.v41_swa_cap_tokens`), but the
exact accounting sized the pool from the generic 0.8 ratio: at 20 GiB, 256 requests, chunk 8192, 3,132,160 SWA
slots and 3,915,264 full tokens, a pool SGLang never builds.  Now it builds SGLang's SWA pool and solves the most
full tokens whose every pool fits, as it does for a given ratio.
"""

from __future__ import annotations

from pathlib import Path

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvpools_plugins.dsv4.sizing import dsv4_shape, exact_bytes

from kvpools_core import Serving, build, plan

V41 = str(Path(__file__).with_name("configs") / "dsv41_synthetic.json")
"""DeepSeek-V4-Flash's dims (nope 448, rope 64, window 128, index 128), 8 layers, ratios [0, 1, 2, 1, 4, 128, 2,
0], kv_source_layer_ids [1, 2]: one c4, one c128, one ratio-1 and one ratio-2 source; context 1,048,576."""
BUDGET = 20 * 2**30
PAGE_ROW = 149_760
"""One page of 256 V4-layout rows: ``ceil_to(256 x 584, 576)`` = 256 x 585 (``KVLayout.page_bytes``)."""


def _pools(p: object) -> dict[str, int]:
    return {pool.name: pool.bytes for pool in p.pools}  # type: ignore[attr-defined]


def test_cap_mode_exact_plan_by_hand() -> None:
    """20 GiB, 256 requests (SGLang's DeepSeek-V4 default), chunk 8192, the radix cache on, page 256.

    SWA slots (the sglang path's, ``test_dsv41_sglang_budget.test_sglangs_swa_cap_mode_by_hand``): per request
    ``128 + 128 x 1 + 256 + 256`` = 768; ``768 x 256 + 2 x 8192 + 256`` = 213,248; prefix tails ``4 x 256 x (128
    + 256)`` = 393,216; ``ceil_align(606,464, 256)`` = 606,464.  Each pool at ``F`` = 14,677,504 full tokens
    (``buffers.py``: ``_num_dsv4_physical_kv_pages`` = ``ceil((size + 256) / page)`` pages):

    * ``kv_swa``: (606,464 + 256) / 256 = 2,370 pages x 149,760 x 8 layers = 2,839,449,600;
    * ``kv_c4``: F // 4 = 3,669,376 in pages of 64 (37,440 B): 57,338 pages = 2,146,734,720;
    * ``kv_c128``: F // 128 = 114,668 in pages of 2 (``ceil_to(1,168, 576)`` = 1,728 B): 57,462 = 99,294,336;
    * ``indexer_c4``: 3,669,376 in pages of 64 x 132 B: 57,338 x 8,448 = 484,391,424;
    * ``c4_state`` / ``c4_indexer_state``: 606,464 // 256 x ring 8 = 18,952, ``ceil_to(18,952 + 9, 4)`` = 18,964
      rows of 4 x 512 / 4 x 128 float32: 155,353,088 / 38,838,272;
    * ``c128_state``: ``ceil_to(257 x 128 + 129, 128)`` = 33,152 rows of 2 x 512 float32: 135,790,592;
    * ``kv_c1``: F in pages of 256: 57,335 x 149,760 = 8,586,489,600; ``kv_c2``: F // 2 = 7,338,752 in pages of
      128 (``ceil_to(74,752, 576)`` = 74,880 B): 57,336 = 4,293,319,680;
    * ``indexer_c1`` / ``indexer_c2``: (F + 256) // r in pages of 64 x 68 B: 229,341 / 114,671 pages =
      998,092,032 / 499,048,192; ``c2_pair_state``: ``ceil_to(257 x 2 + 3, 2)`` = 518 rows of 4,096 B = 2,121,728;
    * ``full_to_swa`` (F + 257) x 8 = 117,422,088; ``req_to_token`` 257 x (1,048,576 + 4) int32 = 1,077,940,240;
      the allocators (pages + 256) x 8: 57,334 + 256 -> 460,720, 2,369 + 256 -> 21,000.

    Sum 21,474,767,312 <= 21,474,836,480; the 69,168 B left are less than one more page's ``kv_c1`` page
    (149,760 B) alone, so ``F`` is the most that fits.
    """
    p = plan(V41, Serving(accounting="exact"), memory="20GiB")
    config = p.sizing.sglang_config
    assert p.max_running_requests == 256
    assert (768 * 256 + 2 * 8192 + 256) + 4 * 256 * (128 + 256) == 606_464
    assert config["swa_max_total_num_tokens"] == 606_464
    assert config["c4_state_pool_size"] == 606_464 // 256 * 8 == 18_952
    full = 14_677_504
    assert config["full_max_total_num_tokens"] == p.max_total_num_tokens == full
    expected = {
        "kv_swa": (606_464 + 256) // 256 * PAGE_ROW * 8,
        "kv_c4": -(-(full // 4 + 256) // 64) * 37_440,
        "kv_c128": -(-(full // 128 + 256) // 2) * 1_728,
        "indexer_c4": -(-(full // 4 + 256) // 64) * 64 * 132,
        "c4_state": 18_964 * 4 * 512 * 4,
        "c4_indexer_state": 18_964 * 4 * 128 * 4,
        "c128_state": 33_152 * 2 * 512 * 4,
        "kv_c1": (full + 256) // 256 * PAGE_ROW,
        "kv_c2": -(-(full // 2 + 256) // 128) * 74_880,
        "indexer_c1": -(-(full + 256 + 64) // 64) * 64 * 68,
        "indexer_c2": -(-((full + 256) // 2 + 64) // 64) * 64 * 68,
        "c2_pair_state": 518 * 2 * 512 * 4,
        "full_to_swa": (full + 257) * 8,
        "req_to_token": 257 * (1_048_576 + 4) * 4,
        "allocator": (full // 256 + 256) * 8,
        "swa_allocator": (606_464 // 256 + 256) * 8,
    }
    assert expected["kv_swa"] == 2_839_449_600 and expected["kv_c1"] == 8_586_489_600
    assert _pools(p) == expected
    assert sum(expected.values()) == p.planned_bytes == 21_474_767_312 <= BUDGET
    assert BUDGET - 21_474_767_312 == 69_168 < PAGE_ROW
    shape = dsv4_shape(p.model, p.serving)
    assert exact_bytes(p.model, p.serving, shape, full + 256) > BUDGET
    assert any("cap mode" in note for note in p.sizing.notes)
    # the bytes-per-full-token note adds up in cap mode (before, it printed the unused 0.1 x 5,000 term)
    (bpft,) = (note for note in p.cell.notes if "bytes per full token" in note)
    assert "0 x 5,000.0000 B" in bpft and "0.1 x" not in bpft and "= 1,165.5000 B" in bpft


def test_no_chunked_prefill_exact_plan_by_hand() -> None:
    """Chunked prefill off: no cap mode (``_resolve_swa_cap_tokens`` returns None), so the configurator's
    ``DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO`` 0.1, not the generic 0.8: ``F`` = 12,104,448 (the exact plan of
    ``--swa-full-tokens-ratio 0.1``, docs/sizing.md), SWA ``int(12,104,448 x 0.1)`` = 1,210,444 page aligned
    1,210,368; ``kv_swa`` (1,210,368 + 256) / 256 = 4,729 pages x 149,760 x 8 = 5,665,720,320; c4 states
    1,210,368 // 256 x 8 = 37,824.  Planned 21,474,744,560: the 91,920 B left are less than a ``kv_c1`` page."""
    p = plan(V41, Serving(accounting="exact", chunked_prefill_size=None), memory="20GiB")
    config = p.sizing.sglang_config
    full = 12_104_448
    assert config["full_max_total_num_tokens"] == full
    assert int(full * 0.1) // 256 * 256 == config["swa_max_total_num_tokens"] == 1_210_368
    assert config["c4_state_pool_size"] == 1_210_368 // 256 * 8 == 37_824
    assert p.pool("kv_swa").bytes == (1_210_368 + 256) // 256 * PAGE_ROW * 8 == 5_665_720_320
    assert p.planned_bytes == 21_474_744_560 and BUDGET - p.planned_bytes == 91_920 < PAGE_ROW
    # the same plan as the ratio given as 0.1
    given_ratio = plan(V41, Serving(accounting="exact", swa_full_tokens_ratio=0.1), memory="20GiB")
    assert _pools(given_ratio) == _pools(p)
    shape = dsv4_shape(p.model, p.serving)
    assert exact_bytes(p.model, p.serving, shape, full + 256) > BUDGET


def test_meta_build_allocates_the_cap_mode_plan() -> None:
    p = plan(V41, Serving(accounting="exact"), memory="20GiB")
    allocated = build(p, "meta").allocated_by_pool()
    assert allocated == _pools(p)
    assert allocated["kv_swa"] == 2_839_449_600


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    requests=st.integers(1, 512),
    chunk=st.sampled_from([None, 2048, 8192]),
    disable_radix_cache=st.booleans(),
    disable_overlap_schedule=st.booleans(),
    memory=st.sampled_from(["12GiB", "20GiB", "40GiB"]),
)
def test_exact_swa_pool_is_sglangs(
    requests: int, chunk: int | None, disable_radix_cache: bool, disable_overlap_schedule: bool, memory: str
) -> None:
    """For the same request count, the exact plan's SWA slots are the sglang path's cap-mode slots; without
    chunked prefill (no cap mode) both use 0.1 of their own full tokens."""
    serving = Serving(
        max_running_requests=requests,
        chunked_prefill_size=chunk,
        disable_radix_cache=disable_radix_cache,
        disable_overlap_schedule=disable_overlap_schedule,
    )
    exact = plan(V41, attrs.evolve(serving, accounting="exact"), memory=memory)
    sglang = plan(V41, attrs.evolve(serving, accounting="sglang"), memory=memory)
    swa = exact.sizing.sglang_config["swa_max_total_num_tokens"]
    cap = dsv4_shape(sglang.model, sglang.serving).swa_cap
    assert exact.max_running_requests == sglang.max_running_requests == requests
    if chunk is None:
        assert cap is None
        assert swa == int(exact.max_total_num_tokens * 0.1) // 256 * 256
    else:
        assert cap is not None
        assert swa == sglang.sizing.sglang_config["swa_max_total_num_tokens"] == cap
    assert exact.planned_bytes <= exact.budget.budget_bytes
