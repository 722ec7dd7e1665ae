"""Run in the peers venv: SGLang 0.5.23's own QSA profile parsing and per-token charge, on CPU.

``layers/attention/qsa/config.py`` is loaded as it is (its one import, msgspec, is stood in for when
absent) and its ``parse_qsa_profile`` reads each case's text config; ``QSATokenToKVPool.qsa_bytes_per_token``
and ``_index_k_bytes`` are taken from the installed ``mem_cache/qsa_kv_pool.py`` by their syntax tree (the
module imports SGLang's memory pools) and run as they are; with ``size``, ``page_size`` and ``request_slots``
the installed ``QSATokenToKVPool`` is built on CPU (its base pool stood in for) and its QSA buffers measured.
stdin: a JSON list of ``{"config": {...}, "layers": L[, "size": S, "page_size": P, "request_slots": R]}``;
prints per case the profile (or the error SGLang raises), the bytes per token and the pools' bytes.  This file
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


def _pool_class(root: Path) -> type:
    """The installed ``QSATokenToKVPool``, its base ``HybridLinearKVPool`` stood in for (the base pool's own buffers
    are kvpools' ``kv`` pool, checked elsewhere): the QSA buffers its ``__init__`` allocates are SGLang's own code."""
    from contextlib import nullcontext

    class _Saver:
        def region(self, tag: str) -> object:
            return nullcontext()

    class _Full:
        memory_saver_adapter = _Saver()
        enable_custom_mem_pool = False
        custom_mem_pool = None

    class HybridLinearKVPool:
        def __init__(self, **kwargs: object) -> None:
            self.full_kv_pool = _Full()
            self.full_attention_layer_id_mapping = {i: i for i in kwargs["full_attention_layer_ids"]}  # type: ignore[attr-defined]

        def get_kv_size_bytes(self) -> tuple[int, int]:
            return 0, 0

    stubs = {
        "sglang.srt.constants": {"GPU_MEMORY_TYPE_KV_CACHE": "kv_cache"},
        "sglang.srt.mem_cache.memory_pool": {
            "GB": 1 << 30,
            "HybridLinearKVPool": HybridLinearKVPool,
            "MambaPool": object,
        },
    }
    for name, fields in stubs.items():
        module = types.ModuleType(name)
        module.__dict__.update(fields)
        sys.modules[name] = module
    path = root / "mem_cache" / "qsa_kv_pool.py"
    spec = importlib.util.spec_from_file_location("sglang_qsa_kv_pool", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.QSATokenToKVPool  # type: ignore[no-any-return]


def _dtype(case: dict) -> torch.dtype:  # type: ignore[type-arg]
    return torch.float8_e4m3fn if case.get("indexer_dtype") == "fp8_e4m3" else torch.bfloat16


def _pool_bytes(pool_class: type, case: dict, profile: object) -> dict[str, int]:  # type: ignore[type-arg]
    pool = pool_class(
        size=case["size"],
        dtype=torch.bfloat16,
        page_size=case["page_size"],
        head_num=1,
        head_dim=1,
        full_attention_layer_ids=list(range(case["layers"])),
        device="cpu",
        mamba_pool=None,
        qsa_index_kv_heads=profile.kv_heads,  # type: ignore[attr-defined]
        qsa_index_head_dim=profile.head_dim,  # type: ignore[attr-defined]
        qsa_compress_ratio=profile.compress_ratio,  # type: ignore[attr-defined]
        qsa_token_topk=profile.budget,  # type: ignore[attr-defined]
        num_request_slots=case["request_slots"],
        qsa_indexer_dtype=_dtype(case),
    )

    def nbytes(tensors: list) -> int:  # type: ignore[type-arg]
        return sum(t.numel() * t.element_size() for t in tensors)

    return {
        "qsa_compressed_k": nbytes([pool.qsa_compressed_flat]),
        "qsa_key_state": nbytes(pool.qsa_key_state_buffer_pool),
        "qsa_rope_positions": nbytes([pool.qsa_rope_position_buffer]),
    }


def main() -> None:
    root = _root()
    config = _config_module(root)
    per_token = _bytes_per_token(root)
    pool_class = _pool_class(root)
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
                    compressed_dtype=_dtype(case),
                ),
                "pools": _pool_bytes(pool_class, case, profile) if "size" in case else None,
            }
        )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
