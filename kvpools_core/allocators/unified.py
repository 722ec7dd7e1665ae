"""SGLang 0.5.23's multi-ended allocators over one unified byte arena (``--enable-unified-memory``).

One arena (:class:`UnifiedArena`) holds two END sub-pools growing towards each
other: the grow-up END from the sink at the bottom, the grow-down END from
the top.  Each has a :class:`MultiEndedAllocator`
(``mem_cache/allocator/unified_sub_pool.py``) whose contract this module
reproduces:

* **virtual ids above the allocator.**  The scheduler sees *virtual* page ids
  (handed out from ``free_virtual_ids`` in FIFO order, page 0 reserved);
  each sub-pool keeps a virtual-to-physical page table ``virtual_to_physical``
  and its inverse ``physical_to_virtual``.  :meth:`MultiEndedAllocator.translate_kv_loc`
  maps virtual token ids to the physical ones kernels index
  (``v2p[t // ps] * ps + t % ps``; unmapped, negative or out-of-range ids go
  to 0, the sink).
* **two watermarks and the shared gap.**  Each END's watermark bounds its
  live band; the bytes between the two frontiers are the shared gap either
  side may grow into.  ``available_size()`` is what an allocation may take
  *now* (gap bytes, own index space, own holes); ``schedulable_available_size()``
  adds the holes an urgent flush of the growth-side neighbour would release.
* **eager compaction** (``lazy_compaction=False``): a free moves the pages
  left in the band it vacates into the holes it made, so a band is always
  dense and the watermark retreats at once.
* **lazy compaction** (SGLang's default): a free only records holes; holes are
  reused first (nearest the END's own end), and flushed
  (survivors from the frontier moved into the holes, the watermark retreated)
  when the engine is idle (:meth:`~MultiEndedAllocator.flush_opportunistic`,
  at most 4,096 moves) or when a neighbour is short
  (:meth:`~MultiEndedAllocator.flush_for_allocation`, a full pack).

The composites: :class:`UnifiedMambaAllocator` (full KV grow-down, one state
slot per request grow-up) and :class:`UnifiedSWAAllocator` (full KV grow-down
owning the virtual ids, SWA KV grow-up binding the same virtual pages; an SWA
page released by ``free_swa`` returns its bytes to the shared gap, so the
full side can grow into them).  The Mamba+SWA chain, with SWA floating in the
middle, is in :mod:`kvpools_core.allocators.unified_float`.

Page moves copy data through the KV pool handed in as ``kvcache`` when it has
``move_physical_pages(dst_pages, src_pages, page_size)``.  Frees are range
checked (virtual ids in the allocator's space, past the sink page); with
``checked=True`` a free of a page not allocated now, or twice in one call, is
refused too.  CUDA events, transfer gates and HiCache reservations are not
modelled: on a CPU every flushed page is reusable at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import torch
from torch import Tensor

from kvpools_core.allocators.contract import BaseTokenToKVPoolAllocator
from kvpools_core.errors import AllocatorError
from kvpools_core.parts.unified import SubPoolEntry, SubPoolGeometry, sink_bytes, sub_pool_geometry

__all__ = [
    "LAZY_MAX_MOVES_PER_CALL",
    "MultiEndedAllocator",
    "UnifiedArena",
    "UnifiedMambaAllocator",
    "UnifiedSWAAllocator",
]

LAZY_MAX_MOVES_PER_CALL = 4096
"""``SGLANG_LAZY_COMPACTION_MAX_MOVES_PER_CALL``'s default: the move cap of one non-urgent flush."""

_I64 = torch.int64


@attrs.frozen
class UnifiedArena:
    """The arena's geometry: total bytes, the sink, and each sub-pool's index space and grow direction."""

    total_bytes: int
    page_size: int
    sink_bytes: int
    geometry: dict[str, SubPoolGeometry]
    grow_direction: dict[str, str]

    @classmethod
    def build(cls, total_bytes: int, sub_pools: Sequence[tuple[SubPoolEntry, str]], page_size: int) -> UnifiedArena:
        """An arena of ``total_bytes`` for ``(entry, "up" | "down")`` pairs: exactly one END each way."""
        directions = sorted(d for _, d in sub_pools)
        if directions not in (["down", "up"], ["down", "float", "up"]):
            raise AllocatorError(
                f"a unified arena needs exactly one grow-up and one grow-down END sub-pool, and at most one "
                f"floating middle; got {directions}"
            )
        entries = [e for e, _ in sub_pools]
        sink = sink_bytes(entries, page_size)
        return cls(
            total_bytes,
            page_size,
            sink,
            {e.name: sub_pool_geometry(total_bytes, e, sink, page_size) for e in entries},
            {e.name: d for e, d in sub_pools},
        )


