"""Hybrid pools: every preset builds on meta with exactly the planned bytes; state slots, rows and layers on CPU."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from kvpools_plugins.mamba import hybrid_problems
from kvpools_plugins.mamba.pool import HybridLinearKVPool, HybridReqToTokenPool

from kvpools_core import Serving, build, plan
from kvpools_core.errors import InsufficientMemoryError
from kvpools_core.pools import PoolPlanMismatchError

from .support import CHECKS, PRESETS, decode_pool_slots, hybrid_budgets, hybrid_configs, hybrid_serving, parse

GiB = 1 << 30
EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
    "max_running_requests": 128,
}


@pytest.mark.parametrize("accounting", ["exact", "sglang"])
@pytest.mark.parametrize("preset", PRESETS)
def test_presets_build_on_meta_with_the_planned_bytes(preset: str, accounting: str) -> None:
    for options in ({}, {"tp_size": 2, **EAGLE}, {"enable_mamba_extra_buffer": True, "page_size": 64}):
        result = plan(preset, Serving(accounting=accounting, **options), memory="80GiB")
        pools = build(result, "meta")
        assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}, (preset, options)
        assert pools.allocated_bytes == result.planned_bytes
        if accounting == "exact":
            assert result.planned_bytes <= 80 * GiB
        assert isinstance(pools.req_to_token_pool, HybridReqToTokenPool)
        assert isinstance(pools.kv_pool, HybridLinearKVPool)


def test_state_pool_has_k_plus_one_slots_real_log_numbers() -> None:
    """Qwen3.5-397B-A17B at TP 2 with 82 state slots: the SSM tensors are 83 x 94,371,840 B = 7.29 GiB."""
    result = plan("qwen3.5-397b-a17b", Serving(tp_size=2, max_mamba_cache_size=82), memory="100GiB")
    pool = build(result, "meta").req_to_token_pool.mamba_pool
    assert tuple(pool.ssm.shape) == (45, 83, 32, 128, 128)
    assert pool.ssm.numel() * pool.ssm.element_size() == 7_832_862_720
    assert f"{7_832_862_720 / GiB:.2f}" == "7.29"
    assert tuple(pool.conv[0].shape) == (45, 83, 6144, 3)


def test_pipeline_stage_builds_its_own_layers() -> None:
    result = plan("qwen3-next-80b-a3b-thinking", Serving(pp_size=2, pp_rank=1), memory="40GiB")
    pools = build(result, "meta")
    assert pools.kv_pool.full_attention_layer_ids == (27, 31, 35, 39, 43, 47)
    assert pools.req_to_token_pool.mamba_pool.layer_ids[0] == 24
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}


def test_a_plan_the_builder_disagrees_with_is_refused_before_allocating() -> None:
    result = plan("jamba-1.5-mini", Serving(), memory="20GiB")
    state = result.pool("mamba_state")
    bad_pools = tuple(attrs.evolve(p, bytes=p.bytes + 1) if p is state else p for p in result.pools)
    bad = attrs.evolve(result, sizing=attrs.evolve(result.sizing, pools=bad_pools))
    with pytest.raises(PoolPlanMismatchError, match=r"'mamba_state' pool would allocate"):
        build(bad, "meta")


# ---------------------------------------------------------------------------
# a small model on CPU: rows, slots, layers
# ---------------------------------------------------------------------------

TINY: dict[str, Any] = {
    "architectures": ["Qwen3NextForCausalLM"],
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "full_attention_interval": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 64,
    "torch_dtype": "bfloat16",
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}


def tiny_pools(**options: Any) -> Any:
    spec = parse(TINY, "tiny")
    serving = Serving(accounting="sglang", max_mamba_cache_size=12, max_running_requests=8, **options)
    return build(plan(spec, serving, memory=8 << 20), "cpu")


def test_rows_take_state_slots_all_or_nothing() -> None:
    pools = tiny_pools(disable_radix_cache=True)  # ratio 1: 12 slots, 8 request rows
    table = pools.req_to_token_pool
    assert table.mamba_pool.available_size() == 12
    rows = table.alloc(8)
    assert rows == list(range(1, 9))
    slots = table.get_mamba_indices(torch.tensor(rows))
    assert sorted(slots.tolist()) == list(range(1, 9))
    assert table.mamba_pool.available_size() == 4
    table.free(rows[:6])
    assert table.alloc(7) is None  # only 6 rows free: nothing taken
    assert table.mamba_pool.available_size() == 10
    again = table.alloc(6)
    assert again is not None and table.mamba_pool.available_size() == 4


def test_state_slots_held_by_the_cache_run_out_before_rows() -> None:
    """Extra buffer: 1 + 2 ping-pong slots per request, ratio 5 -> 12 // 5 = 2 rows; cached states keep slots."""
    table = tiny_pools(enable_mamba_extra_buffer=True).req_to_token_pool
    assert table.available_size() == 2
    for _ in range(2):
        rows = table.alloc(2)
        assert rows is not None
        pingpong = table.req_index_to_mamba_ping_pong_track_buffer_mapping
        assert pingpong is not None and pingpong.shape == (3, 2) and bool((pingpong[1:] > 0).all())
        table.free(rows, free_state=False)  # the radix cache keeps them
    assert table.mamba_pool.available_size() == 0
    assert table.alloc(1) is None
    assert table.available_size() == 2  # the row was handed back


