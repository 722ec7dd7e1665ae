"""Run SGLang 0.5.23's own FP4 KV recipe code (the peers venv, CPU): ``resolve_kv_cache_quant`` and
``FP4MXBlock16KVCacheMethod.create_buffers`` / ``compute_cell_size``
(``sglang/srt/layers/quantization/fp4_kv_cache_quant_method.py``).

Usage: ``python sglang_fp4_peer.py`` with a JSON list of cases on stdin, each ``{"size": S, "head_num": H,
"head_dim": D, "layer_num": L}``; prints one JSON object: ``resolved`` (what ``resolve_kv_cache_quant`` answers
for each ``--kv-cache-dtype`` name) and, per case, the bytes of every buffer ``create_buffers`` allocates and the
method's ``compute_cell_size``.  The installed module runs as it is; only its two runtime imports (the platform
and ``E2M1_MAX``, neither read on this path) are answered by inert stand-ins, and its parent packages, whose
``__init__`` modules need SGLang's dependency tree, are never imported.  This file runs in the peers venv, never
under pytest.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import torch


def _load() -> types.ModuleType:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    root = Path(next(iter(spec.submodule_search_locations)))
    for name, attrs in {
        "sglang.srt.layers.quantization.kvfp4_tensor": {"E2M1_MAX": 6.0},
        "sglang.srt.runtime_context": {"get_platform": lambda: types.SimpleNamespace(is_sm100=False)},
    }.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        sys.modules[name] = module
    name = "sglang.srt.layers.quantization.fp4_kv_cache_quant_method"
    path = root / "srt" / "layers" / "quantization" / "fp4_kv_cache_quant_method.py"
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module


def main() -> None:
    fp4 = _load()
    cases = json.load(sys.stdin)
    resolved = {}
    for dtype in ("nvfp4", "fp4_mx_block16", "fp8_e4m3", "auto"):
        resolved[dtype] = fp4.resolve_kv_cache_quant(dtype)
    method = fp4.FP4MXBlock16KVCacheMethod()
    out = []
    for case in cases:
        buffers = method.create_buffers(
            size=case["size"],
            head_num=case["head_num"],
            head_dim=case["head_dim"],
            layer_num=case["layer_num"],
            device="meta",
        )
        sizes = {}
        for key, value in buffers.items():
            tensors = value if isinstance(value, list) else ([] if value is None else [value])
            if all(isinstance(t, torch.Tensor) for t in tensors):
                sizes[key] = sum(t.numel() * t.element_size() for t in tensors)
        out.append(
            {
                "bytes": sizes,
                "cell": method.compute_cell_size(case["head_num"], case["head_dim"], case["layer_num"], 1),
            }
        )
    print(json.dumps({"resolved": resolved, "cases": out}))


if __name__ == "__main__":
    main()
