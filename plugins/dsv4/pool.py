"""DeepSeek-V4's KV pool built from a plan: SGLang's ``DeepSeekV4TokenToKVPool`` (separate-KV layout).

The shapes are :mod:`.buffers`' (which cites SGLang's
``python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py`` and
``deepseek_v4_compress_state.py``); this module allocates them through the
build's :class:`~kvpools_core.pools.layout.BufferLayout` and reads and writes
their rows:

* packed rows (``kv_swa``, ``kv_c4``, ``kv_c128``, ``draft_kv_swa``; role
  ``packed_kv``): per layer ``(pages, page_bytes)`` uint8.  Token ``loc`` of a
  pool paged by ``P`` keeps its fp8 nope at byte ``(loc % P) × (nope + 2 rope)``
  of page ``loc // P``, its bf16 rope right after it, and its ``nope // 64``
  ue8m0 scale bytes (+1 pad) at ``P × (nope + 2 rope) + (loc % P) × (nope // 64 + 1)``
  — the offsets of SGLang's ``kernels/ops/attention/dsv4/index_buf_accessor.py``
  (``_set_k_and_s_torch``); a V4.1 pool (``--dsv4-kv-layout v41`` / ``v41_new``, and DeepSeek-V4.1's low-ratio
  pools) holds the whole 512-value latent in its encoding instead (:mod:`.v41_rows`);
* the c4 indexer (``indexer_c4``; role ``index_k``, :func:`indexer_request`): ``(pages, p × 132)`` uint8,
  fp8 keys then fp32 scales per page, DSA's indexer layout, with the c4 KV pool's page count
  (``ceil((size + P) / p)``, not DSA's ``(size + p + 1) // p``);
* compressor states (``c4_state``, ``c4_indexer_state``, ``c128_state``; role
  ``state``): per layer ``(rows, last_dim)`` in the state dtype, kv in the first
  half and score in the second (``KVAndScore``); the last row is cleared to
  (0, −inf) as SGLang does;
* ``full_to_swa`` (the core's :func:`~kvpools_core.allocators.swa.new_full_to_swa_mapping`),
  HiSparse's per-layer data pointers and online-c128 MTP's pending lengths,
  allocated directly (not per layer).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from kvpools_core.allocators.swa import mapping_nbytes, new_full_to_swa_mapping
from kvpools_core.errors import PoolPlanMismatchError
from kvpools_core.pools.kv import allocate, check_planned_bytes, tensor_nbytes
from kvpools_core.pools.layout import PER_LAYER, BufferLayout, BufferRequest, allocate_buffers, check_layout_bytes
from kvpools_core.pools.mla import quantize_fp8_blocks
from kvpools_core.values import Plan

from . import v41_rows
from .buffers import (
    C128_MTP_SEQ_LENS_POOL,
    HISPARSE_PTRS_POOL,
    INDEX_QUANT_BLOCK,
    INDEXER_POOL,
    MAPPING_POOL,
    NOPE_QUANT_BLOCK,
    DSV4Buffers,
    DSV4Sizes,
    IndexerGeometry,
    KVRowGeometry,
    LowIndexGeometry,
    StateGeometry,
    dsv4_buffers,
)
from .dspark import DRAFT_SWA_VALID_FROM_POOL
from .encoder_replay import REQUEST_WINDOW_TAGS_POOL, RequestWindowGeometry, window_planned
from .layouts import LAYOUTS, UNIFORM_FP8, V4
from .unified_pool import UnifiedKVBuffers, unified_planned

__all__ = ["DSV4TokenToKVPool", "PackedRows", "sizes_of"]

_STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_E4M3_MAX = 448.0
_UE8M0_BIAS = 127


def sizes_of(plan: Plan) -> DSV4Sizes:
    """The DSV4 sizes of a plan, from SGLang's ``MemoryPoolConfig`` names in ``sglang_config``."""
    return DSV4Sizes.from_config(plan.sizing.sglang_config)


