"""DeepSeek-V4's exact full tokens solved instead of searched (issue 37): the same answer as the probing search.

``solved_full_tokens`` lays the pool set out once, reads how its bytes grow per page of full tokens and per page
of SWA tokens (``ExactCost.linear``), solves for the most pages within the budget and checks the answer with a
probe at it and one page above it; ``searched_full_tokens`` is the probing search it replaces, kept as the
reference.  The property: over random budgets and servings, the solve's answer, where it gives one, is the
search's, and ``_exact_full_tokens`` (what a plan uses) always is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from kvpools_plugins.dsv4.sizing import (
    ExactCost,
    _exact_full_tokens,
    _largest_within,
    dsv4_shape,
    searched_full_tokens,
    solved_full_tokens,
)

from kvpools_core.errors import KvpoolsError
from kvpools_core.pipeline import plan, plan_basis
from kvpools_core.values import Serving

GiB = 1 << 30
CONFIGS = Path(__file__).with_name("configs")
MODELS = [
    "deepseek-v4-flash",
    "deepseek-v4-pro",
    "deepseek-v4-flash-fp8-sgl",
    str(CONFIGS / "dsv41_synthetic.json"),  # V4.1 ratio-1/2 pools: the pool set the solve leaves to the search
    str(CONFIGS / "dsv4_kv_source_synthetic.json"),
]
SERVINGS = st.fixed_dictionaries(
    {
        "tp_size": st.sampled_from([1, 2, 4, 8]),
        "max_running_requests": st.none() | st.integers(1, 4096),
        "swa_full_tokens_ratio": st.none() | st.sampled_from([0.01, 0.1, 0.33, 0.5, 0.8, 1.0]),
        "context_length": st.none() | st.sampled_from([4096, 65536, 262144]),
        "enable_online_compress": st.booleans(),
        "dsv4_compress_state_dtype": st.sampled_from(["float32", "bfloat16"]),
    },
    optional={
        "speculative": st.just(True),
        "disaggregation_mode": st.just("decode"),
        "pp_size": st.just(2),
        "enable_hisparse": st.just(True),
    },
)


def _answers(model: str, options: dict[str, Any], budget: int) -> tuple[int | None, int, int] | None:
    """(the solve's answer or None, the plan's answer, the search's answer) for one serving and budget; None for a
    serving SGLang refuses or one not sized by the exact accounting at page 256 (nothing to compare)."""
    if options.pop("speculative", False):
        options.update(
            speculative_algorithm="EAGLE",
            speculative_num_steps=3,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=4,
            speculative_draft_num_layers=1,
        )
    if options.get("enable_hisparse"):
        options["disable_radix_cache"] = True
    try:
        basis = plan_basis(model, Serving(**{k: v for k, v in options.items() if v is not None}))
    except KvpoolsError:
        return None
    spec, serving = basis.spec, basis.serving
    if serving.accounting != "exact" or serving.page_size != 256:
        return None
    shape = dsv4_shape(spec, serving)
    solved = solved_full_tokens(ExactCost(spec, serving, shape), budget)
    planned = _exact_full_tokens(spec, serving, shape, budget)
    return solved, planned, searched_full_tokens(ExactCost(spec, serving, shape), budget)


BUDGETS = st.integers(GiB // 4, 4 * GiB) | st.integers(4 * GiB, 400 * GiB).map(lambda b: b + 7919 * (b % 1009))
"""Small budgets (a few pages, the SWA pool under a page: the search's) and large ones, at arbitrary bytes."""


@settings(deadline=None, derandomize=True, database=None, max_examples=200)
@given(model=st.sampled_from(MODELS), options=SERVINGS, budget=BUDGETS)
def test_the_solved_full_tokens_are_the_searchs(model: str, options: dict[str, Any], budget: int) -> None:
    answers = _answers(model, options, budget)
    assume(answers is not None)  # a combination SGLang refuses: there is nothing to size
    assert answers is not None
    solved, planned, searched = answers
    assert solved is None or solved == searched
    assert planned == searched


@pytest.mark.parametrize(
    ("model", "options", "memory"),
    [
        ("deepseek-v4-flash", {}, 40 * GiB),
        ("deepseek-v4-flash", {"tp_size": 4}, 60 * GiB + 12345),
        ("deepseek-v4-pro", {"tp_size": 8, "swa_full_tokens_ratio": 0.5}, 70 * GiB),
        ("deepseek-v4-flash", {"pp_size": 2, "enable_online_compress": True}, 30 * GiB),
        ("deepseek-v4-flash", {"disaggregation_mode": "decode", "context_length": 8192}, 20 * GiB),
        ("deepseek-v4-flash", {"max_running_requests": 2048, "context_length": 4096}, 40 * GiB),
    ],
)
def test_the_solve_answers_the_usual_servings(model: str, options: dict[str, Any], memory: int) -> None:
    """V4's separate-KV pool set at budgets that hold its SWA pages: the solve answers (the property above is not
    met by falling back to the search every time), and its answer is the search's."""
    answers = _answers(model, dict(options), memory)
    assert answers is not None
    solved, planned, searched = answers
    assert solved is not None
    assert solved == planned == searched


def test_a_wrong_solve_is_caught_by_its_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check at the answer and one page above it is what makes the solve exact: with the bytes per full page
    understated by 1 % the solve's formula answers too many tokens; the probe at that answer refuses it (None), and
    the plan's answer is still the search's (5,040,128 full tokens for deepseek-v4-flash at 40 GiB)."""
    original = ExactCost.linear

    def understated(self: ExactCost, tokens: int) -> tuple[int, int, int] | None:
        linear = original(self, tokens)
        assert linear is not None
        spent, per_page, per_swa_page = linear
        return spent, per_page * 99 // 100, per_swa_page

    basis = plan_basis("deepseek-v4-flash", Serving())
    spec, serving = basis.spec, basis.serving
    shape = dsv4_shape(spec, serving)
    budget = 40 * GiB
    assert solved_full_tokens(ExactCost(spec, serving, shape), budget) == 5_040_128
    monkeypatch.setattr(ExactCost, "linear", understated)
    assert solved_full_tokens(ExactCost(spec, serving, shape), budget) is None
    assert _exact_full_tokens(spec, serving, shape, budget) == 5_040_128
    monkeypatch.undo()
    assert plan("deepseek-v4-flash", Serving(), memory=budget).max_total_num_tokens == 5_040_128


def test_the_linear_bytes_are_the_probes_differences() -> None:
    """``ExactCost.linear`` at deepseek-v4-flash's 40 GiB answer (19,688 pages of 256, SWA 1,968 pages at ratio
    0.1, 256 requests): per page of full tokens the c4 KV page of 64 rows (ceil(64 x 584 / 576) x 576 = 37,440 B)
    on 21 layers, the c128 page of 2 rows (1,728 B) on 20 layers, the indexer page of 64 x 132 B on 21 layers,
    256 mapping entries of 8 B and one 8 B allocator entry: 786,240 + 34,560 + 177,408 + 2,048 + 8 = 1,000,264 B;
    per SWA page the SWA page (256 x 584 -> 149,760 B) on 43 layers, 16 c4 state rows (256 // 128 window x ring
    8) of 8,192 + 2,048 B on 21 layers and one SWA allocator entry: 6,439,680 + 3,440,640 + 8 = 9,880,328 B; and
    the probe's own bytes one page further each way say the same."""
    basis = plan_basis("deepseek-v4-flash", Serving())
    spec, serving = basis.spec, basis.serving
    cost = ExactCost(spec, serving, dsv4_shape(spec, serving))
    tokens = 19_688 * 256
    linear = cost.linear(tokens)
    assert linear is not None
    spent, per_page, per_swa_page = linear
    assert (per_page, per_swa_page) == (1_000_264, 9_880_328)
    assert spent == cost(tokens)
    # 19,689 pages: SWA int(19,689 x 256 x 0.1) // 256 = 1,968 pages (unchanged); 19,690: 1,969
    assert cost.swa_tokens(tokens + 256) == cost.swa_tokens(tokens) == 1_968 * 256
    assert cost(tokens + 256) - spent == per_page
    assert cost(tokens + 512) - spent == 2 * per_page + per_swa_page


@settings(deadline=None, derandomize=True, database=None, max_examples=300)
@given(
    room=st.integers(-(10**6), 10**12),
    per_page=st.integers(1, 10**7),
    per_swa_page=st.integers(0, 10**8),
    ratio=st.sampled_from([0.0, 0.01, 0.1, 0.33, 0.8, 1.0]),
)
def test_largest_within_is_the_largest_that_fits(room: int, per_page: int, per_swa_page: int, ratio: float) -> None:
    """The solve's bisection over integer sums: the most pages within ``room``, where one page more is not."""

    def swa(pages: int) -> int:
        return int(pages * 256 * ratio) // 256

    def spent(pages: int) -> int:
        return per_page * pages + per_swa_page * swa(pages)

    pages = _largest_within(room, per_page, per_swa_page, ratio, swa)
    assert pages is not None and pages >= 0
    assert spent(pages) <= room or pages == 0
    assert spent(pages + 1) > room
