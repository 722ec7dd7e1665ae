"""kvpools' multi-ended allocators on their own: worked layouts, misuse refused, translation, paged extend/decode.

The layouts are worked by hand from SGLang 0.5.23's ``MultiEndedAllocator``
(``allocator/unified_sub_pool.py``): ``_take_physical_eager``,
``_compact_pending_impl``, ``_free_lazy``, ``_take_free_pages_from_end`` and
``_flush``.  ``test_unified_allocator_vs_sglang.py`` checks the same against
the installed code on random sequences.
"""

from __future__ import annotations

import pytest
import torch

from kvpools_core.allocators.unified import (
    MultiEndedAllocator,
    UnifiedArena,
    UnifiedMambaAllocator,
    UnifiedSWAAllocator,
)
from kvpools_core.allocators.unified_float import FloatAllocator, UnifiedMambaSWAAllocator
from kvpools_core.errors import AllocatorError
from kvpools_core.parts.unified import mha_entry, state_entry

FULL = mha_entry("full", layer_num=1, head_num=1, head_dim=8, itemsize=2)  # 32 B entries
STATE = state_entry("mamba", layer_num=1, conv_row_bytes=[32], temporal_row_bytes=32)  # 64 B entries
SWA = mha_entry("swa", layer_num=1, head_num=1, head_dim=8, itemsize=2)  # 32 B


def mamba(total: int = 1024, page: int = 1, lazy: bool = True, checked: bool = False) -> UnifiedMambaAllocator:
    arena = UnifiedArena.build(total, [(FULL, "down"), (STATE, "up")], page)
    return UnifiedMambaAllocator(arena, lazy_compaction=lazy, checked=checked)


def test_geometry_of_a_small_arena() -> None:
    # 1,024 B, page 1: sink = max(64, 32) = 64 B -> full min slot 2, state min slot 1;
    # full: 32 slots, its watermark at the top page 31; state: 16 slots, watermark at 1
    a = mamba()
    f, m = a.full_attn_allocator, a.mamba_allocator
    assert (f.max_slots, f.min_page_index, f.watermark_physical) == (32, 2, 31)
    assert (m.max_slots, m.min_page_index, m.watermark_physical) == (16, 1, 1)
    # full gap = 32 x 32 - 1 x 64 = 960 B = 30 slots = its index room (32 - 2)
    assert f.available_size() == 30
    assert m.available_size() == (1024 - 64) // 64 == 15


def test_eager_free_compacts_the_band() -> None:
    """Eager: the grow-down END hands out ascending ranges below its watermark; a free moves the band's
    survivors into the holes and retreats at once."""
    a = mamba(lazy=False)
    f = a.full_attn_allocator
    first = a.alloc(3)  # virtual pages 2, 3, 4 -> physical 29, 30, 31 (ascending from wm - 3 + 1)
    second = a.alloc(2)  # virtual 5, 6 -> physical 27, 28
    assert first is not None and second is not None
    assert first.tolist() == [2, 3, 4] and second.tolist() == [5, 6]
    assert f.virtual_to_physical[2:7].tolist() == [29, 30, 31, 27, 28]
    a.free(torch.tensor([3]))  # physical 30 freed: band (26, 27] vacated, survivor 27 (virtual 5) moves into 30
    assert f.watermark_physical == 27
    assert f.virtual_to_physical[5].item() == 30
    assert f.physical_to_virtual[27].item() == -1
    assert f.free_virtual_ids is not None and f.free_virtual_ids[-1].item() == 3  # FIFO: freed ids go last
    assert a.available_size() == 30 - 4


def test_lazy_free_records_holes_reused_first_and_flushes() -> None:
    a = mamba()
    f = a.full_attn_allocator
    a.alloc(4)  # virtual 2..5 -> physical 28..31
    a.free(torch.tensor([3, 4]))  # physical 29, 30 become holes; nothing moves
    assert f.watermark_physical == 27 and sorted(f.holes.tolist()) == [29, 30]
    assert f.allocated_count() == 2
    # the next page comes from the holes, from this END's own (high) end of the sorted list
    out = a.alloc(1)
    assert out is not None and f.virtual_to_physical[out].tolist() == [30]
    # an idle flush moves the survivor nearest the frontier (28, virtual 2) into the hole (29) and keeps the
    # watermark; the vacated page joins the holes
    assert f.flush_opportunistic() == 1
    assert f.virtual_to_physical[2].item() == 29 and f.holes.tolist() == [28]
    # an urgent flush absorbs the boundary hole: the watermark retreats to 28
    f.flush_for_allocation()
    assert f.watermark_physical == 28 and f.holes.numel() == 0


