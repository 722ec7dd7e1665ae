"""How each ``--kv-cache-dtype`` is stored: buffer shapes, quantised writes, dequantised reads.

One :class:`KVCodec` per KV dtype, chosen by :func:`codec_for`:

* ``bf16`` / ``fp16`` / ``fp32`` — stored natively; writes cast, reads cast.
* ``fp8_e4m3`` / ``fp8_e5m2`` — stored as ``uint8`` (``index_put`` is not
  implemented for fp8 tensors) with a per-tensor scale of 1, as SGLang without
  ``k_scale``; writes saturate to the format's finite range (torch's cast
  would give ``inf`` for e5m2) and round to nearest even.
* ``fp4_e2m1`` — NVFP4-style: two e2m1 values per byte (the even element in
  the low nibble, as ``__nv_fp4x2``) and one scale byte per 16 values.  The
  scale byte is an ``fp8_e4m3`` number, ``amax / 6`` rounded *up* to the next
  e4m3 value so no value of a block clips.  A block whose ``amax`` exceeds
  ``6 * 448 = 2688`` saturates (NVFP4 adds a per-tensor global scale for that,
  which kvpools, like SGLang without ``k_scale``, fixes at 1).  Each value
  rounds to the nearest point of the grid {0, 0.5, 1, 1.5, 2, 3, 4, 6} x sign
  (ties toward zero).
* ``mxfp8`` — OCP MX: ``fp8_e4m3`` data and one e8m0 scale byte (``2**(b -
  127)``) per 32 values, the scale the smallest power of two that keeps the
  block within e4m3's 448 (no clipping).

Every function is vectorised over tokens, heads and blocks; none runs on
``meta`` tensors beyond shapes (a meta pool only allocates).
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import Tensor

from kvpools_core.dtypes import KVDtype

__all__ = [
    "FP4_BLOCK",
    "MXFP8_BLOCK",
    "Fp4Codec",
    "Fp8Codec",
    "KVCodec",
    "MXFp8Codec",
    "NativeCodec",
    "codec_for",
    "fp4_dequantize",
    "fp4_quantize",
    "fp8_quantize",
    "mxfp8_dequantize",
    "mxfp8_quantize",
]

FP4_BLOCK = 16
"""Values sharing one fp4 scale byte."""
MXFP8_BLOCK = 32
"""Values sharing one mxfp8 (e8m0) scale byte."""

_E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_SIGNED = _E2M1_VALUES + tuple(-v for v in _E2M1_VALUES)  # indexed by the 4-bit code: sign bit 3
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_E2M1_MAX = 6.0
_E4M3_MAX = 448.0
_E4M3_MAX_BITS = 0x7E  # 448; 0x7F is NaN
_E8M0_BIAS = 127


class KVCodec(ABC):
    """Storage of one KV dtype: shapes of a ``(rows, heads, dim)`` buffer and its scales, encode, decode."""

    #: values per scale byte, or None without scales
    scale_block: ClassVar[int | None] = None

    def __init__(self, dtype: torch.dtype, store_dtype: torch.dtype = torch.uint8) -> None:
        self.dtype = dtype
        """The logical KV dtype (``torch.float8_e4m3fn``, ``torch.float4_e2m1fn_x2``, ...)."""
        self.store_dtype = store_dtype
        """The dtype of the stored tensors (uint8 for every 8- and 4-bit type)."""

    def data_shape(self, rows: int, heads: int, dim: int) -> tuple[int, ...]:
        return (rows, heads, dim)

    def scale_shape(self, rows: int, heads: int, dim: int) -> tuple[int, ...] | None:
        return None

    def view(self, data: Tensor) -> Tensor:
        """The stored buffer as the kernels read it (fp8 buffers as fp8)."""
        return data

    @abstractmethod
    def encode(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """``(n, heads, dim)`` activations → stored data (and scales) for ``n`` rows."""

    @abstractmethod
    def decode(self, data: Tensor, scale: Tensor | None, out_dtype: torch.dtype) -> Tensor:
        """Stored rows (and their scales) → ``(n, heads, dim)`` values in ``out_dtype``."""


class NativeCodec(KVCodec):
    """bf16 / fp16 / fp32: stored as is."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__(dtype, dtype)

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        return x.to(self.dtype), None

    def decode(self, data: Tensor, scale: Tensor | None, out_dtype: torch.dtype) -> Tensor:
        return data.to(out_dtype)


class Fp8Codec(KVCodec):
    """fp8 e4m3 / e5m2 with a per-tensor scale of 1, stored as uint8."""

    def view(self, data: Tensor) -> Tensor:
        return data.view(self.dtype)

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        if x.dtype == self.dtype:
            return x.view(torch.uint8), None
        return fp8_quantize(x, self.dtype).view(torch.uint8), None

    def decode(self, data: Tensor, scale: Tensor | None, out_dtype: torch.dtype) -> Tensor:
        return data.view(self.dtype).to(out_dtype)


