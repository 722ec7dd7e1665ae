"""A config fuzzer: mutated real configs plan, or fail with a deliberate error naming the field, in under a second.

Every bundled preset is mutated (a key deleted, set to null, 0, -1, 2**64,
1e30, a float, a string, a list, an object, its kvpools bound or one above;
layer-pattern lists cut, extended, emptied or given an unknown entry; the same
inside ``text_config`` and the other nested objects, and keys other presets
have are added), written to a ``config.json`` and planned under a few serving
variants.  The property:

* the plan is valid (tokens >= 0, planned bytes within the budget), or
* a ``ConfigError`` whose message quotes a field (``field 'text_config.head_dim'``)
  and names no command-line flag, or ``UnsupportedCombinationError``,
  ``InsufficientMemoryError`` or ``NoProviderError`` (nobody claims the config);
* never a bare exception, nor a ``PluginHookError`` (a plugin crashed), and
  never more than :data:`SECONDS` for one example.

Profiles (``KVPOOLS_FUZZ_PROFILE``): ``ci`` (the default: a fixed, derandomized
set of examples, a few seconds) and ``deep`` (random, many thousands; a few
minutes), e.g.::

    KVPOOLS_FUZZ_PROFILE=deep .venv/bin/pytest -q -p no:cacheprovider tests/core/test_config_fuzz.py

``KVPOOLS_FUZZ_EXAMPLES=N`` overrides either profile's example count.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpools_core import Registry, Serving, plan
from kvpools_core.config import FIELD_LIMITS, limit_for, read_config_file
from kvpools_core.errors import (
    ConfigError,
    InsufficientMemoryError,
    KvpoolsError,
    NoProviderError,
    UnsupportedCombinationError,
)
from kvpools_core.models import registry_presets

SECONDS = 1.0
"""The most one example (read, parse, plan) may take."""
HANG_SECONDS = 10
"""A hang is cut short here (and fails) instead of stalling the run."""

_COMMON = {
    "database": None,
    "deadline": None,  # the module's own per-example limit (SECONDS) applies instead
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
}
settings.register_profile("kvpools-fuzz-ci", max_examples=1000, derandomize=True, **_COMMON)  # same examples each run
settings.register_profile("kvpools-fuzz-deep", max_examples=20_000, derandomize=False, **_COMMON)
_PROFILE = settings.get_profile(f"kvpools-fuzz-{os.environ.get('KVPOOLS_FUZZ_PROFILE', 'ci')}")
FUZZ = settings(_PROFILE, max_examples=int(os.environ.get("KVPOOLS_FUZZ_EXAMPLES", _PROFILE.max_examples)))

ACCEPTED = (ConfigError, UnsupportedCombinationError, InsufficientMemoryError, NoProviderError)
"""Deliberate errors; any other ``KvpoolsError`` (``PluginHookError``, a claim conflict) is a bug."""

SERVINGS = (
    Serving(),
    Serving(tp_size=2),
    Serving(page_size=16),
    Serving(tp_size=2, page_size=16),
    Serving(page_size=64),  # DSA's CUDA page size
    Serving(tp_size=4, page_size=64, kv_cache_dtype="fp8_e4m3"),
)
SUPPORT_PLUGINS = ("cpu", "cuda", "speculative")
"""Loaded beside a lone architecture plugin: planning needs a platform."""
_DELETE = object()
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")
QUOTED_FIELD = re.compile(r"field '[\w.]+'")


@cache
def _registry(alone: str | None = None) -> Registry:
    """Every installed plugin, or only the architecture plugin ``alone`` (and the platforms and wrappers).

    Alone, no other plugin's error can mask the plugin's own crash (the example plugin rejects a non-string
    ``model_type`` before the MLA plugin would have hashed it).
    """
    if alone is None:
        return Registry(autoload=True, plugins=None, disabled=(), trace=False, on_plugin_error="raise")
    return Registry(
        autoload=False, plugins=[alone, *SUPPORT_PLUGINS], disabled=(), trace=False, on_plugin_error="raise"
    )


@cache
def _owners() -> dict[str, str]:
    """Preset name → the plugin that ships it."""
    return {name: plugin for name, (plugin, _path) in registry_presets(_registry()).items()}


@cache
def _presets() -> dict[str, dict[str, Any]]:
    return {name: read_config_file(Path(path)) for name, (_plugin, path) in registry_presets(_registry()).items()}


@cache
def _known_keys() -> tuple[str, ...]:
    """Every key some preset has (at any depth), and every bounded field: candidates to add where absent."""
    keys: set[str] = set(FIELD_LIMITS)

    def walk(node: dict[str, Any]) -> None:
        for key, value in node.items():
            if not key.startswith("_"):
                keys.add(key)
            if isinstance(value, dict):
                walk(value)

    for config in _presets().values():
        walk(config)
    return tuple(sorted(keys))


def _objects(config: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Paths of the config's objects (itself first), the places a mutation can act."""
    yield path
    for key, value in config.items():
        if isinstance(value, dict) and not key.startswith("_"):
            yield from _objects(value, (*path, key))


