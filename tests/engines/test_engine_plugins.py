"""Engines as a plugin axis (issue 35): the ``engine_accountings`` and ``engine_layer_specs`` hooks, the built-in
engines found through their entry points, the toy engine distribution (``tests/engines/toy``, installed as its own
distribution by the nox ``tests`` session), and the conformance kit's engine suite checking engines' answers."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from click.testing import CliRunner

import kvpools_core.engines as engines_module
from kvpools_core import hookimpl
from kvpools_core.cli import main
from kvpools_core.engines import Engine, EngineCapacity, accountings, engine_for, engines
from kvpools_core.engines.trtllm import ENGINE as TRTLLM
from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.errors import (
    ConfigError,
    KvpoolsError,
    PluginConflictError,
    PluginResultError,
    UnsupportedCombinationError,
)
from kvpools_core.models import load_model
from kvpools_core.parts.trtllm import TrtllmLayer
from kvpools_core.registry import Registry, get_registry
from kvpools_core.testing import engine_suite
from kvpools_core.values import Serving

GiB = 1 << 30
LLAMA8B_PER_TOKEN = 2 * 8 * 128 * 2 * 32
"""llama-3.1-8b: K and V x 8 KV heads x head_dim 128 x 2 B (bf16) x 32 layers = 131,072 B per token."""


def _toy_installed() -> bool:
    return "toy" in accountings()


needs_toy = pytest.mark.skipif(
    not _toy_installed(), reason="the toy engine distribution (tests/engines/toy) is not installed"
)


def test_builtin_engines_are_entry_points_found_through_the_hook() -> None:
    """No list of engines inside the core: each built-in is a kvpools entry point answering engine_accountings."""
    assert not hasattr(engines_module, "BUILTIN_ENGINES")
    registry = get_registry()
    found = engines(registry)
    for name in ("sglang", "vllm", "trtllm"):
        info = registry.plugin(name)
        assert (info.status, info.module, info.distribution) == ("loaded", f"kvpools_core.engines.{name}", "kvpools")
        assert "engine_accountings" in info.hooks
        assert found[name].name == name
    assert {mode: accountings()[mode].name for mode in ("exact", "sglang", "vllm", "trtllm")} == {
        "exact": "sglang",
        "sglang": "sglang",
        "vllm": "vllm",
        "trtllm": "trtllm",
    }


def test_unknown_accounting_names_the_installed_ones() -> None:
    with pytest.raises(ConfigError, match=r"'lmdeploy' is not an accounting of the installed engines \(") as caught:
        engine_for("lmdeploy")
    message = str(caught.value)
    assert "(exact, sglang, " in message and "trtllm, vllm)" in message
    assert "no installed distribution provides it" in message


def test_a_kept_out_builtin_engine_is_named_with_its_plugin() -> None:
    registry = Registry(disabled=["trtllm"])
    assert "trtllm" not in accountings(registry)
    with pytest.raises(ConfigError, match="kvpools' own engine plugin 'trtllm' \\(distribution kvpools\\)") as caught:
        engine_for("trtllm", registry)
    assert 'Disabled by Registry(disabled=...): "trtllm" (kvpools' in str(caught.value)


def _engine(name: str, modes: tuple[str, ...]) -> Engine:
    return attrs.evolve(TRTLLM, name=name, accountings=modes, distribution="kvpools-test")


class _SameAccounting:
    @hookimpl
    def engine_accountings(self) -> list[Engine]:
        return [_engine("other", ("trtllm",))]


class _NotAnEngine:
    @hookimpl
    def engine_accountings(self) -> list[Any]:
        return ["trtllm"]


def test_two_engines_answering_one_accounting_conflict() -> None:
    registry = Registry(extra_plugins={"same_accounting": _SameAccounting()})
    with pytest.raises(PluginConflictError, match="Accounting 'trtllm' comes from two engine plugins") as caught:
        engines(registry)
    assert '"trtllm" (kvpools' in str(caught.value) and '"same_accounting" (<in-process>' in str(caught.value)


def test_an_answer_that_is_not_an_engine_is_blamed_on_its_plugin() -> None:
    registry = Registry(extra_plugins={"not_an_engine": _NotAnEngine()})
    with pytest.raises(PluginResultError, match="not_an_engine"):
        engines(registry)


@pytest.mark.parametrize("bad", ["Two Words", "", "UPPER"])
def test_serving_accounting_is_a_lower_case_name(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"Serving\.accounting must be a lower-case accounting name"):
        Serving(accounting=bad)


# -- engine_layer_specs: TensorRT-LLM's per-layer answer from the architecture plugins --------------------------


def test_trtllm_layers_come_from_the_architecture_plugins() -> None:
    """mha answers llama-3.1-8b's 32 layers (8 KV heads, head 128, K and V); mla answers DeepSeek-V3's latent row
    (kv_lora_rank 512 + qk_rope_head_dim 64, one head, K only); swa keeps gpt-oss's sliding windows (128)."""
    registry = get_registry()
    llama, _ = load_model("llama-3.1-8b", registry)
    answer, shaped = registry.call("engine_layer_specs", engine="trtllm", model=llama, serving=Serving())
    assert shaped == ("mha",)
    assert answer[0] == TrtllmLayer(index=0, num_kv_heads=8, head_dim=128, kv_factor=2) and len(answer) == 32
    deepseek, _ = load_model("deepseek-v3", registry)
    answer, shaped = registry.call("engine_layer_specs", engine="trtllm", model=deepseek, serving=Serving())
    assert shaped == ("mla",) and answer[0] == TrtllmLayer(index=0, num_kv_heads=1, head_dim=576, kv_factor=1)
    gpt_oss, _ = load_model("gpt-oss-20b", registry)
    answer, shaped = registry.call("engine_layer_specs", engine="trtllm", model=gpt_oss, serving=Serving())
    assert shaped == ("swa",) and {layer.sliding_window for layer in answer} == {None, 128}
    # other engines' names are declined by the built-ins
    assert registry.call("engine_layer_specs", engine="nobody", model=llama, serving=Serving())[0] is None


