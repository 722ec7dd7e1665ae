"""The unified pool's sizing arithmetic (``kvpools_core.parts.unified``): by hand, the issue's worked examples,
and against SGLang 0.5.23's own ``UnifiedKVPool`` for generated models.

Line references are to SGLang 0.5.23's ``srt/mem_cache/unified_memory_pool.py``
(UMP), ``srt/mem_cache/layout/token_major.py`` (TM),
``srt/model_executor/pool_configurator.py`` (PC) and
``srt/mem_cache/allocator/unified_mamba.py`` (UM).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvpools_core.allocators.unified import UnifiedArena, UnifiedMambaAllocator, UnifiedSWAAllocator
from kvpools_core.errors import InvalidValueError
from kvpools_core.parts.unified import (
    UnifiedRequest,
    arena_bytes,
    bs1_floor_problem,
    bs1_floor_terms,
    empty_end_available_tokens,
    hybrid_swa_token_capacity,
    mamba_arena_bytes,
    mamba_size_full,
    mamba_slot_full_token_cost,
    max_unified_full_tokens,
    mha_entry,
    mla_entry,
    row_alignment_problems,
    sink_bytes,
    state_alignment_problems,
    state_entry,
    sub_pool_geometry,
    swa_size_full,
    unified_memory_problems,
)
from tests.unified.peer import Peer, entry

GiB = 1 << 30

# Qwen3-Next-80B-A3B at TP 4, bf16: 12 full-attention layers of 2 KV heads x 256 (1 per rank at TP 4),
# 36 Gated-DeltaNet layers: conv state (2048, 3) bf16 per rank, temporal state (8, 128, 128) fp32 per rank.
QWEN3_NEXT_FULL = mha_entry("full", layer_num=12, head_num=1, head_dim=256, itemsize=2)
QWEN3_NEXT_STATE = state_entry(
    "mamba", layer_num=36, conv_row_bytes=[2048 * 3 * 2], temporal_row_bytes=8 * 128 * 128 * 4
)
# gpt-oss-20b at TP 1, bf16: 12 full + 12 sliding-window layers, 8 KV heads x 64.
GPT_OSS_FULL = mha_entry("full", layer_num=12, head_num=8, head_dim=64, itemsize=2)
GPT_OSS_SWA = mha_entry("swa", layer_num=12, head_num=8, head_dim=64, itemsize=2)


def test_entries_by_hand() -> None:
    # MHA (UMP MHASubPoolSpec.entry_bytes): layers x (K row + V row), rounded up to 32 B (TM align_entry_bytes)
    assert QWEN3_NEXT_FULL.entry_bytes == 12 * (256 * 2 + 256 * 2) == 12_288
    assert GPT_OSS_FULL.entry_bytes == 12 * (8 * 64 * 2 * 2) == 24_576
    # 1 layer, K row 8 x 2 = 16 B, V row 16 x 2 = 32 B: 48 B -> 64 B
    assert mha_entry("x", layer_num=1, head_num=1, head_dim=8, v_head_dim=16, itemsize=2).entry_bytes == 64
    # MLA (UMP MLASubPoolSpec.entry_bytes): one (512 + 64) x 2 = 1,152 B latent row per layer; 3 layers = 3,456
    assert mla_entry("x", layer_num=3, kv_lora_rank=512, qk_rope_head_dim=64, itemsize=2).entry_bytes == 3_456
    # 1 layer of (7 + 2) x 2 = 18 B -> 32 B
    assert mla_entry("x", layer_num=1, kv_lora_rank=7, qk_rope_head_dim=2, itemsize=2).entry_bytes == 32
    # state (UMP MambaSubPoolSpec.entry_bytes, unfused): raw, no rounding: 36 x (12,288 + 524,288)
    assert QWEN3_NEXT_STATE.entry_bytes == 36 * (2048 * 3 * 2 + 8 * 128 * 128 * 4) == 19_316_736
    assert state_entry("s", layer_num=1, conv_row_bytes=[6], temporal_row_bytes=4).entry_bytes == 10


def test_sink_and_geometry_by_hand() -> None:
    # UMP _reserved_floor_bytes: max(largest entry, page x each KV entry); the state entry is charged once
    assert sink_bytes([QWEN3_NEXT_FULL, QWEN3_NEXT_STATE], 64) == max(19_316_736, 64 * 12_288) == 19_316_736
    assert sink_bytes([GPT_OSS_FULL, GPT_OSS_SWA], 16) == 16 * 24_576 == 393_216
    # UMP UnifiedKVPool.__init__: max_slots = total // entry; min_slot_index = ceil(sink / entry);
    # MultiEndedAllocator.__init__: num_pages = max_slots // page, min_page_index = ceil(min_slot / page)
    g = sub_pool_geometry(100_000, QWEN3_NEXT_FULL, 24_576, 4)
    assert (g.max_slots, g.min_slot_index, g.num_pages, g.min_page_index) == (8, 2, 2, 1)
    with pytest.raises(InvalidValueError, match="no room for real data"):
        sub_pool_geometry(24_576, QWEN3_NEXT_FULL, 24_576, 1)  # 2 slots, the first 2 are the sink


def test_arena_floors_to_4096() -> None:
    # config_from_budget: unified_total_bytes = budget - budget % 4096
    assert arena_bytes(20 * GiB + 4_095) == 20 * GiB
    assert arena_bytes(4_095) == 0
    # the Mamba factories put the state pool on top: 4,096 + 2 x 10
    assert mamba_arena_bytes(4_096, 2, state_entry("s", layer_num=1, conv_row_bytes=[6], temporal_row_bytes=4)) == 4_116


def test_qwen3_next_worked_example() -> None:
    """Issue 31: 20 GiB at TP 4 bf16 -> up to 1,744,482 full tokens; each state slot costs 1,572 tokens.

    kvpools (as SGLang's code) gives 1,746,054 full tokens with *no* slot live in a 20 GiB arena:
    20 GiB / 12,288 = 1,747,626 full slots, less the sink (one 19,316,736 B state entry = 1,572 slots).
    The issue's 1,744,482 is exactly one slot cost lower: the full side's availability once one request's
    state slot is live (checked below on the real allocator), not with none live.
    """
    assert mamba_slot_full_token_cost(QWEN3_NEXT_STATE, QWEN3_NEXT_FULL) == 1_572  # UM: ceil(19,316,736 / 12,288)
    arena = UnifiedArena.build(20 * GiB, [(QWEN3_NEXT_FULL, "down"), (QWEN3_NEXT_STATE, "up")], 1)
    full, mamba = arena.geometry["full"], arena.geometry["mamba"]
    assert full.max_slots == 20 * GiB // 12_288 == 1_747_626
    assert mamba.min_slot_index == 1 and full.min_slot_index == 1_572
    assert empty_end_available_tokens(full, mamba) == 1_747_626 - 1_572 == 1_746_054
    assert mamba_size_full(full) == 1_747_625  # UM size_full: max_slots - 1, the boot label
    alloc = UnifiedMambaAllocator(arena)
    assert alloc.available_size() == 1_746_054
    assert alloc.mamba_allocator.alloc(1) is not None
    assert alloc.available_size() == 1_744_482  # the number: one state slot live


def test_gpt_oss_20b_worked_example() -> None:
    """Issue 31: gpt-oss-20b in 60 GiB: static 1,456,352 full tokens, unified ``size_full`` 2,621,424.

    The unified label is the full END's availability in the empty arena (``UnifiedSWAAllocatorBase``
    with a profiled budget): at page size 16 the sink is one 16-token page, so
    60 GiB / 24,576 = 2,621,440 slots = 163,840 pages, less one = 163,839 pages = 2,621,424 tokens.
    (At page size 1 it would be 2,621,439.)  The static figure is SGLang's default split,
    PC HybridSWAPoolConfigurator: 60 GiB / (24,576 + 0.8 x 24,576) = 1,456,355 -> page-aligned 1,456,352.
    """
    arena = UnifiedArena.build(arena_bytes(60 * GiB), [(GPT_OSS_FULL, "down"), (GPT_OSS_SWA, "up")], 16)
    assert swa_size_full(arena.geometry["full"], arena.geometry["swa"]) == 2_621_424
    assert UnifiedSWAAllocator(arena).size_full == 2_621_424
    assert int(60 * GiB // (24_576 + 0.8 * 24_576)) // 16 * 16 == 1_456_352
    # the configurator's unified boot label (PC _max_unified_full_tokens) stays the ratio split
    assert (
        max_unified_full_tokens(
            60 * GiB, 16, full_bytes_per_token=24_576, swa_bytes_per_token=24_576, swa_full_tokens_ratio=0.8
        )
        == 1_456_352
    )
    assert hybrid_swa_token_capacity(2_621_424) == 2_621_424
    assert hybrid_swa_token_capacity(2_621_424, 1_000_000) == 1_000_000


def test_max_unified_full_tokens_charges_the_draft_span() -> None:
    # PC allocation_bytes(p): target = p x ps x full + swa; draft = (ceil(span / ps) x ps + ps) x draft,
    # span = target // full - 1.  1,000 B budget, page 2, full 10 B, draft 1 B, no SWA:
    # 44 pages: target 880, span 87 -> 88 + 2 = 90 draft tokens -> 970 <= 1,000; 45 pages: 900 + 92 = 992;
    # 46 pages: 920, span 91 -> 92 + 2 = 94 -> 1,014 > 1,000.
    assert max_unified_full_tokens(1_000, 2, full_bytes_per_token=10, draft_bytes_per_token=1) == 90


def test_bs1_floor() -> None:
    # UMP init_unified_mamba_swa_pools: min(context, window + page) SWA tokens + 3 state slots + the sink
    full = mha_entry("full", layer_num=1, head_num=1, head_dim=8, itemsize=2)  # 32 B
    swa = mha_entry("swa", layer_num=1, head_num=1, head_dim=8, itemsize=2)  # 32 B
    st_ = state_entry("mamba", layer_num=1, conv_row_bytes=[64], temporal_row_bytes=64)  # 128 B
    terms = bs1_floor_terms(
        entries=[full, swa, st_], page_size=4, state=st_, swa=swa, context_len=100, sliding_window=8
    )
    assert terms == [("swa_window_kv", 12 * 32), ("bs1_state_slots", 3 * 128), ("sink", 128)]
    assert bs1_floor_problem(384 + 384 + 128, terms, "init_unified_mamba_swa_pools") is None
    problem = bs1_floor_problem(895, terms, "init_unified_mamba_swa_pools")
    assert problem is not None and problem.option == "--mem-fraction-static"
    assert "bs=1 floor 896 = swa_window_kv=384 + bs1_state_slots=384 + sink=128" in problem.reason


def test_row_alignment() -> None:
    # UMP _check_row_alignment: every per-rank row a multiple of 16 B; 1 head x 40 x 2 B = 80 B is fine,
    # 1 head x 36 x 2 B = 72 B is not
    assert row_alignment_problems([mha_entry("full", layer_num=1, head_num=1, head_dim=40, itemsize=2)]) == []
    bad = row_alignment_problems([mha_entry("full", layer_num=1, head_num=1, head_dim=36, itemsize=2)])
    assert [p.reason for p in bad] == [
        "--enable-unified-memory needs every per-rank KV row to be a multiple of 16 bytes; sub-pool 'full' "
        "has a 72-byte K row.",
        "--enable-unified-memory needs every per-rank KV row to be a multiple of 16 bytes; sub-pool 'full' "
        "has a 72-byte V row.",
    ]


@pytest.mark.parametrize(
    ("req", "options"),
    [
        (UnifiedRequest(is_mamba=True), []),
        (UnifiedRequest(is_hybrid_swa=True, speculative_algorithm="EAGLE", speculative_eagle_topk=1), []),
        (UnifiedRequest(), ["--enable-unified-memory"]),  # neither hybrid
        (UnifiedRequest(is_hybrid_swa=True, is_deepseek_v4=True), ["--enable-unified-memory"]),
        (UnifiedRequest(is_hybrid_swa=True, is_mla=True), ["--enable-unified-memory"]),
        (UnifiedRequest(is_mamba=True, kv_cache_dtype="fp4_e2m1"), ["--kv-cache-dtype"]),
        (UnifiedRequest(is_mamba=True, enable_kv_cache_sharding=True), ["--enable-kv-cache-sharding"]),
        (UnifiedRequest(is_mamba=True, speculative_algorithm="NGRAM"), ["--speculative-algorithm"]),
        (UnifiedRequest(is_mamba=True, speculative_eagle_topk=4), ["--speculative-eagle-topk"]),
        (UnifiedRequest(is_mamba=True, enable_two_batch_overlap=True), ["--enable-two-batch-overlap"]),
        (UnifiedRequest(is_mamba=True, enable_lmcache=True), ["--enable-lmcache"]),
        (
            UnifiedRequest(is_mamba=True, enable_unified_cache_external_linker=True),
            ["--enable-unified-cache-external-linker"],
        ),
        (
            UnifiedRequest(is_mamba=True, speculative_algorithm="EAGLE3", enable_hierarchical_cache=True),
            ["--enable-hierarchical-cache"],
        ),
        (UnifiedRequest(is_mamba=True, enable_hierarchical_cache=True), []),  # HiCache alone is fine
        (
            UnifiedRequest(is_mamba=True, disaggregation_mode="prefill", lazy_compaction=False, pp_size=2),
            ["--pp-size", "SGLANG_DISABLE_LAZY_COMPACTION"],
        ),
        (
            UnifiedRequest(
                is_mamba=True, disaggregation_mode="decode", disaggregation_decode_retraction_backup="host_pool"
            ),
            ["--disaggregation-decode-retraction-backup"],
        ),
        (UnifiedRequest(is_mamba=True, dcp_size=2), ["--dcp-size"]),  # MHA full side
        (UnifiedRequest(is_mamba=True, is_mla=True, dcp_size=2, attention_backends=("flashinfer",)), []),
        (
            UnifiedRequest(is_mamba=True, is_mla=True, dcp_size=2, attention_backends=("flashmla",)),
            ["--attention-backend"],
        ),
    ],
)
def test_refusals(req: UnifiedRequest, options: list[str]) -> None:
    """kv_cache_hook.py handle_unified_memory_pool / _validate_unified_memory_dcp, kv_shard_hook.py, the FP4 rule,
    kv_cache_configurator's model-class rule: each refusal names the option and the fix."""
    problems = unified_memory_problems(req)
    assert [p.option for p in problems] == options
    assert all(p.fix for p in problems)


