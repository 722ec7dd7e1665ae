"""ROCm AITER's vectorized 5-d KV layout (SGLang's ``SGLANG_AITER_KV_CACHE_LAYOUT=vectorized_5d``) for the MHA store.

SGLang's ``MHATokenToKVPool._create_buffers`` on HIP with that layout
(reference ``sglang-pools.md`` §1.3) allocates, per layer, with ``X = 16 //
store_dtype.itemsize`` elements per 16-byte vector and ``num_blocks = (size +
page_size) // page_size``:

* K ``(num_blocks, H, D // X, page_size, X)``: a page's keys, ``X`` dims of
  one token contiguous, tokens next;
* V ``(num_blocks, H, page_size // X, Dv, X)``: ``X`` tokens of one value dim
  contiguous;

and asserts ``page_size % X == 0``, ``D % X == 0``, ``Dv % X == 0``.  Token slot
``loc`` is row ``loc`` of the canonical ``(size + page_size, H, D)`` buffer:
block ``b = loc // page_size``, offset ``o = loc % page_size``; ``K[loc, h, d]``
is ``k5[b, h, d // X, o, d % X]`` and ``V[loc, h, e]`` is ``v5[b, h, o // X, e,
o % X]``.  No ``(rows, H, D)`` view of either exists, so :class:`AiterVectorizedLayout`
returns the MHA store's ``k`` / ``v`` (its ``row_indexed_ok`` requests) as
:class:`~kvpools_core.pools.layout.RowIndexedBuffer` s over those tensors and
carves every other request as the core does without it: one tensor per layer,
canonical (SGLang's HIP MLA, DSA and scale buffers), and the hybrid models'
recurrent state (roles ``conv``, ``conv_window_first``, ``ssm``) one ``(layers,
slots, *row)`` tensor per kind (SGLang's ``MambaPool`` on HIP as on CUDA).  The bytes are the
per-layer layout's (``(size + page_size) x H x D x itemsize`` per layer), so
plans are exact as they are.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from kvpools_core.errors import InvalidValueError, PoolPlanMismatchError
from kvpools_core.options import option
from kvpools_core.pools.layout import (
    LAYER_MAJOR,
    PER_LAYER,
    BufferLayout,
    BufferRequest,
    LayoutBuffer,
    RowIndexedBuffer,
    allocate,
)
from kvpools_rocm.layout_names import KV_CACHE_LAYOUT_OPTION, VECTOR_BYTES, VECTORIZED_5D

__all__ = ["AITER_VECTORIZED_LAYOUT", "AiterVectorizedLayout", "key_buffer_5d", "value_buffer_5d"]

KEY_ROLE = "k"
VALUE_ROLE = "v"
STATE_ROLES = frozenset({"conv", "conv_window_first", "ssm"})
"""The recurrent state's roles (``plugins/mamba``): one tensor per kind, as the core carves them by default."""


class AiterVectorizedLayout(BufferLayout):
    """AITER's vectorized 5-d K / V per layer, as row-indexed buffers; every other request as the core carves it."""

    name = VECTORIZED_5D

    def nbytes(self, request: BufferRequest) -> int:
        """SGLang's bytes: whole blocks of ``page_size`` rows for K / V (``(size + page) // page`` of them)."""
        if not _vectorized(request):
            return request.nbytes
        blocks = request.rows // request.page_size
        return blocks * request.page_size * math.prod(request.row_shape) * request.dtype.itemsize * request.num_layers

    def allocate(self, request: BufferRequest) -> list[LayoutBuffer]:
        if not _vectorized(request):
            core = LAYER_MAJOR if request.role in STATE_ROLES else PER_LAYER
            return list(core.allocate(request))
        _check_geometry(request)
        make = key_buffer_5d if request.role == KEY_ROLE else value_buffer_5d
        return [make(request) for _ in request.layers]


AITER_VECTORIZED_LAYOUT = AiterVectorizedLayout()


def vector_width(dtype: torch.dtype) -> int:
    """``X = 16 // store_dtype.itemsize``: the elements of one 16-byte vector."""
    return VECTOR_BYTES // dtype.itemsize


def key_buffer_5d(request: BufferRequest) -> RowIndexedBuffer:
    """One layer's zeroed K ``(blocks, H, D // X, page, X)``; ``K[loc, h, d]`` is ``k5[b, h, d // X, o, d % X]``."""
    heads, dim = request.row_shape
    page, x = request.page_size, vector_width(request.dtype)
    native = allocate((request.rows // page, heads, dim // x, page, x), request.dtype, request.device)

    def locate(rows: Tensor) -> tuple[Any, ...]:  # native[b, :, :, o, :] -> (n, H, D // X, X)
        return rows // page, slice(None), slice(None), rows % page, slice(None)

    return RowIndexedBuffer(native, request.shape, locate, (heads, dim // x, x))


def value_buffer_5d(request: BufferRequest) -> RowIndexedBuffer:
    """One layer's zeroed V ``(blocks, H, page // X, Dv, X)``; ``V[loc, h, e]`` is ``v5[b, h, o // X, e, o % X]``."""
    heads, dim = request.row_shape
    page, x = request.page_size, vector_width(request.dtype)
    native = allocate((request.rows // page, heads, page // x, dim, x), request.dtype, request.device)

    def locate(rows: Tensor) -> tuple[Any, ...]:  # native[b, :, o // X, :, o % X] -> (n, H, Dv)
        offsets = rows % page
        return rows // page, slice(None), offsets // x, slice(None), offsets % x

    return RowIndexedBuffer(native, request.shape, locate, (heads, dim))


def _vectorized(request: BufferRequest) -> bool:
    """The MHA store's K / V: the requests SGLang's ``MHATokenToKVPool`` allocates 5-d and the store reads by row."""
    return request.row_indexed_ok and request.role in (KEY_ROLE, VALUE_ROLE)


def _check_geometry(request: BufferRequest) -> None:
    """SGLang's asserts (the ``validate`` hook refuses them at planning; a hand-made pool meets them here)."""
    if len(request.row_shape) != 2:
        raise InvalidValueError(
            f"{_option_text()}: AITER's 5-d layout stores (heads, dim) rows, but the {request.describe()} has rows of "
            f"{request.row_shape}; use {KV_CACHE_LAYOUT_OPTION}=nhd for this pool."
        )
    page, dim, x = request.page_size, request.row_shape[1], vector_width(request.dtype)
    if page % x or dim % x:
        raise InvalidValueError(
            f"{_option_text()}: AITER's 5-d layout needs page_size ({page}) and the head dim ({dim}) of the "
            f"{request.describe()} to be multiples of X = 16 // itemsize = {x} (SGLang asserts it); use "
            f"{option('page_size')} a multiple of {x}, or {KV_CACHE_LAYOUT_OPTION}=nhd."
        )
    if request.rows % page:
        raise PoolPlanMismatchError(
            f"{_option_text()}: AITER's 5-d layout allocates whole blocks of {page} rows, but the "
            f"{request.describe()} has {request.rows} rows, bytes the plan would not charge; plan the pool in whole "
            f"pages, or use {KV_CACHE_LAYOUT_OPTION}=nhd."
        )


def _option_text() -> str:
    return f"{option('plugin_options')} {KV_CACHE_LAYOUT_OPTION}={VECTORIZED_5D}"
