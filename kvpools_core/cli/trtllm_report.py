"""What ``kvpools plan`` / ``kvpools capacity`` print under ``--accounting trtllm``: TensorRT-LLM's terms, then
the ``trtllm-serve`` line and its ``--extra_llm_api_options`` file."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvpools_core.engines.trtllm.deployment import TRTLLM_VERSION, TrtllmPlanResult
from kvpools_core.units import format_bytes


def _header(result: TrtllmPlanResult, command: str, console: Console) -> None:
    serving = result.serving
    dp = " · attention DP" if result.enable_attention_dp else ""
    cp = getattr(result, "context_parallel", None)
    if cp is not None:
        dp += f" · CP {cp.size} ({cp.cp_type.lower()})"
    console.print(
        f"[bold]kvpools {command}[/bold] — {result.model.name} ({result.model.source}), accounting trtllm "
        f"(TensorRT-LLM {TRTLLM_VERSION}, PyTorch {getattr(result, 'v2_manager', None) or 'KVCacheManager'}) · "
        f"TP {serving.tp_size} · PP {serving.pp_size}"
        f"{dp} · kv {result.kv_cache_dtype}"
    )


def _draft_label(result: TrtllmPlanResult) -> str:
    """The draft manager's name: MTP's, or a separate draft model's (``decoding_type``, one- or two-model)."""
    if result.drafting is None:
        return "MTP draft manager"
    return f"{result.drafting.decoding_type} ({result.drafting.mode}) draft manager"


def _budget_lines(result: TrtllmPlanResult) -> list[str]:
    lines = []
    # context parallelism: no warm-up, the memory free when the manager is built (engines/trtllm/context_parallel.py)
    when = "free after warm-up" if getattr(result, "context_parallel", None) is None else "free at KV cache creation"
    for rank in result.ranks:
        stage = f"stage {rank.pp_rank}: " if len(result.ranks) > 1 else ""
        if result.gpu is None:
            free = f"--memory {format_bytes(rank.free_after_warmup)} ({when})"
        elif rank.pp_rank < len(result.runtime):
            terms = result.runtime[rank.pp_rank]
            free = (
                f"{result.gpu.label} {format_bytes(terms.total.bytes)} (torch's total) - weights "
                f"{format_bytes(terms.weights)} - activation {format_bytes(terms.activation.bytes)} - outside torch "
                f"{format_bytes(terms.outside_torch.bytes)} = {format_bytes(rank.free_after_warmup)} {when}"
            )
        else:
            free = (
                f"{result.gpu.label} {format_bytes(result.gpu.total_bytes)} - weights "
                f"{format_bytes(rank.weights_memory or 0)} = {format_bytes(rank.free_after_warmup)} {when}"
            )
        lines.append(
            f"{stage}{free} x --kv_cache_free_gpu_memory_fraction {result.free_gpu_memory_fraction:g} = "
            f"{rank.available_kv_memory:,} B ({format_bytes(rank.available_kv_memory)}); kv size per token "
            f"{rank.estimated_size_per_token:,} B (estimate), {rank.cache_bytes_per_token:,} B (manager)"
            + (
                f"; {_draft_label(result)} + {rank.draft_estimated_size_per_token:,} B (estimate)"
                if rank.draft_estimated_size_per_token
                else ""
            )
        )
    return lines


def _pools_table(result: TrtllmPlanResult) -> Table:
    title = "VSWA: one pool per attention window" if result.is_vswa else "one pool (every layer, one window)"
    if result.draft_kv_cache == "separate":
        title += f", and the {_draft_label(result)}'s pool"
    if result.hybrid_manager:
        title = f"{result.hybrid_manager}: the attention pool and the recurrent-state pool (one block per request)"
    manager_v2 = getattr(result, "v2_manager", None)
    if manager_v2:
        title = f"{manager_v2} (KVCacheManagerV2): one pool group per life cycle, blocks = slots, share = ratio"
    table = Table(title=title)
    for column in ("window", "layers", "share", "bytes/token", "primary blocks", "tokens", "host blocks"):
        table.add_column(column, justify="right")
    for pool in result.pools:
        if pool.recurrent:
            table.add_row(
                "recurrent state",
                str(len(pool.layers)),
                f"{pool.share:g}",
                f"{pool.recurrent_state_bytes:,} B/block",
                f"{pool.primary_blocks:,}",
                "-",
                f"{pool.secondary_blocks:,}",
            )
            continue
        table.add_row(
            f"{pool.window} (draft)" if pool.draft else str(pool.window),
            str(len(pool.layers)),
            f"{pool.share:g}",
            f"{pool.bytes_per_token:,}",
            f"{pool.primary_blocks:,}",
            f"{pool.primary_blocks * result.tokens_per_block:,}",
            f"{pool.secondary_blocks:,}",
        )
    return table


def _tail(result: TrtllmPlanResult, console: Console) -> None:
    for warning in result.warnings:
        console.print(f"  TensorRT-LLM warns: {escape(warning)}")
    for note in result.notes:
        console.print(f"  note: {escape(note)}")
    console.print("[bold]flags[/bold]")
    console.print(f"  {escape(result.serve_command())}")
    console.print("  kvpools-trtllm.yaml:")
    for line in result.extra_options_yaml().splitlines():
        console.print(f"    {escape(line)}")


def render_trtllm_plan(result: TrtllmPlanResult, console: Console) -> None:
    """The human report of :func:`~kvpools_core.engines.trtllm.plan_trtllm`."""
    _header(result, "plan", console)
    for line in _budget_lines(result):
        console.print(f"  budget: {line}")
    console.print(_pools_table(result))
    console.print(f"  tokens_per_block {result.tokens_per_block}; max_seq_len {result.max_seq_len}")
    capacity = result.kv_cache_capacity()
    if capacity is not None:
        console.print(f"  get_kv_cache_capacity(): {capacity}")
    else:
        pools = "an attention and a recurrent-state pool" if result.hybrid_manager else "several window pools (VSWA)"
        console.print(f"  get_kv_cache_capacity(): {pools}; kvpools does not state maxNumBlocks")
    console.print(f"  max_batch_size {result.max_batch_size}; max_num_tokens {result.max_num_tokens}")
    _tail(result, console)


def render_trtllm_capacity(result: TrtllmPlanResult, contexts: Sequence[int], console: Console) -> None:
    """The requests table of ``kvpools capacity --accounting trtllm``."""
    _header(result, "capacity", console)
    for line in _budget_lines(result):
        console.print(f"  budget: {line}")
    console.print(_pools_table(result))
    extra = result.extra_tokens_per_request
    held = f"(min(L, window) + {extra})" if extra else "min(L, window)"
    title = f"requests = min(max_batch_size, min over pools of blocks / ceil({held} / tokens))"
    if getattr(result, "v2_manager", None):
        title = "requests = min(max_batch_size, min over pool groups of slots / the slots a request of L holds)"
    cp = getattr(result, "context_parallel", None)
    if cp is not None:
        title = f"requests = min(max_batch_size, rank 0's blocks / ceil(ceil(L / tokens) / cp {cp.size}))"
    table = Table(title=title)
    table.add_column("context L", justify="right")
    table.add_column("requests", justify="right")
    for length in contexts:
        value = result.concurrency_at(length)
        table.add_row(str(length), str(value) if value is not None else "over max_seq_len")
    console.print(table)
    _tail(result, console)
