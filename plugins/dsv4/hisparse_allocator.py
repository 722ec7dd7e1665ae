"""SGLang 0.5.23's ``DeepSeekV4HiSparseTokenToKVPoolAllocator`` (``mem_cache/allocator/hisparse.py``), built.

It wraps the DeepSeek-V4 SWA allocator (the *logical* allocator: full slots, SWA slots, the full-to-SWA mapping)
and adds the c4 device side: a paged allocator over the ``c4_max_total_num_tokens`` rows of the HiSparse c4
device pool, paged by ``P // 4``, and an int64 ``mapping`` from a c4 *logical* slot (``full slot // 4``; there are
``c4_logical_size = c128 tokens x 32`` of them) to its device row (0: none; the last entry ``-1``).

* ``alloc_extend``: refuses (None, nothing taken) when either side lacks the pages (SGLang's two checks:
  full pages of ``P``, and c4 pages of ``P // 4`` for ``seq // 4 - prefix // 4`` compressed positions), then
  extends the logical allocator, keeps the full slots that complete a group of 4 (``(slot + 1) % 4 == 0``,
  ``translate_loc_from_full_to_compressed``), and gives each of their c4 slots ``slot // 4`` a device row;
* ``alloc_decode``: logical slots only (the HiSparse coordinator places decode rows in its device buffer);
* ``free``: the logical slots, then the device rows their c4 slots map to (page 0 pads, never owned), and the
  mapping cleared;
* ``available_size`` / ``full_available_size``: ``min(logical, device rows x 4)``.

:mod:`.hisparse` plans its bytes (``c4_hisparse_allocator``, ``c4_hisparse_mapping``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvpools_core.allocators.paged import PagedAllocator
from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator

from .hisparse import C4_HISPARSE_ALLOCATOR, C4_HISPARSE_MAPPING, c4_device_rows, c4_page, hisparse_mapping_entries

__all__ = ["DSV4HiSparseAllocator"]

COMPRESS_RATIO = 4


class DSV4HiSparseAllocator:
    """The logical DSV4 SWA allocator plus the HiSparse c4 device allocator and its int64 mapping."""

    compress_ratio = COMPRESS_RATIO

    def __init__(
        self,
        logical: SWATokenToKVPoolAllocator,
        c4_tokens: int,
        c128_tokens: int,
        *,
        checked: bool = False,
    ) -> None:
        self.logical_attn_allocator = logical
        self.page_size = logical.page_size
        self.hisparse_page_size = c4_page(self.page_size)
        device = logical.device
        self.hisparse_attn_allocator = PagedAllocator(
            c4_device_rows(c4_tokens, self.page_size),
            self.hisparse_page_size,
            device=device,
            need_sort=logical.need_sort,
            checked=checked,
        )
        entries = hisparse_mapping_entries(c128_tokens, self.page_size)
        self.full_to_hisparse_device_index_mapping = torch.zeros(entries, dtype=torch.int64, device=device)
        if self.full_to_hisparse_device_index_mapping.device.type != "meta":
            self.full_to_hisparse_device_index_mapping[-1] = -1  # a last_loc of -1 translates to -1

    # -- sizes ---------------------------------------------------------------

    @property
    def size(self) -> int:
        return self.logical_attn_allocator.size

    @property
    def size_full(self) -> int:
        return self.logical_attn_allocator.size_full

    @property
    def size_swa(self) -> int:
        return self.logical_attn_allocator.size_swa

    @property
    def full_to_swa_index_mapping(self) -> Tensor:
        return self.logical_attn_allocator.full_to_swa_index_mapping

    def available_size(self) -> int:
        return min(
            self.logical_attn_allocator.available_size(),
            self.hisparse_attn_allocator.available_size() * COMPRESS_RATIO,
        )

    def full_available_size(self) -> int:
        return min(
            self.logical_attn_allocator.full_available_size(),
            self.hisparse_attn_allocator.available_size() * COMPRESS_RATIO,
        )

    def swa_available_size(self) -> int:
        return self.logical_attn_allocator.swa_available_size()

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_pool().values())

    def nbytes_by_pool(self) -> dict[str, int]:
        """The logical allocator's pools, ``c4_hisparse_allocator`` and ``c4_hisparse_mapping``."""
        measured = dict(self.logical_attn_allocator.nbytes_by_pool())
        measured.update(self.hisparse_attn_allocator.nbytes_by_pool(C4_HISPARSE_ALLOCATOR))
        mapping = self.full_to_hisparse_device_index_mapping
        measured[C4_HISPARSE_MAPPING] = mapping.numel() * mapping.element_size()
        return measured

    # -- allocation ------------------------------------------------------------

    def translate_loc_from_full_to_compressed(self, full: Tensor) -> Tensor:
        """The c4 slots of the full slots that complete a group of 4 (``HiSparseC4DevicePool``)."""
        full = full.long()
        return full[(full + 1) % COMPRESS_RATIO == 0] // COMPRESS_RATIO

    def get_last_loc_compressed(self, last_loc: Tensor) -> Tensor:
        """The last complete c4 slot of a prefix ending at ``last_loc`` (-1 stays -1)."""
        return (last_loc.long() - (COMPRESS_RATIO - 1)) // COMPRESS_RATIO

    def alloc_extend(
        self, prefix_lens: Tensor, seq_lens: Tensor, last_loc: Tensor, extend_num_tokens: int
    ) -> Tensor | None:
        p, hp = self.page_size, self.hisparse_page_size
        pre, seq = prefix_lens.long(), seq_lens.long()
        full_pages = int(((seq + p - 1) // p - (pre + p - 1) // p).sum())
        cpre, cseq = pre // COMPRESS_RATIO, seq // COMPRESS_RATIO
        c4_pages = int(((cseq + hp - 1) // hp - (cpre + hp - 1) // hp).sum())
        if full_pages > self.logical_attn_allocator.available_size() // p:
            return None
        if c4_pages > self.hisparse_attn_allocator.available_size() // hp:
            return None
        logical = self.logical_attn_allocator.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens)
        if logical is None:
            return None
        compressed = self.translate_loc_from_full_to_compressed(logical)
        mapping = self.full_to_hisparse_device_index_mapping
        device_last = mapping[self.get_last_loc_compressed(last_loc)]
        rows = self.hisparse_attn_allocator.alloc_extend(cpre, cseq, device_last, len(compressed))
        assert rows is not None, "Hisparse allocation failed in alloc_extend"  # both sides were checked
        mapping[compressed] = rows.long()
        return logical

    def alloc_decode(self, seq_lens: Tensor, last_loc: Tensor) -> Tensor | None:
        return self.logical_attn_allocator.alloc_decode(seq_lens, last_loc)

    def free(self, indices: Tensor) -> None:
        if indices.numel() == 0:
            return
        self.logical_attn_allocator.free(indices)
        compressed = self.translate_loc_from_full_to_compressed(indices)
        mapping = self.full_to_hisparse_device_index_mapping
        rows = mapping[compressed]
        rows = rows[rows >= self.hisparse_page_size]
        if rows.numel():
            self.hisparse_attn_allocator.free(rows)
        mapping[compressed] = 0

    def free_swa(self, indices: Tensor) -> None:
        self.logical_attn_allocator.free_swa(indices)

    def clear(self) -> None:
        self.logical_attn_allocator.clear()
        self.hisparse_attn_allocator.clear()
        self.full_to_hisparse_device_index_mapping[:-1].fill_(0)
