"""Pools with their own row layout (``CellPart.extra_slots``), explicit draft layers (``draft_layer_parts``).

Both exist for architectures whose storage is not "``tokens + page_size``
rows of the average layer": SGLang's DSA indexer allocates
``(tokens + page + 1) // page`` pages, and a draft layer may differ from the
target's average layer (layer-split storage, mixed layer kinds).
"""

from __future__ import annotations

import json

import pytest
from kvpools_plugins.speculative import with_draft

from kvpools_core import CellPart, CellSize, Serving
from kvpools_core.parts.sizing import pool_rows, token_pools
from kvpools_core.values import to_dict


@pytest.mark.parametrize(
    ("tokens", "page", "extra", "rows"),
    [
        (1000, 1, 0, 1001),  # tokens + the padding page
        (1024, 64, 0, 1088),
        (1000, 1, 1, 1002),  # DSA indexer at page 1: (1000 + 1 + 1) // 1 pages
        (1024, 64, 1, 1088),  # at page 64: (1024 + 64 + 1) // 64 = 17 pages
        (1000, 64, 1, 1024),  # an unaligned count rounds down to whole pages: (1000 + 65) // 64 = 16
    ],
)
def test_pool_rows(tokens: int, page: int, extra: int, rows: int) -> None:
    assert pool_rows(tokens, page, extra) == rows


def test_token_pools_use_each_pools_layout() -> None:
    cell = CellSize(
        parts=[CellPart("latent", 576), CellPart("indexer", 132, "indexer", extra_slots=1)],
        sglang_bytes_per_token=708,
        num_layers=1,
    )
    assert cell.pool_extra_slots() == {"kv": 0, "indexer": 1}
    kv, indexer = token_pools(cell, 1000, 1, owner="test")
    assert (kv.padding_slots, kv.bytes) == (1, 1001 * 576)
    assert (indexer.padding_slots, indexer.bytes) == (2, 1002 * 132)


def test_a_pool_takes_the_largest_extra_slots_of_its_parts() -> None:
    cell = CellSize(
        parts=[CellPart("a", 4, "p"), CellPart("b", 4, "p", extra_slots=3)], sglang_bytes_per_token=8, num_layers=1
    )
    assert cell.pool_extra_slots() == {"p": 3}


def test_json_round_trip_keeps_layouts_and_draft_layers() -> None:
    cell = CellSize(
        parts=[CellPart("indexer", 264, "indexer", extra_slots=1)],
        sglang_bytes_per_token=264,
        num_layers=2,
        draft_layer_parts=[CellPart("indexer", 132, "indexer", extra_slots=1)],
    )
    assert CellSize.from_dict(json.loads(json.dumps(to_dict(cell)))) == cell


def test_draft_average_layer_keeps_the_part_layout() -> None:
    """Without explicit draft layers: ceil(part × D / L), in ``draft_<pool>`` pools with the same extra slots."""
    cell = CellSize(
        parts=[CellPart("latent", 656 * 61), CellPart("indexer", 132 * 61, "indexer", extra_slots=1)],
        sglang_bytes_per_token=708 * 61,
        num_layers=61,
    )
    drafted = with_draft(cell, Serving(speculative_algorithm="EAGLE", speculative_draft_num_layers=1))
    assert drafted.parts[2:] == (
        CellPart("draft_latent", 656, "draft_kv"),
        CellPart("draft_indexer", 132, "draft_indexer", extra_slots=1),
    )
    assert drafted.sglang_bytes_per_token == int(708 * 61 * (1 + 1 / 61))


def test_explicit_draft_layers_are_charged_per_draft_layer() -> None:
    """A 17-layer split storage of a 61-layer stage: the draft still stores whole layers (2 × 788 B)."""
    one = (CellPart("latent", 656), CellPart("indexer", 132, "indexer", extra_slots=1))
    cell = CellSize(
        parts=[CellPart("latent", 656 * 17), CellPart("indexer", 132 * 17, "indexer", extra_slots=1)],
        sglang_bytes_per_token=708 * 17,
        num_layers=61,
        draft_layer_parts=one,
    )
    drafted = with_draft(cell, Serving(speculative_algorithm="EAGLE", speculative_draft_num_layers=2))
    assert drafted.parts[2:] == (
        CellPart("draft_latent", 2 * 656, "draft_kv"),
        CellPart("draft_indexer", 2 * 132, "draft_indexer", extra_slots=1),
    )
    assert drafted.sglang_bytes_per_token == int(708 * 17 * (1 + 2 / 61))  # SGLang scales by the stage's layers
