"""What ``kvpools capacity`` prints: the ladder table, the largest contexts and the SGLang flags, or one JSON object."""

from __future__ import annotations

from typing import Any

import attrs
from rich.console import Console
from rich.table import Table

from kvpools_core.planning.capacity import (
    CONTEXT_LIMIT,
    Capacity,
    ContextAnswer,
    EngineFlags,
    Limits,
    token_limit,
)
from kvpools_core.planning.split import SplitChoice
from kvpools_core.values import Plan, to_dict


@attrs.frozen(kw_only=True)
class CapacityReport:
    """Every answer ``kvpools capacity`` gives for one plan."""

    plan: Plan
    limits: Limits
    ladder: tuple[Capacity, ...]
    single_request: ContextAnswer
    concurrent: ContextAnswer | None
    flags: EngineFlags | None
    flags_error: str | None = None
    split: SplitChoice | None = None
    """The workload-aware split (``--workload``), or None."""


def context_label(tokens: int) -> str:
    """``32k`` for 32,768 and ``1M`` for 1,048,576 (as context lengths are quoted); other counts with separators."""
    if tokens % (1 << 20) == 0:
        return f"{tokens >> 20}M"
    if tokens % 1024 == 0:
        return f"{tokens // 1024}k"
    return f"{tokens:,}"


def capacity_summary(report: CapacityReport) -> dict[str, Any]:
    """The ``--json`` object: per context length the concurrent requests and the binding limit.

    Counts and answers are per DP-attention worker (``dp_workers`` of them); ``flags`` are SGLang's totals;
    ``windows`` the worst-case window terms the windowed token spaces were answered with (``Plan.windows``),
    ``compression`` the full tokens per slot of each compressed token space (``Plan.compression``),
    ``compression_pages`` the allocator page of those with one (``Plan.compression_pages``).
    """
    plan = report.plan
    return {
        "model": plan.model.name,
        "accounting": plan.serving.accounting,
        "dp_workers": plan.serving.attn_dp_size,
        "counts": plan.counts,
        "windows": [{**to_dict(window), "per_request": window.per_request} for window in plan.windows],
        "compression": dict(report.limits.compressed),
        "compression_pages": dict(report.limits.compressed_pages),
        "context_length": report.limits.context_len,
        "ladder": [answer.to_dict() for answer in report.ladder],
        "max_context": {
            "single_request": report.single_request.to_dict(),
            "concurrent": report.concurrent.to_dict() if report.concurrent is not None else None,
        },
        "flags": report.flags.to_dict() if report.flags is not None else {"error": report.flags_error},
        **({"split": report.split.to_dict()} if report.split is not None else {}),
    }


def _limits_line(limits: Limits, dp: int) -> str:
    parts = []
    for space, count in limits.tokens.items():
        window = limits.windowed.get(space)
        text = f"{token_limit(space)} {count:,}"
        if window is not None:
            chunk = f"{window.prefill_chunk:,}" if window.prefill_chunk is not None else "a whole prompt"
            text += (
                f" (window {window.window:,}: at most {window.per_request:,} per request, + up to {chunk} for each "
                f"of {window.prefills_in_flight} prefill(s) in flight, {window.reserved:,} reserved)"
            )
        ratio = limits.compressed.get(space)
        if ratio is not None:
            own = limits.compressed_pages.get(space)
            text += f" (1 per {ratio} full tokens" + (f", in pages of {own} of its own)" if own else ")")
        parts.append(text)
    if limits.slots_per_request:
        parts.append(f"state slots {limits.state_slots:,} ({limits.slots_per_request} per request)")
    parts.append(f"request cap {limits.request_cap:,}")
    parts.append(f"context length {limits.context_len:,}")
    worker = f" (per DP worker, {dp} workers)" if dp > 1 else ""
    return " · ".join(parts) + worker


def _binding(answer: Capacity, context_len: int) -> str:
    if answer.binding == CONTEXT_LIMIT and answer.context_len > context_len:
        return f"exceeds the context length ({context_len:,})"
    return answer.binding


def render_capacity(report: CapacityReport, console: Console) -> None:
    """The human report: the counts, one row per context length, the largest contexts, the flags line."""
    plan, limits = report.plan, report.limits
    console.print(
        f"[bold]kvpools capacity[/bold] — {plan.model.name} ({plan.model.source}), accounting {plan.serving.accounting}"
    )
    console.print(f"limits       {_limits_line(limits, plan.serving.attn_dp_size)}")
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("context", justify="right")
    table.add_column("concurrent requests", justify="right")
    table.add_column("binding limit")
    for answer in report.ladder:
        table.add_row(
            context_label(answer.context_len),
            f"{answer.concurrent_requests:,}",
            _binding(answer, limits.context_len),
        )
    console.print(table)
    reaches: list[tuple[str, ContextAnswer]] = []
    if report.concurrent is not None:
        reaches.append(
            (f"largest context {report.concurrent.requests:,} concurrent requests all reach", report.concurrent)
        )
    reaches.append(("largest single-request context", report.single_request))
    for what, reach in reaches:
        console.print(f"{what}: {reach.context_len:,} tokens (binding: {reach.binding})")
    if report.flags is not None:
        flags = report.flags
        console.print(
            f"SGLang flags ({flags.headroom:.0%} headroom, binding: {flags.binding}): {' '.join(flags.args())}"
        )
    else:
        console.print(f"SGLang flags: none — {report.flags_error}")
    if report.split is not None:
        render_split(report.split, console)


def render_split(split: SplitChoice, console: Console) -> None:
    """The ``--workload`` block: the chosen value, requests default -> chosen, the gain, what binds, the flags."""
    console.print(f"[bold]workload-aware split[/bold] — workload {split.workload}")
    if split.knob is None:
        console.print(f"  no split to choose: {split.reason}; {split.default.concurrent_requests:,} requests at once")
        return
    default_value = "SGLang's default" if split.default_value is None else f"{split.default_value}"
    console.print(f"  {split.knob}: {default_value} -> {split.value}")
    console.print(
        f"  concurrent requests: {split.default.concurrent_requests:,} -> {split.chosen.concurrent_requests:,} "
        f"(x{split.gain:.2f})"
    )
    limits = " · ".join(f"{name} {value:,}" for name, value in split.chosen.limits.items())
    console.print(f"  binding: {split.default.binding} -> {split.chosen.binding} ({limits})")
    console.print(f"  SGLang flags: {' '.join(split.flags())}")
