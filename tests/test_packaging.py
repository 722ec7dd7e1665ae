"""Every built-in plugin folder ships in the wheel and is declared like a third party's."""

from __future__ import annotations

import sys
from pathlib import Path

import importlib_metadata
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PLUGIN_DIRS = sorted(p.parent.name for p in (ROOT / "plugins").glob("*/__init__.py"))


@pytest.mark.parametrize("name", PLUGIN_DIRS)
def test_plugin_folder_is_packaged_and_declared(name: str) -> None:
    package = f"kvpools_plugins.{name}"
    assert package in PYPROJECT["tool"]["setuptools"]["packages"]
    assert PYPROJECT["project"]["entry-points"]["kvpools"].get(name) == package
    if (ROOT / "plugins" / name / "presets").is_dir():
        assert "presets/*.json" in PYPROJECT["tool"]["setuptools"]["package-data"][package]


def test_the_installed_distribution_declares_the_same_entry_points() -> None:
    installed = {
        ep.name: ep.value for ep in importlib_metadata.entry_points(group="kvpools") if ep.dist.name == "kvpools"
    }
    assert installed == PYPROJECT["project"]["entry-points"]["kvpools"]


def test_the_core_imports_no_plugin() -> None:
    for path in (ROOT / "kvpools_core").rglob("*.py"):
        text = path.read_text()
        assert "kvpools_plugins" not in text, f"{path} imports a plugin: the core must know none"


def test_torch_finds_numpy_without_the_test_extra() -> None:
    """torch warns "Failed to initialize NumPy" on every import without it: a runtime dependency, not a test one."""
    runtime = [dep.split(">")[0].split("=")[0].strip() for dep in PYPROJECT["project"]["dependencies"]]
    assert "numpy" in runtime


def test_no_fallback_to_paths_outside_the_checkout() -> None:
    """The benchmark driver names what is missing instead of reaching for an absolute path elsewhere."""
    script = (ROOT / "benchmarks" / "run_bench.sh").read_text()
    assert "/work/" not in script
