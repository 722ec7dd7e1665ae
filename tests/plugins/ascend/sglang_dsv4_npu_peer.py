"""Build SGLang 0.5.23's own NPU DeepSeek-V4 pools on ``meta`` (the peers venv, CPU, no ``torch_npu``).

Usage: ``python sglang_dsv4_npu_peer.py`` with a JSON list of cases on stdin; prints one JSON list, per case the
bytes of every buffer ``DSV4NPUTokenToKVPool`` allocates (by kvpools' pool names), the request pool's
``req_to_c128_sidecar`` and the c128 allocator's arguments, or the exception SGLang raises.

The classes run unchanged, taken by name (``ast``, with ``tests/dsv4/sglang_peer_stubs.py``'s loader) from
the installed ``hardware_backend/npu/dsv4/dsv4_memory_pool.py`` (``NPUDeepSeekV4SingleKVPool``,
``NPUCompressStatePool``, ``NPUDeepSeekV4IndexerPool``, ``DSV4NPUTokenToKVPool``), their bases from
``mem_cache/deepseek_v4_memory_pool.py`` (``DeepSeekV4SingleKVPool``, ``DeepSeekV4IndexerPool``,
``DeepSeekV4TokenToKVPool`` and its helpers) and ``mem_cache/deepseek_v4_compress_state.py``
(``CompressStatePool``), ``dsv4_req_to_token_pool.py`` (``DSV4ReqToTokenTablesMixin``, ``DSV4NPUReqToTokenPool``)
over ``mem_cache/memory_pool.py``'s ``ReqToTokenPool``, and ``dsv4_allocator.py``
(``DSV4NPUTokenToKVPoolAllocator``).  Stand-ins: ``KVCache.__init__`` (its attribute assignments, the memory
saver a no-op), the runtime contexts (``get_exec`` / ``get_spec`` / ``get_platform`` / ``get_schedule``:
non-speculative, no encoder replay, ``c128_page_size`` from the case), ``is_npu_arch35`` (the case's ``arch35``),
the allocator's bases (the SWA allocator's ``__init__`` a no-op; the c128 ``NPUPagedTokenToKVPoolAllocator``
records its arguments and SGLang's ``num_pages = size // page_size``), and the unified-KV gate (off).  The
compressor state's buffer is allocated on ``meta``.  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import types
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "dsv4"))
from sglang_peer_stubs import Env, compress_state_pool, extract, load_kv_layout, sglang_root

STATE: dict[str, Any] = {"arch35": False, "c128_page_size": 16, "draft_tokens": 0}


class _Saver:
    def region(self, *_args: Any, **_kwargs: Any) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


class _KVCacheStandIn:
    """``KVCache.__init__``'s assignments (``mem_cache/memory_pool.py``), without its memory saver."""

    swa_req_ring_size = None
    request_window = None

    def __init__(
        self, size, page_size, dtype, layer_num, device, enable_memory_saver, start_layer=None, end_layer=None
    ):  # type: ignore[no-untyped-def]
        self.size, self.page_size, self.dtype, self.device = size, page_size, dtype, device
        self.store_dtype = torch.uint8 if dtype in (torch.float8_e5m2, torch.float8_e4m3fn) else dtype
        self.layer_num = layer_num
        self.start_layer = start_layer or 0
        self.end_layer = end_layer or layer_num - 1
        self.memory_saver_adapter = _Saver()
        self.custom_mem_pool = None
        self.layer_transfer_counter = None


class _SWAAllocatorStandIn:
    def __init__(self, **_kwargs: Any) -> None:
        pass


class _PagedAllocatorStandIn:
    def __init__(self, size: int, page_size: int, dtype: Any, device: str, kvcache: Any, need_sort: bool) -> None:
        self.size, self.page_size = size, page_size
        self.num_pages = size // page_size  # PagedTokenToKVPoolAllocator (mem_cache/allocator/paged.py)


