"""kvpools-rocm's ``rocm.kv_cache_layout=vectorized_5d``: AITER's 5-d K / V, row-indexed, exact bytes.

Reference ``../shared/reference/sglang-pools.md`` §1.3 (the ROCm AITER bullet,
``SGLANG_AITER_KV_CACHE_LAYOUT=vectorized_5d``): ``X = 16 // store_dtype.itemsize``,
``num_blocks = (size + page_size) // page_size``, K ``(num_blocks, H, D // X,
page_size, X)``, V ``(num_blocks, H, page_size // X, Dv, X)``, asserts
``page_size % X == 0``, ``D % X == 0``, ``Dv % X == 0``.  The element mapping
these tests check follows from those shapes: token slot ``loc`` is block ``b =
loc // P``, offset ``o = loc % P``; ``K[loc, h, d]`` is ``k5[b, h, d // X, o, d %
X]`` (the ``X`` dims of one token are one vector, a page's tokens next to each
other) and ``V[loc, h, e]`` is ``v5[b, h, o // X, e, o % X]`` (``X`` tokens of one
value dim are one vector).
"""

from __future__ import annotations

import pytest
import torch
from kvpools_rocm.layout_hooks import validate_kv_cache_layout
from kvpools_rocm.layouts import AITER_VECTORIZED_LAYOUT
from torch import Tensor

from kvpools_core import Serving, build, get_registry, plan
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import InvalidValueError, UnsupportedCombinationError
from kvpools_core.models import registry_presets
from kvpools_core.options import cli_surface
from kvpools_core.parts.attention import LayerGeometry
from kvpools_core.pools import MHATokenToKVPool, RowIndexedBuffer
from kvpools_core.pools.layout import BufferRequest
from kvpools_core.pools.quant import codec_for
from kvpools_core.values import LayerSpec, ModelSpec

from ..pools.conftest import build_mha_model

pytestmark = pytest.mark.usefixtures("rocm_platform")

OPTION = {"rocm.kv_cache_layout": "vectorized_5d"}
PAGE = 16
LLAMA_LAYERS, LLAMA_KV_HEADS, LLAMA_HEAD_DIM = 32, 8, 128  # llama-3.1-8b: num_key_value_heads 8, head_dim 128


def _rocm(page: int = PAGE, kv: str = "auto", **options: str) -> Serving:
    return Serving(platform="rocm", page_size=page, kv_cache_dtype=kv, plugin_options={**OPTION, **options})


@pytest.mark.parametrize(
    ("kv", "k_tail", "v_tail"),
    [
        # bf16: X = 16 // 2 = 8 -> K (blocks, 8, 128 // 8, 16, 8), V (blocks, 8, 16 // 8, 128, 8)
        ("auto", (8, 16, 16, 8), (8, 2, 128, 8)),
        # fp8 (stored as uint8): X = 16 // 1 = 16 -> K (blocks, 8, 128 // 16, 16, 16), V (blocks, 8, 1, 128, 16)
        ("fp8_e4m3", (8, 8, 16, 16), (8, 1, 128, 16)),
    ],
)
def test_llama_builds_the_5d_buffers_with_the_planned_bytes(
    kv: str, k_tail: tuple[int, ...], v_tail: tuple[int, ...]
) -> None:
    result = plan("llama-3.1-8b", _rocm(kv=kv), memory="8GiB")
    pools = build(result, "meta")
    assert pools.allocated_bytes == result.planned_bytes
    assert pools.allocated_by_pool()["kv"] == result.pool("kv").bytes
    assert pools.provenance["buffer_layout"] == ("rocm",) and pools.layout is AITER_VECTORIZED_LAYOUT
    kv_store = pools.kv_pool.kv
    rows = result.max_total_num_tokens + PAGE
    blocks = rows // PAGE  # SGLang's num_blocks = (size + page_size) // page_size
    assert rows % PAGE == 0 and len(kv_store.k_buffer) == len(kv_store.v_buffer) == LLAMA_LAYERS
    for k, v in zip(kv_store.k_buffer, kv_store.v_buffer, strict=True):
        assert isinstance(k, RowIndexedBuffer) and isinstance(v, RowIndexedBuffer)
        assert k.shape == v.shape == (rows, LLAMA_KV_HEADS, LLAMA_HEAD_DIM)  # the canonical rows the store addresses
        assert tuple(k.native.shape) == (blocks, *k_tail) and tuple(v.native.shape) == (blocks, *v_tail)
        assert k.nbytes == v.nbytes == rows * LLAMA_KV_HEADS * LLAMA_HEAD_DIM * k.native.element_size()
    key = pools.kv_pool.get_key_buffer(0)  # what AITER reads: the 5-d tensor, fp8 as fp8
    assert tuple(key.shape) == (blocks, *k_tail)
    assert key.dtype == (torch.float8_e4m3fn if kv == "fp8_e4m3" else torch.bfloat16)


