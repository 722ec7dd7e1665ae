"""The conformance suite ``pytest --kvpools-conformance=NAME`` runs on an installed plugin.

An architecture plugin is checked from seeds: its presets (and
``--kvpools-conformance-config`` files); every check is one of
:mod:`kvpools_core.testing.conformance`.  A platform plugin is checked on its
own contract against every installed architecture
(:mod:`kvpools_core.testing.platform_conformance`).  Property
checks draw serving options and budgets with hypothesis and shrink a failure
to a case printed as a ``kvpools plan`` command line.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpools_core.models import resolve_model_source
from kvpools_core.pipeline import resolve_platform, resolve_platform_traits
from kvpools_core.registry import Registry
from kvpools_core.testing import conformance as c
from kvpools_core.testing import platform_conformance as pc
from kvpools_core.testing import strategies as s
from kvpools_core.testing.registries import isolated_registry
from kvpools_core.values import PlatformTraits, Serving

LARGE_BUDGET = 80 * s.GiB


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``plugin``: the named architecture plugins; ``platform_plugin``: the named platform plugins.

    A plugin is an architecture when it implements ``parse_model_config`` and a
    platform when it answers ``platforms`` (one plugin may be both); a name
    that is neither, or not loaded, is checked (and failed) as an architecture.
    """
    names = metafunc.config.getoption("kvpools_conformance") or []
    if "plugin" not in metafunc.fixturenames and "platform_plugin" not in metafunc.fixturenames:
        return
    registry = Registry()
    platforms = pc.platform_plugins(registry)
    hooks = {info.name: info.hooks for info in registry.plugins() if info.status == "loaded"}
    if "plugin" in metafunc.fixturenames:
        architectures = [n for n in names if "parse_model_config" in hooks.get(n, ()) or n not in platforms]
        metafunc.parametrize("plugin", architectures)
    if "platform_plugin" in metafunc.fixturenames:
        metafunc.parametrize("platform_plugin", [n for n in names if n in platforms])


@pytest.fixture(scope="session")
def registry() -> Registry:
    return Registry()


@pytest.fixture(scope="session")
def platform(request: pytest.FixtureRequest, registry: Registry) -> tuple[str, PlatformTraits]:
    name = request.config.getoption("kvpools_conformance_platform")
    serving = resolve_platform(Serving(platform=name), registry)
    traits = resolve_platform_traits(serving, registry).traits
    return serving.platform, traits


@pytest.fixture
def own(plugin: str, registry: Registry) -> Registry:
    """The plugin alone (and the core), for what only its own answers may show: claims and declines."""
    if plugin not in {info.name for info in registry.plugins() if info.status == "loaded"}:
        pytest.fail(f"no loaded plugin is named {plugin!r}; `kvpools plugins` lists the installed ones")
    return isolated_registry([plugin], platforms=())


@pytest.fixture
def seeds(plugin: str, registry: Registry, request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    """The plugin's presets and the ``--kvpools-conformance-config`` configs it claims."""
    configs = s.plugin_presets(plugin, registry)
    for path in request.config.getoption("kvpools_conformance_config"):
        config, _, name = resolve_model_source(path, registry)
        configs[name] = dict(config)
    own_registry = isolated_registry([plugin], platforms=())
    claimed = {name: config for name, config in configs.items() if _claims(own_registry, name, config)}
    if not claimed:
        pytest.fail(
            f"plugin {plugin!r} ships no preset and no --kvpools-conformance-config it claims: the suite needs at "
            f"least one config to start from (ship presets with the presets hook, or pass a config.json)."
        )
    return claimed


def _claims(own: Registry, name: str, config: dict[str, Any]) -> bool:
    try:
        return c.parse_alone(own, config, name) is not None
    except Exception:
        return True  # a crash on its own config is reported by test_claims_its_configs


# -- parsing ------------------------------------------------------------------------------


def test_claims_its_configs(plugin: str, own: Registry, seeds: dict[str, dict[str, Any]]) -> None:
    for name, config in seeds.items():
        c.check_claims(plugin, name, config, own)


def test_declines_configs_it_does_not_own(plugin: str, own: Registry, registry: Registry) -> None:
    others = {
        name: config
        for info in registry.plugins()
        if info.name != plugin and info.status == "loaded"
        for name, config in s.plugin_presets(info.name, registry).items()
    }
    for name, config in others.items():
        c.check_declines(plugin, name, config, own)


def test_names_malformed_fields(plugin: str, own: Registry, seeds: dict[str, dict[str, Any]]) -> None:
    for name, config in seeds.items():
        for field in c.MALFORMABLE_FIELDS:
            if field in config:
                c.check_malformed_field(plugin, name, config, field, own)


# -- planning and building --------------------------------------------------------------


def _settings(request: pytest.FixtureRequest) -> settings:
    return settings(
        max_examples=request.config.getoption("kvpools_conformance_examples"),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much],
        derandomize=True,
        database=None,
    )


