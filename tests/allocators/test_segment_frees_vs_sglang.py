"""Differential: SGLang 0.5.23's segment and page-id frees, kvpools' allocators against SGLang's own (issue 37).

SGLang 0.5.23's scheduler and radix cache free a request's KV row segment by segment: ``free_segment`` /
``free_segments`` (``allocator/base.py``, ``paged.py``: one page per ``page_size`` slots, no
de-duplication), ``free_page_ids``, ``free_full_segment(s)``, and on the SWA allocator ``free_swa_segment``
(``allocator/swa.py``; ``mem_cache/common.py``'s ``free_swa_out_of_window_slots`` and
``free_kv_row_segments`` are the callers modelled here).  The installed SGLang allocators run in the peers
venv (``sglang_peer_server.py``); every hypothesis step sends the same call to both, interleaved with
``alloc`` / ``alloc_extend`` / ``alloc_decode`` / ``free`` and free groups, and after every step compares
``available_size()`` (both sides of the SWA allocator) and the free lists: in order where kvpools matches
SGLang (paged, without ``need_sort``: the returned slots too), as sets elsewhere (the token allocator reuses
freed slots first by design, so each side frees the slots it handed out; ``need_sort`` merges at other
times).

Without the peers venv or the shared checkout it skips with the shared-checkout reason; under
``KVPOOLS_REQUIRE_SHARED=1`` (CI) it fails instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvpools_core.allocators import PagedAllocator, TokenAllocator
from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator
from tests.allocators.sglang_peer import Peer
from tests.oracle import locate

PYTHON, BENCH = locate.require_sglang_peer()
PEER: Peer


@pytest.fixture(scope="module", autouse=True)
def peer() -> Iterator[Peer]:
    global PEER
    PEER = Peer(PYTHON, BENCH)
    yield PEER
    PEER.close()


def i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def free_list(a: TokenAllocator | PagedAllocator) -> list[int]:
    out: list[int] = a.get_all_free_pages().tolist()
    return out


class _Both(RuleBasedStateMachine):
    """Bookkeeping shared by the machines: each request's row on both sides, the comparison after a step."""

    exact: bool
    rows: dict[int, tuple[list[int], list[int]]]  # request -> (kvpools' slots, SGLang's), position by position

    def check_out(self, ours: torch.Tensor | None, theirs: list[int] | None, n: int) -> list[int] | None:
        got = None if ours is None else ours.tolist()
        assert (got is None) == (theirs is None)
        if got is None:
            return None
        assert theirs is not None and len(got) == len(theirs) == n
        if self.exact:
            assert got == theirs
        return got

    def same_lists(self, ours: list[int], theirs: list[int], page: int | None = None) -> None:
        """The same free list where kvpools matches SGLang unit for unit; elsewhere the two hand out other units,
        so: as many free, none twice, and (``page`` given: the full side) none a live row still holds."""
        if self.exact:
            assert ours == theirs
            return
        assert len(ours) == len(theirs)
        assert len(set(ours)) == len(ours) and len(set(theirs)) == len(theirs)
        if page is not None:
            for side, free in enumerate((ours, theirs)):
                live = {s // page for row in self.rows.values() for s in row[side]}
                assert not live & set(free), "a unit of a live row is on the free list"

    def tail(self, data: st.DataObject, page: int) -> tuple[int, int, int] | None:
        """A request, a page-aligned ``keep`` below its length and a page-aligned cut at or above it."""
        if not self.rows:
            return None
        r = data.draw(st.sampled_from(sorted(self.rows)))
        n = len(self.rows[r][0])
        if self.floor(r) >= n:
            return None  # the whole row slid out of the window already
        keep = data.draw(st.integers(self.floor(r) // page, (n - 1) // page)) * page
        cut = data.draw(st.integers(keep // page, -(-n // page))) * page
        return r, keep, cut

    def floor(self, r: int) -> int:
        return 0

    def cut_rows(self, r: int, keep: int) -> tuple[list[int], list[int]]:
        ours, theirs = self.rows[r]
        dropped = ours[keep:], theirs[keep:]
        if keep:
            self.rows[r] = (ours[:keep], theirs[:keep])
        else:
            del self.rows[r]
        return dropped


class SegmentFrees(_Both):
    """Token and paged allocators: requests prefill, extend, decode and give back segments of their rows."""

    @initialize(page=st.sampled_from([1, 4, 16]), pages=st.integers(4, 24), need_sort=st.booleans())
    def start(self, page: int, pages: int, need_sort: bool) -> None:
        self.page, self.size = page, pages * page
        self.ours = (
            TokenAllocator(self.size, need_sort=need_sort)
            if page == 1
            else PagedAllocator(self.size, page, need_sort=need_sort)
        )
        PEER.call("new", page=page, size=self.size, need_sort=need_sort)
        self.exact = page > 1 and not need_sort
        self.rows = {}
        self.next = 0
        self.in_group = False

    @rule(n=st.integers(1, 40))
    def prefill(self, n: int) -> None:
        if self.page == 1:
            ours, theirs = self.ours.alloc(n), PEER.call("alloc", n=n)["out"]
        else:
            assert isinstance(self.ours, PagedAllocator)
            ours = self.ours.alloc_extend(i64([0]), i64([n]), i64([-1]), n)
            theirs = PEER.call("alloc_extend", pre=[0], seq=[n], last=[-1], n=n)["out"]
        got = self.check_out(ours, theirs, n)
        if got is not None:
            assert theirs is not None
            self.rows[self.next] = (got, theirs)
            self.next += 1

    @precondition(lambda self: self.page > 1 and self.rows)
    @rule(data=st.data(), grow=st.integers(1, 20))
    def extend(self, data: st.DataObject, grow: int) -> None:
        assert isinstance(self.ours, PagedAllocator)
        reqs = data.draw(st.lists(st.sampled_from(sorted(self.rows)), min_size=1, max_size=3, unique=True))
        pre = [len(self.rows[r][0]) for r in reqs]
        seq = [p + grow for p in pre]
        n = grow * len(reqs)
        ours = self.ours.alloc_extend(i64(pre), i64(seq), i64([self.rows[r][0][-1] for r in reqs]), n)
        theirs = PEER.call("alloc_extend", pre=pre, seq=seq, last=[self.rows[r][1][-1] for r in reqs], n=n)["out"]
        got = self.check_out(ours, theirs, n)
        if got is not None:
            assert theirs is not None
            for k, r in enumerate(reqs):
                self.rows[r][0].extend(got[k * grow : (k + 1) * grow])
                self.rows[r][1].extend(theirs[k * grow : (k + 1) * grow])

    @precondition(lambda self: self.page > 1 and self.rows)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        assert isinstance(self.ours, PagedAllocator)
        reqs = data.draw(st.lists(st.sampled_from(sorted(self.rows)), min_size=1, max_size=4, unique=True))
        seq = [len(self.rows[r][0]) + 1 for r in reqs]
        ours = self.ours.alloc_decode(i64(seq), i64([self.rows[r][0][-1] for r in reqs]))
        theirs = PEER.call("alloc_decode", seq=seq, last=[self.rows[r][1][-1] for r in reqs])["out"]
        got = self.check_out(ours, theirs, len(reqs))
        if got is not None:
            assert theirs is not None
            for k, r in enumerate(reqs):
                self.rows[r][0].append(got[k])
                self.rows[r][1].append(theirs[k])

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        r = data.draw(st.sampled_from(sorted(self.rows)))
        ours, theirs = self.cut_rows(r, 0)
        self.ours.free(i64(ours))
        PEER.call("free", slots=theirs)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), how=st.sampled_from(["segment", "segments", "full_segment", "full_segments", "page_ids"]))
    def free_tail(self, data: st.DataObject, how: str) -> None:
        """The row's tail from a page boundary (radix cache, request end), or its pages by id."""
        picked = self.tail(data, self.page)
        assert picked is not None
        r, keep, cut = picked
        p = self.page
        (ours_row, theirs_row) = (list(side) for side in self.rows[r])
        if how in ("segment", "full_segment"):
            getattr(self.ours, f"free_{how}")(i64(ours_row[keep:]), start_pos=keep)
            PEER.call(f"free_{how}", slots=theirs_row[keep:], start=keep)
        elif how in ("segments", "full_segments"):
            self.ours.__getattribute__(f"free_{how}")([(i64(ours_row[keep:cut]), keep), (i64(ours_row[cut:]), cut)])
            PEER.call(f"free_{how}", segments=[[theirs_row[keep:cut], keep], [theirs_row[cut:], cut]])
        else:
            self.ours.free_page_ids(i64([s // p for s in ours_row[keep::p]]))
            PEER.call("free_page_ids", slots=[s // p for s in theirs_row[keep::p]])
        self.cut_rows(r, keep)

    @rule()
    def group(self) -> None:
        if self.in_group:
            self.ours.free_group_end()
            PEER.call("group_end")
        else:
            self.ours.free_group_begin()
            PEER.call("group_begin")
        self.in_group = not self.in_group

    @invariant()
    def same_state(self) -> None:
        if hasattr(self, "ours"):
            theirs = PEER.call("state")
            assert self.ours.available_size() == theirs["available"]
            self.same_lists(free_list(self.ours), theirs["free"], self.page)

    def teardown(self) -> None:
        if getattr(self, "in_group", False):
            self.ours.free_group_end()
            PEER.call("group_end")


class SWASegmentFrees(_Both):
    """The dual full / SWA allocator: prefill, decode, window eviction and request ends by segment."""

    @initialize(
        page=st.sampled_from([1, 4, 16]),
        pages=st.integers(6, 24),
        swa_pages=st.integers(4, 16),
        need_sort=st.booleans(),
    )
    def start(self, page: int, pages: int, swa_pages: int, need_sort: bool) -> None:
        self.page = page
        self.ours = SWATokenToKVPoolAllocator(pages * page, swa_pages * page, page, need_sort=need_sort)
        PEER.call("new_swa", size=pages * page, size_swa=swa_pages * page, page=page, need_sort=need_sort)
        self.exact = page > 1 and not need_sort
        self.rows = {}
        self.evicted: dict[int, int] = {}
        self.next = 0
        self.in_group = False

    def floor(self, r: int) -> int:
        return self.evicted[r]

    @rule(n=st.integers(1, 40))
    def prefill(self, n: int) -> None:
        if self.page == 1:  # SGLang's SWA allocator takes page-1 prefills with alloc (alloc_extend asserts page > 1)
            ours, theirs = self.ours.alloc(n), PEER.call("alloc", n=n)["out"]
        else:
            ours = self.ours.alloc_extend(i64([0]), i64([n]), i64([-1]), n)
            theirs = PEER.call("alloc_extend", pre=[0], seq=[n], last=[-1], n=n)["out"]
        got = self.check_out(ours, theirs, n)
        if got is not None:
            assert theirs is not None
            self.rows[self.next] = (got, theirs)
            self.evicted[self.next] = 0
            self.next += 1

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        reqs = data.draw(st.lists(st.sampled_from(sorted(self.rows)), min_size=1, max_size=4, unique=True))
        seq = [len(self.rows[r][0]) + 1 for r in reqs]
        if sum((n - 1) % self.page == 0 for n in seq) * self.page > self.ours.available_size():
            return  # SGLang's scheduler retracts first (check_decode_mem): its alloc_decode keeps the full pages
        if self.page == 1:
            ours, theirs = self.ours.alloc(len(reqs)), PEER.call("alloc", n=len(reqs))["out"]
        else:
            ours = self.ours.alloc_decode(i64(seq), i64([self.rows[r][0][-1] for r in reqs]))
            theirs = PEER.call("alloc_decode", seq=seq, last=[self.rows[r][1][-1] for r in reqs])["out"]
        got = self.check_out(ours, theirs, len(reqs))
        if got is not None:
            assert theirs is not None
            for k, r in enumerate(reqs):
                self.rows[r][0].append(got[k])
                self.rows[r][1].append(theirs[k])

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), segment=st.booleans())
    def evict(self, data: st.DataObject, segment: bool) -> None:
        """``free_swa_out_of_window_slots``: the SWA side of ``row[evicted:new]``, ``new`` page-aligned and
        before the page of the request's last token (which later extends continue)."""
        r = data.draw(st.sampled_from(sorted(self.rows)))
        p, (ours_row, theirs_row) = self.page, self.rows[r]
        top = (len(ours_row) - 1) // p * p
        if top <= self.evicted[r]:
            return
        new = data.draw(st.integers(self.evicted[r] // p + 1, top // p)) * p
        lo = self.evicted[r]
        if segment:
            self.ours.free_swa_segment(i64(ours_row[lo:new]), start_pos=lo)
            PEER.call("free_swa_segment", slots=theirs_row[lo:new], start=lo)
        else:
            self.ours.free_swa(i64(ours_row[lo:new]))
            PEER.call("free_swa", slots=theirs_row[lo:new])
        self.evicted[r] = new

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), segments=st.booleans())
    def finish(self, data: st.DataObject, segments: bool) -> None:
        """A request ends (``free_kv_row_segments``): the evicted head full-side only, the rest both sides."""
        r = data.draw(st.sampled_from(sorted(self.rows)))
        ev = self.evicted.pop(r)
        ours, theirs = self.cut_rows(r, 0)
        if segments:
            if ev:
                self.ours.free_full_segments([(i64(ours[:ev]), 0)])
                PEER.call("free_full_segments", segments=[[theirs[:ev], 0]])
            self.ours.free_segments([(i64(ours[ev:]), ev)])
            PEER.call("free_segments", segments=[[theirs[ev:], ev]])
        else:
            if ev:
                self.ours.free_full(i64(ours[:ev]))
                PEER.call("free_full", slots=theirs[:ev])
            self.ours.free(i64(ours[ev:]))
            PEER.call("free", slots=theirs[ev:])

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), split=st.booleans())
    def free_tail(self, data: st.DataObject, split: bool) -> None:
        """A tail of a row, past its evicted head, both sides (the radix cache's ``free_segment``)."""
        picked = self.tail(data, self.page)
        if picked is None:
            return
        r, keep, cut = picked
        ours_row, theirs_row = self.rows[r]
        if split:
            self.ours.free_segments([(i64(ours_row[keep:cut]), keep), (i64(ours_row[cut:]), cut)])
            PEER.call("free_segments", segments=[[theirs_row[keep:cut], keep], [theirs_row[cut:], cut]])
        else:
            self.ours.free_segment(i64(ours_row[keep:]), start_pos=keep)
            PEER.call("free_segment", slots=theirs_row[keep:], start=keep)
        self.cut_rows(r, keep)
        if r not in self.rows:
            del self.evicted[r]

    @rule()
    def group(self) -> None:
        if self.in_group:
            self.ours.free_group_end()
            PEER.call("group_end")
        else:
            self.ours.free_group_begin()
            PEER.call("group_begin")
        self.in_group = not self.in_group

    @invariant()
    def same_state(self) -> None:
        if hasattr(self, "ours"):
            theirs = PEER.call("state")
            assert [self.ours.full_available_size(), self.ours.swa_available_size()] == theirs["available"]
            full, swa = theirs["free"]
            self.same_lists(free_list(self.ours.full_attn_allocator), full, self.page)
            self.same_lists(free_list(self.ours.swa_attn_allocator), swa)

    def teardown(self) -> None:
        if getattr(self, "in_group", False):
            self.ours.free_group_end()
            PEER.call("group_end")


def _case(machine: type[RuleBasedStateMachine], examples: int) -> Any:
    case = machine.TestCase
    case.settings = settings(max_examples=examples, stateful_step_count=30, deadline=None)
    return case


TestSegmentFrees = _case(SegmentFrees, 60)
TestSWASegmentFrees = _case(SWASegmentFrees, 60)
