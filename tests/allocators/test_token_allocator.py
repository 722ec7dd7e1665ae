"""TokenAllocator: SGLang's token-allocator contract, checked against a set model."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvpools_core.allocators import AllocatorState, TokenAllocator
from kvpools_core.errors import AllocatorError

TokenModel = tuple[list[list[int]], list[int], set[int], bool]


def fingerprint(a: TokenAllocator) -> tuple[object, ...]:
    """Everything that defines the allocator's state (for "nothing changed")."""
    allocated = None if a._allocated is None else a._allocated.tolist()
    # the free stack's released + pending units and its free units; what lies between is never read (a free
    # group may park a call there that its settling refuses)
    buf = a._buf[: a._rel + a._pend].tolist() + a._buf[a._head :].tolist()
    return (a._head, a._rel, a._pend, a._in_group, buf, allocated)


def i64(values: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


# ----------------------------------------------------------------- unit tests
def test_fresh_allocator_sizes(device: str) -> None:
    a = TokenAllocator(10, device=device)
    assert (a.size, a.page_size, a.num_pages) == (10, 1, 10)
    assert a.available_size() == 10
    assert a.device.type == torch.device(device).type


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("size", [1, 7, 4096])
def test_nbytes_equals_planned(size: int, checked: bool, device: str) -> None:
    a = TokenAllocator(size, device=device, checked=checked)
    # int64 free stack: 8 B per slot; checked mode adds one int16 per slot id 0..size
    expected = 8 * size + (2 * (size + 1) if checked else 0)
    assert TokenAllocator.planned_nbytes(size, 1, checked) == expected
    assert a.nbytes == expected


def test_rejects_bad_geometry() -> None:
    with pytest.raises(ValueError, match="positive multiple"):
        TokenAllocator(0)
    with pytest.raises(ValueError, match="page_size 1"):
        TokenAllocator.planned_nbytes(16, 4)


def test_hands_out_every_slot_once_and_never_slot_0(device: str) -> None:
    a = TokenAllocator(8, device=device)
    out = a.alloc(8)
    assert out is not None
    assert sorted(out.tolist()) == list(range(1, 9))
    assert out.dtype == torch.int64 and out.device.type == torch.device(device).type
    assert a.alloc(1) is None
    a.free(out)
    assert a.available_size() == 8


def test_oversized_alloc_returns_none_and_changes_nothing(device: str) -> None:
    a = TokenAllocator(8, device=device)
    held = a.alloc(5)
    before = fingerprint(a)
    assert a.alloc(4) is None
    assert fingerprint(a) == before
    assert a.available_size() == 3
    assert held is not None


def test_zero_alloc_is_empty_and_negative_is_an_error() -> None:
    a = TokenAllocator(4)
    out = a.alloc(0)
    assert out is not None and out.numel() == 0
    assert a.available_size() == 4
    with pytest.raises(ValueError, match="non-negative"):
        a.alloc(-1)


def test_returned_slots_are_private_copies() -> None:
    # the free stack is overwritten by later frees; a returned tensor must not change
    a = TokenAllocator(8)
    first = a.alloc(3)
    assert first is not None
    kept = first.tolist()
    second = a.alloc(2)
    assert second is not None
    a.free(second)
    a.free(i64([first.tolist()[0]]))
    assert first.tolist() == kept


def test_free_reuses_last_freed_first() -> None:
    a = TokenAllocator(8)
    out = a.alloc(3)
    assert out is not None
    a.free(out[1:2])
    again = a.alloc(1)
    assert again is not None and again.tolist() == out[1:2].tolist()


def test_free_accepts_int32_and_2d_indices() -> None:
    a = TokenAllocator(8)
    out = a.alloc(4)
    assert out is not None
    a.free(out[:2].to(torch.int32))
    a.free(out[2:].reshape(1, 2))
    assert a.available_size() == 8


def test_free_group_defers_until_end(device: str) -> None:
    a = TokenAllocator(4, device=device)
    out = a.alloc(4)
    assert out is not None
    a.free_group_begin()
    a.free(out[:1])
    a.free(out[1:3])
    assert a.available_size() == 0
    assert a.alloc(1) is None
    a.free_group_end()
    assert a.available_size() == 3
    assert sorted(a.alloc(3).tolist()) == sorted(out[:3].tolist())  # type: ignore[union-attr]


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("need_sort", [False, True])
@pytest.mark.parametrize("m", [10, 64, 65, 600])
def test_free_group_holds_frees_of_any_size_until_end(m: int, need_sort: bool, checked: bool, device: str) -> None:
    """Every free inside a group comes back at its end, however many slots it frees (a free of more than 64
    slots, checked at the call, used to go straight back to the free stack and be handed out inside the group).

    SGLang 0.5.23 (peers venv, ``sglang/srt/mem_cache/allocator/``): ``TokenToKVPoolAllocator.free`` appends
    to ``free_group`` while a group is open (token.py:69-75), ``available_size`` counts ``free_pages`` and
    ``release_pages`` only (token.py:50-52), and ``free_group_end`` frees the group's slots (base.py:217-220).
    Here: 1000 slots, ``m`` and 10 allocated, the ``m`` freed inside a group: 1000 - m - 10 stay available,
    all of them (and none of the ``m``) can be allocated inside the group, and ``m`` come back at its end.
    """
    a = TokenAllocator(1000, need_sort=need_sort, checked=checked, device=device)
    freed, kept = a.alloc(m), a.alloc(10)
    assert freed is not None and kept is not None
    a.free_group_begin()
    a.free(freed)
    assert a.available_size() == 1000 - m - 10
    rest = a.alloc(1000 - m - 10)
    assert rest is not None and not set(rest.tolist()) & set(freed.tolist())
    assert a.alloc(1) is None
    a.free_group_end()
    assert a.available_size() == m
    again = a.alloc(m)
    assert again is not None and sorted(again.tolist()) == sorted(freed.tolist())


@pytest.mark.parametrize("checked", [False, True])
def test_a_refused_alloc_in_a_group_moves_no_held_slot(checked: bool, device: str) -> None:
    """An ``alloc`` the allocator refuses (more than is available) changes nothing, even with a group holding a
    large free below head: 200 slots, 65 + 65 allocated and the first 65 freed in the group leave 70 available;
    asking 71 is None and the state is what it was (the held slots used to move to the pending region first;
    found by ``TestTokenLargeChecked``)."""
    a = TokenAllocator(200, checked=checked, device=device)
    first, second = a.alloc(65), a.alloc(65)
    assert first is not None and second is not None
    a.free_group_begin()
    a.free(first)
    before = fingerprint(a)
    assert a.available_size() == 70
    assert a.alloc(71) is None
    assert fingerprint(a) == before
    a.free_group_end()
    assert a.available_size() == 135


def test_free_group_nesting_is_an_error() -> None:
    a = TokenAllocator(4)
    with pytest.raises(RuntimeError, match="without free_group_begin"):
        a.free_group_end()
    a.free_group_begin()
    with pytest.raises(RuntimeError, match="twice"):
        a.free_group_begin()


def test_need_sort_releases_then_merges_sorted(device: str) -> None:
    a = TokenAllocator(6, device=device, need_sort=True)
    out = a.alloc(6)
    assert out is not None and out.tolist() == [1, 2, 3, 4, 5, 6]
    a.free(i64([5, 2], device))
    a.free(i64([4], device))
    assert a.available_size() == 3
    # short of free slots: the released ones are merged and handed out ascending
    assert a.alloc(3).tolist() == [2, 4, 5]  # type: ignore[union-attr]


def test_need_sort_prefers_the_sorted_free_region() -> None:
    a = TokenAllocator(6, need_sort=True)
    out = a.alloc(3)
    assert out is not None
    a.free(out)
    # 3 free slots remain unmerged: they come first, the released 1..3 are not reused yet
    assert a.alloc(3).tolist() == [4, 5, 6]  # type: ignore[union-attr]
    assert a.alloc(2).tolist() == [1, 2]  # type: ignore[union-attr]


def test_backup_restore_reverts_allocs_and_frees(device: str) -> None:
    a = TokenAllocator(8, device=device)
    held = a.alloc(3)
    assert held is not None
    before = fingerprint(a)
    state = a.backup_state()
    extra = a.alloc(4)
    assert extra is not None
    a.free(held)
    a.free(extra[:2])
    a.restore_state(state)
    assert fingerprint(a) == before
    # restoring the same state twice is fine, also after more changes
    a.alloc(2)
    a.restore_state(state)
    assert fingerprint(a) == before


def test_backup_without_writes_restores_without_copies() -> None:
    a = TokenAllocator(8)
    state = a.backup_state()
    a.alloc(5)
    a.restore_state(state)
    assert state._buf is None  # copy-on-write: nothing was written, nothing copied
    assert a.available_size() == 8


def test_restore_rejects_foreign_state() -> None:
    a, b = TokenAllocator(4), TokenAllocator(4)
    with pytest.raises(ValueError, match="different allocator"):
        a.restore_state(b.backup_state())


def test_clear_frees_everything(device: str) -> None:
    a = TokenAllocator(5, device=device, need_sort=True)
    out = a.alloc(4)
    assert out is not None
    a.free(out[:2])
    a.free_group_begin()
    a.clear()
    assert a.available_size() == 5
    assert a.alloc(5).tolist() == [1, 2, 3, 4, 5]  # type: ignore[union-attr]
    a.free_group_begin()  # clear() also closed the group


def test_over_free_is_rejected_unchecked() -> None:
    a = TokenAllocator(4)
    out = a.alloc(1)
    assert out is not None
    with pytest.raises(ValueError, match="double free"):
        a.free(i64([1, 2, 3]))


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([0], r"foreign slot\(s\) \[0\]"),
        ([9], r"foreign slot\(s\) \[9\]"),
        ([-1], r"foreign slot\(s\) \[-1\]"),
        ([6], r"never-allocated slot\(s\) \[6\]"),
        ([1, 1], r"slot\(s\) \[1\] appear\(s\) twice"),
    ],
)
def test_checked_rejects_bad_frees_and_keeps_state(bad: list[int], message: str, device: str) -> None:
    a = TokenAllocator(8, device=device, checked=True)
    out = a.alloc(3)
    assert out is not None and out.tolist() == [1, 2, 3]
    before = fingerprint(a)
    with pytest.raises(ValueError, match=message):
        a.free(i64(bad, device))
    assert fingerprint(a) == before
    a.free(out)
    assert a.available_size() == 8


