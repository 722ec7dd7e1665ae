"""Bad frees and foreign restores against every allocator kind, default and checked mode.

Each machine drives two allocators built alike: ``a`` gets every call,
valid and abusive; its twin gets only the valid ones.  Every abusive call
must raise ``AllocatorError`` and leave ``a`` exactly as its twin is (same
counters, free stack, maps, open group), so from then on both hand out the
same ids.  The default mode must refuse ids outside the pool (padding 0, -1,
past the end), non-integer ids and foreign states; checked mode must also
refuse double frees and frees of ids that are not allocated now.  Every id
handed out is checked against a set model: in range, never live twice.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kvpools_plugins.swa.allocator import PureSWAAllocator, SWATokenToKVPoolAllocator

from kvpools_core.allocators import PagedAllocator, TokenAllocator
from kvpools_core.allocators.base import BaseAllocator
from kvpools_core.errors import AllocatorError, KvpoolsError

# no "explain" phase, one bug at a time: a failure shrinks in seconds, not minutes
SETTINGS = settings(
    max_examples=15,
    stateful_step_count=25,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate, Phase.shrink],
    report_multiple_bugs=False,
)


@dataclass(frozen=True)
class Kind:
    """An allocator kind: how to build one, its page size, the pages of the pool its ids index."""

    name: str
    page: int
    pages: int
    make: Callable[[bool, bool], Any]  # (checked, need_sort) -> allocator
    swa: str = ""  # "", "dual" or "pure"


KINDS = {
    "token": Kind("token", 1, 16, lambda c, s: TokenAllocator(16, need_sort=s, checked=c)),
    "paged4": Kind("paged4", 4, 8, lambda c, s: PagedAllocator(32, 4, need_sort=s, checked=c)),
    "paged16": Kind("paged16", 16, 5, lambda c, s: PagedAllocator(80, 16, need_sort=s, checked=c)),
    "dual1": Kind("dual1", 1, 12, lambda c, s: SWATokenToKVPoolAllocator(12, 8, 1, need_sort=s, checked=c), "dual"),
    "dual4": Kind("dual4", 4, 8, lambda c, s: SWATokenToKVPoolAllocator(32, 20, 4, need_sort=s, checked=c), "dual"),
    "pure1": Kind("pure1", 1, 12, lambda c, s: PureSWAAllocator(12, 1, need_sort=s, checked=c), "pure"),
    "pure4": Kind("pure4", 4, 6, lambda c, s: PureSWAAllocator(24, 4, need_sort=s, checked=c), "pure"),
}


def core_fingerprint(a: BaseAllocator) -> tuple[object, ...]:
    allocated = None if a._allocated is None else a._allocated.tolist()
    pending = [t.tolist() for t in a._pending]
    return (a._head, a._rel, a._pend, a._in_group, a._buf.tolist(), allocated, pending, list(a._pending_bytes))


def fingerprint(a: Any) -> tuple[object, ...]:
    """Everything that defines an allocator's state, of any kind."""
    if isinstance(a, SWATokenToKVPoolAllocator):
        return (
            core_fingerprint(a.full_attn_allocator),
            core_fingerprint(a.swa_attn_allocator),
            a.full_to_swa_index_mapping.tolist(),
        )
    if isinstance(a, PureSWAAllocator):
        return core_fingerprint(a.swa_attn_allocator)
    return core_fingerprint(a)


def i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


