"""Plugins depend on the core alone: no plugin imports another, and none imports an internal core module.

An AST scan of every built-in ``plugins/<name>/**/*.py``, of the example distribution
(``tests/plugins/example/kvpools_example.py``) and of the vendor distributions
(``plugins/kvpools-rocm/kvpools_rocm``, ``plugins/kvpools-ascend/kvpools_ascend``, under
the example's rules) refuses, naming ``file:line``:

* a relative import of level >= 2 (``from ..mha import x``): it leaves the plugin's package;
* an import of ``kvpools_plugins.<other>`` / ``plugins.<other>`` outside the plugin's own package;
* a ``kvpools_core`` module not in :data:`kvpools_core.PUBLIC_MODULES` (``registry``,
  ``pipeline``, ``building``, ``defaults``, ``cli``, ``report``, ``hookspecs``, ...).

Every import counts wherever it is written (inside a function, under
``TYPE_CHECKING``, through ``importlib.import_module("...")``): each is a dependency.
The scan is itself tested on synthetic sources, so it cannot pass by seeing nothing.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import kvpools_core
from kvpools_core import PUBLIC_MODULES, is_public_module

ROOT = Path(__file__).parents[2]
PLUGINS = ROOT / "plugins"
EXAMPLE = ROOT / "tests" / "plugins" / "example" / "kvpools_example.py"
VENDOR_PACKAGES = {"kvpools-rocm": "kvpools_rocm", "kvpools-ascend": "kvpools_ascend"}
"""Vendor distributions shipped from ``plugins/<distribution>/<package>`` (scanned as the example is)."""
PLUGIN_ROOTS = ("kvpools_plugins", "plugins")
"""The built-ins' import package (``kvpools_plugins``) and their folder, should anyone import it by path."""
INTERNAL = ("registry", "models", "pipeline", "building", "defaults", "engines", "planning", "cli", "hookspecs")


def core_modules() -> frozenset[str]:
    """Every module of ``kvpools_core`` (so ``from kvpools_core import registry`` is seen as a module import)."""
    found = {"kvpools_core"}
    for info in pkgutil.walk_packages(kvpools_core.__path__, "kvpools_core."):
        found.add(info.name)
    return frozenset(found)


CORE_MODULES = core_modules()


