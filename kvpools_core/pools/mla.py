"""The MLA KV pool: SGLang's ``MLATokenToKVPool`` / ``MLATokenToKVPoolFP4`` built from a plan.

Per layer of this rank's pipeline stage one buffer of ``(size + page_size, 1,
kv_cache_dim)`` rows (the first page pads: CUDA-graph dummy tokens write
there), addressed by the model's global layer id.  fp8 is stored as uint8;
fp4 as packed pairs ``(rows, 1, dim / 2)`` plus a ``(rows, dim / 16)`` scale
buffer; DSA's packed fp8 row keeps the latent in fp8 with fp32 block scales
and the rope in bf16 (:func:`pack_fp8_rows`).  A speculative plan's draft
model gets its own pool (``.draft``) of the same row, with its own padding page (under DCP ``dcp`` times the
slots and the page, :func:`~kvpools_core.parts.names.draft_pool_geometry`).

Under DSA's cache layer split a rank owns only some layers: the others get
0-row placeholders and reads of them go through one ``remote`` scratch buffer,
which SGLang fills by broadcast from the owning rank.

The owned layers' rows (role ``latent``) and fp4 scales (``latent_scale``)
are allocated through the build's buffer layout
(:mod:`kvpools_core.pools.layout`; one tensor per layer by default).  The
0-row placeholders hold no memory and the ``remote`` scratch is one buffer
shared by every non-owned layer, not a per-layer buffer, so both are
allocated here directly, whatever the layout.

A plain row (``kv_lora_rank + qk_rope_head_dim`` elements of the KV store
dtype: not fp4, not DSA's packed fp8) declares two column groups, ``nope``
(the latent) and ``rope``, so a layout may store it split
(:data:`~kvpools_core.pools.layout.ColumnSplit`): SGLang's Ascend NPU keeps
them as two tensors, ``k_buffer (…, kv_lora_rank)`` and ``v_buffer (…,
qk_rope_head_dim)``.  Writes and dequantised reads go to each part in place;
:meth:`MLATokenToKVPool.get_nope_rope_buffers` returns both as views either
way; only :meth:`MLATokenToKVPool.get_key_buffer` of a split store (the whole
row) concatenates, a copy of the layer's rows (``rows × row bytes``) made at
every call, which writes to it never reach.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.latent import FP8_BLOCK, LatentRow, MLADims, model_dims
from kvpools_core.parts.names import DRAFT_KV_POOL, KV_POOL, draft_num_layers, draft_pool_geometry
from kvpools_core.pools.host_copy import copy_rows_to_host, load_rows_from_host
from kvpools_core.pools.kv import allocate, check_planned_bytes, tensor_nbytes
from kvpools_core.pools.layout import (
    PER_LAYER,
    BufferLayout,
    BufferRequest,
    LayerBuffer,
    allocate_split_by_layer,
    check_layout_bytes,
)
from kvpools_core.pools.quant import KVCodec, codec_for, fp8_quantize
from kvpools_core.values import Plan

__all__ = [
    "DRAFT_POOL",
    "MAIN_POOL",
    "MLATokenToKVPool",
    "check_latent_bytes",
    "pack_fp8_rows",
    "quantize_fp8_blocks",
    "unpack_fp8_rows",
]

MAIN_POOL = KV_POOL
DRAFT_POOL = DRAFT_KV_POOL
NOPE_GROUP = "nope"
"""The latent columns of a plain row (``kv_lora_rank``): SGLang NPU's ``k_buffer``."""
ROPE_GROUP = "rope"
"""The rope key columns of a plain row (``qk_rope_head_dim``): SGLang NPU's ``v_buffer``."""
_E4M3_MAX = 448.0


