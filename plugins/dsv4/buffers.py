"""Every buffer SGLang's DeepSeek-V4 KV pool allocates, and its exact bytes (torch-free).

What this describes is SGLang's ``DeepSeekV4TokenToKVPool`` on CUDA in its
separate-KV layout (``python/sglang/srt/mem_cache/deepseek_v4_memory_pool.py``,
the pool ``_build_dsv4_kv_pool`` in ref-000 builds, around its line 1334), with
its compressor states (``python/sglang/srt/mem_cache/deepseek_v4_compress_state.py``,
``CompressStatePool``), the full→SWA index mapping and the free lists of the
allocator ref-000's ``_build_token_to_kv_pool_allocator`` pairs with it, and the
stock request table (``_build_default_req_pool``: no DSV4 variant off NPU).

Per PP stage (``compress_ratios[start:end]``), with ``P`` the page size and
``L``, ``L4``, ``L128`` the stage's layers, c4 layers and c128 layers:

* ``kv_swa`` — every layer's SWA rows (``swa_kv_pool``, a ``DeepSeekV4SingleKVPool``
  of ``swa_size`` tokens paged by ``swa_page_size`` = the schedule's page size,
  ref-000 ``_build_dsv4_kv_pool``).  One row per token is FlashMLA's packed DSV4
  layout: ``qk_nope_head_dim`` fp8 values, ``qk_rope_head_dim`` bf16 values, one
  ue8m0 scale byte per 64 nope values and one pad byte (448 + 128 + 7 + 1 = 584 B,
  ``get_bytes_per_token``).  A page keeps its ``P`` tokens' nope+rope first
  (576 B each), then their 8 scale bytes, and is padded to a multiple of 576 B
  (``create_buffer``: ``ceil_div(P × 584, 576) × 576``); a layer holds
  ``ceil((size + P) / P)`` pages of uint8 (0.5.23 ``_num_dsv4_physical_kv_pages``: the
  allocator's reserved page).  There are no rows per *full* token:
  full token ids exist only in the allocator and the mapping.
* ``kv_c4`` / ``kv_c128`` — the compressed rows of the c4 / c128 layers, the same
  packed layout paged by ``P // 4`` / ``P // 128`` tokens (``_init_compressed_pools``),
  ``ceil((size + P) / (P // ratio))`` pages (the reserved page is a *logical* page of
  ``P`` tokens: ``ratio`` physical pages), ``c4_size`` / ``c128_size`` tokens (a compressed
  slot is ``full slot // ratio``, so no allocator of their own).  Under HiSparse the c4 pool is
  ``HiSparseC4DevicePool`` (same buffers, ``c4_size`` shrunk) plus one uint64
  data pointer per c4 layer (``c4_hisparse_ptrs``).
* ``indexer_c4`` — the c4 layers' lightning-indexer keys (``DeepSeekV4IndexerPool``):
  per layer ``ceil((size + P) / p)`` pages of ``p × 132`` uint8 (``p = P // 4``;
  fp8 keys then fp32 scales per 128, the DSA indexer's page layout), sized by the
  *logical* c4 count ``c4_logical_size = c128_size × 32`` — HiSparse does not
  shrink it.
* ``c4_state`` / ``c4_indexer_state`` / ``c128_state`` — ``CompressStatePool``
  per compressed layer: ``(rows, last_dim)`` in the state dtype
  (``SGLANG_DSV4_COMPRESS_STATE_DTYPE``, ``_get_dsv4_compress_state_dtypes``),
  ``rows = ceil((size + ring + 1) / ratio) × ratio`` (c4 rounds to 4, c128 to 128),
  ``last_dim = 2 × (1 + overlap) × head_dim`` (c4 overlaps: ``4 × head_dim``;
  c128: ``2 × head_dim``).  c4 attention states use ``qk_nope + qk_rope`` as
  head_dim, the c4 indexer states ``index_head_dim``.  The c4 size is the
  caller's (SWA-addressed: ``swa // window × ring``); the c128 size is
  request-scoped, ``max(c128_state_pool_size, num_req_slots × ring)`` where
  ``num_req_slots`` is the request table's row count.  Online c128
  (``--enable-online-compress``): ``ring = 1``, ``size = max(c128_state_pool_size,
  num_req_slots)``, rows ``(size + 2) × (1 + draft tokens)`` unrounded,
  ``last_dim = 3 × head_dim``; with ``--enable-online-c128-mtp`` also one int64
  pending sequence length per state slot (``c128_mtp_seq_lens``).
* ``draft_kv_swa`` — the speculative draft worker's own DSV4 pool: its layers are
  all SWA-only NextN layers, with the target's SWA size and no c4/c128/state
  buffers (ref-000 zeroes them for a draft worker).
* ``full_to_swa`` — the mapping ``SWATokenToKVPoolAllocator`` keeps (int64,
  ``full + P + 1``); ``req_to_token``; ``allocator`` (full pages) and
  ``swa_allocator`` (SWA pages) free lists.
* under encoder replay (:mod:`.encoder_replay`) ``swa_request_window``, ``swa_request_window_tags`` and
  ``swa_replay_workspace`` replace ``kv_swa``, ``full_to_swa`` and ``swa_allocator``.

The token spaces the pools scale with are ``full``, ``swa``, ``c4`` and ``c128``
(:data:`TOKEN_SPACES`); the c128 state and the request table scale per request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache, partial
from typing import Any

import attrs

from kvpools_core.allocators.sizes import allocator_planned_nbytes
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.sizing import (
    SWA_MAPPING_ITEM_BYTES,
    SWA_MAPPING_POOL,
    allocator_pool,
    page_align,
    req_to_token_rows,
    request_pools,
    request_pools_bytes,
    swa_mapping_pool,
    with_cost,
)
from kvpools_core.values import FIXED, FULL_TOKENS, REQUEST, TOKEN, GroupCost, LayerSpec, ModelSpec, PoolSpec, Serving

from .dspark import DRAFT_SWA_VALID_FROM_POOL, VALID_FROM_BYTES, dspark_swa_valid_from_slots
from .encoder_replay import RequestWindowGeometry, replay_on, request_window_geometry, window_layout
from .hisparse import hisparse_allocator_layout, uses_hisparse_allocator
from .layouts import KVLayout, compressed_layout, main_layout
from .low_ratio import (
    DSV41_INDEX_PAGE_SIZE,
    FP4_SCALE_BLOCK,
    PAIR_STATE_POOL,
    index_pool_name,
    kv_pool_name,
    pair_ring_size,
    sources_by_ratio,
)
from .memo import last_pair, per_model
from .speculative import online_mtp_draft_tokens, ring_size
from .unified import SEPARATE, UnifiedGeometry, dsv4_layout, unified_geometry, unified_layout

__all__ = [
    "C4_INDEXER_STATE_POOL",
    "C4_KV_POOL",
    "C4_STATE_POOL",
    "C4_TOKENS",
    "C128_KV_POOL",
    "C128_MTP_SEQ_LENS_POOL",
    "C128_STATE_POOL",
    "C128_TOKENS",
    "DRAFT_SWA_KV_POOL",
    "HISPARSE_PTRS_POOL",
    "INDEXER_POOL",
    "MAPPING_POOL",
    "SWA_ALLOCATOR",
    "SWA_KV_POOL",
    "SWA_TOKENS",
    "TOKEN_SPACES",
    "DSV4Buffers",
    "DSV4Sizes",
    "KVRowGeometry",
    "LowIndexGeometry",
    "LowRatioBuffers",
    "PoolBytesProbe",
    "SizeStep",
    "StateGeometry",
    "dsv4_buffers",
    "low_ratio_buffers",
    "low_ratio_layout",
    "pool_specs",
    "ring_size",
]

OWNER = "dsv4"

SWA_TOKENS = "swa"
C4_TOKENS = "c4"
C128_TOKENS = "c128"
TOKEN_SPACES = (FULL_TOKENS, SWA_TOKENS, C4_TOKENS, C128_TOKENS)

SWA_KV_POOL = "kv_swa"
C4_KV_POOL = "kv_c4"
C128_KV_POOL = "kv_c128"
INDEXER_POOL = "indexer_c4"
C4_STATE_POOL = "c4_state"
C4_INDEXER_STATE_POOL = "c4_indexer_state"
C128_STATE_POOL = "c128_state"
C128_MTP_SEQ_LENS_POOL = "c128_mtp_seq_lens"
HISPARSE_PTRS_POOL = "c4_hisparse_ptrs"
DRAFT_SWA_KV_POOL = "draft_kv_swa"
MAPPING_POOL = SWA_MAPPING_POOL
SWA_ALLOCATOR = "swa_allocator"

# The packed DSV4 row (DeepSeekV4SingleKVPool.get_bytes_per_token / create_buffer).
NOPE_QUANT_BLOCK = 64  # nope values sharing one ue8m0 scale byte (quantize_block_size)
SCALE_PAD = 1  # one pad byte after the scales (scale_pad)
ROPE_BYTES = 2  # the rope stays bf16 (rope_storage_dtype)
PAGE_ALIGN = 576  # a page is padded to a multiple of 576 B
# The indexer row (get_dsv4_indexer_bytes_per_token, fp8): keys + one fp32 scale per 128.
INDEX_QUANT_BLOCK = 128
INDEX_SCALE_BYTES = 4
C4_LOGICAL_PER_C128 = 32  # c4_logical_size = c128_size * 32
STATE_DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2}
MAPPING_ITEM_BYTES = SWA_MAPPING_ITEM_BYTES
PTR_BYTES = 8  # uint64 data pointers


@attrs.frozen
class DSV4Sizes:
    """SGLang's DSV4 ``MemoryPoolConfig`` sizes of one rank (``DSV4PoolConfigurator``, ref-002)."""

    full_tokens: int
    swa_tokens: int
    c4_tokens: int
    c128_tokens: int
    c4_state_size: int
    c128_state_size: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> DSV4Sizes:
        """The sizes under SGLang's ``MemoryPoolConfig`` names (a plan's ``sglang_config``)."""
        return cls(
            full_tokens=int(config["full_max_total_num_tokens"]),
            swa_tokens=int(config["swa_max_total_num_tokens"]),
            c4_tokens=int(config["c4_max_total_num_tokens"]),
            c128_tokens=int(config["c128_max_total_num_tokens"]),
            c4_state_size=int(config["c4_state_pool_size"]),
            c128_state_size=int(config["c128_state_pool_size"]),
        )


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _row_page_bytes(page_size: int, row_bytes: int, page_align: int) -> int:
    """A packed-row pool's page: ``page_size`` rows, padded to a multiple of ``page_align`` bytes."""
    return _ceil_to(page_size * row_bytes, page_align)


