"""Paged KV-slot allocator, SGLang ``PagedTokenToKVPoolAllocator`` semantics.

Slot ``s`` lives in page ``s // page_size``; a request's position ``p`` sits
at ``page * page_size + p % page_size``, so every page a request owns is one
contiguous, page-aligned run of slots.  Pages ``1..num_pages`` are handed
out; page 0 is the padding page.

Two interfaces share one free-page stack (see ``base``):

* SGLang style, tensors in and out: ``alloc``, ``alloc_extend``,
  ``alloc_decode``, ``free`` -- a fixed handful of vectorised torch ops per
  call for the whole batch, on CPU or accelerator tensors alike.
* vLLM style, Python ints: ``alloc_pages`` / ``free_pages`` -- on a CPU
  device these index the stack's memory directly (~0.3 us per call, where
  one torch op costs ~2-5 us).  On an accelerator they go through the tensor
  and synchronise; a host-side scheduler builds its allocator with
  ``device="cpu"`` (the allocator holds page ids, not KV data).

Frees are range checked (page 0 and pages past the pool are refused) and, with
``checked=True``, checked against an "allocated" map (see ``base``).

Two class-level extension points let a platform's subclass keep SGLang's
semantics of its own allocator without copying these paths:
``index_dtype`` (the dtype of the returned slot indices) and ``fill_extend``
(another way to compute an extend batch's slots, e.g. a per-request loop for
batches its kernel does not take).
"""

from __future__ import annotations

import array
import ctypes
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor

from kvpools_core.allocators.base import BaseAllocator
from kvpools_core.allocators.contract import check_segment_start
from kvpools_core.allocators.sizes import paged_extra_nbytes
from kvpools_core.errors import AllocatorError, AllocatorStateError

__all__ = ["PagedAllocator", "check_decode_lengths", "check_extend_lengths"]

_I64 = torch.int64
_aminmax = torch.aminmax
_memmove = ctypes.memmove


