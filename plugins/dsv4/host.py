"""DeepSeek-V4's host (HiCache) pools, as SGLang 0.5.23's ``build_deepseek_v4_hicache_stack`` sizes them.

``srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py`` (``_deepseek_v4_num_host_pages`` L647-676,
``build_deepseek_v4_hicache_stack`` L946-1248) and ``srt/mem_cache/memory_pool_host.py``
(``LogicalHostPool`` L87, ``DeepSeekV4PagedHostPool`` L236, ``DeepSeekV4StateHostPool`` L770), for the CUDA
separate-KV layout :mod:`.buffers` describes.  Host pages are counted from the *device pages*, with
``--hicache-ratio`` only (``--hicache-size`` raises) and no padding page::

    full_host_pages = int(ceil(full tokens / P) x ratio)
    swa_host_pages  = int(ceil(SWA tokens / P) x ratio)

* ``kv`` — the ``LogicalHostPool`` anchor: ``full_host_pages x P`` full-token slots, no bytes; the c4, indexer
  and c128 mirrors take their page indices from it (``indices_from_pool=KV``);
* ``kv_swa`` — a ``DeepSeekV4PagedHostPool`` of ``swa_host_pages`` pages x (stage layers + packed MTP draft
  layers) x the SWA page's padded bytes (``bytes_per_page_padded``);
* ``kv_c4`` / ``indexer_c4`` / ``kv_c128`` — paged mirrors of ``full_host_pages`` pages (one full page of
  ``P`` tokens is ``P / 4`` c4 rows, ``P / 128`` c128 rows) x their layers x the padded page bytes (the fused
  fp8 indexer page is ``P / 4 x 132`` B, unpadded);
* ``c4_state`` / ``c4_indexer_state`` — ``DeepSeekV4StateHostPool`` of ``swa_host_pages`` pages x the c4
  layers x ``ring x`` the state row (``state_page_bytes``); the c128 state has no mirror ("intentionally not
  registered with hicache").

* ``kv_c1`` / ``indexer_c1`` / ``kv_c2`` / ``indexer_c2`` — DeepSeek-V4.1's ratio-1/2 kv_source pools
  (``_dsv4_low_ratio_entries``, L865-891, after the c128 mirror): per low ratio ``r`` with sources, a KV mirror of
  ``full_host_pages`` pages x the source layers x the pool's padded page (``P / r`` rows), and the fused fp4
  indexer keys of one full page (``P / r`` slots of ``d / 2 + d / 32`` B, ``_dsv4_low_ratio_regions`` L805-862)
  x the source layers; the ratio-2 pair state has no mirror ("rebuilt at page boundaries").

Every paged mirror takes its device pool's ``bytes_per_page_padded`` (``DeepSeekV4PagedHostPool`` ``item_bytes``),
so the layout of :mod:`.layouts` carries over unchanged: V4's 584 B rows in pages padded to 576 B, V4.1's 528 B
rows padded to 512 B (interleaved 528 B), V4.1-fp4's 288 B rows padded to 256 B (interleaved 288 B), and under
``--dsv4-attn-backend trtllm`` the uniform fp8 pool's ``page_size x 512`` B pages, unpadded (:mod:`.trtllm`).
A padded page pins bytes no transfer ever writes or reads (:attr:`HostPool.unused_bytes`): at ``P = 256`` a V4
c128 page holds 2 rows (1,168 B) in 1,728 B, a V4.1 one 2 rows (1,056 B) in 1,536 B.  The draft worker's SWA
layers are packed into ``kv_swa`` (an MTP draft, or a DSpark draft loaded as ``DeepseekV4ForCausalLMDSpark``:
:func:`.dspark.dspark_packs_into_host`) or mirrored by a sidecar of the same host pages (``build_swa_draft_pools``:
``num_host_pages`` = the target's).
"""

from __future__ import annotations

from kvpools_core.options import option
from kvpools_core.parts.names import packs_draft_into_host
from kvpools_core.values import FULL_TOKENS, TOKEN, HostPool, Plan, Serving

from .buffers import (
    C4_KV_POOL,
    C128_KV_POOL,
    DRAFT_SWA_KV_POOL,
    INDEXER_POOL,
    SWA_KV_POOL,
    SWA_TOKENS,
    DSV4Buffers,
    DSV4Sizes,
    KVRowGeometry,
    LowIndexGeometry,
    StateGeometry,
    dsv4_buffers,
)
from .dspark import dspark_packs_into_host

ANCHOR_POOL = "kv"
"""The ``LogicalHostPool`` anchor's name (SGLang's ``PoolName.KV``); it mirrors the full-token allocator."""
FULL_ALLOCATOR = "allocator"
SGLANG_HICACHE_NO_RADIX_MESSAGE = (
    "The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive and cannot be used at "
    "the same time. Please use only one of them."
)
SGLANG_HICACHE_DCP_MLA_MESSAGE = (
    "HiCache with --dcp-size > 1 is only supported for MLA models: the index translation lives in "
    "MLATokenToKVPoolHost, and the MHA host pool has none."
)
SGLANG_HICACHE_DCP_SPEC_MESSAGE = (
    "HiCache with --dcp-size > 1 only supports DSPARK speculative decoding; other draft-model host pools have no "
    "DCP index translation."
)
SGLANG_HICACHE_SIZE_MESSAGE = (
    "DeepSeek V4 HiCache currently does not support --hicache-size; use --hicache-ratio instead."
)


