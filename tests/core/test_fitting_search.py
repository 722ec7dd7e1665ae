"""``largest_fitting_tokens`` probes along secants; its answer must be bisection's on every non-decreasing cost."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from kvpools_core.parts.sizing import largest_fitting_tokens


def bisection(budget: int, page: int, upper: int, cost: Callable[[int], int]) -> int:
    """The search as it was: bisection over pages (the reference answer)."""
    low, high = 0, upper // page
    while low < high:
        mid = (low + high + 1) // 2
        if cost(mid * page) <= budget:
            low = mid
        else:
            high = mid - 1
    return low * page


@st.composite
def step_costs(draw: st.DrawFn) -> Callable[[int], int]:
    """Non-decreasing costs as plans have them: fixed + per token + per request (a clamped, stepped count) +
    per page, or flat stretches (whole blocks of tokens) that stall a secant."""
    fixed = draw(st.integers(0, 10**10))
    per_token = draw(st.integers(0, 300_000))
    per_request = draw(st.integers(0, 10**6))
    context = draw(st.sampled_from([1024, 32768, 131072, 1 << 20]))
    block = draw(st.sampled_from([1, 7, 1000, 65536]))

    def cost(tokens: int) -> int:
        requests = min(max(min(int(tokens / context * 512), 4096), 2048), tokens // 2)
        return fixed + per_token * (tokens // block) * block + per_request * requests + 8 * (tokens // 64)

    return cost


@settings(max_examples=400, deadline=None)
@given(
    cost=step_costs(),
    budget=st.integers(0, 10**12),
    page=st.sampled_from([1, 16, 64, 128, 256]),
    upper=st.integers(0, 10**8),
)
def test_secant_search_equals_bisection(cost: Callable[[int], int], budget: int, page: int, upper: int) -> None:
    assert largest_fitting_tokens(budget, page, upper, cost) == bisection(budget, page, upper, cost)


def test_it_needs_few_probes_on_an_affine_cost() -> None:
    calls: list[int] = []

    def cost(tokens: int) -> int:
        calls.append(tokens)
        return 3_000_000 + 131_080 * tokens

    budget = 40 * 2**30
    assert largest_fitting_tokens(budget, 1, budget // 131_072, cost) == (budget - 3_000_000) // 131_080
    assert len(calls) <= 6  # bisection takes 19 over these 319,000 pages
