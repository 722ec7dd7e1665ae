"""PD disaggregation on a hybrid: the decode node's table, state pool and radix cache, the prefill node, by hand.

A decode node (``--disaggregation-mode decode``) runs without the radix cache (SGLang 0.5.23
``handle_pd_disaggregation``, ``arg_groups/pd_disaggregation_hook.py`` lines 98-121), so one state slot per
request and K = ``--max-running-requests // dp``; its request table is ``HybridMambaDecodeReqToTokenPool``
(ref-000 lines 1003-1022, 1063-1102): ``max_running_requests + pre_alloc_size + 1`` rows and a state pool of
``max(K, (max_running_requests + pre_alloc_size) x 1)`` slots (``disaggregation/decode.py``), of which SGLang's
budget charged ``K + 1``.  Qwen3-Next at TP 4: 19,316,736 B of state per slot (36 GDN layers x (2048 x 3 x 2 +
8 x 128 x 128 x 4)), 12,288 B of KV per token (1 KV head x 256 x (K + V) x bf16 x 12 layers), a request row of
(262,144 + 4) int32 = 1,048,592 B.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import attrs
import pytest
import torch
from kvpools_plugins.mamba.pool import HybridMambaDecodeReqToTokenPool, HybridReqToTokenPool

from kvpools_core import Serving, build, plan
from kvpools_core.errors import UnsupportedCombinationError

from .test_mamba_pool import tiny_pools

GiB = 1 << 30
QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"
PER_SLOT = 19_316_736
CELL = 12_288
ROW = 1_048_592
DECODE = {"disaggregation_mode": "decode", "tp_size": 4, "max_running_requests": 16}
DP4 = {"tp_size": 4, "dp_size": 4, "enable_dp_attention": True}


def decode_plan(accounting: str = "sglang", **options: Any) -> Any:
    return plan(QWEN3_NEXT, Serving(accounting=accounting, **{**DECODE, **options}), memory=20 * GiB)


# ---------------------------------------------------------------------------
# SGLang's default of --disaggregation-decode-extra-slots
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "extra"),
    [
        ({"disaggregation_mode": "decode", "max_running_requests": 16}, 32),  # 16 per worker <= 32: twice that
        ({"disaggregation_mode": "decode", "max_running_requests": 32}, 64),
        ({"disaggregation_mode": "decode", "max_running_requests": 33}, 0),  # large batches get none
        ({"disaggregation_mode": "decode"}, 0),  # no --max-running-requests: none
        ({"disaggregation_mode": "decode", "max_running_requests": 100, **DP4}, 50),  # 25 per DP worker
        ({"disaggregation_mode": "decode", "max_running_requests": 7, **DP4}, 2),  # max(1, 7 // 4) = 1
        ({"disaggregation_mode": "decode", "max_running_requests": 16, "disaggregation_decode_extra_slots": 3}, 3),
        ({"disaggregation_mode": "prefill", "max_running_requests": 16}, 0),  # only a decode launch pre-allocates
        ({"disaggregation_mode": "prefill", "disaggregation_decode_extra_slots": 3}, 0),
        ({"max_running_requests": 16}, 0),
    ],
)
def test_decode_extra_slots_default(options: dict[str, Any], extra: int) -> None:
    """``max(1, max_running_requests // num_dp_ranks)`` per worker, doubled when at most 32 (lines 123-143)."""
    assert Serving(**options).decode_extra_slots == extra


def test_a_decode_node_runs_without_the_radix_cache() -> None:
    assert Serving(disaggregation_mode="decode").radix_cache_disabled
    assert not Serving(disaggregation_mode="prefill").radix_cache_disabled
    assert Serving(disable_radix_cache=True).radix_cache_disabled


# ---------------------------------------------------------------------------
# the decode node by hand
# ---------------------------------------------------------------------------


def test_decode_plan_by_hand_sglang_accounting() -> None:
    """K = 16 // 1 (radix cache off): SGLang's KV budget 20 GiB - 17 x 19,316,736 = 21,146,451,968 B,
    // 12,288 = 1,720,902 tokens; 16 requests and 2 x 16 = 32 pre-allocated rows, so the state pool holds
    max(16, 48) = 48 slots (+1): 49 x 19,316,736 = 946,520,064 B, 32 slots beyond SGLang's charge."""
    result = decode_plan()
    assert (result.max_total_num_tokens, result.max_running_requests) == (1_720_902, 16)
    assert result.sizing.sglang_config["max_mamba_cache_size"] == 16
    assert (result.sizing.state_slots, result.sizing.state_slots_per_request) == (48, 1)
    state = result.pool("mamba_state")
    assert (state.slots, state.padding_slots, state.bytes) == (48, 1, 946_520_064)
    table = result.pool("req_to_token")
    assert (table.slots, table.padding_slots, table.bytes) == (48, 1, 49 * ROW)
    assert result.pool("mamba_req_mapping").bytes == 49 * 4  # no ping-pong columns: no extra buffer
    assert (result.pool("mamba_allocator").slots, result.pool("mamba_allocator").bytes) == (48, 384)
    # SGLang's estimate: its KV tokens plus the K + 1 slots it charged, not the raised pool
    assert result.sizing.sglang_estimate_bytes == 1_720_902 * CELL + 17 * PER_SLOT == 21_474_828_288
    assert any("32 more than SGLang's budget charged (618,135,552 B uncharged" in n for n in result.sizing.notes)
    assert result.cost.bytes_for(**result.counts) == result.planned_bytes


def test_decode_plan_by_hand_exact_accounting() -> None:
    """Every byte in 20 GiB: (t + 1) x 12,288 + 8 t + 49 x 19,316,736 + 49 x 1,048,592 + 49 x 4 + 48 x 8
    <= 21,474,836,480, so t = (21,474,836,480 - 997,913,940) // 12,296 = 1,665,332."""
    result = decode_plan("exact")
    assert (result.max_total_num_tokens, result.max_running_requests, result.sizing.state_slots) == (1_665_332, 16, 48)
    assert result.planned_bytes == 1_665_332 * 12_296 + 997_913_940 <= 20 * GiB
    assert result.sizing.sglang_config["max_mamba_cache_size"] == 16


@pytest.mark.parametrize(("extra", "slots"), [(0, 16), (4, 20), (500, 516)])
def test_explicit_extra_slots(extra: int, slots: int) -> None:
    """max(K 16, 16 + extra): no pre-allocated row leaves K alone; every one beyond K raises the pool."""
    result = decode_plan(disaggregation_decode_extra_slots=extra)
    assert result.max_total_num_tokens == 1_720_902  # SGLang's split never sees the raise
    assert result.pool("mamba_state").slots == result.sizing.state_slots == slots
    assert result.pool("req_to_token").slots == 16 + extra


def test_ratio_budget_without_max_running_requests() -> None:
    """No --max-running-requests: K from the ratio budget, 1 slot per request (radix off), no pre-allocated rows
    by default: 20 GiB x 0.9 / 1.9 = 10,172,291,031.6 B, K = (budget - 19,316,736) // 19,316,736 = 525."""
    result = plan(QWEN3_NEXT, Serving(accounting="sglang", disaggregation_mode="decode", tp_size=4), memory=20 * GiB)
    assert result.sizing.sglang_config["max_mamba_cache_size"] == 525
    assert result.sizing.state_slots_per_request == 1
    assert result.max_running_requests <= 525
    assert result.pool("mamba_state").slots == 525  # max(525, requests + 0)
    raised = plan(
        QWEN3_NEXT,
        Serving(accounting="sglang", disaggregation_mode="decode", tp_size=4, disaggregation_decode_extra_slots=600),
        memory=20 * GiB,
    )
    assert raised.pool("mamba_state").slots == raised.max_running_requests + 600


def test_decode_sizes_like_a_server_without_the_radix_cache() -> None:
    """The decode node's split is the null node's with --disable-radix-cache; only the table and pool differ."""
    decode = decode_plan(disaggregation_decode_extra_slots=0)
    null = plan(
        QWEN3_NEXT,
        Serving(accounting="sglang", tp_size=4, max_running_requests=16, disable_radix_cache=True),
        memory=20 * GiB,
    )
    assert {p.name: p.bytes for p in decode.pools} == {p.name: p.bytes for p in null.pools}
    assert decode.sizing.sglang_config == null.sizing.sglang_config


@pytest.mark.parametrize("lazy", [False, True])
def test_extra_buffer_is_inert_on_a_decode_node(lazy: bool) -> None:
    """The extra buffer needs the radix cache, which a decode node lacks: the same plan, the lazy one accepted."""
    buffered = decode_plan(enable_mamba_extra_buffer=True, enable_mamba_extra_buffer_lazy=lazy)
    assert {p.name: p.bytes for p in buffered.pools} == {p.name: p.bytes for p in decode_plan().pools}


def test_speculative_decode_node() -> None:
    """EAGLE, 4 draft tokens: SGLang charges (K + 1) x D = 68 slots of intermediate state; the table's spec
    state has (16 + 32) + 1 rows of 4 x 19,316,736 B (``mamba_spec_state_size = size + pre_alloc_size``)."""
    result = decode_plan(
        speculative_algorithm="EAGLE",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        speculative_draft_num_layers=1,
    )
    assert result.sizing.sglang_config["max_mamba_cache_size"] == 16
    spec = result.pool("mamba_spec_state")
    assert (spec.slots, spec.padding_slots, spec.bytes_per_slot) == (48, 1, 4 * PER_SLOT)
    kv_budget = 20 * GiB - 68 * PER_SLOT - 17 * PER_SLOT
    assert result.max_total_num_tokens == kv_budget // result.cell.sglang_bytes_per_token
    assert result.cost.bytes_for(**result.counts) == result.planned_bytes
    pools = build(result, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    spec_state = pools.req_to_token_pool.spec_state
    assert spec_state is not None and spec_state.intermediate_ssm.shape[1] == 49


# ---------------------------------------------------------------------------
# the prefill node
# ---------------------------------------------------------------------------


def test_prefill_node_sizes_like_a_null_node() -> None:
    """Prefill keeps the radix cache (ratio 3) and the aggregated table; nothing pre-allocated."""
    serving = Serving(accounting="sglang", tp_size=4, max_running_requests=16)
    prefill = plan(QWEN3_NEXT, attrs.evolve(serving, disaggregation_mode="prefill"), memory=20 * GiB)
    null = plan(QWEN3_NEXT, serving, memory=20 * GiB)
    assert {p.name: p.bytes for p in prefill.pools} == {p.name: p.bytes for p in null.pools}
    assert prefill.sizing.state_slots_per_request == 3


def test_prefill_node_refuses_the_lazy_extra_buffer() -> None:
    """SGLang's ``validate_mamba_extra_buffer`` (mamba_hook.py lines 123-128) while the buffer is live."""
    with pytest.raises(UnsupportedCombinationError, match=r"unsupported under PD disaggregation.*lazy slots"):
        plan(
            QWEN3_NEXT,
            Serving(disaggregation_mode="prefill", enable_mamba_extra_buffer=True, enable_mamba_extra_buffer_lazy=True),
            memory=20 * GiB,
        )


# ---------------------------------------------------------------------------
# built pools
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("accounting", ["sglang", "exact"])
def test_decode_pools_build_with_the_planned_bytes(accounting: str) -> None:
    result = decode_plan(accounting)
    pools = build(result, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    table = pools.req_to_token_pool
    assert isinstance(table, HybridMambaDecodeReqToTokenPool)
    assert (table.size, table.pre_alloc_size, table.usable_rows) == (16, 32, 48)
    assert table.req_to_token.shape[0] == 49 and table.mamba_pool.size == 48


def test_every_decode_row_holds_a_state_slot_on_cpu() -> None:
    """Tiny Qwen3-Next, K = 12 (explicit), 8 requests, 16 pre-allocated rows: max(12, 24) = 24 slots."""
    table = tiny_pools(disaggregation_mode="decode").req_to_token_pool
    assert isinstance(table, HybridMambaDecodeReqToTokenPool)
    assert (table.size, table.pre_alloc_size, table.available_size()) == (8, 16, 24)
    assert table.mamba_pool.available_size() == 24
    rows = table.alloc(24)
    assert rows == list(range(1, 25))
    slots = table.get_mamba_indices(torch.tensor(rows))
    assert sorted(slots.tolist()) == list(range(1, 25))
    assert table.alloc(1) is None
    table.free(rows[:2])
    again = table.alloc(2)
    assert again is not None and sorted(again) == [1, 2]
    assert table.req_generation[1] == 2 and table.req_generation[3] == 1
    null = tiny_pools(disable_radix_cache=True).req_to_token_pool
    assert type(null) is HybridReqToTokenPool and null.mamba_pool.size == 12


# ---------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------

CLI_DECODE = [QWEN3_NEXT, "--memory", "20GiB", "--tp-size", "4", "--max-running-requests", "16"]


def test_cli_plan_and_build_a_decode_node(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    args = [*CLI_DECODE, "--disaggregation-mode", "decode", "--accounting", "sglang"]
    out = subprocess.run(
        [kvpools_exe, "plan", *args, "--json"], capture_output=True, text=True, env=cli_env, check=True
    ).stdout
    summary = json.loads(out)
    assert (summary["max_total_num_tokens"], summary["max_running_requests"], summary["max_mamba_cache_size"]) == (
        1_720_902,
        16,
        16,
    )
    slots = {p["name"]: (p["slots"], p["padding_slots"]) for p in summary["pools"]}
    assert slots["mamba_state"] == (48, 1) and slots["req_to_token"] == (48, 1)
    built = subprocess.run(
        [kvpools_exe, "build", *args, "--device", "meta"], capture_output=True, text=True, env=cli_env, check=True
    ).stdout
    assert "mamba_state" in built and "946,520,064" in built and "mismatch" not in built


def test_cli_refuses_the_lazy_buffer_on_a_prefill_node(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    args = [*CLI_DECODE, "--disaggregation-mode", "prefill", "--enable-mamba-extra-buffer"]
    done = subprocess.run(
        [kvpools_exe, "plan", *args, "--enable-mamba-extra-buffer-lazy"], capture_output=True, text=True, env=cli_env
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--enable-mamba-extra-buffer-lazy is unsupported under PD disaggregation" in done.stderr + done.stdout
