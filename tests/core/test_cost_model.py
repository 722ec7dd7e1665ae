"""The cost model every plan carries: per group, bytes per token (of which token space), per request,
per state slot and fixed — checked by hand on four presets, and predicting other plans' bytes exactly."""

from __future__ import annotations

import types
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvpools_core import (
    CellPart,
    CellSize,
    ConfigError,
    CostModel,
    GroupCost,
    InvalidValueError,
    KvpoolsError,
    ModelSpec,
    Plan,
    PoolSizing,
    PoolSpec,
    Registry,
    Serving,
    hookimpl,
    plan,
)
from tests.strategies import budgets, mha_models, servings

GiB = 1 << 30
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def lines(result: Plan) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in result.cost.lines())


# ---------------------------------------------------------------------------
# hand-computed numbers
# ---------------------------------------------------------------------------


def test_dense_llama_by_hand() -> None:
    result = plan("llama-3.1-8b", Serving(), memory="20GiB")
    cost = result.cost
    # K + V: 2 x 8 KV heads x 128 x 2 B (bf16) x 32 layers = 131,072 B per token; page 0 pads one token.
    assert cost.group("kv") == GroupCost(group="kv", token_bytes=131_072, fixed_bytes=131_072)
    # request table row: (context 131,072 + 4 headroom columns) x 4 B (int32); row 0 pads.
    assert cost.group("req_to_token") == GroupCost(group="req_to_token", bytes_per_request=524_304, fixed_bytes=524_304)
    assert cost.group("allocator") == GroupCost(group="allocator", token_bytes=8)  # int64 free list, page 1
    assert [g.group for g in cost.groups] == ["kv", "req_to_token", "allocator"]
    assert cost.token_spaces == ("full",)
    assert result.counts == {"tokens": {"full": result.max_total_num_tokens}, "requests": 2048, "state_slots": 0}
    assert cost.bytes_for(**result.counts) == result.planned_bytes
    assert cost.bytes_for(tokens=1000, requests=10) == 131_072 * 1001 + 524_304 * 11 + 8 * 1000
    assert lines(result)["kv"] == "131,072 B/token + 131,072 B fixed"
    assert lines(result)["req_to_token"] == "524,304 B/request + 524,304 B fixed"


def test_dense_llama_paged_allocator_pays_per_page() -> None:
    result = plan("llama-3.1-8b", Serving(page_size=64), memory="20GiB")
    cost = result.cost
    assert cost.group("kv").fixed_bytes == 64 * 131_072  # the padding page
    # one int64 free-list entry per 64-token page, plus the paged allocator's 64 in-page offsets (int64)
    assert cost.group("allocator") == GroupCost(group="allocator", token_bytes=8, token_block=64, fixed_bytes=512)
    assert cost.group("allocator").bytes_per_token == 0.125
    assert lines(result)["allocator"] == "0.125 B/token (8 B per 64-token page) + 512 B fixed"
    assert result.pool("allocator").cost == cost.group("allocator")  # recorded: slots are pages
    assert result.pool("kv").cost is None  # derived from the pool's own fields
    assert cost.bytes_for(**result.counts) == result.planned_bytes


KIMI = "kimi-linear-48b-a3b-instruct-nvfp4"


def test_mamba_hybrid_pays_per_state_slot() -> None:
    result = plan(KIMI, Serving(), memory="60GiB")
    cell, cost = result.cell, result.cost
    # conv (4 - 1) x 3 x 32 x 128 x 2 B = 73,728; SSM 32 x 128 x 128 x 4 B = 2,097,152; x 20 KDA layers.
    state = (73_728 + 2_097_152) * 20
    assert state == 43_417_600
    assert (cell.bytes_per_state_slot, cell.bytes_per_request, cell.fixed_bytes) == (state, 0, 0)
    assert cell.parts_of("state_slot") == (CellPart("state", state, "mamba_state", unit="state_slot"),)
    assert cell.bytes_per_token == 8_064  # (512 + 64) x 2 B x 7 MLA layers; the state is not a token part
    k = result.sizing.sglang_config["max_mamba_cache_size"]
    assert result.counts["state_slots"] == k
    assert cost.group("mamba_state") == GroupCost(group="mamba_state", bytes_per_state_slot=state, fixed_bytes=state)
    assert cost.group("mamba_allocator") == GroupCost(group="mamba_allocator", bytes_per_state_slot=8)
    assert cost.group("mamba_req_mapping") == GroupCost(group="mamba_req_mapping", bytes_per_request=4, fixed_bytes=4)
    assert cost.group("kv") == GroupCost(group="kv", token_bytes=8_064, fixed_bytes=8_064)
    assert cost.bytes_per_state_slot == state + 8
    assert cost.bytes_for(**result.counts) == result.planned_bytes
    more = dict(result.counts, state_slots=k + 10)
    assert cost.bytes_for(**more) - result.planned_bytes == 10 * (state + 8)
    assert "mamba_state: 43,417,600 B/state slot + 43,417,600 B fixed" in result.cost.lines()


