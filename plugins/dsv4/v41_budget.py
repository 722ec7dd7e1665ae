"""SGLang 0.5.23's ``DSV4PoolConfigurator`` budget for DeepSeek-V4.1 stages (compress ratios 1 / 2), issue 33.

ref-002's configurator (which :class:`.sizing.DSV4Shape` follows token-exactly for DeepSeek-V4) counts c4 and
c128 layers only, so a stage with ``kv_source_layer_ids`` of ratio 1 / 2 was charged their SWA rows alone and
over-planned by up to 6x.  SGLang 0.5.23 (``srt/model_executor/pool_configurator.py``) prices them; kvpools
takes its whole arithmetic for a model whose ``compress_ratios`` list a ratio 1 or 2 (DeepSeek-V4 models keep
ref-002's, which the oracle pins):

* the owners (``collect_sources_by_ratio``): every c4 / c128 layer of the stage, the ``kv_source_layer_ids`` of
  ratios 1 / 2 (:func:`.low_ratio.sources_by_ratio`);
* page-padded rows (``_get_paged_kv_bytes_per_token``): a ratio-``r`` row costs
  ``layout.page_bytes(P // r) / (P // r)`` (585 B for the V4 layout at ``P`` 256, not 584), the SWA row
  ``main.page_bytes(P) / P``; ``kv_bytes`` under ``--dsv4-attn-backend trtllm`` and on pools that are not the
  CUDA ``DeepSeekV4SingleKVPool`` (unified / NPU);
* bytes per SWA token (``_get_bytes_per_swa_token``): ``swa row x layers + ring(4) / P x (c4 KV + indexer
  state) x c4 layers`` (the c4 state ring is per SWA *page*, ``P``, where ref-002 divided by the window);
  under encoder replay ``kv_bytes x paged draft layers`` (0: no draft on V4.1);
* bytes per full token (``_get_bytes_per_full_token``): ``swa_ratio x bytes per SWA token + sum over owners``
  of ``_compressed_bytes_per_full_token``: c4 ``1 / (4 x shrink) x row(4) + 1/4 x indexer``, c128
  ``1/128 x row(128)``, ratios 1 / 2 ``(row(r) + fp4 indexer) / r`` (the low-ratio indexer is fp4,
  ``index_head_dim / 2 + index_head_dim / 32`` = 68 B at 128); then ``x (T + 1) / T`` for a draft worker
  without encoder replay;
* fixed bytes (``calculate_pool_sizes``): the c128 state (as V4), the ratio-2 pair state
  (``_get_c2_state_fixed_bytes``: ``ceil((slots x ring(2) + ring(2) + 1) / 2) x 2`` float32 rows of ``2 x
  (nope + rope)`` per ratio-2 source) and encoder replay's request window;
* the reserved pages (``_get_low_ratio_kv_padding_bytes``): after ``int((budget - fixed) / bytes per full
  token)`` page aligned, one page is taken off while ``full x coefficient + padding(full)`` exceeds the
  budget, ``padding(full) = sum over ratios 1 / 2 of (P x row(r) + (index slots - full // r) x fp4 indexer) x
  sources``, ``index slots = ceil(((full + P) // r + 64) / 64) x 64`` (``DSV41_INDEX_PAGE_SIZE``; 0 on the pools
  without a page pad);
* sizes (``_compute_dsv4_sizes``): ``c4_state_pool_size = swa // P x ring(4)``.

0.5.23's SWA cap mode (``_resolve_swa_cap_tokens``, taken when ``--swa-full-tokens-ratio`` is left unset on a
V4.1 checkpoint) sizes the SWA pool from the request cap instead of the ratio (:func:`v41_swa_cap_tokens`): the
ratio term leaves the coefficient and ``cap x bytes per SWA token`` joins the fixed bytes.  ``--accounting exact``
builds that same SWA pool (the cap, or the 0.1 default where cap mode is unusable) and solves the most full tokens
whose pools fit, as it does for a given ratio.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.values import ModelSpec, Serving, is_unset

from .config import C4, C128, V41_ARCHITECTURE, V41_MODEL_TYPE
from .encoder_replay import local_chunk
from .layouts import compressed_layout, main_layout, uniform_fp8
from .low_ratio import DSV41_INDEX_PAGE_SIZE, FP4_SCALE_BLOCK, LOW_RATIOS, _ratios, pair_ring_size, sources_by_ratio
from .memo import per_model
from .unified import SEPARATE, dsv4_layout

__all__ = [
    "V41Budget",
    "is_v41_stage",
    "v41_architecture_problems",
    "v41_budget",
    "v41_swa_cap_tokens",
    "v41_swa_ratio",
]

SGLANG_ACCOUNTINGS = ("exact", "sglang")
"""The accountings that plan SGLang's server: both size a V4.1 SWA pool as 0.5.23's configurator does (cap mode,
or the 0.1 default); ``--accounting exact`` then solves the most full tokens whose pools fit (issue 33)."""

DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO = 0.1
"""``DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO`` (``pool_configurator.py``): the configurator's ratio when the operator
gave none and cap mode is unusable."""

FLOAT32_BYTES = 4


@per_model
def is_v41_stage(model: ModelSpec) -> bool:
    """Whether the model lists a compress ratio 1 or 2 (a DeepSeek-V4.1 topology): 0.5.23's budget applies."""
    return any(r in LOW_RATIOS for r in _ratios(model))


