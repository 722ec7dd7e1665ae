"""Inkling-class models' built pools: SGLang's ``SWAKVPool`` and its allocator (torch: imported at build)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kvpools_core.allocators.factory import slot_index_dtype
from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator, new_full_to_swa_mapping
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.attention import layer_geometry
from kvpools_core.parts.sizing import (
    SWA_MAPPING_ITEM_BYTES,
    SWA_MAPPING_POOL,
)
from kvpools_core.pools.kv import LayerKV, allocate, check_planned_bytes, tensor_nbytes
from kvpools_core.pools.layout import BufferLayout, BufferRequest, check_layout_bytes
from kvpools_core.pools.quant import KVCodec, codec_for
from kvpools_core.values import (
    LayerSpec,
    Plan,
)

from .inkling import FULL, FULL_POOL, SLIDING, SWA_POOL, sglang_swa_shape
from .inkling_mtp import (
    InklingMtpTerms,
    head_kv_pool_name,
    head_mapping_pool_name,
    head_state_allocator_name,
    head_state_pool_name,
    mtp_active,
    mtp_terms,
)
from .sizing import SLOT_ALLOCATOR_ITEM_BYTES
from .state import state_shape

__all__ = ["InklingKVPool", "InklingMtpHeads", "inkling_allocator"]


class InklingKVPool:
    """SGLang's ``SWAKVPool`` for an Inkling-class model: the full layers' K / V with ``full + page`` rows, the
    sliding layers' (their own geometry) with ``swa + page`` rows, and the full -> SWA slot mapping the allocator
    writes (sliding layers are addressed with full slot ids, translated through it)."""

    def __init__(self, plan: Plan, device: str | torch.device, layout: BufferLayout | None = None) -> None:
        serving, model = plan.serving, plan.model
        kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
        self.codec = codec_for(kv)
        config = plan.sizing.sglang_config
        self.size, self.size_swa = int(config["full_max_total_num_tokens"]), int(config["swa_max_total_num_tokens"])
        self.page_size = page = serving.page_size
        start, end = rank_layer_range(model, serving)
        layers = model.layers[start:end]
        full = [layer for layer in layers if layer.kind == FULL]
        swa = [layer for layer in layers if layer.kind == SLIDING]
        self.layers_mapping = {layer.index: (i, False) for i, layer in enumerate(full)}
        self.layers_mapping.update({layer.index: (i, True) for i, layer in enumerate(swa)})
        geometry = {name: layer_geometry(group, serving) for name, group in ((FULL_POOL, full), (SWA_POOL, swa))}
        rows = {FULL_POOL: self.size + page, SWA_POOL: self.size_swa + page}
        for name in (FULL_POOL, SWA_POOL):
            check_planned_bytes(
                name,
                LayerKV.planned_nbytes(rows[name], geometry[name], self.codec),
                plan.pool(name).bytes,
                f"{len(geometry[name])} layer(s), {rows[name]} rows of {kv.name}",
            )
        check_planned_bytes(
            SWA_MAPPING_POOL,
            (self.size + page + 1) * SWA_MAPPING_ITEM_BYTES,
            plan.pool(SWA_MAPPING_POOL).bytes,
            f"{self.size + page + 1} int64 entries",
        )
        if layout is not None:
            requests: list[BufferRequest] = []
            for name in (FULL_POOL, SWA_POOL):
                requests += LayerKV.buffer_requests(
                    name=name,
                    rows=rows[name],
                    layers=geometry[name],
                    start_layer=0,
                    codec=self.codec,
                    device=device,
                    page_size=page,
                )
            check_layout_bytes(layout, requests)
        stores = {
            name: LayerKV(
                rows=rows[name],
                layers=geometry[name],
                start_layer=0,
                codec=self.codec,
                device=device,
                read_dtype=getattr(torch, model.dtype),
                name=name,
                page_size=page,
                layout=layout,
            )
            for name in (FULL_POOL, SWA_POOL)
        }
        self.full_kv_pool, self.swa_kv_pool = stores[FULL_POOL], stores[SWA_POOL]
        self.full_to_swa_index_mapping = new_full_to_swa_mapping(self.size, page, device)
        self.device = self.swa_kv_pool.device
        self.mtp_heads: InklingMtpHeads | None = None
        if serving.speculative and mtp_active(serving):
            shape = sglang_swa_shape(model, serving)
            terms = mtp_terms(model, serving, full_per_token=shape.full_per_token, swa_per_token=shape.swa_per_token)
            whole = model.layers
            self.mtp_heads = InklingMtpHeads(
                plan,
                terms,
                self.codec,
                device,
                full=next((layer for layer in whole if layer.kind == FULL), whole[0]),
                sliding=next(layer for layer in whole if layer.kind == SLIDING),
            )

    def nbytes_by_pool(self) -> dict[str, int]:
        measured = {
            FULL_POOL: self.full_kv_pool.nbytes,
            SWA_POOL: self.swa_kv_pool.nbytes,
            SWA_MAPPING_POOL: tensor_nbytes([self.full_to_swa_index_mapping]),
        }
        if self.mtp_heads is not None:
            measured.update(self.mtp_heads.nbytes_by_pool())
        return measured

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_pool().values())

    def get_kv_size_bytes(self) -> tuple[int, int]:
        fk, fv = self.full_kv_pool.get_kv_size_bytes()
        sk, sv = self.swa_kv_pool.get_kv_size_bytes()
        return fk + sk, fv + sv

    def _store(self, layer_id: int) -> tuple[LayerKV, int, bool]:
        if layer_id not in self.layers_mapping:
            raise IndexError(f"Layer {layer_id} is not on this rank; it holds {sorted(self.layers_mapping)}.")
        index, is_swa = self.layers_mapping[layer_id]
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), index, is_swa

    def get_key_buffer(self, layer_id: int) -> Tensor:
        store, index, _ = self._store(layer_id)
        return store.get_key_buffer(index)

    def get_value_buffer(self, layer_id: int) -> Tensor:
        store, index, _ = self._store(layer_id)
        return store.get_value_buffer(index)

    def set_kv_buffer(self, layer_id: int, loc: Tensor, cache_k: Tensor, cache_v: Tensor) -> None:
        """Store K and V of full slots ``loc`` (translated to SWA slots for a sliding layer)."""
        store, index, is_swa = self._store(layer_id)
        store.set_kv_buffer(index, self.full_to_swa_index_mapping[loc] if is_swa else loc, cache_k, cache_v)

    def get_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        store, index, is_swa = self._store(layer_id)
        return store.get_kv(index, self.full_to_swa_index_mapping[loc] if is_swa else loc, dtype)

    def __repr__(self) -> str:
        return (
            f"InklingKVPool(size={self.size}, size_swa={self.size_swa}, page_size={self.page_size}, "
            f"layers={len(self.layers_mapping)}, device={self.device})"
        )


def inkling_allocator(plan: Plan, pool: InklingKVPool, device: str, *, checked: bool) -> SWATokenToKVPoolAllocator:
    """SGLang's ``SWATokenToKVPoolAllocator`` over the two KV pools (``need_sort`` under PD)."""
    page = plan.serving.page_size
    return SWATokenToKVPoolAllocator(
        pool.size,
        pool.size_swa // page * page,
        page,
        mapping=pool.full_to_swa_index_mapping,
        kvcache=pool,
        device=device,
        need_sort=plan.serving.disaggregation_mode in ("prefill", "decode"),
        checked=checked,
        index_dtype=slot_index_dtype(plan),
    )


