"""Run SGLang 0.5.23's own ``NVFP4KVCacheMethod`` (the peers venv, CPU, ``meta`` tensors).

The installed ``layers/quantization/fp4_kv_cache_quant_method.py`` is loaded as ``sglang_fp4_peer.py`` loads it.
Per case the method is built for the GPU (``native_scale_layout``: SM100's TRT-LLM GenMHA layout, as
``get_platform().is_sm100`` sets it), its attention backends are selected with its own
``configure_attention_backends`` from the prefill backend SGLang resolves (``_NVFP4_PREFILL_BACKEND``, read from
the installed ``arg_groups/kv_cache_hook.py`` by its syntax tree: ``fp8_e4m3`` -> flashinfer, ``nvfp4`` ->
trtllm_mha) and decode ``trtllm_mha``; then ``create_buffers`` allocates on ``meta`` and ``compute_cell_size``
prices a token.

Usage: ``python sglang_nvfp4_peer.py`` with a JSON list of cases on stdin, each ``{"size": S, "head_num": H,
"head_dim": D, "layer_num": L, "page_size": P, "sm": 100|120, "prefill": "fp8_e4m3"|"nvfp4"}``; prints the bytes of
every buffer and the cell per case.  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path

import torch
from sglang_fp4_peer import _load


def _prefill_backends() -> dict[str, str]:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    path = Path(next(iter(spec.submodule_search_locations))) / "srt" / "arg_groups" / "kv_cache_hook.py"
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_NVFP4_PREFILL_BACKEND" for t in node.targets
        ):
            return dict(ast.literal_eval(node.value))
    raise SystemExit(f"_NVFP4_PREFILL_BACKEND not found in {path}")


def main() -> None:
    fp4 = _load()
    backends = _prefill_backends()
    out = []
    for case in json.load(sys.stdin):
        method = fp4.NVFP4KVCacheMethod(
            num_layers=case["layer_num"],
            device="meta",
            page_size=case["page_size"],
            native_scale_layout=case["sm"] == 100,
        )
        method.configure_attention_backends(backends[case["prefill"]], "trtllm_mha")
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
        cell = method.compute_cell_size(case["head_num"], case["head_dim"], case["layer_num"], 1)
        out.append({"bytes": sizes, "cell": cell, "prefill_backend": backends[case["prefill"]]})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
