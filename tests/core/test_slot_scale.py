"""``CellPart.slot_scale``: a token pool spanning ``k`` slots per plan token (SGLang's DCP draft pools).

SGLang's draft worker under ``--dcp-size k`` builds its pools over ``max_total_num_tokens x k`` slots in pages
of ``page_size x k`` (``loc_space_scale``, ``000_fbd4f47288598fb9.txt`` lines 405-433): ``(tokens + page) x k``
rows.  These tests pin the contract: validation, the pool's fields and its recorded cost.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpools_core.errors import ConfigError, InvalidValueError
from kvpools_core.parts.sizing import token_pool, token_pools
from kvpools_core.values import REQUEST, CellPart, CellSize, CostModel


def test_slot_scale_must_be_positive() -> None:
    with pytest.raises(InvalidValueError, match="slot_scale"):
        CellPart("draft_kv", 10, "draft_kv", slot_scale=0)


def test_slot_scale_is_for_token_parts_only() -> None:
    with pytest.raises(InvalidValueError, match=r"slot_scale applies to token parts only.*'state'"):
        CellPart("state", 10, "state", unit=REQUEST, slot_scale=2)


def test_the_parts_of_one_pool_share_one_slot_scale() -> None:
    with pytest.raises(InvalidValueError, match="pool 'draft_kv' mixes parts of slot_scale 2 and 1"):
        CellSize(
            parts=(CellPart("a", 10, "draft_kv", slot_scale=2), CellPart("b", 4, "draft_kv")),
            sglang_bytes_per_token=14.0,
            num_layers=1,
        )


def test_cell_counts_every_slot_a_token_spans() -> None:
    cell = CellSize(
        parts=(CellPart("latent", 100, "kv"), CellPart("draft_latent", 10, "draft_kv", slot_scale=4)),
        sglang_bytes_per_token=110.0,
        num_layers=2,
    )
    assert cell.pool_slot_scale() == {"kv": 1, "draft_kv": 4}
    assert cell.bytes_per_token == 100 + 10 * 4
    assert cell.cost.group("draft_kv").token_bytes == 40


def test_a_scaled_pool_by_hand() -> None:
    """1,000 tokens, page 16, 1,152 B per slot, 8 slots per token: 8 x (1,000 + 16) rows."""
    pool = token_pool("draft_kv", 1000, 16, 1152, "test", slot_scale=8)
    assert (pool.slots, pool.padding_slots, pool.bytes_per_slot) == (8000, 128, 1152)
    assert pool.bytes == 8128 * 1152 == 9_363_456
    cost = pool.group_cost
    assert (cost.token_bytes, cost.token_block, cost.fixed_bytes) == (9216, 1, 128 * 1152)


def test_a_scaled_paged_pool_with_slack_by_hand() -> None:
    """SGLang's DSA draft indexer under DCP 8 at page 64: ``(8 x 640 + 512 + 1) // 512`` pages of 512 slots."""
    pool = token_pool("draft_indexer", 640, 64, 132, "test", extra_slots=1, slot_scale=8)
    rows = (8 * 640 + 8 * 64 + 1) // 512 * 512
    assert rows == 5632 == 8 * (640 + 64)
    assert (pool.slots, pool.padding_slots, pool.bytes) == (5120, 512, 5632 * 132)
    cost = pool.group_cost
    assert (cost.token_bytes, cost.token_block, cost.fixed_bytes) == (512 * 132, 64, 512 * 132)


def test_slot_scale_below_one_is_refused() -> None:
    with pytest.raises(ConfigError, match="slot_scale must be at least 1"):
        token_pool("kv", 10, 1, 4, "test", slot_scale=0)


@given(
    pages=st.integers(0, 500),
    page=st.sampled_from((1, 16, 64, 256)),
    per_slot=st.integers(1, 5000),
    scale=st.sampled_from((1, 2, 4, 8)),
    extra=st.sampled_from((0, 1)),
)
def test_the_recorded_cost_gives_the_bytes_for_any_page_aligned_count(
    pages: int, page: int, per_slot: int, scale: int, extra: int
) -> None:
    """Every consumer of a plan's cost (fit, capacity, sweep) reads the bytes off it: they must be the pool's."""
    tokens = pages * page
    pool = token_pool("p", tokens, page, per_slot, "test", extra_slots=extra, slot_scale=scale)
    assert pool.bytes == (pool.slots + pool.padding_slots) * per_slot
    assert pool.slots == tokens * scale
    assert CostModel((pool.group_cost,)).bytes_for(tokens=tokens) == pool.bytes
    if not extra:
        assert pool.padding_slots == page * scale


def test_token_pools_pass_each_pools_scale() -> None:
    cell = CellSize(
        parts=(CellPart("latent", 100, "kv"), CellPart("draft_latent", 10, "draft_kv", slot_scale=2)),
        sglang_bytes_per_token=110.0,
        num_layers=2,
    )
    kv, draft = token_pools(cell, 64, 1, "test")
    assert (kv.slots, kv.padding_slots, kv.bytes) == (64, 1, 65 * 100)
    assert (draft.slots, draft.padding_slots, draft.bytes) == (128, 2, 130 * 10)


def test_a_plan_without_slot_scale_reads_back_as_scale_one() -> None:
    """Plans written before the field: ``from_dict`` fills the default."""
    part = CellPart.from_dict({"name": "latent", "bytes_per_token": 10, "pool": "kv"})
    assert part.slot_scale == 1
