"""TensorRT-LLM 1.2's KV-cache sizing (PyTorch backend, ``KVCacheManager``), modelled from its sources.

A small core package (no TensorRT-LLM, torch or GPU import): :mod:`kvpools_core.engines.trtllm.manager` restates
the manager's and ``KvCacheCreator``'s arithmetic, :mod:`kvpools_core.engines.trtllm.deployment` plans a
``trtllm-serve`` deployment with it; :func:`~kvpools_core.engines.trtllm.deployment.plan_trtllm` is what
``--accounting trtllm`` runs.  See ``docs/trtllm.md``.
"""

from collections.abc import Sequence

from kvpools_core.engines.base import Engine, EngineCapacity
from kvpools_core.engines.trtllm.context_parallel import TrtllmHelixPlanResult
from kvpools_core.engines.trtllm.deployment import (
    TRTLLM_VERSION,
    TrtllmPlanResult,
    TrtllmRank,
    capacity_dict,
    plan_trtllm,
)
from kvpools_core.engines.trtllm.deployment_v2 import TrtllmV2PlanResult
from kvpools_core.engines.trtllm.manager import (
    DEFAULT_FREE_GPU_MEMORY_FRACTION,
    DEFAULT_TOKENS_PER_BLOCK,
    TrtllmLayer,
    WindowPool,
    trtllm_layers,
)
from kvpools_core.hookspecs import hookimpl


def capacity(result: TrtllmPlanResult) -> EngineCapacity:
    """The first rank's KV memory (``free_gpu_memory_fraction`` of the memory free after warm-up, capped by
    ``max_gpu_total_bytes``), the bytes its window pools' primary blocks take, the tokens the smallest pool holds
    (``maxNumTokens`` without VSWA) and the requests of ``max_seq_len`` tokens the pools hold at once."""
    rank = result.ranks[0]
    return EngineCapacity(
        engine="trtllm",
        accounting="trtllm",
        budget_bytes=rank.available_kv_memory,
        kv_bytes=sum(pool.primary_bytes(result.tokens_per_block) for pool in result.pools),
        max_tokens=result.max_kv_tokens,
        max_requests=result.concurrency_at(result.max_seq_len),
    )


ENGINE = Engine(
    name="trtllm",
    version=TRTLLM_VERSION,
    accountings=("trtllm",),
    plan=plan_trtllm,
    capacity=capacity,
    summary="TensorRT-LLM's KV cache: the fraction of memory free after warm-up, blocks per attention-window pool, "
    "as TensorRT-LLM 1.2's PyTorch KVCacheManager sizes them.",
    docs="docs/trtllm.md",
)

__all__ = [
    "DEFAULT_FREE_GPU_MEMORY_FRACTION",
    "DEFAULT_TOKENS_PER_BLOCK",
    "ENGINE",
    "TRTLLM_VERSION",
    "TrtllmHelixPlanResult",
    "TrtllmLayer",
    "TrtllmPlanResult",
    "TrtllmRank",
    "TrtllmV2PlanResult",
    "WindowPool",
    "capacity",
    "capacity_dict",
    "engine_accountings",
    "plan_trtllm",
    "trtllm_layers",
]


@hookimpl
def engine_accountings() -> Sequence[Engine]:
    """TensorRT-LLM's accounting, found by the registry as any engine plugin's (entry point ``trtllm``)."""
    return [ENGINE]
