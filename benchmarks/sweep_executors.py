"""Points per second of ``kvpools sweep`` on 1 process, 2 worker processes and a local Dask cluster.

    python -m benchmarks.sweep_executors                  # 100,000 points (400 configurations x 250 budgets)
    python -m benchmarks.sweep_executors --memories 10    # 4,000 points (a smoke run)

Every run plans the same grid and must give the same rows as the single-process run (checked), so the speed
is not bought with a different answer. The Dask cluster runs on loopback (``LocalCluster``: 2 worker
processes, one thread each) and is reached through ``Client.get_executor()`` exactly as a remote one would be;
it needs the ``kvpools[dask]`` extra. Reported: wall seconds and points/s of each, and the ratio to one process
measured in the same run; JSON in ``benchmarks/results/sweep_executors_<stamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import warnings
from pathlib import Path
from typing import Any

from kvpools_core.planning.sweep import SweepGrid, SweepRow, run_sweep

MODELS = ("llama-3.1-8b", "qwen3-30b-a3b", "deepseek-v3", "gemma-3-12b-it", "qwen3-next-80b-a3b-thinking")


def grid(memories: int) -> SweepGrid:
    return SweepGrid(
        models=list(MODELS),
        axes=[
            ("tp_size", [1, 2, 4, 8, 16]),
            ("kv_cache_dtype", ["auto", "fp8_e4m3"]),
            ("page_size", [1, 16, 32, 64, 128, 256, 512, 1024]),
        ],
        budgets=[{"memory": f"{10 + i}GiB"} for i in range(memories)],
        contexts=[8192, 32768],
    )


def timed(label: str, run: Any, points: int) -> dict[str, Any]:
    start = time.perf_counter()
    rows = run()
    wall = time.perf_counter() - start
    print(f"{label:>28}: {wall:8.2f} s wall, {points / wall:10,.0f} points/s", flush=True)
    return {"label": label, "wall_s": wall, "points_per_s": points / wall, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memories", type=int, default=250, help="budgets per configuration (250: 100,000 points)")
    args = parser.parse_args()
    the_grid = grid(args.memories)
    points = len(the_grid)
    print(f"{points:,} points on {os.cpu_count()} cores ({platform.processor() or platform.machine()})")
    runs = [timed("1 process", lambda: run_sweep(the_grid, jobs=1), points)]
    runs.append(timed("2 worker processes", lambda: run_sweep(the_grid, jobs=2), points))
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        print("distributed is not installed (pip install 'kvpools[dask]'): the Dask run is skipped")
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cluster = LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None)
            client = Client(cluster)
        try:
            executor = client.get_executor()
            runs.append(
                timed("local Dask cluster, 2 workers", lambda: run_sweep(the_grid, jobs=2, executor=executor), points)
            )
        finally:
            client.close()
            cluster.close()
    reference: list[SweepRow] = runs[0]["rows"]
    for run in runs[1:]:
        if run["rows"] != reference:
            raise SystemExit(f"{run['label']}: rows differ from the single process's")
    base = runs[0]["wall_s"]
    for run in runs:
        print(f"{run['label']:>28}: {base / run['wall_s']:.2f}x one process")
    out = Path(__file__).parent / "results" / f"sweep_executors_{time.strftime('%Y%m%dT%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    record = {
        "points": points,
        "cores": os.cpu_count(),
        "runs": [{k: v for k, v in run.items() if k != "rows"} for run in runs],
    }
    out.write_text(json.dumps(record, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
