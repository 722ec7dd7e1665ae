"""What ``kvpools compare`` prints: both engines' budgets, the per-layer-group table, concurrency, the notes."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from kvpools_core.engines.trtllm.deployment import TRTLLM_VERSION
from kvpools_core.engines.vllm.deployment import VLLM_VERSION
from kvpools_core.planning.compare import EngineComparison, LayerGroupComparison
from kvpools_core.units import format_bytes


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,}" if float(value).is_integer() else f"{value:,.1f}"


def _sglang_cells(row: LayerGroupComparison) -> tuple[str, str, str]:
    if not row.sglang_pools:
        return "-", "-", "-"
    per = "slot" if row.unit == "state_slot" else "token"
    return ", ".join(row.sglang_pools), f"{row.sglang_bytes_per_unit:,} B/{per}", f"{row.sglang_slots:,}"


def _vllm_cells(row: LayerGroupComparison) -> tuple[str, str, str, str]:
    if not row.vllm_groups:
        return "-", "-", "-", "-"
    specs = ", ".join(dict.fromkeys(row.vllm_specs))
    groups = f"{specs} (group{'s' if len(row.vllm_groups) > 1 else ''} {', '.join(map(str, row.vllm_groups))})"
    pages = "/".join(f"{page:,}" for page in row.vllm_page_size_bytes)
    layout = f"{row.vllm_layers} x page {pages} B / {row.vllm_block_size or '-'} tok"
    if row.unit == "state_slot":
        return groups, layout, f"{_number(row.vllm_bytes_per_token)} B/request", "-"
    charged = row.vllm_charged_bytes_per_token
    per = f"{_number(row.vllm_bytes_per_token)} B/token"
    if charged is not None and charged != row.vllm_bytes_per_token:
        per += f" ({_number(charged)} charged)"
    return groups, layout, per, _number(row.vllm_tokens)


def _trtllm_cells(row: LayerGroupComparison) -> tuple[str, str, str]:
    if not row.trtllm_windows and row.trtllm_blocks:  # a hybrid's recurrent-state pool: blocks are requests
        blocks = ", ".join(f"{b:,}" for b in row.trtllm_blocks)
        return f"recurrent state: {blocks} blocks ({row.trtllm_layers} layers)", "-", "-"
    if not row.trtllm_windows:
        return "-", "-", "-"
    pools = ", ".join(
        f"window {window:,}: {blocks:,} blocks"
        for window, blocks in zip(row.trtllm_windows, row.trtllm_blocks, strict=True)
    )
    return (
        f"{pools} ({row.trtllm_layers} layers)",
        f"{row.trtllm_bytes_per_token:,} B/token",
        _number(row.trtllm_tokens),
    )


def render_engine_comparison(comparison: EngineComparison, console: Console) -> None:
    """The human report of :func:`~kvpools_core.planning.compare.compare_engines`."""
    plan, vllm = comparison.sglang, comparison.vllm
    serving = plan.serving
    console.print(
        f"[bold]kvpools compare[/bold] — {plan.model.name} ({plan.model.source}): SGLang's accounting vs vLLM "
        f"{VLLM_VERSION}'s vs TensorRT-LLM {TRTLLM_VERSION}'s · TP {serving.tp_size} · kv {serving.kv_cache_dtype}"
    )
    vllm_budget = comparison.vllm_budget
    console.print(
        f"  budget ({comparison.budget_basis}): SGLang {format_bytes(comparison.sglang_budget)}, vLLM "
        f"{format_bytes(vllm_budget) if vllm_budget is not None else '-'}, TensorRT-LLM "
        f"{format_bytes(comparison.trtllm.ranks[0].available_kv_memory) if comparison.trtllm is not None else '-'}"
    )
    exact = comparison.exact_max_total_num_tokens
    plain = "" if exact is None else f" (SGLang's estimate; `kvpools plan`'s --accounting exact: {exact:,}, see notes)"
    console.print(
        f"  SGLang: max_total_num_tokens {plan.max_total_num_tokens:,}{plain}, page {serving.page_size}, "
        f"max_running_requests {plan.max_running_requests:,}, context length {plan.model.context_len:,}"
    )
    if vllm is not None:
        console.print(
            f"  vLLM: num_gpu_blocks {vllm.plan.num_gpu_blocks:,} of {format_bytes(vllm.plan.bytes_per_block[0])}, "
            f"block {vllm.effective_block_size}, max_model_len {vllm.max_model_len:,}, max_num_seqs {vllm.max_num_seqs}"
        )
        console.print(f"  vLLM logs: {vllm.plan.log_line}")
    trtllm = comparison.trtllm
    if trtllm is not None:
        pools = ", ".join(
            f"recurrent state: {pool.primary_blocks:,} blocks of {pool.recurrent_state_bytes:,} B "
            f"({len(pool.layers)} layers, one block per request)"
            if pool.recurrent
            else f"window {pool.window:,}: {pool.primary_blocks:,} blocks x {trtllm.tokens_per_block} tokens "
            f"({len(pool.layers)} layers, {pool.bytes_per_token:,} B/token)"
            for pool in trtllm.pools
        )
        console.print(
            f"  TensorRT-LLM {TRTLLM_VERSION}: {format_bytes(trtllm.ranks[0].available_kv_memory)} of KV cache; "
            f"{pools}; get_kv_cache_capacity() {trtllm.kv_cache_capacity()}"
        )
    elif comparison.trtllm_refusal is not None:
        console.print(f"  TensorRT-LLM: {comparison.trtllm_refusal}")
    table = Table(title="Per layer group (one rank's bytes; vLLM tokens: its usable blocks, were all this group's)")
    left = ("layer group", "SGLang pools", "vLLM groups", "vLLM layers x page / block")
    right = ("TensorRT-LLM pools",)
    columns = (*left[:2], "SGLang bytes", "SGLang tokens", *left[2:], "vLLM bytes", "vLLM tokens", *right)
    for column in (*columns, "TensorRT-LLM bytes", "TensorRT-LLM tokens"):
        table.add_column(column, justify="left" if column in (*left, *right) else "right")
    for row in comparison.groups:
        table.add_row(row.kind, *_sglang_cells(row), *_vllm_cells(row), *_trtllm_cells(row))
    console.print(table)
    console.print("[bold]where the difference comes from[/bold]")
    for row in comparison.groups:
        for line in row.why:
            console.print(f"  {row.kind}: {line}")
    contexts = Table(title="Concurrent requests at context L")
    for column in ("L", "SGLang requests", "SGLang binding", "vLLM blocks/request", "vLLM max_concurrency"):
        contexts.add_column(column, justify="left" if "binding" in column else "right")
    contexts.add_column("vLLM requests", justify="right")
    contexts.add_column("vLLM binding")
    contexts.add_column("TensorRT-LLM requests", justify="right")
    for context in comparison.contexts:
        contexts.add_row(
            f"{context.context_len:,}",
            f"{context.sglang_requests:,}",
            context.sglang_binding,
            _number(context.vllm_blocks_per_request),
            f"{context.vllm_max_concurrency:.2f}x" if context.vllm_max_concurrency is not None else "-",
            _number(context.vllm_requests),
            context.vllm_binding or "-",
            _number(context.trtllm_requests),
        )
    console.print(contexts)
    for note in comparison.notes:
        console.print(f"  note: {note}")
    if vllm is not None:
        console.print("[bold]vLLM flags[/bold]")
        console.print(f"  {vllm.serve_command()}")
    if trtllm is not None:
        console.print("[bold]TensorRT-LLM flags[/bold]")
        console.print(f"  {trtllm.serve_command()}")
