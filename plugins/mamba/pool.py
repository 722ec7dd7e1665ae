"""The hybrid pools built from a plan: SGLang's ``MambaPool``, ``HybridReqToTokenPool`` and ``HybridLinearKVPool``.

* :class:`MambaStatePool` — per recurrent layer of this rank, conv tensors
  ``(layers, K + 1, *conv_shape)`` and an SSM tensor ``(layers, K + 1, *ssm_shape)``
  (slot 0 pads), with a slot allocator handing out ``1..K``.
* :class:`HybridReqToTokenPool` — the request table (core
  :class:`~kvpools_core.pools.ReqToTokenPool`) plus ``req_index_to_mamba_index_mapping``
  (int32 per row) and, with the extra buffer, the ping-pong slot table
  (int64, 2 columns with overlap, else 1); it owns the state pool, as in
  SGLang, and the speculative intermediate state ``(layers, rows, D, *shape)``
  (the dense layout, whose bytes are SGLang's charge).
* :class:`HybridMambaDecodeReqToTokenPool` — a PD decode node's table: the
  running requests' rows plus ``pre_alloc_size`` rows for transfers, each
  with its state slot (SGLang's ``HybridMambaDecodeReqToTokenPool``).
* :class:`HybridLinearKVPool` — K and V of the full-attention layers only
  (an MLA latent row for MLA-based hybrids: the parts library's
  ``MLATokenToKVPool``), addressed by global layer id (and the draft model's KV pool).

The full-attention K/V (or latent rows) are allocated through the build's
buffer layout (:mod:`kvpools_core.pools.layout`), and so are the state
tensors, so a platform can carve them too (SGLang's NPU keeps the conv window
before the channels): one request per state kind, rows = the ``K + 1`` state
slots (``page_size`` 1), in the roles ``conv`` (rows of ``(channels, window)``),
``conv_window_first`` (KDA's ``(window, channels)``) and ``ssm``.  The pool
exposes each kind as one ``(layers, K + 1, *shape)`` view (SGLang's
``MambaPool.conv[i]`` / ``temporal``), so a layout must carve a state request's
layers from one tensor at an even stride; under the core's per-layer default
the state is carved layer-major, which is SGLang's CUDA ``MambaPool`` memory.
The speculative intermediate state is not routed: SGLang allocates it dense in
the canonical shape on every platform (CUDA's dedup view aside).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from kvpools_core.allocators import TokenAllocator
from kvpools_core.dtypes import MODEL_DTYPES
from kvpools_core.errors import BufferLayoutError
from kvpools_core.parts.indexer import index_head_dim, index_kpool, index_layer_mask
from kvpools_core.parts.names import DRAFT_KV_POOL, INDEX_POOL, KV_POOL
from kvpools_core.parts.sizing import req_to_token_row_len, req_to_token_rows
from kvpools_core.pools import ReqToTokenPool, check_planned_bytes
from kvpools_core.pools.dsa import DSATokenToKVPool, IndexStorage, index_storage, plan_latent_row
from kvpools_core.pools.kv import allocate, tensor_nbytes
from kvpools_core.pools.layout import (
    LAYER_MAJOR,
    BufferLayout,
    BufferRequest,
    PerLayerLayout,
    allocate_buffers,
    check_layout_bytes,
    describe_layout,
)
from kvpools_core.pools.mha import MHATokenToKVPool
from kvpools_core.pools.mla import MLATokenToKVPool, check_latent_bytes
from kvpools_core.pools.req_to_token import DecodeRows
from kvpools_core.values import LayerSpec, ModelSpec, Plan, Serving

from .config import GDN
from .dsa import is_dsa_hybrid
from .latent import is_mla_hybrid, latent_row
from .ple import NGRAM_POOL, NGRAM_SPEC_POOL, SHORT_CONV_POOL, SHORT_CONV_SPEC_POOL, PleState, ple_state
from .qsa import QSA_COMPRESSED_POOL, QSA_KEY_STATE_POOL, QSA_ROPE_POOL, QSAProfile, qsa_profile
from .replayssm import RING_POOL, ring_geometry, spec_active
from .sizing import (
    MAPPING_POOL,
    SLOT_ALLOCATOR_POOL,
    SPEC_STATE_POOL,
    STATE_POOL,
    draft_tokens,
    ping_pong_size,
    ping_pong_slots_per_request,
    spec_state_rows,
)
from .state import StateShape, rank_full_attention_layers, rank_state_layer_ids, state_shape

__all__ = [
    "CONV_ROLE",
    "SSM_ROLE",
    "WINDOW_FIRST_CONV_ROLE",
    "HybridLinearKVPool",
    "HybridMambaDecodeReqToTokenPool",
    "HybridReqToTokenPool",
    "MambaSpecState",
    "MambaStatePool",
    "state_layout",
]

DRAFT_POOL = DRAFT_KV_POOL
CONV_ROLE = "conv"
"""The conv state's buffer role: rows of ``(channels, window)`` (SGLang's ``(conv_dim / tp, K - 1)``)."""
WINDOW_FIRST_CONV_ROLE = "conv_window_first"
"""The conv state's role when its rows are already ``(window, channels)`` (KDA's ``(K - 1, 3 x heads x dim)``)."""
SSM_ROLE = "ssm"
"""The SSM state's buffer role (SGLang's ``temporal``)."""


def state_layout(layout: BufferLayout | None) -> BufferLayout:
    """The layout the state is carved by: the platform's, or layer-major under the per-layer default.

    The core's per-layer default is SGLang's CUDA carving of token pools; its
    CUDA ``MambaPool`` keeps one ``(layers, K + 1, ...)`` tensor per state kind,
    which is :data:`~kvpools_core.pools.layout.LAYER_MAJOR`.
    """
    return LAYER_MAJOR if layout is None or isinstance(layout, PerLayerLayout) else layout


class MambaStatePool:
    """Conv and SSM state of this rank's recurrent layers for ``size`` slots (+ slot 0), and their allocator."""

    def __init__(
        self,
        *,
        size: int,
        layer_ids: Sequence[int],
        shape: StateShape,
        device: str | torch.device,
        checked: bool = False,
        layout: BufferLayout | None = None,
    ) -> None:
        """``layout`` carves the state tensors (:func:`state_layout`: layer-major when None or per-layer)."""
        self.size = size
        self.shape = shape
        self.layer_ids = tuple(layer_ids)
        self._local = {layer_id: i for i, layer_id in enumerate(self.layer_ids)}
        self.layout = state_layout(layout)
        requests = self.buffer_requests(size=size, layer_ids=self.layer_ids, shape=shape, device=device)
        check_layout_bytes(self.layout, requests)  # every kind's bytes, before the first tensor
        *self.conv, self.ssm = [_stacked(self.layout, allocate_buffers(self.layout, r), r) for r in requests]
        self.allocator = TokenAllocator(size, device=device, checked=checked)
        self.device = self.ssm.device

    @staticmethod
    def buffer_requests(
        *, size: int, layer_ids: Sequence[int], shape: StateShape, device: str | torch.device
    ) -> list[BufferRequest]:
        """What the pool asks its layout for: each conv kind, then the SSM state, ``size + 1`` slot rows each."""
        conv_role = WINDOW_FIRST_CONV_ROLE if shape.conv_window_first else CONV_ROLE
        kinds = [(conv_role, conv, shape.conv_dtype) for conv in shape.conv] + [(SSM_ROLE, shape.ssm, shape.ssm_dtype)]
        return [
            BufferRequest(
                pool=STATE_POOL,
                role=role,
                rows=size + 1,
                page_size=1,
                layers=layer_ids,
                row_shape=row_shape,
                dtype=getattr(torch, dtype),
                device=device,
            )
            for role, row_shape, dtype in kinds
        ]

    @staticmethod
    def planned_nbytes(size: int, num_layers: int, shape: StateShape) -> int:
        """The state tensors' bytes, from shapes alone: ``(K + 1) x layers x per-layer state``."""
        return (size + 1) * num_layers * shape.bytes

    @property
    def nbytes(self) -> int:
        return self.state_nbytes + int(self.allocator.nbytes)

    @property
    def state_nbytes(self) -> int:
        """Bytes of the conv and SSM tensors (the allocator's free stack excluded)."""
        return tensor_nbytes(self.conv, [self.ssm])

    def available_size(self) -> int:
        return int(self.allocator.available_size())

    def alloc(self, need_size: int) -> Tensor | None:
        """``need_size`` free state slots (int64), or ``None``, changing nothing, when too few are free."""
        return self.allocator.alloc(need_size)

    def free(self, slots: Tensor) -> None:
        self.allocator.free(slots.to(torch.int64))

    def clear_slots(self, slots: Tensor) -> None:
        """Zero the state of ``slots`` in every layer (a new request starts from an empty state)."""
        for tensor in (*self.conv, self.ssm):
            tensor[:, slots] = 0

    def copy_from(self, src: Tensor, dst: Tensor) -> None:
        """Copy the state of slots ``src`` into ``dst`` in every layer (the radix cache's copy-on-write)."""
        for tensor in (*self.conv, self.ssm):
            tensor[:, dst] = tensor[:, src]

    def layer_cache(self, layer_id: int) -> tuple[list[Tensor], Tensor]:
        """``(conv tensors, SSM tensor)`` of one recurrent layer (global id), each indexed by slot."""
        i = self._local_index(layer_id)
        return [conv[i] for conv in self.conv], self.ssm[i]

    def _local_index(self, layer_id: int) -> int:
        if layer_id not in self._local:
            raise IndexError(
                f"Layer {layer_id} has no recurrent state on this rank; it holds layers {list(self.layer_ids)} "
                f"(global ids)."
            )
        return self._local[layer_id]

    def __repr__(self) -> str:
        return (
            f"MambaStatePool(slots={self.size} + 1 padding, layers={len(self.layer_ids)}, "
            f"{self.shape.describe()}, free={self.available_size()}, device={self.device})"
        )


