"""SGLang's allocator contract (issue 19): what SGLang's own allocator unit tests check, written here.

The behaviours of ``test/registered/unit/mem_cache/test_allocator_cpu.py`` (sglang 6204cdc6) and
``test_allocator_refcount.py`` (sglang 9c458129), on kvpools' token, paged and SWA allocators, on every
device torch sees; where kvpools decided to differ (``docs/allocators.md``, "Allocator contract"), the
test pins kvpools' behaviour.  The state machines at the end check reference counts and host copies
against a model.
"""

from __future__ import annotations

from typing import Any
from unittest.mock import MagicMock

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvpools_core.allocators import BaseTokenToKVPoolAllocator, PagedAllocator, TokenAllocator
from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator, new_full_to_swa_mapping
from kvpools_core.errors import AllocatorError


def i64(values: list[int], device: str = "cpu") -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64, device=device)


def token(size: int, device: str, need_sort: bool = False, kvcache: Any = None) -> TokenAllocator:
    """SGLang's positional constructor: ``(size, dtype, device, kvcache, need_sort)``."""
    return TokenAllocator(size, torch.int64, device, kvcache if kvcache is not None else MagicMock(), need_sort)


def paged(size: int, page: int, device: str, need_sort: bool = False, kvcache: Any = None) -> PagedAllocator:
    """SGLang's positional constructor: ``(size, page_size, dtype, device, kvcache, need_sort)``."""
    return PagedAllocator(size, page, torch.int64, device, kvcache if kvcache is not None else MagicMock(), need_sort)


# ------------------------------------------------------------------ the abstract base
class Minimal(BaseTokenToKVPoolAllocator):
    """An engine's subclass as SGLang's tests write one: its own free_pages / release_pages tensors."""

    def __init__(self) -> None:
        super().__init__(8, 1, torch.int64, "cpu", MagicMock(), False)
        self.free_pages = torch.arange(1, 9, dtype=torch.int64)
        self.release_pages = torch.empty(0, dtype=torch.int64)
        self.freed: list[list[int]] = []

    def clear(self) -> None:
        pass

    def alloc(self, need_size: int) -> None:
        pass

    def free(self, free_index: Any) -> None:
        self.freed.append(torch.as_tensor(free_index).tolist())


def test_base_is_abstract_in_clear_alloc_free() -> None:
    with pytest.raises(TypeError, match="abstract"):
        BaseTokenToKVPoolAllocator(8, 1, torch.int64, "cpu", None, False)  # type: ignore[abstract]


@pytest.mark.parametrize("method", ["get_cpu_copy", "load_cpu_copy", "alloc_extend", "alloc_decode"])
def test_base_leaves_the_rest_not_implemented(method: str) -> None:
    with pytest.raises(NotImplementedError):
        getattr(Minimal(), method)()


def test_base_keeps_the_constructor_and_sglang_defaults() -> None:
    a = Minimal()
    assert (a.size, a.page_size, a.dtype, a.device, a.need_sort) == (8, 1, torch.int64, "cpu", False)
    assert a.get_kvcache() is a._kvcache and a.size_full == 8
    assert a.available_size() == 8 and a.debug_print() == ""
    a.free_pages, a.release_pages = i64([6, 5]), i64([3, 1, 2])
    a.merge_and_sort_free()
    assert a.free_pages.tolist() == [1, 2, 3, 5, 6] and len(a.release_pages) == 0
    a.merge_and_sort_free()  # nothing released: no change
    assert a.free_pages.tolist() == [1, 2, 3, 5, 6]
    a.free_group_begin()
    with pytest.raises(RuntimeError):
        a.free_group_begin()
    a.free_group.append(i64([1]))  # type: ignore[union-attr]  # what a subclass's free does inside a group
    a.free_group.append(i64([2]))  # type: ignore[union-attr]
    a.free_group_end()
    assert a.freed == [[1, 2]]


def test_kvpools_allocators_are_the_base(device: str) -> None:
    pool = MagicMock()
    for a in (token(8, device, kvcache=pool), paged(8, 2, device, kvcache=pool)):
        assert isinstance(a, BaseTokenToKVPoolAllocator)
        assert a.get_kvcache() is pool and a.dtype is torch.int64
    pool.full_to_swa_index_mapping = new_full_to_swa_mapping(8, 2, device)
    swa = SWATokenToKVPoolAllocator(8, 8, 2, torch.int64, device, pool, False)
    assert isinstance(swa, BaseTokenToKVPoolAllocator) and swa.get_kvcache() is pool
    assert swa.full_attn_allocator.get_kvcache() is pool.full_kv_pool
    assert swa.swa_attn_allocator.get_kvcache() is pool.swa_kv_pool
    assert swa.full_to_swa_index_mapping is pool.full_to_swa_index_mapping  # the pool's mapping, not a new one
    with pytest.raises(NotImplementedError, match="only for paged"):
        token(8, device).alloc_decode(i64([1], device), i64([0], device))


