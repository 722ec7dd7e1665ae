"""The core's sizing invariants hold for MLA, DSA and MiniMax-sparse plans too.

Exact plans fit the budget; more budget never
means fewer tokens; a plan re-solved from its own token count is the same
plan; tokens are page aligned and requests fit; exact never holds more tokens
than SGLang's estimate allows when it charges at least SGLang's cell (one
pipeline stage; fp4 MiniMax stores less than SGLang charges).
"""

from __future__ import annotations

from typing import Any

import attrs
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvpools_core import InsufficientMemoryError, ModelSpec, Plan, Serving, plan
from tests.draft_shape import as_sglang_runs

from .oracle_support import latent_configs, minimax_sparse_configs, parse

SETTINGS = settings(
    max_examples=120, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@st.composite
def cases(draw: st.DrawFn) -> tuple[ModelSpec, Serving, int]:
    family = draw(st.sampled_from(("mla", "dsa", "minimax_sparse")))
    if family == "minimax_sparse":
        config = draw(minimax_sparse_configs())
    else:
        config = draw(latent_configs(dsa=family == "dsa", max_layers=64))
    spec = parse(config)
    tp = draw(st.sampled_from((1, 2, 4, 8)))
    pp = draw(st.sampled_from((1, 1, 2)))
    assume(pp <= spec.num_layers)
    options: dict[str, Any] = dict(
        kv_cache_dtype=draw(st.sampled_from(("auto", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"))),
        page_size=64 if family == "dsa" else draw(st.sampled_from((1, 16, 64))),
        tp_size=tp,
        dp_size=tp,
        enable_dp_attention=tp > 1 and draw(st.booleans()),
        pp_size=pp,
        pp_rank=draw(st.integers(0, pp - 1)),
        max_running_requests=draw(st.none() | st.integers(tp, 8192)),  # >= one per DP-attention worker
        max_total_tokens=draw(st.none() | st.integers(1, 5_000_000)),
    )
    spec_algorithm = draw(st.sampled_from((None, None, "EAGLE", "NEXTN", "DFLASH")))
    if spec_algorithm:
        options.update(speculative_algorithm=spec_algorithm, speculative_draft_num_layers=draw(st.integers(1, 3)))
        options = as_sglang_runs(options)
    return spec, Serving(**options), draw(st.integers(1 << 20, 200 << 30))


def plan_or_skip(model: ModelSpec, serving: Serving, budget: int) -> Plan:
    try:
        return plan(model, serving, memory=budget)
    except InsufficientMemoryError:
        assume(False)
        raise


@SETTINGS
@given(cases())
def test_exact_plans_fit_and_requests_fit(case: tuple[ModelSpec, Serving, int]) -> None:
    model, serving, budget = case
    result = plan_or_skip(model, serving, budget)
    assert result.planned_bytes <= budget
    assert result.max_total_num_tokens % serving.page_size == 0
    assert 1 <= result.max_running_requests <= result.max_total_num_tokens // 2
    if serving.pp_size == 1 and result.cell.bytes_per_token >= result.cell.sglang_bytes_per_token:
        # exact charges at least SGLang's cell per token, plus the pools SGLang leaves out
        sglang = plan(model, attrs.evolve(serving, accounting="sglang"), memory=budget)
        assert result.max_total_num_tokens <= sglang.max_total_num_tokens


@SETTINGS
@given(cases(), st.integers(0, 50 << 30))
def test_more_budget_never_means_fewer_tokens(case: tuple[ModelSpec, Serving, int], extra: int) -> None:
    model, serving, budget = case
    small = plan_or_skip(model, serving, budget)
    assert plan(model, serving, memory=budget + extra).max_total_num_tokens >= small.max_total_num_tokens


@SETTINGS
@given(cases())
def test_the_constraint_path_reproduces_a_plan(case: tuple[ModelSpec, Serving, int]) -> None:
    model, serving, budget = case
    result = plan_or_skip(model, serving, budget)
    again = plan(model, attrs.evolve(serving, max_total_tokens=result.max_total_num_tokens), memory=budget)
    assert (again.max_total_num_tokens, again.max_running_requests) == (
        result.max_total_num_tokens,
        result.max_running_requests,
    )
    assert again.pools == result.pools
