"""The core's imports run one way, and no module imports itself back: the layers of ``docs/architecture.md``.

An AST scan of every module of ``kvpools_core`` and of the vendor distributions (every import statement,
wherever written: inside functions and under ``TYPE_CHECKING`` too, and ``import_module("...")`` calls)
fails on

* an import of a module on a higher layer than the importer's (:data:`LAYERS`), naming ``file:line``;
* an import cycle between modules (a strongly connected component of more than one module);
* a name imported from the facade (``from kvpools_core import plan`` inside the core): the facade sits on top.

The scanner is itself tested on synthetic trees, so it cannot pass by seeing nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("foundation", ("errors", "units", "options", "dtypes", "parallel", "readonly", "config", "values")),
    ("library", ("parts", "pools", "allocators")),
    ("contract", ("hookspecs", "registry", "defaults", "models")),
    ("pipeline", ("pipeline", "building")),
    ("engines", ("engines",)),
    ("planning", ("planning",)),
    ("applications", ("cli", "serve")),
    ("edges", ("integrations", "testing", "")),
)
"""Bottom to top: a module may import its own layer and every layer below, never one above.
``""`` is the facade, ``kvpools_core/__init__.py``."""


def layer_of(module: str, package: str = "kvpools_core") -> int:
    """The layer index of ``module`` (``kvpools_core.planning.fit`` -> planning's)."""
    rest = module[len(package) :].lstrip(".")
    top = rest.split(".", 1)[0]
    for index, (_, members) in enumerate(LAYERS):
        if top in members:
            return index
    raise AssertionError(f"{module} is in no layer of tests/core/test_layers.py LAYERS: add it to one.")


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, by dotted name (a package by its own name)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        dotted = ".".join(path.relative_to(root).with_suffix("").parts)
        found[dotted.removesuffix(".__init__")] = path
    return found


def imports_of(module: str, path: Path, known: dict[str, Path]) -> list[tuple[int, str, bool]]:
    """``(line, imported module, names_from_facade)`` for every import of ``module`` that lands in ``known``."""
    is_package = path.name == "__init__.py"
    found: list[tuple[int, str, bool]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        targets: list[str] = []
        facade_names = False
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                parts = parts if is_package else parts[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, base] if base else parts)
            subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
            targets = subs or [base]
            dunder_only = all(alias.name.startswith("__") for alias in node.names)  # ``__version__``: the facade's
            facade_names = not subs and not dunder_only and base in known and known[base].name == "__init__.py"
            if len(subs) < len(node.names) and subs and base in known:
                targets.append(base)
                facade_names = known[base].name == "__init__.py"
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name == "import_module" and isinstance(node.args[0].value, str):
                targets = [node.args[0].value]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if not target or target == module:
                continue
            ancestor = module.startswith(target + ".")
            if ancestor and not facade_names:
                continue  # ``import pkg.sub`` binds ``pkg`` too: not a dependency on pkg's own code
            found.append((getattr(node, "lineno", 0), target, ancestor and facade_names))
    return found


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def scan(root: Path, package: str, layered: bool = True) -> list[str]:
    """Every layering problem of ``package`` under ``root``, as ``path:line: what``."""
    known = modules_of(root, package)
    problems = []
    edges: dict[str, set[str]] = {name: set() for name in known}
    for module, path in known.items():
        for line, target, facade in imports_of(module, path, known):
            where = f"{path.relative_to(root)}:{line}"
            if facade:
                problems.append(f"{where}: imports names from the facade {target}: import the module defining them")
                continue
            edges[module].add(target)
            if layered and layer_of(target, package) > layer_of(module, package):
                problems.append(
                    f"{where}: {module} ({LAYERS[layer_of(module, package)][0]}) imports {target} "
                    f"({LAYERS[layer_of(target, package)][0]}), a layer above it"
                )
    problems += [f"{package}: import cycle {' <-> '.join(component)}" for component in cycles(edges)]
    return problems


VENDOR_PACKAGES = ("plugins/kvpools-rocm/kvpools_rocm", "plugins/kvpools-ascend/kvpools_ascend")


def test_core_imports_run_one_way_without_cycles() -> None:
    assert scan(ROOT, "kvpools_core") == []


@pytest.mark.parametrize("path", VENDOR_PACKAGES)
def test_vendor_distributions_have_no_import_cycles(path: str) -> None:
    root, _, package = (ROOT / path).as_posix().rpartition("/")
    assert scan(Path(root), package, layered=False) == []


def test_builtin_plugins_have_no_import_cycles() -> None:
    assert scan(ROOT, "plugins", layered=False) == []


APPLICATIONS = dict(LAYERS)["applications"]


def sibling_imports(root: Path, package: str = "kvpools_core") -> list[str]:
    """Where one application (``cli``, ``serve``) imports a private name of the other, or the CLI's option plumbing
    (``cli.common``): what both need belongs in a public function of a layer below (``planning``)."""
    problems = []
    for module, path in modules_of(root, package).items():
        top = module[len(package) :].lstrip(".").split(".", 1)[0]
        if top not in APPLICATIONS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith(package):
                continue
            target = node.module[len(package) :].lstrip(".").split(".", 1)[0] if node.module else ""
            if target == top or target not in APPLICATIONS:
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            where = f"{path.relative_to(root)}:{node.lineno}"
            if private:
                problems.append(f"{where}: {module} imports private {', '.join(private)} of {node.module}")
            elif node.module == f"{package}.cli.common":
                problems.append(f"{where}: {module} imports the CLI's option plumbing {node.module}")
    return problems


def test_sibling_applications_share_through_a_layer_below() -> None:
    """The service and the CLI call public functions of ``planning`` for what both need (``--engine-version``,
    vLLM's plan, the runtime profiles), never the other's helpers."""
    assert sibling_imports(ROOT) == []


def test_every_core_package_has_a_layer() -> None:
    tops = {p.name.removesuffix(".py") for p in (ROOT / "kvpools_core").iterdir() if p.suffix == ".py" or p.is_dir()}
    tops -= {"__pycache__", "__init__"}
    for top in sorted(tops):
        layer_of(f"kvpools_core.{top}")


def test_top_level_stays_small() -> None:
    """The contract a plugin author reads: at most 12 top-level modules, each under ~800 lines."""
    modules = [p for p in (ROOT / "kvpools_core").glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= 12, sorted(p.name for p in modules)
    long = {p.name: n for p in modules if (n := len(p.read_text(encoding="utf-8").splitlines())) > 850}
    assert long == {}


# --- the scanner itself, on synthetic trees ---------------------------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return tmp_path


def test_scanner_sees_an_upward_import_inside_a_function(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "kvpools_core/__init__.py": "",
            "kvpools_core/values/__init__.py": "def f():\n    from kvpools_core.planning import fit\n",
            "kvpools_core/planning/__init__.py": "",
            "kvpools_core/planning/fit.py": "from kvpools_core.values import x\n",
        },
    )
    problems = scan(root, "kvpools_core")
    assert any("values/__init__.py:2" in p and "a layer above" in p for p in problems), problems


def test_scanner_sees_a_cycle_and_type_checking_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "kvpools_core/__init__.py": "",
            "kvpools_core/planning/__init__.py": "",
            "kvpools_core/planning/a.py": "from kvpools_core.planning import b\n",
            "kvpools_core/planning/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from kvpools_core.planning.a import X\n",
        },
    )
    assert scan(root, "kvpools_core") == [
        "kvpools_core: import cycle kvpools_core.planning.a <-> kvpools_core.planning.b"
    ]


