"""The MiniMax sparse KV pool: SGLang's ``MiniMaxSparseKVPool`` built from a plan.

A main pool (:class:`~kvpools_core.pools.kv.LayerKV`) holds K and V of every
layer of this rank's stage, ``(size + page_size, kv_heads, head_dim)`` each in
the KV dtype; the indexer pool holds, per sparse layer, one
``(size + page_size, 1, sparse_index_dim)`` key buffer in the model dtype and,
on index-value layers, a value buffer of the same shape.  Layers are
addressed by global id.  A speculative plan's draft gets its own pool
(``.draft``), layers shaped like the target's last layer (under DCP over ``dcp`` times the slots, in pages of
``dcp x page``: :func:`~kvpools_core.parts.names.draft_pool_geometry`).  Both the main K/V
and the indexer buffers (roles ``index_k`` / ``index_v``) are allocated
through the build's buffer layout (:mod:`kvpools_core.pools.layout`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.attention import layer_geometry
from kvpools_core.parts.hisparse import hisparse_ratio
from kvpools_core.parts.names import (
    DRAFT_INDEX_POOL,
    DRAFT_KV_POOL,
    INDEX_POOL,
    KV_POOL,
    draft_num_layers,
    draft_pool_geometry,
)
from kvpools_core.pools.kv import LayerKV, check_planned_bytes, tensor_nbytes
from kvpools_core.pools.layout import PER_LAYER, BufferLayout, BufferRequest, allocate_by_layer, check_layout_bytes
from kvpools_core.pools.quant import KVCodec, codec_for
from kvpools_core.values import LayerSpec, Plan, Serving

from .hisparse import DENSE_KV_POOL
from .kinds import SPARSE

__all__ = ["MiniMaxSparseKVPool"]

MAIN_POOL = KV_POOL
DRAFT_POOL = DRAFT_KV_POOL


class MiniMaxSparseKVPool:
    """Main K/V of every layer and the indexer cache of the sparse layers of one rank."""

    def __init__(
        self,
        *,
        size: int,
        page_size: int,
        layers: list[LayerSpec],
        start_layer: int,
        serving: Serving,
        codec: KVCodec,
        device: str | torch.device,
        model_dtype: torch.dtype,
        names: tuple[str, str] = (MAIN_POOL, INDEX_POOL),
        draft: MiniMaxSparseKVPool | None = None,
        layout: BufferLayout | None = None,
        hisparse_ratio: int = 1,
        index_codec: KVCodec | None = None,
    ) -> None:
        """``hisparse_ratio`` > 1: SGLang's ``MiniMaxSparseKVPool(enable_hisparse)``: the main K/V holds the
        sparse layers only (``size + page`` rows), :attr:`dense` the dense layers' (``size x ratio + page``)
        and the indexer ``size x ratio + page`` rows; each kind must be one contiguous run of layers."""
        self.size = size
        self.page_size = page_size
        self.name, self.index_name = names
        self.draft = draft
        self.model_dtype = model_dtype
        self._start, self._end = start_layer, start_layer + len(layers)
        self.index_codec = index_codec
        """The indexer's codec under ``m3_fp8_attn_gemm`` (the KV's fp8, stored as uint8); None: the model dtype."""
        rows = size + page_size
        logical_rows = size * hisparse_ratio + page_size
        layout = layout or PER_LAYER
        index_dtype = index_codec.store_dtype if index_codec is not None else model_dtype
        index_requests = self.index_requests(
            self.index_name, logical_rows, page_size, layers, start_layer, index_dtype, device
        )
        check_layout_bytes(layout, index_requests)  # with the main K/V's, before the first tensor
        main_layers, main_start, dense_layers, dense_start = split_layers(layers, start_layer, hisparse_ratio)
        self.main = LayerKV(
            rows=rows,
            layers=layer_geometry(main_layers, serving),
            start_layer=main_start,
            codec=codec,
            device=device,
            read_dtype=model_dtype,
            name=self.name,
            page_size=page_size,
            layout=layout,
        )
        self.dense: LayerKV | None = None
        """HiSparse only: the dense layers' K/V for the logical slots (SGLang's ``dense_pool``)."""
        if dense_layers:
            self.dense = LayerKV(
                rows=logical_rows,
                layers=layer_geometry(dense_layers, serving),
                start_layer=dense_start,
                codec=codec,
                device=device,
                read_dtype=model_dtype,
                name=DENSE_KV_POOL,
                page_size=page_size,
                layout=layout,
            )
        index = allocate_by_layer(layout, index_requests)
        self.index_k_buffer: dict[int, Tensor] = dict(sorted(index.get("index_k", {}).items()))
        self.index_v_buffer: dict[int, Tensor] = dict(sorted(index.get("index_v", {}).items()))
        self.device = self.main.device

    @classmethod
    def from_plan(
        cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None
    ) -> MiniMaxSparseKVPool:
        """The pool (and its draft pool) of a plan; refuses, before allocating, bytes the plan did not charge.

        ``layout`` carves the buffers (the ``buffer_layout`` hook's answer; one tensor per layer when None).
        """
        model, serving = plan.model, plan.serving
        codec = codec_for(resolve_kv_dtype(serving.kv_cache_dtype, model.dtype))
        model_dtype = getattr(torch, model.dtype)
        index_codec = codec if serving.m3_fp8_attn_gemm else None  # ref-000 lines 1857-1861
        index_dtype = index_codec.store_dtype if index_codec is not None else model_dtype
        start, end = rank_layer_range(model, serving)
        size, page = plan.max_total_num_tokens, serving.page_size
        layers = list(model.layers[start:end])
        rows = size + page
        ratio = hisparse_ratio(serving)
        if ratio > 1:
            _check_hisparse(plan, layers, start, serving, codec, size, ratio)
        else:
            _check(plan, (MAIN_POOL, INDEX_POOL), layers, serving, codec, rows)
        draft_layers = None
        drafts = draft_num_layers(plan)
        draft_size, draft_page = draft_pool_geometry(plan, DRAFT_POOL)  # dcp x the target's under DCP
        if drafts is not None:
            draft_layers = [model.layers[-1]] * drafts
            _check(plan, (DRAFT_POOL, DRAFT_INDEX_POOL), draft_layers, serving, codec, draft_size + draft_page)
        if layout is not None:  # every pool's bytes, before the first tensor

            def requests(
                names: tuple[str, str], of: list[LayerSpec], first: int, slots: int, slot_page: int
            ) -> list[BufferRequest]:
                main = LayerKV.buffer_requests(
                    name=names[0],
                    rows=slots + slot_page,
                    layers=layer_geometry(of, serving),
                    start_layer=first,
                    codec=codec,
                    device=device,
                    page_size=slot_page,
                )
                return main + cls.index_requests(names[1], slots + slot_page, slot_page, of, first, index_dtype, device)

            if ratio > 1:  # the sparse layers' K/V per device slot; the dense layers' and the indexer per logical one
                main, main_start, dense, dense_start = split_layers(layers, start, ratio)
                logical_rows = size * ratio + page
                wanted = LayerKV.buffer_requests(
                    name=MAIN_POOL,
                    rows=size + page,
                    layers=layer_geometry(main, serving),
                    start_layer=main_start,
                    codec=codec,
                    device=device,
                    page_size=page,
                )
                if dense:
                    wanted += LayerKV.buffer_requests(
                        name=DENSE_KV_POOL,
                        rows=logical_rows,
                        layers=layer_geometry(dense, serving),
                        start_layer=dense_start,
                        codec=codec,
                        device=device,
                        page_size=page,
                    )
                wanted += cls.index_requests(INDEX_POOL, logical_rows, page, layers, start, model_dtype, device)
                check_layout_bytes(layout, wanted)
            else:
                check_layout_bytes(layout, requests((MAIN_POOL, INDEX_POOL), layers, start, size, page))
            if draft_layers is not None:
                check_layout_bytes(
                    layout, requests((DRAFT_POOL, DRAFT_INDEX_POOL), draft_layers, 0, draft_size, draft_page)
                )
        draft = None
        if draft_layers is not None:
            draft = cls(
                size=draft_size,
                page_size=draft_page,
                layers=draft_layers,
                start_layer=0,
                serving=serving,
                codec=codec,
                device=device,
                model_dtype=model_dtype,
                names=(DRAFT_POOL, DRAFT_INDEX_POOL),
                layout=layout,
                index_codec=index_codec,
            )
        return cls(
            size=size,
            page_size=page,
            layers=layers,
            start_layer=start,
            serving=serving,
            codec=codec,
            device=device,
            model_dtype=model_dtype,
            draft=draft,
            layout=layout,
            hisparse_ratio=ratio,
            index_codec=index_codec,
        )

    @staticmethod
    def index_requests(
        pool: str,
        rows: int,
        page_size: int,
        layers: list[LayerSpec],
        start_layer: int,
        model_dtype: torch.dtype,
        device: str | torch.device,
    ) -> list[BufferRequest]:
        """The indexer's requests: ``index_k`` of every sparse layer, ``index_v`` of index-value layers.

        Each ``(rows, 1, index_head_dim)`` in the model dtype; layers of one index dim share a request.
        """
        groups: dict[tuple[str, int], list[int]] = {}
        for offset, layer in enumerate(layers):
            if layer.kind != SPARSE:
                continue
            dim = int(layer.params["index_head_dim"])
            groups.setdefault(("index_k", dim), []).append(start_layer + offset)
            if layer.params["index_value"]:
                groups.setdefault(("index_v", dim), []).append(start_layer + offset)
        device = torch.device(device)
        return [
            BufferRequest(
                pool=pool,
                role=role,
                rows=rows,
                page_size=page_size,
                layers=ids,
                row_shape=(1, dim),
                dtype=model_dtype,
                device=device,
            )
            for (role, dim), ids in groups.items()
        ]

    # -- what it is ----------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        return self.main.codec.dtype

    @property
    def start_layer(self) -> int:
        return self._start

    @property
    def end_layer(self) -> int:
        return self._end

    @property
    def layer_num(self) -> int:
        return self._end - self._start

    @property
    def sparse_layer_ids(self) -> list[int]:
        return sorted(self.index_k_buffer)

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_pool().values())

    def nbytes_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name: ``kv``, ``indexer`` (if any sparse layer) and the draft's."""
        measured = {self.name: self.main.nbytes}
        if self.dense is not None:
            measured[DENSE_KV_POOL] = self.dense.nbytes
        if self.index_k_buffer:
            measured[self.index_name] = tensor_nbytes(
                list(self.index_k_buffer.values()), list(self.index_v_buffer.values())
            )
        if self.draft is not None:
            measured.update(self.draft.nbytes_by_pool())
        return measured

    # -- main K/V ------------------------------------------------------------

    def get_key_buffer(self, layer_id: int) -> Tensor:
        return self._kv(layer_id).get_key_buffer(layer_id)

    def get_value_buffer(self, layer_id: int) -> Tensor:
        return self._kv(layer_id).get_value_buffer(layer_id)

    def get_kv_buffer(self, layer_id: int) -> tuple[Tensor, Tensor]:
        kv = self._kv(layer_id)
        return kv.get_key_buffer(layer_id), kv.get_value_buffer(layer_id)

    def set_kv_buffer(self, layer_id: int, loc: Tensor, cache_k: Tensor, cache_v: Tensor) -> None:
        self._kv(layer_id).set_kv_buffer(layer_id, loc, cache_k, cache_v)

    def get_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        return self._kv(layer_id).get_kv(layer_id, loc, dtype)

    def _kv(self, layer_id: int) -> LayerKV:
        """The K/V store of ``layer_id``: the dense layers' under HiSparse, else the main one."""
        dense = self.dense
        if dense is not None and dense.start_layer <= layer_id < dense.end_layer:
            return dense
        return self.main

    # -- indexer -------------------------------------------------------------

    def get_index_k_buffer(self, layer_id: int) -> Tensor:
        return self._index(self.index_k_buffer, layer_id, "keys")

    def get_index_v_buffer(self, layer_id: int) -> Tensor:
        return self._index(self.index_v_buffer, layer_id, "values")

    def set_index_kv(self, layer_id: int, loc: Tensor, index_k: Tensor, index_v: Tensor | None = None) -> None:
        """Store ``(len(loc), 1, sparse_index_dim)`` index keys (and values on index-value layers)."""
        self.get_index_k_buffer(layer_id)[loc] = self._index_store(index_k)
        if index_v is not None:
            self.get_index_v_buffer(layer_id)[loc] = self._index_store(index_v)
        elif layer_id in self.index_v_buffer:
            raise ValueError(f"Layer {layer_id} caches index values too: pass index_v.")

    def _index_store(self, x: Tensor) -> Tensor:
        if self.index_codec is None:
            return x.to(self.model_dtype)
        data, _scale = self.index_codec.encode(x)  # fp8: a saturating cast, no scale
        return data

    def _index(self, buffers: Mapping[int, Tensor], layer_id: int, what: str) -> Tensor:
        if layer_id not in buffers:
            raise IndexError(
                f"Layer {layer_id} has no indexer {what} in the {self.index_name!r} pool: it holds "
                f"{what} of layers {sorted(buffers)} (sparse layers of [{self.start_layer}, {self.end_layer}))."
            )
        return buffers[layer_id]

    def __repr__(self) -> str:
        draft = f", draft={self.draft.layer_num} layers" if self.draft is not None else ""
        return (
            f"MiniMaxSparseKVPool(size={self.size}, page_size={self.page_size}, dtype={self.dtype}, "
            f"layers=[{self.start_layer}, {self.end_layer}), sparse={len(self.index_k_buffer)}, "
            f"device={self.device}{draft})"
        )


def _check(
    plan: Plan,
    names: tuple[str, str],
    layers: list[LayerSpec],
    serving: Serving,
    codec: KVCodec,
    rows: int,
    *,
    index_layers: list[LayerSpec] | None = None,
) -> None:
    """Refuse K/V (of ``layers``; none checked when empty) or indexer bytes (of ``index_layers``, default
    ``layers``) that differ from the plan's pools."""
    main, index = names
    if layers:
        check_planned_bytes(
            main,
            LayerKV.planned_nbytes(rows, layer_geometry(layers, serving), codec),
            plan.pool(main).bytes,
            f"{len(layers)} layer(s), {rows} rows",
        )
    item = (
        codec.store_dtype.itemsize
        if serving.m3_fp8_attn_gemm
        else torch.empty((), dtype=getattr(torch, plan.model.dtype)).element_size()
    )
    index_bytes = sum(
        rows * int(layer.params["index_head_dim"]) * item * (2 if layer.params["index_value"] else 1)
        for layer in (layers if index_layers is None else index_layers)
        if layer.kind == SPARSE
    )
    if index_bytes or any(p.name == index for p in plan.pools):
        check_planned_bytes(
            index, index_bytes, plan.pool(index).bytes, f"indexer of {len(layers)} layer(s), {rows} rows"
        )


def split_layers(
    layers: list[LayerSpec], start_layer: int, hisparse_ratio: int
) -> tuple[list[LayerSpec], int, list[LayerSpec], int]:
    """(main layers, their first id, dense layers, their first id): all layers in the main store without HiSparse;
    with it the sparse layers there and the dense ones apart, each one contiguous run of ids."""
    if hisparse_ratio <= 1:
        return layers, start_layer, [], start_layer
    sparse = [start_layer + i for i, layer in enumerate(layers) if layer.kind == SPARSE]
    dense = [start_layer + i for i, layer in enumerate(layers) if layer.kind != SPARSE]
    for ids in (sparse, dense):
        if ids and ids != list(range(ids[0], ids[0] + len(ids))):
            raise UnsupportedCombinationError(
                f"kvpools builds {option('enable_hisparse')} on MiniMax sparse attention when the stage's sparse "
                f"layers and its dense layers are each one contiguous run; this stage's are {sparse} and {dense}. "
                "`kvpools plan` gives its pools."
            )
    main = [layers[i - start_layer] for i in sparse]
    rest = [layers[i - start_layer] for i in dense]
    return main, sparse[0] if sparse else start_layer, rest, dense[0] if dense else start_layer


def _check_hisparse(
    plan: Plan, layers: list[LayerSpec], start: int, serving: Serving, codec: KVCodec, size: int, ratio: int
) -> None:
    """Refuse a HiSparse build whose K/V or indexer bytes differ from the plan's pools."""
    page = serving.page_size
    main, _, dense, _ = split_layers(layers, start, ratio)
    check_planned_bytes(
        MAIN_POOL,
        LayerKV.planned_nbytes(size + page, layer_geometry(main, serving), codec),
        plan.pool(MAIN_POOL).bytes,
        f"{len(main)} sparse layer(s), {size + page} rows",
    )
    logical_rows = size * ratio + page
    if dense:
        check_planned_bytes(
            DENSE_KV_POOL,
            LayerKV.planned_nbytes(logical_rows, layer_geometry(dense, serving), codec),
            plan.pool(DENSE_KV_POOL).bytes,
            f"{len(dense)} dense layer(s), {logical_rows} rows",
        )
    _check(plan, (MAIN_POOL, INDEX_POOL), [], serving, codec, logical_rows, index_layers=layers)
