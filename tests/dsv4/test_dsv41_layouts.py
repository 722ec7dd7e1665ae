"""DeepSeek-V4's V4.1 KV layouts and V4.1's ratio-1/2 kv_source pools: hand-computed bytes, meta builds, refusals.

Sources: SGLang 0.5.23 ``kernels/ops/attention/dsv4/kv_layout.py`` (``KVLayout``: V4 576 + 8 B a token, pages
padded to 576 B; V4.1 512 + 16 B, padded to 512 B; V4.1-fp4 256 + 32 B, padded to 256 B) and
``srt/mem_cache/deepseek_v4_memory_pool.py`` (``select_dsv4_kv_layout``, ``resolve_compressed_kv_layout``,
``collect_sources_by_ratio``, ``_init_compressed_pools``, ``_make_pair_state_pool``); ref-000
``_build_dsv4_kv_pool`` lines 1359-1381, ref-002 ``_get_bytes_per_full_token`` lines 620-660.
"""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
import torch
from kvpools_plugins.dsv4.pool import DSV4TokenToKVPool

from kvpools_core import Serving, build
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.pipeline import plan
from kvpools_core.values import Plan

V4_SOURCES = str(Path(__file__).with_name("configs") / "dsv4_kv_source_synthetic.json")
"""The same layers under ``model_type`` ``deepseek_v4``: SGLang's V4.1 feature gate (no EAGLE, no PP) is off."""
V41 = str(Path(__file__).with_name("configs") / "dsv41_synthetic.json")
"""DeepSeek-V4-Flash's dims, 8 layers, ratios [0, 1, 2, 1, 4, 128, 2, 0] (+ MTP 0), kv_source_layer_ids [1, 2]."""
FLASH = "deepseek-v4-flash"


def _counts(p: Plan) -> dict[str, int]:
    return {k: int(v) for k, v in p.sizing.sglang_config.items()}


