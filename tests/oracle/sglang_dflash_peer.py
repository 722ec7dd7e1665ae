"""Run SGLang 0.5.23's own DFLASH-family cell scaling (the peers venv, CPU).

``scale_kv_cell_size_per_token_for_dflash`` (``sglang/srt/speculative/dflash_utils.py``) is the function
``DefaultPoolConfigurator`` calls for DFLASH and DSPARK (``is_dflash_family``).  The module's imports need SGLang's
kernels and dependency tree, so only that function's own source is taken from the installed file (by its syntax
tree) and run as it is; ``SpeculativeAlgorithm.is_dflash_family`` is read the same way from ``spec_info.py``: the
names of the members it accepts.

Usage: ``python sglang_dflash_peer.py`` with a JSON list of ``[cell, target_layers, draft_layers]`` on stdin;
prints ``{"cells": [...], "dflash_family": [...]}``.  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Optional


def _root() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "srt" / "speculative"


def _function(path: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise SystemExit(f"{name} not found in {path}")


def _dflash_family(path: Path) -> list[str]:
    """The ``is_*`` predicates ``is_dflash_family`` ors, mapped to the members each compares with."""
    tree = ast.parse(path.read_text())
    enum = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeAlgorithm")
    methods = {n.name: n for n in enum.body if isinstance(n, ast.FunctionDef)}
    called = [
        node.func.attr
        for node in ast.walk(methods["is_dflash_family"])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    ]
    members = []
    for predicate in called:
        for node in ast.walk(methods[predicate]):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "SpeculativeAlgorithm"
            ):
                members.append(node.attr)
    return sorted(members)


def main() -> None:
    root = _root()
    function = _function(root / "dflash_utils.py", "scale_kv_cell_size_per_token_for_dflash")
    namespace: dict[str, Any] = {"Optional": Optional}
    exec(compile(ast.Module(body=[function], type_ignores=[]), "dflash_utils.py", "exec"), namespace)
    scale = namespace["scale_kv_cell_size_per_token_for_dflash"]
    cases = json.load(sys.stdin)
    cells = [
        scale(target_cell_size_per_token=cell, target_num_layers=layers, draft_num_layers=draft)
        for cell, layers, draft in cases
    ]
    print(json.dumps({"cells": cells, "dflash_family": _dflash_family(root / "spec_info.py")}))


if __name__ == "__main__":
    main()