class MambaSpecState:
    """Speculative verification's intermediate state: per request row, ``D`` draft tokens' conv and SSM state."""

    def __init__(
        self,
        *,
        rows: int,
        draft_tokens: int,
        num_layers: int,
        shape: StateShape,
        device: str | torch.device,
        ssm: bool = True,
    ):
        lead = (num_layers, rows, draft_tokens)
        self.draft_tokens = draft_tokens
        self.intermediate_conv = [allocate(lead + c, getattr(torch, shape.conv_dtype), device) for c in shape.conv]
        # ReplaySSM spec-verify (``ssm=False``): the ring owns rollback, SGLang allocates no intermediate SSM state.
        self.intermediate_ssm = allocate(lead + shape.ssm, getattr(torch, shape.ssm_dtype), device) if ssm else None

    @property
    def nbytes(self) -> int:
        ssm = [] if self.intermediate_ssm is None else [self.intermediate_ssm]
        return tensor_nbytes(self.intermediate_conv, ssm)


class ReplaySSMRing:
    """SGLang's ReplaySSM ring tensors (``MambaPool.__init__``): ``d``, ``k``, the gate ``g``, and the spec ring's
    low parts (GDN) or raw-input window (KDA), each ``(layers, rows, heads, L[, dim])``."""

    def __init__(
        self, *, model: ModelSpec, serving: Serving, rows: int, num_layers: int, device: str | torch.device
    ) -> None:
        g = ring_geometry(model, serving)
        shape = state_shape(model, serving)
        length = serving.linear_replayssm_cache_len
        spec = serving.enable_linear_replayssm_spec
        ring_dtype = shape.conv_dtype if spec else shape.ssm_dtype
        lead = (num_layers, rows)
        f32, conv = "float32", shape.conv_dtype
        self.shapes: list[tuple[tuple[int, ...], str]] = [
            ((*lead, g.hv, length, g.v_dim), ring_dtype),  # d
            ((*lead, g.h_k, length, g.k_dim), ring_dtype),  # k
            ((*lead, g.hv, length, g.k_dim) if g.kda else (*lead, g.hv, length), f32),  # g
        ]
        if spec and g.kda:  # raw v, raw k, beta
            self.shapes += [
                ((*lead, g.hv, length, g.v_dim), conv),
                ((*lead, g.h_k, length, g.k_dim), conv),
                ((*lead, g.hv, length), f32),
            ]
        elif spec and ring_dtype != f32:  # the low parts of d and k
            self.shapes += [((*lead, g.hv, length, g.v_dim), conv), ((*lead, g.h_k, length, g.k_dim), conv)]
        self.device = device
        self.tensors: list[Tensor] = []

    @property
    def planned_nbytes(self) -> int:
        return sum(math.prod(shape) * MODEL_DTYPES[dtype] for shape, dtype in self.shapes)

    def allocate(self) -> None:
        self.tensors = [allocate(shape, getattr(torch, dtype), self.device) for shape, dtype in self.shapes]

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.tensors)


