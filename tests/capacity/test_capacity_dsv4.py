"""Capacity answers for DeepSeek-V4: its compressed ``c4`` / ``c128`` spaces (``Plan.compression``) and its
windowed ``swa`` space (``Plan.windows``) — by hand, against the real dual allocator, and through the CLI."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

import attrs
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpools_core import Plan, Serving, plan
from kvpools_core.cli import main
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.planning.capacity import concurrency, max_context
from kvpools_core.planning.split import Workload, choose_split, workload_concurrency

with warnings.catch_warnings():
    # a torch wheel installed without numpy warns once at import; warnings are errors here
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch

from kvpools_plugins.dsv4.building import build_allocator

from kvpools_core.allocators.swa import new_full_to_swa_mapping

FLASH = Serving(page_size=256, tp_size=8, swa_full_tokens_ratio=0.8, max_running_requests=2048)
"""deepseek-v4-flash at TP 8, page 256 (SGLang's CUDA DeepSeek-V4 page), 60 GiB, 2,048 requests given (unset,
SGLang's DeepSeek-V4 default is 256: tests/core/test_engine_defaults.py), SGLang's generic ratio 0.8 given
explicitly (left unset, DeepSeek-V4 takes SGLang's 0.1: ``flash_swa_tenth``): full 986,368 tokens, SWA
788,992 (ratio 0.8), c4 246,592 = full / 4, c128 7,706 = full / 128, 2,048 requests, context 1,048,576; the SWA
window terms are 128 + 128 x 1 + 256 + 256 = 768 per request, 2 prefills of up to 8,192 in flight, 256 reserved."""


@pytest.fixture(scope="module")
def flash() -> Plan:
    return plan("deepseek-v4-flash", FLASH, memory="60GiB")


@pytest.fixture(scope="module")
def flash_swa_tenth() -> Plan:
    """The same with ``--swa-full-tokens-ratio`` unset: SGLang's own DeepSeek-V4 default 0.1 (docs/capacity.md);
    2,104 requests given (the configurator's estimate at that ratio before SGLang's DeepSeek-V4 default 256 was
    applied; many requests let the SWA window bind)."""
    p = plan("deepseek-v4-flash", Serving(page_size=256, tp_size=8, max_running_requests=2104), memory="60GiB")
    assert p.serving.swa_full_tokens_ratio == 0.1
    return p


def test_the_plan_describes_every_token_space(flash: Plan) -> None:
    assert flash.counts["tokens"] == {"full": 986_368, "swa": 788_992, "c4": 246_592, "c128": 7_706}
    assert dict(flash.compression) == {"c4": 4, "c128": 128}
    (window,) = flash.windows
    assert (window.token_space, window.window, window.per_request) == ("swa", 128, 768)
    assert (window.prefill_chunk, window.prefills_in_flight, window.reserved) == (8_192, 2, 256)


def test_8k_the_full_tokens_bind(flash: Plan) -> None:
    """8,192 tokens = 32 full pages: full 986,368 // 8,192 = 120; c4 holds 8,192 / 4 = 2,048 per request,
    246,592 // 2,048 = 120; c128 8,192 / 128 = 64, 7,706 // 64 = 120 (the compressed spaces tie with full: they
    are full / ratio); SWA past its worst case of 768: room 788,992 - 256 = 788,736, a prefill holds
    min(8,192 - 768, 8,192) = 7,424 more, 2 x (768 + 7,424) = 16,384 <= room, so 2 + (788,736 - 16,384) // 768
    = 2 + 1,005 = 1,007; request cap 2,048.  The least is 120, full tokens named first on the tie."""
    answer = concurrency(flash, 8_192)
    assert answer.limits == {
        "full tokens": 120,
        "swa tokens": 1_007,
        "c4 tokens": 120,
        "c128 tokens": 120,
        "request cap": 2_048,
    }
    assert answer.tokens_per_request == {"full": 8_192, "swa": 768, "c4": 2_048, "c128": 64}
    assert (answer.concurrent_requests, answer.binding) == (120, "full tokens")


def test_300_tokens_the_swa_tokens_bind(flash: Plan) -> None:
    """300 tokens = 2 pages = 512 slots, within the SWA worst case (768): SWA 788,992 // 512 = 1,541; full
    986,368 // 512 = 1,926; c4 246,592 // 128 = 1,926; c128 7,706 // 4 = 1,926; request cap 2,048 -> 1,541, SWA."""
    answer = concurrency(flash, 300)
    assert answer.limits == {
        "full tokens": 1_926,
        "swa tokens": 1_541,
        "c4 tokens": 1_926,
        "c128 tokens": 1_926,
        "request cap": 2_048,
    }
    assert (answer.concurrent_requests, answer.binding) == (1_541, "swa tokens")


def test_one_token_the_request_cap_binds(flash: Plan) -> None:
    """One page: full 986,368 // 256 = 3,853, SWA 788,992 // 256 = 3,082, c4 246,592 // 64 = 3,853, c128
    7,706 // 2 = 3,853; the request cap 2,048 binds."""
    answer = concurrency(flash, 1)
    assert (answer.concurrent_requests, answer.binding) == (2_048, "request cap")
    assert answer.limits["swa tokens"] == 3_082 and answer.limits["c128 tokens"] == 3_853


def test_4k_at_a_tenth_the_swa_window_binds(flash_swa_tenth: Plan) -> None:
    """Ratio 0.1, 2,104 requests given: full 4,311,296, SWA 431,104, c4 1,077,824, c128 33,682 (the paged pools with
    SGLang 0.5.23's physical page count).  4,096 tokens: full 4,311,296 // 4,096 = 1,052 (c4 // 1,024 and c128 // 32
    the same); SWA past 768: room 431,104 - 256 =
    430,848, a prefill holds min(4,096 - 768, 8,192) = 3,328 more, 2 x 4,096 <= room, 2 + (430,848 - 8,192) //
    768 = 552 -> 552, the SWA window binds."""
    p = flash_swa_tenth
    assert p.counts["tokens"] == {"full": 4_311_296, "swa": 431_104, "c4": 1_077_824, "c128": 33_682}
    answer = concurrency(p, 4_096)
    assert answer.limits == {
        "full tokens": 1_052,
        "swa tokens": 552,
        "c4 tokens": 1_052,
        "c128 tokens": 1_052,
        "request cap": 2_104,
    }
    assert answer.binding == "swa tokens"


def test_max_context_by_hand(flash: Plan) -> None:
    """One request: full 986,368 (page aligned), c4 246,592 x 4 and c128 7,706 x 128 the same; SWA past its
    worst case: 788,992 - 256 - 768 leaves room for a whole 8,192 chunk, so any length -> 986,368, full tokens.
    Ten requests: full 98,636 // 256 x 256 = 98,560; c4 24,659 x 4 = 98,636 -> 98,560; c128 770 x 128 =
    98,560 -> 98,560."""
    one = max_context(flash, 1)
    assert (one.context_len, one.binding) == (986_368, "full tokens")
    assert one.limits["swa tokens"] == flash.model.context_len
    ten = max_context(flash, 10)
    assert ten.context_len == 98_560
    assert ten.limits["c4 tokens"] == ten.limits["c128 tokens"] == 98_560


def test_hisparse_c4_is_refused() -> None:
    """Under HiSparse the c4 device pool has an allocator of its own: no ratio is recorded, so capacity refuses
    c4 and names it."""
    p = plan(
        "deepseek-v4-flash",
        attrs.evolve(FLASH, enable_hisparse=True, disable_radix_cache=True, accounting="sglang"),
        memory="60GiB",
    )
    assert dict(p.compression) == {"c128": 128}
    with pytest.raises(UnsupportedCombinationError, match=r"\['c4'\]"):
        concurrency(p, 1_024)


def test_a_ratio_must_divide_the_page(flash: Plan) -> None:
    odd = attrs.evolve(flash, sizing=attrs.evolve(flash.sizing, compression={"c4": 3, "c128": 128}))
    with pytest.raises(UnsupportedCombinationError, match="divides the page"):
        concurrency(odd, 1_024)


# ------------------------------------------------------------------------------------------- brute force

SMALL = attrs.evolve(FLASH, context_length=8_192, max_running_requests=16)
SMALL_PLANS = {
    "ratio-0.8": ("1GiB", SMALL),
    "ratio-0.1": ("1GiB", attrs.evolve(SMALL, swa_full_tokens_ratio=0.1)),
    "ratio-1.0": ("1GiB", attrs.evolve(SMALL, swa_full_tokens_ratio=1.0)),
}


@pytest.fixture(scope="module")
def small_plans() -> dict[str, Plan]:
    return {name: plan("deepseek-v4-flash", serving, memory=memory) for name, (memory, serving) in SMALL_PLANS.items()}


def admitted_slots(p: Plan, context_len: int) -> list[torch.Tensor]:
    """Fresh requests of ``context_len`` tokens in the dsv4 plugin's own dual full / SWA allocator (``alloc_extend``
    from an empty prefix, as SGLang's scheduler) until it refuses: each request's full slots."""
    page = p.serving.page_size
    full = int(p.sizing.sglang_config["full_max_total_num_tokens"])
    pool = SimpleNamespace(full_to_swa_index_mapping=new_full_to_swa_mapping(full, page, "cpu"))
    allocator = build_allocator(plan=p, pool=pool, device="cpu", checked=True)
    zero, none, seq = torch.tensor([0]), torch.tensor([-1]), torch.tensor([context_len])
    held = []
    while (got := allocator.alloc_extend(zero, seq, none, context_len)) is not None:
        held.append(got)
    return held


@pytest.mark.parametrize("name", sorted(SMALL_PLANS))
@pytest.mark.parametrize("context_len", [1, 255, 256, 257, 500, 768])
def test_what_the_dual_allocator_admits(small_plans: dict[str, Plan], name: str, context_len: int) -> None:
    """Within the SWA worst case (768) no eviction runs: the allocator admits exactly min(full, swa limit), and the
    admitted requests' compressed slots (``full slot // ratio``) number ``requests x pages x page / ratio``, all
    within the space's count plus its padding page (page 0) — the compressed limit is what the allocator's pages
    give."""
    p = small_plans[name]
    answer = concurrency(p, context_len)
    held = admitted_slots(p, context_len)
    assert len(held) == min(answer.limits["full tokens"], answer.limits["swa tokens"])
    page = p.serving.page_size
    pages = torch.unique(torch.cat(held) // page)  # a request holds its pages whole, written or not
    assert pages.numel() * page == len(held) * answer.tokens_per_request["full"]
    slots = (pages[:, None] * page + torch.arange(page)).flatten()
    for space, ratio in p.compression.items():
        rows = torch.unique(slots // ratio)
        assert rows.numel() == len(held) * answer.tokens_per_request[space]
        assert int(rows.max()) < p.counts["tokens"][space] + page // ratio
        assert answer.limits[f"{space} tokens"] == answer.limits["full tokens"]


@pytest.fixture(scope="module")
def all_plans(flash: Plan, flash_swa_tenth: Plan, small_plans: dict[str, Plan]) -> dict[str, Plan]:
    no_chunks = plan(
        "deepseek-v4-flash",
        attrs.evolve(SMALL, disable_overlap_schedule=True, chunked_prefill_size=None),
        memory="1GiB",
    )
    return {"flash": flash, "flash-0.1": flash_swa_tenth, "no-chunks": no_chunks, **small_plans}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["flash", "flash-0.1", "no-chunks", *sorted(SMALL_PLANS)]), requests=st.integers(1, 3_000))
def test_max_context_is_the_largest_context_that_fits(all_plans: dict[str, Plan], name: str, requests: int) -> None:
    """``max_context(N)`` = L: N requests fit at L and not at L + 1."""
    p = all_plans[name]
    answer = max_context(p, requests)
    reached = answer.context_len
    if reached:
        assert concurrency(p, reached).concurrent_requests >= requests
    assert concurrency(p, reached + 1).concurrent_requests < requests
    assert answer.limits[answer.binding] == reached


# ------------------------------------------------------------------------------------------------- split

workloads = st.one_of(
    st.integers(256, 64 * 1024).map(lambda n: Workload((n,), f"{n}", clamp=True)),
    st.lists(st.integers(64, 64 * 1024), min_size=2, max_size=6).map(lambda ls: Workload(tuple(ls), "mix", clamp=True)),
)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(workload=workloads, memory=st.sampled_from(["40GiB", "60GiB"]))
def test_split_within_budget_and_never_worse(workload: Workload, memory: str) -> None:
    """The split turns DeepSeek-V4's ``swa_full_tokens_ratio`` (its windowed SWA space; c4 / c128 move with the
    full tokens): every candidate is a plan, the default among them."""
    choice = choose_split("deepseek-v4-flash", FLASH, {"memory": memory}, workload)
    assert choice.knob == "swa_full_tokens_ratio"
    assert choice.plan.planned_bytes <= choice.plan.budget.budget_bytes
    assert choice.chosen.concurrent_requests >= choice.default.concurrent_requests
    assert workload_concurrency(choice.plan, workload) == choice.chosen
    assert workload_concurrency(choice.default_plan, workload) == choice.default


def test_split_for_8k(flash: Plan) -> None:
    """8k requests outgrow the window: the full tokens bind at 120 under SGLang's 0.8, and the SWA space needs
    only its worst case per request and the chunks in flight, so a smaller ratio gives full tokens room."""
    choice = choose_split("deepseek-v4-flash", FLASH, {"memory": "60GiB"}, "8k")
    assert choice.default.concurrent_requests == concurrency(flash, 8_192).concurrent_requests == 120
    assert isinstance(choice.value, float) and choice.value < 0.8
    assert choice.chosen.concurrent_requests > 120
    assert choice.chosen == workload_concurrency(choice.plan, Workload((8_192,), "8k"))


# --------------------------------------------------------------------------------------------------- CLI


def test_cli_answers_deepseek_v4() -> None:
    args = ["capacity", "deepseek-v4-flash", "--tp-size", "8", "--page-size", "256", "--memory", "60GiB"]
    args += ["--swa-full-tokens-ratio", "0.8", "--max-running-requests", "2048"]  # FLASH's numbers
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "c4 tokens 246,592 (1 per 4 full tokens)" in out.output
    assert "c128 tokens 7,706 (1 per 128 full tokens)" in out.output
    assert "largest single-request context: 986,368 tokens (binding: full tokens)" in out.output
    data = json.loads(CliRunner().invoke(main, [*args, "--json"]).output)
    assert data["compression"] == {"c4": 4, "c128": 128}
    by_length = {row["context_len"]: row for row in data["ladder"]}
    assert (by_length[8_192]["concurrent_requests"], by_length[8_192]["binding"]) == (120, "full tokens")
