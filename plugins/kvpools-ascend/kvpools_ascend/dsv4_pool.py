"""DeepSeek-V4's NPU pools built from a plan (torch): ``DSV4NPUTokenToKVPool``, its allocator and request table.

The shapes are :mod:`kvpools_ascend.dsv4`'s (which cites SGLang 0.5.23's ``hardware_backend/npu/dsv4/``); this
module allocates them and reads and writes the rows as SGLang's NPU pool does (flat ``loc`` writes into the
``(pages, kernel_page, 1, kv_dim)`` PA_ND tensors, ``set_swa_buffer`` / ``set_compress_buffer``).  The planning
side must not import torch: the hooks here import this module only when a build asks.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from kvpools_ascend.allocator import npu_paged_allocator_class
from kvpools_ascend.dsv4 import (
    C128_ALLOCATOR,
    C128_REFCOUNT,
    INDEXER_PACKED,
    SIDECAR,
    NPUDSV4Buffers,
    PANDGeometry,
    npu_dsv4_buffers,
)
from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator, mapping_nbytes, new_full_to_swa_mapping
from kvpools_core.errors import PoolPlanMismatchError
from kvpools_core.pools.kv import allocate, check_planned_bytes, tensor_nbytes
from kvpools_core.pools.req_to_token import ReqToTokenPool
from kvpools_core.values import Plan

__all__ = ["NPUDSV4Allocator", "NPUDSV4ReqToTokenPool", "NPUDSV4TokenToKVPool"]

MAPPING_POOL = "full_to_swa"


def _sizes(plan: Plan) -> dict[str, int]:
    return {key: int(value) for key, value in plan.sizing.sglang_config.items() if isinstance(value, int)}


def plan_buffers(plan: Plan) -> NPUDSV4Buffers:
    serving = plan.serving
    context_len = serving.context_length or plan.model.context_len
    return npu_dsv4_buffers(plan.model, serving, _sizes(plan), plan.max_running_requests, context_len)


def _kv_dtype(b: NPUDSV4Buffers) -> torch.dtype:
    return torch.float8_e4m3fn if b.arch35 else torch.bfloat16


def _pand(geo: PANDGeometry, dtype: torch.dtype, device: str | torch.device) -> dict[int, Tensor]:
    """Per layer ``(pages, kernel_page, 1, kv_dim)`` (``NPUDeepSeekV4SingleKVPool.create_buffer``)."""
    return {layer: allocate((geo.pages, geo.kernel_page, 1, geo.kv_dim), dtype, device) for layer in geo.layers}


class NPUDSV4TokenToKVPool:
    """SGLang's ``DSV4NPUTokenToKVPool``: PA_ND SWA / c4 / c128 KV, the c4 indexer (packed + NPU key and scale),
    the float32 compressor states and the full-to-SWA mapping."""

    def __init__(self, buffers: NPUDSV4Buffers, device: str | torch.device) -> None:
        b = self.buffers = buffers
        self.device = torch.device(device)
        self.page_size = b.page_size
        self.start_layer, self.end_layer = b.start_layer, b.end_layer
        self.compression_ratios = b.ratios
        kv_dtype = _kv_dtype(b)
        self.kv = {geo.name: _pand(geo, kv_dtype, device) for geo in b.kv_pools}
        ix = b.indexer
        self.index_k_with_scale_buffer = {
            layer: allocate((ix.pages, ix.page * ix.row_bytes), torch.uint8, device) for layer in ix.layers
        }
        self.index_k_buffer = _pand(b.index_k, torch.float8_e4m3fn if b.arch35 else torch.int8, device)
        self.index_scale_buffer = _pand(b.index_scale, torch.float32 if b.arch35 else torch.float16, device)
        self.states = {
            st.name: {layer: allocate((st.rows, st.last_dim), torch.float32, device) for layer in st.layers}
            for st in b.states
        }
        self.full_to_swa_index_mapping = new_full_to_swa_mapping(b.full_tokens, b.page_size, device)

    @classmethod
    def from_plan(cls, plan: Plan, device: str | torch.device) -> NPUDSV4TokenToKVPool:
        """The pool of an NPU DeepSeek-V4 plan; refuses, before allocating, any pool the plan charges otherwise."""
        b = plan_buffers(plan)
        check_plan(plan, _planned(b))
        return cls(b, device)

    def nbytes_by_pool(self) -> dict[str, int]:
        b = self.buffers
        measured = {name: tensor_nbytes(list(bufs.values())) for name, bufs in self.kv.items()}
        if b.indexer.layers:
            measured[INDEXER_PACKED] = tensor_nbytes(list(self.index_k_with_scale_buffer.values()))
            measured[b.index_k.name] = tensor_nbytes(list(self.index_k_buffer.values()))
            measured[b.index_scale.name] = tensor_nbytes(list(self.index_scale_buffer.values()))
        measured.update({name: tensor_nbytes(list(bufs.values())) for name, bufs in self.states.items()})
        measured[MAPPING_POOL] = tensor_nbytes([self.full_to_swa_index_mapping])
        return measured

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_pool().values())

    # -- addressing (SGLang's NPU accessors) ---------------------------------

    def compress_ratio(self, layer_id: int) -> int:
        index = layer_id - self.start_layer
        if not 0 <= index < len(self.compression_ratios):
            raise IndexError(f"Layer {layer_id} is not in this stage ([{self.start_layer}, {self.end_layer})).")
        return self.compression_ratios[index]

    def get_key_buffer(self, layer_id: int) -> Tensor:
        """``get_key_buffer``: the layer's PA_ND buffer of its ratio (0: SWA, 4: c4, 128: c128)."""
        ratio = self.compress_ratio(layer_id)
        if ratio == 0:
            return self.kv[self.buffers.swa.name][layer_id]
        name = {4: self.buffers.c4.name, 128: self.buffers.c128.name}.get(ratio)
        if name is None:
            raise ValueError(f"unsupported compress_ratio={ratio} for get_key_buffer")
        return self.kv[name][layer_id]

    def get_swa_buffer(self, layer_id: int, loc: Tensor | None = None) -> Tensor:
        """Every layer keeps SWA rows; ``loc`` gathers flat rows ``(n, 1, dim)``."""
        self.compress_ratio(layer_id)
        kv = self.kv[self.buffers.swa.name][layer_id]
        return kv if loc is None else kv.flatten(0, 1)[loc]

    def set_swa_buffer(self, layer_id: int, loc: Tensor, cache: Tensor) -> None:
        """``set_swa_buffer`` before arch35: flat-indexed bf16 rows (``cache`` ``(n, dim)`` or ``(n, 1, dim)``)."""
        self.compress_ratio(layer_id)
        flat = self.kv[self.buffers.swa.name][layer_id].flatten(0, 1)
        if cache.ndim == flat.ndim - 1:
            cache = cache.unsqueeze(1)
        flat[loc] = cache.to(flat.dtype)

    def set_compress_buffer(self, layer_id: int, loc: Tensor, kv: Tensor) -> None:
        """``set_compress_buffer`` (not the indexer) before arch35: rows at compressed slots ``loc``."""
        ratio = self.compress_ratio(layer_id)
        if ratio == 0:
            raise ValueError(f"Layer {layer_id} is an SWA-only layer: it has no compressed rows.")
        flat = self.get_key_buffer(layer_id).flatten(0, 1)
        if kv.ndim == flat.ndim - 1:
            kv = kv.unsqueeze(1)
        flat[loc] = kv.to(flat.dtype)

    def get_compress_buffer(self, layer_id: int, loc: Tensor | None = None) -> Tensor | None:
        if self.compress_ratio(layer_id) == 0:
            return None
        kv = self.get_key_buffer(layer_id)
        return kv if loc is None else kv.flatten(0, 1)[loc]

    def translate_loc_from_full_to_swa(self, kv_indices: Tensor) -> Tensor:
        return self.full_to_swa_index_mapping[kv_indices]

    def register_mapping(self, full_to_swa_index_mapping: Tensor) -> None:
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    def __repr__(self) -> str:
        b = self.buffers
        return (
            f"NPUDSV4TokenToKVPool(layers=[{b.start_layer}, {b.end_layer}), swa={b.swa_tokens}, c4={b.c4.tokens}, "
            f"c128={b.c128_tokens}, page_size={b.page_size}, c128_page_size={b.c128_page}, device={self.device})"
        )