def test_checked_catches_double_free(device: str) -> None:
    a = TokenAllocator(8, device=device, checked=True)
    out = a.alloc(3)
    assert out is not None
    a.free(out[:1])
    before = fingerprint(a)
    with pytest.raises(ValueError, match=r"double free .* \[1\]"):
        a.free(out[:2])
    assert fingerprint(a) == before
    # also inside a free group: the first free counts, the second is refused -- on the CPU path when the group
    # settles (its checks run once, at its end), naming the slot; the group's other free stands
    a.free_group_begin()
    a.free(out[1:2])
    with pytest.raises(ValueError, match=r"double free .* \[2\]"):
        a.free(out[1:2])
        a.free_group_end()
    if a._in_group:  # refused at the call (an accelerator's path): the group is still open
        a.free_group_end()
    assert a.available_size() == 7


# -------------------------------------------------------------- state machine
class TokenMachine(RuleBasedStateMachine):
    """Random alloc/free/group/backup/restore/clear traffic against a set model."""

    SIZE = 24
    need_sort = False
    checked = False
    held: list[list[int]]
    pending: list[int]
    released: set[int]
    in_group: bool
    saved: tuple[AllocatorState, TokenModel, tuple[object, ...]] | None

    @initialize()
    def setup(self) -> None:
        self.a = TokenAllocator(self.SIZE, need_sort=self.need_sort, checked=self.checked)
        self.held = []  # live allocations
        self.pending = []  # freed inside the open group
        self.released = set()  # need_sort: freed, not merged yet
        self.in_group = False
        self.saved = None

    def live(self) -> list[int]:
        return [s for h in self.held for s in h]

    def expected_available(self) -> int:
        return self.SIZE - len(self.live()) - len(self.pending)

    @rule(n=st.integers(0, SIZE + 2))
    def alloc(self, n: int) -> None:
        avail = self.expected_available()
        before = fingerprint(self.a)
        out = self.a.alloc(n)
        if n > avail:
            assert out is None
            assert fingerprint(self.a) == before
            return
        assert out is not None
        slots = out.tolist()
        assert len(slots) == n == len(set(slots))
        assert all(1 <= s <= self.SIZE for s in slots), slots
        assert not set(slots) & set(self.live()), "slot handed out twice"
        assert not set(slots) & set(self.pending), "slot of an open free group reused"
        if self.need_sort:
            assert slots == sorted(slots), "need_sort hands out ascending slots"
            if n <= avail - len(self.released):
                assert not set(slots) & self.released, "released slots reused before a merge"
            else:
                self.released.clear()
        if slots:
            self.held.append(slots)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), whole=st.booleans())
    def free(self, data: st.DataObject, whole: bool) -> None:
        i = data.draw(st.integers(0, len(self.held) - 1))
        slots = self.held[i]
        if whole:
            part = data.draw(st.permutations(slots))
        else:
            part = data.draw(st.lists(st.sampled_from(slots), min_size=1, unique=True))
        self.a.free(torch.tensor(part, dtype=torch.int64))
        rest = [s for s in slots if s not in part]
        if rest:
            self.held[i] = rest
        else:
            del self.held[i]
        if self.in_group:
            self.pending += part
        elif self.need_sort:
            self.released |= set(part)

    @precondition(lambda self: self.held)
    @rule(data=st.data(), how=st.sampled_from(["segment", "segments", "full_segments", "page_ids", "full"]))
    def free_segment(self, data: st.DataObject, how: str) -> None:
        """SGLang 0.5.23's segment frees (issue 37): a tail ``held[keep:]`` of an allocation read as a request's
        row; at page size 1 each is ``free`` of those slots (``allocator/token.py``, ``base.py``)."""
        i = data.draw(st.integers(0, len(self.held) - 1))
        slots = self.held[i]
        keep = data.draw(st.integers(0, len(slots) - 1))
        tail, cut = slots[keep:], data.draw(st.integers(keep, len(slots)))
        split = [(torch.tensor(slots[keep:cut], dtype=torch.int64), keep), (torch.tensor(slots[cut:]), cut)]
        if how == "segment":
            self.a.free_segment(torch.tensor(tail), start_pos=keep)
        elif how == "segments":
            self.a.free_segments(split)
        elif how == "full_segments":
            self.a.free_full_segments(split)
        elif how == "page_ids":
            self.a.free_page_ids(tail)
        else:
            self.a.free_full_segment(torch.tensor(tail), start_pos=keep)
        if keep:
            self.held[i] = slots[:keep]
        else:
            del self.held[i]
        if self.in_group:
            self.pending += tail
        elif self.need_sort:
            self.released |= set(tail)

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
            self.released |= set(self.pending)
        self.pending = []

    @rule()
    def backup(self) -> None:
        model: TokenModel = ([list(h) for h in self.held], list(self.pending), set(self.released), self.in_group)
        self.saved = (self.a.backup_state(), model, fingerprint(self.a))

    @precondition(lambda self: self.saved is not None)
    @rule()
    def restore(self) -> None:
        assert self.saved is not None
        state, model, before = self.saved
        self.a.restore_state(state)
        assert fingerprint(self.a) == before
        held, pending, released, in_group = model
        self.held = [list(h) for h in held]
        self.pending, self.released, self.in_group = list(pending), set(released), in_group

    @rule()
    def clear(self) -> None:
        self.a.clear()
        self.held, self.pending, self.released, self.in_group = [], [], set(), False

    @precondition(lambda self: self.checked)
    @rule(data=st.data())
    def bad_free_is_rejected(self, data: st.DataObject) -> None:
        live = set(self.live())
        bad = data.draw(st.integers(-2, self.SIZE + 2).filter(lambda s: s not in live))
        self.a.backup_state()  # the group's earlier frees settled, so that "before" is comparable
        before = fingerprint(self.a)
        with pytest.raises(ValueError):
            self.a.free(torch.tensor([bad], dtype=torch.int64))
            self.a.backup_state()  # inside a group the CPU path checks the free when the group settles
        assert fingerprint(self.a) == before

    @invariant()
    def available_matches_model(self) -> None:
        if hasattr(self, "a"):
            assert self.a.available_size() == self.expected_available()

    def teardown(self) -> None:
        if not hasattr(self, "a"):
            return
        if self.in_group:
            self.group_end()
        for slots in self.held:
            self.a.free(torch.tensor(slots, dtype=torch.int64))
        assert self.a.available_size() == self.SIZE
        out = self.a.alloc(self.SIZE)
        assert out is not None and sorted(out.tolist()) == list(range(1, self.SIZE + 1))


