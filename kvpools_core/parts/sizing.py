"""SGLang's sizing semantics, as reusable functions, plus kvpools' exact solve.

The functions follow ``pool_configurator.py`` (``DefaultPoolConfigurator``)
and ``kv_cache_configurator.py`` (``_profile_available_bytes``,
``_apply_token_constraints``, ``resolve_max_num_reqs``, the request-table row
width) of SGLang, re-expressed; architecture plugins that size their own pools
reuse them.  ``--accounting sglang`` reproduces SGLang's numbers;
``--accounting exact`` (the default) also charges what SGLang leaves outside its
estimate — every pool's padding page, the request-to-token table and the
allocator's free list — and finds the most tokens whose *whole* plan fits.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

import attrs

from kvpools_core.errors import ConfigError, InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.values import (
    FIXED,
    FULL_TOKENS,
    REQUEST,
    STATE_SLOT,
    TOKEN,
    Budget,
    CellSize,
    GroupCost,
    ModelSpec,
    PoolSizing,
    PoolSpec,
    Serving,
    TokenWindow,
    Workspace,
)

GiB = 1 << 30
DEFAULT_MEM_FRACTION_STATIC = 0.9
"""The fraction a stated or measured budget uses when ``Serving.mem_fraction_static`` is unset: kvpools' choice,
kept from earlier versions (SGLang computes its default from the GPU's total memory, 0.95 when it cannot read
it). A GPU budget uses SGLang's own default for that GPU (:func:`kvpools_core.pipeline.gpus.sglang_memory_defaults`)."""
REQ_TO_TOKEN_EXTRA = 4
"""Headroom columns SGLang adds to every request-table row."""
REQ_TO_TOKEN_ITEM_BYTES = 4  # int32 slot indices


def fmt_gib(num_bytes: float) -> str:
    return f"{num_bytes / GiB:.2f} GiB"


# ---------------------------------------------------------------------------
# budget
# ---------------------------------------------------------------------------


def explicit_budget(budget_bytes: int) -> Budget:
    if budget_bytes < 0:
        raise ConfigError(f"{option('memory')} must not be negative, got {budget_bytes} bytes.")
    return Budget(
        budget_bytes=budget_bytes,
        source="explicit",
        steps=(f"explicit budget {budget_bytes} B ({fmt_gib(budget_bytes)})",),
    )


def profile_budget(
    *,
    free_bytes: int,
    pre_model_load_bytes: int,
    mem_fraction_static: float,
    weights_bytes: int = 0,
    reserved_bytes: int = 0,
    device: str | None = None,
    source: str = "measured",
) -> Budget:
    """SGLang's ``_profile_available_bytes`` in its own float-GiB arithmetic.

    ``free_bytes`` is the device's free memory before the weights load (what
    kvpools can measure), ``weights_bytes`` what the weights will take, so
    SGLang's post-load free memory is their difference.  The runtime slack is
    ``pre_model_load * (1 - mem_fraction_static)``.
    """
    pre_gb = pre_model_load_bytes / GiB
    slack_gb = pre_gb * (1 - mem_fraction_static)
    rest_gb = _rest_gib(free_bytes, weights_bytes, pre_model_load_bytes, mem_fraction_static, reserved_bytes)
    if rest_gb <= 0:
        raise _no_room_for_kv(free_bytes, weights_bytes, pre_model_load_bytes, mem_fraction_static, reserved_bytes)
    budget_bytes = int(rest_gb * GiB)
    steps = (
        f"free memory {free_bytes} B ({fmt_gib(free_bytes)})" + (f" on {device}" if device else ""),
        f"- weights {weights_bytes} B ({fmt_gib(weights_bytes)})",
        f"- runtime slack = pre-load {fmt_gib(pre_model_load_bytes)} x (1 - mem_fraction_static {mem_fraction_static})"
        f" = {slack_gb:.4f} GiB",
        f"- reserved {reserved_bytes} B ({fmt_gib(reserved_bytes)})",
        f"= KV budget {budget_bytes} B ({fmt_gib(budget_bytes)})",
    )
    return Budget(
        budget_bytes=budget_bytes,
        source=source,
        device=device,
        free_bytes=free_bytes,
        weights_bytes=weights_bytes,
        pre_model_load_bytes=pre_model_load_bytes,
        mem_fraction_static=mem_fraction_static,
        slack_bytes=int(slack_gb * GiB),
        reserved_bytes=reserved_bytes,
        steps=steps,
    )


