"""Hybrid sliding-window attention: a full pool and an SWA pool (gpt-oss, Gemma-2/3/4, MiMo-V2-Flash, Mistral).

Claims configs with sliding-window layers, in every form real configs use
(:mod:`.config`), and declines the rest.  Full-attention layers keep every
token; sliding layers only the window, so they get their own, smaller token
pool, sized by SGLang's ``HybridSWAPoolConfigurator`` /
``SWAChunkCapPoolConfigurator`` semantics (:mod:`.sizing`).  A model whose
every layer slides (Mistral-7B-v0.1) has one SWA pool and no full pool.

Built objects: :class:`.pool.SWAKVPool` (the two pools, the global→sub-pool
layer mapping and the full→SWA index mapping) and the allocators of
:mod:`.allocator` (a slot in both pools per token; the SWA slot is freed
when the token slides out of the window).

Hybrid MLA-SWA models (full layers MLA or DSA, sliding layers MLA with their
own latent dims, :mod:`.mla`) keep the same two token spaces, sizing and
allocator; their pools store latent rows (:class:`.mla_pool.SWAMLAKVPool`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from kvpools_core import for_architecture, hookimpl
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.attention import attention_cell_size, host_row_width_problems, scale_block_problems
from kvpools_core.parts.indexer import INDEX_EXTRA_SLOTS, INDEX_POOL
from kvpools_core.parts.sizing import SWA_MAPPING_POOL
from kvpools_core.parts.unified import SubPoolEntry
from kvpools_core.parts.unified_plan import (
    UNIFIED_FEATURE,
    ArenaMember,
    kv_entry_from_cell,
    serving_problems,
    unified_sizing,
)
from kvpools_core.values import Budget, CellPart, CellSize, ModelSpec, Plan, PoolSizing, Serving

from .config import ARCHITECTURE, FULL, SLIDING, parse_swa_config, sglang_serves_hybrid_swa
from .mla import full_row, index_bytes, is_dsa, is_latent, latent_problems, swa_row
from .sizing import (
    DRAFT_KV_ALGORITHMS,
    DRAFT_POOL,
    FULL_POOL,
    SWA_ALLOCATOR,
    SWA_POOL,
    SWA_TOKENS,
    draft_layer,
    draft_num_layers,
    sglang_shape,
    size_swa_pools,
)
from .traits import architecture_traits as architecture_traits
from .weights import estimate_weights as estimate_weights

if TYPE_CHECKING:
    from kvpools_core.pools.layout import BufferLayout

__all__ = ["ARCHITECTURE", "swa_cell_size"]

PRESET_DIR = Path(__file__).parent / "presets"


@hookimpl
def presets() -> dict[str, str]:
    return {path.stem: str(path) for path in sorted(PRESET_DIR.glob("*.json"))}


@hookimpl
def engine_features() -> dict[str, list[str]]:
    """SGLang 0.5.23 builds its unified memory pool for hybrid sliding-window models (``_init_unified_swa_pools``;
    only those ``ModelConfig.is_hybrid_swa`` names, MHA on both sides: :func:`unified_problems`)."""
    return {ARCHITECTURE: [UNIFIED_FEATURE]}


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    return parse_swa_config(config, source)


@hookimpl
@for_architecture(ARCHITECTURE)
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    problems = []
    if serving.dcp_size > 1:
        problems.append(
            f"{option('dcp_size')} {serving.dcp_size}: kvpools' SWA pools shard KV heads over attention TP, not tokens "
            f"over decode context parallelism. Use {option('dcp_size')} 1 for {model.name}."
        )
    problems += unified_problems(model, serving)
    if is_latent(model):
        return problems + latent_problems(model, serving, serving.speculative_algorithm in DRAFT_KV_ALGORITHMS)
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    dims = [layer.head_dim for layer in model.layers] + [layer.v_head_dim for layer in model.layers]
    widths = host_row_width_problems(model.layers, serving, model.name)
    return problems + scale_block_problems(dims, kv, model.name) + widths


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_layer_specs(engine: str, model: ModelSpec, serving: Serving) -> tuple[Any, ...] | None:
    """TensorRT-LLM's ``KVCacheManager`` layers (``--accounting trtllm``): this plugin's layer kinds
    ("attention", "sliding_attention"), as :func:`kvpools_core.parts.trtllm.trtllm_layer` makes them; None for
    other engines."""
    from kvpools_core.parts.trtllm import ENGINE, trtllm_layers_of

    return trtllm_layers_of(model, ("attention", "sliding_attention")) if engine == ENGINE else None


@hookimpl
@for_architecture(ARCHITECTURE)
def vllm_kv_cache_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, Any] | None:
    """vLLM's ``Attention.get_kv_cache_spec``: a ``SlidingWindowSpec`` for a layer with a window, a
    ``FullAttentionSpec`` otherwise, the heads of one TP rank (``vllm/model_executor/layers/attention/
    attention.py``; gpt-oss, Gemma 2/3, Mistral build exactly these)."""
    from kvpools_core.errors import UnsupportedCombinationError
    from kvpools_core.parts.vllm.layers import kv_element_bytes, kv_heads_per_rank
    from kvpools_core.parts.vllm.specs import FullAttentionSpec, KVCacheSpec, SlidingWindowSpec

    if is_latent(model):
        raise UnsupportedCombinationError(
            f"{model.name}: vLLM's sliding-window MLA layers (SlidingWindowMLASpec) are not modelled for "
            "--accounting vllm yet; use --accounting sglang or exact."
        )
    dtype_bytes = kv_element_bytes(model, serving)
    specs: dict[str, KVCacheSpec] = {}
    for layer in model.layers:
        heads = kv_heads_per_rank(layer.num_kv_heads, serving.tp_size)
        name = f"model.layers.{layer.index}.self_attn.attn"
        if layer.kind == SLIDING and layer.sliding_window is not None:
            specs[name] = SlidingWindowSpec(
                block_size=block_size,
                num_kv_heads=heads,
                head_size=layer.head_dim,
                head_size_v=layer.v_head_dim,
                dtype_bytes=dtype_bytes,
                sliding_window=layer.sliding_window,
            )
        else:
            specs[name] = FullAttentionSpec(
                block_size=block_size,
                num_kv_heads=heads,
                head_size=layer.head_dim,
                head_size_v=layer.v_head_dim,
                dtype_bytes=dtype_bytes,
            )
    return specs


@hookimpl
@for_architecture(ARCHITECTURE)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    if sglang_plain(model, serving):
        return plain_cell_size(model, serving)
    return swa_cell_size(model, serving)


@hookimpl
@for_architecture(ARCHITECTURE)
def size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing | None:
    if sglang_plain(model, serving):
        return None  # one dense KV pool: the core's sizing, as SGLang's MHA configurator
    static = size_swa_pools(model, serving, cell, budget)
    if not serving.enable_unified_memory:
        return static
    # SGLang's UnifiedSWATokenToKVPoolAllocator: SWA KV grows up, full KV grows down and owns the virtual ids, so
    # no full->SWA mapping (unified_memory_pool.py init_unified_swa_pools, a profiled budget: total_bytes =
    # unified_total_bytes); the request cap stays the static configurator's
    full, swa = unified_entries(model, serving, cell)
    return unified_sizing(
        static,
        serving,
        budget_bytes=budget.budget_bytes,
        members=(ArenaMember(FULL_POOL, full, "down"), ArenaMember(SWA_POOL, swa, "up", SWA_TOKENS)),
        drop=("allocator", SWA_ALLOCATOR, SWA_MAPPING_POOL),
        owner=ARCHITECTURE,
        model_name=model.name,
        context_len=serving.context_length or model.context_len,
        sliding_window=int(model.params["sliding_window"]),
    )


def unified_entries(model: ModelSpec, serving: Serving, cell: CellSize) -> tuple[SubPoolEntry, SubPoolEntry]:
    """The full and the SWA KV entries: every full (sliding) layer of one token on this rank, token-major."""
    start, end = rank_layer_range(model, serving)
    layers = model.layers[start:end]
    num_swa = sum(layer.kind == SLIDING for layer in layers)
    return (
        kv_entry_from_cell(cell, FULL_POOL, max(len(layers) - num_swa, 1)),
        kv_entry_from_cell(cell, SWA_POOL, max(num_swa, 1)),
    )


def unified_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """SGLang's unified-memory rules for a sliding-window model (``parts.unified_plan.serving_problems``).

    SGLang builds the pool only for the models ``ModelConfig.is_hybrid_swa`` names (Gemma-2/3 and Mistral are
    served dense, so they are "neither"), and refuses an MLA-SWA hybrid.
    """
    if not serving.enable_unified_memory:
        return []
    hybrid = sglang_serves_hybrid_swa(model)[0] or is_latent(model)
    entries: tuple[SubPoolEntry, ...] = ()
    if hybrid and not is_latent(model):
        entries = unified_entries(model, serving, swa_cell_size(model, serving))
    return serving_problems(
        serving, model_name=model.name, is_mamba=False, is_hybrid_swa=hybrid, is_mla=is_latent(model), entries=entries
    )


@hookimpl
@for_architecture(ARCHITECTURE)
def retraction_host_pool(plan: Plan) -> bool:
    """An ``SWAKVPool`` (MHA or MLA sub-pools) with full-attention tokens is one SGLang's decode retraction backs
    up in a host pool (``full_tokens_per_layer > 0``; ``UnifiedRadixCache.supports_retraction_backup`` wants its
    KV and SWA host pools, which every SWA host stack has); so is the dense pool SGLang builds instead."""
    if sglang_plain(plan.model, plan.serving):
        return True
    return int(plan.sizing.sglang_config.get("full_max_total_num_tokens", 0)) > 0


@hookimpl
@for_architecture(ARCHITECTURE)
def build_pool(plan: Plan, device: str, layout: BufferLayout | None) -> Any | None:
    if sglang_plain(plan.model, plan.serving):
        from kvpools_core.pools.mha import MHATokenToKVPool

        return MHATokenToKVPool.from_plan(plan, device, layout=layout)
    if is_latent(plan.model):
        from .mla_pool import SWAMLAKVPool

        return SWAMLAKVPool.from_plan(plan, device, layout=layout)
    from .pool import SWAKVPool

    return SWAKVPool.from_plan(plan, device, layout=layout)


@hookimpl
@for_architecture(ARCHITECTURE)
def build_allocator(plan: Plan, pool: Any, device: str, checked: bool) -> Any | None:
    if sglang_plain(plan.model, plan.serving):
        return None  # the core's allocator of one token space
    from .allocator import allocator_for_plan

    return allocator_for_plan(plan, pool, device, checked=checked)


def sglang_plain(model: ModelSpec, serving: Serving) -> bool:
    """Whether ``--accounting sglang`` must size ``model`` as SGLang 0.5.23 does, with one dense KV pool.

    SGLang builds hybrid SWA pools only when ``ModelConfig.is_hybrid_swa``
    (:func:`.config.sglang_serves_hybrid_swa`): Gemma-2/3, Mistral and the
    other sliding-window families it does not list keep every token on every
    layer (``MHATokenToKVPool``), so SGLang's numbers are the dense ones.  The
    exact accounting plans kvpools' own hybrid pools, which its ``build`` makes.
    Hybrid MLA-SWA configs keep their own path.
    """
    return serving.accounting == "sglang" and not is_latent(model) and not sglang_serves_hybrid_swa(model)[0]


def plain_cell_size(model: ModelSpec, serving: Serving) -> CellSize:
    """Every layer of this rank as a full-attention layer of its own geometry: SGLang's MHA cell."""
    start, end = rank_layer_range(model, serving)
    cell = attention_cell_size(model.layers[start:end], model, serving)
    why = sglang_serves_hybrid_swa(model)[1]
    note = (
        f"SGLang 0.5.23 serves {model.name} without hybrid SWA pools ({why}): one KV pool keeps every token on "
        f"all {end - start} layer(s), sliding ones included, so {option('accounting')} sglang sizes that pool; "
        f"{option('swa_full_tokens_ratio')} and {option('swa_eviction_interval')} do not apply "
        f"({option('accounting')} exact plans kvpools' own hybrid pools)"
    )
    return attrs.evolve(cell, notes=(*model.params.get("notes", ()), *cell.notes, note))


