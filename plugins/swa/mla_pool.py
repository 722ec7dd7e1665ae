"""The hybrid MLA-SWA KV pool: SGLang's ``SWAKVPool`` over MLA / DSA sub-pools, built from a plan.

As ``_build_hybrid_mla_swa_kv_pool``: the full layers' store is the parts
library's :class:`~kvpools_core.pools.mla.MLATokenToKVPool` (or
:class:`~kvpools_core.pools.dsa.DSATokenToKVPool`, with the indexer keys)
of ``full + page_size`` rows; the sliding layers' store is an
``MLATokenToKVPool`` of their own latent dims with ``swa + page_size`` rows.
Each sub-pool numbers its layers 0..n-1; a global layer id is looked up in
``layers_mapping`` (``layer id → (index in its store, is_swa)``).  Kernels
address every layer with *full* slot ids, and a sliding layer translates them
through ``full_to_swa_index_mapping`` (as :class:`~.pool.SWAKVPool`: 0 for no
SWA slot, a trailing −1), which the dual allocator writes.  The sub-pools allocate their rows through
the build's buffer layout (:mod:`kvpools_core.pools.layout`); the mapping is
one table per pool, allocated directly (see :mod:`.pool`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.indexer import INDEX_POOL
from kvpools_core.parts.latent import LatentRow
from kvpools_core.pools.dsa import DSATokenToKVPool, check_index_bytes, index_request
from kvpools_core.pools.kv import check_planned_bytes, tensor_nbytes
from kvpools_core.pools.layout import BufferLayout, BufferRequest, check_layout_bytes
from kvpools_core.pools.mla import MLATokenToKVPool, check_latent_bytes
from kvpools_core.values import Plan

from .config import FULL, SLIDING
from .mla import full_row, index_bytes, is_dsa, latent_view, swa_row
from .pool import SWARouting, new_mapping
from .sizing import FULL_POOL, MAPPING_ITEM_BYTES, MAPPING_POOL, SWA_POOL

__all__ = ["SWAMLAKVPool"]


class SWAMLAKVPool(SWARouting[MLATokenToKVPool]):
    """Latent rows of the full and the sliding layers of one rank, addressed by global layer id and full slot id."""

    def __init__(
        self,
        *,
        size: int,
        size_swa: int,
        page_size: int,
        full_layer_ids: list[int],
        swa_layer_ids: list[int],
        full_row: LatentRow | None,
        swa_row: LatentRow,
        device: str | torch.device,
        model_dtype: torch.dtype,
        index_head_dim: int | None = None,
        layout: BufferLayout | None = None,
    ) -> None:
        self.size = size
        self.size_swa = size_swa
        self.page_size = page_size
        self._route_layers(full_layer_ids, swa_layer_ids)
        self.full_kv_pool: MLATokenToKVPool | None = None
        self.full_to_swa_index_mapping: Tensor | None = None
        if full_row is not None:
            num_full = len(self.full_attention_layer_ids)
            if index_head_dim is not None:
                self.full_kv_pool = DSATokenToKVPool(
                    size=size,
                    row=full_row,
                    num_layers=num_full,
                    index_head_dim=index_head_dim,
                    name=FULL_POOL,
                    index_name=INDEX_POOL,
                    page_size=page_size,
                    start_layer=0,
                    device=device,
                    model_dtype=model_dtype,
                    layout=layout,
                )
            else:
                self.full_kv_pool = MLATokenToKVPool(
                    size=size,
                    row=full_row,
                    num_layers=num_full,
                    name=FULL_POOL,
                    page_size=page_size,
                    start_layer=0,
                    device=device,
                    model_dtype=model_dtype,
                    layout=layout,
                )
            self.full_to_swa_index_mapping = new_mapping(size, page_size, device)
        self.swa_kv_pool = MLATokenToKVPool(
            size=size_swa,
            row=swa_row,
            num_layers=len(self.swa_attention_layer_ids),
            name=SWA_POOL,
            page_size=page_size,
            start_layer=0,
            device=device,
            model_dtype=model_dtype,
            layout=layout,
        )
        self.device = self.swa_kv_pool.device

    @classmethod
    def from_plan(cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None) -> SWAMLAKVPool:
        """The pools a plan describes; refuses, before allocating, bytes the plan did not charge.

        ``layout`` carves the sub-pools' buffers (the ``buffer_layout`` hook's answer; one tensor per layer when None).
        """
        model, serving = plan.model, plan.serving
        config = plan.sizing.sglang_config
        full, swa, page = (
            int(config["full_max_total_num_tokens"]),
            int(config["swa_max_total_num_tokens"]),
            serving.page_size,
        )
        start, end = rank_layer_range(model, serving)
        layers = model.layers[start:end]
        full_ids = [layer.index for layer in layers if layer.kind == FULL]
        swa_ids = [layer.index for layer in layers if layer.kind == SLIDING]
        row, srow = full_row(model, serving), swa_row(model, serving)
        index_head_dim = None
        if row is not None:
            check_latent_bytes(plan, FULL_POOL, row, full + page, len(full_ids))
            check_planned_bytes(
                MAPPING_POOL,
                (full + page + 1) * MAPPING_ITEM_BYTES,
                plan.pool(MAPPING_POOL).bytes,
                f"{full + page + 1} int64 entries",
            )
            if is_dsa(model):
                view = latent_view(model, FULL)
                assert view is not None
                index_head_dim = int(view.layers[0].params["index_head_dim"])
                check_index_bytes(plan, INDEX_POOL, full, page, index_bytes(model), len(full_ids))
        check_latent_bytes(plan, SWA_POOL, srow, swa + page, len(swa_ids))
        if layout is not None:  # every sub-pool's bytes, before the first tensor
            requests: list[BufferRequest] = MLATokenToKVPool.latent_requests(
                name=SWA_POOL, rows=swa + page, row=srow, layers=range(len(swa_ids)), page_size=page, device=device
            )
            if row is not None:
                full_local = range(len(full_ids))
                requests += MLATokenToKVPool.latent_requests(
                    name=FULL_POOL, rows=full + page, row=row, layers=full_local, page_size=page, device=device
                )
                if index_head_dim is not None:
                    requests.append(index_request(INDEX_POOL, full, page, index_bytes(model), full_local, device))
            check_layout_bytes(layout, requests)
        return cls(
            size=full,
            size_swa=swa,
            page_size=page,
            full_layer_ids=full_ids,
            swa_layer_ids=swa_ids,
            full_row=row,
            swa_row=srow,
            device=device,
            model_dtype=getattr(torch, model.dtype),
            index_head_dim=index_head_dim,
            layout=layout,
        )

    # -- what it is ----------------------------------------------------------

    def nbytes_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name (``kv_full``, ``indexer``, ``full_to_swa``, ``kv_swa``)."""
        measured = {}
        if self.full_kv_pool is not None and self.full_to_swa_index_mapping is not None:
            measured.update(self.full_kv_pool.nbytes_by_pool())
            measured[MAPPING_POOL] = tensor_nbytes([self.full_to_swa_index_mapping])
        measured.update(self.swa_kv_pool.nbytes_by_pool())
        return measured

    # -- latent rows -----------------------------------------------------------

    def set_kv_buffer(self, layer_id: int, loc: Tensor, cache_k: Tensor, cache_v: Tensor | None = None) -> None:
        """Store whole rows at full slots ``loc`` (translated to SWA slots for a sliding layer)."""
        store, index = self._store(layer_id)
        store.set_kv_buffer(index, self._loc(layer_id, loc), cache_k, cache_v)

    def set_mla_kv_buffer(self, layer_id: int, loc: Tensor, k_nope: Tensor, k_rope: Tensor) -> None:
        """Store the latent ``(n, 1, kv_lora_rank)`` and rope ``(n, 1, qk_rope_head_dim)`` parts at full slots."""
        store, index = self._store(layer_id)
        store.set_mla_kv_buffer(index, self._loc(layer_id, loc), k_nope, k_rope)

    def get_mla_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """The latent and rope parts at full slots ``loc``, dequantised to ``dtype`` (default: the model dtype)."""
        store, index = self._store(layer_id)
        return store.get_mla_kv(index, self._loc(layer_id, loc), dtype)

    # -- DSA indexer keys (full layers) ----------------------------------------

    def set_index_k(self, layer_id: int, loc: Tensor, index_k: Tensor) -> None:
        """Quantise and store the index keys ``(len(loc), index_head_dim)`` of a DSA full layer at slots ``loc``."""
        pool, index = self._indexer(layer_id)
        pool.set_index_k(index, loc, index_k)

    def get_index_k_dequant(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """The index keys of a DSA full layer at slots ``loc``, dequantised."""
        pool, index = self._indexer(layer_id)
        return pool.get_index_k_dequant(index, loc, dtype)

    def get_index_k_with_scale_buffer(self, layer_id: int) -> Tensor:
        pool, index = self._indexer(layer_id)
        return pool.get_index_k_with_scale_buffer(index)

    # -- helpers ---------------------------------------------------------------

    def _indexer(self, layer_id: int) -> tuple[DSATokenToKVPool, int]:
        store, index = self._store(layer_id)
        if not isinstance(store, DSATokenToKVPool):
            kind = "a sliding" if self._locate(layer_id)[1] else "an MLA full"
            raise ValueError(f"Layer {layer_id} is {kind} layer: only DSA full layers keep indexer keys.")
        return store, index

    def __repr__(self) -> str:
        full = self.full_kv_pool.row.row_bytes if self.full_kv_pool is not None else 0
        swa = self.swa_kv_pool.row.row_bytes
        return (
            f"SWAMLAKVPool(size={self.size}, size_swa={self.size_swa}, page_size={self.page_size}, "
            f"full layers={len(self.full_attention_layer_ids)} x {full} B, "
            f"SWA layers={len(self.swa_attention_layer_ids)} x {swa} B, device={self.device})"
        )
