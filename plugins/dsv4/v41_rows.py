"""DeepSeek-V4.1's paged KV rows: the V41 (fp8) and V41_FP4 encodings, block-split or interleaved (issue 33).

A V4.1 row is the whole 512-value latent (nope and rotated rope together), as SGLang 0.5.23's FlashMLA store
kernels write it (``kernels/ops/attention/dsv4/kv_layout.py``; the store semantics are those of SGLang's test
oracle ``test/kernels/deepseek_v4/dsv41_kv_quant_reference.py``):

* ``v41``: 512 e4m3 values, then 16 ue8m0 scales, one per 32 values, ``scale = 2 ** ceil(log2(max(amax / 448,
  1e-4)))`` (a power of two, so the scale byte is its biased exponent);
* ``v41_fp4``: 256 bytes of e2m1 codes (two a byte, the even index in the low nibble; round to nearest, ties to
  the even code, saturating at 6, the sign kept for values that round to zero), then 32 e4m3 scales, one per 16
  values, ``scale = e4m3(clamp(amax / 6, 2 ** -9, 448))``.

In a page of ``P`` tokens the block-split layouts keep every token's data first (token ``i`` at ``i x data``),
then every token's scales (at ``P x data + i x scales``); the ``_new`` layouts keep each token's scales right
after its data (token ``i`` at ``i x (data + scales)``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .layouts import KVLayout

__all__ = ["V41_LATENT", "dequantize", "quantize", "row_columns"]

V41_LATENT = 512
FP8_TILE = 32
FP4_TILE = 16
E4M3_MAX = 448.0
E2M1_MAX = 6.0
FP8_SCALE_FLOOR = 1e-4
FP4_SCALE_FLOOR = 2.0**-9
UE8M0_BIAS = 127
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _pow2_ceil(x: Tensor) -> Tensor:
    """``2 ** ceil(log2(x))`` for positive finite float32 ``x``, exact at powers of two."""
    mantissa, exponent = torch.frexp(x)  # x = mantissa x 2 ** exponent, mantissa in [0.5, 1)
    return torch.ldexp(torch.ones_like(x), exponent - (mantissa == 0.5).to(exponent.dtype))


def _e2m1_codes(x: Tensor) -> Tensor:
    """4-bit e2m1 codes of float32 ``x``: nearest magnitude, ties to the even code, saturating; sign in bit 3."""
    mags = torch.tensor(_E2M1, dtype=torch.float32, device=x.device)
    mids = (mags[:-1] + mags[1:]) / 2
    a = x.abs().clamp_max(E2M1_MAX)
    below = torch.bucketize(a, mids, right=False)  # midpoints strictly below a
    upto = torch.bucketize(a, mids, right=True)  # midpoints at or below a
    tie = below != upto
    code = torch.where(tie & (below % 2 == 1), upto, torch.where(tie, below, upto))
    return (torch.signbit(x).to(torch.uint8) << 3) | code.to(torch.uint8)


def _e2m1_values(codes: Tensor) -> Tensor:
    mags = torch.tensor(_E2M1, dtype=torch.float32, device=codes.device)
    values = mags[(codes & 7).long()]
    return torch.where((codes & 8) != 0, -values, values)


def quantize(layout: KVLayout, latent: Tensor) -> tuple[Tensor, Tensor]:
    """``(data (n, data_bytes), scales (n, scale_bytes))`` uint8 of ``latent`` ``(n, 512)`` in ``layout``."""
    n = latent.shape[0]
    x = latent.float()
    if layout.fp4:
        tiles = x.reshape(n, V41_LATENT // FP4_TILE, FP4_TILE)
        amax = tiles.abs().amax(-1)
        scale = (amax / E2M1_MAX).clamp(FP4_SCALE_FLOOR, E4M3_MAX).to(torch.float8_e4m3fn)
        codes = _e2m1_codes(tiles / scale.float().unsqueeze(-1)).reshape(n, V41_LATENT)
        data = codes[:, 0::2] | (codes[:, 1::2] << 4)
        return data, scale.view(torch.uint8)
    tiles = x.reshape(n, V41_LATENT // FP8_TILE, FP8_TILE)
    scale = _pow2_ceil((tiles.abs().amax(-1) / E4M3_MAX).clamp_min(FP8_SCALE_FLOOR))
    data = (tiles / scale.unsqueeze(-1)).reshape(n, V41_LATENT).to(torch.float8_e4m3fn).view(torch.uint8)
    exponent = torch.frexp(scale)[1] - 1  # scale is 2 ** (exponent), frexp's mantissa 0.5
    return data, (exponent + UE8M0_BIAS).to(torch.uint8)


def dequantize(layout: KVLayout, data: Tensor, scales: Tensor) -> Tensor:
    """The float32 ``(n, 512)`` latent of rows ``data`` / ``scales`` (uint8) in ``layout``."""
    n = data.shape[0]
    if layout.fp4:
        codes = torch.empty((n, V41_LATENT), dtype=torch.uint8, device=data.device)
        codes[:, 0::2] = data & 0xF
        codes[:, 1::2] = data >> 4
        values = _e2m1_values(codes).reshape(n, V41_LATENT // FP4_TILE, FP4_TILE)
        scale = scales.contiguous().view(torch.float8_e4m3fn).float()
        return (values * scale.unsqueeze(-1)).reshape(n, V41_LATENT)
    values = data.contiguous().view(torch.float8_e4m3fn).float().reshape(n, V41_LATENT // FP8_TILE, FP8_TILE)
    scale = torch.ldexp(torch.ones_like(scales, dtype=torch.float32), scales.long() - UE8M0_BIAS)
    return (values * scale.unsqueeze(-1)).reshape(n, V41_LATENT)


def row_columns(layout: KVLayout, page_size: int, loc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(pages, data columns, scale columns)`` of slots ``loc`` in ``(pages, page_bytes)`` uint8 buffers."""
    loc = loc.long()
    pages = (loc // page_size).unsqueeze(1)
    off = (loc % page_size).unsqueeze(1)
    data, scale = layout.data_bytes, layout.scale_bytes
    if layout.interleaved:
        base = off * (data + scale)
        data_cols = base + torch.arange(data, device=loc.device)
        scale_cols = base + data + torch.arange(scale, device=loc.device)
    else:
        data_cols = off * data + torch.arange(data, device=loc.device)
        scale_cols = page_size * data + off * scale + torch.arange(scale, device=loc.device)
    return pages, data_cols, scale_cols