# ------------------------------------------------------------------ the token allocator
def test_token_alloc(device: str) -> None:
    a = token(16, device)
    out = a.alloc(4)
    assert out is not None and len(out) == 4 and a.available_size() == 12
    more = a.alloc(4)
    assert more is not None and not set(out.tolist()) & set(more.tolist())
    assert len(torch.unique(torch.cat((out, more)))) == 8
    assert token(8, device).alloc(9) is None
    assert token(4, device, need_sort=True).alloc(8) is None
    whole = token(16, device).alloc(16)
    assert whole is not None and 0 not in whole.tolist()
    empty = a.alloc(0)
    assert empty is not None and len(empty) == 0 and a.available_size() == 8


def test_token_free(device: str) -> None:
    a = token(16, device)
    a.free(a.alloc(4))
    assert a.available_size() == 16
    a.free(torch.tensor([], dtype=torch.int64, device=device))
    assert a.available_size() == 16
    b = token(8, device)
    b.free(b.alloc(8))
    assert b.alloc(8) is not None
    s = token(8, device, need_sort=True)
    s.free(s.alloc(4))
    assert len(s.release_pages) == 4 and a.available_size() == 16
    assert s.alloc(8) is not None  # merged before the alloc
    n = token(8, device)
    n.free(n.alloc(4))
    assert len(n.free_pages) == 8


def test_token_reuses_freed_slots_first(device: str) -> None:
    """Divergence: LIFO where SGLang's token allocator is FIFO (its free appends to the end)."""
    a = token(8, device)
    out = a.alloc(3)
    assert out is not None
    a.free(out)
    again = a.alloc(3)
    assert again is not None and again.tolist() == out.tolist()  # SGLang hands out [4, 5, 6] here


def test_token_backup_restore_and_groups(device: str) -> None:
    a = token(16, device)
    state = a.backup_state()
    a.alloc(8)
    a.alloc(4)
    a.restore_state(state)
    assert a.available_size() == 16
    out = a.alloc(4)
    state = a.backup_state()
    a.free(out)
    a.restore_state(state)
    assert a.available_size() == 12
    x, y = a.alloc(4), a.alloc(4)
    a.free_group_begin()
    a.free(x)
    a.free(y)
    assert a.available_size() == 4
    a.free_group_end()
    assert a.available_size() == 12
    a.free_group_begin()
    a.free_group_end()
    assert a.available_size() == 12


@pytest.mark.parametrize("make", [lambda kv: token(8, "cpu", kvcache=kv), lambda kv: paged(16, 4, "cpu", kvcache=kv)])
def test_host_copies_delegate_to_the_pool(make: Any) -> None:
    kv = MagicMock()
    kv.get_cpu_copy.return_value = "cpu_data"
    a = make(kv)
    assert a.get_cpu_copy(i64([4, 8])) == "cpu_data"
    kv.get_cpu_copy.assert_called_once()
    a.load_cpu_copy("data", i64([4, 8]))
    kv.load_cpu_copy.assert_called_once()


def test_host_copies_without_a_pool_say_what_is_missing() -> None:
    with pytest.raises(AllocatorError, match="built without one: pass kvcache="):
        TokenAllocator(8).get_cpu_copy(i64([1]))
    with pytest.raises(AllocatorError, match="has no host copies"):
        PagedAllocator(8, 2, kvcache=object()).load_cpu_copy([], i64([2]))


# ------------------------------------------------------------------ the paged allocator
def test_paged_alloc_and_free(device: str) -> None:
    a = paged(64, 4, device)
    out = a.alloc(8)
    assert out is not None and len(out) == 8 and a.available_size() == 56
    assert int(out[0]) % 4 == 0 and int(out[4]) % 4 == 0
    assert paged(16, 4, device).alloc(20) is None
    assert paged(16, 4, device, need_sort=True).alloc(32) is None
    grid = paged(64, 4, device).alloc(16)
    assert grid is not None and len(torch.unique(grid)) == 16
    whole = paged(64, 4, device).alloc(64)
    assert whole is not None and 0 not in whole.tolist()
    b = paged(32, 4, device)
    b.free(b.alloc(8))
    assert b.available_size() == 32
    b.free(torch.tensor([], dtype=torch.int64, device=device))
    assert b.available_size() == 32
    c = paged(16, 4, device)
    c.free(c.alloc(16))
    assert c.alloc(16) is not None
    s = paged(32, 4, device, need_sort=True)
    s.free(s.alloc(4))
    assert s.available_size() == 32 and len(s.release_pages) == 1


