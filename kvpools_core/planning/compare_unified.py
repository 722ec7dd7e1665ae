"""SGLang's unified memory beside vLLM's hybrid allocator: ``kvpools compare --enable-unified-memory``.

Both let a hybrid model's layer groups draw on one allocation instead of pools split at start-up: vLLM 0.33's
hybrid KV-cache manager gives every KV-cache group its blocks from one shared block pool (a block is the same
bytes whichever group holds it, so the groups' page sizes are unified first), and SGLang 0.5.23's
``--enable-unified-memory`` carves the full, sliding-window and state sub-pools from one byte arena whose
boundaries move (``docs/unified-memory.md``).  :func:`compare_unified` lines up, for each context length of an
:class:`~kvpools_core.planning.compare.EngineComparison`, SGLang's static split (the comparison's own
``sglang_requests``), SGLang's unified arena (:func:`~kvpools_core.planning.unified.unified_concurrency` on the
same model, serving options and budget with ``enable_unified_memory``) and vLLM's requests.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvpools_core.planning.compare import EngineComparison
from kvpools_core.planning.unified import unified_concurrency
from kvpools_core.values import Plan

__all__ = ["UnifiedComparisonRow", "compare_unified", "unified_comparison_dict"]


@attrs.frozen
class UnifiedComparisonRow:
    """Concurrent requests of one context length: SGLang static, SGLang unified, vLLM's shared block pool."""

    context_len: int
    sglang_static: int
    sglang_static_binding: str
    sglang_unified: int
    sglang_unified_binding: str
    sglang_unified_request_bytes: int
    """Bytes one request draws from the arena (its full pages and its state slots or SWA pages)."""
    vllm_requests: int | None
    vllm_blocks_per_request: int | None
    vllm_binding: str | None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def compare_unified(
    model: str, comparison: EngineComparison, *, registry: Any = None, **budget: Any
) -> tuple[Plan, tuple[UnifiedComparisonRow, ...]]:
    """SGLang's unified plan for ``model`` (as given to ``compare_engines``) with ``comparison``'s SGLang serving
    options and ``budget`` (the same keywords ``compare_engines`` took: ``memory`` or a GPU), and one row per
    context length of the comparison.

    Raises what planning with ``--enable-unified-memory`` raises for the model (a model SGLang does not build
    the arena for is refused with SGLang's reason).
    """
    from kvpools_core.engines import engine_for

    serving = attrs.evolve(comparison.sglang.serving, enable_unified_memory=True)
    unified = engine_for("sglang").plan(model, serving, registry=registry, **budget)
    rows = []
    for context in comparison.contexts:
        ours = unified_concurrency(unified, context.context_len)
        rows.append(
            UnifiedComparisonRow(
                context_len=context.context_len,
                sglang_static=context.sglang_requests,
                sglang_static_binding=context.sglang_binding,
                sglang_unified=ours.concurrent_requests,
                sglang_unified_binding=ours.binding,
                sglang_unified_request_bytes=ours.request_bytes,
                vllm_requests=context.vllm_requests,
                vllm_blocks_per_request=context.vllm_blocks_per_request,
                vllm_binding=context.vllm_binding,
            )
        )
    return unified, tuple(rows)


def unified_comparison_dict(arena_plan: Plan, rows: tuple[UnifiedComparisonRow, ...]) -> dict[str, Any]:
    """The ``unified`` object of ``kvpools compare --enable-unified-memory --json`` (and of the service's)."""
    return {
        "max_total_num_tokens": arena_plan.max_total_num_tokens,
        "arena": {**attrs.asdict(arena_plan.sizing.arenas[0]), "labels": dict(arena_plan.sizing.arenas[0].labels)},
        "contexts": [row.to_dict() for row in rows],
    }