class NPUDSV4ReqToTokenPool:
    """``DSV4NPUReqToTokenPool`` / ``DSV4NPUDecodeReqToTokenPool``: the core's request table plus
    ``req_to_c128_sidecar``, one int32 c128 page id per 128 x ``c128_page_size`` tokens of a request row."""

    def __init__(self, table: ReqToTokenPool, buffers: NPUDSV4Buffers, device: str | torch.device) -> None:
        self.table = table
        self.c128_page_size = buffers.c128_page
        self.req_to_c128_sidecar = allocate((buffers.num_req_slots, buffers.sidecar_cols), torch.int32, device)

    @classmethod
    def from_plan(cls, plan: Plan, device: str | torch.device) -> NPUDSV4ReqToTokenPool:
        b = plan_buffers(plan)
        check_plan(plan, [(SIDECAR, b.sidecar_bytes, f"{b.num_req_slots} rows x {b.sidecar_cols} int32")])
        return cls(ReqToTokenPool.from_plan(plan, device), b, device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.table, name)

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes) + tensor_nbytes([self.req_to_c128_sidecar])

    def nbytes_by_pool(self) -> dict[str, int]:
        return {"req_to_token": int(self.table.nbytes), SIDECAR: tensor_nbytes([self.req_to_c128_sidecar])}


