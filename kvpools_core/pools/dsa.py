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

The plan says how the indexer keys are stored, by the name of its ``indexer``
pool's cell part (:func:`index_storage`), and :class:`IndexStorage` carries it:

* :data:`PAGED_INDEX_PART` (``"indexer"``): the pages above (SGLang's
  ``DSATokenToKVPool``; the part declares ``extra_slots=1``);
* :data:`INDEX_ROWS_PART` (``"index_k"``): one plain ``(1, index_head_dim)``
  row per token slot of the KV store dtype, ``size + page_size`` rows
  (``(size // P + 1) × P`` for the page-aligned sizes of every plan), no
  scales — SGLang's Ascend NPU ``NPUMLATokenToKVPool.index_k_buffer``
  (256 B per token per layer in bf16, 128 in fp8, against CUDA's 132);
* :data:`INDEX_ROWS_PART` and :data:`INDEX_SCALES_PART` (``"index_k_scale"``):
  those rows (fp8) plus one fp32 scale per token slot in a buffer of its own,
  ``(size + page_size, 1)`` per layer — SGLang NPU's quantised lightning
  indexer (``index_k_scale_buffer``, 128 + 4 B per token per layer).

The latent row's layout (DSA's packed fp8 row or the plain one) is the plan's
too (:func:`plan_latent_row`), so a platform that stores fp8 latent rows
unpacked plans them unpacked and gets them built so.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch
from torch import Tensor

from kvpools_core.errors import AllocatorError, ConfigError
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.indexer import (
    INDEX_BLOCK,
    INDEX_SCALE_BYTES,
    INDEX_TAIL_POOL,
    TAIL_ELEMENT_BYTES,
    index_buffer_slots,
    index_head_dim,
    index_layer_mask,
    index_tail_bytes_per_request,
    latent_row,
    owned_layers,
)
from kvpools_core.parts.latent import LatentRow
from kvpools_core.parts.names import DRAFT_INDEX_POOL, INDEX_POOL, draft_num_layers, draft_pool_geometry
from kvpools_core.pools.dsa_index import (
    INDEX_ROWS_PART,
    INDEX_SCALE_ROLE,
    INDEX_SCALES_PART,
    PAGED_INDEX_PART,
    IndexStorage,
    check_index_bytes,
    index_request,
    index_storage,
)
from kvpools_core.pools.kv import allocate, check_planned_bytes, tensor_nbytes
from kvpools_core.pools.layout import (
    PER_LAYER,
    BufferLayout,
    allocate_by_layer,
    check_layout_bytes,
)
from kvpools_core.pools.mla import DRAFT_POOL, MAIN_POOL, MLATokenToKVPool, check_latent_bytes, quantize_fp8_blocks
from kvpools_core.pools.quant import KVCodec, codec_for
from kvpools_core.values import TOKEN, Plan

__all__ = [
    "INDEX_ROWS_PART",
    "INDEX_SCALES_PART",
    "PAGED_INDEX_PART",
    "DSATokenToKVPool",
    "IndexStorage",
    "check_index_bytes",
    "index_request",
    "index_storage",
    "plan_latent_row",
]


def plan_latent_row(plan: Plan) -> LatentRow:
    """The latent row the plan's ``kv`` pool parts describe: DSA's packed fp8 row or the plain one.

    SGLang's rule (:func:`~kvpools_core.parts.indexer.latent_row`) unless the
    plan's parts are those of the other layout (a platform that stores fp8
    rows unpacked); the bytes are checked against the plan afterwards.
    """
    row = latent_row(plan.model, plan.serving)
    names = [part.name for part in plan.cell.parts_of(TOKEN) if part.pool == MAIN_POOL]
    if row.kv.name != "fp8_e4m3" or names == [name for name, _bytes in row.parts()]:
        return row
    other = attrs.evolve(row, packed_fp8=not row.packed_fp8)
    return other if names == [name for name, _bytes in other.parts()] else row


class DSATokenToKVPool(MLATokenToKVPool):
    """MLA latent rows plus the paged indexer keys of every DSA layer of one rank."""

    quant_block_size = INDEX_BLOCK

    def get_cpu_copy(self, indices: Tensor) -> dict[str, object]:
        """Refused: the MLA rows alone would leave the indexer keys behind (they are paged, not per slot)."""
        raise AllocatorError(
            "get_cpu_copy(): the DSA pool has no host copies (its indexer keys are stored by page, and a copy of "
            "the latent rows alone would resume a request without them); retract by recomputing instead"
        )

    def load_cpu_copy(self, kv_cache_cpu: dict[str, object], indices: Tensor) -> None:
        """Refused, as :meth:`get_cpu_copy`."""
        self.get_cpu_copy(indices)

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
        index: IndexStorage | None = None,
        index_size: int | None = None,
        index_layers: Sequence[int] | None = None,
        tail_rows: int = 0,
        tail_width: int = 0,
    ) -> None:
        """``index`` says how the index keys are stored (CUDA's fp8 pages of ``index_head_dim`` when None).

        ``index_size`` is the index buffer's token slots (``size`` when None; SGLang's ``index_buf_size``),
        ``index_layers`` the owned layers that hold index keys (all when None; IndexShare layers get 0-row
        placeholders) and ``tail_rows`` x ``tail_width`` the kpool-compress tails of each of them (none at 0).
        """
        self.index_head_dim = index_head_dim
        self.index_name = index_name
        self.index = index or IndexStorage(index_head_dim)
        if self.index.index_head_dim != index_head_dim:
            raise ValueError(f"index storage of index_head_dim {self.index.index_head_dim}, not {index_head_dim}")
        layer_ids = range(start_layer, start_layer + num_layers)
        mine = [layer for layer in layer_ids if owned is None or layer in owned]
        keyed = mine if index_layers is None else [layer for layer in mine if layer in set(index_layers)]
        self.index_size = size if index_size is None else index_size
        self.index_layer_ids = frozenset(keyed)
        """Owned layers holding index keys (the others: 0-row placeholders, SGLang's ``skip_topk_layers``)."""
        index_requests = self.index.requests(index_name, self.index_size, page_size, keyed, device)
        request = index_requests[0]
        check_layout_bytes(layout or PER_LAYER, index_requests)  # with the latent rows', before the first tensor
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
        buffers = allocate_by_layer(self.layout, index_requests)
        keys = buffers.get("index_k", {})
        shape, dtype = request.shape, request.dtype
        per_layer = [
            keys[layer] if layer in self.index_layer_ids else allocate((0, *shape[1:]), dtype, device)
            for layer in layer_ids
        ]
        self.index_tails: list[Tensor] = (
            [
                allocate(
                    (tail_rows if layer in self.index_layer_ids else 0, tail_width, index_head_dim),
                    torch.bfloat16,
                    device,
                )
                for layer in layer_ids
                for _kind in ("k", "score")
            ]
            if tail_rows
            else []
        )
        """kpool-compress tails: per layer a key and a score ``(requests + 1, kpool + draft, index_head_dim)`` bf16."""
        scale_request = index_requests[1] if len(index_requests) > 1 else None
        self.index_k_scale_buffer: list[Tensor] = []
        """Scale rows (:data:`INDEX_SCALES_PART`): per layer ``(size + page_size, 1)`` fp32 (else empty)."""
        self.remote_index_k_scale_buffer: Tensor | None = None
        if scale_request is not None:
            scales = buffers.get(INDEX_SCALE_ROLE, {})
            scale_shape, scale_dtype = scale_request.shape, scale_request.dtype
            self.index_k_scale_buffer = [
                scales[layer] if self.is_owned(layer) else allocate((0, *scale_shape[1:]), scale_dtype, device)
                for layer in layer_ids
            ]
            if owned is not None:
                self.remote_index_k_scale_buffer = allocate(scale_shape, scale_dtype, device)
        self.index_k_with_scale_buffer: list[Tensor] = per_layer if self.index.paged else []
        """Paged storage: per layer ``(pages, page_size × 132)`` uint8 (empty for plain rows)."""
        self.index_k_buffer: list[Tensor] = [] if self.index.paged else per_layer
        """Plain-row storage: per layer ``(size + page_size, 1, index_head_dim)`` of the KV store dtype."""
        remote = allocate(shape, dtype, device) if owned is not None else None
        self.remote_index_k_with_scale_buffer = remote if self.index.paged else None
        self.remote_index_k_buffer = None if self.index.paged else remote

    @classmethod
    def from_plan(
        cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None
    ) -> DSATokenToKVPool:
        """The pool (and its draft pool) of a DSA plan; refuses, before allocating, bytes the plan did not charge.

        ``layout`` carves the buffers (the ``buffer_layout`` hook's answer; one tensor per layer when None).
        """
        model, serving = plan.model, plan.serving
        row, index = plan_latent_row(plan), index_storage(plan)
        start, end = rank_layer_range(model, serving)
        size, page = plan.max_total_num_tokens, serving.page_size
        owned = owned_layers(start, end, serving)
        stored = end - start if owned is None else len(owned) + 1  # owned layers + the remote scratch
        index_dim = index.index_head_dim
        check_latent_bytes(plan, MAIN_POOL, row, size + page, stored)
        mask = index_layer_mask(model.layers[start:end], serving)
        mine = [layer for layer in range(start, end) if owned is None or layer in owned]
        keyed = [layer for layer, kept in zip(range(start, end), mask, strict=True) if kept and layer in mine]
        index_size = index_buffer_slots(size, page, serving)
        if keyed != mine and index.nbytes(index_size, page, len(mine)) == plan.pool(INDEX_POOL).bytes:
            keyed = mine  # a platform whose pool keeps every layer's keys planned them all (Ascend before arch35)
        index.check(plan, INDEX_POOL, index_size, page, len(keyed) + (stored - len(owned) if owned else 0))
        tail_rows, tail_width = _tail_geometry(plan, len(keyed))
        layers = draft_num_layers(plan)
        draft_size, draft_page = draft_pool_geometry(plan, DRAFT_POOL)  # dcp x the target's under DCP
        if layers is not None:  # the draft worker keeps every layer (no split)
            if draft_pool_geometry(plan, DRAFT_INDEX_POOL) != (draft_size, draft_page):
                raise ConfigError(
                    f"The plan's {DRAFT_POOL} and {DRAFT_INDEX_POOL} pools span different slots per token; "
                    f"SGLang's draft worker builds both over one slot space."
                )
            check_latent_bytes(plan, DRAFT_POOL, row, draft_size + draft_page, layers)
            index.check(plan, DRAFT_INDEX_POOL, draft_size, draft_page, layers)
        if layout is not None:  # every pool's bytes, before the first tensor
            pools = [(MAIN_POOL, INDEX_POOL, mine, keyed, size, index_size, page)]
            if layers is not None:
                ids = list(range(layers))
                pools.append((DRAFT_POOL, DRAFT_INDEX_POOL, ids, ids, draft_size, draft_size, draft_page))
            requests = []
            for latent, index_pool, ids, keys, slots, index_slots, slot_page in pools:
                requests += cls.latent_requests(
                    name=latent, rows=slots + slot_page, row=row, layers=ids, page_size=slot_page, device=device
                )
                requests += index.requests(index_pool, index_slots, slot_page, keys, device)
            check_layout_bytes(layout, requests)
        model_dtype = getattr(torch, model.dtype)

        def make(
            first: int, num: int, names: tuple[str, str], part: range | None, draft: DSATokenToKVPool | None = None
        ) -> DSATokenToKVPool:
            drafted = names[0] == DRAFT_POOL
            return cls(
                size=draft_size if drafted else size,
                page_size=draft_page if drafted else page,
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
                index=index,
                index_size=None if drafted else index_size,
                index_layers=None if drafted else keyed,
                tail_rows=0 if drafted else tail_rows,
                tail_width=tail_width,
            )

        draft = None
        if layers is not None:
            draft = make(0, layers, (DRAFT_POOL, DRAFT_INDEX_POOL), None)
        return make(start, end - start, (MAIN_POOL, INDEX_POOL), owned, draft)

    # -- sizes ---------------------------------------------------------------

    @property
    def index_row_bytes(self) -> int:
        """Bytes of one token's index key per layer: key and scales (132 for index_head_dim 128), or the plain row."""
        return self.index.row_bytes

    @property
    def index_scales(self) -> int:
        return self.index_head_dim // INDEX_BLOCK

    def index_nbytes(self) -> int:
        remote = [
            t
            for t in (
                self.remote_index_k_with_scale_buffer,
                self.remote_index_k_buffer,
                self.remote_index_k_scale_buffer,
            )
            if t is not None
        ]
        return tensor_nbytes(self.index_k_with_scale_buffer, self.index_k_buffer, self.index_k_scale_buffer, remote)

    def _own_nbytes_by_pool(self) -> dict[str, int]:
        measured = {self.name: self.latent_nbytes(), self.index_name: self.index_nbytes()}
        if self.index_tails:
            measured[INDEX_TAIL_POOL] = tensor_nbytes(self.index_tails)
        return measured

    # -- indexer keys --------------------------------------------------------

    def get_index_k_with_scale_buffer(self, layer_id: int) -> Tensor:
        """The layer's ``(pages, page_size × index row)`` uint8 pages (the remote scratch for another rank's layer)."""
        self._need_paged("get_index_k_with_scale_buffer")
        index = self.local(layer_id)
        if not self.is_owned(layer_id):
            assert self.remote_index_k_with_scale_buffer is not None
            return self.remote_index_k_with_scale_buffer
        return self.index_k_with_scale_buffer[index]

    def get_index_k_buffer(self, layer_id: int) -> Tensor:
        """Plain rows: the layer's ``(size + page_size, 1, index_head_dim)`` keys, as kernels read them (NPU's name)."""
        if self.index.paged:
            raise ValueError(
                f"The {self.index_name!r} pool keeps fp8 index keys and scales in pages: read "
                f"get_index_k_with_scale_buffer (or get_index_k / get_index_k_scale)."
            )
        index = self.local(layer_id)
        if not self.is_owned(layer_id):
            assert self.remote_index_k_buffer is not None
            return self._index_codec.view(self.remote_index_k_buffer)
        return self._index_codec.view(self.index_k_buffer[index])

    def get_index_k_scale_buffer(self, layer_id: int) -> Tensor:
        """Scale rows: the layer's ``(size + page_size, 1)`` fp32 scales, as kernels read them (NPU's name)."""
        self._need_scale_rows("get_index_k_scale_buffer")
        if not self.is_owned(layer_id):
            self.local(layer_id)
            assert self.remote_index_k_scale_buffer is not None
            return self.remote_index_k_scale_buffer
        return self.index_k_scale_buffer[self.local(layer_id)]

    def set_index_k(self, layer_id: int, loc: Tensor, index_k: Tensor) -> None:
        """Store ``(len(loc), index_head_dim)`` index keys: fp8 with fp32 scales (pages: one per 128; scale rows: one
        per token), or cast to the KV dtype (rows without scales)."""
        n = loc.shape[0]
        if tuple(index_k.shape) != (n, self.index_head_dim):
            raise ValueError(
                f"set_index_k(layer {layer_id}): index_k has shape {tuple(index_k.shape)}, "
                f"expected ({n}, {self.index_head_dim})."
            )
        if not self.index.paged and self.index.scale_dtype is None:
            index = self.local(layer_id)
            if self.is_owned(layer_id):
                self.index_k_buffer[index][loc] = self._index_codec.encode(index_k.reshape(n, 1, -1))[0]
            return
        keys, scale = quantize_fp8_blocks(index_k, INDEX_BLOCK if self.index.paged else self.index_head_dim)
        self.set_index_k_and_scale(layer_id, loc, keys, scale)

    def set_index_k_and_scale(self, layer_id: int, loc: Tensor, keys: Tensor, scale: Tensor) -> None:
        """Store fp8 keys ``(n, index_head_dim)`` and fp32 scales at slots ``loc``.

        Scales are ``(n, index_head_dim // 128)`` in pages, ``(n, 1)`` in scale rows (one per token).
        """
        if self.index.scale_dtype is None:
            self._need_paged("set_index_k_and_scale")
        if not self.is_owned(layer_id):
            self.local(layer_id)
            return  # another CP rank owns this layer
        key_bytes = keys.view(torch.uint8) if keys.dtype != torch.uint8 else keys
        if not self.index.paged:
            index = self.local(layer_id)
            self.index_k_buffer[index][loc] = key_bytes.reshape(loc.shape[0], 1, self.index_head_dim)
            self.index_k_scale_buffer[index][loc] = scale.to(torch.float32).reshape(loc.shape[0], 1)
            return
        buffer = self.get_index_k_with_scale_buffer(layer_id)
        pages, key_cols, scale_cols = self._index_columns(loc)
        buffer[pages, key_cols] = key_bytes
        buffer[pages, scale_cols] = scale.to(torch.float32).contiguous().view(torch.uint8)

    def get_index_k(self, layer_id: int, loc: Tensor) -> Tensor:
        """The index keys ``(n, index_head_dim)`` at slots ``loc``: fp8 (pages), or the KV dtype (rows)."""
        if not self.index.paged:
            return self.get_index_k_buffer(layer_id)[loc].reshape(loc.shape[0], self.index_head_dim)
        pages, key_cols, _ = self._index_columns(loc)
        return self.get_index_k_with_scale_buffer(layer_id)[pages, key_cols].view(torch.float8_e4m3fn)

    def get_index_k_scale(self, layer_id: int, loc: Tensor) -> Tensor:
        """The fp32 scales at slots ``loc``: ``(n, index_head_dim // 128)`` (pages) or ``(n, 1)`` (scale rows)."""
        if self.index.scale_dtype is not None:
            return self.get_index_k_scale_buffer(layer_id)[loc]
        self._need_paged("get_index_k_scale")
        pages, _, scale_cols = self._index_columns(loc)
        return self.get_index_k_with_scale_buffer(layer_id)[pages, scale_cols].contiguous().view(torch.float32)

    def get_index_k_dequant(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> Tensor:
        """The index keys at slots ``loc``, dequantised to ``dtype`` (default: the model dtype)."""
        if self.index.scale_dtype is not None:
            keys = self.get_index_k(layer_id, loc).float() * self.get_index_k_scale(layer_id, loc)
            return keys.to(dtype or self.model_dtype)
        if not self.index.paged:
            rows = self.index_k_buffer[self.local(layer_id)] if self.is_owned(layer_id) else self.remote_index_k_buffer
            assert rows is not None
            keys = self._index_codec.decode(rows[loc], None, dtype or self.model_dtype)
            return keys.reshape(loc.shape[0], self.index_head_dim)
        keys = self.get_index_k(layer_id, loc).float().reshape(loc.shape[0], self.index_scales, INDEX_BLOCK)
        values = keys * self.get_index_k_scale(layer_id, loc).unsqueeze(-1)
        return values.reshape(loc.shape[0], self.index_head_dim).to(dtype or self.model_dtype)

    @property
    def _index_codec(self) -> KVCodec:
        """The KV dtype's codec, which plain index rows are stored in (also beside a packed fp8 latent row)."""
        assert not self.index.paged
        return codec_for(self.row.kv)

    def _need_paged(self, method: str) -> None:
        if self.index.paged:
            return
        if self.index.scale_dtype is None:
            raise ValueError(
                f"{method}: the {self.index_name!r} pool keeps index keys as plain rows of {self.index.rows_dtype} "
                f"without scales (the plan's {INDEX_ROWS_PART!r} part): read get_index_k_buffer / get_index_k."
            )
        raise ValueError(
            f"{method}: the {self.index_name!r} pool keeps index keys as plain rows of {self.index.rows_dtype} with "
            f"{self.index.scale_dtype} scale rows beside them (the plan's {INDEX_ROWS_PART!r} and "
            f"{INDEX_SCALES_PART!r} parts): read get_index_k_buffer / get_index_k_scale_buffer."
        )

    def _need_scale_rows(self, method: str) -> None:
        if self.index.scale_dtype is None:
            raise ValueError(
                f"{method}: the {self.index_name!r} pool has no separate index scale rows (the plan has no "
                f"{INDEX_SCALES_PART!r} part): read get_index_k_scale."
            )

    def _index_columns(self, loc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(page, key byte columns, scale byte columns) of every slot: the paged layout, vectorised."""
        if self.index.kpool != 1:
            raise ValueError(
                f"The {self.index_name!r} pool holds pooled index keys (index_kpool {self.index.kpool}, one key per "
                f"{self.index.kpool} tokens, SGLang's IndexerKPool writes them): kvpools allocates them but does not "
                "read or write them per token."
            )
        page = self.page_size
        loc = loc.long()
        pages = (loc // page).unsqueeze(1)
        offset = (loc % page).unsqueeze(1)
        key_cols = offset * self.index_head_dim + torch.arange(self.index_head_dim, device=loc.device)
        scale_bytes = self.index_scales * INDEX_SCALE_BYTES
        scale_cols = page * self.index_head_dim + offset * scale_bytes + torch.arange(scale_bytes, device=loc.device)
        return pages, key_cols, scale_cols


def _tail_geometry(plan: Plan, num_index_layers: int) -> tuple[int, int]:
    """(rows, width) of the kpool-compress tails the plan charged, ``(0, 0)`` without them; refuses other bytes.

    SGLang allocates ``max_running_requests + 1`` rows of ``index_kpool + draft tokens`` per index layer, twice.
    """
    per_request = index_tail_bytes_per_request(plan.model, plan.serving, num_index_layers)
    if not per_request:
        return 0, 0
    rows = plan.max_running_requests + 1
    width = per_request // (2 * num_index_layers * index_head_dim(plan.model) * TAIL_ELEMENT_BYTES)
    check_planned_bytes(
        INDEX_TAIL_POOL,
        rows * per_request,
        plan.pool(INDEX_TAIL_POOL).bytes,
        f"{num_index_layers} layer(s) of 2 x {rows} x {width} bf16 tails",
    )
    return rows, width