def gpu_budget(
    *,
    gpu: str,
    gpu_total_bytes: int,
    runtime_bytes: int,
    mem_fraction_static: float,
    mem_fraction_source: str,
    weights_bytes: int,
    reserved_bytes: int = 0,
) -> Budget:
    """SGLang's profile arithmetic on a whole GPU: pre-load memory = total - runtime footprint.

    SGLang measures ``pre_model_load_memory`` when the weights start loading, so
    both the free memory and the pre-load memory of ``_profile_available_bytes``
    are the GPU's total less what the runtime (CUDA context, communicators)
    already holds; the rest is :func:`profile_budget`.
    """
    if runtime_bytes >= gpu_total_bytes:
        raise ConfigError(
            f"{option('runtime_memory')} ({fmt_gib(runtime_bytes)}) must be below the GPU's total memory "
            f"({fmt_gib(gpu_total_bytes)})."
        )
    pre_load = gpu_total_bytes - runtime_bytes
    profiled = profile_budget(
        free_bytes=pre_load,
        pre_model_load_bytes=pre_load,
        mem_fraction_static=mem_fraction_static,
        weights_bytes=weights_bytes,
        reserved_bytes=reserved_bytes,
        source=f"GPU {gpu}",
    )
    steps = (
        f"GPU {gpu} total {gpu_total_bytes} B ({fmt_gib(gpu_total_bytes)}, {gpu_total_bytes / (1 << 20):g} MiB)",
        f"- runtime before the weights {runtime_bytes} B ({fmt_gib(runtime_bytes)})",
        f"= pre-load free {pre_load} B ({fmt_gib(pre_load)})",
        f"mem_fraction_static {mem_fraction_static}: {mem_fraction_source}",
        *profiled.steps[1:],
    )
    return attrs.evolve(
        profiled,
        steps=steps,
        gpu=gpu,
        gpu_total_bytes=gpu_total_bytes,
        runtime_bytes=runtime_bytes,
        mem_fraction_source=mem_fraction_source,
    )


def _no_room_for_kv(
    free_bytes: int, weights_bytes: int, pre_model_load_bytes: int, mem_fraction_static: float, reserved_bytes: int
) -> InsufficientMemoryError:
    """Why a profiled budget is empty, with only advice that can be followed.

    The KV budget is ``free - weights - pre_load * (1 - fraction) - reserved``;
    a fraction can reach at most 1, so when weights and reservations alone fill
    the free memory no fraction helps, and the error says so.
    """
    o = option
    slack_gb = pre_model_load_bytes / GiB * (1 - mem_fraction_static)
    seen = (
        f"{fmt_gib(free_bytes)} free, {fmt_gib(weights_bytes)} of weights, {slack_gb:.2f} GiB runtime slack"
        f"{f', {fmt_gib(reserved_bytes)} reserved' if reserved_bytes else ''}"
    )
    left_gb = (free_bytes - weights_bytes - reserved_bytes) / GiB
    pre_gb = pre_model_load_bytes / GiB
    minimum = 1 - left_gb / pre_gb if pre_gb > 0 else 1.0
    if left_gb <= 0 or minimum >= 1:
        return InsufficientMemoryError(
            f"The weights{' and reservations' if reserved_bytes else ''} do not fit in the free memory ({seen}): "
            f"no {o('mem_fraction_static')} can leave room for the KV cache. Shard the weights over more ranks "
            f"({o('tp_size')}, {o('pp_size')}), quantise them, or use a device with more free memory."
        )
    suggested = math.ceil(minimum * 1000) / 1000
    advice = (
        f"Raise {o('mem_fraction_static')} above {suggested:.3f} (minimum viable = 1 - available/pre = "
        f"{minimum:.4f}, where available is the free memory less the weights"
        f"{' and the reservations' if reserved_bytes else ''})"
        if suggested < 1
        else f"Set {o('mem_fraction_static')} to 1.0 (minimum viable = {minimum:.4f})"
    )
    return InsufficientMemoryError(
        f"Loaded weights leave no memory for the KV cache under {o('mem_fraction_static')}={mem_fraction_static}: "
        f"{seen}. {advice}, or lower {o('weights_memory')} / {o('reserved_memory')}."
    )


