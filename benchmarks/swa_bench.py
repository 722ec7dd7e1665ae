"""Paired rounds: kvpools' dual full / SWA allocator against SGLang 0.5.23's ``SWATokenToKVPoolAllocator``.

Both allocators replay one deterministic serving trace of a sliding-window model, call for call, the way
SGLang 0.5.23's scheduler drives its allocator without a radix cache (``ChunkCache``):

* admission (FCFS, while both pools keep room for the prompt and a page per running request): one prefill
  batch per step, ``alloc(n)`` at page size 1 (SGLang's scheduler), ``alloc_extend`` above;
* decode: one token per running request, ``alloc(bs)`` / ``alloc_decode``; a step that does not fit retracts
  the newest request (it frees everything and re-queues);
* window eviction (``free_swa_out_of_window_slots``): once ``seq_len - window`` passes the evicted length by
  ``--interval``, ``free_swa_segment(row[evicted:new], start_pos=evicted)`` with ``new`` page-aligned;
* request end (``free_kv_row_segments``): ``free_full_segments([(row[:evicted], 0)])`` and
  ``free_segments([(row[evicted:], evicted)])``.

Every step's evictions and request ends run inside one free group (``free_group_begin`` / ``end``, as the
scheduler's result processing).  Core time is the time inside the allocators' calls, by kind (``alloc``:
prefill and decode; ``evict``; ``end``: request ends and the group's end); both runs must see the same
``(full, swa)`` available sizes after every step, or the run fails.  An allocator without the segment frees
(kvpools before issue 37) is driven with ``free_swa`` / ``free_full`` / ``free`` of the same slots.

Each round replays kvpools then SGLang (order alternating by round); the ratio kvpools / SGLang is taken per
round and reported as the median [min, max] over rounds.

usage (peers venv; run_bench.sh runs it):
    PYTHONPATH=. python benchmarks/swa_bench.py --bench-dir ../shared/bench --rounds 5 [--pages 1,16]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

FULL_TOKENS = 65_536
SWA_TOKENS = 16_384
WINDOW = 1_024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-dir", default=os.environ.get("KVPOOLS_BENCH_DIR", "/work/shared/bench"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--pages", default="1,16", help="page sizes, comma separated")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--interval", type=int, default=128, help="SGLANG_SWA_EVICTION_INTERVAL")
    ap.add_argument("--out", default=None, help="JSON with every round's core times")
    args = ap.parse_args(argv)

    sys.path.insert(0, args.bench_dir)
    import torch

    from benchmarks.bench_adapter import _import_allocators
    from benchmarks.sglang_swa_peer import StubSWAPool, import_sglang_swa

    torch.set_num_threads(1)
    sglang_swa = import_sglang_swa(args.bench_dir)
    ours_mod = _import_allocators()
    import kvpools_core.allocators.swa as ours_swa  # loaded by _import_allocators, torch only

    report: dict[str, Any] = {"rounds": args.rounds, "requests": args.requests, "pages": {}}
    rows = []
    for page in (int(p) for p in args.pages.split(",")):
        trace = make_trace(args.requests, seed=20261207)

        def ours(page: int = page) -> Any:
            mapping = torch.zeros(FULL_TOKENS + page + 1, dtype=torch.int64)
            mapping[-1] = -1
            return OursDriver(ours_swa.SWATokenToKVPoolAllocator(FULL_TOKENS, SWA_TOKENS, page, mapping=mapping))

        def theirs(page: int = page) -> Any:
            alloc = sglang_swa.SWATokenToKVPoolAllocator(
                FULL_TOKENS, SWA_TOKENS, page, torch.bfloat16, "cpu", StubSWAPool(), False
            )
            return SglangDriver(alloc)

        rounds = []
        for rnd in range(args.rounds):
            got: dict[str, dict[str, Any]] = {}
            for name, make in (("kvpools", ours), ("sglang", theirs))[:: 1 if rnd % 2 == 0 else -1]:
                got[name] = replay(trace, make(), page, args.interval)
            if got["kvpools"]["sizes"] != got["sglang"]["sizes"]:
                print(f"page {page}: the two allocators' available sizes differ; stopping", file=sys.stderr)
                return 1
            rounds.append({name: {k: v for k, v in res.items() if k != "sizes"} for name, res in got.items()})
            print(f"page {page}: round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        report["pages"][page] = rounds
        rows.append((page, rounds))
    del ours_mod
    print_table(rows, args)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


def make_trace(n: int, seed: int) -> list[tuple[int, int]]:
    """``(prompt_len, output_len)`` per request, log-uniform 64..4,096 and 16..1,024."""
    rng = random.Random(seed)

    def draw(lo: int, hi: int) -> int:
        return int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1))))

    return [(draw(64, 4096), draw(16, 1024)) for _ in range(n)]


class _Driver:
    """One allocator behind the calls the replay makes, each timed into a bucket."""

    def __init__(self, alloc: Any) -> None:
        self.a = alloc
        self.core = {"alloc": 0.0, "evict": 0.0, "end": 0.0}
        self.segments = all(hasattr(alloc, m) for m in ("free_swa_segment", "free_segments", "free_full_segments"))

    def timed(self, bucket: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.core[bucket] += time.perf_counter() - t0
        return out

    def sizes(self) -> tuple[int, int]:
        return self.a.full_available_size(), self.a.swa_available_size()

    def extend(self, pre: Any, seq: Any, last: Any, n: int) -> Any:
        """The allocator's ``alloc_extend`` as its API spells it: each driver (ours, SGLang's) provides it."""
        raise NotImplementedError(f"{type(self).__name__} must drive its allocator's alloc_extend")

    def decode(self, seq: Any, last: Any) -> Any:
        """The allocator's ``alloc_decode``: each driver provides it."""
        raise NotImplementedError(f"{type(self).__name__} must drive its allocator's alloc_decode")

    def evict(self, slots: Any, start: int) -> None:
        if self.segments:
            self.timed("evict", self.a.free_swa_segment, slots, start_pos=start)
        else:
            self.timed("evict", self.a.free_swa, slots)

    def end(self, row: Any, evicted: int) -> None:
        if self.segments:
            if evicted:
                self.timed("end", self.a.free_full_segments, [(row[:evicted], 0)])
            self.timed("end", self.a.free_segments, [(row[evicted:], evicted)])
        else:
            if evicted:
                self.timed("end", self.a.free_full, row[:evicted])
            self.timed("end", self.a.free, row[evicted:])

    def group_begin(self) -> None:
        self.timed("end", self.a.free_group_begin)

    def group_end(self) -> None:
        self.timed("end", self.a.free_group_end)


