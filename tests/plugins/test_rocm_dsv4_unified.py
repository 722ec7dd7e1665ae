"""DeepSeek-V4's unified-KV pool on ROCm (issue 33, ledger rows 000-004 and 000-076): kvpools-rocm selects it
(``PlatformTraits.pool_layouts``), the dsv4 plugin plans and builds it.

SGLang 0.5.23: ``unified_fp8_for_dsv4_pool`` (ref-000 lines 138-145), ``is_unified_kv_triton`` /
``is_unified_kv_fp8`` (``layers/attention/dsv4/unified_kv_gate.py``), ``DeepSeekV4UnifiedKVPool`` and
``DeepSeekV4TokenToKVPool.__init__`` (``mem_cache/deepseek_v4_memory_pool.py``): per stage layer ``swa_pages +
c128_size x K_PER_BLOCK[ratio] + page // ratio`` rows, ``swa_pages = num_req_slots x get_swa_ring_size(window)``,
bf16 rows of ``qk_nope + qk_rope`` = 512 values (1,024 B), or a 512 B fp8 nope row (``DSV4_FP8_NOPE_ROW_BYTES``)
plus a bf16 rope row of 64 values (128 B); the c4 states per request slot (``num_req_slots x c4 ring``).

DeepSeek-V4-Flash, TP 8, 60 GiB, page 256, ratio 0.1: 43 layers (21 c4, 20 c128, 2 SWA-only), window 128.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from kvpools_plugins.dsv4.pool import DSV4TokenToKVPool

from kvpools_core import Serving, build, plan
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.values import Plan

pytestmark = pytest.mark.usefixtures("rocm_platform")
UNIFIED = {"rocm.flashmla_backend": "unified_kv_triton"}
FP8 = {**UNIFIED, "rocm.dsv4_unified_kv_fp8": "on"}
BASE = Serving(platform="rocm", tp_size=8, page_size=256, swa_full_tokens_ratio=0.1)
EAGLE: dict[str, Any] = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
    "max_running_requests": 256,
}
ROWS_PER_C128 = 21 * 32 + 20 * 1  # K_PER_BLOCK: 32 rows per c128 block in a c4 layer, 1 in a c128 layer
PAD_ROWS = 21 * (256 // 4) + 20 * (256 // 128)  # "Pad by one extra page" of each compressed layer


def _plan(options: dict[str, str], **changes: Any) -> Plan:
    return plan("deepseek-v4-flash", attrs.evolve(BASE, plugin_options=options, **changes), memory="60GiB")


def test_bf16_unified_pool_by_hand() -> None:
    """SGLang's 256 requests (``apply_deepseek_v4_defaults``) + 1 padding slot, ring 128: 257 x 128 x 43 layers x
    1,024 B = 1,448,476,672 B of ring rows; 73,570 c128 tokens x 692 rows + 1,384 padding rows, x 1,024 B =
    52,133,707,776 B; c4 states per slot: ceil((257 x 8 + 8 + 1) / 4) x 4 = 2,068 rows x 8,192 B x 21 layers =
    355,762,176 B."""
    p = _plan(UNIFIED)
    assert p.serving.traits.pool_layouts == {"dsv4": "unified_bf16"}
    assert (p.max_total_num_tokens, p.max_running_requests, p.sizing.sglang_config["c128_max_total_num_tokens"]) == (
        9416960,
        256,
        73570,
    )
    assert p.pool("unified_kv_ring").bytes == 257 * 128 * 43 * 1024 == 1448476672
    assert p.pool("unified_kv_compressed").bytes == (73570 * ROWS_PER_C128 + PAD_ROWS) * 1024 == 52133707776
    assert p.pool("c4_state").bytes == 2068 * 8192 * 21 == 355762176
    names = {pool.name for pool in p.sizing.pools}
    assert not names & {"kv_swa", "kv_c4", "kv_c128", "unified_kv_rope_ring"}
    assert {"indexer_c4", "c128_state", "full_to_swa", "swa_allocator"} <= names
    assert sum(pool.bytes for pool in p.sizing.pools) <= 60 << 30
    assert any("unified-KV DeepSeek-V4 pool (unified_bf16" in note for note in p.sizing.notes)
    assert _plan({}).max_total_num_tokens == 7805184  # the separate pools


def test_fp8_unified_pool_by_hand() -> None:
    """fp8: the nope row is 512 B and a 128 B bf16 rope row beside it: 257 slots x 128 x 43 x 512 B and x 128 B."""
    p = _plan(FP8)
    assert p.serving.traits.pool_layouts == {"dsv4": "unified_fp8"}
    assert (p.max_total_num_tokens, p.max_running_requests) == (14246144, 256)
    c128 = p.sizing.sglang_config["c128_max_total_num_tokens"]
    assert p.pool("unified_kv_ring").bytes == 257 * 128 * 43 * 512
    assert p.pool("unified_kv_rope_ring").bytes == 257 * 128 * 43 * 128
    assert p.pool("unified_kv_compressed").bytes == (c128 * ROWS_PER_C128 + PAD_ROWS) * 512
    assert p.pool("unified_kv_rope_compressed").bytes == (c128 * ROWS_PER_C128 + PAD_ROWS) * 128


@pytest.mark.parametrize("options", [UNIFIED, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("speculative", [False, True], ids=["plain", "eagle"])
def test_meta_build_allocates_what_the_plan_says(options: dict[str, str], speculative: bool) -> None:
    p = _plan(options, **(EAGLE if speculative else {}))
    pools = build(p, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.sizing.pools}
    assert isinstance(pools.kv_pool, DSV4TokenToKVPool) and pools.kv_pool.unified_kv_pool is not None
    for pool in p.sizing.pools:  # the cost model prices every pool as it is
        if pool.cost is not None:
            tokens = p.sizing.token_counts.get(pool.cost.token_space, 0)
            assert pool.cost.bytes_for(tokens=tokens, requests=p.max_running_requests) == pool.bytes, pool.name


def test_the_speculative_ring_and_the_draft_pool() -> None:
    """EAGLE with 4 draft tokens: ring 128 + 4 - 1 = 131 rows per slot; the MTP draft's one NextN layer keeps a
    ring of its own in the same layout (unified_fp8_for_dsv4_pool keeps only a DSpark draft bf16)."""
    p = _plan(FP8, **EAGLE)
    slots = 256 + 1
    assert p.pool("unified_kv_ring").bytes == slots * 131 * 43 * 512
    assert p.pool("draft_unified_kv_ring").bytes == slots * 131 * 1 * 512
    assert p.pool("draft_unified_kv_rope_ring").bytes == slots * 131 * 1 * 128
    assert "draft_kv_swa" not in {pool.name for pool in p.sizing.pools}


def test_without_the_options_the_separate_pools_stay() -> None:
    p = _plan({})
    assert p.serving.traits.pool_layouts == {}
    assert {"kv_swa", "kv_c4", "kv_c128"} <= {pool.name for pool in p.sizing.pools}
    sglang = attrs.evolve(BASE, accounting="sglang")
    a = plan("deepseek-v4-flash", attrs.evolve(sglang, plugin_options=UNIFIED), memory="60GiB")
    b = plan("deepseek-v4-flash", sglang, memory="60GiB")
    assert a.max_total_num_tokens == b.max_total_num_tokens  # ref-002's configurator sizes the same counts


@pytest.mark.parametrize(
    ("options", "changes", "words"),
    [
        (UNIFIED, {"enable_hisparse": True, "disable_radix_cache": True}, "HiSparse currently requires the separate"),
        ({"rocm.dsv4_unified_kv_fp8": "on"}, {}, "changes nothing without rocm.flashmla_backend=unified_kv_triton"),
        ({**UNIFIED, "rocm.dsv4_unified_kv_fp8": "yes"}, {}, "rocm.dsv4_unified_kv_fp8=yes: choose on or off"),
        (FP8, {"disaggregation_mode": "prefill", "pp_size": 2}, "does not support PD disaggregation with pp_size=2"),
    ],
    ids=["hisparse", "fp8-alone", "bad-switch", "fp8-pd-pp"],
)
def test_refusals(options: dict[str, str], changes: dict[str, Any], words: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match=words):
        _plan(options, **changes)


def test_round_trip_keeps_the_layout() -> None:
    p = _plan(FP8)
    again = Plan.from_json(p.to_json())
    assert again.serving.traits.pool_layouts == {"dsv4": "unified_fp8"}
    assert {pool.name: pool.bytes for pool in again.sizing.pools} == {pool.name: pool.bytes for pool in p.sizing.pools}