@functools.cache
def _model(registry: Registry, name: str, text: str) -> Any:
    from kvpools_core.models import parse_config

    return parse_config(json.loads(text), f"preset:{name}", registry)[0]


def _cases(plugin: str, seeds: dict[str, dict[str, Any]], registry: Registry, platform: tuple[str, PlatformTraits]):  # type: ignore[no-untyped-def]
    name, traits = platform

    @st.composite
    def cases(draw: st.DrawFn) -> c.Case:
        preset, config = draw(s.preset_configs(seeds), label="config")
        model = _model(registry, preset, json.dumps(config, sort_keys=True))
        serving = draw(s.servings(model, platform=name, traits=traits), label="serving")
        return c.Case(plugin, preset, config, serving, draw(s.budgets(), label="memory"))

    return cases()


def test_plans_fit_build_exactly_and_grow_with_memory(
    plugin: str, seeds: dict[str, dict[str, Any]], registry: Registry, platform: Any, request: pytest.FixtureRequest
) -> None:
    planned_cases = []

    @_settings(request)
    @given(_cases(plugin, seeds, registry, platform))
    def check(case: c.Case) -> None:
        planned = c.check_plan(case, registry)
        if planned is None:
            return
        planned_cases.append(case)
        c.check_build(case, planned, registry)
        c.check_more_memory(case, planned, registry)

    check()
    if not planned_cases:
        if _seed_cases(plugin, seeds, platform, registry):
            pytest.fail(f"every generated case of {plugin!r} was refused or out of memory: the check proved nothing")
        pytest.skip(f"plugin {plugin!r} refuses every seed config on platform {platform[0]!r}")


def test_a_larger_tp_never_stores_more_per_rank(
    plugin: str, seeds: dict[str, dict[str, Any]], registry: Registry, platform: Any, request: pytest.FixtureRequest
) -> None:
    @_settings(request)
    @given(_cases(plugin, seeds, registry, platform))
    def check(case: c.Case) -> None:
        c.check_tp_monotone(case, s.tp_sizes(c.model_of(case, registry)), registry)

    check()


def _seed_cases(
    plugin: str, seeds: dict[str, dict[str, Any]], platform: tuple[str, PlatformTraits], registry: Registry
) -> list[c.Case]:
    """Each seed at the first page size the platform and the plugin accept (none: the seed is left out)."""
    name, traits = platform
    cases = []
    for preset, config in seeds.items():
        for page in s.page_sizes(traits):
            case = c.Case(plugin, preset, config, Serving(platform=name, page_size=page), LARGE_BUDGET)
            if c.check_plan(case, registry) is not None:
                cases.append(case)
                break
    return cases


