"""The plugin authors' kit proves what it claims: a sound toy plugin passes every check, and each
deliberately broken variant of it fails the check written for that defect.

The toy (``model_type: toy-kit``) composes the core's parts like a real plugin;
each defect is one line of difference, so a check that stopped catching its
defect fails here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import attrs
import pytest

from kvpools_core import hookimpl
from kvpools_core.config import ConfigReader
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.attention import attention_cell_size
from kvpools_core.parts.sizing import default_size_pools
from kvpools_core.registry import Registry
from kvpools_core.testing import conformance as c
from kvpools_core.testing.registries import FakeDeviceMemory, isolated_registry, plan_and_build
from kvpools_core.testing.strategies import tp_sizes
from kvpools_core.values import Budget, CellSize, LayerSpec, ModelSpec, PoolSizing, Serving

GiB = 1 << 30
CONFIG = {
    "model_type": "toy-kit",
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 8192,
}
FOREIGN = {"model_type": "llama", "num_hidden_layers": 2}


class Toy:
    """A small GQA architecture plugin; ``defect`` breaks exactly one invariant."""

    def __init__(self, defect: str | None = None) -> None:
        self.defect = defect

    @hookimpl
    def parse_model_config(self, config: Mapping[str, Any], source: str) -> ModelSpec | None:
        if config.get("model_type") != "toy-kit":
            if self.defect == "crashes_on_foreign":
                return ModelSpec(
                    name=source, architecture="toy-kit", layers=config["layers"], context_len=1, dtype="bf16"
                )
            if self.defect != "claims_foreign":
                return None
            config = CONFIG
        reader = ConfigReader(config, source)
        if self.defect == "raw_int":
            num_layers = int(config["num_hidden_layers"])
        else:
            num_layers = reader.integer("num_hidden_layers")
        kv_heads, head_dim = reader.integer("num_key_value_heads"), reader.integer("head_dim")
        layers = [
            LayerSpec(index=i, kind="attention", num_kv_heads=kv_heads, head_dim=head_dim) for i in range(num_layers)
        ]
        return ModelSpec(
            name=source,
            architecture="toy-kit",
            layers=layers,
            context_len=reader.integer("max_position_embeddings"),
            dtype="bfloat16",
            num_attention_heads=reader.integer("num_attention_heads"),
        )

    @hookimpl
    def validate(self, model: ModelSpec, serving: Serving) -> list[str] | None:
        if model.architecture == "toy-kit" and self.defect == "mute_refusal" and serving.page_size == 16:
            return ["this toy does not like that"]
        return None

    @hookimpl
    def estimate_cell_size(self, model: ModelSpec, serving: Serving) -> CellSize | None:
        if model.architecture != "toy-kit":
            return None
        tp = serving.tp_size
        if self.defect == "ignores_dtype":
            serving = attrs.evolve(serving, kv_cache_dtype="bf16")
        if self.defect in ("ignores_tp", "tp_grows"):
            serving = attrs.evolve(serving, tp_size=1, dp_size=1, enable_dp_attention=False)
        start, end = rank_layer_range(model, serving)
        cell = attention_cell_size(model.layers[start:end], model, serving)
        if self.defect == "tp_grows":
            parts = [attrs.evolve(p, bytes_per_token=p.bytes_per_token * tp) for p in cell.parts]
            return attrs.evolve(cell, parts=parts)
        return cell

    @hookimpl
    def size_pools(self, model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing | None:
        if model.architecture != "toy-kit":
            return None
        if self.defect == "over_budget":
            budget = attrs.evolve(budget, budget_bytes=budget.budget_bytes * 2)
        if self.defect == "half_budget":
            budget = attrs.evolve(budget, budget_bytes=budget.budget_bytes // 2)
        if self.defect == "shrinks_with_memory" and budget.budget_bytes > 6 * GiB:
            budget = attrs.evolve(budget, budget_bytes=budget.budget_bytes // 4)
        sizing = default_size_pools(model, serving, cell, budget, owner="toy")
        if self.defect == "misaligned":
            sizing = attrs.evolve(sizing, max_total_num_tokens=sizing.max_total_num_tokens - 1)
        return sizing

    @hookimpl
    def build_pool(self, plan: Any, device: str, layout: Any) -> Any | None:
        if plan.model.architecture != "toy-kit":
            return None
        from kvpools_core.pools.mha import MHATokenToKVPool

        if self.defect == "short_build":
            sizing = attrs.evolve(plan.sizing, max_total_num_tokens=plan.max_total_num_tokens - plan.serving.page_size)
            plan = attrs.evolve(plan, sizing=sizing)
        return MHATokenToKVPool.from_plan(plan, device, layout=layout)


@pytest.fixture(autouse=True)
def _serving_cpu_has_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy plans on the ``cpu`` platform, whose fp8 KV needs Intel AMX on the serving host: pin the answer,
    so the fp8 cases plan (and the dtype check has something to catch) on every machine that runs this."""
    monkeypatch.setenv("KVPOOLS_CPU_AMX", "1")


def registry_of(toy: Toy) -> Registry:
    return isolated_registry(["speculative"], objects={"toy": toy})


def case(tp: int = 1, page: int = 16, memory: int = 4 * GiB, **serving: Any) -> c.Case:
    return c.Case("toy", "toy-kit", CONFIG, Serving(platform="cpu", tp_size=tp, page_size=page, **serving), memory)


