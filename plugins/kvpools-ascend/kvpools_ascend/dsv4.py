"""DeepSeek-V4 on Ascend NPUs: SGLang 0.5.23's ``DSV4NPUTokenToKVPool``, its allocator and request table (no torch).

On an NPU SGLang builds DeepSeek-V4's KV cache with its own classes
(``srt/hardware_backend/npu/dsv4/``; ``_build_dsv4_kv_pool`` picks ``DSV4NPUTokenToKVPool``,
``_build_token_to_kv_pool_allocator`` ``DSV4NPUTokenToKVPoolAllocator``, the request-pool builders
``DSV4NPUReqToTokenPool`` / ``DSV4NPUDecodeReqToTokenPool``: ref-000 lines 1112-1118, 1194-1200, 1365-1375,
2066-2071), sized by the same ``DSV4PoolConfigurator`` as on CUDA, with page 128 and the KV cache in bf16
(``_deepseek_v4_kv_cache_dtype``, ``arg_groups/overrides.py``: ``if view.device == "npu": kv_cache_dtype =
"bfloat16"``, whatever ``--kv-cache-dtype`` says).  kvpools-ascend declares that layout in its traits
(``pool_layouts["dsv4"] = "npu_pa_nd"``, ``platform_planned_layouts``: the ``dsv4`` plugin then neither refuses
the name nor sizes it) and answers ``validate``, ``estimate_cell_size`` (a wrapper), ``size_pools``,
``build_req_to_token_pool``, ``build_pool`` and ``build_allocator`` for DeepSeek-V4 plans on ``ascend`` itself.

**The configurator on NPU** (``pool_configurator.py`` of 0.5.23, ``DSV4PoolConfigurator``): ``kv_bytes`` is the
FlashMLA row, ``qk_nope + 2 x qk_rope + 8`` = 584 B (line 1108), and ``_get_paged_kv_bytes_per_token`` returns it
unpadded on NPU (lines 1353-1357: ``if self._unified or _is_npu or ...: return self.kv_bytes``), as does
``_get_low_ratio_kv_padding_bytes`` (0, line 1408); the indexer 132 B, the states float32; page 128
(``model_overrides/deepseek_v4.py``: ``if cfg.device == "npu": page_size = 128``).  :class:`NPUConfigurator`
reproduces it (``--accounting sglang``); ``--accounting exact`` keeps its derivation of the sub-pools and finds
the most full tokens whose every NPU buffer fits.

**The buffers** (``dsv4_memory_pool.py``; ``P`` the page, 128; ``L``, ``L4``, ``L128`` the stage's layers, c4 and
c128 layers; ``cps`` the ``--c128-page-size``, default 16, :data:`C128_PAGE_OPTION`):

* SWA / c4 / c128 KV, ``NPUDeepSeekV4SingleKVPool.create_buffer`` (lines 69-93): per layer a PA_ND tensor
  ``((size + kp + 1) // kp, kp, 1, kv_dim)`` -- before arch35 bf16 ``kv_dim = qk_nope + qk_rope`` (1024 B a row);
  on arch35 (A5) fp8 ``kv_dim = ceil((qk_nope + 2 qk_rope + ceil(qk_nope / 64)) / 128) x 128`` (640 B).  The kernel
  page ``kp`` (``_make_kv_pool``, lines 305-312): ``P`` for SWA, ``P / 4`` for c4 (its native page), ``cps`` for
  c128.  ``size``: ``swa_size`` / ``c4_size`` / ``c128_size``.
* the c4 indexer, ``NPUDeepSeekV4IndexerPool._create_buffer`` (lines 190-222), over ``c4_logical_size = c128 x 32``
  rows: the base packed CUDA buffer kept (``ceil((size + P) / (P / 4))`` pages of ``P / 4 x 132`` uint8,
  ``DeepSeekV4IndexerPool._create_buffer``), plus per layer ``index_k ((size + kp + 1) // kp, kp, 1, index_head_dim)``
  int8 (fp8 on arch35) and ``index_scale (…, 1)`` fp16 (fp32 on arch35), ``kp = P / 4``.
* compressor states, ``NPUCompressStatePool`` (lines 109-146): the shared ``CompressStatePool`` with
  ``state_cache_page_size = ring``, so its rows are ``size + ring + 1`` rounded up to ``lcm(ratio, ring)``
  (``deepseek_v4_compress_state.py`` lines 170-177); float32 only.  c4 state and c4 indexer state per c4 layer
  (``4 x head_dim`` wide), the c128 state per c128 layer (``2 x head_dim``).  Sizes: c4 the configurator's
  ``swa // P x ring``, c128 ``max(c128_state_pool_size, num_req_slots x ring)``
  (``DeepSeekV4TokenToKVPool.__init__``); on arch35 both at least ``num_req_slots x ring``
  (``_make_compress_state_pool``, lines 347-349).
* the full-to-SWA mapping and the request table, as on CUDA; the request table's C128 sidecar,
  ``req_to_c128_sidecar (rows, max(1, ceil(context / (128 x cps))))`` int32 (``dsv4_req_to_token_pool.py``
  lines 51-60).
* the allocator, ``DSV4NPUTokenToKVPoolAllocator`` (``dsv4_allocator.py`` lines 104-140): the SWA allocator's
  full and SWA free lists, plus an ``NPUPagedTokenToKVPoolAllocator(c128_size, page_size=cps)`` free list and an
  int32 ``c128_page_refcount`` of ``c128_size // cps + 1``.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from functools import partial
from math import ceil, gcd

import attrs

from kvpools_ascend.names import PLATFORM
from kvpools_core import hookimpl
from kvpools_core.allocators import allocator_planned_nbytes
from kvpools_core.errors import InsufficientMemoryError
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.sizing import (
    allocator_pool,
    apply_token_cap,
    fmt_gib,
    largest_fitting_tokens,
    not_enough_memory,
    page_align,
    req_to_token_row_len,
    req_to_token_rows,
    request_pools,
    resolve_max_num_reqs,
    sliding_window_terms,
    swa_mapping_pool,
    with_cost,
)
from kvpools_core.values import (
    FIXED,
    REQUEST,
    TOKEN,
    Budget,
    CellSize,
    GroupCost,
    ModelSpec,
    PoolSizing,
    PoolSpec,
    Serving,
)

__all__ = [
    "C128_PAGE_OPTION",
    "NPUDSV4Buffers",
    "npu_dsv4_buffers",
    "npu_dsv4_cell",
    "npu_dsv4_pool_specs",
    "npu_dsv4_problems",
]

DSV4_ARCHITECTURE = "dsv4"
SGLANG_ACCOUNTINGS = ("exact", "sglang")
"""The accountings that plan SGLang's server (vLLM's and TensorRT-LLM's keep their engines' own pools)."""
OWNER = "ascend"
C128_PAGE_OPTION = "ascend.c128_page_size"
"""SGLang's ``--c128-page-size`` (``arg_groups/fields/schedule.py``: default 16, "a positive multiple of 16")."""
DEFAULT_C128_PAGE = 16
ARCH35_QUANT_GROUP = 64
"""``_NPU_ARCH35_KV_QUANT_GROUP_SIZE``: nope values per scale byte of the A5 packed row."""
ARCH35_ROW_ALIGN = 128
"""``_NPU_ARCH35_KV_ROW_ALIGNMENT``: the A5 packed row is padded to a multiple of 128 B."""
INDEX_ROW_EXTRA = 4
"""The packed CUDA indexer row: keys + one fp32 scale per 128 (``get_dsv4_indexer_bytes_per_token``)."""
C4_LOGICAL_PER_C128 = 32
"""``c4_logical_size = c128_size * 32``: the indexer's rows."""
STATE_BYTES = 4
"""``NPUCompressStatePool`` asserts float32 state ("Atlas A3 npu.compressor requires FP32 state_cache")."""
SIDECAR_ITEM_BYTES = 4
REFCOUNT_ITEM_BYTES = 4