def _values(key: str, current: Any) -> st.SearchStrategy[Any]:
    """What a field may be set to: wrong types, absurd and boundary counts, and pattern edits."""
    bound = limit_for(key).maximum
    absurd = st.sampled_from([_DELETE, None, 0, -1, 2**64, 1e30, bound, bound + 1])
    wrong_type = st.sampled_from([32.0, 2.5, float("nan"), float("inf"), True, "abc", "", [1, "x"], [], {"a": 1}, {}])
    options = [absurd, absurd, wrong_type, wrong_type, st.integers(-(2**70), 2**70), st.integers(0, 300)]
    edits: list[Any] = []
    if isinstance(current, str) and current:  # hybrid_override_pattern, model_type, torch_dtype, ...
        edits = [current[:-1], current + current[-1], current[:1], current * 3, "X" + current[1:]]
    elif isinstance(current, list) and current:  # layer patterns, per-layer flags, architectures
        unknown: Any = "bogus" if isinstance(current[0], str) else 7
        edits = [current[:-1], current + current[-1:], current[:1], current * 3, [unknown, *current[1:]]]
    if edits:  # one entry short, one too many, one entry, three times too long, an unknown first entry
        options += [st.sampled_from(edits)] * 2
    return st.one_of(*options)


@st.composite
def mutated_configs(draw: st.DrawFn) -> tuple[str, dict[str, Any], list[str]]:
    """(preset, a mutated copy of its config, the mutated keys)."""
    presets = _presets()
    name = draw(st.sampled_from(sorted(presets)))
    config = copy.deepcopy(presets[name])
    keys: list[str] = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        where = draw(st.sampled_from(list(_objects(config))))
        target = config
        for step in where:
            target = target[step]
        present = sorted(k for k in target if not k.startswith("_"))
        # Mostly keys the config has (it reads them); sometimes one another preset has (an unexpected marker).
        if present and draw(st.integers(0, 3)) != 0:
            key = draw(st.sampled_from(present))
        else:
            key = draw(st.sampled_from(_known_keys()))
        value = draw(_values(key, target.get(key)))
        if value is _DELETE:
            target.pop(key, None)
        else:
            target[key] = copy.deepcopy(value)
        keys.append(key)
    return name, config, keys


class Hang(BaseException):
    """Raised by the alarm; a ``BaseException`` so no ``except Exception`` (the registry's blame) swallows it."""


@contextmanager
def _hang_guard(seconds: int) -> Iterator[None]:
    """Abort a runaway example (a loop over 2**64 layers) so the fuzzer reports it instead of stalling."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def alarm(_signum: int, _frame: FrameType | None) -> None:
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    # Re-armed every second: an exception raised inside a gc callback is swallowed, so one alarm could be lost.
    signal.setitimer(signal.ITIMER_REAL, seconds, 1)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check_config(
    config: dict[str, Any], keys: list[str], serving: Serving, directory: Path, registry: Registry | None = None
) -> str:
    """Plan a config through the whole pipeline and check the property; returns the outcome's class name.

    A slow example is timed once more and judged by the faster run, so a busy
    shared machine's scheduler hiccup is not reported as a slow parser.
    """
    path = directory / "config.json"
    path.write_text(json.dumps(config))
    registry = registry or _registry()
    outcome, elapsed = _plan_once(path, keys, serving, registry)
    if elapsed >= SECONDS:
        elapsed = min(elapsed, _plan_once(path, keys, serving, registry)[1])
    assert elapsed < SECONDS, f"{elapsed:.2f} s for mutated {keys} ({outcome})"
    return outcome


def _plan_once(path: Path, keys: list[str], serving: Serving, registry: Registry) -> tuple[str, float]:
    started = time.perf_counter()
    outcome = "plan"
    try:
        with _hang_guard(HANG_SECONDS):
            result = plan(str(path), serving, memory="8GiB", registry=registry)
    except ACCEPTED as error:
        outcome = type(error).__name__
        message = str(error)
        if isinstance(error, ConfigError):
            assert QUOTED_FIELD.search(message) or any(key in message for key in keys), message
            assert not FLAG.search(message), f"a config problem must not name a flag: {message}"
    except KvpoolsError as error:  # PluginHookError: a plugin crashed; PluginConflictError: two claims
        pytest.fail(f"{type(error).__name__} for mutated {keys}: {error}")
    else:
        assert result.max_total_num_tokens >= 0
        assert result.planned_bytes <= result.budget.budget_bytes, (result.planned_bytes, result.budget.budget_bytes)
    return outcome, time.perf_counter() - started


@pytest.fixture(scope="module")
def directory() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="kvpools-fuzz-") as name:
        yield Path(name)


@FUZZ
@given(case=mutated_configs(), serving=st.sampled_from(SERVINGS), alone=st.booleans())
def test_mutated_presets_plan_or_fail_naming_the_field(
    case: tuple[str, dict[str, Any], list[str]], serving: Serving, alone: bool, directory: Path
) -> None:
    name, config, keys = case
    check_config(config, keys, serving, directory, _registry(_owners()[name]) if alone else None)


@pytest.mark.parametrize("name", sorted(_presets()))
def test_every_preset_plans_unmutated(name: str, directory: Path) -> None:
    """The fuzzer's baseline: each preset itself plans (or is refused on purpose) quickly."""
    for serving in SERVINGS:
        check_config(_presets()[name], [], serving, directory)