def test_v41_main_and_compressed_pages_by_hand() -> None:
    """deepseek-v4-flash (43 layers: 2 + 1 MTP-listed SWA-only, 21 c4, 20 c128) with ``--dsv4-kv-layout v41``."""
    p = plan(FLASH, Serving(tp_size=4, dsv4_kv_layout="v41"), memory="60GiB")
    c = _counts(p)
    swa, c4, c128 = c["swa_max_total_num_tokens"], c["c4_max_total_num_tokens"], c["c128_max_total_num_tokens"]
    # pages: 0.5.23 _num_dsv4_physical_kv_pages(size, page, global_page) = ceil((size + global_page) / page)
    # (deepseek_v4_memory_pool.py L166-171), global_page = P = 256 for every pool (L1579-1589)
    # SWA: 256 x 528 = 135,168 B a page (a multiple of 512); ceil((size + 256) / 256) pages; every layer
    assert p.pool("kv_swa").bytes == -(-(swa + 256) // 256) * 135_168 * 43
    # c4: 64-token pages of 64 x 528 = 33,792 B (66 x 512); the reserved 256-token page is 4 of them
    assert p.pool("kv_c4").bytes == -(-(c4 + 256) // 64) * 33_792 * 21
    # c128: 2-token pages of 1,056 B, padded to 1,536 B (3 x 512); the reserved page is 128 of them
    assert p.pool("kv_c128").bytes == -(-(c128 + 256) // 2) * 1_536 * 20


def test_v41_new_and_fp4_compressed_pages_by_hand() -> None:
    p = plan(FLASH, Serving(tp_size=4, dsv4_kv_layout="v41_new", dsv4_compressed_kv_layout="fp4"), memory="60GiB")
    c = _counts(p)
    # interleaved V4.1 main cache: 528 B a token, pages padded to 528 B: 256 x 528 exactly
    assert p.pool("kv_swa").bytes == -(-(c["swa_max_total_num_tokens"] + 256) // 256) * 135_168 * 43
    # fp4 (interleaved) compressed caches: 288 B a token, padded to 288 B; c128's 2-token page is 576 B;
    # ceil((size + 256) / (256 // ratio)) pages (_num_dsv4_physical_kv_pages, global_page_size = 256)
    assert p.pool("kv_c4").bytes == -(-(c["c4_max_total_num_tokens"] + 256) // 64) * 64 * 288 * 21
    assert p.pool("kv_c128").bytes == -(-(c["c128_max_total_num_tokens"] + 256) // 2) * 576 * 20


def test_sglang_accounting_does_not_read_the_layout() -> None:
    """ref-002's ``_get_bytes_per_full_token`` charges every row ``nope + 2 rope + 8`` = 584 B whatever the layout:
    SGLang's counts are the same under V4 and V4.1, the pools built hold fewer bytes under V4.1."""
    v4 = plan(FLASH, Serving(tp_size=4, accounting="sglang"), memory="60GiB")
    v41 = plan(FLASH, Serving(tp_size=4, accounting="sglang", dsv4_kv_layout="v41"), memory="60GiB")
    assert _counts(v4) == _counts(v41)
    assert v41.pool("kv_swa").bytes < v4.pool("kv_swa").bytes
    # the exact accounting solves over the built bytes, so the smaller rows buy more tokens
    e4 = plan(FLASH, Serving(tp_size=4), memory="60GiB")
    e41 = plan(FLASH, Serving(tp_size=4, dsv4_kv_layout="v41"), memory="60GiB")
    assert e41.max_total_num_tokens > e4.max_total_num_tokens


def test_low_ratio_pools_by_hand() -> None:
    """The synthetic V4.1 config at 20 GiB (V4 layout): layer 1 is the ratio-1 source (layer 3 reads it), layer 2
    the ratio-2 source (layer 6 reads it)."""
    p = plan(V41, Serving(), memory="20GiB")
    full = p.max_total_num_tokens
    slots = p.max_running_requests + 1  # the request table's rows: requests + 1 padding row
    # kv_c1: full slots in 256-slot pages, ceil((full + 256) / 256) pages of 149,760 B (584 x 256 -> 260 x 576)
    assert p.pool("kv_c1").bytes == -(-(full + 256) // 256) * 149_760
    # kv_c2: full // 2 slots in 128-slot pages, ceil((full // 2 + 256) / 128) pages of 74,880 B (130 x 576)
    assert p.pool("kv_c2").bytes == -(-(full // 2 + 256) // 128) * 74_880
    # fp4 index keys: (full + 256) // r slots in 64-slot pages of 64 x (64 + 4) B, ceil((size + 64) / 64) pages
    assert p.pool("indexer_c1").bytes == -(-((full + 256) + 64) // 64) * 64 * 68
    assert p.pool("indexer_c2").bytes == -(-((full + 256) // 2 + 64) // 64) * 64 * 68
    # the ratio-2 source's pending pair: slots x ring 2, rows rounded to 2, 2 x 512 float32
    assert p.pool("c2_pair_state").bytes == -(-(slots * 2 + 3) // 2) * 2 * 1024 * 4
    # ratio-1/2 layers own no c4/c128 pools: one c4 and one c128 layer in the stage; ceil((c4 + 256) / 64) pages
    assert p.pool("kv_c4").bytes == -(-(_counts(p)["c4_max_total_num_tokens"] + 256) // 64) * 37_440 * 1


SERVINGS = [
    Serving(),
    Serving(dsv4_kv_layout="v41"),
    Serving(dsv4_kv_layout="v41_new", dsv4_compressed_kv_layout="fp8"),
    Serving(dsv4_kv_layout="v41", dsv4_compressed_kv_layout="fp4"),
    Serving(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
            speculative_num_draft_tokens=4, speculative_draft_num_layers=1),
    Serving(accounting="sglang", dsv4_kv_layout="v41"),
]  # fmt: skip


@pytest.mark.parametrize("serving", SERVINGS, ids=["v4", "v41", "v41-new-fp8", "v41-fp4", "eagle", "sglang-v41"])
@pytest.mark.parametrize("model", [V41, FLASH], ids=["v41-synthetic", "flash"])
def test_meta_build_allocates_what_the_plan_charges(model: str, serving: Serving) -> None:
    if model == FLASH:
        serving = attrs.evolve(serving, max_running_requests=256)
    elif serving.speculative:
        model = V4_SOURCES
    p = plan(model, serving, memory="20GiB")
    allocated = build(p, "meta").allocated_by_pool()
    for pool in p.pools:
        assert allocated[pool.name] == pool.bytes, pool.name
    counts = dict(p.sizing.token_counts)
    for pool in p.pools:  # the cost lines reproduce every pool's bytes at the plan's counts (capacity answers)
        cost = pool.group_cost
        tokens = counts.get(cost.token_space, 0) if pool.unit == "token" else 0
        assert cost.bytes_for(tokens=tokens, requests=p.max_running_requests) == pool.bytes, pool.name


def test_v4_rows_of_a_low_ratio_pool_round_trip_on_cpu() -> None:
    p = plan(V41, Serving(max_running_requests=4, context_length=4096), memory="1GiB")
    pool = build(p, "cpu").kv_pool
    assert isinstance(pool, DSV4TokenToKVPool)
    rows = pool.low_ratio_kv_pools[2]
    loc = torch.tensor([0, 1, 130])
    nope = torch.randn(3, 448) * 3
    rope = torch.randn(3, 64)
    rows.set_kv(2, loc, nope, rope)
    got_nope, got_rope = rows.get_kv(2, loc, torch.float32)
    assert torch.equal(got_rope, rope.to(torch.bfloat16).float())
    assert torch.allclose(got_nope, nope, rtol=0.07, atol=0.02)


def test_v41_rows_by_hand() -> None:
    """A latent of ones: V4.1 fp8 scale 2 ** ceil(log2(1 / 448)) = 2 ** -8 (ue8m0 byte 127 - 8 = 119), values
    256.0 (e4m3 0x78); V4.1 fp4 scale e4m3(1 / 6) = 0.171875 (0x23), values 1 / 0.171875 = 5.8 -> e2m1 6 (code 7,
    two a byte: 0x77), read back 6 x 0.171875 = 1.03125.  Block-split: a page's data, then its scales."""
    p = plan(V41, Serving(max_running_requests=4, context_length=4096, dsv4_kv_layout="v41"), memory="1GiB")
    pool = build(p, "cpu").kv_pool
    ones_nope, ones_rope = torch.ones(1, 448), torch.ones(1, 64)
    swa = pool.swa_kv_pool  # v41, pages of 256
    swa.set_kv(0, torch.tensor([257]), ones_nope, ones_rope)  # page 1, slot 1
    page = swa.buffer(0)[1]
    assert bool((page[512:1024] == 0x78).all()) and bool((page[256 * 512 + 16 : 256 * 512 + 32] == 119).all())
    nope, rope = swa.get_kv(0, torch.tensor([257]), torch.float32)
    assert bool((nope == 1).all()) and bool((rope == 1).all())
    c1 = pool.low_ratio_kv_pools[1]  # v41_fp4 (auto next to V4.1), pages of 256
    c1.set_kv(1, torch.tensor([2]), ones_nope, ones_rope)  # page 0, slot 2
    page = c1.buffer(1)[0]
    assert bool((page[512:768] == 0x77).all()) and bool((page[256 * 256 + 64 : 256 * 256 + 96] == 0x23).all())
    nope, rope = c1.get_kv(1, torch.tensor([2]), torch.float32)
    assert bool((nope == 1.03125).all()) and bool((rope == 1.03125).all())


@pytest.mark.parametrize(
    ("model", "serving", "message"),
    [
        (FLASH, Serving(dsv4_kv_layout="v4", dsv4_compressed_kv_layout="fp4"),
         "the V4 main cache only pairs with V4 caches"),
        (FLASH, Serving(dsv4_kv_layout="v41", enable_hisparse=True, disable_radix_cache=True, accounting="sglang"),
         "HiSparse C4 pools support the V4 layout only"),
        (V4_SOURCES, Serving(pp_size=2, pp_rank=1, max_running_requests=64),
         "layer 6 (compress ratio 2) of pipeline stage"),
        (V41, Serving(pp_size=2, max_running_requests=64),
         "DeepSeek-V4.1 does not support pipeline parallelism yet; disable it to serve this model."),
        (V41, Serving(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
                      speculative_num_draft_tokens=4, speculative_draft_num_layers=1),
         "DeepSeek-V4.1 does not support speculative decoding other than DSpark yet"),
    ],
    ids=["v4-fp4", "hisparse-v41", "orphan-reader", "v41-pp", "v41-eagle"],
)  # fmt: skip
def test_refusals(model: str, serving: Serving, message: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match=re.escape(message)):
        plan(model, serving, memory="20GiB")


def test_vllm_accounting_refuses_the_low_ratios() -> None:
    """vLLM 0.33's DeepSeek-V4.1 (tests/dsv4/test_dsv41_vllm.py) needs index_source_layer_ids, which this config lacks,
    and refuses its ratio-4 / 128 layers."""
    from kvpools_core.engines.vllm import plan_vllm

    with pytest.raises(
        UnsupportedCombinationError, match=re.escape("DeepSeek V4.1 requires kv_source_layer_ids / index_source")
    ):
        plan_vllm(V41, Serving(), memory="20GiB")


def test_v41_needs_a_512_value_latent() -> None:
    from kvpools_plugins.dsv4.layouts import layout_problems

    from .test_dsv4_pool import small_model  # 128 nope + 64 rope

    problems = layout_problems(small_model(), Serving(dsv4_kv_layout="v41"))
    assert any("store a 512-value latent" in p and "= 192" in p for p in problems)
    assert layout_problems(small_model(), Serving()) == []