class TokenSortedMachine(TokenMachine):
    need_sort = True


class TokenCheckedMachine(TokenMachine):
    checked = True


TestToken = TokenMachine.TestCase
TestToken.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestTokenNeedSort = TokenSortedMachine.TestCase
TestTokenNeedSort.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestTokenChecked = TokenCheckedMachine.TestCase
TestTokenChecked.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)


# ------------------------------------------------------ default-mode checks
@pytest.mark.parametrize("bad", [[0], [9], [-1], [2, 0], [1, 2**40]])
@pytest.mark.parametrize("in_group", [False, True])
def test_default_mode_refuses_ids_outside_the_pool(bad: list[int], in_group: bool, device: str) -> None:
    a = TokenAllocator(8, device=device)
    out = a.alloc(3)
    assert out is not None and out.tolist() == [1, 2, 3]
    if in_group:
        a.free_group_begin()
    before = fingerprint(a)
    outside = [s for s in bad if not 1 <= s <= 8]
    message = re.escape(f"foreign slot(s) {outside}: valid slot ids are 1..8 ")
    with pytest.raises(AllocatorError, match=message):
        a.free(i64(bad, device))
        a.backup_state()  # inside a group the CPU path checks a free when the group settles: here
    with pytest.raises(AllocatorError, match="slot 0 is padding and never allocated"):
        a.free(bad)
    assert fingerprint(a) == before  # slot 2 of [2, 0] was not freed either
    a.free(out)
    if in_group:
        a.free_group_end()
    assert a.alloc(8).tolist() == list(range(1, 9))  # type: ignore[union-attr]