class _HalfHeads:
    """A third-party architecture plugin answering TensorRT-LLM's hook for a model it claims (here: llama)."""

    @hookimpl
    def engine_layer_specs(self, engine: str, model: Any) -> tuple[TrtllmLayer, ...] | None:
        if engine != "trtllm" or model.name != "llama-3.1-8b":
            return None
        return tuple(
            TrtllmLayer(index=layer.index, num_kv_heads=4, head_dim=128, kv_factor=2) for layer in model.layers
        )


def test_a_third_party_plugin_answers_trtllm_per_layer() -> None:
    """An out-of-tree answer is what the engine sizes: half the KV heads doubles the tokens the budget holds."""
    ours = plan_trtllm("llama-3.1-8b", Serving(), memory="20GiB")
    theirs = plan_trtllm(
        "llama-3.1-8b", Serving(), memory="20GiB", registry=Registry(extra_plugins={"half": _HalfHeads()})
    )
    assert ours.ranks[0].cache_bytes_per_token == LLAMA8B_PER_TOKEN
    assert theirs.ranks[0].cache_bytes_per_token == LLAMA8B_PER_TOKEN // 2


class _WrongValues:
    @hookimpl
    def engine_layer_specs(self, engine: str) -> list[str] | None:
        return ["layer"] if engine == "trtllm" else None


def test_wrong_per_layer_values_are_blamed_on_the_plugin() -> None:
    registry = Registry(extra_plugins={"wrong": _WrongValues()})
    with pytest.raises(PluginResultError, match=r'"wrong" \(<in-process> -\) answered engine_layer_specs'):
        plan_trtllm("llama-3.1-8b", Serving(), memory="20GiB", registry=registry)


def test_no_answer_is_refused_naming_the_answerers() -> None:
    spec, _ = load_model("llama-3.1-8b", get_registry())
    custom = attrs.evolve(spec, architecture="custom")
    with pytest.raises(UnsupportedCombinationError, match=r"architecture \('custom'\) for --accounting trtllm yet"):
        plan_trtllm(custom, Serving(), memory="20GiB")


# -- the conformance kit's engine suite -------------------------------------------------------------------------


