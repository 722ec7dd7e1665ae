"""Token-granular KV-slot allocator (page size 1), SGLang ``TokenToKVPoolAllocator`` semantics."""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from kvpools_core.allocators.base import BaseAllocator

__all__ = ["TokenAllocator"]

_I64 = torch.int64
_memmove = ctypes.memmove


class TokenAllocator(BaseAllocator):
    """Hands out any distinct KV slots from ``1..size`` (slot 0 is padding).

    ``alloc`` copies a slice of the preallocated free stack out, ``free``
    copies the slots back in: no reallocation, no device sync.  Freed slots
    are reused first (LIFO).
    """

    _kind = "slot"

    def __init__(
        self,
        size: int,
        *,
        device: str | torch.device = "cpu",
        need_sort: bool = False,
        debug: bool = False,
    ) -> None:
        super().__init__(size, 1, device=device, need_sort=need_sort, debug=debug)

    @classmethod
    def planned_nbytes(cls, size: int, page_size: int = 1, debug: bool = False) -> int:
        """``8 * size`` (the int64 free stack) ``+ (size + 1)`` in debug mode."""
        if page_size != 1:
            raise ValueError(f"TokenAllocator has page_size 1, got {page_size}")
        return super().planned_nbytes(size, 1, debug)

    def alloc(self, need_size: int) -> Tensor | None:
        """``need_size`` free slots as a new int64 tensor, or None (nothing changes)."""
        head = self._head
        end = head + need_size
        arr = self._host_arr
        if arr is not None and need_size > 0 and end <= self._n:
            self._head = end
            # the array slice is a private copy; the tensor shares (and keeps) it
            return torch.frombuffer(arr[head:end], dtype=_I64)
        if need_size <= 0:
            if need_size == 0:
                return self._buf.new_empty(0)
            raise ValueError(f"alloc() needs a non-negative size, got {need_size}")
        start = self._take(need_size)
        if start is None:
            return None
        # a copy: the stack region is overwritten by later frees
        out = self._buf[start : start + need_size].clone()
        if self._allocated is not None:
            self._mark_allocated(out)
        return out

    def free(self, indices: Tensor) -> None:
        """Return slots; inside a free group they come back at its end."""
        if self._host_arr is not None and indices.dtype is _I64 and indices.is_cpu and indices.is_contiguous():
            m = indices.numel()
            if m:  # one memmove into the stack, no torch op
                _memmove(self._addr + 8 * self._park(m), indices.data_ptr(), 8 * m)
        elif indices.numel():
            self._release(self._as_index(indices))