# ------------------------------------------------------------- against SGLang's own UnifiedKVPool


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


_MHA = st.fixed_dictionaries(
    {
        "kind": st.just("mha"),
        "layers": st.integers(1, 12),
        "heads": st.integers(1, 8),
        "head_dim": st.sampled_from([36, 40, 64, 80, 96, 128, 256]),
    }
)
_MLA = st.fixed_dictionaries(
    {"kind": st.just("mla"), "layers": st.integers(1, 8), "rank": st.sampled_from([256, 512]), "rope": st.just(64)}
)
_STATE = st.fixed_dictionaries(
    {
        "kind": st.just("mamba"),
        "layers": st.integers(1, 40),
        "conv": st.lists(st.tuples(st.integers(1, 4096), st.integers(1, 4)), min_size=1, max_size=2),
        "temporal": st.tuples(st.integers(1, 16), st.integers(1, 128), st.integers(1, 128)),
    }
)

# the labels test builds the arena on the CPU in the peer: small entries keep it a few MB
_SMALL_MHA = st.fixed_dictionaries(
    {
        "kind": st.just("mha"),
        "layers": st.integers(1, 4),
        "heads": st.integers(1, 4),
        "head_dim": st.sampled_from([64, 128]),
    }
)
_SMALL_STATE = st.fixed_dictionaries(
    {
        "kind": st.just("mamba"),
        "layers": st.integers(1, 4),
        "conv": st.lists(st.tuples(st.integers(1, 64), st.integers(1, 4)), min_size=1, max_size=2),
        "temporal": st.tuples(st.integers(1, 4), st.integers(1, 16), st.integers(1, 16)),
    }
)


