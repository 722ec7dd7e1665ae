"""The DSA store's third indexer storage: fp8 key rows plus one fp32 scale per token slot in a buffer of its own.

A plan says so by its ``indexer`` pool's parts (``index_k`` then ``index_k_scale``), whichever plugin sized them;
SGLang's NPU pool with the quantised lightning indexer is one such storage (``NPUMLATokenToKVPool.index_k_scale_buffer
(layers, size // P + 1, P, 1) float32``, sglang-pools.md §3.3).  Sizes: 4 layers of index_head_dim 128, so a token
costs 4 × 128 key bytes and 4 × 4 scale bytes; the store keeps ``size + page_size`` rows of each.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch

from kvpools_core import CellPart, Plan
from kvpools_core.errors import ConfigError, PoolPlanMismatchError
from kvpools_core.parts.names import INDEX_POOL
from kvpools_core.pools.dsa import (
    INDEX_ROWS_PART,
    INDEX_SCALES_PART,
    DSATokenToKVPool,
    IndexStorage,
    index_storage,
)
from kvpools_core.pools.layout import PageMajorLayout

from .test_dsa_pool import small_dsa_plan

LAYERS, DIM = 4, 128


def _scale_row_plan(kv: str = "fp8_e4m3", scale_bytes: int = 4, **serving: Any) -> Plan:
    """The small plan with the indexer pool re-sized as key rows and ``scale_bytes`` of scales per token per layer."""
    planned = small_dsa_plan(kv_cache_dtype=kv, **serving)
    (paged,) = [part for part in planned.cell.parts if part.pool == INDEX_POOL]
    stored = paged.bytes_per_token // 132  # CUDA's 128 fp8 + 4 scale bytes per stored layer
    key_bytes = DIM * (1 if kv == "fp8_e4m3" else 2)
    parts = (
        CellPart(INDEX_ROWS_PART, stored * key_bytes, INDEX_POOL),
        CellPart(INDEX_SCALES_PART, stored * 4, INDEX_POOL),
    )
    kept = [part for part in planned.cell.parts if part.pool != INDEX_POOL]
    rows = planned.max_total_num_tokens + planned.serving.page_size
    index_bytes = rows * (key_bytes + scale_bytes) * stored
    pools = tuple(attrs.evolve(p, bytes=index_bytes) if p.name == INDEX_POOL else p for p in planned.pools)
    return attrs.evolve(
        planned,
        cell=attrs.evolve(planned.cell, parts=(*kept, *parts)),
        sizing=attrs.evolve(planned.sizing, pools=pools),
    )


def test_the_plans_two_parts_name_fp8_rows_and_fp32_scale_rows() -> None:
    planned = _scale_row_plan()
    storage = index_storage(planned)
    assert storage == IndexStorage(DIM, torch.uint8, torch.float32)
    assert (storage.row_bytes, storage.scale_bytes, IndexStorage(DIM, torch.uint8).scale_bytes) == (128, 4, 0)
    with pytest.raises(ConfigError, match=r"bf16, which has no fp8 values to scale.*fp8_e4m3"):
        index_storage(_scale_row_plan("bf16"))
    scales_only = [p for p in planned.cell.parts if p.name != INDEX_ROWS_PART]
    with pytest.raises(PoolPlanMismatchError, match=r"\['index_k_scale'\].*'index_k' and 'index_k_scale'"):
        index_storage(attrs.evolve(planned, cell=attrs.evolve(planned.cell, parts=tuple(scales_only))))
    with pytest.raises(ValueError, match="index scale rows need plain key rows"):
        IndexStorage(DIM, None, torch.float32)


@pytest.mark.parametrize("layout", [None, PageMajorLayout()])
def test_a_meta_build_allocates_the_planned_key_and_scale_rows(layout: PageMajorLayout | None) -> None:
    planned = _scale_row_plan()
    store = DSATokenToKVPool.from_plan(planned, "meta", layout=layout)
    rows = planned.max_total_num_tokens + planned.serving.page_size
    assert [tuple(t.shape) for t in store.index_k_buffer] == [(rows, 1, DIM)] * LAYERS
    assert [(tuple(t.shape), t.dtype) for t in store.index_k_scale_buffer] == [((rows, 1), torch.float32)] * LAYERS
    assert store.index_nbytes() == rows * (DIM + 4) * LAYERS == planned.pool(INDEX_POOL).bytes
    if layout is not None:  # page-major: (layers, pages, page, 1) like the NPU's index_k_scale_buffer
        pages, page = rows // planned.serving.page_size, planned.serving.page_size
        assert tuple(store.index_k_scale_buffer[0]._base.shape) == (LAYERS, pages, page, 1)


def test_scale_bytes_the_plan_did_not_charge_are_refused_before_allocating() -> None:
    with pytest.raises(PoolPlanMismatchError, match=r"'indexer' pool would allocate .* torch.float32 scales"):
        DSATokenToKVPool.from_plan(_scale_row_plan(scale_bytes=0), "meta")


def test_keys_and_scales_round_trip_on_the_cpu() -> None:
    """``set_index_k`` quantises each token's 128 values with one scale (amax / 448); the raw setter stores as given."""
    store = DSATokenToKVPool.from_plan(_scale_row_plan(), "cpu", layout=PageMajorLayout())
    generator = torch.Generator().manual_seed(0)
    loc = torch.randperm(store.size, generator=generator)[:8] + store.page_size
    keys = torch.randn(8, DIM, generator=generator).to(torch.bfloat16)
    store.set_index_k(2, loc, keys)
    scale = store.get_index_k_scale(2, loc)
    assert scale.shape == (8, 1) and scale.dtype == torch.float32
    assert torch.equal(scale, keys.float().abs().amax(dim=1, keepdim=True) / 448)
    assert store.get_index_k(2, loc).dtype == torch.float8_e4m3fn
    assert torch.allclose(store.get_index_k_dequant(2, loc).float(), keys.float(), rtol=0.07, atol=1e-2)
    fp8 = (torch.arange(8 * DIM) % 200 - 100).reshape(8, DIM).to(torch.float8_e4m3fn)
    given = torch.arange(1, 9, dtype=torch.float32).reshape(8, 1)
    store.set_index_k_and_scale(3, loc, fp8, given)
    assert torch.equal(store.get_index_k(3, loc).view(torch.uint8), fp8.view(torch.uint8))
    assert torch.equal(store.get_index_k_scale_buffer(3)[loc], given)
    assert not store.get_index_k_scale_buffer(2)[loc].equal(given)  # layers keep their own scales
    with pytest.raises(ValueError, match=r"plain rows of torch.uint8 with torch.float32 scale rows beside"):
        store.get_index_k_with_scale_buffer(0)
    plain = DSATokenToKVPool.from_plan(small_dsa_plan(), "meta")
    with pytest.raises(ValueError, match="pool keeps fp8 index keys and scales in pages"):
        plain.get_index_k_buffer(0)
    with pytest.raises(ValueError, match="no separate index scale rows"):
        plain.get_index_k_scale_buffer(0)


