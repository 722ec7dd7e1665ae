"""The MHA / GQA KV pool: SGLang's ``MHATokenToKVPool`` (and its FP4 / MXFP8 variants) built from a plan.

Per layer of this rank's pipeline stage, K is ``(size + page_size,
kv_heads_per_rank, head_dim)`` and V ``(size + page_size, kv_heads_per_rank,
v_head_dim)`` (the first page pads: CUDA-graph dummy tokens write there);
block-scaled dtypes add scale tensors (see :mod:`kvpools_core.pools.quant`).
Unlike SGLang's FP4 pool, V is stored at its own ``v_head_dim``.  A speculative
plan's draft model gets its own pool of the same per-layer geometry
(``.draft``), with its own padding page, as SGLang's draft worker allocates (under DCP over ``dcp`` times
the slots, in pages of ``dcp x page``: :func:`~kvpools_core.parts.names.draft_pool_geometry`).
Every K / V / scale buffer is allocated through the build's buffer layout
(:mod:`kvpools_core.pools.layout`; one tensor per layer by default); K and V
may come back as row-indexed buffers (rows permuted in a native tensor), which
the writes and reads address by row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from kvpools_core.dtypes import KVDtype, resolve_kv_dtype
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.attention import LayerGeometry, layer_geometry
from kvpools_core.parts.names import DRAFT_KV_POOL, KV_POOL, draft_num_layers, draft_pool_geometry
from kvpools_core.pools.kv import LayerKV, PoolPlanMismatchError, check_planned_bytes
from kvpools_core.pools.layout import BufferLayout, check_layout_bytes
from kvpools_core.pools.quant import KVCodec, codec_for
from kvpools_core.values import LayerSpec, Plan

__all__ = ["MHATokenToKVPool", "NoOpMHATokenToKVPool", "plan_layer_geometry"]

MAIN_POOL = KV_POOL
DRAFT_POOL = DRAFT_KV_POOL


class MHATokenToKVPool:
    """K and V of every full-attention layer of one rank, indexed by token slot and global layer id."""

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        layers: list[LayerGeometry],
        start_layer: int,
        codec: KVCodec,
        device: str | torch.device,
        model_dtype: torch.dtype,
        name: str = MAIN_POOL,
        draft: MHATokenToKVPool | None = None,
        layout: BufferLayout | None = None,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.codec = codec
        self.name = name
        self.draft = draft
        self.kv = LayerKV(
            rows=size + page_size,
            layers=layers,
            start_layer=start_layer,
            codec=codec,
            device=device,
            read_dtype=model_dtype,
            name=name,
            page_size=page_size,
            layout=layout,
        )
        self.device = self.kv.device

    @property
    def layout(self) -> BufferLayout:
        """The buffer layout the K / V buffers were allocated through."""
        return self.kv.layout

    @classmethod
    def from_plan(
        cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None
    ) -> MHATokenToKVPool:
        """The pool (and its draft pool) a plan describes; refuses, before allocating, bytes the plan did not charge.

        ``layout`` carves the buffers (the ``buffer_layout`` hook's answer; one tensor per layer when None).
        """
        start, end = rank_layer_range(plan.model, plan.serving)
        return cls.from_layers(plan, plan.model.layers[start:end], device, start_layer=start, layout=layout)

    @classmethod
    def from_layers(
        cls,
        plan: Plan,
        layers: Sequence[LayerSpec],
        device: str | torch.device,
        *,
        start_layer: int,
        pool_name: str = MAIN_POOL,
        layout: BufferLayout | None = None,
    ) -> MHATokenToKVPool:
        """A pool of ``layers`` (full attention, this rank) and the plan's draft pool, if it has one.

        Architectures that keep K/V for some layers only (linear-attention
        hybrids) build it here too, so the bytes checks and the draft's shape
        live in one place.
        """
        serving = plan.serving
        kv = resolve_kv_dtype(serving.kv_cache_dtype, plan.model.dtype)
        codec = cls.plan_codec(plan, kv)
        model_dtype = getattr(torch, plan.model.dtype)
        geometry = layer_geometry(layers, serving)
        size, page = plan.max_total_num_tokens, serving.page_size
        rows = size + page
        check_planned_bytes(
            pool_name,
            cls.planned_nbytes(rows, geometry, codec, page),
            plan.pool(pool_name).bytes,
            f"{len(geometry)} layer(s) from {start_layer}, {rows} rows of {kv.name}",
        )
        requests = LayerKV.buffer_requests(
            name=pool_name,
            rows=rows,
            layers=geometry,
            start_layer=start_layer,
            codec=codec,
            device=device,
            page_size=page,
        )
        draft_layers = None
        draft_size, draft_page = draft_pool_geometry(plan, DRAFT_POOL)  # dcp x the target's under DCP
        if draft_num_layers(plan) is not None:
            draft_layers = _draft_geometry(plan, geometry)
            draft_rows = draft_size + draft_page
            check_planned_bytes(
                DRAFT_POOL,
                cls.planned_nbytes(draft_rows, draft_layers, codec, draft_page),
                plan.pool(DRAFT_POOL).bytes,
                f"{len(draft_layers)} draft layer(s) of the target's geometry, {draft_rows} rows of {kv.name}",
            )
            requests += LayerKV.buffer_requests(
                name=DRAFT_POOL,
                rows=draft_rows,
                layers=draft_layers,
                start_layer=0,
                codec=codec,
                device=device,
                page_size=draft_page,
            )
        if layout is not None:
            check_layout_bytes(layout, requests)  # every pool's, before the first tensor
        draft = None
        if draft_layers is not None:
            draft = cls(
                size=draft_size,
                page_size=draft_page,
                layers=draft_layers,
                start_layer=0,
                codec=codec,
                device=device,
                model_dtype=model_dtype,
                name=DRAFT_POOL,
                layout=layout,
            )
        return cls(
            size=size,
            page_size=page,
            layers=geometry,
            start_layer=start_layer,
            codec=codec,
            device=device,
            model_dtype=model_dtype,
            name=pool_name,
            draft=draft,
            layout=layout,
        )

    @classmethod
    def plan_codec(cls, plan: Plan, kv: KVDtype) -> KVCodec:
        """How this pool stores the plan's KV dtype (a subclass may store a recipe of its own)."""
        return codec_for(kv)

    @classmethod
    def planned_nbytes(cls, rows: int, layers: Sequence[LayerGeometry], codec: KVCodec, page_size: int) -> int:
        """The bytes a pool of ``rows`` rows allocates, from shapes alone."""
        return LayerKV.planned_nbytes(rows, layers, codec)

    # -- what it is ----------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        """The KV dtype (``torch.float8_e4m3fn``, ``torch.float4_e2m1fn_x2``, ``torch.bfloat16``, ...)."""
        return self.codec.dtype

    @property
    def store_dtype(self) -> torch.dtype:
        """The dtype of the stored K/V tensors (``uint8`` for 8- and 4-bit types)."""
        return self.codec.store_dtype

    @property
    def start_layer(self) -> int:
        return self.kv.start_layer

    @property
    def end_layer(self) -> int:
        """One past the last layer held (exclusive; SGLang's ``KVCache.end_layer`` is inclusive)."""
        return self.kv.end_layer

    @property
    def layer_num(self) -> int:
        return self.kv.layer_num

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor held, the draft pool's included, measured from the tensors."""
        return sum(self.nbytes_by_pool().values())

    def nbytes_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name: ``kv`` and, with a draft, ``draft_kv``."""
        measured = {self.name: self.kv.nbytes}
        if self.draft is not None:
            measured.update(self.draft.nbytes_by_pool())
        return measured

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(K bytes, V bytes)`` of this pool (scales included, draft excluded), as SGLang."""
        return self.kv.get_kv_size_bytes()

    # -- buffers ---------------------------------------------------------------

    def get_key_buffer(self, layer_id: int) -> Tensor:
        """Layer ``layer_id``'s K as kernels read it: native, fp8 views of uint8, packed uint8 for fp4.

        Under a layout that gives K row-indexed buffers (ROCm ``vectorized_5d``) it is the layout's native
        tensor (AITER's ``(blocks, H, D // X, page, X)``), as SGLang returns it; address rows through
        :meth:`set_kv_buffer` / :meth:`get_kv` (or ``kv.k_buffer[i]``, the row-indexed buffer).
        """
        return self.kv.get_key_buffer(layer_id)

    def get_value_buffer(self, layer_id: int) -> Tensor:
        return self.kv.get_value_buffer(layer_id)

    def get_kv_buffer(self, layer_id: int) -> tuple[Tensor, Tensor]:
        return self.kv.get_key_buffer(layer_id), self.kv.get_value_buffer(layer_id)

    def get_key_scale_buffer(self, layer_id: int) -> Tensor:
        """uint8 K scales: fp4 ``(rows, heads * head_dim // 16)`` e4m3; mxfp8 ``(rows, heads, head_dim // 32)`` e8m0."""
        return self.kv.get_key_scale_buffer(layer_id)

    def get_value_scale_buffer(self, layer_id: int) -> Tensor:
        return self.kv.get_value_scale_buffer(layer_id)

    def set_kv_buffer(self, layer_id: int, loc: Tensor, cache_k: Tensor, cache_v: Tensor) -> None:
        """Store ``(len(loc), heads, dim)`` K and V at slots ``loc``, quantising when the pool's dtype asks."""
        self.kv.set_kv_buffer(layer_id, loc, cache_k, cache_v)

    def get_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """K and V at slots ``loc``, dequantised to ``dtype`` (default: the model dtype)."""
        return self.kv.get_kv(layer_id, loc, dtype)

    # -- host copies (retraction) ------------------------------------------------

    def get_cpu_copy(self, indices: Tensor) -> dict[str, object]:
        """The KV of slots ``indices`` (every layer, scales included, and the draft pool's) in host memory.

        SGLang's ``MHATokenToKVPool.get_cpu_copy`` (``memory_pool.py`` L2791): per layer, chunks of
        8,192 slots; opaque to the caller, who hands it back to :meth:`load_cpu_copy`.
        """
        return {
            "kv": self.kv.get_cpu_copy(indices),
            "draft": None if self.draft is None else self.draft.get_cpu_copy(indices),
        }

    def load_cpu_copy(self, kv_cache_cpu: dict[str, Any], indices: Tensor) -> None:
        """Write a :meth:`get_cpu_copy` result into slots ``indices`` (the resumed request's new slots)."""
        self.kv.load_cpu_copy(kv_cache_cpu["kv"], indices)
        if self.draft is not None:
            self.draft.load_cpu_copy(kv_cache_cpu["draft"], indices)

    def __repr__(self) -> str:
        draft = f", draft={self.draft.layer_num} layers" if self.draft is not None else ""
        return (
            f"MHATokenToKVPool(size={self.size}, page_size={self.page_size}, dtype={self.dtype}, "
            f"layers=[{self.start_layer}, {self.end_layer}), device={self.device}{draft})"
        )


class NoOpMHATokenToKVPool(MHATokenToKVPool):
    """SGLang 0.5.23's ``NoOpMHATokenToKVPool`` (``--prefill-only-disable-kv-cache``, ``mem_cache/memory_pool.py``).

    ``size`` is the plan's token count (the scheduler admits by it), but each layer holds one page of placeholder
    rows only, K ``(page_size, heads, head_dim)`` and V ``(page_size, heads, v_head_dim)``; writing or reading
    K/V raises, as SGLang's does, since the FA prefill path never touches the pool (:mod:`kvpools_core.pipeline.noop`).
    """

    @classmethod
    def from_plan(
        cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None
    ) -> NoOpMHATokenToKVPool:
        serving = plan.serving
        start, end = rank_layer_range(plan.model, serving)
        kv = resolve_kv_dtype(serving.kv_cache_dtype, plan.model.dtype)
        codec = codec_for(kv)
        geometry = layer_geometry(plan.model.layers[start:end], serving)
        page = serving.page_size
        check_planned_bytes(
            MAIN_POOL,
            LayerKV.planned_nbytes(page, geometry, codec),
            plan.pool(MAIN_POOL).bytes,
            f"no-op pool: {len(geometry)} layer(s) from {start}, one placeholder page of {page} rows of {kv.name}",
        )
        if layout is not None:
            requests = LayerKV.buffer_requests(
                name=MAIN_POOL,
                rows=page,
                layers=geometry,
                start_layer=start,
                codec=codec,
                device=device,
                page_size=page,
            )
            check_layout_bytes(layout, requests)
        pool = cls(
            size=0,  # rows = size + page_size: the placeholder page alone
            page_size=page,
            layers=geometry,
            start_layer=start,
            codec=codec,
            device=device,
            model_dtype=getattr(torch, plan.model.dtype),
            layout=layout,
        )
        pool.size = plan.max_total_num_tokens  # the scheduler's view of capacity
        return pool

    def set_kv_buffer(self, layer_id: int, loc: Tensor, cache_k: Tensor, cache_v: Tensor) -> None:
        raise RuntimeError(
            "NoOpMHATokenToKVPool holds no KV (--prefill-only-disable-kv-cache): the FA prefill path reads raw K/V "
            "and must not write the pool."
        )

    def get_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        raise RuntimeError("NoOpMHATokenToKVPool holds no KV (--prefill-only-disable-kv-cache): nothing to read.")


def plan_layer_geometry(plan: Plan) -> list[LayerGeometry]:
    """Per layer of the plan's pipeline stage: KV heads this rank stores, K and V head dims."""
    start, end = rank_layer_range(plan.model, plan.serving)
    return layer_geometry(plan.model.layers[start:end], plan.serving)


def _draft_geometry(plan: Plan, layers: list[LayerGeometry]) -> list[LayerGeometry]:
    """The draft's layers: ``speculative_draft_num_layers`` copies of the target's layer geometry.

    SGLang charges the draft as ``D / L`` of the target's cell, which is a
    whole number of layers only when the stage's layers are alike.
    """
    num = draft_num_layers(plan) or 0
    if not layers or len(set(layers)) > 1:
        raise PoolPlanMismatchError(
            f"The plan has a draft KV pool but this stage's layers have {len(set(layers))} different geometries; "
            f"a draft of {num} layer(s) 'like the target's' is ambiguous. Give the draft its own pool sizing."
        )
    return [layers[0]] * num
