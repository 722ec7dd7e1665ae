"""The SWA allocator's per-request ring mode (SGLang 0.5.23 ``allocator/swa.py`` lines 128-170, 222-229, 285-330,
375-386, 495-550, 878): full slots paged as a plain paged allocator pages them, SWA capacity the ring total."""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kvpools_core.allocators import PagedAllocator
from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator
from kvpools_core.allocators.swa_ring import SWARingTokenToKVPoolAllocator, is_swa_req_ring, ring_cost_tokens
from kvpools_core.errors import AllocatorError


class Slots:
    """A request table's free rows (``ReqToTokenPool.available_size``)."""

    def __init__(self, free: int) -> None:
        self.free = free

    def available_size(self) -> int:
        return self.free


class RingPool:
    swa_req_ring_size = 6


def test_sizes_are_the_ring_total() -> None:
    slots = Slots(5)
    alloc = SWARingTokenToKVPoolAllocator(64, 32, 4, kvcache=RingPool(), req_to_token_pool=slots)
    # ring 6 in pages of 4: 8 tokens a slot (swa.py L139-141); 5 free slots: 40 (L143)
    assert alloc.swa_ring_cost_tokens == ring_cost_tokens(6, 4) == 8
    assert alloc.size_swa == 40
    assert alloc.size == min(alloc.size_full, 40)
    assert is_swa_req_ring(alloc)
    assert not is_swa_req_ring(SWATokenToKVPoolAllocator(64, 32, 4))
    slots.free = 2  # swa_available_size follows the free slots (L226-228); size_swa stays as counted (L143)
    assert alloc.swa_available_size() == 16
    assert alloc.size_swa == 40
    full = alloc.alloc(8)
    assert full is not None
    assert alloc.available_size() == alloc.full_available_size() == 64 - 8  # the ring never limits (L164-167)
    assert int(alloc.full_to_swa_index_mapping.abs().sum()) == 1  # only the -1 sentinel: nothing mapped


def test_ring_mode_needs_a_ring_and_the_request_table() -> None:
    with pytest.raises(AllocatorError, match="capacity is counted in req slots"):
        SWARingTokenToKVPoolAllocator(64, 32, 4, kvcache=RingPool(), req_to_token_pool=None)
    with pytest.raises(AllocatorError, match="positive ring size"):
        SWARingTokenToKVPoolAllocator(64, 32, 4, kvcache=object(), req_to_token_pool=Slots(1))


@settings(max_examples=25, stateful_step_count=30, deadline=None, derandomize=True, database=None)
class RingMatchesThePagedFullSide(RuleBasedStateMachine):
    """Ring mode takes and frees exactly what a plain paged allocator of the full size would (full KV only)."""

    PAGE, SIZE = 4, 96

    def __init__(self) -> None:
        super().__init__()
        self.ring = SWARingTokenToKVPoolAllocator(
            self.SIZE, 16, self.PAGE, kvcache=RingPool(), req_to_token_pool=Slots(3), checked=True
        )
        self.paged = PagedAllocator(self.SIZE, self.PAGE)
        self.requests: list[list[int]] = []

    @rule(length=st.integers(1, 13))
    def extend(self, length: int) -> None:
        args = (torch.tensor([0]), torch.tensor([length]), torch.tensor([-1]), length)
        got, want = self.ring.alloc_extend(*args), self.paged.alloc_extend(*args)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert torch.equal(got, want)
            self.requests.append(got.tolist())

    @precondition(lambda self: bool(self.requests))
    @rule(i=st.integers(0, 50))
    def decode(self, i: int) -> None:
        req = self.requests[i % len(self.requests)]
        args = (torch.tensor([len(req) + 1]), torch.tensor([req[-1]]))
        got, want = self.ring.alloc_decode(*args), self.paged.alloc_decode(*args)
        assert (got is None) == (want is None)
        if got is not None and want is not None:
            assert torch.equal(got, want)
            req.append(int(got[0]))

    @precondition(lambda self: bool(self.requests))
    @rule(i=st.integers(0, 50), swa_first=st.booleans())
    def finish(self, i: int, swa_first: bool) -> None:
        req = self.requests.pop(i % len(self.requests))
        if swa_first:
            self.ring.free_swa(torch.tensor(req))  # a no-op: the ring owns the SWA rows
            self.ring.free_full(torch.tensor(req))
        else:
            self.ring.free(torch.tensor(req))
        self.paged.free(torch.tensor(req))

    @invariant()
    def same_free_space(self) -> None:
        assert self.ring.available_size() == self.paged.available_size()
        assert self.ring.swa_available_size() == 3 * 8
        assert int((self.ring.full_to_swa_index_mapping[:-1] != 0).sum()) == 0


TestRingMatchesThePagedFullSide = RingMatchesThePagedFullSide.TestCase