def sglang_rest_gib(budget: Budget) -> float:
    """SGLang's ``rest_memory`` behind a budget: float GiB, before ``int(rest * (1 << 30))`` makes it bytes.

    A plugin that carves its own share out of the budget before the KV pools
    (the mamba state cache: ``_handle_max_mamba_cache`` runs inside
    ``_profile_available_bytes``) needs it to reproduce SGLang's float
    arithmetic; an explicit budget is exactly ``budget_bytes / GiB``.
    """
    if budget.free_bytes is None or budget.pre_model_load_bytes is None or budget.mem_fraction_static is None:
        return budget.budget_bytes / GiB
    return _rest_gib(
        budget.free_bytes,
        budget.weights_bytes or 0,
        budget.pre_model_load_bytes,
        budget.mem_fraction_static,
        budget.reserved_bytes or 0,
    )


def _rest_gib(free: int, weights: int, pre_model_load: int, mem_fraction_static: float, reserved: int) -> float:
    """``available - slack - reserved`` in SGLang's order of float operations."""
    return (free - weights) / GiB - (pre_model_load / GiB) * (1 - mem_fraction_static) - reserved / GiB


# ---------------------------------------------------------------------------
# tokens and requests (SGLang semantics)
# ---------------------------------------------------------------------------


def page_align(tokens: int, page_size: int) -> int:
    return tokens // page_size * page_size