class MLATokenToKVPool:
    """The latent rows of every MLA layer of one rank, indexed by token slot and global layer id."""

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
        name: str = MAIN_POOL,
        owned: range | None = None,
        draft: MLATokenToKVPool | None = None,
        layout: BufferLayout | None = None,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.row = row
        self.name = name
        self.start_layer = start_layer
        self.end_layer = start_layer + num_layers
        self.owned = owned
        self.model_dtype = model_dtype
        self.draft = draft
        self.codec: KVCodec | None = None if row.packed_fp8 else codec_for(row.kv)
        self.layout = layout or PER_LAYER
        rows = size + page_size
        data_shape, scale_shape = self._shapes(rows)
        layer_ids = range(self.start_layer, self.end_layer)
        requests = self.latent_requests(
            name=name,
            rows=rows,
            row=row,
            layers=[layer for layer in layer_ids if self.is_owned(layer)],
            page_size=page_size,
            device=device,
        )
        buffers = allocate_split_by_layer(self.layout, requests)
        latent = buffers.get("latent", {})
        # fp4 scales declare no column groups, so the core never lets a layout split them
        scales = {layer: t for layer, t in buffers.get("latent_scale", {}).items() if isinstance(t, Tensor)}
        self.split = any(isinstance(buffer, tuple) for buffer in latent.values())
        """Whether the layout stores the rows split (``nope_buffer`` / ``rope_buffer``) instead of ``kv_buffer``."""
        self.kv_buffer: list[Tensor] = []
        """Whole rows per layer (empty when split)."""
        self.nope_buffer: list[Tensor] = []
        """The latent columns per layer, ``(rows, 1, kv_lora_rank)``, when split (else empty)."""
        self.rope_buffer: list[Tensor] = []
        """The rope columns per layer, ``(rows, 1, qk_rope_head_dim)``, when split (else empty)."""
        for layer in layer_ids:
            buffer: LayerBuffer = (
                latent[layer] if self.is_owned(layer) else self._placeholder(data_shape, device, self.split)
            )
            if isinstance(buffer, tuple):
                nope, rope = buffer
                self.nope_buffer.append(nope)
                self.rope_buffer.append(rope)
            else:
                self.kv_buffer.append(buffer)
        self.kv_scale_buffer = [
            scales[layer] if self.is_owned(layer) else allocate((0, *scale_shape[1:]), torch.uint8, device)
            for layer in layer_ids
            if scale_shape is not None
        ]
        self.remote_kv_buffer = allocate(data_shape, self.store_dtype, device) if owned is not None else None
        self.remote_kv_scale_buffer = (
            allocate(scale_shape, torch.uint8, device) if owned is not None and scale_shape is not None else None
        )
        held = self.kv_buffer or self.nope_buffer
        self.device = torch.device(device) if not held else held[0].device

    @classmethod
    def from_plan(
        cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None
    ) -> MLATokenToKVPool:
        """The pool (and its draft pool) of an MLA plan; refuses, before allocating, bytes the plan did not charge.

        ``layout`` carves the buffers (the ``buffer_layout`` hook's answer; one tensor per layer when None).
        """
        serving = plan.serving
        row = LatentRow(model_dims(plan.model), resolve_kv_dtype(serving.kv_cache_dtype, plan.model.dtype))
        start, end = rank_layer_range(plan.model, serving)
        return cls.from_layers(plan, row, device, start_layer=start, num_layers=end - start, layout=layout)

    @classmethod
    def from_layers(
        cls,
        plan: Plan,
        row: LatentRow,
        device: str | torch.device,
        *,
        start_layer: int,
        num_layers: int,
        pool_name: str = MAIN_POOL,
        layout: BufferLayout | None = None,
    ) -> MLATokenToKVPool:
        """``num_layers`` latent layers addressed from ``start_layer`` and the plan's draft pool, if it has one.

        Architectures that keep latent rows for some layers only (MLA-based linear
        hybrids, addressed by local index) build here too, so the bytes checks and
        the draft's shape live in one place.
        """
        size, page = plan.max_total_num_tokens, plan.serving.page_size
        rows = size + page
        check_latent_bytes(plan, pool_name, row, rows, num_layers)
        drafts = draft_num_layers(plan)
        draft_size, draft_page = draft_pool_geometry(plan, DRAFT_POOL)  # dcp x the target's under DCP
        if drafts is not None:
            check_latent_bytes(plan, DRAFT_POOL, row, draft_size + draft_page, drafts)
        if layout is not None:  # every pool's bytes, before the first tensor
            layer_ids = range(start_layer, start_layer + num_layers)
            requests = cls.latent_requests(
                name=pool_name, rows=rows, row=row, layers=layer_ids, page_size=page, device=device
            )
            if drafts is not None:
                requests += cls.latent_requests(
                    name=DRAFT_POOL,
                    rows=draft_size + draft_page,
                    row=row,
                    layers=range(drafts),
                    page_size=draft_page,
                    device=device,
                )
            check_layout_bytes(layout, requests)
        model_dtype = getattr(torch, plan.model.dtype)

        def make(first: int, num: int, name: str, draft: MLATokenToKVPool | None = None) -> MLATokenToKVPool:
            drafted = name == DRAFT_POOL
            return cls(
                size=draft_size if drafted else size,
                page_size=draft_page if drafted else page,
                row=row,
                start_layer=first,
                num_layers=num,
                device=device,
                model_dtype=model_dtype,
                name=name,
                draft=draft,
                layout=layout,
            )

        draft = make(0, drafts, DRAFT_POOL) if drafts is not None else None
        return make(start_layer, num_layers, pool_name, draft)

    @staticmethod
    def latent_requests(
        *,
        name: str,
        rows: int,
        row: LatentRow,
        layers: Sequence[int],
        page_size: int,
        device: str | torch.device,
    ) -> list[BufferRequest]:
        """What the store asks its layout for: the ``latent`` rows (and fp4's ``latent_scale``) of ``layers``.

        A plain row declares its ``nope`` and ``rope`` column groups (a layout may split it).
        """
        shapes: list[tuple[str, torch.dtype, tuple[int, ...]]]
        groups: tuple[tuple[str, int], ...] = ()
        if row.packed_fp8:
            shapes = [("latent", torch.uint8, (1, row.kv_cache_dim))]
        else:
            codec = codec_for(row.kv)
            dim = row.dims.kv_cache_dim
            shapes = [("latent", codec.store_dtype, codec.data_shape(rows, 1, dim)[1:])]
            scale = codec.scale_shape(rows, 1, dim)
            if scale is not None:
                shapes.append(("latent_scale", torch.uint8, scale[1:]))
            else:  # one element per value: the row's columns are the latent, then the rope
                # (a rope-less latent, GLM5-Next's default qk_rope_head_dim 0, has the latent's columns only)
                widths = ((NOPE_GROUP, row.dims.kv_lora_rank), (ROPE_GROUP, row.dims.qk_rope_head_dim))
                groups = tuple((group, width) for group, width in widths if width)
        device = torch.device(device)
        return [
            BufferRequest(
                pool=name,
                role=role,
                rows=rows,
                page_size=page_size,
                layers=layers,
                row_shape=row_shape,
                dtype=dtype,
                device=device,
                column_groups=groups if role == "latent" else (),
            )
            for role, dtype, row_shape in shapes
        ]

    @staticmethod
    def planned_nbytes(rows: int, row: LatentRow, num_layers: int) -> int:
        """Bytes of ``num_layers`` latent buffers of ``rows`` rows, from their shapes (nothing is allocated)."""
        if row.packed_fp8:
            return rows * row.kv_cache_dim * num_layers  # uint8
        codec = codec_for(row.kv)
        item = torch.empty((), dtype=codec.store_dtype).element_size()
        dim = row.dims.kv_cache_dim
        data = math.prod(codec.data_shape(rows, 1, dim)) * item
        scale = codec.scale_shape(rows, 1, dim)
        return (data + (math.prod(scale) if scale is not None else 0)) * num_layers

    # -- what it is ----------------------------------------------------------

    @property
    def dims(self) -> MLADims:
        return self.row.dims

    @property
    def kv_lora_rank(self) -> int:
        return self.row.dims.kv_lora_rank

    @property
    def qk_rope_head_dim(self) -> int:
        return self.row.dims.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        return self.row.kv_cache_dim

    @property
    def dtype(self) -> torch.dtype:
        """The KV dtype (``torch.bfloat16``, ``torch.float8_e4m3fn``, ``torch.float4_e2m1fn_x2``, ...)."""
        return torch.float8_e4m3fn if self.codec is None else self.codec.dtype

    @property
    def store_dtype(self) -> torch.dtype:
        return torch.uint8 if self.codec is None else self.codec.store_dtype

    @property
    def layer_num(self) -> int:
        return self.end_layer - self.start_layer

    def is_owned(self, layer_id: int) -> bool:
        """Whether this rank stores ``layer_id`` (always, unless the cache layer split is on)."""
        return self.owned is None or layer_id in self.owned

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor held, the draft pool's included, measured from the tensors."""
        return sum(self.nbytes_by_pool().values())

    def nbytes_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name: ``kv`` and, with a draft, ``draft_kv``."""
        measured = self._own_nbytes_by_pool()
        if self.draft is not None:
            measured.update(self.draft.nbytes_by_pool())
        return measured

    def get_kv_size_bytes(self) -> int:
        """Bytes of this pool's buffers (draft excluded), as SGLang's ``get_kv_size_bytes``."""
        return sum(self._own_nbytes_by_pool().values())

    def latent_nbytes(self) -> int:
        """Bytes of the latent buffers: rows (whole or split), scales and the remote scratch."""
        remote = [t for t in (self.remote_kv_buffer, self.remote_kv_scale_buffer) if t is not None]
        return tensor_nbytes(self.kv_buffer, self.nope_buffer, self.rope_buffer, self.kv_scale_buffer, remote)

    def _own_nbytes_by_pool(self) -> dict[str, int]:
        return {self.name: self.latent_nbytes()}

    # -- buffers ---------------------------------------------------------------

    def get_key_buffer(self, layer_id: int) -> Tensor:
        """Layer ``layer_id``'s rows as kernels read them (fp8 views of uint8; packed uint8 for fp4).

        A split store concatenates its two parts: a copy of the layer (writes to it are lost), made at each call;
        read :meth:`get_nope_rope_buffers` instead.
        """
        data = self._data(layer_id)
        if isinstance(data, tuple):
            data = torch.cat(data, dim=-1)
        return self._view(data)

    def get_value_buffer(self, layer_id: int) -> Tensor:
        """The latent part of the rows (``[..., :kv_lora_rank]``; packed fp4: its bytes); a view, split or not."""
        data = self._data(layer_id)
        if isinstance(data, tuple):
            return self._view(data[0])
        width = self.kv_lora_rank // 2 if self.row.kv.is_fp4 else self.kv_lora_rank
        return self._view(data)[..., :width]

    def get_nope_rope_buffers(self, layer_id: int) -> tuple[Tensor, Tensor]:
        """Views of the layer's latent ``(rows, 1, kv_lora_rank)`` and rope ``(rows, 1, qk_rope_head_dim)`` columns.

        SGLang NPU's ``get_kv_buffer`` (``k_buffer``, ``v_buffer``); on a whole-row store, slices of the rows.
        Plain rows only (not fp4, not DSA's packed fp8 row).
        """
        if not self.plain_row:
            raise ValueError(
                f"The {self.name!r} pool stores {self.row.kv.name} rows{' packed' if self.row.packed_fp8 else ''}: "
                f"they have no separate latent and rope columns; read get_key_buffer."
            )
        data = self._data(layer_id)
        if isinstance(data, tuple):
            return self._view(data[0]), self._view(data[1])
        rows = self._view(data)
        return rows[..., : self.kv_lora_rank], rows[..., self.kv_lora_rank :]

    @property
    def plain_row(self) -> bool:
        """Whether a row is ``kv_lora_rank + qk_rope_head_dim`` elements (not fp4, not packed): it may be split."""
        return self.codec is not None and self.codec.scale_shape(1, 1, self.dims.kv_cache_dim) is None

    def get_kv_buffer(self, layer_id: int) -> tuple[Tensor, Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_scale_buffer(self, layer_id: int) -> Tensor:
        """fp4: the ``(rows, kv_cache_dim // 16)`` e4m3 scale bytes of the layer."""
        if not self.kv_scale_buffer:
            raise ValueError(f"The {self.name!r} pool stores {self.row.kv.name} rows without a scale buffer.")
        index = self.local(layer_id)
        if not self.is_owned(layer_id):
            assert self.remote_kv_scale_buffer is not None
            return self.remote_kv_scale_buffer
        return self.kv_scale_buffer[index]

    # -- writes and reads ----------------------------------------------------

    def set_kv_buffer(self, layer_id: int, loc: Tensor, cache_k: Tensor, cache_v: Tensor | None = None) -> None:
        """Store whole rows ``(len(loc), 1, kv_lora_rank + qk_rope_head_dim)``; ``cache_v`` is ignored.

        MLA's V is the latent part of K, as SGLang's ``MLATokenToKVPool.set_kv_buffer``.
        """
        index = self.local(layer_id)
        if self.codec is None:
            raise ValueError(
                f"The {self.name!r} pool stores DSA's packed fp8 row: write latent and rope separately with "
                f"set_mla_kv_buffer(layer_id, loc, k_nope, k_rope)."
            )
        self._check_shape(layer_id, "K", cache_k, loc, self.dims.kv_cache_dim)
        if not self.is_owned(layer_id):
            return  # another CP rank owns this layer
        data, scale = self.codec.encode(cache_k)
        if self.split:
            self.nope_buffer[index][loc] = data[..., : self.kv_lora_rank]
            self.rope_buffer[index][loc] = data[..., self.kv_lora_rank :]
            return
        self.kv_buffer[index][loc] = data
        if scale is not None:
            self.kv_scale_buffer[index][loc] = scale

    def set_mla_kv_buffer(self, layer_id: int, loc: Tensor, k_nope: Tensor, k_rope: Tensor) -> None:
        """Store the latent ``(n, 1, kv_lora_rank)`` and rope ``(n, 1, qk_rope_head_dim)`` parts of ``n`` rows."""
        self._check_shape(layer_id, "k_nope", k_nope, loc, self.kv_lora_rank)
        self._check_shape(layer_id, "k_rope", k_rope, loc, self.qk_rope_head_dim)
        if self.split:  # each part into its own tensor, no concatenation: plain rows' codecs are elementwise
            assert self.codec is not None
            index = self.local(layer_id)
            if self.is_owned(layer_id):  # the rope cast as the whole-row path casts it, so both store the same bits
                self.nope_buffer[index][loc] = self.codec.encode(k_nope)[0]
                self.rope_buffer[index][loc] = self.codec.encode(k_rope.to(k_nope.dtype))[0]
            return
        if self.codec is not None:
            self.set_kv_buffer(layer_id, loc, torch.cat((k_nope, k_rope.to(k_nope.dtype)), dim=-1))
            return
        index = self.local(layer_id)
        if self.is_owned(layer_id):
            self.kv_buffer[index][loc] = pack_fp8_rows(k_nope, k_rope)

    def get_mla_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """The latent and rope parts at slots ``loc``, dequantised to ``dtype`` (default: the model dtype)."""
        out = dtype or self.model_dtype
        stored = self._data(layer_id)
        if isinstance(stored, tuple):
            assert self.codec is not None
            nope, rope = stored
            return self.codec.decode(nope[loc], None, out), self.codec.decode(rope[loc], None, out)
        data = stored[loc]
        if self.codec is None:
            return unpack_fp8_rows(data, self.dims, out)
        scale = self.get_scale_buffer(layer_id)[loc] if self.kv_scale_buffer else None
        rows = self.codec.decode(data, scale, out)
        return rows[..., : self.kv_lora_rank], rows[..., self.kv_lora_rank :]

    # -- helpers -------------------------------------------------------------

    def local(self, layer_id: int) -> int:
        """Index of a global layer id in this pool's buffers; a clear error for a layer held elsewhere."""
        index = layer_id - self.start_layer
        if not 0 <= index < self.layer_num:
            raise IndexError(
                f"Layer {layer_id} is not in the {self.name!r} pool: it holds layers "
                f"[{self.start_layer}, {self.end_layer}) (global ids; another pipeline stage holds the rest)."
            )
        return index

    def _data(self, layer_id: int) -> Tensor | tuple[Tensor, Tensor]:
        """The layer's whole rows, or its ``(nope, rope)`` parts when split."""
        index = self.local(layer_id)
        if not self.is_owned(layer_id):
            assert self.remote_kv_buffer is not None
            return self.remote_kv_buffer  # SGLang broadcasts the owner's rows into it before reading
        if self.split:
            return self.nope_buffer[index], self.rope_buffer[index]
        return self.kv_buffer[index]

    def _placeholder(self, data_shape: tuple[int, ...], device: str | torch.device, split: bool) -> LayerBuffer:
        """A non-owned layer's 0 rows (no memory), in the owned layers' form."""
        if not split:
            return allocate((0, *data_shape[1:]), self.store_dtype, device)
        return tuple(
            allocate((0, *data_shape[1:-1], width), self.store_dtype, device)
            for width in (self.kv_lora_rank, self.qk_rope_head_dim)
        )

    def _view(self, data: Tensor) -> Tensor:
        return data.view(torch.float8_e4m3fn) if self.codec is None else self.codec.view(data)

    def _shapes(self, rows: int) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
        if self.codec is None:
            return (rows, 1, self.row.kv_cache_dim), None
        dim = self.dims.kv_cache_dim
        return self.codec.data_shape(rows, 1, dim), self.codec.scale_shape(rows, 1, dim)

    def _check_shape(self, layer_id: int, what: str, value: Tensor, loc: Tensor, dim: int) -> None:
        n = loc.shape[0]
        if tuple(value.shape) != (n, 1, dim):
            raise ValueError(
                f"set_kv_buffer(layer {layer_id}): {what} has shape {tuple(value.shape)}, "
                f"expected ({n}, 1, {dim}) for {n} slot(s)."
            )

    # -- host copies (retraction) ------------------------------------------------

    def get_cpu_copy(self, indices: Tensor) -> dict[str, object]:
        """The latent rows (and scales) of slots ``indices`` in every layer this rank stores, and the draft
        pool's, in host memory: SGLang's ``get_cpu_copy`` (``memory_pool.py`` L2791, per layer in chunks of 8,192
        slots); opaque to the caller, who hands it back to :meth:`load_cpu_copy`."""
        return {
            "kv": copy_rows_to_host(self._row_buffers(), indices),
            "draft": None if self.draft is None else self.draft.get_cpu_copy(indices),
        }

    def load_cpu_copy(self, kv_cache_cpu: dict[str, Any], indices: Tensor) -> None:
        """Write a :meth:`get_cpu_copy` result into slots ``indices`` (the resumed request's new slots)."""
        load_rows_from_host(self._row_buffers(), kv_cache_cpu["kv"], indices)
        if self.draft is not None:
            self.draft.load_cpu_copy(kv_cache_cpu["draft"], indices)

    def _row_buffers(self) -> list[Tensor]:
        """The row buffers of the layers this rank stores (others hold 0-row placeholders)."""
        owned = [i for i, layer in enumerate(range(self.start_layer, self.end_layer)) if self.is_owned(layer)]
        groups = (self.kv_buffer, self.nope_buffer, self.rope_buffer, self.kv_scale_buffer)
        return [group[i] for group in groups if group for i in owned]

    def __repr__(self) -> str:
        draft = f", draft={self.draft.layer_num} layers" if self.draft is not None else ""
        split = f", owned={self.owned.start}..{self.owned.stop - 1}" if self.owned is not None else ""
        return (
            f"{type(self).__name__}(size={self.size}, page_size={self.page_size}, kv={self.row.kv.name}, "
            f"row={self.row.row_bytes} B, layers=[{self.start_layer}, {self.end_layer}){split}, "
            f"device={self.device}{draft})"
        )


def check_latent_bytes(plan: Plan, pool: str, row: LatentRow, rows: int, num_layers: int) -> None:
    """Refuse to build latent buffers whose bytes differ from the plan's ``pool``."""
    check_planned_bytes(
        pool,
        MLATokenToKVPool.planned_nbytes(rows, row, num_layers),
        plan.pool(pool).bytes,
        f"{num_layers} layer(s) of {row.row_bytes} B rows ({row.kv.name}), {rows} rows",
    )


def pack_fp8_rows(k_nope: Tensor, k_rope: Tensor) -> Tensor:
    """DSA's packed fp8 rows ``(n, 1, R + R/128*4 + r*2)`` uint8: fp8 latent, fp32 block scales, bf16 rope.

    Each block of 128 latent values is divided by ``amax / 448`` (its fp32
    scale, 1 for an all-zero block) and saturated to e4m3, as FlashMLA's
    ``quantize_k_cache`` does.
    """
    n, _one, rank = k_nope.shape
    latent, scale = quantize_fp8_blocks(k_nope.reshape(n, rank))
    rope = k_rope.reshape(n, -1).to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat((latent.view(torch.uint8), scale.view(torch.uint8), rope), dim=-1).reshape(n, 1, -1)


def quantize_fp8_blocks(x: Tensor, block: int = FP8_BLOCK) -> tuple[Tensor, Tensor]:
    """``(n, dim)`` → e4m3 values ``(n, dim)`` and one fp32 scale per ``block`` values ``(n, dim // block)``.

    The scale is the block's ``amax / 448`` (1 for an all-zero block), so no value saturates.
    """
    n, dim = x.shape
    blocks = x.float().reshape(n, dim // block, block)
    scale = blocks.abs().amax(-1) / _E4M3_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = fp8_quantize(blocks / scale.unsqueeze(-1), torch.float8_e4m3fn).reshape(n, dim)
    return values, scale.contiguous()


def unpack_fp8_rows(rows: Tensor, dims: MLADims, out_dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Inverse of :func:`pack_fp8_rows`: ``(latent (n, 1, R), rope (n, 1, r))`` in ``out_dtype``."""
    n = rows.shape[0]
    flat = rows.reshape(n, -1)
    rank, rope_dim = dims.kv_lora_rank, dims.qk_rope_head_dim
    scales = rank // FP8_BLOCK
    latent = flat[:, :rank].contiguous().view(torch.float8_e4m3fn).float().reshape(n, scales, FP8_BLOCK)
    scale = flat[:, rank : rank + scales * 4].contiguous().view(torch.float32)
    rope = flat[:, rank + scales * 4 :].contiguous().view(torch.bfloat16)
    nope = (latent * scale.unsqueeze(-1)).reshape(n, 1, rank)
    return nope.to(out_dtype), rope.reshape(n, 1, rope_dim).to(out_dtype)
