"""Every built-in plugin can be switched off alone, and each architecture works alone.

For each built-in plugin P, one fresh process runs with ``KVPOOLS_DISABLED_PLUGINS=P``:
importing and ``get_registry()`` work; every preset P does not ship plans exactly as
with all plugins (the whole ``Plan.to_json()``, provenance included) and builds on
``meta`` to the plan's bytes; P's own configs (by path: with P disabled they are no
presets) are refused with the "no architecture plugin recognises" error.  The converse,
``KVPOOLS_DISABLE_PLUGIN_AUTOLOAD=1 KVPOOLS_PLUGINS=P,cpu``, plans and builds P's
presets by path exactly as the full registry does, but for provenance: mla works
without dsa, swa without dsa and mla, mamba without mha and mla.  Each process plans
every case it needs in one go and prints JSON (``SCRIPT``); the processes run two at a
time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from kvpools_core import Registry
from kvpools_core.models import registry_presets

ARCHITECTURES = ("mha", "mla", "dsa", "minimax_sparse", "mamba", "swa", "dsv4")
PLATFORMS = ("cpu", "cuda")
BUILTINS = (*ARCHITECTURES, "speculative", *PLATFORMS)
MEMORY = "16GiB"

_EAGLE = {
    "page_size": 64,
    "speculative_algorithm": "EAGLE",
    "speculative_draft_num_layers": 1,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "max_running_requests": 64,
}
SERVINGS: dict[str, dict[str, Any]] = {
    "cpu": {"platform": "cpu"},
    "cpu-tp2": {"platform": "cpu", "tp_size": 2},
    "cpu-eagle": {"platform": "cpu", **_EAGLE},
    # DeepSeek-V4 pages by 256 (SGLang asserts it) and its c128 state grows with the request cap
    "cpu-p256": {"platform": "cpu", "page_size": 256, "max_running_requests": 64},
    "cuda": {"platform": "cuda"},
    "cuda-eagle": {"platform": "cuda", **_EAGLE},
}
"""Serving options by label (``Serving(**kwargs)``); KV dtypes stay at auto, valid on either platform."""
BUILT = "cpu-p256"
"""Each plan of this serving is also built on ``meta`` (of ``cuda`` when the cpu plugin is disabled)."""

SCRIPT = r"""
import json, sys

job = json.loads(sys.argv[1])
from kvpools_core import Serving, build, get_registry, plan
from kvpools_core.models import registry_presets

registry = get_registry()
out = {
    "plugins": {info.name: info.status for info in registry.plugins()},
    "presets": sorted(registry_presets(registry)),
    "plans": {},
    "builds": {},
}
for model in job["models"]:
    plans = out["plans"][model] = {}
    for label, kwargs in job["servings"].items():
        try:
            made = plan(model, Serving(**kwargs), memory=job["memory"], registry=registry)
        except Exception as exc:
            plans[label] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        plans[label] = {"json": made.to_json()}
        if label == job["build"] and model not in job["unbuilt"]:
            try:
                pools = build(made, "meta", registry=registry)
            except Exception as exc:
                out["builds"][model] = {"error": f"{type(exc).__name__}: {exc}"}
            else:
                out["builds"][model] = {
                    "allocated": pools.allocated_by_pool(),
                    "planned": {pool.name: pool.bytes for pool in made.pools},
                    "provenance": {hook: list(by) for hook, by in pools.provenance.items()},
                }
print(json.dumps(out))
"""


def run_script(
    env: Mapping[str, str], models: list[str], servings: list[str], built: str = BUILT, unbuilt: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Plan ``models`` under ``servings`` (and build the ``built`` serving's plans but of ``unbuilt``) in a process
    with the plugin controls ``env``."""
    job = {
        "models": models,
        "servings": {s: SERVINGS[s] for s in servings},
        "memory": MEMORY,
        "build": built,
        "unbuilt": unbuilt,
    }
    base = {k: v for k, v in os.environ.items() if not k.startswith("KVPOOLS_")}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(job)],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{dict(env)}: {result.stderr[-4000:]}"
    return json.loads(result.stdout)  # type: ignore[no-any-return]


PRESETS: dict[str, tuple[str, str]] = registry_presets(Registry(autoload=False))
"""Every built-in preset: name → (plugin, path of its config.json)."""
OWNED = {p: sorted(name for name, (owner, _) in PRESETS.items() if owner == p) for p in BUILTINS}
PATHS = sorted(path for _, path in PRESETS.values())


def _jobs() -> dict[str, tuple[Any, ...]]:
    # by name for the disabled runs, by path (built by name only: the same plan) for the runs alone
    jobs = {"full": ({}, sorted(PRESETS) + PATHS, list(SERVINGS), BUILT, tuple(PATHS))}
    for p in BUILTINS:
        kept = [name for name in sorted(PRESETS) if PRESETS[name][0] != p]
        servings = [label for label in SERVINGS if SERVINGS[label]["platform"] != p]
        refused = [PRESETS[name][1] for name in OWNED[p]]
        # a platform's own servings are run too: they must be refused
        platform_cases = [label for label in SERVINGS if SERVINGS[label]["platform"] == p][:1]
        built = BUILT if SERVINGS[BUILT]["platform"] != p else "cuda"
        jobs[f"disabled:{p}"] = ({"KVPOOLS_DISABLED_PLUGINS": p}, kept + refused, servings + platform_cases, built)
    for p in ARCHITECTURES:
        env = {"KVPOOLS_DISABLE_PLUGIN_AUTOLOAD": "1", "KVPOOLS_PLUGINS": f"{p},cpu"}
        jobs[f"alone:{p}"] = (env, [PRESETS[name][1] for name in OWNED[p]], ["cpu", "cpu-tp2", "cpu-p256"])
    return jobs


