"""Run SGLang 0.5.23's own DeepSeek-V4 backend layout code (the peers venv, CPU): ``--dsv4-attn-backend``.

Usage: ``python sglang_dsv4_trtllm_peer.py`` with a JSON object on stdin (``selections``, ``buffers``); prints one
JSON object.

* ``selections``: per ``(backend, SGLANG_DSV4_KV_LAYOUT, SGLANG_DSV4_COMPRESSED_KV_LAYOUT, GPU major)``, what
  ``select_dsv4_kv_layout`` returns with ``get_exec().kernel.dsv4_attn_backend`` = backend, or the assertion;
* ``buffers``: per ``(qk_nope_head_dim, qk_rope_head_dim, page_size, num_pages)``,
  ``DeepSeekV4UniformFP8KVPool.get_bytes_per_token`` and the bytes, shape and dtype of the tensor its
  ``create_buffer`` allocates (on ``meta``), or its assertion.

The functions and the class are taken from ``srt/mem_cache/deepseek_v4_memory_pool.py`` by name (``ast``, with
``sglang_peer_stubs.py``'s loader) and run unchanged; the uniform pool's base class is an empty stand-in (its
``__init__`` needs a GPU allocator; ``create_buffer`` and ``get_bytes_per_token`` read only the attributes set
here).  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sglang_peer_stubs import LayoutQuery, extract, load_kv_layout, sglang_root


class _SingleKVPoolStandIn:
    """``DeepSeekV4SingleKVPool``'s place as the uniform pool's base: nothing of it is read."""


def main() -> None:
    request = json.load(sys.stdin)
    root = sglang_root()
    kv = load_kv_layout(root)
    query = LayoutQuery()
    namespace = query.namespace(kv)
    pool_file = root / "srt/mem_cache/deepseek_v4_memory_pool.py"
    extract(pool_file, {"select_dsv4_kv_layout"}, namespace)
    selections = []
    for backend, mode, option, major in request["selections"]:
        query.set(mode, option, major, backend)
        try:
            layout, opt = namespace["select_dsv4_kv_layout"]()
            selections.append({"main": layout.value, "option": opt})
        except AssertionError as exc:
            selections.append({"error": str(exc)})

    pool_ns: dict[str, Any] = {"torch": torch, "DeepSeekV4SingleKVPool": _SingleKVPoolStandIn}
    extract(pool_file, {"DeepSeekV4UniformFP8KVPool"}, pool_ns)
    uniform = pool_ns["DeepSeekV4UniformFP8KVPool"]
    buffers = []
    for nope, rope, page, pages in request["buffers"]:
        pool = uniform.__new__(uniform)
        pool.qk_nope_head_dim, pool.qk_rope_head_dim, pool.page_size, pool.device = nope, rope, page, "meta"
        try:
            buf = pool.create_buffer(num_pages=pages)
            buffers.append(
                {
                    "bytes_per_token": pool.get_bytes_per_token(),
                    "nbytes": buf.numel() * buf.element_size(),
                    "shape": list(buf.shape),
                    "dtype": str(buf.dtype),
                    "page_bytes": pool.bytes_per_page_padded,
                }
            )
        except AssertionError as exc:
            buffers.append({"error": str(exc)})
    print(json.dumps({"selections": selections, "buffers": buffers}))


if __name__ == "__main__":
    main()
