"""The Python API under careless use: errors name the Python argument (not a CLI flag) and the fix."""

from __future__ import annotations

import types

import pytest

from kvpools_core import Registry, Serving, hookimpl, plan
from kvpools_core.errors import ConfigError, InsufficientMemoryError, PluginConflictError, UnsupportedCombinationError
from kvpools_core.options import cli_surface, option
from kvpools_core.units import parse_bytes

GiB = 1 << 30


def test_option_names_follow_the_surface() -> None:
    assert option("tp_size") == "tp_size"
    assert option("draft_model") == "draft_model"
    with cli_surface():
        assert option("tp_size") == "--tp-size"
        assert option("draft_model") == "--speculative-draft-model-path"
        assert option("plugin_options") == "--plugin-option"
    assert option("tp_size") == "tp_size"  # restored on exit


def test_api_errors_name_python_arguments() -> None:
    with pytest.raises(ConfigError, match=r"^tp_size must be a positive integer, got 0\.$"):
        Serving(tp_size=0)
    with pytest.raises(ConfigError) as error:
        plan("llama-3.1-8b", memory="10GiB", weights_memory="1GiB")
    assert "weights_memory" in str(error.value) and "--" not in str(error.value)


def test_values_built_by_plugins_name_their_class_not_a_flag() -> None:
    from kvpools_core import CellPart, InvalidValueError, LayerSpec

    with pytest.raises(InvalidValueError, match=r"CellPart\.bytes_per_token must be a non-negative integer"):
        CellPart("kv", -1)
    with pytest.raises(InvalidValueError, match=r"LayerSpec\.num_kv_heads"):
        LayerSpec(index=0, kind="attention", num_kv_heads=-2)


def test_an_invalid_value_built_inside_a_plugin_names_the_plugin() -> None:
    """A plugin whose arithmetic goes negative: blamed on it, not passed off as the user's config error."""
    from kvpools_core import CellPart, CellSize, PluginResultError

    def estimate_cell_size(model: object, serving: object) -> CellSize:
        return CellSize(parts=[CellPart("kv", -64)], sglang_bytes_per_token=64, num_layers=1)

    first = hookimpl(tryfirst=True)(estimate_cell_size)
    registry = Registry(extra_plugins={"negative": _plugin(estimate_cell_size=first)})
    with pytest.raises(PluginResultError, match=r'Plugin "negative".*estimate_cell_size.*CellPart\.bytes_per_token'):
        plan("llama-3.1-8b", memory="1GiB", registry=registry)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1.5e9, 1_500_000_000), (2.0, 2), (1024, 1024), ("1.5GiB", 3 * (1 << 29)), ("80G", 80 << 30)],
)
def test_sizes_accept_ints_floats_and_units(value: object, expected: int) -> None:
    assert parse_bytes(value, "memory") == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1, "-3GiB", [1], None, True, "1e30", 2**70])
def test_bad_sizes_name_the_argument(value: object) -> None:
    with pytest.raises(ConfigError, match=r"^memory "):
        parse_bytes(value, "memory")  # type: ignore[arg-type]


def test_a_float_memory_plans() -> None:
    assert plan("llama-3.1-8b", memory=1.5e9).budget.budget_bytes == 1_500_000_000


def test_serving_must_be_a_serving() -> None:
    with pytest.raises(ConfigError, match="Serving"):
        plan("llama-3.1-8b", {"tp_size": 2}, memory="1GiB")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# heads that attention TP cannot split
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preset", "serving", "ok"),
    [
        ("llama-3.1-8b", Serving(tp_size=3), False),  # 32 query heads
        ("llama-3.1-8b", Serving(tp_size=16), True),  # 8 KV heads replicated to 16 ranks
        ("llama-3.1-70b", Serving(tp_size=16), True),
        ("llama-3.1-70b", Serving(tp_size=8, dp_size=8, enable_dp_attention=True), True),  # attention TP 1
        ("qwen3-8b", Serving(tp_size=32), True),  # 32 heads, 8 KV heads replicated 4x
        ("deepseek-v3", Serving(tp_size=6), False),  # 128 query heads
        ("deepseek-v3", Serving(tp_size=32), True),  # one latent row, not sharded
        ("gpt-oss-20b", Serving(tp_size=3), False),
    ],
)
def test_attention_tp_must_split_the_heads(preset: str, serving: Serving, ok: bool) -> None:
    if ok:
        plan(preset, serving, memory="60GiB")
        return
    with pytest.raises(UnsupportedCombinationError, match=rf"tp_size {serving.tp_size} cannot split"):
        plan(preset, serving, memory="60GiB")


def test_kv_heads_neither_split_nor_replicated() -> None:
    """12 KV heads over attention TP 8: 12 % 8 and 8 % 12 are both non-zero (48 query heads divide)."""
    from kvpools_core import LayerSpec, ModelSpec

    model = ModelSpec(
        name="odd-kv",
        architecture="mha",
        layers=[LayerSpec(index=i, kind="attention", num_kv_heads=12, head_dim=64) for i in range(2)],
        context_len=1024,
        dtype="bfloat16",
        num_attention_heads=48,
    )
    with pytest.raises(UnsupportedCombinationError, match="neither split nor replicate the 12 KV heads"):
        plan(model, Serving(tp_size=8), memory="1GiB")
    plan(model, Serving(tp_size=4), memory="1GiB")