def test_state_slot_shrinks_the_full_side() -> None:
    """Each live state slot costs ``ceil(64 / 32) = 2`` full tokens of the shared gap."""
    a = mamba()
    assert a.mamba_slot_full_token_cost() == 2
    before = a.available_size()
    assert a.mamba_allocator.alloc(1) is not None
    assert a.available_size() == before - 2


def test_schedulable_counts_the_neighbours_holes() -> None:
    a = mamba(total=512)  # full 16 slots (min 2); state 8 slots (min 1): full gap 512 - 64 = 448 B = 14 slots
    m = a.mamba_allocator
    slots = m.alloc(7)  # state watermark 1 -> 8: the whole arena's state side, 448 B
    assert slots is not None
    assert a.full_attn_allocator.available_size() == 0
    m.free(slots[:3])  # three state holes at the bottom: 192 B an urgent flush would hand back
    assert a.full_attn_allocator.available_size() == 0
    assert a.available_size() == a.full_attn_allocator.schedulable_available_size() == 192 // 32 == 6
    out = a.alloc(6)  # short: the full side urgently flushes the state side, which packs and retreats
    assert out is not None and m.watermark_physical == 5


def test_swa_free_swa_returns_bytes_to_the_full_side() -> None:
    arena = UnifiedArena.build(1024, [(FULL, "down"), (SWA, "up")], 1)  # sink 32 B: min slot 1 each
    a = UnifiedSWAAllocator(arena)
    # 1,024 B = 32 slots of 32 B; the empty gap holds 31 full slots (index room 31)
    assert a.size_full == 31 and a.available_size() == (1024 - 32) // 64 == 15
    ids = a.alloc(10)
    assert ids is not None and a.available_size() == 5
    a.free_swa(ids[:6])  # six SWA pages become holes: a full + SWA pair can reuse them
    assert a.swa_attn_allocator.allocated_count() == 4
    # joint view (UnifiedSWATokenToKVPoolAllocator._compute_available_size): gap = full low frontier 22 x 32
    # - SWA high frontier 11 x 32 = 352 B; 6 pairs take an SWA hole and a full page (6 x 32 B of gap),
    # the 160 B left fund 160 // 64 = 2 more pairs: 8
    assert a.available_size() == 8
    a.swa_attn_allocator.flush_for_allocation()  # survivors 7..10 move to 1..4, the SWA watermark 11 -> 5
    assert a.swa_attn_allocator.watermark_physical == 5
    # the full side grows into the 6 x 32 B handed back: (704 - 160) // 32 = 17 (10 full + 4 SWA pages live)
    assert a.full_attn_allocator.available_size() == (1024 - 32 - 14 * 32) // 32 == 17
    a.free_full(ids[:6])
    assert a.full_attn_allocator.allocated_count() == 4
    assert a.translate_kv_loc(ids[6:]).tolist() == a.full_attn_allocator.virtual_to_physical[ids[6:]].tolist()


def test_translate_kv_loc() -> None:
    a = mamba(total=4096, page=4)  # full: 128 slots = 32 pages; sink = max(64, 4 x 32) = 128 B = page 1
    ids = a.alloc(8)  # virtual pages 1, 2 -> physical pages 30, 31
    assert ids is not None and ids.tolist() == list(range(4, 12))
    phys = a.translate_kv_loc(torch.tensor([4, 5, 11, -3, 0, 13, 10_000]))
    # v2p[t // 4] * 4 + t % 4; negative, unmapped (page 3) and out-of-range ids -> 0
    assert phys.tolist() == [120, 121, 127, 0, 0, 0, 0]


def test_paged_extend_and_decode_in_virtual_space() -> None:
    a = mamba(total=4096, page=4)
    out = a.alloc_extend(torch.tensor([0, 0]), torch.tensor([3, 5]), torch.tensor([-1, -1]), 8)
    # request 0: page 1 (tokens 4, 5, 6); request 1: pages 2, 3 (8..11, 12)
    assert out is not None and out.tolist() == [4, 5, 6, 8, 9, 10, 11, 12]
    dec = a.alloc_decode(torch.tensor([4, 6]), torch.tensor([6, 12]))
    assert dec is not None and dec.tolist() == [7, 13]  # both continue their open page
    dec = a.alloc_decode(torch.tensor([5]), torch.tensor([7]))
    assert dec is not None and dec.tolist() == [16]  # position 4 starts a fresh page (virtual page 4)


