"""The DSA plugin: claims, hand-computed cell sizes (latent row + indexer), the real-log check, validation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from kvpools_core import Registry, Serving, UnsupportedCombinationError, build, plan
from kvpools_core.config import HF_ID_KEY
from kvpools_core.models import parse_config, resolve_model_source
from tests.oracle.locate import MODEL_CONFIGS

DSA_PRESETS = ("deepseek-v3.2", "deepseek-v3.2-exp")
L = 61  # DeepSeek-V3.2 layers
CUDA = Serving(page_size=64)
FP8 = attrs.evolve(CUDA, kv_cache_dtype="fp8_e4m3")

PACKED_ROW = 512 + 512 // 128 * 4 + 64 * 2  # fp8 latent + fp32 scale per 128 + bf16 rope = 656
INDEX_ROW = 128 + 128 // 128 * 4  # fp8 index key + one fp32 scale = 132
RAW_FP8_ROW = 512 + 64  # 576


def v32_like(**changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "index_topk": 2048,
        "index_head_dim": 128,
        "index_n_heads": 64,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    }
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


def parts(name: str, serving: Serving) -> dict[str, int]:
    cell = plan(name, serving, memory="8GiB").cell
    return {p.name: p.bytes_per_token for p in cell.parts}


# ---------------------------------------------------------------------------
# the real log
# ---------------------------------------------------------------------------


def test_deepseek_v32_exp_on_8_b200_with_dp_attention_is_788_bytes_per_token_per_layer() -> None:
    """SGLang allocated 975,424 tokens of DeepSeek-V3.2-Exp at 43.67 GiB of KV on 8×B200 with DP attention.

    43.67 GiB / 975,424 tokens / 61 layers = 788 B per token per layer:
    the 656 B packed fp8 latent row + the 132 B indexer key.  SGLang's
    configurator charges 576 + 132 = 708 for it; kvpools' plan charges the 788.
    """
    serving = Serving(
        tp_size=8,
        dp_size=8,
        enable_dp_attention=True,
        kv_cache_dtype="fp8_e4m3",
        page_size=64,
        max_total_tokens=975_424,
    )
    result = plan("deepseek-v3.2-exp", serving, memory="60GiB")
    assert result.max_total_num_tokens == 975_424
    assert result.cell.bytes_per_token == 788 * L == (PACKED_ROW + INDEX_ROW) * L
    assert result.cell.sglang_bytes_per_token == 708 * L
    kv_bytes = result.pool("kv").bytes + result.pool("indexer").bytes
    assert kv_bytes == (975_424 + 64) * 788 * L  # page 0 pads both buffers
    assert round(kv_bytes / (1 << 30), 2) == 43.67
    assert round(975_424 * 788 * L / (1 << 30), 2) == 43.67


# ---------------------------------------------------------------------------
# claims and hand-computed cells
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "architecture",
    ["DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "GlmMoeDsaForCausalLM", "DeepseekV3ForCausalLMNextN"],
)
def test_dsa_claims_dsa_architectures_with_index_topk(registry: Registry, architecture: str) -> None:
    spec, plugin = parse_config(v32_like(architectures=[architecture]), "test", registry)
    assert (plugin, spec.architecture, spec.layers[0].kind) == ("dsa", "dsa", "dsa")
    assert spec.layers[0].params["index_head_dim"] == 128
    # without index_topk the same architecture is plain MLA
    assert parse_config(v32_like(architectures=[architecture], index_topk=None), "test", registry)[1] == "mla"


def test_fp8_latent_row_is_packed_and_the_indexer_is_its_own_pool() -> None:
    assert parts("deepseek-v3.2", FP8) == {
        "latent": 512 * L,
        "latent_scale": 16 * L,
        "rope": 128 * L,
        "indexer": INDEX_ROW * L,
    }
    cell = plan("deepseek-v3.2", FP8, memory="8GiB").cell
    assert {p.name: p.pool for p in cell.parts}["indexer"] == "indexer"
    assert cell.sglang_bytes_per_token == (RAW_FP8_ROW + INDEX_ROW) * L == 43188


@pytest.mark.parametrize(
    ("kv", "stored_row", "sglang_row"),
    [
        ("auto", 1152, 1152),  # bf16: (512 + 64) × 2
        ("fp8_e5m2", 576, 576),  # only e4m3 is packed
        # fp4: 288 packed + 36 scale bytes; SGLang: (576 × 61) // 2 + 36 × 61 → 324 per layer
        ("fp4_e2m1", 324, 324),
    ],
)
def test_other_kv_dtypes(kv: str, stored_row: int, sglang_row: int) -> None:
    cell = plan("deepseek-v3.2", attrs.evolve(CUDA, kv_cache_dtype=kv), memory="8GiB").cell
    assert cell.bytes_per_token == (stored_row + INDEX_ROW) * L
    assert cell.sglang_bytes_per_token == (sglang_row + INDEX_ROW) * L


@pytest.mark.parametrize(
    ("options", "packed"),
    [
        ({"dsa_decode_backend": "trtllm"}, False),  # a co-located server reads raw rows if either backend is TRTLLM
        ({"dsa_prefill_backend": "trtllm"}, False),
        ({"disaggregation_mode": "decode", "dsa_decode_backend": "trtllm"}, False),
        ({"disaggregation_mode": "decode", "dsa_prefill_backend": "trtllm"}, True),  # only the local role counts
        ({"disaggregation_mode": "prefill", "dsa_decode_backend": "trtllm"}, True),
        ({"platform": "rocm", "dsa_decode_backend": "tilelang", "page_size": 1}, False),
        # the flashmla backends named: unset, kvpools-rocm takes SGLang's HIP defaults (triton: raw rows)
        (
            {
                "platform": "rocm",
                "page_size": 16,
                "dsa_decode_backend": "flashmla_kv",
                "dsa_prefill_backend": "flashmla_sparse",
            },
            True,
        ),
    ],
)
@pytest.mark.usefixtures("rocm_platform")
def test_calculate_mla_kv_cache_dim_backends(options: dict[str, Any], packed: bool) -> None:
    cell = plan("deepseek-v3.2", attrs.evolve(FP8, **options), memory="8GiB").cell
    row = PACKED_ROW if packed else RAW_FP8_ROW
    assert cell.bytes_per_token == (row + INDEX_ROW) * L
    assert cell.sglang_bytes_per_token == (RAW_FP8_ROW + INDEX_ROW) * L  # SGLang's estimate ignores the layout


@pytest.mark.usefixtures("rocm_platform")
def test_indexer_pages_hold_one_extra_slot() -> None:
    """``((tokens + page + 1) // page)`` pages: at page size 1 two slots pad; at 64 one page does."""
    for page, padding in ((1, 2), (16, 16), (64, 64)):
        result = plan("deepseek-v3.2", Serving(platform="rocm", page_size=page), memory="8GiB")
        tokens = result.max_total_num_tokens
        indexer = result.pool("indexer")
        assert (indexer.padding_slots, result.pool("kv").padding_slots) == (padding, page)
        assert indexer.bytes == (tokens + page + 1) // page * page * INDEX_ROW * L
        assert result.planned_bytes <= result.budget.budget_bytes


PREFILL = {"disaggregation_mode": "prefill"}  # SGLang runs the cache layer split on a PD prefill node only


def test_cache_layer_split_over_context_parallel_ranks() -> None:
    """61 layers over 4 CP ranks: ceil(61 / 4) + 1 = 17 layers stored (16 owned + the remote scratch)."""
    serving = attrs.evolve(FP8, tp_size=4, attn_cp_size=4, enable_dsa_cache_layer_split=True, **PREFILL)
    cell = plan("deepseek-v3.2", serving, memory="8GiB").cell
    assert cell.bytes_per_token == 788 * 17
    assert cell.sglang_bytes_per_token == 708 * 17 == 12036
    assert cell.num_layers == L
    # The flag alone (one CP rank) changes nothing.
    alone = plan("deepseek-v3.2", attrs.evolve(FP8, enable_dsa_cache_layer_split=True, **PREFILL), memory="8GiB").cell
    assert alone.bytes_per_token == 788 * L


def test_layer_split_draft_keeps_every_layer() -> None:
    """SGLang scales by the stage's 61 layers: int(12036 × (1 + 1/61)) = 12233; the draft stores one whole layer."""
    serving = attrs.evolve(
        FP8, tp_size=4, attn_cp_size=4, enable_dsa_cache_layer_split=True, speculative_algorithm="NEXTN", **PREFILL
    )
    result = plan("deepseek-v3.2", serving, memory="8GiB")
    assert result.cell.sglang_bytes_per_token == int(12036 * (1 + 1 / 61)) == 12233
    assert result.pool("draft_kv").bytes_per_slot == PACKED_ROW
    assert result.pool("draft_indexer").bytes_per_slot == INDEX_ROW
    assert result.pool("draft_indexer").padding_slots == 64


def test_nextn_draft_without_split() -> None:
    """int(43188 × (1 + 1/61)) = 43896; draft pools of one 656 B latent row and one 132 B indexer key."""
    result = plan("deepseek-v3.2", attrs.evolve(FP8, speculative_algorithm="NEXTN"), memory="8GiB")
    assert result.cell.sglang_bytes_per_token == 43896
    assert (result.pool("draft_kv").bytes_per_slot, result.pool("draft_indexer").bytes_per_slot) == (656, 132)


# ---------------------------------------------------------------------------
# presets
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("preset", DSA_PRESETS)
def test_every_dsa_preset_parses_plans_and_builds(preset: str, registry: Registry) -> None:
    shared = MODEL_CONFIGS / f"{preset}.json"
    if shared.is_file():  # the preset is the shared config, verbatim
        bundled = resolve_model_source(preset, registry)[0]
        bundled.pop("_weights_config", None)  # the preset's pointer to its complete config (weights estimate)
        bundled.pop(HF_ID_KEY, None)  # and its Hugging Face id (the model path of launch lines)
        assert bundled == json.loads(shared.read_text())
    for serving in (CUDA, attrs.evolve(FP8, tp_size=8, dp_size=8, enable_dp_attention=True)):
        result = plan(preset, serving, memory="40GiB", registry=registry)
        assert result.provenance["parse_model_config"] == ("dsa",)
        assert result.planned_bytes <= result.budget.budget_bytes
        pools = build(result, "meta", registry=registry)
        assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}