# ---------------------------------------------------------------------------
# budgets
# ---------------------------------------------------------------------------


def test_weights_beyond_free_memory_give_advice_that_can_be_followed() -> None:
    with pytest.raises(InsufficientMemoryError) as error:
        plan("llama-3.1-8b", free_memory="80GiB", weights_memory="81GiB")
    message = str(error.value)
    assert "no mem_fraction_static can" in message and "above 1" not in message


def test_a_fraction_that_works_is_suggested_and_does_work() -> None:
    with pytest.raises(InsufficientMemoryError, match=r"above 0\.99") as error:
        plan("llama-3.1-8b", free_memory="80GiB", weights_memory="79.5GiB")
    suggested = float(str(error.value).split("above ")[1].split(" ")[0])
    assert suggested < 1
    plan("llama-3.1-8b", Serving(mem_fraction_static=suggested), free_memory="80GiB", weights_memory="79.5GiB")


def test_the_suggested_fraction_counts_the_reservation() -> None:
    with pytest.raises(InsufficientMemoryError) as error:
        plan("llama-3.1-8b", free_memory="80GiB", weights_memory="70GiB", reserved_memory="9.5GiB")
    suggested = float(str(error.value).split("above ")[1].split(" ")[0])
    assert "and the reservations" in str(error.value)
    kwargs = {"free_memory": "80GiB", "weights_memory": "70GiB", "reserved_memory": "9.5GiB"}
    plan("llama-3.1-8b", Serving(mem_fraction_static=suggested), **kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# platforms and plugin options are declared, not guessed
# ---------------------------------------------------------------------------


def test_unknown_platform_lists_the_installed_ones() -> None:
    with pytest.raises(ConfigError, match=r"Unknown platform 'tpu'.*cpu, cuda"):
        plan("llama-3.1-8b", Serving(platform="tpu"), memory="1GiB")


def _plugin(**hooks: object) -> types.SimpleNamespace:
    """An in-process plugin; plain functions become hook implementations, marked ones stay as marked."""
    return types.SimpleNamespace(
        **{name: fn if hasattr(fn, "kvpools_impl") else hookimpl(fn) for name, fn in hooks.items()}
    )


def test_a_platform_plugin_makes_its_platform_known() -> None:
    registry = Registry(extra_plugins={"tpu_vendor": _plugin(platforms=lambda: {"tpu": "a vendor's TPU"})})
    assert plan("llama-3.1-8b", Serving(platform="tpu"), memory="1GiB", registry=registry).serving.platform == "tpu"


def test_two_providers_of_one_platform_conflict() -> None:
    registry = Registry(extra_plugins={"cuda_clone": _plugin(platforms=lambda: {"cuda": "another CUDA"})})
    with pytest.raises(PluginConflictError, match=r"'cuda' comes from two plugins"):
        plan("llama-3.1-8b", memory="1GiB", registry=registry)


def test_two_plugins_declaring_one_option_conflict() -> None:
    declares = {"tuner.level": "how hard to tune"}
    twins = {name: _plugin(plugin_options=lambda: declares) for name in ("tuner", "tuner2")}
    registry = Registry(extra_plugins=twins)
    with pytest.raises(PluginConflictError, match=r"Plugin option 'tuner\.level' comes from two plugins"):
        plan("llama-3.1-8b", Serving(plugin_options={"tuner.level": "1"}), memory="1GiB", registry=registry)


def test_plugin_options_must_be_declared() -> None:
    registry = Registry(extra_plugins={"tuner": _plugin(plugin_options=lambda: {"tuner.level": "how hard to tune"})})
    plan("llama-3.1-8b", Serving(plugin_options={"tuner.level": "3"}), memory="1GiB", registry=registry)
    with pytest.raises(ConfigError, match=r"'tuner\.levle'.*tuner\.level \(tuner\)"):
        plan("llama-3.1-8b", Serving(plugin_options={"tuner.levle": "3"}), memory="1GiB", registry=registry)


# ---------------------------------------------------------------------------
# plans that start but cannot serve what was asked
# ---------------------------------------------------------------------------


def test_unreachable_context_is_noted() -> None:
    result = plan("llama-3.1-8b", Serving(context_length=10_000_000), memory="1GiB")
    assert any("no request can reach its full context" in note for note in result.sizing.notes)
    assert not any("reach" in note for note in plan("llama-3.1-8b", memory="60GiB").sizing.notes)


def test_max_running_requests_below_the_dp_width() -> None:
    with pytest.raises(ConfigError, match=r"max_running_requests 4 is split over 8 DP-attention workers"):
        Serving(tp_size=8, dp_size=8, enable_dp_attention=True, max_running_requests=4)
    Serving(tp_size=8, dp_size=8, enable_dp_attention=True, max_running_requests=8)
    Serving(tp_size=8, dp_size=8, max_running_requests=4)  # no DP attention: no split
