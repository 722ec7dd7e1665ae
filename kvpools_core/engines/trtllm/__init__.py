"""TensorRT-LLM 1.2's KV-cache sizing (PyTorch backend, ``KVCacheManager``), modelled from its sources.

A small core package (no TensorRT-LLM, torch or GPU import): :mod:`kvpools_core.engines.trtllm.manager` restates
the manager's and ``KvCacheCreator``'s arithmetic, :mod:`kvpools_core.engines.trtllm.deployment` plans a
``trtllm-serve`` deployment with it; :func:`~kvpools_core.engines.trtllm.deployment.plan_trtllm` is what
``--accounting trtllm`` runs.  See ``docs/trtllm.md``.
"""

from kvpools_core.engines.base import Engine
from kvpools_core.engines.trtllm.deployment import (
    TRTLLM_VERSION,
    TrtllmPlanResult,
    TrtllmRank,
    capacity_dict,
    plan_trtllm,
)
from kvpools_core.engines.trtllm.manager import (
    DEFAULT_FREE_GPU_MEMORY_FRACTION,
    DEFAULT_TOKENS_PER_BLOCK,
    TrtllmLayer,
    WindowPool,
    trtllm_layers,
)

ENGINE = Engine(
    name="trtllm",
    version=TRTLLM_VERSION,
    accountings=("trtllm",),
    plan=plan_trtllm,
    summary="TensorRT-LLM's KV cache: the fraction of memory free after warm-up, blocks per attention-window pool, "
    "as TensorRT-LLM 1.2's PyTorch KVCacheManager sizes them.",
    docs="docs/trtllm.md",
)

__all__ = [
    "DEFAULT_FREE_GPU_MEMORY_FRACTION",
    "DEFAULT_TOKENS_PER_BLOCK",
    "ENGINE",
    "TRTLLM_VERSION",
    "TrtllmLayer",
    "TrtllmPlanResult",
    "TrtllmRank",
    "WindowPool",
    "capacity_dict",
    "plan_trtllm",
    "trtllm_layers",
]
