"""DeepSeek-V4's per-request SWA ring on the target (issue 33, ledger row 000-024).

SGLang 0.5.23: the unified-KV ``DeepSeekV4TokenToKVPool`` sets ``swa_req_ring_size = get_swa_ring_size(window,
speculative)`` (``mem_cache/deepseek_v4_memory_pool.py`` lines 1196-1224) and keeps the paged SWA allocator
(``needs_paged_swa_allocator``, line 1134), so ref-000 lines 2118-2128 build ``SWATokenToKVPoolAllocator(...,
req_to_token_pool=...)``, which runs in ring mode (``mem_cache/allocator/swa.py`` lines 128-151):
``swa_ring_cost_tokens = ceil(ring / page) x page``, ``size_swa = req_to_token_pool.available_size() x cost``;
ref-000 ``configure`` lines 377-387 report that as ``swa_max_total_num_tokens``.

DeepSeek-V4-Flash on ROCm (kvpools-rocm's ``rocm.flashmla_backend=unified_kv_triton``), TP 8, 60 GiB, ratio 0.1:
window 128, 256 requests (``apply_deepseek_v4_defaults``), request table rows 1..256 free.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from kvpools_plugins.dsv4.swa_req_ring import RING_COST, RING_TOTAL, ring_capacity

from kvpools_core import Serving, build, plan
from kvpools_core.allocators.swa_ring import SWARingTokenToKVPoolAllocator, is_swa_req_ring
from kvpools_core.values import Plan, PlatformTraits

pytestmark = pytest.mark.usefixtures("rocm_platform")
UNIFIED = {"rocm.flashmla_backend": "unified_kv_triton"}
FP8 = {**UNIFIED, "rocm.dsv4_unified_kv_fp8": "on"}
EAGLE: dict[str, Any] = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
    "max_running_requests": 256,
}


def _plan(options: dict[str, str], page: int = 256, **changes: Any) -> Plan:
    serving = Serving(platform="rocm", tp_size=8, page_size=page, swa_full_tokens_ratio=0.1, plugin_options=options)
    return plan("deepseek-v4-flash", attrs.evolve(serving, **changes), memory="60GiB")


@pytest.mark.parametrize(
    ("page", "speculative", "cost"),
    [
        (256, False, 256),  # ring 128 -> one 256-token page
        (256, True, 256),  # ring 128 + 4 - 1 = 131 -> one page
    ],
    ids=["p256", "p256-eagle"],
)
def test_the_swa_capacity_is_the_ring_total(page: int, speculative: bool, cost: int) -> None:
    p = _plan(UNIFIED, page, **(EAGLE if speculative else {}))
    config = p.sizing.sglang_config
    assert p.max_running_requests == 256
    assert (config[RING_COST], config[RING_TOTAL]) == (cost, 256 * cost)
    # the sizer's paged count stays: it sizes the vestigial SWA free list and the c4 states
    assert config["swa_max_total_num_tokens"] == int(p.max_total_num_tokens * 0.1) // page * page
    assert any(f"= {256 * cost:,} SWA tokens" in note for note in p.sizing.notes)


@pytest.mark.parametrize(
    ("window", "page", "speculative", "cost"),
    [(128, 64, False, 128), (128, 64, True, 192), (100, 64, False, 128), (128, 128, True, 256)],
)
def test_the_ring_cost_is_the_ring_in_whole_pages(window: int, page: int, speculative: bool, cost: int) -> None:
    """``_swa_ring_cost = ceil(ring / page) x page`` (swa.py lines 139-141): 131 rows in 64-token pages is 192;
    a decode node's pre-allocated rows are request slots too (``DecodeReqToTokenPool``)."""
    traits = PlatformTraits(platform="rocm", pool_layouts={"dsv4": "unified_bf16"})
    serving = Serving(page_size=page, platform_traits=traits, **(EAGLE if speculative else {}))
    assert ring_capacity(serving, window, 10) == {RING_COST: cost, RING_TOTAL: 10 * cost}
    decode = attrs.evolve(serving, disaggregation_mode="decode")
    extra = decode.decode_extra_slots
    assert ring_capacity(decode, window, 10) == {RING_COST: cost, RING_TOTAL: (10 + extra) * cost}


def test_the_separate_pools_keep_paged_swa() -> None:
    config = _plan({}).sizing.sglang_config
    assert RING_COST not in config and RING_TOTAL not in config


@pytest.mark.parametrize("options", [UNIFIED, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "eagle"])
def test_meta_build_takes_the_ring_allocator(options: dict[str, str], speculative: bool) -> None:
    """The built allocator is SGLang's in ring mode: its ``size_swa`` is the plan's ring total, the bytes are the
    plan's (the vestigial paged SWA free list included), and the free SWA capacity follows the request table."""
    p = _plan(options, **(EAGLE if speculative else {}))
    pools = build(p, "meta")
    alloc = pools.allocator
    assert isinstance(alloc, SWARingTokenToKVPoolAllocator) and is_swa_req_ring(alloc)
    assert alloc.swa_ring_cost_tokens == p.sizing.sglang_config[RING_COST] == 256
    assert alloc.size_swa == p.sizing.sglang_config[RING_TOTAL] == 256 * 256
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.sizing.pools}
    assert alloc.available_size() == alloc.full_available_size() == p.sizing.sglang_config["full_max_total_num_tokens"]
    rows = pools.req_to_token_pool.alloc(3)
    assert rows is not None and alloc.swa_available_size() == (256 - 3) * 256
    pools.req_to_token_pool.free(rows)
    assert alloc.swa_available_size() == alloc.size_swa


def test_separate_pools_keep_the_paged_allocator() -> None:
    alloc = build(_plan({}), "meta").allocator
    assert not is_swa_req_ring(alloc) and not isinstance(alloc, SWARingTokenToKVPoolAllocator)
