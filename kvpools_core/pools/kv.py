"""Token-indexed K/V buffers of a range of layers, addressed by global layer id.

:class:`LayerKV` is the storage every attention pool is made of: one K and
one V tensor per layer (plus scale tensors for block-scaled dtypes), each with
``rows`` token slots, laid out ``(rows, heads, dim)`` as SGLang's NHD layout.
Layer ids are the model's (a pipeline stage holding layers ``[16, 32)``
answers ``get_key_buffer(16)``); ``end_layer`` is exclusive, like
:func:`kvpools_core.parallel.rank_layer_range` (SGLang's ``KVCache.end_layer``
is inclusive).

The buffers are allocated through a :class:`~kvpools_core.pools.layout.BufferLayout`
(one request per role — ``k``, ``v``, ``k_scale``, ``v_scale`` — and row shape):
one tensor per layer by default, or however the build's platform carves them;
reads and writes stay here, on the per-layer views.  K and V are only ever
addressed by row index, so their requests are ``row_indexed_ok``: a layout may
hand them :class:`~kvpools_core.pools.layout.RowIndexedBuffer` s (rows permuted
within a native tensor, ROCm AITER's vectorized 5-d K / V), which the writes
and reads below index like tensors; ``get_key_buffer`` then returns the native
tensor, what kernels read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

import torch
from torch import Tensor

from kvpools_core.errors import PoolPlanMismatchError
from kvpools_core.parts.attention import LayerGeometry
from kvpools_core.pools.host_copy import copy_rows_to_host, load_rows_from_host
from kvpools_core.pools.layout import (
    PER_LAYER,
    BufferLayout,
    BufferRequest,
    RowBuffer,
    RowIndexedBuffer,
    allocate,
    allocate_rows_by_layer,
)
from kvpools_core.pools.quant import KVCodec

__all__ = ["LayerGeometry", "LayerKV", "PoolPlanMismatchError", "allocate", "check_planned_bytes", "tensor_nbytes"]


class LayerKV:
    """K and V (and their scales) of layers ``[start_layer, start_layer + len(layers))`` in one KV dtype."""

    def __init__(
        self,
        *,
        rows: int,
        layers: Sequence[LayerGeometry],
        start_layer: int,
        codec: KVCodec,
        device: str | torch.device,
        read_dtype: torch.dtype,
        name: str = "kv",
        page_size: int = 1,
        layout: BufferLayout | None = None,
    ) -> None:
        self.name = name
        self.rows = rows
        self.layers = tuple(layers)
        self.start_layer = start_layer
        self.end_layer = start_layer + len(self.layers)
        self.codec = codec
        self.read_dtype = read_dtype
        self.layout = layout or PER_LAYER
        requests = self.buffer_requests(
            name=name,
            rows=rows,
            layers=self.layers,
            start_layer=start_layer,
            codec=codec,
            device=device,
            page_size=page_size,
        )
        buffers = allocate_rows_by_layer(self.layout, requests)
        ids = range(start_layer, self.end_layer)

        def per_layer(role: str) -> list[RowBuffer]:
            by_id = buffers.get(role)
            return [by_id[i] for i in ids] if by_id else []

        self.k_buffer = per_layer("k")
        """Per layer, the K rows: a ``(rows, heads, dim)`` tensor, or a row-indexed buffer (see the module)."""
        self.v_buffer = per_layer("v")
        # scale requests are not row_indexed_ok, so the core gave them tensors (a row-indexed one is refused)
        self.k_scale_buffer = cast("list[Tensor]", per_layer("k_scale"))
        self.v_scale_buffer = cast("list[Tensor]", per_layer("v_scale"))
        self.device = torch.device(device) if not self.k_buffer else self.k_buffer[0].device

    @staticmethod
    def buffer_requests(
        *,
        name: str,
        rows: int,
        layers: Sequence[LayerGeometry],
        start_layer: int,
        codec: KVCodec,
        device: str | torch.device,
        page_size: int = 1,
    ) -> list[BufferRequest]:
        """What :class:`LayerKV` asks its layout for: per role, one request per row shape (alike layers share one)."""
        device = torch.device(device)
        # (role, dtype, row shape of a layer, row_indexed_ok): K / V are read and written by row index only
        roles: list[tuple[str, torch.dtype, Callable[[LayerGeometry], tuple[int, ...]], bool]] = [
            ("k", codec.store_dtype, lambda g: codec.data_shape(rows, g.heads, g.head_dim), True),
            ("v", codec.store_dtype, lambda g: codec.data_shape(rows, g.heads, g.v_head_dim), True),
        ]
        if codec.scale_block is not None:
            roles += [
                ("k_scale", torch.uint8, lambda g: _scale_shape(codec, rows, g.heads, g.head_dim), False),
                ("v_scale", torch.uint8, lambda g: _scale_shape(codec, rows, g.heads, g.v_head_dim), False),
            ]
        by_geometry: dict[LayerGeometry, list[int]] = {}
        for i, g in enumerate(layers):
            by_geometry.setdefault(g, []).append(start_layer + i)
        requests = []
        for role, dtype, shape_of, row_indexed_ok in roles:
            groups: dict[tuple[int, ...], list[int]] = {}
            for g, ids in by_geometry.items():
                groups.setdefault(shape_of(g)[1:], []).extend(ids)
            requests += [
                BufferRequest(
                    pool=name,
                    role=role,
                    rows=rows,
                    page_size=page_size,
                    layers=sorted(ids),
                    row_shape=row_shape,
                    dtype=dtype,
                    device=device,
                    row_indexed_ok=row_indexed_ok,
                )
                for row_shape, ids in groups.items()
            ]
        return requests

    @staticmethod
    def planned_nbytes(rows: int, layers: Sequence[LayerGeometry], codec: KVCodec) -> int:
        """The bytes :class:`LayerKV` would allocate, from shapes alone (nothing is allocated)."""
        item = torch.empty((), dtype=codec.store_dtype).element_size()
        total = 0
        for g in layers:
            for dim in (g.head_dim, g.v_head_dim):
                total += _numel(codec.data_shape(rows, g.heads, dim)) * item
                scale = codec.scale_shape(rows, g.heads, dim)
                total += _numel(scale) if scale is not None else 0
        return total

    # -- sizes ---------------------------------------------------------------

    @property
    def layer_num(self) -> int:
        return len(self.layers)

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor held, measured from the tensors."""
        return tensor_nbytes(self.k_buffer, self.v_buffer, self.k_scale_buffer, self.v_scale_buffer)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(K bytes, V bytes)``, scales included, as SGLang's ``get_kv_size_bytes``."""
        return tensor_nbytes(self.k_buffer, self.k_scale_buffer), tensor_nbytes(self.v_buffer, self.v_scale_buffer)

    # -- buffers -------------------------------------------------------------

    def local(self, layer_id: int) -> int:
        """Index of a global layer id in this pool's buffers; a clear error for a layer held elsewhere."""
        index = layer_id - self.start_layer
        if not 0 <= index < len(self.layers):
            raise IndexError(
                f"Layer {layer_id} is not in the {self.name!r} pool: it holds layers "
                f"[{self.start_layer}, {self.end_layer}) (global ids; another pipeline stage holds the rest)."
            )
        return index

    def get_key_buffer(self, layer_id: int) -> Tensor:
        """Layer ``layer_id``'s K as kernels read it: the ``(rows, heads, dim)`` view, or a row-indexed
        buffer's native tensor (AITER's 5-d K, as SGLang's ``get_key_buffer`` returns it); rows: ``k_buffer``."""
        return self.codec.view(_native(self.k_buffer[self.local(layer_id)]))

    def get_value_buffer(self, layer_id: int) -> Tensor:
        return self.codec.view(_native(self.v_buffer[self.local(layer_id)]))

    def get_key_scale_buffer(self, layer_id: int) -> Tensor:
        return self._scales(self.k_scale_buffer, layer_id)

    def get_value_scale_buffer(self, layer_id: int) -> Tensor:
        return self._scales(self.v_scale_buffer, layer_id)

    # -- writes and reads ----------------------------------------------------

    def set_kv_buffer(self, layer_id: int, loc: Tensor, cache_k: Tensor, cache_v: Tensor) -> None:
        """Store ``(len(loc), heads, dim)`` K and V at slots ``loc``, quantising to the pool's dtype."""
        i = self.local(layer_id)
        g = self.layers[i]
        n = loc.shape[0]
        for what, value, dim in (("K", cache_k, g.head_dim), ("V", cache_v, g.v_head_dim)):
            if tuple(value.shape) != (n, g.heads, dim):
                raise ValueError(
                    f"set_kv_buffer(layer {layer_id}): {what} has shape {tuple(value.shape)}, "
                    f"expected ({n}, {g.heads}, {dim}) for {n} slot(s)."
                )
        k_data, k_scale = self.codec.encode(cache_k)
        v_data, v_scale = self.codec.encode(cache_v)
        self.k_buffer[i][loc] = k_data
        self.v_buffer[i][loc] = v_data
        if k_scale is not None and v_scale is not None:
            self.k_scale_buffer[i][loc] = k_scale
            self.v_scale_buffer[i][loc] = v_scale

    def get_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """K and V at slots ``loc``, dequantised to ``dtype`` (default: the model dtype)."""
        i = self.local(layer_id)
        out = dtype or self.read_dtype
        k_scale = self.k_scale_buffer[i][loc] if self.k_scale_buffer else None
        v_scale = self.v_scale_buffer[i][loc] if self.v_scale_buffer else None
        return self.codec.decode(self.k_buffer[i][loc], k_scale, out), self.codec.decode(
            self.v_buffer[i][loc], v_scale, out
        )

    # -- host copies (retraction) ---------------------------------------------

    def get_cpu_copy(self, indices: Tensor) -> list[list[Tensor]]:
        """Rows ``indices`` of every K, V and scale buffer, copied to host memory (SGLang's ``get_cpu_copy``)."""
        return copy_rows_to_host(self.row_buffers(), indices)

    def load_cpu_copy(self, kv_cache_cpu: list[list[Tensor]], indices: Tensor) -> None:
        """Write a :meth:`get_cpu_copy` result into rows ``indices`` (SGLang's ``load_cpu_copy``)."""
        load_rows_from_host(self.row_buffers(), kv_cache_cpu, indices)

    def row_buffers(self) -> list[RowBuffer]:
        """Every row-indexed buffer held, layer by layer: K, V, then the scales."""
        return [*self.k_buffer, *self.v_buffer, *self.k_scale_buffer, *self.v_scale_buffer]

    def _scales(self, buffers: list[Tensor], layer_id: int) -> Tensor:
        i = self.local(layer_id)
        if not buffers:
            raise ValueError(f"The {self.name!r} pool stores {self.codec.dtype} without scales.")
        return buffers[i]


def check_planned_bytes(pool: str, allocating: int, planned: int, detail: str) -> None:
    """Refuse to build a pool whose shapes disagree with the plan's ``PoolSpec.bytes``."""
    if allocating != planned:
        raise PoolPlanMismatchError(
            f"The {pool!r} pool would allocate {allocating} B but the plan charges {planned} B "
            f"({detail}). The plan and the pool builder disagree: re-plan with this kvpools version, "
            f"or report it as a bug of the plugin that sized the pool."
        )


def tensor_nbytes(*groups: Sequence[Tensor | RowIndexedBuffer]) -> int:
    """Bytes of every tensor in the groups (works on ``meta``: shapes times element size; native bytes of
    row-indexed buffers)."""
    return sum(t.numel() * t.element_size() for group in groups for t in group)


def _native(buffer: RowBuffer) -> Tensor:
    return buffer.native if isinstance(buffer, RowIndexedBuffer) else buffer


def _scale_shape(codec: KVCodec, rows: int, heads: int, dim: int) -> tuple[int, ...]:
    shape = codec.scale_shape(rows, heads, dim)
    assert shape is not None
    return shape


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for size in shape:
        total *= size
    return total
