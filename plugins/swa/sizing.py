"""Two token spaces from one budget: SGLang's ``HybridSWAPoolConfigurator`` / ``SWAChunkCapPoolConfigurator``.

A hybrid model keeps a full pool (every token of every request, full
layers) and an SWA pool (only the window, sliding layers); every token holds
a slot in both until it slides out of the window.  SGLang's semantics:

* **ratio** (default): bytes per full token = full × (full layers + draft
  layers) + ``swa_full_tokens_ratio`` × swa × SWA layers; full tokens =
  budget // that, page aligned; SWA tokens = ``int(full × ratio)``, page aligned.
* **all-SWA** (no full layer): one SWA pool; tokens = budget // (swa × SWA
  layers + full × draft layers); the ratio does not apply.
* **chunk cap** (explicit ``--max-running-requests``, radix cache off,
  chunked prefill on, full layers present): the SWA pool holds each
  request's worst case — window + eviction interval × draft tokens + page,
  plus the decode allocation of the speculative mode — for every request,
  plus the chunks in flight (on a decode node: the pre-allocated slots); the
  rest of the budget goes to the full pool.

``--accounting sglang`` reproduces those numbers.  ``--accounting exact``
keeps the semantics (the ratio, the cap) and finds the most full tokens
whose whole plan — both pools with their padding pages, the draft pool, the
full→SWA index mapping, the request table and both allocators' free lists —
fits the budget; under the chunk cap it never gives the SWA pool more slots
than the full pool (an SWA slot always belongs to a live full slot).
"""

from __future__ import annotations

import attrs

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import InsufficientMemoryError
from kvpools_core.options import option
from kvpools_core.parts.indexer import INDEX_POOL
from kvpools_core.parts.names import DRAFT_KV_POOL
from kvpools_core.parts.sizing import (
    SWA_MAPPING_ITEM_BYTES,
    SWA_MAPPING_POOL,
    RequestLimit,
    allocator_pool,
    apply_token_cap,
    fmt_gib,
    largest_fitting_tokens,
    not_enough_memory,
    page_align,
    raise_budget_advice,
    request_pools,
    resolve_max_num_reqs,
    sglang_tokens,
    sliding_window_terms,
    swa_mapping_pool,
    token_pool,
)
from kvpools_core.parts.sizing import spec_decode_alloc_len_per_request as spec_decode_alloc_len_per_request
from kvpools_core.values import (
    FULL_TOKENS,
    Budget,
    CellSize,
    LayerSpec,
    ModelSpec,
    PoolSizing,
    PoolSpec,
    Serving,
    TokenWindow,
)

from .config import FULL, SLIDING, sglang_serves_hybrid_swa
from .mla import is_latent, latent_bytes_per_layer

FULL_POOL = "kv_full"
SWA_POOL = "kv_swa"
DRAFT_POOL = DRAFT_KV_POOL
MAPPING_POOL = SWA_MAPPING_POOL
SWA_ALLOCATOR = "swa_allocator"
MAPPING_ITEM_BYTES = SWA_MAPPING_ITEM_BYTES
SWA_TOKENS = "swa"
"""The token space of the sliding-window pool: tokens inside the window (``swa_max_total_num_tokens``)."""
SGLANG_DRAFT_ALGORITHMS = frozenset({"EAGLE", "EAGLE3", "STANDALONE", "NEXTN"})
"""Drafts SGLang's SWA configurator budgets into the full term (``is_eagle() or is_standalone()``)."""
DRAFT_KV_ALGORITHMS = SGLANG_DRAFT_ALGORITHMS | {"DFLASH", "DSPARK"}
"""Drafts whose worker allocates a KV pool of max_total_num_tokens (NGRAM writes none)."""
OWNER = "swa"


