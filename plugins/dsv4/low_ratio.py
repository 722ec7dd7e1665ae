"""DeepSeek-V4.1's low compress ratios 1 and 2: the kv_source layers' pools (issue 33).

SGLang 0.5.23's ``DeepSeekV4TokenToKVPool`` (``srt/mem_cache/deepseek_v4_memory_pool.py``; ref-000
``_build_dsv4_kv_pool`` lines 1359-1363 pass ``kv_source_layers = hf_config.kv_source_layer_ids`` and
``full_size = full_max_total_num_tokens``):

* ``collect_sources_by_ratio``: of a stage's layers with ratio 1 or 2, only those listed in
  ``kv_source_layer_ids`` own compressed storage; every other ratio-1/2 layer reads the nearest preceding source
  of its ratio (``source_layer_of``, which asserts there is one);
* ``_init_compressed_pools``: per low ratio ``r`` with sources, one KV pool of ``full_size // r`` slots paged by
  ``P // r`` (``P`` the page size), one layer per source, in ``compressed_kv_layout(r)`` (V4 next to a V4 main
  cache; V41_FP4 by default next to V4.1, :mod:`.layouts`); its pages are ``_num_dsv4_physical_kv_pages``:
  ``ceil((size + P) / (P // r))``;
* one fp4 indexer pool per low ratio (``force_fp4=True``): ``(full_size + P) // r`` slots paged by
  ``DSV41_INDEX_PAGE_SIZE`` (64; 128 where DeepGEMM ships its paged sparse MQA kernel on SM100, which kvpools
  does not see), ``index_head_dim / 2 + index_head_dim / 32`` bytes a slot (68 at 128 dims), pages
  ``ceil((size + 64) / 64)``;
* ``_make_pair_state_pool`` for each ratio-2 source (``_init_paged_compress_states``): a float32
  ``CompressStatePool`` of ``num_req_slots x ring`` slots (ring ``get_compress_state_ring_size(2)``: 2, or the
  power of two ``1 << (draft tokens + 1).bit_length()`` under speculative decoding), ``2 x (nope + rope)``
  floats a row, ``ceil((size + ring + 1) / 2) x 2`` rows.  Ratio-1 layers keep no state; neither low ratio has
  indexer states.

The budget: ref-002's ``DSV4PoolConfigurator`` counts c4 and c128 layers only, so ``--accounting sglang``
charges the low-ratio layers their SWA rows alone (SGLang's counts, token-exact) while the pools built hold the
pools above; ``--accounting exact`` solves over everything built.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import attrs

from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.values import FULL_TOKENS, ModelSpec, PoolSpec, Serving

from .buffers import KVRowGeometry, StateGeometry, _paged_pool, _request_pool, layout_row_bytes
from .layouts import compressed_layout

__all__ = [
    "LOW_RATIOS",
    "LowIndexGeometry",
    "LowRatioBuffers",
    "low_ratio_buffers",
    "low_ratio_layout",
    "low_ratio_problems",
    "pair_ring_size",
    "sources_by_ratio",
]

LOW_RATIOS = (1, 2)
DSV41_INDEX_PAGE_SIZE = 64
FP4_SCALE_BLOCK = 32  # get_dsv4_indexer_bytes_per_token(fp4): d // 2 payload + d // 32 scale bytes
SGLANG_NO_SOURCE_MESSAGE = "has no kv_source layer"


def kv_pool_name(ratio: int) -> str:
    return f"kv_c{ratio}"


def index_pool_name(ratio: int) -> str:
    return f"indexer_c{ratio}"


PAIR_STATE_POOL = "c2_pair_state"


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


def _ratios(model: ModelSpec) -> list[int]:
    """``model_config.compress_ratios``: every listed ratio (decoder layers, then MTP layers)."""
    listed = model.params.get("compress_ratios")
    if listed is not None:
        return [int(r) for r in listed]
    return [int(layer.params.get("compress_ratio", 0)) for layer in model.layers]


def sources_by_ratio(model: ModelSpec, stage: range) -> dict[int, list[int]]:
    """``collect_sources_by_ratio``'s ratio-1/2 entries: the stage's kv_source layers of each low ratio."""
    ratios = _ratios(model)
    sources = [int(i) for i in model.params.get("kv_source_layer_ids", ())]
    found: dict[int, list[int]] = {}
    for ratio in LOW_RATIOS:
        layers = [i for i in sources if i in stage and ratios[i] == ratio]
        if layers:
            found[ratio] = layers
    return found


def pair_ring_size(serving: Serving) -> int:
    """``get_compress_state_ring_size(2, draft tokens)``: 2, or ``1 << (D + 1).bit_length()`` speculative."""
    draft_tokens = (serving.speculative_num_draft_tokens or 0) if serving.speculative else 0
    if draft_tokens <= 0:
        return 2
    return 1 << (draft_tokens + 1).bit_length()


def low_ratio_buffers(model: ModelSpec, serving: Serving, full_tokens: int, num_req_slots: int) -> LowRatioBuffers:
    """The ratio-1/2 pools ``DeepSeekV4TokenToKVPool`` builds on this rank (none for a V4 model)."""
    start, end = rank_layer_range(model, serving)
    found = sources_by_ratio(model, range(start, end))
    if not found:
        return LowRatioBuffers((), (), None)
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


_Make = Callable[[str], PoolSpec]


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


def low_ratio_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang asserts for ratio-1/2 layers, and what kvpools does not model with them."""
    start, end = rank_layer_range(model, serving)
    ratios = _ratios(model)
    low_layers = [i for i in range(start, end) if ratios[i] in LOW_RATIOS]
    if not low_layers:
        return []
    o = option
    problems: list[str] = []
    found = sources_by_ratio(model, range(start, end))
    orphans = [i for i in low_layers if not any(s <= i for s in found.get(ratios[i], []))]
    if orphans:
        first = orphans[0]
        stage = f" of pipeline stage [{start}, {end})" if (start, end) != (0, len(model.layers)) else ""
        problems.append(
            f"{model.name}: layer {first} (compress ratio {ratios[first]}){stage} {SGLANG_NO_SOURCE_MESSAGE}: SGLang "
            f"fails in source_layer_of ('layer {first} (ratio {ratios[first]}) has no kv_source layer'); "
            f"kv_source_layer_ids must name a layer of the same ratio at or before it in the same stage. Fix "
            f"'kv_source_layer_ids' in the config, or move {o('pp_layer_partition')} so the source and its readers "
            f"share a stage."
        )
    if serving.enable_hierarchical_cache:
        problems.append(
            f"kvpools does not model DeepSeek-V4's host tier for the ratio-1/2 (kv_source) pools yet. Drop "
            f"{o('enable_hierarchical_cache')}."
        )
    return problems
