"""What ``kvpools plan`` / ``kvpools capacity`` print under ``--accounting vllm``: vLLM's terms, then its flags."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from kvpools_core.engines.vllm.deployment import VLLM_VERSION, VllmPlanResult, concurrency_at, group_spec_kind
from kvpools_core.engines.vllm.offload import VllmCpuOffload
from kvpools_core.units import format_bytes


def _header(result: VllmPlanResult, command: str, console: Console) -> None:
    serving = result.serving
    console.print(
        f"[bold]kvpools {command}[/bold] — {result.model.name} ({result.model.source}), accounting vllm "
        f"(vLLM {VLLM_VERSION}) · TP {serving.tp_size} · PP {serving.pp_size} · kv {serving.kv_cache_dtype}"
    )


def _budget_lines(result: VllmPlanResult) -> list[str]:
    lines = []
    for rank, budget in enumerate(result.budgets):
        stage = f"stage {rank}: " if len(result.budgets) > 1 else ""
        if result.gpu is None:
            lines.append(
                f"{stage}available_kv_cache_memory = --kv-cache-memory-bytes "
                f"{budget.available_kv_cache_memory} ({format_bytes(budget.available_kv_cache_memory)})"
            )
            continue
        assert budget.requested_memory is not None
        if result.runtime_memory is not None:
            runtime = result.runtime_memory
            peaks = result.stage_activation_peaks
            terms = "".join(
                f" - {term.name} "
                f"{format_bytes(peaks[rank] if term.name == 'activation peak' and peaks else term.bytes)}"
                for term in runtime.terms
            )
            lines.append(
                f"{stage}available_kv_cache_memory = ceil({result.gpu.label} {format_bytes(runtime.total.bytes)} "
                f"({'measured' if runtime.total.measured else 'derived'} torch total) x --gpu-memory-utilization "
                f"{result.gpu_memory_utilization:g}) {format_bytes(budget.requested_memory)} - weights "
                f"{format_bytes(result.weights_memory[rank])}{terms} = {format_bytes(budget.available_kv_cache_memory)}"
            )
            continue
        lines.append(
            f"{stage}available_kv_cache_memory = ceil({result.gpu.label} {format_bytes(result.gpu.total_bytes)} x "
            f"--gpu-memory-utilization {result.gpu_memory_utilization:g}) {format_bytes(budget.requested_memory)} "
            f"- weights {format_bytes(result.weights_memory[rank])} = {format_bytes(budget.available_kv_cache_memory)}"
        )
    return lines


def render_vllm_plan(result: VllmPlanResult, console: Console) -> None:
    """The human report of :func:`~kvpools_core.engines.vllm.plan_vllm`."""
    plan = result.plan
    _header(result, "plan", console)
    for line in _budget_lines(result):
        console.print(f"  budget: {line}")
    table = Table(title="KV-cache groups (one block pool shared by all groups)")
    for column in ("group", "layers", "spec", "block_size", "page_size_bytes"):
        table.add_column(column, justify="left" if column == "spec" else "right")
    for index, group in enumerate(plan.groups):
        table.add_row(
            str(index),
            str(len(group.layer_names)),
            group_spec_kind(group),
            str(group.kv_cache_spec.block_size),
            str(group.kv_cache_spec.page_size_bytes),
        )
    console.print(table)
    per_block = ", ".join(format_bytes(b) for b in plan.bytes_per_block)
    console.print(f"  bytes per block: {per_block} (the widest group's layers' pages)")
    console.print(
        f"  num_gpu_blocks: {plan.num_gpu_blocks} (block 0 is vLLM's null block: {plan.num_gpu_blocks - 1} usable)"
    )
    console.print(f"  blocks per request at max_model_len {plan.max_model_len}: {plan.blocks_per_request}")
    console.print(f"  kv_cache_size_tokens: {plan.kv_cache_size_tokens}")
    console.print(f"  max_concurrency: {plan.max_concurrency:.2f}x at {plan.max_model_len} tokens per request")
    if result.auto_fit_log_line is not None:
        console.print(f"  vLLM logs: {result.auto_fit_log_line}")
    console.print(f"  vLLM logs: {plan.log_line}")
    for note in result.notes:
        console.print(f"  note: {note}")
    if result.offload is not None:
        _render_offload(result.offload, console)
    console.print("[bold]flags[/bold]")
    console.print(f"  {result.serve_command()}")


def _render_offload(offload: VllmCpuOffload, console: Console) -> None:
    """vLLM's CPU offload tier: its blocks, tokens, pinned bytes per worker and per node, the node check, the rule."""
    console.print("[bold]CPU offload (--kv-offloading-size, OffloadingConnector)[/bold]")
    layout = "replicated (one copy shared by the TP ranks)" if offload.replicated_layout else "one slice per worker"
    console.print(
        f"  host block: {offload.worker_kv_bytes_per_block:,} B per worker x {offload.num_copies} "
        f"({layout}) = {offload.kv_bytes_per_chunk:,} B, page aligned {offload.aligned_kv_bytes_per_chunk:,} B"
    )
    console.print(
        f"  num_cpu_blocks: {offload.num_cpu_blocks:,} = {offload.host_tokens:,} host tokens "
        f"(block_size {offload.block_size})"
    )
    console.print(
        f"  pinned: {offload.bytes_per_rank:,} B ({format_bytes(offload.bytes_per_rank)}) per worker; "
        f"{offload.region_bytes:,} B ({format_bytes(offload.region_bytes)}) per node (the /dev/shm region)"
    )
    if offload.memory is not None:
        memory = offload.memory
        console.print(
            f"  node: {memory.available_bytes:,} B available ({memory.source}) - reserve {memory.reserve_bytes:,} B "
            f"= {memory.usable_bytes:,} B usable: fits"
        )
    console.print(f"  rule: {offload.rule}")


def render_vllm_capacity(result: VllmPlanResult, contexts: Sequence[int], console: Console) -> None:
    """The concurrency table of ``kvpools capacity --accounting vllm``."""
    _header(result, "capacity", console)
    for line in _budget_lines(result):
        console.print(f"  budget: {line}")
    auto = " (--max-model-len auto)" if result.max_model_len_auto else ""
    console.print(
        f"  num_gpu_blocks {result.plan.num_gpu_blocks} in {len(result.plan.groups)} group(s); "
        f"max_model_len {result.max_model_len}{auto}"
    )
    table = Table(title="max_concurrency = num_gpu_blocks / Σ_groups cdiv(max_memory_usage_bytes(L), page)")
    table.add_column("context L", justify="right")
    table.add_column("max_concurrency", justify="right")
    for length in contexts:
        value = concurrency_at(result, length)
        table.add_row(str(length), f"{value:.2f}x" if value is not None else "over --max-model-len")
    console.print(table)
    for note in result.notes:
        console.print(f"  note: {note}")
    console.print("[bold]flags[/bold]")
    console.print(f"  {result.serve_command()}")