def test_unified_memory_arenas_keep_the_contract(
    plugin: str, seeds: dict[str, dict[str, Any]], registry: Registry, platform: Any
) -> None:
    """A plugin that names ``"unified_memory"`` (``engine_features``) plans each seed under
    ``--enable-unified-memory`` as one arena that keeps the contract (:func:`check_arenas`) and builds it on
    ``meta`` to the planned byte (:func:`check_build`), or refuses it."""
    features = {
        arch
        for _, answer in registry.call_collect("engine_features")
        for arch, f in answer.items()
        if "unified_memory" in f
    }
    cases = [
        attrs.evolve(case, serving=attrs.evolve(case.serving, enable_unified_memory=True))
        for case in _seed_cases(plugin, seeds, platform, registry)
        if c.model_of(case, registry).architecture in features
    ]
    if not cases:
        pytest.skip(f"plugin {plugin!r} names no unified-memory architecture among its seeds")
    for case in cases:
        planned = c.check_plan(case, registry)
        if planned is None:
            continue
        if not planned.sizing.arenas:
            raise case.fail("--enable-unified-memory was planned without an arena")
        c.check_build(case, planned, registry)


def test_honours_the_kv_dtype_and_tp(
    plugin: str, seeds: dict[str, dict[str, Any]], registry: Registry, platform: Any
) -> None:
    for case in _seed_cases(plugin, seeds, platform, registry):
        c.check_honours_kv_dtype_and_tp(case, registry)


def test_fills_a_large_budget(plugin: str, seeds: dict[str, dict[str, Any]], registry: Registry, platform: Any) -> None:
    for case in _seed_cases(plugin, seeds, platform, registry):
        for page in (case.serving.page_size, *[p for p in (64, 256) if p in s.page_sizes(platform[1])]):
            c.check_fills_a_large_budget(
                attrs.evolve(case, serving=attrs.evolve(case.serving, page_size=page)), registry
            )


def test_seed_configs_exist_on_disk_for_replay(
    plugin: str, seeds: dict[str, dict[str, Any]], platform: Any, registry: Registry
) -> None:
    """Every case can be replayed: its config is written where the printed command line points."""
    for case in _seed_cases(plugin, seeds, platform, registry):
        assert Path(case.config_path()).is_file()


# -- platform plugins ---------------------------------------------------------------------


@pytest.fixture
def provided(platform_plugin: str, registry: Registry) -> list[str]:
    """The platforms the plugin provides, checked to be named and described consistently."""
    return pc.check_names_its_platforms(platform_plugin, registry)


def test_platform_accelerators_are_well_formed(platform_plugin: str, provided: list[str], registry: Registry) -> None:
    pc.check_accelerators(platform_plugin, registry)


def test_platform_traits_leave_a_page_for_every_model_and_kernel(
    platform_plugin: str, provided: list[str], registry: Registry
) -> None:
    for name in provided:
        pc.check_traits_leave_a_page(platform_plugin, name, registry)


def test_platform_quantization_traits_name_methods_it_refuses(
    platform_plugin: str, provided: list[str], registry: Registry
) -> None:
    for name in provided:
        pc.check_quantization_traits(platform_plugin, name, registry)


def test_platform_answers_only_for_its_own_platforms(platform_plugin: str, registry: Registry) -> None:
    pc.check_answers_only_for_its_platforms(platform_plugin, registry)


def test_every_architecture_plans_and_builds_exactly_on_the_platform(
    platform_plugin: str, provided: list[str], registry: Registry
) -> None:
    for name in provided:
        traits = pc.check_traits_leave_a_page(platform_plugin, name, registry)
        built = pc.check_architectures_plan_and_build(
            platform_plugin, name, traits, registry, kv_dtypes=("auto", "fp8_e4m3")
        )
        if not built:
            pytest.fail(f"no installed architecture's preset plans on platform {name!r}: the check proved nothing")


def test_planning_for_the_platform_imports_no_torch(
    platform_plugin: str, provided: list[str], registry: Registry
) -> None:
    for name in provided:
        pc.check_plans_without_torch(platform_plugin, name, pc.resolved_traits(name, registry))
