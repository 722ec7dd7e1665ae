"""Token-granular KV-slot allocator (page size 1), SGLang ``TokenToKVPoolAllocator`` semantics."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch
from torch import Tensor

from kvpools_core.allocators.base import BaseAllocator
from kvpools_core.allocators.contract import check_segment_start
from kvpools_core.errors import AllocatorError

__all__ = ["TokenAllocator"]

_I64 = torch.int64
_memmove = ctypes.memmove
_aminmax = torch.aminmax
_PARK_MAX = 64
"""Frees inside a group of at most this many slots are checked when the group settles, not at the call."""


class TokenAllocator(BaseAllocator):
    """Hands out any distinct KV slots from ``1..size`` (slot 0 is padding).

    ``alloc`` copies a slice of the preallocated free stack out, ``free``
    copies the slots back in: no reallocation.  Freed slots are reused first
    (LIFO, where SGLang's reuses them last: see "Allocator contract" in
    ``docs/allocators.md``).  ``checked=True`` also keeps an "allocated" map that catches
    double frees (see ``base``).
    """

    _kind = "slot"

    def __init__(
        self,
        size: int,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        kvcache: object = None,
        need_sort: bool = False,
        *,
        checked: bool = False,
        debug: bool = False,
    ) -> None:
        """SGLang's ``TokenToKVPoolAllocator(size, dtype, device, kvcache, need_sort)``, plus ``checked``."""
        super().__init__(size, 1, dtype, device, kvcache, need_sort, checked=checked, debug=debug)

    @classmethod
    def planned_nbytes(cls, size: int, page_size: int = 1, checked: bool = False) -> int:
        """``8 * size`` (the int64 free stack) ``+ 2 * (size + 1)`` in checked mode."""
        if page_size != 1:
            raise ValueError(f"TokenAllocator has page_size 1, got {page_size}")
        return super().planned_nbytes(size, 1, checked)

    @property
    def free_pages(self) -> Tensor:
        """The free slots in the order ``alloc`` hands them out, released ones left out (SGLang's
        ``free_pages``; a copy).  The paged allocator's ``free_pages`` is its page API's free call."""
        return self._buf[self._head :].clone()

    def alloc(self, need_size: int) -> Tensor | None:
        """``need_size`` free slots as a new int64 tensor, or None (nothing changes)."""
        head = self._head
        end = head + need_size
        arr = self._host_arr
        if arr is not None and need_size > 0 and end <= self._n and not self._hold:
            self._head = end
            # the array slice is a private copy; the tensor shares (and keeps) it
            return torch.frombuffer(arr[head:end], dtype=_I64)
        checked_host = self._allocated is not None and self._refs is None and self._arr is not None
        if checked_host and need_size > 0 and end <= self._n and not self._hold:  # the same copy, one index_fill_
            assert self._arr is not None
            self._head = end
            out = torch.frombuffer(self._arr[head:end], dtype=_I64)
            if need_size <= 32:  # a few: the host map by Python ints, no torch op
                self._mark_taken(head, need_size)
            else:
                self._mark_allocated(out)
            return out
        if need_size <= 0:
            if need_size == 0:
                return self._buf.new_empty(0)
            raise AllocatorError(f"alloc() needs a non-negative size, got {need_size}; nothing was allocated")
        start = self._take(need_size)
        if start is None:
            return None
        # a copy: the stack region is overwritten by later frees
        out = self._buf[start : start + need_size].clone()
        if self._allocated is not None:
            self._mark_allocated(out)
        return out

    def free(self, indices: Tensor | Sequence[int]) -> None:
        """Return slots; inside a free group they come back at its end.

        ``indices``: an integer tensor (any shape), or a list / tuple of ints.
        Refused with ``AllocatorError``, changing nothing: ids outside
        ``1..size``, non-integer ids, more slots than are allocated, and in
        checked mode slots not allocated now or repeated.
        """
        if isinstance(indices, Tensor) and indices.dtype is _I64 and indices.is_cpu and indices.is_contiguous():
            m = indices.numel()
            if not m:
                return
            if self._in_group and m <= _PARK_MAX and self._addr and self._refs is None:
                # a few slots (a decode step's): parked with the count checked; the range (and the map) once,
                # when the group settles.  A larger free is checked at the call: its check is a small share of it,
                # and on the shared trace replay parking them measured slower (benchmarks/README.md)
                rel, pend = self._rel, self._pend
                if m > self._head - rel - pend - self._hold:  # the range's (or the map's) error, then the count's
                    if self._allocated is not None:
                        self._check_release(indices.view(-1))
                    else:
                        self._check_range(indices.view(-1))
                    self._check_count(m)
                if self._snaps:
                    self._materialize()
                _memmove(self._addr + 8 * (rel + pend), indices.data_ptr(), 8 * m)
                self._pend = pend + m
                self._deferred.append((pend, m))
                return
            if self._host_arr is not None:  # one aminmax for the range, one memmove into the stack
                _aminmax(indices, out=self._minmax_out)
                lo, hi = self._minmax
                if lo < 1 or hi > self._n:
                    raise self._range_error(indices.view(-1))
                # _park, inlined: this is the hot path of a scheduler's frees
                rel, pend, head, hold = self._rel, self._pend, self._head, self._hold
                if m > head - rel - pend - hold:
                    self._check_count(m)
                if self._snaps:
                    self._materialize()
                if self._in_group:  # checked now, usable at the group's end (SGLang's free_group)
                    if self.need_sort:
                        pos = rel + pend
                        self._pend = pend + m
                    else:  # held just below head: free_group_end moves head over them, no second copy
                        pos = head - hold - m
                        self._hold = hold + m
                elif self.need_sort:
                    pos = rel
                    self._rel = rel + m
                else:
                    pos = self._head = head - m
                _memmove(self._addr + 8 * pos, indices.data_ptr(), 8 * m)
                return
            if self._allocated is not None and self._refs is None and self._addr:
                self._free_checked_host(indices.view(-1))
                return
        units = self.to_ids(indices)
        if units.numel():
            if self._refs is not None:
                self._free_counted(units)
            else:
                self._release(units)

    def _free_checked_host(self, units: Tensor) -> None:
        """Checked mode's ``free`` of int64 CPU slots outside a group: ``_release``'s checks and writes without
        its layers (the range, the count, one claim of the map; then one ``memmove`` into the stack)."""
        m = units.numel()
        if not m:
            return
        rel, pend, head, hold = self._rel, self._pend, self._head, self._hold
        if m > head - rel - pend - hold:  # the map's own error first, then the count's
            self._check_release(units)
            self._check_count(m)
        self._claim(units)
        if self._in_group and not self.need_sort:  # held just below head until the group's end
            pos = head - hold - m
            self._hold = hold + m
        elif self._in_group:  # usable at the group's end
            pos = rel + pend
            self._pend = pend + m
        elif self.need_sort:
            pos = rel
            self._rel = rel + m
        else:
            pos = self._head = head - m
        _memmove(self._addr + 8 * pos, units.data_ptr(), 8 * m)

    def free_page_ids(self, page_ids: Tensor | Sequence[int]) -> None:
        """SGLang's ``free_page_ids``: at page size 1 page ids are slot ids, so ``free``."""
        self.free(page_ids)

    def free_segment(self, free_index: Tensor | Sequence[int], *, start_pos: int) -> None:
        """SGLang's ``free_segment``: ``free`` (every ``start_pos >= 0`` starts a page of one slot)."""
        if type(start_pos) is not int or start_pos < 0:
            check_segment_start(start_pos, 1, "free_segment")
        self.free(free_index)