class _ShapeLike(Protocol):
    """What :class:`V41Budget` reads of ``.sizing.DSV4Shape`` (a protocol keeps the modules acyclic)."""

    @property
    def num_layers(self) -> int: ...
    @property
    def c4_ring(self) -> int: ...
    @property
    def c4_state_bytes(self) -> int: ...
    @property
    def c4_indexer_state_bytes(self) -> int: ...
    @property
    def shrink(self) -> int: ...
    @property
    def indexer_bytes(self) -> int: ...
    @property
    def swa_ratio(self) -> float: ...
    @property
    def swa_cap(self) -> int | None: ...


@attrs.frozen
class V41Budget:
    """The terms 0.5.23's configurator adds or changes for a DeepSeek-V4.1 stage (see the module)."""

    page: int
    owners: tuple[tuple[int, int], ...]
    """``(ratio, owner layers)`` in ``collect_sources_by_ratio``'s order (4, 128, 1, 2), owned ratios only."""
    swa_row: float
    """``_get_paged_kv_bytes_per_token()``: the SWA row, page padded."""
    rows: tuple[tuple[int, float], ...]
    """``_get_paged_kv_bytes_per_token(r)`` of each owned ratio."""
    low_index_bytes: int
    pair_ring: int
    padded: bool
    """Whether the pools carry the page pad (and the low-ratio reserved pages)."""

    def layers(self, ratio: int) -> int:
        return dict(self.owners).get(ratio, 0)

    def row(self, ratio: int) -> float:
        return dict(self.rows)[ratio]

    def bytes_per_swa_token(self, shape: _ShapeLike, replay: bool) -> float:
        """``_get_bytes_per_swa_token`` (no paged draft layers under replay: 0)."""
        if replay:
            return 0
        c4_state_ratio = (shape.c4_ring if self.layers(4) else 0) / self.page
        return self.swa_row * shape.num_layers + (
            c4_state_ratio * (shape.c4_state_bytes + shape.c4_indexer_state_bytes) * self.layers(4)
        )

    def compressed_bytes_per_full_token(self, shape: _ShapeLike, ratio: int) -> float:
        """``_compressed_bytes_per_full_token(ratio)``."""
        if ratio in LOW_RATIOS:
            return (self.row(ratio) + self.low_index_bytes) / ratio
        if ratio == 4:
            c4_frac = 1 / (4 * shape.shrink)
            return c4_frac * self.row(4) + 1 / 4 * shape.indexer_bytes
        return 1 / 128 * self.row(128)

    def bytes_per_full_token(self, shape: _ShapeLike, replay: bool) -> float:
        """``_get_bytes_per_full_token``, in SGLang's float operations and order (before the draft inflation)."""
        compressed = sum(self.compressed_bytes_per_full_token(shape, ratio) * layers for ratio, layers in self.owners)
        # cap mode moves the SWA pool and the c4 states that follow it into fixed bytes
        swa_ratio = 0 if shape.swa_cap is not None else shape.swa_ratio
        return swa_ratio * self.bytes_per_swa_token(shape, replay) + compressed

    def c2_state_fixed_bytes(self, slots: int, attn_head_dim: int) -> int:
        """``_get_c2_state_fixed_bytes`` for ``slots`` request slots (``_get_num_req_slots``)."""
        layers = self.layers(2)
        if not layers:
            return 0
        rows = slots * self.pair_ring + self.pair_ring + 1
        rows = -(-rows // 2) * 2
        return rows * 2 * attn_head_dim * FLOAT32_BYTES * layers

    def padding_bytes(self, full_tokens: int) -> float:
        """``_get_low_ratio_kv_padding_bytes(full_tokens)``."""
        if not self.padded:
            return 0
        total: float = 0
        for ratio in LOW_RATIOS:
            layers = self.layers(ratio)
            if not layers:
                continue
            main_padding = self.page * self.row(ratio)
            index_size = (full_tokens + self.page) // ratio
            index_slots = -(-(index_size + DSV41_INDEX_PAGE_SIZE) // DSV41_INDEX_PAGE_SIZE) * DSV41_INDEX_PAGE_SIZE
            index_padding = (index_slots - full_tokens // ratio) * self.low_index_bytes
            total += (main_padding + index_padding) * layers
        return total

    def fit(self, full_token: int, bytes_per_full_token: float, available: float) -> int:
        """``calculate_pool_sizes``' loop: whole pages off until tokens and reserved pages fit ``available``."""
        while full_token > 0 and full_token * bytes_per_full_token + self.padding_bytes(full_token) > available:
            full_token -= self.page
        return full_token


def v41_budget(model: ModelSpec, serving: Serving, kv_bytes: int) -> V41Budget | None:
    """0.5.23's terms for this stage, or ``None`` for a DeepSeek-V4 model (ref-002's budget)."""
    if not is_v41_stage(model):
        return None
    start, end = rank_layer_range(model, serving)
    stage = range(start, end)
    layers = model.layers[start:end]
    low = sources_by_ratio(model, stage)
    owners = [
        (4, sum(1 for layer in layers if layer.kind == C4)),
        (128, sum(1 for layer in layers if layer.kind == C128)),
    ]
    owners += [(r, len(low.get(r, ()))) for r in LOW_RATIOS]
    owned = tuple((r, n) for r, n in owners if n)
    page = serving.page_size
    # _get_paged_kv_bytes_per_token: the unified rings, the NPU pool and trtllm's uniform fp8 pool carry no pad
    padded = not uniform_fp8(serving) and dsv4_layout(serving) == SEPARATE
    if padded:
        main = main_layout(serving)
        swa_row: float = main.page_bytes(page) / page
        rows = tuple((r, compressed_layout(serving, r).page_bytes(page // r) / (page // r)) for r, _ in owned)
    else:
        swa_row = kv_bytes
        rows = tuple((r, float(kv_bytes)) for r, _ in owned)
    index_dim = int(model.params.get("index_head_dim", 0))
    return V41Budget(
        page=page,
        owners=owned,
        swa_row=swa_row,
        rows=rows,
        low_index_bytes=index_dim // 2 + index_dim // FP4_SCALE_BLOCK,
        pair_ring=pair_ring_size(serving),
        padded=padded,
    )


def v41_swa_cap_tokens(model: ModelSpec, serving: Serving, window: int) -> int | None:
    """0.5.23's SWA cap mode (``_resolve_swa_cap_tokens``, ``compute_swa_request_cap``) under SGLang's
    accountings (``sglang`` and ``exact``: the SWA pool SGLang builds): SWA slots reserved from the request cap,
    or ``None`` where the configurator keeps ratio sizing.

    Taken for a V4.1 checkpoint (no 0.1 default, ``_deepseek_v4_overrides``) with ``--swa-full-tokens-ratio``
    unset, the separate-KV pool, ``--max-running-requests`` known and chunked prefill on (or a PD decode node);
    not under encoder replay (its cap is 0).  With ``R = max(1, requests // attn_dp)``, window ``W``, page ``P``
    and eviction interval ``E`` (``SGLANG_SWA_EVICTION_INTERVAL``; no speculative decoding on V4.1: one draft
    token, a page of decode allocation): ``cap = R x (W + E + P + P) + chunks x chunk + P`` (chunks 2, 1 with
    ``--disable-overlap-schedule``; the rank's chunk) or on a decode node ``R x (W + E + 2P) + (W + P) x extra
    slots``; prefix tails ``4 R`` (0 without the radix cache); ``ceil_align(cap + tails x (W + P), P)``.
    """
    if serving.accounting not in SGLANG_ACCOUNTINGS or not is_v41_stage(model):
        return None
    if serving.enable_encoder_swa_bounded_replay:
        return None
    if not is_unset(serving.swa_full_tokens_ratio) or serving.max_running_requests is None:
        return None
    if dsv4_layout(serving) != SEPARATE:
        return None  # ring mode: no cap
    decode = serving.disaggregation_mode == "decode"
    chunk = serving.chunked_prefill_size
    if not decode and (chunk is None or chunk <= 0):
        return None
    page = serving.page_size
    requests = max(1, serving.max_running_requests // serving.attn_dp_size)
    per_request = window + max(1, serving.swa_eviction_interval) * 1 + page + page
    if decode:
        cap = per_request * requests + (window + page) * serving.decode_extra_slots
    else:
        chunks = 1 if serving.disable_overlap_schedule else 2
        cap = per_request * requests + chunks * local_chunk(serving) + page
    tails = 0 if serving.disable_radix_cache else 4 * requests
    return -(-(cap + tails * (window + page)) // page) * page


def v41_architecture_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """``DeepseekV41ForCausalLM`` left as the served class: SGLang 0.5.23 rewrites it only for a ``deepseek_v41``
    config naming it alone (``normalize_deepseek_v41_config``, :func:`.config.v41_architectures`) and registers no
    model of that name, so any other such config fails to load there (vLLM 0.33 serves it: ``--accounting vllm``)."""
    if serving.accounting == "vllm" or not model.hf_architectures:
        return []
    if model.hf_architectures[0] != V41_ARCHITECTURE:
        return []
    o = option
    return [
        f"{model.name}: architectures {list(model.hf_architectures)} with model_type {model.model_type!r}: SGLang "
        f"0.5.23 rewrites {V41_ARCHITECTURE} to DeepseekV4ForCausalLM only for a model_type '{V41_MODEL_TYPE}' config "
        f"that lists it alone (normalize_deepseek_v41_config) and has no model class of that name. Set 'model_type' "
        f"to '{V41_MODEL_TYPE}' and 'architectures' to ['{V41_ARCHITECTURE}'], or plan with {o('accounting')} vllm."
    ]


def v41_swa_ratio(model: ModelSpec, serving: Serving) -> float:
    """The SWA ratio 0.5.23's configurator sizes a V4.1 stage by under SGLang's accountings (``sglang`` and
    ``exact``): the operator's, or, left unset, ``DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO`` 0.1, not the generic 0.8 (a
    V4.1 checkpoint gets no 0.1 engine default, ``_deepseek_v4_overrides``): what sizes the SWA pool where cap mode
    is unusable (no chunked prefill; in cap mode, :func:`v41_swa_cap_tokens`, the ratio is unused)."""
    ratio = serving.swa_full_tokens_ratio
    if serving.accounting in SGLANG_ACCOUNTINGS and is_v41_stage(model) and is_unset(ratio):
        return DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO
    return float(ratio)
