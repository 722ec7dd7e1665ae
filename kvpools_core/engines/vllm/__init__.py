"""vLLM 0.33's KV-cache planning, modelled exactly: per-layer specs, groups, blocks, the memory check, capacity.

A small core package (no vLLM or torch import): :mod:`kvpools_core.parts.vllm.specs` holds vLLM's per-layer
``KVCacheSpec`` classes as frozen values, :mod:`kvpools_core.engines.vllm.planning` the planner that turns them and a
memory budget into ``num_gpu_blocks``, ``max_concurrency`` and ``kv_cache_size_tokens``;
:func:`~kvpools_core.engines.vllm.deployment.plan_vllm` is what ``--accounting vllm`` runs.  See ``docs/vllm.md``.
"""

from collections.abc import Sequence

from kvpools_core.engines.base import Engine, EngineCapacity
from kvpools_core.engines.vllm.budget import DEFAULT_GPU_MEMORY_UTILIZATION, VllmMemoryBudget, available_kv_cache_memory
from kvpools_core.engines.vllm.deployment import VLLM_VERSION, VllmPlanResult, concurrency_at, plan_vllm
from kvpools_core.engines.vllm.offload import VllmCpuOffload, plan_cpu_offload
from kvpools_core.engines.vllm.planning import (
    KVCacheGroupSpec,
    VllmKVCachePlan,
    VllmLimits,
    VllmMemoryError,
    bytes_per_block,
    check_enough_kv_cache_memory,
    estimate_max_model_len,
    get_kv_cache_groups,
    mamba_cache_mode_of,
    max_memory_usage_bytes,
    packed_kv_cache_groups,
    plan_kv_cache,
    resolve_kv_cache_layout,
    unify_kv_cache_spec_page_size,
)
from kvpools_core.hookspecs import hookimpl
from kvpools_core.parts.vllm.layers import align_hybrid_block_size, pp_layer_ranges
from kvpools_core.parts.vllm.specs import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

__all__ = [
    "DEFAULT_GPU_MEMORY_UTILIZATION",
    "ENGINE",
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "FullAttentionSpec",
    "KVCacheGroupSpec",
    "KVCacheSpec",
    "MLAAttentionSpec",
    "MambaSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "UniformTypeKVCacheSpecs",
    "VllmCpuOffload",
    "VllmKVCachePlan",
    "VllmLimits",
    "VllmMemoryBudget",
    "VllmMemoryError",
    "VllmPlanResult",
    "align_hybrid_block_size",
    "available_kv_cache_memory",
    "bytes_per_block",
    "capacity",
    "check_enough_kv_cache_memory",
    "concurrency_at",
    "engine_accountings",
    "estimate_max_model_len",
    "get_kv_cache_groups",
    "mamba_cache_mode_of",
    "max_memory_usage_bytes",
    "packed_kv_cache_groups",
    "plan_cpu_offload",
    "plan_kv_cache",
    "plan_vllm",
    "pp_layer_ranges",
    "resolve_kv_cache_layout",
    "unify_kv_cache_spec_page_size",
]


def capacity(result: VllmPlanResult) -> EngineCapacity:
    """The first worker's KV memory, the bytes its blocks take, vLLM's "GPU KV cache size: N tokens" and its
    maximum concurrency at ``max_model_len`` (rounded down)."""
    kv = result.plan
    return EngineCapacity(
        engine="vllm",
        accounting="vllm",
        budget_bytes=kv.available_kv_cache_memory[0],
        kv_bytes=kv.num_gpu_blocks * kv.bytes_per_block[0],
        max_tokens=kv.kv_cache_size_tokens,
        max_requests=int(kv.max_concurrency),
    )


ENGINE = Engine(
    name="vllm",
    version=VLLM_VERSION,
    accountings=("vllm",),
    plan=plan_vllm,
    capacity=capacity,
    summary="vLLM's KV cache: per-layer specs, groups, blocks and max concurrency, as vLLM 0.33 plans them.",
    docs="docs/vllm.md",
)


@hookimpl
def engine_accountings() -> Sequence[Engine]:
    """vLLM's accounting, found by the registry as any engine plugin's (entry point ``vllm``)."""
    return [ENGINE]
