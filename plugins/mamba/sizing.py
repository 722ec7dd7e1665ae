"""Sizing a hybrid: the mamba state cache's share of the budget, its slots per request, then the KV tokens.

SGLang's semantics (``kv_cache_configurator.py``): ``_handle_max_mamba_cache``
takes the state cache out of the budget *before* the KV configurator sees it
(``max_mamba_cache_size`` = K slots, one more for padding), in SGLang's float
GiB arithmetic; ``_calculate_mamba_ratio`` says how many slots one running
request needs; ``resolve_max_num_reqs`` caps the requests by ``K // ratio``.
The KV tokens are then the core's (``DefaultPoolConfigurator`` over the
full-attention layers only).  ``--accounting exact`` keeps SGLang's K and
finds the most tokens whose whole plan fits, state pools included.  A PD
decode node sizes K the same way (without the radix cache) but its table
raises the state pool past K (:func:`decode_state_slots`).
"""

from __future__ import annotations

import math

import attrs

from kvpools_core.errors import InsufficientMemoryError
from kvpools_core.parts.sizing import (
    GiB,
    RequestLimit,
    allocator_pool,
    apply_token_cap,
    fmt_gib,
    largest_fitting_tokens,
    not_enough_memory,
    page_align,
    raise_budget_advice,
    req_to_token_rows,
    request_pools,
    request_rows_cost,
    resolve_max_num_reqs,
    sglang_rest_gib,
    sglang_tokens,
    token_pools,
    with_cost,
)
from kvpools_core.values import REQUEST, STATE_SLOT, Budget, CellSize, ModelSpec, PoolSizing, PoolSpec, Serving

from .ple import NGRAM_POOL, NGRAM_SPEC_POOL, SHORT_CONV_POOL, SHORT_CONV_SPEC_POOL, PleState, ple_state
from .qsa import QSA_COMPRESSED_POOL, qsa_profile, qsa_request_pools
from .replayssm import (
    RING_POOL,
    decode_ring_bytes_per_layer,
    sglang_spec_ring_per_req,
    spec_active,
    spec_ring_bytes_per_layer,
)
from .state import rank_state_layer_ids, sglang_stage_per_req, state_shape

# SGLang's ratios of state slots to running requests (module constants of kv_cache_configurator.py).
MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO = 3
MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP = 1
MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP = 2
MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP_LAZY = 1
MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP = 1
MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER = 1

STATE_POOL = "mamba_state"
SPEC_STATE_POOL = "mamba_spec_state"
MAPPING_POOL = "mamba_req_mapping"
SLOT_ALLOCATOR_POOL = "mamba_allocator"
MAPPING_ITEM_BYTES = 4  # int32 request row -> state slot
PING_PONG_ITEM_BYTES = 8  # int64 request row -> ping-pong slots
SLOT_ALLOCATOR_ITEM_BYTES = 8  # int64 free stack of state slots


def mamba_ratio(serving: Serving) -> int:
    """``_calculate_mamba_ratio``: state slots one running request may hold (1 without the radix cache, which
    a PD decode node never has: :attr:`~kvpools_core.values.Serving.radix_cache_disabled`)."""
    if serving.radix_cache_disabled:
        return 1
    skip = serving.mamba_skip_decode_lock
    base = MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO - (MAMBA_CACHE_BASE_RATIO_DROP_ON_SKIP if skip else 0)
    additional = 0
    if extra_buffer(serving):
        if not serving.disable_overlap_schedule:
            lazy = serving.enable_mamba_extra_buffer_lazy
            additional = (
                MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP_LAZY if lazy else MAMBA_CACHE_V2_ADDITIONAL_RATIO_OVERLAP
            )
        else:
            additional = MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_OVERLAP
    elif skip:
        additional = MAMBA_CACHE_V2_ADDITIONAL_RATIO_NO_BUFFER
    return base + additional


