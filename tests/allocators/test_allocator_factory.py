"""Which allocator a plan gets, and that the planner charges what it holds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvpools_core import Registry, Serving, build, hookimpl, plan
from kvpools_core.allocators import (
    PagedAllocator,
    TokenAllocator,
    allocator_class,
    allocator_for_plan,
    allocator_planned_nbytes,
)
from kvpools_core.building import Pools
from kvpools_core.errors import AllocatorError
from kvpools_core.values import Plan, PlatformTraits


def fake_plan(tokens: int, page_size: int, disaggregation_mode: str = "null", dcp_size: int = 1) -> SimpleNamespace:
    serving = SimpleNamespace(
        page_size=page_size,
        disaggregation_mode=disaggregation_mode,
        dcp_size=dcp_size,
        traits=PlatformTraits(platform="cpu"),
    )
    return SimpleNamespace(max_total_num_tokens=tokens, serving=serving)


def test_page_size_1_gets_the_token_allocator() -> None:
    assert allocator_class(1) is TokenAllocator
    assert allocator_class(16) is PagedAllocator


@pytest.mark.parametrize(
    ("tokens", "page_size", "expected"),
    [
        (1000, 1, 8 * 1000),  # 1000 int64 slot ids
        (1024, 64, 8 * 16 + 8 * 64),  # 16 int64 page ids + 64 int64 in-page offsets
        (0, 16, 0),  # no pool, no allocator
    ],
)
def test_planned_bytes(tokens: int, page_size: int, expected: int) -> None:
    assert allocator_planned_nbytes(tokens, page_size) == expected


@pytest.mark.parametrize(("page_size", "mode"), [(1, "null"), (16, "null"), (16, "decode"), (1, "prefill")])
def test_allocator_for_plan_holds_what_was_planned(page_size: int, mode: str) -> None:
    a = allocator_for_plan(fake_plan(4096, page_size, mode), "cpu")  # type: ignore[arg-type]
    assert isinstance(a, allocator_class(page_size))
    assert a.available_size() == 4096
    assert a.need_sort is (mode != "null")  # PD disaggregation wants ascending slot ids
    assert a.nbytes == allocator_planned_nbytes(4096, page_size)


@pytest.mark.parametrize("page_size", [1, 16])
def test_dcp_widens_the_allocator_id_space(page_size: int) -> None:
    """SGLang 0.5.23 builds ``PagedTokenToKVPoolAllocator(S x dcp, page_size=page x dcp)`` under DCP, even at page
    size 1 (ref-000 ``_build_token_to_kv_pool_allocator`` lines 2145-2164): ``dcp`` logical token ids per slot of
    this rank, the same number of pages, so the same free list and a ``page x dcp`` offsets table."""
    dcp, tokens = 8, 4096
    a = allocator_for_plan(fake_plan(tokens, page_size, dcp_size=dcp), "cpu")  # type: ignore[arg-type]
    assert isinstance(a, PagedAllocator)
    assert (a.size, a.page_size) == (tokens * dcp, page_size * dcp)
    assert a.available_size() == tokens * dcp
    assert a.nbytes == 8 * (tokens // page_size) + 8 * page_size * dcp
    got = a.alloc(page_size * dcp)  # one page: page x dcp consecutive logical ids
    assert got is not None and got.tolist() == list(range(page_size * dcp, 2 * page_size * dcp))
    kept = allocator_for_plan(fake_plan(tokens, page_size, dcp_size=dcp), "cpu", widen_dcp=False)  # type: ignore[arg-type]
    assert kept.available_size() == tokens and kept.page_size == page_size


def test_dcp_plan_builds_the_widened_allocator_it_planned() -> None:
    """deepseek-v3.2 (DSA, MLA) at TP 8, DCP 8: the plan charges the widened allocator and build holds it."""
    from kvpools_core import Serving, build
    from kvpools_core.pipeline import plan

    p = plan("deepseek-v3.2", Serving(tp_size=8, dcp_size=8, kv_cache_dtype="fp8_e4m3"), memory="40GiB")
    spec = p.pool("allocator")
    tokens, page = p.max_total_num_tokens, p.serving.page_size  # DSA's page 64
    assert page == 64
    assert spec.bytes == 8 * (tokens // page) + 8 * page * 8
    pools = build(p, "meta")
    assert (pools.allocator.size, pools.allocator.page_size) == (tokens * 8, page * 8)
    assert pools.allocated_by_pool()["allocator"] == spec.bytes


# ------------------------------------------------------------ build(checked)
def _units(pools: Pools) -> dict[str, int]:
    """Unit ids each planned allocator pool holds (its checked map has one bool per id 0..units)."""
    return {p.name: p.slots for p in pools.plan.pools if p.kind == "allocator"}


@pytest.mark.parametrize(
    ("preset", "serving"),
    [
        ("llama-3.1-8b", Serving(context_length=256, max_running_requests=4)),
        ("llama-3.1-8b", Serving(context_length=256, max_running_requests=4, page_size=16)),
        ("gpt-oss-20b", Serving(context_length=256, max_running_requests=4, page_size=4)),
        ("mistral-7b-v0.1", Serving(context_length=256, max_running_requests=4, page_size=16)),
    ],
)
def test_build_checked_gives_checked_allocators_and_reports_their_map(preset: str, serving: Serving) -> None:
    p = plan(preset, serving, memory=48 << 20)
    default = build(p, "cpu")
    planned = {pool.name: pool.bytes for pool in p.pools}
    assert default.allocated_by_pool() == planned and default.allocated_bytes == p.planned_bytes
    allocator = default.allocator
    assert not allocator.checked
    with pytest.raises(AllocatorError, match="padding"):  # unchecked, but range checked
        allocator.free(torch.tensor([0]))

    checked = build(p, "cpu", checked=True)
    assert checked.allocator.checked and type(checked.allocator) is type(allocator)
    # the int16 "allocated" map: 2 bytes per unit id 0..units (issue 37: a free counts off its units in one op)
    extra = {f"{name}_checked": 2 * (units + 1) for name, units in _units(checked).items()}
    assert checked.allocated_by_pool() == planned | extra  # the planned pools unchanged, the maps apart
    assert checked.allocated_bytes == p.planned_bytes + sum(extra.values())
    slots = checked.allocator.alloc(serving.page_size)
    assert slots is not None
    checked.allocator.free(slots)
    with pytest.raises(AllocatorError, match="double free"):
        checked.allocator.free(slots)


def test_build_allocator_hook_gets_checked() -> None:
    """A plugin that names ``checked`` in its build_allocator gets it; the default is False."""
    seen: list[bool] = []

    class Spy:
        @hookimpl(tryfirst=True)
        def build_allocator(self, plan: Plan, pool: object, device: str, checked: bool) -> None:
            seen.append(checked)

    p = plan("llama-3.1-8b", Serving(context_length=256, max_running_requests=4), memory=48 << 20)
    local = Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"spy": Spy()})
    build(p, "meta", registry=local)
    build(p, "meta", registry=local, checked=True)
    assert seen == [False, True]


def test_mamba_state_slots_are_range_checked() -> None:
    """The recurrent-state pool hands out slots through a core TokenAllocator: padding slot 0 is refused."""
    p = plan("falcon-h1-0.5b", Serving(context_length=256, max_running_requests=2), memory=256 << 20)
    req = build(p, "cpu").req_to_token_pool
    free = req.mamba_pool.allocator.available_size()
    rows = req.alloc(1)
    with pytest.raises(AllocatorError, match=r"foreign slot\(s\) \[0\]"):
        req.mamba_pool.free(torch.tensor([0]))
    req.free(rows)
    assert req.mamba_pool.allocator.available_size() == free


def test_mamba_state_slots_are_checked_in_checked_builds() -> None:
    """build(checked=True) reaches the state-slot allocator the request table owns (build_req_to_token_pool)."""
    p = plan("falcon-h1-0.5b", Serving(context_length=256, max_running_requests=2), memory=256 << 20)
    unchecked = build(p, "cpu")
    assert not unchecked.req_to_token_pool.mamba_pool.allocator.checked
    assert "mamba_allocator_checked" not in unchecked.allocated_by_pool()
    pools = build(p, "cpu", checked=True)
    slots = pools.req_to_token_pool.mamba_pool.allocator
    assert slots.checked
    k = p.sizing.sglang_config["max_mamba_cache_size"]
    assert pools.allocated_by_pool()["mamba_allocator_checked"] == 2 * (k + 1)  # int16 per slot id 0..k
    assert pools.allocated_by_pool()["mamba_allocator"] == p.pool("mamba_allocator").bytes
    got = slots.alloc(1)
    assert got is not None
    slots.free(got)
    with pytest.raises(AllocatorError, match="double free"):
        slots.free(got)
