"""The MLA plugin: which configs it claims, hand-computed cell sizes, presets, and the combinations it rejects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from kvpools_core import Plan, Registry, Serving, UnsupportedCombinationError, build, plan
from kvpools_core.config import HF_ID_KEY
from kvpools_core.errors import ConfigError
from kvpools_core.models import parse_config, resolve_model_source
from tests.oracle.locate import MODEL_CONFIGS

MLA_PRESETS = ("deepseek-v3", "deepseek-r1", "deepseek-v2-lite", "kimi-k2-instruct")

V3_LAYERS = 61
V3_ROW_BF16 = (512 + 64) * 2  # kv_lora_rank + qk_rope_head_dim, 2 bytes each = 1152


def deepseek_like(**changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "num_hidden_layers": 4,
        "num_attention_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "max_position_embeddings": 8192,
        "torch_dtype": "bfloat16",
    }
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


# ---------------------------------------------------------------------------
# claiming configs
# ---------------------------------------------------------------------------


def test_mla_claims_latent_configs_and_describes_every_layer(registry: Registry) -> None:
    spec, plugin = parse_config(deepseek_like(), "test", registry)
    assert plugin == "mla"
    assert spec.architecture == "mla" and spec.num_layers == 4
    layer = spec.layers[0]
    assert (layer.kind, layer.num_kv_heads, layer.head_dim, layer.v_head_dim) == ("mla", 1, 576, 512)
    assert dict(layer.params) == {"kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert spec.params["qk_nope_head_dim"] == 128


@pytest.mark.parametrize(
    ("config", "claimed_by"),
    [
        (deepseek_like(index_topk=2048, index_head_dim=128), "dsa"),  # a DSA architecture with index_topk
        (deepseek_like(architectures=["DeepseekV2ForCausalLM"], index_topk=2048, index_head_dim=128), "mla"),
        (deepseek_like(architectures=["Glm4MoeLiteForCausalLM"]), "mla"),
        (deepseek_like(layer_types=["full_attention"] * 4), "mla"),
        (deepseek_like(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=128), "swa"),  # MLA-SWA
    ],
)
def test_exactly_one_plugin_claims_each_latent_config(
    registry: Registry, config: dict[str, Any], claimed_by: str
) -> None:
    """SGLang's ``is_deepseek_dsa`` splits MLA from DSA: a DSA architecture *and* ``index_topk``."""
    assert parse_config(config, "test", registry)[1] == claimed_by


@pytest.mark.parametrize(
    "config",
    [
        deepseek_like(architectures=["DeepseekV4ForCausalLM"]),  # DeepSeek-V4 compressed attention
    ],
)
def test_other_families_are_declined(registry: Registry, config: dict[str, Any]) -> None:
    # mla, dsa and swa decline it; the dsv4 plugin claims it and wants its compress_ratios
    with pytest.raises(ConfigError, match="'compress_ratios' is missing"):
        parse_config(config, "test", registry)


def test_sliding_latent_dims_without_a_layer_list_are_an_error(registry: Registry) -> None:
    """``swa_kv_lora_rank`` makes it hybrid MLA-SWA (not MLA), but nothing says which layers slide."""
    with pytest.raises(ConfigError, match="no layer_types or hybrid_layer_pattern"):
        parse_config(deepseek_like(swa_kv_lora_rank=256), "test", registry)


def test_mha_keeps_declining_latent_configs(registry: Registry) -> None:
    """A DeepSeek config under a dense model_type is still MLA: MHA declines configs with kv_lora_rank."""
    assert parse_config(deepseek_like(model_type="llama"), "test", registry)[1] == "mla"


# ---------------------------------------------------------------------------
# hand-computed cell sizes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kv", "stored", "sglang"),
    [
        ("auto", V3_ROW_BF16 * V3_LAYERS, V3_ROW_BF16 * V3_LAYERS),  # 1152 × 61 = 70272
        ("fp8_e4m3", 576 * V3_LAYERS, 576 * V3_LAYERS),  # 35136
        ("fp8_e5m2", 576 * V3_LAYERS, 576 * V3_LAYERS),
        ("fp32", 576 * 4 * V3_LAYERS, 576 * 4 * V3_LAYERS),  # 140544
        # fp4: 576 / 2 = 288 packed bytes + 576 / 16 = 36 scale bytes = 324 per layer = 19764;
        # SGLang: (576 × 61 × 1) // 2 + (576 // 16) × 61 × 1 = 17568 + 2196 = 19764
        ("fp4_e2m1", 324 * V3_LAYERS, 19764),
    ],
)
def test_deepseek_v3_cell_size(kv: str, stored: int, sglang: int) -> None:
    cell = plan("deepseek-v3", Serving(kv_cache_dtype=kv), memory="8GiB").cell
    assert cell.bytes_per_token == stored
    assert cell.sglang_bytes_per_token == sglang
    assert cell.num_layers == V3_LAYERS
    assert {part.pool for part in cell.parts} == {"kv"}


def test_fp4_parts_are_packed_latent_rope_and_scales() -> None:
    cell = plan("deepseek-v3", Serving(kv_cache_dtype="fp4_e2m1"), memory="8GiB").cell
    assert {p.name: p.bytes_per_token for p in cell.parts} == {
        "latent": 256 * V3_LAYERS,  # 512 / 2
        "rope": 32 * V3_LAYERS,  # 64 / 2
        "scale": 36 * V3_LAYERS,  # 576 / 16
    }


