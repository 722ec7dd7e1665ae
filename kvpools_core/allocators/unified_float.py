"""The floating middle of a three-pool unified arena, and the Mamba+SWA composite over it (SGLang 0.5.23).

A model that is both a Mamba hybrid and a sliding-window hybrid puts three
sub-pools in one arena: state slots at the bottom (grow-up END), full KV at the
top (grow-down END), and SWA KV *floating* between them
(``FloatMultiEndedAllocator`` in ``allocator/unified_sub_pool.py``,
``UnifiedMambaSWATokenToKVPoolAllocator`` in ``allocator/unified_hybrid_swa.py``):

* the float's span ``[low_wm_page, high_wm_page)`` may hold holes; frees mark
  holes (boundary holes are absorbed at flush points, zero-copy), allocations
  reuse holes first (taking the whole request from one end of the hole list,
  the next from the other) and then extend the span towards the roomier gap;
* an empty float parks and becomes *transparent*: the two ENDs' frontier walks
  see through it, and its next allocation starts at the midpoint of the free
  region, so both neighbours keep room;
* data moves only on demand: when an END (or the composite) is short, the
  float is asked to open the side facing it (:meth:`FloatAllocator.open_short_side`,
  SGLang's ``_float_open_short_side``), relocating the fewest live pages
  (holes first, then the far gap).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from kvpools_core.allocators.contract import BaseTokenToKVPoolAllocator
from kvpools_core.allocators.unified import MultiEndedAllocator, UnifiedArena, UnifiedSWAAllocator
from kvpools_core.errors import AllocatorError

__all__ = ["FloatAllocator", "UnifiedMambaSWAAllocator"]

_I64 = torch.int64


class FloatAllocator(MultiEndedAllocator):
    """The floating middle sub-pool (SGLang's ``FloatMultiEndedAllocator``): holes first, moves on demand."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs["lazy_compaction"] = False  # a float is holes-first; the lazy pipeline is END machinery
        self._next_end = "low"  # which end of the hole list the next request drains (alternates; clear keeps it)
        super().__init__(**kwargs)
        if self.grow_direction != "float":
            raise AllocatorError(f"sub-pool {self.sub_pool_name!r} is not a floating middle")

    def clear(self) -> None:
        super().clear()
        self._park_span()
        self.watermark_physical = -1  # unused by a float (SGLang keeps it at -1)

    def _park_span(self) -> None:
        self.low_wm = self.high_wm = self.num_pages
        self._holes = self._holes[:0]
        self._holes_sorted = True
        self._dirty = False

    # ------------------------------------------------------------ geometry
    def _live(self) -> int:
        return self.high_wm - self.low_wm - self._holes.numel()

    def _transparent(self) -> bool:
        return self._live() == 0

    def _allocated_pages(self) -> int:
        return self._live()

    def _low_frontier(self) -> int:
        return self.low_wm * self.entry_bytes_per_page

    def _high_frontier(self) -> int:
        return self.high_wm * self.entry_bytes_per_page

    def _region(self) -> tuple[int, int]:
        """Page bounds of the free region between the opaque neighbours (low rounded up, high down)."""
        epp = self.entry_bytes_per_page
        return max(-(-self._below() // epp), self.min_page_index), min(self._above() // epp, self.num_pages)

    def pages_in_band(self, *, low_byte: int, high_byte: int) -> int:
        """Pages of this pool's own grid inside ``[low_byte, high_byte)``."""
        epp = self.entry_bytes_per_page
        return max(0, min(high_byte // epp, self.num_pages) - max(-(-low_byte // epp), self.min_page_index))

    def _gap_pages(self) -> tuple[int, int]:
        lo, hi = self._region()
        if self._transparent():
            room = max(0, hi - lo)
            return room, room
        return max(0, self.low_wm - lo), max(0, hi - self.high_wm)

    def _side_neighbour(self, side: str) -> MultiEndedAllocator | None:
        p = self.low_peer if side == "low" else self.high_peer
        while p is not None and p._transparent():
            p = p.low_peer if side == "low" else p.high_peer
        return p

    def _side_drain_bytes(self, side: str) -> int:
        p = self._side_neighbour(side)
        return p._holes.numel() * p.entry_bytes_per_page if p is not None and p.lazy_compaction else 0

    def _available_tokens(self, extra_gap_bytes: int = 0) -> int:
        low, high = self._gap_pages()
        if extra_gap_bytes > 0:
            epp = self.entry_bytes_per_page
            low += self._side_drain_bytes("low") // epp
            high += self._side_drain_bytes("high") // epp
        extend = min(max(low, high), self.num_pages - self.min_page_index - self._live())
        return (extend + self._holes.numel()) * self.page_size

    def schedulable_available_size(self) -> int:
        return self._available_tokens(max(self._side_drain_bytes("low"), self._side_drain_bytes("high")))

    # ------------------------------------------------------------- alloc
    def _bind_new(self, v_pages: Tensor, k: int) -> Tensor | None:
        phys = self._take_pages(k)
        if phys is None:
            return None
        self.virtual_to_physical[v_pages] = phys
        self.physical_to_virtual[phys] = v_pages
        return phys

    def _take_pages(self, k: int) -> Tensor | None:
        n_drain = min(k, self._holes.numel())
        more = k - n_drain
        fresh = None
        if more:
            lo, hi = self._region()
            if self._transparent():
                if more > hi - lo:
                    return None
                start = lo + (hi - lo - more) // 2  # from empty: the midpoint, room on both sides
                self.low_wm, self.high_wm = start, start + more
            else:
                gap_low, gap_high = self.low_wm - lo, hi - self.high_wm
                for side in ("high", "low") if gap_high >= gap_low else ("low", "high"):
                    if side == "high" and more <= gap_high:
                        start = self.high_wm
                        self.high_wm += more
                        break
                    if side == "low" and more <= gap_low:
                        start = self.low_wm = self.low_wm - more
                        break
                else:
                    return None
            fresh = torch.arange(start, start + more, dtype=_I64, device=self.device)
        if not n_drain:
            return fresh
        up = self._up
        self._up = self._next_end == "low"  # _take_holes reads the END's side from _up
        try:
            drained = self._take_holes(n_drain).clone()
        finally:
            self._up = up
        self._next_end = "high" if self._next_end == "low" else "low"
        return drained if fresh is None else torch.cat((drained, fresh))

    # -------------------------------------------------------------- free
    def free(self, free_index: Tensor | Sequence[int], *, _pages: Tensor | None = None) -> None:
        """Mark the pages of ``free_index`` as holes; park the span once nothing lives in it."""
        idx = torch.as_tensor(free_index, device=self.device)
        if idx.numel() == 0:
            return
        if self.free_group is not None:
            self.free_group.append(idx.clone())
            return
        pages = _pages if _pages is not None else self._float_pages(idx)
        phys = self.virtual_to_physical[pages]
        if self.checked:
            self._check_bound(pages, phys)
        self.virtual_to_physical[pages] = -1
        self.physical_to_virtual[phys] = -1
        self._holes = torch.cat((self._holes, phys))
        self._holes_sorted = self._holes.numel() <= 1
        self._dirty = True
        if self._live() == 0:
            self._park_span()

    def _float_pages(self, idx: Tensor) -> Tensor:
        pages = self._virtual_pages(idx)  # range checked; unique at page size > 1
        return idx.to(_I64).reshape(-1) if self.page_size == 1 and not self.checked else pages

    def _absorb(self) -> int:
        """Shrink the span past holes at its two boundaries (zero-copy); pages handed back."""
        if self._live() == 0:
            self._park_span()
            return 0
        if not self._dirty or not self._holes.numel():
            self._dirty = False
            return 0
        self._dirty = False
        before = self.high_wm - self.low_wm
        holes = set(self._holes.tolist())
        changed = False
        while self.low_wm in holes:
            holes.remove(self.low_wm)
            self.low_wm += 1
            changed = True
        while self.high_wm - 1 in holes:
            holes.remove(self.high_wm - 1)
            self.high_wm -= 1
            changed = True
        if changed:
            self._holes = torch.tensor(sorted(holes), dtype=_I64, device=self.device)
            self._holes_sorted = True
        return before - (self.high_wm - self.low_wm)

    def flush_for_allocation(self) -> int:
        """A float's flush only absorbs boundary holes: interior holes are its own to reuse."""
        return self._absorb()

    def flush_opportunistic(self) -> int:
        if not self._dirty or not self._holes.numel():
            return 0
        return self._absorb()

    # ------------------------------------------------------- on-demand moves
    def make_room(self, *, side: str, min_bytes: int) -> int:
        """Open at least ``min_bytes`` of contiguous free space on ``side``, moving the fewest live pages.

        Returns the bytes open on ``side`` afterwards; below ``min_bytes`` means impossible (nothing moved).
        """
        epp = self.entry_bytes_per_page
        gap_low, gap_high = self._gap_pages()
        have = (gap_low if side == "low" else gap_high) * epp
        lo, hi = self._region()
        if have >= min_bytes or self._transparent():
            return have
        live = self._live()
        if (hi - lo - live) * epp < min_bytes:
            return have
        need = -(-(min_bytes - have) // epp)
        holes = set(self._holes.tolist())
        live_sorted = [p for p in range(self.low_wm, self.high_wm) if p not in holes]
        if need >= live:
            final = list(range(lo, lo + live)) if side == "high" else list(range(hi - live, hi))
            self._relocate(live_sorted, final)
        else:
            srcs = list(reversed(live_sorted))[:need] if side == "high" else live_sorted[:need]
            if side == "high":
                dsts = sorted(h for h in holes if h < min(srcs))[: len(srcs)]
            else:
                dsts = sorted((h for h in holes if h > max(srcs)), reverse=True)[: len(srcs)]
            fresh = len(srcs) - len(dsts)
            if fresh > 0:
                if side == "high":
                    if fresh > gap_low:
                        return have
                    dsts += list(range(self.low_wm - 1, self.low_wm - 1 - fresh, -1))
                else:
                    if fresh > gap_high:
                        return have
                    dsts += list(range(self.high_wm, self.high_wm + fresh))
            src_t = torch.tensor(srcs, dtype=_I64, device=self.device)
            self._move(src_t, torch.tensor(dsts, dtype=_I64, device=self.device))
            self.physical_to_virtual[src_t] = -1
            final_live = sorted((set(live_sorted) - set(srcs)) | set(dsts))
            self.low_wm, self.high_wm = final_live[0], final_live[-1] + 1
            kept = set(final_live)
            self._holes = torch.tensor(
                [p for p in range(self.low_wm, self.high_wm) if p not in kept], dtype=_I64, device=self.device
            )
            self._holes_sorted = True
            self._dirty = True
            self._absorb()
        gap_low, gap_high = self._gap_pages()
        return (gap_low if side == "low" else gap_high) * epp

    def _relocate(self, live_sorted: list[int], final: list[int]) -> None:
        """Move the live pages onto ``final`` in order (one batch when disjoint, else one page at a time)."""
        pairs = [(s, d) for s, d in zip(live_sorted, final, strict=True) if s != d]
        if pairs and {s for s, _ in pairs}.isdisjoint({d for _, d in pairs}):
            src = torch.tensor([s for s, _ in pairs], dtype=_I64, device=self.device)
            self._move(src, torch.tensor([d for _, d in pairs], dtype=_I64, device=self.device))
            self.physical_to_virtual[src] = -1
        elif pairs:
            for s, d in pairs if final[0] <= live_sorted[0] else reversed(pairs):
                src = torch.tensor([s], dtype=_I64, device=self.device)
                self._move(src, torch.tensor([d], dtype=_I64, device=self.device))
                self.physical_to_virtual[src] = -1
        if final:
            self.low_wm, self.high_wm = final[0], final[-1] + 1
            self._holes = self._holes[:0]
            self._holes_sorted = True
        else:
            self._park_span()

    def open_short_side(self, demand: dict[MultiEndedAllocator, int]) -> None:
        """SGLang's ``_float_open_short_side``: from a demand in pages per band, open the side that is short."""
        if self._transparent() or not any(p > 0 for p in demand.values()):
            return
        for band, pages in demand.items():
            if pages > 0 and pages > band.num_pages - band.min_page_index - band._allocated_pages():
                return  # index space binds; bytes cannot fix it
        sides = {"low": 0, "high": 0}
        for band, pages in demand.items():
            if band is self or pages <= 0:
                continue
            holes = band._holes.numel() if band.lazy_compaction else 0
            sides["high" if band.grow_direction == "down" else "low"] += (
                max(0, pages - holes) * band.entry_bytes_per_page
            )
        room = {
            "low": max(0, self._low_frontier() - self._below()),
            "high": max(0, self._above() - self._high_frontier()),
        }
        surplus = {s: room[s] - sides[s] for s in ("low", "high")}
        f_bytes = max(0, demand.get(self, 0) - self._holes.numel()) * self.entry_bytes_per_page
        slack = max(b.entry_bytes_per_page for b, p in demand.items() if p > 0)
        if surplus["low"] < 0 and surplus["high"] < 0:
            return
        if surplus["low"] < 0 or surplus["high"] < 0:
            short, far = ("low", "high") if surplus["low"] < 0 else ("high", "low")
            target = sides[short] + max(0, f_bytes - max(0, surplus[far])) + slack
            if target > room[short]:
                self.make_room(side=short, min_bytes=target)
            return
        if f_bytes > max(surplus.values()):
            short = "low" if surplus["low"] >= surplus["high"] else "high"
            self.make_room(side=short, min_bytes=sides[short] + f_bytes + slack)


class UnifiedMambaSWAAllocator(UnifiedSWAAllocator):
    """State (grow-up END) | SWA (float) | full KV (grow-down END): ``UnifiedMambaSWATokenToKVPoolAllocator``.

    ``full_max_total_num_tokens`` / ``swa_max_total_num_tokens`` are SGLang's
    boot token counts (the labels and the conserve caps); the split floats.
    """

    def __init__(
        self,
        arena: UnifiedArena,
        *,
        full_max_total_num_tokens: int,
        swa_max_total_num_tokens: int,
        lazy_compaction: bool = True,
        kvcache: Any = None,
        device: str | torch.device = "cpu",
        checked: bool = False,
    ) -> None:
        BaseTokenToKVPoolAllocator.__init__(self, full_max_total_num_tokens, arena.page_size, None, device, kvcache)
        self.arena = arena
        self.lazy_compaction = lazy_compaction
        kw: dict[str, Any] = {"arena": arena, "device": device, "checked": checked}
        fa = self.full_attn_allocator = MultiEndedAllocator(sub_pool_name="full", lazy_compaction=lazy_compaction, **kw)
        sa = self.swa_attn_allocator = FloatAllocator(
            sub_pool_name="swa",
            is_id_owner=False,
            virtual_num_pages=fa.num_virtual_ids,
            virtual_min_page=fa.min_page_index,
            **kw,
        )
        ma = self.mamba_allocator = MultiEndedAllocator(sub_pool_name="mamba", lazy_compaction=lazy_compaction, **kw)
        ma.high_peer, sa.low_peer, sa.high_peer, fa.low_peer = sa, ma, fa, sa
        self.free_group: list[Tensor] | None = None
        self._full_group: list[Tensor] = []
        self._size_full, self._size_swa = full_max_total_num_tokens, swa_max_total_num_tokens

    def _ends(self) -> tuple[MultiEndedAllocator, ...]:
        return (self.full_attn_allocator, self.swa_attn_allocator, self.mamba_allocator)

    def mamba_slot_full_token_cost(self) -> int:
        """One state slot in tokens of the joint budget: ``ceil(state entry / (full entry + SWA entry))``."""
        e = self.full_attn_allocator.entry_bytes + self.swa_attn_allocator.entry_bytes
        return -(-self.mamba_allocator.entry_bytes_per_page // e)

    def available_size(self) -> int:
        """Joint tokens for equal full and SWA demand: full takes its band first, SWA then needs one band."""
        fa, sa = self.full_attn_allocator, self.swa_attn_allocator
        assert isinstance(sa, FloatAllocator)
        h_f = fa._holes.numel() if fa.lazy_compaction else 0
        h_s = sa._holes.numel()
        r_f = fa.num_pages - fa.min_page_index - fa._allocated_pages()
        r_s = sa.num_pages - sa.min_page_index - sa._allocated_pages()
        full_gap, full_low, e_f = fa._gap_bytes(), fa._low_frontier(), fa.entry_bytes_per_page
        chain_low = sa._below()
        if sa._transparent():
            band_low, low_room = chain_low, 0
        else:
            band_low, low_room = sa._high_frontier(), sa.pages_in_band(low_byte=chain_low, high_byte=sa._low_frontier())
        lo, hi = 0, min(h_f + r_f, h_s + r_s)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            full_bytes = max(0, mid - h_f) * e_f
            room = max(low_room, sa.pages_in_band(low_byte=band_low, high_byte=full_low - full_bytes))
            if full_bytes <= full_gap and max(0, mid - h_s) <= room:
                lo = mid
            else:
                hi = mid - 1
        return lo * self.page_size

    def ensure_capacity(self, full_tokens: int, swa_tokens: int) -> bool:
        """SGLang's tri-pool ladder: END flushes when they suffice, else a float move, else the shortfall ladder."""
        if full_tokens < 0 or swa_tokens < 0:
            return False
        ps = self.page_size
        fa, sa, ma = self.full_attn_allocator, self.swa_attn_allocator, self.mamba_allocator
        assert isinstance(sa, FloatAllocator)
        if self._fits_demand(-(-full_tokens // ps), -(-swa_tokens // ps)):
            return True
        if full_tokens != swa_tokens:
            for m in (sa, fa, ma):
                m.flush_for_allocation()
            if self._fits_demand(-(-full_tokens // ps), -(-swa_tokens // ps)):
                return True
            sa.open_short_side({fa: -(-full_tokens // ps), sa: -(-swa_tokens // ps), ma: 0})
            return self._fits_demand(-(-full_tokens // ps), -(-swa_tokens // ps))
        need = -(-full_tokens // ps) * ps
        if not self._id_capacity(need):
            return False
        if need <= self.available_size():
            return True
        if self._end_reclaim_satisfied(need):
            fa.flush_for_allocation()
            ma.flush_for_allocation()
            return need <= self.available_size()
        if self._float_high_target(need) is not None:
            fa.flush_for_allocation()
            ma.flush_for_allocation()
            if not self._id_capacity(need):
                return False
            if need <= self.available_size():
                return True
            target = self._float_high_target(need, flush_ends=False)
            if target is None:
                return False
            sa.make_room(side="high", min_bytes=target)
            return self._id_capacity(need) and need <= self.available_size()
        if self._byte_shortfall(need) > 0:
            return False
        for m in (sa, fa, ma):
            m.flush_for_allocation()
        if need <= self.available_size():
            return True
        sa.open_short_side({fa: need // ps, sa: need // ps, ma: 0})
        return need <= self.available_size()

    def _fits_demand(self, full_pages: int, swa_pages: int) -> bool:
        fa, sa = self.full_attn_allocator, self.swa_attn_allocator
        assert isinstance(sa, FloatAllocator)
        h_f = fa._holes.numel() if fa.lazy_compaction else 0
        h_s = sa._holes.numel()
        r_f = fa.num_pages - fa.min_page_index - fa._allocated_pages()
        r_s = sa.num_pages - sa.min_page_index - sa._allocated_pages()
        if full_pages > h_f + r_f or swa_pages > h_s + r_s:
            return False
        full_bytes = max(0, full_pages - h_f) * fa.entry_bytes_per_page
        if full_bytes > fa._gap_bytes():
            return False
        ext = max(0, swa_pages - h_s)
        full_low_after = fa._low_frontier() - full_bytes
        if sa._transparent():
            return ext <= sa.pages_in_band(low_byte=sa._below(), high_byte=full_low_after)
        return ext <= max(
            sa.pages_in_band(low_byte=sa._below(), high_byte=sa._low_frontier()),
            sa.pages_in_band(low_byte=sa._high_frontier(), high_byte=full_low_after),
        )

    def _id_capacity(self, tokens: int) -> bool:
        fa, sa = self.full_attn_allocator, self.swa_attn_allocator
        assert fa.free_virtual_ids is not None
        pages = tokens // self.page_size
        return (
            pages <= fa.free_virtual_ids.numel() and pages <= sa.num_pages - sa.min_page_index - sa._allocated_pages()
        )

    def _end_frontiers(self, tokens: int, *, flush_ends: bool = True) -> tuple[int, int, int]:
        fa, ma = self.full_attn_allocator, self.mamba_allocator
        credit_f = fa._holes.numel() if flush_ends and fa.lazy_compaction else 0
        credit_m = ma._holes.numel() if flush_ends and ma.lazy_compaction else 0
        holes_f = fa._holes.numel() if fa.lazy_compaction else 0
        ext = max(0, tokens // self.page_size - (holes_f - credit_f))
        before = fa._low_frontier() + credit_f * fa.entry_bytes_per_page
        return before, before - ext * fa.entry_bytes_per_page, ma._high_frontier() - credit_m * ma.entry_bytes_per_page

    def _end_reclaim_satisfied(self, tokens: int) -> bool:
        if not self._id_capacity(tokens):
            return False
        if tokens <= self.available_size():
            return True
        fa, sa = self.full_attn_allocator, self.swa_attn_allocator
        assert isinstance(sa, FloatAllocator)
        _, full_after, state_after = self._end_frontiers(tokens)
        pages = tokens // self.page_size
        if full_after < fa.min_page_index * fa.entry_bytes_per_page:
            return False
        if sa._transparent():
            return pages <= sa.pages_in_band(low_byte=state_after, high_byte=full_after)
        if full_after < sa._high_frontier():
            return False
        return max(0, pages - sa._holes.numel()) <= max(
            sa.pages_in_band(low_byte=state_after, high_byte=sa._low_frontier()),
            sa.pages_in_band(low_byte=sa._high_frontier(), high_byte=full_after),
        )

    def _float_high_target(self, tokens: int, *, flush_ends: bool = True) -> int | None:
        if not self._id_capacity(tokens):
            return None
        fa, sa = self.full_attn_allocator, self.swa_attn_allocator
        assert isinstance(sa, FloatAllocator)
        if sa._transparent():
            return None
        before, after, state_after = self._end_frontiers(tokens, flush_ends=flush_ends)
        if after < fa.min_page_index * fa.entry_bytes_per_page:
            return None
        e_s = sa.entry_bytes_per_page
        low = max(-(-state_after // e_s), sa.min_page_index)
        high = min(before // e_s, sa.num_pages)
        limit = min(after // e_s, sa.num_pages) - tokens // self.page_size
        retreat = sa.high_wm - limit
        if retreat <= 0 or sa.low_wm - low < retreat:
            return None
        return (high - limit) * e_s

    def _byte_shortfall(self, tokens: int) -> int:
        members = (self.full_attn_allocator, self.swa_attn_allocator, self.mamba_allocator)
        live = sum(m.allocated_count() * m.entry_bytes for m in members)
        sink = min(m.min_page_index * m.entry_bytes_per_page for m in members)
        fa, sa = self.full_attn_allocator, self.swa_attn_allocator
        need = tokens // self.page_size * (fa.entry_bytes_per_page + sa.entry_bytes_per_page)
        return max(0, need + live + sink - self.arena.total_bytes)

    def flush_opportunistic(self) -> int:
        return sum(
            m.flush_opportunistic() for m in (self.full_attn_allocator, self.swa_attn_allocator, self.mamba_allocator)
        )

    def clear(self) -> None:
        super().clear()
        self.mamba_allocator.clear()
