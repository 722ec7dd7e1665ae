"""The layouts and side states issue 31 left refused: ``--enable-page-major-kv-layout``, the Mamba envelope layout,
ReplaySSM and Qwen4-Exp's PLE state under ``--enable-unified-memory``, each against SGLang 0.5.23's own code.

Line references: SGLang 0.5.23's ``srt/arg_groups/kv_cache_hook.py`` (HOOK), ``srt/arg_groups/pipeline.py``
(PIPE), ``srt/mem_cache/kv_cache_configurator.py`` (KCC), ``srt/mem_cache/unified_memory_pool.py`` (UMP),
``srt/mem_cache/memory_pool.py`` (MP).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import attrs
import pytest
from click.testing import CliRunner

import kvpools_core as kv
import kvpools_core.cli as cli
from kvpools_core.errors import ConfigError
from kvpools_core.values import Plan, Serving
from tests.unified.peer import Peer

QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"
KIMI = "kimi-linear-48b-a3b-instruct-nvfp4"
RING_POOL = "mamba_replayssm_ring"


@pytest.fixture(scope="module")
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


def _plan(model: str, memory: str = "20GiB", **serving: Any) -> Plan:
    return kv.plan(model, Serving(**serving), memory=memory)


def _cli(*args: str) -> Any:
    return CliRunner().invoke(cli.main, ["plan", *args])


_HOOK_ARGS = {  # a server-args namespace for handle_page_major_kv_layout: an MHA model on allowed backends
    "enable_unified_memory": False,
    "enable_page_major_kv_layout": True,
    "is_mla": False,
    "has_asymmetric_kv": False,
    "attention_backends": ["fa3"],
    "linear_attn_decode_backend": None,
    "linear_attn_backend": None,
    "linear_attn_prefill_backend": None,
    "mamba_backend": None,
}


# ------------------------------------------------------------------------------------- --enable-page-major-kv-layout


@pytest.mark.parametrize("model", ["gpt-oss-20b", QWEN3_NEXT, "llama-3.1-8b"])
def test_page_major_alone_is_refused_with_sglangs_reason(peer: Peer, model: str) -> None:
    """HOOK ``handle_page_major_kv_layout``: without ``--enable-unified-memory`` the flag is refused before any
    pool exists (MP ``PageMajorMHATokenToKVPool._create_buffers`` raises too: the class is non-constructible)."""
    theirs = peer.call("page_major", args=_HOOK_ARGS)["error"]
    assert theirs.startswith("--enable-page-major-kv-layout without --enable-unified-memory is temporarily unsupported")
    result = _cli(model, "--memory", "20GiB", "--enable-page-major-kv-layout")
    assert result.exit_code == 1 and result.stderr.startswith("Error: "), (result.stdout, result.stderr)
    assert "Traceback" not in result.output
    reason = "the strided MHA K/V views were removed and the static-pool page-major layout awaits its per-layer-view "
    assert reason in theirs and reason in " ".join(result.stderr.split())
    assert "--enable-page-major-kv-layout without --enable-unified-memory is temporarily unsupported" in result.stderr
    with pytest.raises(ConfigError, match="enable_page_major_kv_layout without enable_unified_memory"):
        Serving(enable_page_major_kv_layout=True)


@pytest.mark.parametrize(
    ("model", "serving", "memory"),
    [
        ("gpt-oss-20b", {"page_size": 16}, "60GiB"),  # hybrid SWA: UnifiedSWAKVPool
        (QWEN3_NEXT, {"tp_size": 4, "accounting": "sglang"}, "20GiB"),  # GDN hybrid, MHA full side
        (KIMI, {"tp_size": 2}, "20GiB"),  # KDA hybrid, MLA full side
    ],
)
def test_unified_memory_implies_page_major_and_the_plan_is_the_arena(
    peer: Peer, model: str, serving: dict[str, Any], memory: str
) -> None:
    """HOOK ``handle_page_major_kv_layout`` declares the flag on under ``--enable-unified-memory``: the unified
    arena (token-major entries, every layer of one slot contiguous) is the page-major layout, so passing the flag
    too changes nothing in the plan; SGLang accepts both spellings."""
    implied = peer.call(
        "page_major", args={**_HOOK_ARGS, "enable_unified_memory": True, "enable_page_major_kv_layout": False}
    )
    assert implied == {"error": None, "enable_page_major_kv_layout": True}
    plain = _plan(model, memory, enable_unified_memory=True, **serving)
    flagged = _plan(model, memory, enable_unified_memory=True, enable_page_major_kv_layout=True, **serving)
    assert flagged.sizing == plain.sizing and flagged.pools == plain.pools
    assert flagged.serving.enable_page_major_kv_layout and not plain.serving.enable_page_major_kv_layout
    built = kv.build(flagged, "meta")
    assert built.allocated_bytes == flagged.planned_bytes


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # KCC _build_token_to_kv_pool's assert "page-major KV layout is not supported with fp4 KV cache" sits on the
        # plain-MHA arm, which SGLang 0.5.23 never reaches with the flag on: without unified memory PIPE line 336
        # (handle_page_major_kv_layout) refuses first ...
        (("llama-3.1-8b", "--kv-cache-dtype", "fp4_e2m1"), "temporarily unsupported"),
        (("gpt-oss-20b", "--kv-cache-dtype", "fp4_e2m1"), "temporarily unsupported"),
        # ... and with it, HOOK handle_kv4_compatibility (PIPE line 254) refuses FP4 under unified memory, and a
        # plain-MHA model is neither hybrid (KCC _init_pools)
        (("gpt-oss-20b", "--kv-cache-dtype", "fp4_e2m1", "--enable-unified-memory"), "FP4 KV cache does not yet"),
        (("llama-3.1-8b", "--enable-unified-memory"), "this model is neither"),
    ],
)
def test_page_major_with_fp4_never_reaches_the_plain_mha_assert(args: tuple[str, ...], message: str) -> None:
    result = _cli(*args, "--memory", "20GiB", "--enable-page-major-kv-layout")
    assert result.exit_code == 1 and result.stderr.startswith("Error: ") and "Traceback" not in result.output
    assert message in result.stderr, result.stderr


# ----------------------------------------------------------------------------- ReplaySSM under unified memory


def test_the_unified_factory_takes_no_replayssm_or_ple_geometry(peer: Peer) -> None:
    """UMP ``init_unified_mamba_pools`` and ``UnifiedHybridReqToTokenPool`` have no ReplaySSM, short-conv or n-gram
    parameter (``UnifiedMambaPool`` sets ``enable_linear_replayssm`` False): nothing but the recurrent state can
    reach the arena's state entry, which is kvpools' entry (``test_unified_plan.py``)."""
    sig = peer.call("signatures")
    for params in sig.values():
        assert not [p for p in params if "replayssm" in p or "short_conv" in p or "ngram" in p or "envelope" in p]
    assert "unified_total_bytes" in sig["init_unified_mamba_pools"]


def test_the_mamba_envelope_entry_is_the_arenas_state_entry(peer: Peer) -> None:
    """``mamba_envelope_layout`` (KCC ``_build_hybrid_req_pool`` / ``_build_hybrid_mamba_decode_req_pool``) is
    ``--enable-page-major-kv-layout``, which SGLang 0.5.23 accepts only with unified memory, where the target's
    request pool comes from the unified factory (it ignores the flag, UMP ``_init_mamba_pool``).  Its entry
    (``layout/token_major.py`` ``mamba_entry_bytes``: every layer's conv and temporal state of one slot) is the
    arena's state entry, and ``size + 1`` of them are the static state pool's bytes: Qwen3-Next at TP 4,
    36 x (2,048 x 3 x 2 + 8 x 128 x 128 x 4) = 19,316,736 B."""
    theirs = peer.call("envelope", layers=36, conv=[[2048, 3]], temporal=[8, 128, 128])["entry"]
    assert theirs == 36 * (2_048 * 3 * 2 + 8 * 128 * 128 * 4) == 19_316_736
    unified = _plan(QWEN3_NEXT, enable_unified_memory=True, enable_page_major_kv_layout=True, tp_size=4)
    assert unified.sizing.arenas[0].sub_pool("mamba_state").entry_bytes == theirs
    static = _plan(QWEN3_NEXT, tp_size=4)
    state = static.pool("mamba_state")
    assert state.bytes == (state.slots + state.padding_slots) * theirs  # max_slots = size + 1 (MP line 701)


@pytest.mark.parametrize(("model", "serving"), [(QWEN3_NEXT, {"tp_size": 4}), (KIMI, {"tp_size": 2})])
def test_the_decode_ring_flag_changes_nothing_under_unified_memory(model: str, serving: dict[str, Any]) -> None:
    """``--enable-linear-replayssm``: the static plan has the (uncharged) decode ring; SGLang's unified stack
    builds none, and ``_handle_max_mamba_cache`` does not read the decode flag, so the unified plan is the plan
    without the flag, to the byte."""
    static = _plan(model, enable_linear_replayssm=True, **serving)
    assert RING_POOL in {p.name for p in static.pools}
    off = _plan(model, enable_unified_memory=True, accounting="sglang", **serving)
    on = _plan(model, enable_unified_memory=True, accounting="sglang", enable_linear_replayssm=True, **serving)
    assert on.pools == off.pools and on.sizing.arenas == off.sizing.arenas
    assert RING_POOL not in {p.name for p in on.pools}
    assert any("builds no ring" in n for n in on.sizing.notes)


def test_the_spec_ring_is_reserved_by_sglangs_budget_but_not_allocated(peer: Peer) -> None:
    """``--enable-linear-replayssm-spec`` on Qwen3-Next (GDN) at TP 4, 20 GiB, 64 requests.

    The ring (configs/mamba_utils.py ``replayssm_ring_bytes_per_req``, L = 16): per layer d = 8 v-heads x 16 x 128
    x 2 B = 32,768, k = 4 k-heads x 16 x 128 x 2 = 16,384, the fp32 gate 8 x 16 x 4 = 512 and the bf16 low parts
    of d and k 49,152: 98,816 B; x 36 GDN layers = 3,557,376 B per request row.  KCC ``_handle_max_mamba_cache``
    reserves it for 64 + 1 rows (231,229,440 B) before K: K = 513 (525 without), and the token side's budget is
    the static split's KV share, 920,801 x 12,288 B = 11,314,802,688 B (``unified_total_bytes``, already a 4,096 B
    multiple).  UMP ``init_unified_mamba_pools`` puts K state entries on top and builds no ring:
    11,314,802,688 + 513 x 19,316,736 = 21,224,288,256 B; the reserve stays unallocated.
    """
    serving: dict[str, Any] = {
        "tp_size": 4,
        "accounting": "sglang",
        "max_running_requests": 64,
        "enable_linear_replayssm_spec": True,
    }
    static = _plan(QWEN3_NEXT, **serving)
    ring = next(p for p in static.pools if p.name == RING_POOL)
    assert ring.bytes == 3_557_376 * 65 == 231_229_440
    assert static.sizing.sglang_config["max_mamba_cache_size"] == 513 and static.max_total_num_tokens == 920_801
    p = _plan(QWEN3_NEXT, enable_unified_memory=True, **serving)
    (arena,) = p.sizing.arenas
    assert arena.bytes == 920_801 * 12_288 + 513 * 19_316_736 == 21_224_288_256
    assert arena.labels["max_mamba_cache_size"] == 513
    assert RING_POOL not in {pool.name for pool in p.pools}
    assert any("3,557,376 B per request row" in n for n in p.sizing.notes)
    # the geometry SGLang's UnifiedKVPool computes for these arena bytes (the peer builds it on meta)
    specs = [
        {"kind": "mha", "name": "full", "grow": "down", "layers": 12, "heads": 1, "head_dim": 256},
        {"kind": "mamba", "name": "mamba", "grow": "up", "layers": 36, "conv": [[2048, 3]], "temporal": [8, 128, 128]},
    ]
    reply = peer.call("sizes", total=arena.bytes, page=p.serving.page_size, specs=specs)
    assert reply["entry"] == {"full": 12_288, "mamba": 19_316_736} and reply["sink"] == arena.sink_bytes
    assert [reply["max_slots"][n] for n in ("full", "mamba")] == [
        arena.sub_pool("kv").max_slots,
        arena.sub_pool("mamba_state").max_slots,
    ]
    built = kv.build(p, "meta")
    assert built.allocated_bytes == p.planned_bytes
    assert built.allocated_by_pool() == {pool.name: pool.bytes for pool in p.pools if pool.arena is None}


def test_the_kda_spec_ring_is_charged_per_slot_and_not_allocated() -> None:
    """Kimi-Linear (KDA, MLA full side) at TP 2: the spec ring is charged per state slot (KCC
    ``_handle_max_mamba_cache``: ``extra_per_slot``), so K falls from 467 to 342; the arena puts 342 state entries
    on top of the token budget and no ring pool exists; the plan builds on meta to the byte."""
    serving: dict[str, Any] = {"tp_size": 2, "accounting": "sglang", "enable_linear_replayssm_spec": True}
    static = _plan(KIMI, **serving)
    assert static.sizing.sglang_config["max_mamba_cache_size"] == 342
    p = _plan(KIMI, enable_unified_memory=True, **serving)
    (arena,) = p.sizing.arenas
    state = arena.sub_pool("mamba_state")
    assert arena.labels["max_mamba_cache_size"] == 342
    assert (arena.bytes - 342 * state.entry_bytes) % 4_096 == 0  # unified_total_bytes, floored to 4,096 B
    assert RING_POOL not in {pool.name for pool in p.pools}
    plain = _plan(KIMI, enable_unified_memory=True, tp_size=2, accounting="sglang")
    assert arena.bytes < plain.sizing.arenas[0].bytes  # the reserve leaves the budget, not into the arena
    assert kv.build(p, "meta").allocated_bytes == p.planned_bytes


# ------------------------------------------------------------------------------- Qwen4-Exp's PLE state


def test_ple_state_is_refused_with_sglangs_reason(peer: Peer) -> None:
    """UMP ``UnifiedHybridReqToTokenPool._init_mamba_pool`` refuses the short-conv / n-gram state; kvpools names
    SGLang's reason, the option and the fix, and plans the static pools without unified memory."""
    theirs = peer.call("ple")["error"]
    assert theirs == "Qwen4-Exp PLE side states are not supported with --enable-unified-memory"
    result = _cli("qwen4-exp-defaults", "--memory", "20GiB", "--enable-unified-memory")
    assert result.exit_code == 1 and result.stderr.startswith("Error: ") and "Traceback" not in result.output
    assert theirs in " ".join(result.stderr.split()) and "without --enable-unified-memory" in result.stderr
    assert _plan("qwen4-exp-defaults").problems() == []


