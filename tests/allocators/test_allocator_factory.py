"""Which allocator a plan gets, and that the planner charges what it holds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvpools_core.allocators import (
    PagedAllocator,
    TokenAllocator,
    allocator_class,
    allocator_for_plan,
    allocator_planned_nbytes,
)


def fake_plan(tokens: int, page_size: int, disaggregation_mode: str = "null") -> SimpleNamespace:
    serving = SimpleNamespace(page_size=page_size, disaggregation_mode=disaggregation_mode)
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