@attrs.frozen
class SGLangShape:
    """The numbers SGLang's SWA configurator reads: per-layer bytes per token, layer counts, the ratio.

    Layer counts are the whole model's (SGLang's configurator does not look
    at the pipeline stage); heads are per attention-TP rank, ``max(1, heads // tp)``.
    """

    full_per_token: int
    swa_per_token: int
    num_full: int
    num_swa: int
    num_draft: int
    ratio: float

    @property
    def hybrid(self) -> bool:
        return self.num_full > 0

    @property
    def cell(self) -> float:
        """``_cell_size``: bytes per ``max_total_num_tokens`` token, SGLang's float arithmetic."""
        if not self.hybrid:
            return float(self.swa_per_token * self.num_swa + self.full_per_token * self.num_draft)
        return self.full_per_token * (self.num_full + self.num_draft) + self.ratio * self.swa_per_token * self.num_swa

    @property
    def full_cell(self) -> int:
        """Bytes per full token of the full term alone (the chunk cap's divisor)."""
        return self.full_per_token * (self.num_full + self.num_draft)

    def estimate(self, full_tokens: int, swa_tokens: int) -> int:
        """What SGLang's coefficients charge for pools of these sizes."""
        if not self.hybrid:
            return swa_tokens * (self.swa_per_token * self.num_swa + self.full_per_token * self.num_draft)
        return full_tokens * self.full_cell + swa_tokens * self.swa_per_token * self.num_swa