def sglang_tokens(budget_bytes: int, cell_bytes: float, page_size: int) -> int:
    """``DefaultPoolConfigurator.calculate_pool_sizes``: budget // cell, page aligned."""
    return page_align(int(budget_bytes // cell_bytes), page_size)


def apply_token_cap(token_capacity: int, max_total_tokens: int | None) -> tuple[int, str | None]:
    """``_apply_token_constraints``' user cap, with SGLang's warning when the cap is above capacity."""
    if max_total_tokens is None:
        return token_capacity, None
    note = None
    if max_total_tokens > token_capacity:
        note = (
            f"max_total_tokens={max_total_tokens} is larger than the profiled value {token_capacity}. "
            f"Use the profiled value instead."
        )
    return min(token_capacity, max_total_tokens), note


@attrs.frozen
class RequestLimit:
    max_running_requests: int
    requested_per_worker: int | None
    note: str | None


def resolve_max_num_reqs(token_capacity: int, context_len: int, serving: Serving) -> RequestLimit:
    """``resolve_max_num_reqs`` without the mamba cap (the mamba plugin adds it).

    Unset: ``clamp(int(tokens / context_len * 512), 2048, 4096)``; set: the
    per-DP-worker share of ``--max-running-requests``; both at most tokens // 2.
    """
    estimated = max(min(int(token_capacity / context_len * 512), 4096), 2048)
    requested = serving.max_running_requests
    if requested is not None:
        per_worker = requested // serving.attn_dp_size
        limit = min(per_worker, token_capacity // 2)
    else:
        per_worker = None
        limit = min(estimated, token_capacity // 2)
    note = None
    if per_worker is not None and limit < per_worker:
        note = (
            f"max_running_requests was reduced from the requested {per_worker} to {limit} "
            f"(per dp worker) due to the available KV cache capacity."
        )
    return RequestLimit(limit, per_worker, note)


def alloc_len_per_decode(serving: Serving) -> int:
    """KV tokens one request may allocate in one decode step (``get_alloc_len_per_decode``)."""
    if not serving.speculative:
        return 1
    steps = serving.speculative_num_steps or 1
    topk = serving.speculative_eagle_topk or 1
    draft_tokens = serving.max_speculative_num_draft_tokens or 0  # the adaptive maximum (allocation_sizing.py)
    page = serving.page_size * serving.dcp_size
    if page == 1 or topk == 1 or serving.speculative_algorithm == "NGRAM":
        return max(steps * topk, draft_tokens)
    return max(-(-(page - 1 + steps) // page) * page * topk, draft_tokens)


def spec_decode_alloc_len_per_request(serving: Serving) -> int:
    """KV tokens one request may take in a spec-v1 decode step (SGLang's ``spec_decode_alloc_len_per_request``).

    Each of the ``topk`` branches drafts ``num_steps`` tokens, verify takes
    ``num_draft_tokens``; paged, each rounds up to whole pages (a branch of a
    tree draft one page more).
    """
    page = serving.page_size
    branch = serving.speculative_num_steps or 1
    topk = serving.speculative_eagle_topk or 1
    verify = serving.speculative_num_draft_tokens or 1
    if page > 1:
        branch = -(-(branch + page) // page) * page if topk > 1 else -(-branch // page) * page
        verify = -(-verify // page) * page
    return max(branch * topk, verify)


def sliding_window_terms(token_space: str, window: int, serving: Serving) -> TokenWindow:
    """The worst-case window terms of a token space SGLang's scheduler evicts out-of-window tokens from, as
    ``SWAChunkCapPoolConfigurator.__init__`` adds them up (``002_50706b73e02ffb67.txt`` lines 425-458).

    SGLang's eviction (``ScheduleBatch.maybe_evict_swa``) is the same for every hybrid-SWA model — the
    ``SWATokenToKVPoolAllocator`` pair of a sliding-window hybrid and of DeepSeek-V4 alike — so the plugins of
    both record these terms for their SWA space with the model's window.  A request holds at most ``window +
    eviction interval x draft tokens + page + decode allocation`` tokens (lines 427-445; the decode allocation
    is a page, spec-v1's :func:`spec_decode_alloc_len_per_request`, or spec-v2's ``2 x
    get_alloc_len_per_decode``), beyond which each of the chunks in flight holds up to
    ``--chunked-prefill-size`` more (2 with the overlap schedule, 1 without) and a page stays reserved (lines
    453-458); a decode node prefills nothing and keeps ``(window + page)`` per pre-allocated slot (lines
    448-452).
    """
    page = serving.page_size
    if not serving.speculative:
        decode = page
    elif serving.disable_overlap_schedule:
        decode = spec_decode_alloc_len_per_request(serving)  # spec-v1
    else:
        decode = 2 * alloc_len_per_decode(serving)  # spec-v2 keeps 2 x alloc_len outstanding
    if serving.disaggregation_mode == "decode":
        prefills, reserved = 0, (window + page) * serving.decode_extra_slots
    else:
        prefills, reserved = (1 if serving.disable_overlap_schedule else 2), page
    return TokenWindow(
        token_space=token_space,
        window=window,
        eviction_interval=max(1, serving.swa_eviction_interval),
        draft_tokens=serving.speculative_num_draft_tokens or 1,
        page_size=page,
        decode_alloc=decode,
        prefill_chunk=serving.chunked_prefill_size,
        prefills_in_flight=prefills,
        reserved=reserved,
    )


def req_to_token_row_len(context_len: int, serving: Serving) -> int:
    """Columns of one request-table row: context + ``get_req_to_token_extra_context_len``."""
    extra = REQ_TO_TOKEN_EXTRA + (serving.max_speculative_num_draft_tokens or 0)
    page = serving.page_size * serving.dcp_size
    if serving.speculative and page > 1:
        extra = max(extra, 2 * alloc_len_per_decode(serving) + page - 1)
    return context_len + extra


def req_to_token_rows(max_running_requests: int, serving: Serving) -> tuple[int, int]:
    """(usable rows, padding rows): row 0 pads; a decode node pre-allocates :attr:`Serving.decode_extra_slots`
    more (``DecodeReqToTokenPool``: ``size + pre_alloc_size + 1`` rows, ref-000 lines 1003-1022)."""
    return max_running_requests + serving.decode_extra_slots, 1


# ---------------------------------------------------------------------------
# pools
# ---------------------------------------------------------------------------


def token_pools(cell: CellSize, tokens: int, page_size: int, owner: str) -> list[PoolSpec]:
    """One pool per token storage group of the cell; each allocates ``tokens + page_size`` rows (page 0 pads).

    A pool whose parts declare ``extra_slots`` allocates :func:`pool_rows` rows instead, and one whose parts
    declare ``slot_scale`` that many times the slots (:func:`token_pool`).
    """
    extra = cell.pool_extra_slots()
    scale = cell.pool_slot_scale()
    return [
        token_pool(name, tokens, page_size, per_token, owner, extra_slots=extra[name], slot_scale=scale[name])
        for name, per_token in cell.pool_bytes_per_token().items()
    ]


def token_pool(
    name: str,
    tokens: int,
    page_size: int,
    bytes_per_token: int,
    owner: str,
    *,
    extra_slots: int = 0,
    token_space: str = FULL_TOKENS,
    charged: bool = True,
    kind: str = "kv",
    slot_scale: int = 1,
) -> PoolSpec:
    """A pool of ``tokens`` slots of ``token_space`` with :func:`pool_rows` rows, and its cost.

    Without ``extra_slots`` it costs ``bytes_per_token`` per token plus its
    padding page, for any token count.  With them it is laid out in whole
    pages: its cost is per page of ``page_size`` tokens, and the slack pages
    are fixed bytes (exact for page-aligned token counts, which every plan's are).

    ``slot_scale`` ``k`` makes a pool spanning ``k`` slots per plan token, paged
    by ``page_size x k``: ``tokens x k`` slots, ``page_size x k`` padding
    (:func:`pool_rows` of the scaled counts), ``bytes_per_token`` per slot, so
    ``(tokens + page_size) x k x bytes_per_token`` bytes; its recorded cost is
    ``k x bytes_per_token`` per plan token.  SGLang's draft worker under DCP
    builds its pools so (``loc_space_scale`` = dcp and ``pool_page_size`` = page
    x dcp scale ``max_total_num_tokens`` and the page, ``000_fbd4f47288598fb9.txt``
    lines 405-433, the pool constructors at 1398-1663).
    """
    if slot_scale < 1:
        raise ConfigError(f"token_pool {name!r}: slot_scale must be at least 1, got {slot_scale}.")
    slots, page = tokens * slot_scale, page_size * slot_scale
    rows = pool_rows(slots, page, extra_slots)
    pool = PoolSpec(
        name=name,
        kind=kind,
        slots=slots,
        padding_slots=rows - slots,
        bytes_per_slot=bytes_per_token,
        bytes=rows * bytes_per_token,
        sglang_charged=charged,
        owner=owner,
        unit=TOKEN,
        token_space=token_space,
    )
    if not extra_slots and slot_scale == 1:
        return pool
    if not extra_slots:
        cost = GroupCost(
            group=name,
            token_space=token_space,
            token_bytes=bytes_per_token * slot_scale,
            fixed_bytes=bytes_per_token * page,
        )
    else:
        cost = GroupCost(
            group=name,
            token_space=token_space,
            token_bytes=bytes_per_token * page,
            token_block=page_size,
            fixed_bytes=bytes_per_token * pool_rows(0, page, extra_slots),
        )
    return with_cost(pool, cost)


def with_cost(pool: PoolSpec, cost: GroupCost) -> PoolSpec:
    """``pool`` recording ``cost``, where its fields alone (``bytes_per_slot`` per ``slots``) would not say it."""
    try:
        derived = pool.group_cost
    except ConfigError:
        derived = None
    return pool if derived == cost else attrs.evolve(pool, cost=cost)


def pool_rows(tokens: int, page_size: int, extra_slots: int = 0) -> int:
    """Rows a token pool allocates: ``tokens + page_size``, or with ``extra_slots``
    ``(tokens + page_size + extra_slots) // page_size`` whole pages (SGLang's DSA indexer)."""
    if not extra_slots:
        return tokens + page_size
    return (tokens + page_size + extra_slots) // page_size * page_size


def request_table_pool(max_running_requests: int, context_len: int, serving: Serving) -> PoolSpec:
    """The request-to-token table: one row per request (its bytes per request hold for ``context_len``)."""
    rows, padding = req_to_token_rows(max_running_requests, serving)
    row_bytes = req_to_token_row_len(context_len, serving) * REQ_TO_TOKEN_ITEM_BYTES
    pool = PoolSpec(
        name="req_to_token",
        kind="request",
        slots=rows,
        padding_slots=padding,
        bytes_per_slot=row_bytes,
        bytes=(rows + padding) * row_bytes,
        sglang_charged=False,
        owner="core",
        unit=REQUEST,
    )
    if rows == max_running_requests:  # one row per request: the fields say the cost (with_cost would keep it)
        return pool
    return with_cost(pool, request_rows_cost(pool, max_running_requests))


def request_pools(max_running_requests: int, context_len: int, serving: Serving) -> list[PoolSpec]:
    """Everything a plan holds per running request beside the KV: the request table and the platform's workspaces.

    Every ``size_pools`` charges these (the pipeline checks the workspaces are
    there), so a platform's per-request buffers reach every architecture's
    sizing without it naming the platform.
    """
    return [
        request_table_pool(max_running_requests, context_len, serving),
        *(workspace_pool(w, max_running_requests) for w in serving.workspaces),
    ]


def request_pools_bytes(max_running_requests: int, context_len: int, serving: Serving) -> int:
    """``sum(p.bytes for p in request_pools(...))`` without building the pools: for a search that probes many
    request counts and keeps one (DeepSeek-V4's exact plan)."""
    rows, padding = req_to_token_rows(max_running_requests, serving)
    table = (rows + padding) * req_to_token_row_len(context_len, serving) * REQ_TO_TOKEN_ITEM_BYTES
    return table + sum(w.bytes_for(max_running_requests) for w in serving.workspaces)


def workspace_pool(workspace: Workspace, requests: int) -> PoolSpec:
    """A platform workspace as a plan pool: ``requests x bytes_per_request + fixed_bytes``, no padding row."""
    pool = PoolSpec(
        name=workspace.name,
        kind=WORKSPACE_KIND,
        slots=requests,
        bytes_per_slot=workspace.bytes_per_request,
        bytes=workspace.bytes_for(requests),
        sglang_charged=False,
        owner=workspace.owner or "core",
        unit=REQUEST,
    )
    return with_cost(
        pool,
        GroupCost(
            group=workspace.name, bytes_per_request=workspace.bytes_per_request, fixed_bytes=workspace.fixed_bytes
        ),
    )


WORKSPACE_KIND = "workspace"
"""The ``PoolSpec.kind`` of a platform workspace (``build`` allocates those pools itself)."""


def request_rows_cost(pool: PoolSpec, requests: int) -> GroupCost:
    """A per-request pool's cost when its rows exceed the requests (a decode node's pre-allocated rows):
    ``bytes_per_slot`` per request, every other row fixed."""
    return GroupCost(
        group=pool.name,
        bytes_per_request=pool.bytes_per_slot,
        fixed_bytes=pool.bytes - pool.bytes_per_slot * requests,
    )


SWA_MAPPING_POOL = "full_to_swa"
"""The pool of a sliding-window model's full→SWA index mapping (SGLang's ``full_to_swa_index_mapping``)."""
SWA_MAPPING_ITEM_BYTES = 8
"""The mapping holds one int64 SWA slot id per full slot."""


def swa_mapping_pool(full_tokens: int, page_size: int, owner: str) -> PoolSpec:
    """The full→SWA index mapping: one int64 per full slot (padding page included) and the trailing −1.

    Every architecture with a sliding-window token space beside the full one allocates it
    (the dual allocator of :mod:`kvpools_core.allocators.swa` writes it); SGLang leaves it out of its estimate.
    """
    rows = full_tokens + page_size + 1
    return PoolSpec(
        name=SWA_MAPPING_POOL,
        kind="mapping",
        slots=full_tokens,
        padding_slots=page_size + 1,
        bytes_per_slot=SWA_MAPPING_ITEM_BYTES,
        bytes=rows * SWA_MAPPING_ITEM_BYTES,
        sglang_charged=False,
        owner=owner,
        unit=TOKEN,
        token_space=FULL_TOKENS,
    )


def allocator_pool(
    tokens: int,
    page_size: int,
    *,
    token_space: str = FULL_TOKENS,
    name: str = "allocator",
    owner: str = "core",
    dcp: int = 1,
) -> PoolSpec:
    """The allocator's free list, a fixed device allocation SGLang leaves out of its estimate.

    Its slots are pages; it costs one free-list entry per page of ``token_space``
    tokens plus, when paged, the in-page offsets table (fixed), for at least one page.
    Under decode context parallelism (``dcp`` > 1) SGLang widens the default allocator's id space to
    ``PagedTokenToKVPoolAllocator(tokens x dcp, page x dcp)`` (ref-000 lines 2145-2164): the same pages, each of
    ``page x dcp`` logical tokens, so the free list keeps ``tokens // page`` entries and the offsets table
    ``page x dcp``.
    """
    from kvpools_core.allocators import allocator_planned_nbytes

    num_bytes = allocator_planned_nbytes(tokens * dcp, page_size * dcp)
    pages = tokens // page_size
    one_page, per_page = _allocator_page_bytes(page_size, dcp)
    paged = page_size * dcp > 1
    pool = PoolSpec(
        name=name,
        kind="allocator",
        slots=pages,
        bytes_per_slot=num_bytes // pages if pages else 0,
        bytes=num_bytes,
        sglang_charged=False,
        owner=owner,
        unit=TOKEN,
        token_space=token_space,
        # paged, its cost is per page of tokens (token_block = page), which its fields (per slot) cannot say
        cost=_allocator_cost(name, token_space, page_size, dcp) if paged else None,
    )
    if paged:
        return pool
    return with_cost(
        pool, GroupCost(group=name, token_space=token_space, token_bytes=per_page, fixed_bytes=one_page - per_page)
    )


@functools.lru_cache(maxsize=256)
def _allocator_page_bytes(page_size: int, dcp: int = 1) -> tuple[int, int]:
    """(bytes of a one-page allocator, bytes each further page adds): the allocator's cost per page (a page of
    ``page_size`` tokens on this rank, ``page_size x dcp`` ids of the DCP-widened allocator)."""
    from kvpools_core.allocators import allocator_planned_nbytes

    widened = page_size * dcp
    one_page = allocator_planned_nbytes(widened, widened)
    return one_page, allocator_planned_nbytes(2 * widened, widened) - one_page


@functools.lru_cache(maxsize=256)
def _allocator_cost(name: str, token_space: str, page_size: int, dcp: int = 1) -> GroupCost:
    """A paged allocator's cost: one free-list entry per page, the rest fixed (frozen, so shared by plans: a
    function of its arguments alone, built and validated once per page size, issue 37)."""
    one_page, per_page = _allocator_page_bytes(page_size, dcp)
    return GroupCost(
        group=name,
        token_space=token_space,
        token_bytes=per_page,
        token_block=page_size,
        fixed_bytes=one_page - per_page,
    )


def request_state_pools(cell: CellSize, max_running_requests: int, owner: str) -> list[PoolSpec]:
    """The cell's request and fixed parts, one pool per ``CellPart.pool`` (row 0 of per-request state pads)."""
    pools = [
        PoolSpec(
            name=name,
            kind="state",
            slots=max_running_requests,
            padding_slots=1,
            bytes_per_slot=per_request,
            bytes=(max_running_requests + 1) * per_request,
            owner=owner,
            unit=REQUEST,
        )
        for name, per_request in cell.pool_bytes(REQUEST).items()
        if per_request
    ]
    pools += [
        PoolSpec(name=name, kind="fixed", slots=1, bytes_per_slot=fixed, bytes=fixed, owner=owner, unit=FIXED)
        for name, fixed in cell.pool_bytes(FIXED).items()
        if fixed
    ]
    return pools


def largest_fitting_tokens(budget_bytes: int, page_size: int, upper_tokens: int, cost: Callable[[int], int]) -> int:
    """The most page-aligned tokens in ``[0, upper_tokens]`` whose whole plan costs at most the budget.

    ``cost`` must not decrease as tokens grow (more tokens never need fewer
    bytes), which makes any search that keeps "the answer lies in ``[low,
    high]``" exact: the answer is the one a binary search over pages gives.
    Each ``cost`` call lays out every pool, so the search probes where the
    secant through earlier probes meets the budget (a plan's cost is affine in
    tokens between the steps of its request count): ~5 probes on a plan instead
    of bisection's ~20.  After two secant probes in a row that each left more
    than half the interval, one bisection step follows, so a cost the secant
    reads badly (long flat stretches) takes at most about three times
    bisection's probes.
    """
    low, high = 0, upper_tokens // page_size  # the answer (in pages) is in [low, high]; low fits or is 0
    fits: tuple[int, int] | None = None  # (pages, cost) of the largest probe that fits
    over: tuple[int, int] | None = None  # (pages, cost) of the smallest probe that does not
    probes: list[tuple[int, int]] = []
    slow = 0  # secant probes in a row that did not halve the interval
    while low < high:
        if slow >= 2:
            mid, slow = (low + high + 1) // 2, 0
        elif not probes:
            mid = high  # the upper bound is the budget over the bytes of one token: close above the answer
        else:
            first, second = (fits, over) if fits and over else (probes[-2] if len(probes) > 1 else None, probes[-1])
            mid = min(max(_secant(first, second, budget_bytes, default=(low + high + 1) // 2), low + 1), high)
        width = high - low
        spent = cost(mid * page_size)
        probes.append((mid, spent))
        if spent <= budget_bytes:
            low, fits = mid, (mid, spent)
        else:
            high, over = mid - 1, (mid, spent)
        slow = slow + 1 if 2 * (high - low) > width else 0
    return low * page_size


def _secant(first: tuple[int, int] | None, second: tuple[int, int] | None, budget_bytes: int, *, default: int) -> int:
    """Pages where the line through two ``(pages, cost)`` probes costs ``budget_bytes`` (floored); with one probe,
    where cost proportional to pages would; ``default`` when the probes say nothing."""
    if second is None:
        return default
    if first is None or first[0] == second[0]:
        return second[0] * budget_bytes // second[1] if second[1] > 0 else default
    (p1, c1), (p2, c2) = sorted((first, second))
    if c2 <= c1:
        return default
    return p1 + (budget_bytes - c1) * (p2 - p1) // (c2 - c1)


# ---------------------------------------------------------------------------
# the core default of ``size_pools``
# ---------------------------------------------------------------------------


def default_size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget, *, owner: str) -> PoolSizing:
    """Single-token-space sizing: SGLang's ``DefaultPoolConfigurator`` or kvpools' exact solve."""
    state_parts = cell.parts_of(STATE_SLOT)
    if state_parts:
        raise UnsupportedCombinationError(
            f"The cell size of {model.name} has state-slot parts ({', '.join(p.name for p in state_parts)}), which "
            "the core's size_pools cannot count: the plugin that estimates such a cell must answer size_pools "
            "and say how many state slots to allocate."
        )
    page = serving.page_size
    context_len = serving.context_length or model.context_len
    notes: list[str] = []

    def layout(tokens: int) -> tuple[list[PoolSpec], RequestLimit]:
        limit = resolve_max_num_reqs(tokens, context_len, serving)
        pools = token_pools(cell, tokens, page, owner)
        pools += request_state_pools(cell, limit.max_running_requests, owner)
        pools += request_pools(limit.max_running_requests, context_len, serving)
        pools.append(allocator_pool(tokens, page, dcp=serving.dcp_size))
        return pools, limit

    if serving.accounting == "sglang":
        profiled = sglang_tokens(budget.budget_bytes, cell.sglang_bytes_per_token, page)
        tokens, cap_note = apply_token_cap(profiled, serving.max_total_tokens)
        tokens = page_align(tokens, page)
    else:
        capped_upper = budget.budget_bytes // max(1, cell.bytes_per_token)
        profiled = largest_fitting_tokens(
            budget.budget_bytes, page, capped_upper, lambda t: sum(p.bytes for p in layout(t)[0])
        )
        tokens, cap_note = apply_token_cap(profiled, serving.max_total_tokens)
        tokens = page_align(tokens, page)
    if cap_note:
        notes.append(cap_note)
    if tokens <= 0:
        raise not_enough_memory(model, serving, cell, budget)
    pools, limit = layout(tokens)
    if limit.note:
        notes.append(limit.note)
    if limit.max_running_requests <= 0:
        raise InsufficientMemoryError(
            f"{tokens} KV tokens leave room for no request (a request needs at least 2 tokens). "
            f"Raise {option('memory')} or lower {option('page_size')}."
        )
    estimate = int(tokens * cell.sglang_bytes_per_token)
    return PoolSizing(
        max_total_num_tokens=tokens,
        max_running_requests=limit.max_running_requests,
        pools=pools,
        sglang_config={"max_total_num_tokens": tokens, "max_running_requests": limit.max_running_requests},
        sglang_estimate_bytes=estimate,
        notes=notes,
    )


def not_enough_memory(
    model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget, *, fixed: tuple[int, str] | None = None
) -> InsufficientMemoryError:
    """The error when not one page fits, with the numbers and the knobs to turn.

    ``fixed`` is ``(bytes, what)`` a sizing reserved before dividing by the cell (per-request state sized by
    the request count): without it the message would blame the page when the reservation ate the budget.
    """
    o = option
    page = serving.page_size
    per_token = cell.sglang_bytes_per_token if serving.accounting == "sglang" else cell.bytes_per_token
    need = page * per_token
    return InsufficientMemoryError(
        f"Not enough memory for the KV cache: {fmt_gib(budget.budget_bytes)} ({budget.budget_bytes} B) available, "
        f"one page of {page} token(s) of {model.name} needs {need:.0f} B across {cell.num_layers} layer(s)"
        f"{' plus the padding page, request table and allocator' if serving.accounting == 'exact' else ''}"
        f"{'' if fixed is None else f', after {fixed[0]:,} B ({fmt_gib(fixed[0])}) of {fixed[1]}'}. "
        f"{_raise_budget(budget)}, lower {o('page_size')}, {o('context_length')} or {o('max_running_requests')}, "
        f"or use a smaller {o('kv_cache_dtype')}."
    )


def raise_budget_advice(budget: Budget) -> str:
    """The advice that raises ``budget`` as it was given (for plugins' memory errors): never
    ``--mem-fraction-static`` under an explicit ``--memory``, which it would not change."""
    return _raise_budget(budget)


def _raise_budget(budget: Budget) -> str:
    """The options that raise the budget, as it was given: an explicit budget has no fraction to turn."""
    o = option
    if budget.source == "explicit" or budget.mem_fraction_static is None:
        return f"Raise {o('memory')}"
    fraction = f"{o('mem_fraction_static')} (current value {budget.mem_fraction_static})"
    if budget.gpu is not None:
        return f"Raise {fraction}, plan on a GPU with more memory ({o('gpu')} or {o('gpu_memory')})"
    if budget.device is not None and budget.source.startswith("measured"):
        return f"Raise {fraction}, or free memory on {budget.device}"
    return f"Raise {o('free_memory')} or {fraction}"


def summarize_notes(*groups: Sequence[str]) -> tuple[str, ...]:
    seen: list[str] = []
    for group in groups:
        for note in group:
            if note not in seen:
                seen.append(note)
    return tuple(seen)
