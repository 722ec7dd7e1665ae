"""DeepSeek-V4 on Ascend NPUs: SGLang 0.5.23's NPU pools planned and built by kvpools-ascend (issue 33).

References (SGLang 0.5.23 as installed in the peers venv, ``sglang/srt/``):

* ``hardware_backend/npu/dsv4/dsv4_memory_pool.py``: ``NPUDeepSeekV4SingleKVPool.create_buffer`` (lines 69-93:
  ``((size + kp + 1) // kp, kp, 1, qk_nope + qk_rope)`` bf16 before arch35, the A5 packed fp8 row of
  ``ceil((448 + 128 + 7) / 128) x 128 = 640`` on arch35), ``DSV4NPUTokenToKVPool._make_kv_pool`` (lines 305-312:
  kernel page ``P`` for SWA, ``P / 4`` for c4, ``c128_page_size`` for c128), ``NPUDeepSeekV4IndexerPool._create_buffer``
  (lines 190-222: the packed CUDA row kept, plus int8 keys and fp16 scales at page ``P / 4``),
  ``NPUCompressStatePool`` (lines 109-146: ``state_cache_page_size = ring``, float32 only) and
  ``_make_compress_state_pool`` (lines 333-361);
* ``mem_cache/deepseek_v4_compress_state.py`` lines 170-177: rows ``size + ring + 1`` rounded to ``lcm(ratio,
  state_cache_page_size)``; ``mem_cache/deepseek_v4_memory_pool.py`` ``DeepSeekV4TokenToKVPool.__init__`` (c128 state
  ``max(c128_state_pool_size, num_req_slots x ring)``, ``c4_logical_size = c128_size x 32``) and
  ``_num_dsv4_physical_kv_pages`` (lines 166-171);
* ``dsv4_req_to_token_pool.py`` lines 51-60 (``req_to_c128_sidecar``: rows x ``max(1, ceil(context / (128 x
  c128_page_size)))`` int32) and ``dsv4_allocator.py`` lines 104-140 (c128 ``NPUPagedTokenToKVPoolAllocator(c128_size,
  page_size=c128_page_size)`` and ``c128_page_refcount`` of ``num_pages + 1`` int32);
* ``model_executor/pool_configurator.py`` ``DSV4PoolConfigurator``: ``kv_bytes`` 584 (line 1108), unpadded on NPU
  (lines 1353-1357), ``calculate_pool_sizes`` (lines 1638-1701);
* ``arg_groups/model_overrides/deepseek_v4.py`` (page 128 on NPU), ``arg_groups/overrides.py``
  ``_deepseek_v4_kv_cache_dtype`` (bfloat16 on NPU).

DeepSeek-V4-Flash: 43 layers (2 SWA-only, 21 c4, 20 c128), qk_nope 448, qk_rope 64, index_head_dim 128, window 128;
TP 4 at 60 GiB, page 128, 256 requests (SGLang's DeepSeek-V4 default).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvpools_core import Plan, Serving, build, plan
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.planning.capacity import concurrency

GiB = 1 << 30

FLASH = Serving(platform="ascend", tp_size=4)
EAGLE: dict[str, Any] = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
}
MEMORY = "60GiB"
V41 = str(Path(__file__).parents[2] / "dsv4" / "configs" / "dsv41_synthetic.json")


def _plan(serving: Serving = FLASH, model: str = "deepseek-v4-flash", memory: str = MEMORY) -> Plan:
    return plan(model, serving, memory=memory)


@pytest.fixture(scope="module")
def flash() -> Plan:
    return _plan()


def test_the_npu_pools_by_hand(flash: Plan) -> None:
    """Every pool of the default plan, from its sizes (full 4,785,792, SWA 478,464, c4 1,196,448, c128 37,389,
    c4 state 29,904, c128 state 32,896; 256 requests, 257 request slots) and SGLang's NPU shapes."""
    config = dict(flash.sizing.sglang_config)
    assert (config["full_max_total_num_tokens"], config["swa_max_total_num_tokens"]) == (4_785_792, 478_464)
    assert (config["c4_max_total_num_tokens"], config["c128_max_total_num_tokens"]) == (1_196_448, 37_389)
    assert (config["c4_state_pool_size"], config["c128_state_pool_size"], flash.max_running_requests) == (
        29_904,
        32_896,
        256,
    )
    pools = {p.name: p.bytes for p in flash.pools}
    row = (448 + 64) * 2  # bf16 nope + rope (create_buffer before arch35)
    assert pools["kv_swa"] == (478_464 + 128 + 1) // 128 * 128 * row * 43 == 21_073_362_944
    assert pools["kv_c4"] == (1_196_448 + 32 + 1) // 32 * 32 * row * 21 == 25_729_105_920
    assert pools["kv_c128"] == (37_389 + 16 + 1) // 16 * 16 * row * 20 == 765_788_160
    logical = 37_389 * 32  # c4_logical_size
    assert pools["indexer_c4"] == -(-(logical + 128) // 32) * 32 * 132 * 21 == 3_316_908_672
    assert pools["index_k_c4"] == (logical + 32 + 1) // 32 * 32 * 128 * 21 == 3_216_138_240  # int8
    assert pools["index_scale_c4"] == (logical + 32 + 1) // 32 * 32 * 2 * 21 == 50_252_160  # fp16
    c4_rows = -(-(29_904 + 8 + 1) // 8) * 8  # lcm(4, ring 8) = 8
    assert pools["c4_state"] == c4_rows * 4 * 512 * 4 * 21 == 5_147_197_440
    assert pools["c4_indexer_state"] == c4_rows * 4 * 128 * 4 * 21 == 1_286_799_360
    c128_rows = -(-(max(32_896, 257 * 128) + 128 + 1) // 128) * 128  # lcm(128, ring 128) = 128
    assert pools["c128_state"] == c128_rows * 2 * 512 * 4 * 20 == 2_715_811_840
    row_len = flash.pool("req_to_token").bytes_per_slot // 4
    assert pools["req_to_c128_sidecar"] == 257 * max(1, -(-row_len // (128 * 16))) * 4 == 257 * 513 * 4
    assert pools["c128_page_refcount"] == (37_389 // 16 + 1) * 4 == 9_348
    assert flash.pool("c128_allocator").slots == 37_389 // 16
    # SGLang's estimate leaves out the NPU's own key / scale buffers and the sidecar
    assert not flash.pool("index_k_c4").sglang_charged and not flash.pool("req_to_c128_sidecar").sglang_charged
    assert flash.planned_bytes <= 60 * GiB


def test_the_configurators_counts_on_npu() -> None:
    """``--accounting sglang``: SGLang's coefficient at page 128 is 0.1 x 584 x 43 + 1/4 x 584 x 21 + 1/4 x 132 x
    21 + 0.1 x 8/128 x (8192 + 2048) x 21 + 1/128 x 584 x 20 = 7,705.45 B (584 unpadded on NPU), the c128 state's
    fixed bytes 33,152 rows x 4,096 B x 20 = 2,715,811,840 for 256 requests."""
    result = _plan(attrs.evolve(FLASH, accounting="sglang"))
    full = int((60 * GiB - 2_715_811_840) / 7705.45) // 128 * 128
    assert result.sizing.sglang_config["full_max_total_num_tokens"] == full == 8_008_448
    assert result.sizing.sglang_config["swa_max_total_num_tokens"] == int(full * 0.1) // 128 * 128
    assert result.sizing.sglang_config["c4_max_total_num_tokens"] == full // 4
    assert result.sizing.sglang_config["c128_max_total_num_tokens"] == full // 128
    assert result.pool("kv_swa").bytes == (int(full * 0.1) // 128 * 128 + 129) // 128 * 128 * 1024 * 43


def test_sglang_accounting_has_no_swa_ring_on_npu() -> None:
    """Before: any DeepSeek-V4 layout the dsv4 plugin did not know counted as a unified-KV ring (ring mode,
    ``swa_ring_max_total_num_tokens``); the NPU pool pages its SWA rows (``swa_kv_pool``, no unified ring)."""
    for accounting in ("exact", "sglang"):
        result = _plan(attrs.evolve(FLASH, accounting=accounting))
        assert "swa_ring_max_total_num_tokens" not in result.sizing.sglang_config, accounting
        assert not any("ring mode" in note for note in result.sizing.notes), accounting


@pytest.mark.parametrize(
    ("serving", "memory"),
    [
        (FLASH, MEMORY),
        (attrs.evolve(FLASH, pp_size=2, pp_rank=1), MEMORY),
        (attrs.evolve(FLASH, plugin_options={"ascend.soc": "arch35"}), MEMORY),
        (attrs.evolve(FLASH, plugin_options={"ascend.c128_page_size": "64"}, max_running_requests=32), "20GiB"),
        (attrs.evolve(FLASH, disaggregation_mode="decode", disaggregation_decode_extra_slots=8), MEMORY),
        (attrs.evolve(FLASH, accounting="sglang", kv_cache_dtype="fp8_e4m3"), MEMORY),
        (attrs.evolve(FLASH, **EAGLE), MEMORY),
        (attrs.evolve(FLASH, **EAGLE, accounting="sglang"), MEMORY),
    ],
    ids=["flash", "pp-stage-1", "arch35", "c128-page-64", "decode", "sglang-fp8-flag", "eagle", "eagle-sglang"],
)
def test_meta_build_allocates_what_the_plan_says(serving: Serving, memory: str) -> None:
    result = _plan(serving, memory=memory)
    pools = build(result, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    assert pools.allocated_bytes == result.planned_bytes
    assert pools.provenance["build_pool"] == ("ascend",) and pools.provenance["build_allocator"] == ("ascend",)


def test_arch35_rows_and_states() -> None:
    """A5: 640 B fp8 rows (448 + 2 x 64 + ceil(448 / 64) = 583, padded to 128), fp8 index keys with fp32 scales,
    and c4 states of at least one ring per request slot (``size = max(size, num_req_slots x ring)``)."""
    result = _plan(attrs.evolve(FLASH, plugin_options={"ascend.soc": "arch35"}, max_running_requests=4096))
    swa = result.sizing.sglang_config["swa_max_total_num_tokens"]
    assert result.pool("kv_swa").bytes == (swa + 129) // 128 * 128 * 640 * 43
    logical = result.sizing.sglang_config["c128_max_total_num_tokens"] * 32
    assert result.pool("index_scale_c4").bytes == (logical + 33) // 32 * 32 * 4 * 21
    slots = result.max_running_requests + 1
    c4_size = max(result.sizing.sglang_config["c4_state_pool_size"], slots * 8)
    assert result.pool("c4_state").bytes == -(-(c4_size + 9) // 8) * 8 * 2048 * 4 * 21


def test_npu_rows_are_written_where_sglang_writes_them() -> None:
    """``set_swa_buffer`` / ``set_compress_buffer``: flat ``loc`` rows of the ``(pages, kp, 1, dim)`` buffers."""
    import torch

    result = _plan(attrs.evolve(FLASH, max_total_tokens=4096, max_running_requests=4), memory="4GiB")
    pool = build(result, "cpu").kv_pool
    rows = torch.randn(3, 512, dtype=torch.bfloat16)
    loc = torch.tensor([1, 129, 300])
    pool.set_swa_buffer(0, loc, rows)
    assert torch.equal(pool.get_swa_buffer(0, loc)[:, 0], rows)
    assert torch.equal(pool.get_key_buffer(0)[1, 1, 0], rows[1])  # slot 129: page 1, row 1
    pool.set_compress_buffer(3, torch.tensor([17]), rows[:1])  # a c128 layer: kernel page 16
    assert torch.equal(pool.get_key_buffer(3)[1, 1, 0], rows[0])
    assert pool.get_compress_buffer(0) is None


# -- what SGLang refuses on NPU, and what kvpools does not model there ----------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"enable_hisparse": True, "disable_radix_cache": True}, "enable_hisparse is not supported on the NPU DSV4"),
        ({"enable_online_compress": True}, "incompatible with the NPU fused compressor"),
        ({"dsv4_compress_state_dtype": "bfloat16"}, "Atlas A3 npu.compressor requires FP32 state_cache"),
        ({"plugin_options": {"ascend.c128_page_size": "24"}}, "c128_page_size must be a positive multiple of 16"),
        ({"dsv4_attn_backend": "trtllm", "kv_cache_dtype": "fp8_e4m3"}, "DeepSeekV4UniformFP8KVPool"),
        ({"dsv4_kv_layout": "v41"}, "kvpools does not model dsv4_kv_layout v41"),
        ({**EAGLE, "speculative_num_steps": 11, "speculative_num_draft_tokens": 12},
         "speculative_num_draft_tokens=12 exceeds what the c4 compress state ring can keep resident"),
        ({"enable_hierarchical_cache": True}, "kvpools does not model enable_hierarchical_cache"),
    ],
    ids=["hisparse", "online-c128", "bf16-state", "c128-page", "trtllm", "v41-layout", "eagle-ring", "hicache"],
)  # fmt: skip
def test_refusals(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match=message):
        _plan(attrs.evolve(FLASH, **changes))


def test_low_ratio_layers_are_refused_with_sglangs_failure() -> None:
    with pytest.raises(UnsupportedCombinationError, match="unexpected keyword argument 'force_fp4'"):
        _plan(Serving(platform="ascend"), model=V41, memory="20GiB")


# -- capacity --------------------------------------------------------------------------------------------------


def test_capacity_answers(flash: Plan) -> None:
    """Full pages bind: 4,785,792 / 128 = 37,389 pages; a 32k request holds 256 of them (146 fit), a 1M one 8,192
    (4 fit); up to 16k the request cap 256 binds."""
    assert concurrency(flash, 32_768).concurrent_requests == 37_389 // 256 == 146
    assert concurrency(flash, 1_048_576).concurrent_requests == 37_389 // 8_192 == 4
    assert concurrency(flash, 16_384).concurrent_requests == 256


def test_the_c128_page_allocator_binds_capacity() -> None:
    """The c128 rows come from their own page allocator (pages of 16 c128 slots, ``dsv4_allocator.py`` lines
    127-140): a 2,176-token request holds 17 full pages but 2,176 // 128 = 17 c128 slots in 2 pages of 16 (32
    slots), so with 4,096 requests allowed (and SWA room for them) the c128 pool binds, not the full one; a
    2,048-token request holds 16 slots, one page; below 128 tokens it holds none."""
    result = _plan(attrs.evolve(FLASH, max_running_requests=4096, swa_full_tokens_ratio=0.5))
    assert dict(result.compression_pages) == {"c128": 16}
    tokens = result.counts["tokens"]
    at = concurrency(result, 2_176)
    assert at.tokens_per_request["c128"] == 32 and at.limits["c128 tokens"] == tokens["c128"] // 32
    assert at.limits["full tokens"] == tokens["full"] // (17 * 128) > at.limits["c128 tokens"]
    assert at.binding == "c128 tokens" and at.concurrent_requests == tokens["c128"] // 32
    assert concurrency(result, 2_048).tokens_per_request["c128"] == 16
    assert "c128 tokens" not in concurrency(result, 100).limits
    # max_context: n requests of L share the c128 pages: L // 128 <= (c128 // n) // 16 x 16
    from kvpools_core.planning.capacity import max_context

    n = tokens["c128"] // 32  # exactly two pages each
    answer = max_context(result, n)
    assert answer.limits["c128 tokens"] == (32 + 1) * 128 - 128 == 4_096


def test_what_the_capacity_readers_do_not_model_is_refused(flash: Plan) -> None:
    """The replay and the capacity record count a compressed space as slot ``s // r`` of full slot ``s``; the NPU's
    c128 pages are refused there, by name, not answered as that."""
    from kvpools_core.errors import ConfigError
    from kvpools_core.planning.capacity_record import capacity_records
    from kvpools_core.planning.replay import fixed_trace, replay

    with pytest.raises(UnsupportedCombinationError, match="capacity record of a compressed token space with a page"):
        capacity_records(flash, context_len=4096)
    with pytest.raises(ConfigError, match=r"\['c128'\] of deepseek-v4-flash have page allocators of their own"):
        replay(flash, fixed_trace(4096, 16, 4))


def test_eagle_on_npu_by_hand() -> None:
    """EAGLE (4 draft tokens, 1 NextN layer): rings 16 / 256 (``get_compress_state_ring_size``), so the c4 states
    cost 0.1 x 16/128 x (8192 + 2048) x 21 = 2,688 B per full token and SGLang's coefficient is (2,511.2 + 3,066 +
    693 + 2,688 + 91.25) x 44 / 43 (the draft worker, lines 1265-1272); the c128 state's fixed bytes
    ceil((257 x 256 + 257) / 128) x 128 = 66,176 rows x 4,096 B x 20.  The draft worker's own NPU pool holds the
    SWA rows of its one layer (PA_ND, 1024 B), and the states round to lcm(4, 16) = 16 / lcm(128, 256) = 256 rows."""
    result = _plan(attrs.evolve(FLASH, **EAGLE, accounting="sglang"))
    config = result.sizing.sglang_config
    fixed = 66_176 * 4_096 * 20
    full = int((60 * GiB - fixed) / ((2511.2 + 3066 + 693 + 2688 + 91.25) * 44 / 43)) // 128 * 128
    assert config["full_max_total_num_tokens"] == full
    swa = config["swa_max_total_num_tokens"]
    assert config["c4_state_pool_size"] == swa // 128 * 16 and config["c128_state_pool_size"] == 257 * 256
    assert result.pool("draft_kv_swa").bytes == (swa + 129) // 128 * 128 * 1024 * 1
    assert result.pool("c4_state").bytes == -(-(swa // 128 * 16 + 17) // 16) * 16 * 2048 * 4 * 21
    assert result.pool("c128_state").bytes == -(-(257 * 256 + 257) // 256) * 256 * 1024 * 4 * 20


def test_the_cell_says_what_the_npu_stores(flash: Plan) -> None:
    """The ``dsv4`` plugin's cell rewritten by kvpools-ascend's wrapper: SWA / c4 / c128 rows of 1024 B per layer
    (PA_ND bf16) where CUDA packs 584, the c4 indexer 132 + 128 + 2 B per layer; SGLang's coefficient kept."""
    parts = {part.name: part.bytes_per_token for part in flash.cell.parts}
    assert parts["swa_kv"] == 1024 * 43 and parts["c4_kv"] == 1024 * 21 and parts["c128_kv"] == 1024 * 20
    assert parts["c4_indexer"] == (132 + 128 + 2) * 21
    assert flash.cell.sglang_bytes_per_token == pytest.approx(7705.45)
    assert any("PA_ND bf16" in note for note in flash.cell.notes)
    assert flash.provenance["estimate_cell_size"] == ("dsv4", "ascend")


def test_the_plan_round_trips_with_its_compression_pages(flash: Plan) -> None:
    again = Plan.from_json(flash.to_json())
    assert again.compression_pages == flash.compression_pages == {"c128": 16}
    assert again.sizing == flash.sizing


@settings(max_examples=12, deadline=None)
@given(
    gib=st.integers(min_value=6, max_value=120),
    c128_page=st.sampled_from(["16", "32", "64"]),
    soc=st.sampled_from(["a2", "arch35"]),
)
def test_the_exact_plan_is_the_most_that_fits(gib: int, c128_page: str, soc: str) -> None:
    """Invariant of the exact accounting: the plan fits the budget, one more page of full tokens would not (the
    sub-pools and requests re-derived as SGLang derives them), and a meta build allocates what it plans."""
    from kvpools_ascend.dsv4 import npu_dsv4_pool_bytes
    from kvpools_ascend.dsv4_sizing import npu_configurator

    serving = attrs.evolve(FLASH, plugin_options={"ascend.soc": soc, "ascend.c128_page_size": c128_page})
    result = _plan(serving, memory=f"{gib}GiB")
    budget = result.budget.budget_bytes
    assert result.planned_bytes <= budget
    cfg = npu_configurator(result.model, result.serving)
    sizes = cfg.sizes(result.max_total_num_tokens + 128)
    context = result.model.context_len
    from kvpools_core.parts.sizing import resolve_max_num_reqs

    requests = resolve_max_num_reqs(sizes["full_max_total_num_tokens"], context, result.serving).max_running_requests
    assert npu_dsv4_pool_bytes(result.model, result.serving, cfg.finalize(sizes, requests), requests, context) > budget
    assert build(result, "meta").allocated_bytes == result.planned_bytes