def host_problems(serving: Serving) -> list[str]:
    """What SGLang refuses for DSV4's host tier (``--hicache-size``; HiSparse, whose radix-cache-off rule HiCache
    refuses; DCP, refused for every non-MLA model, and DeepSeek-V4 is ``AttentionArch.MHA`` to SGLang)."""
    if not serving.enable_hierarchical_cache:
        return []
    o = option
    problems = []
    if serving.hicache_size > 0:
        problems.append(
            f"{o('hicache_size')} {serving.hicache_size}: SGLang raises '{SGLANG_HICACHE_SIZE_MESSAGE}' "
            f"(_deepseek_v4_num_host_pages). Size the host tier by {o('hicache_ratio')}."
        )
    if serving.enable_hisparse or serving.disable_radix_cache:
        # HiSparse asserts --disable-radix-cache (validate_hisparse; the core refuses HiSparse without it)
        why = f" ({o('enable_hisparse')} needs {o('disable_radix_cache')})" if serving.enable_hisparse else ""
        problems.append(
            f"SGLang refuses {o('enable_hierarchical_cache')} with {o('disable_radix_cache')}{why}: "
            f"'{SGLANG_HICACHE_NO_RADIX_MESSAGE}' (handle_cache_compatibility in SGLang 0.5.23's "
            f"arg_groups/kv_cache_hook.py, L393-397). Drop {o('enable_hierarchical_cache')}"
            + (f" or {o('enable_hisparse')}." if serving.enable_hisparse else f" or {o('disable_radix_cache')}.")
        )
    if serving.dcp_size > 1:
        # resolve_hicache_dcp_compatibility (arg_groups/hicache_hook.py L129-165): a draft other than DSPARK fails
        # first; DeepSeek-V4's ModelConfig is AttentionArch.MHA (configs/model_config.py L1418-1431), so the
        # MLA-only check fails for every DeepSeek-V4 server
        spec = serving.speculative_algorithm
        message, line = (
            (SGLANG_HICACHE_DCP_SPEC_MESSAGE, "L141-146")
            if spec is not None and spec != "DSPARK"
            else (SGLANG_HICACHE_DCP_MLA_MESSAGE, "L157-162")
        )
        problems.append(
            f"SGLang refuses {o('enable_hierarchical_cache')} with {o('dcp_size')} {serving.dcp_size} on DeepSeek-V4 "
            f"(whose ModelConfig is AttentionArch.MHA): '{message}' (resolve_hicache_dcp_compatibility in SGLang "
            f"0.5.23's arg_groups/hicache_hook.py, {line}). Use {o('dcp_size')} 1 or drop "
            f"{o('enable_hierarchical_cache')}."
        )
    return problems


