"""The MLA pool: ``build`` allocates exactly what the plan charges, and latent rows read back what was written."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvpools_core import InsufficientMemoryError, Plan, Serving, build, plan
from kvpools_core.pools import PoolPlanMismatchError
from kvpools_core.pools.mla import MLATokenToKVPool
from kvpools_core.pools.quant import fp4_dequantize, fp4_quantize, fp8_quantize
from kvpools_core.values import ModelSpec

from .oracle_support import latent_configs, parse

KV_DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1")


def small_mla(**changes: Any) -> ModelSpec:
    """3 layers of a 32 + 16 latent row (fp4-compatible: 48 is a multiple of 16), short context."""
    config = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "kv_lora_rank": 32,
        "qk_rope_head_dim": 16,
        "max_position_embeddings": 128,
        "torch_dtype": "bfloat16",
        "num_nextn_predict_layers": 1,
    }
    return parse({**config, **changes})


def small_plan(kv: str = "auto", page_size: int = 1, memory: int = 1 << 20, **serving: Any) -> Plan:
    return plan(small_mla(), Serving(kv_cache_dtype=kv, page_size=page_size, **serving), memory=memory)


@st.composite
def mla_plans(draw: st.DrawFn) -> Plan:
    config = draw(latent_configs(dsa=False, max_layers=12))
    config["max_position_embeddings"] = draw(st.integers(64, 32768))
    spec = parse(config)
    pp = draw(st.integers(1, min(3, spec.num_layers)))
    tp = draw(st.sampled_from((1, 2, 8)))
    options: dict[str, Any] = dict(
        kv_cache_dtype=draw(st.sampled_from(KV_DTYPES)),
        page_size=draw(st.sampled_from((1, 16, 64))),
        tp_size=tp,
        dp_size=tp,
        enable_dp_attention=tp > 1,
        pp_size=pp,
        pp_rank=draw(st.integers(0, pp - 1)),
        max_total_tokens=draw(st.none() | st.integers(1, 1_000_000)),
        accounting=draw(st.sampled_from(("exact", "exact", "sglang"))),
    )
    if draw(st.booleans()):
        options.update(speculative_algorithm="EAGLE", speculative_draft_num_layers=draw(st.integers(1, 3)))
    budget = draw(st.integers(22, 38).flatmap(lambda e: st.integers(1 << e, 1 << (e + 1))))  # 4 MiB .. 512 GiB
    try:
        return plan(spec, Serving(**options), memory=budget)
    except InsufficientMemoryError:
        assume(False)
        raise


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mla_plans())
def test_meta_build_matches_the_plan_pool_by_pool(planned: Plan) -> None:
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert pools.allocated_bytes == planned.planned_bytes
    if planned.serving.accounting == "exact":
        assert planned.planned_bytes <= planned.budget.budget_bytes
    assert pools.provenance["build_pool"] == ("mla",)
    kv = pools.kv_pool
    rows = planned.max_total_num_tokens + planned.serving.page_size
    width = kv.kv_cache_dim // 2 if kv.row.kv.is_fp4 else kv.kv_cache_dim
    assert tuple(kv.get_key_buffer(kv.start_layer).shape) == (rows, 1, width)
    with pytest.raises(IndexError, match="another pipeline stage"):
        kv.get_key_buffer(kv.end_layer)
    assert Plan.from_json(planned.to_json()) == planned


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("page_size", (1, 16))
def test_cpu_build_matches_the_plan(kv: str, page_size: int) -> None:
    planned = small_plan(kv, page_size, speculative_algorithm="NEXTN")
    pools = build(planned, "cpu")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert pools.allocated_bytes == planned.planned_bytes <= planned.budget.budget_bytes
    assert set(pools.allocated_by_pool()) == {"kv", "draft_kv", "req_to_token", "allocator"}
    assert pools.kv_pool.draft is not None and pools.kv_pool.draft.layer_num == 1
    assert all(t.device == torch.device("cpu") for t in pools.kv_pool.kv_buffer)


def rows(n: int, dim: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 1, dim, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize("kv", ("bf16", "fp16", "fp32"))
def test_native_rows_round_trip_exactly(kv: str) -> None:
    pool = build(small_plan(kv), "cpu").kv_pool
    dtype = pool.dtype
    loc = torch.tensor([5, 1, 9])
    nope, rope = rows(3, 32).to(dtype), rows(3, 16, seed=1).to(dtype)
    pool.set_mla_kv_buffer(2, loc, nope, rope)
    got_nope, got_rope = pool.get_mla_kv(2, loc, dtype)
    assert torch.equal(got_nope, nope) and torch.equal(got_rope, rope)
    assert torch.equal(pool.get_key_buffer(2)[loc], torch.cat((nope, rope), -1))
    assert torch.equal(pool.get_value_buffer(2)[loc], nope)
    assert not pool.get_key_buffer(2)[0].any()  # the padding slot is never written
    assert not pool.get_key_buffer(1)[loc].any()  # nor another layer


@pytest.mark.parametrize("kv", ("fp8_e4m3", "fp8_e5m2"))
def test_fp8_rows_read_back_their_fp8_values(kv: str) -> None:
    pool = build(small_plan(kv), "cpu").kv_pool
    assert pool.get_key_buffer(0).dtype == pool.dtype and pool.kv_buffer[0].dtype == torch.uint8
    loc = torch.tensor([3, 4])
    k = rows(2, 48)
    pool.set_kv_buffer(0, loc, k, k)  # cache_v is ignored: MLA's V is K's latent
    expected = fp8_quantize(k, pool.dtype).float()
    nope, rope = pool.get_mla_kv(0, loc, torch.float32)
    assert torch.equal(torch.cat((nope, rope), -1), expected)


def test_fp4_rows_store_packed_values_and_scales() -> None:
    pool = build(small_plan("fp4_e2m1"), "cpu").kv_pool
    assert tuple(pool.kv_buffer[0].shape[1:]) == (1, 24) and tuple(pool.get_scale_buffer(0).shape[1:]) == (3,)
    loc = torch.tensor([2, 7, 6])
    nope, rope = rows(3, 32), rows(3, 16, seed=2)
    pool.set_mla_kv_buffer(1, loc, nope, rope)
    packed, scale = fp4_quantize(torch.cat((nope, rope), -1))
    expected = fp4_dequantize(packed, scale, torch.float32)
    got = torch.cat(pool.get_mla_kv(1, loc, torch.float32), -1)
    assert torch.equal(got, expected)
    assert torch.allclose(
        got, torch.cat((nope, rope), -1), atol=scale.view(torch.float8_e4m3fn).float().max()
    )  # half the widest grid step


def test_pipeline_stage_uses_global_layer_ids() -> None:
    planned = small_plan(pp_size=2, pp_rank=1)  # 3 layers: stage 0 holds [0, 1), stage 1 holds [1, 3)
    pool = build(planned, "cpu").kv_pool
    assert (pool.start_layer, pool.end_layer, pool.layer_num) == (1, 3, 2)
    loc = torch.tensor([1])
    pool.set_kv_buffer(2, loc, rows(1, 48).to(torch.bfloat16))
    with pytest.raises(IndexError, match=r"Layer 0 is not in the 'kv' pool: it holds layers \[1, 3\)"):
        pool.get_key_buffer(0)


def test_write_shapes_are_checked() -> None:
    pool = build(small_plan(), "cpu").kv_pool
    with pytest.raises(ValueError, match=r"expected \(2, 1, 48\)"):
        pool.set_kv_buffer(0, torch.tensor([1, 2]), torch.zeros(2, 1, 40))
    with pytest.raises(ValueError, match=r"k_rope has shape \(1, 1, 8\), expected \(1, 1, 16\)"):
        pool.set_mla_kv_buffer(0, torch.tensor([1]), torch.zeros(1, 1, 32), torch.zeros(1, 1, 8))


def test_a_plan_the_pool_disagrees_with_is_refused_before_allocating() -> None:
    planned = small_plan()
    kv = planned.pool("kv")
    tampered = attrs.evolve(
        planned,
        sizing=attrs.evolve(
            planned.sizing, pools=[attrs.evolve(p, bytes=p.bytes - 1) if p is kv else p for p in planned.pools]
        ),
    )
    with pytest.raises(PoolPlanMismatchError, match=r"'kv' pool would allocate \d+ B but the plan charges"):
        MLATokenToKVPool.from_plan(tampered, "meta")
