"""Run in the peers venv: build SGLang 0.5.23's own ``ShortConvPool`` and ``NGramPool`` on CPU (real
``mem_cache/ple_state_pool.py``), with the layer ids and shapes that SGLang's ``Qwen4ExpTextConfig`` properties
derive (compiled from the installed ``configs/qwen4_exp.py``), and print their tensors' bytes as JSON.

argv: the shared ``bench`` folder, then a JSON list of objects ``{"text_config": {...}, "start": s,
"end": e, "size": mamba_size, "spec_state_size": n, "draft_tokens": d or null, "dtype": "bfloat16"}``;
prints one answer per case, then the modules it stubbed.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any


def main() -> None:
    bench, cases = sys.argv[1], json.loads(sys.argv[2])
    sys.path.insert(0, bench)
    import peer_imports as p  # the shared helper that imports SGLang's pieces without its dependencies
    import torch

    p.install()
    for package in ("sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.utils", "sglang.srt.configs"):
        p._BARE.add(package)
    p._STUB.add("sglang.srt.constants", GPU_MEMORY_TYPE_KV_CACHE="kv_cache")
    p._STUB.add("sglang.srt.mem_cache.utils", maybe_init_custom_mem_pool=lambda device: (False, None, None))

    class _NoSaver:
        @staticmethod
        def create(enable: bool) -> _NoSaver:
            return _NoSaver()

        def region(self, tag: str):
            from contextlib import nullcontext

            return nullcontext()

    p._STUB.add("sglang.srt.utils.torch_memory_saver_adapter", TorchMemorySaverAdapter=_NoSaver)
    import importlib

    ple = importlib.import_module("sglang.srt.mem_cache.ple_state_pool")

    # Qwen4ExpTextConfig's three properties, compiled from the installed file (its base class needs transformers).
    source = Path(importlib.util.find_spec("sglang").submodule_search_locations[0], "srt/configs/qwen4_exp.py")
    tree = ast.parse(source.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Qwen4ExpTextConfig")
    wanted = {"short_conv_layer_ids", "short_conv_state_shape", "ngram_context_len"}
    body = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {n.name for n in body} == wanted, "SGLang's Qwen4ExpTextConfig changed"
    module = ast.Module(
        body=[ast.ClassDef(name="Props", bases=[], keywords=[], body=body, decorator_list=[])], type_ignores=[]
    )
    namespace: dict = {}
    exec(compile(ast.fix_missing_locations(module), str(source), "exec"), namespace)

    print(json.dumps([_case(params, namespace["Props"], ple, torch) for params in cases] + [sorted(set(p.STUBBED))]))


def _case(params: dict[str, Any], props: Any, ple: Any, torch: Any) -> dict[str, int | None]:
    text = params["text_config"]
    config = props()
    # Qwen4ExpTextConfig.__init__'s defaults for the fields the properties read.
    config.ple_layer_ids = text.get("ple_layer_ids") or []
    config.ple_conv_kernel_size = text.get("ple_conv_kernel_size", 4)
    config.ngram_size = text.get("ngram_size", 3)
    config.hidden_size = text["hidden_size"]
    config.hc_count = text.get("hc_count", 4)

    start, end = params["start"], params["end"]
    # KVCacheConfigurator._get_ple_req_pool_kwargs: this rank's short-conv layers.
    layer_ids = [i for i in config.short_conv_layer_ids if start <= i < end]
    common = {
        "size": params["size"],
        "device": "cpu",
        "spec_state_size": params["spec_state_size"],
        "speculative_num_draft_tokens": params["draft_tokens"],
    }
    conv = ple.ShortConvPool(
        state_shape=config.short_conv_state_shape, layer_ids=layer_ids, dtype=getattr(torch, params["dtype"]), **common
    )
    ngram = ple.NGramPool(context_len=config.ngram_context_len, eos_token_id=int(text.get("eos_token_id", 0)), **common)

    def nbytes(t):
        return None if t is None else t.numel() * t.element_size()

    return {
        "ple_short_conv": nbytes(conv.conv_state),
        "ple_short_conv_spec": nbytes(conv.intermediate_conv_state),
        "ple_ngram": nbytes(ngram.context),
        "ple_ngram_spec": nbytes(ngram.intermediate_context),
    }


if __name__ == "__main__":
    main()