def test_free_takes_int_sequences_and_refuses_non_integers() -> None:
    a = TokenAllocator(8)
    out = a.alloc(6)
    assert out is not None
    a.free([1, 2])
    a.free((3,))
    a.free(np.array([4], dtype=np.int32))  # type: ignore[arg-type]
    a.free([])
    assert a.available_size() == 6
    before = fingerprint(a)
    for bad in (torch.tensor([5.0]), torch.tensor([True]), [5.5], ["5"], None):
        with pytest.raises(AllocatorError, match="integer slot ids"):
            a.free(bad)  # type: ignore[arg-type]
    assert fingerprint(a) == before


def test_restore_rejects_what_is_not_a_state() -> None:
    a = TokenAllocator(4)
    for state in (None, object(), (0, 0, 0, False)):
        with pytest.raises(AllocatorError, match="backup_state"):
            a.restore_state(state)  # type: ignore[arg-type]


def test_check_free_changes_nothing() -> None:
    a = TokenAllocator(8, checked=True)
    out = a.alloc(2)
    assert out is not None
    before = fingerprint(a)
    a.check_free(out)
    with pytest.raises(AllocatorError, match="never-allocated"):
        a.check_free([5])
    with pytest.raises(AllocatorError, match="foreign"):
        a.check_free([0])
    assert fingerprint(a) == before


