"""The Ascend NPU paged allocator (``kvpools_ascend.allocator``): SGLang's ``NPUPagedTokenToKVPoolAllocator``.

Reference: ``/work/shared/reference/sglang-pools.md`` §3.3 (``allocator_npu.py@0828de37``:
``alloc_extend`` runs its Triton kernel below 200 new pages, else ``alloc_extend_naive``, and returns
``out.int()``; ``alloc_decode`` is ``(last_loc+1)*(1-need) + free[cumsum(need)-need]*P*need`` with
``need = seq_lens % P == 1``; ``free`` takes ``unique(idx.cpu() // P)``), §2.3 (the paged parent: page
``p`` holds slots ``p*P .. p*P+P-1``, page 0 pads, the three runs per extend request, freed pages
prepended; "Return dtype int64 (NPU: int32)", line 422) and ``000_*.txt`` lines 2036-2096
(``_build_token_to_kv_pool_allocator``: on an NPU with the ``ascend`` backend or a hybrid GDN model,
hybrid SWA models get ``SWATokenToKVPoolAllocator`` / ``DSV4NPUTokenToKVPoolAllocator`` (2063-2081),
the others ``NPUPagedTokenToKVPoolAllocator(max_total_num_tokens, page_size, ...)`` (2083-2096)).
Every slot below is worked out by hand from those rules.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kvpools_ascend import allocator as npu
from kvpools_ascend.allocator import NPUPagedAllocator
from torch import Tensor

from kvpools_core import Serving, build, plan
from kvpools_core.allocators import AllocatorState, PagedAllocator, TokenAllocator
from kvpools_core.errors import AllocatorError

I32 = torch.int32


def i64(values: list[int]) -> Tensor:
    return torch.tensor(values, dtype=torch.int64)


def i32(values: list[int]) -> Tensor:
    return torch.tensor(values, dtype=I32)


class SpyNPU(NPUPagedAllocator):
    """Counts the batches the naive loop fills."""

    naive_calls = 0

    def alloc_extend_naive(self, *args: object) -> Tensor:
        self.naive_calls += 1
        out: Tensor = super().alloc_extend_naive(*args)
        return out


# ------------------------------------------------------------ hand examples
def test_the_class_is_sglangs_paged_allocator_with_int32_slots() -> None:
    assert issubclass(NPUPagedAllocator, PagedAllocator)
    assert NPUPagedAllocator.index_dtype == I32 and NPUPagedAllocator.naive_extend_pages == 200
    assert npu.npu_paged_allocator_class() is NPUPagedAllocator  # one class, defined once
    assert NPUPagedAllocator.__module__ == "kvpools_ascend.allocator"
    with pytest.raises(AttributeError, match="no attribute 'NPUPaged'"):
        _ = npu.NPUPaged


@pytest.mark.parametrize("checked", [False, True])
def test_decode_formula_on_a_concrete_batch(checked: bool) -> None:
    """P = 4, pages 1-4 in use, pages 5, 6, ... free.  seq_lens [5, 6, 9, 3]: need = seq % 4 == 1 =
    [1, 0, 1, 0], cumsum(need) - need = [0, 1, 1, 2]: request 0 takes page 5 (slot 20), request 2
    page 6 (slot 24), requests 1 and 3 continue their pages (last_loc 8 -> 9, 17 -> 18)."""
    a = NPUPagedAllocator(64, 4, checked=checked)
    assert a.alloc_pages(4) == [1, 2, 3, 4]
    # last_loc: position seq-2 of each request (page 1 pos 3, page 2 pos 4, page 3 pos 7, page 4 pos 1)
    out = a.alloc_decode(i64([5, 6, 9, 3]), i64([7, 8, 15, 17]))
    assert out is not None and out.dtype == I32
    assert out.tolist() == [20, 9, 24, 18]
    assert a.available_size() == (16 - 4 - 2) * 4  # need.sum() == 2 pages taken
    assert a.alloc_pages(1) == [7]


def test_decode_without_new_pages_is_last_loc_plus_one() -> None:
    a = NPUPagedAllocator(32, 4)
    a.alloc_pages(2)
    out = a.alloc_decode(i64([2, 8]), i64([4, 10]))
    assert out is not None and out.dtype == I32 and out.tolist() == [5, 11]
    assert a.available_size() == 24


def test_decode_short_of_pages_changes_nothing() -> None:
    a = NPUPagedAllocator(16, 4)
    a.alloc_pages(3)  # one page left, two requests start a page
    assert a.alloc_decode(i64([1, 5]), i64([-1, 7])) is None
    assert a.available_size() == 4 and a.alloc_pages(1) == [4]


def test_decode_at_page_size_1_takes_one_slot_each() -> None:
    """SGLang's ``need`` is never set at P = 1 (seq % 1 == 0); the core's fresh slot per request stays."""
    a = NPUPagedAllocator(8, 1)
    out = a.alloc_decode(i64([4, 2]), i64([-1, -1]))
    assert out is not None and out.dtype == I32 and out.tolist() == [1, 2]


@pytest.mark.parametrize("checked", [False, True])
def test_extend_crossing_page_boundaries(checked: bool) -> None:
    """P = 4, pages 1-2 in use, pages 3, 4, 5, 6 next.  Request 0: prefix 2, seq 11, last_loc 5
    (page 1, position 1): positions 2-3 continue page 1 (6, 7), 4-7 fill page 3 (12-15), 8-10 start
    page 4 (16-18).  Request 1: prefix 5, seq 14, last_loc 8 (page 2, position 4): 5-7 continue
    page 2 (9-11), 8-11 fill page 5 (20-23), 12-13 start page 6 (24, 25)."""
    expected = [6, 7, 12, 13, 14, 15, 16, 17, 18, 9, 10, 11, 20, 21, 22, 23, 24, 25]
    a = NPUPagedAllocator(64, 4, checked=checked)
    assert a.alloc_pages(2) == [1, 2]
    out = a.alloc_extend(i64([2, 5]), i64([11, 14]), i64([5, 8]), 18)
    assert out is not None and out.dtype == I32 and out.tolist() == expected
    assert a.available_size() == (16 - 6) * 4
    # the naive loop on the same batch and pages gives the same slots
    naive = a.alloc_extend_naive(i64([2, 5]), i64([11, 14]), i64([5, 8]), i64([3, 4, 5, 6]), 18)
    assert naive.dtype == I32 and naive.tolist() == expected


def test_naive_loop_runs_from_200_new_pages_and_matches_the_vectorised_path() -> None:
    """200 new pages (SGLang: ``num_new_pages < 200`` -> kernel): request 0 prefix 2, seq 402 (pages
    1-101: 100 new), request 1 prefix 0, seq 399 (100 new, the last one 3 slots full), request 2
    nothing.  199 pages (seq 395: 99 new) stays on the vectorised path."""
    for seq1, pages, naive_calls in ((399, 200, 1), (395, 199, 0)):
        a, core = SpyNPU(4 * 1024, 4), PagedAllocator(4 * 1024, 4)
        for alloc in (a, core):
            assert alloc.alloc_pages(2) == [1, 2]
        args = (i64([2, 0, 7]), i64([402, seq1, 7]), i64([5, -1, 11]), 400 + seq1)
        out, expected = a.alloc_extend(*args), core.alloc_extend(*args)
        assert out is not None and expected is not None
        assert a.naive_calls == naive_calls and out.dtype == I32
        assert out.tolist() == expected.tolist()
        assert a.available_size() == core.available_size() == (1024 - 2 - pages) * 4
        # hand-checked ends: request 0 continues page 1 (6, 7), then page 3; request 1 starts page 103
        assert out[:3].tolist() == [6, 7, 12] and out[400] == 103 * 4
        assert out[-1] == (2 + pages) * 4 + (seq1 - 1) % 4


def test_naive_loop_equals_the_gather_on_the_same_state() -> None:
    """One allocator, one state: the batch filled by the naive loop, then (restored) by the gather."""
    a = NPUPagedAllocator(4 * 512, 4)
    a.alloc_pages(3)
    state = a.backup_state()
    args = (i64([3, 0, 8, 1]), i64([9, 5, 8, 30]), i64([6, -1, 11, 8]), 40)
    a.naive_extend_pages = 1  # every batch with a new page takes the loop
    naive = a.alloc_extend(*args)
    a.restore_state(state)
    a.naive_extend_pages = 10**9  # never
    gathered = a.alloc_extend(*args)
    assert naive is not None and gathered is not None
    assert naive.dtype == gathered.dtype == I32 and naive.tolist() == gathered.tolist()


def test_alloc_returns_int32_whole_pages() -> None:
    a = NPUPagedAllocator(32, 4)
    out = a.alloc(8)
    assert out is not None and out.dtype == I32 and out.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    empty = a.alloc_extend(i64([0]), i64([0]), i64([-1]), 0)
    assert empty is not None and empty.dtype == I32 and empty.numel() == 0


@pytest.mark.parametrize("checked", [False, True])
def test_free_takes_each_page_once_and_hands_them_back_ascending(checked: bool) -> None:
    """``unique(idx // P)``: slots [25, 9, 24, 9, 10] are pages [6, 2, 6, 2, 2] -> pages 2 and 6, once,
    prepended in ascending order (§2.3: freed pages are reused first)."""
    a = NPUPagedAllocator(64, 4, checked=checked)
    assert a.alloc_pages(8) == [1, 2, 3, 4, 5, 6, 7, 8]
    a.free(i32([25, 9, 24, 9, 10]))
    assert a.available_size() == (16 - 8 + 2) * 4
    assert a.alloc_pages(3) == [2, 6, 9]


def test_free_in_a_group_comes_back_at_its_end() -> None:
    a = NPUPagedAllocator(32, 4)
    slots = a.alloc(16)
    assert slots is not None
    a.free_group_begin()
    a.free(slots[8:])
    a.free(torch.cat((slots[:4], slots[8:12])))  # pages 1 and 3: page 3 again, taken once
    assert a.available_size() == 16
    a.free_group_end()
    assert a.available_size() == 28  # pages 1, 3, 4 back; page 2 still held


@pytest.mark.parametrize("checked", [False, True])
def test_bad_frees_are_refused_and_change_nothing(checked: bool) -> None:
    a = NPUPagedAllocator(32, 4, checked=checked)
    a.alloc_pages(2)
    for bad in (i32([3]), i32([8, 40]), i32([-1])):  # page 0 is padding; page 10 is past the pool
        with pytest.raises(AllocatorError, match=r"valid page ids are 1\.\.8"):
            a.free(bad)
    with pytest.raises(AllocatorError, match=r"integer page ids; got a torch\.float32 tensor"):
        a.free(torch.tensor([8.0]))
    assert a.available_size() == 24
    a.free([4, 8])  # Python ints (pages 1, 2): the core's free
    assert a.available_size() == 32


def test_planned_bytes_are_the_core_paged_allocators() -> None:
    for size, page_size, checked in ((57088, 128, False), (4096, 16, True)):
        core = PagedAllocator.planned_nbytes(size, page_size, checked)
        assert NPUPagedAllocator.planned_nbytes(size, page_size, checked) == core
        assert NPUPagedAllocator(size, page_size, device="meta", checked=checked).nbytes == core


# ------------------------------------------------------------------- build
def test_an_ascend_plan_builds_the_npu_allocator() -> None:
    result = plan("llama-3.1-8b", Serving(platform="ascend", page_size=128), memory="8GiB")
    pools = build(result, "meta")
    assert pools.provenance["build_allocator"] == ("ascend",)
    assert type(pools.allocator) is NPUPagedAllocator
    assert pools.allocator.index_dtype == getattr(torch, result.serving.traits.slot_index_dtype)  # the plan's int32
    assert pools.allocator.device.type == "meta" and not pools.allocator.need_sort
    assert pools.allocator.size == result.max_total_num_tokens and pools.allocator.page_size == 128
    assert pools.allocated_bytes == result.planned_bytes
    assert pools.allocator.nbytes == result.pool("allocator").bytes


def test_an_ascend_build_respects_checked_and_disaggregation() -> None:
    result = plan(
        "llama-3.1-8b", Serving(platform="ascend", page_size=128, disaggregation_mode="prefill"), memory="8GiB"
    )
    pools = build(result, "meta", checked=True)
    allocator = pools.allocator
    assert type(allocator) is NPUPagedAllocator and allocator.checked and allocator.need_sort
    pages = result.max_total_num_tokens // 128
    assert pools.allocated_by_pool()["allocator_checked"] == 2 * (pages + 1)  # int16 per page id 0..pages
    assert pools.allocated_bytes == result.planned_bytes + 2 * (pages + 1)


def test_a_cuda_plan_keeps_the_core_allocator() -> None:
    result = plan("llama-3.1-8b", Serving(page_size=128), memory="8GiB")
    pools = build(result, "meta")
    assert pools.provenance["build_allocator"] == ("core",)
    assert type(pools.allocator) is PagedAllocator
    assert npu.build_allocator(result, None, "meta", False) is None


def test_ascend_hybrid_gdn_gets_the_npu_allocator_and_swa_the_swa_one() -> None:
    """000_*.txt 2058-2096: hybrid GDN (mamba) -> NPU paged allocator; hybrid SWA -> SWA allocator."""
    gdn = plan("qwen3-next-80b-a3b-thinking", Serving(platform="ascend", page_size=128, tp_size=8), memory="80GiB")
    pools = build(gdn, "meta")
    assert pools.provenance["build_allocator"] == ("ascend",) and type(pools.allocator) is NPUPagedAllocator
    assert pools.allocated_bytes == gdn.planned_bytes
    swa = plan("gemma-3-12b-it", Serving(platform="ascend", page_size=128, tp_size=8), memory="80GiB")
    assert npu.build_allocator(swa, None, "meta", False) is None
    assert build(swa, "meta").provenance["build_allocator"] == ("swa",)


def test_deepseek_v4_and_page_size_1_are_declined_on_an_npu() -> None:
    """DSV4 has SWA and compressed token spaces (its SWA allocator, 000_*.txt 2066-2072).  At page size 1
    the plan charges the token allocator's free list (no in-page offsets): the core builds that."""
    dsv4 = plan("deepseek-v4-flash", Serving(page_size=256, tp_size=8), memory="80GiB")
    assert not npu.kv_slots_in_one_token_space(dsv4)
    assert npu.build_allocator(dsv4, None, "npu:0", False) is None
    page1 = plan("llama-3.1-8b", Serving(), memory="8GiB")
    assert npu.kv_slots_in_one_token_space(page1)
    assert npu.build_allocator(page1, None, "npu:0", False) is None
    assert type(build(page1, "meta").allocator) is TokenAllocator


# ----------------------------------------------------------- state machine
class NPUTwinMachine(RuleBasedStateMachine):
    """Random SGLang traffic on the NPU allocator and a core paged twin: the same calls give the same
    slots (int32 against int64), no slot is handed out twice, and frees restore availability.

    The twin gets each free's slots ascending and int64: SGLang's NPU free sorts the pages
    (``unique``) where the core's CPU free keeps first-seen order, so the twin is given the order the
    NPU free uses.  Subclasses vary the page size, ``need_sort``, checked mode and the naive threshold.
    """

    PAGES = 12
    page_size = 4
    need_sort = False
    checked = False
    naive_extend_pages = 200
    seqs: list[list[int]]
    blocks: list[list[int]]
    pending: set[int]
    in_group: bool
    saved: tuple[AllocatorState, AllocatorState, list[list[int]], list[list[int]], set[int], bool] | None

    @initialize()
    def setup(self) -> None:
        self.size = self.PAGES * self.page_size
        options = {"need_sort": self.need_sort, "checked": self.checked}
        self.npu = NPUPagedAllocator(self.size, self.page_size, **options)
        self.npu.naive_extend_pages = self.naive_extend_pages
        self.twin = PagedAllocator(self.size, self.page_size, **options)
        self.seqs, self.blocks, self.pending, self.in_group, self.saved = [], [], set(), False, None

    # -- helpers
    def live_slots(self) -> list[int]:
        p = self.page_size
        return [s for kv in self.seqs for s in kv] + [q * p + j for b in self.blocks for q in b for j in range(p)]

    def live_pages(self) -> set[int]:
        return {s // self.page_size for s in self.live_slots()}

    def same(self, out: Tensor | None, twin_out: Tensor | None) -> list[int] | None:
        if twin_out is None:
            assert out is None
            return None
        assert out is not None and out.dtype == I32 and twin_out.dtype == torch.int64
        slots: list[int] = out.tolist()
        assert slots == twin_out.tolist()
        return slots

    def check_new_pages(self, pages: list[int]) -> None:
        assert all(1 <= q <= self.PAGES for q in pages), pages
        assert len(set(pages)) == len(pages), "page handed out twice in one call"
        assert not set(pages) & self.live_pages(), "page handed out twice"
        assert not set(pages) & self.pending, "a page of an open free group reused"

    def free_both(self, slots: list[int], twice: bool) -> None:
        listed = slots + slots if twice else slots
        self.npu.free(i32(listed))
        self.twin.free(i64(sorted(set(listed))))
        if self.in_group:
            self.pending |= {s // self.page_size for s in slots}

    # -- traffic
    @rule(data=st.data())
    def extend(self, data: st.DataObject) -> None:
        grow = data.draw(st.lists(st.integers(0, len(self.seqs) - 1), unique=True, max_size=3)) if self.seqs else []
        batch = [self.seqs[i] for i in grow] + [[] for _ in range(data.draw(st.integers(0 if grow else 1, 2)))]
        ext = data.draw(st.lists(st.integers(0, 3 * self.page_size), min_size=len(batch), max_size=len(batch)))
        prefix = [len(kv) for kv in batch]
        args = (i64(prefix), i64([p + e for p, e in zip(prefix, ext, strict=True)]))
        last = i64([kv[-1] if kv else -1 for kv in batch])
        slots = self.same(self.npu.alloc_extend(*args, last, sum(ext)), self.twin.alloc_extend(*args, last, sum(ext)))
        if slots is None:
            return
        p, new_pages, at = self.page_size, [], 0
        for kv, e in zip(batch, ext, strict=True):
            previous = kv[-1] if kv else -1
            for pos, slot in enumerate(slots[at : at + e], start=len(kv)):
                if pos % p:
                    assert slot == previous + 1, "an open page continues slot by slot"
                else:
                    assert slot % p == 0, "a new page starts at its first slot"
                    new_pages.append(slot // p)
                previous = slot
            at += e
        self.check_new_pages(new_pages)
        for kv, e in zip(batch, ext, strict=True):
            kv.extend(slots[:e])
            del slots[:e]
        self.seqs += [kv for kv in batch[len(grow) :] if kv]

    @precondition(lambda self: self.seqs)
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        idx = data.draw(st.lists(st.integers(0, len(self.seqs) - 1), unique=True, min_size=1))
        batch = [self.seqs[i] for i in idx]
        seq, last = i64([len(kv) + 1 for kv in batch]), i64([kv[-1] for kv in batch])
        slots = self.same(self.npu.alloc_decode(seq, last), self.twin.alloc_decode(seq, last))
        if slots is None:
            return
        p = self.page_size
        self.check_new_pages([s // p for kv, s in zip(batch, slots, strict=True) if len(kv) % p == 0])
        for kv, s in zip(batch, slots, strict=True):
            assert s == (kv[-1] + 1 if len(kv) % p else s // p * p), "decode continues its page or starts one"
            kv.append(s)

    @precondition(lambda self: self.seqs)
    @rule(data=st.data(), twice=st.booleans())
    def free_seq(self, data: st.DataObject, twice: bool) -> None:
        i = data.draw(st.integers(0, len(self.seqs) - 1))
        kv = self.seqs[i]
        keep = data.draw(st.integers(0, len(kv) // self.page_size)) * self.page_size  # a page-aligned head stays
        self.free_both(data.draw(st.permutations(kv[keep:])), twice)
        if keep:
            del kv[keep:]
        else:
            del self.seqs[i]

    @rule(k=st.integers(0, PAGES + 1))
    def alloc_block(self, k: int) -> None:
        slots = self.same(self.npu.alloc(k * self.page_size), self.twin.alloc(k * self.page_size))
        if slots:
            pages = [s // self.page_size for s in slots[:: self.page_size]]
            assert slots == [q * self.page_size + j for q in pages for j in range(self.page_size)], "whole pages"
            self.check_new_pages(pages)
            self.blocks.append(pages)

    @precondition(lambda self: self.blocks)
    @rule(data=st.data(), twice=st.booleans())
    def free_block(self, data: st.DataObject, twice: bool) -> None:
        pages = self.blocks.pop(data.draw(st.integers(0, len(self.blocks) - 1)))
        self.free_both(data.draw(st.permutations([q * self.page_size + self.page_size - 1 for q in pages])), twice)

    @precondition(lambda self: not self.in_group)
    @rule()
    def group_begin(self) -> None:
        self.npu.free_group_begin()
        self.twin.free_group_begin()
        self.in_group = True

    @precondition(lambda self: self.in_group)
    @rule()
    def group_end(self) -> None:
        self.npu.free_group_end()
        self.twin.free_group_end()
        self.in_group, self.pending = False, set()

    @rule()
    def backup(self) -> None:
        model = ([list(kv) for kv in self.seqs], [list(b) for b in self.blocks], set(self.pending), self.in_group)
        self.saved = (self.npu.backup_state(), self.twin.backup_state(), *model)

    @precondition(lambda self: self.saved is not None)
    @rule()
    def restore(self) -> None:
        assert self.saved is not None
        state, twin_state, seqs, blocks, pending, in_group = self.saved
        self.npu.restore_state(state)
        self.twin.restore_state(twin_state)
        self.seqs, self.blocks = [list(kv) for kv in seqs], [list(b) for b in blocks]
        self.pending, self.in_group = set(pending), in_group

    @rule()
    def clear(self) -> None:
        self.npu.clear()
        self.twin.clear()
        self.seqs, self.blocks, self.pending, self.in_group = [], [], set(), False

    # -- invariants
    @invariant()
    def availability_matches(self) -> None:
        if hasattr(self, "npu"):
            free_pages = self.PAGES - len(self.live_pages()) - len(self.pending)
            assert self.npu.available_size() == self.twin.available_size() == free_pages * self.page_size

    @invariant()
    def no_slot_is_held_twice(self) -> None:
        if hasattr(self, "npu"):
            slots = self.live_slots()
            assert len(slots) == len(set(slots))

    def teardown(self) -> None:
        if not hasattr(self, "npu"):
            return
        if self.in_group:
            self.group_end()
        for kv in self.seqs:
            self.free_both(kv, twice=False)
        for pages in self.blocks:
            self.free_both([q * self.page_size for q in pages], twice=False)
        assert self.npu.available_size() == self.size
        assert sorted(self.npu.alloc_pages(self.PAGES) or []) == list(range(1, self.PAGES + 1))


class NPUTwin16Machine(NPUTwinMachine):
    page_size = 16
    PAGES = 6


class NPUTwinNaiveMachine(NPUTwinMachine):
    naive_extend_pages = 1  # every extend with a new page takes the naive loop


class NPUTwinSortedCheckedMachine(NPUTwinMachine):
    need_sort = True
    checked = True


class NPUTwinNaive16CheckedMachine(NPUTwinMachine):
    page_size = 16
    PAGES = 6
    checked = True
    naive_extend_pages = 1


def _machine_test(machine: type[RuleBasedStateMachine], examples: int) -> type:
    case = machine.TestCase
    case.settings = settings(max_examples=examples, stateful_step_count=25, deadline=None)
    return case


TestNPUTwin4 = _machine_test(NPUTwinMachine, 50)
TestNPUTwin16 = _machine_test(NPUTwin16Machine, 30)
TestNPUTwinNaive = _machine_test(NPUTwinNaiveMachine, 50)
TestNPUTwinSortedChecked = _machine_test(NPUTwinSortedCheckedMachine, 30)
TestNPUTwinNaive16Checked = _machine_test(NPUTwinNaive16CheckedMachine, 30)


def test_segment_frees_take_the_int32_slots_and_give_the_core_free_list() -> None:
    """SGLang 0.5.23's ``NPUPagedTokenToKVPoolAllocator`` inherits ``free_segment`` / ``free_page_ids`` from the
    paged allocator (``hardware_backend/npu/allocator_npu.py`` overrides only ``alloc_extend``, ``alloc_decode``
    and ``free``): the NPU allocator's int32 slots go through the core's, page ids as given (issue 37)."""
    npu_alloc, core = NPUPagedAllocator(64, 4), PagedAllocator(64, 4)
    rows = [a.alloc_extend(i64([0]), i64([10]), i64([-1]), 10) for a in (npu_alloc, core)]
    assert rows[0] is not None and rows[1] is not None
    assert rows[0].dtype == torch.int32 and rows[0].tolist() == rows[1].tolist() == list(range(4, 14))
    for a, row in zip((npu_alloc, core), rows, strict=True):
        a.free_segment(row[4:], start_pos=4)
        a.free_page_ids(torch.tensor([1], dtype=torch.int32))
    assert npu_alloc.get_all_free_pages().tolist() == core.get_all_free_pages().tolist() == [1, 2, 3, *range(4, 17)]
    with pytest.raises(AllocatorError, match="page boundary"):
        npu_alloc.free_segment(rows[0], start_pos=1)
