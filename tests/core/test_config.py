"""Reading real and broken configs: defaults as SGLang applies them, errors that name field and file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import ConfigError, NoProviderError, Registry, Serving, plan
from kvpools_core.config import load_model

SHARED_CONFIGS = Path(__file__).parents[2].parent / "shared" / "model-configs"


def write(tmp_path: Path, config: dict[str, Any]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


BASE = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "hidden_size": 4096,
    "max_position_embeddings": 8192,
}


def test_defaults_follow_sglang(registry: Registry, tmp_path: Path) -> None:
    spec, plugin = load_model(write(tmp_path, BASE), registry)
    assert plugin == "mha"
    layer = spec.layers[0]
    assert layer.head_dim == 4096 // 32  # head_dim defaults to hidden_size / heads
    assert layer.num_kv_heads == 32  # num_key_value_heads defaults to the attention heads
    assert layer.v_head_dim == layer.head_dim
    assert (spec.context_len, spec.dtype) == (8192, "bfloat16")  # no torch_dtype: bf16


def test_unknown_keys_are_ignored_and_text_config_is_read(registry: Registry, tmp_path: Path) -> None:
    wrapped = {
        "model_type": "llama",
        "vision_config": {"hidden_size": 1},
        "text_config": dict(BASE, num_key_value_heads=8),
    }
    spec, _ = load_model(write(tmp_path, dict(wrapped, some_future_key=[1, 2])), registry)
    assert spec.layers[0].num_kv_heads == 8
    assert spec.is_multimodal


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_attention_heads": None}, r"field 'num_attention_heads' is missing"),
        ({"num_hidden_layers": "32"}, r"field 'num_hidden_layers' must be an integer >= 1, got '32'"),
        ({"hidden_size": 4001}, r"hidden_size 4001 is not divisible by num_attention_heads 32.*Add head_dim"),
        ({"max_position_embeddings": None}, r"field 'max_position_embeddings' is missing.*--context-length"),
        ({"torch_dtype": "int8"}, r"field 'torch_dtype' is 'int8'"),
    ],
)
def test_missing_or_invalid_fields_name_the_field_and_the_file(
    registry: Registry, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = write(tmp_path, {k: v for k, v in {**BASE, **change}.items() if v is not None})
    with pytest.raises(ConfigError, match=message) as info:
        load_model(path, registry)
    assert path in str(info.value)


def test_context_length_override(registry: Registry) -> None:
    result = plan("llama-3.1-8b", Serving(context_length=8192, accounting="sglang"), memory="60GiB", registry=registry)
    assert result.model.context_len == 8192
    # int(491520 / 8192 * 512) = 30720 -> clamped to 4096
    assert result.max_running_requests == 4096


def test_a_sliding_window_model_is_not_claimed_by_mha(tmp_path: Path) -> None:
    mha_only = Registry(autoload=False, plugins=["mha"])
    with pytest.raises(NoProviderError, match="no architecture plugin recognises"):
        load_model(write(tmp_path, dict(BASE, model_type="mistral", sliding_window=4096)), mha_only)
    inert = dict(BASE, model_type="qwen2", sliding_window=131072, use_sliding_window=False)
    assert load_model(write(tmp_path, inert), mha_only)[1] == "mha"


DENSE = [
    "llama-3.1-8b",
    "llama-3.1-70b",
    "qwen3-8b",
    "qwen2.5-7b-instruct",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "mimo-7b-base",
    "minimax-m2.5",
]


@pytest.mark.parametrize("name", DENSE)
def test_dense_presets_are_the_shared_configs(registry: Registry, name: str) -> None:
    spec, plugin = load_model(name, registry)
    shared = json.loads((SHARED_CONFIGS / f"{name}.json").read_text())
    assert plugin == "mha"
    assert spec.num_layers == shared["num_hidden_layers"]
    assert spec.layers[0].num_kv_heads == shared["num_key_value_heads"]
    assert spec.layers[0].head_dim == shared.get("head_dim", shared["hidden_size"] // shared["num_attention_heads"])
    assert spec.context_len == shared["max_position_embeddings"]
    assert plan(name, Serving(), memory="80GiB", registry=registry).max_total_num_tokens > 0