@attrs.frozen
class ChunkCap:
    """SGLang's ``SWAChunkCapPoolConfigurator._swa_cap``: ``requests`` worst cases, the chunks in flight, the reserve.

    ``terms`` are the window terms the plan records (:func:`token_window`), so
    the cap the pool is sized by and the worst case capacity answers invert
    are one figure.
    """

    terms: TokenWindow
    requests: int

    @property
    def per_request(self) -> int:
        return self.terms.per_request

    @property
    def tail(self) -> int:
        """``chunks_in_flight x chunked_prefill_size + page``, or a decode node's ``(window + page) x extra slots``."""
        return self.terms.prefills_in_flight * (self.terms.prefill_chunk or 0) + self.terms.reserved

    @property
    def tokens(self) -> int:
        return self.per_request * self.requests + self.tail

    @property
    def aligned(self) -> int:
        return -(-self.tokens // self.terms.page_size) * self.terms.page_size

    def describe(self) -> str:
        t = self.terms
        if t.prefills_in_flight:
            what = f"{t.prefills_in_flight} chunk(s) in flight x {t.prefill_chunk} + page {t.page_size}"
        else:
            extra = t.reserved // (t.window + t.page_size)
            what = f"{extra} pre-allocated decode slot(s) x (window {t.window} + page {t.page_size})"
        return (
            f"{self.requests} request(s) x (window {t.window} + eviction interval {t.eviction_interval} x "
            f"{t.draft_tokens} draft token(s) + page {t.page_size} + decode {t.decode_alloc}) + "
            f"{what} (= {self.tail:,}) = {self.tokens:,} tokens"
        )


def draft_layer(model: ModelSpec) -> LayerSpec:
    """The geometry of one draft-model layer: a full layer of the target (SGLang's assumption), else its SWA layer."""
    return next((layer for layer in model.layers if layer.kind == FULL), model.layers[0])


def draft_num_layers(serving: Serving) -> int:
    """Draft layers whose KV the draft worker allocates (0 without draft KV)."""
    if serving.speculative_algorithm not in DRAFT_KV_ALGORITHMS:
        return 0
    return serving.speculative_draft_num_layers or 0


def sglang_shape(model: ModelSpec, serving: Serving) -> SGLangShape:
    """SGLang's coefficients for this model and serving (whole-model layer counts).

    A hybrid MLA-SWA model gets the latent rows it stores per layer instead:
    SGLang's own coefficients for it are not established (``--accounting
    sglang`` is refused), so its "SGLang estimate" is the KV rows without padding.
    """
    e = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype).element_bytes
    tp = serving.attn_tp_size
    full = [layer for layer in model.layers if layer.kind == FULL]
    swa = [layer for layer in model.layers if layer.kind == SLIDING]

    def per_token(layer: LayerSpec) -> int:
        return max(1, layer.num_kv_heads // tp) * (layer.head_dim + layer.v_head_dim) * e

    if is_latent(model):
        full_per_token, swa_per_token = latent_bytes_per_layer(model, serving)
    else:
        full_per_token, swa_per_token = per_token(draft_layer(model)), per_token(swa[0]) if swa else 0
    drafts = serving.speculative_draft_num_layers or 0
    return SGLangShape(
        full_per_token=full_per_token,
        swa_per_token=swa_per_token,
        num_full=len(full),
        num_swa=len(swa),
        num_draft=drafts if serving.speculative_algorithm in SGLANG_DRAFT_ALGORITHMS else 0,
        ratio=serving.swa_full_tokens_ratio,
    )


def token_window(model: ModelSpec, serving: Serving) -> TokenWindow:
    """The worst-case window terms of the ``"swa"`` token space, as ``SWAChunkCapPoolConfigurator.__init__`` adds
    them up (``002_50706b73e02ffb67.txt`` lines 425-458; the core's :func:`sliding_window_terms`, shared with
    DeepSeek-V4's SWA space).

    Every SWA plan records these terms, whether or not the chunk cap sizes its
    pool: they describe the engine's eviction, not the pool's split.
    """
    return sliding_window_terms(SWA_TOKENS, int(model.params["sliding_window"]), serving)


def chunk_cap(model: ModelSpec, serving: Serving) -> ChunkCap | None:
    """The SWA cap when ``SWAChunkCapPoolConfigurator.is_applicable`` (lines 461-473); None otherwise.

    The radix cache is off as the server resolves it (:attr:`Serving.radix_cache_disabled`): a PD decode node
    runs without it, so its explicit ``--max-running-requests`` turns the cap on.
    """
    if (
        serving.max_running_requests is None
        or not serving.radix_cache_disabled
        or serving.chunked_prefill_size is None
        or not any(layer.kind == FULL for layer in model.layers)
    ):
        return None
    return ChunkCap(terms=token_window(model, serving), requests=serving.max_running_requests // serving.attn_dp_size)


def size_swa_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing:
    """The ``size_pools`` answer for a sliding-window model (both accounting modes)."""
    shape = sglang_shape(model, serving)
    cap = chunk_cap(model, serving)
    page = serving.page_size
    context_len = serving.context_length or model.context_len
    exact = serving.accounting == "exact"
    per_token = cell.pool_bytes_per_token()
    extra_slots = cell.pool_extra_slots()
    notes: list[str] = []

    def split(tokens: int, constrained: bool) -> tuple[int, int]:
        """(full, SWA) tokens for ``max_total_num_tokens`` = tokens.

        SGLang's ``_solve_pool_sizes``; under the chunk cap the profiling path
        keeps the capped SWA pool and the constraint path caps it at ``tokens``
        (unaligned, as SGLang); the exact plan keeps it within the full pool.
        """
        if not shape.hybrid:
            return 0, page_align(tokens, page)
        full = page_align(tokens, page)
        if cap is None:
            return full, page_align(int(full * shape.ratio), page)
        if exact:
            return full, min(cap.aligned, full)
        return full, min(cap.aligned, tokens) if constrained else cap.aligned

    def layout(tokens: int, constrained: bool = False) -> tuple[list[PoolSpec], RequestLimit, int, int]:
        full, swa = split(tokens, constrained)
        total = full if shape.hybrid else swa
        limit = resolve_max_num_reqs(total, context_len, serving)
        return (
            _pools(per_token, extra_slots, shape, full, swa, total, limit.max_running_requests, context_len, serving),
            limit,
            full,
            swa,
        )

    if exact:
        sized_by_total = [name for name in per_token if name != (SWA_POOL if shape.hybrid else FULL_POOL)]
        per_total_token = sum(per_token[name] for name in sized_by_total) + (MAPPING_ITEM_BYTES if shape.hybrid else 0)
        upper = budget.budget_bytes // max(1, per_total_token)
        profiled = largest_fitting_tokens(budget.budget_bytes, page, upper, lambda t: _cost(layout(t)[0]))
    elif cap is not None:
        fixed = cap.aligned * shape.swa_per_token * shape.num_swa
        profiled = (budget.budget_bytes - fixed) // shape.full_cell // page * page
        if profiled <= 0:
            raise _cap_error(cap, fixed, budget)
    else:
        profiled = sglang_tokens(budget.budget_bytes, shape.cell, page)
    tokens, cap_note = apply_token_cap(profiled, serving.max_total_tokens)
    if cap_note:
        notes.append(cap_note)
    constrained = tokens != profiled
    full, swa = split(tokens, constrained)
    total = full if shape.hybrid else swa
    if total <= 0:
        raise not_enough_memory(model, serving, cell, budget)
    if page_align(swa, page) <= 0:
        raise InsufficientMemoryError(
            f"The SWA pool of {model.name} would get {swa} tokens, less than one page of {page}: "
            f"int({full} full tokens x {option('swa_full_tokens_ratio')} {shape.ratio}) rounds to nothing. "
            f"Raise {option('memory')} or {option('swa_full_tokens_ratio')}, or lower {option('page_size')}."
        )
    pools, limit, _, _ = layout(tokens, constrained)
    if limit.note:
        notes.append(limit.note)
    if limit.max_running_requests <= 0:
        raise InsufficientMemoryError(
            f"{total} KV tokens leave room for no request (a request needs at least 2 tokens). "
            f"Raise {option('memory')} or lower {option('page_size')}."
        )
    sized_by = split_note(shape, cap, pools, full, swa, page)
    notes.append(sized_by)
    if serving.accounting == "sglang" and not sglang_serves_hybrid_swa(model)[0]:
        # hybrid MLA-SWA only (the swa plugin sizes the others as SGLang's dense pool under --accounting sglang)
        notes.append(
            f"SGLang 0.5.23 does not serve {model.name} with hybrid SWA pools ({sglang_serves_hybrid_swa(model)[1]}); "
            f"these numbers are SGLang's HybridSWAPoolConfigurator applied to its layer pattern."
        )
    return PoolSizing(
        max_total_num_tokens=total,
        max_running_requests=limit.max_running_requests,
        pools=pools,
        sglang_config={
            "max_total_num_tokens": total,
            "max_running_requests": limit.max_running_requests,
            "full_max_total_num_tokens": full,
            "swa_max_total_num_tokens": swa,
        },
        sglang_estimate_bytes=shape.estimate(full, swa),
        notes=notes,
        token_counts={FULL_TOKENS: full, SWA_TOKENS: swa} if shape.hybrid else {SWA_TOKENS: swa},
        windows=(token_window(model, serving),),
        token_space_sizing={SWA_TOKENS: sized_by},
    )


def split_note(shape: SGLangShape, cap: ChunkCap | None, pools: list[PoolSpec], full: int, swa: int, page: int) -> str:
    """How the budget was split between the pools (the report prints it)."""
    by_name = {p.name: p for p in pools}
    swa_pool = by_name[SWA_POOL]
    if not shape.hybrid:
        return (
            f"all {shape.num_swa} layers slide: one SWA pool of {swa:,} tokens "
            f"({swa_pool.bytes_per_slot:,} B/token, {fmt_gib(swa_pool.bytes)}); {option('swa_full_tokens_ratio')} "
            f"does not apply."
        )
    full_pool = by_name[FULL_POOL]
    kv = full_pool.bytes + swa_pool.bytes
    share = (
        f"full pool {full:,} tokens x {full_pool.bytes_per_slot:,} B ({shape.num_full} full layer(s)) = "
        f"{fmt_gib(full_pool.bytes)} ({_pct(full_pool.bytes, kv)} of the KV bytes); SWA pool {swa:,} tokens x "
        f"{swa_pool.bytes_per_slot:,} B ({shape.num_swa} SWA layer(s)) = {fmt_gib(swa_pool.bytes)} "
        f"({_pct(swa_pool.bytes, kv)})"
    )
    if cap is not None:
        return (
            f"SWA chunk cap (explicit {option('max_running_requests')}, radix cache off, chunked prefill): the SWA "
            f"pool holds "
            f"{cap.describe()}, page aligned {cap.aligned:,}; the rest of the budget goes to the full pool: {share}."
        )
    return (
        f"{option('swa_full_tokens_ratio')} {shape.ratio} split the budget: SWA tokens = int(full x {shape.ratio}) "
        f"page aligned "
        f"(page {page}); {share}."
    )


def _token_pool(
    name: str, tokens: int, page: int, bytes_per_token: int, charged: bool, extra: int, space: str
) -> PoolSpec:
    return token_pool(name, tokens, page, bytes_per_token, OWNER, extra_slots=extra, token_space=space, charged=charged)


def _pools(
    per_token: dict[str, int],
    extra_slots: dict[str, int],
    shape: SGLangShape,
    full: int,
    swa: int,
    total: int,
    requests: int,
    context_len: int,
    serving: Serving,
) -> list[PoolSpec]:
    """Every allocation of the plan: KV pools, the mapping, the request table, the allocators' free lists.

    A DSA full layer's indexer keys (``indexer``) have one slot per full token, paged with SGLang's extra slot.
    The window pool and its allocator scale with SWA tokens, every other token pool with the
    ``max_total_num_tokens`` tokens: full tokens, or SWA tokens when no layer is full.
    """
    page = serving.page_size
    total_space = FULL_TOKENS if shape.hybrid else SWA_TOKENS
    pools = []
    for name, bytes_per_token in per_token.items():
        slots, space = {FULL_POOL: (full, FULL_TOKENS), SWA_POOL: (swa, SWA_TOKENS)}.get(name, (total, total_space))
        charged = name in (FULL_POOL, SWA_POOL, INDEX_POOL) or (name == DRAFT_POOL and shape.num_draft > 0)
        pools.append(_token_pool(name, slots, page, bytes_per_token, charged, extra_slots.get(name, 0), space))
    if shape.hybrid:
        pools.append(swa_mapping_pool(full, page, OWNER))
    pools += request_pools(requests, context_len, serving)
    swa_pages = page_align(swa, page)  # SGLang's allocator pages the pool: size // page_size
    if shape.hybrid:
        pools.append(allocator_pool(full, page))
        if swa_pages:
            pools.append(allocator_pool(swa_pages, page, token_space=SWA_TOKENS, name=SWA_ALLOCATOR, owner=OWNER))
    elif swa_pages:
        pools.append(allocator_pool(swa_pages, page, token_space=SWA_TOKENS))
    return pools


def _cap_error(cap: ChunkCap, fixed_bytes: int, budget: Budget) -> InsufficientMemoryError:
    advice = raise_budget_advice(budget)
    return InsufficientMemoryError(
        f"SWA pool cap ({cap.aligned} tokens, {fixed_bytes / (1 << 30):.2f} GiB) leaves no room for the full KV pool "
        f"within the available {budget.budget_bytes / (1 << 30):.2f} GiB (the cap is {cap.describe()}). "
        f"Lower {option('max_running_requests')} or {option('swa_eviction_interval')}, "
        f"or {advice[0].lower()}{advice[1:]}."
    )


def _cost(pools: list[PoolSpec]) -> int:
    return sum(p.bytes for p in pools)


def _pct(part: int, whole: int) -> str:
    return f"{part / whole * 100:.1f} %" if whole else "-"
