"""DeepSeek-V4 with HiSparse under exact accounting (issue 32): the HiSparse allocator's device bytes, planned and
built, and its allocator against SGLang 0.5.23's own ``DeepSeekV4HiSparseTokenToKVPoolAllocator`` (peers venv).
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import attrs
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from kvpools_plugins.dsv4.hisparse_allocator import DSV4HiSparseAllocator

from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator
from kvpools_core.building import build
from kvpools_core.pipeline import plan
from kvpools_core.values import Serving
from tests.oracle import locate

GiB = 1 << 30
HISPARSE = Serving(
    page_size=256,
    tp_size=8,
    swa_full_tokens_ratio=0.8,
    enable_hisparse=True,
    disable_radix_cache=True,
    hisparse_config='{"host_to_device_ratio": 4}',
)
PEER = Path(__file__).with_name("sglang_dsv4_hisparse_peer.py")


def test_build_on_meta_allocates_what_the_plan_says() -> None:
    """The exact plan's every pool, the allocator's included, is what ``build`` allocates (on meta)."""
    p = plan("deepseek-v4-flash", HISPARSE, memory=40 * GiB)
    built = build(p, device="meta")
    assert isinstance(built.allocator, DSV4HiSparseAllocator)
    measured = built.allocated_by_pool()
    assert measured == {pool.name: pool.bytes for pool in p.sizing.pools}


def _allocator(full: int, page: int, c4_tokens: int, c128_tokens: int) -> DSV4HiSparseAllocator:
    logical = SWATokenToKVPoolAllocator(full, full, page)
    return DSV4HiSparseAllocator(logical, c4_tokens, c128_tokens)


def _run(allocator: DSV4HiSparseAllocator, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    steps = []
    mapping = allocator.full_to_hisparse_device_index_mapping
    for op in ops:
        got = None
        if op["op"] == "extend":
            prefix, seq, last = (torch.tensor(op[k], dtype=torch.int64) for k in ("prefix", "seq", "last"))
            out = allocator.alloc_extend(prefix, seq, last, int((seq - prefix).sum()))
            got = None if out is None else [int(x) for x in out]
        else:
            allocator.free(torch.tensor(op["slots"], dtype=torch.int64))
        steps.append(
            {
                "out": got,
                "mapping": {str(i): int(v) for i, v in enumerate(mapping.tolist()) if v != 0},
                "available": int(allocator.available_size()),
                "device_available": int(allocator.hisparse_attn_allocator.available_size()),
            }
        )
    return steps


def _workload(rng: random.Random, full: int, page: int, c4_tokens: int, n: int) -> list[dict[str, Any]]:
    """Requests prefilled in chunks and freed whole, as the scheduler does (its ``last_loc``: the last slot held)."""
    live: dict[int, list[int]] = {}
    ops: list[dict[str, Any]] = []
    # the op list is built ahead from kvpools' own answers, then replayed on both sides
    allocator = _allocator(full, page, c4_tokens, full // 128)
    for rid in range(n):
        if live and rng.random() < 0.35:
            victim = rng.choice(sorted(live))
            op = {"op": "free", "slots": live.pop(victim)}
        else:
            held = live.get(rid % 5, [])
            grow = rng.choice([1, 3, 4, 17, page, page + 5, 2 * page + 3])
            op = {"op": "extend", "prefix": [len(held)], "seq": [len(held) + grow], "last": [held[-1] if held else -1]}
        (step,) = _run(allocator, [op])
        ops.append(op)
        if op["op"] == "extend" and step["out"] is not None:
            live[rid % 5] = live.get(rid % 5, []) + step["out"]
    return ops


def test_allocator_matches_sglang() -> None:
    """Same pages, same logical slots, same c4 mapping and available sizes as SGLang's allocator, op by op."""
    python, bench = locate.require_sglang_peer()
    rng = random.Random(32)
    cases = []
    for full, page, c4_div in ((4096, 256, 8), (8192, 256, 16), (2048, 128, 4)):
        cases.append(
            {
                "full": full,
                "page_size": page,
                "c4_tokens": full // c4_div,
                "c128_tokens": full // 128,
                "ops": _workload(rng, full, page, full // c4_div, 40),
            }
        )
    out = subprocess.run(
        [str(python), str(PEER), str(bench)], input=json.dumps(cases), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    for case, want in zip(cases, json.loads(out.stdout), strict=True):
        ours = _allocator(case["full"], case["page_size"], case["c4_tokens"], case["c128_tokens"])
        assert ours.hisparse_page_size == want["hisparse_page_size"]
        assert ours.hisparse_attn_allocator.available_size() == want["device_pages"] * want["hisparse_page_size"]
        mapping = ours.full_to_hisparse_device_index_mapping
        assert (mapping.numel(), str(mapping.dtype), int(mapping[-1])) == (
            want["mapping_entries"],
            want["mapping_dtype"],
            want["mapping_last"],
        )
        assert _run(ours, case["ops"]) == want["steps"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 700), st.booleans()), min_size=1, max_size=30))
def test_device_rows_follow_the_mapped_c4_slots(ops: list[tuple[int, int, bool]]) -> None:
    """Invariant: every mapped c4 slot owns a distinct device row outside page 0, the device allocator hands out
    exactly the pages those rows fill, and freeing every request gives every page back."""
    full, page = 8192, 256
    allocator = _allocator(full, page, full // 16, full // 128)
    hp = allocator.hisparse_page_size
    total = allocator.hisparse_attn_allocator.available_size()
    held: dict[int, list[int]] = {}
    for rid, grow, free in ops:
        slots = held.get(rid, [])
        if free and slots:
            allocator.free(torch.tensor(slots))
            held.pop(rid)
        else:
            pre = torch.tensor([len(slots)])
            out = allocator.alloc_extend(pre, pre + grow, torch.tensor([slots[-1] if slots else -1]), grow)
            if out is not None:
                held[rid] = slots + out.tolist()
        mapping = allocator.full_to_hisparse_device_index_mapping[:-1]
        rows = mapping[mapping != 0]
        assert int(rows.unique().numel()) == int(rows.numel())
        assert bool((rows >= hp).all())
        pages = {int(r) // hp for r in rows}
        assert total - allocator.hisparse_attn_allocator.available_size() >= len(pages) * hp
        expected = sum(len(s) // 4 for s in held.values())
        assert int(rows.numel()) == expected
    for slots in held.values():
        allocator.free(torch.tensor(slots))
    assert allocator.hisparse_attn_allocator.available_size() == total


def test_without_hisparse_the_allocator_is_the_swa_one() -> None:
    p = plan("deepseek-v4-flash", attrs.evolve(HISPARSE, enable_hisparse=False, hisparse_config=None), memory=40 * GiB)
    assert isinstance(build(p, device="meta").allocator, SWATokenToKVPoolAllocator)
    assert not {"c4_hisparse_allocator", "c4_hisparse_mapping"} & {pool.name for pool in p.sizing.pools}
