"""The MiniMax-sparse plugin: claims, hand-computed cells (main K/V + indexer), presets, and its pool."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvpools_core import InsufficientMemoryError, Plan, Registry, Serving, UnsupportedCombinationError, build, plan
from kvpools_core.errors import ConfigError
from kvpools_core.models import parse_config

from ..mla.oracle_support import minimax_sparse_configs, parse

M3_LAYERS, M3_SPARSE = 60, 57  # layers 0-2 dense, 3-59 sparse with a key-only indexer
M3_INDEX_K = M3_SPARSE * 128 * 2  # one bf16 index key of 128 values per sparse layer = 14592


def small_config(**sparse: Any) -> dict[str, Any]:
    """4 layers: 0 dense, 1 and 3 sparse with index values, 2 sparse with keys only."""
    return {
        "architectures": ["MiniMaxM3SparseForCausalLM"],
        "model_type": "minimax_m3",
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "max_position_embeddings": 256,
        "torch_dtype": "bfloat16",
        "num_nextn_predict_layers": 1,
        "sparse_attention_config": {
            "sparse_attention_freq": [0, 1, 1, 1],
            "sparse_disable_index_value": [0, 0, 1, 0],
            "sparse_index_dim": 32,
            **sparse,
        },
    }


# ---------------------------------------------------------------------------
# claims
# ---------------------------------------------------------------------------


def test_the_sparse_config_decides_layer_kinds(registry: Registry) -> None:
    spec, plugin = parse_config(small_config(), "test", registry)
    assert plugin == "minimax_sparse"
    assert [layer.kind for layer in spec.layers] == ["attention"] + ["sparse_attention"] * 3
    assert [layer.params.get("index_value") for layer in spec.layers] == [None, True, False, True]


def test_the_preset_is_the_vl_wrapper(registry: Registry) -> None:
    result = plan("minimax-m3", Serving(), memory="8GiB", registry=registry)
    assert result.provenance["parse_model_config"] == ("minimax_sparse",)
    assert result.model.layer_kinds() == {"attention": 3, "sparse_attention": 57}
    assert result.model.is_multimodal and result.model.num_nextn_predict_layers == 1


def test_mha_and_the_sparse_plugin_never_both_claim(registry: Registry) -> None:
    """MiniMax-M2 (dense GQA) stays MHA's; a MiniMax-M3 sparse architecture is never MHA's."""
    assert plan("minimax-m2.5", Serving(), memory="8GiB", registry=registry).provenance["parse_model_config"] == (
        "mha",
    )
    assert parse_config({**small_config(), "model_type": "minimax_m2"}, "test", registry)[1] == "minimax_sparse"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sparse_attention_config": None}, "'sparse_attention_config' is missing"),
        ({"sparse_attention_config": {"sparse_attention_freq": [0, 1], "sparse_index_dim": 32}}, "has 2 entries"),
        ({"sparse_attention_config": {"sparse_attention_freq": [0, 1, 1, 1]}}, "sparse_index_dim"),
    ],
)
def test_broken_sparse_configs_name_the_field(change: dict[str, Any], message: str) -> None:
    config = {**small_config(), **change}
    with pytest.raises(ConfigError, match=message):
        parse({k: v for k, v in config.items() if v is not None})


# ---------------------------------------------------------------------------
# hand-computed cells
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("serving", "stored", "sglang"),
    [
        # 60 layers × K+V × 4 heads × 128 × 2 B = 122880, + 57 × 128 × 2 B of index keys
        (Serving(), 122880 + M3_INDEX_K, 122880 + M3_INDEX_K),
        (Serving(tp_size=4), 30720 + M3_INDEX_K, 30720 + M3_INDEX_K),  # 1 KV head per rank
        (Serving(tp_size=8), 30720 + M3_INDEX_K, 30720 + M3_INDEX_K),  # heads replicate beyond 4
        # fp8 main pool; the indexer stays in the model dtype
        (Serving(kv_cache_dtype="fp8_e4m3"), 61440 + M3_INDEX_K, 61440 + M3_INDEX_K),
        # fp4: 64 packed + 8 scale bytes per head per K or V = 60 × 2 × 4 × 72 = 34560; SGLang charges 1 B a value
        (Serving(kv_cache_dtype="fp4_e2m1"), 34560 + M3_INDEX_K, 61440 + M3_INDEX_K),
        # DCP 2 shards tokens: each rank stores 4 // (4 / 2) = 2 heads; SGLang's estimate counts 1
        (Serving(tp_size=4, dcp_size=2), 61440 + M3_INDEX_K, 30720 + M3_INDEX_K),
    ],
)
def test_minimax_m3_cell_size(serving: Serving, stored: int, sglang: int) -> None:
    cell = plan("minimax-m3", serving, memory="8GiB").cell
    assert (cell.bytes_per_token, cell.sglang_bytes_per_token) == (stored, sglang)
    assert cell.num_layers == M3_LAYERS


def test_index_values_count_twice() -> None:
    """Layers 1 and 3 keep index K and V, layer 2 K only: (2 × 2 + 1) × 32 × 2 B = 320.

    Main pool: 4 layers × (K + V) × 2 heads × 64 × 2 B = 2048.
    """
    cell = plan(parse(small_config()), Serving(), memory="8GiB").cell
    assert {p.name: p.bytes_per_token for p in cell.parts} == {"k": 1024, "v": 1024, "index_k": 192, "index_v": 128}
    assert cell.sglang_bytes_per_token == 2048 + 320


def test_pipeline_stage_counts_its_own_sparse_layers() -> None:
    """PP 2 of MiniMax-M3: stage 0 holds layers 0-29 (3 dense, 27 sparse)."""
    cell = plan("minimax-m3", Serving(pp_size=2), memory="8GiB").cell
    assert cell.bytes_per_token == 30 * 2 * 4 * 128 * 2 + 27 * 128 * 2


def test_nextn_draft_is_shaped_like_the_last_layer() -> None:
    """int(45312 × (1 + 1/60)) = 46067; the draft: K+V of one head (512 B) and one index key (256 B)."""
    result = plan("minimax-m3", Serving(tp_size=4, speculative_algorithm="NEXTN"), memory="8GiB")
    assert result.cell.sglang_bytes_per_token == int(45312 * (1 + 1 / 60)) == 46067
    assert (result.pool("draft_kv").bytes_per_slot, result.pool("draft_indexer").bytes_per_slot) == (512, 256)


def test_block_scaled_dtypes_need_whole_blocks() -> None:
    with pytest.raises(UnsupportedCombinationError, match="one scale per 32 values"):
        plan(parse({**small_config(), "head_dim": 48}), Serving(kv_cache_dtype="mxfp8"), memory="8GiB")


# ---------------------------------------------------------------------------
# the pool
# ---------------------------------------------------------------------------


@st.composite
def sparse_plans(draw: st.DrawFn) -> Plan:
    config = draw(minimax_sparse_configs())
    spec = parse(config)
    pp = draw(st.integers(1, min(3, spec.num_layers)))
    tp = draw(st.sampled_from((1, 2, 8)))
    options: dict[str, Any] = dict(
        kv_cache_dtype=draw(st.sampled_from(("auto", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "mxfp8", "fp32"))),
        page_size=draw(st.sampled_from((1, 16, 64))),
        tp_size=tp,
        dcp_size=draw(st.sampled_from([d for d in (1, 2) if tp % d == 0])),
        pp_size=pp,
        pp_rank=draw(st.integers(0, pp - 1)),
        accounting=draw(st.sampled_from(("exact", "exact", "sglang"))),
    )
    if draw(st.booleans()):
        options.update(speculative_algorithm="EAGLE", speculative_draft_num_layers=draw(st.integers(1, 2)))
    budget = draw(st.integers(22, 36).flatmap(lambda e: st.integers(1 << e, 1 << (e + 1))))
    try:
        return plan(spec, Serving(**options), memory=budget)
    except (InsufficientMemoryError, UnsupportedCombinationError):
        assume(False)
        raise


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sparse_plans())
def test_meta_build_matches_the_plan_pool_by_pool(planned: Plan) -> None:
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    if planned.serving.accounting == "exact":
        assert planned.planned_bytes <= planned.budget.budget_bytes
    assert pools.provenance["build_pool"] == ("minimax_sparse",)
    assert Plan.from_json(planned.to_json()) == planned


@pytest.mark.parametrize("kv", ("auto", "fp8_e4m3", "fp4_e2m1", "mxfp8"))
def test_cpu_build_and_round_trip(kv: str) -> None:
    planned = plan(
        parse(small_config()), Serving(kv_cache_dtype=kv, speculative_algorithm="NEXTN", page_size=16), memory=1 << 20
    )
    pools = build(planned, "cpu")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert set(pools.allocated_by_pool()) == {"kv", "indexer", "draft_kv", "draft_indexer", "req_to_token", "allocator"}
    pool = pools.kv_pool
    assert pool.sparse_layer_ids == [1, 2, 3]
    loc = torch.tensor([16, 17])
    index_k = torch.randn(2, 1, 32, dtype=torch.bfloat16)
    pool.set_index_kv(2, loc, index_k)  # key-only layer
    assert torch.equal(pool.get_index_k_buffer(2)[loc], index_k)
    with pytest.raises(IndexError, match="no indexer values"):
        pool.get_index_v_buffer(2)
    with pytest.raises(ValueError, match="caches index values too"):
        pool.set_index_kv(3, loc, index_k)
    pool.set_index_kv(3, loc, index_k, -index_k)
    assert torch.equal(pool.get_index_v_buffer(3)[loc], -index_k)
    k = torch.randn(2, 2, 64, dtype=torch.bfloat16)
    pool.set_kv_buffer(0, loc, k, -k)
    got_k, got_v = pool.get_kv(0, loc, torch.bfloat16)
    if kv == "auto":
        assert torch.equal(got_k, k) and torch.equal(got_v, -k)
    else:
        assert torch.allclose(got_k.float(), k.float(), atol=2.0) and torch.allclose(
            got_v.float(), -k.float(), atol=2.0
        )


def test_a_dense_only_stage_has_no_indexer_pool() -> None:
    config = small_config(sparse_attention_freq=[0, 0, 1, 1])
    planned = plan(parse(config), Serving(pp_size=2, pp_rank=0), memory=1 << 20)
    assert "indexer" not in {p.name for p in planned.pools}
    pools = build(planned, "cpu")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert attrs.evolve(planned.serving, pp_rank=1).pp_rank == 1