def test_mamba_speculative_state_is_per_request_and_the_draft_scales_only_tokens() -> None:
    spec = {
        "speculative_algorithm": "EAGLE",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "speculative_draft_num_layers": 1,
        "max_running_requests": 64,
    }
    result = plan("qwen3-next-80b-a3b-thinking", Serving(**spec), memory="60GiB")  # type: ignore[arg-type]
    per_slot = result.cell.bytes_per_state_slot
    assert [p.name for p in result.cell.parts] == ["k", "v", "state", "draft_k", "draft_v"]
    assert result.cost.group("mamba_spec_state").bytes_per_request == 4 * per_slot  # D draft tokens' state
    assert result.cost.bytes_for(**result.counts) == result.planned_bytes


GPT_OSS = "gpt-oss-20b"


@pytest.mark.parametrize("page", [1, 64])
def test_swa_has_two_token_spaces(page: int) -> None:
    result = plan(GPT_OSS, Serving(page_size=page), memory="20GiB")
    cost = result.cost
    full = result.sizing.sglang_config["full_max_total_num_tokens"]
    swa = result.sizing.sglang_config["swa_max_total_num_tokens"]
    assert result.counts["tokens"] == {"full": full, "swa": swa}
    assert cost.token_spaces == ("full", "swa")
    # 12 full and 12 sliding layers, each 2 x 8 KV heads x 64 x 2 B = 2,048 B per token.
    assert cost.group("kv_full") == GroupCost(group="kv_full", token_bytes=24_576, fixed_bytes=24_576 * page)
    assert cost.group("kv_swa") == GroupCost(
        group="kv_swa", token_space="swa", token_bytes=24_576, fixed_bytes=24_576 * page
    )
    # full -> SWA index: int64 per full slot, the padding page and a trailing -1
    assert cost.group("full_to_swa") == GroupCost(group="full_to_swa", token_bytes=8, fixed_bytes=8 * (page + 1))
    assert cost.group("swa_allocator").token_space == "swa"
    assert cost.group("allocator").token_space == "full"
    assert cost.bytes_for(**result.counts) == result.planned_bytes
    longer_window = cost.bytes_for(tokens={"full": full, "swa": swa + 10 * page}, requests=result.max_running_requests)
    # ten more pages of the window pool, and ten more int64 free-list entries (one per page)
    assert longer_window - result.planned_bytes == 10 * page * 24_576 + 10 * 8
    assert "kv_swa: 24,576 B/swa token + " in "\n".join(cost.lines())
    with pytest.raises(ConfigError, match=r"no token count for token space\(s\) \['swa'\]"):
        cost.bytes_for(tokens={"full": full})


def test_dsa_indexer_is_paid_per_whole_page() -> None:
    result = plan("deepseek-v3.2", Serving(page_size=64, tp_size=8), memory="60GiB")
    cost = result.cost
    # bf16 latent (512 x 2 B) + rope (64 x 2 B) over 61 layers; the padding page is fixed.
    assert cost.group("kv") == GroupCost(group="kv", token_bytes=70_272, fixed_bytes=64 * 70_272)
    # indexer keys: 128 fp8 + a 4 B scale per layer = 132 B x 61 = 8,052 B per token, laid out in whole
    # pages: (tokens + 64 + 1) // 64 pages, so 515,328 B per 64-token page and one padding page fixed.
    indexer = cost.group("indexer")
    assert indexer == GroupCost(group="indexer", token_bytes=8_052 * 64, token_block=64, fixed_bytes=8_052 * 64)
    assert indexer.bytes_per_token == 8_052
    assert result.pool("indexer").cost == indexer
    tokens = result.max_total_num_tokens
    assert tokens % 64 == 0
    assert indexer.bytes_for(tokens=tokens) == result.pool("indexer").bytes
    assert indexer.bytes_for(tokens=tokens + 63) == indexer.bytes_for(tokens=tokens)  # whole pages only
    assert cost.bytes_for(**result.counts) == result.planned_bytes


