"""Attention K/V rows: what one full- or sliding-attention layer stores per token on one rank.

Each layer keeps K (``head_dim``) and V (``v_head_dim``) for the KV heads this
rank stores: attention TP shards heads, decode context parallelism (DCP)
shards tokens, so a DCP rank stores ``kv_heads_per_rank(heads, attn_tp, dcp)``
heads while SGLang charges heads sharded by attention TP only.  The bytes per
KV dtype: ``element × dim`` per head; fp4 packs two values per byte and adds
one uint8 scale per 16 values; mxfp8 adds one e8m0 scale per 32 values (which
SGLang's estimate omits).  Every architecture that keeps K and V (MHA/GQA,
sliding window, MiniMax sparse, linear-attention hybrids) composes these; the
store that allocates them is :class:`kvpools_core.pools.mha.MHATokenToKVPool`
(one :class:`kvpools_core.pools.kv.LayerKV` per group of layers).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from kvpools_core.dtypes import NVFP4_MHA_REFUSAL, KVDtype, resolve_kv_dtype
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parallel import kv_heads_per_rank
from kvpools_core.parts.nvfp4 import SCALE_BLOCK as NVFP4_SCALE_BLOCK
from kvpools_core.parts.nvfp4 import nvfp4_layout, nvfp4_problems
from kvpools_core.values import CellPart, CellSize, LayerSpec, ModelSpec, Serving

__all__ = ["LayerGeometry", "attention_cell_size", "layer_geometry", "scale_block_problems", "sglang_fp4_cell"]


@attrs.frozen
class LayerGeometry:
    """What one layer stores per token on this rank: KV heads, K and V head dims."""

    heads: int
    head_dim: int
    v_head_dim: int


def layer_geometry(layers: Sequence[LayerSpec], serving: Serving) -> list[LayerGeometry]:
    """Per layer: the KV heads this rank stores (attention TP, DCP), K and V head dims."""
    return [
        LayerGeometry(
            heads=kv_heads_per_rank(layer.num_kv_heads, serving.attn_tp_size, serving.dcp_size),
            head_dim=layer.head_dim,
            v_head_dim=layer.v_head_dim,
        )
        for layer in layers
    ]


def attention_cell_size(
    layers: tuple[LayerSpec, ...], model: ModelSpec, serving: Serving, pool: str = "kv", *, nvfp4: bool = False
) -> CellSize:
    """K and V (and their scales) of full-attention ``layers`` on this rank, as parts of ``pool``.

    SGLang charges heads sharded by attention TP only; the pool really stores
    ``kv_heads_per_rank(heads, attn_tp, dcp)`` heads (DCP shards tokens, not heads).
    """
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    if kv.name == "nvfp4" and layers:
        if not nvfp4:  # an architecture whose pool kvpools has not modelled NVFP4KVCacheMethod for
            raise UnsupportedCombinationError(NVFP4_MHA_REFUSAL.format(flag=option("kv_cache_dtype")))
        return nvfp4_cell_size(layers, serving, pool)
    e = kv.element_bytes
    sglang = 0
    k_bytes = v_bytes = k_scale = v_scale = 0
    for layer in layers:
        heads = kv_heads_per_rank(layer.num_kv_heads, serving.attn_tp_size)
        stored = kv_heads_per_rank(layer.num_kv_heads, serving.attn_tp_size, serving.dcp_size)
        d, dv = layer.head_dim, layer.v_head_dim
        if kv.is_fp4:
            # Packed data (two values per byte) + one uint8 scale per 16 values.
            k_bytes += stored * d // 2
            v_bytes += stored * dv // 2
            k_scale += stored * d // 16
            v_scale += stored * dv // 16
        else:
            sglang += heads * (d + dv) * e
            k_bytes += stored * d * e
            v_bytes += stored * dv * e
            if kv.scale_block:  # mxfp8: one e8m0 scale per 32 values, which SGLang's estimate omits
                k_scale += stored * (d // kv.scale_block)
                v_scale += stored * (dv // kv.scale_block)
    if kv.is_fp4:
        # SGLang applies the fp4 formula to the whole cell, not layer by layer.
        sglang = sglang_fp4_cell(layers, serving, e)
    parts = [CellPart("k", k_bytes, pool), CellPart("v", v_bytes, pool)]
    if k_scale or v_scale:
        parts += [CellPart("k_scale", k_scale, pool), CellPart("v_scale", v_scale, pool)]
    return CellSize(parts=parts, sglang_bytes_per_token=max(sglang, 1), num_layers=len(layers))


def nvfp4_cell_size(layers: tuple[LayerSpec, ...], serving: Serving, pool: str = "kv") -> CellSize:
    """nvfp4 MHA layers (dense models only, ``nvfp4=True``): the buffers of SGLang's ``NVFP4KVCacheMethod`` for the
    resolved layout (:mod:`kvpools_core.parts.nvfp4`), per token of the pool's rows; SGLang's estimate is the
    fp4 formula of ``pool_configurator.py`` (ref-002 lines 270-277)."""
    problems = nvfp4_problems(
        serving, tuple(layer.head_dim for layer in layers), tuple(layer.v_head_dim for layer in layers)
    )
    layout = nvfp4_layout(serving)
    if problems or layout is None:
        raise UnsupportedCombinationError(" ".join(problems))
    k_bytes = v_bytes = scale = 0
    for layer in layers:
        stored = kv_heads_per_rank(layer.num_kv_heads, serving.attn_tp_size, serving.dcp_size)
        k_bytes += stored * layer.head_dim // 2
        v_bytes += stored * layer.head_dim // 2  # V at the K width (create_buffers' k)
        scale += stored * layer.head_dim // NVFP4_SCALE_BLOCK
    parts = [CellPart("k", k_bytes, pool), CellPart("v", v_bytes, pool)]
    if layout.linear_scales:
        parts += [CellPart("k_scale", scale, pool), CellPart("v_scale", scale, pool)]
    if layout.native_scales:
        parts += [CellPart("k_native_scale", scale, pool), CellPart("v_native_scale", scale, pool)]
    if layout.workspace:  # one (rows, heads, head_dim) fp8 tensor each for K and V, shared by every layer
        first = layers[0]
        row = kv_heads_per_rank(first.num_kv_heads, serving.attn_tp_size, serving.dcp_size) * first.head_dim
        parts += [CellPart("dq_k", row, pool), CellPart("dq_v", row, pool)]
    sglang = sglang_fp4_cell(layers, serving, 1)
    return CellSize(
        parts=parts, sglang_bytes_per_token=max(sglang, 1), num_layers=len(layers), notes=(layout.describe,)
    )


def sglang_fp4_cell(layers: tuple[LayerSpec, ...], serving: Serving, e: int) -> int:
    """SGLang's fp4 MHA cell: its formula over the first layer's geometry times the layer count."""
    if not layers:
        return 0
    first = layers[0]
    n = kv_heads_per_rank(first.num_kv_heads, serving.attn_tp_size)
    num = len(layers)
    cell = n * (first.head_dim + first.v_head_dim) * num * e
    return cell // 2 + (n * first.head_dim * num * 2 * e) // 16


def host_row_width_problems(layers: Iterable[LayerSpec], serving: Serving, model_name: str) -> list[str]:
    """K/V layers whose V rows are narrower than their K rows, under ``--enable-hierarchical-cache``: refused.

    SGLang 0.5.23's ``MHATokenToKVPoolHost`` sizes the host pool by
    ``(head_dim + v_head_dim) x heads x layers`` bytes per token but allocates
    ``(2, layers, size, heads, head_dim)`` (``pool_host/mha.py`` ``init_kv_buffer``): V at the K width.  kvpools
    does not model that mismatch, so it plans no host tier for such models rather than a wrong one.
    """
    if not serving.enable_hierarchical_cache:
        return []
    widths = sorted({(layer.head_dim, layer.v_head_dim) for layer in layers if layer.v_head_dim != layer.head_dim})
    if not widths:
        return []
    shown = ", ".join(f"K {k} / V {v}" for k, v in widths)
    return [
        f"{option('enable_hierarchical_cache')}: {model_name} has V rows narrower than K rows ({shown}); SGLang's MHA "
        f"host pool sizes them as K + V but allocates V at the K width, which kvpools does not model. Plan the "
        f"device pools without the host tier."
    ]


def scale_block_problems(head_dims: Iterable[int], kv: KVDtype, model_name: str) -> list[str]:
    """A block-scaled KV dtype (mxfp8) needs every stored head dim to be a multiple of its block."""
    if kv.scale_block is None:
        return []
    bad = sorted(d for d in set(head_dims) if d % kv.scale_block)
    if not bad:
        return []
    return [
        f"{option('kv_cache_dtype')} {kv.name} stores one scale per {kv.scale_block} values, but {model_name} has "
        f"head dims {bad} that are not multiples of {kv.scale_block}. Use bf16, fp16 or fp8_e4m3."
    ]
