"""Fixed-capacity free stack shared by the token and paged KV-slot allocators.

Both allocators hand out *units* (a slot for the token allocator, a page for
the paged one) numbered ``1..num_pages``; unit 0 is the padding page and is
never handed out.  All free-list state is one preallocated ``int64`` buffer
of ``num_pages`` entries plus host-side counters, so the allocator's memory
is a fixed function of ``(size, page_size)`` and a free never reallocates
(SGLang ``torch.cat``-s its free list on every free)::

    buf:  [ released | pending | (stale) ...... | free units ............ ]
          0        rel    rel+pend            head                   num_pages

* ``buf[head:]`` are the free units, taken from the front (``head`` moves
  right), so a fresh or sorted free region hands out ascending ids.
* A plain free writes the units just before ``head`` (LIFO reuse, as SGLang's
  paged allocator).  Units freed with ``need_sort`` (``released``) or, by the
  token allocator, inside a free group (``pending``) are parked at the low
  end; that space cannot collide with the free region because parked units
  still count as in use (``rel + pend <= head``).

Frees are checked before anything changes, so a refused free (``AllocatorError``)
leaves the allocator exactly as it was:

* always: the ids are integers and in ``1..num_pages`` (padding 0 and -1
  are never handed out, so freeing them is a caller bug), and no more units
  are freed than are allocated (a paged free group counts its pages when it
  ends).  The range check is one ``torch.aminmax`` per free of a tensor, or
  ``min``/``max`` of a Python list of page ids: O(1) Python work, but on the
  CPU token path that op costs as much as the free did before (~3 us, ~8 us
  with cold caches), and on an accelerator it synchronises once per free.
  Inside a free group the token allocator's CPU path checks the group's frees
  once, when the group settles (``_settle_deferred``): nothing a group frees
  is usable before then, and a call the check refuses is taken out again;
* ``checked=True`` (``build(plan, device, checked=True)``): also a bool
  "allocated" map of ``2 * (num_pages + 1)`` bytes (int16), which catches double frees,
  frees of never-allocated ids and repeats within one free.  Every call then
  takes the tensor path (and on an accelerator synchronises), so it is for
  tests and debugging, not for a benchmark.

On a CPU device the buffer is an ``array('q')`` shared with a torch tensor:
Python-int page calls index it directly and index tensors are copied in and
out with one ``memmove`` -- a torch op costs ~2-5 us here, which would
dominate these O(1) operations.  Other devices use plain tensor ops.
"""

from __future__ import annotations

import array
import ctypes
import weakref
from collections.abc import Iterable, Sequence
from typing import ClassVar

import torch
from torch import Tensor

from kvpools_core.allocators.contract import (
    BaseTokenToKVPoolAllocator,
    host_copy_of,
    load_host_copy_into,
    page_disjoint_segments,
)
from kvpools_core.allocators.sizes import check_geometry, free_stack_nbytes
from kvpools_core.errors import AllocatorError, AllocatorStateError

__all__ = ["AllocatorState", "BaseAllocator"]

_I64 = torch.int64
_memmove = ctypes.memmove
_aminmax = torch.aminmax
_CLAIM_MAX = 65_535
"""Checked mode counts a free's units off an int16 map: frees of more units than this check repeats by sorting."""


class AllocatorState:
    """Opaque snapshot returned by ``backup_state()``.

    Copy-on-write: taking it copies nothing; the first later write to the
    allocator's buffers (a free, a merge, checked-mode bookkeeping) copies them into
    the snapshot.  The common pattern -- backup, speculative allocations,
    restore -- therefore costs O(1); a snapshot that outlives a write holds
    one copy of the free stack (``planned_nbytes``), as SGLang's backup holds
    its old free list.
    """

    __slots__ = ("__weakref__", "_allocated", "_buf", "_counters", "_owner", "_pending", "_refs")

    def __init__(
        self,
        owner: object,
        counters: tuple[int, int, int, bool],
        pending: tuple[tuple[Tensor, ...], tuple[bytes, ...], tuple[Tensor, ...]],
    ) -> None:
        self._owner = owner
        self._counters = counters
        self._pending = pending
        self._buf: Tensor | None = None
        self._allocated: Tensor | None = None
        self._refs: Tensor | None = None