def _nbytes(tensors: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _load() -> dict[str, Any]:
    root = sglang_root()
    kv = load_kv_layout(root)
    # the pool's function-local import of the unified-KV gate: off (SGLang's NPU never takes the unified path)
    gate = types.ModuleType("sglang.srt.layers.attention.dsv4.unified_kv_gate")
    gate.is_unified_kv_fp8 = lambda: False  # type: ignore[attr-defined]
    gate.is_unified_kv_triton = lambda: False  # type: ignore[attr-defined]
    sys.modules[gate.__name__] = gate

    def get_spec() -> types.SimpleNamespace:  # EAGLE with the case's draft tokens, or none
        drafts = STATE["draft_tokens"]
        return types.SimpleNamespace(
            speculative_algorithm="EAGLE" if drafts else None, speculative_num_draft_tokens=drafts or None
        )

    kernel = types.SimpleNamespace(enable_deepseek_v4_fp4_indexer=False, dsv4_attn_backend=None)
    features = types.SimpleNamespace(enable_encoder_swa_bounded_replay=False)
    envs = types.SimpleNamespace(
        SGLANG_OPT_SM120_DIRECT_SWA_KV=Env(False),
        SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=Env(False),
        SGLANG_HIP_DSV41_INDEX_K_PAGE8=Env(False),
    )
    compress_state = compress_state_pool(root)
    base: dict[str, Any] = {
        "__name__": "sglang_dsv4_base",
        "torch": torch,
        "KVCache": _KVCacheStandIn,
        "BaseSWAKVPool": _KVCacheStandIn,
        "KVLayout": kv.KVLayout,
        "is_valid_kv_layout_pair": kv.is_valid_kv_layout_pair,
        "CompressStatePool": compress_state,
        "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache",
        "nullcontext": contextlib.nullcontext,
        "ONLINE_C128": False,
        "_is_hip": False,
        "envs": envs,
        "logger": logging.getLogger("sglang_dsv4_npu_peer"),
        "get_exec": lambda: types.SimpleNamespace(kernel=kernel, features=features),
        "get_spec": get_spec,
        "get_platform": lambda: types.SimpleNamespace(is_sm120=False),
        "ceil_div": lambda a, b: -(-a // b),
        "List": list,
        "Optional": Any,
        "NamedTuple": __import__("typing").NamedTuple,
    }
    extract(
        root / "srt/mem_cache/deepseek_v4_memory_pool.py",
        {
            "get_dsv4_indexer_bytes_per_token",
            "get_compress_state_ring_size",
            "resolve_compress_state_ring_size",
            "collect_sources_by_ratio",
            "is_dspark_spec",
            "uses_draft_swa_ring",
            "get_swa_ring_size",
            "resolve_unified_kv_fp8",
            "_num_dsv4_physical_kv_pages",
            "resolve_compressed_kv_layout",
            "DeepSeekV4SingleKVPool",
            "HiSparseC4DevicePool",
            "DeepSeekV4IndexerPool",
            "_CompressedPoolConfig",
            "DeepSeekV4LayerItem",
            "DeepSeekV4TokenToKVPool",
        },
        base,
    )
    npu: dict[str, Any] = {
        "__name__": "sglang_dsv4_npu",
        "torch": torch,
        "torch_npu": types.ModuleType("torch_npu"),
        "math": math,
        "KVLayout": kv.KVLayout,
        "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache",
        "is_npu_arch35": lambda: STATE["arch35"],
        "CompressStatePool": compress_state,
        "ONLINE_C128": False,
        "DeepSeekV4IndexerPool": base["DeepSeekV4IndexerPool"],
        "DeepSeekV4SingleKVPool": base["DeepSeekV4SingleKVPool"],
        "DeepSeekV4TokenToKVPool": base["DeepSeekV4TokenToKVPool"],
        "get_schedule": lambda: types.SimpleNamespace(c128_page_size=STATE["c128_page_size"]),
        "_NPU_ARCH35_KV_QUANT_GROUP_SIZE": 64,
        "_NPU_ARCH35_KV_ROW_ALIGNMENT": 128,
    }
    npu_file = root / "srt/hardware_backend/npu/dsv4/dsv4_memory_pool.py"
    for name, value in (("_NPU_ARCH35_KV_QUANT_GROUP_SIZE", 64), ("_NPU_ARCH35_KV_ROW_ALIGNMENT", 128)):
        assert f"{name} = {value}" in npu_file.read_text(), name
    extract(
        npu_file,
        {"NPUDeepSeekV4SingleKVPool", "NPUCompressStatePool", "NPUDeepSeekV4IndexerPool", "DSV4NPUTokenToKVPool"},
        npu,
    )
    req: dict[str, Any] = {"torch": torch, "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache", "Any": Any, "Callable": Any}
    req["TorchMemorySaverAdapter"] = types.SimpleNamespace(create=lambda enable: _Saver())
    extract(root / "srt/mem_cache/memory_pool.py", {"ReqToTokenPool"}, req)
    req["get_schedule"] = npu["get_schedule"]
    req["DecodeReqToTokenPool"] = object
    extract(
        root / "srt/hardware_backend/npu/dsv4/dsv4_req_to_token_pool.py",
        {"DSV4ReqToTokenTablesMixin", "DSV4NPUReqToTokenPool"},
        req,
    )
    alloc: dict[str, Any] = {
        "torch": torch,
        "SWATokenToKVPoolAllocator": _SWAAllocatorStandIn,
        "NPUPagedTokenToKVPoolAllocator": _PagedAllocatorStandIn,
        "Optional": Any,
    }
    extract(root / "srt/hardware_backend/npu/dsv4/dsv4_allocator.py", {"DSV4NPUTokenToKVPoolAllocator"}, alloc)
    return {"pool": npu["DSV4NPUTokenToKVPool"], "req": req["DSV4NPUReqToTokenPool"], "alloc": alloc}


def run(case: dict[str, Any], classes: dict[str, Any]) -> dict[str, Any]:
    STATE["arch35"] = case["arch35"]
    STATE["c128_page_size"] = case["c128_page_size"]
    STATE["draft_tokens"] = case.get("draft_tokens", 0)
    try:
        req_pool = classes["req"](case["max_num_reqs"], case["max_context_len"], "meta", False)

        def make_pool(**stage: Any) -> Any:
            # _build_dsv4_kv_pool's arguments on an NPU; ``stage``: the layers and what depends on them
            return classes["pool"](
                max_num_reqs=case["max_num_reqs"],
                num_req_slots=req_pool.req_to_token.shape[0],
                swa_size=case["swa_size"],
                c4_size=case["c4_size"],
                c128_size=case["c128_size"],
                c4_state_pool_size=case["c4_state_pool_size"],
                c128_state_pool_size=case["c128_state_pool_size"],
                page_size=case["page_size"],
                swa_page_size=case["page_size"],
                sliding_window=case["window"],
                dtype=torch.bfloat16,  # _deepseek_v4_kv_cache_dtype: bfloat16 on an NPU
                c4_state_dtype=torch.float32,
                c128_state_dtype=torch.float32,
                qk_nope_head_dim=case["nope"],
                qk_rope_head_dim=case["rope"],
                indexer_head_dim=case["index_dim"],
                device="meta",
                enable_memory_saver=False,
                unified_fp8=False,
                kv_source_layers=[],
                full_size=case["full_size"],
                **stage,
            )

        pool = make_pool(
            layer_num=case["end"] - case["start"],
            compression_ratios=case["ratios"],
            start_layer=case["start"],
            end_layer=case["end"],
            enable_hisparse=case.get("hisparse", False),
            online_mtp_max_draft_tokens=0,
        )
    except (AssertionError, ValueError, TypeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    out: dict[str, int] = {}
    for name, sub in (("kv_swa", pool.swa_kv_pool), ("kv_c4", pool.c4_kv_pool), ("kv_c128", pool.c128_kv_pool)):
        if sub is not None and sub.kv_buffer:
            out[name] = _nbytes(sub.kv_buffer)
    ix = pool.c4_indexer_kv_pool
    if ix is not None and ix.layer_num:
        out["indexer_c4"] = _nbytes(ix.index_k_with_scale_buffer)
        out["index_k_c4"] = _nbytes(ix.index_k_buffer)
        out["index_scale_c4"] = _nbytes(ix.index_scale_buffer)
    states = {"c4_state": pool.compress_state_pools, "c4_indexer_state": pool.indexer_compress_state_pools}
    for name, pools in states.items():
        nbytes = _nbytes(p.kv_score_buffer.kv_score for p in pools if p is not None and p.ratio == 4)
        if nbytes:
            out[name] = nbytes
    c128 = _nbytes(p.kv_score_buffer.kv_score for p in pool.compress_state_pools if p is not None and p.ratio == 128)
    if c128:
        out["c128_state"] = c128
    if case.get("draft_layers"):
        # the draft worker's pool: _build_dsv4_kv_pool with COMPRESS_RATIO_NEXTN_LAYER (0) per NextN layer
        layers = case["draft_layers"]
        draft = make_pool(
            layer_num=layers,
            compression_ratios=[0] * layers,
            start_layer=0,
            end_layer=layers,
            enable_hisparse=False,
            online_mtp_max_draft_tokens=case.get("draft_tokens", 0),
        )
        states = [p for p in draft.compress_state_pools if p is not None] + [draft.c4_indexer_kv_pool]
        assert draft.c4_kv_pool is None and draft.c128_kv_pool is None and states == [None], "a draft holds SWA only"
        out["draft_kv_swa"] = _nbytes(draft.swa_kv_pool.kv_buffer)
    out["req_to_token"] = _nbytes([req_pool.req_to_token])
    out["req_to_c128_sidecar"] = _nbytes([req_pool.req_to_c128_sidecar])
    result: dict[str, Any] = {"bytes": out}
    if pool.c128_kv_pool is not None:
        allocator = classes["alloc"]["DSV4NPUTokenToKVPoolAllocator"](
            size=case["full_size"],
            size_swa=case["swa_size"],
            page_size=case["page_size"],
            dtype=torch.int32,
            device="meta",
            kvcache=pool,
            need_sort=False,
        )
        c128_alloc = allocator.c128_attn_allocator
        result["c128_allocator"] = [c128_alloc.size, c128_alloc.page_size, c128_alloc.num_pages]
        result["bytes"]["c128_page_refcount"] = _nbytes([allocator.c128_page_refcount])
    return result


def main() -> None:
    cases = json.load(sys.stdin)
    classes = _load()
    print(json.dumps([run(case, classes) for case in cases]))


if __name__ == "__main__":
    main()
