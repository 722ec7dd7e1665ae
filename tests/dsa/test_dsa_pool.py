"""The DSA pool: latent rows (packed fp8 when planned so) plus the paged indexer keys, exactly as planned."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kvpools_plugins.dsa import INDEX_PART

from kvpools_core import CellPart, InsufficientMemoryError, Plan, Serving, build, plan
from kvpools_core.errors import ConfigError, PoolPlanMismatchError
from kvpools_core.parts.names import INDEX_POOL
from kvpools_core.pools.dsa import (
    INDEX_ROWS_PART,
    PAGED_INDEX_PART,
    DSATokenToKVPool,
    IndexStorage,
    index_storage,
    plan_latent_row,
)
from kvpools_core.pools.quant import fp8_quantize
from tests.dsa.support import SMALL_DSA

from ..mla.oracle_support import latent_configs, parse

KV_DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1")


def small_dsa_plan(memory: int = 4 << 20, **serving: Any) -> Plan:
    """4 DSA layers of a 128 + 32 latent row and the 128-dim indexer, short context."""
    config = {**SMALL_DSA, "num_nextn_predict_layers": 1}
    return plan(parse(config), Serving(**{"page_size": 64, **serving}), memory=memory)


@st.composite
def dsa_plans(draw: st.DrawFn) -> Plan:
    config = draw(latent_configs(dsa=True, max_layers=12))
    config["max_position_embeddings"] = draw(st.integers(64, 32768))
    spec = parse(config)
    pp = draw(st.integers(1, min(2, spec.num_layers)))
    cp = draw(st.sampled_from((1, 2, 4)))
    options: dict[str, Any] = dict(
        kv_cache_dtype=draw(st.sampled_from(KV_DTYPES)),
        platform=draw(st.sampled_from(("cuda", "rocm"))),
        tp_size=4,
        attn_cp_size=cp,
        enable_dsa_cache_layer_split=draw(st.booleans()),
        dsa_decode_backend=draw(st.sampled_from(("flashmla_kv", "trtllm"))),
        pp_size=pp,
        pp_rank=draw(st.integers(0, pp - 1)),
        accounting=draw(st.sampled_from(("exact", "exact", "sglang"))),
    )
    options["page_size"] = 64 if options["platform"] == "cuda" else draw(st.sampled_from((1, 16, 64)))
    if options["enable_dsa_cache_layer_split"]:
        options["disaggregation_mode"] = "prefill"  # SGLang runs the split on a PD prefill node only
    if draw(st.booleans()):
        options.update(speculative_algorithm="EAGLE", speculative_draft_num_layers=draw(st.integers(1, 2)))
    budget = draw(st.integers(22, 38).flatmap(lambda e: st.integers(1 << e, 1 << (e + 1))))
    try:
        return plan(spec, Serving(**options), memory=budget)
    except InsufficientMemoryError:
        assume(False)
        raise


@pytest.mark.usefixtures("rocm_platform")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dsa_plans())
def test_meta_build_matches_the_plan_pool_by_pool(planned: Plan) -> None:
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert pools.allocated_bytes == planned.planned_bytes
    if planned.serving.accounting == "exact":
        assert planned.planned_bytes <= planned.budget.budget_bytes
    kv = pools.kv_pool
    page = planned.serving.page_size
    pages = (planned.max_total_num_tokens + page + 1) // page
    assert tuple(kv.get_index_k_with_scale_buffer(kv.start_layer).shape) == (pages, page * 132)
    assert Plan.from_json(planned.to_json()) == planned


@pytest.mark.parametrize("kv", KV_DTYPES)
def test_cpu_build_matches_the_plan(kv: str) -> None:
    planned = small_dsa_plan(kv_cache_dtype=kv, speculative_algorithm="NEXTN")
    pools = build(planned, "cpu")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert set(pools.allocated_by_pool()) == {"kv", "indexer", "draft_kv", "draft_indexer", "req_to_token", "allocator"}
    assert pools.allocated_bytes == planned.planned_bytes <= planned.budget.budget_bytes


def test_packed_fp8_row_layout_and_round_trip() -> None:
    """656-style row for 128 + 32: 128 fp8 latent bytes, one fp32 scale, 32 bf16 rope values (64 bytes) = 196."""
    pool = build(small_dsa_plan(kv_cache_dtype="fp8_e4m3"), "cpu").kv_pool
    assert isinstance(pool, DSATokenToKVPool)
    assert pool.kv_cache_dim == 128 + 4 + 64 == 196
    assert tuple(pool.get_key_buffer(0).shape[1:]) == (1, 196) and pool.get_key_buffer(0).dtype == torch.float8_e4m3fn
    loc = torch.tensor([65, 3, 64])
    nope = torch.randn(3, 1, 128, generator=torch.Generator().manual_seed(0)) * 5
    rope = torch.randn(3, 1, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    pool.set_mla_kv_buffer(2, loc, nope, rope)
    row = pool.kv_buffer[2][loc].reshape(3, -1)
    scale = row[:, 128:132].contiguous().view(torch.float32)
    assert torch.equal(scale.squeeze(1), nope.abs().amax(-1).squeeze(1) / 448)
    assert torch.equal(row[:, 132:].contiguous().view(torch.bfloat16), rope.reshape(3, 32))
    got_nope, got_rope = pool.get_mla_kv(2, loc, torch.float32)
    expected = fp8_quantize(nope / scale.reshape(3, 1, 1), torch.float8_e4m3fn).float() * scale.reshape(3, 1, 1)
    assert torch.equal(got_nope, expected)
    assert torch.equal(got_rope, rope.float())
    with pytest.raises(ValueError, match="packed fp8 row"):
        pool.set_kv_buffer(2, loc, torch.zeros(3, 1, 160))


def test_indexer_keys_are_paged_keys_first_then_scales() -> None:
    pool = build(small_dsa_plan(), "cpu").kv_pool
    assert isinstance(pool, DSATokenToKVPool)
    loc = torch.tensor([64, 130, 127])  # page 1 offset 0, page 2 offset 2, page 1 offset 63
    keys = torch.randn(3, 128, generator=torch.Generator().manual_seed(2)) * 7
    pool.set_index_k(1, loc, keys)
    buffer = pool.get_index_k_with_scale_buffer(1)
    scale = keys.abs().amax(-1) / 448
    assert torch.equal(
        buffer[2, 2 * 128 : 3 * 128].view(torch.float8_e4m3fn).float(),
        fp8_quantize(keys[1] / scale[1], torch.float8_e4m3fn).float(),
    )
    assert torch.equal(buffer[1, 64 * 128 + 63 * 4 : 64 * 128 + 64 * 4].view(torch.float32), scale[2:3])
    assert torch.equal(pool.get_index_k_scale(1, loc).squeeze(1), scale)
    dequant = pool.get_index_k_dequant(1, loc, torch.float32)
    assert torch.allclose(dequant, keys, rtol=0.07, atol=0)  # e4m3: 3 mantissa bits
    untouched = torch.ones(buffer.shape[0], dtype=torch.bool)
    untouched[[1, 2]] = False
    assert not buffer[untouched].any() and not pool.get_index_k_with_scale_buffer(0).any()


def test_layer_split_owns_a_contiguous_share_and_one_remote_scratch() -> None:
    """4 layers over 2 CP ranks: rank 0 owns layers 0 and 1, layers 2 and 3 read through the scratch buffers."""
    serving = {
        "tp_size": 2,
        "attn_cp_size": 2,
        "enable_dsa_cache_layer_split": True,
        "kv_cache_dtype": "fp8_e4m3",
        "disaggregation_mode": "prefill",
    }
    planned = small_dsa_plan(**serving)
    pools = build(planned, "cpu")
    pool = pools.kv_pool
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert pool.owned == range(0, 2)
    assert [t.shape[0] for t in pool.kv_buffer] == [planned.max_total_num_tokens + 64] * 2 + [0, 0]
    assert pool.get_key_buffer(3).data_ptr() == pool.remote_kv_buffer.data_ptr()
    assert pool.get_index_k_with_scale_buffer(2).data_ptr() == pool.remote_index_k_with_scale_buffer.data_ptr()
    nope, rope = torch.ones(1, 1, 128), torch.ones(1, 1, 32)
    pool.set_mla_kv_buffer(3, torch.tensor([5]), nope, rope)  # owned by rank 1: dropped here
    assert not pool.remote_kv_buffer.any()
    pool.set_mla_kv_buffer(1, torch.tensor([5]), nope, rope)
    assert pool.kv_buffer[1][5].any()


# -- the indexer storage is the plan's -------------------------------------------------


def _with_index_parts(planned: Plan, *parts: CellPart) -> Plan:
    kept = [part for part in planned.cell.parts if part.pool != INDEX_POOL]
    return attrs.evolve(planned, cell=attrs.evolve(planned.cell, parts=(*kept, *parts)))


def test_the_plans_indexer_part_names_the_storage() -> None:
    """``indexer`` → CUDA's pages (132 B per token per layer); ``index_k`` → rows of the KV store dtype."""
    planned = small_dsa_plan()
    assert index_storage(planned) == IndexStorage(128) and IndexStorage(128).row_bytes == 132
    assert INDEX_PART == PAGED_INDEX_PART  # the DSA plugin names the part the store reads
    rows = _with_index_parts(planned, CellPart(INDEX_ROWS_PART, 4 * 256, INDEX_POOL))
    assert index_storage(rows) == IndexStorage(128, torch.bfloat16) and index_storage(rows).row_bytes == 256
    fp8 = small_dsa_plan(kv_cache_dtype="fp8_e4m3")
    assert index_storage(_with_index_parts(fp8, CellPart(INDEX_ROWS_PART, 4 * 128, INDEX_POOL))).rows_dtype == (
        torch.uint8
    )
    with pytest.raises(PoolPlanMismatchError, match=r"has the part\(s\) \['keys'\].*'indexer'.*'index_k'"):
        index_storage(_with_index_parts(planned, CellPart("keys", 4 * 256, INDEX_POOL)))
    fp4 = small_dsa_plan(kv_cache_dtype="fp4_e2m1")
    with pytest.raises(ConfigError, match="fp4_e2m1 has block scales, so it has no plain row"):
        index_storage(_with_index_parts(fp4, CellPart(INDEX_ROWS_PART, 4 * 128, INDEX_POOL)))


def test_a_plan_whose_index_rows_disagree_with_its_bytes_is_refused() -> None:
    """Plain rows of 128 bf16 are 256 B per layer: a part of another size is caught before allocating."""
    planned = _with_index_parts(small_dsa_plan(), CellPart(INDEX_ROWS_PART, 4 * 132, INDEX_POOL))
    with pytest.raises(PoolPlanMismatchError, match=r"'indexer' pool would allocate \d+ B .*128 torch.bfloat16"):
        DSATokenToKVPool.from_plan(planned, "meta")


def test_the_latent_row_is_the_plans() -> None:
    """fp8 on CUDA plans DSA's packed row (656 B for 512 + 64); a plan of the plain row's parts builds it plain."""
    packed = small_dsa_plan(kv_cache_dtype="fp8_e4m3")
    assert plan_latent_row(packed).packed_fp8
    plain_parts = (CellPart("latent", 128 * 4), CellPart("rope", 32 * 4))  # fp8: a byte per value, 4 layers
    indexer = [part for part in packed.cell.parts if part.pool == INDEX_POOL]
    plain = attrs.evolve(packed, cell=attrs.evolve(packed.cell, parts=(*plain_parts, *indexer)))
    assert not plan_latent_row(plain).packed_fp8
