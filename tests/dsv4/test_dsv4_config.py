"""Reading DeepSeek-V4 configs: layer kinds from compress_ratios, the pool-side contract, errors naming the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kvpools_plugins.dsv4.config import parse_dsv4_config

from kvpools_core.errors import ConfigError
from kvpools_core.models import parse_config
from kvpools_core.registry import get_registry
from kvpools_core.values import ModelSpec

from .support import preset_config


def parse(config: dict[str, Any]) -> ModelSpec:
    return parse_config(config, "test-config", get_registry())[0]


def flash() -> dict[str, Any]:
    return copy.deepcopy(preset_config("deepseek-v4-flash"))


@pytest.mark.parametrize(
    ("preset", "layers", "kinds"),
    [
        ("deepseek-v4-flash", 43, {"swa": 2, "c4": 21, "c128": 20}),
        ("deepseek-v4-flash-fp8-sgl", 43, {"swa": 2, "c4": 21, "c128": 20}),
        ("deepseek-v4-pro", 61, {"c128": 31, "c4": 30}),
    ],
)
def test_presets_layer_kinds_and_contract(preset: str, layers: int, kinds: dict[str, int]) -> None:
    """The last ratio of the released configs is the MTP layer's: the decoder layers are the first num_hidden_layers."""
    model = parse(preset_config(preset))
    assert model.architecture == "dsv4"
    assert model.num_layers == layers
    assert dict(sorted(model.layer_kinds().items())) == dict(sorted(kinds.items()))
    assert model.num_nextn_predict_layers == 1
    assert model.context_len == 1048576
    for layer in model.layers:
        p = layer.params
        assert layer.kind == {0: "swa", 4: "c4", 128: "c128"}[p["compress_ratio"]]
        assert (p["qk_nope_head_dim"], p["qk_rope_head_dim"], p["window_size"]) == (448, 64, 128)
        if layer.kind == "c4":
            assert (p["index_head_dim"], p["index_n_heads"]) == (128, 64)
        else:
            assert "index_head_dim" not in p and "index_n_heads" not in p


def test_only_dsv4_claims_and_text_config_nesting() -> None:
    config = flash()
    model = parse(config)
    nested = {"architectures": config["architectures"], "text_config": {k: v for k, v in config.items()}}
    assert parse(nested).layers == model.layers
    claims = get_registry().call_collect("parse_model_config", config=config, source="x")
    assert [claim[-1].architecture for claim in claims] == ["dsv4"]  # mla, dsa and swa decline it
    other = flash()
    other["architectures"] = ["DeepseekV3ForCausalLM"]
    assert parse_dsv4_config(other, "x") is None


def test_stated_window_size_and_qk_nope_head_dim() -> None:
    config = flash()
    config.update(window_size=256, qk_nope_head_dim=192)
    model = parse(config)
    assert model.layers[0].params["window_size"] == 256
    assert model.layers[0].params["qk_nope_head_dim"] == 192


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"compress_ratios": [0, 4] * 5}, "'compress_ratios' has 10 entries"),
        ({"compress_ratios": [0, 4, 64] + [4] * 41}, "'compress_ratios' has ratio(s) [64]"),
        ({"compress_ratios": None}, "'compress_ratios' is missing"),
        ({"compress_ratios": "4,128"}, "'compress_ratios' must be a list"),
        ({"qk_rope_head_dim": None}, "'qk_rope_head_dim' is missing"),
        ({"head_dim": None}, "'head_dim' is missing"),
        ({"head_dim": 64}, "'head_dim' is 64"),
        ({"index_head_dim": None}, "'index_head_dim' is missing"),
        ({"sliding_window": None}, "'sliding_window' is missing"),
        ({"num_hidden_layers": None}, "'num_hidden_layers' is missing"),
    ],
)
def test_config_errors_name_the_field(change: dict[str, Any], field: str) -> None:
    config = flash()
    for key, value in change.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    with pytest.raises(ConfigError) as error:
        parse(config)
    assert field in str(error.value)


def test_ratios_of_exactly_num_hidden_layers_are_accepted() -> None:
    config = flash()
    config["compress_ratios"] = config["compress_ratios"][:43]
    assert parse(config).layers == parse(flash()).layers


def test_no_c4_layer_needs_no_indexer() -> None:
    config = flash()
    config["compress_ratios"] = [0, 128] * 22
    config.pop("index_head_dim")
    model = parse(config)
    assert set(model.layer_kinds()) == {"swa", "c128"}
