"""SGLang 0.5.23's segment and page-id frees on every allocator (issue 37), with hand-computed free lists.

SGLang's contract (``srt/mem_cache/allocator/`` of 0.5.23): ``PagedTokenToKVPoolAllocator.free_segment``
frees ``free_index[::page_size] // page_size`` through ``free_page_ids``, which puts the pages in front of the
free list as given (``_release_page_ids``: ``torch.cat((*page_ids, self.free_pages))``); inside a free group
they are kept apart and released after the group's ``free`` pages (``free_group_end``).  The SWA allocator's
``free_swa_segment`` reads the mapping at one slot per page and frees those SWA pages by id; its
``free_segment`` is ``free_swa_segment`` then the full side's ``free_segment``.  ``base.py``'s ``_page_disjoint``
refuses (asserts) segments sharing a page.  The expected lists below were also printed by SGLang's own
allocators in the peers venv; ``test_segment_frees_vs_sglang.py`` compares them call by call.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kvpools_plugins.swa.allocator import PureSWAAllocator

import kvpools_core.allocators.paged as paged_module
from kvpools_core.allocators import PagedAllocator, TokenAllocator
from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator
from kvpools_core.errors import AllocatorError


def i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def free_list(a: Any) -> list[int]:
    out: list[int] = a.get_all_free_pages().tolist()
    return out


def state(a: Any) -> tuple[Any, ...]:
    return (free_list(a), a.available_size(), a._head, a._rel, a._pend, a._in_group)


def request(a: PagedAllocator | SWATokenToKVPoolAllocator, n: int) -> torch.Tensor:
    out = a.alloc_extend(i64([0]), i64([n]), i64([-1]), n)
    assert out is not None
    return out


# ------------------------------------------------------------------ paged
def test_free_segment_frees_one_page_per_page_size_slots_in_row_order() -> None:
    a = PagedAllocator(64, 4)  # pages 1..16
    row = request(a, 10)  # pages 1, 2, 3: slots 4..13
    assert row.tolist() == list(range(4, 14))
    a.free_segment(row[4:], start_pos=4)  # positions 4..9: pages 2 (slots 8..11) and 3 (12, 13: the last, partly)
    assert free_list(a) == [2, 3, *range(4, 17)]
    a.free_segment(row[:4], start_pos=0)
    assert free_list(a) == list(range(1, 17))


def test_free_page_ids_puts_the_pages_in_front_as_given() -> None:
    a = PagedAllocator(64, 4)
    assert a.alloc_pages(3) == [1, 2, 3]
    a.free_page_ids(i64([3, 1]))  # no sorting, no de-duplication: cat((page_ids, free_pages))
    assert free_list(a) == [3, 1, *range(4, 17)]
    assert a.available_size() == (16 - 3 + 2) * 4


def test_a_group_releases_page_ids_in_front_of_its_frees() -> None:
    a = PagedAllocator(64, 4)
    assert a.alloc_pages(6) == [1, 2, 3, 4, 5, 6]
    a.free_group_begin()
    a.free(i64([21, 16, 17]))  # pages 5, 4, 4
    a.free_page_ids(i64([2, 1]))
    assert a.available_size() == 10 * 4  # nothing comes back before the group ends
    a.free_group_end()
    # SGLang: free(cat(group)) first -> unique [4, 5] in front; then free_page_ids(cat(ids)) -> [2, 1] in front
    assert free_list(a) == [2, 1, 4, 5, *range(7, 17)]


def test_free_segments_frees_each_segment_in_front_of_the_previous_one() -> None:
    a = PagedAllocator(64, 4)
    row = request(a, 16)  # pages 1..4
    a.free_segments([(row[:8], 0), (row[8:], 8)])  # segment by segment: [3, 4] lands in front of [1, 2]
    assert free_list(a) == [3, 4, 1, 2, *range(5, 17)]


def test_the_range_check_runs_once_per_segment_on_its_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []

    def counting(t: torch.Tensor, **kwargs: Any) -> Any:
        seen.append(t.numel())
        return torch.aminmax(t, **kwargs)

    a = PagedAllocator(64, 4)
    row = request(a, 12)
    monkeypatch.setattr(paged_module, "_aminmax", counting)
    a.free_segment(row, start_pos=0)
    assert seen == [3]  # one aminmax over the 3 pages, not over the 12 slots


@pytest.mark.parametrize("checked", [False, True])
def test_bad_segments_are_refused_before_anything_changes(checked: bool) -> None:
    a = PagedAllocator(64, 4, checked=checked)
    row = request(a, 12)  # pages 1..3
    before = state(a)
    with pytest.raises(AllocatorError, match="page boundary"):
        a.free_segment(row[2:], start_pos=2)
    with pytest.raises(AllocatorError, match="shares a page"):  # the first ends in page 1, the second starts there
        a.free_segments([(row[:6], 0), (row[6:], 4)])
    with pytest.raises(AllocatorError, match="foreign"):  # all or nothing: the second segment's page 17 is foreign
        a.free_segments([(row[:4], 0), (i64([68, 69]), 4)])
    with pytest.raises(AllocatorError, match="foreign"):
        a.free_page_ids(i64([2, 0]))
    assert state(a) == before


def test_checked_mode_refuses_a_segment_that_is_not_whole_page_runs() -> None:
    slots = i64([4, 5, 8, 9])  # pages 1, 1, 2, 2: [::4] names page 1 only, page 2 would leak
    unchecked = PagedAllocator(64, 4)
    request(unchecked, 12)
    unchecked.free_segment(slots, start_pos=0)
    assert free_list(unchecked)[:2] == [1, 4]  # SGLang's result: page 1 alone
    checked = PagedAllocator(64, 4, checked=True)
    request(checked, 12)
    before = state(checked)
    with pytest.raises(AllocatorError, match="not in the page"):
        checked.free_segment(slots, start_pos=0)
    assert state(checked) == before


def test_checked_mode_refuses_a_page_given_twice_or_free() -> None:
    a = PagedAllocator(64, 4, checked=True)
    assert a.alloc_pages(2) == [1, 2]
    before = state(a)
    with pytest.raises(AllocatorError, match="twice"):
        a.free_page_ids(i64([1, 2, 1]))
    with pytest.raises(AllocatorError, match="double free or free of never-allocated"):
        a.free_page_ids(i64([3]))
    assert state(a) == before
    a.free_page_ids(i64([2, 1]))
    assert free_list(a) == [2, 1, *range(3, 17)]


# ------------------------------------------------------------------ token
def test_token_segment_frees_are_frees() -> None:
    a = TokenAllocator(16)
    row = a.alloc(6)
    assert row is not None and row.tolist() == [1, 2, 3, 4, 5, 6]
    a.free_segment(row[4:], start_pos=4)
    a.free_page_ids(row[3:4])
    a.free_segments([(row[:1], 0), (row[1:3], 1)])  # one free of [2, 3, 1]: each segment in front of the last
    assert a.available_size() == 16
    assert free_list(a) == [2, 3, 1, 4, 5, 6, *range(7, 17)]  # reused first (LIFO, kvpools' token order)
    with pytest.raises(AllocatorError, match="page boundary"):
        a.free_segment(row, start_pos=-1)


# ------------------------------------------------------------------ SWA
def test_swa_segment_frees_read_one_mapping_entry_per_page() -> None:
    a = SWATokenToKVPoolAllocator(64, 32, 4)  # full pages 1..16, SWA pages 1..8
    row = request(a, 10)
    assert row.tolist() == list(range(4, 14))
    assert a.translate_loc_from_full_to_swa(row).tolist() == list(range(4, 14))
    a.free_swa_segment(row[:8], start_pos=0)  # the window slid past positions 0..7: SWA pages 1, 2
    assert free_list(a.swa_attn_allocator) == [1, 2, 4, 5, 6, 7, 8]
    assert a.translate_loc_from_full_to_swa(row).tolist() == [0] * 8 + [12, 13]
    assert a.full_available_size() == 13 * 4
    a.free_full_segments([(row[:8], 0)])
    a.free_segment(row[8:], start_pos=8)
    assert free_list(a.full_attn_allocator) == [3, 1, 2, *range(4, 17)]
    assert free_list(a.swa_attn_allocator) == [3, 1, 2, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("page", [1, 4])
def test_swa_segment_frees_refuse_the_wrong_side_before_anything_changes(page: int) -> None:
    a = SWATokenToKVPoolAllocator(16 * page, 8 * page, page)
    row = request(a, 3 * page) if page > 1 else a.alloc(3)
    assert row is not None
    a.free_swa_segment(row[:page], start_pos=0)

    def snapshot() -> tuple[Any, ...]:
        return (
            state(a.full_attn_allocator),
            state(a.swa_attn_allocator),
            a.full_to_swa_index_mapping.tolist(),
        )

    before = snapshot()
    with pytest.raises(AllocatorError, match="free_full_segment"):  # its SWA page is gone already
        a.free_segment(row, start_pos=0)
    with pytest.raises(AllocatorError, match="free_full_segment"):
        a.free_swa_segment(row[:page], start_pos=0)
    with pytest.raises(AllocatorError, match="still map to SWA"):
        a.free_full_segment(row[page:], start_pos=page)
    with pytest.raises(AllocatorError, match="foreign"):
        a.free_swa_segment(i64([17 * page]), start_pos=0)
    assert snapshot() == before
    a.free_full_segments([(row[:page], 0)])
    a.free_segments([(row[page:], page)])
    assert (a.full_available_size(), a.swa_available_size()) == (16 * page, 8 * page)


def test_pure_swa_segment_frees() -> None:
    a = PureSWAAllocator(32, 4)
    row = a.alloc_extend(i64([0]), i64([10]), i64([-1]), 10)
    assert row is not None
    a.free_full_segments([(row[:4], 0)])  # no full pool: nothing to free
    a.free_full_segment(row, start_pos=0)
    assert a.available_size() == 32 - 12
    a.free_swa_segment(row[:4], start_pos=0)
    a.free_segments([(row[4:], 4)])
    assert a.available_size() == 32
    assert free_list(a.swa_attn_allocator) == [2, 3, 1, *range(4, 9)]


# ------------------------------------------------------------------ checked mode's map
@pytest.mark.parametrize("bad", [17, -1, 0])
def test_checked_free_refuses_a_foreign_id_after_valid_ones_and_keeps_the_map(bad: int) -> None:
    """On CPU the map's ``index_add_`` is the range check and stops at the first bad id, after counting off the
    valid ones before it: the map is rebuilt from the free lists (and the padding 0 is added back), exactly."""
    a = TokenAllocator(16, checked=True)
    held = a.alloc(5)
    assert held is not None
    assert a._allocated is not None
    before = (a._allocated.tolist(), state(a))
    assert before[0] == [0, 1, 1, 1, 1, 1] + [0] * 11
    with pytest.raises(AllocatorError, match=r"padding|foreign"):
        a.free(i64([1, 2, bad, 3]))
    assert (a._allocated.tolist(), state(a)) == before
    a.free(held)
    assert a._allocated.tolist() == [0] * 17 and a.available_size() == 16