def test_checked_mode_reports_its_map_apart() -> None:
    # the plan charges the unchecked allocator; the checked map is an extra pool
    assert TokenAllocator(8).nbytes_by_pool() == {"allocator": 64}
    checked = TokenAllocator(8, checked=True)
    # the int16 map of slot ids 0..8: 2 * 9 bytes
    assert checked.nbytes_by_pool("mamba_allocator") == {"mamba_allocator": 64, "mamba_allocator_checked": 18}
    assert checked.nbytes == 82


def test_debug_is_the_old_name_of_checked() -> None:
    a = TokenAllocator(8, debug=True)
    assert a.checked and a.debug
    assert not TokenAllocator(8).debug


# ------------------------------------------------- a free group's deferred checks
def _twin_without(bad_call: bool, checked: bool, need_sort: bool = False) -> TokenAllocator:
    """The allocator a group of frees should leave: built alike, the same valid calls, the bad one never made."""
    a = TokenAllocator(16, checked=checked, need_sort=need_sort)
    out = a.alloc(10)  # more held than the group frees: the per-call count never binds
    assert out is not None
    a.free_group_begin()
    a.free(out[:2])
    a.free(out[3:5])
    a.free_group_end()
    return a


@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("need_sort", [False, True])
def test_a_group_refuses_its_bad_calls_when_it_ends_and_keeps_the_others(checked: bool, need_sort: bool) -> None:
    """Foreign ids (both modes) and a double free (checked) inside a group: the calls that a check at the call
    would refuse are refused at ``free_group_end``, naming the ids; the group's other frees stand and the group
    is closed: the allocator equals one that never saw the bad calls."""
    a = TokenAllocator(16, checked=checked, need_sort=need_sort)
    out = a.alloc(10)
    assert out is not None and out.tolist() == list(range(1, 11))
    a.free_group_begin()
    a.free(out[:2])
    a.free(i64([3, 99]))  # foreign 99: the whole call is refused, slot 3 stays allocated
    a.free(out[3:5])
    bad = r"foreign slot\(s\) \[99\]"
    if checked:
        a.free(out[:1])  # slot 1 again: a double free, refused in checked mode
        bad += r".*double free .* \[1\]"
    refused = rf"{2 if checked else 1} free call\(s\) inside the free group refused.*{bad}"
    with pytest.raises(AllocatorError, match=refused):
        a.free_group_end()
    assert not a._in_group
    twin = _twin_without(True, checked, need_sort)
    assert fingerprint(a) == fingerprint(twin)
    assert a.available_size() == twin.available_size() == 10
    assert torch.equal(a.alloc(10), twin.alloc(10))  # type: ignore[arg-type]


