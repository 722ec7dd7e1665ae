"""Arch35 Ascend NPUs (``--plugin-option ascend.soc=arch35``) and the quantised lightning indexer.

References.  ``000_*.txt`` ``_build_ascend_mla_kv_pool`` (~lines 1558-1606): on arch35 the builder passes
``kv_cache_dim = calculate_mla_kv_cache_dim`` (656 for fp8 DSA, lines 2611-2666: 512 + 512 // 128 × 4 + 64 × 2)
and the compact ``indexer_layer_ids`` (layers where ``dsa_layer_skips_topk`` is false), but never
``enable_npu_quant_lightning_indexer``.  sgl-project/sglang ``hardware_backend/npu/memory_pool_npu.py`` @ 003fca80,
``NPUMLATokenToKVPool.__init__``: the latent is packed (``k_buffer (…, P, 1, 656)`` fp8, ``v_buffer`` of width 0)
only with that flag, which also adds ``index_k_scale_buffer (indexer layers, S // P + 1, P, 1)`` float32 and stores
``index_k_buffer (…, P, 1, index_head_dim)`` in fp8; without it an arch35 pool is the a2 pool (sglang-pools.md §3.3).
``dsa_layer_skips_topk`` is false for every layer of a config without ``index_topk_freq`` / ``index_topk_pattern`` /
``indexer_types`` (DeepSeek-V3.2-Exp's), so the compact subset is all 61 layers.
DeepSeek-V3.2-Exp: R = 512, r = 64, index_head_dim 128, L = 61; plans at 60 GiB, page size 128.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest
import torch
from kvpools_ascend import dsa as ascend_dsa

from kvpools_core import Plan, Serving, build, plan
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.pools import dsa as core_dsa
from kvpools_core.pools.dsa import DSATokenToKVPool, IndexStorage, index_storage
from tests.dsa.support import SMALL_DSA

from ...mla.oracle_support import parse

R, r, D_I, L, PAGE = 512, 64, 128, 61, 128
ARCH35 = {"ascend.soc": "arch35"}
QUANT = {**ARCH35, "ascend.npu_quant_lightning_indexer": "true"}


def _ascend(options: dict[str, Any], model: str = "deepseek-v3.2-exp", **serving: Any) -> Plan:
    return plan(model, Serving(platform="ascend", page_size=PAGE, plugin_options=options, **serving), memory="60GiB")


def _parts(planned: Plan) -> list[tuple[str, int, str, int]]:
    return [(p.name, p.bytes_per_token, p.pool, p.extra_slots) for p in planned.cell.parts]


def _pools(planned: Plan) -> dict[str, int]:
    return {p.name: p.bytes for p in planned.pools}


# -- arch35 without the quantised indexer: the a2 bytes --------------------------------------


@pytest.mark.parametrize(
    ("kv", "parts", "tokens", "kv_bytes", "index_bytes"),
    [
        # bf16: (R + r) × 2 × L = 70272 B of latent row, 128 × 2 × 61 = 15616 B of index keys per token
        ("auto", [("latent", R * 2 * L), ("rope", r * 2 * L), ("index_k", 15616)], 732416, 51477331968, 11439407104),
        # fp8 without the flag: kv_cache_dim is ignored, the row stays 512 + 64 B, index keys 128 B per layer
        ("fp8_e4m3", [("latent", R * L), ("rope", r * L), ("index_k", D_I * L)], 1437440, 50510389248, 11224530944),
    ],
)
def test_arch35_without_the_quantised_indexer_plans_and_builds_the_a2_pool(
    kv: str, parts: list[tuple[str, int]], tokens: int, kv_bytes: int, index_bytes: int
) -> None:
    planned, a2 = _ascend(ARCH35, kv_cache_dtype=kv), _ascend({}, kv_cache_dtype=kv)
    assert [(name, size) for name, size, _pool, _extra in _parts(planned)] == parts
    assert planned.max_total_num_tokens == a2.max_total_num_tokens == tokens
    rows = tokens + PAGE  # (S // P + 1) × P
    element = 2 if kv == "auto" else 1
    assert kv_bytes == rows * (R + r) * element * L and index_bytes == rows * D_I * element * L
    assert _pools(planned) == _pools(a2) and (planned.pool("kv").bytes, planned.pool("indexer").bytes) == (
        kv_bytes,
        index_bytes,
    )
    (note,) = [n for n in planned.cell.notes if n.startswith("Ascend NPU (arch35")]
    assert "compact indexer layers are all of them" in note and "CUDA stores 132 B" in note
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == _pools(planned)
    store = pools.kv_pool
    assert isinstance(store, DSATokenToKVPool) and store.index_k_scale_buffer == [] and not store.row.packed_fp8
    pages = tokens // PAGE + 1
    dtype = torch.bfloat16 if kv == "auto" else torch.uint8
    assert [(tuple(t._base.shape), t.dtype) for t in (store.nope_buffer[0], store.rope_buffer[0])] == [
        ((L, pages, PAGE, 1, R), dtype),
        ((L, pages, PAGE, 1, r), dtype),
    ]
    assert tuple(store.index_k_buffer[0]._base.shape) == (L, pages, PAGE, 1, D_I)


# -- the quantised lightning indexer: packed fp8 latent, fp8 index keys, fp32 index scales -----


def test_the_quantised_indexer_cell_is_the_packed_row_fp8_keys_and_fp32_scales() -> None:
    """Per layer: 512 fp8 + 16 B of tile scales + 128 B of bf16 rope (656), 128 B of keys, 4 B of scale: 788 B."""
    planned = _ascend(QUANT, kv_cache_dtype="fp8_e4m3")
    assert _parts(planned) == [
        ("latent", 31232, "kv", 0),  # 512 × 61
        ("latent_scale", 976, "kv", 0),  # 512 // 128 × 4 × 61
        ("rope", 7808, "kv", 0),  # 64 × 2 × 61
        ("index_k", 7808, "indexer", 0),  # 128 × 61
        ("index_k_scale", 244, "indexer", 0),  # 4 × 61
    ]
    assert planned.cell.bytes_per_token == 788 * L == 48068
    assert planned.cell.sglang_bytes_per_token == (576 + 132) * L  # --accounting sglang: SGLang's CUDA cell
    (note,) = [n for n in planned.cell.notes if n.startswith("Ascend NPU (arch35")]
    assert "one fp32 scale per token (128 + 4 B" in note and "v_buffer of width 0" in note
    assert any(n.startswith(ascend_dsa.PACKED_ROW_NOTE) for n in planned.cell.notes)
    assert planned.max_total_num_tokens == 1285376
    rows = 1285376 + PAGE
    assert _pools(planned)["kv"] == rows * 656 * L == 51440728064
    assert _pools(planned)["indexer"] == rows * (D_I + 4) * L == 10350878208
    assert index_storage(planned) == IndexStorage(D_I, torch.uint8, torch.float32)


def test_the_quantised_indexer_builds_sglangs_npu_shapes_on_meta() -> None:
    planned = _ascend(QUANT, kv_cache_dtype="fp8_e4m3")
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == _pools(planned)
    assert pools.provenance["buffer_layout"] == ("ascend",)
    store = pools.kv_pool
    assert isinstance(store, DSATokenToKVPool) and store.row.packed_fp8
    pages = planned.max_total_num_tokens // PAGE + 1
    assert pages == 10043
    shapes = [
        (tuple(t._base.shape), t.dtype)
        for t in (store.kv_buffer[0], store.index_k_buffer[60], store.index_k_scale_buffer[0])
    ]
    assert shapes == [
        ((L, pages, PAGE, 1, 656), torch.uint8),  # k_buffer; v_buffer (…, 0) holds no bytes
        ((L, pages, PAGE, 1, D_I), torch.uint8),  # index_k_buffer, fp8 stored as bytes
        ((L, pages, PAGE, 1), torch.float32),  # index_k_scale_buffer
    ]
    assert store.nbytes_by_pool() == {"kv": planned.pool("kv").bytes, "indexer": planned.pool("indexer").bytes}


def test_a_raw_row_backend_keeps_the_row_unpacked_beside_the_scales() -> None:
    """TRTLLM reads raw rows: ``calculate_mla_kv_cache_dim`` gives R + r = 576, so ``dsa_kv_cache_store_fp8`` is off."""
    planned = _ascend(QUANT, kv_cache_dtype="fp8_e4m3", dsa_decode_backend="trtllm")
    assert [(name, size) for name, size, _pool, _extra in _parts(planned)] == [
        ("latent", R * L),
        ("rope", r * L),
        ("index_k", D_I * L),
        ("index_k_scale", 4 * L),
    ]
    assert build(planned, "meta").allocated_by_pool() == _pools(planned)


def test_index_keys_and_scales_round_trip_on_the_cpu_in_the_npu_buffers() -> None:
    config = dict(SMALL_DSA)
    serving = Serving(platform="ascend", page_size=PAGE, kv_cache_dtype="fp8_e4m3", plugin_options=QUANT)
    planned = plan(parse(config), serving, memory=4 << 20)
    pools = build(planned, "cpu")
    assert pools.allocated_by_pool() == _pools(planned)
    store = pools.kv_pool
    generator = torch.Generator().manual_seed(0)
    loc = torch.randperm(store.size, generator=generator)[:8] + PAGE
    for layer in range(4):
        keys = torch.randn(8, 128, generator=generator).to(torch.bfloat16)
        store.set_index_k(layer, loc, keys)
        scales = keys.float().abs().amax(dim=1, keepdim=True) / 448  # one scale per token's 128 values
        assert torch.equal(store.get_index_k_scale(layer, loc), scales)
        # read back from the NPU-shaped tensors themselves: (layers, pages, P, 1[, D]) indexed by page and offset
        pages, offsets = loc // PAGE, loc % PAGE
        whole_scales = store.index_k_scale_buffer[layer]._base[layer]
        assert torch.equal(whole_scales[pages, offsets].reshape(8, 1), scales)
        expected = (keys.float() / scales).to(torch.float8_e4m3fn)
        whole_keys = store.index_k_buffer[layer]._base[layer]
        assert torch.equal(whole_keys[pages, offsets].reshape(8, 128), expected.view(torch.uint8))
        assert torch.allclose(store.get_index_k_dequant(layer, loc).float(), keys.float(), rtol=0.07, atol=1e-2)


# -- refusals and option values ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "model", "serving", "message"),
    [
        ({"ascend.soc": "a5"}, "deepseek-v3.2-exp", {}, r"ascend.soc=a5 is not an Ascend generation .*a2 or arch35"),
        ({**QUANT, "ascend.npu_quant_lightning_indexer": "yes"}, "deepseek-v3.2-exp", {}, "=yes: use true or false"),
        (
            {"ascend.npu_quant_lightning_indexer": "true"},
            "deepseek-v3.2-exp",
            {"kv_cache_dtype": "fp8_e4m3"},
            "needs ascend.soc=arch35",
        ),
        (QUANT, "deepseek-v3.2-exp", {}, "requires kv_cache_dtype fp8_e4m3 .* not bf16"),
        (QUANT, "deepseek-v3", {"kv_cache_dtype": "fp8_e4m3"}, "applies to DSA models only"),
        (QUANT, "llama-3.1-70b", {"kv_cache_dtype": "fp8_e4m3"}, "applies to DSA models only"),
        (
            QUANT,
            "deepseek-v3.2-exp",
            {
                "kv_cache_dtype": "fp8_e4m3",
                "speculative_algorithm": "EAGLE",
                "speculative_draft_num_layers": 1,
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
            },
            "not supported with speculative_algorithm: which indexer the draft worker",
        ),
    ],
)
def test_what_the_options_refuse(options: dict[str, str], model: str, serving: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match=message):
        _ascend(options, model, **serving)


def test_the_quantised_indexer_needs_index_head_dim_128() -> None:
    config = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "kv_lora_rank": 128,
        "qk_rope_head_dim": 32,
        "index_topk": 64,
        "index_head_dim": 64,
        "max_position_embeddings": 256,
        "torch_dtype": "bfloat16",
    }
    serving = Serving(platform="ascend", page_size=PAGE, kv_cache_dtype="fp8_e4m3", plugin_options=QUANT)
    with pytest.raises(UnsupportedCombinationError, match=r"requires index_head_dim=128 .* has 64"):
        plan(parse(config), serving, memory=4 << 20)


def test_cuda_ignores_the_ascend_options_and_names_agree() -> None:
    cuda = plan(
        "deepseek-v3.2-exp", Serving(page_size=64, kv_cache_dtype="fp8_e4m3", plugin_options=QUANT), memory="60GiB"
    )
    assert cuda.max_total_num_tokens == 1285376 and _pools(cuda)["indexer"] == 10350362880  # as before the options
    assert ascend_dsa.INDEX_SCALES_PART == core_dsa.INDEX_SCALES_PART


def test_the_cli_builds_the_arch35_quantised_pool(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    args = ["--platform", "ascend", "--device", "meta", "--memory", "60GiB", "--page-size", "128"]
    options = ["--plugin-option", "ascend.soc=arch35", "--plugin-option", "ascend.npu_quant_lightning_indexer=true"]
    out = subprocess.run(
        [kvpools_exe, "build", "deepseek-v3.2-exp", *args, "--kv-cache-dtype", "fp8_e4m3", *options, "--json"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["allocated_by_pool"] == summary["planned_by_pool"]
    assert summary["planned_by_pool"]["indexer"] == 10350878208


# -- IndexShare on the NPU: arch35 drops the shared layers' keys, a2 keeps every layer's ----------------------------


@pytest.mark.parametrize(("options", "layers"), [({}, 78), (ARCH35, 21)], ids=["a2", "arch35"])
def test_indexshare_on_ascend(options: dict[str, Any], layers: int) -> None:
    """GLM-5.2 (57 of 78 layers share top-k): ``_build_ascend_mla_kv_pool`` passes the compact
    ``indexer_layer_ids`` on arch35 only (``000_*.txt`` ~lines 1566-1578); the pool then keeps 256 B (bf16) rows
    for those layers, every layer's before arch35.  The build allocates what the plan says."""
    planned = _ascend(options, model="glm-5.2")
    assert ("index_k", layers * 256, "indexer", 0) in _parts(planned)
    assert _pools(planned)["indexer"] == (planned.max_total_num_tokens + PAGE) * layers * 256
    assert build(planned, "meta").allocated_by_pool() == _pools(planned)
