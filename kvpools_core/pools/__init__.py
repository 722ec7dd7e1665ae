"""Real pools built from a plan: the request table, token-indexed K/V buffers, KV quantisation.

Architecture plugins compose their pools from these pieces
(:class:`~kvpools_core.pools.kv.LayerKV` per group of layers,
:func:`~kvpools_core.pools.quant.codec_for` per KV dtype) and check, before
allocating, that the bytes they are about to allocate are the bytes the plan
charged (:func:`~kvpools_core.pools.kv.check_planned_bytes`).
"""

from __future__ import annotations

from kvpools_core.pools.kv import LayerGeometry, LayerKV, PoolPlanMismatchError, check_planned_bytes
from kvpools_core.pools.req_to_token import DecodeReqToTokenPool, ReqToTokenPool

__all__ = [
    "DecodeReqToTokenPool",
    "LayerGeometry",
    "LayerKV",
    "PoolPlanMismatchError",
    "ReqToTokenPool",
    "check_planned_bytes",
]