def test_a_cached_prefix_keeps_its_state_slot() -> None:
    table = tiny_pools(disable_radix_cache=True).req_to_token_pool
    rows = table.alloc(2)
    assert rows is not None
    table.free(rows, free_state=False)
    assert table.mamba_pool.available_size() == 10
    with pytest.raises(ValueError, match="not allocated"):
        table.free(rows)


def test_new_state_slots_start_zeroed_and_layers_are_global_ids() -> None:
    pools = tiny_pools(disable_radix_cache=True)
    table, kv = pools.req_to_token_pool, pools.kv_pool
    state = table.mamba_pool
    assert state.layer_ids == (0, 2)
    conv, ssm = state.layer_cache(2)
    assert tuple(ssm.shape) == (13, 4, 8, 8) and ssm.dtype == torch.float32
    assert tuple(conv[0].shape) == (13, 2 * 2 * 8 + 4 * 8, 3) and conv[0].dtype == torch.bfloat16
    ssm[5] = 1.0
    rows = table.alloc(1)
    assert rows is not None
    slot = int(table.get_mamba_indices(torch.tensor(rows)))
    assert float(ssm[slot].abs().sum()) == 0.0
    with pytest.raises(IndexError, match=r"Layer 1 has no recurrent state"):
        state.layer_cache(1)
    assert kv.full_attention_layer_ids == (1, 3)
    loc = torch.tensor([3, 7])
    k = torch.randn(2, 2, 16, dtype=torch.bfloat16)
    kv.set_kv_buffer(3, loc, k, k)
    assert torch.equal(kv.get_key_buffer(3)[loc], k)
    with pytest.raises(IndexError, match=r"Layer 2 keeps no KV on this rank"):
        kv.get_key_buffer(2)


def test_speculative_state_is_indexed_by_request_row() -> None:
    pools = tiny_pools(
        speculative_algorithm="EAGLE",
        speculative_num_steps=2,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=3,
        speculative_draft_num_layers=1,
    )
    spec = pools.req_to_token_pool.spec_state
    assert spec is not None
    requests = pools.plan.max_running_requests
    assert tuple(spec.intermediate_ssm.shape) == (2, requests + 1, 3, 4, 8, 8)
    assert pools.kv_pool.draft is not None


@settings(CHECKS, max_examples=120)
@given(st.data())
def test_generated_exact_plans_fit_and_build_on_meta(data: st.DataObject) -> None:
    """Any hybrid, any serving: the exact plan stays within its budget and ``build`` allocates it byte for byte."""
    config = data.draw(hybrid_configs(), label="config")
    spec = parse(config)
    serving = attrs.evolve(data.draw(hybrid_serving(spec), label="serving"), accounting="exact")
    assume(not hybrid_problems(spec, serving))
    memory = data.draw(hybrid_budgets(spec), label="memory")
    try:
        result = plan(spec, serving, memory=memory)
    except InsufficientMemoryError:
        event("refused")
        return
    assert result.planned_bytes <= memory
    pools = build(result, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    assert result.pool("mamba_state").slots == decode_pool_slots(
        result.sizing.sglang_config["max_mamba_cache_size"], result
    )
    event(f"planned ({serving.disaggregation_mode})")


def test_copy_on_write_between_state_slots() -> None:
    state = tiny_pools(disable_radix_cache=True).req_to_token_pool.mamba_pool
    src, dst = state.alloc(1), state.alloc(1)
    assert src is not None and dst is not None
    conv, ssm = state.layer_cache(0)
    ssm[src] = 2.0
    conv[0][src] = 3.0
    state.copy_from(src, dst)
    assert float(ssm[dst].min()) == 2.0 and float(conv[0][dst].min()) == 3.0
    state.clear_slots(dst)
    assert float(ssm[dst].abs().sum()) == 0.0
    assert "MambaStatePool(slots=12 + 1 padding, layers=2" in repr(state)
