"""SGLang's ``NPUPagedTokenToKVPoolAllocator`` (``hardware_backend/npu/allocator_npu.py``) for Ascend plans.

SGLang builds it on an NPU whenever the attention backend is ``ascend`` (the NPU's
default) or the model is a hybrid GDN one, unless the model is a hybrid SWA one
(``_build_token_to_kv_pool_allocator``): those get the SWA allocators, which the
``swa`` and ``dsv4`` plugins build.  It is SGLang's paged allocator with three
changes, kept here on top of the core's ``PagedAllocator``:

* slot indices are int32 (what ``torch_npu``'s cache writes take);
* ``alloc_extend`` fills batches of ``NAIVE_EXTEND_PAGES`` (200) or more new pages
  with a per-request loop, ``alloc_extend_naive``, instead of its Triton kernel;
* ``alloc_decode`` is one torch expression, and ``free`` finds the distinct pages
  of the freed slots on the host.

The free list is the core's (SGLang's NPU class inherits its paged parent's), so
the allocator holds exactly the bytes the plan charges for the core paged one.

Planning loads this plugin and must not import torch (``kvpools plan`` stays
fast), so ``NPUPagedAllocator`` is defined on first use:
``from kvpools_ascend.allocator import NPUPagedAllocator`` imports torch then.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import TYPE_CHECKING, Any

from kvpools_ascend.names import on_ascend
from kvpools_core import hookimpl
from kvpools_core.values import FULL_TOKENS, TOKEN, Plan

if TYPE_CHECKING:
    from kvpools_core.allocators.paged import PagedAllocator

__all__ = ["build_allocator"]

NAIVE_EXTEND_PAGES = 200
"""From this many new pages on, the NPU ``alloc_extend`` runs ``alloc_extend_naive``
(SGLang: ``num_new_pages < 200`` runs ``sgl_kernel_npu``'s Triton kernel)."""


def __getattr__(name: str) -> Any:
    if name == "NPUPagedAllocator":
        return npu_paged_allocator_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def npu_paged_allocator_class() -> type[PagedAllocator]:
    """``NPUPagedAllocator``, defined (and torch imported) on the first call."""
    from typing import ClassVar

    import torch
    from torch import Tensor

    from kvpools_core.allocators.paged import PagedAllocator
    from kvpools_core.errors import AllocatorError

    class NPUPagedAllocator(PagedAllocator):
        """Paged KV-slot allocator with SGLang's NPU semantics (see the module): int32 slots."""

        index_dtype: torch.dtype = torch.int32
        naive_extend_pages: ClassVar[int] = NAIVE_EXTEND_PAGES

        def fill_extend(
            self, prefix_lens: Tensor, seq_lens: Tensor, last_loc: Tensor, new_pages: Tensor, extend_num_tokens: int
        ) -> Tensor | None:
            """The per-request loop for batches of ``naive_extend_pages`` or more new
            pages; smaller ones take the core's vectorised gather, which gives what
            SGLang's kernel gives (the tests check that the two paths agree)."""
            if new_pages.numel() < self.naive_extend_pages:
                return None
            return self.alloc_extend_naive(prefix_lens, seq_lens, last_loc, new_pages, extend_num_tokens)

        def alloc_extend_naive(
            self, prefix_lens: Tensor, seq_lens: Tensor, last_loc: Tensor, new_pages: Tensor, extend_num_tokens: int
        ) -> Tensor:
            """SGLang's ``alloc_extend_naive``: the int32 slots of an extend batch, request by request.

            Per request, three runs: the rest of the open page after ``last_loc``,
            the new pages it fills, and the first slots of a last, partly filled
            new page.  ``new_pages`` are the batch's new pages in the order the
            requests take them; nothing is taken or changed here.  The lengths
            come to the host once (SGLang reads them per request, a sync each);
            the slot runs are written on the allocator's device.
            """
            p = self.page_size
            out = torch.empty(extend_num_tokens, dtype=torch.int32, device=self.device)
            in_page = torch.arange(p, dtype=torch.int32, device=self.device)
            pages = new_pages.to(torch.int32)
            out_start = page_start = 0
            for pre, seq, last in zip(prefix_lens.tolist(), seq_lens.tolist(), last_loc.tolist(), strict=True):
                pages_pre = -(-pre // p)  # pages the prefix already (partly) fills
                open_run = min(seq, pages_pre * p) - pre
                whole = max(seq // p - pages_pre, 0)  # new pages filled to their end
                tail = seq - max(seq // p, pages_pre) * p  # > 0: slots on a last, partly filled new page
                if open_run:
                    out[out_start : out_start + open_run] = in_page[:open_run] + (last + 1)
                start = out_start + open_run
                if whole:
                    run = pages[page_start : page_start + whole, None] * p + in_page
                    out[start : start + whole * p] = run.view(-1)
                    start += whole * p
                if tail > 0:
                    out[start : start + tail] = in_page[:tail] + pages[page_start + whole] * p
                    page_start += 1
                page_start += whole
                out_start += seq - pre
            return out

        def alloc_decode(
            self, seq_lens: Tensor, last_loc: Tensor, *, num_new_pages: int | None = None
        ) -> Tensor | None:
            """SGLang's NPU decode, ``(last_loc + 1) * (1 - need) + free[cumsum(need) - need] * P * need``
            with ``need = (seq_lens % P == 1)``, taking ``need.sum()`` pages; or None (nothing changes).

            At page size 1 that ``need`` is never set (SGLang's scheduler then takes
            decode slots with ``alloc``), so page size 1 keeps the core's one fresh
            slot per request.
            """
            p = self.page_size
            if p == 1:
                return super().alloc_decode(seq_lens, last_loc, num_new_pages=num_new_pages)
            seq = self._as_index(seq_lens)
            last = self._as_index(last_loc)
            if seq.numel() != last.numel():  # O(1), before any page is taken
                raise AllocatorError(
                    f"alloc_decode(): {seq.numel()} seq_lens and {last.numel()} last_loc; need one entry per "
                    "request; nothing was allocated"
                )
            need = (seq % p == 1).to(torch.int64)
            k = int(need.sum()) if num_new_pages is None else num_new_pages
            if self._allocated is not None:
                self._check_decode(seq, last, k)
            start = self._take(k)
            if start is None:
                return None
            if not k:
                return self._as_slots(last + 1)
            taken = self._buf[start : start + k]
            if self._allocated is not None:
                self._mark_allocated(taken)
            # requests after the last one that needs a page read index k (SGLang reads the next free
            # page there); masked out either way, the clamp keeps the read inside the taken pages
            index = (need.cumsum(0) - need).clamp_(max=k - 1)
            return self._as_slots((last + 1) * (1 - need) + taken[index] * p * need)

        def free(self, indices: Tensor | Sequence[int]) -> None:
            """SGLang's NPU free: the distinct pages of the slots, found on the host
            (``torch.unique(slots.cpu() // P)``), given back as ``free_pages`` does.

            Slots of any integer dtype (this allocator returns int32), in any order,
            repeats allowed; refused as the core's ``free`` refuses them.
            """
            if not isinstance(indices, Tensor) or not _is_integer(indices.dtype) or indices.is_meta:
                super().free(indices)  # Python ints are on the host already; the core refuses the others
                return
            if indices.numel():
                self.free_pages(torch.unique(indices.detach().reshape(-1).cpu() // self.page_size))

    def _is_integer(dtype: torch.dtype) -> bool:
        return not (dtype.is_floating_point or dtype.is_complex or dtype is torch.bool)

    NPUPagedAllocator.__module__ = __name__
    NPUPagedAllocator.__qualname__ = "NPUPagedAllocator"
    return NPUPagedAllocator


def kv_slots_in_one_token_space(plan: Plan) -> bool:
    """Whether every token pool of the plan lives in the full token space: SGLang's
    ``not is_hybrid_swa``.  A sliding-window (or DeepSeek-V4 compressed) token space
    takes an SWA allocator, which the plugin that owns that space builds."""
    return all(pool.token_space == FULL_TOKENS for pool in plan.pools if pool.unit == TOKEN)


@hookimpl(tryfirst=True)
def build_allocator(plan: Plan, pool: Any, device: str, checked: bool) -> PagedAllocator | None:
    """The NPU paged allocator for Ascend plans of one KV token space and ``page_size > 1``.

    SGLang builds it at page size 1 too, but there its scheduler only calls
    ``alloc`` / ``free`` (the core token allocator's slots) and the plan charges
    the token allocator's free list, without the paged one's in-page offsets:
    those plans keep the core token allocator, so a build holds exactly the
    planned bytes.  (Ascend plans need page 128; page 1 comes only from a
    plan made for another platform and built on an ``npu`` device.)
    """
    if not on_ascend(plan, device) or plan.serving.page_size == 1 or not kv_slots_in_one_token_space(plan):
        return None
    return npu_paged_allocator_class()(
        plan.max_total_num_tokens,
        plan.serving.page_size,
        device=device,
        kvcache=pool,
        need_sort=plan.serving.disaggregation_mode in ("prefill", "decode"),
        checked=checked,
    )
