"""``kvpools capacity --enable-unified-memory`` (issue 31): requests per length in the arena, by hand, against the
real unified allocator filling the same arena, and the three-mode comparison through the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import kvpools_core as kv
import kvpools_core.cli as cli
from kvpools_core.allocators.unified import UnifiedArena, UnifiedMambaAllocator
from kvpools_core.parts.unified import SubPoolEntry
from kvpools_core.planning.unified import ARENA_BYTES, three_modes, unified_concurrency
from kvpools_core.values import Serving

QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"


def test_qwen3_next_by_hand() -> None:
    """20 GiB, TP 4, sglang: the 21,455,519,744 B arena of test_unified_plan.  The full END starts at the top of
    its 1,746,054 slots (page 1): 1,746,054 x 12,288 = 21,455,511,552 B; the state END at its first slot past
    the sink, 1 x 19,316,736 B.  An 8k request draws 8,192 x 12,288 + 3 x 19,316,736 = 158,613,504 B (3 state
    slots with the radix cache), so (21,455,511,552 - 19,316,736) // 158,613,504 = 135 run; the cap is 175."""
    p = kv.plan(QWEN3_NEXT, Serving(tp_size=4, enable_unified_memory=True, accounting="sglang"), memory="20GiB")
    a = unified_concurrency(p, 8192)
    assert a.request_bytes == 8192 * 12_288 + 3 * 19_316_736 == 158_613_504
    assert a.room_bytes == 1_746_054 * 12_288 - 19_316_736
    assert a.concurrent_requests == (1_746_054 * 12_288 - 19_316_736) // 158_613_504 == 135
    assert a.binding == ARENA_BYTES and a.limits["request cap"] == 175
    # a short request: the state slots dominate and the request cap binds
    assert unified_concurrency(p, 16).binding == "request cap"


@pytest.mark.parametrize(("length", "memory"), [(8192, "3GiB"), (1000, "2GiB"), (30_000, "4GiB")])
def test_the_allocator_admits_exactly_the_predicted_requests(length: int, memory: str) -> None:
    """Fill the plan's arena through kvpools' UnifiedMambaAllocator (SGLang's contract, differential-tested in
    test_unified_allocator_vs_sglang): each request takes 3 state slots and its tokens; the count admitted
    before the first refusal is the capacity answer (when the arena, not the request cap, binds)."""
    p = kv.plan(QWEN3_NEXT, Serving(tp_size=4, enable_unified_memory=True, page_size=16), memory=memory)
    arena = p.sizing.arenas[0]
    full, state = arena.sub_pool("kv"), arena.sub_pool("mamba_state")
    built = UnifiedArena.build(
        arena.bytes,
        [
            (SubPoolEntry("kv", "kv", 12, full.entry_bytes), "down"),
            (SubPoolEntry("mamba_state", "state", 36, state.entry_bytes), "up"),
        ],
        p.serving.page_size,
    )
    alloc = UnifiedMambaAllocator(built, full="kv", mamba="mamba_state")
    predicted = unified_concurrency(p, length)
    admitted = 0
    while admitted <= predicted.concurrent_requests + 1:
        slots = [alloc.mamba_allocator.alloc(1) for _ in range(3)]
        if any(s is None for s in slots):
            break
        pages = -(-length // 16) * 16
        if alloc.alloc(pages) is None:
            break
        admitted += 1
    if predicted.binding == ARENA_BYTES:
        assert admitted == predicted.concurrent_requests
    else:
        assert admitted >= predicted.concurrent_requests


def test_three_modes_gpt_oss_120b() -> None:
    """SGLang's static split (ratio 0.8) < the best static ratio for the length <= unified memory (no split)."""
    rows = three_modes("gpt-oss-120b", Serving(enable_unified_memory=True), {"memory": "60GiB"}, [8192, 32768])
    for row in rows:
        assert row.static < row.best_static <= row.unified
        assert row.unified_binding == ARENA_BYTES


def test_capacity_cli_json() -> None:
    result = CliRunner().invoke(
        cli.main,
        [
            *("capacity", QWEN3_NEXT, "--tp-size", "4", "--memory", "20GiB", "--enable-unified-memory"),
            *("--context", "8k,32k", "--workload", "8k", "--json"),
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [c["context_len"] for c in data["capacity"]] == [8192, 32768]
    assert data["arena"]["labels"]["mamba_slot_full_token_cost"] == 1_572
    assert len(data["modes"]) == 3 and data["workload"] == "8k"


def test_capacity_refuses_what_it_does_not_answer() -> None:
    result = CliRunner().invoke(
        cli.main, ["capacity", "gpt-oss-20b", "--memory", "20GiB", "--enable-unified-memory", "--requests", "4"]
    )
    assert result.exit_code == 1 and "not modelled for it yet" in result.stderr


def test_the_static_capacity_planner_refuses_an_arena() -> None:
    """The static planner reads a fixed split from the plan's counts; an arena has none, so it refuses rather
    than answer as if the full side held every token (fit, sweep, the capacity record, the service)."""
    from kvpools_core.errors import UnsupportedCombinationError
    from kvpools_core.planning.capacity import concurrency

    p = kv.plan("gpt-oss-20b", Serving(enable_unified_memory=True), memory="20GiB")
    with pytest.raises(UnsupportedCombinationError, match=r"planning\.unified"):
        concurrency(p, 8192)
