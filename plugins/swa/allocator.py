"""Slot allocators of the SWA pools, composed from the core's token / paged allocators.

:class:`SWATokenToKVPoolAllocator` (SGLang's of the same name; it lives in
:mod:`kvpools_core.allocators.swa`, shared with DeepSeek-V4's pool) hands every
new token a slot in the full pool *and* one in the SWA pool, and records the
pair in the pool's ``full_to_swa_index_mapping``; callers see full slot ids
only.  ``free_swa`` gives back the SWA slots of tokens that slid out of the
window (their full slots stay); ``free`` gives back both.  With ``page_size >
1`` both sub-allocators run the same page-granular calls with the same
lengths, so a full page and its SWA page hold the same positions at the same
offsets: a full page maps to exactly one SWA page, and ``free_swa`` frees
whole SWA pages.  :class:`PureSWAAllocator` serves a model whose every layer
slides: one allocator over the SWA pool, whose slot ids are the token ids.

Caller contract (as SGLang's): ``free_swa`` never frees the page holding a
request's last token while the request still extends it (with ``checked=True``
an extend from an evicted page is refused).

Frees are checked as the core allocators check theirs, before the mapping or
either pool changes (``AllocatorError``, nothing changed): full slot ids out of
range always, and with ``checked=True`` full slots not allocated now; ``free_full``
of slots still mapped to SWA slots is refused in every mode.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from kvpools_core.allocators import AllocatorState, TokenAllocator
from kvpools_core.allocators.contract import page_disjoint_segments
from kvpools_core.allocators.factory import slot_index_dtype
from kvpools_core.allocators.swa import (
    SWAState,
    SWATokenToKVPoolAllocator,
    check_token_decode,
    check_token_extend,
    sub_allocator,
)
from kvpools_core.values import Plan

__all__ = ["PureSWAAllocator", "SWAState", "SWATokenToKVPoolAllocator", "allocator_for_plan"]

_I64 = torch.int64


def allocator_for_plan(
    plan: Plan, pool: object, device: str | torch.device, *, checked: bool = False
) -> SWATokenToKVPoolAllocator | PureSWAAllocator:
    """The allocator of a plan's SWA pool (``pool`` is its :class:`~.pool.SWAKVPool`).

    The SWA sub-allocator pages the SWA pool as SGLang's does
    (``size_swa // page_size`` pages); ``need_sort`` is on in PD disaggregation.
    ``checked`` builds both sub-allocators in checked mode (double frees refused).
    """
    config = plan.sizing.sglang_config
    page = plan.serving.page_size
    need_sort = plan.serving.disaggregation_mode in ("prefill", "decode")
    swa = int(config["swa_max_total_num_tokens"]) // page * page
    mapping = getattr(pool, "full_to_swa_index_mapping", None)
    if mapping is None:
        return PureSWAAllocator(swa, page, device=device, need_sort=need_sort, checked=checked, kvcache=pool)
    full = int(config["full_max_total_num_tokens"])
    return SWATokenToKVPoolAllocator(
        full,
        swa,
        page,
        mapping=mapping,
        kvcache=pool,
        device=device,
        need_sort=need_sort,
        checked=checked,
        index_dtype=slot_index_dtype(plan),
    )


class PureSWAAllocator:
    """Every layer slides: one allocator over the SWA pool; slot ids are token ids (no mapping)."""

    def __init__(
        self,
        size_swa: int,
        page_size: int = 1,
        *,
        device: str | torch.device = "cpu",
        need_sort: bool = False,
        checked: bool = False,
        debug: bool = False,
        kvcache: object = None,
    ) -> None:
        self.page_size = page_size
        self.checked = checked = checked or debug  # ``debug`` is the old name of checked mode
        # slot ids are the SWA store's rows: the one allocator holds the whole pool (its host copies go through it)
        self.swa_attn_allocator = sub_allocator(size_swa, page_size, device, need_sort, checked, kvcache=kvcache)
        self.full_attn_allocator = self.swa_attn_allocator
        self.device = self.swa_attn_allocator.device

    @property
    def size(self) -> int:
        return self.swa_attn_allocator.size

    size_swa = size

    @property
    def nbytes(self) -> int:
        return self.swa_attn_allocator.nbytes

    def nbytes_by_pool(self) -> dict[str, int]:
        """Plan pool ``allocator`` (plus ``allocator_checked`` in checked mode)."""
        return self.swa_attn_allocator.nbytes_by_pool("allocator")

    def available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    full_available_size = swa_available_size = available_size

    def get_kvcache(self) -> object:
        """The SWA pool (every layer slides)."""
        return self.swa_attn_allocator.get_kvcache()

    def get_cpu_copy(self, indices: Tensor) -> object:
        """The KV of slots ``indices`` in host memory, from the pool."""
        return self.swa_attn_allocator.get_cpu_copy(indices)

    def load_cpu_copy(self, kv_cache_cpu: object, indices: Tensor) -> None:
        """Write a ``get_cpu_copy`` result into slots ``indices``."""
        self.swa_attn_allocator.load_cpu_copy(kv_cache_cpu, indices)

    def translate_loc_from_full_to_swa(self, loc: Tensor) -> Tensor:
        return loc

    def alloc(self, need_size: int) -> Tensor | None:
        return self.swa_attn_allocator.alloc(need_size)

    def alloc_extend(
        self,
        prefix_lens: Tensor,
        seq_lens: Tensor,
        last_loc: Tensor,
        extend_num_tokens: int,
        *,
        num_new_pages: int | None = None,
    ) -> Tensor | None:
        inner = self.swa_attn_allocator
        if isinstance(inner, TokenAllocator):
            check_token_extend(inner, prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages, self.checked)
            return inner.alloc(extend_num_tokens)
        return inner.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens, num_new_pages=num_new_pages)

    def alloc_decode(self, seq_lens: Tensor, last_loc: Tensor, *, num_new_pages: int | None = None) -> Tensor | None:
        inner = self.swa_attn_allocator
        if isinstance(inner, TokenAllocator):
            check_token_decode(inner, seq_lens, last_loc, num_new_pages, self.checked)
            return inner.alloc(seq_lens.numel())
        return inner.alloc_decode(seq_lens, last_loc, num_new_pages=num_new_pages)

    def free(self, indices: Tensor | Sequence[int]) -> None:
        """Free slots: the caller frees a slot once, evicted or not (there is no mapping to skip evicted ones).

        Checked as the core allocator checks (``AllocatorError``, nothing
        changed): 0 and -1 are not slot ids and are refused, not skipped.
        """
        self.swa_attn_allocator.free(indices)

    free_swa = free

    def free_full(self, indices: Tensor | Sequence[int]) -> None:
        """No full pool: nothing to free."""

    # SGLang 0.5.23's segment frees (``kvpools_core.allocators.contract``): one pool, so a segment's SWA and
    # full sides are its slots, freed once; the full side alone has nothing to free.

    def free_segment(self, free_index: Tensor | Sequence[int], *, start_pos: int) -> None:
        """Free a segment of a request's row (the pool's ``free_segment``: pages as given, one range check)."""
        self.swa_attn_allocator.free_segment(free_index, start_pos=start_pos)

    free_swa_segment = free_segment

    def free_segments(self, segments: Iterable[tuple[Tensor | Sequence[int], int]]) -> None:
        """Free ascending, page-disjoint segments of one row, checked together first."""
        self.swa_attn_allocator.free_segments(segments)

    def free_full_segment(self, free_index: Tensor | Sequence[int], *, start_pos: int) -> None:
        """No full pool: nothing to free (SGLang's returns at once too)."""

    def free_full_segments(self, segments: Iterable[tuple[Tensor | Sequence[int], int]]) -> None:
        """No full pool: nothing to free; the segments are still checked as SGLang's ``_page_disjoint`` does."""
        page_disjoint_segments(segments, self.page_size, "free_full_segments")

    def free_group_begin(self) -> None:
        self.swa_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        self.swa_attn_allocator.free_group_end()

    def merge_and_sort_free(self) -> None:
        self.swa_attn_allocator.merge_and_sort_free()

    def backup_state(self) -> AllocatorState:
        return self.swa_attn_allocator.backup_state()

    def restore_state(self, state: AllocatorState) -> None:
        """Return exactly to the state of ``backup_state()``; another allocator's state is refused."""
        self.swa_attn_allocator.restore_state(state)

    def clear(self) -> None:
        self.swa_attn_allocator.clear()

    def __repr__(self) -> str:
        return (
            f"PureSWAAllocator(size_swa={self.size}, page_size={self.page_size}, "
            f"free={self.available_size()}, device={self.device})"
        )
