"""The dual full / SWA slot allocator and its full→SWA index mapping (SGLang's ``SWATokenToKVPoolAllocator``).

:class:`SWATokenToKVPoolAllocator` hands every new token a slot in the full
pool *and* one in the SWA pool, and records the pair in
``full_to_swa_index_mapping`` (int64, ``size + page_size`` entries and a
trailing −1 so that ``last_loc = -1`` translates to −1); callers see full slot
ids only.  ``free_swa`` gives back the SWA slots of tokens that slid out of the
window (their full slots stay); ``free`` gives back both.  With ``page_size >
1`` both sub-allocators run the same page-granular calls with the same
lengths, so a full page maps to exactly one SWA page, and ``free_swa`` frees
whole SWA pages.  Every hybrid sliding-window store uses it (the ``swa``
plugin's SWA pools, DeepSeek-V4's compressed-attention pool), composed from
the core's token / paged allocators.

Caller contract (as SGLang's): ``free_swa`` never frees the page holding a
request's last token while the request still extends it (with ``checked=True``
an extend from an evicted page is refused).  Frees are checked as the core
allocators check theirs, before the mapping or either pool changes
(``AllocatorError``, nothing changed): full slot ids out of range always, and
with ``checked=True`` full slots not allocated now.  ``free_full`` of slots
still mapped to SWA slots is refused in every mode (they would leak).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from kvpools_core.allocators.base import AllocatorState
from kvpools_core.allocators.contract import (
    BaseTokenToKVPoolAllocator,
    check_segment_start,
    host_copy_of,
    load_host_copy_into,
    page_disjoint_segments,
)
from kvpools_core.allocators.factory import allocator_class
from kvpools_core.allocators.paged import PagedAllocator, check_decode_lengths, check_extend_lengths
from kvpools_core.allocators.token import TokenAllocator
from kvpools_core.errors import AllocatorError

__all__ = [
    "MAPPING_ITEM_BYTES",
    "SWAState",
    "SWATokenToKVPoolAllocator",
    "check_token_decode",
    "check_token_extend",
    "mapping_nbytes",
    "new_full_to_swa_mapping",
    "sub_allocator",
]

_I64 = torch.int64
MAPPING_ITEM_BYTES = 8
"""The mapping holds int64 SWA slot ids (the planner's ``sizing.SWA_MAPPING_ITEM_BYTES``; a test keeps them
equal).  The module imports torch and the allocators only, as the benchmarks' peers venv has nothing else."""


def mapping_nbytes(size: int, page_size: int) -> int:
    """Bytes of ``full_to_swa_index_mapping`` for ``size`` full slots: ``(size + page_size + 1) × 8``."""
    return (size + page_size + 1) * MAPPING_ITEM_BYTES


def new_full_to_swa_mapping(size: int, page_size: int, device: str | torch.device) -> Tensor:
    """``full_to_swa_index_mapping``: ``size + page_size`` zeros and the trailing −1 sentinel."""
    from kvpools_core.pools.layout import allocate  # the pools (and the planner's values) on first use only

    mapping = allocate((size + page_size + 1,), _I64, device)
    if mapping.device.type != "meta":
        mapping[-1] = -1
    return mapping


def check_token_extend(
    allocator: TokenAllocator | PagedAllocator,
    prefix_lens: Tensor,
    seq_lens: Tensor,
    last_loc: Tensor,
    extend_num_tokens: int,
    num_new_pages: int | None,
    checked: bool,
) -> None:
    """An ``alloc_extend`` served by ``alloc(extend_num_tokens)`` (page size 1, where the lengths only count
    slots): lengths that agree in number and counts >= 0 always (O(1)); checked, the lengths themselves."""
    pre, seq, last = (allocator._as_index(t) for t in (prefix_lens, seq_lens, last_loc))
    k = extend_num_tokens if num_new_pages is None else num_new_pages
    if not pre.numel() == seq.numel() == last.numel() or extend_num_tokens < 0 or k < 0:
        raise AllocatorError(
            f"alloc_extend(): {pre.numel()} prefix_lens, {seq.numel()} seq_lens, {last.numel()} last_loc, "
            f"extend_num_tokens={extend_num_tokens}, num_new_pages={num_new_pages}; need one entry per request "
            "and counts >= 0; nothing was allocated"
        )
    if checked:
        check_extend_lengths(pre, seq, extend_num_tokens, k, 1)