class PleStatePools:
    """Qwen4-Exp's PLE state beside the state pool (SGLang's ``ShortConvPool`` and ``NGramPool``, addressed by
    state slot): short-conv windows ``(layers, slots + 1) + shape``, n-gram context ``(slots + 1, context)`` int64
    (filled with ``eos_token_id`` by SGLang; zeros here), and with speculation their per-draft-token copies."""

    def __init__(
        self, *, ple: PleState, slots: int, spec_rows: int | None, draft_tokens: int, device: str | torch.device
    ) -> None:
        self.tensors: dict[str, Tensor] = {}
        if ple.short_conv_bytes_per_slot:
            assert ple.shape is not None
            conv_dtype = getattr(torch, ple.conv_dtype)
            layers = len(ple.layer_ids)
            self.tensors[SHORT_CONV_POOL] = allocate((layers, slots + 1, *ple.shape), conv_dtype, device)
            if spec_rows is not None:
                shape = (layers, spec_rows + 1, draft_tokens, *ple.shape)
                self.tensors[SHORT_CONV_SPEC_POOL] = allocate(shape, conv_dtype, device)
        if ple.ngram_bytes_per_slot:
            context = ple.ngram_context_len
            self.tensors[NGRAM_POOL] = allocate((slots + 1, context), torch.int64, device)
            if spec_rows is not None:
                self.tensors[NGRAM_SPEC_POOL] = allocate((spec_rows + 1, draft_tokens, context), torch.int64, device)

    def nbytes_by_pool(self) -> dict[str, int]:
        return {name: tensor_nbytes([tensor]) for name, tensor in self.tensors.items()}