def extra_buffer(serving: Serving) -> bool:
    """Whether SGLang keeps the extra (ping-pong) buffer: asked for, and the radix cache on.

    SGLang resolves ``get_exec().mamba.enable_mamba_extra_buffer`` (what ref-000 reads, e.g. line 2281) with
    ``mamba_extra_buffer_of``: ``disable_radix_cache is False`` and an ``extra_buffer`` strategy
    (``sglang/srt/arg_groups/model_override_base.py``), so the buffer is inert without the radix cache (and on
    a PD decode node, which runs without it).
    """
    return serving.enable_mamba_extra_buffer and not serving.radix_cache_disabled


def ping_pong_size(serving: Serving) -> int:
    """Columns of the request -> ping-pong slot table (``HybridReqToTokenPool``): 2 with overlap, else 1; 0 without."""
    if not extra_buffer(serving):
        return 0
    return 1 if serving.disable_overlap_schedule else 2


def ping_pong_slots_per_request(serving: Serving) -> int:
    """Ping-pong slots a new request takes beside its state slot (lazy mode takes one)."""
    if not extra_buffer(serving):
        return 0
    return 1 if serving.enable_mamba_extra_buffer_lazy else ping_pong_size(serving)


def decode_state_slots(k: int, requests: int, serving: Serving) -> int:
    """The state slots the request table's ``MambaPool`` holds: K, or on a PD decode node enough for every row.

    SGLang builds a decode node's table as ``HybridMambaDecodeReqToTokenPool`` (ref-000 lines 1003-1022 and
    1063-1102, passing ``mamba_size=max_mamba_cache_size``), which raises the pool to
    ``max(K, (max_running_requests + pre_alloc_size) x (1 + tracking slots))`` so that every running and
    pre-allocated request holds its slots (``disaggregation/decode.py`` ``HybridMambaDecodeReqToTokenPool.__init__``,
    SGLang 0.5.23; tracking slots = ``get_mamba_tracking_slots(extra_buffer, overlap, lazy=False)``, 0 without
    the extra buffer, which a decode node never has: its radix cache is off).  ``_handle_max_mamba_cache`` charged
    only ``K + 1`` slots: the raise is memory SGLang's budget does not count.
    """
    if not serving.decode_request_pools:
        return k
    return max(k, (requests + serving.decode_extra_slots) * (1 + ping_pong_size(serving)))


def spec_state_rows(requests: int, serving: Serving) -> int:
    """Request rows of the speculative intermediate state (``mamba_spec_state_size``; a padding row more).

    ``max_running_requests``, plus the pre-allocated rows on a PD decode node (``size + pre_alloc_size``,
    ``HybridMambaDecodeReqToTokenPool``).
    """
    return requests + serving.decode_extra_slots


def draft_tokens(serving: Serving) -> int:
    """D: the draft tokens whose intermediate state speculative verification keeps (0 without speculation)."""
    return (serving.speculative_num_draft_tokens or 0) if serving.speculative else 0


@attrs.frozen
class MambaSplit:
    """What ``_handle_max_mamba_cache`` decides: K, and the GiB it leaves the KV cache.

    ``rest_gib`` is the budget SGLang holds before the carve-out,
    ``kv_rest_gib`` after it (still in float GiB, as SGLang converts only at
    the end).  ``state_bytes`` and ``intermediate_bytes`` are SGLang's charges.
    """

    max_mamba_cache_size: int
    ratio: int
    source: str
    stage_per_req: int
    rest_gib: float
    kv_rest_gib: float
    mamba_budget_bytes: float | None = None
    intermediate_bytes: int = 0
    intermediate_requests: int = 0
    ring_per_slot: int = 0
    """ReplaySSM's spec-verify ring charged per state slot (KDA)."""
    ring_fixed_bytes: int = 0
    """ReplaySSM's spec-verify ring charged once (GDN: ``ring x (max_running_requests // dp + 1)``)."""

    @property
    def state_bytes(self) -> int:
        return (self.max_mamba_cache_size + 1) * (self.stage_per_req + self.ring_per_slot) + self.ring_fixed_bytes

    @property
    def kv_budget_bytes(self) -> int:
        """``int(rest_memory * (1 << 30))`` of ``_profile_available_bytes``, after the carve-out."""
        return int(self.kv_rest_gib * GiB)