def test_dsa_indexer_slack_slot_at_page_one_is_fixed() -> None:
    """At page 1 SGLang's indexer takes (tokens + 1 + 1) rows: two padding slots, exact at any token count."""
    from kvpools_core.parts.sizing import token_pool

    pool = token_pool("indexer", 1000, 1, 132, "test", extra_slots=1)
    assert pool.bytes == 1002 * 132
    assert pool.group_cost == GroupCost(group="indexer", token_bytes=132, fixed_bytes=2 * 132)
    assert pool.cost is None  # the fields say it already


# ---------------------------------------------------------------------------
# the property: one plan's cost model predicts another plan's bytes
# ---------------------------------------------------------------------------

PRESETS = (
    "llama-3.1-8b",  # dense MHA
    "qwen3-8b",
    "deepseek-v2-lite",  # MLA
    "deepseek-v3.2",  # DSA (indexer pages)
    "minimax-m2.5",
    "qwen3-next-80b-a3b-thinking",  # mamba hybrids (state slots)
    KIMI,
    "falcon-h1-0.5b",
    "gpt-oss-20b",  # SWA (two token spaces)
    "gemma-3-12b-it",
    "mimo-v2-flash",
)


@st.composite
def preset_servings(draw: st.DrawFn) -> Serving:
    tp = draw(st.sampled_from([1, 2, 8]))
    options: dict[str, Any] = {
        "kv_cache_dtype": draw(st.sampled_from(["auto", "fp8_e4m3", "fp4_e2m1"])),
        "page_size": draw(st.sampled_from([1, 16, 64])),
        "tp_size": tp,
        "accounting": draw(st.sampled_from(["exact", "sglang"])),
        "disable_radix_cache": draw(st.booleans()),
        "enable_mamba_extra_buffer": draw(st.booleans()),
    }
    if draw(st.booleans()):
        options["max_running_requests"] = draw(st.integers(8, 512))
    if tp > 1 and draw(st.booleans()):
        options.update(dp_size=tp, enable_dp_attention=True, max_running_requests=draw(st.integers(tp, 512)))
    if draw(st.booleans()):
        options.update(
            speculative_algorithm=draw(st.sampled_from(["EAGLE", "NEXTN"])),
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
            speculative_draft_num_layers=1,
            max_running_requests=options.get("max_running_requests", 64),
        )
    if draw(st.booleans()):
        options.update(disaggregation_mode="decode", disaggregation_decode_extra_slots=draw(st.integers(1, 16)))
    return Serving(**options)


def _plan_or_skip(model: str | ModelSpec, serving: Serving, memory: int, registry: Registry) -> Plan:
    try:
        return plan(model, serving, memory=memory, registry=registry)
    except KvpoolsError:
        assume(False)
        raise


def _assert_predicts_a_smaller_plan(
    model: str | ModelSpec, serving: Serving, memory: int, registry: Registry, cap: float
) -> None:
    first = _plan_or_skip(model, serving, memory, registry)
    assert first.cost.bytes_for(**first.counts) == first.planned_bytes
    fewer = max(1, int(first.max_total_num_tokens * cap) + 1)  # rarely page aligned
    second = _plan_or_skip(model, attrs.evolve(serving, max_total_tokens=fewer), memory, registry)
    assume(second.max_total_num_tokens < first.max_total_num_tokens)
    # the first plan's coefficients, at the second plan's counts, give the second plan's bytes
    assert first.cost.bytes_for(**second.counts) == second.planned_bytes
    assert first.cost == second.cost


@SETTINGS
@given(
    preset=st.sampled_from(PRESETS),
    serving=preset_servings(),
    memory=st.sampled_from([20 * GiB, 60 * GiB, 140 * GiB]),
    cap=st.floats(0.05, 0.95),
)
def test_a_plans_cost_model_predicts_a_replan_of_every_preset(
    registry: Registry, preset: str, serving: Serving, memory: int, cap: float
) -> None:
    _assert_predicts_a_smaller_plan(preset, serving, memory, registry, cap)


@SETTINGS
@given(model=mha_models(), serving=servings(), budget=budgets, cap=st.floats(0.05, 0.95))
def test_a_plans_cost_model_predicts_a_replan_of_generated_models(
    registry: Registry, model: ModelSpec, serving: Serving, budget: int, cap: float
) -> None:
    _assert_predicts_a_smaller_plan(model, serving, budget, registry, cap)


# ---------------------------------------------------------------------------
# values, units and JSON
# ---------------------------------------------------------------------------