class HybridReqToTokenPool(ReqToTokenPool):
    """The request table of a hybrid: each row also maps to its state slot (and ping-pong slots).

    ``alloc`` takes, per new request, one row, one state slot and the
    extra buffer's ping-pong slots, all or nothing; ``free`` gives back the
    row and, unless the radix cache keeps it (``free_state=False``), its slots.
    """

    def __init__(
        self,
        size: int,
        max_context_len: int,
        device: str | torch.device,
        *,
        mamba_pool: MambaStatePool,
        ping_pong_size: int = 0,
        ping_pong_slots: int = 0,
        spec_state: MambaSpecState | None = None,
        ple_state: PleStatePools | None = None,
        replayssm_ring: ReplaySSMRing | None = None,
    ) -> None:
        super().__init__(size, max_context_len, device)
        self.replayssm_ring = replayssm_ring
        self.mamba_pool = mamba_pool
        self.spec_state = spec_state
        self.ple_state = ple_state
        self.ping_pong_size = ping_pong_size
        self.ping_pong_slots = ping_pong_slots
        rows = self.req_to_token.shape[0]
        self.req_index_to_mamba_index_mapping = allocate((rows,), torch.int32, device)
        self.req_index_to_mamba_ping_pong_track_buffer_mapping: Tensor | None = None
        if ping_pong_size:
            self.req_index_to_mamba_ping_pong_track_buffer_mapping = allocate(
                (rows, ping_pong_size), torch.int64, device
            )

    @classmethod
    def from_plan(
        cls, plan: Plan, device: str | torch.device, *, checked: bool = False, layout: BufferLayout | None = None
    ) -> HybridReqToTokenPool:
        """The table, state pool and speculative state of a plan; checks every pool's bytes before allocating.

        ``layout`` carves the state tensors (the ``buffer_layout`` hook's answer; layer-major when None).
        """
        model, serving = plan.model, plan.serving
        shape = state_shape(model, serving)
        layer_ids = rank_state_layer_ids(model, serving)
        k = plan.sizing.state_slots  # SGLang's K; on a PD decode node raised to cover every row
        rows, padding = req_to_token_rows(plan.max_running_requests, serving)
        row_len = req_to_token_row_len(serving.context_length or model.context_len, serving)
        pp = ping_pong_size(serving)
        d = draft_tokens(serving)
        want = {
            "req_to_token": ((rows + padding) * row_len * 4, f"{rows} + {padding} rows of {row_len} int32"),
            MAPPING_POOL: ((rows + padding) * (4 + 8 * pp), f"{rows + padding} rows x (int32 + {pp} int64)"),
            STATE_POOL: (
                MambaStatePool.planned_nbytes(k, len(layer_ids), shape),
                f"{k} + 1 slots x {len(layer_ids)} layers x ({shape.describe()})",
            ),
            SLOT_ALLOCATOR_POOL: (int(TokenAllocator.planned_nbytes(k)), f"int64 free stack of {k} slots"),
        }
        spec_rows = spec_state_rows(plan.max_running_requests, serving) + 1
        has_spec = any(p.name == SPEC_STATE_POOL for p in plan.pools)
        replay = spec_active(model, serving)
        if has_spec:
            want[SPEC_STATE_POOL] = (
                spec_rows * d * len(layer_ids) * (shape.conv_bytes if replay else shape.bytes),
                f"{spec_rows} rows x {d} draft tokens x {len(layer_ids)} layers"
                + (" (conv windows only: ReplaySSM)" if replay else ""),
            )
        ring = None
        if replay or serving.enable_linear_replayssm:
            per_request = replay and model.params["mixer"] == GDN
            ring_rows = spec_rows if per_request else k + 1
            ring = ReplaySSMRing(model=model, serving=serving, rows=ring_rows, num_layers=len(layer_ids), device=device)
            want[RING_POOL] = (
                ring.planned_nbytes,
                f"{ring_rows} rows x {len(layer_ids)} layers, L = {serving.linear_replayssm_cache_len}",
            )
        ple = ple_state(model, serving)
        if ple is not None:
            for name, per_slot, count, what in (
                (SHORT_CONV_POOL, ple.short_conv_bytes_per_slot, k + 1, f"{k} + 1 slots"),
                (SHORT_CONV_SPEC_POOL, d * ple.short_conv_bytes_per_slot, spec_rows, f"{spec_rows} rows x {d}"),
                (NGRAM_POOL, ple.ngram_bytes_per_slot, k + 1, f"{k} + 1 slots"),
                (NGRAM_SPEC_POOL, d * ple.ngram_bytes_per_slot, spec_rows, f"{spec_rows} rows x {d}"),
            ):
                if per_slot and (has_spec or not name.endswith("_spec")):
                    want[name] = (count * per_slot, f"{what} x {ple.describe()}")
        for name, (allocating, detail) in want.items():
            check_planned_bytes(name, allocating, plan.pool(name).bytes, detail)
        mamba_pool = MambaStatePool(
            size=k, layer_ids=layer_ids, shape=shape, device=device, checked=checked, layout=layout
        )
        spec = None
        if has_spec:
            spec = MambaSpecState(
                rows=spec_rows, draft_tokens=d, num_layers=len(layer_ids), shape=shape, device=device, ssm=not replay
            )
        if ring is not None:
            ring.allocate()
        parts: dict[str, Any] = {
            "mamba_pool": mamba_pool,
            "ping_pong_size": pp,
            "ping_pong_slots": ping_pong_slots_per_request(serving),
            "spec_state": spec,
            "replayssm_ring": ring,
            "ple_state": None
            if ple is None
            else PleStatePools(
                ple=ple, slots=k, spec_rows=spec_rows - 1 if has_spec else None, draft_tokens=d, device=device
            ),
        }
        if serving.decode_request_pools:
            return HybridMambaDecodeReqToTokenPool(
                plan.max_running_requests, row_len, device, pre_alloc_size=serving.decode_extra_slots, **parts
            )
        return cls(rows, row_len, device, **parts)

    # -- sizes ---------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_pool().values())

    def nbytes_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name: the table, the slot mapping, the state pool and its allocator."""
        mapping = [self.req_index_to_mamba_index_mapping]
        if self.req_index_to_mamba_ping_pong_track_buffer_mapping is not None:
            mapping.append(self.req_index_to_mamba_ping_pong_track_buffer_mapping)
        measured = {
            "req_to_token": super().nbytes,
            MAPPING_POOL: tensor_nbytes(mapping),
            STATE_POOL: self.mamba_pool.state_nbytes,
            **self.mamba_pool.allocator.nbytes_by_pool(SLOT_ALLOCATOR_POOL),
        }
        if self.spec_state is not None:
            measured[SPEC_STATE_POOL] = self.spec_state.nbytes
        if self.ple_state is not None:
            measured.update(self.ple_state.nbytes_by_pool())
        if self.replayssm_ring is not None:
            measured[RING_POOL] = self.replayssm_ring.nbytes
        return measured

    # -- rows and slots ------------------------------------------------------

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` rows, each with a fresh (zeroed) state slot and its ping-pong slots; ``None`` if short."""
        rows = super().alloc(need_size)
        if rows is None or not rows:
            return rows
        per_request = 1 + self.ping_pong_slots
        slots = self.mamba_pool.alloc(need_size * per_request)
        if slots is None:
            super().free(rows)
            return None
        index = torch.tensor(rows, dtype=torch.int64, device=self.req_to_token.device)
        slots = slots.to(self.req_to_token.device).view(need_size, per_request)
        self.mamba_pool.clear_slots(slots[:, 0])
        self.req_index_to_mamba_index_mapping[index] = slots[:, 0].to(torch.int32)
        table = self.req_index_to_mamba_ping_pong_track_buffer_mapping
        if table is not None:
            columns = torch.full((need_size, self.ping_pong_size), -1, dtype=torch.int64, device=table.device)
            columns[:, : self.ping_pong_slots] = slots[:, 1:]
            table[index] = columns
        return rows

    def free(self, free_index: int | Iterable[int] | Tensor, *, free_state: bool = True) -> None:
        """Return rows with their state and ping-pong slots (kept when ``free_state`` is false: a cached prefix)."""
        rows = [free_index] if isinstance(free_index, int) else [int(i) for i in free_index]
        super().free(rows)  # validates the rows (an unknown or free row raises, changing nothing)
        index = torch.tensor(rows, dtype=torch.int64, device=self.req_to_token.device)
        slots = self.req_index_to_mamba_index_mapping[index].to(torch.int64)
        table = self.req_index_to_mamba_ping_pong_track_buffer_mapping
        if free_state and table is not None and self.ping_pong_slots:
            extra = table[index, : self.ping_pong_slots].reshape(-1)
            slots = torch.cat([slots, extra[extra > 0]])
        if free_state and slots.numel():
            self.mamba_pool.free(slots.cpu() if self.mamba_pool.device.type == "cpu" else slots)
        self.req_index_to_mamba_index_mapping[index] = 0
        if table is not None:
            table[index] = -1

    def get_mamba_indices(self, req_indices: Tensor) -> Tensor:
        """State slots of request rows."""
        return self.req_index_to_mamba_index_mapping[req_indices]

    def clear(self) -> None:
        super().clear()
        if hasattr(self, "mamba_pool"):
            self.mamba_pool.allocator.clear()

    def __repr__(self) -> str:
        return f"HybridReqToTokenPool({super().__repr__()}, {self.mamba_pool!r})"


