"""kvpools' multi-ended allocator against SGLang 0.5.23's, on the same serving trace, in one run.

A Mamba hybrid (Qwen3-Next-80B-A3B at TP 4, bf16: 12,288 B full entries,
19,316,736 B state entries) in a unified arena, page size 16, lazy compaction
(SGLang's default).  The seeded trace admits requests (one state slot and the
prompt's pages each), decodes (one page per request every few steps), finishes
requests (frees their pages and slot, leaving holes) and flushes at idle points
(``flush_opportunistic`` on both ENDs each step), so the full side keeps
growing into bytes the state side gave back and the reverse.  Both allocators
replay the same decisions; every id handed out and the final physical layout
must be equal (else the run fails).  "Core time" is the time inside allocator
calls only (``time.perf_counter`` around each).

SGLang's allocators are the installed code (the peers venv's site-packages,
``KVPOOLS_PEERS_VENV``, appended to ``sys.path``: same torch), imported with the
stand-ins of ``tests/unified/unified_peer_server.py``; the ``UnifiedKVPool``
they read their geometry from is built on ``meta`` (no arena bytes).

usage: .venv/bin/python benchmarks/unified_allocator.py [--arena-gib 4] [--steps 3000] [--seed 0]
"""

from __future__ import annotations

import argparse
import glob
import os
import random
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kvpools_core.allocators.unified import UnifiedArena, UnifiedMambaAllocator  # noqa: E402
from kvpools_core.parts.unified import mha_entry, state_entry  # noqa: E402

PAGE = 16


class Timed:
    """Sums the wall time spent inside the wrapped allocator calls."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self, fn: Any, *args: Any) -> Any:
        t = time.perf_counter()
        out = fn(*args)
        self.seconds += time.perf_counter() - t
        return out


def sglang_allocator(total: int) -> Any:
    venv = os.environ.get("KVPOOLS_PEERS_VENV", "/tmp/kvpools-peers-venv")
    bench = os.environ.get("KVPOOLS_BENCH_DIR", str(ROOT.parent / "shared" / "bench"))
    if not Path(bench, "peer_imports.py").is_file():
        bench = "/work/shared/bench"
    sys.path.extend([bench, *glob.glob(f"{venv}/lib/python3*/site-packages")])
    sys.path.insert(0, str(ROOT / "tests" / "unified"))
    import unified_peer_server as srv  # type: ignore[import-not-found]

    ump, _sub, um, _swa = srv.import_unified()
    full = ump.MHASubPoolSpec(
        name="full", layer_num=12, grow_direction="down", head_num=1, head_dim=256, store_dtype=torch.bfloat16
    )
    state = ump.MambaSubPoolSpec(
        name="mamba",
        layer_num=36,
        grow_direction="up",
        conv_state_shapes=((2048, 3),),
        conv_dtype=torch.bfloat16,
        temporal_state_shape=(8, 128, 128),
        temporal_dtype=torch.float32,
    )
    pool = ump.UnifiedKVPool(
        total_bytes=total, sub_pool_specs=[full, state], device="meta", enable_memory_saver=False, page_size=PAGE
    )
    kv = types.SimpleNamespace(full_kv_pool=srv._KV(), mamba_pool=srv._KV())
    return um.UnifiedMambaTokenToKVPoolAllocator(
        unified_buffer=pool, kvcache=kv, device="cpu", page_size=PAGE, lazy_compaction=True
    )


def kvpools_allocator(total: int) -> UnifiedMambaAllocator:
    full = mha_entry("full", layer_num=12, head_num=1, head_dim=256, itemsize=2)
    state = state_entry("mamba", layer_num=36, conv_row_bytes=[2048 * 3 * 2], temporal_row_bytes=8 * 128 * 128 * 4)
    return UnifiedMambaAllocator(UnifiedArena.build(total, [(full, "down"), (state, "up")], PAGE))


def replay(alloc: Any, steps: int, seed: int) -> tuple[float, list[Any], dict[str, list[int]]]:
    """The trace; returns core seconds, every id handed out, and the final page tables."""
    rng = random.Random(seed)
    timed = Timed()
    full, mamba = alloc.full_attn_allocator, alloc.mamba_allocator
    running: list[tuple[list[torch.Tensor], torch.Tensor]] = []
    log: list[Any] = []
    for _ in range(steps):
        for _ in range(rng.randint(0, 3)):  # admissions
            slot = timed(mamba.alloc, 1)
            log.append(None if slot is None else slot.tolist())
            if slot is None:
                break
            ids = timed(alloc.alloc, rng.randint(8, 256) * PAGE)
            log.append(None if ids is None else ids[:: PAGE // 4].tolist())
            if ids is None:
                timed(mamba.free, slot)
                break
            running.append(([ids], slot))
        for pages, _slot in running:  # decode: a fresh page now and then
            if rng.random() < 0.25:
                ids = timed(alloc.alloc, PAGE)
                log.append(None if ids is None else ids[0].item())
                if ids is not None:
                    pages.append(ids)
        for _ in range(min(len(running), rng.randint(0, 2))):  # finishes
            pages, slot = running.pop(rng.randrange(len(running)))
            timed(alloc.free, torch.cat(pages))
            timed(mamba.free, slot)
        timed(full.flush_opportunistic)  # idle points
        timed(mamba.flush_opportunistic)
    tables = {
        "full_v2p": full.virtual_to_physical.tolist(),
        "mamba_v2p": mamba.virtual_to_physical.tolist(),
    }
    return timed.seconds, log, tables


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arena-gib", type=float, default=4.0)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3, help="paired rounds; the median ratio is reported")
    args = ap.parse_args(argv)
    total = int(args.arena_gib * (1 << 30)) // 4096 * 4096
    ratios = []
    for r in range(args.rounds):
        order = ["sglang", "kvpools"] if r % 2 == 0 else ["kvpools", "sglang"]
        result = {}
        for name in order:
            alloc = sglang_allocator(total) if name == "sglang" else kvpools_allocator(total)
            result[name] = replay(alloc, args.steps, args.seed)
        if result["sglang"][1:] != result["kvpools"][1:]:
            print("error: kvpools and SGLang handed out different ids or layouts on the same trace", file=sys.stderr)
            return 1
        s, k = result["sglang"][0], result["kvpools"][0]
        ratios.append(k / s)
        print(f"round {r}: sglang {s:.3f} s core, kvpools {k:.3f} s core, ratio {k / s:.2f}")
    ratios.sort()
    print(
        f"median ratio kvpools / sglang: {ratios[len(ratios) // 2]:.2f} (goal <= 0.5); {len(result['sglang'][1])} calls"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