def _named(spec: dict[str, Any], name: str, grow: str) -> dict[str, Any]:
    return {**spec, "name": name, "grow": grow, **({"conv": [list(c) for c in spec["conv"]]} if "conv" in spec else {})}


@settings(max_examples=60, deadline=None)
@given(
    full=st.one_of(_MHA, _MLA),
    other=st.one_of(_STATE, _MHA),
    page=st.sampled_from([1, 16, 64]),
    total=st.integers(1, 1 << 34),
    tri=st.none() | _STATE,
)
def test_sizes_equal_sglang(peer: Peer, full: dict, other: dict, page: int, total: int, tri: dict | None) -> None:
    """Entry bytes, the sink, max_slots and the first slot past the sink, the row rule, and the refusal of an
    arena with no slot past the sink, all as SGLang's ``UnifiedKVPool`` computes them (built on ``meta``);
    with ``tri``, the three-pool chain (state up, SWA floating, full down)."""
    total = arena_bytes(total) or 4096
    if tri is not None and other["kind"] != "mamba":
        specs = [_named(full, "full", "down"), _named(other, "swa", "float"), _named(tri, "mamba", "up")]
    else:
        specs = [_named(full, "full", "down"), _named(other, "mamba" if other["kind"] == "mamba" else "swa", "up")]
    reply = peer.call("sizes", total=total, page=page, specs=specs)
    entries = [entry(s) for s in specs]
    assert reply["entry"] == {e.name: e.entry_bytes for e in entries}
    assert reply["sink"] == sink_bytes(entries, page)
    rows = row_alignment_problems(entries)
    assert ("row_error" in reply) == bool(rows)
    rows += [
        p
        for e in entries
        if e.kind == "state"
        for p in state_alignment_problems(e, conv_itemsize=2, temporal_itemsize=4)
    ]
    if rows:  # SGLang refuses to build the pool: this rule, or an earlier sub-pool's room (chain order)
        assert "Increase total_bytes" in reply["error"] or any(reply["error"].startswith(p.reason[:-1]) for p in rows)
        return
    try:
        geo = [sub_pool_geometry(total, e, reply["sink"], page) for e in entries]
    except InvalidValueError:
        assert "error" in reply
        return
    assert "error" not in reply, reply.get("error")
    assert reply["max_slots"] == {g.name: g.max_slots for g in geo}
    assert reply["min_slot"] == {g.name: g.min_slot_index for g in geo}