def test_the_swa_composite_builds_its_mha_sub_pools_5d() -> None:
    """gpt-oss-20b: full and sliding stores, 8 KV heads of dim 64 each; bf16 X = 8.

    K ``(blocks, 8, 64 // 8, 16, 8)``, V ``(blocks, 8, 16 // 8, 64, 8)`` (§1.3), blocks = each store's rows // 16.
    """
    result = plan("gpt-oss-20b", _rocm(), memory="8GiB")
    pools = build(result, "meta")
    assert pools.allocated_bytes == result.planned_bytes
    assert pools.provenance["buffer_layout"] == ("rocm",)
    for store in (pools.kv_pool.full_kv_pool, pools.kv_pool.swa_kv_pool):
        blocks = store.rows // PAGE
        assert store.rows % PAGE == 0 and store.k_buffer
        assert {tuple(k.native.shape) for k in store.k_buffer} == {(blocks, 8, 8, 16, 8)}
        assert {tuple(v.native.shape) for v in store.v_buffer} == {(blocks, 8, 2, 64, 8)}


@pytest.mark.parametrize("preset", sorted(registry_presets(get_registry())))
def test_every_preset_builds_under_the_5d_layout_with_the_planned_bytes(preset: str) -> None:
    """Page 256 (a multiple of every X and of DeepSeek-V4's 128): MHA K / V 5-d, MLA / DSA / state as without it."""
    result = plan(preset, _rocm(page=256), memory="60GiB")
    pools = build(result, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    assert pools.provenance["buffer_layout"] == ("rocm",)


def test_an_mla_model_keeps_its_latent_rows_per_layer() -> None:
    """The layout answers 5-d only for the MHA store's K / V; an MLA latent request is carved per layer, canonical."""
    result = plan("deepseek-v2-lite", _rocm(), memory="8GiB")
    pools = build(result, "meta")
    assert pools.allocated_bytes == result.planned_bytes and pools.provenance["buffer_layout"] == ("rocm",)
    assert all(isinstance(t, Tensor) and t.dim() == 3 for t in pools.kv_pool.kv_buffer)


def _vectorized_pool(kv: str, geometry: LayerGeometry, *, size: int = 4 * PAGE, layers: int = 2) -> MHATokenToKVPool:
    codec = codec_for(resolve_kv_dtype(kv, "bfloat16"))
    return MHATokenToKVPool(
        size=size,
        page_size=PAGE,
        layers=[geometry] * layers,
        start_layer=3,
        codec=codec,
        device="cpu",
        model_dtype=torch.bfloat16,
        layout=AITER_VECTORIZED_LAYOUT,
    )


def _expected_5d(k5: Tensor, v5: Tensor, loc: Tensor, x: int) -> tuple[Tensor, Tensor]:
    """K / V rows at ``loc`` read from the 5-d tensors element by element, by the mapping in the module docstring."""
    heads, dim, v_dim = k5.shape[1], k5.shape[2] * x, v5.shape[3]
    b, o = (loc // PAGE)[:, None, None], (loc % PAGE)[:, None, None]
    h = torch.arange(heads)[None, :, None]
    d, e = torch.arange(dim)[None, None, :], torch.arange(v_dim)[None, None, :]
    return k5[b, h, d // x, o, d % x], v5[b, h, o // x, e, o % x]


@pytest.mark.parametrize(("kv", "x"), [("bf16", 8), ("fp8_e4m3", 16)])
def test_writes_land_at_the_mapped_5d_elements_and_read_back(kv: str, x: int) -> None:
    geometry = LayerGeometry(heads=2, head_dim=32, v_head_dim=16)  # D != Dv, both multiples of 16
    pool = _vectorized_pool(kv, geometry)
    gen = torch.Generator().manual_seed(7)
    loc = torch.randperm(pool.size, generator=gen)[:20] + PAGE  # distinct slots past the padding page
    # small integers: exact in bf16 and fp8, so the stored bytes are the written values
    k = torch.randint(-8, 9, (20, 2, 32), generator=gen).to(torch.bfloat16)
    v = torch.randint(-8, 9, (20, 2, 16), generator=gen).to(torch.bfloat16)
    pool.set_kv_buffer(4, loc, k, v)
    k5, v5 = pool.get_key_buffer(4), pool.get_value_buffer(4)
    assert tuple(k5.shape) == (5, 2, 32 // x, PAGE, x) and tuple(v5.shape) == (5, 2, PAGE // x, 16, x)
    k_at, v_at = _expected_5d(k5.to(torch.bfloat16), v5.to(torch.bfloat16), loc, x)
    assert torch.equal(k_at, k) and torch.equal(v_at, v)
    assert int(k5.to(torch.float32).count_nonzero()) == int(k.count_nonzero())  # nothing else was written
    assert int(v5.to(torch.float32).count_nonzero()) == int(v.count_nonzero())
    k_read, v_read = pool.get_kv(4, loc)
    assert torch.equal(k_read, k) and torch.equal(v_read, v)
    assert not pool.get_key_buffer(3).to(torch.float32).any()  # the other layer has its own storage


def test_a_plan_built_on_cpu_reads_back_what_the_per_layer_layout_does() -> None:
    model = build_mha_model(head_dim=64, v_head_dim=32)
    result = plan(model, _rocm(), memory=4 << 20)
    nhd = plan(model, _rocm(**{"rocm.kv_cache_layout": "nhd"}), memory=4 << 20)
    assert result.pools == nhd.pools  # the same bytes, so the same plan
    vectorized, per_layer = build(result, "cpu"), build(nhd, "cpu")
    assert "buffer_layout" not in per_layer.provenance and isinstance(per_layer.kv_pool.kv.k_buffer[0], Tensor)
    loc = torch.arange(PAGE, result.max_total_num_tokens + PAGE)  # every slot
    gen = torch.Generator().manual_seed(1)
    for layer in range(4):
        k, v = torch.randn(len(loc), 4, 64, generator=gen), torch.randn(len(loc), 4, 32, generator=gen)
        for pools in (vectorized, per_layer):
            pools.kv_pool.set_kv_buffer(layer, loc, k, v)
        reads = [pools.kv_pool.get_kv(layer, loc) for pools in (vectorized, per_layer)]
        assert all(torch.equal(a, b) for a, b in zip(*reads, strict=True))
    assert vectorized.allocated_bytes == per_layer.allocated_bytes == result.planned_bytes


def test_fp8_rows_read_as_fp8_through_the_row_indexed_view() -> None:
    """The fp8 codec views uint8 storage as fp8: the row-indexed buffer does too, rows located alike."""
    pool = _vectorized_pool("fp8_e4m3", LayerGeometry(heads=1, head_dim=16, v_head_dim=16), layers=1)
    loc = torch.tensor([PAGE + 3, 2 * PAGE + 15])
    k = torch.tensor([[list(range(16))], [list(range(-16, 0))]], dtype=torch.bfloat16)
    pool.set_kv_buffer(3, loc, k, k)
    as_fp8 = pool.kv.k_buffer[0].view(torch.float8_e4m3fn)
    assert isinstance(as_fp8, RowIndexedBuffer) and as_fp8.dtype == torch.float8_e4m3fn
    assert torch.equal(as_fp8[loc].to(torch.bfloat16), k)


@pytest.mark.parametrize(
    ("serving", "problem"),
    [
        (_rocm(page=8, kv="fp8_e4m3"), r"page-size 8 is not a multiple of X = 16 // itemsize = 16 \(fp8_e4m3\)"),
        (_rocm(page=4), r"page-size 4 is not a multiple of X = 16 // itemsize = 8 \(bf16\)"),
        (_rocm(**{"rocm.kv_cache_layout": "hnd"}), r"rocm.kv_cache_layout=hnd: unknown KV cache layout"),
        (_rocm(kv="fp4_e2m1"), r"kv-cache-dtype fp4_e2m1: SGLang's block-scaled MHA pools"),
        (_rocm(kv="mxfp8"), r"kv-cache-dtype mxfp8: SGLang's block-scaled MHA pools"),
    ],
)
def test_what_sglang_asserts_is_refused_when_planning(serving: Serving, problem: str) -> None:
    with cli_surface(), pytest.raises(UnsupportedCombinationError, match=problem):  # options named as CLI flags
        plan("llama-3.1-8b", serving, memory="8GiB")


def test_head_dims_that_are_not_whole_vectors_are_refused() -> None:
    """SGLang asserts ``D % X == 0`` and ``Dv % X == 0``: a head dim of 20 is not whole bf16 vectors of 8."""
    layers = [LayerSpec(index=0, kind="attention", num_kv_heads=2, head_dim=20, v_head_dim=16)]
    model = ModelSpec(name="odd", architecture="mha", layers=layers, context_len=64, dtype="bfloat16")
    [problem] = validate_kv_cache_layout(model, _rocm()) or []
    assert "(head_dim, v_head_dim) [(20, 16)], not multiples of X = 16 // itemsize = 8 (bf16)" in problem
    assert "rocm.kv_cache_layout=nhd" in problem
    assert validate_kv_cache_layout(model, _rocm(**{"rocm.kv_cache_layout": "nhd"})) is None


def test_the_layout_refuses_a_hand_made_request_sglang_would_assert_on() -> None:
    request = BufferRequest(
        pool="kv",
        role="k",
        rows=48,
        page_size=8,
        layers=(0,),
        row_shape=(2, 32),
        dtype=torch.uint8,
        device="cpu",
        row_indexed_ok=True,
    )
    with pytest.raises(InvalidValueError, match=r"page_size \(8\) and the head dim \(32\) .* multiples of X .* = 16"):
        AITER_VECTORIZED_LAYOUT.allocate(request)


@pytest.mark.parametrize(
    "serving",
    [
        Serving(page_size=PAGE, plugin_options=OPTION),  # a CUDA plan: the option is ROCm's, the layout too
        Serving(platform="rocm", page_size=PAGE),  # no option: SGLang's default NHD
        Serving(platform="rocm", page_size=PAGE, plugin_options={"rocm.kv_cache_layout": "nhd"}),
    ],
)
def test_other_plans_keep_per_layer_tensors(serving: Serving) -> None:
    result = plan("llama-3.1-8b", serving, memory="8GiB")
    pools = build(result, "meta")
    assert "buffer_layout" not in pools.provenance and pools.allocated_bytes == result.planned_bytes
    assert all(type(k) is Tensor and tuple(k.shape)[1:] == (8, 128) for k in pools.kv_pool.kv.k_buffer)


def test_an_unknown_value_is_refused_only_on_rocm() -> None:
    with pytest.raises(UnsupportedCombinationError, match="unknown KV cache layout"):
        plan("llama-3.1-8b", _rocm(**{"rocm.kv_cache_layout": "5d"}), memory="8GiB")
    assert plan("llama-3.1-8b", Serving(plugin_options={"rocm.kv_cache_layout": "5d"}), memory="8GiB")