def test_a_snapshot_inside_a_group_settles_it_first() -> None:
    """``backup_state`` checks the group's frees before it snapshots: a restore never brings a foreign id back."""
    a = TokenAllocator(8)
    out = a.alloc(4)
    assert out is not None
    a.free_group_begin()
    a.free(out[:1])
    a.free(i64([0]))
    with pytest.raises(AllocatorError, match=r"foreign slot\(s\) \[0\]"):
        a.backup_state()
    state = a.backup_state()  # settled: the good free is still in the group
    a.free(out[1:2])
    a.restore_state(state)
    a.free_group_end()
    assert a.available_size() == 5
    assert sorted(a.alloc(5).tolist()) == [1, 5, 6, 7, 8]  # type: ignore[union-attr]


def test_retain_inside_a_group_settles_it_first() -> None:
    """The reference counts are built from the free stack: a parked call the group has not checked is neither
    counted free nor lets a foreign id index the counts."""
    a = TokenAllocator(8)
    out = a.alloc(4)
    assert out is not None
    a.free_group_begin()
    a.free(out[:1])
    a.free(i64([2**40]))
    with pytest.raises(AllocatorError, match="foreign"):
        a.retain(out[1:2])
    a.retain(out[1:2])  # settled: now counted
    a.free_group_end()
    assert a.ref_counts.tolist() == [0, 0, 2, 1, 1, 0, 0, 0, 0]


def test_a_merge_inside_a_group_keeps_the_parked_calls() -> None:
    """``merge_and_sort_free`` moves the pending region: the parked calls are found there by offset."""
    a = TokenAllocator(8, need_sort=True)
    out = a.alloc(8)
    assert out is not None
    a.free(out[6:])  # released (need_sort): a later alloc must merge
    a.free_group_begin()
    a.free(out[:2])
    a.free(i64([9]))
    assert a.alloc(2) is not None  # merges the released slots 7 and 8 into the free region
    with pytest.raises(AllocatorError, match=r"foreign slot\(s\) \[9\]"):
        a.free_group_end()
    assert a.available_size() == 2


class TokenLargeMachine(TokenMachine):
    """The same traffic on 200 slots: frees of more than 64 slots inside a group (checked at the call and held
    until the group's end, where smaller ones are parked unchecked) mixed with allocations, backups and
    restores inside the group."""

    SIZE = 200

    @rule(n=st.integers(65, 120))
    def alloc_many(self, n: int) -> None:
        """An allocation whose whole free is more than 64 slots (the draws of ``alloc`` seldom are)."""
        self.alloc(n)


class TokenLargeCheckedMachine(TokenLargeMachine):
    checked = True


TestTokenLarge = TokenLargeMachine.TestCase
TestTokenLarge.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestTokenLargeChecked = TokenLargeCheckedMachine.TestCase
TestTokenLargeChecked.settings = settings(max_examples=30, stateful_step_count=30, deadline=None)
