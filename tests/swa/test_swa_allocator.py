"""The dual (full + SWA) allocator and the pure-SWA allocator: unit cases and a hypothesis state machine.

The machine runs requests that arrive, extend, decode, slide out of the
window (``free_swa`` of whole pages before the last one) and finish, inside
and outside free groups, with backups and restores, at page size 1 and 4,
with and without ``need_sort``.  After every step: no slot is live twice in
either pool, page 0 of either is never handed out, the full→SWA mapping
holds exactly the live, unevicted tokens (0 everywhere else, −1 at the end),
a full page maps to one SWA page at the same offsets, and the free counts
are what the live pages leave.  At teardown everything returns.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from kvpools_plugins.swa.allocator import PureSWAAllocator, SWAState, SWATokenToKVPoolAllocator

from kvpools_core.allocators import AllocatorState, PagedAllocator, TokenAllocator
from kvpools_core.errors import AllocatorError

FULL_PAGES = 12
SWA_PAGES = 6


def t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


class Request:
    def __init__(self) -> None:
        self.slots: list[int] = []  # full slot of every position
        self.evicted = 0  # positions [0, evicted) slid out of the window (SWA slots freed)


class DualAllocatorMachine(RuleBasedStateMachine):
    @initialize(page=st.sampled_from((1, 4)), need_sort=st.booleans())
    def start(self, page: int, need_sort: bool) -> None:
        self.page = page
        self.alloc = SWATokenToKVPoolAllocator(
            FULL_PAGES * page, SWA_PAGES * page, page, need_sort=need_sort, checked=True
        )
        self.live: dict[int, Request] = {}
        self.next_id = 0
        self.pending_full = 0  # pages freed inside the open free group
        self.pending_swa = 0
        self.in_group = False
        self.snapshot: tuple[SWAState, dict[int, Request], int] | None = None

    # ------------------------------------------------------------------ model
    def pages(self, n: int) -> int:
        return -(-n // self.page)

    def live_full_pages(self) -> int:
        return sum(self.pages(len(r.slots)) for r in self.live.values())

    def live_swa_pages(self) -> int:
        return sum(self.pages(len(r.slots)) - r.evicted // self.page for r in self.live.values())

    def free_pages(self) -> tuple[int, int]:
        full = FULL_PAGES - self.live_full_pages() - self.pending_full
        swa = SWA_PAGES - self.live_swa_pages() - self.pending_swa
        return full, swa

    def extend(self, request: Request, n: int) -> bool:
        """Extend by n positions (alloc_extend); False, with nothing changed, when a pool is short."""
        pre, seq = len(request.slots), len(request.slots) + n
        need = self.pages(seq) - self.pages(pre)
        before = self.alloc.full_to_swa_index_mapping.clone()
        last = request.slots[-1] if request.slots else -1
        out = self.alloc.alloc_extend(t([pre]), t([seq]), t([last]), n)
        full_free, swa_free = self.free_pages()
        if need > min(full_free, swa_free):
            assert out is None
            assert torch.equal(before, self.alloc.full_to_swa_index_mapping)
            return False
        assert out is not None and out.numel() == n
        request.slots += out.tolist()
        return True

    # ------------------------------------------------------------------ rules
    def pick(self, data: st.DataObject, most: int = 1) -> list[int]:
        return data.draw(st.lists(st.sampled_from(sorted(self.live)), min_size=1, max_size=most, unique=True))

    @rule(n=st.integers(1, 9))
    def arrive(self, n: int) -> None:
        request = Request()
        if self.extend(request, n):
            self.next_id += 1
            self.live[self.next_id] = request

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(1, 6))
    def extend_request(self, data: st.DataObject, n: int) -> None:
        self.extend(self.live[self.pick(data)[0]], n)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        batch = [self.live[r] for r in self.pick(data, 4)]
        seq = [len(r.slots) + 1 for r in batch]
        need = sum(1 for s in seq if self.pages(s) > self.pages(s - 1))
        out = self.alloc.alloc_decode(t(seq), t([r.slots[-1] for r in batch]))
        if need > min(self.free_pages()):
            assert out is None
            return
        assert out is not None
        for request, slot in zip(batch, out.tolist(), strict=True):
            request.slots.append(slot)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def slide_out_of_window(self, data: st.DataObject) -> None:
        """free_swa of whole pages before the page of the request's last token."""
        request = self.live[self.pick(data)[0]]
        keep_from = (len(request.slots) - 1) // self.page * self.page
        if keep_from <= request.evicted:
            return
        upto = data.draw(st.integers(request.evicted // self.page + 1, keep_from // self.page)) * self.page
        self.alloc.free_swa(t(request.slots[request.evicted : upto]))
        freed_pages = (upto - request.evicted) // self.page
        request.evicted = upto
        if self.in_group:
            self.pending_swa += freed_pages

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        request = self.live.pop(self.pick(data)[0])
        self.alloc.free(t(request.slots))
        if self.in_group:
            self.pending_full += self.pages(len(request.slots))
            self.pending_swa += self.pages(len(request.slots)) - request.evicted // self.page

    @rule()
    def free_group_begin_or_end(self) -> None:
        if self.in_group:
            self.alloc.free_group_end()
            self.pending_full = self.pending_swa = 0
        else:
            self.alloc.free_group_begin()
        self.in_group = not self.in_group

    @precondition(lambda self: not self.in_group)
    @rule()
    def backup_or_restore(self) -> None:
        """Back up; the next time, restore (the requests and the mapping return to the backup's)."""
        if self.snapshot is None:
            self.snapshot = (self.alloc.backup_state(), copy.deepcopy(self.live), self.next_id)
            return
        state, live, _ = self.snapshot
        self.alloc.restore_state(state)
        self.live = live
        self.snapshot = None

    @precondition(lambda self: not self.in_group)
    @rule()
    def merge(self) -> None:
        self.alloc.merge_and_sort_free()

    # ------------------------------------------------------------- invariants
    @invariant()
    def slots_are_unique_and_mapping_is_exact(self) -> None:
        mapping = self.alloc.full_to_swa_index_mapping
        p = self.page
        full_slots = [s for r in self.live.values() for s in r.slots]
        assert len(full_slots) == len(set(full_slots)), "a full slot is live twice"
        assert all(p <= s < (FULL_PAGES + 1) * p for s in full_slots), "a full slot outside 1..size (or in page 0)"
        expected = torch.zeros_like(mapping)
        expected[-1] = -1
        swa_slots = []
        for request in self.live.values():
            for position, full in enumerate(request.slots):
                swa = int(mapping[full])
                if position < request.evicted:
                    assert swa == 0, "an evicted token still maps to an SWA slot"
                    continue
                assert p <= swa < (SWA_PAGES + 1) * p, f"SWA slot {swa} outside 1..size_swa (or in page 0)"
                assert swa % p == full % p, "a token sits at different in-page offsets in the two pools"
                expected[full] = swa
                swa_slots.append(swa)
            pages: dict[int, set[int]] = {}
            for full in request.slots[request.evicted :]:
                pages.setdefault(full // p, set()).add(int(mapping[full]) // p)
            assert all(len(v) == 1 for v in pages.values()), "a full page maps to two SWA pages"
        assert len(swa_slots) == len(set(swa_slots)), "an SWA slot is live twice"
        assert torch.equal(mapping, expected), "the mapping holds something but the live, unevicted tokens"

    @invariant()
    def free_counts_are_what_live_pages_leave(self) -> None:
        full, swa = self.free_pages()
        assert self.alloc.full_available_size() == full * self.page
        assert self.alloc.swa_available_size() == swa * self.page
        assert self.alloc.available_size() == min(full, swa) * self.page

    def teardown(self) -> None:
        if not hasattr(self, "alloc"):
            return
        if self.in_group:
            self.alloc.free_group_end()
        for request in self.live.values():
            self.alloc.free(t(request.slots))
        assert self.alloc.full_available_size() == FULL_PAGES * self.page
        assert self.alloc.swa_available_size() == SWA_PAGES * self.page
        assert not bool(self.alloc.full_to_swa_index_mapping[:-1].any())


DualAllocatorMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=50, deadline=None, derandomize=True, database=None
)
TestDualAllocator = DualAllocatorMachine.TestCase


@pytest.mark.parametrize("page", (1, 4))
def test_dual_allocator_basics(page: int) -> None:
    alloc = SWATokenToKVPoolAllocator(4 * page, 2 * page, page)
    assert (alloc.size, alloc.size_full, alloc.size_swa) == (2 * page, 4 * page, 2 * page)
    assert int(alloc.full_to_swa_index_mapping[-1]) == -1
    assert alloc.translate_loc_from_full_to_swa(t([-1])).tolist() == [-1]  # last_loc of a fresh request
    first = alloc.alloc(2 * page)
    assert first is not None and alloc.available_size() == 0
    assert alloc.alloc(page) is None  # the SWA pool is full though the full pool is not
    assert alloc.full_available_size() == 2 * page
    alloc.free_swa(first[:page])  # slid out of the window
    assert alloc.swa_available_size() == page and alloc.full_available_size() == 2 * page
    assert alloc.translate_loc_from_full_to_swa(first[:page]).tolist() == [0] * page
    alloc.free(first)  # the request ends: the rest of both pools
    assert (alloc.full_available_size(), alloc.swa_available_size()) == (4 * page, 2 * page)
    assert alloc.nbytes_by_pool() == {
        "allocator": alloc.full_attn_allocator.nbytes,
        "swa_allocator": alloc.swa_attn_allocator.nbytes,
    }
    alloc.clear()
    assert not bool(alloc.full_to_swa_index_mapping[:-1].any())


def test_dual_allocator_reuses_core_allocators() -> None:
    assert isinstance(SWATokenToKVPoolAllocator(4, 2, 1).swa_attn_allocator, TokenAllocator)
    assert isinstance(SWATokenToKVPoolAllocator(8, 4, 4).full_attn_allocator, PagedAllocator)


def test_checked_refuses_to_extend_an_evicted_page() -> None:
    alloc = SWATokenToKVPoolAllocator(16, 8, 4, checked=True)
    slots = alloc.alloc_extend(t([0]), t([6]), t([-1]), 6)
    assert slots is not None
    alloc.free_swa(slots[4:])  # the page of the last token: breaks the caller contract
    with pytest.raises(ValueError, match="free_swa"):
        alloc.alloc_extend(t([6]), t([7]), t([int(slots[-1])]), 1)


@pytest.mark.parametrize("page", (1, 4))
def test_pure_swa_allocator(page: int) -> None:
    alloc = PureSWAAllocator(3 * page, page, checked=True)
    assert alloc.translate_loc_from_full_to_swa(t([5, -1])).tolist() == [5, -1]
    first = alloc.alloc_extend(t([0]), t([page + 1]), t([-1]), page + 1)
    assert first is not None and alloc.available_size() == page
    more = alloc.alloc_decode(t([page + 2]), first[-1:])
    assert more is not None and (page == 1 or int(more[0]) == int(first[-1]) + 1)
    assert alloc.alloc(2 * page) is None
    alloc.free_swa(first[:page])  # slid out of the window: freed at once (no mapping to remember it)
    alloc.free_full(first)  # no full pool: nothing happens
    alloc.free(torch.cat((first[page:], more)))
    assert alloc.available_size() == 3 * page
    state = alloc.backup_state()
    assert isinstance(state, AllocatorState)
    assert alloc.alloc(page) is not None
    alloc.restore_state(state)
    assert alloc.available_size() == 3 * page
    assert alloc.nbytes_by_pool() == {"allocator": 8 * 3 + (8 * page if page > 1 else 0), "allocator_checked": 2 * 4}
    assert alloc.nbytes == sum(alloc.nbytes_by_pool().values())


def test_free_swa_frees_whole_swa_pages() -> None:
    """Paged: freeing the SWA slot of one token frees its whole SWA page (SGLang's free_swa expands to pages)."""
    alloc = SWATokenToKVPoolAllocator(16, 8, 4, checked=True)
    slots = alloc.alloc_extend(t([0]), t([7]), t([-1]), 7)
    assert slots is not None and alloc.swa_available_size() == 0
    alloc.free_swa(slots[1:2])
    assert alloc.swa_available_size() == 4
    assert alloc.translate_loc_from_full_to_swa(slots).tolist()[:4] == [0, 0, 0, 0]
    assert all(s > 0 for s in alloc.translate_loc_from_full_to_swa(slots[4:]).tolist())
    alloc.free(slots)
    assert (alloc.full_available_size(), alloc.swa_available_size()) == (16, 8)


def _state(alloc: SWATokenToKVPoolAllocator) -> tuple[object, ...]:
    full, swa = alloc.full_attn_allocator, alloc.swa_attn_allocator
    return (full._head, full._buf.tolist(), swa._head, swa._buf.tolist(), alloc.full_to_swa_index_mapping.tolist())


@pytest.mark.parametrize("page", (1, 4))
@pytest.mark.parametrize("bad", (-1, 0, "past"))
def test_dual_refuses_foreign_full_slots_before_touching_the_mapping(page: int, bad: int | str) -> None:
    """-1 would index the mapping's sentinel, page 0 the padding: refused before the mapping or a pool changes."""
    alloc = SWATokenToKVPoolAllocator(4 * page, 2 * page, page)
    slots = alloc.alloc(page)
    assert slots is not None
    slot = 5 * page if bad == "past" else int(bad)
    before = _state(alloc)
    for call in (alloc.free, alloc.free_swa, alloc.free_full):
        with pytest.raises(AllocatorError, match="foreign"):
            call(torch.cat((slots, t([slot]))))
    assert _state(alloc) == before
    alloc.free(slots.tolist())  # a list of ints is taken too
    assert (alloc.full_available_size(), alloc.swa_available_size()) == (4 * page, 2 * page)


@pytest.mark.parametrize("page", (1, 4))
def test_checked_dual_refuses_a_double_free_before_touching_the_mapping(page: int) -> None:
    alloc = SWATokenToKVPoolAllocator(4 * page, 2 * page, page, checked=True)
    first, second = alloc.alloc(page), alloc.alloc(page)
    assert first is not None and second is not None
    alloc.free(first)
    before = _state(alloc)
    with pytest.raises(AllocatorError, match="double free"):
        alloc.free(torch.cat((second, first)))
    with pytest.raises(AllocatorError, match="double free"):
        alloc.free_swa(first)
    assert _state(alloc) == before
    assert alloc.nbytes_by_pool() == {
        "allocator": alloc.full_attn_allocator.nbytes - 2 * 5,  # int16 maps: 2 bytes per unit id
        "allocator_checked": 2 * 5,
        "swa_allocator": alloc.swa_attn_allocator.nbytes - 2 * 3,
        "swa_allocator_checked": 2 * 3,
    }


def test_restore_state_refuses_another_allocators_state() -> None:
    alloc, other = SWATokenToKVPoolAllocator(8, 4, 1), SWATokenToKVPoolAllocator(8, 4, 1)
    pure = PureSWAAllocator(8, 4)
    before = _state(alloc)
    for state in (other.backup_state(), alloc.full_attn_allocator.backup_state(), None, object()):
        with pytest.raises(AllocatorError, match="restore_state"):
            alloc.restore_state(state)  # type: ignore[arg-type]
    for foreign in (PureSWAAllocator(8, 4).backup_state(), alloc.backup_state(), None):
        with pytest.raises(AllocatorError, match="restore_state"):
            pure.restore_state(foreign)  # type: ignore[arg-type]
    assert _state(alloc) == before


@pytest.mark.parametrize("page", (1, 4))
def test_pure_swa_refuses_padding_and_minus_one(page: int) -> None:
    """No mapping to skip evicted slots by: 0 and -1 are not slot ids, so they are refused, not skipped."""
    alloc = PureSWAAllocator(3 * page, page)
    slots = alloc.alloc(page)
    assert slots is not None
    for bad in (0, -1, 4 * page):
        with pytest.raises(AllocatorError, match="foreign"):
            alloc.free(torch.cat((slots, t([bad]))))
    assert alloc.available_size() == 2 * page
    alloc.free(slots)
    assert alloc.available_size() == 3 * page


def test_the_allocator_module_keeps_the_planners_mapping_entry_size() -> None:
    # kvpools_core.allocators.swa imports torch and the allocators only (the benchmarks' peers venv has no
    # planner): its MAPPING_ITEM_BYTES is a literal that must stay the planner's and the mapping's itemsize
    from kvpools_core.allocators.swa import MAPPING_ITEM_BYTES, new_full_to_swa_mapping
    from kvpools_core.parts.sizing import SWA_MAPPING_ITEM_BYTES

    assert MAPPING_ITEM_BYTES == SWA_MAPPING_ITEM_BYTES == new_full_to_swa_mapping(4, 1, "cpu").element_size()