# ---------------------------------------------------------------------------
# rejected combinations
# ---------------------------------------------------------------------------


def test_cuda_needs_page_size_64() -> None:
    """An explicit page 1 is refused (left unset, the page is SGLang's 64: tests/core/test_engine_defaults.py)."""
    with pytest.raises(UnsupportedCombinationError, match=r"DSA models need page_size 64 on cuda.*got page_size 1"):
        plan("deepseek-v3.2", Serving(page_size=1), memory="8GiB")


@pytest.mark.usefixtures("rocm_platform")
def test_rocm_needs_page_1_or_a_multiple_of_16() -> None:
    with pytest.raises(UnsupportedCombinationError, match=r"page_size 1 or a multiple of 16 on rocm.*got page_size 8"):
        plan("deepseek-v3.2", Serving(platform="rocm", page_size=8), memory="8GiB")


def test_cpu_fp8_dsa_is_rejected_like_mla() -> None:
    with pytest.raises(UnsupportedCombinationError, match=r"CPU FP8 KV cache is only supported for MHA\..*\[dsa\]"):
        plan("deepseek-v3.2", Serving(kv_cache_dtype="fp8_e4m3", platform="cpu"), memory="8GiB")


def test_index_head_dim_must_be_128(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(v32_like(index_head_dim=64)))
    with pytest.raises(UnsupportedCombinationError, match="index_head_dim 64; SGLang's DSA pool"):
        plan(str(config), CUDA, memory="1GiB")


def test_packed_row_needs_whole_scale_blocks(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(v32_like(kv_lora_rank=448)))
    with pytest.raises(UnsupportedCombinationError, match="kv_lora_rank 448"):
        plan(str(config), FP8, memory="1GiB")
    raw = attrs.evolve(FP8, dsa_decode_backend="trtllm")
    assert plan(str(config), raw, memory="1GiB").cell.bytes_per_token == (448 + 64 + INDEX_ROW) * 4