def host_pages(device_tokens: int, page: int, ratio: float) -> int:
    """``int(ceil(device tokens / page) x ratio)`` (``_deepseek_v4_num_host_pages``): no padding page."""
    return int(-(-device_tokens // page) * ratio)


def dsv4_host_pools(plan: Plan) -> list[HostPool]:
    """Every host pool of one rank of a DeepSeek-V4 plan (``build_deepseek_v4_hicache_stack``), in SGLang's order."""
    serving, sizing = plan.serving, plan.sizing
    sizes = DSV4Sizes.from_config(sizing.sglang_config)
    b = dsv4_buffers(plan.model, serving, sizes, max_running_requests=sizing.max_running_requests)
    page, ratio = serving.page_size, serving.hicache_ratio_or_default
    full_pages = host_pages(sizes.full_tokens, page, ratio)
    swa_pages = host_pages(sizes.swa_tokens, page, ratio)
    by_full = f"int(ceil({sizes.full_tokens:,} full tokens / {page}) x {option('hicache_ratio')} {ratio:g})"
    by_swa = f"int(ceil({sizes.swa_tokens:,} SWA tokens / {page}) x {option('hicache_ratio')} {ratio:g})"
    pools = [
        HostPool(
            name=ANCHOR_POOL,
            device_pool=FULL_ALLOCATOR,
            unit=TOKEN,
            token_space=FULL_TOKENS,
            device_slots=sizes.full_tokens,
            page_size=page,
            slots=full_pages * page,
            rows=full_pages * page,
            bytes_per_slot=0,
            bytes=0,
            layout=serving.hicache_mem_layout,
            sized_by=f"LogicalHostPool anchor: {by_full} = {full_pages:,} pages, no tensor",
        )
    ]
    if b.draft_swa is None:
        pools.append(_paged(plan, SWA_KV_POOL, (b.swa,), swa_pages, SWA_TOKENS, by_swa))
    elif packs_draft_into_host(plan.model, serving) or dspark_packs_into_host(plan.model, serving):
        pools.append(_paged(plan, SWA_KV_POOL, (b.swa, b.draft_swa), swa_pages, SWA_TOKENS, by_swa))
    else:
        sidecar = f"build_swa_draft_pools: the target's {swa_pages:,} SWA host pages"
        pools.append(_paged(plan, SWA_KV_POOL, (b.swa,), swa_pages, SWA_TOKENS, by_swa))
        pools.append(_paged(plan, DRAFT_SWA_KV_POOL, (b.draft_swa,), swa_pages, SWA_TOKENS, sidecar))
    if b.c4.layers:
        pools.append(_paged(plan, C4_KV_POOL, (b.c4,), full_pages, FULL_TOKENS, by_full))
        pools.append(_indexer_pool(b, plan, full_pages, by_full))
        pools += [_state(plan, geo, swa_pages, by_swa) for geo in (b.c4_state, b.c4_indexer_state)]
    if b.c128.layers:
        pools.append(_paged(plan, C128_KV_POOL, (b.c128,), full_pages, FULL_TOKENS, by_full))
    for kv, index in zip(b.low_ratio.kv, b.low_ratio.index, strict=True):
        # _dsv4_low_ratio_entries: per low ratio with kv_source layers, its KV then its fused fp4 indexer keys
        pools.append(_paged(plan, kv.name, (kv,), full_pages, FULL_TOKENS, by_full))
        pools.append(_low_index_pool(plan, index, full_pages, by_full))
    return pools


def _device_slots(plan: Plan, name: str) -> int:
    return next(pool.slots for pool in plan.pools if pool.name == name)


def _paged(plan: Plan, name: str, geometries: tuple[KVRowGeometry, ...], pages: int, space: str, how: str) -> HostPool:
    """A ``DeepSeekV4PagedHostPool``: ``pages`` x the layers (draft layers packed after the target's) x
    ``bytes_per_page_padded``; the padding of each page is pinned and never read (``unused_bytes``)."""
    geo = geometries[0]
    layers = sum(len(g.layers) for g in geometries)
    return _host_pool(
        plan,
        name,
        space,
        pages,
        layers * geo.page_bytes,
        f"{how} = {pages:,} pages x {layers} layer(s) x {geo.page_bytes:,} B",
        packed=tuple(g.name for g in geometries[1:]),
        unused_per_page=layers * (geo.page_bytes - geo.page_size * geo.row_bytes),
    )


def _state(plan: Plan, geo: StateGeometry, pages: int, how: str) -> HostPool:
    """A ``DeepSeekV4StateHostPool``: ``pages`` x the c4 layers x ``state_page_bytes = ring x`` one state row."""
    layers = len(geo.layers)
    return _host_pool(
        plan,
        geo.name,
        SWA_TOKENS,
        pages,
        layers * geo.ring * geo.row_bytes,
        f"{how} = {pages:,} pages x {layers} layer(s) x ring {geo.ring} x {geo.row_bytes:,} B",
    )


def _indexer_pool(b: DSV4Buffers, plan: Plan, pages: int, how: str) -> HostPool:
    """The fused fp8 indexer mirror (``_dsv4_indexer_regions``): ``P / 4 x 132`` B per page and layer, unpadded."""
    ix, layers = b.indexer, len(b.indexer.layers)
    return _host_pool(
        plan,
        INDEXER_POOL,
        FULL_TOKENS,
        pages,
        layers * ix.page_bytes,
        f"{how} = {pages:,} pages x {layers} layer(s) x {ix.page_bytes:,} B",
    )


def _low_index_pool(plan: Plan, ix: LowIndexGeometry, pages: int, how: str) -> HostPool:
    """A low ratio's fp4 indexer mirror (``_dsv4_low_ratio_regions``): the index pages of one full page
    (``P / r`` slots, in pages of 64) as one host item, ``P / r x (d / 2 + d / 32)`` B per page and source layer."""
    page_bytes = plan.serving.page_size // ix.ratio * ix.row_bytes
    layers = len(ix.layers)
    return _host_pool(
        plan,
        ix.name,
        FULL_TOKENS,
        pages,
        layers * page_bytes,
        f"{how} = {pages:,} pages x {layers} source layer(s) x {page_bytes:,} B",
    )


def _host_pool(
    plan: Plan,
    name: str,
    space: str,
    pages: int,
    page_bytes: int,
    sized_by: str,
    *,
    packed: tuple[str, ...] = (),
    unused_per_page: int = 0,
) -> HostPool:
    """One paged DSV4 host pool mirroring the device pool ``name``: ``pages`` whole pages of ``page_bytes``."""
    page = plan.serving.page_size
    return HostPool(
        name=name,
        device_pool=name,
        unit=TOKEN,
        token_space=space,
        device_slots=_device_slots(plan, name),
        page_size=page,
        slots=pages * page,
        rows=pages * page,
        bytes_per_slot=0,
        bytes=pages * page_bytes,
        layout=plan.serving.hicache_mem_layout,
        sized_by=sized_by,
        packed=packed,
        page_bytes=page_bytes,
        unused_bytes=pages * unused_per_page,
    )


__all__ = ["dsv4_host_pools", "host_pages", "host_problems"]
