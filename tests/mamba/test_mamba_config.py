"""Hybrid configs: which plugin claims them, the layer layout, and the recurrent state per TP rank (hand-computed)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kvpools_plugins import mha
from kvpools_plugins.mamba.state import (
    rank_full_attention_layers,
    sglang_stage_per_req,
    state_bytes_per_slot,
    state_layer_ids,
    state_shape,
)

from kvpools_core import Serving
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.registry import get_registry
from kvpools_core.values import ModelSpec
from tests.oracle.locate import require_model_configs

from .support import MODEL_CONFIGS, PRESETS, parse, preset_config

GRANITE = MODEL_CONFIGS / "granite-4.0-h-small.json"


def spec_of(name: str) -> ModelSpec:
    return parse(preset_config(name), f"preset:{name}")


# ---------------------------------------------------------------------------
# claims
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
def test_every_hybrid_preset_is_claimed_by_mamba_alone(preset: str) -> None:
    config = preset_config(preset)
    claims = get_registry().call_collect("parse_model_config", config=config, source=preset)
    assert [plugin for plugin, _ in claims] == ["mamba"]
    assert mha.parse_model_config(config, preset) is None


def test_mha_declines_dense_model_types_carrying_a_hybrid_layout() -> None:
    """A derivative checkpoint keeping a dense model_type but Qwen3-Next's or Jamba's layout fields."""
    qwen = {**preset_config("qwen3-next-80b-a3b-thinking"), "model_type": "qwen3", "architectures": ["X"]}
    jamba = {**preset_config("jamba-1.5-mini"), "model_type": "llama", "architectures": ["X"]}
    for config in (qwen, jamba):
        assert mha.parse_model_config(config, "derived") is None
        assert parse(config).architecture == "mamba"


def test_sliding_window_layer_types_are_declined() -> None:
    config = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"],
        "num_attention_heads": 8,
        "head_dim": 64,
        "max_position_embeddings": 4096,
    }
    from kvpools_plugins import mamba

    assert mamba.parse_model_config(config, "swa") is None


# ---------------------------------------------------------------------------
# layouts
# ---------------------------------------------------------------------------

LAYOUTS = {
    # preset: (layers, state layers, full-attention layers, first full-attention ids)
    "qwen3-next-80b-a3b-thinking": (48, 36, 12, [3, 7, 11]),  # (i + 1) % 4 == 0
    "qwen3.5-35b-a3b": (40, 30, 10, [3, 7, 11]),
    "qwen3.5-397b-a17b": (60, 45, 15, [3, 7, 11]),
    "qwen3.6-35b-a3b-nvfp4": (40, 30, 10, [3, 7, 11]),
    "nemotron-h-56b-base-8k": (118, 54, 10, [7, 18, 29]),  # '*' in the pattern; '-' keeps nothing
    "nemotron-3-nano-30b-a3b": (52, 23, 6, [5, 12, 19]),  # 'E' keeps nothing
    "jamba-1.5-mini": (32, 28, 4, [4, 12, 20]),  # (i - 4) % 8 == 0
    "falcon-h1-0.5b": (36, 36, 36, [0, 1, 2]),  # every layer both
    "falcon-h1-7b": (44, 44, 44, [0, 1, 2]),
}


@pytest.mark.parametrize("preset", PRESETS)
def test_layer_layouts(preset: str) -> None:
    spec = spec_of(preset)
    layers, state, full, first = LAYOUTS[preset]
    full_ids = [layer.index for layer in rank_full_attention_layers(spec, Serving())]
    assert (spec.num_layers, len(state_layer_ids(spec)), len(full_ids), full_ids[:3]) == (layers, state, full, first)


def test_multimodal_wrapper_and_mtp_layers() -> None:
    spec = spec_of("qwen3.5-35b-a3b")
    assert spec.is_multimodal and spec.num_nextn_predict_layers == 1 and spec.dtype == "bfloat16"
    assert (spec.layers[3].num_kv_heads, spec.layers[3].head_dim) == (2, 256)
    assert spec.layers[0].num_kv_heads == 0  # a linear-attention layer keeps no KV


# ---------------------------------------------------------------------------
# state shapes and bytes, by hand
# ---------------------------------------------------------------------------


def test_gated_deltanet_state_qwen3_next() -> None:
    """key_dim = 16 x 128 = 2048, value_dim = 32 x 128 = 4096; conv over q, k, v: 2048 + 2048 + 4096 = 8192."""
    spec = spec_of("qwen3-next-80b-a3b-thinking")
    shape = state_shape(spec, Serving())
    assert (shape.conv, shape.ssm) == (((8192, 3),), (32, 128, 128))
    assert shape.conv_bytes == 8192 * 3 * 2 == 49_152
    assert shape.ssm_bytes == 32 * 128 * 128 * 4 == 2_097_152
    assert state_bytes_per_slot(spec, Serving()) == 36 * (49_152 + 2_097_152) == 77_266_944
    tp4 = state_shape(spec, Serving(tp_size=4))
    assert (tp4.conv, tp4.ssm) == (((2048, 3),), (8, 128, 128))


def test_gated_deltanet_key_groups_padded_when_tp_exceeds_them() -> None:
    """16 key heads over TP 32: groups padded to 32, conv = 8192 + 2 x 32 x 128 = 16384, / 32 = 512."""
    spec = spec_of("qwen3.5-397b-a17b")
    shape = state_shape(spec, Serving(tp_size=32))
    assert (shape.conv, shape.ssm) == (((512, 3),), (2, 128, 128))


def test_mamba2_state_nemotron_h() -> None:
    """Nemotron-H-56B: inner 256 x 64 = 16384, conv 16384 + 2 x 8 x 256 = 20480; SSM 256 x 64 x 256 fp32."""
    spec = spec_of("nemotron-h-56b-base-8k")
    shape = state_shape(spec, Serving(tp_size=8))
    assert (shape.conv, shape.ssm) == (((2560, 3),), (32, 64, 256))
    assert shape.bytes == 2560 * 3 * 2 + 32 * 64 * 256 * 4 == 2_112_512
    assert state_bytes_per_slot(spec, Serving(tp_size=8)) == 54 * 2_112_512


def test_mamba2_state_nemotron_3_nano() -> None:
    """64 heads x 64 = 4096, conv 4096 + 2 x 8 x 128 = 6144; SSM 64 x 64 x 128 fp32.

    The config's mamba_ssm_cache_dtype is not read (SGLang reads mamba_ssm_dtype only).
    """
    spec = spec_of("nemotron-3-nano-30b-a3b")
    shape = state_shape(spec, Serving())
    assert shape.bytes == 6144 * 3 * 2 + 64 * 64 * 128 * 4 == 2_134_016
    assert state_bytes_per_slot(spec, Serving()) == 23 * 2_134_016


def test_mamba1_state_jamba() -> None:
    """d_inner = 2 x 4096 = 8192: conv (8192 / tp, 3) bf16, SSM (8192 / tp, 16) fp32."""
    spec = spec_of("jamba-1.5-mini")
    shape = state_shape(spec, Serving(tp_size=2))
    assert (shape.conv, shape.ssm) == (((4096, 3),), (4096, 16))
    assert state_bytes_per_slot(spec, Serving(tp_size=2)) == 28 * (4096 * 3 * 2 + 4096 * 16 * 4) == 8_028_160


def test_falcon_h1_parallel_hybrid_derives_d_ssm_from_its_heads() -> None:
    """0.5B has no mamba_d_ssm: 24 heads x 64 = 1536 (not mamba_expand x hidden_size = 2048); groups 1 -> TP 2."""
    spec = spec_of("falcon-h1-0.5b")
    assert spec.params["state"]["intermediate_size"] == 1536
    shape = state_shape(spec, Serving(tp_size=2))
    assert (shape.conv, shape.ssm) == ((((1536 + 2 * 2 * 128) // 2, 3),), (12, 64, 128))
    assert state_bytes_per_slot(spec, Serving()) == 36 * ((1536 + 2 * 128) * 3 * 2 + 24 * 64 * 128 * 4)


def test_falcon_h1_shards_over_the_whole_tp_group() -> None:
    """DP attention (attention TP 1) does not change Falcon-H1's state shard (SGLang uses the TP world size)."""
    spec = spec_of("falcon-h1-7b")
    dp = Serving(tp_size=4, dp_size=4, enable_dp_attention=True)
    assert state_shape(spec, dp) == state_shape(spec, Serving(tp_size=4))
    qwen = spec_of("qwen3-next-80b-a3b-thinking")
    assert state_shape(qwen, dp) == state_shape(qwen, Serving(tp_size=1))  # attention TP 1