def check_token_decode(
    allocator: TokenAllocator | PagedAllocator,
    seq_lens: Tensor,
    last_loc: Tensor,
    num_new_pages: int | None,
    checked: bool,
) -> None:
    """``check_token_extend`` for an ``alloc_decode`` served by ``alloc(len(seq_lens))``."""
    seq, last = allocator._as_index(seq_lens), allocator._as_index(last_loc)
    k = seq.numel() if num_new_pages is None else num_new_pages
    if seq.numel() != last.numel() or k < 0:
        raise AllocatorError(
            f"alloc_decode(): {seq.numel()} seq_lens, {last.numel()} last_loc, num_new_pages={num_new_pages}; "
            "need one entry per request and counts >= 0; nothing was allocated"
        )
    if checked:
        check_decode_lengths(seq, k, 1)


class SWAState:
    """Opaque snapshot of :meth:`SWATokenToKVPoolAllocator.backup_state`."""

    __slots__ = ("_owner", "full", "mapping", "swa")

    def __init__(self, owner: object, full: AllocatorState, swa: AllocatorState, mapping: Tensor) -> None:
        self._owner = owner
        self.full = full
        self.swa = swa
        self.mapping = mapping


def sub_allocator(
    size: int,
    page_size: int,
    device: str | torch.device,
    need_sort: bool,
    checked: bool,
    index_dtype: torch.dtype | None = None,
    kvcache: object = None,
) -> TokenAllocator | PagedAllocator:
    """One side's allocator (SGLang's choice by page size), over that side's KV store ``kvcache``."""
    if allocator_class(page_size) is TokenAllocator:
        return TokenAllocator(size, device=device, kvcache=kvcache, need_sort=need_sort, checked=checked)
    return PagedAllocator(
        size, page_size, device=device, kvcache=kvcache, need_sort=need_sort, checked=checked, index_dtype=index_dtype
    )


class SWATokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """A full slot and an SWA slot per token; the SWA slot can be freed alone.

    The constructor is SGLang's, ``(size, size_swa, page_size, dtype, device,
    kvcache, need_sort)``; the mapping is the pool's ``full_to_swa_index_mapping``
    when ``kvcache`` has one (kvpools' pool owns it; SGLang's allocator makes it
    and registers it with the pool), else ``mapping``, else a new one.
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
        mapping: Tensor | None = None,
        checked: bool = False,
        debug: bool = False,
        index_dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(size, page_size, dtype, device, kvcache, need_sort)
        self.checked = checked = checked or debug  # ``debug`` is the old name of checked mode
        full_pool, swa_pool = (getattr(kvcache, name, None) for name in ("full_kv_pool", "swa_kv_pool"))
        self.full_attn_allocator = sub_allocator(size, page_size, device, need_sort, checked, index_dtype, full_pool)
        # SWA slots live in the int64 full->SWA mapping (as SGLang's): only full slots take the platform's dtype
        self.swa_attn_allocator = sub_allocator(size_swa, page_size, device, need_sort, checked, kvcache=swa_pool)
        self.device = self.full_attn_allocator.device
        self._token = object()  # identifies snapshots taken from this instance
        pool_mapping = getattr(kvcache, "full_to_swa_index_mapping", None)
        if mapping is None and isinstance(pool_mapping, Tensor):
            mapping = pool_mapping
        if mapping is None:
            mapping = new_full_to_swa_mapping(size, page_size, self.device)
        if mapping.shape != (size + page_size + 1,):
            raise ValueError(
                f"full_to_swa_index_mapping must have {size + page_size + 1} entries (size + page_size + the -1 "
                f"sentinel), got shape {tuple(mapping.shape)}"
            )
        self.full_to_swa_index_mapping = mapping
        # the mapping by full page (pages 0..size // page_size): a segment free unmaps whole pages in one op
        self._mapping_pages = mapping[: (size // page_size + 1) * page_size].view(-1, page_size)
        self._offsets = torch.arange(page_size, dtype=_I64, device=self.device)
        if isinstance(self.swa_attn_allocator, PagedAllocator):  # SGLang's SWA group end order
            self.swa_attn_allocator._ids_released_first = True

    @property
    def debug(self) -> bool:
        """Old name of :attr:`checked`."""
        return self.checked

    # ------------------------------------------------------------------ sizes
    @property
    def size(self) -> int:
        """Tokens both pools can hold at once (SGLang: ``min(size_full, size_swa)``)."""
        return min(self.size_full, self.size_swa)

    @size.setter
    def size(self, value: int) -> None:
        """The base constructor's assignment; the sizes are the sub-allocators'."""

    @property
    def size_full(self) -> int:
        return self.full_attn_allocator.size

    @property
    def size_swa(self) -> int:
        return self.swa_attn_allocator.size

    @property
    def nbytes(self) -> int:
        """Bytes of both free lists (the mapping belongs to the pool)."""
        return sum(self.nbytes_by_pool().values())

    def nbytes_by_pool(self) -> dict[str, int]:
        """Plan pools ``allocator`` and ``swa_allocator`` (plus ``*_checked`` in checked mode)."""
        return {
            **self.full_attn_allocator.nbytes_by_pool("allocator"),
            **self.swa_attn_allocator.nbytes_by_pool("swa_allocator"),
        }

    def available_size(self) -> int:
        return min(self.full_available_size(), self.swa_available_size())

    def full_available_size(self) -> int:
        return self.full_attn_allocator.available_size()

    def swa_available_size(self) -> int:
        return self.swa_attn_allocator.available_size()

    def translate_loc_from_full_to_swa(self, loc: Tensor) -> Tensor:
        return self.full_to_swa_index_mapping[loc]

    # ------------------------------------------------------------ host copies
    def get_cpu_copy(self, indices: Tensor) -> object:
        """The KV of full slots ``indices`` (full and, where mapped, SWA rows) in host memory, from the pool.

        Full slot ids a free would refuse are refused first (``AllocatorError``)."""
        self.full_attn_allocator.check_held(indices)
        return host_copy_of(self, indices)

    def load_cpu_copy(self, kv_cache_cpu: object, indices: Tensor) -> None:
        """Write a ``get_cpu_copy`` result into full slots ``indices`` and the SWA slots they map to.

        Refused with ``AllocatorError``: full slot ids a free would refuse, and a copy the pool did not make."""
        self.full_attn_allocator.check_held(indices)
        load_host_copy_into(self, kv_cache_cpu, indices)

    # ------------------------------------------------------------- allocation
    def alloc(self, need_size: int) -> Tensor | None:
        """``need_size`` full slots (whole pages when paged), each paired with an SWA slot; None if either is short."""
        if need_size > self.available_size():
            return None
        full = self.full_attn_allocator.alloc(need_size)
        swa = self.swa_attn_allocator.alloc(need_size)
        assert full is not None and swa is not None  # both had room
        self._map(full, swa)
        return full

    def alloc_extend(
        self,
        prefix_lens: Tensor,
        seq_lens: Tensor,
        last_loc: Tensor,
        extend_num_tokens: int,
        *,
        num_new_pages: int | None = None,
    ) -> Tensor | None:
        """Slots for positions ``prefix_lens[i]..seq_lens[i]-1`` in both pools (full slot ids returned), or None."""
        if self.page_size == 1:
            lens = (prefix_lens, seq_lens, last_loc)
            check_token_extend(self.full_attn_allocator, *lens, extend_num_tokens, num_new_pages, self.checked)
            return self.alloc(extend_num_tokens)
        p = self.page_size
        full_alloc, swa_alloc = self._paged()
        pre = full_alloc._as_index(prefix_lens)
        seq = full_alloc._as_index(seq_lens)
        last = full_alloc._as_index(last_loc)
        if num_new_pages is None and pre.numel() == seq.numel():
            num_new_pages = int(((seq + p - 1) // p - (pre + p - 1) // p).sum())
        self._check_batch(pre, seq, last, extend_num_tokens, num_new_pages or 0)
        assert num_new_pages is not None
        if num_new_pages * p > self.available_size():
            return None
        swa_last = self._swa_last(last)
        if self.checked:
            evicted = (pre % p != 0) & (swa_last <= 0)
            if bool(evicted.any()):
                raise AllocatorError(
                    f"alloc_extend continues the open page of last_loc {last[evicted][:8].tolist()} whose SWA page "
                    f"was freed by free_swa; evict only pages before a request's last page"
                )
        full = full_alloc.alloc_extend(pre, seq, last, extend_num_tokens, num_new_pages=num_new_pages)
        swa = swa_alloc.alloc_extend(pre, seq, swa_last, extend_num_tokens, num_new_pages=num_new_pages)
        assert full is not None and swa is not None  # both had the pages
        self._map(full, swa)
        return full

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
        """Full slots for the whole extend of one request, SWA slots only for its last ``swa_tail_len`` tokens.

        SGLang's ``alloc_extend_swa_tail`` (``allocator/swa.py`` L356-428 of 0.5.23): a long prefill whose
        earlier tokens fall out of the window before they are read needs no SWA KV for them.  The tail gets
        fresh SWA pages (as a request with no prefix: ``ceil(swa_tail_len / page_size)`` pages) mapped to the
        last ``swa_tail_len`` full slots; the extend's other full slots are left unmapped (0).  One request
        per call (``AllocatorError`` otherwise, where SGLang asserts); None, nothing changed, when either pool
        is short.  ``num_new_pages``: the full side's new pages, as ``alloc_extend`` takes it.

        Caller contract (as SGLang's): start the tail on a page boundary, ``(seq_len - swa_tail_len) %
        page_size == 0``, so that each full page maps to one SWA page at the same offsets, which later decodes
        and ``free_swa`` rely on; ``checked=True`` refuses a tail that does not.
        """
        if self.page_size == 1:
            raise AllocatorError("alloc_extend_swa_tail() is for a paged SWA allocator (page_size > 1), as SGLang's")
        p = self.page_size
        pre = prefix_lens.to(device=self.device, dtype=_I64).reshape(-1)
        seq = seq_lens.to(device=self.device, dtype=_I64).reshape(-1)
        last = last_loc.to(device=self.device, dtype=_I64).reshape(-1)
        if pre.numel() != 1 or seq.numel() != 1 or last.numel() != 1:
            raise AllocatorError(
                f"alloc_extend_swa_tail() allocates for one request (SGLang's supports bs=1); got {seq.numel()}"
            )
        if not 0 <= swa_tail_len <= extend_num_tokens:
            raise AllocatorError(
                f"alloc_extend_swa_tail(): need 0 <= swa_tail_len <= extend_num_tokens, got {swa_tail_len} / "
                f"{extend_num_tokens}"
            )
        if self.checked and swa_tail_len and (int(seq[0]) - swa_tail_len) % p:
            raise AllocatorError(
                f"alloc_extend_swa_tail(): the tail of {swa_tail_len} tokens starts mid-page (seq_len {int(seq[0])}, "
                f"page_size {p}), so its SWA pages would not line up with the full pages that later decodes and "
                "free_swa assume; choose swa_tail_len with (seq_len - swa_tail_len) % page_size == 0"
            )
        if num_new_pages is None:
            num_new_pages = int(((seq + p - 1) // p - (pre + p - 1) // p).sum())
        swa_pages = -(-swa_tail_len // p)
        full_alloc, swa_alloc = self._paged()
        if num_new_pages * p > full_alloc.available_size() or swa_pages * p > swa_alloc.available_size():
            return None
        full = full_alloc.alloc_extend(pre, seq, last, extend_num_tokens, num_new_pages=num_new_pages)
        assert full is not None  # it had the pages
        if swa_tail_len == 0:
            return full
        tail = torch.tensor([swa_tail_len], dtype=_I64, device=self.device)
        none = torch.zeros(1, dtype=_I64, device=self.device)
        swa = swa_alloc.alloc_extend(none, tail, none - 1, swa_tail_len, num_new_pages=swa_pages)
        assert swa is not None
        full_slots = full.to(_I64)
        self.full_to_swa_index_mapping[full_slots[-swa_tail_len:]] = swa.to(_I64)
        if swa_tail_len < extend_num_tokens:
            self.full_to_swa_index_mapping[full_slots[:-swa_tail_len]] = 0
        return full

    def alloc_decode(self, seq_lens: Tensor, last_loc: Tensor, *, num_new_pages: int | None = None) -> Tensor | None:
        """One slot per request in both pools for position ``seq_lens[i]-1`` (full slot ids returned), or None."""
        if self.page_size == 1:
            check_token_decode(self.full_attn_allocator, seq_lens, last_loc, num_new_pages, self.checked)
            return self.alloc(seq_lens.numel())
        p = self.page_size
        full_alloc, swa_alloc = self._paged()
        seq = full_alloc._as_index(seq_lens)
        last = full_alloc._as_index(last_loc)
        needs = full_alloc._in_page(seq) == 1  # one mask for both sides: they page in step
        if num_new_pages is None:
            num_new_pages = int(torch.count_nonzero(needs))
        self._check_batch(None, seq, last, 0, num_new_pages)
        if num_new_pages * p > self.available_size():
            return None
        swa_last = self._swa_last(last, decode=True)
        if self.checked:
            evicted = ~needs & (swa_last <= 0)
            if bool(evicted.any()):
                raise AllocatorError(
                    f"alloc_decode continues the page of last_loc {last[evicted][:8].tolist()} whose SWA page was "
                    f"freed by free_swa; evict only pages before a request's last page"
                )
            full = full_alloc.alloc_decode(seq, last, num_new_pages=num_new_pages)
            swa = swa_alloc.alloc_decode(seq, swa_last, num_new_pages=num_new_pages)
        else:  # checked above (lengths, counts): both sides take their pages from the one mask
            full = full_alloc._decode_pages(last, needs, num_new_pages)
            swa = swa_alloc._decode_pages(swa_last, needs, num_new_pages)
        assert full is not None and swa is not None
        self._map(full, swa)
        return full

    # ------------------------------------------------------------------ frees
    def free(self, indices: Tensor | Sequence[int]) -> None:
        """Free full slots ``indices`` and the SWA slots still mapped to them (a request ends).

        All or nothing: the full allocator checks the slots (as its own
        ``free`` would) before the mapping or either pool changes.
        """
        full = self.full_attn_allocator.to_ids(indices)
        if not full.numel():
            return
        self.full_attn_allocator.check_free(full)
        self._free_swa(full)
        self.full_attn_allocator.free(full)

    def free_swa(self, indices: Tensor | Sequence[int]) -> None:
        """Free the SWA slots of full slots ``indices`` (tokens out of the window); their full slots stay.

        Paged: the SWA page of every full page touched is freed whole.
        Slots without an SWA slot (already evicted) are skipped.  Full slot
        ids out of range (and, checked, not allocated) are refused first.
        """
        full = self.full_attn_allocator.to_ids(indices)
        if not full.numel():
            return
        self.full_attn_allocator.check_free(full, count=False)
        self._free_swa(full)

    def _free_swa(self, full: Tensor) -> None:
        """``free_swa`` of checked 1-D int64 full slots."""
        if self.page_size > 1:
            full = self._page_slots(full)
        swa = self.full_to_swa_index_mapping[full]
        swa = swa[swa > 0]
        if swa.numel():  # first: the SWA allocator may still refuse (a corrupted mapping)
            self.swa_attn_allocator.free(swa)
        self.full_to_swa_index_mapping[full] = 0

    def free_full(self, indices: Tensor | Sequence[int]) -> None:
        """Free full slots whose SWA slots are already gone (``free_swa`` first; SGLang asserts it).

        Refused with ``AllocatorError``, nothing changed, where a slot still maps to an
        SWA slot: freeing it would leak that SWA slot for good.  One gather of the
        mapping per slot given: at the slot (page size 1) or at the first slot of its
        page (which every mapped page maps: pages fill from their first slot, and
        ``free_swa`` unmaps whole pages); ``checked=True`` reads their whole pages.
        """
        full_alloc = self.full_attn_allocator
        full = full_alloc.to_ids(indices)
        if not full.numel():
            return
        full_alloc.check_free(full)
        p = self.page_size
        mapped = full if p == 1 else self._page_slots(full) if self.checked else full // p * p
        swa = self.full_to_swa_index_mapping[mapped]
        if bool((swa > 0).any()):
            still = mapped[swa > 0]
            raise AllocatorError(
                f"free_full() of full slot(s) {still[:8].tolist()} that still map to SWA slot(s) "
                f"{swa[swa > 0][:8].tolist()}: those would never be freed; call free_swa() on them first, or "
                "free() to free both; nothing was freed"
            )
        full_alloc.free(full)

    # ---------------------------------------------------------- segment frees
    # SGLang 0.5.23's scheduler and radix cache free a request's row segment by segment (see ``contract``):
    # one slot per page (``free_index[::page_size]``) names each page, so the mapping is read and cleared per
    # page and both sides free page ids as given, with one range check per side and no de-duplication.

    def free_segment(self, free_index: Tensor | Sequence[int], *, start_pos: int) -> None:
        """Free a segment of a request's row on both sides (SGLang's ``free_segment``): the SWA pages still
        mapped to its full pages, then the full pages.  All or nothing: the full pages are checked (range,
        count; checked: allocated), then the SWA side (a page with no SWA page left is refused: free it with
        ``free_full_segment``), before either changes."""
        seg = self._one_segment(free_index, start_pos, "free_segment")
        if seg is not None:
            self._free_both(*seg)

    def free_segments(self, segments: Iterable[tuple[Tensor | Sequence[int], int]]) -> None:
        """``free_segment`` of ascending, page-disjoint segments of one row, checked together first."""
        seg = self._many_segments(segments, "free_segments")
        if seg is not None:
            self._free_both(*seg)

    def free_swa_segment(self, free_index: Tensor | Sequence[int], *, start_pos: int) -> None:
        """Free the SWA pages of a segment's full pages, which stay (SGLang's ``free_swa_segment``: tokens
        that slid out of the window).  Every page must still map to an SWA page (refused otherwise, as are
        full slot ids out of range and, checked, not allocated), before anything changes."""
        seg = self._one_segment(free_index, start_pos, "free_swa_segment")
        if seg is not None:
            reps, pages = seg
            if not self._gather_checks(reps):
                self.full_attn_allocator._check_held_units(pages)
            self._free_swa_pages(reps, pages)

    def free_full_segment(self, free_index: Tensor | Sequence[int], *, start_pos: int) -> None:
        """Free a segment's full pages whose SWA pages are gone already (SGLang's ``free_full_segment``):
        one still mapped is refused, nothing freed (its SWA page would leak)."""
        seg = self._one_segment(free_index, start_pos, "free_full_segment")
        if seg is not None:
            self._free_full_pages(*seg)

    def free_full_segments(self, segments: Iterable[tuple[Tensor | Sequence[int], int]]) -> None:
        """``free_full_segment`` of ascending, page-disjoint segments of one row, checked together first."""
        seg = self._many_segments(segments, "free_full_segments")
        if seg is not None:
            self._free_full_pages(*seg)

    def _one_segment(
        self, free_index: Tensor | Sequence[int], start_pos: int, method: str
    ) -> tuple[Tensor, Tensor] | None:
        """A segment's full slots naming its pages (``[::page_size]``) and those pages (full units), or None."""
        p = self.page_size
        if type(start_pos) is not int or start_pos < 0 or start_pos % p:
            check_segment_start(start_pos, p, method)
        full_alloc = self.full_attn_allocator
        full = full_alloc.to_ids(free_index)
        if not full.numel():
            return None
        if p == 1:
            return full, full
        return full[::p], full_alloc._segment_units(full)

    def _many_segments(
        self, segments: Iterable[tuple[Tensor | Sequence[int], int]], method: str
    ) -> tuple[Tensor, Tensor] | None:
        segs = page_disjoint_segments(segments, self.page_size, method)
        parts = [seg for free_index, start_pos in segs if (seg := self._one_segment(free_index, start_pos, method))]
        if not parts:
            return None
        if len(parts) == 1:
            return parts[0]
        if not self.full_attn_allocator._in_group:  # as SGLang's segment-by-segment frees leave the free lists
            parts.reverse()
        return torch.cat([r for r, _ in parts]), torch.cat([q for _, q in parts])

    def _gather_checks(self, reps: Tensor) -> bool:
        """Whether the mapping's gather at ``reps`` is the full side's range check (unchecked, on CPU): a slot
        past the mapping makes ``index_select`` raise before anything changes, and every other id a free
        refuses (padding, the slots past the pool, the -1 sentinel) maps to no SWA slot, which the SWA side's
        range check refuses; the error is then worked out (``_free_swa_pages``).  Saves one ``aminmax`` a call."""
        return not self.checked and reps.is_cpu

    def _free_both(self, reps: Tensor, pages: Tensor) -> None:
        full_alloc = self.full_attn_allocator
        if not self._gather_checks(reps):
            full_alloc._check_units(pages)
        elif full_alloc._refs is not None:  # counted frees: the full side checks its counts first
            full_alloc._check_range(pages)
        if full_alloc._counts_now():
            full_alloc._check_count(pages.numel())
        self._free_swa_pages(reps, pages)
        full_alloc._give_back_ids(pages)

    def _free_full_pages(self, reps: Tensor, pages: Tensor) -> None:
        full_alloc = self.full_attn_allocator
        full_alloc._check_units(pages)
        if full_alloc._counts_now():
            full_alloc._check_count(pages.numel())
        mapped = (
            self._mapping_pages[pages] if self.checked and self.page_size > 1 else self.full_to_swa_index_mapping[reps]
        )
        if bool((mapped > 0).any()):
            still = (mapped > 0) if mapped.dim() == 1 else (mapped > 0).any(1)
            raise AllocatorError(
                f"free_full_segment() of full slot(s) {reps[still][:8].tolist()} whose pages still map to SWA "
                "slots: those would never be freed; free_swa_segment() them first, or free_segment() to free "
                "both; nothing was freed"
            )
        full_alloc._give_back_ids(pages)

    def _free_swa_pages(self, reps: Tensor, pages: Tensor) -> None:
        """Free the SWA pages mapped to full pages ``pages`` (slots ``reps`` name them) and unmap them;
        refused, nothing changed, where one maps to none."""
        mapping = self.full_to_swa_index_mapping
        try:  # reps are checked full slots, or (_gather_checks) this gather is the check
            swa = mapping.index_select(0, reps)
        except (IndexError, RuntimeError):
            self.full_attn_allocator._check_range(pages)  # raises, naming the foreign ids
            raise
        swa_alloc = self.swa_attn_allocator
        swa_pages = swa if self.page_size == 1 else self._paged()[1]._page_of(swa)
        try:
            swa_alloc.free_page_ids(swa_pages)
        except AllocatorError:
            if self._gather_checks(reps):
                self.full_attn_allocator._check_range(pages)  # a foreign full id first, named as such
            gone = swa <= 0
            if not bool(gone.any()):
                raise
            raise AllocatorError(
                f"free of the SWA side of full slot(s) {reps[gone][:8].tolist()}, which map to no SWA slot (free_swa "
                "gave it back, or alloc_extend_swa_tail never mapped it): free their full side alone with "
                "free_full_segment(s) (SGLang's free_kv_row_segments splits a row so); nothing was freed"
            ) from None
        if self.page_size == 1:
            mapping.index_fill_(0, reps, 0)
        else:
            self._mapping_pages.index_fill_(0, pages, 0)

    def free_group_begin(self) -> None:
        self.full_attn_allocator.free_group_begin()
        self.swa_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        self.full_attn_allocator.free_group_end()
        self.swa_attn_allocator.free_group_end()

    def merge_and_sort_free(self) -> None:
        self.full_attn_allocator.merge_and_sort_free()
        self.swa_attn_allocator.merge_and_sort_free()

    # ------------------------------------------------------------ state/reset
    def backup_state(self) -> SWAState:
        """Snapshot of both allocators (copy-on-write) and of the mapping (one copy of it)."""
        return SWAState(
            self._token,
            self.full_attn_allocator.backup_state(),
            self.swa_attn_allocator.backup_state(),
            self.full_to_swa_index_mapping.clone(),
        )

    def restore_state(self, state: SWAState) -> None:
        """Return exactly to the state of ``backup_state()`` (of this allocator only)."""
        if not isinstance(state, SWAState):
            raise AllocatorError(
                f"restore_state() takes what this allocator's backup_state() returned (an SWAState); "
                f"got {type(state).__name__}"
            )
        if state._owner is not self._token:
            raise AllocatorError("restore_state() got a state taken from a different allocator; nothing was restored")
        self.full_attn_allocator.restore_state(state.full)
        self.swa_attn_allocator.restore_state(state.swa)
        self.full_to_swa_index_mapping.copy_(state.mapping)

    def clear(self) -> None:
        """Everything free; every full slot unmapped (the −1 sentinel stays)."""
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
        self.full_to_swa_index_mapping[:-1] = 0

    def _page_slots(self, full: Tensor) -> Tensor:
        """Every slot of the pages of full slots ``full`` (1-D int64; a page repeats per slot given)."""
        p = self.page_size
        return torch.add(self._offsets, (full // p)[:, None], alpha=p).reshape(-1)

    def _check_batch(self, pre: Tensor | None, seq: Tensor, last: Tensor, n_tok: int, k: int) -> None:
        """Before the mapping is read: lengths that agree (O(1), every mode) and, checked, the full side's
        validation of the batch (so a refusal comes before either side takes a page)."""
        full_alloc = self._paged()[0]
        if pre is None:
            if seq.numel() != last.numel():
                raise AllocatorError(
                    f"alloc_decode(): {seq.numel()} seq_lens and {last.numel()} last_loc; need one entry per "
                    "request; nothing was allocated"
                )
            if self.checked:
                full_alloc._check_decode(seq, last, k)
        else:
            if not pre.numel() == seq.numel() == last.numel() or n_tok < 0:
                raise AllocatorError(
                    f"alloc_extend(): {pre.numel()} prefix_lens, {seq.numel()} seq_lens, {last.numel()} last_loc "
                    f"and extend_num_tokens={n_tok}; need one entry per request and extend_num_tokens = "
                    "sum(seq_lens - prefix_lens) >= 0; nothing was allocated"
                )
            if self.checked:
                full_alloc._check_extend(pre, seq, last, n_tok, k)
        if k < 0:
            raise AllocatorError(f"num_new_pages={k}: need a count >= 0; nothing was allocated")
        if self.checked and last.numel():
            # -1 (no prefix) reads the mapping's sentinel; other negatives would wrap around
            foreign = (last < -1) | (last >= self.full_to_swa_index_mapping.numel() - 1)
            if bool(foreign.any()):
                raise AllocatorError(
                    f"last_loc {last[foreign][:8].tolist()} is not a full slot id (nor -1); nothing was allocated"
                )

    def _map(self, full: Tensor, swa: Tensor) -> None:
        """Record the new pairs: ``mapping[full] = swa`` (one ``index_copy_``, cheaper than an index put)."""
        self.full_to_swa_index_mapping.index_copy_(0, full if full.dtype is _I64 else full.to(_I64), swa)

    def _swa_last(self, last: Tensor, *, decode: bool = False) -> Tensor:
        """The SWA slots of ``last_loc`` (-1 stays -1); a ``last_loc`` past the mapping is refused."""
        mapping = self.full_to_swa_index_mapping
        if decode and last.is_cpu:  # a decode's last_loc is a slot: a gather (on an accelerator a bad index is
            try:  # an asynchronous device assert, so there: indexing); -1 (no prefix) needs indexing's wrap-around
                return mapping.index_select(0, last)
            except (IndexError, RuntimeError):
                pass
        try:
            return mapping[last]
        except IndexError:
            raise AllocatorError(
                f"last_loc {last[:8].tolist()} indexes past the {self.size_full} full slots; nothing was allocated"
            ) from None

    def _paged(self) -> tuple[PagedAllocator, PagedAllocator]:
        full, swa = self.full_attn_allocator, self.swa_attn_allocator
        assert isinstance(full, PagedAllocator) and isinstance(swa, PagedAllocator)  # page_size > 1
        return full, swa

    def __repr__(self) -> str:
        return (
            f"SWATokenToKVPoolAllocator(size_full={self.size_full}, size_swa={self.size_swa}, "
            f"page_size={self.page_size}, free full={self.full_available_size()}, "
            f"free swa={self.swa_available_size()}, device={self.device})"
        )
