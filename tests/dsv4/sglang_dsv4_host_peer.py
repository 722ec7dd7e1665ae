"""Run SGLang 0.5.23's own DeepSeek-V4 HiCache stack builder (the peers venv, CPU) over kvpools' built pools.

Usage: ``python sglang_dsv4_host_peer.py`` with a JSON list of cases on stdin; prints a JSON list (one per case).

Each case describes one rank's device pool as kvpools builds it (on ``meta``): every layer buffer's shape, the
layouts, the ratios, the kv_source layers, the full / SWA sizes and ``--hicache-ratio``.  The peer rebuilds that
pool as ``meta`` tensors behind the attribute names SGLang reads, and runs, unchanged (taken by name with
``ast``, with ``sglang_peer_stubs.py``'s loader), ``build_deepseek_v4_hicache_stack`` of
``srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py`` with the helpers it calls
(``_resolve_deepseek_v4_layer_mappings``, ``_deepseek_v4_num_host_pages``, ``_dsv4_compressed_region_buffers``,
``_dsv4_indexer_regions``, ``_dsv4_low_ratio_regions``, ``_dsv4_low_ratio_entries``, ``_dsv4_rope_sibling``, ...),
``with_packed_draft_layer_mapping`` of ``host_pool_config.py`` and ``PoolName`` of ``hicache_storage.py``.  Each
device pool's ``bytes_per_page_padded`` is SGLang's: ``KVLayout.page_bytes(page_size)`` of
``kernels/ops/attention/dsv4/kv_layout.py`` (``DeepSeekV4SingleKVPool.create_buffer``), or ``page_size x 512``
for the uniform fp8 pool (``DeepSeekV4UniformFP8KVPool.create_buffer``).

Only the host pool classes are recording stand-ins (their constructors pin host memory): each entry reports
what the stack builder hands them -- ``LogicalHostPool``'s size, a ``DeepSeekV4PagedHostPool``'s layer count
(``len(device_buffers)``), ``item_bytes`` and ``num_host_pages``, a ``DeepSeekV4StateHostPool``'s layer count
and pages.  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple, Optional

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sglang_peer_stubs import extract, load_kv_layout, sglang_root

STACK_FUNCTIONS = {
    "_DeepSeekV4LayerMappings",
    "_resolve_deepseek_v4_layer_mappings",
    "_deepseek_v4_num_host_pages",
    "_dsv4_compressed_region_buffers",
    "_require_single_row_dsv4_swa_pages",
    "_dsv4_page_aligned_only",
    "_IndexerRegion",
    "_dsv4_indexer_regions",
    "_dsv4_low_ratio_regions",
    "_dsv4_low_ratio_entries",
    "_dsv4_rope_sibling",
    "_build_dsv4_rope_entry",
    "build_deepseek_v4_hicache_stack",
}


class _Logical:
    def __init__(self, size: int, page_size: int, layout: str = "layer_first") -> None:
        self.record = {"kind": "logical", "size": size, "page_size": page_size}


class _Paged:
    def __init__(self, *, pool_name: str, device_buffers: list, item_bytes: int, num_host_pages: int, **_: Any):
        self.record = {
            "kind": "paged",
            "layers": len(device_buffers),
            "item_bytes": int(item_bytes),
            "num_host_pages": num_host_pages,
        }


class _State:
    def __init__(self, *, pool_name: str, state_pools: list, num_host_pages: int, **_: Any):
        self.record = {"kind": "state", "layers": len(state_pools), "num_host_pages": num_host_pages}


def _entry(*, name: Any, host_pool: Any, **_: Any) -> tuple[str, dict[str, Any]]:
    return str(name.value), host_pool.record


class _Group:
    def __init__(self, entries: list) -> None:
        self.entries = entries


def _kv_pool(spec: dict[str, Any] | None, kv_layout: Any) -> Any:
    """A paged KV pool: its layer buffers as ``meta`` uint8 tensors of kvpools' shapes, SGLang's padded page."""
    if spec is None:
        return None
    page = spec["page_size"]
    if spec["layout"] == "uniform_fp8":
        padded = page * 512  # DeepSeekV4UniformFP8KVPool.create_buffer
        layout = kv_layout.V4
    else:
        layout = kv_layout.parse(spec["layout"])
        padded = layout.page_bytes(page)  # DeepSeekV4SingleKVPool.create_buffer
    for shape in spec["buffers"]:  # create_buffer allocates (num_pages, bytes_per_page_padded)
        assert shape[1] == padded, f"kvpools' {spec['layout']} page of {page} rows is {shape[1]} B, SGLang's {padded} B"
    buffers = [torch.empty(shape, dtype=torch.uint8, device="meta") for shape in spec["buffers"]]
    return types.SimpleNamespace(kv_buffer=buffers, page_size=page, bytes_per_page_padded=padded, kv_layout=layout)


def _index_pool(spec: dict[str, Any]) -> Any:
    buffers = [torch.empty(shape, dtype=torch.uint8, device="meta") for shape in spec["buffers"]]
    return types.SimpleNamespace(index_k_with_scale_buffer=buffers, page_size=spec["page_size"])


def _run(case: dict[str, Any], namespace: dict[str, Any], kv_layout: Any) -> list[tuple[str, dict[str, Any]]]:
    memory = namespace["_memory"]
    memory.hicache_ratio = case["hicache_ratio"]
    ratios = case["ratios"]
    start, end = case["start_layer"], case["end_layer"]
    counts: dict[int, int] = {}
    mapping = []
    for ratio in ratios:
        mapping.append(types.SimpleNamespace(compress_ratio=ratio, compress_layer_id=counts.get(ratio, 0)))
        counts[ratio] = counts.get(ratio, 0) + 1
    c4_layers = [i for i in range(start, end) if ratios[i] == 4]
    states = [object() if i in c4_layers else None for i in range(len(ratios))]
    kvcache = types.SimpleNamespace(
        size=case["full_tokens"],
        start_layer=start,
        end_layer=end,
        layer_mapping=mapping,
        swa_size=case["swa_tokens"],
        swa_page_size=case["page_size"],
        swa_kv_pool=_kv_pool(case["swa"], kv_layout),
        c4_kv_pool=_kv_pool(case["c4"], kv_layout),
        c128_kv_pool=_kv_pool(case["c128"], kv_layout),
        c4_indexer_kv_pool=_index_pool(case["indexer_c4"]) if case["indexer_c4"] else None,
        compress_state_pools=states,
        indexer_compress_state_pools=states,
        sources_by_ratio={int(r): s for r, s in case["sources_by_ratio"].items()},
        kv_pools={int(r): _kv_pool(s, kv_layout) for r, s in case["low_kv"].items()},
        index_pools={int(r): _index_pool(s) for r, s in case["low_index"].items()},
    )
    drafts = [types.SimpleNamespace(swa_kv_pool=_kv_pool(case["draft_swa"], kv_layout))] if case["draft_swa"] else []
    allocator = types.SimpleNamespace(
        size_full=case["full_tokens"], swa_attn_allocator=types.SimpleNamespace(alloc=None, free=None)
    )
    params = types.SimpleNamespace(
        page_size=case["page_size"],
        token_to_kv_pool_allocator=allocator,
        mtp_draft_device_pools=drafts,
        tp_cache_group=None,
        attn_cp_cache_group=None,
        attn_tp_cache_group=None,
        pp_cache_group=None,
    )
    group, _ = namespace["build_deepseek_v4_hicache_stack"](
        params=params, kvcache=kvcache, load_cache_event=None, storage_backend=None
    )
    return group.entries


def main() -> None:
    cases = json.load(sys.stdin)
    root = sglang_root()
    kv_layout = load_kv_layout(root).KVLayout
    memory = types.SimpleNamespace(
        hicache_size=0,
        hicache_ratio=2.0,
        hicache_mem_layout="layer_first",
        hicache_write_policy="write_through",
        hicache_io_backend="kernel",
        hicache_host_memory_mode="cache",
    )
    namespace: dict[str, Any] = {
        "__name__": "sglang_dsv4_hicache_stack",
        "Enum": Enum,
        "dataclass": dataclass,
        "field": field,
        "Any": Any,
        "Callable": Callable,
        "NamedTuple": NamedTuple,
        "Optional": Optional,
        "_memory": memory,
        "get_memory": lambda: memory,
        "LogicalHostPool": _Logical,
        "DeepSeekV4PagedHostPool": _Paged,
        "DeepSeekV4StateHostPool": _State,
        "build_pool_entry": _entry,
        "HostPoolGroup": _Group,
        "HybridCacheController": lambda *args, **kwargs: None,
        "_get_allocator_type": lambda: "default",
    }
    # dataclasses resolves the postponed annotations through the defining module
    sys.modules[namespace["__name__"]] = types.ModuleType(namespace["__name__"])
    extract(root / "srt/mem_cache/hicache_storage.py", {"PoolName"}, namespace)
    extract(root / "srt/mem_cache/hybrid_cache/host_pool_config.py", {"with_packed_draft_layer_mapping"}, namespace)
    extract(root / "srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py", STACK_FUNCTIONS, namespace)
    out = []
    for case in cases:
        try:
            out.append({"entries": _run(case, namespace, kv_layout)})
        except (AssertionError, ValueError) as exc:
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
