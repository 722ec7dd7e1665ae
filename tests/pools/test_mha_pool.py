"""The MHA pool: shapes and dtypes per KV dtype, write/read round trips, PP layer ids, draft pool, plan checks."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import torch
from kvpools_plugins.mha import build_pool

from kvpools_core import ModelSpec, Plan, build
from kvpools_core.pools import PoolPlanMismatchError
from kvpools_core.pools.mha import MHATokenToKVPool

MODEL_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def test_shapes_hand_computed(small_plan: Callable[..., Plan], mha_model: Callable[..., ModelSpec]) -> None:
    # 4 layers, 4 KV heads, K dim 64, V dim 32, page 16, bf16: per token 4 x 4 x (64 + 32) x 2 B = 3072 B.
    plan = small_plan(model=mha_model(v_head_dim=32), page_size=16)
    assert plan.cell.bytes_per_token == 3072
    pool = MHATokenToKVPool.from_plan(plan, "cpu")
    size = plan.max_total_num_tokens
    assert size % 16 == 0 and pool.size == size and pool.page_size == 16
    assert pool.get_key_buffer(0).shape == (size + 16, 4, 64)  # the first page pads
    assert pool.get_value_buffer(3).shape == (size + 16, 4, 32)
    assert pool.dtype == pool.store_dtype == torch.bfloat16
    assert (pool.start_layer, pool.end_layer, pool.layer_num) == (0, 4, 4)
    assert pool.nbytes == (size + 16) * 3072 == plan.pool("kv").bytes
    assert pool.get_kv_size_bytes() == ((size + 16) * 4 * 4 * 64 * 2, (size + 16) * 4 * 4 * 32 * 2)
    assert pool.nbytes_by_pool() == {"kv": plan.pool("kv").bytes}


@pytest.mark.parametrize(
    ("kv", "dtype", "k_shape", "v_shape", "k_scale", "v_scale"),
    [
        ("fp8_e4m3", torch.float8_e4m3fn, (4, 64), (4, 32), None, None),
        ("fp8_e5m2", torch.float8_e5m2, (4, 64), (4, 32), None, None),
        # two e2m1 values per byte; one scale byte per 16 values, flat per row: 4 x 64 / 16 = 16, 4 x 32 / 16 = 8
        ("fp4_e2m1", torch.uint8, (4, 32), (4, 16), (16,), (8,)),
        # e4m3 data; one e8m0 byte per 32 values: (4, 64 / 32) and (4, 32 / 32)
        ("mxfp8", torch.float8_e4m3fn, (4, 64), (4, 32), (4, 2), (4, 1)),
    ],
)
def test_quantised_layouts(
    small_plan: Callable[..., Plan],
    mha_model: Callable[..., ModelSpec],
    kv: str,
    dtype: torch.dtype,
    k_shape: tuple[int, ...],
    v_shape: tuple[int, ...],
    k_scale: tuple[int, ...] | None,
    v_scale: tuple[int, ...] | None,
) -> None:
    plan = small_plan(model=mha_model(v_head_dim=32), kv_cache_dtype=kv)
    pool = MHATokenToKVPool.from_plan(plan, "meta")
    rows = plan.max_total_num_tokens + 1
    k, v = pool.get_kv_buffer(1)
    assert (k.shape, v.shape) == ((rows, *k_shape), (rows, *v_shape))
    assert k.dtype == dtype and pool.store_dtype == torch.uint8
    if k_scale is None:
        with pytest.raises(ValueError, match="without scales"):
            pool.get_key_scale_buffer(1)
    else:
        assert pool.get_key_scale_buffer(1).shape == (rows, *k_scale)
        assert pool.get_value_scale_buffer(1).shape == (rows, *(v_scale or ()))
        assert pool.get_key_scale_buffer(1).dtype == torch.uint8
    assert pool.nbytes == plan.pool("kv").bytes


def _kv(n: int, heads: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (torch.randn(n, heads, dim, generator=torch.Generator().manual_seed(seed)) * 4).to(dtype)


@pytest.mark.parametrize("kv", ["bf16", "fp16", "fp32"])
def test_native_round_trip_is_exact(
    small_plan: Callable[..., Plan], mha_model: Callable[..., ModelSpec], kv: str
) -> None:
    plan = small_plan(model=mha_model(v_head_dim=32, dtype=MODEL_DTYPES[kv]), kv_cache_dtype=kv, page_size=4)
    pool = build(plan, "cpu").kv_pool
    dtype = pool.dtype
    loc = torch.tensor([4, 9, 5, plan.max_total_num_tokens + 3])  # any slot, the last page's included
    k, v = _kv(4, 4, 64, dtype, 1), _kv(4, 4, 32, dtype, 2)
    pool.set_kv_buffer(2, loc, k, v)
    k_out, v_out = pool.get_kv(2, loc)
    assert k_out.dtype == dtype and torch.equal(k_out, k) and torch.equal(v_out, v)
    assert torch.equal(pool.get_key_buffer(2)[loc], k)
    assert pool.get_key_buffer(1).abs().sum() == 0  # other layers untouched


def test_write_casts_to_the_pool_dtype(small_plan: Callable[..., Plan]) -> None:
    pool = MHATokenToKVPool.from_plan(small_plan(kv_cache_dtype="fp16"), "cpu")
    k = _kv(2, 4, 64, torch.float32, 3)
    pool.set_kv_buffer(0, torch.tensor([1, 2]), k, k)
    assert torch.equal(pool.get_key_buffer(0)[1:3], k.to(torch.float16))


@pytest.mark.parametrize(
    ("kv", "bound"),
    [
        # |err| <= rel |x| + abs (see tests/pools/test_quant.py for the derivations); x is bf16, read in fp32
        ("fp8_e4m3", lambda x, amax16, amax32: 2**-4 * x.abs() + 2**-10),
        ("fp8_e5m2", lambda x, amax16, amax32: 2**-3 * x.abs() + 2**-17),
        ("mxfp8", lambda x, amax16, amax32: 2**-4 * x.abs() + 2**-10 * 2 * amax32 / 448),
        ("fp4_e2m1", lambda x, amax16, amax32: 1.125 * amax16 / 6 + 2**-9),
    ],
)
def test_quantised_round_trip_within_bound(
    small_plan: Callable[..., Plan], mha_model: Callable[..., ModelSpec], kv: str, bound: Callable[..., torch.Tensor]
) -> None:
    plan = small_plan(model=mha_model(v_head_dim=32), kv_cache_dtype=kv, page_size=8)
    pool = build(plan, "cpu").kv_pool
    loc = torch.tensor([8, 30, 17, 9, 63])
    k, v = _kv(5, 4, 64, torch.bfloat16, 4), _kv(5, 4, 32, torch.bfloat16, 5)
    pool.set_kv_buffer(3, loc, k, v)
    k_out, v_out = pool.get_kv(3, loc, torch.float32)
    for x, out in ((k, k_out), (v, v_out)):
        x = x.float()
        n, heads, dim = x.shape
        amax16 = x.reshape(n, heads, dim // 16, 16).abs().amax(-1, keepdim=True).expand(-1, -1, -1, 16).reshape(x.shape)
        amax32 = x.reshape(n, heads, dim // 32, 32).abs().amax(-1, keepdim=True).expand(-1, -1, -1, 32).reshape(x.shape)
        err = (out - x).abs()
        assert (err <= bound(x, amax16, amax32)).all()
        assert err.max() > 0  # it really quantised
    assert pool.get_kv(3, loc)[0].dtype == torch.bfloat16  # default read dtype: the model's


def test_fp8_input_is_stored_as_is(small_plan: Callable[..., Plan]) -> None:
    pool = MHATokenToKVPool.from_plan(small_plan(kv_cache_dtype="fp8_e4m3"), "cpu")
    k = _kv(2, 4, 64, torch.float32, 6).to(torch.float8_e4m3fn)
    pool.set_kv_buffer(0, torch.tensor([3, 4]), k, k)
    assert torch.equal(pool.get_key_buffer(0)[3:5].view(torch.uint8), k.view(torch.uint8))


def test_write_rejects_wrong_shapes(small_plan: Callable[..., Plan]) -> None:
    pool = MHATokenToKVPool.from_plan(small_plan(), "cpu")
    k = torch.zeros(2, 1, 64, dtype=torch.bfloat16)  # one head where the pool has 4: would broadcast silently
    with pytest.raises(ValueError, match=r"expected \(2, 4, 64\)"):
        pool.set_kv_buffer(0, torch.tensor([1, 2]), k, torch.zeros(2, 4, 64, dtype=torch.bfloat16))


def test_pipeline_stage_uses_global_layer_ids(
    small_plan: Callable[..., Plan], mha_model: Callable[..., ModelSpec]
) -> None:
    # 6 layers over 2 stages: rank 1 holds [3, 6)
    plan = small_plan(model=mha_model(layers=6), pp_size=2, pp_rank=1)
    pool = MHATokenToKVPool.from_plan(plan, "cpu")
    assert (pool.start_layer, pool.end_layer, pool.layer_num) == (3, 6, 3)
    k = _kv(1, 4, 64, torch.bfloat16, 7)
    pool.set_kv_buffer(3, torch.tensor([1]), k, k)
    assert torch.equal(pool.get_key_buffer(3)[1], k[0])
    assert torch.equal(pool.kv.k_buffer[0][1], k[0])  # global layer 3 is local buffer 0
    for layer in (0, 2, 6):
        with pytest.raises(IndexError, match=r"Layer \d is not in the 'kv' pool: it holds layers \[3, 6\)"):
            pool.get_key_buffer(layer)


def test_kv_heads_per_rank(small_plan: Callable[..., Plan], mha_model: Callable[..., ModelSpec]) -> None:
    model = mha_model(kv_heads=8)
    assert MHATokenToKVPool.from_plan(small_plan(model=model, tp_size=4), "meta").get_key_buffer(0).shape[1] == 2
    # TP above the KV heads replicates: one head per rank
    assert MHATokenToKVPool.from_plan(small_plan(model=model, tp_size=16), "meta").get_key_buffer(0).shape[1] == 1
    # DCP shards tokens, not heads: attention TP 4 with DCP 2 keeps 8 // (4 // 2) = 4 heads
    assert (
        MHATokenToKVPool.from_plan(small_plan(model=model, tp_size=4, dcp_size=2), "meta").get_key_buffer(0).shape[1]
        == 4
    )


def test_draft_pool(small_plan: Callable[..., Plan], mha_model: Callable[..., ModelSpec]) -> None:
    plan = small_plan(
        model=mha_model(v_head_dim=32),
        kv_cache_dtype="mxfp8",
        speculative_algorithm="EAGLE",
        speculative_draft_num_layers=2,
    )
    pool = MHATokenToKVPool.from_plan(plan, "cpu")
    draft = pool.draft
    assert draft is not None and draft.name == "draft_kv"
    assert (draft.start_layer, draft.end_layer, draft.size, draft.page_size) == (0, 2, pool.size, pool.page_size)
    assert draft.get_key_buffer(1).shape == pool.get_key_buffer(1).shape
    assert draft.get_value_scale_buffer(0).shape == pool.get_value_scale_buffer(0).shape
    assert pool.nbytes_by_pool() == {"kv": plan.pool("kv").bytes, "draft_kv": plan.pool("draft_kv").bytes}
    assert pool.nbytes == plan.pool("kv").bytes + plan.pool("draft_kv").bytes
    # draft bytes = 2 of the 4 target layers
    assert plan.pool("draft_kv").bytes * 2 == plan.pool("kv").bytes


def test_refuses_a_plan_it_would_not_match(small_plan: Callable[..., Plan]) -> None:
    plan = small_plan()
    pools = tuple(attrs.evolve(p, bytes=p.bytes + 1) if p.name == "kv" else p for p in plan.pools)
    tampered = attrs.evolve(plan, sizing=attrs.evolve(plan.sizing, pools=pools))
    with pytest.raises(PoolPlanMismatchError, match=r"'kv' pool would allocate \d+ B but the plan charges \d+ B"):
        MHATokenToKVPool.from_plan(tampered, "meta")


def test_hook_declines_other_architectures(small_plan: Callable[..., Plan]) -> None:
    plan = small_plan()
    other = attrs.evolve(plan, model=attrs.evolve(plan.model, architecture="mla"))
    assert build_pool(plan=other, device="meta") is None
    assert isinstance(build_pool(plan=plan, device="meta", layout=None), MHATokenToKVPool)
