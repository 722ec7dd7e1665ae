"""TensorRT-LLM's unified hybrid pool (``CppMambaHybridCacheManager``) as pure arithmetic: the full-attention
layers' KV blocks and the Mamba / linear-attention layers' recurrent-state blocks in one ``KVCacheManager``.

Two steps, as TensorRT-LLM takes them:

* ``KvCacheCreator`` divides its budget by an affine cost (``CacheCost``), which
  ``CppMambaHybridCacheManager.get_cache_size_per_token`` returns from ``_estimate_mamba_hybrid_cache_cost``
  (``_torch/pyexecutor/kv_cache/mamba_cache_manager.py``): ``slope`` = the attention layers' static bytes per
  token (``KVCacheManager.get_cache_size_per_token(num_layers=<the rank's attention layers>)``), ``intercept`` =
  ``(max_batch_size x pp_size + 1) x`` the rank's state bytes (one live state per resident sequence and one
  CUDA-graph padding dummy); ``kv_cache_config.max_tokens = max((budget - intercept) // slope, 0)``.
* The manager (``KVCacheManager._calculate_max_num_blocks_for_linear_attention``,
  ``_torch/pyexecutor/resource_manager.py``) takes ``max_gpu_total_bytes`` as its budget, its own slope (the
  attention layers' ``get_cache_bytes_per_token``) and intercept (``max_batch_size x pp_size`` states), clamps
  by ``max_tokens``, and returns two pools: ``max_seq_len`` -> ``tokens // tokens_per_block`` attention blocks,
  ``RECURRENT_STATES`` -> ``max_batch_size x pp_size + 1`` state blocks (one request's state over the rank's
  recurrent layers each); a host cache splits in the same proportion.

Periodic Mamba snapshots for block reuse (``mamba_state_config.periodic_snapshot_interval``) are off by default and
not modelled: no kvpools option turns them on.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from kvpools_core.engines.trtllm.manager import (
    TrtllmLayer,
    WindowPool,
    available_kv_memory,
    cache_bytes_per_token,
    estimated_size_per_token,
    pp_layers,
    window_upper_bound,
)
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.values import ModelSpec

HYBRID_MANAGER = "CppMambaHybridCacheManager"
"""The manager kvpools plans for hybrids (``kv_cache_config.use_kv_cache_manager_v2: false``)."""
CUDA_GRAPH_DUMMY_SLOTS = 1
"""``num_reserved_dummy_slots=1`` of ``CppMambaHybridCacheManager.get_cache_size_per_token``; the manager's own
count is the same ``+ 1`` ("+1 is for the CUDA graph padding dummy")."""


@attrs.frozen(kw_only=True)
class HybridCost:
    """One pipeline stage's affine cost, ``bytes(T) = slope x T + intercept``."""

    slope: int
    intercept: int

    def tokens_for_budget(self, budget: int) -> int:
        """``CacheCost.tokens_for_budget``: ``max((budget - intercept) // slope, 0)``."""
        return max((budget - self.intercept) // self.slope, 0)

    def bytes_for_tokens(self, tokens: int) -> int:
        """``CacheCost.bytes_for_tokens``: ``slope x tokens + intercept``."""
        return self.slope * tokens + self.intercept


def cpp_hybrid_cache_cost(
    *, attention_bytes_per_token: int, state_bytes: int, max_batch_size: int, pp_size: int
) -> HybridCost:
    """``CppMambaHybridCacheManager.get_cache_size_per_token`` -> ``_estimate_mamba_hybrid_cache_cost`` without
    snapshots (``include_explicit_snapshots=False``, no periodic interval): slope = the stage's attention bytes per
    token (``KVCacheManager.get_cache_size_per_token(num_layers=<local attention layers>)``), intercept =
    ``(max_batch_size x pp_size + 1) x state_bytes`` (``num_reserved_dummy_slots=1``)."""
    return HybridCost(
        slope=attention_bytes_per_token,
        intercept=(max_batch_size * pp_size + CUDA_GRAPH_DUMMY_SLOTS) * state_bytes,
    )


@attrs.frozen(kw_only=True)
class HybridStage:
    """One pipeline stage's hybrid pool before the MIN across ranks."""

    attention_layers: tuple[int, ...]
    state_layers: tuple[int, ...]
    state_bytes: int
    """One request's recurrent state over the stage's recurrent layers (``local_mamba_layers x
    get_states_bytes_per_layer``)."""
    estimate: HybridCost
    manager: HybridCost
    config_tokens: int
    """``kv_cache_config.max_tokens`` as ``KvCacheCreator`` sets it (``estimate.tokens_for_budget``)."""
    budget: int
    pool_bytes: int
    max_tokens: int
    kv_blocks: int
    kv_secondary_blocks: int
    state_blocks: int
    state_secondary_blocks: int


def state_bytes_per_layer(layers: Sequence[TrtllmLayer], tp_size: int, enable_attention_dp: bool) -> int:
    """``MambaKVCacheParams.get_states_bytes_per_layer(mapping)`` (one geometry for every recurrent layer)."""
    state = next(layer.state for layer in layers if layer.state is not None)
    assert state is not None
    return state.bytes_per_rank(1 if enable_attention_dp else tp_size)


def plan_stage(
    *,
    spec: ModelSpec,
    layers: Sequence[TrtllmLayer],
    rank: int,
    pp_size: int,
    tp_size: int,
    enable_attention_dp: bool,
    kv_cache_dtype: str,
    free_after_warmup: int,
    fraction: float,
    tokens_per_block: int,
    max_batch_size: int,
    max_tokens: int | None,
    max_gpu_total_bytes: int | None,
    host_cache_size: int | None,
) -> HybridStage:
    """One stage's ``KvCacheCreator`` + ``_calculate_max_num_blocks_for_linear_attention`` (module docstring)."""
    span = pp_layers(spec.num_layers, pp_size, rank)
    local = [layers[i] for i in span]
    attention = [layer for layer in local if layer.has_kv]
    states = [layer for layer in local if layer.state is not None]
    if not attention:
        raise UnsupportedCombinationError(
            f"kvpools does not model pipeline stage {rank} of {spec.name} without a full-attention layer for "
            "--accounting trtllm yet (TensorRT-LLM's affine cost then has no attention slope to divide by); "
            "choose another --pp-size."
        )
    if not states:
        raise UnsupportedCombinationError(
            f"kvpools does not model pipeline stage {rank} of {spec.name} without a recurrent layer for "
            "--accounting trtllm yet (CppMambaHybridCacheManager then falls back to a plain KVCacheManager on that "
            "stage); choose another --pp-size."
        )
    model_attention = [layer for layer in layers if layer.has_kv]
    per_state = state_bytes_per_layer(layers, tp_size, enable_attention_dp)
    state_bytes = len(states) * per_state
    resident = max_batch_size * pp_size
    estimate = cpp_hybrid_cache_cost(
        attention_bytes_per_token=estimated_size_per_token(
            model_attention, len(attention), kv_cache_dtype, 2, tp_size, enable_attention_dp
        ),
        state_bytes=state_bytes,
        max_batch_size=max_batch_size,
        pp_size=pp_size,
    )
    budget = available_kv_memory(free_after_warmup, fraction)
    if max_tokens is not None:
        budget = min(budget, estimate.bytes_for_tokens(max_tokens))
    config_tokens = estimate.tokens_for_budget(budget)
    pool_bytes = budget if max_gpu_total_bytes is None or max_gpu_total_bytes <= 0 else min(budget, max_gpu_total_bytes)
    manager = HybridCost(
        slope=cache_bytes_per_token(attention, kv_cache_dtype, 2, tp_size, enable_attention_dp),
        intercept=resident * state_bytes,
    )
    blocks = linear_attention_blocks(
        primary_bytes=pool_bytes,
        secondary_bytes=host_cache_size or 0,
        attention_bytes_per_token=manager.slope,
        state_bytes=state_bytes,
        max_batch_size=max_batch_size,
        pp_size=pp_size,
        tokens_per_block=tokens_per_block,
        max_tokens=config_tokens,
    )
    return HybridStage(
        attention_layers=tuple(span.index(layer.index) for layer in attention),
        state_layers=tuple(span.index(layer.index) for layer in states),
        state_bytes=state_bytes,
        estimate=estimate,
        manager=manager,
        config_tokens=config_tokens,
        budget=budget,
        pool_bytes=pool_bytes,
        max_tokens=blocks.max_tokens,
        kv_blocks=blocks.kv_blocks,
        kv_secondary_blocks=blocks.kv_secondary_blocks,
        state_blocks=blocks.state_blocks,
        state_secondary_blocks=blocks.state_secondary_blocks,
    )


@attrs.frozen(kw_only=True)
class LinearAttentionBlocks:
    """What ``_calculate_max_num_blocks_for_linear_attention`` returns: ``{max_seq_len: (kv_blocks,
    kv_secondary_blocks), RECURRENT_STATES: (state_blocks, state_secondary_blocks)}``, and the tokens it settled
    on."""

    max_tokens: int
    kv_blocks: int
    kv_secondary_blocks: int
    state_blocks: int
    state_secondary_blocks: int


def linear_attention_blocks(
    *,
    primary_bytes: int,
    secondary_bytes: int,
    attention_bytes_per_token: int,
    state_bytes: int,
    max_batch_size: int,
    pp_size: int,
    tokens_per_block: int,
    max_tokens: int | None,
) -> LinearAttentionBlocks:
    """``KVCacheManager._calculate_max_num_blocks_for_linear_attention`` without periodic snapshots: tokens =
    ``max((primary - max_batch_size x pp_size x state_bytes) // attention_bytes_per_token, 0)``, clamped by
    ``max_tokens`` (a slope of 0 -- no attention layer -- leaves ``max_tokens``); ``tokens // tokens_per_block``
    attention blocks; ``max_batch_size x pp_size + 1`` state blocks; the host pool splits both in the proportion
    ``secondary / primary``.  ``state_bytes`` is one request's state over the stage's recurrent layers."""
    resident = max_batch_size * pp_size
    if attention_bytes_per_token > 0:
        tokens = max((primary_bytes - resident * state_bytes) // attention_bytes_per_token, 0)
        if max_tokens is not None:
            tokens = min(max_tokens, tokens)
    else:
        tokens = max_tokens or 0
    kv_blocks = tokens // tokens_per_block
    state_blocks = resident + CUDA_GRAPH_DUMMY_SLOTS
    ratio = secondary_bytes / primary_bytes if primary_bytes else 0.0
    return LinearAttentionBlocks(
        max_tokens=tokens,
        kv_blocks=kv_blocks,
        kv_secondary_blocks=int(kv_blocks * ratio),
        state_blocks=state_blocks,
        state_secondary_blocks=int(state_blocks * ratio),
    )


def hybrid_pools(
    stages: Sequence[HybridStage], max_seq_len: int, tokens_per_block: int
) -> tuple[tuple[WindowPool, WindowPool], int, tuple[str, ...]]:
    """The two pools after the MIN across ranks (``KVCacheManager.__init__`` all-reduces blocks per window), the
    ``max_seq_len`` ``_validate_and_adjust_attention_windows`` leaves (the recurrent pool's negative window is
    skipped) and its warnings."""
    first = stages[0]
    kv_blocks = min(stage.kv_blocks for stage in stages)
    if kv_blocks == 0:
        short = min(stages, key=lambda stage: stage.kv_blocks)
        raise UnsupportedCombinationError(
            "TensorRT-LLM refuses this plan: 'Impossible to fit in any sequence in kvCache' -- the recurrent state "
            f"of max_batch_size x pp_size + 1 requests ({short.estimate.intercept:,} B, {short.state_bytes:,} B "
            f"each) leaves no attention block in the {short.budget:,} B KV budget "
            "(CppMambaHybridCacheManager's affine CacheCost). Lower --max_batch_size, or give the KV cache more "
            "memory."
        )
    upper = window_upper_bound(kv_blocks, tokens_per_block)
    warnings: list[str] = []
    seq = max_seq_len
    if max_seq_len > upper:
        warnings.append(
            f"Attention window size {max_seq_len} exceeds upper bound {upper} for available blocks. Reducing to "
            f"{upper}."
        )
        warnings.append(f"Adjusted max_seq_len to {upper}")
        seq = upper
    attention = WindowPool(
        window=seq,
        layers=first.attention_layers,
        bytes_per_token=first.manager.slope,
        share=1.0,
        primary_blocks=kv_blocks,
        secondary_blocks=min(stage.kv_secondary_blocks for stage in stages),
    )
    recurrent = WindowPool(
        window=0,
        layers=first.state_layers,
        bytes_per_token=0,
        share=1.0,
        primary_blocks=min(stage.state_blocks for stage in stages),
        secondary_blocks=min(stage.state_secondary_blocks for stage in stages),
        recurrent_state_bytes=first.state_bytes,
    )
    return (attention, recurrent), seq, tuple(warnings)


__all__ = [
    "CUDA_GRAPH_DUMMY_SLOTS",
    "HYBRID_MANAGER",
    "HybridCost",
    "HybridStage",
    "LinearAttentionBlocks",
    "cpp_hybrid_cache_cost",
    "hybrid_pools",
    "linear_attention_blocks",
    "plan_stage",
    "state_bytes_per_layer",
]
