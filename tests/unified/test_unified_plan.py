"""``--enable-unified-memory`` in the plan (issue 31): the arena contract, the worked examples, the refusals, and
the plan's geometry against SGLang 0.5.23's own ``UnifiedKVPool``.

Line references: SGLang 0.5.23's ``srt/mem_cache/kv_cache_configurator.py`` (KCC),
``srt/mem_cache/unified_memory_pool.py`` (UMP).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import kvpools_core as kv
import kvpools_core.cli as cli
from kvpools_core.errors import ConfigError, InvalidValueError, PlanFormatError, UnsupportedCombinationError
from kvpools_core.values import Arena, GroupCost, Plan, PoolSpec, Serving
from tests.unified.peer import Peer

GiB = 1 << 30
QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"


def _plan(model: str, memory: str = "20GiB", **serving: Any) -> Plan:
    return kv.plan(model, Serving(enable_unified_memory=True, **serving), memory=memory)


def test_qwen3_next_worked_example_is_sglangs() -> None:
    """Issue 31: Qwen3-Next-80B-A3B, TP 4, bf16, 20 GiB: up to 1,744,482 full tokens; a state slot costs 1,572.

    SGLang's profiled budget is taken net of the state cache (KCC ``_profile_available_bytes`` ->
    ``_handle_max_mamba_cache``): the static split's KV share, 11,314,233,344 B (920,754 tokens x 12,288 B, the
    issue's static figure), is ``unified_total_bytes``; ``init_unified_mamba_pools`` puts K = 525 state entries
    of 19,316,736 B back on top: 11,314,233,344 + 10,141,286,400 = 21,455,519,744 B.  max_slots = that //
    12,288 = 1,746,054; the sink is one state entry (1,572 full slots), and the state END's first page sits
    above it, so the full END reaches 1,746,054 - 1,572 = 1,744,482 tokens in the empty arena.
    """
    p = _plan(QWEN3_NEXT, tp_size=4, accounting="sglang")
    (arena,) = p.sizing.arenas
    assert arena.bytes == 11_314_233_344 + 525 * 19_316_736 == 21_455_519_744
    assert arena.sink_bytes == 19_316_736
    assert arena.sub_pool("kv").entry_bytes == 12 * (256 * 2 + 256 * 2) == 12_288
    assert arena.sub_pool("kv").max_slots == 21_455_519_744 // 12_288 == 1_746_054
    assert arena.sub_pool("mamba_state").max_slots == 21_455_519_744 // 19_316_736 == 1_110
    assert p.max_total_num_tokens == 1_746_054 - 1_572 == 1_744_482
    assert arena.labels["mamba_slot_full_token_cost"] == 1_572  # ceil(19,316,736 / 12,288)
    assert arena.labels["size_full"] == 1_746_054 - 1  # UnifiedMambaTokenToKVPoolAllocator.size_full
    assert arena.labels["size_mamba"] == 1_110 - 1
    assert arena.labels["max_mamba_cache_size"] == 525
    assert p.max_running_requests == 525 // 3 == 175  # the static configurator's cap (3 slots per request)
    # the bs=1 floor (UMP _check_bs1_feasibility_floor): 3 state slots + the sink
    assert arena.floor_bytes == 3 * 19_316_736 + 19_316_736
    assert p.problems() == []


def test_gpt_oss_20b_worked_example_is_sglangs() -> None:
    """Issue 31: gpt-oss-20b in 60 GiB, page 16: ``size_full`` 2,621,424 (static split: 1,456,352 full tokens).

    ``_init_unified_swa_pools`` with a profiled budget and no draft takes ``unified_total_bytes`` (60 GiB, 4 KiB
    aligned already): 60 GiB // 24,576 = 2,621,440 slots = 163,840 pages, less the one-page sink = 2,621,424.
    """
    p = _plan("gpt-oss-20b", "60GiB", page_size=16, accounting="sglang")
    (arena,) = p.sizing.arenas
    assert arena.bytes == 60 * GiB
    assert arena.sink_bytes == 16 * 24_576
    assert p.max_total_num_tokens == arena.labels["size_full"] == (163_840 - 1) * 16 == 2_621_424
    assert arena.labels["hybrid_swa_token_capacity"] == 2_621_424
    assert arena.labels["full_max_total_num_tokens"] == 1_456_352  # PC _max_unified_full_tokens, the ratio split
    static = kv.plan("gpt-oss-20b", Serving(page_size=16, accounting="sglang"), memory="60GiB")
    assert static.max_total_num_tokens == 1_456_352
    assert p.max_running_requests == static.max_running_requests


def test_the_arena_contract() -> None:
    """One arena pool allocates the buffer; its members draw on it and are not counted beside it; an exact
    plan fits its budget; the JSON round trip keeps the arena."""
    p = _plan("gpt-oss-120b", "60GiB")
    names = {pool.name: pool for pool in p.pools}
    assert names["unified_arena"].arena is None and names["unified_arena"].kind == "arena"
    assert names["kv_full"].arena == names["kv_swa"].arena == "unified_arena"
    assert "full_to_swa" not in names and "allocator" not in names  # the unified allocator owns the virtual ids
    assert p.planned_bytes == sum(pool.bytes for pool in p.pools if pool.arena is None) <= 60 * GiB
    assert p.cost.bytes_for(**p.counts) == p.planned_bytes
    assert p.cost.arena_draw("unified_arena", **p.counts) == p.max_total_num_tokens * 36_864  # 18 x 2,048 B
    assert p.sizing.arenas[0].sink_bytes + p.cost.arena_draw("unified_arena", **p.counts) <= p.sizing.arenas[0].bytes
    assert Plan.from_json(p.to_json()) == p


def test_a_plan_whose_members_overdraw_the_arena_is_refused() -> None:
    p = _plan("gpt-oss-20b", "8GiB")
    half = p.sizing.arenas[0].bytes // 2  # the full side's draw at the plan's counts no longer fits
    small = [
        attrs.evolve(pool, bytes_per_slot=half, bytes=half) if pool.name == "unified_arena" else pool
        for pool in p.pools
    ]
    arenas = (attrs.evolve(p.sizing.arenas[0], bytes=half),)
    bad = attrs.evolve(p, sizing=attrs.evolve(p.sizing, pools=small, arenas=arenas))
    assert any("exceed" in problem for problem in bad.problems())
    with pytest.raises(PlanFormatError, match="arenas"):
        Plan.from_dict(json.loads(bad.to_json()))
    orphan = [attrs.evolve(pool, arena="elsewhere", cost=None) if pool.name == "kv_swa" else pool for pool in p.pools]
    bad = attrs.evolve(p, sizing=attrs.evolve(p.sizing, pools=orphan))
    assert any("names no arena" in problem for problem in bad.problems())


def test_a_member_cost_names_its_arena() -> None:
    with pytest.raises(InvalidValueError, match="arena"):
        PoolSpec(
            name="kv",
            kind="kv",
            slots=1,
            bytes_per_slot=1,
            bytes=1,
            arena="a",
            cost=GroupCost(group="kv", token_bytes=1),
        )
    assert Arena(name="a", bytes=10, sink_bytes=1, sub_pools=()).sub_pools == ()


def test_exact_arena_is_the_budget_less_the_other_pools() -> None:
    p = _plan(QWEN3_NEXT, tp_size=4)
    others = sum(pool.bytes for pool in p.pools if pool.arena is None and pool.name != "unified_arena")
    arena = p.sizing.arenas[0].bytes
    assert arena % 4096 == 0 and arena + others <= 20 * GiB < arena + others + 4096 + 20 * (1 << 20)


def test_lazy_compaction_is_recorded_and_needs_the_pool() -> None:
    assert _plan("gpt-oss-20b").sizing.arenas[0].lazy_compaction is True
    assert _plan("gpt-oss-20b", disable_lazy_compaction=True).sizing.arenas[0].lazy_compaction is False
    with pytest.raises(ConfigError, match="enable_unified_memory"):
        Serving(disable_lazy_compaction=True)
    with pytest.raises(ConfigError, match="another engine's KV cache"):
        Serving(enable_unified_memory=True, accounting="vllm")


@pytest.mark.parametrize(
    ("model", "serving", "memory"),
    [
        (QWEN3_NEXT, {"tp_size": 4}, "20GiB"),
        ("gpt-oss-20b", {"page_size": 16}, "60GiB"),
        ("gpt-oss-120b", {"accounting": "sglang"}, "60GiB"),
        (QWEN3_NEXT, {"tp_size": 4, "page_size": 64, "disable_lazy_compaction": True}, "12GiB"),
    ],
)
def test_build_on_meta_allocates_the_plan_to_the_byte(model: str, serving: dict[str, Any], memory: str) -> None:
    """One arena tensor, the request table (and the request-to-state mapping), the unified allocators' tables:
    each pool's measured bytes are the plan's, and their sum is ``planned_bytes``."""
    p = _plan(model, memory, **serving)
    pools = kv.build(p, "meta")
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools if pool.arena is None}
    assert pools.allocated_bytes == p.planned_bytes
    assert pools.allocator.full_attn_allocator.lazy_compaction is not serving.get("disable_lazy_compaction", False)


def test_the_views_are_carved_from_the_one_arena() -> None:
    """On the CPU every view of every layer points into the arena's buffer, token-major: slot ``s`` of layer
    ``l``'s V row of gpt-oss-20b lies at ``s x 24,576 + l x 2,048 + 1,024`` (K and V rows of 8 x 64 x 2 B)."""
    p = _plan("gpt-oss-20b", "1GiB")
    pools = kv.build(p, "cpu")
    arena = pools.kv_pool
    base = arena.buffer.data_ptr()
    k, v = arena.layer_views("kv_full", 3)
    assert k.shape == (arena.arena.sub_pool("kv_full").max_slots, 1_024)
    assert v[5].data_ptr() - base == 5 * 24_576 + 3 * 2_048 + 1_024
    swa_k, _ = arena.layer_views("kv_swa", 11)
    assert swa_k[7].data_ptr() - base == 7 * 24_576 + 11 * 2_048
    assert all(
        base <= view.data_ptr() < base + arena.nbytes for sub in arena.views.values() for layer in sub for view in layer
    )
    ids = pools.allocator.alloc(16)
    assert ids is not None and pools.allocator.translate_kv_loc(ids).max() < arena.arena.sub_pool("kv_full").max_slots


