"""Invariants of sizing that must hold for every model, serving option and budget."""

from __future__ import annotations

import attrs
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvpools_core import InsufficientMemoryError, ModelSpec, Plan, Registry, Serving, plan
from tests.strategies import budgets, mha_models, servings

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def plan_or_skip(model: ModelSpec, serving: Serving, budget: int, registry: Registry) -> Plan:
    try:
        return plan(model, serving, memory=budget, registry=registry)
    except InsufficientMemoryError:
        assume(False)
        raise


@SETTINGS
@given(model=mha_models(), serving=servings(accounting="exact"), budget=budgets)
def test_exact_plans_never_exceed_the_budget(
    registry: Registry, model: ModelSpec, serving: Serving, budget: int
) -> None:
    result = plan_or_skip(model, serving, budget, registry)
    assert result.planned_bytes <= budget
    assert result.planned_bytes == sum(pool.bytes for pool in result.pools)


@SETTINGS
@given(model=mha_models(), serving=servings(), budget=budgets)
def test_tokens_are_page_aligned_and_requests_fit(
    registry: Registry, model: ModelSpec, serving: Serving, budget: int
) -> None:
    result = plan_or_skip(model, serving, budget, registry)
    assert result.max_total_num_tokens % serving.page_size == 0
    assert 1 <= result.max_running_requests <= result.max_total_num_tokens // 2
    if serving.max_total_tokens is not None:
        assert result.max_total_num_tokens <= serving.max_total_tokens


@SETTINGS
@given(model=mha_models(), serving=servings(), budget=budgets, extra=st.integers(0, 50 << 30))
def test_tokens_never_decrease_when_the_budget_grows(
    registry: Registry, model: ModelSpec, serving: Serving, budget: int, extra: int
) -> None:
    small = plan_or_skip(model, serving, budget, registry)
    large = plan(model, serving, memory=budget + extra, registry=registry)
    assert large.max_total_num_tokens >= small.max_total_num_tokens


@SETTINGS
@given(model=mha_models(), serving=servings(), budget=budgets)
def test_the_constraint_path_reproduces_a_plan_from_its_own_token_count(
    registry: Registry, model: ModelSpec, serving: Serving, budget: int
) -> None:
    result = plan_or_skip(model, serving, budget, registry)
    again = plan(
        model, attrs.evolve(serving, max_total_tokens=result.max_total_num_tokens), memory=budget, registry=registry
    )
    assert again.max_total_num_tokens == result.max_total_num_tokens
    assert again.max_running_requests == result.max_running_requests
    assert again.pools == result.pools


@SETTINGS
@given(model=mha_models(), serving=servings(), budget=budgets)
def test_json_round_trip(registry: Registry, model: ModelSpec, serving: Serving, budget: int) -> None:
    result = plan_or_skip(model, serving, budget, registry)
    assert Plan.from_json(result.to_json()) == result


@SETTINGS
@given(model=mha_models(), serving=servings(accounting="sglang"), budget=budgets)
def test_exact_mode_never_holds_more_tokens_than_sglang(
    registry: Registry, model: ModelSpec, serving: Serving, budget: int
) -> None:
    sglang = plan_or_skip(model, serving, budget, registry)
    try:
        exact = plan(model, attrs.evolve(serving, accounting="exact"), memory=budget, registry=registry)
    except InsufficientMemoryError:
        return
    if exact.cell.bytes_per_token >= exact.cell.sglang_bytes_per_token:
        assert exact.max_total_num_tokens <= sglang.max_total_num_tokens