def test_scanner_sees_facade_names_and_relative_imports(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "kvpools_core/__init__.py": "from kvpools_core.planning import fit\n",
            "kvpools_core/errors.py": "from kvpools_core import plan\n",
            "kvpools_core/planning/__init__.py": "",
            "kvpools_core/planning/fit.py": "from ..engines import base\n",
            "kvpools_core/engines/__init__.py": "",
            "kvpools_core/engines/base.py": "from . import other\n",
            "kvpools_core/engines/other.py": "",
        },
    )
    problems = scan(root, "kvpools_core")
    assert any(p.startswith("kvpools_core/errors.py:1: imports names from the facade") for p in problems), problems
    assert not any("fit.py" in p for p in problems), problems  # planning -> engines runs down
    root2 = _tree(
        tmp_path / "up",
        {
            "kvpools_core/__init__.py": "",
            "kvpools_core/engines/__init__.py": "",
            "kvpools_core/engines/base.py": "from ..planning import fit\n",
            "kvpools_core/planning/__init__.py": "",
            "kvpools_core/planning/fit.py": "",
        },
    )
    assert any("engines/base.py:1" in p for p in scan(root2, "kvpools_core"))


def test_scanner_sees_a_private_helper_shared_between_applications(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/cli/__init__.py": "",
            "pkg/cli/common.py": "def _helper(): ...\nPROFILES = ()\n",
            "pkg/serve/__init__.py": "",
            "pkg/serve/service.py": "def f():\n    from pkg.cli.common import _helper\n",
            "pkg/serve/page.py": "from pkg.cli.common import PROFILES\n",
        },
    )
    found = sibling_imports(root, "pkg")
    assert len(found) == 2
    assert "pkg/serve/service.py:2: pkg.serve.service imports private _helper of pkg.cli.common" in found
    assert "pkg/serve/page.py:1: pkg.serve.page imports the CLI's option plumbing pkg.cli.common" in found