def test_suite_fails_an_engine_raising_an_unnamed_error() -> None:
    def plan(model: Any, serving: Any, *, memory: int, registry: Any = None) -> Any:
        raise ZeroDivisionError("oops")

    broken = attrs.evolve(TRTLLM, plan=plan)
    spec, _ = load_model("llama-3.1-8b", get_registry())
    with pytest.raises(pytest.fail.Exception, match=r"raised ZeroDivisionError .* must be a kvpools_core"):
        engine_suite.plan_capacity(broken, "trtllm", spec, GiB, get_registry())


def _answering(summary: Any) -> Engine:
    def plan(model: Any, serving: Any, *, memory: int, registry: Any = None) -> Any:
        if memory < 1024:
            raise ConfigError("too small")
        return memory

    return attrs.evolve(TRTLLM, plan=plan, capacity=summary)


def test_suite_fails_an_engine_over_its_budget() -> None:
    over = _answering(
        lambda m: EngineCapacity(engine="trtllm", accounting="trtllm", budget_bytes=m, kv_bytes=m + 1, max_tokens=1)
    )
    spec, _ = load_model("llama-3.1-8b", get_registry())
    with pytest.raises(AssertionError, match="over its budget"):
        engine_suite.test_budget_ladder(over, "trtllm", {"llama": spec}, get_registry())


def test_suite_fails_an_engine_holding_fewer_tokens_with_more_memory() -> None:
    shrinking = _answering(
        lambda m: EngineCapacity(
            engine="trtllm", accounting="trtllm", budget_bytes=m, kv_bytes=m, max_tokens=10**15 // m
        )
    )
    spec, _ = load_model("llama-3.1-8b", get_registry())
    with pytest.raises(AssertionError, match="fewer than"):
        engine_suite.test_budget_ladder(shrinking, "trtllm", {"llama": spec}, get_registry())


def test_suite_passes_the_builtin_engines_in_process() -> None:
    registry = get_registry()
    seeds = {"llama-3.1-8b": load_model("llama-3.1-8b", registry)[0]}
    for engine in engines(registry).values():
        for mode in engine.accountings:
            engine_suite.test_budget_ladder(engine, mode, seeds, registry)


# -- the toy engine distribution: a third party adds an engine -------------------------------------------------


@needs_toy
def test_toy_engine_plans_by_hand() -> None:
    """10 GiB x cache_max_entry_count 0.8 = 8,589,934,592 B; a 64-token block of llama-3.1-8b is 64 x 131,072 =
    8,388,608 B: 1,024 blocks, 65,536 tokens."""
    toy = engine_for("toy")
    assert (
        toy.distribution == "kvpools-toy-engine"
        and get_registry().plugin("toy_engine").distribution == toy.distribution
    )
    spec, _ = load_model("llama-3.1-8b", get_registry())
    summary = toy.capacity(toy.plan(spec, Serving(accounting="toy"), memory="10GiB"))
    assert (summary.budget_bytes, summary.kv_bytes, summary.max_tokens) == (
        8_589_934_592,
        1024 * 64 * LLAMA8B_PER_TOKEN,
        65_536,
    )
    with pytest.raises(KvpoolsError, match="kvpools-toy-engine does not model deepseek-v3"):
        toy.plan(load_model("deepseek-v3", get_registry())[0], Serving(accounting="toy"), memory="10GiB")


@needs_toy
def test_toy_engine_on_the_command_line() -> None:
    shown = CliRunner().invoke(main, ["plan", "llama-3.1-8b", "--accounting", "TOY", "--memory", "10GiB"])
    assert shown.exit_code == 0, shown.output
    assert "max tokens:  65,536" in shown.output
    refused = CliRunner().invoke(main, ["plan", "llama-3.1-8b", "--accounting", "toy", "--gpu", "h100"])
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert (
        "kvpools plans it from --memory SIZE (its KV budget per rank) alone" in refused.output
        and "got --gpu" in refused.output
    )


def test_unknown_accounting_on_the_command_line() -> None:
    shown = CliRunner().invoke(
        main,
        [
            "plan",
            "llama-3.1-8b",
            "--accounting",
            "lmdeploy",
            "--memory",
            "10GiB",
        ],
    )
    assert shown.exit_code == 1 and "Traceback" not in shown.output
    assert "--accounting 'lmdeploy' is not an accounting of the installed engines" in shown.output
