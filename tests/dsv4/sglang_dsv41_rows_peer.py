"""Write DeepSeek-V4.1 KV pages with SGLang 0.5.23's own V4.1 store oracle (the peers venv, CPU).

Usage: ``python sglang_dsv41_rows_peer.py`` with a JSON list on stdin, each ``{"input": PATH, "layout": NAME,
"page_size": P, "output": PATH}``: ``input`` is a ``torch.save``'d float32 ``(P, 512)`` latent (one page of
tokens), ``layout`` one of ``v41``, ``v41_new``, ``v41_fp4``, ``v41_fp4_new``; the page SGLang's
``quantize_k_cache_v41`` / ``quantize_k_cache_v41_fp4`` (``test/kernels/deepseek_v4/dsv41_kv_quant_reference.py``,
the oracle its store-kernel tests compare against) writes, interleaved by its ``interleave_pages`` for the
``_new`` layouts, is saved to ``output`` as a uint8 ``(page bytes,)`` tensor (``page``), with the oracle's
dequantisation of it (``dequantize_k_cache_v41`` / ``_fp4``: ``read``, float32 ``(P, 512)``).  The oracle runs
as installed; its one import (``ceil_pow2`` of ``kernels/ops/quantization/fp4_fake_quant.py``, torch only) is
loaded from its file, because the packages' ``__init__`` modules need SGLang's dependency tree.  This file runs in
the peers venv, never under pytest.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import torch


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    root = Path(next(iter(spec.submodule_search_locations)))
    _load("sglang.kernels.ops.quantization.fp4_fake_quant", root / "kernels/ops/quantization/fp4_fake_quant.py")
    ref = _load("dsv41_kv_quant_reference", root / "test/kernels/deepseek_v4/dsv41_kv_quant_reference.py")
    for case in json.load(sys.stdin):
        latent = torch.load(case["input"]).float()
        page = case["page_size"]
        k = latent.reshape(1, page, 512)
        name = case["layout"]
        if name.startswith("v41_fp4"):
            pages = ref.quantize_k_cache_v41_fp4(k)
            data, scale = 256, 32
        else:
            pages = ref.quantize_k_cache_v41(k)
            data, scale = 512, 16
        dequantize = ref.dequantize_k_cache_v41_fp4 if name.startswith("v41_fp4") else ref.dequantize_k_cache_v41
        read = dequantize(pages, page).reshape(page, 512).float()
        if name.endswith("_new"):
            pages = ref.interleave_pages(pages, page, data, scale)
        torch.save({"page": pages.reshape(-1)[: page * (data + scale)].clone(), "read": read}, case["output"])
    print(json.dumps({"ok": True}))


if __name__ == "__main__":
    main()
