"""The SWA allocator's per-request ring mode (SGLang 0.5.23's ``SWATokenToKVPoolAllocator`` with a
``swa_req_ring_size``; ``srt/mem_cache/allocator/swa.py`` lines 128-170, 222-229, 285-330, 375-386, 495-550 and
``is_swa_req_ring`` line 878).

Where a pool keeps its SWA rows in a fixed ring per request slot (``kvcache.swa_req_ring_size`` is set: the
DeepSeek-V4 HIP unified-KV pool, a DSpark draft's SWA ring), SGLang's SWA allocator stops paging SWA slots:

* ``alloc`` / ``alloc_extend`` / ``alloc_extend_swa_tail`` / ``alloc_decode`` take full slots only and leave
  ``full_to_swa_index_mapping`` unwritten, so every SWA free is a no-op (nothing is mapped);
* the SWA capacity is the ring total: ``size_swa = free request slots x ring cost`` at construction, where the
  ring cost is the ring rounded up to whole pages, ``ceil(ring / page) x page`` (``swa_ring_cost_tokens``);
  ``swa_available_size`` is the free request slots times that cost, ``available_size`` the full side's alone
  (the ring never limits token growth);
* the paged SWA sub-allocator is still built, of the configurator's ``size_swa`` (SGLang's "vestigial" pool),
  so its free list keeps its bytes.

ref-000's ``configure`` (lines 377-387) then reports ``swa_max_total_num_tokens = alloc.size_swa`` for a target
whose allocator is in ring mode (:func:`is_swa_req_ring`).
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator, check_token_decode, check_token_extend
from kvpools_core.errors import AllocatorError

__all__ = ["RequestSlots", "SWARingTokenToKVPoolAllocator", "is_swa_req_ring", "ring_cost_tokens"]


class RequestSlots(Protocol):
    """What ring mode reads of the request table: its free rows (``ReqToTokenPool.available_size``)."""

    def available_size(self) -> int: ...


def ring_cost_tokens(ring_size: int, page_size: int) -> int:
    """``_swa_ring_cost``: a request's ring in whole pages."""
    return (ring_size + page_size - 1) // page_size * page_size


class SWARingTokenToKVPoolAllocator(SWATokenToKVPoolAllocator):
    """``SWATokenToKVPoolAllocator`` in per-request ring mode: full slots paged, SWA rows owned by request slots.

    ``ring_size`` defaults to ``kvcache.swa_req_ring_size`` (as SGLang reads it); ``req_to_token_pool`` is
    required, as SGLang asserts ("per-request SWA ring: capacity is counted in req slots").
    """

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int = 1,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        kvcache: object = None,
        need_sort: bool = False,
        *,
        req_to_token_pool: RequestSlots | None,
        ring_size: int | None = None,
        mapping: Tensor | None = None,
        checked: bool = False,
        index_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(
            size,
            size_swa,
            page_size,
            dtype,
            device,
            kvcache,
            need_sort,
            mapping=mapping,
            checked=checked,
            index_dtype=index_dtype,
        )
        ring = ring_size if ring_size is not None else getattr(kvcache, "swa_req_ring_size", None)
        if ring is None or int(ring) <= 0:
            raise AllocatorError(
                f"per-request SWA ring mode needs a positive ring size (ring_size or kvcache.swa_req_ring_size); "
                f"got {ring!r}"
            )
        if req_to_token_pool is None:
            raise AllocatorError("per-request SWA ring: capacity is counted in req slots; pass req_to_token_pool")
        self._req_to_token_pool = req_to_token_pool
        self._swa_ring_cost = ring_cost_tokens(int(ring), page_size)
        self._ring_size_swa = req_to_token_pool.available_size() * self._swa_ring_cost

    def bind_req_to_token_pool(self, req_to_token_pool: RequestSlots) -> None:
        """Count free request slots from ``req_to_token_pool`` from now on (a build hook that gets no table made
        the allocator with a stand-in); ``size_swa`` stays what the allocator counted at construction."""
        self._req_to_token_pool = req_to_token_pool

    # ------------------------------------------------------------------ sizes
    @property
    def swa_req_ring(self) -> bool:
        return True

    @property
    def swa_ring_cost_tokens(self) -> int:
        return self._swa_ring_cost

    @property
    def size_swa(self) -> int:
        """Every request slot's ring, counted when the allocator was made (all slots free)."""
        return self._ring_size_swa

    def available_size(self) -> int:
        """The full side's: a ring is pre-allocated per slot and never limits token growth."""
        return self.full_available_size()

    def swa_available_size(self) -> int:
        return self._req_to_token_pool.available_size() * self._swa_ring_cost

    # ------------------------------------------------------------- allocation
    def alloc(self, need_size: int) -> Tensor | None:
        return self.full_attn_allocator.alloc(need_size)

    def alloc_extend(
        self,
        prefix_lens: Tensor,
        seq_lens: Tensor,
        last_loc: Tensor,
        extend_num_tokens: int,
        *,
        num_new_pages: int | None = None,
    ) -> Tensor | None:
        """Full slots only; the mapping stays unwritten."""
        if self.page_size == 1:
            lens = (prefix_lens, seq_lens, last_loc)
            check_token_extend(self.full_attn_allocator, *lens, extend_num_tokens, num_new_pages, self.checked)
            return self.alloc(extend_num_tokens)
        return self.full_attn_allocator.alloc_extend(
            prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages=num_new_pages
        )

    def alloc_extend_swa_tail(
        self,
        prefix_lens: Tensor,
        seq_lens: Tensor,
        last_loc: Tensor,
        extend_num_tokens: int,
        swa_tail_len: int,
        *,
        num_new_pages: int | None = None,
    ) -> Tensor | None:
        """As :meth:`alloc_extend`: the ring holds the tail, so only full slots are taken."""
        return self.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages=num_new_pages)

    def alloc_decode(self, seq_lens: Tensor, last_loc: Tensor, *, num_new_pages: int | None = None) -> Tensor | None:
        if self.page_size == 1:
            check_token_decode(self.full_attn_allocator, seq_lens, last_loc, num_new_pages, self.checked)
            return self.alloc(seq_lens.numel())
        return self.full_attn_allocator.alloc_decode(seq_lens, last_loc, num_new_pages=num_new_pages)


def is_swa_req_ring(allocator: object) -> bool:
    """SGLang's ``is_swa_req_ring``: an SWA allocator in per-request ring mode."""
    return isinstance(allocator, SWATokenToKVPoolAllocator) and bool(getattr(allocator, "swa_req_ring", False))
