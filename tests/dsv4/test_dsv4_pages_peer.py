"""DeepSeek-V4's paged pools hold SGLang 0.5.23's page count: its own constructors, built on ``meta`` (issue 33).

SGLang 0.5.23 gives every DSV4 paged pool ``_num_dsv4_physical_kv_pages(size, page, global_page)`` =
``ceil((size + global_page) / page)`` pages (``deepseek_v4_memory_pool.py`` L166-171): the allocator reserves one
*logical* page of ``P`` tokens, which is ``ratio`` physical pages of a compressed pool of page ``P // ratio``.
kvpools gave ``kv_c4``, ``kv_c128`` and ``indexer_c4`` ``(size + page + 1) // page`` (one padding page): 3 pages
short per c4 / indexer layer and 127 per c128 layer at ``P = 256``.  ``sglang_dsv4_pages_peer.py`` runs the
installed ``DeepSeekV4SingleKVPool`` / ``DeepSeekV4IndexerPool`` unchanged.  Skips without the peers venv.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kvpools_plugins.dsv4.buffers import DSV4Sizes, dsv4_buffers, physical_pages
from kvpools_plugins.dsv4.layouts import compressed_layout, main_layout

from kvpools_core import Serving
from kvpools_core.pipeline import plan
from kvpools_core.values import Plan
from tests.dsv4.peers import run_peer
from tests.oracle import locate

PYTHON, _BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_dsv4_pages_peer.py")
FLASH = "deepseek-v4-flash"


def _case(p: Plan) -> dict[str, Any]:
    sizes = DSV4Sizes.from_config(p.sizing.sglang_config)
    b = dsv4_buffers(p.model, p.serving, sizes, max_running_requests=p.max_running_requests)
    return {
        "page_size": p.serving.page_size,
        "qk_nope_head_dim": b.qk_nope_head_dim,
        "qk_rope_head_dim": b.qk_rope_head_dim,
        "swa_size": sizes.swa_tokens,
        "layers": len(b.swa.layers),
        "kv_layout": main_layout(p.serving).name,
        "c4_size": sizes.c4_tokens,
        "c4_layers": len(b.c4.layers),
        "c4_layout": compressed_layout(p.serving, 4).name,
        "c128_size": sizes.c128_tokens,
        "c128_layers": len(b.c128.layers),
        "c128_layout": compressed_layout(p.serving, 128).name,
        "c4_logical_size": b.indexer.tokens,
        "index_head_dim": b.index_head_dim,
    }


def test_physical_pages_is_sglangs() -> None:
    grid = [
        [size, page // ratio, page]
        for size in (0, 1, 63, 64, 65, 255, 256, 257, 1000, 4097)
        for page in (64, 128, 256, 512)
        for ratio in (1, 4, 128)
        if page // ratio
    ]
    answer = run_peer(PYTHON, PEER, {"pages": grid, "pools": []})["pages"]
    assert [physical_pages(size, physical, logical) for size, physical, logical in grid] == answer


SERVINGS = {
    "tp4": Serving(tp_size=4),
    "tp4-v41": Serving(tp_size=4, dsv4_kv_layout="v41"),
    "tp4-v41-new-fp8": Serving(tp_size=4, dsv4_kv_layout="v41_new", dsv4_compressed_kv_layout="fp8"),
    "tp4-sglang-accounting": Serving(tp_size=4, accounting="sglang"),
    "pp2-rank1": Serving(pp_size=2, pp_rank=1),
}


@pytest.mark.parametrize("name", list(SERVINGS))
def test_paged_pools_are_sglangs_constructors(name: str) -> None:
    """deepseek-v4-flash on 60 GiB: every paged pool's bytes are what SGLang's own constructor allocates (the
    ``sglang`` accounting keeps ref-002's token counts, and its pools are still the bytes SGLang builds)."""
    p = plan(FLASH, SERVINGS[name], memory="60GiB")
    answer = run_peer(PYTHON, PEER, {"pages": [], "pools": [_case(p)]})["pools"][0]
    assert {"kv_swa", "kv_c4", "kv_c128", "indexer_c4"} <= set(answer)
    assert {pool: p.pool(pool).bytes for pool in answer} == {pool: got["bytes"] for pool, got in answer.items()}
    sizes = DSV4Sizes.from_config(p.sizing.sglang_config)
    b = dsv4_buffers(p.model, p.serving, sizes, max_running_requests=p.max_running_requests)
    pages = {"kv_swa": b.swa.pages, "kv_c4": b.c4.pages, "kv_c128": b.c128.pages, "indexer_c4": b.indexer.pages}
    assert pages == {pool: got["pages"] for pool, got in answer.items()}
