"""Hybrid linear-attention models: full-attention KV plus a fixed-size recurrent state per request.

Qwen3-Next and Qwen3.5 (Gated DeltaNet), Nemotron-H and Granite-4.0-H (Mamba2),
Jamba (Mamba-1) and Falcon-H1 (every layer both) keep K and V only for their
full-attention layers and, for the others, a conv + SSM state per request
slot; Kimi-Linear (KDA) keeps an MLA latent row for its full-attention layers.
SGLang (``_handle_max_mamba_cache``) takes the state cache out of the budget
first — ``max_mamba_cache_size`` K slots — and sizes the KV tokens from the
rest; requests are capped by ``K // ratio`` state slots per request.

The cell size is the full-attention layers' KV (the parts library's
:func:`~kvpools_core.parts.attention.attention_cell_size`, or its latent row
for MLA-based hybrids, :mod:`.latent`; the speculative wrapper adds the
draft's) plus one state slot on this rank, a ``unit="state_slot"`` part of
the ``mamba_state`` pool (``CellSize.bytes_per_state_slot``: slots are not
requests, there are ``max_mamba_cache_size`` of them);
``size_pools`` does the split (:mod:`.sizing`), and the pools
(:mod:`.pool`) hold the state in the request table, as SGLang's
``HybridReqToTokenPool`` does.  A PD decode node (``--disaggregation-mode decode``)
runs without the radix cache (one state slot per request, K from
``--max-running-requests``), pre-allocates request rows for transfers and
raises the state pool to cover them, SGLang's ``HybridMambaDecodeReqToTokenPool``
(:func:`.sizing.decode_state_slots`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from kvpools_core import for_architecture, hookimpl
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parallel import pp_layer_range
from kvpools_core.parts.attention import attention_cell_size, scale_block_problems
from kvpools_core.parts.dsa import dsa_cell_size
from kvpools_core.parts.unified import SubPoolEntry
from kvpools_core.parts.unified_plan import (
    UNIFIED_FEATURE,
    ArenaMember,
    kv_entry_from_cell,
    serving_problems,
    state_entry_from_cell,
    unified_sizing,
)
from kvpools_core.values import (
    STATE_SLOT,
    TOKEN,
    Budget,
    CellPart,
    CellSize,
    EngineDefault,
    ModelSpec,
    PackedInto,
    Plan,
    PoolSizing,
    Serving,
)

from .config import KV_KINDS, QWEN4_EXP_MODEL_TYPES, hybrid_family, hybrid_model_spec
from .dsa import GLM5_NEXT, dsa_hybrid_defaults, dsa_hybrid_problems, is_dsa_hybrid
from .inkling import (
    INKLING_MAMBA_FULL_MEMORY_RATIO,
    INKLING_SWA_FULL_TOKENS_RATIO,
    INKLING_VLLM_REFUSAL,
    inkling_cell_size,
    inkling_plan,
    inkling_problems,
    inkling_unified_sizing,
    is_inkling,
    is_inkling_model,
    parse_inkling_config,
    size_inkling_pools,
)
from .latent import is_mla_hybrid, latent_cell_size, latent_problems
from .ple import NGRAM_POOL, SHORT_CONV_POOL
from .qsa import QSA_COMPRESSED_POOL, QSA_PAGE_SIZE, compressed_bytes_per_token, qsa_problems, qsa_profile
from .replayssm import RING_POOL, replayssm_problems
from .sizing import SLOT_ALLOCATOR_POOL, STATE_POOL, extra_buffer, size_hybrid_pools
from .state import (
    rank_full_attention_layers,
    rank_state_layer_ids,
    state_bytes_per_slot,
    state_entry_parts,
    state_shape,
)
from .traits import architecture_traits as architecture_traits
from .unified import UNIFIED_DROPPED_POOLS, unified_side_state_notes, unified_side_state_problems, unified_token_budget
from .weights import estimate_weights as estimate_weights

if TYPE_CHECKING:
    from kvpools_core.pools.layout import BufferLayout

ARCHITECTURE = "mamba"
PRESET_DIR = Path(__file__).parent / "presets"


@hookimpl
def presets() -> dict[str, str]:
    return {path.stem: str(path) for path in sorted(PRESET_DIR.glob("*.json"))}


@hookimpl
def engine_features() -> dict[str, list[str]]:
    """SGLang 0.5.23 builds its unified memory pool for hybrid Mamba / linear-attention models (MHA or MLA full
    side; ``_init_unified_mamba_pools``)."""
    return {ARCHITECTURE: [UNIFIED_FEATURE]}


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    if is_inkling(config, source):
        return parse_inkling_config(config, source, architecture=ARCHITECTURE)
    family = hybrid_family(config, source)
    if family is None:
        return None
    return hybrid_model_spec(config, source, architecture=ARCHITECTURE, family=family)


@hookimpl
@for_architecture(ARCHITECTURE)
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    if is_inkling_model(model):
        return inkling_problems(model, serving)
    problems = hybrid_problems(model, serving)
    if serving.adaptive_speculation:
        # SGLang sizes the speculative state pools by max_speculative_num_draft_tokens() but the state budget
        # (_handle_max_mamba_cache) by speculative_num_draft_tokens: a split kvpools does not plan yet
        problems.append(
            f"kvpools does not model {option('speculative_adaptive')} on hybrid linear-attention models yet: "
            f"SGLang 0.5.23 sizes their speculative state pools by the adaptive maximum and their state budget "
            f"by the current draft-token count. Drop {option('speculative_adaptive')}."
        )
    return problems


@hookimpl
@for_architecture(ARCHITECTURE)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    if is_inkling_model(model):
        shape, layers = state_shape(model, serving), rank_state_layer_ids(model, serving)
        return inkling_cell_size(
            model,
            serving,
            CellPart("state", state_bytes_per_slot(model, serving), STATE_POOL, unit=STATE_SLOT),
            f"short-conv state per slot: {len(layers)} layer(s) x ({shape.describe()}) = "
            f"{shape.bytes * len(layers):,} B (every layer, configs/inkling.py conv_layer_ids)",
        )
    full_layers = rank_full_attention_layers(model, serving)
    if is_dsa_hybrid(model):  # latent rows and index keys of the full layers (.dsa; the parts library's DSA cell)
        cell = dsa_cell_size(full_layers, model, serving)
    elif is_mla_hybrid(model):
        cell = latent_cell_size(full_layers, model, serving)
    else:
        cell = attention_cell_size(full_layers, model, serving)
    shape = state_shape(model, serving)
    layers = rank_state_layer_ids(model, serving)
    qsa = qsa_profile(model)
    if qsa is not None:  # QSATokenToKVPool's compressed index keys, per row of the full pool (.qsa)
        per_token = compressed_bytes_per_token(qsa, len(full_layers), serving)
        cell = attrs.evolve(
            cell,
            parts=(*cell.parts, CellPart(QSA_COMPRESSED_POOL, per_token, QSA_COMPRESSED_POOL)),
            notes=(*cell.notes, f"{qsa.describe()}: {per_token:,} B per token over {len(full_layers)} layer(s)"),
        )
    return attrs.evolve(
        cell,
        parts=(*cell.parts, CellPart("state", state_bytes_per_slot(model, serving), STATE_POOL, unit=STATE_SLOT)),
        notes=(
            *cell.notes,
            f"recurrent state per slot: {len(layers)} {model.params['mixer']} layer(s) x ({shape.describe()}) = "
            f"{shape.bytes * len(layers):,} B; KV over {cell.num_layers} full-attention layer(s) only",
        ),
    )


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_layer_specs(engine: str, model: ModelSpec, serving: Serving) -> tuple[Any, ...] | None:
    """TensorRT-LLM's layers (``--accounting trtllm``): Nemotron-H's and Qwen3-Next's / Qwen3.5's attention KV
    and recurrent state as ``CppMambaHybridCacheManager`` keeps them (:mod:`.trtllm`), the other families refused
    with the reason; None for other engines."""
    from kvpools_core.parts.trtllm import ENGINE

    if engine == ENGINE:
        from .trtllm import hybrid_trtllm_layers

        return hybrid_trtllm_layers(model)
    return None


@hookimpl
@for_architecture(ARCHITECTURE)
def vllm_kv_cache_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, Any] | None:
    """vLLM 0.33's specs: a ``MambaSpec`` per recurrent layer, a ``FullAttentionSpec`` per attention layer, the
    block size aligned to the state (:mod:`.vllm`)."""
    from .vllm import hybrid_vllm_specs

    if model.params.get("qsa"):
        raise UnsupportedCombinationError(
            f"kvpools does not model QSA (Qwen sparse attention) pools under {option('accounting')} vllm yet: "
            f"vLLM 0.33's index-key caches for them are not read. Use {option('accounting')} sglang or exact."
        )
    if is_inkling_model(model):
        raise UnsupportedCombinationError(INKLING_VLLM_REFUSAL)
    if model.params.get("family") == GLM5_NEXT:
        raise UnsupportedCombinationError(
            f"kvpools does not model GLM5-Next ({model.name}) under {option('accounting')} vllm yet: vLLM 0.33's "
            f"layers for it (KDA state beside DSA latent rows and index keys) are not read. Use "
            f"{option('accounting')} sglang or exact."
        )
    if model.params.get("ple"):
        raise UnsupportedCombinationError(
            f"kvpools does not model Qwen4-Exp's PLE state under {option('accounting')} vllm yet: vLLM 0.33's "
            f"Qwen4ExpForCausalLM keeps state kvpools has not read. Use {option('accounting')} sglang or exact."
        )
    return dict(hybrid_vllm_specs(model, serving, block_size))


@hookimpl
@for_architecture(ARCHITECTURE)
def size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing | None:
    if is_inkling_model(model):
        inkling = size_inkling_pools(model, serving, cell, budget, owner=ARCHITECTURE)
        return (
            inkling
            if not serving.enable_unified_memory
            else inkling_unified_sizing(model, serving, cell, budget, inkling, owner=ARCHITECTURE)
        )
    static = size_hybrid_pools(
        model, serving, cell, budget, owner=ARCHITECTURE, state_layers=len(rank_state_layer_ids(model, serving))
    )
    if not serving.enable_unified_memory:
        return static
    # SGLang's UnifiedMambaTokenToKVPoolAllocator: state slots grow up, full KV grows down (unified_memory_pool.py
    # init_unified_mamba_pools); K and the request cap stay the static configurator's
    full, state = unified_entries(model, serving, cell)
    sizing = unified_sizing(
        static,
        serving,
        budget_bytes=budget.budget_bytes,
        members=(ArenaMember(full.name, full, "down"), ArenaMember(STATE_POOL, state, "up")),
        drop=(SLOT_ALLOCATOR_POOL, "allocator", *UNIFIED_DROPPED_POOLS),
        owner=ARCHITECTURE,
        model_name=model.name,
        context_len=serving.context_length or model.context_len,
        max_mamba_cache_size=int(static.sglang_config["max_mamba_cache_size"]),
        token_budget_bytes=unified_token_budget(model, serving, budget),
    )
    notes = unified_side_state_notes(model, serving)
    return attrs.evolve(sizing, notes=(*sizing.notes, *notes)) if notes else sizing


def unified_entries(model: ModelSpec, serving: Serving, cell: CellSize) -> tuple[SubPoolEntry, SubPoolEntry]:
    """The full KV entry (all full-attention layers of one token on this rank) and the state entry."""
    full_pool = next(iter(cell.pool_bytes_per_token()))
    full = kv_entry_from_cell(cell, full_pool, max(cell.num_layers, 1))
    parts = state_entry_parts(state_shape(model, serving))
    return full, state_entry_from_cell(cell, STATE_POOL, len(rank_state_layer_ids(model, serving)), parts)


@hookimpl
@for_architecture(ARCHITECTURE)
def host_mirrors(plan: Plan) -> dict[str, str | PackedInto | None] | None:
    """SGLang's ``MambaPoolHost`` (``mem_cache/pool_host/mamba.py``): the PLE side states (the MambaPool's
    ``extra_checkpoint_buffers``) are packed into the state pool's host rows (its ``get_size_per_token`` adds
    them); the ReplaySSM ring has no host copy.  Plans with neither keep the core's default."""
    names = {pool.name for pool in plan.pools}
    if not names & {RING_POOL, SHORT_CONV_POOL, NGRAM_POOL}:
        return None
    mirrors: dict[str, str | PackedInto | None] = {
        pool.name: None
        for pool in plan.pools
        if ((pool.unit == TOKEN and pool.kind == "kv") or (pool.unit == STATE_SLOT and pool.kind == "state"))
        and pool.name not in (RING_POOL, SHORT_CONV_POOL, NGRAM_POOL)
    }
    for name in (SHORT_CONV_POOL, NGRAM_POOL):
        if name in names and STATE_POOL in mirrors:
            mirrors[name] = PackedInto(STATE_POOL)
    return mirrors