class PagedAllocator(BaseAllocator):
    """Page-granular KV-slot allocator over ``size // page_size`` pages."""

    _kind = "page"

    index_dtype: torch.dtype = torch.int64
    """Dtype of the slot tensors ``alloc``, ``alloc_extend`` and ``alloc_decode`` return.

    SGLang's allocators return int64; a platform whose kernels take another
    integer dtype sets this in a subclass (SGLang's NPU allocator returns
    int32, what ``torch_npu``'s cache writes take) and every tensor path
    honours it.  The free stack stays int64 (the planned bytes do not change),
    ``free`` takes slots of any integer dtype, and ``alloc_pages`` keeps
    returning Python ints.  The constructor's ``index_dtype`` sets it for one
    allocator (what the builders pass from ``PlatformTraits.slot_index_dtype``).
    """

    _ids_released_first: bool = False
    """At a free group's end, whether the ``free_page_ids`` pages go back before the group's ``free`` pages
    (SGLang's SWA allocator releases its SWA side so; its paged allocator releases them after)."""

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
        index_dtype: torch.dtype | None = None,
    ) -> None:
        """SGLang's ``PagedTokenToKVPoolAllocator(size, page_size, dtype, device, kvcache, need_sort)``,
        plus ``checked`` and ``index_dtype``."""
        super().__init__(size, page_size, dtype, device, kvcache, need_sort, checked=checked, debug=debug)
        if index_dtype is not None:
            self.index_dtype = index_dtype
        p = page_size
        self._pm1 = p - 1
        self._slot_end = (self.num_pages + 1) * p  # slots of pages 1..num_pages are p.._slot_end-1
        # C-level callables: no Python frame per use on the hot paths
        self._page_of: Callable[[Tensor], Tensor]
        self._in_page: Callable[[Tensor], Tensor]
        if p & (p - 1) == 0:
            self._page_of = partial(torch.bitwise_right_shift, other=p.bit_length() - 1)
            self._in_page = partial(torch.bitwise_and, other=p - 1)
        else:
            self._page_of = partial(torch.floor_divide, other=p)
            self._in_page = partial(torch.remainder, other=p)
        # slot offsets inside a page: expands pages to slots without an arange per call
        self._offsets = torch.arange(p, dtype=_I64, device=self.device)

    @classmethod
    def planned_nbytes(cls, size: int, page_size: int, checked: bool = False) -> int:
        """``8 * num_pages`` (free stack) ``+ 8 * page_size`` (in-page offsets)
        ``+ 2 * (num_pages + 1)`` (int16 allocated map) in checked mode."""
        return super().planned_nbytes(size, page_size, checked) + paged_extra_nbytes(page_size)

    # ------------------------------------------------------------ tensor API
    def alloc(self, need_size: int) -> Tensor | None:
        """Slots of ``need_size // page_size`` whole pages, or None (nothing changes).

        ``need_size`` must be a non-negative multiple of ``page_size``, else
        ``AllocatorError`` (a ``ValueError``): SGLang rounds it down and hands out
        fewer slots than asked (none below a page), which a caller indexing
        ``need_size`` slots finds only later.
        """
        p = self.page_size
        if need_size < 0 or need_size % p:
            raise AllocatorError(
                f"alloc({need_size}): a paged allocator hands out whole pages; "
                f"ask for a non-negative multiple of page_size={p} (SGLang's rounds down: ask for "
                f"{need_size // p * p} for that)"
            )
        k = need_size // p
        start = self._take(k)
        if start is None:
            return None
        pages = self._buf[start : start + k]
        if self._allocated is not None:
            self._mark_allocated(pages)
        return self._as_slots(torch.add(self._offsets, pages[:, None], alpha=p).view(-1))

    def alloc_extend(
        self,
        prefix_lens: Tensor,
        seq_lens: Tensor,
        last_loc: Tensor,
        extend_num_tokens: int,
        *,
        num_new_pages: int | None = None,
    ) -> Tensor | None:
        """Slots for positions ``prefix_lens[i]..seq_lens[i]-1`` of every request,
        flat and request by request, or None (nothing changes).

        Per request: the rest of the open page right after ``last_loc`` (the
        slot of position ``prefix_lens[i]-1``), then fresh pages.  Pass
        ``num_new_pages`` (from host copies of the lengths) to avoid a device
        sync; ``extend_num_tokens`` must be ``sum(seq_lens - prefix_lens)``.
        """
        pre = self._as_index(prefix_lens)
        seq = self._as_index(seq_lens)
        last = self._as_index(last_loc)
        if not pre.numel() == seq.numel() == last.numel() or extend_num_tokens < 0:  # O(1): Python ints
            raise _batch_error(pre, seq, last, extend_num_tokens)
        aligned_ok = num_new_pages is None or self._cpu  # the test below syncs: not where the count was given
        if aligned_ok and self._allocated is None and not torch.count_nonzero(self._in_page(pre)):
            # the common case, fresh or page-aligned prefixes: no open page to continue
            return self._extend_aligned(pre, seq, last, extend_num_tokens, num_new_pages)
        page_of = self._page_of
        pages_pre = page_of(pre + self._pm1)  # pages already (partly) filled
        pages_seq = page_of(seq + self._pm1)
        cum_pages = (pages_seq - pages_pre).cumsum(0)
        k = num_new_pages
        if k is None:
            k = int(cum_pages[-1]) if cum_pages.numel() else 0
        if self._allocated is not None:
            self._check_extend(pre, seq, last, extend_num_tokens, k)
        start = self._take(k)
        if start is None:
            return None
        if self._allocated is not None:
            self._mark_allocated(self._buf[start : start + k])
        try:
            return self._fill_open(pre, seq, last, extend_num_tokens, start, k, cum_pages, pages_pre, pages_seq)
        except (RuntimeError, IndexError) as exc:  # lengths that disagree (default mode does not check them)
            raise self._untake(start, k, exc) from None

    def _fill_open(
        self,
        pre: Tensor,
        seq: Tensor,
        last: Tensor,
        extend_num_tokens: int,
        start: int,
        k: int,
        cum_pages: Tensor,
        pages_pre: Tensor,
        pages_seq: Tensor,
    ) -> Tensor:
        """``alloc_extend``'s slots once its ``k`` pages are taken at ``buf[start:]`` (open pages possible)."""
        p, page_of = self.page_size, self._page_of
        if not extend_num_tokens:
            return self._buf.new_empty(0, dtype=self.index_dtype)
        filled = self.fill_extend(pre, seq, last, self._buf[start : start + k], extend_num_tokens)
        if filled is not None:
            return self._as_slots(filled)
        ext = seq - pre
        # Per request, for new token t (flat index): its position is t + shift_pos,
        # its page is buf[pos // p + page_base]; open-page positions (< open_end)
        # continue last_loc instead: slot = pos + open_off.
        per_req = torch.stack((seq - ext.cumsum(0), cum_pages - pages_seq + start, last + 1 - pre, pages_pre * p), 1)
        req_of_token = torch.repeat_interleave(ext, output_size=extend_num_tokens)
        shift_pos, page_base, open_off, open_end = per_req.index_select(0, req_of_token).unbind(1)
        pos = torch.arange(extend_num_tokens, device=self.device).add_(shift_pos)
        # open-page tokens index one page before their first new page (maybe -1): unused
        fresh = self._buf[page_of(pos).add_(page_base)].mul_(p).add_(self._in_page(pos))
        return self._as_slots(torch.where(pos < open_end, pos + open_off, fresh))

    def alloc_decode(
        self,
        seq_lens: Tensor,
        last_loc: Tensor,
        *,
        num_new_pages: int | None = None,
    ) -> Tensor | None:
        """One slot per request for position ``seq_lens[i]-1``: ``last_loc+1``, or
        the first slot of a fresh page when that position starts a page."""
        seq = self._as_index(seq_lens)
        last = self._as_index(last_loc)
        if seq.numel() != last.numel():  # O(1): masked_scatter_ would fail once the pages are taken
            raise _batch_error(None, seq, last, 0)
        p = self.page_size
        if p == 1:  # every request takes a page
            k = seq.numel() if num_new_pages is None else num_new_pages
            if k < 0:
                raise AllocatorError(f"num_new_pages={k}: need a count >= 0; nothing was allocated")
            if self._allocated is not None:
                self._check_decode(seq, last, k)
            return self.alloc(seq.numel())
        needs = self._in_page(seq) == 1  # position seq-1 starts a page
        k = int(torch.count_nonzero(needs)) if num_new_pages is None else num_new_pages
        if self._allocated is not None:
            self._check_decode(seq, last, k)
        return self._decode_pages(last, needs, k)

    def _decode_pages(self, last: Tensor, needs: Tensor, k: int) -> Tensor | None:
        """``alloc_decode`` once checked: ``last + 1``, the requests in ``needs`` on the ``k`` new pages."""
        start = self._take(k)
        if start is None:
            return None
        out = last + 1
        if k:
            taken = self._buf[start : start + k]
            if self._allocated is not None:
                self._mark_allocated(taken)
            # the i-th request that needs a page takes the i-th new page
            out.masked_scatter_(needs, taken * self.page_size)
        return self._as_slots(out)

    def fill_extend(
        self, prefix_lens: Tensor, seq_lens: Tensor, last_loc: Tensor, new_pages: Tensor, extend_num_tokens: int
    ) -> Tensor | None:
        """Hook for a subclass: the slots of an ``alloc_extend`` batch, or None to
        let the vectorised gather compute them (the default, always None).

        Called once the batch's pages are taken, before the gather, with
        ``prefix_lens``, ``seq_lens`` and ``last_loc`` as 1-D int64 on
        ``device``, ``extend_num_tokens > 0``, and ``new_pages`` (1-D int64)
        in the order the batch takes them: request by request, each in
        position order.  An answer must be the gather's slots (position ``t``
        of request ``i``: ``last_loc[i] + 1 + t - prefix_lens[i]`` in the open
        page, else ``page * page_size + t % page_size`` of the page holding
        it), in any integer dtype (returned as ``index_dtype``), and change
        nothing: ``new_pages`` is a view of the free stack, valid only during
        the call.  A platform whose kernel computes some batches another way
        overrides it (SGLang's NPU allocator fills batches of 200 or more new
        pages with a per-request loop).
        """
        return None

    def free(self, indices: Tensor | Sequence[int]) -> None:
        """Free the pages of slot ``indices`` (any order, repeats allowed);
        inside a free group they come back at its end.

        ``indices``: an integer tensor (any shape), or a list / tuple of ints.
        Refused with ``AllocatorError``, changing nothing: slots outside pages
        ``1..num_pages``, non-integer ids, more pages than are allocated, and
        in checked mode pages not allocated now.
        """
        if (
            self._host_mv is not None
            and isinstance(indices, Tensor)
            and indices.dtype is _I64
            and indices.is_cpu
            and indices.is_contiguous()
        ):
            m = indices.numel()
            if not m:
                return
            if self._in_group:
                # a private byte copy of the slots; pages are worked out once per group
                _aminmax(indices, out=self._minmax_out)
                lo, hi = self._minmax
                if lo < self.page_size or hi >= self._slot_end:
                    raise self._range_error(self._page_of(indices.view(-1)))
                self._pending_bytes.append(ctypes.string_at(indices.data_ptr(), 8 * m))
            else:  # range checked on the distinct pages, as Python ints
                self._release_ints(_distinct_ints(self._page_of(indices.view(-1))))
            return
        slots = self.to_ids(indices)
        if not slots.numel():
            return
        pages = self._page_of(slots)  # a new tensor: safe to keep
        if self._refs is not None:  # one holder less per page touched
            self._free_counted(_distinct(pages))
            return
        if self._in_group:
            if self._allocated is not None:
                pages = _distinct(pages)
                self._check_release(pages)
                self._mark_freed(pages)
            else:
                self._check_range(pages)
            self._pending.append(pages)
            return
        self._release(_distinct(pages))

    def free_group_end(self) -> None:
        """Free the group's pages: those of ``free`` / ``free_pages`` merged and de-duplicated in one go, then
        the ``free_page_ids`` / ``free_segment`` pages as given, in front of them (SGLang's order)."""
        if not self._in_group:
            raise AllocatorStateError("free_group_end() called without free_group_begin(); nothing changed")
        parts = list(self._pending)
        if self._pending_bytes:
            slots = torch.frombuffer(bytearray().join(self._pending_bytes), dtype=_I64)
            parts.append(self._page_of(slots))
        ids = self._pending_ids
        self._in_group = False
        try:
            pages: list[int] | Tensor | None = None
            if parts:
                merged = parts[0] if len(parts) == 1 else torch.cat(parts)
                pages = _distinct_ints(merged) if self._host_mv is not None else _distinct(merged)
            given = None if not ids else ids[0] if len(ids) == 1 else torch.cat(ids)
            total = (len(pages) if pages is not None else 0) + (given.numel() if given is not None else 0)
            if total > self._head - self._rel:  # both or neither: count them together first
                self._check_count(total)
            if given is not None and self._ids_released_first:
                self._release(given, validated=True)
            if isinstance(pages, list):
                self._release_ints(pages)
            elif pages is not None:  # checked when each free joined the group
                self._release(pages, validated=True)
            if given is not None and not self._ids_released_first:
                self._release(given, validated=True)
        except BaseException:
            self._in_group = True  # a rejected flush leaves the group as it was
            raise
        self._pending = []
        self._pending_bytes = []
        self._pending_ids = []

    # ---------------------------------------------------------- segment frees
    def free_page_ids(self, page_ids: Tensor | Sequence[int]) -> None:
        """Free exactly these pages, in this order (SGLang 0.5.23's ``free_page_ids``: no page twice, no
        de-duplication); inside a free group they come back at its end, in front of the group's other frees.

        ``page_ids``: an integer tensor or a list / tuple of ints.  Refused with ``AllocatorError``, changing
        nothing: ids outside ``1..num_pages`` (one ``aminmax``), non-integers, more pages than are allocated,
        and in checked mode pages not allocated now or repeated.
        """
        if (
            self._host_mv is not None
            and isinstance(page_ids, Tensor)
            and page_ids.dtype is _I64
            and page_ids.is_cpu
            and page_ids.is_contiguous()
        ):
            m = page_ids.numel()
            if m:
                _aminmax(page_ids, out=self._minmax_out)
                lo, hi = self._minmax
                if lo < 1 or hi > self._n:
                    raise self._range_error(page_ids.view(-1))
                if self._in_group:
                    self._pending_ids.append(page_ids.view(-1).clone())
                    return
                pos = self._park(m)
                _memmove(self._addr + 8 * pos, page_ids.data_ptr(), 8 * m)
            return
        t = self.to_ids(page_ids)
        if not t.numel():
            return
        if self._refs is not None:  # one holder less per page given
            self._free_counted(t)
            return
        self._check_units(t)
        if not self._in_group:
            self._check_count(t.numel())
        self._give_back_ids(t.clone() if self._in_group else t)

    def _give_back_ids(self, units: Tensor) -> None:
        """Free checked pages as given (a group keeps ``units`` until its end: pass a tensor nobody else writes)."""
        if self._refs is not None:
            self._free_counted(units)
        elif self._in_group:
            if self._allocated is not None:
                self._mark_freed(units)
            self._pending_ids.append(units)
        else:
            self._release(units, validated=True)

    def free_segment(self, free_index: Tensor | Sequence[int], *, start_pos: int) -> None:
        """Free segment ``kv_row[start_pos : start_pos + n]`` of one request (SGLang 0.5.23's ``free_segment``):
        ``start_pos`` on a page boundary, each page's slots in position order, so ``free_index[::page_size]``
        holds one slot of every page and those pages are freed, in row order, with no de-duplication and one
        range check on the pages (``free_page_ids``).  Checked mode also refuses a segment whose slots are
        not whole runs of their pages (where ``[::page_size]`` would miss or repeat a page).
        """
        p = self.page_size
        if type(start_pos) is not int or start_pos < 0 or start_pos % p:
            check_segment_start(start_pos, p, "free_segment")
        if (
            self._allocated is None
            and isinstance(free_index, Tensor)
            and free_index.dtype is _I64
            and (free_index.is_cpu if self._cpu else free_index.device == self.device)
        ):
            if free_index.numel():
                self.free_page_ids(self._page_of(free_index.reshape(-1)[::p] if p > 1 else free_index.reshape(-1)))
            return
        slots = self.to_ids(free_index)
        if slots.numel():
            self.free_page_ids(self._segment_units(slots))

    def _segment_units(self, free_index: Tensor | Sequence[int]) -> Tensor:
        slots = self.to_ids(free_index)
        p = self.page_size
        pages = self._page_of(slots[::p] if p > 1 else slots)
        if self._allocated is not None and p > 1:
            whole = self._page_of(slots) == pages.repeat_interleave(p)[: slots.numel()]
            if not bool(whole.all()):
                bad = slots[~whole]
                raise AllocatorError(
                    f"segment slot(s) {bad[:8].tolist()} are not in the page of the run of {p} slots they sit in: "
                    "a segment is kv_row[start_pos:...] of one request, whole pages in position order from a "
                    "page boundary; free other slot sets with free(); nothing was freed"
                )
        return pages

    # ------------------------------------------------------------- page API
    def alloc_pages(self, num_pages: int) -> list[int] | None:
        """``num_pages`` free page ids as Python ints, or None (nothing changes)."""
        head = self._head
        end = head + num_pages
        mv = self._host_mv
        if mv is not None and num_pages > 0 and end <= self._n:
            self._head = end
            if num_pages == 1:  # a decode step's new page: skip the slice object
                return [mv[head]]
            out: list[int] = mv[head:end].tolist()
            return out
        if num_pages <= 0:
            if num_pages == 0:
                return []
            raise AllocatorError(f"alloc_pages() needs a non-negative count, got {num_pages}; nothing was allocated")
        start = self._take(num_pages)
        if start is None:
            return None
        pages = self._buf[start : start + num_pages]
        if self._allocated is not None:
            self._mark_allocated(pages)
        out = pages.tolist()
        return out

    def free_pages(self, pages: Sequence[int] | Tensor) -> None:
        """Return whole pages by id; inside a free group they come back at its end.

        ``pages``: a list or tuple of ints, or an integer tensor.  Refused with
        ``AllocatorError``, changing nothing: ids outside ``1..num_pages``,
        non-integers, more pages than are allocated, and in checked mode pages
        not allocated now or repeated.
        """
        mv = self._host_mv
        if mv is not None and type(pages) is list and not (self._in_group or self.need_sort or self._snaps):
            m = len(pages)
            head = self._head - m
            if m == 1 and head >= 0:  # a decode step's page
                page = pages[0]
                if type(page) is int and 0 < page <= self._n:
                    mv[head] = page
                    self._head = head
                    return
            elif 1 < m <= 8 and head >= 0:  # a short request's pages: no array, no min / max
                n = self._n
                for page in pages:
                    if type(page) is not int or not 0 < page <= n:
                        break
                else:
                    for i, page in enumerate(pages, head):
                        mv[i] = page
                    self._head = head
                    return
            if m > 0 and head >= 0:  # (rel == pend == 0 here)
                try:
                    data = array.array("q", pages)
                except (TypeError, OverflowError):
                    data = self._ints(pages)  # raises, naming the problem
                if min(pages) < 1 or max(pages) > self._n:  # the range check
                    self._ints(pages)  # raises, naming the ids
                mv[head : head + m] = data
                self._head = head
                return
        if mv is not None and type(pages) is list and not self._in_group:
            self._release_ints(pages)
            return
        t = self.to_ids(pages)
        if not t.numel():
            return
        if self._refs is not None:
            self._free_counted(t)
            return
        if self._in_group:
            if self._allocated is not None:
                self._claim(t)
            else:
                self._check_range(t)
            self._pending.append(t.clone())
            return
        self._release(t)

    # --------------------------------------------------------------- helpers
    def _extend_aligned(
        self, pre: Tensor, seq: Tensor, last: Tensor, n_tok: int, num_new_pages: int | None = None
    ) -> Tensor | None:
        """``alloc_extend`` when every prefix ends on a page boundary: request i's
        slots are the first ``seq - pre`` slots of its new pages, so one gather
        from the new pages' slot grid serves the whole batch."""
        ext = seq - pre
        new_pages = self._page_of(ext + self._pm1)  # prefixes are aligned: ceil(ext / p)
        k = num_new_pages if num_new_pages is not None else int(new_pages.sum())
        start = self._take(k)
        if start is None:
            return None
        try:
            return self._fill_aligned(pre, seq, last, n_tok, start, k, ext, new_pages)
        except (RuntimeError, IndexError) as exc:  # lengths that disagree (default mode does not check them)
            raise self._untake(start, k, exc) from None

    def _fill_aligned(
        self, pre: Tensor, seq: Tensor, last: Tensor, n_tok: int, start: int, k: int, ext: Tensor, new_pages: Tensor
    ) -> Tensor:
        """``_extend_aligned``'s slots once its ``k`` pages are taken at ``buf[start:]``."""
        p = self.page_size
        if not n_tok:
            return self._buf.new_empty(0, dtype=self.index_dtype)
        taken = self._buf[start : start + k]
        filled = self.fill_extend(pre, seq, last, taken, n_tok)
        if filled is not None:
            return self._as_slots(filled)
        grid = torch.add(self._offsets, taken.unsqueeze(1), alpha=p)
        if ext.numel() == 1:
            return self._as_slots(grid.view(-1)[:n_tok])
        # unused slots at the end of each request's last page shift the later requests
        slack = new_pages.mul_(p).sub_(ext)
        skip = slack.cumsum(0).sub_(slack)
        index = torch.arange(n_tok, device=self.device).add_(skip.repeat_interleave(ext, output_size=n_tok))
        return self._as_slots(torch.take(grid, index))

    def _untake(self, start: int, k: int, exc: BaseException) -> AllocatorError:
        """Give back the ``k`` pages just taken at ``buf[start:]`` (a batch failed after ``_take``) and
        the error to raise: the allocator is as before the call (a ``need_sort`` merge aside)."""
        taken = self._buf[start : start + k]
        if self._allocated is not None:
            self._allocated.index_fill_(0, taken, 0)
        if self._refs is not None:
            self._refs[taken] = 0
        self._head = start
        return AllocatorError(
            f"alloc_extend(): the batch's lengths disagree ({exc}); need extend_num_tokens = "
            "sum(seq_lens - prefix_lens) and num_new_pages the pages they need; nothing was allocated"
        )

    def _as_slots(self, slots: Tensor) -> Tensor:
        """Returned slots in ``index_dtype`` (no copy when they are already)."""
        dtype = self.index_dtype
        return slots if slots.dtype is dtype else slots.to(dtype)

    def _tensors(self) -> list[Tensor]:
        return [*super()._tensors(), self._offsets]

    def _free_units(self, ids: Tensor) -> Tensor:
        return _distinct(self._page_of(ids))

    def _pending_units(self) -> list[Tensor]:
        out = [*self._pending, *self._pending_ids]
        if self._pending_bytes:
            out.append(self._page_of(torch.frombuffer(bytearray().join(self._pending_bytes), dtype=_I64)))
        return out

    def _release_unheld(self, units: Tensor) -> None:
        if self._in_group:  # the group's pages are released at its end
            if self._allocated is not None:
                self._mark_freed(units)
            self._pending.append(units)
        else:
            self._release(units, validated=True)

    def _counts_now(self) -> bool:
        return not self._in_group  # a group's pages are counted, de-duplicated, at its end

    def _valid_ids(self) -> str:
        p, n = self.page_size, self._n
        return (
            f"valid page ids are 1..{n}, i.e. slots {p}..{(n + 1) * p - 1} "
            f"(page 0, slots 0..{p - 1}, is padding and never allocated)"
        )

    def _describe(self, units: Tensor) -> str:
        pages = units[:8].tolist()
        p = self.page_size
        spans = ", ".join(f"{q * p}..{q * p + p - 1}" for q in pages)
        return f"page(s) {pages} (slots {spans})"

    def _check_extend(self, pre: Tensor, seq: Tensor, last: Tensor, n_tok: int, k: int) -> None:
        """Checked mode: validate an ``alloc_extend`` batch before anything changes."""
        if not (pre.numel() == seq.numel() == last.numel()):
            raise AllocatorError("prefix_lens, seq_lens and last_loc need one entry per request")
        check_extend_lengths(pre, seq, n_tok, k, self.page_size)
        self._check_open_pages(pre, last)

    def _check_decode(self, seq: Tensor, last: Tensor, k: int) -> None:
        """Checked mode: validate an ``alloc_decode`` batch before anything changes."""
        if seq.numel() != last.numel():
            raise AllocatorError("seq_lens and last_loc need one entry per request")
        check_decode_lengths(seq, k, self.page_size)
        self._check_open_pages(seq - 1, last)

    def _check_open_pages(self, pre: Tensor, last: Tensor) -> None:
        """Where position ``pre`` continues a page, ``last_loc`` must be the slot
        right before it, in a page this allocator handed out."""
        assert self._allocated is not None
        open_ = self._in_page(pre) != 0
        if not bool(open_.any()):
            return
        lo, po = last[open_], pre[open_]
        misplaced = self._in_page(lo + 1) != self._in_page(po)
        if bool(misplaced.any()):
            raise AllocatorError(
                f"last_loc {lo[misplaced][:8].tolist()} does not precede positions "
                f"{po[misplaced][:8].tolist()} in a page (need (last_loc + 1) % page_size == "
                "prefix_len % page_size)"
            )
        pages = self._page_of(lo)
        foreign = (pages < 1) | (pages > self._n)
        foreign |= self._allocated[pages.clamp(0, self._n)] == 0
        if bool(foreign.any()):
            raise AllocatorError(f"last_loc {lo[foreign][:8].tolist()} is not in an allocated page")


