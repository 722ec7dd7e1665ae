"""vLLM 0.33's KV-cache budget: ``available_kv_cache_memory`` from stated inputs (``gpu_worker.py`` L641).

vLLM's ``--gpu-memory-utilization`` is a fraction of the device's **total** memory for the whole instance
(``request_memory``, ``v1/worker/utils.py`` L715: ``ceil(total x util)``), not of the memory free after the
weights as SGLang's ``--mem-fraction-static`` is.  From it vLLM subtracts what its profile run measured outside
the KV cache, and the CUDA-graph estimate (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``, on by default);
``--kv-cache-memory-bytes`` replaces the whole computation.  kvpools cannot profile a model, so the non-KV
figures are inputs (e.g. read off vLLM's own log, or the weights estimate).
"""

from __future__ import annotations

import math

import attrs

from kvpools_core.errors import ConfigError

DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
"""``CacheConfig.gpu_memory_utilization``'s default in vLLM 0.33 (``config/cache.py`` L215)."""


@attrs.frozen(kw_only=True)
class VllmMemoryBudget:
    """How vLLM arrives at ``available_kv_cache_memory`` (bytes; negative when the non-KV memory exceeds the
    request, which vLLM refuses with "No available memory for the cache blocks")."""

    available_kv_cache_memory: int
    source: str
    requested_memory: int | None = None
    non_kv_cache_memory: int | None = None
    cudagraph_memory: int = 0


def _non_negative(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"{name} must be a non-negative number of bytes, got {value!r}.")
    return value


def available_kv_cache_memory(
    *,
    total_memory: int | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    weights_memory: int = 0,
    activation_peak_memory: int = 0,
    non_torch_memory: int = 0,
    cudagraph_memory_estimate: int = 0,
    estimate_cudagraphs: bool = True,
    kv_cache_memory_bytes: int | None = None,
) -> VllmMemoryBudget:
    """``Worker.determine_available_memory`` for a text model, from stated inputs.

    ``requested = ceil(total_memory x gpu_memory_utilization)``; ``non_kv_cache_memory`` = the profile's
    ``total_consumed`` (weights, non-torch memory: ``weights_memory + non_torch_memory``) plus its
    ``transient_peak_headroom`` (``activation_peak_memory``); the CUDA-graph estimate is subtracted when
    ``estimate_cudagraphs`` (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``, the default).  With
    ``kv_cache_memory_bytes`` (``--kv-cache-memory-bytes``) that figure is the answer, and the utilization is
    ignored, as vLLM warns.
    """
    if kv_cache_memory_bytes is not None:
        return VllmMemoryBudget(
            available_kv_cache_memory=_non_negative("--kv-cache-memory-bytes", kv_cache_memory_bytes),
            source="kv_cache_memory_bytes",
        )
    if total_memory is None:
        raise ConfigError(
            "vLLM's budget needs the device's total memory (--gpu-memory-utilization is a fraction of it), "
            "or --kv-cache-memory-bytes."
        )
    _non_negative("total memory", total_memory)
    if isinstance(gpu_memory_utilization, bool) or not 0 < gpu_memory_utilization <= 1:
        raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization!r}.")
    requested = math.ceil(total_memory * gpu_memory_utilization)
    non_kv = (
        _non_negative("weights memory", weights_memory)
        + _non_negative("non-torch memory", non_torch_memory)
        + _non_negative("activation peak memory", activation_peak_memory)
    )
    cudagraph = _non_negative("CUDA-graph memory estimate", cudagraph_memory_estimate) if estimate_cudagraphs else 0
    return VllmMemoryBudget(
        available_kv_cache_memory=requested - non_kv - cudagraph,
        source="gpu_memory_utilization",
        requested_memory=requested,
        non_kv_cache_memory=non_kv,
        cudagraph_memory=cudagraph,
    )
