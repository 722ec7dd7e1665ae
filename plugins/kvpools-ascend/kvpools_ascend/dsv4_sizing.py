"""DeepSeek-V4 on Ascend NPUs: SGLang's configurator as it runs on an NPU (``--accounting sglang``) and the exact solve.

The counts are ``DSV4PoolConfigurator``'s (``model_executor/pool_configurator.py`` of SGLang 0.5.23) at the NPU's
page and unpadded row; the pools are :mod:`kvpools_ascend.dsv4`'s buffers for those counts.
"""

from __future__ import annotations

import attrs

from kvpools_ascend.dsv4 import (
    C4_TOKENS,
    C128_PAGE_OPTION,
    C128_TOKENS,
    FULL,
    INDEX_ROW_EXTRA,
    SGLANG_ACCOUNTINGS,
    STATE_BYTES,
    SWA_TOKENS,
    c128_page_size,
    npu_dsv4_pool_bytes,
    npu_dsv4_pool_specs,
    on_npu_dsv4,
    ring_size,
)
from kvpools_ascend.names import PLATFORM
from kvpools_core import hookimpl
from kvpools_core.errors import InsufficientMemoryError
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.sizing import (
    apply_token_cap,
    fmt_gib,
    largest_fitting_tokens,
    not_enough_memory,
    page_align,
    resolve_max_num_reqs,
    sliding_window_terms,
)
from kvpools_core.values import Budget, CellSize, ModelSpec, PoolSizing, Serving

__all__ = ["NPUConfigurator", "npu_configurator", "size_npu_dsv4"]


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
        token_space_sizing={SWA_TOKENS: swa_pool_note(cfg, sizes)},
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


def swa_pool_note(cfg: NPUConfigurator, sizes: dict[str, int]) -> str:
    """How the SWA pool was sized (``PoolSizing.token_space_sizing["swa"]``, and the first sub-pool note)."""
    full, swa = sizes["full_max_total_num_tokens"], sizes["swa_max_total_num_tokens"]
    return (
        f"SWA pool: int({full:,} full tokens x {option('swa_full_tokens_ratio')} {cfg.swa_ratio}) page aligned = "
        f"{swa:,} tokens, for all {cfg.num_layers} layer(s) of this stage."
    )


def sub_pool_notes(cfg: NPUConfigurator, sizes: dict[str, int], requests: int) -> list[str]:
    swa = sizes["swa_max_total_num_tokens"]
    notes = [swa_pool_note(cfg, sizes)]
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
