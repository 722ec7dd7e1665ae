"""The DSV4 pool, its buffers' exact bytes, its allocator, on meta and cpu (hand-built model and plans)."""

from __future__ import annotations

import math

import attrs
import pytest
import torch
from kvpools_plugins.dsv4.buffers import DSV4Sizes, pool_specs
from kvpools_plugins.dsv4.building import build_allocator
from kvpools_plugins.dsv4.pool import DSV4TokenToKVPool

from kvpools_core.errors import PoolPlanMismatchError
from kvpools_core.parts.sizing import explicit_budget
from kvpools_core.values import CellPart, CellSize, LayerSpec, ModelSpec, Plan, PoolSizing, Serving

NOPE, ROPE, INDEX, WINDOW = 128, 64, 128, 128
RATIOS = (0, 4, 128, 4)
PAGE = 256
ROW = NOPE + 2 * ROPE + NOPE // 64 + 1  # 259 B: fp8 nope, bf16 rope, ue8m0 scales, pad


def small_model(ratios: tuple[int, ...] = RATIOS, nextn: int = 1) -> ModelSpec:
    layers = []
    for i, ratio in enumerate(ratios):
        params = {"compress_ratio": ratio, "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "window_size": WINDOW}
        if ratio == 4:
            params |= {"index_head_dim": INDEX, "index_n_heads": 8}
        kind = {0: "swa", 4: "c4", 128: "c128"}[ratio]
        layers.append(LayerSpec(index=i, kind=kind, num_kv_heads=1, head_dim=NOPE + ROPE, params=params))
    return ModelSpec(
        name="tiny-dsv4", architecture="dsv4", layers=layers, context_len=1024, dtype="bfloat16",
        num_nextn_predict_layers=nextn,
    )  # fmt: skip


SIZES = DSV4Sizes(full_tokens=2048, swa_tokens=1024, c4_tokens=512, c128_tokens=16, c4_state_size=64, c128_state_size=0)
REQUESTS = 4


def hand_plan(serving: Serving, sizes: DSV4Sizes = SIZES, model: ModelSpec | None = None) -> Plan:
    model = model or small_model()
    pools = pool_specs(model, serving, sizes, max_running_requests=REQUESTS, context_len=model.context_len)
    config = {
        "max_total_num_tokens": sizes.full_tokens,
        "full_max_total_num_tokens": sizes.full_tokens,
        "swa_max_total_num_tokens": sizes.swa_tokens,
        "c4_max_total_num_tokens": sizes.c4_tokens,
        "c128_max_total_num_tokens": sizes.c128_tokens,
        "c4_state_pool_size": sizes.c4_state_size,
        "c128_state_pool_size": sizes.c128_state_size,
    }
    counts = {"full": sizes.full_tokens, "swa": sizes.swa_tokens, "c4": sizes.c4_tokens, "c128": sizes.c128_tokens}
    sizing = PoolSizing(
        max_total_num_tokens=sizes.full_tokens,
        max_running_requests=REQUESTS,
        pools=pools,
        sglang_config=config,
        token_counts=counts,
    )
    cell = CellSize(
        parts=[CellPart("kv_swa", ROW * len(model.layers), "kv_swa")], sglang_bytes_per_token=1, num_layers=4
    )
    budget = explicit_budget(sum(p.bytes for p in pools))
    return Plan(model=model, serving=serving, budget=budget, cell=cell, sizing=sizing)


def _ceil(x: int, m: int) -> int:
    return -(-x // m) * m


def test_pool_specs_bytes_by_hand() -> None:
    serving = Serving(page_size=PAGE)
    by_name = {p.name: p for p in pool_specs(small_model(), serving, SIZES, max_running_requests=4, context_len=1024)}
    swa_page = _ceil(PAGE * ROW, 576)  # 66,816: 256 rows padded to a multiple of 576 B
    # SGLang 0.5.23 _num_dsv4_physical_kv_pages(size, page, global_page) = ceil((size + global_page) / page)
    # (deepseek_v4_memory_pool.py L166-171); the compressed pools and the indexer pass global_page_size=P = 256
    # (_init_compressed_pools L1579-1589, L1615-1625): the reserved logical page is 4 c4 / 128 c128 pages.
    assert by_name["kv_swa"].bytes == 5 * swa_page * 4  # ceil((1024 + 256) / 256) = 5 pages, every layer
    assert by_name["kv_c4"].bytes == 12 * _ceil(64 * ROW, 576) * 2  # ceil((512 + 256) / 64) = 12 pages of 64
    assert by_name["kv_c128"].bytes == 136 * 576 * 1  # ceil((16 + 256) / 2) = 136 pages of 2, one padded 576 B row
    assert by_name["indexer_c4"].bytes == 12 * 64 * 132 * 2  # logical c4 = 32 x 16 = 512: ceil((512 + 256) / 64)
    assert by_name["c4_state"].bytes == _ceil(64 + 8 + 1, 4) * 4 * (NOPE + ROPE) * 4 * 2  # fp32, overlap: 4 x head
    assert by_name["c4_indexer_state"].bytes == _ceil(64 + 8 + 1, 4) * 4 * INDEX * 4 * 2
    slots = REQUESTS + 1
    assert by_name["c128_state"].bytes == _ceil(slots * 128 + 128 + 1, 128) * 2 * (NOPE + ROPE) * 4  # rounded to 128
    assert by_name["full_to_swa"].bytes == (2048 + PAGE + 1) * 8
    assert by_name["req_to_token"].unit == "request"
    assert {p.token_space for p in by_name.values() if p.unit == "token"} == {"full", "swa", "c4", "c128"}
    assert "draft_kv_swa" not in by_name


def test_pool_specs_variants() -> None:
    model = small_model()
    bf16 = pool_specs(model, Serving(page_size=PAGE, dsv4_compress_state_dtype="bf16"), SIZES,
                      max_running_requests=4, context_len=1024)  # fmt: skip
    fp32 = pool_specs(model, Serving(page_size=PAGE), SIZES, max_running_requests=4, context_len=1024)
    b16, b32 = ({p.name: p.bytes for p in pools} for pools in (bf16, fp32))
    for name in ("c4_state", "c4_indexer_state", "c128_state"):
        assert b16[name] * 2 == b32[name]
    online = {p.name: p.bytes for p in pool_specs(model, Serving(page_size=PAGE, enable_online_compress=True), SIZES,
                                                   max_running_requests=4, context_len=1024)}  # fmt: skip
    assert online["c128_state"] == (REQUESTS + 1 + 2) * 3 * (NOPE + ROPE) * 4  # ring 1, (max, sum, kv), unrounded
    spec = Serving(page_size=PAGE, speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
                   speculative_num_draft_tokens=4)  # fmt: skip
    by = {p.name: p.bytes for p in pool_specs(model, spec, SIZES, max_running_requests=4, context_len=1024)}
    assert by["draft_kv_swa"] == 5 * _ceil(PAGE * ROW, 576) * 1  # one NextN layer, ceil((1024 + 256) / 256) pages
    assert by["c4_state"] == _ceil(64 + 16 + 1, 4) * 4 * (NOPE + ROPE) * 4 * 2  # speculative ring 16
    assert by["c128_state"] == _ceil((REQUESTS + 1) * 256 + 257, 128) * 2 * (NOPE + ROPE) * 4  # ring 256
    hisparse = {p.name for p in pool_specs(model, Serving(page_size=PAGE, enable_hisparse=True), SIZES,
                                           max_running_requests=4, context_len=1024)}  # fmt: skip
    assert "c4_hisparse_ptrs" in hisparse


@pytest.mark.parametrize(
    "serving",
    [
        Serving(page_size=PAGE),
        Serving(page_size=PAGE, dsv4_compress_state_dtype="bf16"),
        Serving(page_size=PAGE, enable_online_compress=True),
        Serving(page_size=PAGE, enable_hisparse=True, hisparse_config='{"host_to_device_ratio": 4}'),
        Serving(page_size=128, speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
                speculative_num_draft_tokens=4),
        Serving(page_size=PAGE, disaggregation_mode="decode", disaggregation_decode_extra_slots=3),
    ],
    ids=["base", "bf16-state", "online", "hisparse", "eagle-p128", "decode"],
)  # fmt: skip
def test_meta_build_matches_plan_and_cost(serving: Serving) -> None:
    sizes = SIZES if serving.page_size == PAGE else attrs.evolve(SIZES, c4_state_size=128)
    plan = hand_plan(serving, sizes)
    pool = DSV4TokenToKVPool.from_plan(plan, "meta")
    measured = pool.nbytes_by_pool()
    for name, nbytes in measured.items():
        assert nbytes == plan.pool(name).bytes, name
    allocator = build_allocator(plan=plan, pool=pool, device="meta", checked=False)
    for name, nbytes in allocator.nbytes_by_pool().items():
        assert nbytes == plan.pool(name).bytes, name
    counts = dict(plan.sizing.token_counts)
    for p in plan.pools:  # the cost model reproduces every pool's bytes at the plan's counts
        cost = p.group_cost
        tokens = counts.get(cost.token_space, 0) if p.unit == "token" else 0
        assert cost.bytes_for(tokens=tokens, requests=REQUESTS) == p.bytes, p.name


def test_refuses_before_allocating_when_the_plan_disagrees(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = hand_plan(Serving(page_size=PAGE))
    pools = tuple(attrs.evolve(p, bytes=p.bytes - 1) if p.name == "c4_state" else p for p in plan.pools)
    bad = attrs.evolve(plan, sizing=attrs.evolve(plan.sizing, pools=pools))
    calls = []
    monkeypatch.setattr("kvpools_plugins.dsv4.pool.allocate_buffers", lambda *a: calls.append(a))
    with pytest.raises(PoolPlanMismatchError, match="c4_state"):
        DSV4TokenToKVPool.from_plan(bad, "cpu")
    assert not calls
    missing = attrs.evolve(plan, sizing=attrs.evolve(plan.sizing, pools=[p for p in plan.pools if p.name != "kv_c128"]))
    with pytest.raises(PoolPlanMismatchError, match="kv_c128"):
        DSV4TokenToKVPool.from_plan(missing, "cpu")


@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
def test_cpu_build_writes_and_reads_rows(state_dtype: str) -> None:
    torch.manual_seed(0)
    plan = hand_plan(Serving(page_size=PAGE, dsv4_compress_state_dtype=state_dtype, platform="cpu"))
    pool = DSV4TokenToKVPool.from_plan(plan, "cpu")
    allocator = build_allocator(plan=plan, pool=pool, device="cpu", checked=True)
    full = allocator.alloc(PAGE)
    assert full is not None
    swa_loc = pool.translate_loc_from_full_to_swa(full[:5])
    assert bool((swa_loc > 0).all())
    nope, rope = torch.randn(5, NOPE), torch.randn(5, ROPE)
    for layer in range(4):  # SWA rows of every layer: packed fp8 nope (ue8m0 scales) + bf16 rope
        pool.set_swa_kv(layer, swa_loc, nope, rope)
        got_nope, got_rope = pool.get_swa_kv(layer, swa_loc, torch.float32)
        assert torch.allclose(got_rope, rope.bfloat16().float())
        assert torch.allclose(got_nope, nope, rtol=0.07, atol=0.07 * float(nope.abs().max()) / 8)
    loc = torch.tensor([1, 7, 63, 64, 511])
    pool.set_extra_kv(1, loc, nope, rope)  # c4 rows
    assert torch.allclose(pool.get_extra_kv(1, loc, torch.float32)[1], rope.bfloat16().float())
    c128_loc = torch.tensor([1, 2, 3, 15, 16])
    pool.set_extra_kv(2, c128_loc, nope, rope)  # c128 rows: pages of 2 tokens, each page padded to 576 B
    got = pool.get_extra_kv(2, c128_loc, torch.float32)
    assert torch.allclose(got[1], rope.bfloat16().float())
    with pytest.raises(ValueError, match="SWA-only"):
        pool.set_extra_kv(0, loc, nope, rope)
    keys = torch.randn(5, INDEX)
    pool.set_index_k(3, loc, keys)
    assert torch.allclose(pool.get_index_k(3, loc, torch.float32), keys, rtol=0.07, atol=0.02)
    with pytest.raises(IndexError):
        pool.set_index_k(2, loc, keys)  # only c4 layers carry the indexer
    states = pool.attention_states(1)
    kv, score = torch.randn(3, 2 * (NOPE + ROPE)), torch.randn(3, 2 * (NOPE + ROPE))
    rows = torch.tensor([0, 5, 9])
    states.set_state(1, rows, kv, score)
    got_kv, got_score = states.get_state(1, rows)
    dtype = getattr(torch, state_dtype)
    assert got_kv.dtype == dtype and torch.equal(got_kv, kv.to(dtype)) and torch.equal(got_score, score.to(dtype))
    last = states.buffer(1)[-1]
    assert bool((last[: last.numel() // 2] == 0).all()) and bool(torch.isinf(last[last.numel() // 2 :]).all())
    assert pool.indexer_states(3).buffer(3).shape[-1] == 4 * INDEX
    assert pool.attention_states(2).buffer(2).shape == (math.ceil((5 * 128 + 129) / 128) * 128, 2 * (NOPE + ROPE))
    allocator.free(full)
    assert int(pool.full_to_swa_index_mapping[full].abs().sum()) == 0