class HybridMambaDecodeReqToTokenPool(DecodeRows, HybridReqToTokenPool):
    """A PD decode node's hybrid table: ``size`` running requests plus ``pre_alloc_size`` rows for transfers.

    SGLang's ``HybridMambaDecodeReqToTokenPool`` (``disaggregation/decode.py``): the rows of
    ``DecodeReqToTokenPool`` (``size + pre_alloc_size + 1``, every one but row 0 handed out, each hand-out
    counted in ``req_generation``), each with its state slot; the plan's state pool already holds
    ``max(K, (size + pre_alloc_size) x slots per request)`` slots (:func:`.sizing.decode_state_slots`).
    """


class QSABuffers:
    """``QSATokenToKVPool``'s own buffers (``mem_cache/qsa_kv_pool.py``, :mod:`.qsa`): the compressed index keys
    ``(L, ceil(rows / ratio) x kv_heads x head_dim)`` bf16 in one flat tensor, per layer the pending key ring
    ``(request_slots x ratio, kv_heads, head_dim)`` bf16, and the ``(request_slots x ratio, 3)`` int64 MRoPE ring."""

    def __init__(
        self,
        *,
        profile: QSAProfile,
        layers: int,
        rows: int,
        request_slots: int,
        device: str | torch.device,
        fp8: bool = False,
    ):
        self.profile = profile
        self.compressed_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
        """``--qsa-indexer-dtype``: fp8_e4m3, else bf16 (the pending ring is always bf16)."""
        self.layers = layers
        self.capacity = -(rows // -profile.compress_ratio)
        self.ring_slots = request_slots * profile.compress_ratio
        self.device = device
        self.compressed_flat: Tensor | None = None
        self.key_state: list[Tensor] = []
        self.rope_positions: Tensor | None = None

    def planned_nbytes(self) -> dict[str, int]:
        p = self.profile
        return {
            QSA_COMPRESSED_POOL: self.layers * self.capacity * p.kv_heads * p.head_dim * self.compressed_dtype.itemsize,
            QSA_KEY_STATE_POOL: self.layers * self.ring_slots * p.kv_heads * p.head_dim * 2,
            QSA_ROPE_POOL: self.ring_slots * 3 * 8,
        }

    def allocate(self) -> None:
        p = self.profile
        self.compressed_flat = allocate(
            (self.layers, self.capacity * p.kv_heads * p.head_dim), self.compressed_dtype, self.device
        )
        self.key_state = [
            allocate((self.ring_slots, p.kv_heads, p.head_dim), torch.bfloat16, self.device) for _ in range(self.layers)
        ]
        self.rope_positions = allocate((self.ring_slots, 3), torch.int64, self.device)

    def compressed_k(self, local_layer: int) -> Tensor:
        """Layer ``local_layer``'s compressed keys, ``(capacity, kv_heads, head_dim)`` (a view of the flat tensor)."""
        assert self.compressed_flat is not None
        return self.compressed_flat[local_layer].view(self.capacity, self.profile.kv_heads, self.profile.head_dim)

    def nbytes_by_pool(self) -> dict[str, int]:
        measured = {
            QSA_COMPRESSED_POOL: tensor_nbytes([] if self.compressed_flat is None else [self.compressed_flat]),
            QSA_KEY_STATE_POOL: tensor_nbytes(self.key_state),
            QSA_ROPE_POOL: tensor_nbytes([] if self.rope_positions is None else [self.rope_positions]),
        }
        return measured

    def __repr__(self) -> str:
        return (
            f"QSABuffers({self.layers} layer(s), {self.capacity} compressed rows, {self.ring_slots} ring rows, "
            f"{self.profile.describe()})"
        )


class HybridLinearKVPool:
    """KV of this rank's full-attention layers, addressed by global layer id (state lives in the request table).

    ``full`` is an MHA pool (K and V) or, for MLA-based hybrids, an MLA pool
    (one latent row; ``use_mla`` in SGLang), of the full-attention layers only.
    """

    def __init__(
        self,
        *,
        full: MHATokenToKVPool | MLATokenToKVPool,
        full_attention_layer_ids: Sequence[int],
        qsa: QSABuffers | None = None,
    ) -> None:
        self.full = full
        self.qsa = qsa
        """SGLang's ``QSATokenToKVPool`` buffers (:class:`QSABuffers`) of a QSA model, else None."""
        self.full_attention_layer_ids = tuple(full_attention_layer_ids)
        self.full_attention_layer_id_mapping = {layer_id: i for i, layer_id in enumerate(self.full_attention_layer_ids)}
        self.size = full.size
        self.page_size = full.page_size
        self.device = full.device

    @classmethod
    def from_plan(
        cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None
    ) -> HybridLinearKVPool:
        """The full-attention layers' pool; ``layout`` carves its buffers (one tensor per layer when None)."""
        full_layers = rank_full_attention_layers(plan.model, plan.serving)
        full: MHATokenToKVPool | MLATokenToKVPool
        if is_dsa_hybrid(plan.model):
            full = _build_dsa_pool(plan, full_layers, device, layout)
        elif is_mla_hybrid(plan.model):
            full = _build_latent_pool(plan, len(full_layers), device, layout)
        else:
            full = MHATokenToKVPool.from_layers(
                plan, full_layers, device, start_layer=0, pool_name=KV_POOL, layout=layout
            )
        profile = qsa_profile(plan.model)
        qsa = None
        if profile is not None:
            rows, padding = req_to_token_rows(plan.max_running_requests, plan.serving)
            qsa = QSABuffers(
                profile=profile,
                layers=len(full_layers),
                rows=plan.max_total_num_tokens + plan.serving.page_size,
                request_slots=rows + padding,
                device=device,
                fp8=plan.serving.qsa_indexer_dtype == "fp8_e4m3",
            )
            for name, nbytes in qsa.planned_nbytes().items():
                check_planned_bytes(name, nbytes, plan.pool(name).bytes, f"{qsa!r}")
            qsa.allocate()
        return cls(full=full, full_attention_layer_ids=[layer.index for layer in full_layers], qsa=qsa)

    @property
    def use_mla(self) -> bool:
        return isinstance(self.full, MLATokenToKVPool)

    @property
    def draft(self) -> MHATokenToKVPool | MLATokenToKVPool | None:
        return self.full.draft

    @property
    def dtype(self) -> torch.dtype:
        return self.full.dtype

    @property
    def layer_num(self) -> int:
        return len(self.full_attention_layer_ids)

    @property
    def nbytes(self) -> int:
        return self.full.nbytes

    def nbytes_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name: ``kv`` and, with a draft, ``draft_kv`` (and the QSA buffers)."""
        measured = self.full.nbytes_by_pool()
        if isinstance(self.full, DSATokenToKVPool) and not self.full.index_layer_ids:
            measured.pop(INDEX_POOL, None)  # every full layer shares another's top-k: the plan has no indexer pool
        if self.qsa is not None:
            measured.update(self.qsa.nbytes_by_pool())
        return measured

    def get_kv_size_bytes(self) -> tuple[int, int] | int:
        """The full pool's ``get_kv_size_bytes``: ``(K bytes, V bytes)`` for MHA, the latent bytes for MLA."""
        return self.full.get_kv_size_bytes()

    def get_key_buffer(self, layer_id: int) -> Tensor:
        return self.full.get_key_buffer(self._local(layer_id))

    def get_value_buffer(self, layer_id: int) -> Tensor:
        return self.full.get_value_buffer(self._local(layer_id))

    def get_kv_buffer(self, layer_id: int) -> tuple[Tensor, Tensor]:
        return self.full.get_kv_buffer(self._local(layer_id))

    def set_kv_buffer(self, layer_id: int, loc: Tensor, cache_k: Tensor, cache_v: Tensor | None = None) -> None:
        """Store K and V (MHA) or whole latent rows in ``cache_k`` (MLA, ``cache_v`` ignored) at slots ``loc``."""
        if isinstance(self.full, MLATokenToKVPool):
            self.full.set_kv_buffer(self._local(layer_id), loc, cache_k, cache_v)
            return
        if cache_v is None:
            raise ValueError(f"set_kv_buffer(layer {layer_id}): an MHA full-attention layer needs cache_v.")
        self.full.set_kv_buffer(self._local(layer_id), loc, cache_k, cache_v)

    def get_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """K and V (MHA), or the latent and rope parts (MLA), at slots ``loc`` in ``dtype``."""
        if isinstance(self.full, MLATokenToKVPool):
            return self.full.get_mla_kv(self._local(layer_id), loc, dtype)
        return self.full.get_kv(self._local(layer_id), loc, dtype)

    def set_mla_kv_buffer(self, layer_id: int, loc: Tensor, k_nope: Tensor, k_rope: Tensor) -> None:
        """MLA-based hybrids: store the latent and rope parts of rows at slots ``loc``."""
        self._latent_pool(layer_id).set_mla_kv_buffer(self._local(layer_id), loc, k_nope, k_rope)

    def get_mla_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """MLA-based hybrids: the latent and rope parts at slots ``loc``."""
        return self._latent_pool(layer_id).get_mla_kv(self._local(layer_id), loc, dtype)

    def _latent_pool(self, layer_id: int) -> MLATokenToKVPool:
        if not isinstance(self.full, MLATokenToKVPool):
            raise TypeError(f"Layer {layer_id} keeps MHA K and V, not an MLA latent row: use set_kv_buffer / get_kv.")
        return self.full

    def get_index_k_with_scale_buffer(self, layer_id: int) -> Tensor:
        """A DSA full side's index-key pages of global layer ``layer_id`` (0 rows on an IndexShare layer)."""
        if not isinstance(self.full, DSATokenToKVPool):
            raise TypeError(f"Layer {layer_id} of this hybrid keeps no DSA index keys (its full side is not DSA).")
        return self.full.get_index_k_with_scale_buffer(self._local(layer_id))

    def _local(self, layer_id: int) -> int:
        if layer_id not in self.full_attention_layer_id_mapping:
            raise IndexError(
                f"Layer {layer_id} keeps no KV on this rank: the full-attention layers here are "
                f"{list(self.full_attention_layer_ids)} (global ids); recurrent layers keep their state in "
                f"the request table's mamba_pool."
            )
        return self.full_attention_layer_id_mapping[layer_id]

    def __repr__(self) -> str:
        return (
            f"HybridLinearKVPool(size={self.size}, page_size={self.page_size}, dtype={self.dtype}, "
            f"use_mla={self.use_mla}, full_attention_layers={list(self.full_attention_layer_ids)}, "
            f"device={self.device})"
        )


def _build_dsa_pool(
    plan: Plan, full_layers: Sequence[LayerSpec], device: str | torch.device, layout: BufferLayout | None = None
) -> DSATokenToKVPool:
    """SGLang's ``DSATokenToKVPool`` of a DSA hybrid's full-attention layers (local ids 0..n-1, as
    ``HybridLinearKVPool(use_dsa=True)`` builds it): latent rows, and index pages on the layers SGLang's
    ``skip_topk_layers`` keeps (IndexShare); refuses, before allocating, bytes the plan did not charge."""
    serving = plan.serving
    size, page = plan.max_total_num_tokens, serving.page_size
    row = plan_latent_row(plan)
    keyed = [i for i, kept in enumerate(index_layer_mask(full_layers, serving)) if kept]
    check_latent_bytes(plan, KV_POOL, row, size + page, len(full_layers))
    if keyed:
        index = index_storage(plan)
        index.check(plan, INDEX_POOL, size, page, len(keyed))
    else:  # every full layer reuses another's top-k: 0-row placeholders only, and no indexer pool in the plan
        index = IndexStorage(index_head_dim(plan.model), kpool=index_kpool(plan.model))
    return DSATokenToKVPool(
        size=size,
        page_size=page,
        row=row,
        start_layer=0,
        num_layers=len(full_layers),
        device=device,
        model_dtype=getattr(torch, plan.model.dtype),
        index_head_dim=index.index_head_dim,
        name=KV_POOL,
        index_name=INDEX_POOL,
        layout=layout,
        index=index,
        index_size=size,
        index_layers=keyed,
    )


def _build_latent_pool(
    plan: Plan, num_layers: int, device: str | torch.device, layout: BufferLayout | None = None
) -> MLATokenToKVPool:
    """The MLA pool of an MLA-based hybrid's full-attention layers (local ids 0..n-1) and the draft's latent pool."""
    row = latent_row(plan.model, plan.serving)
    return MLATokenToKVPool.from_layers(
        plan, row, device, start_layer=0, num_layers=num_layers, pool_name=KV_POOL, layout=layout
    )


def _stacked(layout: BufferLayout, views: list[Tensor], request: BufferRequest) -> Tensor:
    """The per-layer views of one state kind as one ``(layers, rows, *row_shape)`` view of their tensor.

    SGLang's kernels index ``conv[i][layer]``, so the layers must lie in one
    tensor at an even stride; a layout that carves them otherwise is refused.
    """
    if not views:
        return allocate((0, *request.shape), request.dtype, request.device)
    first = views[0]
    if len(views) == 1:
        return first.unsqueeze(0)
    base, step = first._base, views[1].storage_offset() - first.storage_offset()
    if base is None or any(
        view._base is not base
        or view.stride() != first.stride()
        or view.storage_offset() != first.storage_offset() + i * step
        for i, view in enumerate(views)
    ):
        raise BufferLayoutError(
            f"Buffer layout {describe_layout(layout)} carved the {request.describe()} as separate tensors; "
            f"the recurrent state is one (layers, slots, ...) tensor per kind (SGLang's MambaPool.conv[i] / "
            f"temporal), so a layout must return views of one tensor, one layer every same number of elements."
        )
    return base.as_strided((len(views), *first.shape), (step, *first.stride()), first.storage_offset())