def test_the_cache_layer_split_keeps_scale_rows_for_its_own_layers_and_one_remote_scratch() -> None:
    """4 layers over 2 CP ranks: rank 0 stores layers 0 and 1 plus one scratch, so 3 × (128 + 4) B per token."""
    planned = _scale_row_plan(
        tp_size=2, attn_cp_size=2, enable_dsa_cache_layer_split=True, disaggregation_mode="prefill"
    )
    store = DSATokenToKVPool.from_plan(planned, "cpu")
    rows = planned.max_total_num_tokens + planned.serving.page_size
    assert store.index_nbytes() == rows * (DIM + 4) * 3 == planned.pool(INDEX_POOL).bytes
    assert [t.shape[0] for t in store.index_k_scale_buffer] == [rows, rows, 0, 0]
    assert store.get_index_k_scale_buffer(3).data_ptr() == store.remote_index_k_scale_buffer.data_ptr()
    loc, fp8 = torch.tensor([5]), torch.ones(1, DIM).to(torch.float8_e4m3fn)
    store.set_index_k_and_scale(3, loc, fp8, torch.ones(1, 1))  # another rank's layer: dropped here
    assert not store.remote_index_k_scale_buffer.any()
    store.set_index_k_and_scale(1, loc, fp8, torch.full((1, 1), 2.0))
    assert store.get_index_k_scale(1, loc).item() == 2.0