JOBS = _jobs()
_pool: ThreadPoolExecutor | None = None
_futures: dict[str, Future[dict[str, Any]]] = {}


def result(job: str) -> dict[str, Any]:
    """One job's output; the first call starts every job, two processes at a time (the full run first)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=2)
        for name, args in JOBS.items():
            _futures[name] = _pool.submit(run_script, *args)
        _pool.shutdown(wait=False)
    return _futures[job].result()


@pytest.fixture(scope="module", autouse=True)
def _drain() -> Any:
    yield
    for future in _futures.values():  # never leave a process running past the module
        future.cancel()
    if _pool is not None:
        _pool.shutdown(wait=True)


def test_every_architecture_ships_presets() -> None:
    """Not vacuous: every architecture plugin owns presets, and the full run plans them all."""
    assert all(OWNED[p] for p in ARCHITECTURES), OWNED
    full = result("full")
    assert full["presets"] == sorted(PRESETS)
    planned = {model for model, plans in full["plans"].items() if "json" in plans[BUILT]}
    assert planned == set(PRESETS) | set(PATHS)
    assert set(full["builds"]) == set(PRESETS)


@pytest.mark.parametrize("plugin", BUILTINS)
def test_disable_one_plugin(plugin: str) -> None:
    full, run = result("full"), result(f"disabled:{plugin}")
    assert run["plugins"][plugin] == "blocked"
    assert all(status == "loaded" for name, status in run["plugins"].items() if name != plugin), run["plugins"]
    assert run["presets"] == sorted(set(PRESETS) - set(OWNED[plugin]))

    for label in SERVINGS:
        if SERVINGS[label]["platform"] == plugin:
            # the platform's own servings: refused, naming the platform nobody provides now
            for model, plans in run["plans"].items():
                if label in plans:
                    assert plans[label]["error"].startswith(f"ConfigError: Unknown platform '{plugin}'"), model
    compared = [label for label in SERVINGS if SERVINGS[label]["platform"] != plugin]
    if plugin == "speculative":
        changed = [
            m for m in run["plans"] if m in PRESETS and run["plans"][m]["cpu-eagle"] != full["plans"][m]["cpu-eagle"]
        ]
        assert changed, "disabling speculative changed no speculative plan: the comparison would be vacuous"
        compared = [label for label in compared if "eagle" not in label]

    kept = [name for name in sorted(PRESETS) if PRESETS[name][0] != plugin]
    built_label = JOBS[f"disabled:{plugin}"][3]
    planned = [model for model in kept if "json" in run["plans"][model][built_label]]
    assert sorted(run["builds"]) == sorted(planned), "every plan of the built serving is built"
    assert len(planned) >= len(kept) // 2, f"only {planned} planned under {built_label}: the check would be vacuous"
    for model in kept:
        for label in compared:
            assert run["plans"][model][label] == full["plans"][model][label], f"{model} [{label}] without {plugin}"
        if "json" not in run["plans"][model][built_label]:  # refused with all plugins too (compared above)
            continue
        built = run["builds"][model]
        assert "error" not in built, f"{model} without {plugin}: {built}"
        assert built["allocated"] == built["planned"], model
        if SERVINGS[BUILT]["platform"] != plugin:  # the same plan as the full run's: the same build
            assert built == full["builds"][model], model

    for name in OWNED[plugin]:
        path = PRESETS[name][1]
        for label, outcome in run["plans"][path].items():
            if SERVINGS[label]["platform"] == plugin:
                continue
            error = outcome.get("error", "")
            assert error.startswith(
                f"NoProviderError: No plugin answered parse_model_config: no architecture plugin recognises {path}"
            ), f"{name} [{label}] without {plugin}: {outcome}"
            assert f'Disabled by KVPOOLS_DISABLED_PLUGINS: "{plugin}"' in error, error


def _without_provenance(plan_json: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(plan_json)
    return {key: value for key, value in data.items() if key != "provenance"}


@pytest.mark.parametrize("plugin", ARCHITECTURES)
def test_an_architecture_alone(plugin: str) -> None:
    full, run = result("full"), result(f"alone:{plugin}")
    loaded = {name for name, status in run["plugins"].items() if status == "loaded"}
    assert loaded == {"core", plugin, "cpu"}
    assert run["presets"] == OWNED[plugin]
    for name in OWNED[plugin]:
        path = PRESETS[name][1]
        assert any("json" in outcome for outcome in run["plans"][path].values()), f"{name} planned nowhere"
        for label, outcome in run["plans"][path].items():
            if "error" in full["plans"][path][label]:  # refused with every plugin too (DeepSeek-V4 at page 1)
                assert outcome == full["plans"][path][label], f"{name} [{label}]"
                continue
            assert "json" in outcome, f"{name} [{label}] with only {plugin} and cpu: {outcome}"
            expected = full["plans"][path][label]["json"]
            assert _without_provenance(outcome["json"]) == _without_provenance(expected), f"{name} [{label}]"
            provenance = json.loads(outcome["json"])["provenance"]
            assert {p for by in provenance.values() for p in by} <= {"core", plugin, "cpu"}
        built, reference = run["builds"][path], full["builds"][name]
        assert "error" not in built, f"{name}: {built}"
        assert built["allocated"] == built["planned"] == reference["allocated"], name