def _imported_modules(node: ast.AST) -> list[str]:
    """The absolute modules an import statement (or ``import_module("...")`` call) depends on."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        base = node.module
        # ``from pkg import sub`` imports the module ``pkg.sub`` when there is one.
        subs = [f"{base}.{alias.name}" for alias in node.names if _is_module(f"{base}.{alias.name}")]
        return subs or [base]
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def _is_module(name: str) -> bool:
    if name in CORE_MODULES:
        return True
    parts = name.split(".")
    # a plugin package (``kvpools_plugins.mha``) or a module in one
    return parts[0] in PLUGIN_ROOTS and len(parts) >= 2


def scan_source(source: str, path: str, own: str | None) -> list[str]:
    """Boundary violations of one file, as ``path:line: what``.

    ``own`` is the plugin package the file belongs to (``"mha"`` for ``plugins/mha/pool.py``),
    or ``None`` for a file outside every built-in plugin package (the example distribution).
    """
    problems = []
    for node in ast.walk(ast.parse(source, filename=path)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.ImportFrom) and node.level >= 2:
            dots = "." * node.level
            problems.append(
                f"{path}:{line}: relative import 'from {dots}{node.module or ''} import ...' (level {node.level}) "
                f"leaves the plugin's package; import the shared block from kvpools_core.parts / kvpools_core.pools"
            )
            continue
        if isinstance(node, ast.ImportFrom) and node.level == 1 and own is None:
            problems.append(
                f"{path}:{line}: relative import 'from .{node.module or ''} import ...' outside any plugin package "
                f"reaches the plugins' shared package"
            )
            continue
        for module in _imported_modules(node):
            parts = module.split(".")
            if parts[0] in PLUGIN_ROOTS:
                if own is None or len(parts) < 2 or parts[1] != own:
                    problems.append(
                        f"{path}:{line}: imports {module}, another plugin's code; plugins cooperate through hooks, "
                        f"and a block two plugins need moves to kvpools_core.parts"
                    )
            elif parts[0] == "kvpools_core" and not is_public_module(module):
                problems.append(
                    f"{path}:{line}: imports {module}, an internal core module; plugins may import only "
                    f"kvpools_core.PUBLIC_MODULES ({', '.join(PUBLIC_MODULES)})"
                )
    return problems


def plugin_files() -> list[tuple[Path, str | None]]:
    """Every plugin source file and the plugin package it belongs to."""
    files: list[tuple[Path, str | None]] = []
    for path in sorted(PLUGINS.rglob("*.py")):
        relative = path.relative_to(PLUGINS)
        if relative.parts[0] in VENDOR_PACKAGES:
            continue
        files.append((path, relative.parts[0] if len(relative.parts) > 1 else None))
    files.append((EXAMPLE, None))
    for dist, package in VENDOR_PACKAGES.items():
        files += [(path, None) for path in sorted((PLUGINS / dist / package).rglob("*.py"))]
    return files


def test_plugins_import_neither_each_other_nor_core_internals() -> None:
    problems = []
    for path, own in plugin_files():
        problems += scan_source(path.read_text(), str(path.relative_to(ROOT)), own)
    assert not problems, "plugin boundary violations:\n" + "\n".join(problems)


def test_the_scan_sees_every_plugin() -> None:
    """Not vacuous: every built-in package and the example are scanned, and they do import the core."""
    files = plugin_files()
    owners = {own for _, own in files if own}
    assert {"mha", "mla", "dsa", "minimax_sparse", "mamba", "swa", "speculative", "cpu", "cuda"} <= owners
    assert EXAMPLE in {path for path, _ in files}
    for dist, package in VENDOR_PACKAGES.items():
        assert PLUGINS / dist / package / "__init__.py" in {path for path, _ in files}
        assert not any(dist in path.parts for path, own in files if own)  # not scanned as a built-in package
    seen = set()
    for path, _ in files:
        for node in ast.walk(ast.parse(path.read_text())):
            seen.update(m for m in _imported_modules(node) if m.startswith("kvpools_core"))
    assert {"kvpools_core.parts.attention", "kvpools_core.parts.latent", "kvpools_core.pools.mha"} <= seen


VIOLATIONS = {
    "relative level 2": ("from ..mha import attention_cell_size", "level 2"),
    "relative level 3": ("from ...kvpools_core import values", "level 3"),
    "relative bare level 2": ("from .. import mla", "level 2"),
    "sibling by package": ("from kvpools_plugins.mla.pool import MLATokenToKVPool", "kvpools_plugins.mla.pool"),
    "sibling import": ("import kvpools_plugins.dsa", "kvpools_plugins.dsa"),
    "sibling from the root": ("from kvpools_plugins import dsa", "kvpools_plugins.dsa"),
    "sibling by folder": ("from plugins.swa.sizing import SWA_POOL", "plugins.swa.sizing"),
    "the plugins root": ("import kvpools_plugins", "kvpools_plugins,"),
    "sibling via importlib": (
        "import importlib\nimportlib.import_module('kvpools_plugins.mla')",
        "kvpools_plugins.mla",
    ),
    "registry": ("from kvpools_core.registry import get_registry", "kvpools_core.registry"),
    "registry as a name": ("from kvpools_core import registry", "kvpools_core.registry"),
    "pipeline": ("import kvpools_core.pipeline", "kvpools_core.pipeline"),
    "building": ("from kvpools_core.building import Pools", "kvpools_core.building"),
    "defaults": ("from kvpools_core.defaults import size_pools", "kvpools_core.defaults"),
    "cli": ("from kvpools_core.cli import main", "kvpools_core.cli"),
    "report": ("from kvpools_core.cli.plan_report import render_plan", "kvpools_core.cli.plan_report"),
    "hookspecs": ("from kvpools_core.hookspecs import hookimpl", "kvpools_core.hookspecs"),
    "inside a function": ("def f():\n    from kvpools_core.registry import Registry\n", "kvpools_core.registry"),
    "under TYPE_CHECKING": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvpools_core.pipeline import plan\n",
        "kvpools_core.pipeline",
    ),
}


@pytest.mark.parametrize("case", VIOLATIONS)
def test_the_scan_catches(case: str) -> None:
    source, named = VIOLATIONS[case]
    source = f'"""A plugin."""\n\nimport torch\n{source}\n'
    problems = scan_source(source, "plugins/mha/fake.py", "mha")
    assert len(problems) == 1, problems
    line = len(source.rstrip("\n").splitlines())  # each case ends with its violation
    assert problems[0].startswith(f"plugins/mha/fake.py:{line}: "), problems
    assert named in problems[0] + ",", problems


def test_the_example_may_not_use_relative_imports() -> None:
    """A file outside every plugin package has no package of its own to import relatively from."""
    assert scan_source("from . import mha\n", "tests/plugins/example/kvpools_example.py", None) == [
        "tests/plugins/example/kvpools_example.py:1: relative import 'from . import ...' outside any plugin "
        "package reaches the plugins' shared package"
    ]
    assert scan_source("from kvpools_plugins.mha import ARCHITECTURE\n", "x.py", None)


ALLOWED = """
from __future__ import annotations

