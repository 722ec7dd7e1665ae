"""PagedAllocator: SGLang's paged-allocator contract, a loop-based reference of
``alloc_extend`` / ``alloc_decode``, and a model-checked state machine."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvpools_core.allocators import AllocatorState, PagedAllocator
from kvpools_core.errors import AllocatorError

PagedModel = tuple[list[list[int]], list[list[int]], set[int], set[int], bool]


def fingerprint(a: PagedAllocator) -> tuple[object, ...]:
    """Everything that defines the allocator's state (for "nothing changed")."""
    allocated = None if a._allocated is None else a._allocated.tolist()
    pending = [t.tolist() for t in a._pending]
    return (a._head, a._rel, a._pend, a._in_group, a._buf.tolist(), allocated, pending, list(a._pending_bytes))


def i64(values: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def reference_extend(
    prefix_lens: list[int], seq_lens: list[int], last_loc: list[int], pages: list[int], page_size: int
) -> list[int]:
    """The obvious loop: continue the open page after last_loc, take the next
    free page exactly when a position starts a page."""
    out: list[int] = []
    fresh = iter(pages)
    for pre, seq, last in zip(prefix_lens, seq_lens, last_loc, strict=True):
        page = None
        for pos in range(pre, seq):
            if pos % page_size == 0:
                page = next(fresh)
            if page is None:  # still in the page that holds last_loc
                out.append(last + 1 + (pos - pre))
            else:
                out.append(page * page_size + pos % page_size)
    assert next(fresh, None) is None, "reference did not use every page"
    return out


def new_pages_needed(prefix_lens: list[int], seq_lens: list[int], page_size: int) -> int:
    return sum(-(-s // page_size) - -(-p // page_size) for p, s in zip(prefix_lens, seq_lens, strict=True))


def peek_pages(a: PagedAllocator, k: int) -> list[int]:
    """The next k pages the allocator hands out (then undone)."""
    state = a.backup_state()
    pages = a.alloc_pages(k)
    assert pages is not None
    a.restore_state(state)
    return pages


# ----------------------------------------------------------------- unit tests
def test_sglang_alloc_extend_case(device: str) -> None:
    # SGLang's alloc_extend test: prefix 2, seq 11, last_loc 1, free pages [3, 4], page 4
    a = PagedAllocator(32, 4, device=device)
    assert a.alloc_pages(2) == [1, 2]  # pages 3, 4 are next
    out = a.alloc_extend(i64([2], device), i64([11], device), i64([1], device), 9)
    assert out is not None
    assert out.tolist() == [2, 3, 12, 13, 14, 15, 16, 17, 18]
    assert out.dtype == torch.int64


def test_fresh_allocator_sizes(device: str) -> None:
    a = PagedAllocator(64, 16, device=device)
    assert (a.size, a.page_size, a.num_pages) == (64, 16, 4)
    assert a.available_size() == 64


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize(("size", "page_size"), [(16, 1), (64, 16), (6, 3), (131072, 64)])
def test_nbytes_equals_planned(size: int, page_size: int, checked: bool, device: str) -> None:
    a = PagedAllocator(size, page_size, device=device, checked=checked)
    pages = size // page_size
    # free stack 8 B/page + in-page offsets 8 B/slot of one page (+ 2 B/page id 0..pages when checked: int16)
    expected = 8 * pages + 8 * page_size + (2 * (pages + 1) if checked else 0)
    assert PagedAllocator.planned_nbytes(size, page_size, checked) == expected
    assert a.nbytes == expected


def test_rejects_unaligned_size() -> None:
    with pytest.raises(ValueError, match="round it down to 48"):
        PagedAllocator(50, 16)
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        PagedAllocator(16, 0)


def test_alloc_hands_out_whole_aligned_pages_never_page_0(device: str) -> None:
    a = PagedAllocator(32, 8, device=device)
    out = a.alloc(32)
    assert out is not None
    slots = out.tolist()
    assert slots == list(range(8, 40))  # pages 1..4, each contiguous and aligned
    assert a.alloc(8) is None
    a.free(out)
    assert a.available_size() == 32


def test_unaligned_alloc_is_rejected_without_change() -> None:
    a = PagedAllocator(32, 8)
    before = fingerprint(a)
    with pytest.raises(ValueError, match="multiple of page_size=8"):
        a.alloc(12)
    assert fingerprint(a) == before


def test_free_frees_whole_pages_any_order_with_repeats(device: str) -> None:
    a = PagedAllocator(32, 4, device=device)
    out = a.alloc(16)
    assert out is not None
    # the page of each slot is freed once, however often and in whatever order it appears
    a.free(i64([13, 4, 5, 14, 4], device))
    assert a.available_size() == 16 + 8
    assert sorted(a.alloc_pages(2)) == [1, 3]  # type: ignore[arg-type]


def test_page_api_and_tensor_api_share_one_state(device: str) -> None:
    a = PagedAllocator(64, 16, device=device)
    pages = a.alloc_pages(2)
    assert pages == [1, 2]
    slots = a.alloc(16)
    assert slots is not None and slots.tolist() == list(range(48, 64))
    assert a.available_size() == 16
    a.free_pages(pages)
    a.free(slots)
    assert a.available_size() == 64
    assert a.alloc_pages(5) is None
    assert a.alloc_pages(0) == []
    with pytest.raises(ValueError, match="non-negative"):
        a.alloc_pages(-1)


def test_free_pages_accepts_tensors_and_tuples() -> None:
    a = PagedAllocator(64, 16)
    a.alloc_pages(4)
    a.free_pages(torch.tensor([1, 2]))
    a.free_pages((3,))
    a.free_pages([])
    assert a.available_size() == 48


@pytest.mark.parametrize("need_sort", [False, True])
def test_over_free_is_rejected_unchecked(need_sort: bool) -> None:
    # the cheap count check keeps a bad free from writing outside the stack
    a = PagedAllocator(64, 16, need_sort=need_sort)
    a.alloc_pages(1)
    before = fingerprint(a)
    with pytest.raises(ValueError, match="free of 2 pages but only 1 are allocated"):
        a.free_pages([3, 4])
    with pytest.raises(ValueError, match="free of 2 pages but only 1 are allocated"):
        a.free(i64([48, 64]))
    assert fingerprint(a) == before


def test_free_pages_reuses_last_freed_first() -> None:
    a = PagedAllocator(64, 16)
    pages = a.alloc_pages(3)
    assert pages == [1, 2, 3]
    a.free_pages([2])
    assert a.alloc_pages(1) == [2]


def test_decode_takes_a_page_exactly_at_a_page_boundary(device: str) -> None:
    a = PagedAllocator(64, 4, device=device)
    out = a.alloc_extend(i64([0, 0], device), i64([4, 3], device), i64([-1, -1], device), 7)
    assert out is not None and out.tolist() == [4, 5, 6, 7, 8, 9, 10]
    # request 0 is at a boundary (position 4 starts page), request 1 continues its page
    dec = a.alloc_decode(i64([5, 4], device), i64([7, 10], device))
    assert dec is not None and dec.tolist() == [12, 11]
    assert a.available_size() == 64 - 12


def test_alloc_extend_and_decode_none_when_short(device: str) -> None:
    a = PagedAllocator(16, 4, device=device)
    assert a.alloc_pages(3) == [1, 2, 3]
    before = fingerprint(a)
    assert a.alloc_extend(i64([0], device), i64([5], device), i64([-1], device), 5) is None
    assert a.alloc_decode(i64([1, 5], device), i64([-1, 7], device)) is None
    assert fingerprint(a) == before
    # a decode that continues open pages needs no page and always fits
    out = a.alloc_decode(i64([2, 3], device), i64([4, 9], device))
    assert out is not None and out.tolist() == [5, 10]


def test_num_new_pages_hint_skips_the_count(device: str) -> None:
    a = PagedAllocator(64, 4, device=device)
    out = a.alloc_extend(i64([0], device), i64([6], device), i64([-1], device), 6, num_new_pages=2)
    assert out is not None and out.tolist() == [4, 5, 6, 7, 8, 9]
    dec = a.alloc_decode(i64([7], device), i64([9], device), num_new_pages=0)
    assert dec is not None and dec.tolist() == [10]


def test_empty_batches(device: str) -> None:
    a = PagedAllocator(64, 4, device=device)
    empty = i64([], device)
    out = a.alloc_extend(empty, empty, empty, 0)
    assert out is not None and out.numel() == 0
    dec = a.alloc_decode(empty, empty)
    assert dec is not None and dec.numel() == 0
    a.free(empty)
    assert a.available_size() == 64


def test_free_group_defers_and_merges_pages(device: str) -> None:
    a = PagedAllocator(32, 4, device=device)
    out = a.alloc(12)
    assert out is not None
    a.free_group_begin()
    a.free(out[:2])  # half of page 1 ...
    a.free(out[2:4])  # ... and the other half, in a second call: page 1 freed once
    a.free_pages([2])
    assert a.available_size() == 20
    a.free_group_end()
    assert a.available_size() == 28


def test_need_sort_hands_out_ascending_pages(device: str) -> None:
    a = PagedAllocator(24, 4, device=device, need_sort=True)
    assert a.alloc_pages(6) == [1, 2, 3, 4, 5, 6]
    a.free_pages([5, 2])
    a.free(i64([16, 17], device))  # page 4
    assert a.available_size() == 12
    assert a.alloc_pages(3) == [2, 4, 5]


def test_backup_restore_is_exact_across_both_apis(device: str) -> None:
    a = PagedAllocator(64, 4, device=device)
    held = a.alloc_pages(3)
    assert held is not None
    before = fingerprint(a)
    state = a.backup_state()
    a.alloc_extend(i64([0], device), i64([9], device), i64([-1], device), 9)
    a.free_pages(held)
    a.free_group_begin()
    a.free(i64([4 * held[0]], device))
    a.restore_state(state)
    assert fingerprint(a) == before


@pytest.mark.parametrize("checked", [False, True])
def test_restore_brings_back_an_open_group(checked: bool) -> None:
    a = PagedAllocator(64, 4, checked=checked)
    out = a.alloc(8)
    assert out is not None
    a.free_group_begin()
    a.free(out[:4])
    a.free(out[4:].to(torch.int32))
    before = fingerprint(a)
    state = a.backup_state()
    a.free_group_end()
    a.restore_state(state)
    assert fingerprint(a) == before
    a.free_group_end()
    assert a.available_size() == 64


def test_rejected_group_flush_keeps_the_group() -> None:
    a = PagedAllocator(64, 4)
    assert a.alloc_pages(1) == [1]
    a.free_group_begin()
    a.free_pages([1, 5])  # page 5 was never handed out: caught when the group is flushed
    before = fingerprint(a)
    with pytest.raises(ValueError, match="free of 2 pages but only 1 are allocated"):
        a.free_group_end()
    assert fingerprint(a) == before


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([0], r"foreign page\(s\) \[0\] \(slots 0\.\.3\)"),
        ([64], r"foreign page\(s\) \[16\] \(slots 64\.\.67\)"),
        ([40], r"never-allocated page\(s\) \[10\] \(slots 40\.\.43\)"),
    ],
)
def test_checked_rejects_bad_frees_and_keeps_state(bad: list[int], message: str, device: str) -> None:
    a = PagedAllocator(60, 4, device=device, checked=True)
    out = a.alloc(8)
    assert out is not None
    before = fingerprint(a)
    with pytest.raises(ValueError, match=message):
        a.free(i64(bad, device))
    assert fingerprint(a) == before


def test_checked_catches_double_free_on_both_apis(device: str) -> None:
    a = PagedAllocator(64, 4, device=device, checked=True)
    pages = a.alloc_pages(2)
    assert pages == [1, 2]
    a.free_pages([1])
    before = fingerprint(a)
    with pytest.raises(ValueError, match=r"double free .* page\(s\) \[1\]"):
        a.free(i64([5], device))
    with pytest.raises(ValueError, match=r"double free .* page\(s\) \[1\]"):
        a.free_pages([2, 1])
    with pytest.raises(ValueError, match=r"page\(s\) \[2\] \(slots 8\.\.11\) appear\(s\) twice"):
        a.free_pages([2, 2])
    assert fingerprint(a) == before
    a.free_group_begin()
    a.free(i64([8], device))
    with pytest.raises(ValueError, match=r"double free .* page\(s\) \[2\]"):
        a.free_pages([2])
    a.free_group_end()
    assert a.available_size() == 64


def test_checked_validates_extend_and_decode_batches(device: str) -> None:
    a = PagedAllocator(64, 4, device=device, checked=True)
    out = a.alloc_extend(i64([0], device), i64([3], device), i64([-1], device), 3)
    assert out is not None and out.tolist() == [4, 5, 6]
    before = fingerprint(a)
    with pytest.raises(ValueError, match="extend_num_tokens=5"):
        a.alloc_extend(i64([3], device), i64([7], device), i64([6], device), 5)
    with pytest.raises(ValueError, match="last_loc \\[5\\] does not precede"):
        a.alloc_extend(i64([3], device), i64([7], device), i64([5], device), 4)
    with pytest.raises(ValueError, match="last_loc \\[22\\] is not in an allocated page"):
        a.alloc_decode(i64([4], device), i64([22], device))
    with pytest.raises(ValueError, match="num_new_pages=0 but the batch needs 1"):
        a.alloc_extend(i64([3], device), i64([7], device), i64([6], device), 4, num_new_pages=0)
    assert fingerprint(a) == before


def test_clear_frees_everything(device: str) -> None:
    a = PagedAllocator(32, 4, device=device, need_sort=True, checked=True)
    a.alloc_pages(5)
    a.free_pages([3])
    a.clear()
    assert a.available_size() == 32
    assert a.alloc_pages(8) == [1, 2, 3, 4, 5, 6, 7, 8]


# ------------------------------------------------------ default-mode checks
@pytest.mark.parametrize("slot", [0, 3, -1, -4, 60, 63, 1 << 40])
@pytest.mark.parametrize("in_group", [False, True])
def test_default_mode_refuses_slots_outside_pages_1_to_n(slot: int, in_group: bool, device: str) -> None:
    """Slots 0..3 (padding page 0), negatives, and 60.. (past page 14) are refused on every path."""
    a = PagedAllocator(56, 4, device=device)  # pages 1..14: slots 4..59
    out = a.alloc(8)
    assert out is not None
    if in_group:
        a.free_group_begin()
    before = fingerprint(a)
    page = slot // 4
    span = re.escape(f"foreign page(s) [{page}] (slots {page * 4}..{page * 4 + 3}): valid page ids are 1..14")
    with pytest.raises(AllocatorError, match=span):
        a.free(i64([int(out[0]), slot], device))
    with pytest.raises(AllocatorError, match=r"page 0, slots 0\.\.3, is padding and never allocated"):
        a.free([slot, int(out[-1])])
    if 0 <= page <= 15:
        with pytest.raises(AllocatorError, match=r"foreign page"):
            a.free_pages([1, page])
        with pytest.raises(AllocatorError, match=r"foreign page"):
            a.free_pages(i64([page], device))
    assert fingerprint(a) == before
    a.free(out)
    if in_group:
        a.free_group_end()
    assert a.available_size() == 56


def test_free_pages_refuses_non_integers_and_free_takes_lists() -> None:
    a = PagedAllocator(64, 16)
    assert a.alloc_pages(3) == [1, 2, 3]
    before = fingerprint(a)
    for bad in ([1.0], [1, "2"], [1 << 70]):
        with pytest.raises(AllocatorError, match="integer page ids"):
            a.free_pages(bad)  # type: ignore[arg-type]
    for bad_slots in (torch.tensor([16.0]), [16.5], None):
        with pytest.raises(AllocatorError, match="integer page ids"):
            a.free(bad_slots)  # type: ignore[arg-type]
    assert fingerprint(a) == before
    a.free([16, 17])  # any slots of a page free the page
    a.free((32,))
    a.free_pages(np.array([3]))  # type: ignore[arg-type]
    assert a.available_size() == 64


def test_restore_rejects_a_foreign_or_non_state() -> None:
    a, b = PagedAllocator(64, 4), PagedAllocator(64, 4)
    for state in (b.backup_state(), None, object()):
        with pytest.raises(AllocatorError, match="restore_state"):
            a.restore_state(state)  # type: ignore[arg-type]


def test_checked_map_is_reported_apart_from_the_planned_allocator() -> None:
    unchecked, checked = PagedAllocator(64, 4), PagedAllocator(64, 4, checked=True)
    assert unchecked.nbytes_by_pool() == {"allocator": 8 * 16 + 8 * 4}
    assert checked.nbytes_by_pool() == {"allocator": 8 * 16 + 8 * 4, "allocator_checked": 2 * 17}


# ------------------------------------------------- reference extend / decode
@st.composite
def extend_batches(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    page_size = draw(st.sampled_from([1, 2, 3, 4, 16]))
    n = draw(st.integers(0, 5))
    prefix = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    ext = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    return page_size, prefix, [p + e for p, e in zip(prefix, ext, strict=True)]


@settings(max_examples=150, deadline=None)
@given(batch=extend_batches(), checked=st.booleans(), taken=st.integers(0, 5))
def test_alloc_extend_matches_reference(batch: tuple[int, list[int], list[int]], checked: bool, taken: int) -> None:
    page_size, prefix, seq = batch
    a = PagedAllocator(512 * page_size, page_size, checked=checked)
    a.alloc_pages(taken)  # start from a used stack, not 1, 2, 3, ...
    # give every prefix real slots (its own pages), so last_loc is the slot of position prefix-1
    last = []
    for pre in prefix:
        kv = a.alloc_extend(i64([0]), i64([pre]), i64([-1]), pre)
        assert kv is not None
        last.append(int(kv[-1]) if pre else -1)
    k = new_pages_needed(prefix, seq, page_size)
    pages = peek_pages(a, k)
    out = a.alloc_extend(i64(prefix), i64(seq), i64(last), sum(seq) - sum(prefix))
    assert out is not None
    assert out.tolist() == reference_extend(prefix, seq, last, pages, page_size)
    assert a.available_size() == (512 - taken - sum(-(-s // page_size) for s in seq)) * page_size


@settings(max_examples=100, deadline=None)
@given(
    page_size=st.sampled_from([1, 2, 4, 16]),
    lens=st.lists(st.integers(0, 40), min_size=0, max_size=6),
    checked=st.booleans(),
)
def test_alloc_decode_matches_reference(page_size: int, lens: list[int], checked: bool) -> None:
    a = PagedAllocator(512 * page_size, page_size, checked=checked)
    last = []
    for n in lens:
        kv = a.alloc_extend(i64([0]), i64([n]), i64([-1]), n)
        assert kv is not None
        last.append(int(kv[-1]) if n else -1)
    seq = [n + 1 for n in lens]
    pages = peek_pages(a, new_pages_needed(lens, seq, page_size))
    out = a.alloc_decode(i64(seq), i64(last))
    assert out is not None
    assert out.tolist() == reference_extend(lens, seq, last, pages, page_size)


# -------------------------------------------------------------- state machine
class PagedMachine(RuleBasedStateMachine):
    """Random SGLang- and vLLM-style traffic against a page-set model.

    Holdings are sequences (slots per position, grown by ``alloc_extend`` /
    ``alloc_decode``) or bare page lists (``alloc`` / ``alloc_pages``).
    """

    PAGES = 12
    page_size = 4
    need_sort = False
    checked = False
    seqs: list[list[int]]
    blocks: list[list[int]]
    pending: set[int]
    released: set[int]
    in_group: bool
    saved: tuple[AllocatorState, PagedModel, tuple[object, ...]] | None

    @initialize()
    def setup(self) -> None:
        self.size = self.PAGES * self.page_size
        self.a = PagedAllocator(self.size, self.page_size, need_sort=self.need_sort, checked=self.checked)
        self.seqs = []  # slots by position
        self.blocks = []  # page ids
        self.pending = set()  # pages freed inside the open group
        self.released = set()  # need_sort: freed, not merged yet
        self.in_group = False
        self.saved = None

    # -- model helpers
    def pages_of(self, slots: list[int]) -> list[int]:
        return sorted({s // self.page_size for s in slots})

    def live(self) -> list[int]:
        pages = [p for kv in self.seqs for p in self.pages_of(kv)]
        return pages + [p for b in self.blocks for p in b]

    def free_pages_count(self) -> int:
        return self.PAGES - len(self.live()) - len(self.pending)

    def check_new_pages(self, new: list[int]) -> None:
        assert all(1 <= p <= self.PAGES for p in new), new
        assert len(set(new)) == len(new)
        live = self.live()
        assert not set(new) & set(live), "page handed out twice"
        assert not set(new) & self.pending, "page of an open free group reused"
        if self.need_sort:
            assert new == sorted(new), "need_sort hands out ascending pages"
            if len(new) <= self.free_pages_count() - len(self.released):
                assert not set(new) & self.released, "released page reused before a merge"
            else:
                self.released.clear()

    def record_free(self, pages: list[int]) -> None:
        if self.in_group:
            self.pending |= set(pages)
        elif self.need_sort:
            self.released |= set(pages)

    # -- SGLang-style traffic
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        grow = data.draw(st.lists(st.integers(0, len(self.seqs) - 1), unique=True, max_size=3)) if self.seqs else []
        fresh = data.draw(st.integers(0 if grow else 1, 2))
        batch = [self.seqs[i] for i in grow] + [[] for _ in range(fresh)]
        ext = data.draw(st.lists(st.integers(0, 3 * self.page_size), min_size=len(batch), max_size=len(batch)))
        prefix = [len(kv) for kv in batch]
        seq = [p + e for p, e in zip(prefix, ext, strict=True)]
        last = [kv[-1] if kv else -1 for kv in batch]
        k = new_pages_needed(prefix, seq, self.page_size)
        before = fingerprint(self.a)
        if k > self.free_pages_count():
            assert self.a.alloc_extend(i64(prefix), i64(seq), i64(last), sum(ext)) is None
            assert fingerprint(self.a) == before
            return
        pages = peek_pages(self.a, k)
        assert fingerprint(self.a) == before
        out = self.a.alloc_extend(i64(prefix), i64(seq), i64(last), sum(ext))
        assert out is not None
        slots = out.tolist()
        assert slots == reference_extend(prefix, seq, last, pages, self.page_size)
        self.check_new_pages(pages)
        for kv, e in zip(batch, ext, strict=True):
            kv.extend(slots[:e])
            del slots[:e]
        self.seqs += [kv for kv in batch[len(grow) :] if kv]

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        idx = data.draw(st.lists(st.integers(0, len(self.seqs) - 1), unique=True, min_size=1))
        batch = [self.seqs[i] for i in idx]
        seq = [len(kv) + 1 for kv in batch]
        last = [kv[-1] for kv in batch]
        k = sum(1 for kv in batch if len(kv) % self.page_size == 0)
        before = fingerprint(self.a)
        if k > self.free_pages_count():
            assert self.a.alloc_decode(i64(seq), i64(last)) is None
            assert fingerprint(self.a) == before
            return
        pages = peek_pages(self.a, k)
        out = self.a.alloc_decode(i64(seq), i64(last))
        assert out is not None
        slots = out.tolist()
        assert slots == reference_extend([n - 1 for n in seq], seq, last, pages, self.page_size)
        self.check_new_pages(pages)
        for kv, s in zip(batch, slots, strict=True):
            kv.append(s)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def free_seq(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.seqs) - 1))
        kv = self.seqs[i]
        # keep a page-aligned head (radix-cache style) or nothing; frees in any order
        keep = data.draw(st.integers(0, len(kv) // self.page_size)) * self.page_size
        tail = data.draw(st.permutations(kv[keep:]))
        self.a.free(i64(tail))
        self.record_free(self.pages_of(tail))
        if keep:
            del kv[keep:]
        else:
            del self.seqs[i]

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), how=st.sampled_from(["segment", "segments", "full_segment", "full_segments", "page_ids"]))
    def free_seq_segment(self, data: st.DataObject, how: str) -> None:
        """SGLang 0.5.23's segment frees (issue 37): the tail ``kv[keep:]`` of a request's row from a page
        boundary (``radix_cache.py``'s ``free_segment(kv_indices[protected:prefix], start_pos=protected)``),
        or its pages by id, or split at a page boundary into two segments (``common.free_kv_row_segments``)."""
        p = self.page_size
        i = data.draw(st.integers(0, len(self.seqs) - 1))
        kv = self.seqs[i]
        keep = data.draw(st.integers(0, (len(kv) - 1) // p)) * p
        cut = data.draw(st.integers(keep // p, -(-len(kv) // p))) * p
        tail = kv[keep:]
        split = [(i64(kv[keep:cut]), keep), (i64(kv[cut:]), cut)]
        if how == "segment":
            self.a.free_segment(i64(tail), start_pos=keep)
        elif how == "segments":
            self.a.free_segments(split)
        elif how == "full_segment":
            self.a.free_full_segment(i64(tail), start_pos=keep)
        elif how == "full_segments":
            self.a.free_full_segments(split)
        else:  # the row's pages, in row order (SGLang's free_page_ids takes them as given)
            self.a.free_page_ids(i64([s // p for s in tail[::p]]))
        self.record_free(self.pages_of(tail))
        if keep:
            del kv[keep:]
        else:
            del self.seqs[i]

    # -- page-level traffic
    @rule(k=st.integers(0, PAGES + 1), as_slots=st.booleans())
    def alloc_block(self, k: int, as_slots: bool) -> None:
        before = fingerprint(self.a)
        pages: list[int] | None = None
        if as_slots:
            out = self.a.alloc(k * self.page_size)
            if out is not None:
                slots = out.tolist()
                pages = [s // self.page_size for s in slots[:: self.page_size]]
                # whole pages: page-aligned and contiguous
                assert slots == [q * self.page_size + j for q in pages for j in range(self.page_size)]
        else:
            pages = self.a.alloc_pages(k)
        if k > self.free_pages_count():
            assert pages is None
            assert fingerprint(self.a) == before
            return
        assert pages is not None and len(pages) == k
        self.check_new_pages(pages)
        if pages:
            self.blocks.append(pages)

    @precondition(lambda self: self.blocks)
    @rule(data=st.data(), as_slots=st.booleans())
    def free_block(self, data: st.DataObject, as_slots: bool) -> None:
        i = data.draw(st.integers(0, len(self.blocks) - 1))
        pages = data.draw(st.permutations(self.blocks.pop(i)))
        if as_slots:
            self.a.free(i64([p * self.page_size + self.page_size - 1 for p in pages]))
        else:
            self.a.free_pages(pages)
        self.record_free(pages)

    # -- groups, snapshots, reset
    @precondition(lambda self: not self.in_group)
    @rule()
    def group_begin(self) -> None:
        self.a.free_group_begin()
        self.in_group = True

    @precondition(lambda self: self.in_group)
    @rule()
    def group_end(self) -> None:
        self.a.free_group_end()
        self.in_group = False
        if self.need_sort:
            self.released |= self.pending
        self.pending = set()

    @rule()
    def backup(self) -> None:
        model: PagedModel = (
            [list(kv) for kv in self.seqs],
            [list(b) for b in self.blocks],
            set(self.pending),
            set(self.released),
            self.in_group,
        )
        self.saved = (self.a.backup_state(), model, fingerprint(self.a))

    @precondition(lambda self: self.saved is not None)
    @rule()
    def restore(self) -> None:
        assert self.saved is not None
        state, model, before = self.saved
        self.a.restore_state(state)
        assert fingerprint(self.a) == before
        seqs, blocks, pending, released, in_group = model
        self.seqs = [list(kv) for kv in seqs]
        self.blocks = [list(b) for b in blocks]
        self.pending, self.released, self.in_group = set(pending), set(released), in_group

    @rule()
    def clear(self) -> None:
        self.a.clear()
        self.seqs, self.blocks, self.pending, self.released, self.in_group = [], [], set(), set(), False

    @precondition(lambda self: self.checked)
    @rule(data=st.data())
    def bad_free_is_rejected(self, data: st.DataObject) -> None:
        owned = set(self.live()) - self.pending
        bad = data.draw(st.integers(-1, self.PAGES + 1).filter(lambda p: p not in owned))
        before = fingerprint(self.a)
        with pytest.raises(ValueError):
            if data.draw(st.booleans()):
                self.a.free(i64([bad * self.page_size]))
            else:
                self.a.free_pages([bad])
        assert fingerprint(self.a) == before

    # -- invariants
    @invariant()
    def available_matches_model(self) -> None:
        if hasattr(self, "a"):
            assert self.a.available_size() == self.free_pages_count() * self.page_size

    @invariant()
    def sequences_keep_the_page_layout(self) -> None:
        p = getattr(self, "page_size", 1)
        for kv in getattr(self, "seqs", []):
            for pos, slot in enumerate(kv):
                assert slot % p == pos % p, "slot not at its in-page offset"
                if pos % p:
                    assert slot == kv[pos - 1] + 1, "page not contiguous"
            assert len(self.pages_of(kv)) == -(-len(kv) // p), "one page per page_size positions"

    def teardown(self) -> None:
        if not hasattr(self, "a"):
            return
        if self.in_group:
            self.group_end()
        for kv in self.seqs:
            self.a.free(i64(kv))
        for pages in self.blocks:
            self.a.free_pages(pages)
        assert self.a.available_size() == self.size
        assert sorted(self.a.alloc_pages(self.PAGES) or []) == list(range(1, self.PAGES + 1))


class Paged1Machine(PagedMachine):
    page_size = 1
    PAGES = 24


class Paged16Machine(PagedMachine):
    page_size = 16
    PAGES = 6


class Paged4SortedMachine(PagedMachine):
    need_sort = True


class Paged4CheckedMachine(PagedMachine):
    checked = True


class Paged16SortedCheckedMachine(PagedMachine):
    page_size = 16
    PAGES = 6
    need_sort = True
    checked = True


def _machine_test(machine: type[RuleBasedStateMachine], examples: int) -> type:
    case = machine.TestCase
    case.settings = settings(max_examples=examples, stateful_step_count=25, deadline=None)
    return case


TestPaged4 = _machine_test(PagedMachine, 60)
TestPaged1 = _machine_test(Paged1Machine, 40)
TestPaged16 = _machine_test(Paged16Machine, 40)
TestPaged4NeedSort = _machine_test(Paged4SortedMachine, 40)
TestPaged4Checked = _machine_test(Paged4CheckedMachine, 30)
TestPaged16NeedSortChecked = _machine_test(Paged16SortedCheckedMachine, 30)
