"""How fast ``kvpools sweep`` plans a 10,000-point grid, against plain ``plan`` per point in the same run.

    python -m benchmarks.sweep_speed                 # 10,000 points: baseline, 1 job, N jobs (the cores)
    python -m benchmarks.sweep_speed --memories 10   # 2,000 points (a smoke run)

The grid: 5 models (dense GQA, MoE, MLA, sliding window, Mamba hybrid) x TP 1, 2, 4, 8 x kv dtype auto,
fp8_e4m3 x page 1, 16, 32, 64, 128 x 50 budgets (10 ... 59 GiB), concurrency at 8k and 32k.  The baseline
is the same points through ``kvpools_core.plan(name, Serving(...), memory=...)`` and
``kvpools_core.planning.capacity.concurrency`` per point, timed in the same process right before the sweep, and
every sweep row is checked equal to its baseline plan (tokens, requests, concurrency) so the speed is not
bought with a different answer.  Wall and CPU seconds are reported (a shared machine's wall time includes
other processes' turns: the CPU time is this process's own work); the JSON lands in
``benchmarks/results/sweep_speed_<stamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from kvpools_core import Serving, plan
from kvpools_core.planning.capacity import concurrency
from kvpools_core.planning.sweep import SweepGrid, SweepRow, default_jobs, run_sweep
from kvpools_core.registry import get_registry

MODELS = ("llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "gemma-3-12b-it", "qwen3-next-80b-a3b-thinking")
TP_SIZES = (1, 2, 4, 8)
KV_DTYPES = ("auto", "fp8_e4m3")
PAGE_SIZES = (1, 16, 32, 64, 128)
CONTEXTS = (8192, 32768)


def grid(memories: int) -> SweepGrid:
    return SweepGrid(
        models=MODELS,
        axes={"tp_size": TP_SIZES, "kv_cache_dtype": KV_DTYPES, "page_size": PAGE_SIZES},
        budgets=[{"memory": f"{gib}GiB"} for gib in range(10, 10 + memories)],
        contexts=CONTEXTS,
    )


def timed(work: Any) -> tuple[Any, float, float]:
    """``work()``, its wall seconds and this process's CPU seconds (children included for the workers)."""
    wall, cpu = time.perf_counter(), _cpu()
    result = work()
    return result, time.perf_counter() - wall, _cpu() - cpu


def _cpu() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def baseline(sweep: SweepGrid) -> list[tuple[dict[str, int], int, dict[int, int]] | None]:
    """Every point through plain ``plan`` by name (None where it does not plan)."""
    answers: list[tuple[dict[str, int], int, dict[int, int]] | None] = []
    for point in sweep.points():
        try:
            result = plan(point.model, Serving(**dict(point.settings)), **dict(point.budget))
        except Exception:
            answers.append(None)
            continue
        counts = {context: concurrency(result, context).concurrent_requests for context in sweep.contexts}
        answers.append((dict(result.counts["tokens"]), result.max_running_requests, counts))
    return answers


def same(rows: list[SweepRow], answers: list[tuple[dict[str, int], int, dict[int, int]] | None]) -> bool:
    return len(rows) == len(answers) and all(
        (row.error is not None) if answer is None else (row.tokens, row.max_running_requests, row.concurrency) == answer
        for row, answer in zip(rows, answers, strict=True)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--memories", type=int, default=50, help="budgets per configuration (50: 10,000 points)")
    parser.add_argument("--jobs", type=int, default=None, help="workers of the parallel run (default: the cores)")
    parser.add_argument("--out", default=None, help="results JSON (default: benchmarks/results/sweep_speed_<stamp>)")
    args = parser.parse_args(argv)
    jobs = args.jobs or default_jobs()

    sweep = grid(args.memories)
    get_registry()  # plugin discovery is paid once by every method; time the planning
    answers, base_wall, base_cpu = timed(lambda: baseline(sweep))
    one, one_wall, one_cpu = timed(lambda: run_sweep(sweep, jobs=1))
    many, many_wall, many_cpu = timed(lambda: run_sweep(sweep, jobs=jobs))
    exact = same(one, answers) and many == one
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    results = {
        "points": len(sweep),
        "planned": sum(answer is not None for answer in answers),
        "identical_to_baseline": exact,
        "baseline_plan_per_point": {"wall_s": base_wall, "cpu_s": base_cpu},
        "sweep_1_job": {"wall_s": one_wall, "cpu_s": one_cpu},
        f"sweep_{jobs}_jobs": {"wall_s": many_wall, "cpu_s": many_cpu},
        "speedup_1_job_wall": base_wall / one_wall,
        f"speedup_{jobs}_jobs_wall": base_wall / many_wall,
        "speedup_1_job_cpu": base_cpu / one_cpu,
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cores": default_jobs(),
            "load_1min_after": load,
        },
        "command": "python -m benchmarks.sweep_speed " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(args.out or f"benchmarks/results/sweep_speed_{stamp}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{len(sweep):,} points ({results['planned']:,} plan), rows identical to plain plan: {exact}")
    print(f"  plain plan per point  {base_wall:7.2f} s wall  {base_cpu:7.2f} s CPU")
    print(f"  sweep, 1 job          {one_wall:7.2f} s wall  {one_cpu:7.2f} s CPU  ({base_wall / one_wall:.1f}x)")
    print(
        f"  sweep, {jobs} jobs         {many_wall:7.2f} s wall  {many_cpu:7.2f} s CPU  ({base_wall / many_wall:.1f}x)"
    )
    print(f"  load average after: {load}; results: {out}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
