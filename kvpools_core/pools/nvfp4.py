"""The MHA pool under ``--kv-cache-dtype nvfp4``: SGLang 0.5.23's ``NVFP4KVCacheMethod.create_buffers`` (issue 33).

For ``m = size + page_size`` rows, ``n`` heads of ``k`` dims, per layer: packed K and V ``(m, n, k // 2)``
uint8 (V at the K width, as SGLang); token-linear scales ``(m, n, k // 16)`` where the resolved layout reads them;
SM100 native scales ``(m // page, n, page, k // 16)``; and once, shared by every layer, the fp8 dequant workspace
``(m, n, k)`` for K and for V where flashinfer prefills (:mod:`kvpools_core.parts.nvfp4` decides which).  The
packed K/V and linear scales go through the build's buffer layout as every MHA pool's; the native scales and the
workspace are allocated as SGLang allocates them, one tensor each.  Writes quantise with kvpools' fp4 quantiser
(two e2m1 values per byte, one e4m3 scale per 16 values) and store the scales in every layout held; reads
dequantise from the linear scales, or from the native ones where there are none.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from kvpools_core.dtypes import KVDtype
from kvpools_core.parts.attention import LayerGeometry
from kvpools_core.parts.nvfp4 import SCALE_BLOCK, Nvfp4Layout, nvfp4_layout
from kvpools_core.pools.kv import LayerKV, tensor_nbytes
from kvpools_core.pools.layout import allocate
from kvpools_core.pools.mha import MHATokenToKVPool
from kvpools_core.pools.quant import Fp4Codec, KVCodec, fp4_dequantize, fp4_quantize
from kvpools_core.values import Plan

__all__ = ["Nvfp4Codec", "Nvfp4MHATokenToKVPool"]


class Nvfp4Codec(Fp4Codec):
    """NVFP4's packed K/V with token-linear scales ``(rows, heads, dim // 16)`` (SGLang's linear layout)."""

    def __init__(self, layout: Nvfp4Layout) -> None:
        super().__init__(torch.float4_e2m1fn_x2)
        self.nvfp4 = layout

    def scale_shape(self, rows: int, heads: int, dim: int) -> tuple[int, ...] | None:
        return (rows, heads, dim // SCALE_BLOCK)

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        return fp4_quantize(x)

    def decode(self, data: Tensor, scale: Tensor | None, out_dtype: torch.dtype) -> Tensor:
        assert scale is not None
        return fp4_dequantize(data, scale, out_dtype)


class Nvfp4NativeCodec(Nvfp4Codec):
    """NVFP4's packed K/V without token-linear scales (SM100 native only: the scales live in the pool's native
    buffers, which :class:`Nvfp4MHATokenToKVPool` writes and reads)."""

    scale_block = None  # type: ignore[assignment]  # no token-linear scales (Fp4Codec types it int)

    def scale_shape(self, rows: int, heads: int, dim: int) -> tuple[int, ...] | None:
        return None

    def encode(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        return fp4_quantize(x)[0], None

    def decode(self, data: Tensor, scale: Tensor | None, out_dtype: torch.dtype) -> Tensor:
        raise ValueError("NVFP4 native-only rows decode with the pool's native scales (Nvfp4MHATokenToKVPool.get_kv).")


class Nvfp4MHATokenToKVPool(MHATokenToKVPool):
    """SGLang's ``MHATokenToKVPool`` with ``NVFP4KVCacheMethod`` (and its draft pool, with the same recipe)."""

    codec: Nvfp4Codec

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        layout = self.codec.nvfp4
        rows, page, device = self.size + self.page_size, self.page_size, self.kv.device
        native = layout.native_scales
        self.native_k_scale_buffer: list[Tensor] = [
            allocate((rows // page, g.heads, page, g.head_dim // SCALE_BLOCK), torch.uint8, device)
            for g in self.kv.layers
            if native
        ]
        self.native_v_scale_buffer: list[Tensor] = [
            allocate((rows // page, g.heads, page, g.head_dim // SCALE_BLOCK), torch.uint8, device)
            for g in self.kv.layers
            if native
        ]
        first = self.kv.layers[0] if self.kv.layers else None
        workspace = layout.workspace and first is not None
        shape = (rows, first.heads, first.head_dim) if first is not None else (0,)
        self.dq_k_buffer = allocate(shape, torch.float8_e4m3fn, device) if workspace else None
        self.dq_v_buffer = allocate(shape, torch.float8_e4m3fn, device) if workspace else None

    @classmethod
    def plan_codec(cls, plan: Plan, kv: KVDtype) -> KVCodec:
        layout = nvfp4_layout(plan.serving)
        assert layout is not None, "an nvfp4 plan has a resolved layout (kvpools_core.parts.nvfp4)"
        return Nvfp4Codec(layout) if layout.linear_scales else Nvfp4NativeCodec(layout)

    @classmethod
    def planned_nbytes(cls, rows: int, layers: Sequence[LayerGeometry], codec: KVCodec, page_size: int) -> int:
        assert isinstance(codec, Nvfp4Codec)
        total = LayerKV.planned_nbytes(rows, layers, codec)
        if codec.nvfp4.native_scales:
            total += sum(2 * (rows // page_size) * g.heads * page_size * (g.head_dim // SCALE_BLOCK) for g in layers)
        if codec.nvfp4.workspace and layers:
            total += 2 * rows * layers[0].heads * layers[0].head_dim
        return total

    def nbytes_by_pool(self) -> dict[str, int]:
        measured = super().nbytes_by_pool()
        extras = [t for t in (self.dq_k_buffer, self.dq_v_buffer) if t is not None]
        measured[self.name] += tensor_nbytes(self.native_k_scale_buffer, self.native_v_scale_buffer, extras)
        return measured

    def set_kv_buffer(self, layer_id: int, loc: Tensor, cache_k: Tensor, cache_v: Tensor) -> None:
        """Store K and V at slots ``loc``: packed data, and the block scales in every layout the pool holds."""
        self.kv.set_kv_buffer(layer_id, loc, cache_k, cache_v)
        if self.native_k_scale_buffer:
            i = layer_id - self.start_layer
            page = self.page_size
            self.native_k_scale_buffer[i][loc // page, :, loc % page] = fp4_quantize(cache_k)[1]
            self.native_v_scale_buffer[i][loc // page, :, loc % page] = fp4_quantize(cache_v)[1]

    def get_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        if not isinstance(self.codec, Nvfp4NativeCodec):
            return super().get_kv(layer_id, loc, dtype)
        i = layer_id - self.start_layer
        page, out = self.page_size, dtype or self.kv.read_dtype
        k_scale = self.native_k_scale_buffer[i][loc // page, :, loc % page]
        v_scale = self.native_v_scale_buffer[i][loc // page, :, loc % page]
        return (
            fp4_dequantize(self.kv.k_buffer[i][loc], k_scale, out),
            fp4_dequantize(self.kv.v_buffer[i][loc], v_scale, out),
        )