class OursDriver(_Driver):
    def extend(self, pre: Any, seq: Any, last: Any, n: int) -> Any:
        return self.timed("alloc", self.a.alloc_extend, pre, seq, last, n)

    def decode(self, seq: Any, last: Any) -> Any:
        return self.timed("alloc", self.a.alloc_decode, seq, last)


class SglangDriver(_Driver):
    def extend(self, pre: Any, seq: Any, last: Any, n: int) -> Any:
        return self.timed("alloc", self.a.alloc_extend, pre, pre, seq, seq, last, n)

    def decode(self, seq: Any, last: Any) -> Any:
        return self.timed("alloc", self.a.alloc_decode, seq, seq, last)


def replay(trace: list[tuple[int, int]], drv: _Driver, page: int, interval: int) -> dict[str, Any]:
    """Replay ``trace`` through ``drv``; core seconds by bucket, steps, and the sizes after every step."""
    import torch

    waiting = list(range(len(trace)))
    waiting.reverse()  # pop() takes the next request
    running: list[int] = []
    length: dict[int, int] = {}  # tokens with KV
    evicted: dict[int, int] = {}
    rows: dict[int, Any] = {}
    done = retracted = steps = 0
    sizes: list[tuple[int, int]] = []
    t_wall = time.perf_counter()
    while waiting or running:
        steps += 1
        drv.group_begin()
        # window eviction of the running requests, then request ends
        for r in running:
            seq_len = length[r]
            if seq_len - WINDOW >= evicted[r] + interval:
                new = (seq_len - WINDOW) // page * page
                if new > evicted[r]:
                    drv.evict(rows[r][evicted[r] : new], evicted[r])
                    evicted[r] = new
        for r in [r for r in running if length[r] >= sum(trace[r])]:
            drv.end(rows[r][: length[r]], evicted[r])
            running.remove(r)
            done += 1
        drv.group_end()
        # decode one token for every running request, retracting the newest while the step does not fit
        while running:
            seq = torch.tensor([length[r] + 1 for r in running], dtype=torch.int64)
            need = len(running) if page == 1 else int(((seq - 1) % page == 0).sum())
            full, swa = drv.sizes()
            if need * page <= min(full, swa):
                break
            r = running.pop()
            drv.group_begin()
            drv.end(rows[r][: length[r]], evicted[r])
            drv.group_end()
            waiting.append(r)
            retracted += 1
        if running:
            last = torch.stack([rows[r][length[r] - 1] for r in running])
            out = drv.decode(seq, last) if page > 1 else drv.timed("alloc", drv.a.alloc, len(running))
            assert out is not None
            for i, r in enumerate(running):
                rows[r][length[r]] = out[i]
                length[r] += 1
        # admission: one prefill batch
        batch: list[int] = []
        full, swa = drv.sizes()
        budget = min(full, swa) - page * (len(running) + 1)
        while waiting and len(running) + len(batch) < 64:
            r = waiting[-1]
            cost = -(-trace[r][0] // page) * page
            if cost > budget:
                break
            budget -= cost + page
            batch.append(waiting.pop())
        if batch:
            prompts = [trace[r][0] for r in batch]
            n = sum(prompts)
            if page == 1:
                out = drv.timed("alloc", drv.a.alloc, n)
            else:
                zeros = torch.zeros(len(batch), dtype=torch.int64)
                out = drv.extend(zeros, torch.tensor(prompts, dtype=torch.int64), zeros - 1, n)
            assert out is not None
            at = 0
            for r, p in zip(batch, prompts, strict=True):
                row = torch.zeros(sum(trace[r]), dtype=torch.int64)
                row[:p] = out[at : at + p]
                at += p
                rows[r], length[r], evicted[r] = row, p, 0
                running.append(r)
        sizes.append(drv.sizes())
    return {
        "core_s": dict(drv.core),
        "total_s": sum(drv.core.values()),
        "wall_s": time.perf_counter() - t_wall,
        "steps": steps,
        "retracted": retracted,
        "segments": drv.segments,
        "sizes": sizes,
    }


def print_table(rows: list[tuple[int, list[dict[str, Any]]]], args: argparse.Namespace) -> None:
    print(f"### SWA dual allocator vs SGLang 0.5.23: median of {args.rounds} paired rounds\n")
    print(f"full {FULL_TOKENS:,} / SWA {SWA_TOKENS:,} tokens, window {WINDOW}, {args.requests} requests\n")
    print(
        "| page | kvpools core s (alloc / evict / end) | SGLang core s (alloc / evict / end) "
        "| ratio total, median [min, max] | evict | end | alloc |"
    )
    print("|---|---|---|---|---|---|---|")
    for page, rounds in rows:
        ours = " / ".join(f"{_median(rounds, 'kvpools', k):.3f}" for k in ("alloc", "evict", "end"))
        theirs = " / ".join(f"{_median(rounds, 'sglang', k):.3f}" for k in ("alloc", "evict", "end"))
        seg = "" if rounds[0]["kvpools"]["segments"] else " (kvpools without segment frees)"
        print(
            f"| {page}{seg} | {ours} | {theirs} | **{_ratio(rounds, None)}** | {_ratio(rounds, 'evict')} "
            f"| {_ratio(rounds, 'end')} | {_ratio(rounds, 'alloc')} |"
        )


def _median(rounds: list[dict[str, Any]], name: str, key: str) -> float:
    return float(statistics.median(r[name]["core_s"][key] for r in rounds))


def _ratio(rounds: list[dict[str, Any]], key: str | None) -> str:
    """kvpools / SGLang per round (core total, or one bucket): median [min, max]."""
    vals = [
        (r["kvpools"]["total_s"] if key is None else r["kvpools"]["core_s"][key])
        / (r["sglang"]["total_s"] if key is None else r["sglang"]["core_s"][key])
        for r in rounds
    ]
    return f"{statistics.median(vals):.2f} [{min(vals):.2f}, {max(vals):.2f}]"


if __name__ == "__main__":
    sys.exit(main())
