"""Run in the peers venv: SGLang 0.5.23's own QSA profile parsing and per-token charge, on CPU.

``layers/attention/qsa/config.py`` is loaded as it is (its one import, msgspec, is stood in for when
absent) and its ``parse_qsa_profile`` reads each case's text config; ``QSATokenToKVPool.qsa_bytes_per_token``
and ``_index_k_bytes`` are taken from the installed ``mem_cache/qsa_kv_pool.py`` by their syntax tree (the
module imports SGLang's memory pools) and run as they are.  stdin: a JSON list of ``{"config": {...},
"layers": L}``; prints per case the profile (or the error SGLang raises) and the bytes per token.  This file
runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import types
from pathlib import Path

import torch


def _root() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "srt"


class _Struct:
    """An inert stand-in for ``msgspec.Struct`` (msgspec is not installed with --no-deps): keyword fields."""

    def __init_subclass__(cls, **options: object) -> None:
        pass

    def __init__(self, **fields: object) -> None:
        self.__dict__.update(fields)


def _config_module(root: Path) -> types.ModuleType:
    if importlib.util.find_spec("msgspec") is None:
        sys.modules["msgspec"] = types.SimpleNamespace(Struct=_Struct)  # type: ignore[assignment]
    path = root / "layers" / "attention" / "qsa" / "config.py"
    spec = importlib.util.spec_from_file_location("qsa_config", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bytes_per_token(root: Path):  # type: ignore[no-untyped-def]
    tree = ast.parse((root / "mem_cache" / "qsa_kv_pool.py").read_text())
    index = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_index_k_bytes")
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "QSATokenToKVPool")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "qsa_bytes_per_token")
    method.decorator_list = []
    namespace: dict[str, object] = {"torch": torch}
    exec(compile(ast.Module(body=[index, method], type_ignores=[]), "qsa_kv_pool.py", "exec"), namespace)
    function = namespace["qsa_bytes_per_token"]
    return lambda **kw: function(None, **kw)  # type: ignore[operator]


def main() -> None:
    root = _root()
    config = _config_module(root)
    per_token = _bytes_per_token(root)
    out = []
    for case in json.load(sys.stdin):
        try:
            profile = config.parse_qsa_profile(types.SimpleNamespace(**case["config"]))
        except ValueError as error:
            out.append({"error": str(error)})
            continue
        if profile is None:
            out.append({"profile": None})
            continue
        out.append(
            {
                "profile": {
                    "n_heads": profile.n_heads,
                    "kv_heads": profile.kv_heads,
                    "head_dim": profile.head_dim,
                    "budget": profile.budget,
                    "compress_ratio": profile.compress_ratio,
                },
                "bytes_per_token": per_token(
                    kv_heads=profile.kv_heads,
                    head_dim=profile.head_dim,
                    compress_ratio=profile.compress_ratio,
                    num_layers=case["layers"],
                ),
            }
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
