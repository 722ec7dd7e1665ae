"""``build`` allocates exactly what the plan charges, pool by pool, for any MHA plan.

Hypothesis draws MHA models and serving options; each plan is built on
``meta`` (shapes and bytes, no memory), so plans of hundreds of GiB cost
nothing.  A handful of small plans are also built on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvpools_core import InsufficientMemoryError, ModelSpec, Plan, Serving, build, plan
from kvpools_core.cli.build_report import FULL_USE, build_summary
from tests.draft_shape import as_sglang_runs

KV_DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp8")


@st.composite
def mha_plans(draw: st.DrawFn, mha_model: Callable[..., ModelSpec]) -> Plan:
    kv = draw(st.sampled_from(KV_DTYPES))
    block = {"fp4_e2m1": 16, "mxfp8": 32}.get(kv, 8)
    dims = st.integers(1, 256 // block).map(lambda n: n * block)
    pp_size = draw(st.integers(1, 4))
    model = mha_model(
        layers=draw(st.integers(pp_size, 12)),
        kv_heads=draw(st.sampled_from([1, 2, 4, 8, 16])),
        head_dim=draw(dims),
        v_head_dim=draw(dims),
        dtype=draw(st.sampled_from(["bfloat16", "float16", "float32"])),
        context_len=draw(st.integers(64, 32768)),
    )
    tp = draw(st.sampled_from([1, 2, 4, 8]))
    dp_attention = draw(st.booleans())
    dp = draw(st.sampled_from([d for d in (1, 2, 4) if tp % d == 0])) if dp_attention else 1
    attn_tp = tp // dp
    options: dict[str, Any] = dict(
        kv_cache_dtype=kv,
        page_size=draw(st.sampled_from([1, 16, 64])),
        tp_size=tp,
        dp_size=dp,
        enable_dp_attention=dp_attention,
        dcp_size=draw(st.sampled_from([d for d in (1, 2, 4) if attn_tp % d == 0])),
        pp_size=pp_size,
        pp_rank=draw(st.integers(0, pp_size - 1)),
        max_total_tokens=draw(st.none() | st.integers(1, 1_000_000)),
        max_running_requests=draw(st.none() | st.integers(dp, 8192)),  # at least one per DP-attention worker
        accounting=draw(st.sampled_from(["exact", "exact", "sglang"])),
    )
    if draw(st.booleans()):
        options.update(
            speculative_algorithm=draw(st.sampled_from(["EAGLE", "EAGLE3", "STANDALONE", "DFLASH"])),
            speculative_draft_num_layers=draw(st.integers(1, 3)),
            speculative_num_steps=draw(st.integers(1, 4)),
            speculative_eagle_topk=draw(st.integers(1, 4)),
            speculative_num_draft_tokens=draw(st.integers(1, 16)),
        )
        options = as_sglang_runs(options)
    if draw(st.booleans()):
        options.update(disaggregation_mode="decode", disaggregation_decode_extra_slots=draw(st.integers(0, 256)))
    budget = draw(st.integers(24, 38).flatmap(lambda e: st.integers(1 << e, 1 << (e + 1))))  # 16 MiB .. 512 GiB
    try:
        return plan(model, Serving(**options), memory=budget)
    except InsufficientMemoryError:
        assume(False)
        raise


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_meta_build_matches_plan_exactly(data: st.DataObject, mha_model: Callable[..., ModelSpec]) -> None:
    planned = data.draw(mha_plans(mha_model))
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert pools.allocated_bytes == planned.planned_bytes
    if planned.serving.accounting == "exact":
        assert planned.planned_bytes <= planned.budget.budget_bytes
    assert pools.provenance["build_pool"] == ("mha",)
    kv = pools.kv_pool
    assert kv.device.type == "meta"
    start, end = kv.start_layer, kv.end_layer
    assert kv.get_key_buffer(start).shape[0] == planned.max_total_num_tokens + planned.serving.page_size
    with pytest.raises(IndexError):
        kv.get_key_buffer(end)
    summary = build_summary(pools)
    assert summary["matches_plan"] and summary["allocated_bytes"] == planned.planned_bytes
    serving = planned.serving
    if summary["budget_used"] < FULL_USE and serving.accounting == "exact" and serving.pp_size == 1:
        # the exact solve is maximal: unless a cap holds it, one more page must not fit
        reasons = summary["budget_explanation"]
        assert reasons, summary
        if serving.max_total_tokens is None:
            assert reasons[-1].startswith("one more page") and "remain." in reasons[-1], reasons


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_cpu_build_matches_plan_exactly(
    kv: str, page_size: int, small_plan: Callable[..., Plan], mha_model: Callable[..., ModelSpec]
) -> None:
    planned = small_plan(
        2 << 20,
        model=mha_model(layers=3, v_head_dim=32, context_len=128),
        kv_cache_dtype=kv,
        page_size=page_size,
        speculative_algorithm="EAGLE",
        speculative_draft_num_layers=1,
    )
    pools = build(planned, "cpu")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert pools.allocated_bytes == planned.planned_bytes <= planned.budget.budget_bytes
    tensors = [*pools.kv_pool.kv.k_buffer, *pools.kv_pool.draft.kv.v_buffer, pools.req_to_token_pool.req_to_token]
    assert all(t.device == torch.device("cpu") for t in tensors)