@pytest.mark.parametrize("lazy", [True, False])
def test_misuse_is_refused_and_changes_nothing(lazy: bool) -> None:
    a = mamba(lazy=lazy)
    ids = a.alloc(3)
    assert ids is not None
    f = a.full_attn_allocator
    before = (f.virtual_to_physical.clone(), f.watermark_physical, a.available_size())
    with pytest.raises(AllocatorError, match="past the sink"):
        a.free(torch.tensor([0]))  # the padding page
    with pytest.raises(AllocatorError, match=r"must lie in 2\.\.31"):
        a.free(torch.tensor([32]))
    with pytest.raises(AllocatorError, match="integers"):
        a.free(torch.tensor([2.0]))
    with pytest.raises(AllocatorError, match="multiple of page_size"):
        mamba(total=4096, page=4).alloc(3)
    assert torch.equal(f.virtual_to_physical, before[0])
    assert (f.watermark_physical, a.available_size()) == before[1:]


def test_double_free() -> None:
    """Eager mode always refuses a free of a page not allocated (SGLang asserts); lazy mode only when checked."""
    for lazy, checked in ((False, False), (True, True)):
        a = mamba(lazy=lazy, checked=checked)
        ids = a.alloc(2)
        assert ids is not None
        a.free(ids[:1])
        with pytest.raises(AllocatorError, match="not allocated"):
            a.free(ids[:1])
        assert a.full_attn_allocator.allocated_count() == 1
    a = mamba(checked=True)
    ids = a.alloc(2)
    assert ids is not None
    with pytest.raises(AllocatorError, match="twice in one free"):
        a.free(torch.tensor([ids[0].item(), ids[0].item()]))


def test_free_group_defers() -> None:
    a = mamba()
    ids = a.alloc(4)
    assert ids is not None
    a.free_group_begin()
    a.free(ids[:2])
    assert a.full_attn_allocator.allocated_count() == 4
    a.free_group_end()
    assert a.full_attn_allocator.allocated_count() == 2


def test_non_owner_cannot_alloc() -> None:
    arena = UnifiedArena.build(1024, [(FULL, "down"), (SWA, "up")], 1)
    swa = UnifiedSWAAllocator(arena).swa_attn_allocator
    with pytest.raises(AllocatorError, match="non-owner"):
        swa.alloc(1)
    with pytest.raises(AllocatorError, match="another pool's virtual-id space"):
        MultiEndedAllocator(arena=arena, sub_pool_name="full", virtual_num_pages=4)


def test_arena_needs_two_ends() -> None:
    with pytest.raises(AllocatorError, match="one grow-up and one grow-down"):
        UnifiedArena.build(1024, [(FULL, "down"), (SWA, "down")], 1)
    with pytest.raises(AllocatorError, match="at most one"):
        UnifiedArena.build(1024, [(FULL, "down"), (SWA, "float"), (SWA, "float"), (STATE, "up")], 1)


def tri(total: int = 2048, page: int = 1) -> UnifiedMambaSWAAllocator:
    swa = mha_entry("swa", layer_num=1, head_num=1, head_dim=8, itemsize=2)  # 32 B
    arena = UnifiedArena.build(total, [(FULL, "down"), (swa, "float"), (STATE, "up")], page)
    return UnifiedMambaSWAAllocator(arena, full_max_total_num_tokens=10, swa_max_total_num_tokens=8)


def test_float_starts_at_the_midpoint_and_parks_when_empty() -> None:
    """FloatMultiEndedAllocator.take_physical_pages: from empty, the span is placed mid-region."""
    a = tri()  # 2,048 B; sink 64 B: state from page 1 (64 B), full and SWA from page 2 (32 B pages)
    sa = a.swa_attn_allocator
    assert isinstance(sa, FloatAllocator) and sa._transparent()
    ids = a.alloc(4)  # full takes pages 60..63 (top); SWA's region is [2, 60): 4 pages at 2 + (58 - 4) // 2 = 29
    assert ids is not None
    assert (sa.low_wm, sa.high_wm) == (29, 33)
    assert sa.virtual_to_physical[ids].tolist() == [29, 30, 31, 32]
    a.free_swa(ids)  # nothing lives in the span: it parks at the top and goes transparent again
    assert (sa.low_wm, sa.high_wm) == (64, 64) and sa._transparent()


def test_float_reuses_holes_from_alternating_ends() -> None:
    a = tri()
    sa = a.swa_attn_allocator
    ids = a.alloc(6)  # full 58..63; SWA's region [2, 58): 6 pages at 2 + (56 - 6) // 2 = 27, so 27..32
    assert ids is not None
    a.free_swa(ids[[0, 2, 5]])  # SWA holes 27, 29, 32 (boundary holes too: absorbed only at a flush)
    first = a.alloc(1)  # drains from the low end of the hole list ...
    second = a.alloc(1)  # ... and the next request from the high end
    assert first is not None and second is not None
    assert sa.virtual_to_physical[first].tolist() == [27]
    assert sa.virtual_to_physical[second].tolist() == [32]
    assert a.mamba_slot_full_token_cost() == 1  # ceil(64 / (32 + 32))
