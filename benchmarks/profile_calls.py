"""Where an adapter's core time goes, call by call, in the shared trace replay (issue 37's profiler).

For each adapter named (ours and peers alike) this replays ``bench_alloc.py``'s trace ``--rounds`` times (the
adapters' order rotating by round) and records every timed call of the allocator (the harness's ``_CoreTimer``
calls: ``alloc``, ``free``, ``free_group_end``, ``alloc_pages``, ...).  The replay is deterministic, so call
``i`` is the same operation in every round: the robust core time is the sum over calls of each call's median
over the rounds, which drops what a shared VM's other jobs add to a single call (a preemption, a burst of cache
misses) where the harness's plain sum keeps it.  It then counts the torch operations each method dispatches per
call in one more replay (a ``TorchDispatchMode``; ``torch.frombuffer``, ``ctypes`` and Python are not torch
operations).

Prints, per adapter and method: calls per replay, median and mean robust time per call, robust total, torch
operations per call and the most frequent ones; then the robust total of every adapter over the first one's.

usage (peers venv, repo root on PYTHONPATH, as compare.py):
    PYTHONPATH=. python benchmarks/profile_calls.py --bench-dir ../shared/bench --rounds 5 \\
        kvpools-token sglang-token kvpools-paged16-pages vllm-blockpool16
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from typing import Any


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("adapters", nargs="+", help="harness adapter names (ours from bench_adapter, the peers')")
    ap.add_argument("--bench-dir", default=os.environ.get("KVPOOLS_BENCH_DIR", "/work/shared/bench"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scenario", default="unique_prompts")
    ap.add_argument("--no-ops", action="store_true", help="skip the torch operation count")
    args = ap.parse_args(argv)

    sys.path.insert(0, args.bench_dir)
    import bench_alloc as b  # type: ignore[import-not-found]
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from benchmarks.bench_adapter import register

    torch.set_num_threads(1)  # as bench_alloc.py's default
    register(b.register_adapter)
    with open(os.path.join(args.bench_dir, "bench_alloc_trace.json")) as fh:
        cfg = json.load(fh)
    trace = b.Trace(cfg, next(s for s in cfg["scenarios"] if s["name"] == args.scenario))

    calls: list[tuple[str, int]] = []  # (method, ns) of the replay running now
    ops: collections.Counter[tuple[str, str]] = collections.Counter()
    counting: list[Any] = []  # the dispatch mode while counting

    class _Count(TorchDispatchMode):  # type: ignore[no-untyped-call]
        method = ""

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            ops[(self.method, str(func))] += 1
            return func(*args, **(kwargs or {}))

    clock = time.perf_counter_ns

    def timed(self: Any, fn: Any, *fn_args: Any, bucket: str = "alloc") -> Any:
        name = getattr(fn, "__name__", str(fn))
        if counting:
            counting[0].method = name
            with counting[0]:
                return fn(*fn_args)
        t0 = clock()
        out = fn(*fn_args)
        calls.append((name, clock() - t0))
        return out

    b._CoreTimer._timed = timed
    runs: dict[str, list[list[tuple[str, int]]]] = {a: [] for a in args.adapters}
    names = list(args.adapters)
    for rnd in range(args.rounds):
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            calls = []
            res = b.replay(trace, b.ADAPTERS[name](trace.capacity_tokens))
            if not res["verified"]:
                print(f"{name}: verification FAILED: {res['errors']}", file=sys.stderr)
                return 1
            runs[name].append(calls)
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    op_calls: dict[str, collections.Counter[str]] = {}
    if not args.no_ops:
        for name in names:
            ops.clear()
            calls = []
            counting[:] = [_Count()]  # type: ignore[no-untyped-call]
            b._CoreTimer._timed = timed
            try:
                b.replay(trace, b.ADAPTERS[name](trace.capacity_tokens))
            finally:
                counting.clear()
            op_calls[name] = collections.Counter()
            for (method, op), k in ops.items():
                op_calls[name][method] += k
                op_calls[name][f"{method}:{op}"] += k

    totals: dict[str, float] = {}
    print("| adapter | method | calls | median us | mean us | total ms | torch ops / call | most frequent |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        rounds = runs[name]
        n = min(len(r) for r in rounds)
        per_call = collections.defaultdict(list)
        for i in range(n):
            per_call[rounds[0][i][0]].append(statistics.median(r[i][1] for r in rounds))
        totals[name] = sum(sum(v) for v in per_call.values()) / 1e6
        for method, times in sorted(per_call.items()):
            k = len(times)
            counted = op_calls.get(name, collections.Counter())
            n_ops = counted[method]
            prefix = method + ":"
            mine = [(c, key[len(prefix) :]) for key, c in counted.items() if key.startswith(prefix)]
            top = sorted(mine, reverse=True)[:3]
            print(
                f"| {name} | {method} | {k} | {statistics.median(times) / 1e3:.2f} | {sum(times) / k / 1e3:.2f} "
                f"| {sum(times) / 1e6:.2f} | {n_ops / k:.2f} | {', '.join(f'{op} {c / k:.2f}' for c, op in top)} |"
            )
    first = names[0]
    print(f"\n| adapter | robust core ms | / {first} |")
    print("|---|---|---|")
    for name in names:
        print(f"| {name} | {totals[name]:.2f} | {totals[name] / totals[first]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