def split_budget(
    rest_gib: float,
    serving: Serving,
    stage_per_req: int,
    model_name: str,
    budget: Budget | None = None,
    *,
    replay_ring: int | None = None,
    ring_per_request: bool = False,
) -> MambaSplit:
    """``_handle_max_mamba_cache``: K from ``--max-mamba-cache-size``, the request count, or the ratio budget.

    ``replay_ring`` is ReplaySSM's spec-verify ring (SGLang's stage share) when it is active: no intermediate
    state is reserved, and the ring is charged per request row (``ring_per_request``, GDN) or per state slot.
    """
    dp = serving.attn_dp_size
    ratio = mamba_ratio(serving)
    replay = replay_ring is not None
    d = 0 if replay else draft_tokens(serving)
    requested = serving.max_running_requests
    ring_fixed = ring_slot = 0
    if replay_ring is not None:
        if ring_per_request:
            assert requested is not None  # replayssm_problems demands it, where SGLang would crash on None
            ring_fixed = replay_ring * (requested // dp + 1)
        else:
            ring_slot = replay_ring
    total = rest_gib
    mamba_budget_bytes: float | None = None
    intermediate = intermediate_requests = 0
    if serving.max_mamba_cache_size is not None:
        k = serving.max_mamba_cache_size // dp
        source = f"--max-mamba-cache-size {serving.max_mamba_cache_size}" + (f" // DP {dp}" if dp > 1 else "")
        if serving.speculative and not replay:
            assert requested is not None  # validate() demands it with speculation, as SGLang asserts
            intermediate_requests = min(requested // dp, k // ratio) + 1
            intermediate = stage_per_req * intermediate_requests * d
            total = total - (intermediate / GiB)
    elif serving.radix_cache_disabled and requested is not None:
        k = requested // dp
        source = "--max-running-requests with the radix cache off"
        if serving.speculative and not replay:
            intermediate_requests = k + 1
            intermediate = stage_per_req * intermediate_requests * d
            total = total - (intermediate / GiB)
    else:
        r = serving.mamba_full_memory_ratio
        mamba_budget_bytes = total * r / (1 + r) * GiB
        source = f"the mamba budget (rest x r / (1 + r), --mamba-full-memory-ratio r = {r})"
        if serving.speculative and not replay:
            assert requested is not None
            k = int((mamba_budget_bytes - stage_per_req * (1 + d)) // (stage_per_req * (1 + d / ratio)))
            intermediate_requests = min(requested // dp, k // ratio) + 1
            intermediate = stage_per_req * intermediate_requests * d
            total = total - (intermediate / GiB)
        else:
            per_slot = stage_per_req + ring_slot
            k = int((mamba_budget_bytes - ring_fixed - per_slot) // per_slot)
    if k <= 0:
        raise InsufficientMemoryError(
            f"Not enough memory for the hybrid (mamba/linear-attention) state cache of {model_name}: "
            f"max_mamba_cache_size={k} from {source} (budget {rest_gib:.2f} GiB, {stage_per_req / (1 << 20):.2f} MB "
            f"of state per slot). Try: (1) reduce --max-running-requests, (2) {_budget_advice(budget)}, "
            f"(3) reduce --speculative-num-draft-tokens, or (4) use devices with more memory."
        )
    state_gib = ((k + 1) * (stage_per_req + ring_slot) + ring_fixed) / GiB
    return MambaSplit(
        max_mamba_cache_size=k,
        ratio=ratio,
        source=source,
        stage_per_req=stage_per_req,
        rest_gib=rest_gib,
        kv_rest_gib=total - state_gib,
        mamba_budget_bytes=mamba_budget_bytes,
        intermediate_bytes=intermediate,
        intermediate_requests=intermediate_requests,
        ring_per_slot=ring_slot,
        ring_fixed_bytes=ring_fixed,
    )


def cap_requests(limit: RequestLimit, split: MambaSplit) -> tuple[int, str | None]:
    """``resolve_max_num_reqs``' mamba cap, with SGLang's warning (which replaces the capacity warning)."""
    cap = split.max_mamba_cache_size // split.ratio
    if cap < limit.max_running_requests:
        return cap, (
            f"max_running_requests is capped to {cap} by the mamba state cache "
            f"(max_mamba_cache_size={split.max_mamba_cache_size}, {split.ratio} state slots per request). "
            f"To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size "
            f"with --mamba-ssm-dtype bfloat16."
        )
    return limit.max_running_requests, limit.note


def size_hybrid_pools(
    model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget, *, owner: str, state_layers: int
) -> PoolSizing:
    """Split the budget (state cache first, SGLang's K), then size the KV tokens and every pool."""
    page = serving.page_size
    context_len = serving.context_length or model.context_len
    per_slot = cell.bytes_per_state_slot
    replay = spec_active(model, serving)
    gdn_ring = replay and model.params["mixer"] == "gdn"
    split = split_budget(
        sglang_rest_gib(budget),
        serving,
        sglang_stage_per_req(model, serving),
        model.name,
        budget,
        replay_ring=sglang_spec_ring_per_req(model, serving) if replay else None,
        ring_per_request=gdn_ring,
    )
    k = split.max_mamba_cache_size
    d = draft_tokens(serving)
    spec_pool = d > 0 and serving.disaggregation_mode != "prefill"  # a prefill node never verifies drafts
    ple = ple_state(model, serving)
    qsa = qsa_profile(model)
    qsa_layers = cell.num_layers  # the rank's full-attention layers
    shape, rank_layers = state_shape(model, serving), len(rank_state_layer_ids(model, serving))
    # Under ReplaySSM spec-verify the intermediate SSM state is not allocated, only the conv windows, and
    # SGLang's budget reserves none of it.
    spec_per_slot = shape.conv_bytes * rank_layers if replay else per_slot
    ring = 0
    if replay:
        ring = spec_ring_bytes_per_layer(model, serving, shape.conv_dtype) * rank_layers
    elif serving.enable_linear_replayssm:
        ring = decode_ring_bytes_per_layer(model, serving, shape.ssm_dtype) * rank_layers

    def layout(tokens: int) -> tuple[list[PoolSpec], int, str | None]:
        requests, note = cap_requests(resolve_max_num_reqs(tokens, context_len, serving), split)
        requests = max(requests, 0)
        slots = decode_state_slots(k, requests, serving)
        pools = token_pools(cell, tokens, page, owner)
        if qsa is not None:  # the reference's cell does not count the compressed index keys (.qsa)
            pools = [attrs.evolve(p, sglang_charged=False) if p.name == QSA_COMPRESSED_POOL else p for p in pools]
            pools += qsa_request_pools(qsa, qsa_layers, requests, serving, owner)
        pools.append(_pool(STATE_POOL, "state", slots, 1, per_slot, owner, unit=STATE_SLOT))
        if spec_pool:
            spec_rows = spec_state_rows(requests, serving)
            spec = _pool(
                SPEC_STATE_POOL, "state", spec_rows, 1, d * spec_per_slot, owner, unit=REQUEST, charged=not replay
            )
            pools.append(with_cost(spec, request_rows_cost(spec, requests)) if spec_rows != requests else spec)
        if ring and gdn_ring:  # per request row: spec_state_size + 1 rows
            ring_rows = spec_state_rows(requests, serving)
            ring_pool = _pool(RING_POOL, "state", ring_rows, 1, ring, owner, unit=REQUEST)
            pools.append(
                with_cost(ring_pool, request_rows_cost(ring_pool, requests)) if ring_rows != requests else ring_pool
            )
        elif ring:  # per state slot; the decode ring is not charged by SGLang's budget
            pools.append(_pool(RING_POOL, "state", slots, 1, ring, owner, unit=STATE_SLOT, charged=replay))
        if ple is not None:
            pools += _ple_pools(ple, slots, spec_state_rows(requests, serving) if spec_pool else None, d, owner)
        pools += request_pools(requests, context_len, serving)
        rows, padding = req_to_token_rows(requests, serving)
        row_bytes = MAPPING_ITEM_BYTES + PING_PONG_ITEM_BYTES * ping_pong_size(serving)
        mapping = _pool(MAPPING_POOL, "request", rows, padding, row_bytes, owner, charged=False, unit=REQUEST)
        pools.append(with_cost(mapping, request_rows_cost(mapping, requests)))
        pools.append(
            _pool(
                SLOT_ALLOCATOR_POOL,
                "allocator",
                slots,
                0,
                SLOT_ALLOCATOR_ITEM_BYTES,
                owner,
                charged=False,
                unit=STATE_SLOT,
            )
        )
        pools.append(allocator_pool(tokens, page, dcp=serving.dcp_size))
        return pools, requests, note

    notes = _split_notes(split, per_slot, state_layers, serving)
    if serving.accounting == "sglang":
        if split.kv_rest_gib <= 0:
            raise _no_memory_left(model, split, budget)
        kv_budget = split.kv_budget_bytes
        profiled = sglang_tokens(kv_budget, cell.sglang_bytes_per_token, page)
    else:
        fixed = (k + 1) * per_slot + k * SLOT_ALLOCATOR_ITEM_BYTES  # what the state cache needs before any token
        if ple is not None:
            fixed += (k + 1) * (ple.short_conv_bytes_per_slot + ple.ngram_bytes_per_slot)
        if ring and not gdn_ring:
            fixed += (k + 1) * ring
        if fixed > budget.budget_bytes:
            raise _no_memory_left(model, split, budget, exact_fixed=fixed)
        kv_budget = budget.budget_bytes - fixed
        upper = kv_budget // max(1, cell.bytes_per_token)
        profiled = largest_fitting_tokens(
            budget.budget_bytes, page, upper, lambda t: sum(p.bytes for p in layout(t)[0])
        )
    tokens, cap_note = apply_token_cap(profiled, serving.max_total_tokens)
    tokens = page_align(tokens, page)
    if cap_note:
        notes.insert(0, cap_note)
    if tokens <= 0:
        raise not_enough_memory(model, serving, cell, attrs.evolve(budget, budget_bytes=max(0, kv_budget)))
    pools, requests, note = layout(tokens)
    if note:
        notes.append(note)
    if requests <= 0:
        raise InsufficientMemoryError(
            f"The hybrid (mamba/linear-attention) state cache of {model.name} is too small to serve any request: "
            f"max_mamba_cache_size={k}, {split.ratio} state slot(s) per request, {tokens} KV tokens, resulting "
            f"max_running_requests={requests}. Try: (1) reduce --max-running-requests, (2) {_budget_advice(budget)}, "
            f"or (3) use devices with more memory."
        )
    notes.append(
        f"the state cache admits at most max_mamba_cache_size // ratio = {k} // {split.ratio} = "
        f"{k // split.ratio} running requests"
    )
    slots = decode_state_slots(k, requests, serving)
    if serving.decode_request_pools:
        notes.append(_decode_note(k, slots, requests, per_slot, serving))
    if ring:
        notes.append(_ring_note(split, ring, slots, requests, serving, gdn_ring))
    if ple is not None:
        ple_bytes = sum(p.bytes for p in pools if p.name.startswith("ple_"))
        notes.append(
            f"Qwen4-Exp PLE request state ({ple.describe()}) beside each of the {slots} + 1 state slots"
            + (f" and {draft_tokens(serving)} draft tokens' copy per request row" if spec_pool else "")
            + f": {ple_bytes:,} B that SGLang's budget does not charge (_handle_max_mamba_cache counts the "
            "GDN state only; mem_cache/ple_state_pool.py allocates it beside the MambaPool)"
        )
    return PoolSizing(
        max_total_num_tokens=tokens,
        max_running_requests=requests,
        pools=pools,
        sglang_config={
            "max_total_num_tokens": tokens,
            "max_running_requests": requests,
            "max_mamba_cache_size": k,
        },
        sglang_estimate_bytes=int(tokens * cell.sglang_bytes_per_token) + split.state_bytes + split.intermediate_bytes,
        notes=notes,
        state_slots=slots,
        state_slots_per_request=split.ratio,
    )


def _pool(
    name: str, kind: str, slots: int, padding: int, per_slot: int, owner: str, *, unit: str, charged: bool = True
) -> PoolSpec:
    """A pool of ``slots`` (+ ``padding``) slots of ``per_slot`` bytes, each one ``unit`` (request, state slot)."""
    return PoolSpec(
        name=name,
        kind=kind,
        slots=slots,
        padding_slots=padding,
        bytes_per_slot=per_slot,
        bytes=(slots + padding) * per_slot,
        sglang_charged=charged,
        owner=owner,
        unit=unit,
    )


def _ring_note(split: MambaSplit, ring: int, slots: int, requests: int, serving: Serving, per_request: bool) -> str:
    length = serving.linear_replayssm_cache_len
    if not serving.enable_linear_replayssm_spec:
        return (
            f"ReplaySSM decode ring (--enable-linear-replayssm, L = {length}): {ring:,} B per state slot x "
            f"({slots} + 1) slots = {ring * (slots + 1):,} B, which SGLang's budget does not charge"
        )
    rows = spec_state_rows(requests, serving) + 1 if per_request else slots + 1
    charged = (
        f"SGLang charges {split.ring_fixed_bytes:,} B (ring x (max_running_requests // DP + 1))"
        if per_request
        else f"SGLang charges it with each of the {split.max_mamba_cache_size} + 1 slots"
    )
    return (
        f"ReplaySSM spec-verify ring (L = {length}) replaces the intermediate SSM state: {ring:,} B per "
        f"{'request row' if per_request else 'state slot'} x {rows} = {ring * rows:,} B; {charged}; the mamba budget "
        f"reserves no intermediate state"
    )


def _ple_pools(ple: PleState, slots: int, spec_rows: int | None, d: int, owner: str) -> list[PoolSpec]:
    """``ShortConvPool`` and ``NGramPool`` (``mem_cache/ple_state_pool.py``): ``slots + 1`` rows each, and with
    speculation ``spec_rows + 1`` rows of ``d`` draft tokens each; uncharged by SGLang's budget."""
    pools = []
    for main, spec, per_slot in (
        (SHORT_CONV_POOL, SHORT_CONV_SPEC_POOL, ple.short_conv_bytes_per_slot),
        (NGRAM_POOL, NGRAM_SPEC_POOL, ple.ngram_bytes_per_slot),
    ):
        if not per_slot:
            continue
        pools.append(_pool(main, "state", slots, 1, per_slot, owner, unit=STATE_SLOT, charged=False))
        if spec_rows is not None:
            pools.append(_pool(spec, "state", spec_rows, 1, d * per_slot, owner, unit=REQUEST, charged=False))
    return pools


def _split_notes(split: MambaSplit, per_slot: int, state_layers: int, serving: Serving) -> list[str]:
    k = split.max_mamba_cache_size
    notes = []
    if split.mamba_budget_bytes is not None:
        notes.append(
            f"mamba budget = {split.rest_gib * GiB:,.0f} B x {serving.mamba_full_memory_ratio} / "
            f"(1 + {serving.mamba_full_memory_ratio}) = {split.mamba_budget_bytes:,.0f} B "
            f"({fmt_gib(split.mamba_budget_bytes)})"
        )
    notes.append(
        f"max_mamba_cache_size = {k} state slots (+1 padding) from {split.source}; "
        f"{per_slot:,} B per slot over this rank's {state_layers} recurrent layer(s)"
        + (
            f", SGLang charges {split.stage_per_req:,} B (the largest stage's share)"
            if split.stage_per_req != per_slot
            else ""
        )
    )
    if split.intermediate_bytes:
        notes.append(
            f"speculative verification keeps {draft_tokens(serving)} draft tokens' state for "
            f"{split.intermediate_requests} request slot(s): {split.intermediate_bytes:,} B charged"
        )
    notes.append(
        f"{split.ratio} state slot(s) per running request ({_ratio_reason(serving)}); "
        f"the KV cache gets {split.kv_budget_bytes:,} B ({fmt_gib(split.kv_budget_bytes)}) under SGLang's split"
    )
    return notes


def _decode_note(k: int, slots: int, requests: int, per_slot: int, serving: Serving) -> str:
    """What a PD decode node's ``HybridMambaDecodeReqToTokenPool`` allocates beyond SGLang's K."""
    extra = serving.decode_extra_slots
    per_request = 1 + ping_pong_size(serving)
    given = "" if serving.disaggregation_decode_extra_slots is not None else " (SGLang's default)"
    need = (requests + extra) * per_request
    node = "PD decode node" if serving.disaggregation_mode == "decode" else "PD role switch (the decode pool shape)"
    head = (
        f"{node}: {requests} running + {extra} pre-allocated request rows{given}; the state pool holds "
        f"max(max_mamba_cache_size {k}, ({requests} + {extra}) x {per_request}) = {slots} slots"
    )
    if slots > k:
        return (
            f"{head}, {slots - k} more than SGLang's budget charged ({(slots - k) * per_slot:,} B uncharged, "
            f"HybridMambaDecodeReqToTokenPool raises mamba_size to {need})"
        )
    return f"{head} (K covers every row)"


def _ratio_reason(serving: Serving) -> str:
    if serving.disable_radix_cache:
        return "radix cache off"
    if serving.radix_cache_disabled:
        return "radix cache off on a PD decode node"
    parts = ["radix cache on"]
    if serving.mamba_skip_decode_lock:
        parts.append("skip-decode-lock")
    if serving.enable_mamba_extra_buffer:
        lazy = " lazy" if serving.enable_mamba_extra_buffer_lazy else ""
        overlap = "no overlap" if serving.disable_overlap_schedule else "overlap"
        parts.append(f"extra{lazy} ping-pong buffer, {overlap}")
    return ", ".join(parts)


def _no_memory_left(
    model: ModelSpec, split: MambaSplit, budget: Budget, exact_fixed: int = 0
) -> InsufficientMemoryError:
    """The state cache leaves nothing for the KV cache (SGLang: ``rest_memory <= 0`` after the carve-out)."""
    state = split.state_bytes + split.intermediate_bytes
    what = (
        f"the state pools ({exact_fixed:,} B with the request tables)"
        if exact_fixed
        else f"the mamba state cache ({split.max_mamba_cache_size} + 1 slots x {split.stage_per_req:,} B"
        + (f" + {split.intermediate_bytes:,} B of speculative state" if split.intermediate_bytes else "")
        + f" = {state:,} B)"
    )
    suggestion = ""
    if budget.free_bytes is not None and budget.pre_model_load_bytes:
        available = (budget.free_bytes - (budget.weights_bytes or 0)) / GiB
        minimum = 1 - available / (budget.pre_model_load_bytes / GiB)
        suggested = math.ceil(minimum * 1000) / 1000
        suggestion = (
            f" Raise --mem-fraction-static above {suggested:.3f} "
            f"(minimum viable = 1 - available/pre = {minimum:.4f}), or"
        )
    return InsufficientMemoryError(
        f"Not enough memory for the KV cache of {model.name}: {what} takes all of the {fmt_gib(budget.budget_bytes)} "
        f"({budget.budget_bytes} B) budget.{suggestion} {raise_budget_advice(budget)}, lower --max-mamba-cache-size or "
        f"--mamba-full-memory-ratio, or use --mamba-ssm-dtype bfloat16."
    )


def _budget_advice(budget: Budget | None) -> str:
    """The advice to raise the budget, naming its own options (no ``--mem-fraction-static`` under ``--memory``)."""
    if budget is None:
        return "raise --memory or --mem-fraction-static"
    advice = raise_budget_advice(budget)
    return advice[0].lower() + advice[1:]
