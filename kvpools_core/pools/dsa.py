"""The DSA KV pool: SGLang's ``DSATokenToKVPool`` (and its cache-layer-split variant) built from a plan.

The MLA latent rows (:class:`~kvpools_core.pools.mla.MLATokenToKVPool`,
packed 656-byte fp8 rows when the plan says so) plus, per layer, the
indexer's key cache: ``((size + page_size + 1) // page_size, page_size ×
132)`` uint8 pages.  Within a page the fp8 keys of its ``page_size`` tokens
come first, then their fp32 scales: token ``loc`` keeps its key at byte
``(loc % page) × D`` of page ``loc // page`` and its scale at
``page × D + (loc % page) × 4`` (``index_buf_accessor``'s layout).

The owned layers' index pages (role ``index_k``: a request whose rows are
pages, ``(pages, page_size × 132)``) are allocated through the build's buffer
layout, as the latent rows are (:mod:`kvpools_core.pools.layout`); the cache
layer split's 0-row placeholders and its one ``remote`` scratch are allocated
here directly (no memory / not per layer).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.indexer import (
    INDEX_BLOCK,
    INDEX_SCALE_BYTES,
    index_pages,
    index_row_bytes,
    latent_row,
    owned_layers,
)
from kvpools_core.parts.latent import LatentRow
from kvpools_core.parts.names import DRAFT_INDEX_POOL, INDEX_POOL, draft_num_layers
from kvpools_core.pools.kv import allocate, check_planned_bytes, tensor_nbytes
from kvpools_core.pools.layout import (
    PER_LAYER,
    BufferLayout,
    BufferRequest,
    allocate_by_layer,
    check_layout_bytes,
)
from kvpools_core.pools.mla import DRAFT_POOL, MAIN_POOL, MLATokenToKVPool, check_latent_bytes, quantize_fp8_blocks
from kvpools_core.values import Plan

__all__ = ["DSATokenToKVPool", "check_index_bytes", "index_request"]

_SCALE_BYTES = INDEX_SCALE_BYTES


class DSATokenToKVPool(MLATokenToKVPool):
    """MLA latent rows plus the paged indexer keys of every DSA layer of one rank."""

    quant_block_size = INDEX_BLOCK

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        row: LatentRow,
        start_layer: int,
        num_layers: int,
        device: str | torch.device,
        model_dtype: torch.dtype,
        index_head_dim: int,
        name: str = MAIN_POOL,
        index_name: str = INDEX_POOL,
        owned: range | None = None,
        draft: DSATokenToKVPool | None = None,
        layout: BufferLayout | None = None,
    ) -> None:
        self.index_head_dim = index_head_dim
        self.index_name = index_name
        layer_ids = range(start_layer, start_layer + num_layers)
        mine = [layer for layer in layer_ids if owned is None or layer in owned]
        request = index_request(index_name, size, page_size, self.index_row_bytes, mine, device)
        check_layout_bytes(layout or PER_LAYER, [request])  # with the latent rows', before the first tensor
        super().__init__(
            size=size,
            page_size=page_size,
            row=row,
            start_layer=start_layer,
            num_layers=num_layers,
            device=device,
            model_dtype=model_dtype,
            name=name,
            owned=owned,
            draft=draft,
            layout=layout,
        )
        pages = allocate_by_layer(self.layout, [request]).get("index_k", {})
        shape = request.shape
        self.index_k_with_scale_buffer = [
            pages[layer] if self.is_owned(layer) else allocate((0, shape[1]), torch.uint8, device)
            for layer in layer_ids
        ]
        self.remote_index_k_with_scale_buffer = allocate(shape, torch.uint8, device) if owned is not None else None

    @classmethod
    def from_plan(
        cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None
    ) -> DSATokenToKVPool:
        """The pool (and its draft pool) of a DSA plan; refuses, before allocating, bytes the plan did not charge.

        ``layout`` carves the buffers (the ``buffer_layout`` hook's answer; one tensor per layer when None).
        """
        model, serving = plan.model, plan.serving
        row = latent_row(model, serving)
        start, end = rank_layer_range(model, serving)
        size, page = plan.max_total_num_tokens, serving.page_size
        owned = owned_layers(start, end, serving)
        stored = end - start if owned is None else len(owned) + 1  # owned layers + the remote scratch
        index_dim = int(model.layers[0].params["index_head_dim"])
        index_row = index_row_bytes(model)
        check_latent_bytes(plan, MAIN_POOL, row, size + page, stored)
        check_index_bytes(plan, INDEX_POOL, size, page, index_row, stored)
        layers = draft_num_layers(plan)
        if layers is not None:  # the draft worker keeps every layer (no split)
            check_latent_bytes(plan, DRAFT_POOL, row, size + page, layers)
            check_index_bytes(plan, DRAFT_INDEX_POOL, size, page, index_row, layers)
        if layout is not None:  # every pool's bytes, before the first tensor
            mine = [layer for layer in range(start, end) if owned is None or layer in owned]
            pools = [(MAIN_POOL, INDEX_POOL, mine)]
            if layers is not None:
                pools.append((DRAFT_POOL, DRAFT_INDEX_POOL, list(range(layers))))
            requests = []
            for latent, index, ids in pools:
                requests += cls.latent_requests(
                    name=latent, rows=size + page, row=row, layers=ids, page_size=page, device=device
                )
                requests.append(index_request(index, size, page, index_row, ids, device))
            check_layout_bytes(layout, requests)
        model_dtype = getattr(torch, model.dtype)

        def make(
            first: int, num: int, names: tuple[str, str], part: range | None, draft: DSATokenToKVPool | None = None
        ) -> DSATokenToKVPool:
            return cls(
                size=size,
                page_size=page,
                row=row,
                start_layer=first,
                num_layers=num,
                device=device,
                model_dtype=model_dtype,
                index_head_dim=index_dim,
                name=names[0],
                index_name=names[1],
                owned=part,
                draft=draft,
                layout=layout,
            )

        draft = None
        if layers is not None:
            draft = make(0, layers, (DRAFT_POOL, DRAFT_INDEX_POOL), None)
        return make(start, end - start, (MAIN_POOL, INDEX_POOL), owned, draft)

    # -- sizes ---------------------------------------------------------------

    @property
    def index_row_bytes(self) -> int:
        """Bytes of one token's index key and scales (132 for index_head_dim 128)."""
        return self.index_head_dim + self.index_scales * _SCALE_BYTES

    @property
    def index_scales(self) -> int:
        return self.index_head_dim // INDEX_BLOCK

    def index_nbytes(self) -> int:
        remote = [self.remote_index_k_with_scale_buffer] if self.remote_index_k_with_scale_buffer is not None else []
        return tensor_nbytes(self.index_k_with_scale_buffer, remote)

    def _own_nbytes_by_pool(self) -> dict[str, int]:
        return {self.name: self.latent_nbytes(), self.index_name: self.index_nbytes()}

    # -- indexer keys --------------------------------------------------------

    def get_index_k_with_scale_buffer(self, layer_id: int) -> Tensor:
        """The layer's ``(pages, page_size × index row)`` uint8 pages (the remote scratch for another rank's layer)."""
        index = self.local(layer_id)
        if not self.is_owned(layer_id):
            assert self.remote_index_k_with_scale_buffer is not None
            return self.remote_index_k_with_scale_buffer
        return self.index_k_with_scale_buffer[index]

    def set_index_k(self, layer_id: int, loc: Tensor, index_k: Tensor) -> None:
        """Quantise ``(len(loc), index_head_dim)`` index keys to fp8 (one fp32 scale per 128) and store them."""
        n = loc.shape[0]
        if tuple(index_k.shape) != (n, self.index_head_dim):
            raise ValueError(
                f"set_index_k(layer {layer_id}): index_k has shape {tuple(index_k.shape)}, "
                f"expected ({n}, {self.index_head_dim})."
            )
        keys, scale = quantize_fp8_blocks(index_k, INDEX_BLOCK)
        self.set_index_k_and_scale(layer_id, loc, keys, scale)

    def set_index_k_and_scale(self, layer_id: int, loc: Tensor, keys: Tensor, scale: Tensor) -> None:
        """Store fp8 keys ``(n, index_head_dim)`` and fp32 scales ``(n, index_head_dim // 128)`` at slots ``loc``."""
        if not self.is_owned(layer_id):
            self.local(layer_id)
            return  # another CP rank owns this layer
        buffer = self.get_index_k_with_scale_buffer(layer_id)
        pages, key_cols, scale_cols = self._index_columns(loc)
        buffer[pages, key_cols] = keys.view(torch.uint8) if keys.dtype != torch.uint8 else keys
        buffer[pages, scale_cols] = scale.to(torch.float32).contiguous().view(torch.uint8)

    def get_index_k(self, layer_id: int, loc: Tensor) -> Tensor:
        """The fp8 index keys ``(n, index_head_dim)`` at slots ``loc``."""
        pages, key_cols, _ = self._index_columns(loc)
        return self.get_index_k_with_scale_buffer(layer_id)[pages, key_cols].view(torch.float8_e4m3fn)

    def get_index_k_scale(self, layer_id: int, loc: Tensor) -> Tensor:
        """The fp32 scales ``(n, index_head_dim // 128)`` at slots ``loc``."""
        pages, _, scale_cols = self._index_columns(loc)
        return self.get_index_k_with_scale_buffer(layer_id)[pages, scale_cols].contiguous().view(torch.float32)

    def get_index_k_dequant(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """The index keys at slots ``loc``, dequantised to ``dtype`` (default: the model dtype)."""
        keys = self.get_index_k(layer_id, loc).float().reshape(loc.shape[0], self.index_scales, INDEX_BLOCK)
        values = keys * self.get_index_k_scale(layer_id, loc).unsqueeze(-1)
        return values.reshape(loc.shape[0], self.index_head_dim).to(dtype or self.model_dtype)

    def _index_columns(self, loc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(page, key byte columns, scale byte columns) of every slot: the paged layout, vectorised."""
        page = self.page_size
        loc = loc.long()
        pages = (loc // page).unsqueeze(1)
        offset = (loc % page).unsqueeze(1)
        key_cols = offset * self.index_head_dim + torch.arange(self.index_head_dim, device=loc.device)
        scale_bytes = self.index_scales * _SCALE_BYTES
        scale_cols = page * self.index_head_dim + offset * scale_bytes + torch.arange(scale_bytes, device=loc.device)
        return pages, key_cols, scale_cols


def index_request(
    pool: str, size: int, page_size: int, index_row: int, layers: Sequence[int], device: str | torch.device
) -> BufferRequest:
    """The indexer's request: per layer, ``(pages, page_size × index row)`` uint8 (its rows are pages)."""
    return BufferRequest(
        pool=pool,
        role="index_k",
        rows=index_pages(size, page_size),
        page_size=page_size,
        layers=layers,
        row_shape=(page_size * index_row,),
        dtype=torch.uint8,
        device=device,
    )


def check_index_bytes(plan: Plan, pool: str, size: int, page_size: int, index_row: int, num_layers: int) -> None:
    """Refuse to build indexer buffers whose bytes differ from the plan's ``pool``."""
    pages = index_pages(size, page_size)
    check_planned_bytes(
        pool,
        pages * page_size * index_row * num_layers,
        plan.pool(pool).bytes,
        f"{num_layers} layer(s) of {pages} pages × {page_size} tokens × {index_row} B",
    )
