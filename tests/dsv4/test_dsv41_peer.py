"""DeepSeek-V4's KV layouts and V4.1's kv_source pools against SGLang 0.5.23's own code (issue 33).

``sglang_dsv4_layout_peer.py`` runs, in the peers venv, the installed ``KVLayout`` (``kv_layout.py``), and
``select_dsv4_kv_layout``, ``resolve_compressed_kv_layout``, ``collect_sources_by_ratio``,
``_num_dsv4_physical_kv_pages``, ``get_dsv4_indexer_bytes_per_token``, ``get_compress_state_ring_size`` and
``CompressStatePool`` of ``deepseek_v4_memory_pool.py`` / ``deepseek_v4_compress_state.py``, unchanged.  Skips
without the peers venv (fails under ``KVPOOLS_REQUIRE_SHARED=1``), as every peer test.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from kvpools_plugins.dsv4.buffers import DSV4Sizes, dsv4_buffers
from kvpools_plugins.dsv4.layouts import LAYOUTS, compressed_layout, layout_problems, main_layout
from kvpools_plugins.dsv4.low_ratio import DSV41_INDEX_PAGE_SIZE

from kvpools_core import Serving
from kvpools_core.pipeline import plan
from kvpools_core.values import Plan
from tests.dsv4.peers import run_peer
from tests.oracle import locate

PYTHON, _BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_dsv4_layout_peer.py")
V4_SOURCES = str(Path(__file__).with_name("configs") / "dsv4_kv_source_synthetic.json")
"""The same layers under ``model_type`` ``deepseek_v4``: SGLang's V4.1 feature gate (no EAGLE, no PP) is off."""
V41 = Path(__file__).with_name("configs") / "dsv41_synthetic.json"
PAGES = [1, 2, 64, 128, 256]
MODES = ("auto", "v4", "v41", "v41_new")
OPTIONS = ("auto", "fp8", "fp4")


def test_layout_bytes_are_sglangs_kv_layout() -> None:
    answer = run_peer(PYTHON, PEER, {"page_sizes": PAGES, "selections": [], "pools": []})
    for name, layout in LAYOUTS.items():
        sglang = answer["layouts"][name]
        assert layout.bytes_per_token == sglang["bytes_per_token"], name
        assert {str(p): layout.page_bytes(p) for p in PAGES} == sglang["page_bytes"], name


def test_layout_selection_is_select_dsv4_kv_layout() -> None:
    """Explicit modes against an SM100 GPU (where every mode is legal); ``auto`` against an SM90 GPU, the answer
    kvpools plans for it (it sees no GPU)."""
    grid = list(itertools.product(MODES, OPTIONS))
    selections = [[mode, opt, 9 if mode == "auto" else 10] for mode, opt in grid]
    answer = run_peer(PYTHON, PEER, {"page_sizes": [], "selections": selections, "pools": []})
    model = plan(str(V41), Serving(), memory="20GiB").model
    for (mode, opt), sglang in zip(grid, answer["selections"], strict=True):
        serving = Serving(dsv4_kv_layout=mode, dsv4_compressed_kv_layout=opt)
        problems = layout_problems(model, serving)
        if "error" in sglang:
            assert any(sglang["error"] in p for p in problems), (mode, opt, problems)
            continue
        assert not problems, (mode, opt, problems)
        assert main_layout(serving).name == sglang["main"], (mode, opt)
        for ratio, name in sglang["compressed"].items():
            assert compressed_layout(serving, int(ratio)).name == name, (mode, opt, ratio)


SERVINGS = [
    Serving(),
    Serving(dsv4_kv_layout="v41"),
    Serving(dsv4_kv_layout="v41_new", dsv4_compressed_kv_layout="fp8"),
    Serving(dsv4_kv_layout="v41", dsv4_compressed_kv_layout="fp4"),
    Serving(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=1,
            speculative_num_draft_tokens=4, speculative_draft_num_layers=1),
    Serving(pp_size=2, pp_rank=0, max_running_requests=64),
]  # fmt: skip


def _case(p: Plan) -> dict[str, Any]:
    sizes = DSV4Sizes.from_config(p.sizing.sglang_config)
    b = dsv4_buffers(p.model, p.serving, sizes, max_running_requests=p.max_running_requests)
    params = p.model.params
    return {
        "ratios": list(params["compress_ratios"]),
        "kv_source_layers": list(params["kv_source_layer_ids"]),
        "start": b.start_layer,
        "end": b.end_layer,
        "full_size": sizes.full_tokens,
        "page_size": p.serving.page_size,
        "kv_layout": main_layout(p.serving).name,
        "option": None if p.serving.dsv4_compressed_kv_layout == "auto" else p.serving.dsv4_compressed_kv_layout,
        "index_page_size": DSV41_INDEX_PAGE_SIZE,
        "index_head_dim": params["index_head_dim"],
        "draft_tokens": (p.serving.speculative_num_draft_tokens or 0) if p.serving.speculative else 0,
        "num_req_slots": b.num_req_slots,
        "head_dim": b.head_dim,
    }


@pytest.mark.parametrize("serving", SERVINGS, ids=["v4", "v41", "v41-new-fp8", "v41-fp4", "eagle", "pp2-rank0"])
def test_low_ratio_pools_are_sglangs(serving: Serving) -> None:
    model = V4_SOURCES if serving.speculative or serving.pp_size > 1 else str(V41)
    p = plan(model, serving, memory="20GiB")
    case = _case(p)
    answer = run_peer(PYTHON, PEER, {"page_sizes": [], "selections": [], "pools": [case]})["pools"][0]
    assert answer["bytes"], answer
    planned = {name: p.pool(name).bytes for name in answer["bytes"]}
    assert planned == answer["bytes"]
    if "ring" in answer:  # the pair state's ring: 2, or 1 << (4 + 1).bit_length() = 8 under 4 draft tokens
        assert answer["ring"] == (8 if serving.speculative else 2)


def test_a_stage_without_the_source_is_what_sglang_cannot_map() -> None:
    """PP rank 1 of the synthetic model holds layer 6 (ratio 2) but not its source, layer 2: SGLang's
    ``collect_sources_by_ratio`` finds no ratio-2 source there (so ``source_layer_of`` fails); kvpools refuses."""
    p = plan(V4_SOURCES, Serving(pp_size=2, pp_rank=0, max_running_requests=64), memory="20GiB")
    case = _case(p) | {"start": 4, "end": 8}
    answer = run_peer(PYTHON, PEER, {"page_sizes": [], "selections": [], "pools": [case]})["pools"][0]
    assert "2" not in answer["sources"]
    assert answer["sources"] == {"4": [4], "128": [5]}
