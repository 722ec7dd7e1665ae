"""The engine conformance suite ``pytest --kvpools-conformance-engine=NAME`` runs on an installed engine plugin.

An engine (an ``Engine`` answer of the ``engine_accountings`` hook, :mod:`kvpools_core.engines`) is checked
under each of its accountings on seed models of every attention family (full, sliding, MLA, sparse, hybrid
recurrent presets; ``--kvpools-conformance-config`` adds configs) over a ladder of budgets:

* the value is well formed: found by its name, each accounting resolves to it, no accounting is another
  engine's;
* refusals are named: every budget or model the engine does not plan raises a kvpools error
  (``KvpoolsError``, which the command line prints without a traceback) with a message, never another
  exception; a 1-byte budget is refused;
* budget monotonicity: once a budget plans, every larger one plans too, and the KV budget the engine reads
  and the tokens it holds never fall as the memory grows;
* tokens within budget: the KV cache's bytes fit the KV budget, except under the accountings the engine
  declares ``over_budget`` (with the reason);
* the engine plans at least one seed model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvpools_core.engines import Engine, EngineCapacity, accountings, engines
from kvpools_core.errors import KvpoolsError
from kvpools_core.models import load_model
from kvpools_core.registry import Registry
from kvpools_core.values import ModelSpec, Serving

GiB = 1 << 30
BUDGETS = (1, 256 << 20, 1 * GiB, 4 * GiB, 16 * GiB, 64 * GiB, 256 * GiB)
"""The memory ladder each seed is planned at (``memory=``): 1 B, 256 MiB, then powers of 4 GiB."""
SEED_PRESETS = (
    "llama-3.1-8b",  # mha
    "qwen3-8b",  # mha
    "gpt-oss-20b",  # swa
    "deepseek-v3",  # mla
    "deepseek-v3.2",  # dsa
    "qwen3-next-80b-a3b-thinking",  # mamba hybrid
)
"""Built-in presets spanning the attention families (a seed no installed plugin parses is left out)."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``engine_name``: the engines named by ``--kvpools-conformance-engine``; ``accounting``: each of theirs."""
    names = metafunc.config.getoption("kvpools_conformance_engine") or []
    if "accounting" in metafunc.fixturenames:
        found = engines(Registry())
        cases = [(name, mode) for name in names for mode in (found[name].accountings if name in found else ("?",))]
        metafunc.parametrize(("engine_name", "accounting"), cases, ids=[f"{n}-{m}" for n, m in cases])
    elif "engine_name" in metafunc.fixturenames:
        metafunc.parametrize("engine_name", names)


@pytest.fixture(scope="session")
def registry() -> Registry:
    return Registry()


@pytest.fixture
def engine(engine_name: str, registry: Registry) -> Engine:
    found = engines(registry)
    if engine_name not in found:
        pytest.fail(
            f"no installed engine is named {engine_name!r}: the loaded engine plugins answer {sorted(found)} "
            "(engine_accountings hook; `kvpools plugins` lists the plugins)"
        )
    return found[engine_name]


@pytest.fixture(scope="session")
def seed_models(request: pytest.FixtureRequest, registry: Registry) -> dict[str, ModelSpec]:
    """The seed presets the installed plugins parse, and the ``--kvpools-conformance-config`` files."""
    seeds: dict[str, ModelSpec] = {}
    sources = [*SEED_PRESETS, *request.config.getoption("kvpools_conformance_config")]
    for source in sources:
        try:
            spec, _ = load_model(str(source), registry)
        except KvpoolsError:
            continue  # a preset no installed plugin parses (an isolated install)
        seeds[Path(str(source)).name] = spec
    if not seeds:
        pytest.fail("no seed model could be parsed: install kvpools' built-in plugins or pass a config")
    return seeds


def plan_capacity(engine: Engine, accounting: str, model: ModelSpec, memory: int, registry: Registry) -> Any:
    """The engine's capacity at ``memory``, or the ``KvpoolsError`` it refused with; any other exception fails."""
    try:
        result = engine.plan(model, Serving(accounting=accounting), memory=memory, registry=registry)
    except KvpoolsError as exc:
        return exc
    except Exception as exc:  # the suite's point: anything but a kvpools error is a failure
        pytest.fail(
            f"engine {engine.name!r} ({accounting}) raised {type(exc).__name__} for {model.name} at {memory:,} B: "
            f"{exc}. A refusal must be a kvpools_core.errors.KvpoolsError naming why."
        )
    summary = engine.capacity(result)
    assert isinstance(summary, EngineCapacity), f"{engine.name}.capacity returned {type(summary).__name__}"
    return summary


def test_engine_is_well_formed(engine: Engine, registry: Registry) -> None:
    assert engine.version and engine.summary and engine.docs and engine.distribution
    owners = accountings(registry)
    for mode in engine.accountings:
        assert owners[mode] is engine, f"--accounting {mode} resolves to {owners[mode].name}, not {engine.name}"
        assert Serving(accounting=mode).accounting == mode
    unknown = set(engine.over_budget) - set(engine.accountings)
    assert not unknown, f"over_budget names accountings the engine does not answer: {sorted(unknown)}"


def test_budget_ladder(engine: Engine, accounting: str, seed_models: dict[str, ModelSpec], registry: Registry) -> None:
    """Refusals named, budget monotonicity, tokens within budget, on every seed; at least one seed plans."""
    planned = []
    for seed, model in seed_models.items():
        answers = [(memory, plan_capacity(engine, accounting, model, memory, registry)) for memory in BUDGETS]
        tiny = answers[0][1]
        assert isinstance(tiny, KvpoolsError), f"{seed}: a 1-byte budget was planned: {tiny}"
        previous: EngineCapacity | None = None
        for memory, answer in answers:
            if isinstance(answer, KvpoolsError):
                assert str(answer).strip(), f"{seed} at {memory:,} B: refused with an empty message"
                assert previous is None, (
                    f"{seed}: {memory:,} B is refused ({answer}) although a smaller budget planned: a larger budget "
                    "must plan whatever a smaller one does"
                )
                continue
            assert answer.engine == engine.name and answer.accounting == accounting
            assert answer.max_tokens > 0 and answer.kv_bytes > 0, f"{seed} at {memory:,} B: {answer}"
            if accounting not in engine.over_budget:
                assert answer.kv_bytes <= answer.budget_bytes, (
                    f"{seed} at {memory:,} B: the KV cache takes {answer.kv_bytes:,} B, over its budget "
                    f"{answer.budget_bytes:,} B (declare the accounting in Engine.over_budget, with the reason, if "
                    "the engine's own arithmetic does so)"
                )
            if previous is not None:
                assert answer.budget_bytes >= previous.budget_bytes, f"{seed}: the budget fell at {memory:,} B"
                assert answer.max_tokens >= previous.max_tokens, (
                    f"{seed}: {answer.max_tokens} tokens at {memory:,} B, fewer than {previous.max_tokens} at a "
                    "smaller budget"
                )
            previous = answer
        if previous is not None:
            planned.append(seed)
    assert planned, f"engine {engine.name!r} ({accounting}) planned none of the seeds {sorted(seed_models)}"
