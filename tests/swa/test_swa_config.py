"""Reading sliding-window configs: every form, every preset, claims that never collide with another plugin."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from kvpools_plugins import mha, swa
from kvpools_plugins.swa.config import FULL, SLIDING

from kvpools_core.errors import ConfigError, NoProviderError
from kvpools_core.models import parse_config, registry_presets
from kvpools_core.pipeline import plan
from kvpools_core.registry import Registry, get_registry
from kvpools_core.values import ModelSpec, Plan, Serving
from tests.oracle.locate import require_model_configs

from .support import CHECKS, hybrid_configs, parse, preset_config, sliding_layer_ids

PRESETS = (
    "gpt-oss-20b",
    "gpt-oss-120b",
    "gemma-2-9b",
    "gemma-3-12b-it",
    "gemma-3-27b-it",
    "gemma-4-26b-a4b",
    "mimo-v2-flash",
    "mistral-7b-v0.1",
    "llama-4-maverick",
)


def kinds(model: ModelSpec) -> str:
    return "".join("s" if layer.kind == SLIDING else "F" for layer in model.layers)


def geometry(model: ModelSpec, kind: str) -> set[tuple[int, int, int]]:
    return {(la.num_kv_heads, la.head_dim, la.v_head_dim) for la in model.layers if la.kind == kind}


def test_presets_are_the_swa_plugins() -> None:
    offered = {name: plugin for name, (plugin, _path) in registry_presets(get_registry()).items()}
    assert {name for name, plugin in offered.items() if plugin == "swa"} == set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_is_claimed_by_swa_alone(preset: str) -> None:
    """The swa plugin claims it, the MHA plugin declines it, and no other plugin claims it (parse_config
    raises a conflict otherwise)."""
    config = preset_config(preset)
    assert mha.parse_model_config(config, preset) is None
    spec = parse(config, preset)
    assert spec.architecture == swa.ARCHITECTURE
    claims = get_registry().call_collect("parse_model_config", config=config, source=preset)
    assert [plugin for plugin, _ in claims] == ["swa"]


def test_gpt_oss_layer_types() -> None:
    model = parse(preset_config("gpt-oss-20b"))
    assert kinds(model) == "sF" * 12
    assert geometry(model, FULL) == geometry(model, SLIDING) == {(8, 64, 64)}
    assert {la.sliding_window for la in model.layers if la.kind == SLIDING} == {128}
    assert model.dtype == "bfloat16" and model.context_len == 131072


def test_gemma2_fixed_alternation_even_layers_slide() -> None:
    model = parse(preset_config("gemma-2-9b"))
    assert kinds(model) == "sF" * 21
    assert model.params["layer_pattern"].startswith("gemma2's fixed pattern 2")
    assert geometry(model, FULL) == geometry(model, SLIDING) == {(8, 256, 256)}


def test_gemma3_layer_types_and_default_pattern() -> None:
    """gemma-3-12b-it lists layer_types; gemma-3-27b-it states neither list nor pattern nor context length:
    transformers' Gemma3TextConfig defaults (pattern 6, 131072) apply, with a note saying so."""
    listed = parse(preset_config("gemma-3-12b-it"))
    assert kinds(listed) == "sssssF" * 8
    assert listed.is_multimodal
    sparse = parse(preset_config("gemma-3-27b-it"))
    assert kinds(sparse) == ("sssssF" * 11)[:62]
    assert sparse.context_len == 131072
    assert any("transformers default 131072" in note for note in sparse.params["notes"])
    assert geometry(sparse, SLIDING) == {(16, 128, 128)}


def test_gemma4_global_layers_keep_their_own_geometry() -> None:
    """Full layers: num_global_key_value_heads 2 x global_head_dim 512 for K and V (attention_k_eq_v ties the
    projections; K is normed and rotated, V only normed, so both are cached); SWA layers 8 x 256."""
    model = parse(preset_config("gemma-4-26b-a4b"))
    assert kinds(model) == "sssssF" * 5
    assert geometry(model, FULL) == {(2, 512, 512)}
    assert geometry(model, SLIDING) == {(8, 256, 256)}
    assert model.params["attention_k_eq_v"] is True


def test_mimo_v2_flash_hybrid_layer_pattern_and_asymmetric_swa() -> None:
    model = parse(preset_config("mimo-v2-flash"))
    pattern = preset_config("mimo-v2-flash")["hybrid_layer_pattern"]
    assert kinds(model) == "".join("s" if v else "F" for v in pattern)
    assert kinds(model).count("F") == 9 and kinds(model).count("s") == 39
    assert geometry(model, FULL) == {(4, 192, 128)}
    assert geometry(model, SLIDING) == {(8, 192, 128)}