def test_an_unknown_unit_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidValueError, match=r"CellPart\.unit must be one of token, request, state_slot, fixed"):
        CellPart("state", 10, "state", unit="slot")
    with pytest.raises(InvalidValueError, match=r"PoolSpec\.unit must be one of"):
        PoolSpec(name="p", kind="kv", slots=1, bytes_per_slot=1, bytes=2, unit="page")
    with pytest.raises(InvalidValueError, match=r"extra_slots applies to token parts only"):
        CellPart("state", 10, "state", extra_slots=1, unit="state_slot")


def test_a_pool_mixing_units_is_refused() -> None:
    with pytest.raises(InvalidValueError, match=r"pool 'kv' mixes parts paid per token and per request"):
        CellSize(parts=[CellPart("k", 8), CellPart("row", 16, unit="request")], sglang_bytes_per_token=8, num_layers=1)


def test_cell_sums_by_unit_and_token_helpers_see_token_parts_only() -> None:
    cell = CellSize(
        parts=[
            CellPart("k", 10),
            CellPart("idx", 4, "indexer", extra_slots=1),
            CellPart("row", 16, "request_state", unit="request"),
            CellPart("state", 100, "state", unit="state_slot"),
            CellPart("table", 7, "fixed", unit="fixed"),
        ],
        sglang_bytes_per_token=14,
        num_layers=1,
    )
    assert (cell.bytes_per_token, cell.bytes_per_request, cell.bytes_per_state_slot, cell.fixed_bytes) == (
        14,
        16,
        100,
        7,
    )
    assert cell.pool_bytes_per_token() == {"kv": 10, "indexer": 4}
    assert cell.pool_extra_slots() == {"kv": 0, "indexer": 1}
    assert cell.cost.bytes_for(tokens=2, requests=3, state_slots=5) == 14 * 2 + 16 * 3 + 100 * 5 + 7


def _registry_answering(estimate_cell_size: Any) -> Registry:
    module = types.ModuleType("cost_test_plugin")
    module.estimate_cell_size = estimate_cell_size  # type: ignore[attr-defined]
    return Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"cost-test": module})


def test_the_core_sizes_request_and_fixed_parts_and_refuses_state_slots() -> None:
    @hookimpl(tryfirst=True)
    def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize:
        return CellSize(
            parts=[
                CellPart("k", 64),
                CellPart("row", 1000, "request_state", unit="request"),
                CellPart("table", 4096, "fixed", unit="fixed"),
            ],
            sglang_bytes_per_token=64,
            num_layers=1,
        )

    result = plan("llama-3.1-8b", Serving(), memory="1GiB", registry=_registry_answering(estimate_cell_size))
    assert result.pool("request_state").bytes == (result.max_running_requests + 1) * 1000
    assert result.pool("fixed").bytes == 4096
    assert result.cost.group("request_state") == GroupCost(
        group="request_state", bytes_per_request=1000, fixed_bytes=1000
    )
    assert result.cost.bytes_for(**result.counts) == result.planned_bytes

    @hookimpl(tryfirst=True)
    def state_cell(model: ModelSpec, serving: Serving) -> CellSize:
        return CellSize(
            parts=[CellPart("k", 64), CellPart("state", 1000, "state", unit="state_slot")],
            sglang_bytes_per_token=64,
            num_layers=1,
        )

    state_cell.__name__ = "estimate_cell_size"
    with pytest.raises(KvpoolsError, match=r"state-slot parts \(state\), which the core's size_pools cannot count"):
        plan("llama-3.1-8b", Serving(), memory="1GiB", registry=_registry_answering(state_cell))


def test_cost_models_add_by_group() -> None:
    target = CostModel([GroupCost(group="kv", token_bytes=100, fixed_bytes=100)])
    draft = CostModel(
        [GroupCost(group="kv", token_bytes=10, fixed_bytes=10), GroupCost(group="draft_kv", token_bytes=5)]
    )
    both = target + draft
    assert both.groups == (
        GroupCost(group="kv", token_bytes=110, fixed_bytes=110),
        GroupCost(group="draft_kv", token_bytes=5),
    )
    assert both.bytes_for(tokens=3) == target.bytes_for(tokens=3) + draft.bytes_for(tokens=3)
    with pytest.raises(InvalidValueError, match="cannot add group"):
        _ = target + CostModel([GroupCost(group="kv", token_space="swa", token_bytes=1)])
    with pytest.raises(InvalidValueError, match="more than once"):
        CostModel([GroupCost(group="kv"), GroupCost(group="kv")])
    with pytest.raises(ConfigError, match="requests must be a non-negative integer"):
        target.bytes_for(tokens=1, requests=-1)


