"""vLLM 0.33's KV-cache planning: grouping, page-size unification, blocks, the memory check, capacity.

Mirrors ``vllm/v1/core/kv_cache_planning.py`` and ``kv_cache_utils.py`` of vLLM 0.33.0 (line numbers below
are that release's), for the default ``DefaultKVCacheConfigBuilder``.  The KV-cache layout is resolved from the
layers' backends as vLLM's engine core does (:func:`resolve_kv_cache_layout`): ``LBNHC`` unless a backend
declares its layouts (DeepSeek-V4's indexer: ``BLHNC``); a block-outermost layout packs mixed page sizes side by
side in each block (:func:`packed_kv_cache_groups`).  Left out, and refused by name where a model would need
them: HiSparse, hidden-state layers, ``--disable-hybrid-kv-cache-manager``, a model's own
``get_kv_cache_groups``, ``VLLM_KV_CACHE_LAYOUT`` and a KV connector's layout.

The differential tests (``tests/vllm/test_differential.py``) run vLLM's own functions on the same specs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import attrs

from kvpools_core.errors import ConfigError, InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.parts.vllm.specs import (
    KV_CACHE_LAYOUTS,
    SLIDING_WINDOW_MLA_MERGE_FIELDS,
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    cdiv,
    round_up,
)
from kvpools_core.parts.vllm.specs import (
    VllmLimits as VllmLimits,
)

GiB = 1 << 30
CONSERVING_MEMORY_URL = "https://docs.vllm.ai/en/latest/configuration/conserving_memory/"

GroupSpec = KVCacheSpec | UniformTypeKVCacheSpecs


class VllmMemoryError(InsufficientMemoryError):
    """vLLM would refuse to start: its ``ValueError`` text, word for word, with the numbers it would print."""


def _str_tuple(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


@attrs.frozen
class KVCacheGroupSpec:
    """``KVCacheGroupSpec``: layers sharing one block table; ``kv_cache_spec`` is their merged spec."""

    layer_names: tuple[str, ...] = attrs.field(converter=_str_tuple)
    kv_cache_spec: GroupSpec

    def layer_spec(self, layer_name: str) -> KVCacheSpec:
        """``_get_per_layer_spec`` (L559)."""
        spec = self.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            return spec.kv_cache_specs[layer_name]
        return spec

    def blocks_per_request(self, limits: VllmLimits) -> int:
        """Blocks one request at ``max_model_len`` holds in this group: ``cdiv(max_memory_usage, page)``."""
        spec = self.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            return spec.max_memory_usage_pages(limits)
        return cdiv(spec.max_memory_usage_bytes(limits), spec.page_size_bytes)


def mamba_cache_mode_of(worker_specs: Iterable[Mapping[str, KVCacheSpec]]) -> str:
    """The ``cache_config.mamba_cache_mode`` the layer specs were built under: every ``MambaSpec`` records it
    (``MambaBase.get_kv_cache_spec``, ``mamba/abstract.py`` L83); ``"none"`` for a model without Mamba layers."""
    modes = {
        spec.mamba_cache_mode for worker in worker_specs for spec in worker.values() if isinstance(spec, MambaSpec)
    }
    if len(modes) > 1:
        raise ConfigError(f"the Mamba layers were built under different mamba_cache_mode values {sorted(modes)}.")
    return modes.pop() if modes else "none"


# ---------------------------------------------------------------------------
# grouping (get_kv_cache_groups, L1113)
# ---------------------------------------------------------------------------


def _mergeable(first: KVCacheSpec, specs: Sequence[KVCacheSpec]) -> bool:
    """``first.merge(specs)`` succeeds: for the modelled specs, exactly when they are all equal, except
    ``SlidingWindowMLASpec.merge`` (L1036-1080), which compares only :data:`SLIDING_WINDOW_MLA_MERGE_FIELDS`."""
    if isinstance(first, SlidingWindowMLASpec):
        return all(
            isinstance(spec, SlidingWindowMLASpec)
            and all(getattr(spec, name) == getattr(first, name) for name in SLIDING_WINDOW_MLA_MERGE_FIELDS)
            for spec in specs
        )
    return all(spec == first for spec in specs)


def merged_spec(specs: Sequence[KVCacheSpec]) -> KVCacheSpec:
    """``specs[0].merge(specs)`` (``create_kv_cache_group_specs``, L187-215): the group's spec is its first layer's,
    except that ``MLAAttentionSpec.merge`` / ``SlidingWindowMLASpec.merge`` (L750-806, L1036-1080) rebuild it without
    ``alignment``, keeping the padded page (so a later block-size copy is no longer re-padded)."""
    first = specs[0]
    if isinstance(first, (MLAAttentionSpec, SlidingWindowMLASpec)) and first.alignment is not None:
        return attrs.evolve(first, alignment=None)
    return first


# ---------------------------------------------------------------------------
# the KV-cache layout (resolve_kv_cache_layout, v1/attention/backends/utils.py L243-383)
# ---------------------------------------------------------------------------

DEFAULT_LAYOUT_PREFERENCE = ("LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC")
"""``_DEFAULT_LAYOUT_PREFERENCE`` (``v1/attention/backends/utils.py`` L229-236): the order when no backend declares."""


def is_block_outermost(layout: str) -> bool:
    """``KVCacheLayout.is_block_outermost``: the block axis first."""
    return layout[0] == "B"


def _is_block_compact(layout: str) -> bool:
    """``KVCacheLayout.is_block_compact``: the layer and block axes outermost."""
    return set(layout[:2]) == {"L", "B"}


def declared_layouts(specs: Iterable[KVCacheSpec]) -> list[str]:
    """``get_supported_kv_cache_layouts`` (L243-280) over the layers' backends: the distinct declarations (a spec's
    ``supported_layouts``), intersected, ordered by how many declarations put a layout first (ties in enum order);
    the default preference when nothing declares.  Distinct declarations stand for distinct backends."""
    declarations: list[tuple[str, ...]] = []
    for spec in specs:
        if spec.supported_layouts is not None and spec.supported_layouts not in declarations:
            declarations.append(spec.supported_layouts)
    if not declarations:
        return list(DEFAULT_LAYOUT_PREFERENCE)
    if len(declarations) == 1:
        return list(declarations[0])
    firsts = [declaration[0] for declaration in declarations]
    common = set.intersection(*map(set, declarations))
    candidates = sorted((name for name in KV_CACHE_LAYOUTS if name in common), key=firsts.count, reverse=True)
    if not candidates:
        raise UnsupportedCombinationError(
            f"vLLM's attention backends share no KV-cache layout (they declare {declarations})."
        )
    return candidates


def resolve_kv_cache_layout(worker_specs: Sequence[Mapping[str, KVCacheSpec]]) -> str:
    """``resolve_kv_cache_layout`` (L293-383) without ``VLLM_KV_CACHE_LAYOUT`` or a KV connector: every worker's
    declared layouts (they must agree), narrowed to block-compact layouts when the layers' ``(H, N, page)`` shapes
    differ, and to block-outermost ones when DCP-sharded and replicated attention caches mix page sizes."""
    per_worker = [declared_layouts(worker.values()) for worker in worker_specs]
    if any(layouts != per_worker[0] for layouts in per_worker[1:]):
        raise UnsupportedCombinationError(
            f"Workers disagree on supported KV cache layouts: {per_worker} (vLLM asserts this): the pipeline stages "
            "run different attention backends; choose a --pipeline-parallel-size or VLLM_PP_LAYER_PARTITION that "
            "gives every stage the same kinds of layers."
        )
    candidates = per_worker[0]
    specs = [spec for worker in worker_specs for spec in worker.values()]
    attention = [spec for spec in specs if isinstance(spec, AttentionSpec)]
    if len(attention) != len(specs) and candidates != list(DEFAULT_LAYOUT_PREFERENCE):
        raise UnsupportedCombinationError(
            "vLLM accounting does not model a declared KV-cache layout beside Mamba layers."
        )
    shapes = {(spec.num_kv_heads, spec.num_states, spec.page_size_bytes) for spec in attention}
    if len(shapes) > 1:
        candidates = [name for name in candidates if _is_block_compact(name)]
        if not candidates:
            raise UnsupportedCombinationError(
                "Specs with mixed HNC shapes need a block-compact layout, but none is in every supported set."
            )
    if len({spec.dcp_sharded for spec in attention}) > 1 and len({spec.page_size_bytes for spec in specs}) > 1:
        candidates = [name for name in candidates if is_block_outermost(name)]
        if not candidates:
            raise UnsupportedCombinationError(
                "DCP with a replicated draft and mixed KV page sizes requires a block-outer KV cache layout."
            )
    return candidates[0]


def is_uniform_type(specs: Mapping[str, KVCacheSpec]) -> bool:
    """``UniformTypeKVCacheSpecs.is_uniform_type`` (``kv_cache_interface.py`` L1343): one block size, one
    ``dcp_sharded``, and the first spec's ``is_uniform_with_collection`` (the registry's base classes:
    MLA groups with full attention, L2708 of ``single_type_kv_cache_manager.py``)."""
    values = list(specs.values())
    if len({spec.block_size for spec in values}) > 1:
        return False
    if len({getattr(spec, "dcp_sharded", False) for spec in values}) > 1:
        return False
    first = values[0]
    if isinstance(first, SlidingWindowMLASpec):  # L1082-1090
        return all(
            isinstance(s, SlidingWindowMLASpec)
            and s.sliding_window == first.sliding_window
            and s.bounded_replay == first.bounded_replay
            for s in values
        )
    if isinstance(first, CircularBufferSpec):  # L989-994
        return all(isinstance(s, CircularBufferSpec) for s in values)
    if isinstance(first, FullAttentionSpec):
        return all(isinstance(spec, FullAttentionSpec) for spec in values)
    if isinstance(first, SlidingWindowSpec):
        return all(isinstance(s, SlidingWindowSpec) and s.sliding_window == first.sliding_window for s in values)
    if isinstance(first, ChunkedLocalAttentionSpec):
        return all(
            isinstance(s, ChunkedLocalAttentionSpec) and s.attention_chunk_size == first.attention_chunk_size
            for s in values
        )
    if isinstance(first, MambaSpec):
        return all(
            isinstance(s, MambaSpec)
            and s.num_speculative_blocks == first.num_speculative_blocks
            and s.num_prefill_checkpoint_blocks == first.num_prefill_checkpoint_blocks
            and s.prefill_checkpoint_alignment == first.prefill_checkpoint_alignment
            and s.page_size_bytes == first.page_size_bytes
            for s in values
        )
    raise UnsupportedCombinationError(f"vLLM accounting does not model {type(first).__name__} layers.")


def unify_kv_cache_spec_page_size(specs: Mapping[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """``unify_kv_cache_spec_page_size`` (L346): every page raised to the largest one.

    Attention pages that divide the largest grow their block size by the ratio; Mamba pages, and non-MLA
    attention pages that do not divide it, are padded (``page_size_padded``); an MLA page that does not divide
    it cannot be padded, and vLLM raises ``NotImplementedError`` (:class:`_CannotUnify` here).
    """
    page_sizes = {spec.page_size_bytes for spec in specs.values()}
    if len(page_sizes) <= 1:
        return dict(specs)
    max_page = max(page_sizes)
    unified: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        page = spec.page_size_bytes
        if page == max_page:
            unified[name] = spec
        elif isinstance(spec, MambaSpec):
            unified[name] = attrs.evolve(spec, page_size_padded=max_page)
        elif max_page % page == 0:
            unified[name] = spec.with_block_size(spec.block_size * (max_page // page))
        elif isinstance(spec, AttentionSpec) and not isinstance(spec, MLAAttentionSpec):
            unified[name] = attrs.evolve(spec, page_size_padded=max_page)
        else:
            raise _CannotUnify(
                f"Layer {name}: page size is not divisible by the maximum page size and cannot be padded. "
                "Padding is only supported for non-MLA attention layers."
            )
        if unified[name].page_size_bytes != max_page:  # a spec with an alignment re-pads itself when rebuilt
            raise UnsupportedCombinationError(
                f"Layer {name}: its page becomes {unified[name].page_size_bytes} bytes, not the maximum {max_page}, "
                "when unified (its alignment padding is applied again); vLLM asserts they are equal and fails to "
                "start."
            )
    return unified


class _CannotUnify(UnsupportedCombinationError):
    """vLLM's ``NotImplementedError`` from ``unify_kv_cache_spec_page_size``."""