def check_extend_lengths(pre: Tensor, seq: Tensor, n_tok: int, k: int, page_size: int) -> None:
    """Checked mode: an ``alloc_extend`` batch's lengths agree (``0 <= prefix_lens <= seq_lens``,
    ``extend_num_tokens`` their sum, ``k`` the new pages they need), else ``AllocatorError``."""
    if bool((pre < 0).any()) or bool((seq < pre).any()):
        raise AllocatorError(f"need 0 <= prefix_lens <= seq_lens; got {pre.tolist()} / {seq.tolist()}")
    total = int((seq - pre).sum())
    if total != n_tok:
        raise AllocatorError(f"extend_num_tokens={n_tok} but seq_lens - prefix_lens sums to {total}")
    p = page_size
    expect = int(((seq + p - 1) // p - (pre + p - 1) // p).sum())
    if k != expect:
        raise AllocatorError(f"num_new_pages={k} but the batch needs {expect} new pages")


def check_decode_lengths(seq: Tensor, k: int, page_size: int) -> None:
    """Checked mode: an ``alloc_decode`` batch has ``seq_lens >= 1`` and ``k`` is the new pages it needs."""
    if bool((seq < 1).any()):
        raise AllocatorError(f"alloc_decode needs seq_lens >= 1, got {seq.tolist()}")
    expect = int(((seq - 1) % page_size == 0).sum())
    if k != expect:
        raise AllocatorError(f"num_new_pages={k} but the batch needs {expect} new pages")


def _batch_error(pre: Tensor | None, seq: Tensor, last: Tensor, n_tok: int) -> AllocatorError:
    """The error of a batch whose tensors disagree in length (or with ``extend_num_tokens < 0``)."""
    lens = f"{seq.numel()} seq_lens and {last.numel()} last_loc"
    if pre is None:
        return AllocatorError(f"alloc_decode(): {lens}; need one entry per request; nothing was allocated")
    return AllocatorError(
        f"alloc_extend(): {pre.numel()} prefix_lens, {lens} and extend_num_tokens={n_tok}; need one entry per "
        "request and extend_num_tokens = sum(seq_lens - prefix_lens) >= 0; nothing was allocated"
    )


def _distinct_ints(pages: Tensor) -> list[int]:
    """``_distinct`` for CPU tensors, as Python ints, ascending (as SGLang's ``torch.unique``, so freed
    pages are reused in the same order): after collapsing runs only ~n/page_size ids are left, which
    ``set`` and ``sorted`` handle faster than one more torch op."""
    return sorted(set(torch.unique_consecutive(pages).tolist()))


def _distinct(pages: Tensor) -> Tensor:
    """Distinct page ids of per-slot page ids, ascending.

    A request's slots repeat each page id up to ``page_size`` times in a row:
    collapsing runs first (O(n)) leaves the sort in ``unique`` ~page_size
    times less to do; the result is exact for any order.
    """
    out: Tensor = torch.unique(torch.unique_consecutive(pages))
    return out
