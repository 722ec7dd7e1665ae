"""Replay one trace through a unified-memory plan under lazy and eager compaction, and say what the holes cost.

    python -m benchmarks.unified_replay qwen3-next-80b-a3b-thinking --memory 20GiB \\
        --serve tp_size=4,page_size=16 --uniform 1000,30000:200,4000 --requests 400

The model is planned with ``--enable-unified-memory`` twice (lazy compaction, SGLang's default, and
``--disable-lazy-compaction``) on the same budget and serving options; the same trace goes through each plan's
unified allocators (``kvpools_core.planning.unified_replay``), and one table compares them: requests admitted and
completed, peak concurrency beside the closed form's prediction (for the trace's longest context), steps,
retractions, pages copied by compaction, the tokens lazy holes hide from ``available_size()`` (schedulable vs
available), free virtual ids beyond the schedulable tokens, and the time inside the allocator calls.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from benchmarks.replay_split import make_trace, serving_fields
from kvpools_core.errors import KvpoolsError
from kvpools_core.pipeline import plan
from kvpools_core.planning.unified_replay import UnifiedReplayStats, replay_unified
from kvpools_core.values import Serving

ROWS = (
    ("requests admitted (prefills)", "admissions", ","),
    ("requests completed", "completed", ","),
    ("peak concurrency", "peak_concurrency", ","),
    ("predicted (longest context)", "predicted_concurrency", ","),
    ("mean concurrency", "mean_concurrency", ",.1f"),
    ("steps", "steps", ","),
    ("retractions", "retractions", ","),
    ("allocator refusals", "allocator_refusals", ","),
    ("pages copied by compaction", "page_moves", ","),
    ("max tokens hidden by holes", "max_hidden_tokens", ","),
    ("steps with hidden tokens", "steps_with_hidden_tokens", ","),
    ("max free ids over schedulable", "max_free_ids_over_schedulable", ","),
    ("min schedulable tokens", "min_schedulable_tokens", ","),
    ("allocator time (s)", "allocator_seconds", ".3f"),
)


def table(lazy: UnifiedReplayStats, eager: UnifiedReplayStats) -> str:
    lines = [f"{'':32} {'lazy compaction':>16} {'eager compaction':>17}"]
    for label, field, spec in ROWS:
        lines.append(f"{label:32} {getattr(lazy, field):>16{spec}} {getattr(eager, field):>17{spec}}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", help="preset name, config.json or a directory holding one")
    parser.add_argument("--memory", required=True, help="the KV budget, e.g. 20GiB")
    parser.add_argument("--serve", action="append", default=[], metavar="FIELD=VALUE", help="serving option")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="JSONL file of {'input_len': ..., 'output_len': ...} records")
    source.add_argument("--fixed", metavar="IN:OUT", help="--requests identical requests")
    source.add_argument("--lognormal", metavar="IN_MEDIAN,IN_P99:OUT_MEDIAN,OUT_P99", help="log-normal lengths")
    source.add_argument("--uniform", metavar="IN_LO,IN_HI:OUT_LO,OUT_HI", help="uniform lengths")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-len", type=int, default=None, help="clamp drawn lengths (log-normal)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    fields = serving_fields(args.serve, "--serve")
    try:
        trace = make_trace(args)
        runs = {}
        for name, disable in (("lazy", False), ("eager", True)):
            serving = Serving(**{**fields, "enable_unified_memory": True, "disable_lazy_compaction": disable})
            runs[name] = replay_unified(plan(args.model, serving, memory=args.memory), trace)
    except KvpoolsError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({name: stats.to_dict() for name, stats in runs.items()}, indent=2))
    else:
        print(f"{args.model}, {args.memory}, {' '.join(args.serve)}: {len(trace):,} requests ({trace.source})")
        print(table(runs["lazy"], runs["eager"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
