"""Interleaved rounds of the shared trace replay: our allocators against their peers.

``bench_alloc.py`` replays each adapter ``--repeat`` times back to back, so a
load change on a shared VM can favour whichever adapter ran in the quiet
minute.  This driver replays every adapter once per round, in rotating order,
and reports per adapter the median core times and, per pair, the median of
the *per-round* ratio ours / faster peer (both measured minutes apart at
most).  It uses the harness's own ``replay`` (same trace, scheduler and
verification).

usage (peers venv, repo root on PYTHONPATH; run_bench.sh --rounds N does this):
    python benchmarks/compare.py --bench-dir /work/shared/bench --rounds 5 --out results/compare.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

PAIRS = {  # ours -> peers of the same kind (the faster one is the reference)
    "kvpools-token": ["sglang-token"],
    "kvpools-paged16-extend": ["sglang-paged16-extend", "sglang-paged64-extend"],
    "kvpools-paged64-extend": ["sglang-paged16-extend", "sglang-paged64-extend"],
    "kvpools-paged16-pages": ["vllm-blockpool16"],
    "kvpools-paged64-pages": ["vllm-blockpool16"],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench-dir", default=os.environ.get("KVPOOLS_BENCH_DIR", "/work/shared/bench"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--scenario", default="unique_prompts")
    ap.add_argument("--ours", default=",".join(PAIRS))
    ap.add_argument("--out", default=None, help="JSON with every round's core times")
    args = ap.parse_args(argv)

    sys.path.insert(0, args.bench_dir)
    import bench_alloc as b  # type: ignore[import-not-found]
    import torch

    from benchmarks.bench_adapter import register

    torch.set_num_threads(1)  # as bench_alloc.py's default
    register(b.register_adapter)
    ours = args.ours.split(",")
    names = ours + sorted({p for o in ours for p in PAIRS[o]})
    with open(os.path.join(args.bench_dir, "bench_alloc_trace.json")) as fh:
        cfg = json.load(fh)
    scenario = next(s for s in cfg["scenarios"] if s["name"] == args.scenario)
    trace = b.Trace(cfg, scenario)

    core: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for rnd in range(args.rounds):
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            res = b.replay(trace, b.ADAPTERS[name](trace.capacity_tokens))
            if not res["verified"]:
                print(f"{name}: verification FAILED: {res['errors']}", file=sys.stderr)
                return 1
            core[name].append((res["core_alloc_s"], res["core_free_s"]))
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    def total(name: str, rnd: int) -> float:
        alloc, free = core[name][rnd]
        return alloc + free

    print(f"### `{args.scenario}`: median of {args.rounds} interleaved rounds\n")
    print("| adapter | core alloc s | core free s | core alloc+free s |")
    print("|---|---|---|---|")
    for name in names:
        a = statistics.median(x[0] for x in core[name])
        f = statistics.median(x[1] for x in core[name])
        t = statistics.median(total(name, r) for r in range(args.rounds))
        print(f"| {name} | {a:.4f} | {f:.4f} | {t:.4f} |")
    print("\n| ours | faster peer (per round) | ratio alloc+free, median [min, max] | target <= 0.5 |")
    print("|---|---|---|---|")
    report: dict[str, Any] = {"rounds": args.rounds, "scenario": args.scenario, "core_s": core, "ratios": {}}
    for name in ours:
        ratios, peers_used = [], set()
        for r in range(args.rounds):
            peer = min(PAIRS[name], key=lambda p, r=r: total(p, r))
            peers_used.add(peer)
            ratios.append(total(name, r) / total(peer, r))
        med = statistics.median(ratios)
        report["ratios"][name] = ratios
        print(
            f"| {name} | {' / '.join(sorted(peers_used))} | {med:.2f} [{min(ratios):.2f}, {max(ratios):.2f}] "
            f"| {'yes' if med <= 0.5 else 'NO'} |"
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
