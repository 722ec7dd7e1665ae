"""Reading real and broken configs: defaults as SGLang applies them, errors that name field and file."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import ConfigError, NoProviderError, Registry, Serving, plan
from kvpools_core import config as config_module
from kvpools_core.config import DIM, FIELD_LIMITS, ConfigReader, Limit, limit_for
from kvpools_core.models import load_model, resolve_model_source
from tests.oracle.locate import require_model_configs


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
        ({"max_position_embeddings": None}, r"field 'max_position_embeddings' is missing\. Add it .* to the config\.$"),
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
    shared = json.loads((require_model_configs() / f"{name}.json").read_text())
    assert plugin == "mha"
    assert spec.num_layers == shared["num_hidden_layers"]
    assert spec.layers[0].num_kv_heads == shared["num_key_value_heads"]
    assert spec.layers[0].head_dim == shared.get("head_dim", shared["hidden_size"] // shared["num_attention_heads"])
    assert spec.context_len == shared["max_position_embeddings"]
    assert plan(name, Serving(), memory="80GiB", registry=registry).max_total_num_tokens > 0


def test_a_preset_is_one_spec_for_every_plan(registry: Registry) -> None:
    """Issue 37: a preset's parsed spec is cached, but each load renamed it with ``attrs.evolve``, validating every
    layer again (DeepSeek-V4-Flash's 43, on every plan).  The cached spec is named after its preset, so a load
    returns that frozen value itself; another name still gets a spec of its own, leaving the cached one alone."""
    first, plugin = load_model("deepseek-v4-flash", registry)
    again, _ = load_model("deepseek-v4-flash", registry)
    assert plugin == "dsv4"
    assert first is again
    assert (first.name, first.source) == ("deepseek-v4-flash", "preset:deepseek-v4-flash")
    renamed, _ = load_model("deepseek-v4-flash", registry, name="my-flash")
    assert renamed.name == "my-flash" and renamed.layers == first.layers
    assert load_model("deepseek-v4-flash", registry)[0] is first


# ---------------------------------------------------------------------------
# hardening: every finding of the config fuzzer (tests/core/test_config_fuzz.py), one test each
# ---------------------------------------------------------------------------


def preset(registry: Registry, name: str) -> dict[str, Any]:
    return resolve_model_source(name, registry)[0]


def test_a_config_that_is_not_utf8_names_the_file_and_the_fix(registry: Registry, tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(json.dumps(BASE).encode()[:-1] + b', "name": "caf\xe9"}')  # Latin-1, not UTF-8
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(byte \d+: invalid continuation byte\).*UTF-8 JSON"):
        load_model(str(path), registry)
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(BASE).encode())  # a byte-order mark is tolerated
    assert load_model(str(path), registry)[1] == "mha"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"num_hidden_layers": ' + "9" * 5000 + "}", r"cannot be read as a model config \(ValueError"),
        ("[" * 100_000 + "]" * 100_000, r"cannot be read as a model config \(RecursionError"),
        ('{"a": 1', r"is not valid JSON \(line 1, column 8"),
        ("[1, 2]", r"must hold a JSON object, got list"),
    ],
)
def test_unreadable_json_is_a_config_error(registry: Registry, tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_model(str(path), registry)


def test_an_oversized_file_is_not_read(registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module, "MAX_CONFIG_BYTES", 100)
    with pytest.raises(ConfigError, match=r"is \d+ bytes; a config.json is kilobytes"):
        load_model(write(tmp_path, dict(BASE, padding="x" * 200)), registry)


@pytest.mark.parametrize("value", [2**64, 10**30, 10_001])
@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("llama-3.1-8b", False),  # mha: one LayerSpec per layer (looped for ever)
        ("falcon-h1-0.5b", False),  # mamba: [kind] * layers (OverflowError)
        ("gemma-2-9b", False),  # swa: the family's fixed pattern over every layer (looped for ever)
        ("mistral-7b-v0.1", False),  # swa all-SWA: (True,) * layers (OverflowError)
        ("deepseek-v3", False),  # mla
        ("deepseek-v3.2", False),  # dsa
        ("minimax-m3", True),  # minimax_sparse
    ],
)
def test_absurd_layer_counts_are_refused_naming_the_field_and_the_bound(
    registry: Registry, tmp_path: Path, name: str, text: bool, value: int
) -> None:
    config = preset(registry, name)
    (config["text_config"] if text else config)["num_hidden_layers"] = value
    field = "text_config.num_hidden_layers" if text else "num_hidden_layers"
    started = time.perf_counter()
    with pytest.raises(
        ConfigError, match=rf"field '{field}' is {value}, above 10,000, kvpools' bound for a layer count"
    ):
        load_model(write(tmp_path, config), registry)
    assert time.perf_counter() - started < 1


def test_a_float_layer_count_is_a_type_error_not_an_overflow(registry: Registry, tmp_path: Path) -> None:
    for name in ("llama-3.1-8b", "falcon-h1-0.5b", "mistral-7b-v0.1"):
        config = dict(preset(registry, name), num_hidden_layers=1e30)
        with pytest.raises(ConfigError, match=r"field 'num_hidden_layers' must be an integer >= 1, got 1e\+30"):
            load_model(write(tmp_path, config), registry)


@pytest.mark.parametrize(("key", "limit"), sorted(FIELD_LIMITS.items()))
def test_every_bounded_field_takes_its_bound_and_refuses_one_more(key: str, limit: Limit) -> None:
    reader = ConfigReader({key: limit.maximum, "above": limit.maximum + 1}, "config.json")
    assert reader.integer(key, minimum=0) == limit.maximum
    with pytest.raises(ConfigError, match=rf"field '{key}' is {limit.maximum + 1}, above {limit.maximum:,}"):
        ConfigReader({key: limit.maximum + 1}, "config.json").integer(key, minimum=0)


def test_a_field_without_a_named_bound_is_a_dimension() -> None:
    assert limit_for("kv_lora_rank") == limit_for("some_future_dim") == DIM
    with pytest.raises(ConfigError, match=r"field 'kv_lora_rank' is 1048577, above 1,048,576, .* for a dimension"):
        ConfigReader({"kv_lora_rank": DIM.maximum + 1}, "config.json").integer("kv_lora_rank")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", r"must be an integer >= 1, got 'abc'\. Fix the value"),
        (32.0, r"must be an integer >= 1, got 32\.0\. Write it as a whole number, without a decimal point\."),
        (2.5, r"must be an integer >= 1, got 2\.5\. Fix the value"),
        (True, r"must be an integer >= 1, got True\."),  # booleans are not integers
        ([32], r"must be an integer >= 1, got \[32\]\."),
        ({"n": 32}, r"must be an integer >= 1, got \{'n': 32\}\."),
        (0, r"must be an integer >= 1, got 0\."),
    ],
)
def test_wrong_json_types_name_the_field_and_the_type_expected(
    registry: Registry, tmp_path: Path, value: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=rf"field 'num_attention_heads' {message}"):
        load_model(write(tmp_path, dict(BASE, num_attention_heads=value)), registry)


@pytest.mark.parametrize(
    ("name", "plugin"),
    [
        ("deepseek-v3", "mla"),
        ("deepseek-v3.2", "dsa"),
        ("llama-3.1-8b", "mha"),
        ("qwen3-next-80b-a3b-thinking", "mamba"),
        ("gpt-oss-20b", "swa"),
        ("minimax-m3", "minimax_sparse"),
    ],
)
@pytest.mark.parametrize("value", [["deepseek_v3"], {"type": "deepseek_v3"}, 3])
def test_a_model_type_that_is_not_a_string_is_a_config_error(
    registry: Registry, tmp_path: Path, name: str, plugin: str, value: Any
) -> None:
    """Each plugin on its own (the MLA reader used to hash the list: ``TypeError: unhashable type``)."""
    alone = Registry(autoload=False, plugins=[plugin], disabled=(), trace=False, on_plugin_error="raise")
    config = preset(registry, name)
    (config["text_config"] if name == "minimax-m3" else config)["model_type"] = value
    with pytest.raises(ConfigError, match=r"field '(text_config\.)?model_type' must be a string, got"):
        load_model(write(tmp_path, config), alone)


@pytest.mark.parametrize("value", [["llama"], "llama", 1, True])
def test_a_text_config_that_is_not_an_object_is_named(registry: Registry, tmp_path: Path, value: Any) -> None:
    with pytest.raises(ConfigError, match=r"field 'text_config' must be an object, got"):
        load_model(write(tmp_path, dict(BASE, text_config=value)), registry)


def test_nested_fields_are_named_by_their_whole_path(registry: Registry, tmp_path: Path) -> None:
    config = preset(registry, "minimax-m3")
    config["text_config"]["num_attention_heads"] = "64"
    with pytest.raises(ConfigError, match=r"field 'text_config.num_attention_heads' must be an integer >= 1"):
        load_model(write(tmp_path, config), registry)
    config = preset(registry, "minimax-m3")
    config["text_config"]["sparse_attention_config"]["sparse_index_dim"] = -1
    with pytest.raises(ConfigError, match=r"field 'text_config.sparse_attention_config.sparse_index_dim' must be"):
        load_model(write(tmp_path, config), registry)


def _edit(config: dict[str, Any], key: str, edit: Any, text: bool = False) -> dict[str, Any]:
    target = config["text_config"] if text else config
    target[key] = edit(target[key])
    return config


@pytest.mark.parametrize(
    ("name", "key", "text", "edit", "message"),
    [
        ("gpt-oss-20b", "layer_types", False, lambda v: v[:-1], r"'num_hidden_layers' is 24 but .* has 23 entries"),
        (
            "gpt-oss-20b",
            "layer_types",
            False,
            lambda v: [*v, "bogus"],
            r"'layer_types' has layer type\(s\) \['bogus'\]",
        ),
        ("gpt-oss-20b", "layer_types", False, lambda v: [], r"'layer_types' is an empty list"),
        ("gpt-oss-20b", "layer_types", False, lambda v: [1, *v[1:]], r"'layer_types' must be a list of strings"),
        ("mimo-v2-flash", "hybrid_layer_pattern", False, lambda v: [2, *v[1:]], r"'hybrid_layer_pattern' must be"),
        ("mimo-v2-flash", "hybrid_layer_pattern", False, lambda v: v * 2, r"but the layer pattern .* has 96 entries"),
        ("qwen3.5-35b-a3b", "layer_types", True, lambda v: v[:-1], r"'text_config.layer_types' describes 39 layers"),
        ("qwen3.5-35b-a3b", "layer_types", True, lambda v: ["x", *v[1:]], r"'text_config.layer_types' has unknown"),
        ("nemotron-h-56b-base-8k", "hybrid_override_pattern", False, lambda v: v + "M*", r"describes 120 layers"),
        ("nemotron-h-56b-base-8k", "hybrid_override_pattern", False, lambda v: "M" * 10_001, r"above 10,000"),
        ("nemotron-h-56b-base-8k", "hybrid_override_pattern", False, lambda v: ["M"], r"must be a string, got"),
        ("minimax-m3", "sparse_attention_config", True, lambda v: dict(v, sparse_attention_freq=[1]), r"has 1 entr"),
        ("minimax-m3", "sparse_attention_config", True, lambda v: [v], r"'text_config.sparse_attention_config' must"),
    ],
)
def test_layer_patterns_of_the_wrong_length_type_or_entries_name_the_field(
    registry: Registry, tmp_path: Path, name: str, key: str, text: bool, edit: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_model(write(tmp_path, _edit(preset(registry, name), key, edit, text)), registry)


def test_layers_block_type_must_match_the_layer_count(registry: Registry, tmp_path: Path) -> None:
    config = preset(registry, "qwen3-next-80b-a3b-thinking")
    config["layers_block_type"] = ["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    with pytest.raises(ConfigError, match=r"field 'layers_block_type' describes 4 layers but num_hidden_layers is 48"):
        load_model(write(tmp_path, config), registry)


def test_a_mistyped_preset_name_gets_close_matches(registry: Registry) -> None:
    with pytest.raises(ConfigError, match=r"Unknown model 'llama-3.1-8'.* Did you mean 'llama-3.1-8b'"):
        load_model("llama-3.1-8", registry)
    with pytest.raises(ConfigError, match=r"Unknown model 'Gemma-2-9B'.* Did you mean 'gemma-2-9b'"):
        load_model("Gemma-2-9B", registry)
    with pytest.raises(ConfigError) as info:
        load_model("zzzz", registry)
    assert "Did you mean" not in str(info.value)


@pytest.mark.parametrize(
    "change",
    [{"max_position_embeddings": None}, {"torch_dtype": "int8"}, {"torch_dtype": ["bfloat16"]}, {"hidden_size": 4001}],
)
def test_config_problems_name_no_command_line_flag(registry: Registry, tmp_path: Path, change: dict[str, Any]) -> None:
    path = write(tmp_path, {k: v for k, v in {**BASE, **change}.items() if v is not None})
    with pytest.raises(ConfigError) as info:
        load_model(path, registry)
    assert "--" not in str(info.value) and path in str(info.value)


def test_long_values_are_shortened_in_messages(registry: Registry, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_model(write(tmp_path, dict(BASE, num_attention_heads=list(range(10_000)))), registry)
    assert len(str(info.value)) < 400 and "..." in str(info.value)