class PackedRows:
    """Packed DSV4 rows of some layers (one ``DeepSeekV4SingleKVPool``): fp8 nope, bf16 rope, ue8m0 scales."""

    def __init__(self, geo: KVRowGeometry, nope: int, rope: int, buffers: dict[int, Tensor]) -> None:
        self.geo = geo
        self.name = geo.name
        self.page_size = geo.page_size
        self.nope, self.rope = nope, rope
        self.scales = nope // NOPE_QUANT_BLOCK
        self.kv_buffer = buffers  # layer id -> (pages, page_bytes) uint8
        self.layout = LAYOUTS[geo.layout]

    @staticmethod
    def request(geo: KVRowGeometry, device: str | torch.device) -> BufferRequest:
        return BufferRequest(
            pool=geo.name,
            role="packed_kv",
            rows=geo.pages,
            page_size=geo.page_size,
            layers=geo.layers,
            row_shape=(geo.page_bytes,),
            dtype=torch.uint8,
            device=device,
        )

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(list(self.kv_buffer.values()))

    def buffer(self, layer_id: int) -> Tensor:
        if layer_id not in self.kv_buffer:
            raise IndexError(
                f"Layer {layer_id} has no buffer in the {self.name!r} pool (layers {list(self.kv_buffer)})."
            )
        return self.kv_buffer[layer_id]

    def _columns(self, loc: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        page = self.page_size
        loc = loc.long()
        pages = (loc // page).unsqueeze(1)
        off = (loc % page).unsqueeze(1)
        data = self.nope + 2 * self.rope
        base = off * data
        nope_cols = base + torch.arange(self.nope, device=loc.device)
        rope_cols = base + self.nope + torch.arange(2 * self.rope, device=loc.device)
        scale_cols = page * data + off * (self.scales + 1) + torch.arange(self.scales, device=loc.device)
        return pages, nope_cols, rope_cols, scale_cols

    def _uniform_columns(self, loc: Tensor) -> tuple[Tensor, Tensor]:
        """A uniform fp8 page holds its ``page_size`` rows of ``nope + rope`` bytes back to back (no scales)."""
        loc = loc.long()
        row = self.nope + self.rope
        cols = (loc % self.page_size).unsqueeze(1) * row + torch.arange(row, device=loc.device)
        return (loc // self.page_size).unsqueeze(1), cols

    def set_kv(self, layer_id: int, loc: Tensor, k_nope: Tensor, k_rope: Tensor) -> None:
        """Quantise ``(n, nope)`` to fp8 with one power-of-two (ue8m0) scale per 64 values; store with bf16 rope.

        A V4.1 pool (:mod:`.v41_rows`) stores the whole latent ``[k_nope, k_rope]`` in its encoding instead."""
        n = loc.shape[0]
        if tuple(k_nope.shape) != (n, self.nope) or tuple(k_rope.shape) != (n, self.rope):
            raise ValueError(
                f"set_kv(layer {layer_id}) on {self.name!r}: expected k_nope ({n}, {self.nope}) and k_rope "
                f"({n}, {self.rope}), got {tuple(k_nope.shape)} and {tuple(k_rope.shape)}."
            )
        buf = self.buffer(layer_id)
        if self.layout is UNIFORM_FP8:
            # DeepSeekV4UniformFP8KVPool.set_key_buffer_fused: the row cast to e4m3 (the backend's unit scale)
            pages, cols = self._uniform_columns(loc)
            buf[pages, cols] = torch.cat((k_nope, k_rope), dim=-1).to(torch.float8_e4m3fn).view(torch.uint8)
            return
        if self.layout is not V4:
            data, scales = v41_rows.quantize(self.layout, torch.cat((k_nope, k_rope), dim=-1))
            pages, data_cols, scale_cols = v41_rows.row_columns(self.layout, self.page_size, loc)
            buf[pages, data_cols] = data
            buf[pages, scale_cols] = scales
            return
        blocks = k_nope.float().reshape(n, self.scales, NOPE_QUANT_BLOCK)
        amax = blocks.abs().amax(-1)
        exponent = torch.where(amax > 0, torch.ceil(torch.log2(amax / _E4M3_MAX)), torch.zeros_like(amax))
        exponent = exponent.clamp(-_UE8M0_BIAS, _UE8M0_BIAS)
        values = (blocks / torch.exp2(exponent).unsqueeze(-1)).clamp(-_E4M3_MAX, _E4M3_MAX)
        nope_bytes = values.reshape(n, self.nope).to(torch.float8_e4m3fn).view(torch.uint8)
        rope_bytes = k_rope.to(torch.bfloat16).contiguous().view(torch.uint8)
        scale_bytes = (exponent + _UE8M0_BIAS).to(torch.uint8)
        pages, nope_cols, rope_cols, scale_cols = self._columns(loc)
        buf[pages, nope_cols] = nope_bytes
        buf[pages, rope_cols] = rope_bytes
        buf[pages, scale_cols] = scale_bytes

    def get_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype = torch.bfloat16) -> tuple[Tensor, Tensor]:
        """``(k_nope (n, nope), k_rope (n, rope))`` at slots ``loc``, dequantised to ``dtype``."""
        buf = self.buffer(layer_id)
        n = loc.shape[0]
        if self.layout is UNIFORM_FP8:
            pages, cols = self._uniform_columns(loc)
            latent = buf[pages, cols].contiguous().view(torch.float8_e4m3fn)
            return latent[:, : self.nope].to(dtype), latent[:, self.nope :].to(dtype)
        if self.layout is not V4:
            pages, data_cols, scale_cols = v41_rows.row_columns(self.layout, self.page_size, loc)
            latent = v41_rows.dequantize(self.layout, buf[pages, data_cols], buf[pages, scale_cols])
            return latent[:, : self.nope].to(dtype), latent[:, self.nope :].to(dtype)
        pages, nope_cols, rope_cols, scale_cols = self._columns(loc)
        nope = buf[pages, nope_cols].contiguous().view(torch.float8_e4m3fn).float()
        scale = torch.exp2(buf[pages, scale_cols].float() - _UE8M0_BIAS)
        nope = (nope.reshape(n, self.scales, NOPE_QUANT_BLOCK) * scale.unsqueeze(-1)).reshape(n, self.nope)
        rope = buf[pages, rope_cols].contiguous().view(torch.bfloat16)
        return nope.to(dtype), rope.to(dtype)


class IndexerPages:
    """The c4 layers' lightning-indexer keys (``DeepSeekV4IndexerPool``): fp8 keys, fp32 scale per 128."""

    def __init__(self, geo: IndexerGeometry, buffers: dict[int, Tensor]) -> None:
        self.geo = geo
        self.page_size = geo.page_size
        self.head_dim = geo.head_dim
        self.index_k_with_scale_buffer = buffers

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(list(self.index_k_with_scale_buffer.values()))

    def _columns(self, loc: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        page, dim = self.page_size, self.head_dim
        loc = loc.long()
        pages = (loc // page).unsqueeze(1)
        off = (loc % page).unsqueeze(1)
        scale_bytes = dim // INDEX_QUANT_BLOCK * 4
        key_cols = off * dim + torch.arange(dim, device=loc.device)
        scale_cols = page * dim + off * scale_bytes + torch.arange(scale_bytes, device=loc.device)
        return pages, key_cols, scale_cols

    def buffer(self, layer_id: int) -> Tensor:
        if layer_id not in self.index_k_with_scale_buffer:
            raise IndexError(f"Layer {layer_id} is not a c4 layer of this stage: it has no indexer keys.")
        return self.index_k_with_scale_buffer[layer_id]

    def set_index_k(self, layer_id: int, loc: Tensor, index_k: Tensor) -> None:
        buf = self.buffer(layer_id)
        keys, scale = quantize_fp8_blocks(index_k, INDEX_QUANT_BLOCK)
        pages, key_cols, scale_cols = self._columns(loc)
        buf[pages, key_cols] = keys.view(torch.uint8)
        buf[pages, scale_cols] = scale.to(torch.float32).contiguous().view(torch.uint8)

    def get_index_k(self, layer_id: int, loc: Tensor, dtype: torch.dtype = torch.bfloat16) -> Tensor:
        buf = self.buffer(layer_id)
        n = loc.shape[0]
        pages, key_cols, scale_cols = self._columns(loc)
        keys = buf[pages, key_cols].contiguous().view(torch.float8_e4m3fn).float()
        scale = buf[pages, scale_cols].contiguous().view(torch.float32)
        blocks = keys.reshape(n, self.head_dim // INDEX_QUANT_BLOCK, INDEX_QUANT_BLOCK) * scale.unsqueeze(-1)
        return blocks.reshape(n, self.head_dim).to(dtype)


class CompressStates:
    """One kind of compressor state (``CompressStatePool`` per layer): ``(rows, last_dim)``, kv then score."""

    def __init__(self, geo: StateGeometry, buffers: dict[int, Tensor]) -> None:
        self.geo = geo
        self.name = geo.name
        self.ring_size = geo.ring
        self.kv_score = buffers
        for buf in buffers.values():
            if buf.device.type != "meta" and not geo.online:
                half = buf.shape[-1] // 2
                buf[-1, :half] = 0
                buf[-1, half:] = float("-inf")

    @staticmethod
    def request(geo: StateGeometry, device: str | torch.device) -> BufferRequest:
        return BufferRequest(
            pool=geo.name,
            role="state",
            rows=geo.rows,
            page_size=1,
            layers=geo.layers,
            row_shape=(geo.last_dim,),
            dtype=_STATE_DTYPES[geo.dtype],
            device=device,
        )

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(list(self.kv_score.values()))

    def buffer(self, layer_id: int) -> Tensor:
        if layer_id not in self.kv_score:
            raise IndexError(f"Layer {layer_id} has no {self.name!r} (layers {list(self.kv_score)}).")
        return self.kv_score[layer_id]

    def set_state(self, layer_id: int, state_loc: Tensor, kv: Tensor, score: Tensor) -> None:
        buf = self.buffer(layer_id)
        buf[state_loc.long()] = torch.cat((kv, score), dim=-1).to(buf.dtype)

    def get_state(self, layer_id: int, state_loc: Tensor) -> tuple[Tensor, Tensor]:
        rows = self.buffer(layer_id)[state_loc.long()]
        half = rows.shape[-1] // 2
        return rows[:, :half], rows[:, half:]


class DSV4TokenToKVPool:
    """SWA rows of every layer, compressed rows + indexer + states of c4/c128 layers, the full→SWA mapping."""

    def __init__(
        self, buffers: DSV4Buffers, full_tokens: int, device: str | torch.device, layout: BufferLayout | None = None
    ) -> None:
        self.buffers = buffers
        self.layout = layout or PER_LAYER
        self.device = torch.device(device)
        self.page_size = buffers.page_size
        self.start_layer, self.end_layer = buffers.start_layer, buffers.end_layer
        self.compression_ratios = buffers.ratios
        b = buffers
        low = b.low_ratio
        rw = b.request_window
        window_pools = (rw.state, rw.workspace) if rw is not None else ()
        row_pools = [
            geo for geo in (b.swa, b.c4, b.c128, b.draft_swa, *low.kv, *window_pools) if geo is not None and geo.layers
        ]
        states = [geo for geo in (b.c4_state, b.c4_indexer_state, b.c128_state, low.pair_state) if geo and geo.layers]
        requests = [PackedRows.request(geo, device) for geo in row_pools]
        index_req = indexer_request(b.indexer, device) if b.indexer.layers else None
        requests += [index_req] if index_req is not None else []
        requests += [CompressStates.request(geo, device) for geo in states]
        low_index_requests = [low_index_request(ix, device) for ix in low.index]
        requests += low_index_requests
        check_layout_bytes(self.layout, requests)  # every buffer's bytes, before the first tensor

        def alloc(request: BufferRequest) -> dict[int, Tensor]:
            return dict(zip(request.layers, allocate_buffers(self.layout, request), strict=True))

        rows = {
            geo.name: PackedRows(geo, b.qk_nope_head_dim, b.qk_rope_head_dim, alloc(PackedRows.request(geo, device)))
            for geo in row_pools
        }
        self.swa_kv_pool = rows.get(b.swa.name)
        self.c4_kv_pool = rows.get(b.c4.name)
        self.c128_kv_pool = rows.get(b.c128.name)
        self.draft_swa_kv_pool = rows.get(b.draft_swa.name) if b.draft_swa is not None else None
        # DeepSeek-V4.1's ratio-1/2 kv_source pools (low_ratio.py): KV by ratio, fp4 index keys by ratio
        self.low_ratio_kv_pools = {b.page_size // geo.page_size: rows[geo.name] for geo in low.kv}
        self.low_ratio_index_pools = {
            ix.ratio: alloc(request) for ix, request in zip(low.index, low_index_requests, strict=True)
        }
        self.indexer = IndexerPages(b.indexer, alloc(index_req) if index_req is not None else {})
        self.states = {geo.name: CompressStates(geo, alloc(CompressStates.request(geo, device))) for geo in states}
        # encoder replay (.encoder_replay): the request window's rows, tags and replay workspace; the full-only
        # allocator keeps no full-to-SWA mapping
        self.request_window = (
            RequestWindowRows(rw, rows[rw.state.name], rows[rw.workspace.name], device) if rw is not None else None
        )
        self.full_to_swa_index_mapping = (
            new_full_to_swa_mapping(full_tokens, self.page_size, device) if rw is None else None
        )
        self.hisparse_data_ptrs = allocate((b.hisparse_ptrs,), torch.uint64, device) if b.hisparse_ptrs else None
        if self.hisparse_data_ptrs is not None and self.c4_kv_pool is not None and self.device.type != "meta":
            ptrs = [buf.data_ptr() for buf in self.c4_kv_pool.kv_buffer.values()]
            self.hisparse_data_ptrs.copy_(torch.tensor(ptrs, dtype=torch.uint64))
        self.c128_mtp_seq_lens = allocate((b.c128_mtp_seq_lens,), torch.int64, device) if b.c128_mtp_seq_lens else None
        # the DSpark draft pool's per-slot SWA validity mark (.dspark)
        self.swa_valid_from = (
            allocate((b.draft_swa_valid_from,), torch.int64, device) if b.draft_swa_valid_from else None
        )
        self.unified_kv_pool = UnifiedKVBuffers(b.unified, device) if b.unified is not None else None

    @classmethod
    def from_plan(cls, plan: Plan, device: str | torch.device, layout: BufferLayout | None = None) -> DSV4TokenToKVPool:
        """The pool of a DSV4 plan; refuses, before allocating, any pool whose bytes the plan does not charge."""
        sizes = sizes_of(plan)
        b = dsv4_buffers(plan.model, plan.serving, sizes, max_running_requests=plan.max_running_requests)
        for name, nbytes, detail in _planned(b, sizes):
            try:
                planned = plan.pool(name).bytes
            except KeyError:
                raise PoolPlanMismatchError(
                    f"The {name!r} pool would allocate {nbytes} B ({detail}) but the plan has no such pool; "
                    f"re-plan with this kvpools version."
                ) from None
            check_planned_bytes(name, nbytes, planned, detail)
        return cls(b, sizes.full_tokens, device, layout)

    # -- sizes ---------------------------------------------------------------

    def nbytes_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name."""
        measured = {
            p.name: p.nbytes
            for p in (
                self.swa_kv_pool,
                self.c4_kv_pool,
                self.c128_kv_pool,
                self.draft_swa_kv_pool,
                *self.low_ratio_kv_pools.values(),
            )
            if p is not None
        }
        for ix in self.buffers.low_ratio.index:
            measured[ix.name] = tensor_nbytes(list(self.low_ratio_index_pools[ix.ratio].values()))
        if self.indexer.index_k_with_scale_buffer:
            measured[INDEXER_POOL] = self.indexer.nbytes
        measured.update({name: s.nbytes for name, s in self.states.items()})
        if self.full_to_swa_index_mapping is not None:
            measured[MAPPING_POOL] = tensor_nbytes([self.full_to_swa_index_mapping])
        if self.request_window is not None:
            measured.update(self.request_window.nbytes_by_pool())
        if self.hisparse_data_ptrs is not None:
            measured[HISPARSE_PTRS_POOL] = tensor_nbytes([self.hisparse_data_ptrs])
        if self.c128_mtp_seq_lens is not None:
            measured[C128_MTP_SEQ_LENS_POOL] = tensor_nbytes([self.c128_mtp_seq_lens])
        if self.swa_valid_from is not None:
            measured[DRAFT_SWA_VALID_FROM_POOL] = tensor_nbytes([self.swa_valid_from])
        if self.unified_kv_pool is not None:
            measured.update(self.unified_kv_pool.nbytes_by_pool())
        return measured

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_pool().values())

    # -- addressing ----------------------------------------------------------

    def compress_ratio(self, layer_id: int) -> int:
        index = layer_id - self.start_layer
        if not 0 <= index < len(self.compression_ratios):
            raise IndexError(
                f"Layer {layer_id} is not in this stage's DSV4 pool ([{self.start_layer}, {self.end_layer}))."
            )
        return self.compression_ratios[index]

    def translate_loc_from_full_to_swa(self, kv_indices: Tensor) -> Tensor:
        if self.full_to_swa_index_mapping is None:
            raise ValueError(
                "This pool keeps its SWA rows in encoder replay's request window: it has no full-to-SWA mapping."
            )
        return self.full_to_swa_index_mapping[kv_indices]

    def register_mapping(self, full_to_swa_index_mapping: Tensor) -> None:
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    # -- rows ----------------------------------------------------------------

    def set_swa_kv(self, layer_id: int, swa_loc: Tensor, k_nope: Tensor, k_rope: Tensor) -> None:
        """Write SWA rows of ``layer_id`` at SWA slots ``swa_loc`` (translate full slots first)."""
        self.compress_ratio(layer_id)
        assert self.swa_kv_pool is not None
        self.swa_kv_pool.set_kv(layer_id, swa_loc, k_nope, k_rope)

    def get_swa_kv(self, layer_id: int, swa_loc: Tensor, dtype: torch.dtype = torch.bfloat16) -> tuple[Tensor, Tensor]:
        self.compress_ratio(layer_id)
        assert self.swa_kv_pool is not None
        return self.swa_kv_pool.get_kv(layer_id, swa_loc, dtype)

    def _compressed(self, layer_id: int) -> PackedRows:
        ratio = self.compress_ratio(layer_id)
        pool = {4: self.c4_kv_pool, 128: self.c128_kv_pool}.get(ratio)
        if pool is None:
            raise ValueError(
                f"Layer {layer_id} is an SWA-only layer (compress ratio {ratio}): it has no compressed rows."
            )
        return pool

    def set_extra_kv(self, layer_id: int, loc: Tensor, k_nope: Tensor, k_rope: Tensor) -> None:
        """Write compressed rows of a c4 / c128 layer at compressed slots ``loc`` (``full slot // ratio``)."""
        self._compressed(layer_id).set_kv(layer_id, loc, k_nope, k_rope)

    def get_extra_kv(self, layer_id: int, loc: Tensor, dtype: torch.dtype = torch.bfloat16) -> tuple[Tensor, Tensor]:
        return self._compressed(layer_id).get_kv(layer_id, loc, dtype)

    def set_index_k(self, layer_id: int, loc: Tensor, index_k: Tensor) -> None:
        self.indexer.set_index_k(layer_id, loc, index_k)

    def get_index_k(self, layer_id: int, loc: Tensor, dtype: torch.dtype = torch.bfloat16) -> Tensor:
        return self.indexer.get_index_k(layer_id, loc, dtype)

    def attention_states(self, layer_id: int) -> CompressStates:
        """The compressor states of a c4 / c128 layer (``get_attention_compress_states``)."""
        ratio = self.compress_ratio(layer_id)
        name = {4: self.buffers.c4_state.name, 128: self.buffers.c128_state.name}.get(ratio)
        if name is None or name not in self.states:
            raise ValueError(f"Layer {layer_id} (compress ratio {ratio}) has no compressor state.")
        return self.states[name]

    def indexer_states(self, layer_id: int) -> CompressStates:
        """The indexer's compressor states of a c4 layer (``get_indexer_compress_states``)."""
        if self.compress_ratio(layer_id) != 4:
            raise ValueError(f"Layer {layer_id} is not a c4 layer: only c4 layers have indexer states.")
        return self.states[self.buffers.c4_indexer_state.name]

    def __repr__(self) -> str:
        b = self.buffers
        return (
            f"DSV4TokenToKVPool(layers=[{self.start_layer}, {self.end_layer}), swa={b.swa.tokens}, c4={b.c4.tokens}, "
            f"c128={b.c128.tokens}, page_size={self.page_size}, device={self.device})"
        )


def indexer_request(ix: IndexerGeometry, device: str | torch.device) -> BufferRequest:
    """The c4 indexer's keys: per layer ``(pages, p x 132)`` uint8, ``pages`` the c4 KV pool's count
    (:attr:`IndexerGeometry.pages`, 0.5.23 ``_num_dsv4_physical_kv_pages``), not DSA's one padding page."""
    return BufferRequest(
        pool=INDEXER_POOL,
        role="index_k",
        rows=ix.pages,
        page_size=ix.page_size,
        layers=ix.layers,
        row_shape=(ix.page_bytes,),
        dtype=torch.uint8,
        device=device,
    )


def low_index_request(ix: LowIndexGeometry, device: str | torch.device) -> BufferRequest:
    """A low ratio's fp4 indexer keys: per layer ``(pages, page_size x row_bytes)`` uint8."""
    return BufferRequest(
        pool=ix.name,
        role="index_k",
        rows=ix.pages,
        page_size=ix.page_size,
        layers=ix.layers,
        row_shape=(ix.page_bytes,),
        dtype=torch.uint8,
        device=device,
    )


def _planned(b: DSV4Buffers, sizes: DSV4Sizes) -> Iterable[tuple[str, int, str]]:
    """``(pool, bytes, how)`` of every pool this store allocates."""
    for geo in (b.swa, b.c4, b.c128, b.draft_swa):
        if geo is not None and geo.layers:
            yield geo.name, geo.nbytes, f"{len(geo.layers)} layer(s) of {geo.pages} pages x {geo.page_bytes} B"
    if b.indexer.layers:
        ix = b.indexer
        yield (
            INDEXER_POOL,
            ix.nbytes,
            f"{len(ix.layers)} layer(s) of {ix.pages} pages x {ix.page_size} x {ix.row_bytes} B",
        )
    for geo in b.low_ratio.kv:
        yield geo.name, geo.nbytes, f"{len(geo.layers)} layer(s) of {geo.pages} pages x {geo.page_bytes} B"
    for low in b.low_ratio.index:
        how = f"{len(low.layers)} layer(s) of {low.pages} pages x {low.page_size} x {low.row_bytes} B"
        yield low.name, low.nbytes, how
    for st in (b.c4_state, b.c4_indexer_state, b.c128_state, b.low_ratio.pair_state):
        if st is not None and st.layers:
            yield st.name, st.nbytes, f"{len(st.layers)} layer(s) of {st.rows} rows x {st.last_dim} {st.dtype}"
    if b.request_window is None:
        yield (
            MAPPING_POOL,
            mapping_nbytes(sizes.full_tokens, b.page_size),
            f"{sizes.full_tokens} + {b.page_size} + 1 int64",
        )
    else:
        yield from window_planned(b.request_window)
    if b.hisparse_ptrs:
        yield HISPARSE_PTRS_POOL, b.hisparse_ptrs * 8, f"{b.hisparse_ptrs} uint64 data pointers"
    if b.c128_mtp_seq_lens:
        yield C128_MTP_SEQ_LENS_POOL, b.c128_mtp_seq_lens * 8, f"{b.c128_mtp_seq_lens} int64"
    if b.draft_swa_valid_from:
        yield DRAFT_SWA_VALID_FROM_POOL, b.draft_swa_valid_from * 8, f"{b.draft_swa_valid_from} int64 (DSpark draft)"
    if b.unified is not None:
        yield from unified_planned(b.unified)


class RequestWindowRows:
    """SGLang's ``RequestWindow`` buffers (``dsv41_request_window.py`` lines 226-264): ``state`` (every stage
    layer's window rows, ``num_slots x capacity + page``), ``tags`` (int64, -1 = empty) and the one-layer replay
    ``workspace``; row ``slot x capacity + pos % capacity`` holds position ``pos`` of request slot ``slot``."""

    def __init__(
        self, geo: RequestWindowGeometry, state: PackedRows, workspace: PackedRows, device: str | torch.device
    ) -> None:
        self.geo = geo
        self.capacity = geo.capacity
        self.page_size = geo.page_size
        self.state = state
        self.workspace = workspace
        self.tags = allocate(geo.tags_shape, torch.int64, device)
        if self.tags.device.type != "meta":
            self.tags.fill_(-1)

    def row_loc(self, slots: Tensor, positions: Tensor) -> Tensor:
        """``RequestWindow.row_loc``: the window row of each (slot, position)."""
        return slots * self.capacity + positions % self.capacity

    def nbytes_by_pool(self) -> dict[str, int]:
        return {
            self.state.name: self.state.nbytes,
            REQUEST_WINDOW_TAGS_POOL: tensor_nbytes([self.tags]),
            self.workspace.name: self.workspace.nbytes,
        }
