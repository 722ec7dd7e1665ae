"""DeepSeek-V4's pools from one budget: SGLang's ``DSV4PoolConfigurator``, and kvpools' exact solve.

DeepSeek-V4 keeps six token-indexed stores per stage, all sized from one
count, the full tokens ``F`` (``max_total_num_tokens``):

* the SWA KV of every layer: ``int(F x swa_full_tokens_ratio)`` page aligned;
* the c4 compressed KV (one row per 4 tokens) and its lightning-indexer keys:
  ``F // (4 x HiSparse host_to_device_ratio)``;
* the c128 compressed KV: ``F // 128``;
* the c4 compressor states (KV and indexer): ``swa // window x c4 ring``;
* the c128 compressor state, per request slot: ``(requests + 1 [+ decode
  extra slots]) x c128 ring`` (online c128: one slot per request).

SGLang's configurator (``--accounting sglang``, reproduced token-exactly)
divides the budget, less the c128 state's fixed bytes, by its bytes per full
token (:meth:`DSV4Shape.bytes_per_full_token`) and derives the rest.
``--accounting exact`` (the default) keeps those derivations and finds the
most page-aligned full tokens whose *whole* plan — every pool ``build``
allocates for those sizes (:func:`kvpools_plugins.dsv4.buffers.pool_specs`) —
fits the budget.

Beside the counts, the plan records what a request holds of each token space, for ``kvpools capacity``:
the ``"c4"`` / ``"c128"`` ratios (:func:`compression`: rows indexed by full slot) and the ``"swa"``
space's worst-case window terms (the core's ``sliding_window_terms`` with ``window_size``).  SGLang
evicts DeepSeek-V4's SWA rows as any hybrid-SWA model's: ``is_hybrid_swa_model`` lists
``DeepseekV4ForCausalLM`` (``configs/model_config.py``), ``create_memory_pool_configurator`` picks
``DSV4PoolConfigurator`` only when ``mr.is_hybrid_swa`` (``002_50706b73e02ffb67.txt`` lines 789-790),
the scheduler's ``sliding_window_size`` is the config's ``sliding_window`` / ``window_size``
(``ModelConfig._get_sliding_window_size``), and ``ScheduleBatch.maybe_evict_swa`` frees a running
request's out-of-window SWA pages for every tree cache that ``supports_swa()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from kvpools_core.errors import InsufficientMemoryError, UnsupportedCombinationError
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
from kvpools_core.values import (
    FULL_TOKENS,
    STATE_SLOT,
    Budget,
    CellPart,
    CellSize,
    ModelSpec,
    PoolSizing,
    PoolSpec,
    Serving,
    parse_hisparse_config,
)

from .buffers import DSV4Sizes, SizeStep, pool_bytes_probe, pool_specs
from .config import C4, C128
from .encoder_replay import encoder_replay_problems, replay_notes, replay_on, request_window_bytes
from .hisparse import dsv4_hisparse_problems
from .host import host_problems
from .layouts import auto_layout_note, uniform_fp8
from .memo import last_pair, per_model
from .speculative import online_mtp_draft_tokens
from .swa_req_ring import ring_capacity, ring_notes
from .trtllm import backend_notes
from .unified import platform_plans_layout, platform_pool_layout, unified_notes, unified_problems
from .v41_budget import (
    V41Budget,
    v41_architecture_problems,
    v41_budget,
    v41_swa_cap_tokens,
    v41_swa_ratio,
)

OWNER = "dsv4"
SWA_TOKENS, C4_TOKENS, C128_TOKENS = "swa", "c4", "c128"
"""Token spaces of the sub-pools beside ``"full"``: SWA tokens, c4 rows, c128 rows."""
QUANT_BLOCK = 128
"""The indexer's fp8 quantisation block: one fp32 scale per 128 values."""
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "NEXTN"})
"""Drafts SGLang's ``spec_algorithm.is_eagle()`` accepts (NEXTN is EAGLE's alias)."""
SGLANG_PAGE_MESSAGE = "page_size must be multiple of 128 for compressed attention"
SGLANG_BUILD_PAGE_MESSAGE = "In paged swa mode, page_size must be 256."
SGLANG_BF16_ONLINE_MESSAGE = (
    "SGLANG_DSV4_COMPRESS_STATE_DTYPE=bf16 is not supported when SGLANG_OPT_USE_ONLINE_COMPRESS=1; "
    "online c128 state must stay float32."
)
SGLANG_ONLINE_MTP_MESSAGE = (
    "SGLANG_OPT_USE_ONLINE_COMPRESS does not support speculative decode (MTP) yet, except the experimental "
    "EAGLE topk=1 path gated by SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=1"
)
STATE_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


def ring_size(ratio: int, serving: Serving) -> int:
    """``get_compress_state_ring_size``: c4 8 (16 speculative); c128 128 (256 speculative), online c128 1."""
    if ratio == 128 and serving.enable_online_compress:
        return 1
    if ratio == 4:
        return 16 if serving.speculative else 8
    return 256 if serving.speculative else 128


def hisparse_shrink(serving: Serving) -> int:
    """The c4 pool's HiSparse shrink: ``host_to_device_ratio`` (SGLang's default 2) when HiSparse is on, else 1."""
    if not serving.enable_hisparse:
        return 1
    return int(parse_hisparse_config(serving.hisparse_config).get("host_to_device_ratio", 2))