class BaseAllocator(BaseTokenToKVPoolAllocator):
    """Free-unit bookkeeping common to ``TokenAllocator`` and ``PagedAllocator``.

    The constructor is SGLang's, ``(size, page_size, dtype, device, kvcache,
    need_sort)``, positional or by keyword, plus kvpools' keyword-only ``checked``.
    """

    _kind: ClassVar[str] = "unit"

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        kvcache: object = None,
        need_sort: bool = False,
        *,
        checked: bool = False,
        debug: bool = False,
    ) -> None:
        check_geometry(size, page_size)
        super().__init__(size, page_size, dtype, device, kvcache, need_sort)
        self.num_pages = n = size // page_size
        self.checked = checked = checked or debug  # ``debug`` is the old name of checked mode
        self._n = n
        self._token = object()  # identifies snapshots taken from this instance
        self._snaps: list[weakref.ref[AllocatorState]] = []
        self._arr: array.array[int] | None = None
        self._mv: memoryview | None = None
        self._addr = 0
        # the range check's aminmax writes into host memory read as Python ints: no .item() per free
        self._minmax = array.array("q", [0, 0])
        minmax = torch.frombuffer(self._minmax, dtype=_I64)
        self._minmax_out = (minmax[0], minmax[1])
        if torch.device(device).type == "cpu":
            self._arr = array.array("q", [0]) * n
            self._mv = memoryview(self._arr)
            self._buf = torch.frombuffer(self._arr, dtype=_I64)
            self._addr = self._buf.data_ptr()
        else:
            self._buf = torch.empty(n, dtype=_I64, device=device)
        self.device = self._buf.device  # normalised ("cuda" -> "cuda:0")
        self._cpu = self.device.type == "cpu"
        # Python-int fast paths; checked mode keeps every call on the tensor path
        self._host_arr = None if checked else self._arr
        self._host_mv = None if checked else self._mv
        self._allocated: Tensor | None = None
        self._amap: memoryview | None = None
        if checked:  # holders by unit id, 1 or 0 (int16: a free counts its units off in one index_add_)
            if self._cpu:  # host memory read as Python ints too: small allocations mark it without a torch op
                amap = array.array("h", [0]) * (n + 1)
                self._amap = memoryview(amap)
                self._allocated = torch.frombuffer(amap, dtype=torch.int16)
            else:
                self._allocated = torch.zeros(n + 1, dtype=torch.int16, device=self.device)
            self._claim_one = (
                torch.ones((), dtype=torch.int16, device=self.device),
                torch.full((), -1, dtype=torch.int16, device=self.device),
            )
            self._left = array.array("h", [0, 0])
            left = torch.frombuffer(self._left, dtype=torch.int16)
            self._left_out = (left[0], left[1])
        self._refs: Tensor | None = None  # int32 reference counts by unit id, from the first retain() on
        self._head = 0
        self._rel = 0
        self._pend = 0
        # token, host path: slots a group freed (checked at the call) held just below head until its end
        self._hold = 0
        self._in_group = False
        # paged: what frees inside a group left for free_group_end (page-id tensors,
        # or byte copies of slot tensors on the host path)
        self._pending: list[Tensor] = []
        self._pending_bytes: list[bytes] = []
        self._pending_ids: list[Tensor] = []  # paged: free_page_ids inside a group, released as given
        # token, host path: (offset in the pending region, count) of each free a group took unchecked
        self._deferred: list[tuple[int, int]] = []
        self.clear()

    @property
    def debug(self) -> bool:
        """Old name of :attr:`checked`."""
        return self.checked

    # ------------------------------------------------------------------ sizes
    @classmethod
    def planned_nbytes(cls, size: int, page_size: int, checked: bool = False) -> int:
        """Bytes of every tensor the allocator holds: the int64 free stack
        (one entry per unit) plus, in checked mode, an int16 "allocated" map."""
        return free_stack_nbytes(size, page_size, checked)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors actually held (equals ``planned_nbytes``)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def nbytes_by_pool(self, name: str = "allocator") -> dict[str, int]:
        """Measured bytes by plan pool name: the plan charges the unchecked allocator without
        reference counts, so checked mode's map is reported apart, as ``<name>_checked``, and
        the counts ``retain`` made, as ``<name>_refcounts``."""
        out = {name: self.nbytes}
        for suffix, extra in (("checked", self._allocated), ("refcounts", self._refs)):
            if extra is not None:
                out[name] -= extra.numel() * extra.element_size()
                out[f"{name}_{suffix}"] = extra.numel() * extra.element_size()
        return out

    def available_size(self) -> int:
        """Free slots (released units count: they are merged on demand)."""
        return (self._n - self._head + self._rel) * self.page_size

    @property
    def release_pages(self) -> Tensor:
        """Units freed with ``need_sort`` and not merged yet (SGLang's ``release_pages``; a copy)."""
        return self._buf[: self._rel].clone()

    def get_all_free_pages(self) -> Tensor:
        """Every free unit: the free region, then the released ones (SGLang's debug census; a copy)."""
        return torch.cat((self._buf[self._head :], self._buf[: self._rel]))

    # ------------------------------------------------------------ host copies
    def get_cpu_copy(self, indices: Tensor) -> object:
        """The KV of slots ``indices`` in host memory, from the KV pool (SGLang retracts a request with it).

        Delegates to the pool's ``get_cpu_copy``; an allocator built without a pool,
        or over one without host copies, raises ``AllocatorError`` saying so, as it does
        for ``indices`` out of range (checked: not allocated now; see ``check_held``).
        """
        self.check_held(indices)
        return host_copy_of(self, indices)

    def load_cpu_copy(self, kv_cache_cpu: object, indices: Tensor) -> None:
        """Write a ``get_cpu_copy`` result into slots ``indices`` (new slots of the resumed request).

        Refused with ``AllocatorError``: ``indices`` out of range (checked: not allocated now;
        see ``check_held``), and a copy the pool did not make for as many slots.
        """
        self.check_held(indices)
        load_host_copy_into(self, kv_cache_cpu, indices)

    # ------------------------------------------------------- reference counts
    @property
    def ref_counts(self) -> Tensor:
        """Holders of every unit (a slot; a page for the paged allocator), int32, indexed by unit id ``0..num_pages``.

        An allocated unit has one holder, one more per ``retain``; a free takes one
        away and the unit is reused only when none is left (SGLang's ``ref_counts``,
        ``test_allocator_refcount.py`` at sglang 9c458129).  Before the first
        ``retain`` the counts are not kept: reading them then builds them from the
        free list (every unit not free has one holder).
        """
        self._settle_deferred()
        return self._refs if self._refs is not None else self._census()

    def retain(self, indices: Tensor | Sequence[int]) -> None:
        """One more holder for the units of ``indices`` (slots; a paged allocator counts each page once per call).

        Each retained unit must then be freed once more before it is reused.  The
        first call makes the counts (``4 * (num_pages + 1)`` bytes, reported as
        ``allocator_refcounts``) and moves every later call onto the tensor paths
        (the Python-int fast paths do not count).  Refused with ``AllocatorError``,
        nothing changed: units out of range, or not allocated now.
        """
        units = self._free_units(self.to_ids(indices))
        if not units.numel():
            return
        self._check_range(units)
        self._settle_deferred()
        # checked against the census before counts are kept: a refused retain leaves them off
        idle = (self._refs if self._refs is not None else self._census())[units] <= 0
        if bool(idle.any()):
            raise AllocatorError(
                f"retain of {self._describe(units[idle])} that are not allocated; retain only what alloc handed out "
                "and is not freed; nothing was retained"
            )
        refs = self._counting()
        if self._snaps:
            self._materialize()
        refs.index_put_((units,), torch.ones_like(units, dtype=torch.int32), accumulate=True)

    def _counting(self) -> Tensor:
        """The reference counts, made on first use (and the host fast paths switched off: they do not count)."""
        if self._refs is None:
            if self._snaps:
                self._materialize()
            self._refs = self._census()
            self._host_arr = None
            self._host_mv = None
        return self._refs

    def _census(self) -> Tensor:
        """Counts from the free list: 1 for every unit not free (nor freed in an open group), else 0."""
        n = self._n
        refs = torch.ones(n + 1, dtype=torch.int32, device=self.device)
        refs[0] = 0
        rel, pend = self._rel, self._pend
        free = [self._buf[self._head - self._hold :], self._buf[: rel + pend], *self._pending_units()]
        if self._deferred:  # a free the open group has not checked yet is not counted free
            keep = torch.ones(rel + pend, dtype=torch.bool)
            for off, m in self._deferred:
                keep[rel + off : rel + off + m] = False
            free[1] = free[1][keep]
        refs[torch.cat(free)] = 0
        return refs

    def _pending_units(self) -> list[Tensor]:
        """Units freed inside an open group and not yet on the stack (the paged allocator keeps some apart)."""
        return []

    def _free_counted(self, units: Tensor) -> None:
        """A free once counts are kept: one holder less per occurrence; units left with none are released.

        Checked before anything changes: a unit freed more often than it is held is a
        double free (``AllocatorError``; SGLang raises ``ValueError``, which this is too).
        """
        refs = self._refs
        assert refs is not None
        uniq, times = torch.unique(units, return_counts=True)
        self._check_range(uniq)
        left = refs[uniq] - times.to(torch.int32)
        over = left < 0
        if bool(over.any()):
            raise AllocatorError(
                f"double free of {self._describe(uniq[over])}: freed more often than held (see ref_counts); "
                "nothing was freed"
            )
        if self._snaps:
            self._materialize()
        refs[uniq] = left
        self._release_unheld(uniq[left == 0])

    def _release_unheld(self, units: Tensor) -> None:
        """Release distinct, checked units whose last holder freed them (inside a group: at its end)."""
        self._release(units, validated=True)

    # ------------------------------------------------------------ segment frees
    def free_page_ids(self, page_ids: Tensor | Sequence[int]) -> None:
        """Free exactly these units (SGLang's ``free_page_ids``).  Abstract: what a unit id is (a slot, a page)
        is the subclass's, and both built-in allocators (``TokenAllocator``, ``PagedAllocator``) define it."""
        raise NotImplementedError(f"{type(self).__name__} defines no free_page_ids: a BaseAllocator subclass must")

    def free_segments(self, segments: Iterable[tuple[Tensor | Sequence[int], int]]) -> None:
        """Free ``(free_index, start_pos)`` segments of one request's row, ascending and page-disjoint
        (SGLang's ``free_segments``), all or nothing: the segments, then their units, are checked as one
        free before any is given back; the units come back in the order SGLang's segment-by-segment frees
        leave them."""
        segs = page_disjoint_segments(segments, self.page_size, "free_segments")
        if len(segs) == 1:
            self.free_segment(segs[0][0], start_pos=segs[0][1])
        elif segs:
            parts = [self._segment_units(free_index) for free_index, _ in segs]
            if not self._in_group:  # each segment's free goes in front of the previous one's
                parts.reverse()
            self.free_page_ids(torch.cat(parts))

    def free_full_segments(self, segments: Iterable[tuple[Tensor | Sequence[int], int]]) -> None:
        """``free_full_segment`` of each segment (SGLang's ``free_full_segments``: one pool, so ``free`` of
        each), all or nothing: several segments are checked as one free before any is given back."""
        segs = page_disjoint_segments(segments, self.page_size, "free_full_segments")
        if len(segs) > 1:
            self.check_free(torch.cat([self.to_ids(free_index) for free_index, _ in segs]))
        for free_index, _ in segs:
            self.free(free_index)

    def _segment_units(self, free_index: Tensor | Sequence[int]) -> Tensor:
        """The units a free of one (non-empty, start-checked) segment gives back, in row order."""
        return self.to_ids(free_index)

    def _give_back_ids(self, units: Tensor) -> None:
        """Free units ``free_page_ids`` would, already checked by the caller (range, checked map, count)."""
        if self._refs is not None:
            self._free_counted(units)
        else:
            self._release(units, validated=True)

    def _check_held_units(self, units: Tensor) -> None:
        """``check_held`` of distinct-or-not units (1-D int64 on ``device``, non-empty)."""
        self._check_range(units)
        if self._allocated is not None:
            idle = self._allocated.index_select(0, units) == 0
            if bool(idle.any()):
                raise AllocatorError(
                    f"{self._describe(units[idle])} are not allocated now; read and write only the slots "
                    "alloc handed out and that are not freed; nothing changed"
                )

    # ------------------------------------------------------------ free groups
    def free_group_begin(self) -> None:
        """Defer frees until ``free_group_end`` (one scheduler step's frees)."""
        if self._in_group:
            raise AllocatorStateError("free_group_begin() called twice without free_group_end(); nothing changed")
        self._in_group = True

    def free_group_end(self) -> None:
        """Make the group's frees available (or released, with ``need_sort``)."""
        if not self._in_group:
            raise AllocatorStateError("free_group_end() called without free_group_begin(); nothing changed")
        if self._deferred:
            try:
                self._settle_deferred()
            except AllocatorError:
                self.free_group_end()  # the group's other frees stand, as if each call had been checked alone
                raise
        self._in_group = False
        pend, hold = self._pend, self._hold
        if hold:  # held just below head already (never with need_sort): head moves over them
            self._hold = 0
            self._head -= hold
        if not pend:
            return
        self._pend = 0
        if self.need_sort:
            self._rel += pend
            return
        # rel == 0 without need_sort: move buf[0:pend] to just before head
        if self._snaps:
            self._materialize()
        head = self._head - pend
        if self._addr:
            _memmove(self._addr + 8 * head, self._addr, 8 * pend)  # overlap-safe
        else:
            self._buf[head : head + pend] = self._buf[:pend].clone()
        self._head = head

    def merge_and_sort_free(self) -> None:
        """Fold released units into the free region, sorted ascending, so that
        disaggregated KV transfers see low, mostly contiguous ids."""
        rel = self._rel
        if not rel:
            return
        if self._snaps:
            self._materialize()
        buf, head, pend = self._buf, self._head, self._pend
        merged = torch.cat((buf[:rel], buf[head:])).sort().values
        pending = buf[rel : rel + pend].clone() if pend else None
        new_head = head - rel
        buf[new_head:] = merged
        if pending is not None:
            buf[:pend] = pending
        self._head = new_head
        self._rel = 0

    # ------------------------------------------------------------ state/reset
    def backup_state(self) -> AllocatorState:
        """Snapshot for an exact ``restore_state`` (copy-on-write, O(1)).

        An open free group's unchecked frees are range-checked first (a snapshot holds checked ids only)."""
        self._settle_deferred()
        self._unhold()
        state = AllocatorState(
            self._token,
            (self._head, self._rel, self._pend, self._in_group),
            (tuple(self._pending), tuple(self._pending_bytes), tuple(self._pending_ids)),
        )
        if self._refs is not None:  # counts change on every alloc: one copy, not copy-on-write
            state._refs = self._refs.clone()
        if len(self._snaps) >= 8:
            self._snaps = [r for r in self._snaps if r() is not None]
        self._snaps.append(weakref.ref(state))
        return state

    def restore_state(self, state: AllocatorState) -> None:
        """Return exactly to the state of ``backup_state()`` (of this allocator only)."""
        if not isinstance(state, AllocatorState):
            raise AllocatorError(
                f"restore_state() takes what this allocator's backup_state() returned; got {type(state).__name__}"
            )
        if state._owner is not self._token:
            raise AllocatorError("restore_state() got a state taken from a different allocator; nothing was restored")
        if state._buf is not None:
            # the buffers changed since the backup: copy its contents back
            if self._snaps:
                self._materialize()
            self._buf.copy_(state._buf)
            if self._allocated is not None and state._allocated is not None:
                self._allocated.copy_(state._allocated)
        self._head, self._rel, self._pend, self._in_group = state._counters
        self._hold = 0  # a snapshot is taken with nothing held
        self._deferred = []  # a snapshot is taken settled
        self._pending = list(state._pending[0])
        self._pending_bytes = list(state._pending[1])
        self._pending_ids = list(state._pending[2])
        if self._refs is not None:  # counts kept now: the backup's, or (taken before any retain) the census
            self._refs.copy_(state._refs if state._refs is not None else self._census())

    def clear(self) -> None:
        """Everything free again; units handed out first in ascending order."""
        if self._snaps:
            self._materialize()
        torch.arange(1, self._n + 1, dtype=_I64, device=self.device, out=self._buf)
        if self._allocated is not None:
            self._allocated.zero_()
        if self._refs is not None:
            self._refs.zero_()
        self._head = self._rel = self._pend = self._hold = 0
        self._in_group = False
        self._pending = []
        self._pending_bytes = []
        self._pending_ids = []
        self._deferred = []

    def _settle_deferred(self) -> None:
        """Check the frees an open group took unchecked (the token allocator's CPU path), in one go.

        Inside a free group nothing freed is usable before the group ends, so the checks can wait until the
        group settles: at ``free_group_end`` (or a ``backup_state`` / ``retain`` / ``ref_counts`` inside the
        group).  Default mode checks the range with one ``aminmax`` over the group's ids, checked mode claims
        them in the "allocated" map in one pass.  Only when that fails are the calls checked one by one, in
        order: a call that would have been refused at the call is refused now -- its ids leave the group
        (they stay allocated), the group's other frees stand, and ``AllocatorError`` names the ids.
        """
        deferred = self._deferred
        if not deferred:
            return
        first = deferred[0][0]
        if self._allocated is None and (len(deferred) == 1 or sum(m for _, m in deferred) == self._pend - first):
            # the common case, the parked calls one run: one view, one aminmax
            _aminmax(self._buf[self._rel + first : self._rel + self._pend], out=self._minmax_out)
            lo, hi = self._minmax
            if lo >= 1 and hi <= self._n:
                self._deferred = []
                return
        try:  # the list stays while the claim runs: its census undo must count the parked calls as held
            self._settle(deferred)
        finally:
            self._deferred = []

    def _settle(self, deferred: list[tuple[int, int]]) -> None:
        rel, pend = self._rel, self._pend
        region = self._buf[rel : rel + pend]
        first = deferred[0][0]
        contiguous = first + sum(m for _, m in deferred) == pend
        ids = region[first:] if contiguous else torch.cat([region[o : o + m] for o, m in deferred])
        if self._allocated is None:
            _aminmax(ids, out=self._minmax_out)
            lo, hi = self._minmax
            if lo >= 1 and hi <= self._n:
                return
        else:
            try:  # the claim's own bounds check is the range check (its census undo counts parked calls held)
                self._claim(ids)
                return
            except AllocatorError:
                pass  # the map is as it was: find the calls to refuse, one by one
        keep = torch.ones(pend, dtype=torch.bool)
        refused: list[str] = []
        for off, m in deferred:
            ids = region[off : off + m]
            try:
                self._check_range(ids)
                if self._allocated is not None:
                    self._claim(ids)
            except AllocatorError as exc:
                keep[off : off + m] = False
                refused.append(str(exc))
        if self._snaps:
            self._materialize()
        kept = region[keep].clone()
        region[: kept.numel()] = kept
        self._pend = kept.numel()
        raise AllocatorError(
            f"{len(refused)} free call(s) inside the free group refused (their slots stay allocated; the group's "
            f"other frees stand): " + "; ".join(refused[:4])
        )

    # ------------------------------------------------------------ validation
    def check_free(self, indices: Tensor | Sequence[int], *, count: bool = True) -> None:
        """Raise ``AllocatorError`` where ``free(indices)`` would; change nothing.

        For a caller that must act on several allocators all or nothing (the
        SWA allocator checks its full slots before touching its mapping).
        ``count=False`` skips the count against the allocated units, for ids
        that are read, not freed.
        """
        units = self._free_units(self.to_ids(indices))
        if not units.numel():
            return
        self._check_units(units)
        if count and self._counts_now():
            self._check_count(units.numel())

    def check_held(self, indices: Tensor | Sequence[int]) -> None:
        """Raise ``AllocatorError`` unless every id of ``indices`` is in range and, in checked mode,
        allocated now (ids that are read or written, not freed: repeats allowed); change nothing."""
        units = self._free_units(self.to_ids(indices))
        if units.numel():
            self._check_held_units(units)

    def _free_units(self, ids: Tensor) -> Tensor:
        """The distinct units a free of ``ids`` gives back (the token allocator: the ids themselves)."""
        return ids

    def _counts_now(self) -> bool:
        """Whether a free is counted against the allocated units now (else at ``free_group_end``)."""
        return True

    def to_ids(self, indices: object) -> Tensor:
        """Ids to free as 1-D int64 on ``device`` (not range checked: ``free`` does that).

        Takes a tensor of an integer dtype, or anything ``torch.as_tensor`` makes
        one of (a list, tuple or numpy array of ints; a lone int).  Floats and
        bools are refused, not rounded: they are a caller bug, not ids.
        """
        if not isinstance(indices, Tensor):
            try:
                converted = torch.as_tensor(indices)
            except (TypeError, ValueError, RuntimeError) as exc:
                raise AllocatorError(
                    f"free() takes integer {self._kind} ids (a tensor, or a list or tuple of ints); "
                    f"got {type(indices).__name__} ({exc})"
                ) from None
            if not converted.numel():
                return self._buf.new_empty(0)
            indices = converted
        dtype = indices.dtype
        if dtype.is_floating_point or dtype.is_complex or dtype is torch.bool:
            raise AllocatorError(f"free() takes integer {self._kind} ids; got a {dtype} tensor")
        return self._as_index(indices)

    def _check_units(self, units: Tensor) -> None:
        """The check a free of ``units`` gets: the map in checked mode, else the range."""
        if self._allocated is not None:
            self._check_release(units)
        else:
            self._check_range(units)

    def _check_range(self, units: Tensor) -> None:
        """Refuse units outside ``1..num_pages`` with one ``aminmax`` (``units`` non-empty)."""
        if units.is_cpu:
            torch.aminmax(units, out=self._minmax_out)
            lo, hi = self._minmax
        else:  # one device -> host transfer for both
            lo, hi = torch.stack(torch.aminmax(units)).tolist()
        if lo < 1 or hi > self._n:
            raise self._range_error(units)

    def _ints(self, units: Sequence[int]) -> array.array[int]:
        """Python ints as an ``array('q')``, checked against ``1..num_pages`` with ``min``/``max``."""
        try:
            data = array.array("q", units)
        except (TypeError, OverflowError) as exc:
            raise AllocatorError(f"free_pages() takes integer page ids in 1..{self._n}; got {exc}") from None
        if data and (min(units) < 1 or max(units) > self._n):
            raise self._range_error(torch.frombuffer(data, dtype=_I64))
        return data

    def _range_error(self, units: Tensor) -> AllocatorError:
        """The error naming the units outside ``1..num_pages`` (first 8)."""
        bad = units[(units < 1) | (units > self._n)]
        return AllocatorError(f"free of foreign {self._describe(bad)}: {self._valid_ids()}; nothing was freed")

    def _valid_ids(self) -> str:
        k = self._kind
        return f"valid {k} ids are 1..{self._n} ({k} 0 is padding and never allocated)"

    def _check_count(self, m: int) -> None:
        """Refuse freeing more units than are allocated (a double free, caught without the map)."""
        allocated = self._head - self._rel - self._pend - self._hold
        if m > allocated:
            raise AllocatorError(
                f"free of {m} {self._kind}s but only {allocated} are allocated; "
                "a double free? (build the allocator with checked=True to find it)"
            )

    # --------------------------------------------------------------- helpers
    def _tensors(self) -> list[Tensor]:
        return [t for t in (self._buf, self._allocated, self._refs) if t is not None]

    def _materialize(self) -> None:
        """Copy the buffers into outstanding copy-on-write snapshots before a write."""
        for ref in self._snaps:
            state = ref()
            if state is not None and state._buf is None:
                state._buf = self._buf.clone()
                if self._allocated is not None:
                    state._allocated = self._allocated.clone()
        self._snaps.clear()

    def _take(self, k: int) -> int | None:
        """Reserve ``k`` units; the buffer offset of the first one, or None."""
        if k < 0:  # a negative count would move head back over handed-out units
            raise AllocatorError(
                f"{k} new {self._kind}s asked for (num_new_pages, or lengths with prefix_lens > seq_lens?); "
                "need a count >= 0; nothing was allocated"
            )
        if k > self._n - self._head + self._rel:  # refused before the held slots move: nothing changes
            return None
        if self._hold:
            self._unhold()
        head = self._head
        if k > self._n - head:
            self.merge_and_sort_free()
            head = self._head
        self._head = head + k
        if self._refs is not None:
            self._refs[self._buf[head : head + k]] = 1
        return head

    def _unhold(self) -> None:
        """Move the slots an open group holds below head to its pending region (before an allocation moves
        head, or a snapshot): they stay freed-in-the-group, only where they are kept changes."""
        hold = self._hold
        if not hold:
            return
        if self._snaps:
            self._materialize()
        head, pos = self._head, self._rel + self._pend
        if self._addr:
            _memmove(self._addr + 8 * pos, self._addr + 8 * (head - hold), 8 * hold)  # overlap-safe
        else:
            self._buf[pos : pos + hold] = self._buf[head - hold : head].clone()
        self._pend += hold
        self._hold = 0

    def _mark_allocated(self, units: Tensor) -> None:
        assert self._allocated is not None
        if self._snaps:
            self._materialize()
        self._allocated.index_fill_(0, units, 1)

    def _mark_taken(self, start: int, k: int) -> None:
        """Checked mode: mark the ``k`` units just taken at ``buf[start:]`` allocated (a Python loop over the
        host map for a few, where one ``index_fill_`` costs ~2 us)."""
        amap = self._amap
        if amap is not None and k <= 32 and self._arr is not None:
            if self._snaps:
                self._materialize()
            for unit in self._arr[start : start + k]:
                amap[unit] = 1
        else:
            self._mark_allocated(self._buf[start : start + k])

    def _as_index(self, t: Tensor) -> Tensor:
        """1-D int64 on ``device`` (copies only when it must)."""
        if t.dtype is _I64 and (t.is_cpu if self._cpu else t.device == self.device):
            return t if t.dim() == 1 else t.reshape(-1)
        dtype = t.dtype
        if dtype.is_floating_point or dtype.is_complex or dtype is torch.bool:
            raise AllocatorError(f"{self._kind} ids and lengths are integers; got a {dtype} tensor; nothing changed")
        try:
            return t.to(device=self.device, dtype=_I64).reshape(-1)
        except (RuntimeError, NotImplementedError) as exc:  # e.g. a meta tensor: no data to copy
            raise AllocatorError(
                f"cannot read a {dtype} tensor on {t.device} as {self._kind} ids on {self.device} ({exc}); "
                "nothing changed"
            ) from None

    def _release(self, units: Tensor, *, validated: bool = False) -> None:
        """Give back distinct ``units`` (1-D int64 on ``device``), checked unless ``validated``."""
        m = units.numel()
        if not m:
            return
        if not validated:
            if self._allocated is not None:
                if m > self._head - self._rel - self._pend - self._hold:  # the map's error first, then the count's
                    self._check_release(units)
                    self._check_count(m)
                self._claim(units)  # checked and marked freed in one pass
            else:
                self._check_range(units)
        elif self._allocated is not None:
            self._mark_freed(units)
        pos = self._park(m)
        if self._addr and units.is_cpu and units.is_contiguous():
            _memmove(self._addr + 8 * pos, units.data_ptr(), 8 * m)
        else:
            self._buf[pos : pos + m] = units

    def _release_ints(self, units: list[int]) -> None:
        """``_release`` for distinct Python ints on the CPU fast path (unchecked mode)."""
        mv = self._host_mv
        assert mv is not None
        if units:
            data = self._ints(units)
            pos = self._park(len(data))
            mv[pos : pos + len(data)] = data

    def _park(self, m: int) -> int:
        """Make room for ``m`` freed units and return their buffer offset: the
        pending region inside a group, the release region with ``need_sort``,
        else just before ``head``.  The caller writes them there."""
        rel, pend, head = self._rel, self._pend, self._head
        if m > head - rel - pend - self._hold:
            self._check_count(m)
        if self._snaps:
            self._materialize()
        if self._in_group:
            self._pend = pend + m
            return rel + pend
        if self.need_sort:
            self._rel = rel + m
            return rel
        self._head = head - m
        return head - m

    def _check_release(self, units: Tensor) -> None:
        """Checked mode: refuse out-of-range, padding, unallocated or repeated
        units before anything changes, naming them (the map is left as it was)."""
        self._claim(units)
        self._unclaim(units)

    def _claim(self, units: Tensor) -> None:
        """Checked mode: mark ``units`` freed in the map if each is allocated and given once, else raise
        ``AllocatorError`` naming them, the map as it was.

        One pass, three ops however many units: one count off each unit's entry (``index_add_``, whose bounds
        check is the range check on CPU; an accelerator checks the range with an ``aminmax`` first), then
        every entry touched must read 0 (a gather and an ``aminmax``): an entry left at -1 was free, one at
        1 - k was given k times.  (int16 entries: a unit repeated 65,537 times would
        wrap to 0, so frees of more units than that sort them instead.)
        """
        alloc = self._allocated
        assert alloc is not None
        m = units.numel()
        if m > _CLAIM_MAX:
            self._check_range(units)
            self._check_repeats(units)
        if self._snaps:
            self._materialize()
        if units.is_cpu:
            try:  # on CPU index_add_'s own bounds check is the range check (it stops at the first bad id)
                alloc.index_add_(0, units, self._claim_one[1].expand(m))
            except (IndexError, RuntimeError):
                alloc.copy_(self._census())  # undo the partial add: the map again from the free lists
                self._check_range(units)  # raises, naming the foreign ids
                raise
        else:  # on an accelerator a bad index is an asynchronous device assert: the range first
            self._check_range(units)
            alloc.index_add_(0, units, self._claim_one[1].expand(m))
        left = alloc.index_select(0, units)
        if left.is_cpu:
            torch.aminmax(left, out=self._left_out)
            lo, hi = self._left
        else:  # one device -> host transfer for both
            lo, hi = torch.stack(torch.aminmax(left)).tolist()
        if lo or hi:
            alloc.index_add_(0, units, self._claim_one[0].expand(m))
            self._check_range(units)  # the padding unit 0 is in the map: named as padding
            not_live = alloc.index_select(0, units) == 0
            if bool(not_live.any()):
                raise AllocatorError(
                    f"double free or free of never-allocated {self._describe(units[not_live])}; nothing was freed"
                )
            self._check_repeats(units)

    def _unclaim(self, units: Tensor) -> None:
        """Undo a ``_claim`` of ``units`` (a later check refused the free)."""
        assert self._allocated is not None
        self._allocated.index_add_(0, units, self._claim_one[0].expand(units.numel()))

    def _check_repeats(self, units: Tensor) -> None:
        if units.numel() > 1:
            srt = units.sort().values
            dup = srt[1:] == srt[:-1]
            if bool(dup.any()):
                raise AllocatorError(f"{self._describe(srt[1:][dup])} appear(s) twice in one free; nothing was freed")

    def _mark_freed(self, units: Tensor) -> None:
        assert self._allocated is not None
        if self._snaps:
            self._materialize()
        self._allocated.index_fill_(0, units, 0)

    def _describe(self, units: Tensor) -> str:
        """Name offending units in an error message (first 8)."""
        return f"{self._kind}(s) {units[:8].tolist()}"