def _full_allocation_fallback(specs: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec] | None:
    """``_try_get_full_allocation_fallback_groups`` (L819): MLA beside regular sliding-window layers whose pages
    cannot be unified: the sliding-window layers are allocated as full attention (``_promote_local_kv_cache_specs``,
    L744), all in one uniform-type group."""
    values = list(specs.values())
    if any(isinstance(spec, (ChunkedLocalAttentionSpec, SlidingWindowMLASpec)) for spec in values):
        return None
    if not (
        any(isinstance(s, MLAAttentionSpec) for s in values) and any(isinstance(s, SlidingWindowSpec) for s in values)
    ):
        return None
    full_block_sizes = {spec.block_size for spec in values if isinstance(spec, FullAttentionSpec)}
    full_block_size = next(iter(full_block_sizes)) if len(full_block_sizes) == 1 else None
    promoted: dict[str, KVCacheSpec] = {}
    for name, spec in specs.items():
        if isinstance(spec, SlidingWindowSpec):
            block_size = full_block_size or spec.block_size
            padded = None
            if spec.page_size_padded is not None:
                padded = max(spec.page_size_padded, spec.unpadded_page_size_bytes * block_size // spec.block_size)
            promoted[name] = FullAttentionSpec(
                block_size=block_size,
                num_kv_heads=spec.num_kv_heads,
                head_size=spec.head_size,
                head_size_v=spec.head_size_v,
                dtype_bytes=spec.dtype_bytes,
                page_size_padded=padded,
                state_content_bytes=spec.state_content_bytes,
                dcp_sharded=spec.dcp_sharded,
                max_tp_shards=spec.max_tp_shards,
                tokens_per_state=spec.tokens_per_state,
                block_stride_alignment=spec.block_stride_alignment,
            )
        else:
            promoted[name] = spec
    if not is_uniform_type(promoted):
        return None
    return [KVCacheGroupSpec(tuple(promoted), _uniform_type(promoted))]


def _uniform_type(specs: Mapping[str, KVCacheSpec]) -> UniformTypeKVCacheSpecs:
    return UniformTypeKVCacheSpecs(block_size=next(iter(specs.values())).block_size, kv_cache_specs=dict(specs))


def _groups_uniform_page_size(specs: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """``_get_kv_cache_groups_uniform_page_size`` (L416): bucket equal specs (first-seen order), split each bucket
    into groups of ``min`` layers (``max`` when ``max < 1.5 * min``), taking ``layers[i::num_groups]``."""
    same_spec: dict[KVCacheSpec, list[str]] = {}
    for name, spec in specs.items():
        same_spec.setdefault(spec, []).append(name)
    merged: list[tuple[list[KVCacheSpec], list[str]]] = []  # L498-516: join buckets whose specs merge
    for spec, names in same_spec.items():
        for bucket_specs, bucket_names in merged:
            if _mergeable(bucket_specs[0], [*bucket_specs, spec]):
                bucket_specs.append(spec)
                bucket_names.extend(names)
                break
        else:
            merged.append(([spec], list(names)))
    buckets = {bucket_specs[0]: names for bucket_specs, names in merged}
    sizes = [len(names) for names in buckets.values()]
    group_size = min(sizes)
    if max(sizes) < min(sizes) * 1.5:
        group_size = max(sizes)
    groups: list[KVCacheGroupSpec] = []
    for names in buckets.values():
        num_groups = cdiv(len(names), group_size)
        for i in range(num_groups):
            group_names = names[i::num_groups]
            groups.append(KVCacheGroupSpec(tuple(group_names), merged_spec([specs[n] for n in group_names])))
    return groups


def approximate_gcd(values: Sequence[int], lower_bound: int) -> int:
    """``_approximate_gcd`` (L879-911): the chunk ``d`` in ``[max(1, lower_bound), max(values)]`` that pads the values
    least when each is rounded up to a multiple of it (ties: the larger ``d``)."""
    min_d = max(1, lower_bound)
    best_d, best_pad = min_d, None
    for d in range(min_d, max(values) + 1):
        pad = sum((d - value % d) % d for value in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best_d):
            best_d, best_pad = d, pad
    return best_d


def packed_kv_cache_groups(specs: Mapping[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """``_get_packed_kv_cache_groups`` (L914-1041), for a block-outermost layout and mixed page sizes.

    Layers are bucketed greedily into uniform types (first-seen order); a bucket whose page sizes each have the
    same layer count is a repeating pattern, split into groups of ``repeats_per_group`` pattern repeats
    (:func:`approximate_gcd` of the balanced buckets' repeat counts, at least the largest mixed-page bucket's);
    any other bucket stays one group.  Unsplit sliding-window buckets are state buckets, split until a group fits
    the block the others need.  Every group is a ``UniformTypeKVCacheSpecs``: the layers' pages side by side.
    """
    buckets: list[dict[str, KVCacheSpec]] = []
    for name, layer in specs.items():
        for bucket in buckets:
            if is_uniform_type({**bucket, name: layer}):
                bucket[name] = layer
                break
        else:
            buckets.append({name: layer})
    bucketed = []
    for bucket in buckets:
        page_size_layers: dict[int, list[str]] = {}
        for name, layer in bucket.items():
            page_size_layers.setdefault(layer.page_size_bytes, []).append(name)
        balanced = len({len(names) for names in page_size_layers.values()}) == 1
        bucketed.append((_uniform_type(bucket), page_size_layers, balanced))
    min_repeats = max(
        (spec.get_max_layers_per_page_size() for spec, pages, balanced in bucketed if balanced and len(pages) > 1),
        default=0,
    )
    repeats = (
        approximate_gcd(
            [spec.get_max_layers_per_page_size() for spec, _, balanced in bucketed if balanced], min_repeats
        )
        if min_repeats
        else None
    )

    def num_groups_for(spec: UniformTypeKVCacheSpecs, balanced: bool) -> int:
        return cdiv(spec.get_max_layers_per_page_size(), repeats) if balanced and repeats is not None else 1

    def widest_group_bytes(pages: Mapping[int, list[str]], count: int) -> int:
        return sum(cdiv(len(names), count) * page for page, names in pages.items())

    def is_state_bucket(spec: UniformTypeKVCacheSpecs) -> bool:
        first = next(iter(spec.kv_cache_specs.values()))
        return isinstance(first, (MambaSpec, CircularBufferSpec)) or (
            repeats is None and isinstance(first, SlidingWindowSpec)
        )

    anchor = max(
        widest_group_bytes(pages, len(spec.kv_cache_specs) if is_state_bucket(spec) else num_groups_for(spec, balanced))
        for spec, pages, balanced in bucketed
    )
    groups: list[KVCacheGroupSpec] = []
    for spec, pages, balanced in bucketed:
        count = num_groups_for(spec, balanced)
        if anchor and is_state_bucket(spec):
            states_per_block = max(anchor // next(iter(spec.kv_cache_specs.values())).page_size_bytes, 1)
            count = max(count, cdiv(len(spec.kv_cache_specs), states_per_block))
        if count == 1:
            groups.append(KVCacheGroupSpec(tuple(spec.kv_cache_specs), spec))
            continue
        pattern_repeats = list(zip(*pages.values(), strict=False))
        for i in range(count):
            names = [name for repeat in pattern_repeats[i::count] for name in repeat]
            groups.append(KVCacheGroupSpec(tuple(names), _uniform_type({n: spec.kv_cache_specs[n] for n in names})))
    grouped = [name for group in groups for name in group.layer_names]
    if len(grouped) != len(specs):  # _check_exact_partition (L1218-1230)
        raise UnsupportedCombinationError(
            f"KV cache groups miss layers: {sorted(set(specs) - set(grouped))} (vLLM asserts this when packing an "
            "unbalanced bucket of mixed page sizes)."
        )
    return groups


def get_kv_cache_groups(specs: Mapping[str, KVCacheSpec], layout: str | None = None) -> list[KVCacheGroupSpec]:
    """``get_kv_cache_groups`` (L1113) for the default builder, in ``layout`` (resolved from the specs when None).

    One group when every spec is the same; one ``UniformTypeKVCacheSpecs`` group when they are one type; in a
    block-outermost layout, mixed pages packed side by side (:func:`packed_kv_cache_groups`); otherwise pages
    unified (falling back to full allocation for MLA beside sliding-window layers) and split into groups of equal
    layer counts.
    """
    if not specs:
        return []
    values = list(specs.values())
    if _mergeable(values[0], values):
        return [KVCacheGroupSpec(tuple(specs), merged_spec(values))]
    if is_uniform_type(specs):
        return [KVCacheGroupSpec(tuple(specs), _uniform_type(specs))]
    if layout is None:
        layout = resolve_kv_cache_layout([specs])
    if is_block_outermost(layout) and len({spec.page_size_bytes for spec in values}) > 1:
        return packed_kv_cache_groups(specs)
    try:
        unified = unify_kv_cache_spec_page_size(specs)
    except _CannotUnify:
        fallback = _full_allocation_fallback(specs)
        if fallback is None:
            raise
        return fallback
    return _groups_uniform_page_size(unified)


# ---------------------------------------------------------------------------
# blocks, memory check, max_model_len (L574, L1253, L1288, L50)
# ---------------------------------------------------------------------------


def _group_layer_specs(groups: Sequence[KVCacheGroupSpec]) -> dict[str, KVCacheSpec]:
    return {name: group.layer_spec(name) for group in groups for name in group.layer_names}


def bytes_per_block(groups: Sequence[KVCacheGroupSpec], layout: str | None = None) -> int:
    """``_get_kv_cache_bytes_per_block`` (L574-605): the largest group's sum of its layers' pages.

    Every group draws block ids from one pool whose block spans all groups' layers (they alias from byte 0),
    so the widest group sets the block's bytes: a group with fewer layers wastes the difference (the
    "padding layers" vLLM warns about).  Layer-outer layouts round each layer's page up to its
    ``get_block_stride_alignment``; block-outer ones round the block up to the lcm of them all.  ``layout`` is
    resolved from the groups' layer specs when None.
    """
    if layout is None:
        layout = resolve_kv_cache_layout([_group_layer_specs(groups)])
    if not is_block_outermost(layout):
        return max(
            sum(
                round_up(spec.page_size_bytes, spec.get_block_stride_alignment())
                for spec in (group.layer_spec(name) for name in group.layer_names)
            )
            for group in groups
        )
    widest = max(sum(group.layer_spec(name).page_size_bytes for name in group.layer_names) for group in groups)
    alignments = [group.layer_spec(name).get_block_stride_alignment() for group in groups for name in group.layer_names]
    return round_up(widest, math.lcm(*alignments))


def max_memory_usage_bytes(groups: Sequence[KVCacheGroupSpec], limits: VllmLimits, layout: str | None = None) -> int:
    """``_max_memory_usage_bytes_from_groups`` (L1253): one request's blocks over all groups x bytes per block."""
    if not groups:
        return 0
    return bytes_per_block(groups, layout) * sum(group.blocks_per_request(limits) for group in groups)


def estimate_max_model_len(
    groups: Sequence[KVCacheGroupSpec], limits: VllmLimits, available_memory: int, layout: str | None = None
) -> int:
    """``_estimate_max_model_len_from_groups`` (L1288): the largest ``max_model_len`` in ``[1, limits.max_model_len]``
    whose one-request need fits ``available_memory``, by vLLM's binary search; 0 when one token does not fit."""
    if layout is None and groups:
        layout = resolve_kv_cache_layout([_group_layer_specs(groups)])

    def fits(model_len: int) -> bool:
        return max_memory_usage_bytes(groups, limits.with_max_model_len(model_len), layout) <= available_memory

    left, right = 1, limits.max_model_len
    if not fits(left):
        return 0
    result = 1
    while left <= right:
        mid = (left + right) // 2
        if fits(mid):
            result = mid
            left = mid + 1
        else:
            right = mid - 1
    return result


def format_gib(num_bytes: int) -> str:
    """``vllm.utils.mem_utils.format_gib``: GiB rounded to 2 places, as Python prints the float."""
    return f"{round(num_bytes / GiB, 2)}"


def check_enough_kv_cache_memory(
    groups: Sequence[KVCacheGroupSpec], limits: VllmLimits, available_memory: int, layout: str | None = None
) -> None:
    """``_check_enough_kv_cache_memory`` (L50): raise vLLM's error when one request at ``max_model_len`` does not
    fit ``available_memory`` (the memory after the null block); the text is vLLM's, word for word."""
    if available_memory <= 0:
        raise VllmMemoryError(
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
            "the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). "
            f"See {CONSERVING_MEMORY_URL} for more details."
        )
    needed = max_memory_usage_bytes(groups, limits, layout)
    if needed > available_memory:
        estimated = estimate_max_model_len(groups, limits, available_memory, layout)
        estimated_msg = (
            f"Based on the available memory, the estimated maximum model length is {estimated}. "
            if estimated > 0
            else ""
        )
        raise VllmMemoryError(
            f"To serve at least one request with the model's max seq len ({limits.max_model_len}), "
            f"({format_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({format_gib(available_memory)} GiB). {estimated_msg}Try increasing `gpu_memory_utilization` (which "
            "also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the "
            f"engine. See {CONSERVING_MEMORY_URL} for more details."
        )


# ---------------------------------------------------------------------------
# pipeline parallel and the whole plan (get_kv_cache_configs, L1461)
# ---------------------------------------------------------------------------


def project_groups_to_worker(groups: Sequence[KVCacheGroupSpec], worker_layers: set[str]) -> list[KVCacheGroupSpec]:
    """``_project_kv_cache_groups_to_worker`` (L1413): each global group restricted to one worker's layers
    (a group may end up empty on a worker; it still counts in a request's blocks)."""
    projected = []
    for group in groups:
        names = tuple(name for name in group.layer_names if name in worker_layers)
        spec = group.kv_cache_spec
        if names and len(names) != len(group.layer_names) and isinstance(spec, UniformTypeKVCacheSpecs):
            spec = UniformTypeKVCacheSpecs(
                block_size=spec.block_size, kv_cache_specs={name: spec.kv_cache_specs[name] for name in names}
            )
        projected.append(KVCacheGroupSpec(names, spec))
    return projected


@attrs.frozen(kw_only=True)
class VllmKVCachePlan:
    """What vLLM 0.33 computes at start-up, under its own names.

    ``num_gpu_blocks`` counts the permanent null block (``BlockPool`` pops block 0 and never frees it), so
    ``num_gpu_blocks - 1`` are usable; ``max_concurrency`` and ``kv_cache_size_tokens`` are what the engine
    logs as "GPU KV cache size: N tokens, Maximum concurrency for L tokens per request: X.XXx"
    (``kv_cache_utils.py`` L1061-1154): ``num_gpu_blocks / Σ_groups cdiv(max_memory_usage, page)`` and
    ``int(max_concurrency * max_model_len)`` -- for hybrid models a block count times ``max_model_len``, not
    tokens any pool holds.  ``max_model_len`` is the auto-fitted value under ``--max-model-len auto``.
    """

    groups: tuple[KVCacheGroupSpec, ...]
    num_gpu_blocks: int
    bytes_per_block: tuple[int, ...]
    available_kv_cache_memory: tuple[int, ...]
    max_model_len: int
    blocks_per_request: int
    max_concurrency: float
    kv_cache_size_tokens: int
    auto_fit: bool = False
    auto_fit_memory: int | None = None
    """Under auto-fit, the limiting worker's memory after the null block, which vLLM's auto-fit line names."""
    kv_cache_layout: str = "LBNHC"
    """The layout vLLM resolves (:func:`resolve_kv_cache_layout`; it logs "Using BLHNC KV cache layout.")."""

    @property
    def block_sizes(self) -> tuple[int, ...]:
        """Each group's block size (tokens per block)."""
        return tuple(group.kv_cache_spec.block_size for group in self.groups)

    @property
    def page_sizes(self) -> tuple[int, ...]:
        """Each group's page bytes (``page_size_bytes`` of the group spec)."""
        return tuple(group.kv_cache_spec.page_size_bytes for group in self.groups)

    @property
    def log_line(self) -> str:
        """The line vLLM logs at start-up (``update_kv_cache_capacity``, ``kv_cache_utils.py`` L1136)."""
        return (
            f"GPU KV cache size: {self.kv_cache_size_tokens:,} tokens, Maximum concurrency for "
            f"{self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x"
        )

    @property
    def kv_cache_tensor_bytes(self) -> tuple[int, ...]:
        """Each worker's KV-cache allocation: ``bytes_per_block * num_gpu_blocks``."""
        return tuple(per_block * self.num_gpu_blocks for per_block in self.bytes_per_block)


def plan_kv_cache(
    worker_specs: Sequence[Mapping[str, KVCacheSpec]],
    available_memory: Sequence[int],
    limits: VllmLimits,
    *,
    num_gpu_blocks_override: int | None = None,
    auto_fit_max_model_len: bool = False,
) -> VllmKVCachePlan:
    """``get_global_kv_cache_groups`` + ``get_kv_cache_configs`` (L1607, L1461) + ``update_kv_cache_capacity``.

    ``worker_specs`` holds each worker's layers (one mapping per pipeline stage; TP ranks of a stage are
    identical), ``available_memory`` each worker's ``available_kv_cache_memory`` in bytes.  With
    ``auto_fit_max_model_len`` (``--max-model-len auto``), ``limits.max_model_len`` is the model's derived
    maximum, lowered to the largest length every worker fits.  Raises :class:`VllmMemoryError` where vLLM
    raises its ``ValueError``.
    """
    if len(worker_specs) != len(available_memory) or not worker_specs:
        raise ConfigError("plan_kv_cache needs one available-memory figure per worker.")
    if num_gpu_blocks_override is not None and num_gpu_blocks_override <= 0:
        raise ConfigError(f"--num-gpu-blocks-override must be positive, got {num_gpu_blocks_override}.")
    merged: dict[str, KVCacheSpec] = {}
    for worker in worker_specs:
        for name, spec in worker.items():
            if name in merged and merged[name] != spec:
                raise ConfigError(f"layer {name!r} has different KV-cache specs on two workers.")
            merged.setdefault(name, spec)
    layout = resolve_kv_cache_layout(worker_specs)
    global_groups = get_kv_cache_groups(merged, layout)
    if not global_groups:
        raise UnsupportedCombinationError("an attention-free model has no KV cache to plan (vLLM uses 1 block).")
    projected = [project_groups_to_worker(global_groups, set(worker)) for worker in worker_specs]
    per_block = [bytes_per_block(groups, layout) for groups in projected]
    memory = list(available_memory)
    if num_gpu_blocks_override is not None:
        memory = [num_gpu_blocks_override * block for block in per_block]
    check_memory = [avail - block for avail, block in zip(memory, per_block, strict=True)]
    auto_fit_memory: int | None = None
    if auto_fit_max_model_len:
        fitted, auto_fit_memory = limits.max_model_len, check_memory[0]
        for groups, avail in zip(projected, check_memory, strict=True):
            worker_max = estimate_max_model_len(groups, limits, avail, layout)
            if worker_max < fitted:  # ``_auto_fit_max_model_len`` (L1367-1378): the first worker to set the min
                fitted, auto_fit_memory = worker_max, avail
        if fitted <= 0:
            raise VllmMemoryError(
                "Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token. "
                "Try increasing `gpu_memory_utilization`."
            )
        limits = limits.with_max_model_len(fitted)
    for groups, avail in zip(projected, check_memory, strict=True):
        check_enough_kv_cache_memory(groups, limits, avail, layout)
    num_blocks = min(avail // block for avail, block in zip(memory, per_block, strict=True))
    blocks_per_request = sum(group.blocks_per_request(limits) for group in global_groups)
    max_concurrency = num_blocks / blocks_per_request
    return VllmKVCachePlan(
        groups=tuple(global_groups),
        num_gpu_blocks=num_blocks,
        bytes_per_block=tuple(per_block),
        available_kv_cache_memory=tuple(memory),
        max_model_len=limits.max_model_len,
        blocks_per_request=blocks_per_request,
        max_concurrency=max_concurrency,
        kv_cache_size_tokens=int(max_concurrency * limits.max_model_len),
        auto_fit=auto_fit_max_model_len,
        auto_fit_memory=auto_fit_memory,
        kv_cache_layout=layout,
    )
