"""Build SGLang 0.5.23's own DeepSeek-V4 paged pools on ``meta`` (the peers venv, CPU) and report their bytes.

Usage: ``python sglang_dsv4_pages_peer.py`` with a JSON object on stdin (``pages``, ``pools``); prints one
JSON object.

* ``pages``: per ``[size, physical_page, logical_page]``, ``_num_dsv4_physical_kv_pages`` as installed;
* ``pools``: per case, the constructors ``DeepSeekV4TokenToKVPool`` calls on CUDA (``_make_kv_pool`` /
  ``_make_indexer_pool``, ``deepseek_v4_memory_pool.py`` of 0.5.23): ``DeepSeekV4SingleKVPool(swa_size,
  swa_page_size, global_page_size=swa_page_size)`` for ``kv_swa``, ``(c4_size, P // 4, global_page_size=P)`` /
  ``(c128_size, P // 128, global_page_size=P)`` for ``kv_c4`` / ``kv_c128`` (``_init_compressed_pools``), and
  ``DeepSeekV4IndexerPool(c4_logical_size, P // 4, global_page_size=P, use_fp4_indexer=False)`` for
  ``indexer_c4``; each pool's bytes are the sum of the buffers its own ``_create_buffers`` / ``_create_buffer``
  allocated (on ``meta``), with their page count.

The two classes are SGLang's source, taken by name (``ast``) and run unchanged; only their base ``KVCache`` is a
stand-in that keeps the attributes its ``__init__`` sets (size, page size, dtype, the uint8 store dtype, the
layer count, the device, an inert memory-saver region, no custom memory pool), because the module's own imports
need SGLang's whole dependency tree.  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import json
import sys
import types
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sglang_peer_stubs import extract, load_kv_layout, sglang_root


class _Saver:
    def region(self, *_: Any) -> Any:
        return nullcontext()


class _KVCache:
    """``memory_pool.KVCache.__init__``'s attributes (L2013-2052), on ``meta`` and without a custom pool."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        layer_num: int,
        device: str,
        enable_memory_saver: bool,
        start_layer: int | None = None,
        end_layer: int | None = None,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self.store_dtype = torch.uint8 if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else dtype
        self.layer_num = layer_num
        self.memory_saver_adapter = _Saver()
        self.custom_mem_pool = None


def _nbytes(buffers: list[torch.Tensor] | None) -> int:
    return sum(b.numel() * b.element_size() for b in buffers or [])


def main() -> None:
    request = json.load(sys.stdin)
    root = sglang_root()
    kv = load_kv_layout(root)
    namespace: dict[str, Any] = {
        "__name__": "sglang_dsv4_pool_classes",
        "KVCache": _KVCache,
        "KVLayout": kv.KVLayout,
        "torch": torch,
        "nullcontext": nullcontext,
        "GPU_MEMORY_TYPE_KV_CACHE": "kv_cache",
        "ceil_div": lambda a, b: -(-a // b),
        "_is_hip": False,
        "get_exec": lambda: types.SimpleNamespace(kernel=types.SimpleNamespace(enable_deepseek_v4_fp4_indexer=False)),
    }
    extract(
        root / "srt/mem_cache/deepseek_v4_memory_pool.py",
        {
            "_num_dsv4_physical_kv_pages",
            "get_dsv4_indexer_bytes_per_token",
            "DeepSeekV4SingleKVPool",
            "DeepSeekV4IndexerPool",
        },
        namespace,
    )
    pages_of = namespace["_num_dsv4_physical_kv_pages"]
    KVPool, IndexerPool = namespace["DeepSeekV4SingleKVPool"], namespace["DeepSeekV4IndexerPool"]
    fp8 = torch.float8_e4m3fn

    def built(case: dict[str, Any]) -> dict[str, Any]:
        page, nope, rope = case["page_size"], case["qk_nope_head_dim"], case["qk_rope_head_dim"]
        out: dict[str, Any] = {}
        kv_pools = (
            ("kv_swa", case["swa_size"], page, case["layers"], case["kv_layout"]),
            ("kv_c4", case["c4_size"], page // 4, case["c4_layers"], case["c4_layout"]),
            ("kv_c128", case["c128_size"], page // 128, case["c128_layers"], case["c128_layout"]),
        )
        for name, size, page_size, layers, layout in kv_pools:
            if not layers:
                continue
            # _make_kv_pool(..., global_page_size=page_size of the schedule) for every one of them
            pool = KVPool(
                size, page_size, fp8, nope, rope, layers, "meta", False, kv_layout=layout, global_page_size=page
            )
            out[name] = {"bytes": _nbytes(pool.kv_buffer), "pages": pool.kv_buffer[0].shape[0]}
        if case["c4_layers"]:
            ix = IndexerPool(
                case["c4_logical_size"], page // 4, fp8, case["index_head_dim"], case["c4_layers"], "meta", False,
                use_fp4_indexer=False, global_page_size=page,
            )  # fmt: skip
            out["indexer_c4"] = {
                "bytes": _nbytes(ix.index_k_with_scale_buffer),
                "pages": ix.index_k_with_scale_buffer[0].shape[0],
            }
        return out

    pools = [built(case) for case in request["pools"]]
    pages = [pages_of(size, physical, logical) for size, physical, logical in request["pages"]]
    print(json.dumps({"pages": pages, "pools": pools}))


if __name__ == "__main__":
    main()
