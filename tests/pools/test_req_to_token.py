"""The request-to-token table: shape from the plan, row hand-out semantics, the decode variant."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvpools_core import Plan
from kvpools_core.pools import DecodeReqToTokenPool, ReqToTokenPool


def test_shape_and_bytes_from_plan(small_plan: Callable[..., Plan]) -> None:
    plan = small_plan(context_length=1000)
    pool = ReqToTokenPool.from_plan(plan, "cpu")
    rows = plan.max_running_requests
    # row = context 1000 + 4 headroom columns (get_req_to_token_extra_context_len), int32
    assert pool.req_to_token.shape == (rows + 1, 1004)
    assert pool.req_to_token.dtype == torch.int32
    assert pool.max_context_len == 1004
    assert pool.size == rows
    assert pool.nbytes == (rows + 1) * 1004 * 4 == plan.pool("req_to_token").bytes
    assert pool.available_size() == rows


def test_speculative_row_headroom(small_plan: Callable[..., Plan]) -> None:
    plan = small_plan(
        context_length=1000,
        speculative_algorithm="EAGLE",
        speculative_draft_num_layers=1,
        speculative_num_steps=5,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=6,
    )
    # + 4 + num_draft_tokens 6 columns
    assert ReqToTokenPool.from_plan(plan, "meta").max_context_len == 1010


def test_alloc_free_and_none() -> None:
    pool = ReqToTokenPool(4, 8, "cpu")
    assert pool.alloc(0) == []
    assert pool.alloc(3) == [1, 2, 3]  # row 0 pads and is never handed out
    assert pool.alloc(2) is None  # only one left: nothing changes
    assert pool.available_size() == 1
    assert pool.alloc(1) == [4]
    pool.free(2)
    pool.free([1, 3])
    assert pool.available_size() == 3
    assert sorted(pool.alloc(3) or []) == [1, 2, 3]
    pool.clear()
    assert pool.available_size() == 4 and pool.alloc(4) == [1, 2, 3, 4]


@pytest.mark.parametrize("row", [0, 5, -1])
def test_free_rejects_padding_and_unknown_rows(row: int) -> None:
    pool = ReqToTokenPool(4, 8, "cpu")
    pool.alloc(4)
    with pytest.raises(ValueError, match="not a row id"):
        pool.free(row)


def test_double_free_raises_and_changes_nothing() -> None:
    pool = ReqToTokenPool(4, 8, "cpu")
    rows = pool.alloc(2)
    assert rows == [1, 2]
    pool.free(1)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(1)
    assert pool.available_size() == 3


def test_free_accepts_a_tensor() -> None:
    pool = ReqToTokenPool(4, 8, "cpu")
    pool.alloc(3)
    pool.free(torch.tensor([1, 3]))
    assert pool.available_size() == 3


def test_write() -> None:
    pool = ReqToTokenPool(2, 8, "cpu")
    (row,) = pool.alloc(1) or []
    pool.write((row, slice(0, 3)), torch.tensor([7, 8, 9], dtype=torch.int32))
    assert pool.req_to_token[row, :4].tolist() == [7, 8, 9, 0]
    pool.write(torch.tensor([row]), 5)
    assert pool.req_to_token[row].eq(5).all()


def test_decode_plan_builds_decode_table(small_plan: Callable[..., Plan]) -> None:
    plan = small_plan(disaggregation_mode="decode", disaggregation_decode_extra_slots=7)
    pool = ReqToTokenPool.from_plan(plan, "cpu")
    assert isinstance(pool, DecodeReqToTokenPool)
    running = plan.max_running_requests
    assert (pool.size, pool.pre_alloc_size) == (running, 7)
    assert pool.req_to_token.shape[0] == running + 7 + 1
    assert pool.nbytes == plan.pool("req_to_token").bytes
    assert pool.available_size() == running + 7


def test_decode_generation_counts_reuse() -> None:
    pool = DecodeReqToTokenPool(2, 8, "cpu", pre_alloc_size=1)
    assert pool.alloc(3) == [1, 2, 3]
    pool.free(2)
    assert pool.alloc(1) == [2]
    assert pool.req_generation[1:] == [1, 2, 1]


def test_meta_allocates_nothing_but_reports_bytes() -> None:
    pool = ReqToTokenPool(4096, 1 << 20, "meta")
    assert pool.device.type == "meta"
    assert pool.nbytes == 4097 * (1 << 20) * 4
    assert pool.alloc(2) == [1, 2]