class Fp4Codec(KVCodec):
    """Packed e2m1 pairs + one e4m3 scale byte per 16 values (scales flat per row, as SGLang)."""

    scale_block = FP4_BLOCK

    def data_shape(self, rows: int, heads: int, dim: int) -> tuple[int, ...]:
        return (rows, heads, dim // 2)

    def scale_shape(self, rows: int, heads: int, dim: int) -> tuple[int, ...] | None:
        return (rows, heads * dim // FP4_BLOCK)

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        packed, scale = fp4_quantize(x)
        return packed, scale.reshape(x.shape[0], -1)

    def decode(self, data: Tensor, scale: Tensor | None, out_dtype: torch.dtype) -> Tensor:
        assert scale is not None
        heads = data.shape[1]
        return fp4_dequantize(data, scale.reshape(data.shape[0], heads, -1), out_dtype)


class MXFp8Codec(KVCodec):
    """fp8 e4m3 data (as uint8) + one e8m0 scale byte per 32 values, ``(rows, heads, dim // 32)``."""

    scale_block = MXFP8_BLOCK

    def scale_shape(self, rows: int, heads: int, dim: int) -> tuple[int, ...] | None:
        return (rows, heads, dim // MXFP8_BLOCK)

    def view(self, data: Tensor) -> Tensor:
        return data.view(torch.float8_e4m3fn)

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        data, scale = mxfp8_quantize(x)
        return data.view(torch.uint8), scale

    def decode(self, data: Tensor, scale: Tensor | None, out_dtype: torch.dtype) -> Tensor:
        assert scale is not None
        return mxfp8_dequantize(data.view(torch.float8_e4m3fn), scale, out_dtype)


def codec_for(kv: KVDtype) -> KVCodec:
    """The codec of a resolved KV dtype (:func:`kvpools_core.dtypes.resolve_kv_dtype`)."""
    if kv.is_fp4:
        return Fp4Codec(torch.float4_e2m1fn_x2)
    if kv.name == "mxfp8":
        return MXFp8Codec(torch.float8_e4m3fn)
    dtype = getattr(torch, kv.torch_dtype)
    if kv.is_fp8:
        return Fp8Codec(dtype)
    return NativeCodec(dtype)


# ---------------------------------------------------------------------------
# the quantisers
# ---------------------------------------------------------------------------


def fp8_quantize(x: Tensor, dtype: torch.dtype) -> Tensor:
    """Saturating cast to an fp8 dtype (round to nearest even); NaN stays NaN."""
    limit = torch.finfo(dtype).max
    return x.clamp(-limit, limit).to(dtype)


def fp4_quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(..., dim)`` → packed e2m1 ``(..., dim // 2)`` uint8 and e4m3 scale bytes ``(..., dim // 16)`` uint8."""
    dim = x.shape[-1]
    if dim % FP4_BLOCK:
        raise ValueError(f"fp4 quantisation needs a last dimension divisible by {FP4_BLOCK}, got {dim}.")
    blocks = x.float().reshape(*x.shape[:-1], dim // FP4_BLOCK, FP4_BLOCK)
    target = blocks.abs().amax(-1) / _E2M1_MAX
    bits = target.clamp(max=_E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
    below = bits.view(torch.float8_e4m3fn).float() < target  # round the scale up: no value of the block clips
    bits = bits + (below & (bits < _E4M3_MAX_BITS)).to(torch.uint8)
    scale = bits.view(torch.float8_e4m3fn).float()
    scaled = blocks / torch.where(scale > 0, scale, 1.0).unsqueeze(-1)
    midpoints = _constant(_E2M1_MIDPOINTS, x.device)
    codes = torch.bucketize(scaled.abs().clamp(max=_E2M1_MAX), midpoints).to(torch.uint8)
    codes = codes | (scaled < 0).to(torch.uint8) << 3
    codes = codes.reshape(*x.shape[:-1], dim // 2, 2)
    packed = codes[..., 0] | codes[..., 1] << 4
    return packed, bits


def fp4_dequantize(packed: Tensor, scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    """Inverse of :func:`fp4_quantize`: packed ``(..., dim // 2)`` and scales ``(..., dim // 16)``."""
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(*packed.shape[:-1], -1, FP4_BLOCK)
    table = _constant(_E2M1_SIGNED, packed.device)
    values = table[codes.long()] * scale.view(torch.float8_e4m3fn).float().unsqueeze(-1)
    return values.reshape(*packed.shape[:-1], -1).to(out_dtype)


def mxfp8_quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """``(..., dim)`` → e4m3 data ``(..., dim)`` and e8m0 scale bytes ``(..., dim // 32)`` uint8."""
    dim = x.shape[-1]
    if dim % MXFP8_BLOCK:
        raise ValueError(f"mxfp8 quantisation needs a last dimension divisible by {MXFP8_BLOCK}, got {dim}.")
    blocks = x.float().reshape(*x.shape[:-1], dim // MXFP8_BLOCK, MXFP8_BLOCK)
    mantissa, exponent = torch.frexp(blocks.abs().amax(-1) / _E4M3_MAX)
    # ceil(log2(amax / 448)) exactly: frexp gives m in [0.5, 1), so an exact power of two has m == 0.5.
    power = (exponent - (mantissa == 0.5).to(exponent.dtype)).clamp(-_E8M0_BIAS, _E8M0_BIAS)
    scaled = blocks / torch.ldexp(torch.ones_like(blocks[..., :1]), power.unsqueeze(-1))
    data = fp8_quantize(scaled, torch.float8_e4m3fn).reshape(x.shape)
    return data, (power + _E8M0_BIAS).to(torch.uint8)


def mxfp8_dequantize(data: Tensor, scale: Tensor, out_dtype: torch.dtype) -> Tensor:
    """Inverse of :func:`mxfp8_quantize`."""
    blocks = data.float().reshape(*data.shape[:-1], -1, MXFP8_BLOCK)
    factor = torch.ldexp(torch.ones_like(blocks[..., :1]), scale.to(torch.int32).unsqueeze(-1) - _E8M0_BIAS)
    return (blocks * factor).reshape(data.shape).to(out_dtype)


@functools.lru_cache(maxsize=64)
def _constant(values: tuple[float, ...], device: torch.device) -> Tensor:
    """A small lookup table, copied to each device once (not once per write)."""
    return torch.tensor(values, dtype=torch.float32, device=device)