def test_paged_groups_restore_and_clear(device: str) -> None:
    a = paged(32, 4, device)
    x, y = a.alloc(4), a.alloc(4)
    a.free_group_begin()
    a.free(x)
    a.free(y)
    assert a.available_size() == 24
    a.free_group_end()
    assert a.available_size() == 32
    state = a.backup_state()
    a.alloc(16)
    a.restore_state(state)
    assert a.available_size() == 32
    a.alloc(32)
    a.clear()
    assert a.available_size() == 32


def test_paged_extend_and_decode(device: str) -> None:
    """What SGLang's ``test_allocator_gpu.py`` checks of ``alloc_extend`` / ``alloc_decode``, on every device."""

    def t(values: list[int]) -> torch.Tensor:
        return i64(values, device)

    a = paged(256, 4, device)
    out = a.alloc_extend(t([0, 4]), t([8, 8]), t([-1, 3]), 12)
    assert out is not None and len(out) == 12 and len(torch.unique(out)) == 12 and a.available_size() == 256 - 12
    state = a.backup_state()
    assert a.alloc_extend(t([0]), t([8]), t([-1]), 8) is not None
    a.restore_state(state)
    assert a.available_size() == 244
    assert paged(256, 4, device, need_sort=True).alloc_extend(t([0]), t([8]), t([-1]), 8) is not None
    assert paged(16, 4, device, need_sort=True).alloc_extend(t([0]), t([32]), t([-1]), 32) is None
    # the open page, then whole pages, then a part page (fresh allocator: pages 1 and 2 are next)
    unaligned = paged(256, 4, device).alloc_extend(t([2]), t([11]), t([1]), 9)
    assert unaligned is not None and unaligned.tolist() == [2, 3, 4, 5, 6, 7, 8, 9, 10]
    b = paged(256, 4, device)
    b.alloc(8)
    several = b.alloc_extend(t([1, 3]), t([6, 7]), t([4, 10]), 9)
    assert several is not None and len(torch.unique(several)) == 9
    d = paged(256, 4, device)
    within = d.alloc_decode(t([4, 8, 12, 16]), t([3, 7, 11, 15]))
    assert within is not None and within.tolist() == [4, 8, 12, 16] and d.available_size() == 256  # no new page
    crossing = d.alloc_decode(t([5, 9]), t([3, 7]))
    assert crossing is not None and len(torch.unique(crossing)) == 2 and d.available_size() == 248
    assert paged(16, 4, device, need_sort=True).alloc_decode(t([5, 9, 13, 17, 21]), t([3, 7, 11, 15, 19])) is None


def test_paged_alloc_refuses_a_partial_page() -> None:
    """Divergence: SGLang rounds ``alloc(n)`` down to whole pages (an empty tensor below a page); kvpools refuses,
    with an ``AllocatorError`` that is a ``ValueError`` (SGLang's debug mode asserts)."""
    a = paged(64, 4, "cpu")
    for n in (3, 5):
        with pytest.raises(ValueError, match="multiple of page_size=4"):
            a.alloc(n)
    assert a.available_size() == 64
    assert a.alloc(4) is not None


def test_paged_reuses_freed_pages_ascending(device: str) -> None:
    """As SGLang's: a free puts its distinct pages, ascending, in front of the free list."""
    a = paged(32, 4, device)
    first, second = a.alloc(8), a.alloc(8)
    assert first is not None and second is not None
    a.free(torch.cat((second, first)))  # pages 3, 4 then 1, 2
    again = a.alloc(16)
    assert again is not None and again[::4].tolist() == [4, 8, 12, 16]


def test_double_free_is_refused(device: str) -> None:
    for a in (token(4, device), paged(8, 2, device)):
        out = a.alloc(2)
        a.free(out)
        with pytest.raises(ValueError):
            a.free(out)


# ------------------------------------------------------------------ reference counts
def test_token_retain_delays_reuse(device: str) -> None:
    a = token(8, device)
    out = a.alloc(3)
    assert out is not None and out.tolist() == [1, 2, 3]
    a.retain(out)
    a.free(out)
    assert a.available_size() == 5
    assert a.ref_counts[out].tolist() == [1, 1, 1] and a.ref_counts.dtype is torch.int32
    a.free(out)
    assert a.available_size() == 8 and a.ref_counts[out].tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="double free"):
        a.free(out)