def test_build_cli_reports_the_arena_as_planned() -> None:
    result = CliRunner().invoke(
        cli.main,
        [
            "build",
            QWEN3_NEXT,
            "--tp-size",
            "4",
            "--memory",
            "20GiB",
            "--enable-unified-memory",
            "--device",
            "meta",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["matches_plan"] is True and data["allocated_bytes"] == data["planned_bytes"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # KCC _init_pools: neither hybrid Mamba nor hybrid SWA
        (("llama-3.1-8b",), "this model is neither"),
        (("deepseek-v4-flash", "--tp-size", "4", "--memory", "60GiB"), "DeepSeek-V4 excluded"),
        # SGLang 0.5.23 serves Gemma-3 dense (ModelConfig.is_hybrid_swa is false), so it is neither too
        (("gemma-3-27b-it",), "this model is neither"),
        # arg_groups/kv_cache_hook.py: the FP4 rule, top-k, the PD rules
        (("gpt-oss-20b", "--kv-cache-dtype", "fp4_e2m1"), "FP4 KV cache does not yet support"),
        (
            (
                *("gpt-oss-20b", "--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "4"),
                *("--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"),
                *("--speculative-draft-num-layers", "1"),
            ),
            "Set --speculative-eagle-topk 1",
        ),
        (
            (QWEN3_NEXT, "--tp-size", "4", "--disaggregation-mode", "decode", "--disable-lazy-compaction"),
            "requires lazy compaction",
        ),
        # accepted by SGLang, not modelled by kvpools: refused, never planned as something else
        (("gpt-oss-20b", "--enable-hierarchical-cache"), "kvpools does not model the page-envelope host tier"),
        (("gpt-oss-20b", "--max-total-tokens", "100000"), "kvpools does not model an arena sized from a token cap"),
    ],
)
def test_refusals_name_sglangs_reason_and_the_fix(args: tuple[str, ...], message: str) -> None:
    if "--memory" not in args:
        args = (*args, "--memory", "20GiB")
    result = CliRunner().invoke(cli.main, ["plan", *args, "--enable-unified-memory"])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("Error: ") and message in result.stderr, result.stderr
    assert "Traceback" not in result.output


def test_plan_json_carries_the_arena() -> None:
    result = CliRunner().invoke(
        cli.main, ["plan", QWEN3_NEXT, "--tp-size", "4", "--memory", "20GiB", "--enable-unified-memory", "--json"]
    )
    assert result.exit_code == 0, result.output
    arena = json.loads(result.stdout)["plan"]["sizing"]["arenas"][0]
    assert arena["labels"]["mamba_slot_full_token_cost"] == 1_572
    assert {s["pool"]: s["grows"] for s in arena["sub_pools"]} == {"kv": "down", "mamba_state": "up"}


# ------------------------------------------------------------- the plan's geometry against SGLang's UnifiedKVPool


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


_QWEN3_NEXT_TP4 = [  # 12 full layers of 2 KV heads x 256 (1 per rank at TP 4); 36 GDN layers, conv (2048, 3),
    {"kind": "mha", "name": "full", "grow": "down", "layers": 12, "heads": 1, "head_dim": 256},
    {"kind": "mamba", "name": "mamba", "grow": "up", "layers": 36, "conv": [[2048, 3]], "temporal": [8, 128, 128]},
]
_GPT_OSS = {  # gpt-oss: 8 KV heads x 64 on every layer; 20b 12 + 12 layers, 120b 18 + 18
    n: [
        {"kind": "mha", "name": "full", "grow": "down", "layers": n, "heads": 8, "head_dim": 64},
        {"kind": "mha", "name": "swa", "grow": "up", "layers": n, "heads": 8, "head_dim": 64},
    ]
    for n in (12, 18)
}
_CASES = [
    (QWEN3_NEXT, {"tp_size": 4, "accounting": "sglang"}, "20GiB", _QWEN3_NEXT_TP4, ("kv", "mamba_state")),
    (QWEN3_NEXT, {"tp_size": 4, "page_size": 64}, "12GiB", _QWEN3_NEXT_TP4, ("kv", "mamba_state")),
    ("gpt-oss-20b", {"page_size": 16, "accounting": "sglang"}, "60GiB", _GPT_OSS[12], ("kv_full", "kv_swa")),
    ("gpt-oss-120b", {"page_size": 64}, "37GiB", _GPT_OSS[18], ("kv_full", "kv_swa")),
    ("gpt-oss-120b", {"tp_size": 2, "kv_cache_dtype": "fp8_e4m3"}, "7GiB", None, ("kv_full", "kv_swa")),
]


@pytest.mark.parametrize(("model", "serving", "memory", "specs", "pools"), _CASES)
def test_plan_geometry_equals_sglangs_pool(
    peer: Peer, model: str, serving: dict[str, Any], memory: str, specs: list[dict[str, Any]] | None, pools: tuple
) -> None:
    """The plan's entries, sink, max_slots and first slot past the sink are what SGLang's ``UnifiedKVPool``
    computes for the same arena bytes and page (built on ``meta`` in the peers venv)."""
    p = _plan(model, memory, **serving)
    (arena,) = p.sizing.arenas
    if specs is None:  # fp8 at TP 2: 4 KV heads x 64 per rank, 1-byte elements: the peer's bf16 specs at half width
        specs = [{**s, "heads": 4, "head_dim": 32} for s in _GPT_OSS[18]]
    reply = peer.call("sizes", total=arena.bytes, page=p.serving.page_size, specs=specs)
    assert "error" not in reply and "row_error" not in reply, reply
    ours = [arena.sub_pool(name) for name in pools]
    assert [reply["entry"][s["name"]] for s in specs] == [s.entry_bytes for s in ours]
    assert reply["sink"] == arena.sink_bytes
    assert [reply["max_slots"][s["name"]] for s in specs] == [s.max_slots for s in ours]
    assert [reply["min_slot"][s["name"]] for s in specs] == [s.min_slot_index for s in ours]


@pytest.mark.parametrize(("composite", "page"), [("mamba", 1), ("mamba", 16), ("swa", 1), ("swa", 16)])
def test_the_allocator_charge_is_the_allocators_tables(composite: str, page: int) -> None:
    """``unified_allocator``'s bytes are the int64 tables kvpools' unified allocators hold at boot: per END
    ``virtual_to_physical``, ``physical_to_virtual``, the in-page offsets and, for an id owner, its free ids."""
    from kvpools_core.allocators.unified import UnifiedArena, UnifiedMambaAllocator, UnifiedSWAAllocator
    from kvpools_core.parts.unified import mha_entry, state_entry
    from kvpools_core.parts.unified_plan import allocator_table_bytes

    full = mha_entry("full", layer_num=2, head_num=2, head_dim=64, itemsize=2)
    other = (
        state_entry("mamba", layer_num=2, conv_row_bytes=[64 * 3 * 2], temporal_row_bytes=2 * 16 * 16 * 4)
        if composite == "mamba"
        else mha_entry("swa", layer_num=2, head_num=2, head_dim=64, itemsize=2)
    )
    arena = UnifiedArena.build(40 << 20, [(full, "down"), (other, "up")], page)
    alloc = (UnifiedMambaAllocator if composite == "mamba" else UnifiedSWAAllocator)(arena, **{composite: composite})
    ends = (alloc.full_attn_allocator, alloc.mamba_allocator if composite == "mamba" else alloc.swa_attn_allocator)
    held = sum(
        t.numel() * 8
        for end in ends
        for t in (end.virtual_to_physical, end.physical_to_virtual, end._offsets, end.free_virtual_ids)
        if t is not None
    )
    assert allocator_table_bytes(arena.geometry, "full", shared_ids=composite == "swa") == held


def test_the_three_pool_chain_is_refused_not_planned_as_two() -> None:
    """The two-END planner refuses a floating middle rather than planning it as two ENDs (the tri-pool is
    ``parts.unified_tri``'s: ``tests/unified/test_unified_tri.py``)."""
    from kvpools_core.parts.unified import mha_entry, state_entry
    from kvpools_core.parts.unified_plan import ArenaMember, unified_sizing

    static = _plan("gpt-oss-20b").sizing
    full = mha_entry("kv_full", layer_num=1, head_num=1, head_dim=64, itemsize=2)
    members = (
        ArenaMember("kv_full", full, "down"),
        ArenaMember("kv_swa", mha_entry("kv_swa", layer_num=1, head_num=1, head_dim=64, itemsize=2), "float"),
        ArenaMember("mamba_state", state_entry("m", layer_num=1, conv_row_bytes=[6], temporal_row_bytes=4), "up"),
    )
    with pytest.raises(UnsupportedCombinationError, match="floating middle is not planned"):
        unified_sizing(
            static,
            Serving(enable_unified_memory=True),
            budget_bytes=1 << 30,
            members=members,
            drop=(),
            owner="t",
            model_name="m",
            context_len=1024,
        )


_HOOK_OPTIONS = frozenset({"--enable-unified-memory", "--kv-cache-dtype", "--enable-kv-cache-sharding"})


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_serving_refusals_equal_sglangs_hook(peer: Peer, data: st.DataObject) -> None:
    """The rules a kvpools ``Serving`` reaches (``parts.unified_plan.unified_request``: SGLang's option names read
    off the typed fields) refuse exactly when SGLang's ``handle_unified_memory_pool`` does, with its first
    message; the options kvpools has no field for are SGLang's defaults."""
    from kvpools_core.parts.unified import unified_memory_problems
    from kvpools_core.parts.unified_plan import unified_request

    pd = data.draw(st.sampled_from(["null", "null", "prefill", "decode"]))
    fields: dict[str, Any] = {
        "enable_unified_memory": True,
        "tp_size": 2,
        "disable_lazy_compaction": data.draw(st.booleans()),
        "disaggregation_mode": pd,
        "pp_size": data.draw(st.sampled_from([1, 1, 2])),
        "dcp_size": data.draw(st.sampled_from([1, 1, 2])),
        "speculative_algorithm": data.draw(st.sampled_from([None, None, "EAGLE", "EAGLE3", "NGRAM", "STANDALONE"])),
        "speculative_eagle_topk": data.draw(st.sampled_from([None, 1, 4])),
        "enable_hisparse": data.draw(st.booleans()),
        "enable_hierarchical_cache": data.draw(st.booleans()),
        "disaggregation_decode_retraction_backup": data.draw(st.sampled_from([None, "host_pool"]))
        if pd == "decode"
        else None,
    }
    try:
        serving = Serving(**fields)
    except ConfigError:
        return
    is_mamba = data.draw(st.booleans())
    is_mla = data.draw(st.booleans())
    is_swa = not is_mamba or data.draw(st.booleans())
    req = unified_request(serving, is_mamba=is_mamba, is_hybrid_swa=is_swa, is_mla=is_mla)
    ours = [p for p in unified_memory_problems(req) if p.option not in _HOOK_OPTIONS]
    args = {
        "is_mamba": is_mamba,
        "is_mla": is_mla,
        "is_hybrid_swa": is_swa,
        "lazy_compaction": serving.lazy_compaction,
        "disaggregation_mode": serving.disaggregation_mode,
        "disaggregation_transfer_backend": "mooncake",
        "pp_size": serving.pp_size,
        "speculative_algorithm": serving.speculative_algorithm,
        "speculative_eagle_topk": serving.speculative_eagle_topk,
        "enable_hisparse": serving.enable_hisparse,
        "disaggregation_decode_enable_offload_kvcache": False,
        "hicache_storage_backend": None,
        "disaggregation_decode_retraction_backup": serving.disaggregation_decode_retraction_backup,
        "enable_two_batch_overlap": False,
        "enable_lmcache": False,
        "enable_unified_cache_external_linker": False,
        "enable_hierarchical_cache": serving.enable_hierarchical_cache,
        "dcp_size": serving.dcp_size,
        "attention_backends": ["flashinfer"],
    }
    theirs = peer.call("refuse", args=args)["error"]
    if not ours:
        assert theirs is None
    else:
        assert theirs is not None and theirs.startswith(ours[0].reason[:60]), (theirs, ours[0].reason)


def test_state_parts_must_fill_the_state_entry() -> None:
    """A plugin's state parts (one layer's conv tensors and temporal state) are carried into the arena only when
    they are the cell's state slot: 2 layers x (12 + 4) B = 32 B (2 x (16 + 4) = 40 B is refused)."""
    from kvpools_core.errors import InvalidValueError
    from kvpools_core.parts.unified import state_parts
    from kvpools_core.parts.unified_plan import arena_rows, state_entry_from_cell
    from kvpools_core.values import STATE_SLOT, CellPart, CellSize

    cell = CellSize(
        parts=(CellPart("state", 32, "mamba_state", unit=STATE_SLOT),), sglang_bytes_per_token=1, num_layers=1
    )
    entry = state_entry_from_cell(cell, "mamba_state", 2, state_parts([12], 4))
    assert entry.parts == (("conv_0", 12), ("temporal", 4))
    assert arena_rows(entry) == {"row_bytes": (12, 4), "row_order": "part"}
    assert arena_rows(state_entry_from_cell(cell, "mamba_state", 2)) == {"row_bytes": ()}
    assert state_parts([12, 6], 0) == (("conv_0", 12), ("conv_1", 6))  # a short-conv-only state: no temporal row
    with pytest.raises(InvalidValueError, match="not the cell's 32 B per state slot"):
        state_entry_from_cell(cell, "mamba_state", 2, state_parts([16], 4))
