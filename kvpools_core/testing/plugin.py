"""The kit's pytest plugin (entry point ``pytest11: kvpools``): fixtures and ``--kvpools-conformance``.

``pytest --kvpools-conformance=NAME`` (repeatable) runs the conformance
suite on the installed plugin ``NAME`` instead of the tests the arguments
name; ``--kvpools-conformance-platform`` plans for another platform (its
page rules and layouts), ``--kvpools-conformance-examples`` sets how many
generated cases each property check tries, and
``--kvpools-conformance-config PATH`` adds seed configs (for a plugin that
ships no presets).  ``pytest --kvpools-conformance-engine=NAME`` (repeatable) runs the engine suite
(:mod:`kvpools_core.testing.engine_suite`) on the installed engine ``NAME``.  ``-p no:kvpools`` turns the
whole plugin off.

Nothing here imports hypothesis or torch until a fixture or the suite asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

__all__ = ["kvpools_fake_device", "kvpools_registry"]

OPTION = "--kvpools-conformance"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvpools", "kvpools plugin conformance (kvpools_core.testing)")
    group.addoption(
        OPTION,
        action="append",
        default=[],
        metavar="NAME",
        help="Run the kvpools conformance suite on the installed plugin NAME (repeatable) instead of the tests "
        "the arguments name.",
    )
    group.addoption(
        "--kvpools-conformance-engine",
        action="append",
        default=[],
        metavar="NAME",
        help="Run the kvpools engine conformance suite on the installed engine NAME (an engine_accountings answer, "
        "repeatable): named refusals, budget monotonicity, tokens within budget.",
    )
    group.addoption(
        "--kvpools-conformance-platform",
        default="cpu",
        metavar="PLATFORM",
        help="Plan the conformance cases for this platform (its page rules, layouts and allocators). Default: cpu.",
    )
    group.addoption(
        "--kvpools-conformance-examples",
        type=int,
        default=25,
        metavar="N",
        help="Generated cases per property check (hypothesis max_examples). Default: 25.",
    )
    group.addoption(
        "--kvpools-conformance-config",
        action="append",
        default=[],
        metavar="PATH",
        help="A config.json (or a directory holding one) to seed the suite with, beside the plugin's presets.",
    )


def pytest_configure(config: pytest.Config) -> None:
    suites = []
    if config.getoption("kvpools_conformance", default=None):
        from kvpools_core.testing import suite

        suites.append(str(Path(suite.__file__)))
    if config.getoption("kvpools_conformance_engine", default=None):
        from kvpools_core.testing import engine_suite

        suites.append(str(Path(engine_suite.__file__)))
    if suites:
        config.args[:] = suites


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the suite's checks for a kind of plugin none of the named ones is (a platform's architecture
    checks): not skips, which would read as checks that could not run."""
    if not config.getoption("kvpools_conformance", default=None):
        return
    from kvpools_core.testing import suite

    def unused(item: pytest.Item) -> bool:
        marker = item.get_closest_marker("skip")
        reason = str(marker.kwargs.get("reason", "")) if marker else ""
        return str(item.path) == suite.__file__ and reason.startswith("got empty parameter set")

    dropped = [item for item in items if unused(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if not unused(item)]


def pytest_report_header(config: pytest.Config) -> str | None:
    names = config.getoption("kvpools_conformance", default=None)
    engine_names = config.getoption("kvpools_conformance_engine", default=None)
    lines = []
    if names:
        platform = config.getoption("kvpools_conformance_platform")
        lines.append(f"kvpools conformance: {', '.join(names)} on platform {platform}")
    if engine_names:
        lines.append(f"kvpools engine conformance: {', '.join(engine_names)}")
    return "\n".join(lines) or None


@pytest.fixture
def kvpools_registry() -> Callable[..., Any]:
    """``kvpools_registry("mha", objects={...})``: a registry of only those plugins (no entry-point autoload)."""
    from kvpools_core.testing.registries import isolated_registry

    return isolated_registry


@pytest.fixture
def kvpools_fake_device() -> Iterator[Callable[..., Any]]:
    """``kvpools_fake_device("toy", free=8 << 30)``: a platform object whose devices report that memory."""
    from kvpools_core.testing.registries import FakeDeviceMemory

    yield FakeDeviceMemory