def test_mistral_every_layer_slides() -> None:
    model = parse(preset_config("mistral-7b-v0.1"))
    assert kinds(model) == "s" * 32
    assert geometry(model, SLIDING) == {(8, 128, 128)}  # head_dim = 4096 / 32


BASE: dict[str, Any] = {
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 4096,
}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"model_type": "qwen2", "sliding_window": 512, "use_sliding_window": True, "max_window_layers": 2}, "FFss"),
        ({"model_type": "gemma3_text", "sliding_window": 512, "sliding_window_pattern": 2}, "sFsF"),
        ({"model_type": "mistral", "sliding_window": 512}, "ssss"),
        (
            {
                "model_type": "step3p5",
                "sliding_window": 8,
                "layer_types": ["full_attention"] + ["sliding_attention"] * 3,
            },
            "Fsss",
        ),
    ],
)
def test_other_forms(extra: dict[str, Any], expected: str) -> None:
    assert kinds(parse({**BASE, **extra})) == expected


@pytest.mark.parametrize(
    "extra",
    [
        {"model_type": "qwen2", "sliding_window": 512, "use_sliding_window": False, "max_window_layers": 2},
        {"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"] * 2},
        {"model_type": "deepseek_v4", "sliding_window": 128, "kv_lora_rank": 512},
        {"model_type": "llama"},
        {"model_type": "mistral", "sliding_window_size": 512},  # mlc's rename, not an HF field: MHA's model
        {"model_type": "gpt_oss", "sliding_window": 128, "layer_types": ["full_attention"] * 4},
    ],
)
def test_declines_what_is_not_sliding_window(extra: dict[str, Any]) -> None:
    assert swa.parse_model_config({**BASE, **extra}, "test") is None


def test_declined_mha_configs_stay_mha() -> None:
    """Dense presets are not claimed by swa (no collision with the MHA plugin's own models)."""
    for name, (plugin, _path) in registry_presets(get_registry()).items():
        if plugin == "mha":
            assert swa.parse_model_config(preset_config(name), name) is None


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"model_type": "mimo_v2_flash", "sliding_window": 8, "hybrid_layer_pattern": [0, 2, 1, 1]}, "0 \\(full\\)"),
        ({"model_type": "gpt_oss", "layer_types": ["sliding_attention"] * 4}, "sliding_window"),
        ({"model_type": "gpt_oss", "sliding_window": 8, "layer_types": ["sliding_attention"] * 3}, "3 entries"),
        (
            {"model_type": "gemma3_text", "sliding_window": 8, "num_kv_shared_layers": 2, "sliding_window_pattern": 2},
            "num_kv_shared_layers",
        ),
        ({"model_type": "mistral", "sliding_window": 8, "head_dim": None, "hidden_size": 100}, "head_dim"),
    ],
)
def test_forms_it_cannot_read_exactly_are_errors(extra: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        swa.parse_model_config({**BASE, **extra}, "test")


def test_without_the_swa_plugin_nobody_claims_gpt_oss() -> None:
    registry = Registry(disabled=("swa",))
    with pytest.raises(NoProviderError):
        parse_config(preset_config("gpt-oss-20b"), "gpt-oss-20b", registry)


@CHECKS
@given(config=hybrid_configs())
def test_generated_configs_are_claimed_once_and_read_as_written(config: dict[str, Any]) -> None:
    model = parse(config)  # raises on a conflict or no claim
    assert mha.parse_model_config(config, "hypothesis") is None
    assert [la.index for la in model.layers if la.kind == SLIDING] == sliding_layer_ids(config)


def test_of_the_shared_model_configs_swa_claims_exactly_the_sliding_ones() -> None:
    configs = sorted(require_model_configs().glob("*.json"))
    claimed = set()
    for path in configs:
        config = json.loads(path.read_text())
        if swa.parse_model_config(config, str(path)) is not None:
            claimed.add(path.stem)
            assert mha.parse_model_config(config, str(path)) is None
    assert claimed == set(PRESETS) - {"llama-4-maverick"}  # no Llama-4 config in the shared model-configs


def test_plans_round_trip_through_json() -> None:
    for preset in ("gemma-3-27b-it", "mimo-v2-flash", "mistral-7b-v0.1"):
        p = plan(preset, Serving(page_size=16, max_running_requests=8, disable_radix_cache=True), memory=1 << 33)
        assert Plan.from_json(p.to_json()) == p
