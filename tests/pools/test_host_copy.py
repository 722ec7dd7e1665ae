"""Host copies through the allocator (``get_cpu_copy`` -> free -> realloc -> ``load_cpu_copy``) per pool kind.

SGLang retracts a request by copying its KV to host memory and resumes it in new slots; every row
buffer a pool holds must come back bit for bit (quantised rows, scales, split latents, draft pools).
The MHA state machine is in ``tests/allocators/test_allocator_contract.py``.
"""

from __future__ import annotations

import pytest
import torch

from kvpools_core import Serving, build, plan
from kvpools_core.errors import AllocatorError
from tests.dsa.test_dsa_pool import small_dsa_plan
from tests.mla.test_mla_pool import small_plan as small_mla_plan

MiB = 1 << 20


def rows_of(buffers: list[torch.Tensor], slots: torch.Tensor) -> list[torch.Tensor]:
    return [b[slots].clone() for b in buffers]


def fill(buffers: list[torch.Tensor], slots: torch.Tensor, seed: int) -> None:
    """Random bytes into every row buffer at ``slots`` (any dtype: written through a uint8 view)."""
    gen = torch.Generator().manual_seed(seed)
    for b in buffers:
        raw = b.view(torch.uint8)
        raw[slots] = torch.randint(0, 256, raw[slots].shape, dtype=torch.uint8, generator=gen)


@pytest.mark.parametrize(("kv", "page"), [("auto", 1), ("fp8_e4m3", 16), ("fp4_e2m1", 16)])
def test_mla_rows_and_draft_come_back(kv: str, page: int) -> None:
    pools = build(small_mla_plan(kv, page, speculative_algorithm="NEXTN"), "cpu")
    alloc, pool = pools.allocator, pools.kv_pool
    assert alloc.get_kvcache() is pool and pool.draft is not None
    buffers = pool._row_buffers() + pool.draft._row_buffers()
    slots = alloc.alloc(2 * page)[: 2 * page - 1]
    fill(buffers, slots, seed=1)
    before = rows_of(buffers, slots)
    copy = alloc.get_cpu_copy(slots)
    alloc.free(slots)
    fill(buffers, slots, seed=2)  # the slots are reused by someone else meanwhile
    new = alloc.alloc(2 * page)[: 2 * page - 1]
    alloc.load_cpu_copy(copy, new)
    assert all(
        torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        for a, b in zip(rows_of(buffers, new), before, strict=True)
    )


def test_swa_full_and_window_rows_come_back() -> None:
    serving = Serving(page_size=4, kv_cache_dtype="fp8_e4m3", max_running_requests=4, context_length=64)
    p = plan("gpt-oss-20b", serving, memory=64 * MiB)
    pools = build(p, "cpu")
    alloc, pool = pools.allocator, pools.kv_pool
    assert alloc.get_kvcache() is pool
    zero, twelve = torch.tensor([0]), torch.tensor([12])
    loc = alloc.alloc_extend_swa_tail(zero, twelve, zero - 1, 12, 4)  # window tail: the last page
    k = torch.randn(12, 8, 64).to(torch.bfloat16)
    for layer in (0, 1):  # layer 0 slides, layer 1 is full
        pool.set_kv_buffer(layer, loc, k, -k)
    full_before, swa_before = pool.get_kv(1, loc), pool.get_kv(0, loc[-4:])
    copy = alloc.get_cpu_copy(loc)
    alloc.free(loc)
    again = alloc.alloc_extend_swa_tail(zero, twelve, zero - 1, 12, 4)
    alloc.load_cpu_copy(copy, again)
    for got, want in zip((pool.get_kv(1, again), pool.get_kv(0, again[-4:])), (full_before, swa_before), strict=True):
        assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    alloc.free(again)
    short = alloc.alloc_extend_swa_tail(zero, twelve, zero - 1, 12, 0)  # no SWA slots: the copy cannot land
    with pytest.raises(ValueError, match="no SWA slot"):
        alloc.load_cpu_copy(copy, short)


def test_pure_swa_rows_come_back() -> None:
    p = plan("mistral-7b-v0.1", Serving(page_size=16, context_length=256, max_running_requests=2), memory=64 * MiB)
    pools = build(p, "cpu")
    alloc, pool = pools.allocator, pools.kv_pool
    loc = alloc.alloc(16)
    k = torch.randn(16, 8, 128).to(torch.bfloat16)
    pool.set_kv_buffer(0, loc, k, k)
    copy = alloc.get_cpu_copy(loc)
    alloc.free(loc)
    again = alloc.alloc(32)[16:]
    alloc.load_cpu_copy(copy, again)
    assert torch.equal(pool.get_kv(0, again)[0], k)


def test_pools_without_host_copies_refuse_clearly() -> None:
    pools = build(small_dsa_plan(), "cpu")
    slots = pools.allocator.alloc(64)
    with pytest.raises(AllocatorError, match="DSA pool has no host copies"):
        pools.allocator.get_cpu_copy(slots)
    mamba = build(plan("falcon-h1-0.5b", Serving(max_running_requests=2, context_length=256), memory=256 * MiB), "cpu")
    with pytest.raises(AllocatorError, match="has no host copies"):
        mamba.allocator.get_cpu_copy(torch.tensor([1]))


def test_a_copy_loads_only_into_as_many_slots() -> None:
    pools = build(small_mla_plan(), "cpu")
    slots = pools.allocator.alloc(4)
    copy = pools.allocator.get_cpu_copy(slots)
    with pytest.raises(ValueError, match="holds 4 slots but 3 indices"):
        pools.allocator.load_cpu_copy(copy, slots[:3])
