"""The build report: planned vs allocated per pool, and the computed reason for unused budget."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Console

from kvpools_core import ModelSpec, Plan, Serving, build, plan
from kvpools_core.cli.build_report import build_summary, render_build


def test_full_budget_needs_no_explanation() -> None:
    # llama-3.1-8b: 32 layers x 8 KV heads x (128 + 128) x 2 B = 131,072 B per token
    planned = plan("llama-3.1-8b", Serving(context_length=128), memory=3 << 20)
    summary = build_summary(build(planned, "meta"))
    # 22 tokens, 11 requests: kv 23 rows x 131,072 = 3,014,656; table 12 rows x (128 + 4) x 4 = 6,336;
    # allocator 22 x 8 = 176 -> 3,021,168 of 3,145,728 (96.04 %)
    assert (summary["max_total_num_tokens"], summary["max_running_requests"]) == (22, 11)
    assert summary["allocated_by_pool"] == {"kv": 3_014_656, "req_to_token": 6_336, "allocator": 176}
    assert summary["allocated_bytes"] == summary["planned_bytes"] == 3_021_168
    assert summary["budget_unused_bytes"] == 124_560
    # token 23 adds a kv row and an allocator entry, no request row (23 // 2 = 11)
    assert summary["budget_explanation"] == [
        "one more page (1 token) would need 131,080 B (kv +131,072 B, allocator +8 B); "
        "only 124,560 B (121.64 KiB) remain."
    ]


def test_request_table_granularity(mha_model: Callable[..., ModelSpec]) -> None:
    # 1 layer x 1 head x (8 + 8) x 2 B = 32 B per token; a request row is (1024 + 4) x 4 = 4,112 B.
    # With page 1 and few tokens, requests = tokens // 2, so cost(T) = (T + 1) 32 + (T // 2 + 1) 4112 + 8 T:
    # cost(101) = 3,264 + 209,712 + 808 = 213,784 <= budget 214,784 < cost(102) = 217,936.
    model = mha_model(layers=1, kv_heads=1, head_dim=8, context_len=1024)
    summary = build_summary(build(plan(model, Serving(), memory=214_784), "meta"))
    assert (summary["max_total_num_tokens"], summary["max_running_requests"]) == (101, 50)
    assert summary["budget_explanation"] == [
        "one more page (1 token) would need 4,152 B (kv +32 B, req_to_token +4,112 B, allocator +8 B); "
        "only 1,000 B (1000 B) remain."
    ]


def test_token_cap(small_plan: Callable[..., Plan]) -> None:
    summary = build_summary(build(small_plan(8 << 20, max_total_tokens=100, page_size=16), "meta"))
    # page aligned: 100 -> 96 tokens
    assert summary["max_total_num_tokens"] == 96
    assert summary["budget_explanation"] == ["--max-total-tokens 100 caps the KV pools at 96 tokens."]


def test_sglang_accounting_over_budget(small_plan: Callable[..., Plan]) -> None:
    summary = build_summary(build(small_plan(8 << 20, accounting="sglang"), "meta"))
    # 8 MiB // (4 layers x 4 heads x (64 + 64) x 2 B = 4,096 B) = 2,048 tokens fill the budget with KV alone;
    # the padding row, request table and allocator come on top
    assert summary["max_total_num_tokens"] == 2048
    assert summary["budget_used"] > 1 and summary["matches_plan"]
    (reason,) = summary["budget_explanation"]
    assert reason.startswith("accounting sglang sizes tokens as budget // SGLang's cell size (4096 B/token)")
    assert reason.endswith(f"exceed the budget by {-summary['budget_unused_bytes']:,} B.")


def test_summary_carries_provenance_and_plan(small_plan: Callable[..., Plan]) -> None:
    planned = small_plan()
    summary = build_summary(build(planned, "meta"))
    assert summary["provenance"] == {
        "build_req_to_token_pool": ["core"],
        "build_pool": ["mha"],
        "build_allocator": ["core"],
    }
    assert summary["plan_provenance"]["estimate_cell_size"][0] == "mha"
    assert Plan.from_dict(summary) == planned  # the plan travels with the build report


def test_render(small_plan: Callable[..., Plan]) -> None:
    console = Console(width=140, record=True, no_color=True)
    render_build(build(small_plan(max_total_tokens=64), "meta"), console)
    text = console.export_text()
    assert "kvpools build — test-mha on meta: 64 tokens" in text
    for pool in ("kv", "req_to_token", "allocator", "total"):
        assert any(line.startswith(pool) and line.rstrip().endswith("ok") for line in text.splitlines()), text
    assert "because --max-total-tokens 64 caps the KV pools at 64 tokens." in text
    assert "built by build_req_to_token_pool: core; build_pool: mha; build_allocator: core" in text
