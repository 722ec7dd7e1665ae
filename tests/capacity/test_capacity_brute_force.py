"""The closed forms against brute force: the plan's real allocator filled with requests until it refuses,
and a scan over every context length for the largest one N requests reach."""

from __future__ import annotations

import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpools_core import Plan, Serving, plan
from kvpools_core.planning.capacity import concurrency, max_context

with warnings.catch_warnings():
    # a torch wheel installed without numpy warns once at import; warnings are errors here
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch

from kvpools_core.allocators import allocator_for_plan


def requests_the_allocator_admits(p: Plan, context_len: int) -> int:
    """Allocate fresh requests of ``context_len`` tokens as SGLang's scheduler does (``alloc_extend`` from an empty
    prefix; ``alloc`` on the token allocator) until the plan's allocator returns None."""
    allocator = allocator_for_plan(p, "cpu")
    zero, none = torch.tensor([0]), torch.tensor([-1])
    seq = torch.tensor([context_len])
    admitted = 0
    while True:
        if p.serving.page_size == 1:
            got = allocator.alloc(context_len)
        else:
            got = allocator.alloc_extend(zero, seq, none, context_len)
        if got is None:
            return admitted
        assert got.numel() == context_len
        admitted += 1


@pytest.fixture(scope="module", params=[1, 16, 64])
def small_llama(request: pytest.FixtureRequest) -> Plan:
    """Llama-3.1-8B in 1 GiB at context 2,048 (a small request table): a few thousand tokens, exact accounting."""
    return plan("llama-3.1-8b", Serving(page_size=request.param, context_length=2_048), memory="1GiB")


@pytest.mark.parametrize("context_len", [1, 15, 16, 17, 63, 64, 65, 100, 333, 1_000, 2_048])
def test_concurrency_is_what_the_real_allocator_admits(small_llama: Plan, context_len: int) -> None:
    """The token limit is exactly what the allocator admits; the answer is that or the request cap, below it."""
    answer = concurrency(small_llama, context_len)
    admitted = requests_the_allocator_admits(small_llama, context_len)
    assert answer.limits["full tokens"] == admitted
    assert answer.concurrent_requests == min(admitted, small_llama.max_running_requests)
    assert answer.binding == ("full tokens" if admitted <= small_llama.max_running_requests else "request cap")


def test_the_whole_pool_is_one_request(small_llama: Plan) -> None:
    """Every usable token of the plan is one request's (page 0 is padding, outside the count)."""
    tokens = small_llama.counts["tokens"]["full"]
    answer = concurrency(small_llama, min(tokens, 2_048))
    assert answer.concurrent_requests == requests_the_allocator_admits(small_llama, min(tokens, 2_048))


def largest_context_by_scan(p: Plan, requests: int) -> int:
    """Every context length from the plan's down to 1: the first at which ``requests`` fit (0 if none)."""
    for context_len in range(p.model.context_len, 0, -1):
        if concurrency(p, context_len).concurrent_requests >= requests:
            return context_len
    return 0


@pytest.mark.parametrize(
    ("model", "serving", "memory"),
    [
        ("llama-3.1-8b", Serving(page_size=64, context_length=2_048), "1GiB"),
        ("gemma-2-9b", Serving(page_size=16, context_length=6_000), "2GiB"),
        ("mistral-7b-v0.1", Serving(context_length=5_000), "1GiB"),
        ("mistral-7b-v0.1", Serving(context_length=20_000, chunked_prefill_size=2_048), "1GiB"),
    ],
    ids=["llama", "gemma-2", "mistral", "mistral-chunks"],
)
@pytest.mark.parametrize("requests", [1, 2, 3, 7, 50])
def test_max_context_is_the_brute_force_scan(model: str, serving: Serving, memory: str, requests: int) -> None:
    p = plan(model, serving, memory=memory)
    assert max_context(p, requests).context_len == largest_context_by_scan(p, requests)


PLANS = {
    "llama-page-16": ("llama-3.1-8b", Serving(page_size=16), "8GiB"),
    "llama-sglang": ("llama-3.1-8b", Serving(accounting="sglang"), "3GiB"),
    "gpt-oss": ("gpt-oss-20b", Serving(page_size=16), "4GiB"),
    "gpt-oss-chunk-cap": (
        "gpt-oss-20b",
        Serving(page_size=64, max_running_requests=16, disable_radix_cache=True),
        "4GiB",
    ),
    "gemma-2": ("gemma-2-9b", Serving(page_size=16), "8GiB"),
    "mistral": ("mistral-7b-v0.1", Serving(), "2GiB"),
    "mistral-no-chunks": ("mistral-7b-v0.1", Serving(chunked_prefill_size=None, disable_overlap_schedule=True), "3GiB"),
    "gemma-2-decode-node": (
        "gemma-2-9b",
        Serving(page_size=16, disaggregation_mode="decode", disaggregation_decode_extra_slots=3),
        "8GiB",
    ),
    "qwen3-next": ("qwen3-next-80b-a3b-thinking", Serving(page_size=16), "20GiB"),
}


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    return {name: plan(model, serving, memory=memory) for name, (model, serving, memory) in PLANS.items()}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(PLANS)), requests=st.integers(1, 3_000))
def test_max_context_is_the_largest_context_that_fits(plans: dict[str, Plan], name: str, requests: int) -> None:
    """``max_context(N)`` = L: N requests fit at L, and at L + 1 (a page more, or past the context length) they
    do not — concurrency never grows with the length, so no longer context fits either."""
    p = plans[name]
    answer = max_context(p, requests)
    reached = answer.context_len
    if reached:
        assert concurrency(p, reached).concurrent_requests >= requests
    assert concurrency(p, reached + 1).concurrent_requests < requests
    assert answer.limits[answer.binding] == reached


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(sorted(PLANS)), shorter=st.integers(1, 1 << 20), extra=st.integers(0, 1 << 20))
def test_concurrency_never_grows_with_the_context(plans: dict[str, Plan], name: str, shorter: int, extra: int) -> None:
    p = plans[name]
    longer = concurrency(p, shorter + extra)
    assert longer.concurrent_requests <= concurrency(p, shorter).concurrent_requests
    assert longer.concurrent_requests == min(longer.limits.values()) or longer.binding == "context length"