@hookimpl
@for_architecture(ARCHITECTURE)
def build_req_to_token_pool(plan: Plan, device: str, checked: bool, layout: BufferLayout | None) -> Any | None:
    """The request table with the recurrent state, carved by the platform's buffer layout (as the KV pool is)."""
    from .pool import HybridReqToTokenPool

    if is_inkling_model(plan.model):
        plan = inkling_plan(plan)

    return HybridReqToTokenPool.from_plan(plan, device, checked=checked, layout=layout)


@hookimpl
@for_architecture(ARCHITECTURE)
def build_pool(plan: Plan, device: str, layout: BufferLayout | None) -> Any | None:
    if is_inkling_model(plan.model):
        from .inkling_pool import InklingKVPool

        return InklingKVPool(plan, device, layout)
    from .pool import HybridLinearKVPool

    return HybridLinearKVPool.from_plan(plan, device, layout=layout)


@hookimpl
@for_architecture(ARCHITECTURE)
def build_allocator(plan: Plan, pool: Any, device: str, checked: bool) -> Any | None:
    """An Inkling-class model's two KV pools take SGLang's ``SWATokenToKVPoolAllocator``; the other hybrids the
    core's allocator of one token space (None)."""
    if is_inkling_model(plan.model):
        from .inkling_pool import inkling_allocator

        return inkling_allocator(plan, pool, device, checked=checked)
    return None


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_defaults(model: ModelSpec, serving: Serving) -> list[EngineDefault] | None:
    """SGLang 0.5.23's per-model defaults for unset options: Inkling's ratios (``_inkling_overrides`` in
    ``arg_groups/model_overrides/inkling.py``: ``--swa-full-tokens-ratio`` 0.1, ``--mamba-full-memory-ratio`` 0.1)
    and a QSA model's page (``arg_groups/model_overrides/qwen4_exp.py``: 'Setting page size to 64 for compressed
    QSA (full//ratio compressed addressing)')."""
    if is_dsa_hybrid(model):
        return dsa_hybrid_defaults(model)
    if is_inkling_model(model):
        reason = "SGLang 0.5.23's default for Inkling (_inkling_overrides in arg_groups/model_overrides/inkling.py)"
        return [
            EngineDefault(option="swa_full_tokens_ratio", value=INKLING_SWA_FULL_TOKENS_RATIO, reason=reason),
            EngineDefault(option="mamba_full_memory_ratio", value=INKLING_MAMBA_FULL_MEMORY_RATIO, reason=reason),
        ]
    if qsa_profile(model) is None or model.model_type not in QWEN4_EXP_MODEL_TYPES:
        return None  # the override is Qwen4-Exp's; another QSA hybrid keeps page 1, which its pool refuses
    reason = (
        "SGLang 0.5.23's page for compressed QSA (the Qwen4-Exp override in arg_groups/model_overrides/qwen4_exp.py)"
    )
    return [EngineDefault(option="page_size", value=QSA_PAGE_SIZE, reason=reason)]


