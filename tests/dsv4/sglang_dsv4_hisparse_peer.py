"""Run SGLang 0.5.23's own ``DeepSeekV4HiSparseTokenToKVPoolAllocator`` (the peers venv, CPU) on cases from stdin.

Usage: ``python sglang_dsv4_hisparse_peer.py BENCH_DIR`` with a JSON list of cases on stdin, each
``{"full": F, "page_size": P, "c4_tokens": n, "c128_tokens": m, "ops": [...]}``; prints one JSON list of answers:
per case the allocator's ``hisparse_page_size``, its device allocator's ``size`` and page count, the mapping's
entries and dtype, and, per op, what it returned and the state after it (the mapping, the available sizes).

An op is ``{"op": "extend", "prefix": [...], "seq": [...], "last": [...]}`` or ``{"op": "free", "slots": [...]}``.

The allocator (``mem_cache/allocator/hisparse.py``) is the installed code.  Its logical allocator is the
installed ``PagedTokenToKVPoolAllocator`` of ``F`` full slots (a DeepSeek-V4 SWA allocator whose SWA side is as
large never refuses first), and the pool it type-checks is a stand-in with the attributes the allocator reads:
``c4_logical_size``, and a c4 device pool with ``size``, ``page_size``, ``dtype``, ``device``,
``register_mapping`` and the full -> compressed translation ``HiSparseC4DevicePool`` does (a full slot that
completes a group of 4 gives its ``slot // 4``).  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from typing import Any


class _DeviceC4Pool:
    """Stands in for ``HiSparseC4DevicePool`` (what the allocator reads of it)."""

    def __init__(self, size: int, page_size: int) -> None:
        import torch

        self.size, self.page_size, self.dtype, self.device = size, page_size, torch.uint8, "cpu"
        self.mapping: Any = None

    def register_mapping(self, mapping: Any) -> None:
        self.mapping = mapping

    def translate_loc_from_full_to_compressed(self, full: Any) -> Any:
        return full[(full + 1) % 4 == 0] // 4

    def _translate_loc_to_hisparse_device(self, compressed: Any) -> Any:
        return self.mapping[compressed]

    def translate_loc_to_hisparse_device(self, compressed: Any) -> Any:
        import torch

        return self.mapping[compressed].to(torch.int32)


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    import peer_imports as peers  # type: ignore[import-not-found]  # the shared bench folder's import machinery
    import torch

    _, paged_cls, _ = peers.import_sglang_allocators()

    class DeepSeekV4TokenToKVPool:  # the names the allocator's isinstance checks look up
        pass

    class HiSparseC4DevicePool(_DeviceC4Pool):
        pass

    peers._STUB.add(
        "sglang.srt.mem_cache.deepseek_v4_memory_pool",
        DeepSeekV4TokenToKVPool=DeepSeekV4TokenToKVPool,
        HiSparseC4DevicePool=HiSparseC4DevicePool,
    )
    peers._STUB.add("sglang.srt.mem_cache.hisparse_memory_pool", HiSparseDSATokenToKVPool=object)
    common = peers._sglang_utils_attrs()
    peers._STUB.add("sglang.srt.utils.common", get_num_new_pages=common["get_num_new_pages"])
    module = importlib.import_module("sglang.srt.mem_cache.allocator.hisparse")
    module.current_platform = types.SimpleNamespace(get_paged_allocator_cls=lambda: None)
    cls = module.DeepSeekV4HiSparseTokenToKVPoolAllocator

    results: list[Any] = []
    for case in json.load(sys.stdin):
        page = case["page_size"]
        kvcache = DeepSeekV4TokenToKVPool()
        kvcache.c4_logical_size = case["c128_tokens"] * 32
        kvcache.c4_kv_pool = HiSparseC4DevicePool(case["c4_tokens"], page // 4)
        logical = paged_cls(case["full"], page, torch.int64, "cpu", kvcache, False)
        allocator = cls(logical)
        mapping = allocator.full_to_hisparse_device_index_mapping
        steps = []
        for op in case["ops"]:
            if op["op"] == "extend":
                prefix = torch.tensor(op["prefix"], dtype=torch.int64)
                seq = torch.tensor(op["seq"], dtype=torch.int64)
                last = torch.tensor(op["last"], dtype=torch.int64)
                out = allocator.alloc_extend(prefix, prefix, seq, seq, last, int((seq - prefix).sum()))
                got = None if out is None else [int(x) for x in out]
            else:
                allocator.free(torch.tensor(op["slots"], dtype=torch.int64))
                got = None
            steps.append(
                {
                    "out": got,
                    "mapping": {str(i): int(v) for i, v in enumerate(mapping.tolist()) if v != 0},
                    "available": int(allocator.available_size()),
                    "device_available": int(allocator.hisparse_attn_allocator.available_size()),
                }
            )
        results.append(
            {
                "hisparse_page_size": allocator.hisparse_page_size,
                "device_size": allocator.hisparse_attn_allocator.size,
                "device_pages": allocator.hisparse_attn_allocator.num_pages,
                "mapping_entries": int(mapping.numel()),
                "mapping_dtype": str(mapping.dtype),
                "mapping_last": int(mapping[-1]),
                "steps": steps,
            }
        )
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