@pytest.mark.parametrize("tp", [1, 2, 8, 16, 64])
def test_tensor_parallelism_does_not_shard_the_latent(tp: int) -> None:
    serving = Serving(tp_size=tp, dp_size=tp, enable_dp_attention=tp > 1)
    assert plan("deepseek-r1", serving, memory="8GiB").cell.bytes_per_token == V3_ROW_BF16 * V3_LAYERS


def test_pipeline_stages_hold_their_own_layers() -> None:
    """61 layers over 2 stages: SGLang gives the extra layer to the last stage (30 + 31)."""
    first = plan("deepseek-v3", Serving(pp_size=2, pp_rank=0), memory="8GiB").cell
    last = plan("deepseek-v3", Serving(pp_size=2, pp_rank=1), memory="8GiB").cell
    assert (first.num_layers, last.num_layers) == (30, 31)
    assert (first.bytes_per_token, last.bytes_per_token) == (30 * V3_ROW_BF16, 31 * V3_ROW_BF16)


def test_nextn_draft_is_the_models_mtp_layer() -> None:
    """NEXTN with num_nextn_predict_layers = 1: int(70272 × (1 + 1/61)) = 71424; the draft pool is one layer."""
    result = plan("deepseek-v3", Serving(speculative_algorithm="NEXTN"), memory="8GiB")
    assert result.serving.speculative_draft_num_layers == 1
    assert result.cell.sglang_bytes_per_token == 71424
    draft = result.pool("draft_kv")
    assert draft.bytes_per_slot == V3_ROW_BF16
    assert draft.bytes == (result.max_total_num_tokens + 1) * V3_ROW_BF16
    assert result.provenance["estimate_cell_size"] == ("mla", "speculative")


def test_eagle_draft_of_two_layers_with_fp4() -> None:
    """int(19764 × (1 + 2/61)) = 20412; the draft stores 2 × 324 B."""
    serving = Serving(kv_cache_dtype="fp4_e2m1", speculative_algorithm="EAGLE", speculative_draft_num_layers=2)
    result = plan("kimi-k2-instruct", serving, memory="8GiB")
    assert result.cell.sglang_bytes_per_token == int(19764 * (1 + 2 / 61)) == 20412
    assert result.pool("draft_kv").bytes_per_slot == 2 * 324


def test_sglang_accounting_divides_the_budget_by_the_cell() -> None:
    """8 GiB // 70272 B = 122238 tokens, aligned down to pages of 64: 122176."""
    result = plan("deepseek-v3", Serving(accounting="sglang", page_size=64), memory="8GiB")
    assert result.max_total_num_tokens == (8 << 30) // 70272 // 64 * 64 == 122176


# ---------------------------------------------------------------------------
# presets
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("preset", MLA_PRESETS)
def test_every_mla_preset_parses_plans_and_builds(preset: str, registry: Registry) -> None:
    shared = MODEL_CONFIGS / f"{preset}.json"
    if shared.is_file():  # the preset is the shared config, verbatim
        bundled = resolve_model_source(preset, registry)[0]
        bundled.pop("_weights_config", None)  # the preset's pointer to its complete config (weights estimate)
        bundled.pop(HF_ID_KEY, None)  # and its Hugging Face id (the model path of launch lines)
        assert bundled == json.loads(shared.read_text())
    for serving in (Serving(), Serving(kv_cache_dtype="fp8_e4m3", page_size=64, tp_size=8)):
        result = plan(preset, serving, memory="40GiB", registry=registry)
        assert result.provenance["parse_model_config"] == ("mla",)
        assert result.planned_bytes <= result.budget.budget_bytes
        pools = build(result, "meta", registry=registry)
        assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}


# ---------------------------------------------------------------------------
# rejected combinations
# ---------------------------------------------------------------------------


def test_cpu_fp8_mla_is_rejected_before_anything_is_sized_or_allocated() -> None:
    """SGLang's ``configure``: "CPU FP8 KV cache is only supported for MHA." — here with the alternatives.

    A 1-byte budget could not hold one page: the combination is refused before sizing gets there.
    """
    serving = Serving(kv_cache_dtype="fp8_e4m3", platform="cpu")
    with pytest.raises(UnsupportedCombinationError) as raised:
        plan("deepseek-v2-lite", serving, memory=1)
    message = str(raised.value)
    assert "CPU FP8 KV cache is only supported for MHA." in message
    assert "kv_cache_dtype auto, bf16, fp16 or fp32" in message and "[mla]" in message
    assert isinstance(plan("deepseek-v2-lite", attrs.evolve(serving, kv_cache_dtype="bf16"), memory="4GiB"), Plan)


def test_mxfp8_has_no_mla_layout() -> None:
    with pytest.raises(UnsupportedCombinationError, match=r"mxfp8 is not supported for MLA models.*fp4_mx_block16"):
        plan("deepseek-v3", Serving(kv_cache_dtype="mxfp8"), memory="4GiB")


def test_fp4_needs_a_row_of_whole_scale_blocks(tmp_path: Path) -> None:
    """kv_lora_rank 500 + rope 64 = 564 values: not a multiple of 16."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(deepseek_like(kv_lora_rank=500)))
    with pytest.raises(UnsupportedCombinationError, match=r"\(kv_lora_rank \+ qk_rope_head_dim = 564\)"):
        plan(str(config), Serving(kv_cache_dtype="fp4_e2m1"), memory="4GiB")
    assert plan(str(config), Serving(kv_cache_dtype="fp8_e4m3"), memory="4GiB").cell.bytes_per_token == 564 * 4
