"""Random interleavings of valid calls and misuse against every allocator kind, default and checked mode.

Each machine drives two allocators built alike: ``a`` gets every call,
valid and abusive; its twin gets only the valid ones.  Every abusive call
must raise ``AllocatorError`` and leave ``a`` exactly as its twin is (same
counters, free stack, maps, open group), so from then on both hand out the
same ids.  The default mode must refuse ids outside the pool (padding 0, -1,
past the end), non-integer ids, foreign states, negative counts, batch
tensors of different lengths and an SWA ``free_full`` of still-mapped slots;
checked mode must also refuse double frees, frees of ids that are not
allocated now and inconsistent ``alloc_extend`` / ``alloc_decode`` batches
(``tests/allocators/test_misuse_catalogue.py`` has one case of each).  Valid
calls include requests that are extended and decoded page by page.  Every id
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
    stateful_step_count=30,
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
    # the free stack's meaningful regions: released + pending, and the free units (what lies between is never
    # read: a free group may park a call there that its settling refuses)
    buf = a._buf[: a._rel + a._pend].tolist() + a._buf[a._head :].tolist()
    return (a._head, a._rel, a._pend, a._in_group, buf, allocated, pending, list(a._pending_bytes))


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
        self.reqs: list[list[int]] = []  # slots of each live request, by position (its pages are its own)
        self.in_group = False
        self.saved: tuple[Any, Any, list[list[int]], list[list[int]], bool] | None = None

    # ----------------------------------------------------------------- model
    def live_pages(self) -> set[int]:
        return {s // self.p for slots in self.live + self.reqs for s in slots}

    def extends(self) -> bool:
        return not isinstance(self.a, TokenAllocator)

    def check_request(self, i: int, new: list[int]) -> None:
        """New slots of request ``i``: in range, distinct, at their positions' page offsets, and in pages
        no other allocation or request holds."""
        slots = self.reqs[i]
        others = {s // self.p for j, r in enumerate(self.reqs) if j != i for s in r}
        others |= {s // self.p for r in self.live for s in r}
        assert all(1 <= s // self.p <= self.kind.pages for s in new), f"invalid id handed out: {new}"
        assert not {s // self.p for s in new} & others, "an id handed out twice"
        full = slots + new
        assert len(set(full)) == len(full)
        if self.p > 1:
            assert all(s % self.p == t % self.p for t, s in enumerate(full)), f"slots off their offsets: {full}"
        self.reqs[i] = full

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
            # a free inside a group may be checked when the group settles (backup_state is a settle point)
            self.a.backup_state()
        assert isinstance(info.value, KvpoolsError) and isinstance(info.value, ValueError)
        self.a.backup_state()  # both settled alike: their deferred valid frees checked
        self.twin.backup_state()
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

    @precondition(lambda self: self.extends())
    @rule(n=st.integers(1, 9))
    def start_request(self, n: int) -> None:
        out = self.both("alloc_extend", i64([0]), i64([n]), i64([-1]), n)
        if out is not None:
            self.reqs.append([])
            self.check_request(len(self.reqs) - 1, out.tolist())

    @precondition(lambda self: self.extends() and self.reqs)
    @rule(data=st.data(), n=st.integers(1, 9))
    def grow_request(self, data: st.DataObject, n: int) -> None:
        """Extend a request by ``n`` tokens from its last slot (its open page first)."""
        i = data.draw(st.integers(0, len(self.reqs) - 1))
        slots = self.reqs[i]
        pre = len(slots)
        out = self.both("alloc_extend", i64([pre]), i64([pre + n]), i64([slots[-1]]), n)
        if out is not None:
            self.check_request(i, out.tolist())

    @precondition(lambda self: self.extends() and self.reqs)
    @rule(data=st.data())
    def decode_requests(self, data: st.DataObject) -> None:
        which = data.draw(st.lists(st.integers(0, len(self.reqs) - 1), min_size=1, unique=True))
        seq = i64([len(self.reqs[i]) + 1 for i in which])
        out = self.both("alloc_decode", seq, i64([self.reqs[i][-1] for i in which]))
        if out is not None:
            for i, s in zip(which, out.tolist(), strict=True):
                self.check_request(i, [s])

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def finish_request(self, data: st.DataObject) -> None:
        i = data.draw(st.integers(0, len(self.reqs) - 1))
        self.both("free", i64(self.reqs.pop(i)))

    @rule()
    def group_begin_or_end(self) -> None:
        self.both("free_group_end" if self.in_group else "free_group_begin")
        self.in_group = not self.in_group

    @rule()
    def backup_or_restore(self) -> None:
        if self.saved is None:
            live, reqs = copy.deepcopy(self.live), copy.deepcopy(self.reqs)
            self.saved = (self.a.backup_state(), self.twin.backup_state(), live, reqs, self.in_group)
            return
        mine, twins, live, reqs, in_group = self.saved
        self.a.restore_state(mine)
        self.twin.restore_state(twins)
        self.live, self.reqs, self.in_group = copy.deepcopy(live), copy.deepcopy(reqs), in_group
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

    @precondition(lambda self: self.extends())
    @rule(how=st.sampled_from(["lengths", "neg_tokens", "neg_pages", "float", "decode_lengths", "decode_neg_pages"]))
    def batch_misuse_every_mode(self, how: str) -> None:
        """Batches refused at O(1) cost in every mode: tensors of different lengths, negative counts, floats."""
        a = self.a
        calls: dict[str, Callable[[], object]] = {
            "lengths": lambda: a.alloc_extend(i64([0, 0]), i64([3]), i64([-1]), 3),
            "neg_tokens": lambda: a.alloc_extend(i64([0]), i64([3]), i64([-1]), -1),
            "neg_pages": lambda: a.alloc_extend(i64([0]), i64([0]), i64([-1]), 0, num_new_pages=-1),
            "float": lambda: a.alloc_extend(torch.tensor([0.0]), torch.tensor([3.0]), i64([-1]), 3),
            "decode_lengths": lambda: a.alloc_decode(i64([4, 5]), i64([-1])),
            "decode_neg_pages": lambda: a.alloc_decode(i64([1]), i64([-1]), num_new_pages=-1),
        }
        self.refused(calls[how])

    @rule(n=st.integers(1, 3))
    def alloc_negative(self, n: int) -> None:
        self.refused(lambda: self.a.alloc(-n * self.p), r"non-negative")

    @precondition(lambda self: self.live)
    @rule()
    def free_of_meta_tensor(self) -> None:
        self.refused(lambda: self.a.free(i64(self.live[0]).to("meta")), r"cannot read")

    @precondition(lambda self: self.kind.swa == "dual" and self.live)
    @rule(data=st.data())
    def free_full(self, data: st.DataObject) -> None:
        """Dual: ``free_full`` of an allocation still mapped is refused in every mode (its SWA slots would
        leak); once ``free_swa`` has unmapped it, it frees the full slots."""
        i = data.draw(st.integers(0, len(self.live) - 1))
        slots = self.live[i]
        if bool((self.a.full_to_swa_index_mapping[i64(slots)] > 0).any()):
            self.refused(lambda: self.a.free_full(i64(slots)), r"still map")
            return
        self.both("free_full", i64(slots))
        del self.live[i]

    # ------------------------------------------------- abuse: checked mode only
    @precondition(lambda self: self.checked and self.extends())
    @rule(data=st.data(), how=st.sampled_from(["shrink", "tokens", "pages", "foreign_last", "seq0", "decode_pages"]))
    def batch_misuse_checked(self, data: st.DataObject, how: str) -> None:
        """Batches whose lengths disagree, or continue a page not allocated: checked mode refuses them."""
        a, p = self.a, self.p
        idle = sorted(set(range(1, self.kind.pages + 1)) - self.live_pages())
        if how == "foreign_last" and (p == 1 or not idle):
            return
        foreign = data.draw(st.sampled_from(idle)) * p + 2 if how == "foreign_last" else 0
        calls: dict[str, Callable[[], object]] = {
            "shrink": lambda: a.alloc_extend(i64([5]), i64([3]), i64([-1]), 0),
            "tokens": lambda: a.alloc_extend(i64([0]), i64([5]), i64([-1]), 3),
            "pages": lambda: a.alloc_extend(i64([0]), i64([2 * p]), i64([-1]), 2 * p, num_new_pages=1),
            "foreign_last": lambda: a.alloc_extend(i64([3]), i64([5]), i64([foreign]), 2),
            "seq0": lambda: a.alloc_decode(i64([0]), i64([-1])),
            "decode_pages": lambda: a.alloc_decode(i64([2]), i64([-1]), num_new_pages=3),
        }
        self.refused(calls[how])

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
        for slots in self.live + self.reqs:
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
