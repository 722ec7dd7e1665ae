"""Run SGLang 0.5.23's own DeepSeek-V4 layout and kv_source arithmetic (the peers venv, CPU).

Usage: ``python sglang_dsv4_layout_peer.py`` with a JSON object on stdin (``page_sizes``, ``selections``,
``pools``); prints one JSON object.

* ``layouts``: per ``KVLayout`` of ``kernels/ops/attention/dsv4/kv_layout.py`` (loaded as it is), its
  ``bytes_per_token`` and ``page_bytes(P)`` for every page size asked;
* ``selections``: per ``(SGLANG_DSV4_KV_LAYOUT, SGLANG_DSV4_COMPRESSED_KV_LAYOUT, GPU major)``, what
  ``select_dsv4_kv_layout`` returns on a CUDA GPU of that compute capability (10: SM100) and each ratio's
  ``resolve_compressed_kv_layout``, or the assertion it raises;
* ``pools``: per case (compress ratios, kv_source ids, stage, full size, page, request slots, draft tokens), the
  ratio-1/2 pools' bytes as ``DeepSeekV4TokenToKVPool._init_compressed_pools`` /
  ``_init_paged_compress_states`` size them, composed from the module's own ``collect_sources_by_ratio``,
  ``_num_dsv4_physical_kv_pages``, ``get_dsv4_indexer_bytes_per_token``, ``get_compress_state_ring_size``,
  ``KVLayout.page_bytes`` and ``CompressStatePool`` (its constructor, with the buffer allocated on ``meta``).

The functions are taken from ``srt/mem_cache/deepseek_v4_memory_pool.py`` and ``deepseek_v4_compress_state.py``
by name (``ast``) and run unchanged; only their module globals (the environment switches, the GPU query, the HIP
flag) are inert stand-ins, because the modules' own imports need SGLang's whole dependency tree.  This file runs
in the peers venv, never under pytest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from sglang_peer_stubs import Env, LayoutQuery, compress_state_pool, extract, load_kv_layout, sglang_root


def main() -> None:
    request = json.load(sys.stdin)
    root = sglang_root()
    kv = load_kv_layout(root)
    KVLayout = kv.KVLayout

    layouts = {
        layout.value: {
            "bytes_per_token": layout.bytes_per_token,
            "page_bytes": {str(p): layout.page_bytes(p) for p in request["page_sizes"]},
        }
        for layout in KVLayout
    }

    query = LayoutQuery()
    namespace = query.namespace(kv, SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=Env(False))
    namespace.update(
        is_valid_kv_layout_pair=kv.is_valid_kv_layout_pair, ONLINE_C128=False, ceil_div=lambda a, b: -(-a // b)
    )
    pool_file = root / "srt/mem_cache/deepseek_v4_memory_pool.py"
    extract(
        pool_file,
        {
            "select_dsv4_kv_layout",
            "resolve_compressed_kv_layout",
            "collect_sources_by_ratio",
            "_num_dsv4_physical_kv_pages",
            "get_dsv4_indexer_bytes_per_token",
            "get_compress_state_ring_size",
        },
        namespace,
    )
    selections = []
    for mode, option, major in request["selections"]:
        query.set(mode, option, major)
        try:
            main_layout, opt = namespace["select_dsv4_kv_layout"]()
            compressed = {
                str(r): namespace["resolve_compressed_kv_layout"](main_layout, r, opt).value for r in (1, 2, 4, 128)
            }
            selections.append({"main": main_layout.value, "compressed": compressed})
        except AssertionError as exc:
            selections.append({"error": str(exc)})

    CompressStatePool = compress_state_pool(root)

    pools = []
    for case in request["pools"]:
        ratios, stage = case["ratios"], range(case["start"], case["end"])
        full, page = case["full_size"], case["page_size"]
        main_layout = KVLayout(case["kv_layout"])
        option = case["option"]
        sources = namespace["collect_sources_by_ratio"](ratios, case["kv_source_layers"], stage)
        out: dict[str, Any] = {"sources": {str(r): v for r, v in sources.items()}, "bytes": {}}
        for ratio in (1, 2):
            layers = sources.get(ratio)
            if not layers:
                continue
            layout = namespace["resolve_compressed_kv_layout"](main_layout, ratio, option)
            # _make_kv_pool(size=full_size // ratio, page_size=page_size // ratio, global_page_size=page_size)
            pages = namespace["_num_dsv4_physical_kv_pages"](full // ratio, page // ratio, page)
            out["bytes"][f"kv_c{ratio}"] = pages * layout.page_bytes(page // ratio) * len(layers)
            # _make_indexer_pool((full_size + page_size) // ratio, DSV41_INDEX_PAGE_SIZE, force_fp4=True)
            index_page = case["index_page_size"]
            index_pages = namespace["_num_dsv4_physical_kv_pages"]((full + page) // ratio, index_page, index_page)
            row = namespace["get_dsv4_indexer_bytes_per_token"](case["index_head_dim"], True)
            out["bytes"][f"indexer_c{ratio}"] = index_pages * index_page * row * len(layers)
        if sources.get(2):
            ring = namespace["get_compress_state_ring_size"](2, case["draft_tokens"])
            state = CompressStatePool(
                size=case["num_req_slots"] * ring,
                ring_size=ring,
                overlap=False,
                head_dim=case["head_dim"],
                dtype=torch.float32,
                device="meta",
                enable_memory_saver=False,
                ratio=2,
                request_scoped=True,
                online=False,
            )
            buf = state.kv_score_buffer.kv_score
            out["ring"] = ring
            out["bytes"]["c2_pair_state"] = buf.numel() * buf.element_size() * len(sources[2])
        pools.append(out)
    print(json.dumps({"layouts": layouts, "selections": selections, "pools": pools}))


if __name__ == "__main__":
    main()