def test_a_recorded_cost_must_match_the_pools_unit_and_name() -> None:
    with pytest.raises(InvalidValueError, match="pays per request"):
        PoolSpec(
            name="kv",
            kind="kv",
            slots=1,
            bytes_per_slot=1,
            bytes=2,
            cost=GroupCost(group="kv", bytes_per_request=1),
        )
    with pytest.raises(InvalidValueError, match="is named 'other'"):
        PoolSpec(name="kv", kind="kv", slots=1, bytes_per_slot=1, bytes=2, cost=GroupCost(group="other"))
    with pytest.raises(InvalidValueError, match="no count for token space 'swa'"):
        PoolSizing(
            max_total_num_tokens=1,
            max_running_requests=1,
            pools=[PoolSpec(name="kv_swa", kind="kv", slots=1, bytes_per_slot=1, bytes=2, token_space="swa")],
        )


def test_plan_json_round_trips_the_cost_fields() -> None:
    result = plan(GPT_OSS, Serving(page_size=64), memory="20GiB")
    loaded = Plan.from_json(result.to_json())
    assert loaded == result
    assert loaded.cost == result.cost


# A plan JSON written before parts had units (kvpools with CellSize.bytes_per_request / fixed_bytes fields
# and no PoolSpec.unit / token_space / cost, no PoolSizing.token_counts / state_slots): a tiny two-layer
# model whose cell charged 16 B per request, which the core put in a request_state pool.
OLD_FORMAT_PLAN: dict[str, Any] = {
    "model": {
        "name": "tiny",
        "architecture": "mha",
        "layers": [
            {"index": 0, "kind": "attention", "num_kv_heads": 1, "head_dim": 8, "v_head_dim": 8},
            {"index": 1, "kind": "attention", "num_kv_heads": 1, "head_dim": 8, "v_head_dim": 8},
        ],
        "context_len": 16,
        "dtype": "bfloat16",
        "num_attention_heads": 1,
    },
    "serving": {"kv_cache_dtype": "auto", "page_size": 1, "accounting": "exact"},
    "budget": {"budget_bytes": 16384, "source": "explicit", "steps": ["explicit budget 16384 B (0.00 GiB)"]},
    "cell": {
        "parts": [
            {"name": "k", "bytes_per_token": 32, "pool": "kv", "extra_slots": 0},
            {"name": "v", "bytes_per_token": 32, "pool": "kv", "extra_slots": 0},
        ],
        "sglang_bytes_per_token": 64,
        "num_layers": 2,
        "bytes_per_request": 16,
        "fixed_bytes": 0,
        "draft_included": False,
        "notes": [],
        "draft_layer_parts": [],
    },
    "sizing": {
        "max_total_num_tokens": 71,
        "max_running_requests": 35,
        "pools": [
            {
                "name": "kv",
                "kind": "kv",
                "slots": 71,
                "bytes_per_slot": 64,
                "bytes": 4608,
                "padding_slots": 1,
                "sglang_charged": True,
                "owner": "core",
            },
            {
                "name": "request_state",
                "kind": "state",
                "slots": 35,
                "bytes_per_slot": 16,
                "bytes": 576,
                "padding_slots": 1,
                "sglang_charged": True,
                "owner": "core",
            },
            {
                "name": "req_to_token",
                "kind": "request",
                "slots": 35,
                "bytes_per_slot": 80,
                "bytes": 2880,
                "padding_slots": 1,
                "sglang_charged": False,
                "owner": "core",
            },
            {
                "name": "allocator",
                "kind": "allocator",
                "slots": 71,
                "bytes_per_slot": 8,
                "bytes": 568,
                "padding_slots": 0,
                "sglang_charged": False,
                "owner": "core",
            },
        ],
        "sglang_config": {"max_total_num_tokens": 71, "max_running_requests": 35},
        "sglang_estimate_bytes": 4544,
        "notes": [],
    },
    "provenance": {"parse_model_config": ["given"], "estimate_cell_size": ["mha"], "size_pools": ["core"]},
    "format": 1,
}


