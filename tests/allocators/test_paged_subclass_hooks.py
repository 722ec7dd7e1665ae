"""The paged allocator's extension points for a platform's subclass: ``index_dtype`` and ``fill_extend``.

A platform keeps SGLang's semantics of its own allocator by setting ``index_dtype``
(SGLang's NPU allocator returns int32, ``allocator_npu.py``; reference §2.3 "Return
dtype int64 (NPU: int32)") and overriding ``fill_extend`` (the NPU allocator fills
batches of >= 200 new pages with ``alloc_extend_naive``, reference §2.3/§3.3).  Slots
are checked against the loop of ``test_paged_allocator.reference_extend`` (§2.3's
three parts per request); SGLang's own case (prefix 2, seq 11, last_loc 1, free
pages [3, 4], page 4 -> [2, 3, 12..18]) is pinned literally.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from torch import Tensor

from kvpools_core.allocators import PagedAllocator
from kvpools_core.errors import AllocatorError
from tests.allocators.test_paged_allocator import extend_batches, i64, new_pages_needed, peek_pages, reference_extend


class Int32Paged(PagedAllocator):
    index_dtype = torch.int32


class LoopPaged(Int32Paged):
    """Fills every extend batch with the reference loop, recording each call."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[int], list[int], list[int], list[int], int]] = []

    def fill_extend(
        self, prefix_lens: Tensor, seq_lens: Tensor, last_loc: Tensor, new_pages: Tensor, extend_num_tokens: int
    ) -> Tensor | None:
        assert prefix_lens.dtype == seq_lens.dtype == last_loc.dtype == new_pages.dtype == torch.int64
        pre, seq, last, pages = prefix_lens.tolist(), seq_lens.tolist(), last_loc.tolist(), new_pages.tolist()
        self.calls.append((pre, seq, last, pages, extend_num_tokens))
        return i64(reference_extend(pre, seq, last, pages, self.page_size))  # int64: the core casts it


def test_index_dtype_defaults_to_int64() -> None:
    a = PagedAllocator(64, 4)
    assert PagedAllocator.index_dtype is torch.int64
    assert a.alloc(8).dtype == torch.int64


@pytest.mark.parametrize("checked", [False, True])
def test_int32_subclass_returns_int32_from_every_alloc_path(device: str, checked: bool) -> None:
    """Same slots as the int64 default, in int32: alloc, both alloc_extend paths (aligned prefixes, an
    open page), an empty extend, and alloc_decode (a new page, and continuing one)."""
    for cls, dtype in ((PagedAllocator, torch.int64), (Int32Paged, torch.int32)):
        a = cls(64, 4, device=device, checked=checked)
        block = a.alloc(8)  # pages 1, 2
        assert block is not None and block.dtype == dtype and block.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
        # SGLang's alloc_extend case: prefix 2, seq 11, last_loc 1 (page 0 stands in), pages 3, 4 next
        fresh = a.alloc_extend(i64([0], device), i64([2], device), i64([-1], device), 2)
        assert fresh is not None and fresh.dtype == dtype and fresh.tolist() == [12, 13]  # page 3
        opened = a.alloc_extend(i64([2], device), i64([11], device), i64([13], device), 9)
        assert opened is not None and opened.dtype == dtype
        assert opened.tolist() == [14, 15, 16, 17, 18, 19, 20, 21, 22]  # rest of page 3, pages 4, 5
        empty = a.alloc_extend(i64([4], device), i64([4], device), i64([15], device), 0)
        assert empty is not None and empty.dtype == dtype and empty.numel() == 0
        # positions 11 (continues slot 22) and 12 (starts page 6: slot 24)
        decode = a.alloc_decode(i64([12], device), i64([22], device))
        assert decode is not None and decode.dtype == dtype and decode.tolist() == [23]
        decode = a.alloc_decode(i64([13], device), i64([23], device))
        assert decode is not None and decode.dtype == dtype and decode.tolist() == [24]


def test_int32_subclass_at_page_size_1_decodes_int32(device: str) -> None:
    a = Int32Paged(8, 1, device=device)
    out = a.alloc_decode(i64([3, 5], device), i64([-1, -1], device))
    assert out is not None and out.dtype == torch.int32 and out.tolist() == [1, 2]


