"""MLA and DSA models on Ascend NPUs: SGLang's ``NPUMLATokenToKVPool``, through the core's MLA / DSA stores.

Reference: ``sglang-pools.md`` §3.3 (``NPUMLATokenToKVPool``: ``k_buffer (L,
S//P + 1, P, 1, kv_lora_rank)``, ``v_buffer (…, qk_rope_head_dim)``,
``index_k_buffer (L, S//P + 1, P, 1, index_head_dim)`` in the KV store dtype)
and §1.9's last row (NPU indexer: ``D_i × elem_size(kv dtype)``, not CUDA's
132 B); ``000_*.txt`` ``_build_ascend_mla_kv_pool`` (~line 1558: ``kv_cache_dim``
stays ``kv_lora_rank`` off arch35, every stage layer an indexer layer).
DeepSeek-V3.2-Exp's config: R = kv_lora_rank 512, r = qk_rope_head_dim 64,
index_head_dim 128, 61 layers.  The CUDA numbers were computed before the NPU
storage existed, to show CUDA plans did not move.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kvpools_ascend import dsa as ascend_dsa
from kvpools_plugins import dsa as dsa_plugin
from kvpools_plugins.dsa import dsa_cell_size
from kvpools_plugins.speculative import with_draft

from kvpools_core import Plan, Serving, build, plan
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.pools import dsa as core_dsa
from kvpools_core.pools.dsa import INDEX_ROWS_PART, DSATokenToKVPool, IndexStorage, index_storage
from kvpools_core.pools.layout import PageMajorLayout
from kvpools_core.pools.mla import MLATokenToKVPool
from tests.dsa.support import SMALL_DSA

from ...mla.oracle_support import parse

GiB, MiB = 1 << 30, 1 << 20
R, r, D_I, L = 512, 64, 128, 61
PAGE = 128
EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_draft_num_layers": 1,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}


class NpuSplitLayout(PageMajorLayout):
    """SGLang NPU's carving: page-major, the MLA row split into its nope and rope tensors."""

    name = "npu_split"


def _ascend(model: str = "deepseek-v3.2-exp", memory: int | str = "60GiB", **serving: Any) -> Plan:
    return plan(model, Serving(platform="ascend", page_size=PAGE, **serving), memory=memory)


def _parts(planned: Plan) -> list[tuple[str, int, str, int]]:
    return [(p.name, p.bytes_per_token, p.pool, p.extra_slots) for p in planned.cell.parts]


# -- the cell: what one token costs on ascend, against CUDA --------------------------


def test_dsa_cell_parts_on_ascend_and_cuda() -> None:
    """bf16: latent R×2×L, rope r×2×L on both; index 128×2×61 = 15616 (ascend) vs 132×61 = 8052 (CUDA, §1.9).

    fp8: the NPU keeps the row unpacked (512 + 64 B per layer, ``kv_cache_dim = kv_lora_rank``) where CUDA
    packs it (512 + 16 + 128 = 656 B, §1.4); its index rows are 128 fp8 bytes per layer.
    """
    bf16, cuda = _ascend(), plan("deepseek-v3.2-exp", Serving(page_size=64), memory="60GiB")
    assert _parts(bf16) == [
        ("latent", R * 2 * L, "kv", 0),
        ("rope", r * 2 * L, "kv", 0),
        ("index_k", 15616, "indexer", 0),
    ]
    assert _parts(cuda) == [("latent", 62464, "kv", 0), ("rope", 7808, "kv", 0), ("indexer", 8052, "indexer", 1)]
    fp8 = _ascend(kv_cache_dtype="fp8_e4m3")
    assert _parts(fp8) == [("latent", R * L, "kv", 0), ("rope", r * L, "kv", 0), ("index_k", D_I * L, "indexer", 0)]
    # --accounting sglang keeps SGLang's (CUDA) cell: (R + r) × e × L + 132 × L
    assert bf16.cell.sglang_bytes_per_token == cuda.cell.sglang_bytes_per_token == (576 * 2 + 132) * L == 78324
    assert fp8.cell.sglang_bytes_per_token == (576 + 132) * L == 43188
    (note,) = [n for n in fp8.cell.notes if n.startswith("Ascend NPU")]
    assert "128 B per token per layer" in note and "CUDA stores 132 B" in note and "512 + 64 B per layer" in note
    assert not any(n.startswith(ascend_dsa.PACKED_ROW_NOTE) for n in fp8.cell.notes)  # no packed row on the NPU
    cuda_fp8 = plan("deepseek-v3.2-exp", Serving(page_size=64, kv_cache_dtype="fp8_e4m3"), memory="60GiB")
    assert any(n.startswith(ascend_dsa.PACKED_ROW_NOTE) for n in cuda_fp8.cell.notes)  # the prefix the plugin drops
    assert bf16.provenance["estimate_cell_size"] == ("dsa", "ascend")


