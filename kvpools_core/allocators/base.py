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

On a CPU device the buffer is an ``array('q')`` shared with a torch tensor:
Python-int page calls index it directly and index tensors are copied in and
out with one ``memmove`` -- a torch op costs ~2-5 us here, which would
dominate these O(1) operations.  Other devices use plain tensor ops.
"""

from __future__ import annotations

import array
import ctypes
import weakref
from typing import ClassVar

import torch
from torch import Tensor

from kvpools_core.allocators.sizes import check_geometry, free_stack_nbytes

__all__ = ["AllocatorState", "BaseAllocator"]

_I64 = torch.int64
_memmove = ctypes.memmove


class AllocatorState:
    """Opaque snapshot returned by ``backup_state()``.

    Copy-on-write: taking it copies nothing; the first later write to the
    allocator's buffers (a free, a merge, debug bookkeeping) copies them into
    the snapshot.  The common pattern -- backup, speculative allocations,
    restore -- therefore costs O(1); a snapshot that outlives a write holds
    one copy of the free stack (``planned_nbytes``), as SGLang's backup holds
    its old free list.
    """

    __slots__ = ("__weakref__", "_allocated", "_buf", "_counters", "_owner", "_pending")

    def __init__(
        self,
        owner: object,
        counters: tuple[int, int, int, bool],
        pending: tuple[tuple[Tensor, ...], tuple[bytes, ...]],
    ) -> None:
        self._owner = owner
        self._counters = counters
        self._pending = pending
        self._buf: Tensor | None = None
        self._allocated: Tensor | None = None


class BaseAllocator:
    """Free-unit bookkeeping common to ``TokenAllocator`` and ``PagedAllocator``."""

    _kind: ClassVar[str] = "unit"

    def __init__(
        self,
        size: int,
        page_size: int,
        *,
        device: str | torch.device = "cpu",
        need_sort: bool = False,
        debug: bool = False,
    ) -> None:
        check_geometry(size, page_size)
        self.size = size
        self.page_size = page_size
        self.num_pages = n = size // page_size
        self.need_sort = need_sort
        self.debug = debug
        self._n = n
        self._token = object()  # identifies snapshots taken from this instance
        self._snaps: list[weakref.ref[AllocatorState]] = []
        self._arr: array.array[int] | None = None
        self._mv: memoryview | None = None
        self._addr = 0
        if torch.device(device).type == "cpu":
            self._arr = array.array("q", [0]) * n
            self._mv = memoryview(self._arr)
            self._buf = torch.frombuffer(self._arr, dtype=_I64)
            self._addr = self._buf.data_ptr()
        else:
            self._buf = torch.empty(n, dtype=_I64, device=device)
        self.device = self._buf.device  # normalised ("cuda" -> "cuda:0")
        self._cpu = self.device.type == "cpu"
        # Python-int fast paths; debug keeps every call on the checked path
        self._host_arr = None if debug else self._arr
        self._host_mv = None if debug else self._mv
        self._allocated: Tensor | None = None
        if debug:
            self._allocated = torch.zeros(n + 1, dtype=torch.bool, device=self.device)
        self._head = 0
        self._rel = 0
        self._pend = 0
        self._in_group = False
        # paged: what frees inside a group left for free_group_end (page-id tensors,
        # or byte copies of slot tensors on the host path)
        self._pending: list[Tensor] = []
        self._pending_bytes: list[bytes] = []
        self.clear()

    # ------------------------------------------------------------------ sizes
    @classmethod
    def planned_nbytes(cls, size: int, page_size: int, debug: bool = False) -> int:
        """Bytes of every tensor the allocator holds: the int64 free stack
        (one entry per unit) plus, in debug mode, a bool "allocated" map."""
        return free_stack_nbytes(size, page_size, debug)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors actually held (equals ``planned_nbytes``)."""
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def available_size(self) -> int:
        """Free slots (released units count: they are merged on demand)."""
        return (self._n - self._head + self._rel) * self.page_size

    # ------------------------------------------------------------ free groups
    def free_group_begin(self) -> None:
        """Defer frees until ``free_group_end`` (one scheduler step's frees)."""
        if self._in_group:
            raise RuntimeError("free_group_begin() called twice without free_group_end()")
        self._in_group = True

    def free_group_end(self) -> None:
        """Make the group's frees available (or released, with ``need_sort``)."""
        if not self._in_group:
            raise RuntimeError("free_group_end() called without free_group_begin()")
        self._in_group = False
        pend = self._pend
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
        """Snapshot for an exact ``restore_state`` (copy-on-write, O(1))."""
        state = AllocatorState(
            self._token,
            (self._head, self._rel, self._pend, self._in_group),
            (tuple(self._pending), tuple(self._pending_bytes)),
        )
        if len(self._snaps) >= 8:
            self._snaps = [r for r in self._snaps if r() is not None]
        self._snaps.append(weakref.ref(state))
        return state

    def restore_state(self, state: AllocatorState) -> None:
        """Return exactly to the state of ``backup_state()``."""
        if state._owner is not self._token:
            raise ValueError("restore_state() got a state taken from a different allocator")
        if state._buf is not None:
            # the buffers changed since the backup: copy its contents back
            if self._snaps:
                self._materialize()
            self._buf.copy_(state._buf)
            if self._allocated is not None and state._allocated is not None:
                self._allocated.copy_(state._allocated)
        self._head, self._rel, self._pend, self._in_group = state._counters
        self._pending = list(state._pending[0])
        self._pending_bytes = list(state._pending[1])

    def clear(self) -> None:
        """Everything free again; units handed out first in ascending order."""
        if self._snaps:
            self._materialize()
        torch.arange(1, self._n + 1, dtype=_I64, device=self.device, out=self._buf)
        if self._allocated is not None:
            self._allocated.zero_()
        self._head = self._rel = self._pend = 0
        self._in_group = False
        self._pending = []
        self._pending_bytes = []

    # --------------------------------------------------------------- helpers
    def _tensors(self) -> list[Tensor]:
        out = [self._buf]
        if self._allocated is not None:
            out.append(self._allocated)
        return out

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
        head = self._head
        if k > self._n - head:
            if k > self._n - head + self._rel:
                return None
            self.merge_and_sort_free()
            head = self._head
        self._head = head + k
        return head

    def _mark_allocated(self, units: Tensor) -> None:
        assert self._allocated is not None
        if self._snaps:
            self._materialize()
        self._allocated[units] = True

    def _as_index(self, t: Tensor) -> Tensor:
        """1-D int64 on ``device`` (copies only when it must)."""
        if t.dtype is _I64 and (t.is_cpu if self._cpu else t.device == self.device):
            return t if t.dim() == 1 else t.reshape(-1)
        return t.to(device=self.device, dtype=_I64).reshape(-1)

    def _release(self, units: Tensor, *, checked: bool = False) -> None:
        """Give back distinct ``units`` (1-D int64 on ``device``)."""
        m = units.numel()
        if not m:
            return
        if self._allocated is not None and not checked:
            self._check_release(units)
        pos = self._park(m)
        if self._allocated is not None:
            self._allocated[units] = False
        if self._addr and units.is_cpu and units.is_contiguous():
            _memmove(self._addr + 8 * pos, units.data_ptr(), 8 * m)
        else:
            self._buf[pos : pos + m] = units

    def _release_ints(self, units: list[int]) -> None:
        """``_release`` for distinct Python ints on the CPU fast path (no debug)."""
        mv = self._host_mv
        assert mv is not None
        if units:
            pos = self._park(len(units))
            mv[pos : pos + len(units)] = array.array("q", units)

    def _park(self, m: int) -> int:
        """Make room for ``m`` freed units and return their buffer offset: the
        pending region inside a group, the release region with ``need_sort``,
        else just before ``head``.  The caller writes them there."""
        rel, pend, head = self._rel, self._pend, self._head
        if m > head - rel - pend:
            raise ValueError(
                f"free of {m} {self._kind}s but only {head - rel - pend} are allocated; "
                "a double free? (construct the allocator with debug=True to find it)"
            )
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
        """Debug: reject out-of-range, padding, unallocated or repeated units
        before anything changes, naming them."""
        assert self._allocated is not None
        bad_range = (units < 1) | (units > self._n)
        if bool(bad_range.any()):
            raise ValueError(
                f"free of foreign {self._describe(units[bad_range])}: valid {self._kind} ids are "
                f"1..{self._n} ({self._kind} 0 is padding and never allocated)"
            )
        not_live = ~self._allocated[units]
        if bool(not_live.any()):
            raise ValueError(f"double free or free of never-allocated {self._describe(units[not_live])}")
        if units.numel() > 1:
            srt = units.sort().values
            dup = srt[1:] == srt[:-1]
            if bool(dup.any()):
                raise ValueError(f"{self._describe(srt[1:][dup])} appear(s) twice in one free")

    def _describe(self, units: Tensor) -> str:
        """Name offending units in an error message (first 8)."""
        return f"{self._kind}(s) {units[:8].tolist()}"
