"""HiSparse's allocator: SGLang 0.5.23's ``HiSparseTokenToKVPoolAllocator`` (``mem_cache/allocator/hisparse.py``).

Two paged allocators and one mapping: ``logical`` hands out the request's slots in the logical space of
``size x host_to_device_ratio`` slots (``size_full``: what the request table stores and
``ModelRunner.max_token_pool_size`` reports), ``device`` the ``size`` device slots (DSA's latent rows,
MiniMax-M3's sparse layers' K/V), and
``mapping`` (int64, ``size_full + page + 1`` entries, the last ``-1``) takes a logical slot to its device
slot (0: none).  ``alloc`` / ``alloc_extend`` take both and record the mapping; ``alloc_decode`` takes a
logical slot only (the coordinator maps it into the request's device buffer); ``free`` returns the
logical slots and the device slots they map to, and clears their mapping.  The allocators are the core's
(``TokenAllocator`` at page 1, else ``PagedAllocator``, as ``allocator_class`` picks), so their bytes are
what the plan charges for them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kvpools_core.allocators.paged import PagedAllocator
from kvpools_core.allocators.token import TokenAllocator
from kvpools_core.parts.hisparse import LOGICAL_ALLOCATOR_POOL, MAPPING_POOL

__all__ = ["HiSparseAllocator"]


class HiSparseAllocator:
    """Logical slots over ``size x ratio``, device slots over ``size``, and the int64 map between them."""

    def __init__(
        self,
        size: int,
        page_size: int,
        host_to_device_ratio: int,
        device: str | torch.device = "cpu",
        kvcache: object = None,
        need_sort: bool = False,
        *,
        checked: bool = False,
    ) -> None:
        kwargs: dict[str, Any] = {"device": device, "kvcache": kvcache, "need_sort": need_sort, "checked": checked}
        self.page_size = page_size
        self._size_full = size * host_to_device_ratio
        self._size_hisparse = size
        self._kvcache = kvcache
        self.logical: TokenAllocator | PagedAllocator
        self.device_allocator: TokenAllocator | PagedAllocator
        if page_size == 1:
            self.logical = TokenAllocator(self._size_full, **kwargs)
            self.device_allocator = TokenAllocator(size, **kwargs)
        else:
            self.logical = PagedAllocator(self._size_full, page_size, **kwargs)
            self.device_allocator = PagedAllocator(size, page_size, **kwargs)
        self.mapping = torch.zeros(self._size_full + page_size + 1, dtype=torch.int64, device=device)
        if self.mapping.device.type != "meta":
            self.mapping[-1] = -1  # a last_loc of -1 translates to -1

    @property
    def size(self) -> int:
        """SGLang's ``size``: the logical slots (``size_full``)."""
        return self._size_full

    @property
    def size_full(self) -> int:
        return self._size_full

    @property
    def size_hisparse(self) -> int:
        """The device slots (the latent rows the pool holds)."""
        return self._size_hisparse

    def get_kvcache(self) -> object:
        return self._kvcache

    def available_size(self) -> int:
        """Slots both allocators can still hand out."""
        return min(self.logical.available_size(), self.device_allocator.available_size())

    def alloc(self, need_size: int) -> Tensor | None:
        """Logical slots, each mapped to a device slot; None (nothing changes) when either side is short."""
        logical = self.logical.alloc(need_size)
        if logical is None:
            return None
        device_slots = self.device_allocator.alloc(need_size)
        if device_slots is None:
            self.logical.free(logical)
            return None
        self.mapping[logical.long()] = device_slots.long()
        return logical

    def alloc_extend(
        self, prefix_lens: Tensor, seq_lens: Tensor, last_loc: Tensor, extend_num_tokens: int
    ) -> Tensor | None:
        """Both allocators extend every request (the device side from the mapped last slots); None when short."""
        pages = self._new_pages(prefix_lens, seq_lens)
        if pages * self.page_size > self.available_size():
            return None
        logical = self.logical.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens)
        if logical is None:
            return None
        device_last = self.mapping[last_loc.long()]
        device_slots = self.device_allocator.alloc_extend(prefix_lens, seq_lens, device_last, len(logical))
        if device_slots is None:
            self.logical.free(logical)
            return None
        self.mapping[logical.long()] = device_slots.long()
        return logical

    def alloc_decode(self, seq_lens: Tensor, last_loc: Tensor) -> Tensor | None:
        """A logical slot per request only (SGLang: the coordinator places decode tokens in the device buffer)."""
        return self.logical.alloc_decode(seq_lens, last_loc)

    def free(self, indices: Tensor) -> None:
        """Return the logical slots, the device slots they map to (page 0 pads, never owned), clear the map."""
        if indices.numel() == 0:
            return
        indices = indices.long()
        self.logical.free(indices)
        device_slots = self.mapping[indices]
        self.device_allocator.free(device_slots[device_slots >= self.page_size])
        self.mapping[indices] = 0

    def clear(self) -> None:
        self.logical.clear()
        self.device_allocator.clear()
        self.mapping[:-1].fill_(0)

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_pool().values())

    def nbytes_by_pool(self) -> dict[str, int]:
        """The plan's ``logical_allocator``, ``allocator`` (device) and ``hisparse_mapping`` pools."""
        measured = dict(self.logical.nbytes_by_pool(LOGICAL_ALLOCATOR_POOL))
        measured.update(self.device_allocator.nbytes_by_pool("allocator"))
        measured[MAPPING_POOL] = self.mapping.numel() * self.mapping.element_size()
        return measured

    def _new_pages(self, prefix_lens: Tensor, seq_lens: Tensor) -> int:
        page = self.page_size
        return int(((seq_lens + page - 1) // page - (prefix_lens + page - 1) // page).sum())