class AbuseMachine(RuleBasedStateMachine):
    kind: Kind
    checked: bool

    @initialize(need_sort=st.booleans())
    def setup(self, need_sort: bool) -> None:
        self.a = self.kind.make(self.checked, need_sort)
        self.twin = self.kind.make(self.checked, need_sort)
        self.p = self.kind.page
        self.live: list[list[int]] = []  # slots of each live allocation (whole pages)
        self.in_group = False
        self.saved: tuple[Any, Any, list[list[int]], bool] | None = None

    # ----------------------------------------------------------------- model
    def live_pages(self) -> set[int]:
        return {s // self.p for slots in self.live for s in slots}

    def both(self, method: str, *args: Any) -> Any:
        """A valid call, on the allocator and on its twin alike; both must answer the same."""
        out = getattr(self.a, method)(*args)
        twin = getattr(self.twin, method)(*args)
        if isinstance(out, torch.Tensor):
            assert torch.equal(out, twin)
        else:
            assert out == twin
        return out

    def refused(self, call: Callable[[], object], match: str | None = None) -> None:
        """An abusive call on ``a`` alone: refused, and ``a`` still equals its twin."""
        with pytest.raises(AllocatorError, match=match) as info:
            call()
        assert isinstance(info.value, KvpoolsError) and isinstance(info.value, ValueError)
        assert fingerprint(self.a) == fingerprint(self.twin), "a refused call changed the allocator"

    # ------------------------------------------------------------ valid calls
    @rule(k=st.integers(1, 4))
    def alloc(self, k: int) -> None:
        out = self.both("alloc", k * self.p)
        if out is None:
            return
        slots = out.tolist()
        pages = {s // self.p for s in slots}
        assert all(1 <= q <= self.kind.pages for q in pages), f"invalid id handed out: {slots}"
        assert len(slots) == k * self.p == len(set(slots))
        assert not pages & self.live_pages(), "an id handed out twice"
        self.live.append(slots)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), how=st.sampled_from(["tensor", "list", "tuple", "int32", "pages"]))
    def free(self, data: st.DataObject, how: str) -> None:
        """Free some whole pages of an allocation, naming each by some of its slots (or, paged, by page id)."""
        i = data.draw(st.integers(0, len(self.live) - 1))
        slots = self.live[i]
        pages = sorted({s // self.p for s in slots})
        gone = data.draw(st.lists(st.sampled_from(pages), min_size=1, unique=True))
        named = [
            s
            for q in gone
            # a slot may repeat within a page (the page is freed once), not at page size 1
            for s in data.draw(
                st.lists(st.sampled_from(range(q * self.p, (q + 1) * self.p)), min_size=1, unique=self.p == 1)
            )
        ]
        if how == "pages" and isinstance(self.a, PagedAllocator):
            self.both("free_pages", list(gone))
        elif how == "list":
            self.both("free", named)
        elif how == "tuple":
            self.both("free", tuple(named))
        elif how == "int32":
            self.both("free", torch.tensor(named, dtype=torch.int32))
        else:
            self.both("free", i64(named))
        rest = [s for s in slots if s // self.p not in gone]
        if rest:
            self.live[i] = rest
        else:
            del self.live[i]

    @precondition(lambda self: self.kind.swa == "dual" and self.live)
    @rule(data=st.data())
    def slide_out_of_window(self, data: st.DataObject) -> None:
        """Dual: free the SWA slots of an allocation (its full slots stay; a second eviction is a no-op)."""
        i = data.draw(st.integers(0, len(self.live) - 1))
        self.both("free_swa", i64(self.live[i]))

    @rule()
    def group_begin_or_end(self) -> None:
        self.both("free_group_end" if self.in_group else "free_group_begin")
        self.in_group = not self.in_group

    @rule()
    def backup_or_restore(self) -> None:
        if self.saved is None:
            self.saved = (self.a.backup_state(), self.twin.backup_state(), copy.deepcopy(self.live), self.in_group)
            return
        mine, twins, live, in_group = self.saved
        self.a.restore_state(mine)
        self.twin.restore_state(twins)
        self.live, self.in_group = copy.deepcopy(live), in_group
        self.saved = None

    @precondition(lambda self: not self.in_group)
    @rule()
    def merge(self) -> None:
        self.both("merge_and_sort_free")

    # ------------------------------------------------------ abuse: every mode
    @rule(data=st.data(), where=st.sampled_from(["padding", "minus_one", "negative", "past_end", "huge"]))
    def free_outside_the_pool(self, data: st.DataObject, where: str) -> None:
        """Padding page 0, -1, past the pool: refused (with any live slots beside them: none is freed)."""
        p, n = self.p, self.kind.pages
        bad = {
            "padding": data.draw(st.integers(0, p - 1)),
            "minus_one": -1,
            "negative": -data.draw(st.integers(2, 3 * p)),
            "past_end": data.draw(st.integers((n + 1) * p, (n + 3) * p)),
            "huge": 2**40,
        }[where]
        good = data.draw(st.lists(st.sampled_from(self.live[0]), max_size=3)) if self.live else []
        ids = data.draw(st.permutations([*good, bad]))
        self.refused(lambda: self.a.free(i64(ids)), r"foreign|padding")
        self.refused(lambda: self.a.free(ids), r"foreign|padding")
        if self.kind.swa == "dual":
            self.refused(lambda: self.a.free_swa(i64(ids)), r"foreign|padding")
            self.refused(lambda: self.a.free_full(i64(ids)), r"foreign|padding")

    @rule(data=st.data())
    def free_pages_outside_the_pool(self, data: st.DataObject) -> None:
        if not isinstance(self.a, PagedAllocator):
            return
        bad = data.draw(st.sampled_from([0, -1, self.kind.pages + 1, 2**40]))
        self.refused(lambda: self.a.free_pages([bad]), r"foreign")
        self.refused(lambda: self.a.free_pages(i64([bad])), r"foreign")
        self.refused(lambda: self.a.free_pages([1.0]), r"integer")

    @precondition(lambda self: self.live)
    @rule(how=st.sampled_from(["float", "bool", "strings", "none", "float_list"]))
    def free_of_non_integers(self, how: str) -> None:
        """Ids as floats, a bool mask, strings or None: refused, not rounded."""
        slots = self.live[0]
        bad: object = {
            "float": torch.tensor(slots, dtype=torch.float32),
            "bool": torch.ones(len(slots), dtype=torch.bool),
            "strings": [str(s) for s in slots],
            "none": None,
            "float_list": [s + 0.5 for s in slots],
        }[how]
        self.refused(lambda: self.a.free(bad), r"integer")

    @rule(which=st.sampled_from(["twin", "object", "none", "sub"]))
    def restore_foreign_state(self, which: str) -> None:
        """A state of another allocator (even one built alike), or no state at all: refused."""
        if which == "sub" and self.kind.swa != "dual":
            return
        states: dict[str, Callable[[], object]] = {
            "twin": lambda: self.twin.backup_state(),
            "object": lambda: object(),
            "none": lambda: None,
            "sub": lambda: self.a.full_attn_allocator.backup_state(),
        }
        state = states[which]()
        self.refused(lambda: self.a.restore_state(state), r"restore_state")

    # ------------------------------------------------- abuse: checked mode only
    @precondition(lambda self: self.checked)
    @rule(data=st.data())
    def free_of_unallocated(self, data: st.DataObject) -> None:
        """A page that is free now (never handed out, or freed already: a double free)."""
        idle = sorted(set(range(1, self.kind.pages + 1)) - self.live_pages())
        if not idle:
            return
        q = data.draw(st.sampled_from(idle))
        good = data.draw(st.lists(st.sampled_from(self.live[0]), max_size=3)) if self.live else []
        ids = data.draw(st.permutations([*good, q * self.p + data.draw(st.integers(0, self.p - 1))]))
        self.refused(lambda: self.a.free(i64(ids)), r"double free or free of never-allocated")
        if isinstance(self.a, PagedAllocator):
            self.refused(lambda: self.a.free_pages([q]), r"double free or free of never-allocated")
        if self.kind.swa == "dual":
            self.refused(lambda: self.a.free_swa(i64(ids)), r"double free or free of never-allocated")

    @precondition(lambda self: self.checked and self.live)
    @rule(data=st.data())
    def free_twice_in_one_call(self, data: st.DataObject) -> None:
        if self.p != 1 and not isinstance(self.a, PagedAllocator):
            return  # slots of one page are one page: a repeat is no double free
        slot = data.draw(st.sampled_from(self.live[0]))
        if self.p == 1:
            self.refused(lambda: self.a.free(i64([slot, slot])), r"twice")
        else:
            self.refused(lambda: self.a.free_pages([slot // self.p] * 2), r"twice")

    # ------------------------------------------------------------- invariants
    @invariant()
    def same_as_twin(self) -> None:
        if hasattr(self, "a"):
            assert fingerprint(self.a) == fingerprint(self.twin)
            assert self.a.available_size() == self.twin.available_size()

    def teardown(self) -> None:
        if not hasattr(self, "a"):
            return
        if self.in_group:
            self.a.free_group_end()
        for slots in self.live:
            self.a.free(i64(slots))
        self.a.merge_and_sort_free()
        if isinstance(self.a, SWATokenToKVPoolAllocator):
            assert (self.a.full_available_size(), self.a.swa_available_size()) == (self.a.size_full, self.a.size_swa)
            assert not bool(self.a.full_to_swa_index_mapping[:-1].any())
            return
        out = self.a.alloc(self.a.size)
        assert out is not None
        pages = sorted({s // self.p for s in out.tolist()})
        assert pages == list(range(1, self.kind.pages + 1)), "every id comes back, once"


def _machine(kind: str, checked: bool) -> Any:
    name = f"Abuse_{kind}_{'checked' if checked else 'default'}"
    machine: Any = type(name, (AbuseMachine,), {"kind": KINDS[kind], "checked": checked})
    case = machine.TestCase
    case.settings = SETTINGS
    return case


for _kind in KINDS:
    for _checked in (False, True):
        _case = _machine(_kind, _checked)
        globals()[f"TestAbuse_{_kind}_{'checked' if _checked else 'default'}"] = _case
del _case, _kind, _checked