def swa_cell_size(model: ModelSpec, serving: Serving) -> CellSize:
    """Bytes per token of each pool on this rank, and SGLang's ``_cell_size`` beside them.

    ``kv_full`` bytes are per full token, ``kv_swa`` per SWA token; the draft
    model (EAGLE / EAGLE3 / STANDALONE / NEXTN / DFLASH) has its own
    ``draft_kv`` pool of ``max_total_num_tokens`` rows, ``D`` layers of a full
    layer's geometry, which this cell already includes (the speculative
    wrapper leaves it alone).
    """
    start, end = rank_layer_range(model, serving)
    layers = model.layers[start:end]
    full = tuple(layer for layer in layers if layer.kind == FULL)
    swa = tuple(layer for layer in layers if layer.kind == SLIDING)
    notes = list(model.params.get("notes", ()))
    if is_latent(model):
        return _latent_cell_size(model, serving, len(full), len(swa), end - start, notes)
    parts: list[CellPart] = []
    if any(layer.kind == FULL for layer in model.layers):
        parts += _named(attention_cell_size(full, model, serving, pool=FULL_POOL).parts, "full_")
    parts += _named(attention_cell_size(swa, model, serving, pool=SWA_POOL).parts, "swa_")
    drafts = draft_num_layers(serving)
    if drafts:
        draft = (draft_layer(model),) * drafts
        parts += _named(attention_cell_size(draft, model, serving, pool=DRAFT_POOL).parts, "draft_")
        notes.append(
            f"{serving.speculative_algorithm} draft: {drafts} layer(s) of a full layer's geometry, "
            f"one draft_kv row per max_total_num_tokens token"
        )
    shape = sglang_shape(model, serving)
    if shape.hybrid:
        notes.append(
            f"kv_full bytes are per full token ({len(full)} full layer(s) on this rank), kv_swa bytes per SWA token "
            f"({len(swa)} SWA layer(s)); SGLang's cell size = full x (full + draft layers) + "
            f"{shape.ratio} x swa x SWA layers"
        )
    return CellSize(
        parts=parts,
        sglang_bytes_per_token=shape.cell,
        num_layers=end - start,
        draft_included=True,
        notes=notes,
    )