SWA_TOKENS, C4_TOKENS, C128_TOKENS, FULL = "swa", "c4", "c128", "full"
SWA_KV, C4_KV, C128_KV, DRAFT_SWA_KV = "kv_swa", "kv_c4", "kv_c128", "draft_kv_swa"
INDEXER_PACKED, INDEX_K, INDEX_SCALE = "indexer_c4", "index_k_c4", "index_scale_c4"
C4_STATE, C4_INDEXER_STATE, C128_STATE = "c4_state", "c4_indexer_state", "c128_state"
SIDECAR = "req_to_c128_sidecar"
C128_ALLOCATOR, C128_REFCOUNT = "c128_allocator", "c128_page_refcount"
SWA_ALLOCATOR = "swa_allocator"

SGLANG_HISPARSE = "enable_hisparse is not supported on the NPU DSV4 KV pool (got c4 pool class HiSparseC4DevicePool)."
SGLANG_ONLINE = (
    "SGLANG_OPT_USE_ONLINE_COMPRESS is incompatible with the NPU fused compressor (no online mode in the kernel)."
)
SGLANG_STATE_DTYPE = "Atlas A3 npu.compressor requires FP32 state_cache, but NPUCompressStatePool got torch.bfloat16."
SGLANG_C128_PAGE = "c128_page_size must be a positive multiple of 16 for the NPU sparse-attention operator, got {value}"
SGLANG_TRTLLM = (
    "enable_hisparse is not supported on the NPU DSV4 KV pool (got c4 pool class DeepSeekV4UniformFP8KVPool)."
)


def on_npu_dsv4(model: ModelSpec, serving: Serving) -> bool:
    return serving.platform == PLATFORM and model.architecture == DSV4_ARCHITECTURE


def arch35(serving: Serving) -> bool:
    """``is_npu_arch35()``: the ``ascend.soc`` plugin option (:mod:`kvpools_ascend.dsa`)."""
    return str(serving.plugin_options.get("ascend.soc", "a2")) == "arch35"


def c128_page_size(serving: Serving) -> int:
    """``--c128-page-size`` (the ``ascend.c128_page_size`` plugin option; SGLang's default 16)."""
    value = serving.plugin_options.get(C128_PAGE_OPTION, DEFAULT_C128_PAGE)
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1


def _ceil_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _lcm(a: int, b: int) -> int:
    return a * b // gcd(a, b)


# ---------------------------------------------------------------------------
# the buffers
# ---------------------------------------------------------------------------


@attrs.frozen
class PANDGeometry:
    """One ``NPUDeepSeekV4SingleKVPool``: per layer ``(pages, kernel_page, 1, kv_dim)`` of ``item`` bytes."""

    name: str
    tokens: int
    kernel_page: int
    layers: tuple[int, ...]
    kv_dim: int
    item: int
    space: str

    @property
    def pages(self) -> int:
        """``npu_num_pages = (self.size + self.kernel_page_size + 1) // self.kernel_page_size``."""
        return (self.tokens + self.kernel_page + 1) // self.kernel_page

    @property
    def row_bytes(self) -> int:
        return self.kv_dim * self.item

    @property
    def nbytes(self) -> int:
        return self.pages * self.kernel_page * self.row_bytes * len(self.layers)


