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

The budget: ref-002's ``DSV4PoolConfigurator`` counts c4 and c128 layers only; kvpools' ``--accounting sglang``
follows SGLang 0.5.23's configurator for a model with these ratios instead, which prices the kv_source pools,
the pair state and their reserved pages (:mod:`.v41_budget`); ``--accounting exact`` solves over everything
built.

The pools' shapes and bytes are :mod:`.buffers`' (``LowIndexGeometry``, ``LowRatioBuffers``,
``low_ratio_buffers``, ``low_ratio_layout``); this module holds the source rules and the refusals.
"""

from __future__ import annotations

from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.values import ModelSpec, Serving

from .memo import per_model

__all__ = [
    "DSV41_INDEX_PAGE_SIZE",
    "LOW_RATIOS",
    "PAIR_STATE_POOL",
    "index_pool_name",
    "kv_pool_name",
    "low_ratio_problems",
    "pair_ring_size",
    "sources_by_ratio",
    "v41_problems",
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


@per_model
def _ratios(model: ModelSpec) -> tuple[int, ...]:
    """``model_config.compress_ratios``: every listed ratio (decoder layers, then MTP layers)."""
    listed = model.params.get("compress_ratios")
    if listed is not None:
        return tuple(int(r) for r in listed)
    return tuple(int(layer.params.get("compress_ratio", 0)) for layer in model.layers)


@per_model
def _low_layers(model: ModelSpec, start: int, end: int) -> tuple[int, ...]:
    """The stage's layers of compress ratio 1 or 2."""
    ratios = _ratios(model)
    return tuple(i for i in range(start, end) if ratios[i] in LOW_RATIOS)


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


V41_MODEL_TYPE = "deepseek_v41"
SGLANG_V41_UNSUPPORTED = "DeepSeek-V4.1 does not support {feature} yet; disable it to serve this model."


def v41_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """``validate_deepseek_v41_features`` (``arg_groups/deepseek_v4_hook.py``): what SGLang 0.5.23 refuses for a
    ``model_type`` ``deepseek_v41`` checkpoint, in its words (the features kvpools has options for)."""
    if model.model_type != V41_MODEL_TYPE:
        return []
    o = option
    unsupported = [
        ("speculative decoding other than DSpark", serving.speculative, o("speculative_algorithm")),
        ("HiSparse", serving.enable_hisparse, o("enable_hisparse")),
        ("pipeline parallelism", serving.pp_size > 1, o("pp_size")),
    ]
    return [
        f"{model.name}: SGLang raises '{SGLANG_V41_UNSUPPORTED.format(feature=feature)}' Drop {flag}."
        for feature, enabled, flag in unsupported
        if enabled
    ]


def low_ratio_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang asserts for ratio-1/2 layers (their host mirrors are :mod:`.host`'s)."""
    start, end = rank_layer_range(model, serving)
    low_layers = _low_layers(model, start, end)
    if not low_layers:
        return []
    ratios = _ratios(model)
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
    return problems
