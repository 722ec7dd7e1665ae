"""Replay one trace through two splits of the same budget and compare what each serves.

    python -m benchmarks.replay_split gpt-oss-120b --memory 40GiB --serve page_size=16 \\
        --fixed 7168:1024 --requests 400 --split-a swa_full_tokens_ratio=0.8 --split-b swa_full_tokens_ratio=0.2

Both variants are planned with the same model, budget and serving options (``--serve FIELD=VALUE``,
``kvpools_core.values.Serving`` field names), each with its own ``--split-a`` / ``--split-b`` fields on
top (SGLang's default split when a side names none; ``--split-b auto``: the split
``kvpools_core.planning.split.choose_split`` chooses for the trace's workload, on top of A's fields); the same trace
is replayed through each (``kvpools_core.planning.replay``), and one table compares them: the pools, peak and mean
concurrency, tokens served, steps, retractions, and B / A.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import typing
from collections.abc import Sequence
from typing import Any

import attrs

from kvpools_core.errors import KvpoolsError
from kvpools_core.pipeline import plan
from kvpools_core.planning.replay import (
    ADMISSIONS,
    ReplayStats,
    Trace,
    fixed_trace,
    load_jsonl_trace,
    lognormal_trace,
    replay,
    uniform_trace,
)
from kvpools_core.planning.split import SplitChoice, Workload, choose_split
from kvpools_core.values import Plan, Serving


def serving_fields(items: Sequence[str], what: str) -> dict[str, Any]:
    """``FIELD=VALUE`` items (commas also separate them) as Serving keyword arguments of the field's type."""
    hints = typing.get_type_hints(Serving)
    names = {f.name for f in attrs.fields(Serving)}
    out: dict[str, Any] = {}
    for item in (part for chunk in items for part in chunk.split(",") if part):
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_").lstrip("_")
        if not sep or key not in names:
            raise SystemExit(f"{what}: {item!r} is not FIELD=VALUE with a Serving field (e.g. page_size=16).")
        kind = [a for a in typing.get_args(hints[key]) if a is not type(None)] or [hints[key]]
        out[key] = _parse(text.strip(), kind[0], f"{what} {key}")
    return out


def _parse(text: str, kind: Any, what: str) -> Any:
    if text.lower() in ("none", "null"):
        return None
    try:
        if kind is bool:
            if text.lower() not in ("true", "false", "1", "0"):
                raise ValueError(text)
            return text.lower() in ("true", "1")
        if kind in (int, float):
            return kind(text)
    except ValueError:
        raise SystemExit(f"{what}: cannot read {text!r} as {kind.__name__}.") from None
    return text


def make_trace(args: argparse.Namespace) -> Trace:
    if args.trace:
        return load_jsonl_trace(args.trace)
    if args.fixed:
        prompt, _, output = args.fixed.partition(":")
        return fixed_trace(int(prompt), int(output), args.requests)
    if args.lognormal:
        inputs, _, outputs = args.lognormal.partition(":")
        in_median, in_p99 = (int(x) for x in inputs.split(","))
        out_median, out_p99 = (int(x) for x in outputs.split(","))
        return lognormal_trace(
            args.requests,
            input_median=in_median,
            input_p99=in_p99,
            output_median=out_median,
            output_p99=out_p99,
            seed=args.seed,
            max_len=args.max_len,
        )
    inputs, _, outputs = args.uniform.partition(":")
    in_range = tuple(int(x) for x in inputs.split(","))
    out_range = tuple(int(x) for x in outputs.split(","))
    return uniform_trace(args.requests, input_range=in_range, output_range=out_range, seed=args.seed)  # type: ignore[arg-type]


def describe_pools(p: Plan) -> str:
    counts = p.counts
    tokens = ", ".join(f"{space} {count:,}" for space, count in counts["tokens"].items())
    slots = f", {counts['state_slots']:,} state slots" if counts["state_slots"] else ""
    return f"tokens {tokens}; {counts['requests']:,} requests{slots}"