@attrs.frozen
class PackedIndexGeometry:
    """The base ``DeepSeekV4IndexerPool`` buffer the NPU pool keeps: per layer ``(pages, page x 132)`` uint8."""

    tokens: int
    page: int
    global_page: int
    layers: tuple[int, ...]
    row_bytes: int

    @property
    def pages(self) -> int:
        """``_num_dsv4_physical_kv_pages(size, page, global_page)``: ``ceil((size + global) / page)``."""
        return -(-(self.tokens + self.global_page) // self.page)

    @property
    def nbytes(self) -> int:
        return self.pages * self.page * self.row_bytes * len(self.layers)


@attrs.frozen
class StateGeometry:
    """One ``NPUCompressStatePool`` per layer: ``(rows, last_dim)`` float32."""

    name: str
    ratio: int
    size: int
    ring: int
    last_dim: int
    layers: tuple[int, ...]

    @property
    def rows(self) -> int:
        """``size + ring + 1`` rounded up to ``lcm(ratio, ring)`` (``state_cache_page_size = ring``)."""
        return _ceil_to(self.size + self.ring + 1, _lcm(self.ratio, self.ring))

    @property
    def row_bytes(self) -> int:
        return self.last_dim * STATE_BYTES

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes * len(self.layers)


@attrs.frozen
class NPUDSV4Buffers:
    """Every buffer of one rank's ``DSV4NPUTokenToKVPool``, its request table's sidecar and its allocator."""

    page_size: int
    c128_page: int
    start_layer: int
    end_layer: int
    ratios: tuple[int, ...]
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    index_head_dim: int
    arch35: bool
    swa: PANDGeometry
    c4: PANDGeometry
    c128: PANDGeometry
    indexer: PackedIndexGeometry
    index_k: PANDGeometry
    index_scale: PANDGeometry
    c4_state: StateGeometry
    c4_indexer_state: StateGeometry
    c128_state: StateGeometry
    draft_swa: PANDGeometry
    """The draft worker's own ``DSV4NPUTokenToKVPool`` (EAGLE's NextN layers, all of ratio 0: SWA rows only,
    ``_build_dsv4_kv_pool`` for a draft worker); no layers without speculative decoding."""
    num_req_slots: int
    sidecar_cols: int
    full_tokens: int
    swa_tokens: int
    c128_tokens: int

    @property
    def kv_pools(self) -> tuple[PANDGeometry, ...]:
        return tuple(geo for geo in (self.swa, self.c4, self.c128, self.draft_swa) if geo.layers)

    @property
    def states(self) -> tuple[StateGeometry, ...]:
        return tuple(st for st in (self.c4_state, self.c4_indexer_state, self.c128_state) if st.layers)

    @property
    def c128_pages(self) -> int:
        """``NPUPagedTokenToKVPoolAllocator.num_pages = size // page_size`` of the c128 allocator."""
        return self.c128_tokens // self.c128_page

    @property
    def sidecar_bytes(self) -> int:
        return self.num_req_slots * self.sidecar_cols * SIDECAR_ITEM_BYTES

    @property
    def refcount_bytes(self) -> int:
        return (self.c128_pages + 1) * REFCOUNT_ITEM_BYTES if self.c128.layers else 0

    @property
    def c128_allocator_tokens(self) -> int:
        """The c128 allocator's slots in whole pages (SGLang's free list holds ``size // page_size`` pages)."""
        return self.c128_pages * self.c128_page

    @property
    def c128_allocator_bytes(self) -> int:
        return allocator_planned_nbytes(self.c128_allocator_tokens, self.c128_page) if self.c128_pages else 0


def kv_row(serving: Serving, nope: int, rope: int) -> tuple[int, int]:
    """``(kv_dim, item bytes)`` of a PA_ND row: bf16 ``nope + rope`` before arch35, the A5 packed fp8 row on it."""
    if arch35(serving):
        packed = nope + rope * 2 + ceil(nope / ARCH35_QUANT_GROUP)
        return _ceil_to(packed, ARCH35_ROW_ALIGN), 1
    return nope + rope, 2


def ring_size(ratio: int, serving: Serving) -> int:
    """``get_compress_state_ring_size`` (online c128 is refused on NPU): 8 / 128, 16 / 256 speculative (the
    draft is refused on NPU for now, :func:`npu_dsv4_problems`)."""
    if serving.speculative:
        return 16 if ratio == 4 else 256
    return 8 if ratio == 4 else 128


def draft_layer_ids(model: ModelSpec, serving: Serving) -> tuple[int, ...]:
    """The draft worker pool's layers (its NextN layers, ``layer_info.num_effective_layers``); none unspeculative."""
    if not serving.speculative:
        return ()
    return tuple(range(serving.speculative_draft_num_layers or model.num_nextn_predict_layers or 1))


def write_pad(ratio: int, ring: int) -> int:
    """``get_compress_state_write_pad``: the most draft tokens a ring of ``ring`` rows keeps resident."""
    window = ratio * (2 if ratio == 4 else 1)
    return ring - window + 2 if ring > window else 0


def npu_dsv4_buffers(
    model: ModelSpec, serving: Serving, sizes: dict[str, int], requests: int, context_len: int
) -> NPUDSV4Buffers:
    """The buffers SGLang's NPU classes allocate for these ``MemoryPoolConfig`` sizes on this rank."""
    start, end = rank_layer_range(model, serving)
    stage = model.layers[start:end]
    ratios = tuple(int(layer.params.get("compress_ratio", 0)) for layer in stage)
    ids = tuple(range(start, end))
    c4_ids = tuple(i for i, r in zip(ids, ratios, strict=True) if r == 4)
    c128_ids = tuple(i for i, r in zip(ids, ratios, strict=True) if r == 128)
    first = model.layers[0].params
    nope, rope = int(first["qk_nope_head_dim"]), int(first["qk_rope_head_dim"])
    index_dim = int(model.params.get("index_head_dim", 0))
    page, cps = serving.page_size, c128_page_size(serving)
    a5 = arch35(serving)
    kv_dim, item = kv_row(serving, nope, rope)
    rows, padding = req_to_token_rows(requests, serving)
    slots = rows + padding
    c4_tokens, c128_tokens = int(sizes["c4_max_total_num_tokens"]), int(sizes["c128_max_total_num_tokens"])
    logical = c128_tokens * C4_LOGICAL_PER_C128
    ring4, ring128 = ring_size(4, serving), ring_size(128, serving)
    c4_state = int(sizes["c4_state_pool_size"])
    c128_state = max(int(sizes["c128_state_pool_size"]), slots * ring128)
    if a5:  # A5's cycle ABI: a ring bank for every request slot
        c4_state, c128_state = max(c4_state, slots * ring4), max(c128_state, slots * ring128)
    head = nope + rope
    kp4 = page // 4
    return NPUDSV4Buffers(
        page_size=page,
        c128_page=cps,
        start_layer=start,
        end_layer=end,
        ratios=ratios,
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope,
        index_head_dim=index_dim,
        arch35=a5,
        swa=PANDGeometry(SWA_KV, int(sizes["swa_max_total_num_tokens"]), page, ids, kv_dim, item, SWA_TOKENS),
        draft_swa=PANDGeometry(
            DRAFT_SWA_KV,
            int(sizes["swa_max_total_num_tokens"]),
            page,
            draft_layer_ids(model, serving),
            kv_dim,
            item,
            SWA_TOKENS,
        ),
        c4=PANDGeometry(C4_KV, c4_tokens, kp4, c4_ids, kv_dim, item, C4_TOKENS),
        c128=PANDGeometry(C128_KV, c128_tokens, cps, c128_ids, kv_dim, item, C128_TOKENS),
        indexer=PackedIndexGeometry(logical, kp4, page, c4_ids, index_dim + index_dim // 128 * INDEX_ROW_EXTRA),
        index_k=PANDGeometry(INDEX_K, logical, kp4, c4_ids, index_dim, 1, C128_TOKENS),
        index_scale=PANDGeometry(INDEX_SCALE, logical, kp4, c4_ids, 1, 4 if a5 else 2, C128_TOKENS),
        c4_state=StateGeometry(C4_STATE, 4, c4_state, ring4, 4 * head, c4_ids),
        c4_indexer_state=StateGeometry(C4_INDEXER_STATE, 4, c4_state, ring4, 4 * index_dim, c4_ids),
        c128_state=StateGeometry(C128_STATE, 128, c128_state, ring128, 2 * head, c128_ids),
        num_req_slots=slots,
        sidecar_cols=max(1, -(-req_to_token_row_len(context_len, serving) // (128 * cps))),
        full_tokens=int(sizes["full_max_total_num_tokens"]),
        swa_tokens=int(sizes["swa_max_total_num_tokens"]),
        c128_tokens=c128_tokens,
    )


# ---------------------------------------------------------------------------
# the plan's pools
# ---------------------------------------------------------------------------

_Make = Callable[[], PoolSpec]


def _token_pool(
    name: str,
    nbytes: int,
    space: str,
    tokens: int,
    block: int,
    per_block: int,
    *,
    kind: str = "kv",
    slots: int = 0,
    charged: bool = True,
) -> PoolSpec:
    """A pool growing ``per_block`` bytes per ``block`` tokens of ``space``; the rest of ``nbytes`` is fixed."""
    fixed = nbytes - per_block * (tokens // block)
    pool = PoolSpec(
        name=name,
        kind=kind,
        slots=slots or tokens,
        bytes_per_slot=per_block // block,
        bytes=nbytes,
        sglang_charged=charged,
        owner=OWNER,
        unit=TOKEN,
        token_space=space,
    )
    if fixed < 0:
        return attrs.evolve(pool, unit=FIXED)
    return with_cost(
        pool, GroupCost(group=name, token_space=space, token_bytes=per_block, token_block=block, fixed_bytes=fixed)
    )


def _request_pool(
    name: str, nbytes: int, requests: int, per_request: int, kind: str = "state", charged: bool = True
) -> PoolSpec:
    """A pool of ``per_request`` bytes per running request; the padding slots and rounding fixed."""
    fixed = nbytes - per_request * requests
    pool = PoolSpec(
        name=name,
        kind=kind,
        slots=requests,
        bytes_per_slot=per_request,
        bytes=nbytes,
        sglang_charged=charged,
        owner=OWNER,
        unit=REQUEST,
    )
    if fixed < 0:
        return attrs.evolve(pool, unit=FIXED)
    return with_cost(pool, GroupCost(group=name, bytes_per_request=per_request, fixed_bytes=fixed))


def _fixed_pool(name: str, nbytes: int, kind: str = "fixed") -> PoolSpec:
    """A pool of fixed bytes SGLang's estimate leaves out."""
    return PoolSpec(
        name=name,
        kind=kind,
        slots=1,
        bytes_per_slot=nbytes,
        bytes=nbytes,
        sglang_charged=False,
        owner=OWNER,
        unit=FIXED,
    )


def _layout(b: NPUDSV4Buffers, serving: Serving, requests: int, context_len: int) -> list[tuple[int, _Make]]:
    """Each pool as ``(bytes, make)``: the bytes for the search's probe, the value only for the answer."""
    page = b.page_size
    out: list[tuple[int, _Make]] = []
    for geo in b.kv_pools:
        # a page of P full tokens adds P / ratio rows of this pool: block and bytes in the pool's own token space
        per_page = geo.kernel_page * geo.row_bytes * len(geo.layers)
        out.append(
            (geo.nbytes, partial(_token_pool, geo.name, geo.nbytes, geo.space, geo.tokens, geo.kernel_page, per_page))
        )
    if b.indexer.layers:
        # the indexer's rows are c4-logical slots, 32 per c128 token: charged per c128 token
        ix = b.indexer
        per_c128 = C4_LOGICAL_PER_C128 * ix.row_bytes * len(ix.layers)
        out.append(
            (
                ix.nbytes,
                partial(
                    _token_pool, INDEXER_PACKED, ix.nbytes, C128_TOKENS, b.c128_tokens, 1, per_c128, slots=ix.tokens
                ),
            )
        )
        for geo in (b.index_k, b.index_scale):
            per = C4_LOGICAL_PER_C128 * geo.row_bytes * len(geo.layers)
            # the NPU's own key and scale buffers: not in SGLang's estimate (it charges the packed row)
            make = partial(
                _token_pool, geo.name, geo.nbytes, C128_TOKENS, b.c128_tokens, 1, per, slots=geo.tokens, charged=False
            )
            out.append((geo.nbytes, make))
    for st in (b.c4_state, b.c4_indexer_state):
        if st.layers:
            # swa // P x ring rows: ring rows per SWA page
            per_page = st.ring * st.row_bytes * len(st.layers)
            make = partial(
                _token_pool, st.name, st.nbytes, SWA_TOKENS, b.swa_tokens, page, per_page, kind="state", slots=st.size
            )
            out.append((st.nbytes, make))
    if b.c128_state.layers:
        st = b.c128_state
        out.append(
            (st.nbytes, partial(_request_pool, st.name, st.nbytes, requests, st.ring * st.row_bytes * len(st.layers)))
        )
    mapping = swa_mapping_pool(b.full_tokens, page, OWNER)
    out.append((mapping.bytes, lambda: mapping))
    for pool in request_pools(requests, context_len, serving):
        out.append((pool.bytes, partial(lambda p: p, pool)))
    per_row = b.sidecar_cols * SIDECAR_ITEM_BYTES
    out.append((b.sidecar_bytes, partial(_request_pool, SIDECAR, b.sidecar_bytes, requests, per_row, "request", False)))
    full_allocator = allocator_pool(b.full_tokens, page)
    out.append((full_allocator.bytes, lambda: full_allocator))
    swa_pages = page_align(b.swa_tokens, page)
    if swa_pages:
        swa_allocator = allocator_pool(swa_pages, page, token_space=SWA_TOKENS, name=SWA_ALLOCATOR, owner=OWNER)
        out.append((swa_allocator.bytes, lambda: swa_allocator))
    if b.c128.layers:
        if b.c128_pages:
            c128_allocator = allocator_pool(
                b.c128_allocator_tokens, b.c128_page, token_space=C128_TOKENS, name=C128_ALLOCATOR, owner=OWNER
            )
            out.append((c128_allocator.bytes, lambda: c128_allocator))
        out.append((b.refcount_bytes, partial(_fixed_pool, C128_REFCOUNT, b.refcount_bytes, "allocator")))
    return out


def npu_dsv4_pool_specs(
    model: ModelSpec, serving: Serving, sizes: dict[str, int], requests: int, context_len: int
) -> list[PoolSpec]:
    """Every pool ``build`` allocates for an NPU DeepSeek-V4 plan of these sizes."""
    b = npu_dsv4_buffers(model, serving, sizes, requests, context_len)
    return [make() for nbytes, make in _layout(b, serving, requests, context_len) if nbytes]


def npu_dsv4_pool_bytes(
    model: ModelSpec, serving: Serving, sizes: dict[str, int], requests: int, context_len: int
) -> int:
    b = npu_dsv4_buffers(model, serving, sizes, requests, context_len)
    return sum(nbytes for nbytes, _ in _layout(b, serving, requests, context_len))


# ---------------------------------------------------------------------------
# what SGLang refuses on NPU, and what kvpools does not model there
# ---------------------------------------------------------------------------


def npu_dsv4_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """SGLang 0.5.23's refusals of a DeepSeek-V4 server on an NPU (its words), and kvpools' own, by name."""
    o = option
    problems = []
    sglang = "SGLang's NPU DeepSeek-V4 pool refuses it"
    if serving.enable_hisparse:
        problems.append(
            f"{o('enable_hisparse')} on {PLATFORM}: {sglang} ('{SGLANG_HISPARSE}', DSV4NPUTokenToKVPool."
            f"_make_kv_pool). Drop {o('enable_hisparse')}."
        )
    if serving.enable_online_compress:
        problems.append(
            f"{o('enable_online_compress')} on {PLATFORM}: {sglang} ('{SGLANG_ONLINE}', _make_compress_state_pool). "
            f"Drop {o('enable_online_compress')}."
        )
    if serving.dsv4_compress_state_dtype != "float32":
        problems.append(
            f"{o('dsv4_compress_state_dtype')} {serving.dsv4_compress_state_dtype} on {PLATFORM}: SGLang asserts "
            f"'{SGLANG_STATE_DTYPE}' (NPUCompressStatePool). Use {o('dsv4_compress_state_dtype')} float32."
        )
    cps = c128_page_size(serving)
    if cps <= 0 or cps % 16:
        value = serving.plugin_options.get(C128_PAGE_OPTION)
        problems.append(
            f"{o('plugin_options')} {C128_PAGE_OPTION}={value}: SGLang raises "
            f"'{SGLANG_C128_PAGE.format(value=value)}' (DSV4NPUTokenToKVPool). Use a positive multiple of 16 "
            f"(SGLang's default {DEFAULT_C128_PAGE})."
        )
    if serving.dsv4_attn_backend == "trtllm":
        problems.append(
            f"{o('dsv4_attn_backend')} trtllm on {PLATFORM}: SGLang's NPU pool asserts '{SGLANG_TRTLLM}' (it builds "
            f"PA_ND rows only, _make_kv_pool). Drop {o('dsv4_attn_backend')}."
        )
    low = sorted({int(layer.params.get("compress_ratio", 0)) for layer in model.layers} & {1, 2})
    if low:
        problems.append(
            f"{model.name} has compress ratio(s) {low} (DeepSeek-V4.1's kv_source layers): on {PLATFORM} SGLang's "
            f"DSV4NPUTokenToKVPool._make_indexer_pool takes no force_fp4 argument, so building their fp4 indexer "
            f"pools fails (TypeError: unexpected keyword argument 'force_fp4'). Serve it on another platform."
        )
    not_modelled = []
    if serving.dsv4_kv_layout not in ("auto", "v4"):
        not_modelled.append(
            f"{o('dsv4_kv_layout')} {serving.dsv4_kv_layout} (SGLang's NPU pool builder passes no layout; which "
            f"layout its attention backend then reads is not in the reference)"
        )
    if serving.speculative and serving.speculative_algorithm != "EAGLE":
        not_modelled.append(
            f"{o('speculative_algorithm')} {serving.speculative_algorithm} (the NPU draft worker's DeepSeek-V4 "
            f"pool; EAGLE is modelled)"
        )
    elif serving.speculative:
        problems += ring_problems(model, serving)
    if serving.enable_hierarchical_cache:
        not_modelled.append(
            f"{o('enable_hierarchical_cache')} (the NPU host pools: PA_ND pages, the C128 sidecar's host pool)"
        )
    if serving.enable_encoder_swa_bounded_replay:
        not_modelled.append(f"{o('enable_encoder_swa_bounded_replay')} (the request window in NPU PA_ND rows)")
    if serving.dcp_size > 1:
        not_modelled.append(f"{o('dcp_size')} {serving.dcp_size} (the NPU pools under decode context parallelism)")
    problems += [
        f"kvpools does not model {what} for DeepSeek-V4 on {PLATFORM} yet. Drop it, or plan for another platform."
        for what in not_modelled
    ]
    return problems


def ring_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """``_assert_ring_serves_draft_tokens`` (``pool_configurator.py`` lines 1291-1307): a verify batch writes its
    draft tokens into the c4 / c128 state rings, which keep at most ``ring - window + 2`` of them."""
    drafts = serving.max_speculative_num_draft_tokens or 0
    start, end = rank_layer_range(model, serving)
    ratios = {int(layer.params.get("compress_ratio", 0)) for layer in model.layers[start:end]}
    problems = []
    for ratio in (4, 128):
        ring = ring_size(ratio, serving)
        most = write_pad(ratio, ring)
        if ratio in ratios and drafts > most:
            problems.append(
                f"{option('speculative_num_draft_tokens')} {drafts}: SGLang asserts 'speculative_num_draft_tokens="
                f"{drafts} exceeds what the c{ratio} compress state ring can keep resident (ring_size={ring} serves "
                f"at most {most} draft tokens).' (DSV4PoolConfigurator). Use at most {most}."
            )
    return problems


# ---------------------------------------------------------------------------
# the cell
# ---------------------------------------------------------------------------


def npu_dsv4_cell(cell: CellSize, model: ModelSpec, serving: Serving) -> CellSize:
    """The ``dsv4`` plugin's cell with the rows SGLang's NPU pool stores (SGLang's bytes per full token kept).

    KV rows become PA_ND rows (1024 B bf16 per layer; 640 B fp8 on arch35, where CUDA stores 584); the c4
    indexer row is the kept packed row plus the NPU's int8 key and fp16 scale (132 + 128 + 2 B; 132 + 128 + 4
    on arch35); the compressor states are unchanged (float32)."""
    nope = int(model.layers[0].params["qk_nope_head_dim"])
    rope = int(model.layers[0].params["qk_rope_head_dim"])
    index_dim = int(model.params.get("index_head_dim", 0))
    kv_dim, item = kv_row(serving, nope, rope)
    row = kv_dim * item
    cuda_row = nope + 2 * rope + 8
    packed_index = index_dim + index_dim // 128 * INDEX_ROW_EXTRA
    npu_index = packed_index + index_dim + (4 if arch35(serving) else 2)
    parts = []
    for part in cell.parts:
        if part.pool in ("kv_swa", "kv_c4", "kv_c128"):
            parts.append(attrs.evolve(part, bytes_per_token=part.bytes_per_token // cuda_row * row))
        elif part.pool == "c4_indexer":
            parts.append(attrs.evolve(part, bytes_per_token=part.bytes_per_token // packed_index * npu_index))
        else:
            parts.append(part)
    dtype = f"fp8 (A5 packed, {kv_dim} B)" if arch35(serving) else f"bf16 ({nope} + {rope} values)"
    note = (
        f"Ascend NPU (DSV4NPUTokenToKVPool): SWA / c4 / c128 rows are PA_ND {dtype}, {row} B per token per layer "
        f"where CUDA packs {cuda_row}; the c4 indexer keeps the packed {packed_index} B row and adds "
        f"{npu_index - packed_index} B ({'fp8 key, fp32 scale' if arch35(serving) else 'int8 key, fp16 scale'}); "
        f"SGLang's configurator still charges {cuda_row} B and {packed_index} B (its bytes per full token below)"
    )
    notes = [n for n in cell.notes if not n.startswith(option("kv_cache_dtype"))]
    return attrs.evolve(cell, parts=tuple(parts), notes=(*notes, note))


# ---------------------------------------------------------------------------
# hooks
# ---------------------------------------------------------------------------


@hookimpl(specname="validate")
def validate_dsv4(model: ModelSpec, serving: Serving) -> list[str] | None:
    if not on_npu_dsv4(model, serving) or serving.accounting not in SGLANG_ACCOUNTINGS:
        return None
    return npu_dsv4_problems(model, serving)


@hookimpl(specname="plugin_options")
def dsv4_plugin_options() -> dict[str, str]:
    return {
        C128_PAGE_OPTION: f"SGLang's --c128-page-size: the physical page of the NPU DeepSeek-V4 c128 KV pool and its "
        f"allocator (a positive multiple of 16; default {DEFAULT_C128_PAGE})."
    }


@hookimpl(specname="estimate_cell_size", wrapper=True)
def estimate_dsv4_cell(model: ModelSpec, serving: Serving) -> Generator[None, CellSize | None, CellSize | None]:
    cell = yield
    if cell is None or not on_npu_dsv4(model, serving) or serving.accounting not in SGLANG_ACCOUNTINGS:
        return cell
    return npu_dsv4_cell(cell, model, serving)


@hookimpl(specname="size_pools", tryfirst=True)
def size_dsv4_npu_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing | None:
    """SGLang's NPU configurator counts (``--accounting sglang``) or the exact solve over the NPU buffers."""
    if not on_npu_dsv4(model, serving) or serving.accounting not in SGLANG_ACCOUNTINGS:
        return None
    return size_npu_dsv4(model, serving, cell, budget)


def npu_pool_note(serving: Serving) -> str:
    cps = c128_page_size(serving)
    return (
        f"{PLATFORM}: SGLang's NPU DeepSeek-V4 pools (DSV4NPUTokenToKVPool, DSV4NPUTokenToKVPoolAllocator, "
        f"DSV4NPUReqToTokenPool): PA_ND KV buffers of (size + kp + 1) // kp pages of the kernel page kp "
        f"({serving.page_size} SWA, {serving.page_size // 4} c4, {cps} c128 = {option('plugin_options')} "
        f"{C128_PAGE_OPTION}), the c4 indexer's int8 keys and fp16 scales beside its packed row, states rounded to "
        f"lcm(ratio, ring) rows, a c128 page allocator and refcount, the request table's C128 sidecar."
    )


# ---------------------------------------------------------------------------
# SGLang's configurator on an NPU, and the exact solve
# ---------------------------------------------------------------------------


@attrs.frozen
class NPUConfigurator:
    """``DSV4PoolConfigurator`` (``model_executor/pool_configurator.py`` of SGLang 0.5.23) as it runs on an NPU for
    what this plugin plans: the ratio-sized SWA pool (no encoder replay, no unified ring), float32 states, no
    HiSparse, no online c128, no draft worker, no low ratios (each refused, :func:`npu_dsv4_problems`).  Its
    numbers are the ``dsv4`` plugin's ``--accounting sglang`` figures at the NPU's page; they are reproduced here,
    in 0.5.23's float operations and order, since plugins share no code."""

    kv_bytes: int
    """``qk_nope + 2 x qk_rope + 8`` (line 1108), unpadded on NPU (``_get_paged_kv_bytes_per_token``, 1353-1357)."""
    indexer_bytes: int
    """``get_dsv4_indexer_bytes_per_token(index_head_dim, False)``: keys + one fp32 scale per 128."""
    head_dim: int
    index_head_dim: int
    num_layers: int
    num_c4: int
    num_c128: int
    swa_ratio: float
    page: int
    window: int
    ring4: int
    ring128: int
    context_len: int
    requested: int | None
    decode_extra: int | None
    speculative: bool = False

    @property
    def bytes_per_swa_token(self) -> float:
        """``_get_bytes_per_swa_token`` (lines 1372-1388): every layer's row, and the c4 states per SWA slot."""
        state = 2 * 2 * self.head_dim * STATE_BYTES
        index_state = 2 * 2 * self.index_head_dim * STATE_BYTES
        ring = self.ring4 if self.num_c4 else 0
        return self.kv_bytes * self.num_layers + (ring / self.page * (state + index_state) * self.num_c4)

    @property
    def bytes_per_full_token(self) -> float:
        """``_get_bytes_per_full_token`` (lines 1437-1446) over ``_compressed_bytes_per_full_token`` (1390-1404)."""
        per_ratio = []
        if self.num_c4:
            per_ratio.append((1 / 4 * self.kv_bytes + 1 / 4 * self.indexer_bytes) * self.num_c4)
        if self.num_c128:
            per_ratio.append(1 / 128 * self.kv_bytes * self.num_c128)
        value = self.swa_ratio * self.bytes_per_swa_token + sum(per_ratio)
        if self.speculative:  # the draft worker: x (T + 1) / T, one draft layer (lines 1265-1272)
            value *= (self.num_layers + 1) / self.num_layers
        return value

    def slots(self, requests: int) -> int:
        """``_get_num_req_slots`` (lines 1504-1507)."""
        return requests + (self.decode_extra or 0) + 1

    def c128_state_fixed_bytes(self, requests: int) -> int:
        """``_get_c128_state_fixed_bytes`` (lines 1509-1528), offline c128."""
        if not self.num_c128:
            return 0
        rows = -(-(self.slots(requests) * self.ring128 + self.ring128 + 1) // 128) * 128
        return rows * 2 * self.head_dim * STATE_BYTES * self.num_c128

    def estimated_requests(self, budget_bytes: int) -> int:
        """``_resolve_max_running_requests_per_worker`` (lines 1565-1574)."""
        if self.requested is not None:
            return self.requested
        tokens = int(budget_bytes / self.bytes_per_full_token)
        estimated = max(min(int(tokens / self.context_len * 512), 4096), 2048)
        return min(estimated, tokens // 2)

    def sizes(self, full_token: int) -> dict[str, int]:
        """``_compute_dsv4_sizes`` (lines 1463-1502): the c4 state follows the SWA pages, ``swa // page x ring``."""
        full = full_token // self.page * self.page
        swa = int(full * self.swa_ratio) // self.page * self.page
        return {
            "full_max_total_num_tokens": full,
            "swa_max_total_num_tokens": swa,
            "c4_max_total_num_tokens": full // 4,
            "c128_max_total_num_tokens": full // 128,
            "c4_state_pool_size": swa // self.page * (self.ring4 if self.num_c4 else 0),
            "c128_state_pool_size": 0,
        }

    def finalize(self, sizes: dict[str, int], requests: int) -> dict[str, int]:
        """``finalize_with_max_running_requests`` (lines 1622-1636): the c128 state, a ring per request slot."""
        return {**sizes, "c128_state_pool_size": self.slots(requests) * (self.ring128 if self.num_c128 else 0)}


def npu_configurator(model: ModelSpec, serving: Serving) -> NPUConfigurator:
    start, end = rank_layer_range(model, serving)
    ratios = [int(layer.params.get("compress_ratio", 0)) for layer in model.layers[start:end]]
    first = model.layers[0].params
    nope, rope = int(first["qk_nope_head_dim"]), int(first["qk_rope_head_dim"])
    index_dim = int(model.params.get("index_head_dim", 0))
    requested = serving.max_running_requests
    return NPUConfigurator(
        kv_bytes=nope + rope * 2 + 8,
        indexer_bytes=index_dim + index_dim // 128 * INDEX_ROW_EXTRA,
        head_dim=nope + rope,
        index_head_dim=index_dim,
        num_layers=len(ratios),
        num_c4=ratios.count(4),
        num_c128=ratios.count(128),
        swa_ratio=serving.swa_full_tokens_ratio,
        page=serving.page_size,
        window=int(first["window_size"]),
        ring4=ring_size(4, serving),
        ring128=ring_size(128, serving),
        context_len=serving.context_length or model.context_len,
        requested=None if requested is None else max(1, requested // serving.attn_dp_size),
        decode_extra=serving.decode_extra_slots if serving.disaggregation_mode == "decode" else None,
        speculative=serving.speculative,
    )


def size_npu_dsv4(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing:
    """The ``size_pools`` answer for DeepSeek-V4 on an NPU (both accountings)."""
    cfg = npu_configurator(model, serving)
    page = serving.page_size
    context_len = cfg.context_len
    notes: list[str] = []
    fixed: int | None = None
    if serving.accounting == "sglang":
        requests = cfg.estimated_requests(budget.budget_bytes)
        fixed = cfg.c128_state_fixed_bytes(requests)
        full = int(max(budget.budget_bytes - fixed, 0) / cfg.bytes_per_full_token) // page * page
        notes.append(
            f"SGLang's DSV4PoolConfigurator on {PLATFORM}: c128 state fixed bytes {fixed:,} ({fmt_gib(fixed)}) for "
            f"{requests} request(s); full tokens = int((budget {budget.budget_bytes:,} - {fixed:,}) / "
            f"{cfg.bytes_per_full_token:,.4f}), page aligned = {full:,} (calculate_pool_sizes)."
        )
    else:
        full = _exact_full_tokens(model, serving, cfg, budget.budget_bytes)
    sizes = cfg.sizes(full)
    capped, cap_note = apply_token_cap(sizes["full_max_total_num_tokens"], serving.max_total_tokens)
    if cap_note:
        notes.append(cap_note)
    if capped != sizes["full_max_total_num_tokens"]:
        sizes = cfg.sizes(capped)  # calculate_pool_sizes_from_max_tokens re-derives every sub-pool
    full = sizes["full_max_total_num_tokens"]
    if full <= 0:
        reserved = None if fixed is None else (fixed, "c128 state reserved for the request count first")
        raise not_enough_memory(model, serving, cell, budget, fixed=reserved)
    limit = resolve_max_num_reqs(full, context_len, serving)
    if limit.note:
        notes.append(limit.note)
    requests = limit.max_running_requests
    if requests <= 0:
        raise InsufficientMemoryError(
            f"{full} KV tokens leave room for no request (a request needs at least 2 tokens). Raise {option('memory')}."
        )
    if sizes["swa_max_total_num_tokens"] < page:
        raise InsufficientMemoryError(
            f"The SWA pool of {model.name} would get {sizes['swa_max_total_num_tokens']} tokens, less than one page "
            f"of {page}: int({full} full tokens x {option('swa_full_tokens_ratio')} {cfg.swa_ratio}) rounds to "
            f"nothing. Raise {option('memory')} or {option('swa_full_tokens_ratio')}."
        )
    sizes = cfg.finalize(sizes, requests)
    notes += [bytes_per_full_token_note(cfg), *sub_pool_notes(cfg, sizes, requests), npu_pool_note(serving)]
    if serving.kv_cache_dtype not in ("auto", "bfloat16", "bf16"):
        notes.append(
            f"{option('kv_cache_dtype')} {serving.kv_cache_dtype} is not what SGLang stores on {PLATFORM}: its "
            f"DeepSeek-V4 override sets bfloat16 on an NPU whatever the flag (_deepseek_v4_kv_cache_dtype), and the "
            f"plan's pools are bf16 PA_ND rows."
        )
    return PoolSizing(
        max_total_num_tokens=full,
        max_running_requests=requests,
        pools=npu_dsv4_pool_specs(model, serving, sizes, requests, context_len),
        sglang_config={"max_total_num_tokens": full, "max_running_requests": requests, **sizes},
        sglang_estimate_bytes=int(full * cfg.bytes_per_full_token) + cfg.c128_state_fixed_bytes(requests),
        notes=notes,
        token_counts={
            FULL: full,
            SWA_TOKENS: sizes["swa_max_total_num_tokens"],
            C4_TOKENS: sizes["c4_max_total_num_tokens"],
            C128_TOKENS: sizes["c128_max_total_num_tokens"],
        },
        windows=(sliding_window_terms(SWA_TOKENS, cfg.window, serving),),
        compression={C4_TOKENS: 4, C128_TOKENS: 128},
        # c4 slots are full // 4 (DSV4NPUTokenToKVPoolAllocator._derive_c4_loc_from_full); c128 slots come from
        # the c128 page allocator: seq // 128 - prefix // 128 per extend, in pages of c128_page_size
        compression_pages={C128_TOKENS: c128_page_size(serving)} if cfg.num_c128 else {},
    )


def _exact_full_tokens(model: ModelSpec, serving: Serving, cfg: NPUConfigurator, budget_bytes: int) -> int:
    """The most page-aligned full tokens whose every NPU pool (:func:`npu_dsv4_pool_bytes`) fits the budget, the
    sub-pools and requests derived as SGLang derives them; the bracket starts at the configurator's estimate."""
    page = cfg.page
    context_len = cfg.context_len

    def cost(tokens: int) -> int:
        sizes = cfg.sizes(tokens)
        requests = max(
            resolve_max_num_reqs(sizes["full_max_total_num_tokens"], context_len, serving).max_running_requests, 0
        )
        return npu_dsv4_pool_bytes(model, serving, cfg.finalize(sizes, requests), requests, context_len)

    estimate = int(budget_bytes / cfg.bytes_per_full_token) if cfg.bytes_per_full_token > 0 else 0
    upper = max(page, page_align(estimate, page) + page)
    while cost(upper) <= budget_bytes:
        upper *= 2
    return largest_fitting_tokens(budget_bytes, page, upper, cost)


def bytes_per_full_token_note(cfg: NPUConfigurator) -> str:
    r = cfg.swa_ratio
    state = 2 * 2 * cfg.head_dim * STATE_BYTES + 2 * 2 * cfg.index_head_dim * STATE_BYTES
    terms = [f"{r} x ({cfg.kv_bytes} B x {cfg.num_layers} layer(s)"]
    if cfg.num_c4:
        terms[0] += f" + {cfg.ring4}/{cfg.page} x {state} B x {cfg.num_c4} (c4 states per SWA page)"
        terms.append(f"(1/4 x {cfg.kv_bytes} B + 1/4 x {cfg.indexer_bytes} B) x {cfg.num_c4} (c4 KV and indexer)")
    terms[0] += ")"
    if cfg.num_c128:
        terms.append(f"1/128 x {cfg.kv_bytes} B x {cfg.num_c128} (c128)")
    total = " + ".join(terms)
    if cfg.speculative:
        total = f"({total}) x ({cfg.num_layers} + 1 draft layer) / {cfg.num_layers}"
    return (
        f"SGLang's bytes per full token on {PLATFORM} = {total} = {cfg.bytes_per_full_token:,.4f} B "
        f"({cfg.kv_bytes} B unpadded: _get_paged_kv_bytes_per_token skips the page pad on NPU); the c128 state is "
        f"per request slot, fixed bytes outside this figure."
    )


def sub_pool_notes(cfg: NPUConfigurator, sizes: dict[str, int], requests: int) -> list[str]:
    full, swa = sizes["full_max_total_num_tokens"], sizes["swa_max_total_num_tokens"]
    notes = [
        f"SWA pool: int({full:,} full tokens x {option('swa_full_tokens_ratio')} {cfg.swa_ratio}) page aligned = "
        f"{swa:,} tokens, for all {cfg.num_layers} layer(s) of this stage."
    ]
    if cfg.num_c4:
        notes.append(
            f"c4 pool (KV, {cfg.num_c4} layer(s)): full // 4 = {sizes['c4_max_total_num_tokens']:,} rows; its indexer "
            f"c128 x 32 = {sizes['c128_max_total_num_tokens'] * 32:,} rows; c4 states: SWA {swa:,} // page {cfg.page} "
            f"x ring {cfg.ring4} = {sizes['c4_state_pool_size']:,} rows."
        )
    if cfg.num_c128:
        notes.append(
            f"c128 pool ({cfg.num_c128} layer(s)): full // 128 = {sizes['c128_max_total_num_tokens']:,} rows; c128 "
            f"state: {cfg.slots(requests):,} request slot(s) x ring {cfg.ring128} = "
            f"{sizes['c128_state_pool_size']:,} rows."
        )
    return notes