def test_real_log_qwen35_397b_at_tp2() -> None:
    """The issue's SGLang log (Qwen3.5-397B-A17B, TP 2): SSM state 7.29 GiB for 82 + 1 slots over 45 GDN layers.

    32 value heads per rank x 128 x 128 fp32 = 2 MiB per layer; x 45 = 94,371,840 B ("94.4 MB") per slot;
    x 83 slots = 7,832,862,720 B = 7.29 GiB.  KV: 1 KV head per rank x 256 x bf16 = 512 B per token per
    full-attention layer for K (and as much for V).
    """
    spec = spec_of("qwen3.5-397b-a17b")
    tp2 = Serving(tp_size=2)
    shape = state_shape(spec, tp2)
    layers = len(state_layer_ids(spec))
    assert (layers, shape.ssm) == (45, (32, 128, 128))
    assert shape.ssm_bytes * layers == 94_371_840
    assert round(shape.ssm_bytes * layers / 1e6, 1) == 94.4
    assert f"{83 * shape.ssm_bytes * layers / (1 << 30):.2f}" == "7.29"
    from kvpools_core.registry import get_registry as registry

    cell, _ = registry().call_first("estimate_cell_size", "", model=spec, serving=tp2)
    full = len(rank_full_attention_layers(spec, tp2))
    assert full == 15
    assert {p.name: p.bytes_per_token // full for p in cell.parts_of("token")} == {"k": 512, "v": 512}


def test_ssm_dtype_from_the_config_and_the_flag() -> None:
    config = copy.deepcopy(preset_config("qwen3-next-80b-a3b-thinking"))
    config["mamba_ssm_dtype"] = "bfloat16"
    spec = parse(config)
    assert state_shape(spec, Serving()).ssm_bytes == 32 * 128 * 128 * 2
    assert state_shape(spec, Serving(mamba_ssm_dtype="float32")).ssm_bytes == 32 * 128 * 128 * 4
    falcon = {**preset_config("falcon-h1-7b"), "mamba_ssm_dtype": "bfloat16"}
    assert state_shape(parse(falcon), Serving()).ssm_dtype == "float32"  # SGLang's Falcon-H1 ignores it


def test_largest_pipeline_stage_share_is_what_sglang_charges() -> None:
    """Nemotron-3-Nano, PP 2 (26 + 26 layers): 11 and 12 mamba layers; SGLang charges int(total x 12 / 23)."""
    spec = spec_of("nemotron-3-nano-30b-a3b")
    pp = Serving(pp_size=2)
    per_layer = state_shape(spec, pp).bytes
    counts = [len([i for i in state_layer_ids(spec) if lo <= i < lo + 26]) for lo in (0, 26)]
    assert counts == [12, 11]
    assert sglang_stage_per_req(spec, pp) == int(per_layer * 23 * (12 / 23))
    assert state_bytes_per_slot(spec, Serving(pp_size=2, pp_rank=1)) == 11 * per_layer


def test_tp_that_does_not_divide_the_state_is_rejected() -> None:
    spec = spec_of("qwen3-next-80b-a3b-thinking")
    with pytest.raises(UnsupportedCombinationError, match=r"TP 3: the value heads is 32, not a multiple of 3"):
        state_shape(spec, Serving(tp_size=3))


# ---------------------------------------------------------------------------
# configs whose state cannot be derived exactly
# ---------------------------------------------------------------------------


def _without(config: dict[str, Any], key: str, *, text: bool = False) -> dict[str, Any]:
    config = copy.deepcopy(config)
    (config["text_config"] if text else config).pop(key)
    return config


def test_granite_excerpt_is_rejected_naming_layer_types() -> None:
    """Granite-4.0-H-Small: only a partial excerpt exists (no layer_types, no mamba heads) — not a preset."""
    from kvpools_core.config import read_config_file

    require_model_configs()
    with pytest.raises(ConfigError, match=r"field 'layer_types' is missing"):
        parse(read_config_file(GRANITE), str(GRANITE))


@pytest.mark.parametrize(
    ("preset", "field", "text"),
    [
        ("qwen3-next-80b-a3b-thinking", "linear_key_head_dim", False),
        ("qwen3-next-80b-a3b-thinking", "linear_conv_kernel_dim", False),
        ("qwen3.5-397b-a17b", "linear_num_value_heads", True),
        ("nemotron-h-56b-base-8k", "n_groups", False),
        ("nemotron-h-56b-base-8k", "ssm_state_size", False),
        ("jamba-1.5-mini", "attn_layer_offset", False),
        ("jamba-1.5-mini", "mamba_d_state", False),
        ("falcon-h1-7b", "mamba_n_groups", False),
    ],
)
def test_missing_state_fields_are_named(preset: str, field: str, text: bool) -> None:
    with pytest.raises(ConfigError, match=rf"field '{'text_config.' if text else ''}{field}' is missing"):
        parse(_without(preset_config(preset), field, text=text))


def test_falcon_without_d_ssm_or_d_head_is_rejected_not_guessed() -> None:
    config = _without(preset_config("falcon-h1-0.5b"), "mamba_d_head")
    with pytest.raises(ConfigError, match=r"'mamba_d_ssm' is missing .* not derive it from mamba_expand"):
        parse(config)


def test_granite_with_a_layout_reads_its_mamba2_fields() -> None:
    config = {
        "model_type": "granitemoehybrid",
        "num_hidden_layers": 4,
        "layer_types": ["mamba", "attention", "mamba", "mamba"],
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "mamba_expand": 2,
        "mamba_n_heads": 32,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_d_state": 128,
        "mamba_d_conv": 4,
        "max_position_embeddings": 131072,
    }
    spec = parse(config)
    assert state_shape(spec, Serving()).bytes == (2048 + 2 * 128) * 3 * 2 + 32 * 64 * 128 * 4
    with pytest.raises(ConfigError, match=r"'mamba_n_heads' is missing"):
        parse(_without(config, "mamba_n_heads"))
    with pytest.raises(ConfigError, match=r"mamba_d_head x mamba_n_heads"):
        parse({**config, "mamba_d_head": 32})


def test_layouts_without_a_full_attention_or_recurrent_layer_are_rejected() -> None:
    nemotron = {**preset_config("nemotron-h-56b-base-8k"), "hybrid_override_pattern": "M-M-"}
    with pytest.raises(ConfigError, match=r"'hybrid_override_pattern' names no full-attention layer"):
        parse(nemotron)
    with pytest.raises(ConfigError, match=r"unknown character"):
        parse({**nemotron, "hybrid_override_pattern": "M*X"})