@settings(max_examples=30, deadline=None)
@given(
    composite=st.sampled_from(["mamba", "swa"]),
    full=_SMALL_MHA,
    other=st.one_of(_SMALL_STATE, _SMALL_MHA),
    page=st.sampled_from([1, 2, 16]),
    pages=st.integers(2, 400),
)
def test_labels_equal_sglang(peer: Peer, composite: str, full: dict, other: dict, page: int, pages: int) -> None:
    """``size_full``, ``size_mamba``, ``mamba_slot_full_token_cost``, ``size_swa`` and the empty arena's
    availability of SGLang's composites equal kvpools' arithmetic (and kvpools' composites)."""
    if composite == "mamba" and other["kind"] != "mamba":
        other = {"kind": "mamba", "layers": 2, "conv": [[16, 3]], "temporal": [2, 8, 8]}
    if composite == "swa" and other["kind"] != "mha":
        other = {**full}
    specs = [_named(full, "full", "down"), _named(other, composite, "up")]
    entries = [entry(s) for s in specs]
    if row_alignment_problems(entries) or any(
        state_alignment_problems(e, conv_itemsize=2, temporal_itemsize=4) for e in entries if e.kind == "state"
    ):
        return  # SGLang refuses to lay such rows out (test_sizes_equal_sglang covers the rule)
    sink = sink_bytes(entries, page)
    total = arena_bytes(sink + pages * max(e.entry_bytes for e in entries) * page) + 4096
    reply = peer.call("new", composite=composite, total=total, page=page, lazy=True, specs=specs)
    arena = UnifiedArena.build(total, [(e, s["grow"]) for e, s in zip(entries, specs, strict=True)], page)
    g_full, g_other = arena.geometry["full"], arena.geometry[composite]
    assert reply["full"]["avail"] == empty_end_available_tokens(g_full, g_other)
    if composite == "mamba":
        assert reply["size_full"] == mamba_size_full(g_full)
        assert reply["size_mamba"] == g_other.max_slots - 1
        assert reply["cost"] == mamba_slot_full_token_cost(entries[1], entries[0])
        assert reply["available"] == UnifiedMambaAllocator(arena).available_size()
    else:
        assert reply["size_full"] == swa_size_full(g_full, g_other) == UnifiedSWAAllocator(arena).size_full
        assert reply["size_swa"] == UnifiedSWAAllocator(arena).size_swa
        assert reply["available"] == UnifiedSWAAllocator(arena).available_size()