@attrs.frozen
class DSV4Shape:
    """What SGLang's ``DSV4PoolConfigurator`` reads, for one pipeline stage (``compress_ratios[start:end]``)."""

    qk_nope_head_dim: int
    qk_rope_head_dim: int
    index_head_dim: int
    window: int
    """The SWA page (``window_size``), the c4 state ratio's divisor."""
    num_layers: int
    num_c4: int
    num_c128: int
    swa_ratio: float
    speculative: bool
    draft_tokens: int
    """``max_speculative_num_draft_tokens or 0``: online c128's MTP banks."""
    online: bool
    state_bytes: int
    """Bytes of one c4 / c128 compressor-state element (float32 4, bfloat16 2)."""
    c4_ring: int
    c128_ring: int
    shrink: int
    context_len: int
    requested_per_worker: int | None
    decode_extra_slots: int | None
    """``Serving.decode_extra_slots`` on a decode node (SGLang's default when unset), else None."""
    uniform_fp8: bool = False
    """``--dsv4-attn-backend trtllm``: the configurator charges ``attn_head_dim`` a row (.trtllm)."""
    v41: V41Budget | None = None
    """SGLang 0.5.23's budget for a DeepSeek-V4.1 stage (ratios 1 / 2, :mod:`.v41_budget`); ``None``: ref-002's."""
    replay: bool = False
    """``--enable-encoder-swa-bounded-replay`` (0.5.23: no SWA bytes per token, no draft inflation)."""
    swa_cap: int | None = None
    """0.5.23's SWA cap mode on a V4.1 stage (:func:`.v41_budget.v41_swa_cap_tokens`): the SWA pool's slots."""
    _bytes_per_full_token: float | None = attrs.field(init=False, eq=False, repr=False)

    @property
    def kv_bytes(self) -> int:
        """One SWA / c4 / c128 row per layer: nope fp8 + rope bf16 + 8 B of scales (SGLang's figure); under
        ``--dsv4-attn-backend trtllm`` the uniform e4m3 row, ``attn_head_dim`` (``kv_bytes = self.attn_head_dim``)."""
        if self.uniform_fp8:
            return self.attn_head_dim
        return self.qk_nope_head_dim + self.qk_rope_head_dim * 2 + 8

    @property
    def indexer_bytes(self) -> int:
        """One c4 indexer key per layer: fp8 values + one fp32 scale per 128 (132 B at 128 dims)."""
        return self.index_head_dim + self.index_head_dim // QUANT_BLOCK * 4

    @property
    def attn_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def c4_state_bytes(self) -> int:
        return 2 * 2 * self.attn_head_dim * self.state_bytes

    @property
    def c4_indexer_state_bytes(self) -> int:
        return 2 * 2 * self.index_head_dim * self.state_bytes

    @property
    def c128_state_bytes(self) -> int:
        return (3 if self.online else 2 * 1) * self.attn_head_dim * self.state_bytes

    @property
    def raw_bytes_per_full_token(self) -> float:
        """``_get_bytes_per_full_token``, in SGLang's float operations and order."""
        if self.v41 is not None:
            return self.v41.bytes_per_full_token(self, self.replay)
        c4_state_ratio = self.c4_ring / self.window
        c128_state_ratio = 0
        c4_frac = 1 / (4 * self.shrink)
        return (
            self.swa_ratio * self.kv_bytes * self.num_layers
            + c4_frac * self.kv_bytes * self.num_c4
            + 1 / 128 * self.kv_bytes * self.num_c128
            + 1 / 4 * self.indexer_bytes * self.num_c4
            + self.swa_ratio * c4_state_ratio * self.c4_state_bytes * self.num_c4
            + c128_state_ratio * self.c128_state_bytes * self.num_c128
            + self.swa_ratio * c4_state_ratio * self.c4_indexer_state_bytes * self.num_c4
        )

    @property
    def bytes_per_full_token(self) -> float:
        """SGLang's coefficient: the raw figure, times ``(T + 1) / T`` when a draft worker is reserved (read
        several times per plan: computed once, when the frozen shape is built)."""
        value = self._bytes_per_full_token
        return self._coefficient() if value is None else value

    def __attrs_post_init__(self) -> None:
        try:
            value: float | None = self._coefficient()
        except ZeroDivisionError:  # a shape of no layers or window: raised where the figure is read, as ever
            value = None
        object.__setattr__(self, "_bytes_per_full_token", value)

    def _coefficient(self) -> float:
        value = self.raw_bytes_per_full_token
        if self.speculative and not (self.v41 is not None and self.replay):
            draft_layers = 1
            value *= (self.num_layers + draft_layers) / self.num_layers
        return value

    def req_slots(self, max_running_requests: int) -> int:
        """``_get_num_req_slots``: requests + 1 padding row (+ a decode node's pre-allocated slots)."""
        if self.decode_extra_slots is not None:
            return max_running_requests + self.decode_extra_slots + 1
        return max_running_requests + 1

    def c128_state_pool_size(self, max_running_requests: int) -> int:
        """``finalize_with_max_running_requests``: request slots x ring (online: one per slot)."""
        slots = self.req_slots(max_running_requests)
        return slots if self.online else slots * self.c128_ring

    def c128_state_fixed_bytes(self, max_running_requests: int) -> int:
        """``_get_c128_state_fixed_bytes``: what SGLang sets aside for the c128 state before the tokens."""
        if self.num_c128 == 0:
            return 0
        slots = self.req_slots(max_running_requests)
        if self.online:
            rows = (slots + self.c128_ring + 1) * (1 + self.draft_tokens)
            last = 3 * self.attn_head_dim
        else:
            rows = -(-(slots * self.c128_ring + self.c128_ring + 1) // 128) * 128
            last = 2 * self.attn_head_dim
        return rows * last * self.state_bytes * self.num_c128

    def c2_state_fixed_bytes(self, max_running_requests: int) -> int:
        """``_get_c2_state_fixed_bytes`` (0.5.23; 0 but on a DeepSeek-V4.1 stage with ratio-2 sources)."""
        if self.v41 is None:
            return 0
        return self.v41.c2_state_fixed_bytes(self.req_slots(max_running_requests), self.attn_head_dim)

    def fixed_state_bytes(self, max_running_requests: int) -> int:
        """The request-slot state set aside before the tokens: the c128 state, and the ratio-2 pair state."""
        return self.c128_state_fixed_bytes(max_running_requests) + self.c2_state_fixed_bytes(max_running_requests)

    def estimated_requests(self, token_capacity: int) -> int:
        """``_get_c128_state_fixed_bytes_for_token_capacity``'s request estimate."""
        estimated = max(min(int(token_capacity / self.context_len * 512), 4096), 2048)
        return min(estimated, token_capacity // 2)

    def sizes(self, full_token: int, page: int) -> dict[str, int]:
        """``_compute_dsv4_sizes`` (``c128_state_pool_size`` is set once requests are known)."""
        full = full_token // page * page
        swa = self.swa_tokens(full, page)
        return {
            "full_max_total_num_tokens": full,
            "swa_max_total_num_tokens": swa,
            "c4_max_total_num_tokens": full // (4 * self.shrink),
            "c128_max_total_num_tokens": full // 128,
            "c4_state_pool_size": swa // self._c4_state_divisor(page) * self._c4_state_ring,
            "c128_state_pool_size": 0,
        }

    def swa_tokens(self, full: int, page: int) -> int:
        """The SWA pool's tokens for ``full`` (page-aligned) full tokens: the ratio's share page aligned, or the cap."""
        return int(full * self.swa_ratio) // page * page if self.swa_cap is None else self.swa_cap

    def steps(self, page: int) -> tuple[SizeStep, SizeStep] | None:
        """How :meth:`sizes` grows with one page of full tokens (the SWA tokens held) and with one page of SWA
        tokens: a fixed step of each size, or None where a size is not linear in those pages (a floor that does
        not divide the page: HiSparse's shrink, a state divisor that is not a divisor of the page)."""
        divisor = self._c4_state_divisor(page)
        if page % (4 * self.shrink) or page % 128 or page % divisor:
            return None
        full = SizeStep(full_tokens=page, c4_tokens=page // (4 * self.shrink), c128_tokens=page // 128)
        swa = SizeStep(swa_tokens=page, c4_state_size=page // divisor * self._c4_state_ring)
        return full, swa

    def _c4_state_divisor(self, page: int) -> int:
        # 0.5.23 addresses the c4 state ring per SWA page; ref-002 (V4) per window
        return page if self.v41 is not None else self.window

    @property
    def _c4_state_ring(self) -> int:
        return self.c4_ring if self.num_c4 or self.v41 is None else 0


@last_pair
def dsv4_shape(model: ModelSpec, serving: Serving) -> DSV4Shape:
    start, end = rank_layer_range(model, serving)
    first = model.layers[0].params
    requested = serving.max_running_requests
    num_c4, num_c128 = _compressed_layers(model, start, end)
    return DSV4Shape(
        qk_nope_head_dim=int(first["qk_nope_head_dim"]),
        qk_rope_head_dim=int(first["qk_rope_head_dim"]),
        index_head_dim=int(model.params.get("index_head_dim", 0)),
        window=int(first["window_size"]),
        num_layers=len(model.layers[start:end]),
        num_c4=num_c4,
        num_c128=num_c128,
        # encoder replay without paged draft layers sets the ratio to 0 (pool_configurator.py lines 1242-1243)
        swa_ratio=0 if replay_on(serving) else v41_swa_ratio(model, serving),
        speculative=serving.speculative,
        draft_tokens=online_mtp_draft_tokens(serving),
        online=serving.enable_online_compress,
        state_bytes=STATE_DTYPE_BYTES[serving.dsv4_compress_state_dtype],
        c4_ring=ring_size(4, serving),
        c128_ring=ring_size(128, serving),
        shrink=hisparse_shrink(serving),
        context_len=serving.context_length or model.context_len,
        requested_per_worker=None if requested is None else requested // serving.attn_dp_size,
        decode_extra_slots=serving.decode_extra_slots if serving.disaggregation_mode == "decode" else None,
        uniform_fp8=uniform_fp8(serving),
        v41=v41_budget(model, serving, _kv_bytes(first, serving)),
        replay=replay_on(serving),
        swa_cap=v41_swa_cap_tokens(model, serving, int(first["window_size"])),
    )


@per_model
def _compressed_layers(model: ModelSpec, start: int, end: int) -> tuple[int, int]:
    """The c4 and c128 layers of the stage ``[start, end)``."""
    kinds = [layer.kind for layer in model.layers[start:end]]
    return kinds.count(C4), kinds.count(C128)


def _kv_bytes(params: Any, serving: Serving) -> int:
    """``kv_bytes`` as :attr:`DSV4Shape.kv_bytes` reads it (before the shape exists)."""
    nope, rope = int(params["qk_nope_head_dim"]), int(params["qk_rope_head_dim"])
    return nope + rope if uniform_fp8(serving) else nope + rope * 2 + 8


# ---------------------------------------------------------------------------
# validate
# ---------------------------------------------------------------------------


def dsv4_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang refuses for a DeepSeek-V4 model (and what kvpools' build cannot hold), before sizing."""
    o = option
    problems = []
    page = serving.page_size
    problems += host_problems(serving)
    problems += encoder_replay_problems(model, serving)
    problems += v41_architecture_problems(model, serving)
    if serving.dcp_size > 1 and serving.speculative and serving.speculative_algorithm != "NGRAM":
        problems.append(
            f"{o('dcp_size')} {serving.dcp_size} with {o('speculative_algorithm')} {serving.speculative_algorithm}: "
            f"SGLang's DeepSeek-V4 draft worker then sizes its SWA pool over {serving.dcp_size} x the full and "
            f"SWA token counts in pages of {serving.dcp_size} x {o('page_size')} (loc_space_scale), which kvpools' "
            f"DeepSeek-V4 pools do not model. Use {o('dcp_size')} 1 or drop the speculative decoding."
        )
    if page % 128:
        problems.append(
            f"{o('page_size')} {page}: SGLang asserts '{SGLANG_PAGE_MESSAGE}' for {model.name}. "
            f"Use {o('page_size')} 256 (a multiple of 128; SGLang's CUDA DeepSeek-V4 pool takes 256)."
        )
    elif serving.accounting == "exact" and page != 256 and not platform_pool_layout(serving):
        # A platform whose kernels refuse page 256 (Ascend's 128 for every model) builds no CUDA pool at all.
        fix = (
            f"Use {o('accounting')} sglang for the configurator's numbers ({serving.platform} refuses "
            f"{o('page_size')} 256)"
            if serving.traits.page_size_problems(256)
            else f"Use {o('page_size')} 256, or {o('accounting')} sglang for the configurator's numbers alone"
        )
        problems.append(
            f"{o('page_size')} {page}: SGLang's DeepSeek-V4 pool asserts '{SGLANG_BUILD_PAGE_MESSAGE}' "
            f"(_build_dsv4_kv_pool on CUDA), and the exact accounting charges the pools build makes. {fix}."
        )
    online = serving.enable_online_compress
    if online and serving.dsv4_compress_state_dtype == "bfloat16":
        problems.append(
            f"{o('dsv4_compress_state_dtype')} bfloat16 with {o('enable_online_compress')}: SGLang raises "
            f"'{SGLANG_BF16_ONLINE_MESSAGE}' Drop one of them."
        )
    if online and serving.speculative:
        algorithm = serving.speculative_algorithm
        if not serving.enable_online_c128_mtp or algorithm not in EAGLE_FAMILY:
            why = (
                f"{o('enable_online_c128_mtp')} is not set"
                if serving.enable_online_c128_mtp is False
                else f"{algorithm} is not an EAGLE draft"
            )
            problems.append(
                f"{o('enable_online_compress')} with {o('speculative_algorithm')} {algorithm} ({why}): SGLang "
                f"fails ('online c128 does not support MTP' in get_compress_state_ring_size; the configurator "
                f"asserts '{SGLANG_ONLINE_MTP_MESSAGE}'). Drop {o('enable_online_compress')} or the speculative "
                f"decoding, or use EAGLE with {o('speculative_eagle_topk')} 1 and {o('enable_online_c128_mtp')}."
            )
        else:
            if (serving.speculative_eagle_topk or 1) != 1:
                problems.append(
                    f"{o('enable_online_c128_mtp')} supports EAGLE top-k 1 only (SGLang: 'EAGLE topk=1 only'); got "
                    f"{o('speculative_eagle_topk')} {serving.speculative_eagle_topk}. Use "
                    f"{o('speculative_eagle_topk')} 1."
                )
            if not serving.speculative_num_draft_tokens:
                problems.append(
                    f"{o('enable_online_c128_mtp')} needs {o('speculative_num_draft_tokens')}: SGLang asserts "
                    f"'SGLANG_EXPERIMENTAL_ONLINE_C128_MTP requires speculative_num_draft_tokens to be set.' Set "
                    f"{o('speculative_num_draft_tokens')}."
                )
    problems += dsv4_hisparse_problems(serving)
    problems += unified_problems(serving)
    if serving.hisparse_config is not None and not serving.enable_hisparse:
        problems.append(
            f"{o('hisparse_config')} is set but {o('enable_hisparse')} is not: SGLang reads the config only with "
            f"HiSparse on. Add {o('enable_hisparse')} or drop {o('hisparse_config')}."
        )
    start, end = rank_layer_range(model, serving)
    if end <= start:
        problems.append(f"pipeline stage {serving.pp_rank} of {model.name} holds no layer; lower {o('pp_size')}.")
    return problems


# ---------------------------------------------------------------------------
# the cell
# ---------------------------------------------------------------------------


def dsv4_cell_size(model: ModelSpec, serving: Serving) -> CellSize:
    """Bytes per row of each store on this stage, and SGLang's bytes per full token beside them.

    Each token part is paid per row of its own token space (SWA tokens, c4
    rows, c128 rows); compressor states per state row.  SGLang's figure
    already includes the speculative draft's share, so the speculative
    wrapper leaves this cell alone (``draft_included``).
    """
    shape = dsv4_shape(model, serving)
    kv = shape.kv_bytes
    # under encoder replay the SWA rows are a per-request window (.encoder_replay), not a token part
    parts = [] if replay_on(serving) else [CellPart("swa_kv", kv * shape.num_layers, "kv_swa")]
    if shape.num_c4:
        parts += [
            CellPart("c4_kv", kv * shape.num_c4, "kv_c4"),
            CellPart("c4_indexer", shape.indexer_bytes * shape.num_c4, "c4_indexer"),
            CellPart("c4_state", shape.c4_state_bytes * shape.num_c4, "c4_state", unit=STATE_SLOT),
            CellPart(
                "c4_indexer_state", shape.c4_indexer_state_bytes * shape.num_c4, "c4_indexer_state", unit=STATE_SLOT
            ),
        ]
    if shape.num_c128:
        parts += [
            CellPart("c128_kv", kv * shape.num_c128, "kv_c128"),
            CellPart("c128_state", shape.c128_state_bytes * shape.num_c128, "c128_state", unit=STATE_SLOT),
        ]
    notes = [bytes_per_full_token_note(shape)]
    if serving.kv_cache_dtype not in ("auto", "fp8_e4m3"):
        notes.append(
            f"{option('kv_cache_dtype')} {serving.kv_cache_dtype} does not change DeepSeek-V4's rows: SGLang's "
            f"DeepSeekV4TokenToKVPool stores every SWA / c4 / c128 row in its packed fp8 layout "
            f"({kv} B per token per layer: fp8 nope, bf16 rope, ue8m0 scales)"
        )
    return CellSize(
        parts=parts,
        sglang_bytes_per_token=shape.bytes_per_full_token,
        num_layers=shape.num_layers,
        draft_included=True,
        notes=notes,
    )


def bytes_per_full_token_note(shape: DSV4Shape) -> str:
    if shape.v41 is not None:
        return _v41_bytes_note(shape, shape.v41)
    r = shape.swa_ratio
    terms = [f"{r} x {shape.kv_bytes} B x {shape.num_layers} layer(s) (SWA)"]
    if shape.num_c4:
        frac = f"1/{4 * shape.shrink}"
        terms += [
            f"{frac} x {shape.kv_bytes} B x {shape.num_c4} (c4)",
            f"1/4 x {shape.indexer_bytes} B x {shape.num_c4} (c4 indexer)",
            f"{r} x {shape.c4_ring}/{shape.window} x ({shape.c4_state_bytes} + {shape.c4_indexer_state_bytes}) B x "
            f"{shape.num_c4} (c4 KV and indexer states, ring {shape.c4_ring} per SWA page)",
        ]
    if shape.num_c128:
        terms.append(f"1/128 x {shape.kv_bytes} B x {shape.num_c128} (c128)")
    text = f"SGLang's bytes per full token = {' + '.join(terms)} = {shape.raw_bytes_per_full_token:,.4f} B"
    if shape.speculative:
        text += (
            f", x ({shape.num_layers} + 1 draft layer) / {shape.num_layers} for the draft worker = "
            f"{shape.bytes_per_full_token:,.4f} B"
        )
    return text + "; the c128 state is per request slot, fixed bytes outside this figure."


def _v41_bytes_note(shape: DSV4Shape, v41: V41Budget) -> str:
    """SGLang 0.5.23's coefficient for a DeepSeek-V4.1 stage, term by term (:mod:`.v41_budget`)."""
    swa = v41.bytes_per_swa_token(shape, shape.replay)
    what = f"SWA rows of {shape.num_layers} layer(s) and c4 states, page padded"
    if shape.swa_cap is not None:  # cap mode: the ratio term leaves the coefficient (V41Budget.bytes_per_full_token)
        terms = [f"0 x {swa:,.4f} B ({what}; cap mode: the {shape.swa_cap:,} SWA slots are fixed bytes)"]
    else:
        terms = [f"{shape.swa_ratio} x {swa:,.4f} B ({what})"]
    names = {4: "c4 KV and indexer", 128: "c128", 1: "ratio-1 sources, KV and fp4 indexer", 2: "ratio-2 sources"}
    for ratio, layers in v41.owners:
        each = v41.compressed_bytes_per_full_token(shape, ratio)
        terms.append(f"{each:,.4f} B x {layers} ({names[ratio]})")
    text = (
        f"SGLang 0.5.23's bytes per full token (DeepSeek-V4.1: the kv_source layers of ratios 1 / 2 priced, rows "
        f"page padded) = {' + '.join(terms)} = {shape.raw_bytes_per_full_token:,.4f} B"
    )
    if shape.bytes_per_full_token != shape.raw_bytes_per_full_token:
        text += f", x ({shape.num_layers} + 1 draft layer) / {shape.num_layers} = {shape.bytes_per_full_token:,.4f} B"
    return text + "; the c128 and ratio-2 pair states are per request slot, fixed bytes outside this figure."


# ---------------------------------------------------------------------------
# size_pools
# ---------------------------------------------------------------------------


def size_dsv4_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing:
    """The ``size_pools`` answer for DeepSeek-V4 (both accounting modes).

    A layout the platform plugin plans itself (``PlatformTraits.platform_planned_layouts``) is that plugin's to
    size (``size_pools``, ``tryfirst``): reaching here, no plugin did, and its pools are not this module's."""
    if platform_plans_layout(serving):
        raise UnsupportedCombinationError(
            f"The {serving.platform} platform plans its own DeepSeek-V4 pools (PlatformTraits."
            f"platform_planned_layouts), but no plugin of that platform sized them (size_pools): install or enable "
            f"the {serving.platform} platform plugin that declares them, or plan for another platform."
        )
    shape = dsv4_shape(model, serving)
    page = serving.page_size
    notes: list[str] = []
    if shape.online and serving.speculative:
        notes.append(  # SGLang's start-up warning, word for word
            "DSV4 compressed attention: experimental online c128 + MTP enabled "
            f"(EAGLE topk=1 only, draft_banks={shape.draft_tokens}). Validate correctness carefully."
        )
    layout_note = auto_layout_note(serving)
    if layout_note:
        notes.append(layout_note)
    notes.extend(backend_notes(serving))
    window_bytes = request_window_bytes(shape, serving) if replay_on(serving) else 0
    if window_bytes:
        notes.extend(replay_notes(shape, serving))
    cost = None
    if serving.accounting == "sglang":
        full, fixed, how = _sglang_full_tokens(shape, budget.budget_bytes, page, window_bytes)
        notes.append(how)
    else:
        cost = ExactCost(model, serving, shape)
        full = exact_full_tokens(cost, budget.budget_bytes)
        fixed = None
    sizes = shape.sizes(full, page)
    capped, cap_note = apply_token_cap(sizes["full_max_total_num_tokens"], serving.max_total_tokens)
    if cap_note:
        notes.append(cap_note)
    if capped != sizes["full_max_total_num_tokens"]:
        # SGLang's constraint path: calculate_pool_sizes_from_max_tokens re-derives every sub-pool.
        sizes = shape.sizes(capped, page)
        notes.append(
            f"{option('max_total_tokens')} {serving.max_total_tokens:,} (or the pipeline stages' minimum) lowered "
            f"the full pool: every sub-pool re-derived from {sizes['full_max_total_num_tokens']:,} full tokens."
        )
    full = sizes["full_max_total_num_tokens"]
    if full <= 0:
        what = "c128 state and encoder replay's request window" if window_bytes else "c128 state"
        reserved = None if fixed is None else (fixed, f"{what} reserved for the request count first")
        raise not_enough_memory(model, serving, cell, budget, fixed=reserved)
    context_len = serving.context_length or model.context_len
    limit = resolve_max_num_reqs(full, context_len, serving)
    if limit.note:
        notes.append(limit.note)
    requests = limit.max_running_requests
    if requests <= 0:
        raise InsufficientMemoryError(
            f"{full} KV tokens leave room for no request (a request needs at least 2 tokens). Raise {option('memory')}."
        )
    if sizes["swa_max_total_num_tokens"] < page and not window_bytes:
        raise InsufficientMemoryError(
            f"The SWA pool of {model.name} would get {sizes['swa_max_total_num_tokens']} tokens, less than one page "
            f"of {page}: int({full} full tokens x {option('swa_full_tokens_ratio')} {shape.swa_ratio}) rounds to "
            f"nothing. Raise {option('memory')} or {option('swa_full_tokens_ratio')}."
        )
    sizes["c128_state_pool_size"] = shape.c128_state_pool_size(requests)
    notes.extend(sub_pool_notes(shape, sizes, requests, serving, fixed, window_bytes))
    notes.extend(unified_notes(serving))
    notes.extend(ring_notes(serving, shape.window, requests, sizes["swa_max_total_num_tokens"]))
    pools = _pools(model, serving, sizes, requests, context_len, cost)
    return PoolSizing(
        max_total_num_tokens=full,
        max_running_requests=requests,
        pools=pools,
        sglang_config={
            "max_total_num_tokens": full,
            "max_running_requests": requests,
            **sizes,
            **ring_capacity(serving, shape.window, requests),
            **({"request_window_bytes": window_bytes} if window_bytes else {}),
        },
        sglang_estimate_bytes=int(
            full * shape.bytes_per_full_token + (shape.v41.padding_bytes(full) if shape.v41 else 0)
        )
        + shape.fixed_state_bytes(requests)
        + window_bytes
        + int(swa_cap_bytes(shape)),
        notes=notes,
        # encoder replay: no SWA token space (the window is per request slot, bounded by the request cap)
        token_counts=token_counts(sizes, swa=not window_bytes),
        windows=() if window_bytes else (sliding_window_terms(SWA_TOKENS, shape.window, serving),),
        token_space_sizing={} if window_bytes else {SWA_TOKENS: swa_pool_note(shape, sizes)},
        compression=compression(shape),
    )


def compression(shape: DSV4Shape) -> dict[str, int]:
    """Full tokens per token of each compressed space: SGLang indexes them by full slot, never allocates them.

    SGLang writes a c4 / c128 layer's compressed row of full slot ``s`` at ``s // ratio`` (its DSV4 attention
    backend, ``layers/attention/deepseek_v4_backend.py`` ``_low_ratio_compression_metadata``: ``raw_out_loc //
    compress_ratio`` when a position completes a group; a full page of ``P`` is ``P // compress_ratio``
    compressed slots, ``layers/attention/dsv4/metadata.py``), and ``_build_token_to_kv_pool_allocator`` gives
    them no allocator of their own (only the full / SWA pair, :mod:`.building`).  So a request of ``k`` full
    pages holds ``k x P / ratio`` rows: page rounding is in full pages, and ``P`` is a multiple of 128
    (``calculate_pool_sizes`` asserts it, ``002_50706b73e02ffb67.txt`` lines 748-750).  Under
    HiSparse the c4 device pool is a shrunk pool with an allocator and mapping of its own
    (``DeepSeekV4HiSparseTokenToKVPoolAllocator``), whose holding per request is not this: c4 is left out then.
    """
    ratios = {C128_TOKENS: 128}
    if shape.shrink == 1:
        ratios[C4_TOKENS] = 4
    return ratios


def token_counts(sizes: dict[str, int], *, swa: bool = True) -> dict[str, int]:
    """The count of each token space the pools scale with (no ``"swa"`` space under encoder replay)."""
    counts = {
        FULL_TOKENS: sizes["full_max_total_num_tokens"],
        SWA_TOKENS: sizes["swa_max_total_num_tokens"],
        C4_TOKENS: sizes["c4_max_total_num_tokens"],
        C128_TOKENS: sizes["c128_max_total_num_tokens"],
    }
    if not swa:
        del counts[SWA_TOKENS]
    return counts


def swa_cap_bytes(shape: DSV4Shape) -> float:
    """``_get_swa_fixed_bytes``' cap-mode term: ``swa_cap_tokens x bytes per SWA token`` (0 out of cap mode)."""
    if shape.swa_cap is None or shape.v41 is None:
        return 0
    return shape.swa_cap * shape.v41.bytes_per_swa_token(shape, shape.replay)


def _sglang_full_tokens(shape: DSV4Shape, budget_bytes: int, page: int, window_bytes: int = 0) -> tuple[int, int, str]:
    """``calculate_pool_sizes``' full tokens, the fixed bytes (the c128 state's, and encoder replay's
    ``request_window_bytes``, ``_get_swa_fixed_bytes``), and how they were decided."""
    bpft = shape.bytes_per_full_token
    if shape.requested_per_worker is not None:
        requests = shape.requested_per_worker
        source = f"the requested {requests} request(s) per DP worker"
    else:
        capacity = int(budget_bytes / bpft)
        requests = shape.estimated_requests(capacity)
        source = (
            f"{requests} request(s) estimated from a capacity of {capacity:,} tokens "
            f"(clamp(int(tokens / context {shape.context_len} x 512), 2048, 4096), at most tokens // 2)"
        )
    c128 = shape.c128_state_fixed_bytes(requests)
    c2 = shape.c2_state_fixed_bytes(requests)
    cap_bytes = swa_cap_bytes(shape)
    exact_fixed = c128 + c2 + (window_bytes + cap_bytes)  # calculate_pool_sizes' order: _get_swa_fixed_bytes is a float
    fixed = int(exact_fixed)
    available = max(budget_bytes - exact_fixed, 0)
    full_token = int(available / bpft)
    window = f" + request window {window_bytes:,}" if window_bytes else ""
    if shape.swa_cap is not None:
        window += f" + SWA cap pool {shape.swa_cap:,} x {cap_bytes / shape.swa_cap:,.4f} = {cap_bytes:,.0f}"
    pair = f" + ratio-2 pair state {c2:,}" if c2 else ""
    how = (
        f"SGLang's DSV4PoolConfigurator: c128 state fixed bytes {c128:,}{pair}{window} ({fmt_gib(fixed)}) for "
        f"{source}; full tokens = int((budget {budget_bytes:,} - {fixed:,}) / {bpft:,.4f}) = {full_token:,}, page "
        f"aligned."
    )
    if shape.v41 is not None and shape.v41.padded:
        aligned = full_token // page * page
        full_token = shape.v41.fit(aligned, bpft, available)
        how += (
            f" Less the ratio-1/2 pools' reserved pages (_get_low_ratio_kv_padding_bytes: "
            f"{shape.v41.padding_bytes(full_token):,.0f} B at {full_token:,} tokens): {full_token:,} full tokens."
        )
    return full_token, fixed, how


def _exact_full_tokens(model: ModelSpec, serving: Serving, shape: DSV4Shape, budget_bytes: int) -> int:
    """The most page-aligned full tokens whose every pool (``buffers.pool_specs``) fits the budget."""
    return exact_full_tokens(ExactCost(model, serving, shape), budget_bytes)


def exact_full_tokens(cost: ExactCost, budget_bytes: int) -> int:
    """:func:`_exact_full_tokens` on a cost already set up (the stage laid out once, not at every probe).

    Solved (:func:`solved_full_tokens`: the pool bytes are linear in the full and SWA pages between request-count
    steps) and checked with a probe at the answer and one page above it; where the solve does not apply or its
    answer fails the check, the probing search (:func:`searched_full_tokens`) decides, so the answer is the
    search's either way."""
    solved = solved_full_tokens(cost, budget_bytes)
    return searched_full_tokens(cost, budget_bytes) if solved is None else solved


def solved_full_tokens(cost: ExactCost, budget_bytes: int) -> int | None:
    """The exact answer from one layout and two checking probes, or None where it cannot be had that way.

    At a fixed request count, every pool of V4's separate-KV set grows by a fixed number of bytes per page of full
    tokens (the c4 / c128 / indexer pages, the mapping, the full allocator) and per page of SWA tokens (every
    layer's SWA page, the draft's, the c4 state rows, the SWA allocator): ``bytes(p) = bytes(p0) + per_page x (p -
    p0) + per_swa_page x (swa(p) - swa(p0))`` exactly (:meth:`ExactCost.linear`), where ``swa(p)`` is the
    configurator's own ``int(p x P x ratio) // P``.  The largest ``p`` within the budget is found on that
    formula (a bisection of integer sums, no layout), laid out again where its request count differs from the
    anchor's, and then checked: it fits and one page more does not.  The cost never decreases with the tokens
    (``largest_fitting_tokens``' premise), so that is the search's answer."""
    page, shape = cost.page, cost.shape
    estimate = int(budget_bytes / shape.bytes_per_full_token) if shape.bytes_per_full_token > 0 else 0
    anchor = max(page, page_align(estimate, page))  # near the answer: SGLang's bytes per token are a lower bound
    for _ in range(3):  # a request-count step between the anchor and the answer: solve again from the answer
        linear = cost.linear(anchor)
        if linear is None:
            return None
        spent, per_page, per_swa_page = linear
        room = budget_bytes - spent + per_page * (anchor // page) + per_swa_page * (cost.swa_tokens(anchor) // page)
        ratio = shape.swa_ratio if shape.swa_cap is None else 0.0
        pages = _largest_within(room, per_page, per_swa_page, ratio, lambda p: cost.swa_tokens(p * page) // page)
        if pages is None:
            return None
        tokens = pages * page
        if cost.requests(tokens) == cost.requests(anchor) or tokens == anchor:
            break
        anchor = max(page, tokens)
    else:
        return None
    # one page more first: the answer's layout is then the probe's last, which its pool values reuse
    if cost(tokens + page) > budget_bytes and (tokens == 0 or cost(tokens) <= budget_bytes):
        return tokens
    return None


def _largest_within(
    room: int, per_page: int, per_swa_page: int, ratio: float, swa_pages: Callable[[int], int]
) -> int | None:
    """The most pages ``p >= 0`` with ``per_page x p + per_swa_page x swa_pages(p) <= room`` (both terms never
    decrease), None without a positive ``per_page``.  ``swa_pages(p)`` is about ``p x ratio`` (at most that, at
    least two pages less), which brackets the answer within a few pages of ``room / (per_page + per_swa_page x
    ratio)``; a bisection of integer sums settles it (over ``[0, room // per_page]`` if the bracket is off)."""
    if per_page <= 0:
        return None

    def fits(pages: int) -> bool:
        return per_page * pages + per_swa_page * swa_pages(pages) <= room

    bound = max(room // per_page, 0)  # swa_pages >= 0: no p past it fits
    rate = per_page + per_swa_page * ratio
    low = min(max(int(room / rate) - 1, 0), bound)
    high = min(max(int((room + 2 * per_swa_page) / rate) + 1, low), bound)
    if not fits(low):
        low = 0
    if fits(high):
        high = bound
    while low < high:
        mid = (low + high + 1) // 2
        if fits(mid):
            low = mid
        else:
            high = mid - 1
    return low


def searched_full_tokens(cost: ExactCost, budget_bytes: int) -> int:
    """The probing search for the most full tokens within the budget (the reference :func:`solved_full_tokens`
    is checked against): a bracket from SGLang's bytes per full token, doubled while it fits, then
    ``largest_fitting_tokens``' secant search, laying the pool set out at each probe (about 8 per plan)."""
    page, shape = cost.page, cost.shape
    estimate = int(budget_bytes / shape.bytes_per_full_token) if shape.bytes_per_full_token > 0 else 0
    upper = max(page, page_align(estimate, page) + page)
    while cost(upper) <= budget_bytes:
        upper *= 2
    return largest_fitting_tokens(budget_bytes, page, upper, cost)


def exact_pools(model: ModelSpec, serving: Serving, shape: DSV4Shape, tokens: int) -> list[PoolSpec]:
    """Every pool for ``tokens`` full tokens, with SGLang's derivation of the sub-pools and requests."""
    sizes = shape.sizes(tokens, serving.page_size)
    context_len = serving.context_length or model.context_len
    requests = resolve_max_num_reqs(sizes["full_max_total_num_tokens"], context_len, serving).max_running_requests
    sizes["c128_state_pool_size"] = shape.c128_state_pool_size(max(requests, 0))
    return _pools(model, serving, sizes, max(requests, 0), context_len)


def exact_bytes(model: ModelSpec, serving: Serving, shape: DSV4Shape, tokens: int) -> int:
    """``sum(p.bytes for p in exact_pools(...))``, without building the pools (the exact search's probe)."""
    return ExactCost(model, serving, shape)(tokens)


def exact_bytes_probe(model: ModelSpec, serving: Serving, shape: DSV4Shape) -> ExactCost:
    """:func:`exact_bytes` as ``cost(tokens)``: what does not depend on the token count is read once."""
    return ExactCost(model, serving, shape)


class ExactCost:
    """``cost(tokens)``: the bytes of every pool ``build`` allocates for ``tokens`` full tokens (:func:`exact_bytes`),
    with the stage laid out once; each token count is laid out at most once."""

    def __init__(self, model: ModelSpec, serving: Serving, shape: DSV4Shape) -> None:
        self.serving, self.shape, self.page = serving, shape, serving.page_size
        self.context_len = serving.context_length or model.context_len
        self.probe = pool_bytes_probe(model, serving, context_len=self.context_len)
        self.seen: dict[int, int] = {}
        self._requests: dict[int, int] = {}

    def __call__(self, tokens: int) -> int:
        if tokens not in self.seen:
            self.seen[tokens] = self.probe(*self._sizes(tokens))
        return self.seen[tokens]

    def linear(self, tokens: int) -> tuple[int, int, int] | None:
        """``(bytes, bytes per page of full tokens, bytes per page of SWA tokens)`` at ``tokens`` (the request count
        held: :meth:`buffers.PoolBytesProbe.linear`), or None where the pool bytes are not linear in those pages."""
        steps = self.shape.steps(self.page)
        if steps is None:
            return None
        linear = self.probe.linear(*self._sizes(tokens), *steps)
        if linear is None:
            return None
        spent, per_page, per_swa_page = linear
        self.seen[tokens] = spent
        return spent, per_page, per_swa_page

    def requests(self, tokens: int) -> int:
        """The request count the plan derives from ``tokens`` full tokens."""
        full = tokens // self.page * self.page
        if full not in self._requests:
            limit = resolve_max_num_reqs(full, self.context_len, self.serving)
            self._requests[full] = max(limit.max_running_requests, 0)
        return self._requests[full]

    def swa_tokens(self, tokens: int) -> int:
        return self.shape.swa_tokens(tokens // self.page * self.page, self.page)

    def _sizes(self, tokens: int) -> tuple[Any, int]:
        sizes = self.shape.sizes(tokens, self.page)
        requests = self.requests(tokens)
        return (
            DSV4Sizes(
                full_tokens=sizes["full_max_total_num_tokens"],
                swa_tokens=sizes["swa_max_total_num_tokens"],
                c4_tokens=sizes["c4_max_total_num_tokens"],
                c128_tokens=sizes["c128_max_total_num_tokens"],
                c4_state_size=sizes["c4_state_pool_size"],
                c128_state_size=self.shape.c128_state_pool_size(requests),
            ),
            requests,
        )


def _pools(
    model: ModelSpec,
    serving: Serving,
    sizes: dict[str, int],
    requests: int,
    context_len: int,
    cost: ExactCost | None = None,
) -> list[PoolSpec]:
    """Every allocation ``build`` makes for these sizes (the pool side's ``pool_specs``); with the exact search's
    ``cost``, the buffers its last probe laid out when that probe was at these sizes."""
    dsv4_sizes = DSV4Sizes.from_config(sizes)
    return list(
        pool_specs(
            model,
            serving,
            dsv4_sizes,
            max_running_requests=requests,
            context_len=context_len,
            owner=OWNER,
            buffers=None if cost is None else cost.probe.buffers(dsv4_sizes, requests),
        )
    )


def swa_pool_note(shape: DSV4Shape, sizes: dict[str, int], window_bytes: int = 0) -> str:
    """What sized the SWA pool: the first sub-pool note, and ``PoolSizing.token_space_sizing["swa"]`` where the
    plan has an SWA token space (not under encoder replay's request window)."""
    full, swa = sizes["full_max_total_num_tokens"], sizes["swa_max_total_num_tokens"]
    if shape.swa_cap is not None:
        return (
            f"SWA pool: SGLang 0.5.23's cap mode ({option('swa_full_tokens_ratio')} unset on a DeepSeek-V4.1 "
            f"checkpoint): {swa:,} tokens from the request cap and radix prefix tails (_resolve_swa_cap_tokens), for "
            f"all {shape.num_layers} layer(s) of this stage, set aside before the full tokens."
        )
    if window_bytes:
        return (
            f"SWA pool: none (encoder replay's request window holds the SWA rows of all {shape.num_layers} "
            f"layer(s) of this stage; swa_max_total_num_tokens {swa})."
        )
    return (
        f"SWA pool: int({full:,} full tokens x {option('swa_full_tokens_ratio')} {shape.swa_ratio}) page aligned = "
        f"{swa:,} tokens, for all {shape.num_layers} layer(s) of this stage."
    )


def sub_pool_notes(
    shape: DSV4Shape, sizes: dict[str, int], requests: int, serving: Serving, fixed: int | None, window_bytes: int = 0
) -> list[str]:
    """What decided each sub-pool (the report prints them)."""
    o = option
    swa = sizes["swa_max_total_num_tokens"]
    notes = [swa_pool_note(shape, sizes, window_bytes)]
    if shape.num_c4:
        divisor = (
            f"(4 x HiSparse host_to_device_ratio {shape.shrink}; {o('enable_hisparse')} keeps the rest on the host)"
            if shape.shrink > 1
            else "4"
        )
        per = f"page {shape.v41.page}" if shape.v41 is not None else f"window {shape.window}"
        notes.append(
            f"c4 pool (KV and indexer, {shape.num_c4} layer(s)): full // {divisor} = "
            f"{sizes['c4_max_total_num_tokens']:,} rows; c4 states: SWA {swa:,} // {per} x ring "
            f"{shape.c4_ring}{' (speculative)' if shape.speculative else ''} = {sizes['c4_state_pool_size']:,} rows."
        )
    if shape.num_c128:
        slots = shape.req_slots(requests)
        extra = f" + {shape.decode_extra_slots} decode pre-allocated" if shape.decode_extra_slots is not None else ""
        ring = "1 slot each (online c128)" if shape.online else f"x ring {shape.c128_ring}"
        line = (
            f"c128 pool ({shape.num_c128} layer(s)): full // 128 = {sizes['c128_max_total_num_tokens']:,} rows; c128 "
            f"state: ({requests} request(s) + 1{extra} = {slots} slot(s)) {ring} = "
            f"{sizes['c128_state_pool_size']:,} rows"
        )
        if fixed is not None:
            line += f" (SGLang set {fixed:,} B aside for it before dividing the budget)"
        notes.append(line + ".")
    return notes