class MultiEndedAllocator(BaseTokenToKVPoolAllocator):
    """One END sub-pool of a :class:`UnifiedArena` (SGLang's ``MultiEndedAllocator``)."""

    def __init__(
        self,
        *,
        arena: UnifiedArena,
        sub_pool_name: str,
        is_id_owner: bool = True,
        virtual_num_pages: int | None = None,
        lazy_compaction: bool = True,
        kvcache: Any = None,
        device: str | torch.device = "cpu",
        need_sort: bool = False,
        checked: bool = False,
        virtual_min_page: int | None = None,
    ) -> None:
        g = arena.geometry[sub_pool_name]
        super().__init__(g.max_slots, g.page_size, None, device, kvcache, need_sort)
        if virtual_num_pages is not None and is_id_owner:
            raise AllocatorError("only a non-owner allocator may use another pool's virtual-id space")
        self.arena = arena
        self.sub_pool_name = sub_pool_name
        self.grow_direction = arena.grow_direction[sub_pool_name]
        self.max_slots = g.max_slots
        self.min_slot_index = g.min_slot_index
        self.num_pages = g.num_pages
        self.min_page_index = g.min_page_index
        self.entry_bytes = g.entry_bytes
        self.entry_bytes_per_page = g.entry_bytes_per_page
        self.is_id_owner = is_id_owner
        self.lazy_compaction = lazy_compaction
        self.checked = checked
        self.num_virtual_ids = g.num_pages if virtual_num_pages is None else virtual_num_pages
        # a non-owner binds the owner's virtual pages, which start past the owner's sink, not its own
        self._virtual_min_page = g.min_page_index if virtual_min_page is None else virtual_min_page
        self.virtual_to_physical = torch.empty(self.num_virtual_ids + 1, dtype=_I64, device=device)
        self.physical_to_virtual = torch.empty(self.num_pages + 1, dtype=_I64, device=device)
        self.low_peer: MultiEndedAllocator | None = None
        self.high_peer: MultiEndedAllocator | None = None
        self._up = self.grow_direction == "up"
        self._mover = getattr(kvcache, "move_physical_pages", None)
        self._offsets = torch.arange(g.page_size, dtype=_I64, device=device)
        self.clear()

    @property
    def nbytes(self) -> int:
        """Bytes of the tables this END holds now (page tables, offsets, free virtual ids, holes)."""
        tables = (self.virtual_to_physical, self.physical_to_virtual, self._offsets, self.free_virtual_ids, self._holes)
        return sum(t.numel() * t.element_size() for t in tables if t is not None)

    # ------------------------------------------------------------------ state
    def bind_peer(self, peer: MultiEndedAllocator) -> None:
        """Bind the other END as this END's growth-side neighbour."""
        if self._up:
            self.high_peer = peer
        else:
            self.low_peer = peer

    def clear(self) -> None:
        """Back to empty: watermark at the END, every virtual page past the sink free, no holes."""
        self.watermark_physical = self.min_page_index if self._up else self.num_pages - 1
        self.virtual_to_physical.fill_(-1)
        self.virtual_to_physical[0] = 0
        self.physical_to_virtual.fill_(-1)
        self.physical_to_virtual[0] = 0
        self.free_virtual_ids: Tensor | None = (
            torch.arange(self.min_page_index, self.num_pages, dtype=_I64, device=self.device)
            if self.is_id_owner
            else None
        )
        self._holes = torch.empty(0, dtype=_I64, device=self.device)
        self._holes_sorted = True
        self.live_page_count = 0
        self.free_group: list[Tensor] | None = None

    @property
    def holes(self) -> Tensor:
        """Physical pages freed but not compacted yet (lazy mode), in free order (a copy)."""
        return self._holes.clone()

    def _allocated_pages(self) -> int:
        if self._up:
            return max(0, self.watermark_physical - self.min_page_index)
        return max(0, self.num_pages - 1 - self.watermark_physical)

    def allocated_count(self) -> int:
        """Live tokens (lazy: the holes inside the band are not live)."""
        pages = self.live_page_count if self.lazy_compaction else self._allocated_pages()
        return pages * self.page_size

    def _low_frontier(self) -> int:
        return (self.min_page_index if self._up else self.watermark_physical + 1) * self.entry_bytes_per_page

    def _high_frontier(self) -> int:
        return (self.watermark_physical if self._up else self.num_pages) * self.entry_bytes_per_page

    def _transparent(self) -> bool:
        """Whether chain walks see through this member (an END never; an empty float middle does)."""
        return False

    def _above(self) -> int:
        """The low frontier of the nearest opaque member above, or the arena's top."""
        p = self.high_peer
        while p is not None and p._transparent():
            p = p.high_peer
        return self.arena.total_bytes if p is None else p._low_frontier()

    def _below(self) -> int:
        """The high frontier of the nearest opaque member below, or 0."""
        p = self.low_peer
        while p is not None and p._transparent():
            p = p.low_peer
        return 0 if p is None else p._high_frontier()

    def _gap_bytes(self) -> int:
        if self._up:
            return max(0, self._above() - self._high_frontier())
        return max(0, self._low_frontier() - self._below())

    def _neighbour(self) -> MultiEndedAllocator | None:
        """The nearest opaque member on this END's growth side."""
        p = self.high_peer if self._up else self.low_peer
        while p is not None and p._transparent():
            p = p.high_peer if self._up else p.low_peer
        return p

    def _available_tokens(self, extra_gap_bytes: int = 0) -> int:
        pages = min(
            (self._gap_bytes() + extra_gap_bytes) // self.entry_bytes_per_page,
            self.num_pages - self.min_page_index - self._allocated_pages(),
        )
        if self.lazy_compaction:
            pages += self._holes.numel()
        return pages * self.page_size

    def available_size(self) -> int:
        """Tokens allocatable right now: the shared gap, own index space and own holes; no peer compaction."""
        return self._available_tokens()

    def schedulable_available_size(self) -> int:
        """``available_size()`` plus the gap an urgent flush of the growth-side neighbour would release."""
        n = self._neighbour()
        extra = n._holes.numel() * n.entry_bytes_per_page if n is not None and n.lazy_compaction else 0
        return self._available_tokens(extra)

    # ------------------------------------------------------------------ alloc
    def alloc(self, need_size: int) -> Tensor | None:
        """``need_size`` virtual token ids (whole pages), or None (nothing changes)."""
        if not self.is_id_owner:
            raise AllocatorError(f"alloc on the non-owner sub-pool {self.sub_pool_name!r}: use alloc_with_virtual")
        if need_size <= 0:
            return torch.empty(0, dtype=_I64, device=self.device)
        ps = self.page_size
        if need_size % ps:
            raise AllocatorError(f"alloc({need_size}): need a multiple of page_size={ps}; nothing was allocated")
        if need_size > self._available_tokens() and not self._relieve(need_size):
            return None
        k = need_size // ps
        fv = self.free_virtual_ids
        assert fv is not None
        if k > fv.numel():
            return None
        v_pages = fv[:k]
        if self._bind_new(v_pages, k) is None:
            return None
        self.free_virtual_ids = fv[k:]
        return self._tokens(v_pages)

    def alloc_with_virtual(self, virtual_pages: Tensor) -> None:
        """Back caller-supplied virtual pages (a non-owner binding the owner's ids) with physical pages."""
        if virtual_pages.numel() and self._bind_new(virtual_pages, virtual_pages.numel()) is None:
            raise AllocatorError(
                f"sub-pool {self.sub_pool_name!r}: no physical room for {virtual_pages.numel()} pages "
                "(the composite's joint capacity check should have refused the allocation)"
            )

    def alloc_extend(
        self, prefix_lens: Tensor, seq_lens: Tensor, last_loc: Tensor, extend_num_tokens: int
    ) -> Tensor | None:
        """Paged extend in virtual space: the open page after ``last_loc`` first, then fresh virtual pages."""
        pre, seq, last = (torch.as_tensor(t, dtype=_I64, device=self.device) for t in (prefix_lens, seq_lens, last_loc))
        k = _new_pages(pre, seq, self.page_size)
        fv = self.free_virtual_ids
        if fv is None or k > fv.numel():
            return None
        if k * self.page_size > self._available_tokens() and not self._relieve(k * self.page_size):
            return None
        new_pages = fv[:k]
        out = _extend_slots(pre, seq, last, new_pages, extend_num_tokens, self.page_size)
        if k and self._bind_new(new_pages, k) is None:
            return None
        self.free_virtual_ids = fv[k:]
        return out

    def alloc_decode(self, seq_lens: Tensor, last_loc: Tensor) -> Tensor | None:
        """One virtual token per request: ``last_loc + 1``, or a fresh page's first token."""
        seq = torch.as_tensor(seq_lens, dtype=_I64, device=self.device)
        last = torch.as_tensor(last_loc, dtype=_I64, device=self.device)
        return self.alloc_extend(seq - 1, seq, last, int(seq.numel()))

    def _relieve(self, need_tokens: int) -> bool:
        """SGLang's shortfall ladder for an END: urgently flush the growth-side neighbour, look again; a float
        neighbour is then asked to open the side facing this END (``_float_open_short_side``)."""
        n = self._neighbour()
        if n is not None:
            n.flush_for_allocation()
        if need_tokens <= self._available_tokens():
            return True
        n = self._neighbour()
        if n is not None and n.grow_direction == "float":
            n.open_short_side({self: -(-need_tokens // self.page_size)})  # type: ignore[attr-defined]
        return need_tokens <= self._available_tokens()

    def _bind_new(self, v_pages: Tensor, k: int) -> Tensor | None:
        """Physical pages for ``k`` virtual pages: holes first (lazy), then the watermark; bound both ways."""
        if not self.lazy_compaction or not self._holes.numel():
            start = self.watermark_physical
            if not self._extend(k):
                return None
            lo = start if self._up else start - k + 1
            phys = torch.arange(lo, lo + k, dtype=_I64, device=self.device)
            if self.lazy_compaction:
                self.live_page_count += k
            self.virtual_to_physical[v_pages] = phys
            self.physical_to_virtual[lo : lo + k] = v_pages  # a contiguous range: a slice copy, no scatter
            return phys
        else:
            n_drain = min(k, self._holes.numel())
            more = k - n_drain
            if more and not self._extend(more):
                return None
            drained = self._take_holes(n_drain)
            if more:
                wm = self.watermark_physical
                ext = (
                    torch.arange(wm - more, wm, dtype=_I64, device=self.device)
                    if self._up
                    else torch.arange(wm + more, wm, -1, dtype=_I64, device=self.device)
                )
                phys = torch.cat((drained, ext))
            else:
                phys = drained
        if self.lazy_compaction:
            self.live_page_count += k
        self.virtual_to_physical[v_pages] = phys
        self.physical_to_virtual[phys] = v_pages
        return phys

    def _extend(self, k: int) -> bool:
        """Move the watermark ``k`` pages into the gap; False (nothing changes) past the index space or a frontier."""
        if self._up:
            new = self.watermark_physical + k
            if new > self.num_pages or (self.lazy_compaction and new > self._above() // self.entry_bytes_per_page):
                return False
        else:
            new = self.watermark_physical - k
            if new < self.min_page_index - 1 or (
                self.lazy_compaction and new + 1 < self._below() // self.entry_bytes_per_page
            ):
                return False
        self.watermark_physical = new
        return True

    def _take_holes(self, n: int) -> Tensor:
        """``n`` holes from this END's own side of the ascending hole list (all of them: in free order)."""
        holes = self._holes
        if n == holes.numel():
            self._holes, self._holes_sorted = holes[:0], True
            return holes
        if not self._holes_sorted:
            holes = torch.sort(holes).values
        if self._up:
            taken, self._holes = holes[:n], holes[n:]
        else:
            taken, self._holes = holes[holes.numel() - n :], holes[: holes.numel() - n]
        self._holes_sorted = True
        return taken

    def _tokens(self, pages: Tensor) -> Tensor:
        if self.page_size == 1:
            return pages.clone()
        return torch.add(self._offsets, pages.unsqueeze(1), alpha=self.page_size).view(-1)

    # ------------------------------------------------------------------- free
    def free(self, free_index: Tensor | Sequence[int], *, _pages: Tensor | None = None) -> None:
        """Free virtual token ids (their whole pages); eager mode compacts at once, lazy mode records holes."""
        idx = torch.as_tensor(free_index, device=self.device)
        if idx.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(idx.clone())
            return
        v_pages = _pages if _pages is not None else self._virtual_pages(idx)
        phys = self.virtual_to_physical[v_pages]
        if not self.lazy_compaction or self.checked:
            self._check_bound(v_pages, phys)
        self.virtual_to_physical[v_pages] = -1
        if self.is_id_owner:
            assert self.free_virtual_ids is not None
            self.free_virtual_ids = torch.cat((self.free_virtual_ids, v_pages))
        if self.lazy_compaction:
            self.physical_to_virtual[phys] = -1
            self._holes = torch.cat((self._holes, phys))
            self._holes_sorted = self._holes.numel() <= 1
            self.live_page_count -= phys.numel()
        else:
            self._compact_eager(phys)

    def free_group_begin(self) -> None:
        self.free_group = []

    def free_group_end(self) -> None:
        group, self.free_group = self.free_group, None
        if group:
            self.free(torch.cat(group))

    def _virtual_pages(self, idx: Tensor) -> Tensor:
        """The distinct virtual pages of token ids ``idx``, range checked (one ``aminmax``)."""
        if idx.dtype.is_floating_point or idx.dtype == torch.bool:
            raise AllocatorError(f"free: token ids must be integers, got dtype {idx.dtype}; nothing was freed")
        idx = idx.to(_I64).reshape(-1)
        ps = self.page_size
        lo, hi = torch.aminmax(idx)
        lo_ok, hi_ok = self._virtual_min_page * ps, self.num_virtual_ids * ps - 1
        if int(lo) < lo_ok or int(hi) > hi_ok:
            raise AllocatorError(
                f"free on sub-pool {self.sub_pool_name!r}: token ids must lie in {lo_ok}..{hi_ok} (past the "
                f"sink page), got {int(lo)}..{int(hi)}; nothing was freed"
            )
        if ps == 1 and self.lazy_compaction and not self.checked:
            return idx  # SGLang: callers pass distinct ids at page size 1
        pages: Tensor = torch.unique(idx // ps)
        if ps == 1 and self.checked and pages.numel() != idx.numel():
            raise AllocatorError(
                f"free on sub-pool {self.sub_pool_name!r}: a token id appears twice in one free (checked mode); "
                "nothing was freed"
            )
        return pages

    def _check_bound(self, v_pages: Tensor, phys: Tensor) -> None:
        bad = phys < 0
        if bool(bad.any()):
            raise AllocatorError(
                f"free on sub-pool {self.sub_pool_name!r}: virtual page(s) {v_pages[bad].tolist()[:8]} are not "
                "allocated (a double free, or ids never handed out); nothing was freed"
            )

    def _compact_eager(self, freed: Tensor) -> None:
        """Move the survivors of the band the free vacates into the holes it made; retreat the watermark."""
        k = freed.numel()
        old = self.watermark_physical
        if self._up:
            new = old - k
            band = torch.arange(new, old, dtype=_I64, device=self.device)
            dst = torch.sort(freed[freed < new]).values
        else:
            new = old + k
            band = torch.arange(old + 1, new + 1, dtype=_I64, device=self.device)
            dst = torch.sort(freed[freed > new]).values
        src = band[~torch.isin(band, freed)]
        self.watermark_physical = new
        if src.numel():
            self._move(src, dst)
        self.physical_to_virtual[band] = -1

    def _move(self, src: Tensor, dst: Tensor) -> None:
        """Copy pages ``src`` to ``dst`` (disjoint) and rebind their virtual pages; ``p2v[src]`` is left to callers."""
        v = self.physical_to_virtual[src]
        if self._mover is not None:
            self._mover(dst, src, self.page_size)
        self.virtual_to_physical[v] = dst
        self.physical_to_virtual[dst] = v

    # ------------------------------------------------------------------ flush
    def flush_for_allocation(self) -> int:
        """Urgent flush (a neighbour is short): pack the band completely and retreat past every hole."""
        return self._flush(urgent=True)

    def flush_opportunistic(self) -> int:
        """Idle-time flush: absorb holes at the frontier, move up to 4,096 survivors into holes."""
        if not self.lazy_compaction or not self._holes.numel():
            return 0
        return self._flush(urgent=False)

    def _flush(self, *, urgent: bool) -> int:
        if not self.lazy_compaction or not self._holes.numel():
            return 0
        holes = torch.sort(self._holes).values
        n = holes.numel()
        wm = self.watermark_physical
        # absorb the holes already contiguous with the frontier
        if self._up:
            run = holes.flip(0) == torch.arange(wm - 1, wm - 1 - n, -1, dtype=_I64, device=self.device)
        else:
            run = holes == torch.arange(wm + 1, wm + 1 + n, dtype=_I64, device=self.device)
        m = int(run.cumprod(0).sum())
        if self._up:
            wm -= m
            holes = holes[: n - m]
        else:
            wm += m
            holes = holes[m:]
        self.watermark_physical = wm
        n_holes = holes.numel()
        moved = 0
        if n_holes:
            cap = n_holes if urgent else min(n_holes, LAZY_MAX_MOVES_PER_CALL)
            # the `cap` survivors nearest the frontier lie within `cap + n_holes` pages of it
            span = cap + n_holes
            if self._up:
                lo = max(self.min_page_index, wm - span)
                band = torch.arange(lo, wm, dtype=_I64, device=self.device)
                live = band[~torch.isin(band, holes)].flip(0)[:cap]
                dst = holes[: live.numel()]
                moved = int((live > dst).sum())
            else:
                hi = min(self.num_pages, wm + 1 + span)
                band = torch.arange(wm + 1, hi, dtype=_I64, device=self.device)
                live = band[~torch.isin(band, holes)][:cap]
                dst = holes.flip(0)[: live.numel()]
                moved = int((live < dst).sum())
            src, dst = live[:moved], dst[:moved]
            if moved:
                self._move(src, dst)
                self.physical_to_virtual[src] = -1
            if urgent:
                self.watermark_physical = wm - n_holes if self._up else wm + n_holes
                holes = holes[:0]
            else:
                rest = holes[moved:] if self._up else holes[: n_holes - moved]
                holes = torch.cat((rest, src)) if moved else rest
        self._holes = holes
        self._holes_sorted = not moved or urgent
        return moved

    # -------------------------------------------------------------- translate
    def translate_kv_loc(self, virt_tokens: Tensor) -> Tensor:
        """Virtual token ids -> physical token ids; unmapped, negative or out-of-range ids -> 0 (the sink)."""
        t = torch.as_tensor(virt_tokens, device=self.device).to(_I64)
        ps = self.page_size
        page = torch.div(t, ps, rounding_mode="floor")
        ok = (t >= 0) & (page < self.num_virtual_ids)
        p = self.virtual_to_physical[torch.where(ok, page, 0)]
        return torch.where(ok & (p >= 0), p * ps + t % ps, 0)

    def is_slot_allocated(self, slot: int) -> bool:
        page = slot // self.page_size
        return 0 <= page < self.num_virtual_ids and int(self.virtual_to_physical[page]) != -1


def _new_pages(pre: Tensor, seq: Tensor, ps: int) -> int:
    return int(((seq + ps - 1) // ps - (pre + ps - 1) // ps).sum()) if seq.numel() else 0


def _extend_slots(pre: Tensor, seq: Tensor, last: Tensor, new_pages: Tensor, n_tok: int, ps: int) -> Tensor:
    """Token ids for positions ``pre..seq-1`` per request: the open page after ``last``, then ``new_pages`` in order."""
    if n_tok == 0:
        return torch.empty(0, dtype=_I64, device=pre.device)
    ext = seq - pre
    pages_pre = (pre + ps - 1) // ps
    pages_seq = (seq + ps - 1) // ps
    page_base = (pages_seq - pages_pre).cumsum(0) - pages_seq
    req = torch.repeat_interleave(torch.arange(ext.numel(), device=pre.device), ext, output_size=n_tok)
    first = ext.cumsum(0) - ext
    pos = torch.arange(n_tok, device=pre.device) - first[req] + pre[req]
    in_open = pos < pages_pre[req] * ps
    page_idx = (pos // ps + page_base[req]).clamp(min=0, max=max(new_pages.numel() - 1, 0))
    fresh = new_pages[page_idx] * ps + pos % ps if new_pages.numel() else pos
    return torch.where(in_open, pos + last[req] + 1 - pre[req], fresh)


UNIFIED_ALLOCATOR_POOL = "unified_allocator"
"""The plan pool that charges the unified allocators' tables (``kvpools_core.parts.unified_plan.ALLOCATOR_POOL``)."""


class _TablesMixin:
    """``nbytes`` / ``nbytes_by_pool`` of a composite: the sum of its ENDs' tables."""

    def _ends(self) -> tuple[MultiEndedAllocator, ...]:
        raise NotImplementedError

    @property
    def nbytes(self) -> int:
        return sum(end.nbytes for end in self._ends())

    def nbytes_by_pool(self) -> dict[str, int]:
        return {UNIFIED_ALLOCATOR_POOL: self.nbytes}


class UnifiedMambaAllocator(_TablesMixin, BaseTokenToKVPoolAllocator):
    """Full KV (grow-down END) + Mamba state (grow-up END): SGLang's ``UnifiedMambaTokenToKVPoolAllocator``.

    The token surface (``alloc*``, ``free``, ``translate_kv_loc``) is the full
    side; ``mamba_allocator`` hands out one state slot per request
    (``mamba_allocator.alloc(1)``), page size 1, its own virtual ids.
    """

    def __init__(
        self,
        arena: UnifiedArena,
        *,
        full: str = "full",
        mamba: str = "mamba",
        lazy_compaction: bool = True,
        kvcache: Any = None,
        device: str | torch.device = "cpu",
        checked: bool = False,
    ) -> None:
        g = arena.geometry[full]
        super().__init__(g.max_slots - 1, arena.page_size, None, device, kvcache, False)
        self.arena = arena
        kw = {"arena": arena, "lazy_compaction": lazy_compaction, "device": device, "checked": checked}
        self.full_attn_allocator = MultiEndedAllocator(sub_pool_name=full, **kw)  # type: ignore[arg-type]
        self.mamba_allocator = MultiEndedAllocator(sub_pool_name=mamba, **kw)  # type: ignore[arg-type]
        self.full_attn_allocator.bind_peer(self.mamba_allocator)
        self.mamba_allocator.bind_peer(self.full_attn_allocator)

    def _ends(self) -> tuple[MultiEndedAllocator, ...]:
        return (self.full_attn_allocator, self.mamba_allocator)

    @property
    def size(self) -> int:
        f = self.full_attn_allocator
        return f.schedulable_available_size() + f.allocated_count()

    @size.setter
    def size(self, value: int) -> None:
        pass  # computed: the split moves at run time

    @property
    def size_full(self) -> int:
        """The boot label: every full slot past slot 0, ``max_slots - 1``."""
        return self.full_attn_allocator.max_slots - 1

    @property
    def size_mamba(self) -> int:
        return self.mamba_allocator.max_slots - 1

    def available_size(self) -> int:
        """Full tokens allocatable after flushing the state side (SGLang: the schedulable view)."""
        return self.full_attn_allocator.schedulable_available_size()

    def mamba_slot_full_token_cost(self) -> int:
        """Full tokens of admission budget one state slot costs: ``ceil(state entry / full entry)``."""
        return -(-self.mamba_allocator.entry_bytes_per_page // self.full_attn_allocator.entry_bytes)

    def alloc(self, need_size: int) -> Tensor | None:
        return self.full_attn_allocator.alloc(need_size)

    def alloc_extend(
        self, prefix_lens: Tensor, seq_lens: Tensor, last_loc: Tensor, extend_num_tokens: int
    ) -> Tensor | None:
        return self.full_attn_allocator.alloc_extend(prefix_lens, seq_lens, last_loc, extend_num_tokens)

    def alloc_decode(self, seq_lens: Tensor, last_loc: Tensor) -> Tensor | None:
        return self.full_attn_allocator.alloc_decode(seq_lens, last_loc)

    def free(self, free_index: Tensor | Sequence[int]) -> None:
        self.full_attn_allocator.free(free_index)

    def free_group_begin(self) -> None:
        self.full_attn_allocator.free_group_begin()

    def free_group_end(self) -> None:
        self.full_attn_allocator.free_group_end()

    def translate_kv_loc(self, loc: Tensor) -> Tensor:
        return self.full_attn_allocator.translate_kv_loc(loc)

    def flush_opportunistic(self) -> int:
        return self.full_attn_allocator.flush_opportunistic() + self.mamba_allocator.flush_opportunistic()

    def clear(self) -> None:
        self.full_attn_allocator.clear()
        self.mamba_allocator.clear()


class UnifiedSWAAllocator(_TablesMixin, BaseTokenToKVPoolAllocator):
    """Full KV (grow-down END, owns the virtual ids) + SWA KV (grow-up END): ``UnifiedSWATokenToKVPoolAllocator``.

    One virtual page is backed by a full page *and* an SWA page; ``free_swa``
    drops the SWA page only (its bytes go back to the shared gap, where the
    full side can grow), ``free`` both, ``free_full`` the full side of pages
    whose SWA side is gone.  Built from a profiled budget (SGLang's
    ``total_bytes`` path): ``size_full`` / ``size_swa`` are the empty
    arena's availabilities.
    """

    def __init__(
        self,
        arena: UnifiedArena,
        *,
        full: str = "full",
        swa: str = "swa",
        lazy_compaction: bool = True,
        kvcache: Any = None,
        device: str | torch.device = "cpu",
        checked: bool = False,
    ) -> None:
        super().__init__(arena.geometry[full].max_slots - 1, arena.page_size, None, device, kvcache, False)
        self.arena = arena
        self.lazy_compaction = lazy_compaction
        kw = {"arena": arena, "lazy_compaction": lazy_compaction, "device": device, "checked": checked}
        fa = self.full_attn_allocator = MultiEndedAllocator(sub_pool_name=full, **kw)  # type: ignore[arg-type]
        sa = self.swa_attn_allocator = MultiEndedAllocator(
            sub_pool_name=swa,
            is_id_owner=False,
            virtual_num_pages=fa.num_virtual_ids,
            virtual_min_page=fa.min_page_index,
            **kw,  # type: ignore[arg-type]
        )
        fa.bind_peer(sa)
        sa.bind_peer(fa)
        self._end_pair = (fa, sa)
        self.free_group: list[Tensor] | None = None
        self._full_group: list[Tensor] = []
        self._empty_gap_bytes = fa._gap_bytes()
        self._size_full = fa.available_size()
        assert fa.free_virtual_ids is not None
        self._size_swa = min(sa.available_size(), fa.free_virtual_ids.numel() * self.page_size)

    def _ends(self) -> tuple[MultiEndedAllocator, ...]:
        return self._end_pair

    @property
    def size(self) -> int:
        return min(self._size_full, self._size_swa)

    @size.setter
    def size(self, value: int) -> None:
        pass

    @property
    def size_full(self) -> int:
        return self._size_full

    @property
    def size_swa(self) -> int:
        return self._size_swa

    def available_size(self) -> int:
        """Tokens one joint ``alloc`` may take now: each costs a full page *and* an SWA page of the shared gap."""
        fa, sa = self.full_attn_allocator, self.swa_attn_allocator
        e_f, e_s = fa.entry_bytes_per_page, sa.entry_bytes_per_page
        gap = max(0, fa._low_frontier() - sa._high_frontier())
        r_f = fa.num_pages - fa.min_page_index - fa._allocated_pages()
        r_s = sa.num_pages - sa.min_page_index - sa._allocated_pages()
        if not self.lazy_compaction:
            return min(gap // (e_f + e_s), r_f, r_s) * self.page_size
        h_f, h_s = fa._holes.numel(), sa._holes.numel()
        both = min(h_f, h_s)
        e2, more = (e_f, h_s) if h_f <= h_s else (e_s, h_f)
        one = min(more - both, gap // e2)
        gap -= one * e2
        total = min(both + one + gap // (e_f + e_s), h_f + r_f, h_s + r_s)
        return total * self.page_size

    def full_available_size(self) -> int:
        fa = self.full_attn_allocator
        return min(self._size_full - fa.allocated_count(), fa.schedulable_available_size())

    def swa_available_size(self) -> int:
        sa = self.swa_attn_allocator
        return min(self._size_swa - sa.allocated_count(), sa.schedulable_available_size())

    def ensure_capacity(self, full_tokens: int, swa_tokens: int) -> bool:
        """Whether the pages fit, urgently flushing both sides where compaction would make room."""
        if full_tokens < 0 or swa_tokens < 0:
            return False
        if not (full_tokens or swa_tokens):
            return True
        ps = self.page_size
        nf, ns = -(-full_tokens // ps), -(-swa_tokens // ps)
        if self._fits(nf, ns, compacted=False):
            return True
        if not self.lazy_compaction or not self._fits(nf, ns, compacted=True):
            return False
        self.full_attn_allocator.flush_for_allocation()
        self.swa_attn_allocator.flush_for_allocation()
        return self._fits(nf, ns, compacted=False)

    def _fits(self, nf: int, ns: int, *, compacted: bool) -> bool:
        fa, sa = self.full_attn_allocator, self.swa_attn_allocator
        ps = self.page_size
        live_f, live_s = fa.allocated_count() // ps, sa.allocated_count() // ps
        vcap = fa.num_virtual_ids - fa.min_page_index
        cap_f, cap_s = min(vcap, fa.num_pages - fa.min_page_index), min(vcap, sa.num_pages - sa.min_page_index)
        if live_f + nf > cap_f or live_s + ns > cap_s:
            return False
        if compacted:
            v_room, h_f, h_s = vcap - live_f, 0, 0
            room_f, room_s = cap_f - live_f, cap_s - live_s
            gap = self._empty_gap_bytes - live_f * fa.entry_bytes_per_page - live_s * sa.entry_bytes_per_page
        else:
            assert fa.free_virtual_ids is not None
            v_room, h_f, h_s = fa.free_virtual_ids.numel(), fa._holes.numel(), sa._holes.numel()
            room_f = fa.num_pages - fa.min_page_index - fa._allocated_pages()
            room_s = sa.num_pages - sa.min_page_index - sa._allocated_pages()
            gap = fa._gap_bytes()
        if nf > v_room or nf > h_f + room_f or ns > h_s + room_s:
            return False
        need = max(0, nf - h_f) * fa.entry_bytes_per_page + max(0, ns - h_s) * sa.entry_bytes_per_page
        return need <= max(0, gap)

    def alloc(self, need_size: int) -> Tensor | None:
        if not self.ensure_capacity(need_size, need_size):
            return None
        fa = self.full_attn_allocator
        assert fa.free_virtual_ids is not None
        pages = fa.free_virtual_ids[: need_size // self.page_size]
        out = fa.alloc(need_size)
        if out is None:
            raise AllocatorError("unified SWA alloc: the full side refused after the joint check passed")
        self.swa_attn_allocator.alloc_with_virtual(pages)
        return out

    def alloc_extend(
        self, prefix_lens: Tensor, seq_lens: Tensor, last_loc: Tensor, extend_num_tokens: int
    ) -> Tensor | None:
        fa = self.full_attn_allocator
        pre = torch.as_tensor(prefix_lens, dtype=_I64)
        seq = torch.as_tensor(seq_lens, dtype=_I64)
        k = _new_pages(pre, seq, self.page_size)
        if not self.ensure_capacity(k * self.page_size, k * self.page_size):
            return None
        assert fa.free_virtual_ids is not None
        pages = fa.free_virtual_ids[:k]
        out = fa.alloc_extend(pre, seq, last_loc, extend_num_tokens)
        if out is None:
            raise AllocatorError("unified SWA alloc_extend: the full side refused after the joint check passed")
        self.swa_attn_allocator.alloc_with_virtual(pages)
        return out

    def alloc_decode(self, seq_lens: Tensor, last_loc: Tensor) -> Tensor | None:
        seq = torch.as_tensor(seq_lens, dtype=_I64)
        return self.alloc_extend(seq - 1, seq, last_loc, int(seq.numel()))

    def _swa_live(self, idx: Tensor) -> Tensor:
        return idx[self.swa_attn_allocator.virtual_to_physical[idx // self.page_size] > 0]

    def free(self, free_index: Tensor | Sequence[int]) -> None:
        """Free both sides of the pages of ``free_index`` (the SWA side only where it is still held)."""
        v = torch.as_tensor(free_index, dtype=_I64, device=self.full_attn_allocator.device).reshape(-1)
        if not v.numel():
            return
        if self.free_group is not None:
            self.free_group.append(v.clone())
            return
        self.full_attn_allocator._virtual_pages(v)  # range check before anything changes
        live = self._swa_live(v)
        if live.numel():
            self.swa_attn_allocator.free(live)
        self.full_attn_allocator.free(v)

    def free_swa(self, free_index: Tensor | Sequence[int]) -> None:
        """Release the SWA pages of ``free_index``; the virtual ids and full pages stay held."""
        v = torch.as_tensor(free_index, dtype=_I64, device=self.full_attn_allocator.device).reshape(-1)
        if not v.numel():
            return
        self.full_attn_allocator._virtual_pages(v)
        live = self._swa_live(v)
        if live.numel():
            self.swa_attn_allocator.free(live)

    def free_full(self, free_index: Tensor | Sequence[int]) -> None:
        """Release the full pages and virtual ids of ``free_index`` whose SWA side ``free_swa`` gave back."""
        if self.free_group is not None:
            self._full_group.append(torch.as_tensor(free_index, dtype=_I64).clone())
            return
        self.full_attn_allocator.free(free_index)

    def free_group_begin(self) -> None:
        """Defer ``free`` and ``free_full`` until :meth:`free_group_end` (``free`` ones first, as SGLang)."""
        super().free_group_begin()
        self._full_group = []

    def free_group_end(self) -> None:
        full, self._full_group = self._full_group, []
        super().free_group_end()
        if full:
            self.full_attn_allocator.free(torch.cat(full))

    def translate_kv_loc(self, loc: Tensor) -> Tensor:
        return self.full_attn_allocator.translate_kv_loc(loc)

    def translate_loc_from_full_to_swa(self, loc: Tensor) -> Tensor:
        return self.swa_attn_allocator.translate_kv_loc(loc)

    def flush_opportunistic(self) -> int:
        return self.full_attn_allocator.flush_opportunistic() + self.swa_attn_allocator.flush_opportunistic()

    def clear(self) -> None:
        self.full_attn_allocator.clear()
        self.swa_attn_allocator.clear()
