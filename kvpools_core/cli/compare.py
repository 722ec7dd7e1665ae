"""``kvpools compare``: one model through SGLang's accounting, vLLM's and TensorRT-LLM's, side by side."""

from __future__ import annotations

import json
from typing import Any

import click

from kvpools_core.cli.common import (
    _console,
    _user_facing,
    main,
)
from kvpools_core.dtypes import KV_DTYPE_SPELLINGS
from kvpools_core.values import (
    Serving,
)


@main.command()
@click.argument("model")
@click.option(
    "--memory",
    default=None,
    help="The KV cache's bytes for both engines (SGLang's budget, vLLM's --kv-cache-memory-bytes), e.g. 40GiB.",
)
@click.option(
    "--gpu",
    default=None,
    metavar="NAME",
    help="A catalogue GPU: each engine's own budget on it "
    "(SGLang's default --mem-fraction-static, vLLM's --gpu-memory-utilization 0.92), both shown.",
)
@click.option("--gpu-memory", default=None, help="A GPU of this total memory, like --gpu.")
@click.option("--weights-memory", default=None, help="With --gpu: one rank's weights [default: kvpools' estimate].")
@click.option(
    "--context",
    "contexts",
    multiple=True,
    metavar="L",
    help="Context lengths to compare concurrency at (repeatable or comma separated; 32768, 32k) "
    "[default: the context length].",
)
@click.option("--tp-size", type=int, default=None, help="Tensor-parallel size (both engines).")
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(KV_DTYPE_SPELLINGS, case_sensitive=False),
    default=None,
    help="KV element type (both engines; auto follows the model dtype).",
)
@click.option(
    "--context-length",
    type=int,
    default=None,
    help="SGLang's --context-length and vLLM's --max-model-len [default: the model's].",
)
@click.option(
    "--page-size", type=int, default=None, help="SGLang's tokens per page [default: SGLang's own for the model]."
)
@click.option("--block-size", type=int, default=None, help="vLLM's tokens per block [default: 16].")
@click.option(
    "--tokens_per_block",
    type=int,
    default=None,
    help="TensorRT-LLM's kv_cache_config.tokens_per_block [default: 32; DeepSeek-V4 needs 128 or 256, TensorRT-LLM's "
    "examples pass 128].",
)
@click.option(
    "--enable-unified-memory",
    "unified",
    is_flag=True,
    help="Also plan SGLang's unified memory arena and line it up with its static split and vLLM's shared block "
    "pool (docs/unified-memory.md).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_user_facing
def compare(
    model: str,
    memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    weights_memory: str | None,
    contexts: tuple[str, ...],
    tp_size: int | None,
    kv_cache_dtype: str | None,
    context_length: int | None,
    page_size: int | None,
    block_size: int | None,
    tokens_per_block: int | None,
    unified: bool,
    as_json: bool,
) -> None:
    """MODEL through SGLang's accounting, vLLM's and TensorRT-LLM's, side by side, from the same budget.

    Per layer group (full attention / MLA, sliding window, state): bytes per token, tokens, vLLM's blocks, and
    where the engines differ; TensorRT-LLM's pools; then the concurrent requests of each --context L in all three
    (docs/compare.md; TensorRT-LLM takes --memory as its memory free after warm-up, docs/trtllm.md).
    """
    from kvpools_core.cli.compare_report import render_engine_comparison
    from kvpools_core.planning.capacity import parse_context_len
    from kvpools_core.planning.compare import compare_engines

    fields: dict[str, Any] = {}
    if tp_size is not None:
        fields["tp_size"] = tp_size
    if kv_cache_dtype is not None:
        fields["kv_cache_dtype"] = kv_cache_dtype.lower()
    comparison = compare_engines(
        model,
        Serving(**fields),
        contexts=[parse_context_len(item) for text in contexts for item in text.split(",")],
        memory=memory,
        gpu=gpu,
        gpu_memory=gpu_memory,
        weights_memory=weights_memory,
        context_length=context_length,
        page_size=page_size,
        block_size=block_size,
        tokens_per_block=tokens_per_block,
    )
    unified_rows: Any = None
    if unified:
        from kvpools_core.planning.compare_unified import compare_unified

        budget = {"memory": memory, "gpu": gpu, "gpu_memory": gpu_memory, "weights_memory": weights_memory}
        unified_rows = compare_unified(model, comparison, **budget)
    if as_json:
        data = comparison.to_dict()
        if unified_rows is not None:
            from kvpools_core.planning.compare_unified import unified_comparison_dict

            data["unified"] = unified_comparison_dict(*unified_rows)
        click.echo(json.dumps(data, indent=2, default=str))
    else:
        render_engine_comparison(comparison, _console())
        if unified_rows is not None:
            _render_unified(*unified_rows)


def _render_unified(arena_plan: Any, rows: Any) -> None:
    """SGLang static, SGLang unified and vLLM's hybrid allocator per context length."""
    from rich.table import Table

    arena = arena_plan.sizing.arenas[0]
    console = _console()
    console.print(
        f"SGLang --enable-unified-memory: one arena of {arena.bytes:,} B "
        f"({', '.join(f'{s.pool} {s.entry_bytes:,} B/entry' for s in arena.sub_pools)}); "
        f"max_total_num_tokens {arena_plan.max_total_num_tokens:,}"
    )
    table = Table(title="Concurrent requests: SGLang static split, SGLang unified arena, vLLM's shared block pool")
    for header in ("L", "SGLang static", "binding", "SGLang unified", "binding", "B / request", "vLLM", "binding"):
        table.add_column(header, justify="right" if header not in ("binding",) else "left")
    for row in rows:
        table.add_row(
            f"{row.context_len:,}",
            f"{row.sglang_static:,}",
            row.sglang_static_binding,
            f"{row.sglang_unified:,}",
            row.sglang_unified_binding,
            f"{row.sglang_unified_request_bytes:,}",
            "-" if row.vllm_requests is None else f"{row.vllm_requests:,}",
            row.vllm_binding or "-",
        )
    console.print(table)