@pytest.mark.parametrize("checked", [False, True])
def test_int32_slots_are_freed(device: str, checked: bool) -> None:
    """Frees take the int32 slots back, directly and inside a free group, and refuse bad ones as for int64."""
    a = Int32Paged(32, 4, device=device, checked=checked)
    slots = a.alloc(16)
    assert slots is not None and slots.dtype == torch.int32
    a.free(slots[:4])
    assert a.available_size() == 20
    a.free_group_begin()
    a.free(slots[4:].flip(0))
    assert a.available_size() == 20  # back at the group's end
    a.free_group_end()
    assert a.available_size() == 32
    with pytest.raises(AllocatorError, match=r"valid page ids are 1\.\.8"):
        a.free(torch.tensor([0, 1], dtype=torch.int32, device=device))  # page 0 is padding
    assert a.available_size() == 32
    assert sorted(a.alloc_pages(8) or []) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_fill_extend_is_asked_on_both_extend_paths_with_the_new_pages() -> None:
    a = LoopPaged(64, 4)
    a.alloc_pages(2)  # pages 3, 4, 5 are next
    # aligned prefixes (the gather's fast path): a fresh request of 6 tokens
    out = a.alloc_extend(i64([0]), i64([6]), i64([-1]), 6)
    assert out is not None and out.dtype == torch.int32 and out.tolist() == [12, 13, 14, 15, 16, 17]
    assert a.calls == [([0], [6], [-1], [3, 4], 6)]
    # an open page (SGLang's case shape): prefix 6, seq 11, last_loc 17
    out = a.alloc_extend(i64([6]), i64([11]), i64([17]), 5)
    assert out is not None and out.tolist() == [18, 19, 20, 21, 22]
    assert a.calls[1] == ([6], [11], [17], [5], 5)
    # nothing to fill: not asked
    assert a.alloc_extend(i64([11]), i64([11]), i64([22]), 0) is not None
    assert len(a.calls) == 2


def test_fill_extend_result_is_returned_and_a_refused_batch_never_asks() -> None:
    class Marked(PagedAllocator):
        def fill_extend(self, *args: object) -> Tensor | None:
            return torch.full((3,), 7, dtype=torch.int32)

    a = Marked(16, 4)
    out = a.alloc_extend(i64([0]), i64([3]), i64([-1]), 3)
    assert out is not None and out.dtype == torch.int64 and out.tolist() == [7, 7, 7]  # cast to index_dtype
    b = LoopPaged(16, 4)
    assert b.alloc_extend(i64([0]), i64([17]), i64([-1]), 17) is None  # 5 pages of 4
    assert b.calls == [] and b.available_size() == 16


@settings(max_examples=100, deadline=None)
@given(batch=extend_batches())
def test_fill_extend_and_int32_give_the_default_slots(batch: tuple[int, list[int], list[int]]) -> None:
    """A subclass with int32 slots and its own fill gives the core's slots on the same state."""
    page_size, prefix, seq = batch
    core, sub = PagedAllocator(512 * page_size, page_size), LoopPaged(512 * page_size, page_size)
    last: list[int] = []
    for pre in prefix:
        kv = core.alloc_extend(i64([0]), i64([pre]), i64([-1]), pre)
        sub_kv = sub.alloc_extend(i64([0]), i64([pre]), i64([-1]), pre)
        assert kv is not None and sub_kv is not None and sub_kv.tolist() == kv.tolist()
        last.append(int(kv[-1]) if pre else -1)
    pages = peek_pages(core, new_pages_needed(prefix, seq, page_size))
    expected = core.alloc_extend(i64(prefix), i64(seq), i64(last), sum(seq) - sum(prefix))
    out = sub.alloc_extend(i64(prefix), i64(seq), i64(last), sum(seq) - sum(prefix))
    assert expected is not None and out is not None
    assert out.dtype == torch.int32 and out.tolist() == expected.tolist()
    if sum(seq) > sum(prefix):
        assert sub.calls[-1][3] == pages
    assert sub.available_size() == core.available_size()
