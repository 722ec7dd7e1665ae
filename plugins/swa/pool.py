"""The hybrid SWA KV pool: SGLang's ``SWAKVPool`` built from a plan.

Two :class:`~kvpools_core.pools.kv.LayerKV` stores: the full layers' with
``full + page_size`` rows and the sliding layers' with ``swa + page_size``
rows (page 0 of each pads).  A global layer id is looked up in
``layers_mapping`` (``layer id → (index in its store, is_swa)``); kernels
address every layer with *full* slot ids, and a sliding layer translates them
through ``full_to_swa_index_mapping`` — one int64 per full slot, 0 for "no
SWA slot" (never allocated, or slid out of the window), and a trailing −1 so
that ``last_loc = -1`` translates to −1.  The allocator writes the mapping;
the pool owns it.  A model without full layers has no full store and no
mapping: its SWA slot ids are the token ids.  A speculative plan's draft
model gets its own store (``.draft``) of ``max_total_num_tokens + page_size`` rows.

The stores' K / V buffers are allocated through the build's buffer layout
(:mod:`kvpools_core.pools.layout`).  ``full_to_swa_index_mapping`` is not:
it is one int64 table per pool (not a per-layer buffer) that the allocator
writes, so it is allocated here directly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import Tensor

from kvpools_core.allocators.swa import new_full_to_swa_mapping
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.attention import LayerGeometry, layer_geometry
from kvpools_core.pools.kv import LayerKV, check_planned_bytes, tensor_nbytes
from kvpools_core.pools.layout import BufferLayout, BufferRequest, check_layout_bytes
from kvpools_core.pools.quant import KVCodec, codec_for
from kvpools_core.values import LayerSpec, Plan, Serving

from .config import FULL, SLIDING
from .sizing import DRAFT_POOL, FULL_POOL, MAPPING_ITEM_BYTES, MAPPING_POOL, SWA_POOL, draft_layer, draft_num_layers

__all__ = ["SWAKVPool", "SWARouting"]


class _LayerStore(Protocol):
    def get_key_buffer(self, layer_id: int) -> Tensor: ...
    def get_value_buffer(self, layer_id: int) -> Tensor: ...


Store = TypeVar("Store", bound=_LayerStore)


class SWARouting(ABC, Generic[Store]):
    """What both hybrid SWA pools share: which store holds a global layer, and full → SWA slots.

    A global layer id is looked up in ``layers_mapping`` (``layer id → (index
    in its store, is_swa)``); kernels address every layer with full slot ids,
    which a sliding layer translates through ``full_to_swa_index_mapping``.
    Subclasses set ``full_kv_pool`` (None without full layers), ``swa_kv_pool``
    and ``full_to_swa_index_mapping``.
    """

    full_kv_pool: Store | None
    swa_kv_pool: Store
    full_to_swa_index_mapping: Tensor | None

    def _route_layers(self, full_layer_ids: Iterable[int], swa_layer_ids: Iterable[int]) -> None:
        self.full_attention_layer_ids = sorted(full_layer_ids)
        self.swa_attention_layer_ids = sorted(swa_layer_ids)
        self.layers_mapping: dict[int, tuple[int, bool]] = {
            **{layer: (i, False) for i, layer in enumerate(self.full_attention_layer_ids)},
            **{layer: (i, True) for i, layer in enumerate(self.swa_attention_layer_ids)},
        }

    @property
    def layer_num(self) -> int:
        return len(self.layers_mapping)

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor held, measured from the tensors."""
        return sum(self.nbytes_by_pool().values())

    @abstractmethod
    def nbytes_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name."""

    def is_swa_layer(self, layer_id: int) -> bool:
        return self._locate(layer_id)[1]

    def translate_loc_from_full_to_swa(self, loc: Tensor) -> Tensor:
        """SWA slots of full slots ``loc`` (0: none; −1 stays −1); the identity without full layers."""
        if self.full_to_swa_index_mapping is None:
            return loc
        return self.full_to_swa_index_mapping[loc]

    def get_key_buffer(self, layer_id: int) -> Tensor:
        store, index = self._store(layer_id)
        return store.get_key_buffer(index)

    def get_value_buffer(self, layer_id: int) -> Tensor:
        store, index = self._store(layer_id)
        return store.get_value_buffer(index)

    def _locate(self, layer_id: int) -> tuple[int, bool]:
        try:
            return self.layers_mapping[layer_id]
        except KeyError:
            raise IndexError(
                f"Layer {layer_id} is not in this SWA pool: it holds full layers {self.full_attention_layer_ids} "
                f"and SWA layers {self.swa_attention_layer_ids} (another pipeline stage holds the rest)."
            ) from None

    def _store(self, layer_id: int) -> tuple[Store, int]:
        index, is_swa = self._locate(layer_id)
        store = self.swa_kv_pool if is_swa else self.full_kv_pool
        assert store is not None
        return store, index

    def _loc(self, layer_id: int, loc: Tensor) -> Tensor:
        """Full slots ``loc`` as the store of ``layer_id`` addresses them."""
        return self.translate_loc_from_full_to_swa(loc) if self._locate(layer_id)[1] else loc


class SWAKVPool(SWARouting[LayerKV]):
    """K and V of the full and the sliding layers of one rank, addressed by global layer id and full slot id."""

    def __init__(
        self,
        *,
        size: int,
        size_swa: int,
        page_size: int,
        full_layers: dict[int, LayerGeometry],
        swa_layers: dict[int, LayerGeometry],
        codec: KVCodec,
        device: str | torch.device,
        model_dtype: torch.dtype,
        hybrid: bool = True,
        draft_layers: list[LayerGeometry] | None = None,
        draft_size: int | None = None,
        layout: BufferLayout | None = None,
    ) -> None:
        self.size = size
        self.size_swa = size_swa
        self.page_size = page_size
        self.codec = codec
        self.hybrid = hybrid
        self._route_layers(full_layers, swa_layers)

        def store(rows: int, layers: list[LayerGeometry], name: str) -> LayerKV:
            return LayerKV(
                rows=rows,
                layers=layers,
                start_layer=0,
                codec=codec,
                device=device,
                read_dtype=model_dtype,
                name=name,
                page_size=page_size,
                layout=layout,
            )

        self.full_kv_pool: LayerKV | None = None
        self.full_to_swa_index_mapping: Tensor | None = None
        if hybrid:
            geometry = [full_layers[i] for i in self.full_attention_layer_ids]
            self.full_kv_pool = store(size + page_size, geometry, FULL_POOL)
            self.full_to_swa_index_mapping = new_mapping(size, page_size, device)
        swa_geometry = [swa_layers[i] for i in self.swa_attention_layer_ids]
        self.swa_kv_pool = store(size_swa + page_size, swa_geometry, SWA_POOL)
        self.draft: LayerKV | None = None
        if draft_layers:
            rows = (size if hybrid else size_swa) if draft_size is None else draft_size
            self.draft = store(rows + page_size, draft_layers, DRAFT_POOL)
        self.device = self.swa_kv_pool.device

    @classmethod
    def from_plan(cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None) -> SWAKVPool:
        """The pools a plan describes; refuses, before allocating, bytes the plan did not charge.

        ``layout`` carves the K / V buffers (the ``buffer_layout`` hook's answer; one tensor per layer when None).
        """
        serving = plan.serving
        kv = resolve_kv_dtype(serving.kv_cache_dtype, plan.model.dtype)
        codec = codec_for(kv)
        config = plan.sizing.sglang_config
        full, swa, page = (
            int(config["full_max_total_num_tokens"]),
            int(config["swa_max_total_num_tokens"]),
            serving.page_size,
        )
        hybrid = any(layer.kind == FULL for layer in plan.model.layers)
        start, end = rank_layer_range(plan.model, serving)
        layers = plan.model.layers[start:end]
        full_layers = {layer.index: geometry(layer, serving) for layer in layers if layer.kind == FULL}
        swa_layers = {layer.index: geometry(layer, serving) for layer in layers if layer.kind == SLIDING}
        if hybrid:
            check_planned_bytes(
                FULL_POOL,
                LayerKV.planned_nbytes(full + page, list(full_layers.values()), codec),
                plan.pool(FULL_POOL).bytes,
                f"{len(full_layers)} full layer(s), {full + page} rows of {kv.name}",
            )
            check_planned_bytes(
                MAPPING_POOL,
                (full + page + 1) * MAPPING_ITEM_BYTES,
                plan.pool(MAPPING_POOL).bytes,
                f"{full + page + 1} int64 entries",
            )
        check_planned_bytes(
            SWA_POOL,
            LayerKV.planned_nbytes(swa + page, list(swa_layers.values()), codec),
            plan.pool(SWA_POOL).bytes,
            f"{len(swa_layers)} SWA layer(s), {swa + page} rows of {kv.name}",
        )
        drafts = draft_num_layers(serving)
        draft = [geometry(draft_layer(plan.model), serving)] * drafts
        if drafts:
            rows = plan.max_total_num_tokens + page
            check_planned_bytes(
                DRAFT_POOL,
                LayerKV.planned_nbytes(rows, draft, codec),
                plan.pool(DRAFT_POOL).bytes,
                f"{drafts} draft layer(s) of a full layer's geometry, {rows} rows of {kv.name}",
            )
        if layout is not None:  # every store's bytes, before the first tensor
            stores = [(SWA_POOL, swa + page, list(swa_layers.values()))]
            if hybrid:
                stores.append((FULL_POOL, full + page, list(full_layers.values())))
            if drafts:
                stores.append((DRAFT_POOL, plan.max_total_num_tokens + page, draft))
            requests: list[BufferRequest] = []
            for name, rows, store_layers in stores:
                requests += LayerKV.buffer_requests(
                    name=name, rows=rows, layers=store_layers, start_layer=0, codec=codec, device=device, page_size=page
                )
            check_layout_bytes(layout, requests)
        return cls(
            size=full,
            size_swa=swa,
            page_size=page,
            full_layers=full_layers,
            swa_layers=swa_layers,
            codec=codec,
            device=device,
            model_dtype=getattr(torch, plan.model.dtype),
            hybrid=hybrid,
            draft_layers=draft,
            draft_size=plan.max_total_num_tokens,
            layout=layout,
        )

    # -- what it is ----------------------------------------------------------

    @property
    def dtype(self) -> torch.dtype:
        return self.codec.dtype

    def nbytes_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name (both stores, the mapping, the draft store)."""
        measured = {}
        if self.full_kv_pool is not None and self.full_to_swa_index_mapping is not None:
            measured[FULL_POOL] = self.full_kv_pool.nbytes
            measured[MAPPING_POOL] = tensor_nbytes([self.full_to_swa_index_mapping])
        measured[SWA_POOL] = self.swa_kv_pool.nbytes
        if self.draft is not None:
            measured[DRAFT_POOL] = self.draft.nbytes
        return measured

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """``(K bytes, V bytes)`` of both stores (scales included, draft excluded)."""
        k, v = self.swa_kv_pool.get_kv_size_bytes()
        if self.full_kv_pool is not None:
            fk, fv = self.full_kv_pool.get_kv_size_bytes()
            k, v = k + fk, v + fv
        return k, v

    # -- buffers ---------------------------------------------------------------

    def get_kv_buffer(self, layer_id: int) -> tuple[Tensor, Tensor]:
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(self, layer_id: int, loc: Tensor, cache_k: Tensor, cache_v: Tensor) -> None:
        """Store K and V of full slots ``loc`` (translated to SWA slots for a sliding layer)."""
        store, index = self._store(layer_id)
        store.set_kv_buffer(index, self._loc(layer_id, loc), cache_k, cache_v)

    def get_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """K and V of full slots ``loc``, dequantised to ``dtype`` (default: the model dtype)."""
        store, index = self._store(layer_id)
        return store.get_kv(index, self._loc(layer_id, loc), dtype)

    # -- host copies (retraction) ------------------------------------------------

    def get_cpu_copy(self, indices: Tensor) -> dict[str, Any]:
        """The KV of full slots ``indices`` in host memory: full layers' rows, and the sliding layers' rows of the
        slots that still have an SWA slot (a tail-only extend or ``free_swa`` leaves the others unmapped), with the
        mask of which; SGLang's ``SWAKVPool.get_cpu_copy`` (``swa_memory_pool.py`` L368).  Opaque: hand it back
        to :meth:`load_cpu_copy`."""
        index = torch.as_tensor(indices).to(device=self.device, dtype=torch.int64).reshape(-1)
        draft = None if self.draft is None else self.draft.get_cpu_copy(index)
        if self.full_kv_pool is None or self.full_to_swa_index_mapping is None:  # every layer slides: slot = SWA slot
            return {"full": None, "swa": self.swa_kv_pool.get_cpu_copy(index), "swa_mask": None, "draft": draft}
        swa = self.full_to_swa_index_mapping[index]
        mask = swa > 0
        return {
            "full": self.full_kv_pool.get_cpu_copy(index),
            "swa": self.swa_kv_pool.get_cpu_copy(swa[mask]),
            "swa_mask": mask.cpu(),
            "draft": draft,
        }

    def load_cpu_copy(self, kv_cache_cpu: dict[str, Any], indices: Tensor) -> None:
        """Write a :meth:`get_cpu_copy` result into full slots ``indices``; the SWA rows go to the SWA slots they
        map to now, which must exist wherever the copy has SWA rows (allocate the same window tail)."""
        index = torch.as_tensor(indices).to(device=self.device, dtype=torch.int64).reshape(-1)
        if self.draft is not None:
            self.draft.load_cpu_copy(kv_cache_cpu["draft"], index)
        if self.full_kv_pool is None or self.full_to_swa_index_mapping is None:
            self.swa_kv_pool.load_cpu_copy(kv_cache_cpu["swa"], index)
            return
        mask = kv_cache_cpu["swa_mask"].to(self.device)
        if mask.shape != index.shape:
            raise ValueError(
                f"load_cpu_copy(): the copy is of {mask.numel()} slots but {index.numel()} indices were given; "
                "pass as many new slots as were copied"
            )
        swa = self.full_to_swa_index_mapping[index][mask]
        if bool((swa <= 0).any()):
            raise ValueError(
                "load_cpu_copy(): some new slots have no SWA slot where the copy holds sliding-window KV; "
                "allocate the new slots with at least the window tail that was copied (alloc_extend_swa_tail)"
            )
        self.full_kv_pool.load_cpu_copy(kv_cache_cpu["full"], index)
        self.swa_kv_pool.load_cpu_copy(kv_cache_cpu["swa"], swa)

    def __repr__(self) -> str:
        return (
            f"SWAKVPool(size={self.size}, size_swa={self.size_swa}, page_size={self.page_size}, dtype={self.dtype}, "
            f"full layers={len(self.full_attention_layer_ids)}, SWA layers={len(self.swa_attention_layer_ids)}, "
            f"device={self.device})"
        )


def new_mapping(size: int, page_size: int, device: str | torch.device) -> Tensor:
    """``full_to_swa_index_mapping``: ``size + page_size`` zeros and the trailing −1 sentinel (the core's)."""
    return new_full_to_swa_mapping(size, page_size, device)


def geometry(layer: LayerSpec, serving: Serving) -> LayerGeometry:
    """What one layer stores per token on this rank (the parts library's head sharding)."""
    return layer_geometry([layer], serving)[0]