import attrs
import torch

import kvpools_core
from kvpools_core import CellSize, for_architecture, hookimpl
from kvpools_core.allocators import allocator_for_plan
from kvpools_core.allocators.token import TokenAllocator
from kvpools_core.config import ConfigReader
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts import LatentRow, latent_cell_size
from kvpools_core.parts.attention import attention_cell_size
from kvpools_core.pools import MHATokenToKVPool
from kvpools_core.pools.mla import MLATokenToKVPool
from kvpools_core.parts.sizing import explicit_budget
from kvpools_core.units import parse_bytes
from kvpools_core.values import Plan

from . import SPARSE
from .pool import SWAKVPool
from kvpools_plugins.swa.config import FULL
"""


def test_the_scan_allows_public_core_and_own_package() -> None:
    assert scan_source(ALLOWED, "plugins/swa/x.py", "swa") == []


def test_public_modules_name_real_modules_and_leave_internals_out() -> None:
    for entry in PUBLIC_MODULES:
        name = entry.removesuffix(".*")
        assert name in CORE_MODULES, f"PUBLIC_MODULES names {entry}, which does not exist"
        if entry.endswith(".*"):
            assert any(m.startswith(f"{name}.") for m in CORE_MODULES), f"{entry}: {name} has no submodules"
    for name in INTERNAL:
        assert f"kvpools_core.{name}" in CORE_MODULES
        assert not is_public_module(f"kvpools_core.{name}")
    assert is_public_module("kvpools_core.parts.latent")
    assert not is_public_module("kvpools_core.partsx")
    assert not is_public_module("kvpools_core.parts_private")


PARTS_WITHOUT_TORCH = """
import importlib, pkgutil, sys
import kvpools_core.parts as parts
names = [info.name for info in pkgutil.walk_packages(parts.__path__, "kvpools_core.parts.")]
for name in names:
    importlib.import_module(name)
assert "torch" not in sys.modules, "importing the parts library imported torch"
print(len(names))
"""


def test_importing_the_parts_library_does_not_import_torch() -> None:
    out = subprocess.run([sys.executable, "-c", PARTS_WITHOUT_TORCH], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) >= 4  # attention, indexer, latent, names (at least)