def run_all_checks(toy: Toy) -> None:
    """Every check the suite runs, on the toy's config, a few serving options and budgets."""
    registry = registry_of(toy)
    own = isolated_registry([], platforms=(), objects={"toy": toy})
    c.check_claims("toy", "toy-kit", CONFIG, own)
    c.check_declines("toy", "llama-ish", FOREIGN, own)
    for field in c.MALFORMABLE_FIELDS:
        if field in CONFIG:
            c.check_malformed_field("toy", "toy-kit", CONFIG, field, own)
    for each in (case(), case(tp=2), case(page=64, memory=8 * GiB), case(kv_cache_dtype="fp8_e4m3")):
        planned = c.check_plan(each, registry)
        assert planned is not None
        c.check_build(each, planned, registry)
        c.check_more_memory(each, planned, registry)
        c.check_tp_monotone(each, tp_sizes(c.model_of(each, registry)), registry)
    c.check_honours_kv_dtype_and_tp(case(memory=80 * GiB), registry)
    c.check_fills_a_large_budget(case(memory=80 * GiB), registry)


def test_a_sound_plugin_passes_every_check() -> None:
    run_all_checks(Toy())


def _parse_checks(toy: Toy) -> None:
    own = isolated_registry([], platforms=(), objects={"toy": toy})
    c.check_claims("toy", "toy-kit", CONFIG, own)
    c.check_declines("toy", "llama-ish", FOREIGN, own)
    for field in c.MALFORMABLE_FIELDS:
        if field in CONFIG:
            c.check_malformed_field("toy", "toy-kit", CONFIG, field, own)


def _plan_checks(toy: Toy) -> None:
    registry = registry_of(toy)
    for each in (case(), case(page=64, memory=8 * GiB)):
        planned = c.check_plan(each, registry)
        if planned is not None:
            c.check_build(each, planned, registry)
            c.check_more_memory(each, planned, registry)


def _tp_check(toy: Toy) -> None:
    registry = registry_of(toy)
    c.check_tp_monotone(case(), tp_sizes(c.model_of(case(), registry)), registry)


def _honours_check(toy: Toy) -> None:
    c.check_honours_kv_dtype_and_tp(case(memory=80 * GiB), registry_of(toy))


def _fill_check(toy: Toy) -> None:
    c.check_fills_a_large_budget(case(memory=80 * GiB), registry_of(toy))


@pytest.mark.parametrize(
    ("defect", "check", "caught"),
    [
        ("claims_foreign", _parse_checks, "claims 'llama-ish', a config another plugin owns"),
        ("crashes_on_foreign", _parse_checks, "crashed on 'llama-ish'"),
        ("raw_int", _parse_checks, "raised PluginHookError.*ValueError: invalid literal"),
        ("mute_refusal", _plan_checks, "a refusal names no serving option"),
        ("over_budget", _plan_checks, "over its"),
        ("misaligned", _plan_checks, "not whole pages"),
        ("short_build", _plan_checks, r"build\(plan, 'meta'\) failed: PoolPlanMismatchError"),
        ("shrinks_with_memory", _plan_checks, "twice the memory gives fewer"),
        ("tp_grows", _tp_check, "more than TP 1"),
        ("ignores_dtype", _honours_check, "ignores the kv dtype silently"),
        ("ignores_tp", _honours_check, "ignores TP silently"),
        ("half_budget", _fill_check, "is not maximal"),
    ],
)
def test_each_defect_is_caught_by_its_check(defect: str, check: Any, caught: str) -> None:
    check(Toy())  # the sound toy passes the same check
    with pytest.raises(c.ConformanceFailure, match=caught) as failure:
        check(Toy(defect))
    assert "plugin 'toy'" in str(failure.value)


def test_a_failure_prints_a_command_line_that_replays_it(tmp_path: Any) -> None:
    with pytest.raises(c.ConformanceFailure) as failure:
        run_all_checks(Toy("over_budget"))
    line = next(text for text in str(failure.value).splitlines() if "reproduce:" in text).split("reproduce: ")[1]
    assert line.startswith("kvpools plan ") and "--memory 4294967296" in line and "--page-size 16" in line
    config_path = line.split()[2]
    assert os.path.isfile(config_path)


def test_the_fixtures_helpers() -> None:
    registry = isolated_registry(["mha"], objects={"fake": FakeDeviceMemory("fakedev", free=8 * GiB)})
    loaded = {info.name for info in registry.plugins() if info.status == "loaded"}
    assert loaded == {"core", "mha", "cpu", "fake"}  # nothing else autoloads
    from kvpools_core.pipeline import measure_free_bytes

    assert measure_free_bytes("fakedev:0", Serving(), registry) == (8 * GiB, ("fake",))
    planned, pools = plan_and_build("llama-3.1-8b", Serving(platform="cpu"), memory="2GiB", registry=registry)
    assert pools.allocated_bytes == planned.planned_bytes


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KVPOOLS_", "PYTEST_"))}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=os.path.dirname(__file__),
    )


def test_the_suite_runs_from_the_command_line() -> None:
    out = _pytest("--kvpools-conformance=mha", "--kvpools-conformance-examples=2")  # the nox session runs 25
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "8 passed" in out.stdout
    verbose = _pytest("--kvpools-conformance=mha", "--kvpools-conformance-examples=1", "-v", "--co")
    assert "kvpools conformance: mha on platform cpu" in verbose.stdout


def test_no_kvpools_turns_the_plugin_off() -> None:
    out = _pytest("-p", "no:kvpools", "--kvpools-conformance=mha")
    assert out.returncode != 0
    assert "unrecognized arguments: --kvpools-conformance" in out.stderr


def test_an_unknown_plugin_is_named() -> None:
    out = _pytest("--kvpools-conformance=no-such-plugin", "--kvpools-conformance-examples=1")
    assert out.returncode != 0
    assert "no loaded plugin is named 'no-such-plugin'" in out.stdout