def test_paged_retain_delays_page_reuse(device: str) -> None:
    a = paged(8, 2, device)
    out = a.alloc(4)
    assert out is not None and out.tolist() == [2, 3, 4, 5]
    a.retain(out)
    a.free(out)
    assert a.available_size() == 4 and a.ref_counts[i64([1, 2])].tolist() == [1, 1]
    a.free(out)
    assert a.available_size() == 8 and a.ref_counts[i64([1, 2])].tolist() == [0, 0]


def test_ref_counts_before_any_retain_and_their_bytes() -> None:
    a = paged(16, 4, "cpu")
    out = a.alloc(8)
    assert out is not None
    assert a.ref_counts.tolist() == [0, 1, 1, 0, 0]  # read from the free list: no counts kept yet
    assert "allocator_refcounts" not in a.nbytes_by_pool()
    a.retain(out[:1])  # page 1 only
    assert a.ref_counts.tolist() == [0, 2, 1, 0, 0]
    assert a.nbytes_by_pool() == {"allocator": a.planned_nbytes(16, 4), "allocator_refcounts": 4 * 5}
    with pytest.raises(AllocatorError, match="not allocated"):
        a.retain(i64([12]))  # page 3 is free
    with pytest.raises(AllocatorError, match="foreign"):
        a.retain(i64([0]))


# ------------------------------------------------------------------ the SWA allocator's tail
def test_swa_tail_allocates_full_pages_and_only_the_window_tail(device: str) -> None:
    a = SWATokenToKVPoolAllocator(64, 32, 4, torch.int64, device, None, False)
    full = a.alloc_extend_swa_tail(i64([0], device), i64([10], device), i64([-1], device), 10, 2)
    assert full is not None and full.tolist() == list(range(4, 14))
    assert a.full_available_size() == 64 - 12 and a.swa_available_size() == 32 - 4
    mapping = a.full_to_swa_index_mapping[full].tolist()
    assert mapping[:8] == [0] * 8 and mapping[8:] == [4, 5]
    # nothing for the window: full pages only; a short pool: None, nothing changed
    only_full = a.alloc_extend_swa_tail(i64([0], device), i64([4], device), i64([-1], device), 4, 0)
    assert only_full is not None and a.swa_available_size() == 28
    before = (a.full_available_size(), a.swa_available_size())
    too_long = a.alloc_extend_swa_tail(i64([0], device), i64([200], device), i64([-1], device), 200, 8)
    assert too_long is None and (a.full_available_size(), a.swa_available_size()) == before
    a.free(full)
    assert a.full_available_size() == 64 - 4 and a.swa_available_size() == 32


def test_swa_tail_refuses_what_sglang_asserts() -> None:
    a = SWATokenToKVPoolAllocator(64, 32, 4, checked=True)
    with pytest.raises(AllocatorError, match="one request"):
        a.alloc_extend_swa_tail(i64([0, 0]), i64([4, 4]), i64([-1, -1]), 8, 4)
    with pytest.raises(AllocatorError, match="swa_tail_len <= extend_num_tokens"):
        a.alloc_extend_swa_tail(i64([0]), i64([4]), i64([-1]), 4, 5)
    with pytest.raises(AllocatorError, match="starts mid-page"):
        a.alloc_extend_swa_tail(i64([0]), i64([10]), i64([-1]), 10, 3)
    with pytest.raises(AllocatorError, match="page_size > 1"):
        SWATokenToKVPoolAllocator(8, 8, 1).alloc_extend_swa_tail(i64([0]), i64([4]), i64([-1]), 4, 2)
    assert a.full_available_size() == 64 and a.swa_available_size() == 32