def _latent_cell_size(
    model: ModelSpec, serving: Serving, num_full: int, num_swa: int, num_layers: int, notes: list[str]
) -> CellSize:
    """Hybrid MLA-SWA: the full layers' latent rows (and DSA indexer keys), the sliding layers' own rows.

    MLA rows are shared by all heads, so TP does not shard them; the draft KV
    is refused in ``validate``.
    """
    parts: list[CellPart] = []
    row = full_row(model, serving)
    if row is not None:
        parts += _named(tuple(row.cell_parts(num_full, pool=FULL_POOL)), "full_")
        if is_dsa(model):
            parts.append(CellPart("full_indexer", index_bytes(model) * num_full, INDEX_POOL, INDEX_EXTRA_SLOTS))
    srow = swa_row(model, serving)
    parts += _named(tuple(srow.cell_parts(num_swa, pool=SWA_POOL)), "swa_")
    shape = sglang_shape(model, serving)
    storage = "a DSA row + indexer key" if is_dsa(model) else "an MLA latent row"
    if row is not None:
        notes.append(
            f"hybrid MLA-SWA: {num_full} full layer(s) on this rank store {storage} of {shape.full_per_token} B "
            f"per full token, {num_swa} SWA layer(s) an MLA row of {srow.row_bytes} B "
            f"(swa_kv_lora_rank {srow.dims.kv_lora_rank} + swa_qk_rope_head_dim {srow.dims.qk_rope_head_dim}) "
            f"per SWA token; the cell size shown as SGLang's uses these rows (SGLang's own is not established)"
        )
    return CellSize(
        parts=parts,
        sglang_bytes_per_token=max(shape.cell, 1),
        num_layers=num_layers,
        draft_included=True,
        notes=notes,
    )


def _named(parts: tuple[CellPart, ...], prefix: str) -> list[CellPart]:
    return [attrs.evolve(part, name=prefix + part.name) for part in parts]
