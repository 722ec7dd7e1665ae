"""Run SGLang 0.5.23's own DSA indexer and HiSparse sizing code (the peers venv, CPU) on cases read from stdin.

Usage: ``python sglang_dsa_peer.py BENCH_DIR`` with a JSON list of cases on stdin; prints one JSON list of answers:

* ``{"op": "skips", "config": {...}, "num_layers": n}`` → per layer ``dsa_layer_skips_topk(config, i)`` (or the
  ``AssertionError`` text), and ``is_deepseek_dsa(config)``: both compiled from the installed
  ``configs/model_config.py``;
* ``{"op": "index_cache", "page_size", "index_kpool", "skip_topk_layers", "index_buf_size"}`` → per layer the
  byte size of the installed ``IndexKeyCache``'s buffer (``mem_cache/index_key_cache.py``), built on ``meta``;
* ``{"op": "hisparse_allocator", "size", "page_size", "ratio"}`` → the installed
  ``HiSparseTokenToKVPoolAllocator``'s ``size_full``, its logical and device allocators' sizes and its mapping's
  entries and dtype (``mem_cache/allocator/hisparse.py``).

Only runtime imports the code does not use for sizing are stubbed (kernels, platform discovery, the DSV4 and
DSA pool classes the allocator type-checks against).  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sys
import types
from typing import Any


def _helpers(peers: Any) -> dict[str, Any]:
    return dict(
        peers.functions_from_installed_module(
            "sglang.srt.configs.model_config",
            ["_hf_arch", "_hf_attr", "is_deepseek_dsa", "dsa_layer_skips_topk"],
            {"PretrainedConfig": object, "Optional": None},
        )
    )


def _index_key_cache(peers: Any) -> Any:
    peers._BARE.add("sglang.srt.mem_cache")
    peers._BARE.add("sglang.kernels")
    peers._BARE.add("sglang.kernels.ops")
    peers._STUB.add("sglang.kernels.ops.kvcache", dsa_index_k_cache=None)
    peers._STUB.add("sglang.srt.constants", GPU_MEMORY_TYPE_KV_CACHE="kv_cache")
    peers._STUB.add(
        "sglang.srt.layers.attention.dsa.utils",
        INDEXER_K_CACHE_PRESHUFFLE_TILE=16,
        aiter_can_use_preshuffle_paged_mqa=lambda: False,
    )
    return importlib.import_module("sglang.srt.mem_cache.index_key_cache").IndexKeyCache


def _hisparse_allocator(peers: Any) -> Any:
    peers.import_sglang_allocators()
    peers._STUB.add(
        "sglang.srt.mem_cache.deepseek_v4_memory_pool", DeepSeekV4TokenToKVPool=object, HiSparseC4DevicePool=object
    )
    peers._STUB.add("sglang.srt.mem_cache.hisparse_memory_pool", HiSparseDSATokenToKVPool=object)
    common = peers._sglang_utils_attrs()  # the helpers compiled from the installed utils/common.py
    peers._STUB.add("sglang.srt.utils.common", get_num_new_pages=common["get_num_new_pages"])
    module = importlib.import_module("sglang.srt.mem_cache.allocator.hisparse")
    # CUDA's platform has no allocator class of its own: SGLang then takes PagedTokenToKVPoolAllocator
    module.current_platform = types.SimpleNamespace(get_paged_allocator_cls=lambda: None)
    return module.HiSparseTokenToKVPoolAllocator


class _Saver:
    def region(self, _tag: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class _KVCache:
    def register_mapping(self, mapping: Any) -> None:
        self.mapping = mapping


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    import peer_imports as peers  # type: ignore[import-not-found]  # the shared bench folder's import machinery
    import torch

    peers.install()
    peers._BARE.add("sglang")
    peers._BARE.add("sglang.srt")
    peers._BARE.add("sglang.srt.configs")
    helpers = _helpers(peers)
    results: list[Any] = []
    for case in json.load(sys.stdin):
        if case["op"] == "skips":
            config = types.SimpleNamespace(**case["config"])
            is_dsa = bool(helpers["is_deepseek_dsa"](config))
            try:
                skips: Any = [bool(helpers["dsa_layer_skips_topk"](config, i)) for i in range(case["num_layers"])]
            except AssertionError as exc:
                skips = f"AssertionError: {exc}"
            results.append({"is_deepseek_dsa": is_dsa, "skips": skips})
        elif case["op"] == "index_cache":
            cls = _index_key_cache(peers)
            pool = types.SimpleNamespace(
                page_size=case["page_size"],
                index_kpool=case["index_kpool"],
                index_head_dim=128,
                quant_block_size=128,
                index_k_with_scale_buffer_dtype=torch.uint8,
                layer_num=len(case["skip_topk_layers"]),
                skip_topk_layers=case["skip_topk_layers"],
                device="meta",
                memory_saver_adapter=_Saver(),
                custom_mem_pool=None,
            )
            cache = cls(pool, case["index_buf_size"])
            results.append([int(buffer.numel() * buffer.element_size()) for buffer in cache.buffer])
        else:
            cls = _hisparse_allocator(peers)
            kvcache = _KVCache()
            allocator = cls(
                case["size"], case["page_size"], torch.int64, "cpu", kvcache, False, host_to_device_ratio=case["ratio"]
            )
            mapping = allocator.full_to_hisparse_device_index_mapping
            results.append(
                {
                    "size_full": allocator.size_full,
                    "logical": allocator.logical_attn_allocator.size,
                    "device": allocator.hisparse_attn_allocator.size,
                    "mapping_entries": int(mapping.numel()),
                    "mapping_dtype": str(mapping.dtype),
                    "mapping_last": int(mapping[-1]),
                }
            )
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
