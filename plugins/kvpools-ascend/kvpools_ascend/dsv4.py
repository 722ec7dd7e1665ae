"""DeepSeek-V4 on Ascend NPUs: SGLang 0.5.23's ``DSV4NPUTokenToKVPool``, its allocator and request table (no torch).

On an NPU SGLang builds DeepSeek-V4's KV cache with its own classes
(``srt/hardware_backend/npu/dsv4/``; ``_build_dsv4_kv_pool`` picks ``DSV4NPUTokenToKVPool``,
``_build_token_to_kv_pool_allocator`` ``DSV4NPUTokenToKVPoolAllocator``, the request-pool builders
``DSV4NPUReqToTokenPool`` / ``DSV4NPUDecodeReqToTokenPool``: ref-000 lines 1112-1118, 1194-1200, 1365-1375,
2066-2071), sized by the same ``DSV4PoolConfigurator`` as on CUDA, with page 128 and the KV cache in bf16
(``_deepseek_v4_kv_cache_dtype``, ``arg_groups/overrides.py``: ``if view.device == "npu": kv_cache_dtype =
"bfloat16"``, whatever ``--kv-cache-dtype`` says).  kvpools-ascend declares that layout in its traits
(``pool_layouts["dsv4"] = "npu_pa_nd"``, ``platform_planned_layouts``: the ``dsv4`` plugin then neither refuses
the name nor sizes it) and answers ``validate``, ``estimate_cell_size`` (a wrapper; :mod:`.dsv4_checks`),
``size_pools`` (:mod:`.dsv4_sizing`), ``build_req_to_token_pool``, ``build_pool`` and ``build_allocator``
(:mod:`.dsv4_build`, :mod:`.dsv4_pool`) for DeepSeek-V4 plans on ``ascend`` under SGLang's accountings.  This
module holds the buffers and the plan's pools.

**The configurator on NPU** (``pool_configurator.py`` of 0.5.23, ``DSV4PoolConfigurator``): ``kv_bytes`` is the
FlashMLA row, ``qk_nope + 2 x qk_rope + 8`` = 584 B (line 1108), and ``_get_paged_kv_bytes_per_token`` returns it
unpadded on NPU (lines 1353-1357: ``if self._unified or _is_npu or ...: return self.kv_bytes``), as does
``_get_low_ratio_kv_padding_bytes`` (0, line 1408); the indexer 132 B, the states float32; page 128
(``model_overrides/deepseek_v4.py``: ``if cfg.device == "npu": page_size = 128``).
:class:`~kvpools_ascend.dsv4_sizing.NPUConfigurator` reproduces it (``--accounting sglang``); ``--accounting
exact`` keeps its derivation of the sub-pools and finds the most full tokens whose every NPU buffer fits.

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

from collections.abc import Callable
from functools import partial
from math import ceil, gcd

import attrs

from kvpools_ascend.names import PLATFORM
from kvpools_core.allocators import allocator_planned_nbytes
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.sizing import (
    allocator_pool,
    page_align,
    req_to_token_row_len,
    req_to_token_rows,
    request_pools,
    swa_mapping_pool,
    with_cost,
)
from kvpools_core.values import (
    FIXED,
    REQUEST,
    TOKEN,
    GroupCost,
    ModelSpec,
    PoolSpec,
    Serving,
)

__all__ = [
    "C128_PAGE_OPTION",
    "NPUDSV4Buffers",
    "npu_dsv4_buffers",
    "npu_dsv4_pool_bytes",
    "npu_dsv4_pool_specs",
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