class NPUDSV4Allocator:
    """``DSV4NPUTokenToKVPoolAllocator``: the SWA allocator (full and SWA free lists) plus the c128 page allocator
    (``NPUPagedTokenToKVPoolAllocator(c128_size, page_size=c128_page_size)``) and its int32 page refcount."""

    def __init__(self, swa: SWATokenToKVPoolAllocator, c128: Any, refcount: Tensor | None) -> None:
        self.swa = swa
        self.c128_attn_allocator = c128
        self.c128_page_refcount = refcount

    def __getattr__(self, name: str) -> Any:
        return getattr(self.swa, name)

    def nbytes_by_pool(self) -> dict[str, int]:
        measured = dict(self.swa.nbytes_by_pool())
        if self.c128_attn_allocator is not None:
            measured.update(self.c128_attn_allocator.nbytes_by_pool(C128_ALLOCATOR))
            assert self.c128_page_refcount is not None
            measured[C128_REFCOUNT] = tensor_nbytes([self.c128_page_refcount])
        return measured

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_pool().values())


def build_npu_allocator(plan: Plan, pool: NPUDSV4TokenToKVPool, device: str, checked: bool) -> NPUDSV4Allocator:
    from kvpools_core.allocators.factory import slot_index_dtype

    b = pool.buffers
    page = b.page_size
    need_sort = plan.serving.disaggregation_mode in ("prefill", "decode")
    swa = SWATokenToKVPoolAllocator(
        b.full_tokens,
        b.swa_tokens // page * page,
        page,
        mapping=pool.full_to_swa_index_mapping,
        kvcache=pool,
        device=device,
        need_sort=need_sort,
        checked=checked,
        index_dtype=slot_index_dtype(plan),
    )
    if not b.c128.layers:
        return NPUDSV4Allocator(swa, None, None)
    c128 = npu_paged_allocator_class()(
        b.c128_allocator_tokens, b.c128_page, device=device, kvcache=pool, need_sort=need_sort, checked=checked
    )
    refcount = allocate((b.c128_pages + 1,), torch.int32, device)
    return NPUDSV4Allocator(swa, c128, refcount)


def check_plan(plan: Plan, planned: Iterable[tuple[str, int, str]]) -> None:
    for name, nbytes, detail in planned:
        try:
            charged = plan.pool(name).bytes
        except KeyError:
            raise PoolPlanMismatchError(
                f"The {name!r} pool would allocate {nbytes} B ({detail}) but the plan has no such pool; re-plan "
                f"with this kvpools version."
            ) from None
        check_planned_bytes(name, nbytes, charged, detail)


def _planned(b: NPUDSV4Buffers) -> Iterable[tuple[str, int, str]]:
    for geo in (*b.kv_pools, *((b.index_k, b.index_scale) if b.indexer.layers else ())):
        how = f"{len(geo.layers)} layer(s) of ({geo.pages}, {geo.kernel_page}, 1, {geo.kv_dim}) x {geo.item} B"
        yield geo.name, geo.nbytes, how
    if b.indexer.layers:
        ix = b.indexer
        yield INDEXER_PACKED, ix.nbytes, f"{len(ix.layers)} layer(s) of {ix.pages} pages x {ix.page} x {ix.row_bytes} B"
    for st in b.states:
        yield st.name, st.nbytes, f"{len(st.layers)} layer(s) of {st.rows} rows x {st.last_dim} float32"
    yield MAPPING_POOL, mapping_nbytes(b.full_tokens, b.page_size), f"{b.full_tokens} + {b.page_size} + 1 int64"