def test_sglang_accounting_on_ascend_divides_the_budget_by_sglangs_cuda_cell() -> None:
    planned = _ascend(accounting="sglang")
    assert planned.max_total_num_tokens == 60 * GiB // 78324 // PAGE * PAGE == 822528


def test_mla_cell_on_ascend_is_the_core_row() -> None:
    """MLA (DeepSeek-V3): the NPU's nope + rope tensors hold the core row's bytes; only the carving differs."""
    for kv in ("auto", "fp8_e4m3"):
        ascend = _ascend("deepseek-v3", kv_cache_dtype=kv)
        cuda = plan("deepseek-v3", Serving(page_size=PAGE, kv_cache_dtype=kv), memory="60GiB")
        assert _parts(ascend) == _parts(cuda) and ascend.cell.sglang_bytes_per_token == cuda.cell.sglang_bytes_per_token
        assert {p.name: p.bytes for p in ascend.pools} == {p.name: p.bytes for p in cuda.pools}


# -- plans and builds on meta: the plan charges what the stores allocate -------------


def test_dsa_on_ascend_builds_sglangs_npu_shapes_with_the_planned_bytes() -> None:
    planned = _ascend()
    size = planned.max_total_num_tokens
    assert size % PAGE == 0 and size + PAGE == (size // PAGE + 1) * PAGE  # S + P rows are the NPU's whole pages
    assert planned.pool("kv").bytes == (size + PAGE) * (R + r) * 2 * L
    assert planned.pool("indexer").bytes == (size + PAGE) * D_I * 2 * L
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert pools.provenance["buffer_layout"] == ("ascend",) and pools.provenance["build_pool"] == ("dsa",)
    store = pools.kv_pool
    assert store.index == IndexStorage(D_I, torch.bfloat16) and store.index_k_with_scale_buffer == []
    assert [tuple(t.shape) for t in store.index_k_buffer] == [(size + PAGE, 1, D_I)] * L
    # the NPU's carving: k_buffer, v_buffer and index_k_buffer as (L, S//P + 1, P, 1, dim) tensors
    split = DSATokenToKVPool.from_plan(planned, "meta", layout=NpuSplitLayout())
    assert split.split and split.nbytes_by_pool() == {
        "kv": planned.pool("kv").bytes,
        "indexer": planned.pool("indexer").bytes,
    }
    pages = size // PAGE + 1
    assert tuple(split.nope_buffer[0]._base.shape) == (L, pages, PAGE, 1, R)
    assert tuple(split.rope_buffer[60]._base.shape) == (L, pages, PAGE, 1, r)
    assert tuple(split.index_k_buffer[0]._base.shape) == (L, pages, PAGE, 1, D_I)
    assert split.nope_buffer[0].dtype == split.index_k_buffer[0].dtype == torch.bfloat16


def test_fp8_dsa_on_ascend_stores_uint8_rows_unpacked() -> None:
    planned = _ascend(kv_cache_dtype="fp8_e4m3")
    size = planned.max_total_num_tokens
    assert (
        planned.pool("kv").bytes == (size + PAGE) * (R + r) * L
        and planned.pool("indexer").bytes == (size + PAGE) * D_I * L
    )
    store = DSATokenToKVPool.from_plan(planned, "meta", layout=NpuSplitLayout())
    assert not store.row.packed_fp8 and store.index == IndexStorage(D_I, torch.uint8)
    assert [tuple(t.shape) for t in (store.nope_buffer[0], store.rope_buffer[0], store.index_k_buffer[0])] == [
        (size + PAGE, 1, R),
        (size + PAGE, 1, r),
        (size + PAGE, 1, D_I),
    ]
    assert build(planned, "meta").allocated_by_pool() == {p.name: p.bytes for p in planned.pools}


@pytest.mark.parametrize("model", ["deepseek-v3", "kimi-k2-instruct"])
def test_mla_on_ascend_builds_split_with_the_planned_bytes(model: str) -> None:
    planned = _ascend(model)
    size, layers = planned.max_total_num_tokens, len(planned.model.layers)
    assert build(planned, "meta").allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    store = MLATokenToKVPool.from_plan(planned, "meta", layout=NpuSplitLayout())
    assert store.nbytes_by_pool() == {"kv": planned.pool("kv").bytes} == {"kv": (size + PAGE) * 576 * 2 * layers}
    assert tuple(store.nope_buffer[0]._base.shape) == (layers, size // PAGE + 1, PAGE, 1, R)
    assert tuple(store.rope_buffer[0]._base.shape) == (layers, size // PAGE + 1, PAGE, 1, r)


# -- DSA + a draft model: the NPU's storage in the draft pools too ------------------------


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_dsa_with_a_draft_model_on_ascend_in_either_wrapper_order(kv: str) -> None:
    """The draft worker builds its own ``NPUMLATokenToKVPool`` (one layer): ``draft_index_k`` rows, no extra slots."""
    planned = _ascend(kv_cache_dtype=kv, **EAGLE)
    e = 2 if kv == "auto" else 1
    assert _parts(planned)[3:] == [
        ("draft_latent", R * e, "draft_kv", 0),
        ("draft_rope", r * e, "draft_kv", 0),
        ("draft_index_k", D_I * e, "draft_indexer", 0),
    ]
    assert planned.provenance["estimate_cell_size"] == ("dsa", "ascend", "speculative")
    # the NPU rewrite and the draft scaling commute: the other wrapper order gives the same cell
    model, serving = planned.model, planned.serving
    cuda = dsa_cell_size(model.layers, model, serving)
    inner = with_draft(ascend_dsa.npu_dsa_cell(cuda, model, serving), serving)
    outer = ascend_dsa.npu_dsa_cell(with_draft(cuda, serving), model, serving)
    assert inner.parts == outer.parts == planned.cell.parts
    assert inner.sglang_bytes_per_token == outer.sglang_bytes_per_token == planned.cell.sglang_bytes_per_token
    size = planned.max_total_num_tokens
    assert planned.pool("draft_indexer").bytes == (size + PAGE) * D_I * e
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    draft = DSATokenToKVPool.from_plan(planned, "meta", layout=NpuSplitLayout()).draft
    assert isinstance(draft, DSATokenToKVPool) and draft.split and draft.index == IndexStorage(D_I, draft.store_dtype)
    assert tuple(draft.index_k_buffer[0]._base.shape) == (1, size // PAGE + 1, PAGE, 1, D_I)


# -- writes and reads on the CPU, through split buffers -----------------------------------


def _small_dsa(kv: str) -> Plan:
    config = dict(SMALL_DSA)
    return plan(parse(config), Serving(platform="ascend", page_size=PAGE, kv_cache_dtype=kv), memory=4 * MiB)


def _random(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)


def _raw(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


@pytest.mark.parametrize("kv", ["bf16", "fp8_e4m3"])
def test_a_round_trip_through_split_buffers_on_the_cpu(kv: str) -> None:
    planned = _small_dsa(kv)
    split = DSATokenToKVPool.from_plan(planned, "cpu", layout=NpuSplitLayout())
    whole = DSATokenToKVPool.from_plan(planned, "cpu")  # one tensor per layer, whole rows
    assert split.split and not whole.split and split.nbytes_by_pool() == whole.nbytes_by_pool()
    assert split.nbytes_by_pool() == {p.name: p.bytes for p in planned.pools if p.name in ("kv", "indexer")}
    loc = torch.randperm(split.size, generator=torch.Generator().manual_seed(0))[:8] + PAGE
    dtype = torch.bfloat16 if kv == "bf16" else torch.float8_e4m3fn
    for layer in range(4):
        nope, rope, keys = _random(8, 1, 128, seed=layer), _random(8, 1, 32, seed=-layer), _random(8, 128, seed=layer)
        for store in (split, whole):
            store.set_mla_kv_buffer(layer, loc, nope, rope)
            store.set_index_k(layer, loc, keys)
        got, expected = split.get_mla_kv(layer, loc), whole.get_mla_kv(layer, loc)
        assert all(torch.equal(_raw(a), _raw(b)) for a, b in zip(got, expected, strict=True))
        assert torch.equal(got[0], nope.to(dtype).to(torch.bfloat16))  # stored as the KV dtype, elementwise
        assert split.get_index_k(layer, loc).dtype == dtype
        assert torch.equal(_raw(split.get_index_k(layer, loc)), _raw(keys.to(dtype)))
        assert torch.equal(split.get_index_k_dequant(layer, loc), keys.to(dtype).to(torch.bfloat16))
        # the NPU's buffers: the latent and rope columns and the index rows, each in its own tensor
        stored_nope, stored_rope = split.get_nope_rope_buffers(layer)
        assert torch.equal(_raw(stored_nope[loc]), _raw(nope.to(dtype)))
        assert torch.equal(_raw(stored_rope[loc]), _raw(rope.to(dtype)))
        assert torch.equal(_raw(split.get_index_k_buffer(layer)[loc].reshape(8, 128)), _raw(keys.to(dtype)))
    for method, args in (("get_index_k_scale", (0, loc)), ("get_index_k_with_scale_buffer", (0,))):
        with pytest.raises(ValueError, match=r"plain rows .* without scales"):
            getattr(split, method)(*args)


# -- CUDA plans did not move ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("serving", "tokens", "pools"),
    [
        ({}, 801472, {"kv": 56325537792, "indexer": 6453967872}),
        ({"kv_cache_dtype": "fp8_e4m3"}, 1285376, {"kv": 51438167040, "indexer": 10350362880}),
        (
            # SGLang's speculative handlers run 48 requests when --max-running-requests is unset
            {"kv_cache_dtype": "fp8_e4m3", **EAGLE},
            1317888,
            {"kv": 52739167232, "indexer": 10612149504, "draft_kv": 864576512, "draft_indexer": 173969664},
        ),
        (
            {"enable_dsa_cache_layer_split": True, "attn_cp_size": 2, "tp_size": 2, "disaggregation_mode": "prefill"},
            1502528,
            {"kv": 55391551488, "indexer": 6346948608},
        ),
    ],
)
def test_cuda_dsa_plans_are_byte_identical_to_before(
    serving: dict[str, Any], tokens: int, pools: dict[str, int]
) -> None:
    planned = plan("deepseek-v3.2-exp", Serving(page_size=64, **serving), memory="60GiB")
    assert planned.max_total_num_tokens == tokens
    assert {name: planned.pool(name).bytes for name in pools} == pools
    assert {p.name for p in planned.cell.parts if p.pool.endswith("indexer")} <= {"indexer", "draft_indexer"}
    assert index_storage(planned) == IndexStorage(D_I)  # CUDA's fp8 pages
    assert build(planned, "meta").allocated_by_pool() == {p.name: p.bytes for p in planned.pools}


def test_cuda_mla_plans_are_byte_identical_to_before() -> None:
    planned = plan("deepseek-v3", Serving(page_size=64, kv_cache_dtype="fp8_e4m3"), memory="60GiB")
    assert planned.max_total_num_tokens == 1757056 and planned.pool("kv").bytes == 61738168320


# -- refusals and the shared names ------------------------------------------------------------


def test_what_ascend_refuses_for_mla_models() -> None:
    with pytest.raises(UnsupportedCombinationError, match="fp4_e2m1 is not supported for MLA models on ascend"):
        _ascend("deepseek-v3", kv_cache_dtype="fp4_e2m1")
    with pytest.raises(UnsupportedCombinationError, match="enable_dsa_cache_layer_split is not supported on ascend"):
        _ascend(enable_dsa_cache_layer_split=True, attn_cp_size=2, tp_size=2)


def test_the_plugin_writes_the_part_names_the_core_store_reads() -> None:
    """The ascend plugin imports neither the store (torch, at plan time) nor the DSA plugin: the names must agree."""
    assert ascend_dsa.INDEX_ROWS_PART == INDEX_ROWS_PART and ascend_dsa.PAGED_INDEX_PART == core_dsa.PAGED_INDEX_PART
    assert ascend_dsa.PAGED_INDEX_PART == dsa_plugin.INDEX_PART
    assert ascend_dsa.PACKED_ROW_NOTE == dsa_plugin.PACKED_ROW_NOTE
