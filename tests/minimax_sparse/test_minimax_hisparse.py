"""HiSparse on MiniMax-M3 sparse attention, planned as SGLang 0.5.23 builds it (issue 32).

Pins the defect: ``--enable-hisparse`` on MiniMax-M3 was planned as without it, then refused as not modelled.
``MiniMaxSparseKVPool(enable_hisparse=True, host_to_device_ratio=r)`` (``mem_cache/memory_pool.py``) keeps the
sparse layers' K/V in ``HiSparseMHAMainPool(size=S)`` (``S + P`` rows), the dense layers' in a
``dense_pool`` of ``S x r`` and the indexer pools at ``index_pool_size = S x r``; the allocator is
``HiSparseTokenToKVPoolAllocator`` (logical ``S x r``, device ``S``, int64 mapping of ``S r + P + 1``).

MiniMax-M3 (the preset): 60 layers, 57 sparse (K-only indexer of 128 bf16 values), 3 dense, 4 KV heads of 128.
At TP 4 each rank keeps one head: K + V = 2 x 128 x 2 B = 512 B per layer per token.
"""

from __future__ import annotations

import json

import attrs
import pytest

from kvpools_core import Serving, plan
from kvpools_core.building import build
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.models import parse_config, resolve_model_source
from kvpools_core.parts.hisparse import LOGICAL_TOKENS
from kvpools_core.pools.hisparse import HiSparseAllocator
from kvpools_core.registry import get_registry
from tests.oracle.locate import oracle_available

GiB = 1 << 30
M3 = Serving(tp_size=4, enable_hisparse=True, disable_radix_cache=True, page_size=1)
"""Page 1 given (SGLang's default for MiniMax-M3 on CUDA is 128: ``engine_defaults``), so the hand-computed rows
below are slots + 1."""
SPARSE_KV = 57 * 512
DENSE_KV = 3 * 512
INDEX_K = 57 * 128 * 2


def _bytes(tokens: int, requests: int, ratio: int = 2) -> int:
    """Every pool of the exact plan at page 1: rows are slots + 1 (page 0 pads)."""
    logical = ratio * tokens
    table = (requests + 1) * 4 * (1_048_576 + 4)  # int32 rows of the 1,048,576-token context + 4
    allocators = 8 * logical + 8 * tokens  # the core's token free stacks
    mapping = (logical + 1 + 1) * 8
    return (tokens + 1) * SPARSE_KV + (logical + 1) * (DENSE_KV + INDEX_K) + table + allocators + mapping


def test_minimax_m3_tp4_exact_plan() -> None:
    got = plan("minimax-m3", M3, memory=60 * GiB)
    tokens, requests = got.max_total_num_tokens, got.max_running_requests
    assert (tokens, requests) == (908_105, 2048)
    assert got.sizing.token_counts == {"full": tokens, LOGICAL_TOKENS: 2 * tokens}
    assert got.pool("kv").bytes == (tokens + 1) * SPARSE_KV
    assert got.pool("dense_kv").bytes == (2 * tokens + 1) * DENSE_KV
    assert got.pool("indexer").bytes == (2 * tokens + 1) * INDEX_K
    assert got.planned_bytes == _bytes(tokens, requests)
    assert _bytes(tokens + 1, requests) > 60 * GiB
    assert got.problems() == []


def test_sglang_accounting_keeps_its_cell() -> None:
    """ref-002's MiniMax cell: 60 x 512 + 57 x 256 = 45,312 B per token, HiSparse or not."""
    got = plan("minimax-m3", attrs.evolve(M3, accounting="sglang"), memory=60 * GiB)
    assert got.cell.sglang_bytes_per_token == 60 * 512 + INDEX_K == 45_312
    assert got.max_total_num_tokens == 60 * GiB // 45_312


@pytest.mark.parametrize("tp", [1, 2])
def test_more_than_one_kv_head_per_rank_is_refused_as_sglang_asserts(tp: int) -> None:
    with pytest.raises(UnsupportedCombinationError, match="MiniMax M3 HiSparse requires one KV head per TP rank"):
        plan("minimax-m3", attrs.evolve(M3, tp_size=tp), memory=60 * GiB)


def test_decode_node_is_refused_as_not_modelled() -> None:
    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model enable_hisparse with disagg"):
        plan("minimax-m3", Serving(tp_size=4, enable_hisparse=True, disaggregation_mode="decode"), memory=60 * GiB)


@pytest.mark.parametrize("pp", [1, 3])
def test_build_on_meta_allocates_what_the_plan_says(pp: int) -> None:
    """The sparse layers' K/V (3..59) for the device slots, the dense layers' (0..2) for the logical ones."""
    for rank in range(pp):
        got = plan("minimax-m3", attrs.evolve(M3, pp_size=pp, pp_rank=rank), memory=60 * GiB)
        pools = build(got, "meta")
        assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in got.pools}
        assert isinstance(pools.allocator, HiSparseAllocator)
    pools = build(plan("minimax-m3", M3, memory=60 * GiB), "meta")
    assert pools.kv_pool.dense is not None and (pools.kv_pool.dense.start_layer, pools.kv_pool.main.start_layer) == (
        0,
        3,
    )
    assert pools.kv_pool.get_key_buffer(1).shape[0] == 2 * 908_105 + 1  # a dense layer: logical rows
    assert pools.kv_pool.get_key_buffer(30).shape[0] == 908_105 + 1  # a sparse layer: device rows


def test_interleaved_dense_layers_are_refused_at_build() -> None:
    """The store keeps each kind in one contiguous run of layers; a pattern with a dense layer between sparse
    ones plans, and ``build`` refuses it by name."""
    config = json.loads(json.dumps(resolve_model_source("minimax-m3", get_registry())[0]))
    config["text_config"]["sparse_attention_config"]["sparse_attention_freq"][10] = 0
    spec, _ = parse_config(config, "interleaved", get_registry())
    got = plan(spec, M3, memory=60 * GiB)
    with pytest.raises(UnsupportedCombinationError, match="each one contiguous run"):
        build(got, "meta")


@pytest.mark.skipif(not oracle_available(), reason="the shared oracle is not here")
@pytest.mark.parametrize("ratio", [None, 4])
def test_sglang_accounting_matches_the_oracle(ratio: int | None) -> None:
    """The reference configurator with ``enable_hisparse``: the same tokens and requests."""
    from tests.oracle.locate import require_oracle

    require_oracle()
    from tests.mla.oracle_support import oracle_model
    from tests.oracle.adapter import oracle_params, run_oracle

    config = None if ratio is None else f'{{"host_to_device_ratio": {ratio}}}'
    serving = attrs.evolve(M3, accounting="sglang", hisparse_config=config)
    params = oracle_params(
        oracle_model(resolve_model_source("minimax-m3", get_registry())[0]), serving, memory=60 * GiB
    )
    params["server_args"].update(enable_hisparse=True, hisparse_config=config)
    out = run_oracle(params)
    got = plan("minimax-m3", serving, memory=60 * GiB)
    pool = out["memory_pool_config"]
    assert (got.max_total_num_tokens, got.max_running_requests) == (
        pool["max_total_num_tokens"],
        pool["max_running_requests"],
    )