def _index_row_bytes(head_dim: int) -> int:
    """One c4 indexer key: fp8 values and one fp32 scale per 128 of them."""
    return head_dim + head_dim // INDEX_QUANT_BLOCK * INDEX_SCALE_BYTES


def physical_pages(tokens: int, page_size: int, global_page: int | None = None) -> int:
    """The pages of one DSV4 paged pool of ``tokens`` slots: SGLang 0.5.23's ``_num_dsv4_physical_kv_pages``
    (``deepseek_v4_memory_pool.py``, L166-171), ``ceil((size + logical page) / physical page)`` — the paged
    allocator reserves one *logical* page (``global_page_size``, the schedule's ``P``), so a compressed pool of
    physical page ``P // ratio`` holds ``ratio`` padding pages, not one."""
    return -(-(tokens + (page_size if global_page is None else global_page)) // page_size)


@attrs.frozen
class KVRowGeometry:
    """One packed-row pool (SWA, c4 or c128): ``layers`` × ``pages`` pages of ``page_bytes`` uint8."""

    name: str
    tokens: int
    page_size: int
    layers: tuple[int, ...]
    row_bytes: int
    page_align: int = PAGE_ALIGN
    """The unit a page's stride is padded to (the layout's ``page_align``: 576 for V4, :mod:`.layouts`)."""
    layout: str = "v4"
    global_page: int | None = None
    """The model-wide logical page (``global_page_size``) the allocator reserves one page of: the schedule's page
    ``P`` for the compressed pools (c4, c128, the low ratios), whose physical page is ``P // ratio``; ``None``: the
    pool's own page (the SWA pools, ``global_page_size=swa_page_size``)."""

    @property
    def pages(self) -> int:
        """0.5.23 ``_num_dsv4_physical_kv_pages(size, page_size, global_page)``: ``ceil((size + global) / page)``,
        the highest slot index being ``size + global - 1`` (:func:`physical_pages`)."""
        return physical_pages(self.tokens, self.page_size, self.global_page)

    @property
    def page_bytes(self) -> int:
        return _row_page_bytes(self.page_size, self.row_bytes, self.page_align)

    @property
    def nbytes(self) -> int:
        return self.pages * self.page_bytes * len(self.layers)


@attrs.frozen
class IndexerGeometry:
    """The c4 indexer: ``layers`` × ``pages`` pages of ``page_size × row_bytes`` uint8."""

    tokens: int
    page_size: int
    layers: tuple[int, ...]
    head_dim: int
    global_page: int | None = None
    """``_make_indexer_pool(..., global_page_size=P)``: the schedule's page (``None``: the pool's own page)."""

    @property
    def row_bytes(self) -> int:
        return _index_row_bytes(self.head_dim)

    @property
    def pages(self) -> int:
        """The c4 KV pool's page count (0.5.23: "PD registers both by page"), :func:`physical_pages`."""
        return physical_pages(self.tokens, self.page_size, self.global_page)

    @property
    def page_bytes(self) -> int:
        return self.page_size * self.row_bytes

    @property
    def nbytes(self) -> int:
        return self.pages * self.page_bytes * len(self.layers)


@attrs.frozen
class StateGeometry:
    """One kind of compressor state: per layer a ``(rows, last_dim)`` buffer of ``dtype``."""

    name: str
    ratio: int
    size: int
    ring: int
    rows: int
    last_dim: int
    dtype: str
    layers: tuple[int, ...]
    online: bool = False

    @property
    def item_bytes(self) -> int:
        return STATE_DTYPE_BYTES[self.dtype]

    @property
    def row_bytes(self) -> int:
        return self.last_dim * self.item_bytes

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes * len(self.layers)


@attrs.frozen
class LowIndexGeometry:
    """A low ratio's fp4 indexer keys: ``layers`` x ``pages`` pages of ``page_size x row_bytes`` uint8."""

    name: str
    ratio: int
    tokens: int
    page_size: int
    layers: tuple[int, ...]
    head_dim: int

    @property
    def row_bytes(self) -> int:
        return self.head_dim // 2 + self.head_dim // FP4_SCALE_BLOCK

    @property
    def pages(self) -> int:
        """``_num_dsv4_physical_kv_pages(size, page, page)``: ``ceil((size + page) / page)``."""
        return -(-(self.tokens + self.page_size) // self.page_size)

    @property
    def page_bytes(self) -> int:
        return self.page_size * self.row_bytes

    @property
    def nbytes(self) -> int:
        return self.pages * self.page_bytes * len(self.layers)


@attrs.frozen
class LowRatioBuffers:
    """A stage's ratio-1/2 pools: KV per low ratio, fp4 indexer keys per low ratio, the ratio-2 pair state."""

    kv: tuple[KVRowGeometry, ...]
    index: tuple[LowIndexGeometry, ...]
    pair_state: StateGeometry | None


NO_LOW_RATIO = LowRatioBuffers((), (), None)
"""A V4 stage's (frozen, shared by every layout)."""


@attrs.frozen
class DSV4Buffers:
    """Every buffer of one rank's DSV4 pool, from a plan's model, serving and sizes."""

    page_size: int
    start_layer: int
    end_layer: int
    ratios: tuple[int, ...]
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    index_head_dim: int
    window_size: int
    swa: KVRowGeometry
    c4: KVRowGeometry
    c128: KVRowGeometry
    indexer: IndexerGeometry
    c4_state: StateGeometry
    c4_indexer_state: StateGeometry
    c128_state: StateGeometry
    draft_swa: KVRowGeometry | None
    num_req_slots: int
    c128_mtp_seq_lens: int
    hisparse_ptrs: int
    low_ratio: LowRatioBuffers = attrs.field(factory=lambda: NO_LOW_RATIO)
    """DeepSeek-V4.1's ratio-1/2 kv_source pools (:mod:`.low_ratio`); empty for V4 models."""
    draft_swa_valid_from: int = 0
    """The DSpark draft pool's int64 ``swa_valid_from`` entries (:mod:`.dspark`)."""
    unified: UnifiedGeometry | None = None
    """The unified-KV pool a platform selects (:mod:`.unified`), which replaces ``swa``, ``c4``, ``c128`` and
    ``draft_swa`` (left without layers); None: the separate-KV pools."""
    request_window: RequestWindowGeometry | None = None
    """DeepSeek-V4.1's per-request SWA window under encoder replay (:mod:`.encoder_replay`), which replaces
    ``swa`` (left without layers), the full-to-SWA mapping and the SWA allocator; None: no encoder replay."""

    @property
    def head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def layers_of(self, ratio: int) -> tuple[int, ...]:
        return tuple(self.start_layer + i for i, r in enumerate(self.ratios) if r == ratio)


def packed_row_bytes(qk_nope_head_dim: int, qk_rope_head_dim: int) -> int:
    """Bytes of one packed DSV4 row: fp8 nope, bf16 rope, ue8m0 scale per 64 nope, one pad (584 for 448/64)."""
    return qk_nope_head_dim + qk_rope_head_dim * ROPE_BYTES + qk_nope_head_dim // NOPE_QUANT_BLOCK + SCALE_PAD


def layout_row_bytes(layout: KVLayout, qk_nope_head_dim: int, qk_rope_head_dim: int) -> int:
    """A token's bytes in ``layout``: V4's from the dims (``get_bytes_per_token``), a V4.1 layout's fixed count."""
    if layout.name == "v4":
        return packed_row_bytes(qk_nope_head_dim, qk_rope_head_dim)
    return layout.bytes_per_token


def _ratio(layer: LayerSpec) -> int:
    return int(layer.params.get("compress_ratio", 0))


def draft_layers(model: ModelSpec, serving: Serving) -> int:
    """Layers of the draft worker's DSV4 pool (NextN layers; none without speculative decoding)."""
    if not serving.speculative:
        return 0
    return serving.speculative_draft_num_layers or model.num_nextn_predict_layers or 1


@attrs.frozen
class _Stage:
    """What :func:`dsv4_buffers` reads from the model and serving options: the same for every pool size, so a
    search over sizes reads it once (:func:`pool_bytes_probe`)."""

    start: int
    end: int
    ratios: tuple[int, ...]
    ids: tuple[int, ...]
    c4_ids: tuple[int, ...]
    c128_ids: tuple[int, ...]
    nope: int
    rope: int
    index_dim: int
    window: int
    row: int
    num_draft: int
    low_ratio: bool
    """Whether the stage holds DeepSeek-V4.1 ratio-1/2 layers (:func:`low_ratio_buffers`)."""
    main_geo: tuple[int, str]
    """The main (SWA) layout's ``(page_align, name)`` (:func:`_geo`)."""
    c4_row: int
    c4_geo: tuple[int, str]
    c128_row: int
    c128_geo: tuple[int, str]
    ring4: int
    ring128: int
    draft_tokens: int
    """``max_speculative_num_draft_tokens()`` (adaptive's largest): online c128's MTP banks."""


@last_pair
def _stage(model: ModelSpec, serving: Serving) -> _Stage:
    start, end = rank_layer_range(model, serving)
    layers = _stage_layers(model, start, end)
    main, c4_layout, c128_layout = main_layout(serving), compressed_layout(serving, 4), compressed_layout(serving, 128)
    return _Stage(
        start=start,
        end=end,
        ratios=layers.ratios,
        ids=layers.ids,
        c4_ids=layers.c4_ids,
        c128_ids=layers.c128_ids,
        nope=layers.nope,
        rope=layers.rope,
        index_dim=layers.index_dim,
        window=layers.window,
        row=layout_row_bytes(main, layers.nope, layers.rope),
        num_draft=draft_layers(model, serving),
        low_ratio=layers.low_ratio,
        main_geo=_geo(main),
        c4_row=layout_row_bytes(c4_layout, layers.nope, layers.rope),
        c4_geo=_geo(c4_layout),
        c128_row=layout_row_bytes(c128_layout, layers.nope, layers.rope),
        c128_geo=_geo(c128_layout),
        ring4=ring_size(4, serving),
        ring128=ring_size(128, serving),
        draft_tokens=online_mtp_draft_tokens(serving),
    )


@attrs.frozen
class _StageLayers:
    """What :class:`_Stage` reads from the model's layers alone (the same for every serving of that stage)."""

    ratios: tuple[int, ...]
    ids: tuple[int, ...]
    c4_ids: tuple[int, ...]
    c128_ids: tuple[int, ...]
    nope: int
    rope: int
    index_dim: int
    window: int
    low_ratio: bool


@per_model
def _stage_layers(model: ModelSpec, start: int, end: int) -> _StageLayers:
    ratios = tuple(_ratio(layer) for layer in model.layers[start:end])
    first = model.layers[0].params
    c4_params = next((layer.params for layer in model.layers if _ratio(layer) == 4), {})
    ids = tuple(range(start, end))
    return _StageLayers(
        ratios=ratios,
        ids=ids,
        c4_ids=tuple(i for i, r in zip(ids, ratios, strict=True) if r == 4),
        c128_ids=tuple(i for i, r in zip(ids, ratios, strict=True) if r == 128),
        nope=int(first["qk_nope_head_dim"]),
        rope=int(first["qk_rope_head_dim"]),
        index_dim=int(c4_params.get("index_head_dim", 0)),
        window=int(first.get("window_size", 0)),
        low_ratio=bool(sources_by_ratio(model, range(start, end))),
    )


def dsv4_buffers(model: ModelSpec, serving: Serving, sizes: DSV4Sizes, *, max_running_requests: int) -> DSV4Buffers:
    """The shapes of every buffer ``DeepSeekV4TokenToKVPool`` (and its draft pool) allocates on this rank."""
    return _buffers(_stage(model, serving), model, serving, sizes, max_running_requests=max_running_requests)


def _buffers(
    st: _Stage, model: ModelSpec, serving: Serving, sizes: DSV4Sizes, *, max_running_requests: int
) -> DSV4Buffers:
    start, end, ratios, ids, c4_ids, c128_ids = st.start, st.end, st.ratios, st.ids, st.c4_ids, st.c128_ids
    nope, rope, index_dim, window, row = st.nope, st.rope, st.index_dim, st.window, st.row
    page = serving.page_size

    rows, padding = req_to_token_rows(max_running_requests, serving)
    num_req_slots = rows + padding
    state_dtype = serving.dsv4_compress_state_dtype
    online = serving.enable_online_compress
    ring4, ring128 = st.ring4, st.ring128
    c4_rows, c128_size, c128_rows, c128_last, mtp_seq_lens = _state_rows(st, serving, sizes, num_req_slots)

    num_draft = st.num_draft
    draft_swa = (
        KVRowGeometry(DRAFT_SWA_KV_POOL, sizes.swa_tokens, page, tuple(range(num_draft)), row, *st.main_geo)
        if num_draft
        else None
    )
    separate = DSV4Buffers(
        page_size=page,
        start_layer=start,
        end_layer=end,
        ratios=ratios,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        index_head_dim=index_dim,
        window_size=window,
        swa=KVRowGeometry(SWA_KV_POOL, sizes.swa_tokens, page, ids, row, *st.main_geo),
        c4=KVRowGeometry(
            C4_KV_POOL, sizes.c4_tokens, max(page // 4, 1), c4_ids, st.c4_row, *st.c4_geo, global_page=page
        ),
        c128=KVRowGeometry(
            C128_KV_POOL, sizes.c128_tokens, max(page // 128, 1), c128_ids, st.c128_row, *st.c128_geo, global_page=page
        ),
        indexer=IndexerGeometry(
            sizes.c128_tokens * C4_LOGICAL_PER_C128, max(page // 4, 1), c4_ids, index_dim, global_page=page
        ),
        c4_state=StateGeometry(
            C4_STATE_POOL, 4, sizes.c4_state_size, ring4, c4_rows, 4 * (nope + rope), state_dtype, c4_ids
        ),
        c4_indexer_state=StateGeometry(
            C4_INDEXER_STATE_POOL, 4, sizes.c4_state_size, ring4, c4_rows, 4 * index_dim, state_dtype, c4_ids
        ),
        c128_state=StateGeometry(
            C128_STATE_POOL, 128, c128_size, ring128, c128_rows, c128_last, state_dtype, c128_ids, online
        ),
        draft_swa=draft_swa,
        num_req_slots=num_req_slots,
        c128_mtp_seq_lens=mtp_seq_lens if c128_ids else 0,
        hisparse_ptrs=len(c4_ids) if serving.enable_hisparse else 0,
        low_ratio=(
            low_ratio_buffers(model, serving, sizes.full_tokens, num_req_slots) if st.low_ratio else NO_LOW_RATIO
        ),
        draft_swa_valid_from=dspark_swa_valid_from_slots(serving, num_req_slots, has_draft_swa=draft_swa is not None),
    )
    b = with_unified_pool(separate, serving, sizes, num_draft)
    swa = b.swa
    window_geo = request_window_geometry(
        serving,
        swa=swa,
        row_bytes=swa.row_bytes,
        page_align=swa.page_align,
        layout=swa.layout,
        window=window,
        num_req_slots=num_req_slots,
        rows=KVRowGeometry,
    )
    if window_geo is None:
        return b
    # encoder replay: the request window replaces the SWA pool (.encoder_replay)
    return attrs.evolve(b, swa=attrs.evolve(swa, layers=()), request_window=window_geo)


def _state_rows(st: _Stage, serving: Serving, sizes: DSV4Sizes, num_req_slots: int) -> tuple[int, int, int, int, int]:
    """The compressor states' ``(c4 rows, c128 size, c128 rows, c128 row's last dim, c128 MTP seq_lens)``
    (``DeepSeekV4TokenToKVPool.__init__``): c4 ``ceil_to(size + ring + 1, 4)`` rows; c128 at least a ring per
    request slot, ``ceil_to(size + ring + 1, 128)`` rows of ``2 x head_dim`` (online c128: a slot per request,
    ``(size + ring + 1) x (1 + draft tokens)`` rows of ``3 x head_dim``, and its MTP ``seq_lens`` under
    ``--enable-online-c128-mtp``)."""
    ring128, head_dim = st.ring128, st.nope + st.rope
    c4_rows = _ceil_to(sizes.c4_state_size + st.ring4 + 1, 4)
    if serving.enable_online_compress:
        c128_size = max(sizes.c128_state_size, num_req_slots)
        # draft_tokens: max_speculative_num_draft_tokens(), adaptive's largest
        c128_rows = (c128_size + ring128 + 1) * (1 + st.draft_tokens)
        mtp_seq_lens = c128_size if serving.enable_online_c128_mtp else 0
        return c4_rows, c128_size, c128_rows, 3 * head_dim, mtp_seq_lens
    c128_size = max(sizes.c128_state_size, num_req_slots * ring128)
    return c4_rows, c128_size, _ceil_to(c128_size + ring128 + 1, 128), 2 * head_dim, 0


def with_unified_pool(b: DSV4Buffers, serving: Serving, sizes: DSV4Sizes, num_draft: int) -> DSV4Buffers:
    """``b`` on the unified-KV layout when the platform selects it (:mod:`.unified`): the SWA / c4 / c128 row
    pools and the draft's SWA pool give way to the unified rows, the c4 states become request-addressed
    (``num_req_slots x c4 ring``, ``DeepSeekV4TokenToKVPool.__init__``); else ``b`` unchanged."""
    unified = unified_geometry(
        serving,
        head_dim=b.head_dim,
        rope_dim=b.qk_rope_head_dim,
        window=b.window_size,
        slots=b.num_req_slots,
        c128_tokens=sizes.c128_tokens,
        ratios=b.ratios,
        draft_layers=num_draft,
    )
    if unified is None:
        return b
    size = b.num_req_slots * b.c4_state.ring
    rows = _ceil_to(size + b.c4_state.ring + 1, 4)
    return attrs.evolve(
        b,
        swa=attrs.evolve(b.swa, layers=()),
        c4=attrs.evolve(b.c4, layers=()),
        c128=attrs.evolve(b.c128, layers=()),
        draft_swa=None,
        c4_state=attrs.evolve(b.c4_state, size=size, rows=rows),
        c4_indexer_state=attrs.evolve(b.c4_indexer_state, size=size, rows=rows),
        unified=unified,
    )


def _geo(layout: KVLayout) -> tuple[int, str]:
    """A layout's ``(page_align, name)``, the tail of :class:`KVRowGeometry`'s fields."""
    return layout.page_align, layout.name


def pool_specs(
    model: ModelSpec,
    serving: Serving,
    sizes: DSV4Sizes,
    *,
    max_running_requests: int,
    context_len: int,
    owner: str = OWNER,
    buffers: DSV4Buffers | None = None,
) -> list[PoolSpec]:
    """Every pool ``build`` allocates for a DSV4 plan of these sizes, with exact bytes and costs.

    Pools of zero bytes (a stage without c128 layers, no draft) are left out.  ``buffers`` are
    :func:`dsv4_buffers` of these sizes when the caller has them already (the exact search's probe at its answer).
    """
    layout = _pool_layout(
        model, serving, sizes, max_running_requests=max_running_requests, context_len=context_len, buffers=buffers
    )
    return [make(owner) for _, make in layout]


def pool_bytes(
    model: ModelSpec, serving: Serving, sizes: DSV4Sizes, *, max_running_requests: int, context_len: int
) -> int:
    """``sum(p.bytes for p in pool_specs(...))`` without building the pools: the exact search's probe, which
    runs several times per plan (the pool values, with their costs, are built once, for the answer)."""
    layout = _pool_layout(model, serving, sizes, max_running_requests=max_running_requests, context_len=context_len)
    return sum(nbytes for nbytes, _ in layout)


def pool_bytes_probe(model: ModelSpec, serving: Serving, *, context_len: int) -> PoolBytesProbe:
    """:func:`pool_bytes` as ``probe(sizes, max_running_requests)``, the model's stage laid out once.

    The exact search probes a handful of token counts per plan; what the pool set's layout reads from the model
    (the stage's layers by compress ratio, the row bytes) is the same at each, so it is read here once, and each
    probe sums the buffers' bytes and the engine-wide pools' without building a pool value (issue 37)."""
    return PoolBytesProbe(model, serving, context_len)


@attrs.frozen
class SizeStep:
    """How much each DSV4 size grows in one step (a page of full tokens, or a page of SWA tokens)."""

    full_tokens: int = 0
    swa_tokens: int = 0
    c4_tokens: int = 0
    c128_tokens: int = 0
    c4_state_size: int = 0


class PoolBytesProbe:
    """``probe(sizes, max_running_requests)``: the bytes of every pool :func:`pool_specs` builds for those sizes.

    :meth:`linear` also says how those bytes grow with the sizes, so a search can solve for the answer instead of
    probing its way there (:func:`kvpools_plugins.dsv4.sizing.solved_full_tokens`).  V4's separate-KV pool set is
    summed from the stage alone (:class:`_SeparateBytes`: no pool laid out, issue 37's sixth pass); the other pool
    sets (HiSparse, unified, encoder replay, DSpark, V4.1's low ratios) are laid out at each probe."""

    def __init__(self, model: ModelSpec, serving: Serving, context_len: int) -> None:
        self.model, self.serving, self.context_len = model, serving, context_len
        self.stage = _stage(model, serving)
        self.hisparse = uses_hisparse_allocator(model, serving)
        separate = _is_separate(self.stage, serving, self.hisparse)
        self.separate = _SeparateBytes(self.stage, serving, context_len) if separate else None
        self._last: tuple[DSV4Sizes, int, DSV4Buffers] | None = None

    def __call__(self, sizes: DSV4Sizes, max_running_requests: int) -> int:
        if self.separate is not None:
            return self.separate.nbytes(sizes, max_running_requests)
        b = _buffers(self.stage, self.model, self.serving, sizes, max_running_requests=max_running_requests)
        self._last = (sizes, max_running_requests, b)
        layout = _pool_layout(
            self.model,
            self.serving,
            sizes,
            max_running_requests=max_running_requests,
            context_len=self.context_len,
            buffers=b,
        )
        return sum(nbytes for nbytes, _ in layout)

    def buffers(self, sizes: DSV4Sizes, max_running_requests: int) -> DSV4Buffers | None:
        """The buffers the last probe laid out, if it was for these sizes and requests (else None: the separate-KV
        pool set's probes lay nothing out)."""
        last = self._last
        if last is not None and last[0] == sizes and last[1] == max_running_requests:
            return last[2]
        return None

    def linear(self, sizes: DSV4Sizes, max_running_requests: int, *steps: SizeStep) -> tuple[int, ...] | None:
        """``(bytes, bytes per step...)`` at ``sizes``: the probe's bytes, and by how much they grow at each of
        ``steps`` (the request count held), exactly as long as the SWA pool keeps a page; None where the pool set
        is not V4's separate-KV one (its bytes are not summed here), or where a step is not a whole number of
        some pool's pages or state-row rounding (the bytes are then not linear in that step)."""
        separate = self.separate
        if separate is None or sizes.swa_tokens < self.serving.page_size:
            return None
        rates = [separate.step_bytes(step) for step in steps]
        if any(rate is None for rate in rates):
            return None
        return (separate.nbytes(sizes, max_running_requests), *(int(rate or 0) for rate in rates))


def _is_separate(st: _Stage, serving: Serving, hisparse: bool) -> bool:
    """Whether :func:`_buffers` lays V4's separate-KV pool set out for this stage and serving, at every size: no
    HiSparse allocator, the separate layout (:func:`unified_geometry` builds none), no encoder replay (no request
    window), no DSpark ``swa_valid_from`` (its entries are the request slots, at least one) and no V4.1 ratio-1/2
    pools (:func:`low_ratio_buffers` builds them for every low ratio the stage holds)."""
    return (
        not hisparse
        and dsv4_layout(serving) == SEPARATE
        and not replay_on(serving)
        and not dspark_swa_valid_from_slots(serving, 1, has_draft_swa=st.num_draft > 0)
        and not st.low_ratio
    )


class _SeparateBytes:
    """V4's separate-KV pool set summed from the stage (what :func:`_buffers` lays out and :func:`_pool_layout`
    charges, for any sizes and request count), and how much those bytes grow per :class:`SizeStep`.

    Each paged pool pays its page (:func:`_row_page_bytes`, :func:`_index_row_bytes`) on each of its layers per
    physical page (:func:`physical_pages`), each compressor state its row per state row (:func:`_state_rows`);
    the mapping, the request pools and the allocators as :func:`_pool_layout` builds them.  The exact solve
    probes a few sizes per plan: they are summed without laying the pool set out (``tests/dsv4/
    test_dsv4_plan_work.py`` checks the sums against the pools themselves)."""

    def __init__(self, st: _Stage, serving: Serving, context_len: int) -> None:
        page = serving.page_size
        self.st, self.serving, self.context_len, self.page = st, serving, context_len, page
        self.page4, self.page128 = max(page // 4, 1), max(page // 128, 1)
        # the SWA pool and the draft's SWA pool: the same tokens, page, row and page alignment
        self.swa_page = _row_page_bytes(page, st.row, st.main_geo[0]) * (len(st.ids) + st.num_draft)
        self.c4_page = _row_page_bytes(self.page4, st.c4_row, st.c4_geo[0]) * len(st.c4_ids)
        self.c128_page = _row_page_bytes(self.page128, st.c128_row, st.c128_geo[0]) * len(st.c128_ids)
        self.indexer_page = self.page4 * _index_row_bytes(st.index_dim) * len(st.c4_ids)
        item = STATE_DTYPE_BYTES[serving.dsv4_compress_state_dtype]
        self.item = item
        # the c4 KV and indexer states share their rows (4 x head_dim and 4 x index_dim of them per row)
        self.c4_state_row = (4 * (st.nope + st.rope) + 4 * st.index_dim) * item * len(st.c4_ids)
        self.hisparse_ptrs = len(st.c4_ids) * PTR_BYTES if serving.enable_hisparse else 0

    def nbytes(self, sizes: DSV4Sizes, max_running_requests: int) -> int:
        st, serving, page = self.st, self.serving, self.page
        rows, padding = req_to_token_rows(max_running_requests, serving)
        c4_rows, _, c128_rows, c128_last, mtp_seq_lens = _state_rows(st, serving, sizes, rows + padding)
        total = physical_pages(sizes.swa_tokens, page) * self.swa_page if st.ids or st.num_draft else 0
        if st.c4_ids:
            total += physical_pages(sizes.c4_tokens, self.page4, page) * self.c4_page
            total += physical_pages(sizes.c128_tokens * C4_LOGICAL_PER_C128, self.page4, page) * self.indexer_page
            total += c4_rows * self.c4_state_row
        if st.c128_ids:
            total += physical_pages(sizes.c128_tokens, self.page128, page) * self.c128_page
            total += c128_rows * c128_last * self.item * len(st.c128_ids) + mtp_seq_lens * 8
        swa_pages = page_align(sizes.swa_tokens, page)
        return (
            total
            + self.hisparse_ptrs
            + (sizes.full_tokens + page + 1) * SWA_MAPPING_ITEM_BYTES  # swa_mapping_pool
            + request_pools_bytes(max_running_requests, self.context_len, serving)
            + allocator_planned_nbytes(sizes.full_tokens, page)
            + (allocator_planned_nbytes(swa_pages, page) if swa_pages else 0)
        )

    def step_bytes(self, step: SizeStep) -> int | None:
        """By how many bytes :meth:`nbytes` grows when the sizes grow by ``step`` at a fixed request count (the
        SWA pool keeping a page), or None when that growth is not one fixed number of bytes: a step not a whole
        number of a pool's pages (``ceil`` of tokens over the page then depends on where it starts), nor of the
        state rows' rounding to the compress ratio (4), nor of the allocators' pages."""
        st, page = self.st, self.page
        full_tokens, swa_tokens = step.full_tokens, step.swa_tokens
        if full_tokens % page or swa_tokens % page:
            return None
        grown = swa_tokens // page * self.swa_page
        if st.c4_ids:
            c4_tokens, indexer_tokens = step.c4_tokens, step.c128_tokens * C4_LOGICAL_PER_C128
            if c4_tokens % self.page4 or indexer_tokens % self.page4 or step.c4_state_size % 4:
                return None
            grown += c4_tokens // self.page4 * self.c4_page + indexer_tokens // self.page4 * self.indexer_page
            grown += step.c4_state_size * self.c4_state_row
        if st.c128_ids:
            if step.c128_tokens % self.page128:
                return None
            grown += step.c128_tokens // self.page128 * self.c128_page
        # the mapping (one int64 per full slot), and the full and SWA allocators' free stacks (per page)
        pages = full_tokens // page + swa_tokens // page
        return grown + full_tokens * SWA_MAPPING_ITEM_BYTES + pages * _allocator_page_step(page)


@lru_cache(maxsize=64)
def _allocator_page_step(page: int) -> int:
    """The bytes a paged allocator's free stack grows by per page (a function of the page alone)."""
    return allocator_planned_nbytes(2 * page, page) - allocator_planned_nbytes(page, page)


_Make = Callable[[str], PoolSpec]


def _pool_layout(
    model: ModelSpec,
    serving: Serving,
    sizes: DSV4Sizes,
    *,
    max_running_requests: int,
    context_len: int,
    buffers: DSV4Buffers | None = None,
) -> list[tuple[int, _Make]]:
    """Each pool as ``(bytes, make(owner) -> PoolSpec)``: its bytes now, its value only when asked."""
    b = buffers or dsv4_buffers(model, serving, sizes, max_running_requests=max_running_requests)
    page = serving.page_size
    layout: list[tuple[int, _Make]] = []
    for geo, space in ((b.swa, SWA_TOKENS), (b.c4, C4_TOKENS), (b.c128, C128_TOKENS)):
        if geo.layers:
            per_block = geo.page_bytes * len(geo.layers)
            layout.append(
                (geo.nbytes, partial(_paged_pool, geo.name, geo.tokens, geo.page_size, per_block, geo.nbytes, space))
            )
    if b.draft_swa is not None:
        geo = b.draft_swa
        per_block = geo.page_bytes * len(geo.layers)
        layout.append(
            (geo.nbytes, partial(_paged_pool, geo.name, geo.tokens, geo.page_size, per_block, geo.nbytes, SWA_TOKENS))
        )
    if b.indexer.layers:
        # c4_logical_size = 32 x c128 tokens: it scales with c128 tokens (HiSparse shrinks c4, not this).
        ix = b.indexer
        c128_per_page = max(ix.page_size // C4_LOGICAL_PER_C128, 1)
        layout.append(
            (
                ix.nbytes,
                partial(
                    _paged_pool,
                    INDEXER_POOL,
                    sizes.c128_tokens,
                    c128_per_page,
                    ix.page_bytes * len(ix.layers),
                    ix.nbytes,
                    C128_TOKENS,
                    slots=ix.tokens,
                    bytes_per_slot=ix.row_bytes * len(ix.layers),
                    slot_space=(C4_TOKENS, C4_LOGICAL_PER_C128),
                ),
            )
        )
    if b.hisparse_ptrs:
        nbytes = b.hisparse_ptrs * PTR_BYTES
        layout.append((nbytes, partial(_fixed_pool, HISPARSE_PTRS_POOL, nbytes)))
    if uses_hisparse_allocator(model, serving):
        # DeepSeekV4HiSparseTokenToKVPoolAllocator's c4 device allocator and c4 logical->device mapping
        layout += hisparse_allocator_layout(sizes.c4_tokens, sizes.c128_tokens, page)
    if b.unified is not None:
        layout += unified_layout(b.unified, (b.c4_state, b.c4_indexer_state), max_running_requests)
    for state in (b.c4_state, b.c4_indexer_state) if b.unified is None else ():
        if state.layers and b.request_window is not None:
            # encoder replay: c4_state_pool_size = 0 SWA tokens // window x ring, so the ring's padding rows alone
            layout.append((state.nbytes, partial(_fixed_pool, state.name, state.nbytes)))
        elif state.layers:
            # c4_state_pool_size = swa // window x ring: ring rows per window of SWA tokens (SGLang 0.5.23, which
            # kvpools follows for DeepSeek-V4.1 stages: per SWA page, .v41_budget).
            divisor = b.page_size if b.low_ratio.kv else max(b.window_size, 1)
            per_block = state.ring * state.row_bytes * len(state.layers)
            layout.append(
                (
                    state.nbytes,
                    partial(
                        _paged_pool,
                        state.name,
                        sizes.swa_tokens,
                        divisor,
                        per_block,
                        state.nbytes,
                        SWA_TOKENS,
                        slots=state.size,
                        bytes_per_slot=state.row_bytes * len(state.layers),
                        kind="state",
                    ),
                )
            )
    st = b.c128_state
    if st.layers:
        rows_per_request = (1 + online_mtp_draft_tokens(serving)) if st.online else st.ring
        per_request = rows_per_request * st.row_bytes * len(st.layers)
        layout.append(
            (st.nbytes, partial(_request_pool, C128_STATE_POOL, max_running_requests, per_request, st.nbytes))
        )
        if b.c128_mtp_seq_lens:
            nbytes = b.c128_mtp_seq_lens * 8
            layout.append((nbytes, partial(_request_pool, C128_MTP_SEQ_LENS_POOL, max_running_requests, 8, nbytes)))
    layout += low_ratio_layout(b.low_ratio, sizes.full_tokens, page, max_running_requests)
    if b.draft_swa_valid_from:
        nbytes = b.draft_swa_valid_from * VALID_FROM_BYTES
        layout.append(
            (
                nbytes,
                partial(_request_pool, DRAFT_SWA_VALID_FROM_POOL, max_running_requests, VALID_FROM_BYTES, nbytes),
            )
        )
    if b.request_window is not None:
        # encoder replay: the window replaces the SWA pool, and the full-only allocator keeps no mapping
        layout += window_layout(b.request_window, max_running_requests, _request_pool, _fixed_pool)
    else:
        # the engine-wide pools the parts library builds (their bytes come from the values themselves)
        # the mapping's bytes as swa_mapping_pool counts them: one int64 per full slot, the padding page and the -1
        mapping_bytes = (sizes.full_tokens + page + 1) * SWA_MAPPING_ITEM_BYTES
        layout.append((mapping_bytes, partial(swa_mapping_pool, sizes.full_tokens, page)))
    layout += [
        (pool.bytes, partial(_as_built, pool)) for pool in request_pools(max_running_requests, context_len, serving)
    ]
    full_allocator = allocator_pool(sizes.full_tokens, page)
    layout.append((full_allocator.bytes, partial(_as_built, full_allocator)))
    swa_pages = page_align(sizes.swa_tokens, page)
    if swa_pages:
        layout.append((allocator_planned_nbytes(swa_pages, page), partial(_swa_allocator, swa_pages, page)))
    return layout


def _as_built(pool: PoolSpec, owner: str) -> PoolSpec:
    """A pool the parts library built with its own owner (the request table, the full allocator)."""
    return pool


def _swa_allocator(swa_pages: int, page: int, owner: str) -> PoolSpec:
    return allocator_pool(swa_pages, page, token_space=SWA_TOKENS, name=SWA_ALLOCATOR, owner=owner)


def _paged_pool(
    name: str,
    tokens: int,
    block: int,
    bytes_per_block: int,
    nbytes: int,
    space: str,
    owner: str,
    *,
    slots: int | None = None,
    bytes_per_slot: int | None = None,
    kind: str = "kv",
    slot_space: tuple[str, int] | None = None,
) -> PoolSpec:
    """A pool growing in blocks of ``block`` tokens of ``space``; the rest of ``nbytes`` is fixed (exact at tokens).

    ``slot_space`` (space, slots per token of ``space``) names what its slots are when they are another space's
    tokens (the c4 indexer: c4 tokens, 32 per c128 token), for the cost line's unit."""
    fixed = nbytes - bytes_per_block * (tokens // block)
    per_token = bytes_per_block // block if bytes_per_slot is None else bytes_per_slot
    count = tokens if slots is None else slots
    fields: dict[str, Any] = {
        "name": name,
        "kind": kind,
        "slots": count,
        "padding_slots": 0,
        "bytes_per_slot": per_token,
        "bytes": nbytes,
        "sglang_charged": kind != "mapping",
        "owner": owner,
        "unit": TOKEN,
        "token_space": space,
    }
    if fixed < 0:  # cannot happen for the pools above; keep the plan exact anyway
        return PoolSpec(**{**fields, "unit": FIXED})
    cost = GroupCost(
        group=name,
        token_space=space,
        token_bytes=bytes_per_block,
        token_block=block,
        fixed_bytes=fixed,
        slot_space=None if slot_space is None else slot_space[0],
        slots_per_token=1 if slot_space is None else slot_space[1],
    )
    if block != 1:
        # a cost per block of tokens, which the fields (per slot) cannot say: with_cost would record it
        return PoolSpec(**fields, cost=cost)
    return with_cost(PoolSpec(**fields), cost)


def _request_pool(name: str, requests: int, per_request: int, nbytes: int, owner: str) -> PoolSpec:
    """A pool of ``per_request`` bytes per running request; the rest of ``nbytes`` (slot padding, rounding) fixed."""
    fixed = nbytes - per_request * requests
    pool = PoolSpec(
        name=name,
        kind="state",
        slots=requests,
        bytes_per_slot=per_request,
        bytes=nbytes,
        owner=owner,
        unit=REQUEST,
    )
    if fixed < 0:
        return _fixed_pool(name, nbytes, owner)
    return with_cost(pool, GroupCost(group=name, bytes_per_request=per_request, fixed_bytes=fixed))


def _fixed_pool(name: str, nbytes: int, owner: str) -> PoolSpec:
    return PoolSpec(name=name, kind="fixed", slots=1, bytes_per_slot=nbytes, bytes=nbytes, owner=owner, unit=FIXED)


# -- DeepSeek-V4.1's ratio-1/2 kv_source pools (issue 33; the rules are .low_ratio's) --------------------


def low_ratio_buffers(model: ModelSpec, serving: Serving, full_tokens: int, num_req_slots: int) -> LowRatioBuffers:
    """The ratio-1/2 pools ``DeepSeekV4TokenToKVPool`` builds on this rank (none for a V4 model)."""
    start, end = rank_layer_range(model, serving)
    found = sources_by_ratio(model, range(start, end))
    if not found:
        return NO_LOW_RATIO
    page = serving.page_size
    index_dim = int(model.params.get("index_head_dim", 0))
    nope = int(model.layers[0].params["qk_nope_head_dim"])
    rope = int(model.layers[0].params["qk_rope_head_dim"])
    kv = []
    index = []
    for ratio, layers in found.items():
        layout = compressed_layout(serving, ratio)
        kv.append(
            KVRowGeometry(
                kv_pool_name(ratio),
                full_tokens // ratio,
                page // ratio,
                tuple(layers),
                layout_row_bytes(layout, nope, rope),
                layout.page_align,
                layout.name,
                global_page=page,
            )
        )
        index.append(
            LowIndexGeometry(
                index_pool_name(ratio),
                ratio,
                (full_tokens + page) // ratio,
                DSV41_INDEX_PAGE_SIZE,
                tuple(layers),
                index_dim,
            )
        )
    pair = None
    if 2 in found:
        ring = pair_ring_size(serving)
        size = num_req_slots * ring
        rows = -(-(size + ring + 1) // 2) * 2
        pair = StateGeometry(PAIR_STATE_POOL, 2, size, ring, rows, 2 * (nope + rope), "float32", tuple(found[2]))
    return LowRatioBuffers(tuple(kv), tuple(index), pair)


def low_ratio_layout(
    lr: LowRatioBuffers, full_tokens: int, page: int, max_running_requests: int
) -> list[tuple[int, _Make]]:
    """Each low-ratio pool as ``(bytes, make(owner))``: KV and indexer pools grow with the full tokens (a page of
    ``P`` full tokens is ``P // r`` slots), the pair state with the request slots."""
    layout: list[tuple[int, _Make]] = []
    for geo in lr.kv:
        # a page of P full tokens is one page of P // r slots
        per_block = geo.page_bytes * len(geo.layers)
        per_slot = geo.row_bytes * len(geo.layers)
        layout.append(
            (geo.nbytes, partial(_low_pool, geo.name, full_tokens, page, per_block, geo.nbytes, geo.tokens, per_slot))
        )
    for ix in lr.index:
        # (full + P) // r slots in pages of 64: a page of P full tokens is P // r more slots
        per_block = (page // ix.ratio) * ix.row_bytes * len(ix.layers)
        per_slot = ix.row_bytes * len(ix.layers)
        layout.append(
            (ix.nbytes, partial(_low_pool, ix.name, full_tokens, page, per_block, ix.nbytes, ix.tokens, per_slot))
        )
    st = lr.pair_state
    if st is not None:
        per_request = st.ring * st.row_bytes * len(st.layers)
        layout.append((st.nbytes, partial(_request_pool, st.name, max_running_requests, per_request, st.nbytes)))
    return layout


def _low_pool(
    name: str, full_tokens: int, page: int, per_block: int, nbytes: int, slots: int, per_slot: int, owner: str
) -> PoolSpec:
    return _paged_pool(
        name, full_tokens, page, per_block, nbytes, FULL_TOKENS, owner, slots=slots, bytes_per_slot=per_slot
    )
