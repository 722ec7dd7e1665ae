"""HiSparse on MiniMax-M3 sparse attention: SGLang 0.5.23's ``MiniMaxSparseKVPool(enable_hisparse=True)``, sized.

``_build_minimax_sparse_kv_pool`` (``000_fbd4f47288598fb9.txt`` lines 1832-1874) passes
``host_to_device_ratio`` ``r`` and ``MiniMaxSparseKVPool`` (``mem_cache/memory_pool.py``) then builds, for
``S = max_total_num_tokens``:

* ``main_pool = HiSparseMHAMainPool(size=S)``: K and V of the stage's *sparse* layers only, ``S + P`` rows
  (read through HiSparse's device mapping);
* ``dense_pool = MHATokenToKVPool(size=S x r)``: K and V of the dense layers, ``S r + P`` rows;
* the indexer pools (``index_kv_pool`` / ``index_k_pool``) of ``index_pool_size = S x r``: ``S r + P`` rows;

and ``HiSparseTokenToKVPoolAllocator`` (lines 2129-2144): logical slots ``S x r``, device slots ``S``, an int64
mapping of ``S r + P + 1`` (:mod:`kvpools_core.parts.hisparse`).  SGLang's configurator (ref-002 lines
221-266) charges every layer's K/V and the indexer once per token whatever ``r``; ``--accounting sglang`` keeps
that count.  ``HiSparseCoordinator`` asserts one KV head per attention-TP rank (``managers/
hisparse_coordinator.py``), and ``HiSparseMHAMainPool`` starts at the stage's first sparse layer.
"""

from __future__ import annotations

import attrs

from kvpools_core.options import option
from kvpools_core.parallel import kv_heads_per_rank
from kvpools_core.parts.hisparse import size_hisparse_pools
from kvpools_core.parts.names import INDEX_POOL
from kvpools_core.values import Budget, CellPart, CellSize, LayerSpec, ModelSpec, PoolSizing, Serving

__all__ = ["DENSE_KV_POOL", "dense_parts", "m3_hisparse_pools", "m3_hisparse_problems"]

DENSE_KV_POOL = "dense_kv"
"""``MiniMaxSparseKVPool.dense_pool`` under HiSparse: the dense layers' K/V for ``S x r`` logical slots."""


def m3_hisparse_problems(layers: tuple[LayerSpec, ...], sparse: str, serving: Serving) -> list[str]:
    """What SGLang refuses, and what kvpools does not model yet, for MiniMax-M3 HiSparse on this stage."""
    if not serving.enable_hisparse:
        return []
    flag = option("enable_hisparse")
    problems = []
    heads = {kv_heads_per_rank(layer.num_kv_heads, serving.attn_tp_size, serving.dcp_size) for layer in layers}
    if heads != {1}:
        problems.append(
            f"SGLang refuses {flag} here: 'MiniMax M3 HiSparse requires one KV head per TP rank, got "
            f"{max(heads)}. Increase the tensor-parallel size.' (HiSparseCoordinator, "
            f"managers/hisparse_coordinator.py). Raise {option('tp_size')} until each attention-TP rank keeps one "
            "KV head."
        )
    if not any(layer.kind == sparse for layer in layers):
        problems.append(
            f"SGLang cannot build {flag} on a pipeline stage without sparse layers (HiSparseMHAMainPool starts at "
            f"the stage's first sparse layer). Change {option('pp_size')} or the layer partition."
        )
    unmodelled = [
        (
            serving.speculative_algorithm is not None,
            "speculative decoding (its draft pool and HiSparse's swap scratch)",
        ),
        (serving.dcp_size > 1, f"{option('dcp_size')} {serving.dcp_size}"),
        (serving.enable_hierarchical_cache, option("enable_hierarchical_cache")),
        (serving.disaggregation_mode != "null", f"{option('disaggregation_mode')} {serving.disaggregation_mode}"),
    ]
    problems += [
        f"kvpools does not model {flag} with {what} on MiniMax sparse attention yet. Drop one of them."
        for present, what in unmodelled
        if present
    ]
    return problems


def dense_parts(parts: tuple[CellPart, ...]) -> tuple[CellPart, ...]:
    """The dense layers' K/V parts, moved to their own pool (``dense_kv``: ``S x r`` slots under HiSparse)."""
    return tuple(attrs.evolve(part, name=f"dense_{part.name}", pool=DENSE_KV_POOL) for part in parts)


def m3_hisparse_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget, *, owner: str) -> PoolSizing:
    """Sparse layers' K/V for ``S`` device tokens; the dense layers' K/V and the indexer for ``S x r``."""

    return size_hisparse_pools(model, serving, cell, budget, owner=owner, logical_pools=(DENSE_KV_POOL, INDEX_POOL))
