"""The stores of the parts library: real pools built from a plan.

Each storage kind of :mod:`kvpools_core.parts` has its store here — K/V rows
(:class:`~kvpools_core.pools.mha.MHATokenToKVPool`, made of
:class:`~kvpools_core.pools.kv.LayerKV` per group of layers), latent rows
(:class:`~kvpools_core.pools.mla.MLATokenToKVPool`), latent rows plus indexer
keys (:class:`~kvpools_core.pools.dsa.DSATokenToKVPool`) — and the request
table.  Architecture plugins compose their pools from these and check, before
allocating, that the bytes they are about to allocate are the bytes the plan
charged (:func:`~kvpools_core.pools.kv.check_planned_bytes`).  Every store
allocates its token-indexed buffers through a
:class:`~kvpools_core.pools.layout.BufferLayout` (the platform's carving,
from the ``buffer_layout`` hook; one tensor per layer by default).
"""

from __future__ import annotations

from kvpools_core.pools.dsa import DSATokenToKVPool
from kvpools_core.pools.kv import LayerGeometry, LayerKV, PoolPlanMismatchError, check_planned_bytes
from kvpools_core.pools.layout import (
    CORE_LAYOUTS,
    LAYER_MAJOR,
    PER_LAYER,
    BufferLayout,
    BufferLayoutError,
    BufferRequest,
    LayerMajorLayout,
    PageMajorLayout,
    PerLayerLayout,
    RowIndexedBuffer,
)
from kvpools_core.pools.mha import MHATokenToKVPool, NoOpMHATokenToKVPool
from kvpools_core.pools.mla import MLATokenToKVPool
from kvpools_core.pools.req_to_token import DecodeReqToTokenPool, ReqToTokenPool

__all__ = [
    "CORE_LAYOUTS",
    "LAYER_MAJOR",
    "PER_LAYER",
    "BufferLayout",
    "BufferLayoutError",
    "BufferRequest",
    "DSATokenToKVPool",
    "DecodeReqToTokenPool",
    "LayerGeometry",
    "LayerKV",
    "LayerMajorLayout",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
    "NoOpMHATokenToKVPool",
    "PageMajorLayout",
    "PerLayerLayout",
    "PoolPlanMismatchError",
    "ReqToTokenPool",
    "RowIndexedBuffer",
    "check_planned_bytes",
]