def test_a_plan_with_page_major_round_trips() -> None:
    p = _plan(QWEN3_NEXT, enable_unified_memory=True, enable_page_major_kv_layout=True, tp_size=4)
    again = Plan.from_json(p.to_json())
    assert again.serving == p.serving and attrs.asdict(again.sizing) == attrs.asdict(p.sizing)


def test_capacity_with_page_major_compares_the_static_modes_without_it() -> None:
    """``kvpools capacity``'s static columns plan the same serving without unified memory, where the flag alone
    would be refused: they drop it with ``--enable-unified-memory``, so the answer is the one without the flag."""
    args = ("capacity", QWEN3_NEXT, "--tp-size", "4", "--memory", "20GiB", "--enable-unified-memory")
    args += ("--context", "8k,32k", "--json")
    plain = CliRunner().invoke(cli.main, list(args))
    flagged = CliRunner().invoke(cli.main, [*args, "--enable-page-major-kv-layout"])
    assert plain.exit_code == 0 and flagged.exit_code == 0, flagged.output
    ours, theirs = json.loads(flagged.stdout), json.loads(plain.stdout)
    assert ours["modes"] == theirs["modes"] and ours["capacity"] == theirs["capacity"]
    assert [(m["static"], m["unified"]) for m in ours["modes"]] == [(110, 133), (27, 46)]


@pytest.mark.parametrize("unified", [False, True])
@pytest.mark.parametrize("flag", [False, True])
def test_serving_accepts_exactly_what_sglangs_hook_accepts(peer: Peer, unified: bool, flag: bool) -> None:
    """The four spellings: SGLang's ``handle_page_major_kv_layout`` refuses only the flag without unified memory,
    and resolves the flag on whenever unified memory is on; ``Serving`` refuses the same one (the backend
    allow-lists the hook also checks read attention backends kvpools does not take as options)."""
    theirs = peer.call(
        "page_major", args={**_HOOK_ARGS, "enable_unified_memory": unified, "enable_page_major_kv_layout": flag}
    )
    assert theirs["enable_page_major_kv_layout"] == (flag or unified)
    try:
        Serving(enable_unified_memory=unified, enable_page_major_kv_layout=flag)
        ours = None
    except ConfigError as exc:
        ours = str(exc)
    assert (ours is None) == (theirs["error"] is None), (ours, theirs)