def table(labels: tuple[str, str], plans: tuple[Plan, Plan], stats: tuple[ReplayStats, ReplayStats]) -> str:
    """One row per measure: A, B and B / A."""
    a, b = stats
    rows: list[tuple[str, str, str, str]] = []

    def row(name: str, x: float, y: float, spec: str = ",", compare: bool = True) -> None:
        ratio = f"{y / x:.3f}" if compare and x else ""
        rows.append((name, format(x, spec), format(y, spec), ratio))

    for space, count in a.token_capacity.items():
        row(f"{space} tokens", count, b.token_capacity.get(space, 0))
    row("max running requests", plans[0].max_running_requests, plans[1].max_running_requests)
    if a.state_slots or b.state_slots:
        row("state slots", a.state_slots, b.state_slots)
    row("peak concurrency", a.peak_concurrency, b.peak_concurrency)
    row("mean concurrency", a.mean_concurrency, b.mean_concurrency, ",.2f")
    row("tokens served", a.tokens_served, b.tokens_served)
    row("steps", a.steps, b.steps)
    row("tokens / step", a.tokens_served / a.steps, b.tokens_served / b.steps, ",.1f")
    row("retractions", a.retractions, b.retractions, compare=False)
    row("completed", a.completed, b.completed, compare=False)
    for space, held in a.peak_tokens_held.items():
        row(f"peak {space} tokens held", held, b.peak_tokens_held.get(space, 0))
    header = ("", f"A: {labels[0]}", f"B: {labels[1]}", "B / A")
    widths = [max(len(line[i]) for line in (header, *rows)) for i in range(4)]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in (header, *rows)
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.replay_split", description=__doc__.split("\n")[0])
    parser.add_argument("model", help="preset name, config.json or a directory holding one")
    parser.add_argument("--memory", required=True, help="the KV budget, e.g. 40GiB")
    parser.add_argument("--serve", action="append", default=[], metavar="FIELD=VALUE", help="serving option (both)")
    parser.add_argument("--split-a", action="append", default=[], metavar="FIELD=VALUE", help="A's own fields")
    parser.add_argument(
        "--split-b",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="B's own fields; 'auto': the split kvpools_core.planning.split.choose_split chooses for the trace",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--trace", help="JSONL file of {'input_len': ..., 'output_len': ...} records")
    source.add_argument("--fixed", metavar="IN:OUT", help="--requests identical requests")
    source.add_argument("--lognormal", metavar="IN_MEDIAN,IN_P99:OUT_MEDIAN,OUT_P99", help="log-normal lengths")
    source.add_argument("--uniform", metavar="IN_LO,IN_HI:OUT_LO,OUT_HI", help="uniform lengths")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-len", type=int, default=None, help="clamp drawn lengths (log-normal)")
    parser.add_argument("--admission", choices=ADMISSIONS, default="reserve")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)

    common = serving_fields(args.serve, "--serve")
    auto = args.split_b == ["auto"]
    side_a = serving_fields(args.split_a, "--split-a")
    sides = (side_a, {} if auto else serving_fields(args.split_b, "--split-b"))
    choice: SplitChoice | None = None
    try:
        trace = make_trace(args)
        if auto:  # the split kvpools chooses for this trace's workload, on top of A's serving
            choice = choose_split(
                args.model, Serving(**{**common, **side_a}), {"memory": args.memory}, Workload.from_trace(trace)
            )
            sides = (side_a, {choice.knob: choice.value} if choice.knob is not None else {})
        labels = tuple(", ".join(f"{k}={v}" for k, v in side.items()) or "SGLang's default" for side in sides)
        if choice is not None:
            labels = (labels[0], f"auto: {labels[1]}")
        plans = tuple(plan(args.model, Serving(**{**common, **side}), memory=args.memory) for side in sides)
        results = []
        seconds = []
        for p in plans:
            start = time.perf_counter()
            results.append(replay(p, trace, admission=args.admission))
            seconds.append(time.perf_counter() - start)
    except KvpoolsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.json:
        out = {
            "model": args.model,
            "memory": args.memory,
            "trace": trace.source,
            "admission": args.admission,
            "chosen_split": choice.to_dict() if choice is not None else None,
            "splits": [
                {"label": label, "pools": p.counts, "stats": s.to_dict(), "seconds": t}
                for label, p, s, t in zip(labels, plans, results, seconds, strict=True)
            ],
        }
        print(json.dumps(out, indent=2))
        return 0
    print(f"{args.model} at {args.memory}; trace: {trace.source} ({len(trace):,} requests, {trace.tokens:,} tokens)")
    print(f"admission: {args.admission}; serving: {', '.join(f'{k}={v}' for k, v in common.items()) or 'defaults'}")
    for name, label, p in zip("AB", labels, plans, strict=True):
        print(f"{name} ({label}): {describe_pools(p)}")
    if choice is not None:
        print(
            f"auto split ({choice.knob or 'none'}): predicted concurrent requests "
            f"{choice.default.concurrent_requests:,} -> {choice.chosen.concurrent_requests:,} (x{choice.gain:.3f}); "
            f"SGLang flags: {' '.join(choice.flags())}"
        )
    print()
    print(table((labels[0], labels[1]), (plans[0], plans[1]), (results[0], results[1])))
    print(f"\nreplay time: A {seconds[0]:.1f} s, B {seconds[1]:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