_RARELY = st.sampled_from([False, False, False, True])
_HOOK_OPTIONS = frozenset(
    {"--enable-unified-memory", "--kv-cache-dtype", "--enable-kv-cache-sharding"}
)  # rules outside handle_unified_memory_pool (the configurator, the FP4 and sharding hooks)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_refusals_equal_sglang(peer: Peer, data: st.DataObject) -> None:
    """SGLang's ``handle_unified_memory_pool`` (kv_cache_hook.py, run in the peers venv) refuses exactly when
    kvpools' rules do, with the first failing rule's message: SGLang asserts them in order."""
    pd = data.draw(st.sampled_from(["null", "null", "null", "null", "prefill", "decode"]))
    dcp = data.draw(st.sampled_from([1, 1, 1, 2]))
    args = {
        "is_mamba": data.draw(_RARELY),
        "is_mla": data.draw(_RARELY),
        "lazy_compaction": not data.draw(_RARELY),
        "disaggregation_mode": pd,
        "disaggregation_transfer_backend": data.draw(st.sampled_from(["mooncake", "mooncake", "mooncake", "nixl"])),
        "pp_size": data.draw(st.sampled_from([1, 1, 1, 2])),
        # the backend audits of EAGLE / DSPARK / DFLASH are not modelled: only algorithms they pass here
        "speculative_algorithm": data.draw(
            st.sampled_from([None, None, None, "EAGLE", "EAGLE3", "NGRAM", "STANDALONE"])
        )
        if dcp == 1
        else None,
        "speculative_eagle_topk": data.draw(st.sampled_from([None, 1, 1, 4])),
        "enable_hisparse": data.draw(_RARELY),
        "disaggregation_decode_enable_offload_kvcache": data.draw(_RARELY),
        "hicache_storage_backend": data.draw(st.sampled_from([None, "file", "mooncake"])),
        "disaggregation_decode_retraction_backup": data.draw(st.sampled_from([None, "host_pool"])),
        "enable_two_batch_overlap": data.draw(_RARELY),
        "enable_lmcache": data.draw(_RARELY),
        "enable_unified_cache_external_linker": data.draw(_RARELY),
        "enable_hierarchical_cache": data.draw(_RARELY),
        "dcp_size": dcp,
        "attention_backends": [
            data.draw(st.sampled_from(["flashinfer", "flashinfer", "flashmla"])) if dcp > 1 else "flashinfer"
        ],
    }
    args["is_hybrid_swa"] = not args["is_mamba"] or data.draw(_RARELY)
    req = UnifiedRequest(**{**args, "attention_backends": tuple(args["attention_backends"])})
    ours = [p for p in unified_memory_problems(req) if p.option not in _HOOK_OPTIONS]
    theirs = peer.call("refuse", args=args)["error"]
    event("accepted" if not ours else f"refused: {ours[0].option}")
    if not ours:
        assert theirs is None
    else:
        assert theirs is not None and theirs.startswith(ours[0].reason[:60]), (theirs, ours[0].reason)
