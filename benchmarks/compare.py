"""Paired rounds of the shared trace replay: our allocators against their peers.

``bench_alloc.py`` replays each adapter ``--repeat`` times back to back, so a
load change on a shared VM can favour whichever adapter ran in the quiet
minute.  In every round this driver replays each of our adapters right next
to its peers (order alternating between rounds) and reports the median core
times and, per pair, the median of the per-round ratio ours / faster peer,
each measured seconds apart.  It uses the harness's own ``replay`` (same
trace, scheduler and verification).

usage (peers venv, repo root on PYTHONPATH; run_bench.sh does this, ROUNDS=N):
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
    "kvpools-paged64-pages": ["vllm-blockpool64"],
    "kvpools-token-checked": ["kvpools-token"],  # checked mode against the unchecked path (target <= 2)
}
TARGETS = {"kvpools-token-checked": 2.0}
"""Ratio targets other than the default 0.5."""


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
    names = ours + sorted({p for o in ours for p in PAIRS[o]} - set(ours))
    with open(os.path.join(args.bench_dir, "bench_alloc_trace.json")) as fh:
        cfg = json.load(fh)
    scenario = next(s for s in cfg["scenarios"] if s["name"] == args.scenario)
    trace = b.Trace(cfg, scenario)

    # per round and per pair: ours and its peers back to back, order alternating by round
    core: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    pair_core: dict[str, list[dict[str, float]]] = {n: [] for n in ours}
    for rnd in range(args.rounds):
        for name in ours:
            group = [name, *PAIRS[name]]
            measured: dict[str, float] = {}
            for adapter in group if rnd % 2 == 0 else group[::-1]:
                res = b.replay(trace, b.ADAPTERS[adapter](trace.capacity_tokens))
                if not res["verified"]:
                    print(f"{adapter}: verification FAILED: {res['errors']}", file=sys.stderr)
                    return 1
                measured[adapter] = res["core_alloc_s"] + res["core_free_s"]
                if adapter == name or len(core[adapter]) <= rnd:
                    core[adapter].append((res["core_alloc_s"], res["core_free_s"]))
            pair_core[name].append(measured)
        print(f"round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    print(f"### `{args.scenario}`: median of {args.rounds} rounds\n")
    print("| adapter | core alloc s | core free s | core alloc+free s |")
    print("|---|---|---|---|")
    for name in names:
        a = statistics.median(x[0] for x in core[name])
        f = statistics.median(x[1] for x in core[name])
        t = statistics.median(x[0] + x[1] for x in core[name])
        print(f"| {name} | {a:.4f} | {f:.4f} | {t:.4f} |")
    print("\n| ours | faster peer (per round) | ratio alloc+free, median [min, max] | target |")
    print("|---|---|---|---|")
    report: dict[str, Any] = {"rounds": args.rounds, "scenario": args.scenario, "core_s": core, "pairs": pair_core}
    for name in ours:
        ratios, peers_used = [], set()
        for measured in pair_core[name]:
            peer = min(PAIRS[name], key=measured.__getitem__)
            peers_used.add(peer)
            ratios.append(measured[name] / measured[peer])
        med = statistics.median(ratios)
        print(
            f"| {name} | {' / '.join(sorted(peers_used))} | {med:.2f} [{min(ratios):.2f}, {max(ratios):.2f}] "
            f"| <= {TARGETS.get(name, 0.5)}: {'yes' if med <= TARGETS.get(name, 0.5) else 'NO'} |"
        )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