def hybrid_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """The combinations SGLang cannot size or kvpools does not model, one message each."""
    problems = replayssm_problems(model, serving) + qsa_problems(model, serving, mla=is_mla_hybrid(model))
    # under unified memory SGLang builds no ReplaySSM ring (planned, .unified) and refuses Qwen4-Exp's PLE state
    problems += unified_side_state_problems(model, serving)
    try:
        state_shape(model, serving)
    except UnsupportedCombinationError as error:
        problems.append(str(error))
    if serving.speculative:
        missing = [
            flag
            for flag, value in (
                (option("speculative_num_draft_tokens"), serving.speculative_num_draft_tokens),
                (option("max_running_requests"), serving.max_running_requests),
            )
            if value is None
        ]
        if missing:
            problems.append(
                f"Speculative decoding on a hybrid model keeps each draft token's recurrent state, which SGLang "
                f"sizes from {' and '.join(missing)}: pass {' and '.join(missing)}."
            )
    if serving.disaggregation_mode != "null" and extra_buffer(serving) and serving.enable_mamba_extra_buffer_lazy:
        # SGLang 0.5.23 validate_mamba_extra_buffer (arg_groups/mamba_hook.py lines 123-128), run while the
        # extra buffer is live (radix cache on: a prefill node; a decode node runs without the radix cache)
        problems.append(
            f"{option('enable_mamba_extra_buffer_lazy')} is unsupported under PD disaggregation "
            f"({option('disaggregation_mode')} {serving.disaggregation_mode}): SGLang's PD decode pool is not wired "
            f"for lazy slots (extra_buffer_lazy unsupported under PD disaggregation). Drop "
            f"{option('enable_mamba_extra_buffer_lazy')} and keep {option('enable_mamba_extra_buffer')}."
        )
    empty = [
        rank
        for rank in range(serving.pp_size)
        if not any(
            layer.kind in KV_KINDS
            for layer in model.layers[
                slice(*pp_layer_range(model.num_layers, rank, serving.pp_size, serving.pp_layer_partition))
            ]
        )
    ]
    if empty and serving.pp_size > 1:
        problems.append(
            f"Pipeline stage(s) {empty} of {option('pp_size')} {serving.pp_size} hold no full-attention layer of "
            f"{model.name}, "
            f"so SGLang's KV cell size there is 0: give every stage a full-attention layer "
            f"({option('pp_layer_partition')}, "
            f"or a smaller {option('pp_size')})."
        )
    problems += serving_problems(
        serving, model_name=model.name, is_mamba=True, is_hybrid_swa=False, is_mla=is_mla_hybrid(model)
    )
    if is_dsa_hybrid(model):
        return problems + dsa_hybrid_problems(model, serving)
    if is_mla_hybrid(model):
        return problems + latent_problems(model, serving)
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    dims = [layer.head_dim for layer in model.layers if layer.kind in KV_KINDS]
    return problems + scale_block_problems(dims, kv, model.name)