def test_a_plan_json_from_before_units_loads() -> None:
    loaded = Plan.from_dict(OLD_FORMAT_PLAN)
    assert loaded.cell.bytes_per_request == 16
    assert loaded.cell.parts_of("request") == (CellPart("request_state", 16, "request_state", unit="request"),)
    assert loaded.cell.bytes_per_token == 64
    assert [p.unit for p in loaded.pools] == ["token", "request", "request", "token"]  # from each pool's kind
    assert loaded.counts == {"tokens": {"full": 71}, "requests": 35, "state_slots": 0}
    assert loaded.cost.bytes_for(**loaded.counts) == loaded.planned_bytes == 4608 + 576 + 2880 + 568
    assert Plan.from_json(loaded.to_json()) == loaded


def test_an_old_dense_plan_json_loads_into_an_equal_plan() -> None:
    """Stripped of every field the cost model added, a dense page-1 plan loads back equal."""
    result = plan("llama-3.1-8b", Serving(), memory="20GiB")
    old = result.to_dict()
    old["cell"]["parts"] = [{k: v for k, v in p.items() if k != "unit"} for p in old["cell"]["parts"]]
    old["cell"].update(bytes_per_request=0, fixed_bytes=0)
    for pool in old["sizing"]["pools"]:
        for field in ("unit", "token_space", "cost"):
            del pool[field]
    del old["sizing"]["token_counts"], old["sizing"]["state_slots"]
    assert Plan.from_dict(old) == result


@given(
    unit=st.sampled_from(["token", "request", "state_slot", "fixed"]),
    pool_space=st.sampled_from(["full", "swa"]),
    cost_space=st.sampled_from(["full", "swa"]),
    token_bytes=st.integers(0, 2),
    bytes_per_request=st.integers(0, 2),
    bytes_per_state_slot=st.integers(0, 2),
)
def test_a_recorded_cost_is_refused_exactly_when_it_pays_per_another_unit(
    unit: str, pool_space: str, cost_space: str, token_bytes: int, bytes_per_request: int, bytes_per_state_slot: int
) -> None:
    """``PoolSpec._check_cost`` decides the common case without building its message (issue 37): it refuses
    exactly the costs that pay per a unit other than the pool's, or per token of another space (the rule as the
    message states it, written out here)."""
    paid = {"token": token_bytes, "request": bytes_per_request, "state_slot": bytes_per_state_slot}
    refused = any(value and name != unit for name, value in paid.items()) or (
        unit == "token" and cost_space != pool_space
    )
    cost = GroupCost(
        group="p",
        token_space=cost_space,
        token_bytes=token_bytes,
        bytes_per_request=bytes_per_request,
        bytes_per_state_slot=bytes_per_state_slot,
    )

    def build() -> PoolSpec:
        return PoolSpec(
            name="p", kind="kv", slots=1, bytes_per_slot=0, bytes=8, unit=unit, token_space=pool_space, cost=cost
        )

    if refused:
        with pytest.raises(InvalidValueError, match=r"PoolSpec.cost of pool 'p' \(unit .*\) pays per"):
            build()
    else:
        assert build().cost is cost


@given(
    name=st.sampled_from(["allocator", "swa_allocator"]),
    token_space=st.sampled_from(["full", "swa"]),
    page_size=st.sampled_from([1, 16, 64, 256]),
    dcp=st.sampled_from([1, 2, 8]),
    tokens=st.integers(0, 64).map(lambda pages: pages * 256),
)
def test_the_allocators_remembered_cost_is_its_own(
    name: str, token_space: str, page_size: int, dcp: int, tokens: int
) -> None:
    """A paged allocator's ``GroupCost`` is built once per (name, token space, page, DCP) and shared by plans
    (issue 37): the one an allocator pool records is the cost of exactly its arguments (one 8 B free-list entry
    per page, the one-page allocator's rest fixed), never another allocator's."""
    from kvpools_core.allocators import allocator_planned_nbytes
    from kvpools_core.parts.sizing import allocator_pool

    pool = allocator_pool(tokens, page_size, token_space=token_space, name=name, dcp=dcp)
    widened = page_size * dcp
    if widened == 1:
        return  # the token allocator: its fields say its cost
    one_page = allocator_planned_nbytes(widened, widened)
    per_page = allocator_planned_nbytes(2 * widened, widened) - one_page
    assert per_page == 8
    assert pool.cost == GroupCost(
        group=name, token_space=token_space, token_bytes=8, token_block=page_size, fixed_bytes=one_page - 8
    )
    assert pool.cost is allocator_pool(tokens + page_size, page_size, token_space=token_space, name=name, dcp=dcp).cost
    if tokens:
        assert pool.group_cost.bytes_for(tokens=tokens) == pool.bytes
