"""``kvpools sweep --accounting trtllm``: a grid of models x TP sizes x KV dtypes x budgets, each point planned as
TensorRT-LLM 1.2 sizes its KV cache (the trtllm engine, :func:`kvpools_core.engines.trtllm.plan_trtllm`), one row
per point: its pools' blocks and tokens, ``max_batch_size`` and the requests each context holds at once
(:meth:`~kvpools_core.engines.trtllm.TrtllmPlanResult.concurrency_at`).  A point TensorRT-LLM or kvpools refuses
is a row with its ``error``, never an abort.  Budgets are ``memory`` (the memory free after warm-up, per GPU) or a
whole catalogue ``gpu`` (weights estimated by kvpools)."""

from __future__ import annotations

import csv
import io
import itertools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kvpools_core.engines import engine_for
from kvpools_core.errors import KvpoolsError
from kvpools_core.planning.capacity import parse_context_len
from kvpools_core.registry import get_registry
from kvpools_core.values import Serving

COLUMNS = (
    "model",
    "tp_size",
    "kv_cache_dtype",
    "budget",
    "max_draft_len",
    "tokens_per_block",
    "max_num_blocks",
    "max_kv_tokens",
    "max_batch_size",
)


def sweep_trtllm(
    models: Sequence[str],
    *,
    tp_sizes: Sequence[int] = (1,),
    kv_cache_dtypes: Sequence[str] = ("auto",),
    budgets: Sequence[dict[str, str]],
    contexts: Sequence[str],
    platform: str = "cuda",
    num_nextn_predict_layers: int | None = None,
    max_batch_size: int | None = None,
    tokens_per_blocks: Sequence[int | None] = (None,),
    max_draft_lens: Sequence[int | None] = (None,),
    draft: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """One row per (model, TP, KV dtype, ``max_draft_len``, ``tokens_per_block``, budget), in that order;
    ``requests@L`` for each context ``L``; every point planned with ``num_nextn_predict_layers`` (one-model MTP),
    ``max_batch_size`` and ``draft`` (a separate draft model's ``decoding_type``, ``speculative_model_dir``,
    ``eagle3_one_model``, ``draft_weights_memory``) when given.  ``max_draft_lens`` and ``tokens_per_blocks`` are
    axes (None: TensorRT-LLM's default, or no draft)."""
    registry = get_registry()
    engine = engine_for("trtllm", registry)
    lengths = [parse_context_len(context) for context in contexts]
    fixed = {name: value for name, value in (draft or {}).items() if value is not None}
    rows = []
    grid = itertools.product(models, tp_sizes, kv_cache_dtypes, max_draft_lens, tokens_per_blocks, budgets)
    for model, tp, dtype, draft_len, block, budget in grid:
        ((kind, value),) = budget.items()
        row: dict[str, Any] = {
            "model": model,
            "tp_size": tp,
            "kv_cache_dtype": dtype,
            "budget": f"{kind}={value}",
        }
        if draft_len is not None:
            row["max_draft_len"] = draft_len
        if block is not None:
            row["tokens_per_block"] = block
        try:
            serving = Serving(accounting="trtllm", tp_size=tp, kv_cache_dtype=dtype, platform=platform)
            options = {"max_draft_len": draft_len, "tokens_per_block": block, kind: value}
            result = engine.plan(
                model,
                serving,
                registry=registry,
                num_nextn_predict_layers=num_nextn_predict_layers,
                max_batch_size=max_batch_size,
                **fixed,
                **{name: option for name, option in options.items() if option is not None},
            )
        except KvpoolsError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        row.update(
            tokens_per_block=result.tokens_per_block,
            max_num_blocks=result.max_num_blocks,
            max_kv_tokens=result.max_kv_tokens,
            max_batch_size=result.max_batch_size,
        )
        for length in lengths:
            row[f"requests@{length}"] = result.concurrency_at(length)
        rows.append({**row, "error": None})
    return rows


def rows_to_csv(rows: Sequence[dict[str, Any]]) -> str:
    fields = list(dict.fromkeys(key for row in rows for key in row))
    stream = io.StringIO()
    writer = csv.DictWriter(stream, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return stream.getvalue()


def rows_to_json(rows: Sequence[dict[str, Any]]) -> str:
    return json.dumps(list(rows), indent=2)


def rows_to_table(rows: Sequence[dict[str, Any]]) -> str:
    fields = list(dict.fromkeys(key for row in rows for key in row if key != "error"))
    lines = [" ".join(f"{field:>16}" for field in fields)]
    for row in rows:
        if row.get("error"):
            lines.append(f"{row['model']:>16} {row['tp_size']:>16} {row['kv_cache_dtype']:>16} {row['budget']:>16}  "
                         f"refused: {row['error']}")  # fmt: skip
            continue
        lines.append(" ".join(f"{'-' if row.get(f) is None else row[f]!s:>16}" for f in fields))
    return "\n".join(lines) + "\n"


__all__ = ["COLUMNS", "rows_to_csv", "rows_to_json", "rows_to_table", "sweep_trtllm"]