class InklingMtpHeads:
    """The MTP heads' own tensors, built as the draft runners allocate them and checked against the plan first:
    one layer of K / V per head (``full + page`` rows, the banded head's in the SWA geometry), the banded head's
    identity mapping (``torch.arange(full + page + 1)``, int64), and each head's one-layer short-conv state of
    ``K + 1`` slots with a free list of ``K`` int64 slots."""

    def __init__(
        self,
        plan: Plan,
        terms: InklingMtpTerms,
        codec: KVCodec,
        device: str | torch.device,
        *,
        full: LayerSpec,
        sliding: LayerSpec,
    ) -> None:
        serving = plan.serving
        size = int(plan.sizing.sglang_config["full_max_total_num_tokens"])
        k = int(plan.sizing.sglang_config["max_mamba_cache_size"])
        rows = size + serving.page_size
        shape = state_shape(plan.model, serving)
        self.tensors: dict[str, list[Any]] = {}
        self.kv: dict[int, LayerKV] = {}
        for head in terms.heads:
            banded = head in terms.banded_heads
            geometry = layer_geometry([sliding if banded else full], serving)
            name = head_kv_pool_name(head)
            check_planned_bytes(
                name,
                LayerKV.planned_nbytes(rows, geometry, codec),
                plan.pool(name).bytes,
                f"MTP head {head}: one {'sliding' if banded else 'full'} layer of {rows} rows",
            )
            want = {
                head_state_pool_name(head): ((k + 1) * shape.bytes, f"{k} + 1 slots x one layer ({shape.describe()})"),
                head_state_allocator_name(head): (k * SLOT_ALLOCATOR_ITEM_BYTES, f"int64 free list of {k} slots"),
            }
            if banded:
                want[head_mapping_pool_name(head)] = ((rows + 1) * 8, f"{rows + 1} int64 entries")
            for pool, (allocating, detail) in want.items():
                check_planned_bytes(pool, allocating, plan.pool(pool).bytes, detail)
            self.kv[head] = LayerKV(
                rows=rows,
                layers=geometry,
                start_layer=0,
                codec=codec,
                device=device,
                read_dtype=getattr(torch, plan.model.dtype),
                name=name,
                page_size=serving.page_size,
            )
            if banded:
                self.tensors[head_mapping_pool_name(head)] = [torch.arange(rows + 1, dtype=torch.int64, device=device)]
            self.tensors[head_state_pool_name(head)] = [
                allocate((k + 1, *conv), getattr(torch, shape.conv_dtype), device) for conv in shape.conv
            ]
            self.tensors[head_state_allocator_name(head)] = [allocate((k,), torch.int64, device)]

    def nbytes_by_pool(self) -> dict[str, int]:
        measured = {head_kv_pool_name(head): kv.nbytes for head, kv in self.kv.items()}
        measured.update({name: tensor_nbytes(tensors) for name, tensors in self.tensors.items()})
        return measured
