"""Every built-in plugin folder ships in the wheel and is declared like a third party's; each released
distribution's version is written once, and what is installed, built and changelogged agrees with it."""

from __future__ import annotations

import ast
import fnmatch
import json
import re
import sys
from pathlib import Path

import importlib_metadata
import pytest
from packaging.requirements import Requirement

import kvpools_core

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PLUGIN_DIRS = sorted(p.parent.name for p in (ROOT / "plugins").glob("*/__init__.py"))
VENDOR_DISTRIBUTIONS = {"kvpools-rocm": "kvpools_rocm", "kvpools-ascend": "kvpools_ascend"}
"""The vendor platforms released from this repository (plugins/<distribution>/), and their packages."""


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


def source_version(init_file: Path) -> str:
    """``__version__`` as setuptools reads it for ``dynamic = ["version"]``: a module-level string literal."""
    for node in ast.parse(init_file.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(target, "id", None) for target in node.targets] == ["__version__"]:
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str), (
                f"{init_file}: __version__ must be a string literal, which setuptools reads without importing"
            )
            return node.value.value
    raise AssertionError(f"{init_file} assigns no __version__")


def installed_from(project: Path, name: str) -> importlib_metadata.Distribution:
    """The metadata ``importlib_metadata.version(name)`` reads, if it was made from ``project``; else skip."""
    try:
        dist = importlib_metadata.distribution(name)
    except importlib_metadata.PackageNotFoundError:
        pytest.skip(f"{name} is not installed")
    if Path(str(dist.locate_file(""))).resolve() == project.resolve():  # egg-info metadata inside the source tree
        return dist
    direct_url = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct_url.get("url") != project.resolve().as_uri():
        pytest.skip(f"the installed {name} was not installed from {project}")
    return dist


def project_metadata(project: Path) -> dict:
    return tomllib.loads((project / "pyproject.toml").read_text())


@pytest.mark.parametrize(
    ("project", "package"),
    [(ROOT, "kvpools_core"), *((ROOT / "plugins" / dist, pkg) for dist, pkg in VENDOR_DISTRIBUTIONS.items())],
    ids=["kvpools", *VENDOR_DISTRIBUTIONS],
)
def test_the_version_is_written_once_in_the_package(project: Path, package: str) -> None:
    metadata = project_metadata(project)
    assert "version" not in metadata["project"], "a literal version in pyproject.toml would be a second copy"
    assert "version" in metadata["project"]["dynamic"]
    assert metadata["tool"]["setuptools"]["dynamic"]["version"] == {"attr": f"{package}.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", source_version(project / package / "__init__.py"))


def test_the_installed_kvpools_metadata_is_the_source_version() -> None:
    """A bumped ``__version__`` without a reinstall leaves stale metadata that ``kvpools --version`` would print."""
    from click.testing import CliRunner

    from kvpools_core.cli import main

    dist = installed_from(ROOT, "kvpools")
    assert kvpools_core.__version__ == source_version(ROOT / "kvpools_core" / "__init__.py")
    assert dist.version == kvpools_core.__version__, "reinstall: pip install --no-deps -e ."
    printed = CliRunner().invoke(main, ["--version"]).output
    assert printed.endswith(f", version {kvpools_core.__version__}\n"), printed


@pytest.mark.parametrize(("name", "package"), VENDOR_DISTRIBUTIONS.items(), ids=list(VENDOR_DISTRIBUTIONS))
def test_an_installed_vendor_platform_metadata_is_its_source_version(name: str, package: str) -> None:
    project = ROOT / "plugins" / name
    dist = installed_from(project, name)
    assert dist.version == source_version(project / package / "__init__.py"), f"reinstall: pip install -e {project}"


@pytest.mark.parametrize("name", VENDOR_DISTRIBUTIONS)
def test_a_vendor_platform_accepts_this_kvpools(name: str) -> None:
    """The vendor distributions declare the kvpools series they are built against, which must include this one."""
    requirements = [Requirement(text) for text in project_metadata(ROOT / "plugins" / name)["project"]["dependencies"]]
    [kvpools] = [requirement for requirement in requirements if requirement.name == "kvpools"]
    assert kvpools.specifier, f"{name} must declare the kvpools versions it is built against, not any kvpools"
    assert kvpools.specifier.contains(kvpools_core.__version__), (
        f"{name} requires {kvpools}, which excludes kvpools {kvpools_core.__version__}"
    )


def test_the_changelog_leads_with_this_version() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.MULTILINE)
    released = [heading for heading in headings if heading.lower() != "unreleased"]
    assert released, "CHANGELOG.md has no version heading (## [X.Y.Z] - date)"
    assert released[0] == kvpools_core.__version__


def test_every_preset_and_the_type_marker_ship_in_the_wheel() -> None:
    package_data = PYPROJECT["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["kvpools_core"] and (ROOT / "kvpools_core" / "py.typed").is_file()
    presets = sorted((ROOT / "plugins").glob("*/presets/**/*.json"))
    assert presets
    for preset in presets:
        plugin = preset.relative_to(ROOT / "plugins").parts[0]
        relative = preset.relative_to(ROOT / "plugins" / plugin)
        globs = package_data.get(f"kvpools_plugins.{plugin}", [])
        # setuptools matches package-data globs against the path below the package; "*" stops at "/"
        path = relative.as_posix()
        assert any(fnmatch.fnmatch(path, glob) and path.count("/") == glob.count("/") for glob in globs), (
            f"{preset.relative_to(ROOT)} matches none of {globs}: it would be missing from the wheel"
        )
