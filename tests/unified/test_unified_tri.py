"""The unified tri-pool (issue 31 / 33): state (grow-up END) | SWA KV (floating middle) | full KV (grow-down END).

An Inkling-class model (``inkling-defaults``: 4 full layers and 12 sliding layers of 4 KV heads x 128, a
short-conv state of 491,520 B per slot) under ``--enable-unified-memory``.  SGLang 0.5.23 references:
``mem_cache/kv_cache_configurator.py`` ``_init_unified_mamba_swa_pools`` and ``config_from_budget`` (KVC),
``mem_cache/unified_memory_pool.py`` ``init_unified_mamba_swa_pools`` / ``UnifiedKVPool`` /
``_reserved_floor_bytes`` (UMP), ``allocator/unified_hybrid_swa.py``
``UnifiedMambaSWATokenToKVPoolAllocator`` (UHS), ``model_executor/pool_configurator.py``
``HybridSWAPoolConfigurator._max_unified_full_tokens`` (PC).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvpools_plugins.mamba.inkling import kv_budget_bytes

from kvpools_core import Serving, build, plan
from kvpools_core.errors import KvpoolsError
from kvpools_core.values import Plan
from tests.oracle import locate
from tests.unified.peer import Peer

PRESET = "inkling-defaults"
ON = {"enable_mamba_extra_buffer": True, "enable_unified_memory": True}
STATE = {"kind": "mamba", "name": "mamba", "grow": "up", "conv": [[3, 512]] * 4 + [[3, 1_536]] * 2}


def _plan(memory: str = "20GiB", **serving: Any) -> Plan:
    return plan(PRESET, Serving(**{"accounting": "sglang", **ON, **serving}), memory=memory)


def test_the_tri_pool_plan_by_hand() -> None:
    """20 GiB, TP 1, page 1, bf16.

    * the KV budget after ``_handle_max_mamba_cache`` (K = 3,970 slots of 491,520 B) is 19,523,010,560 B, a
      multiple of 4,096 (KVC ``config_from_budget``), and the state rides on top (UMP): arena =
      19,523,010,560 + 3,970 x 491,520 = 21,474,344,960 B;
    * entries (UMP, token-major): full 4 layers x 2 x 4 x 128 x 2 B = 8,192; SWA 12 x 2,048 = 24,576;
      state 16 x 3 x 5,120 x 2 B = 491,520 (raw);
    * sink = max(largest entry, page x each KV entry) = 491,520; max_slots = arena // entry;
    * the full END reaches 21,474,344,960 // 8,192 = 2,621,380 slots less the state END's first slot
      (491,520 B = 60 full slots): 2,621,320 tokens in the empty arena;
    * one state slot costs ceil(491,520 / (8,192 + 24,576)) = 15 tokens of joint budget (UHS).
    """
    p = _plan()
    (arena,) = p.sizing.arenas
    assert arena.bytes == 19_523_010_560 + 3_970 * 491_520 == 21_474_344_960
    assert arena.sink_bytes == 491_520
    subs = {s.pool: (s.grows, s.entry_bytes, s.max_slots, s.min_slot_index) for s in arena.sub_pools}
    assert subs == {
        "kv_full": ("down", 8_192, 2_621_380, 60),
        "kv_swa": ("float", 24_576, 873_793, 20),
        "mamba_state": ("up", 491_520, 43_689, 1),
    }
    assert p.max_total_num_tokens == 2_621_380 - 60 == 2_621_320
    assert arena.labels["mamba_slot_full_token_cost"] == 15
    assert arena.labels["max_mamba_cache_size"] == 3_970
    assert p.max_running_requests == 794  # K // 5, as the static split
    # the bs=1 floor: one window + a page of SWA KV, three state slots, the sink
    assert arena.floor_bytes == 513 * 24_576 + 3 * 491_520 + 491_520


@pytest.mark.parametrize(("serving", "memory"), [({}, "20GiB"), ({"accounting": "exact", "page_size": 16}, "3GiB")])
def test_build_on_meta_allocates_the_plan_to_the_byte(serving: dict[str, Any], memory: str) -> None:
    p = _plan(memory, **serving)
    pools = build(p, "meta")
    assert pools.allocated_bytes == p.planned_bytes
    assert pools.allocated_by_pool() == {q.name: q.bytes for q in p.pools if q.arena is None}
    assert pools.allocator.full_attn_allocator.available_size() == p.max_total_num_tokens
    if serving.get("accounting") == "exact":
        assert p.planned_bytes <= 3 << 30


def test_a_cpu_build_hands_out_state_slots_and_tokens_from_one_arena() -> None:
    p = _plan("256MiB", accounting="exact", page_size=16)
    pools = build(p, "cpu")
    alloc = pools.allocator
    slots = alloc.mamba_allocator.available_size()
    full = alloc.full_attn_allocator.available_size()
    assert alloc.mamba_allocator.alloc(1) is not None
    assert alloc.mamba_allocator.available_size() == slots - 1
    tokens = alloc.alloc(32)  # a full and an SWA page per token: the float opens at the middle of the free bytes
    assert tokens is not None and tokens.numel() == 32
    assert alloc.full_attn_allocator.available_size() < full
    assert pools.kv_pool.buffer.numel() == p.sizing.arenas[0].bytes


# -------------------------------------------------------------- against SGLang's own pool and allocator


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


_CASES = [  # small arenas: the peer answers with every page table
    ({}, "1GiB", 4, 12, 4, 512),
    ({"page_size": 16, "tp_size": 2}, "768MiB", 4, 12, 2, 256),
    ({"accounting": "exact", "page_size": 64}, "1GiB", 4, 12, 4, 512),
    ({"swa_full_tokens_ratio": 0.5, "disable_lazy_compaction": True}, "512MiB", 4, 12, 4, 512),
]


@pytest.mark.parametrize(("serving", "memory", "full_layers", "swa_layers", "heads", "kv_width"), _CASES)
def test_geometry_and_boot_state_equal_sglangs(
    peer: Peer, serving: dict[str, Any], memory: str, full_layers: int, swa_layers: int, heads: int, kv_width: int
) -> None:
    """Entries, sink, max_slots, first slots past the sink (UMP ``UnifiedKVPool``) and, for the same arena and boot
    labels, SGLang's tri composite at boot: each END's and the float's availability, the joint availability and the
    state slot's token cost equal kvpools' plan and its built allocator."""
    p = _plan(memory, **serving)
    (arena,) = p.sizing.arenas
    page = p.serving.page_size
    specs = [
        {"kind": "mha", "name": "full", "grow": "down", "layers": full_layers, "heads": heads, "head_dim": 128},
        {"kind": "mha", "name": "swa", "grow": "float", "layers": swa_layers, "heads": heads, "head_dim": 128},
        {**STATE, "layers": 16, "conv": [[3, kv_width]] * 4 + [[3, 1_536]] * 2, "temporal": [0, 0, 0]},
    ]
    sizes = peer.call("sizes", total=arena.bytes, page=page, specs=specs)
    assert "error" not in sizes and "row_error" not in sizes, sizes
    ours = [arena.sub_pool(name) for name in ("kv_full", "kv_swa", "mamba_state")]
    assert [sizes["entry"][s["name"]] for s in specs] == [s.entry_bytes for s in ours]
    assert sizes["sink"] == arena.sink_bytes
    assert [sizes["max_slots"][s["name"]] for s in specs] == [s.max_slots for s in ours]
    assert [sizes["min_slot"][s["name"]] for s in specs] == [s.min_slot_index for s in ours]
    theirs = peer.call(
        "new",
        total=arena.bytes,
        page=page,
        specs=specs,
        composite="tri",
        full_tokens=arena.labels["full_max_total_num_tokens"],
        swa_tokens=arena.labels["swa_max_total_num_tokens"],
        lazy=arena.lazy_compaction,
    )
    alloc = build(p, "meta").allocator
    assert theirs["cost"] == arena.labels["mamba_slot_full_token_cost"] == alloc.mamba_slot_full_token_cost()
    assert theirs["available"] == alloc.available_size()
    assert theirs["full"]["avail"] == p.max_total_num_tokens == alloc.full_attn_allocator.available_size()
    assert theirs["swa"]["avail"] == alloc.swa_attn_allocator.available_size()
    assert theirs["mamba"]["avail"] == alloc.mamba_allocator.available_size()


@pytest.mark.oracle
def test_the_boot_labels_are_the_configurators() -> None:
    """``full_max_total_num_tokens`` / ``swa_max_total_num_tokens`` under unified memory are SGLang's
    ``HybridSWAPoolConfigurator.calculate_pool_sizes`` unified branch (``_max_unified_full_tokens``, no SWA
    admission floor check) on the same KV budget."""
    from tests.mamba.support import preset_config

    python, bench = locate.require_sglang_peer()
    config = {k: v for k, v in preset_config(PRESET).items() if k not in ("architectures", "model_type", "torch_dtype")}
    plans = [_plan("20GiB"), _plan("6GiB", page_size=16, tp_size=2), _plan("1GiB", page_size=64)]
    cases = [
        {
            "config": config,
            "tp": p.serving.attn_tp_size,
            "available": kv_budget_bytes(p.model, p.serving, p.budget),
            "page": p.serving.page_size,
            "ratio": p.serving.swa_full_tokens_ratio,
            "unified": True,
        }
        for p in plans
    ]
    script = Path(__file__).parent.parent / "mamba" / "inkling_peer.py"
    out = subprocess.run(
        [str(python), str(script), str(bench), json.dumps(cases)], capture_output=True, text=True, check=True
    )
    for p, theirs in zip(plans, json.loads(out.stdout), strict=True):
        labels = p.sizing.arenas[0].labels
        assert (labels["full_max_total_num_tokens"], labels["swa_max_total_num_tokens"]) == (
            theirs["full_tokens"],
            theirs["swa_tokens"],
        )


@pytest.mark.parametrize(
    ("serving", "message"),
    [
        ({"kv_cache_dtype": "fp4_e2m1"}, "SGLang 0.5.23 refuses it"),
        ({"disaggregation_mode": "decode"}, "PD"),
        ({"max_total_tokens": 100_000}, "an arena sized from a token cap"),
    ],
)
def test_refusals_name_sglangs_reason_or_what_is_not_modelled(serving: dict[str, Any], message: str) -> None:
    with pytest.raises(KvpoolsError, match=message):
        _plan(**serving)


def test_an_arena_below_the_bs1_floor_is_refused() -> None:
    """UMP ``_check_bs1_feasibility_floor``: the arena must hold one window of SWA KV, three state slots and the
    sink: 513 x 24,576 + 3 x 491,520 + 491,520 = 14,573,568 B.  With K = 5 in 12 MiB the arena is the KV budget
    after 6 state slots plus 5 slots on top, 12,091,392 B."""
    with pytest.raises(
        KvpoolsError, match=r"byte budget 12091392 cannot fit ONE worst-case request \(bs=1 floor 14573568"
    ):
        _plan("12MiB", max_mamba_cache_size=5)


# ---------------------------------------------------------------------------------------------- capacity


@pytest.mark.parametrize(("memory", "page"), [("96MiB", 1), ("128MiB", 16), ("200MiB", 64), ("150MiB", 32)])
@pytest.mark.parametrize("context", [64, 256, 448])
def test_predicted_concurrency_is_what_the_allocator_achieves(memory: str, page: int, context: int) -> None:
    """Requests of ``context`` tokens (within the 512-token window) each take their state slots
    (``state_slots_per_request``) and ``context`` full + SWA tokens (after the composite's ``ensure_capacity``)
    until the arena refuses: the count is the capacity's arena-bytes limit."""
    from kvpools_core.planning.unified import ARENA_BYTES, unified_concurrency

    p = _plan(memory, accounting="exact", page_size=page)
    predicted = unified_concurrency(p, context)
    alloc = build(p, "cpu").allocator
    achieved = 0
    while alloc.mamba_allocator.alloc(p.sizing.state_slots_per_request) is not None:
        alloc.ensure_capacity(context, context)
        if alloc.alloc(context) is None:
            break
        achieved += 1
    assert achieved == predicted.limits[ARENA_BYTES]
    assert predicted.request_bytes == (
        -(-context // page) * page * (8_192 + 24_576) + p.sizing.state_slots_per_request * 491_520
    )


def test_capacity_cli_answers_for_the_tri_pool() -> None:
    from click.testing import CliRunner

    import kvpools_core.cli as cli

    result = CliRunner().invoke(
        cli.main,
        [
            "capacity",
            PRESET,
            "--memory",
            "2GiB",
            "--enable-unified-memory",
            "--enable-mamba-extra-buffer",
        ],
    )
    assert result.exit_code == 0, result.output
    # 8,192 tokens: the full side holds 8,192 tokens of 8,192 B, the SWA side
    # its worst case per request (window 512 + eviction interval 128 + page 1 + decode 1 = 642 tokens) of 24,576 B,
    # and 5 state slots of 491,520 B
    request = 8_192 * 8_192 + 642 * 24_576 + 5 * 491_520
    assert f"{request:,}" in result.output
    assert "642 SWA tokens" in result.output


@settings(max_examples=12, deadline=None)
@given(
    mib=st.integers(min_value=40, max_value=400),
    page=st.sampled_from([1, 8, 16, 64]),
    ratio=st.sampled_from([0.1, 0.25, 0.5]),
    accounting=st.sampled_from(["sglang", "exact"]),
)
def test_random_budgets_build_as_planned_and_boot_as_sglangs(
    peer: Peer, mib: int, page: int, ratio: float, accounting: str
) -> None:
    """For random budgets, pages and ratios: the plan builds to the byte, an exact plan fits its budget, and the
    composite's boot availabilities are SGLang's for the same arena."""
    try:
        p = _plan(f"{mib}MiB", page_size=page, swa_full_tokens_ratio=ratio, accounting=accounting)
    except KvpoolsError as exc:  # too small a budget: refused with the numbers, never planned
        assert "too small" in str(exc) or "Not enough memory" in str(exc) or "cannot" in str(exc)
        return
    pools = build(p, "meta")
    assert pools.allocated_bytes == p.planned_bytes
    if accounting == "exact":
        assert p.planned_bytes <= mib << 20
    (arena,) = p.sizing.arenas
    specs = [
        {"kind": "mha", "name": "full", "grow": "down", "layers": 4, "heads": 4, "head_dim": 128},
        {"kind": "mha", "name": "swa", "grow": "float", "layers": 12, "heads": 4, "head_dim": 128},
        {**STATE, "layers": 16, "temporal": [0, 0, 0]},
    ]
    theirs = peer.call(
        "new",
        total=arena.bytes,
        page=page,
        specs=specs,
        composite="tri",
        full_tokens=arena.labels["full_max_total_num_tokens"],
        swa_tokens=arena.labels["swa_max_total_num_tokens"],
        lazy=arena.lazy_compaction,
    )
    alloc = pools.allocator
    assert theirs["available"] == alloc.available_size()
    assert [theirs[m]["avail"] for m in ("full", "swa", "mamba")] == [
        alloc.full_attn_allocator.available_size(),
        alloc.swa_attn_allocator.available_size(),
        alloc.mamba_allocator.available_size(),
    ]
    assert theirs["full"]["avail"] == p.max_total_num_tokens