# ------------------------------------------------------------------ state machines
class RefCountMachine(RuleBasedStateMachine):
    """Reference counts against a model: a unit is reused only once every holder has freed it."""

    @initialize(page=st.sampled_from([1, 2, 4]), need_sort=st.booleans(), checked=st.booleans())
    def start(self, page: int, need_sort: bool, checked: bool) -> None:
        self.page = page
        self.units = 6
        kwargs: dict[str, Any] = {"need_sort": need_sort, "checked": checked}
        self.a = TokenAllocator(6, **kwargs) if page == 1 else PagedAllocator(6 * page, page, **kwargs)
        self.held: dict[int, int] = {}  # unit -> holders
        self.pending: set[int] = set()  # units nobody holds, freed in the open group: free at its end
        self.in_group = False

    def slots(self, units: list[int]) -> torch.Tensor:
        return torch.tensor([u * self.page + o for u in units for o in range(self.page)], dtype=torch.int64)

    @rule(n=st.integers(0, 3))
    def alloc(self, n: int) -> None:
        out = self.a.alloc(n * self.page)
        free = self.units - len(self.held) - len(self.pending)
        if n > free:
            assert out is None
            return
        assert out is not None
        units = sorted(set((out // self.page).tolist()))
        assert len(units) == n and not set(units) & set(self.held)
        self.held.update(dict.fromkeys(units, 1))

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def retain(self, data: st.DataObject) -> None:
        units = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=3, unique=True))
        self.a.retain(self.slots(units))
        for u in units:
            self.held[u] += 1

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        units = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, max_size=3, unique=True))
        self.a.free(self.slots(units))
        for u in units:
            self.held[u] -= 1
            if not self.held[u]:
                del self.held[u]
                if self.in_group:
                    self.pending.add(u)

    @rule(data=st.data())
    def free_an_unheld_unit_is_refused(self, data: st.DataObject) -> None:
        free = [u for u in range(1, self.units + 1) if u not in self.held and u not in self.pending]
        if not free or not self.held:
            return
        self.a.retain(self.slots([next(iter(self.held))]))  # counts on
        self.held[next(iter(self.held))] += 1
        before = self.a.ref_counts.tolist()
        with pytest.raises(AllocatorError):
            self.a.free(self.slots([data.draw(st.sampled_from(free))]))
        assert self.a.ref_counts.tolist() == before

    @rule()
    def group(self) -> None:
        if self.in_group:
            self.a.free_group_end()
            self.pending.clear()
        else:
            self.a.free_group_begin()
        self.in_group = not self.in_group

    @invariant()
    def counts_are_the_model(self) -> None:
        if not hasattr(self, "a"):
            return
        assert self.a.ref_counts.tolist() == [self.held.get(u, 0) for u in range(self.units + 1)]
        assert self.a.available_size() == (self.units - len(self.held) - len(self.pending)) * self.page


TestRefCounts = RefCountMachine.TestCase
TestRefCounts.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


class HostCopyMachine(RuleBasedStateMachine):
    """A request's KV after ``get_cpu_copy`` -> ``free`` -> realloc -> ``load_cpu_copy`` is what was written."""

    @initialize(page=st.sampled_from([1, 4]), seed=st.integers(0, 2**16))
    def start(self, page: int, seed: int) -> None:
        from kvpools_core.building import build
        from kvpools_core.pipeline import plan
        from kvpools_core.values import Serving
        from tests.pools.conftest import build_mha_model

        p = plan(build_mha_model(layers=2, kv_heads=2, head_dim=8), Serving(page_size=page), memory=1 << 20)
        pools = build(p, "cpu")
        self.a, self.pool, self.page = pools.allocator, pools.kv_pool, page
        self.gen = torch.Generator().manual_seed(seed)
        self.live: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # request -> (slots, its K)
        self.parked: dict[int, tuple[Any, torch.Tensor]] = {}  # retracted request -> (host copy, its K)
        self.next = 0

    @rule(n=st.integers(1, 9))
    def admit(self, n: int) -> None:
        pages = -(-n // self.page)
        slots = self.a.alloc(pages * self.page)
        if slots is None:
            return
        slots = slots[:n]
        k = torch.randn(n, 2, 8, generator=self.gen).to(torch.bfloat16)
        for layer in range(2):
            self.pool.set_kv_buffer(layer, slots, k, -k)
        self.live[self.next] = (slots, k)
        self.next += 1

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def retract(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(sorted(self.live)))
        slots, k = self.live.pop(req)
        self.parked[req] = (self.a.get_cpu_copy(slots), k)
        self.a.free(slots)

    @precondition(lambda self: self.parked)
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        req = data.draw(st.sampled_from(sorted(self.parked)))
        copy, k = self.parked[req]
        n = k.shape[0]
        slots = self.a.alloc(-(-n // self.page) * self.page)
        if slots is None:
            return
        del self.parked[req]
        slots = slots[:n]
        self.a.load_cpu_copy(copy, slots)
        self.live[req] = (slots, k)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        slots, _ = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        self.a.free(slots)

    @invariant()
    def every_live_request_reads_what_was_written(self) -> None:
        for slots, k in getattr(self, "live", {}).values():
            for layer in range(2):
                got_k, got_v = self.pool.get_kv(layer, slots)
                assert torch.equal(got_k, k) and torch.equal(got_v, -k)


TestHostCopies = HostCopyMachine.TestCase
TestHostCopies.settings = settings(max_examples=25, stateful_step_count=20, deadline=None)
