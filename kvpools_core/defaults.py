"""The core's default hook implementations (plugin name ``core``), all ``trylast``.

They answer only where no installed plugin does: single-token-space pool
sizing, neutral platform traits, the plain request table, byte-row storage
pools, the per-layer buffer layout, and the token / paged allocator.  The core
cannot be disabled; every other plugin overrides it simply by answering.
"""

from __future__ import annotations

from typing import Any

from kvpools_core.hookspecs import hookimpl
from kvpools_core.options import option
from kvpools_core.parts.sizing import default_size_pools
from kvpools_core.values import (
    STATE_SLOT,
    TOKEN,
    Budget,
    CellSize,
    ModelSpec,
    Plan,
    PlatformTraits,
    PoolSizing,
    Serving,
)


@hookimpl(trylast=True)
def size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing:
    return default_size_pools(model, serving, cell, budget, owner="core")


@hookimpl(trylast=True)
def host_mirrors(plan: Plan) -> dict[str, str | None]:
    """SGLang's generic host pools: one per K/V-like token pool (``kind="kv"``), one per state-slot pool
    (``kind="state"``: ``MambaPoolHost``), each sized from its own device slots."""
    return {
        pool.name: None
        for pool in plan.pools
        if (pool.unit == TOKEN and pool.kind == "kv") or (pool.unit == STATE_SLOT and pool.kind == "state")
    }


@hookimpl(trylast=True)
def retraction_host_pool(plan: Plan) -> bool:
    """A KV pool no architecture vouches for is not one SGLang's decode retraction backs up on the host."""
    return False


@hookimpl(trylast=True)
def platform_traits(serving: Serving) -> PlatformTraits:
    """A platform whose plugin says nothing of its kernels: no page rules, no raw-row backends, int64 slots."""
    return PlatformTraits(platform=serving.platform)


@hookimpl(trylast=True)
def validate(model: ModelSpec, serving: Serving) -> list[str]:
    problems = []
    problems += _unmodelled_host_tier(model, serving)
    problems += _empty_pipeline_stages(model, serving)
    problems += _unsplittable_heads(model, serving)
    if (
        serving.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE", "DFLASH", "DSPARK")
        and not serving.speculative_draft_num_layers
    ):
        problems.append(
            f"{option('speculative_algorithm')} {serving.speculative_algorithm} charges the draft model's KV cache: "
            f"pass {option('draft_model')} (a preset, config.json or directory) "
            f"or {option('speculative_draft_num_layers')} N."
        )
    if serving.qsa_indexer_dtype != "auto" and not model.params.get("qsa"):
        # SGLang 0.5.23 _build_hybrid_linear_kv_pool / the Qwen4-Exp override (plugins/mamba/qsa.py)
        problems.append(
            f"{option('qsa_indexer_dtype')} {serving.qsa_indexer_dtype} needs a model with a compressed QSA indexer "
            f"(SGLang: '--qsa-indexer-dtype {serving.qsa_indexer_dtype} needs a model with a compressed QSA indexer "
            f"(Qwen4-Exp); this model has none'); {model.name} has none. Drop {option('qsa_indexer_dtype')}."
        )
    if serving.speculative_algorithm == "NEXTN" and not (
        serving.speculative_draft_num_layers or model.num_nextn_predict_layers
    ):
        problems.append(
            f"{option('speculative_algorithm')} NEXTN needs draft layers: {model.name} declares no "
            f"num_nextn_predict_layers; "
            f"pass {option('draft_model')} or {option('speculative_draft_num_layers')} N."
        )
    return problems


def _unmodelled_host_tier(model: ModelSpec, serving: Serving) -> list[str]:
    """Host-tier setups SGLang refuses: HiCache with DCP on a host pool that is not MLA's.

    SGLang 0.5.23 wires DCP only into the MLA host pool
    (``hybrid_cache/hybrid_pool_assembler.py`` ``build_kv_host_pool`` asserts
    ``use_mla`` when ``dcp_enabled``): a model whose cache layers are not MLA
    latent rows (the parts library's ``kv_lora_rank`` layers) fails there.
    """
    if not serving.host_tier or serving.dcp_size == 1:
        return []
    cached = [layer for layer in model.layers if layer.kind != "none"]
    if cached and all("kv_lora_rank" in layer.params for layer in cached):
        return []
    o = option
    return [
        f"{o('enable_hierarchical_cache')} with {o('dcp_size')} {serving.dcp_size}: SGLang asserts 'HiCache + DCP "
        f"is only wired for the MLA host pool; the MHA host pool has no DCP index translation.' "
        f"(build_kv_host_pool), and {model.name} does not cache MLA latent rows. Use {o('dcp_size')} 1, or drop "
        f"{o('enable_hierarchical_cache')}."
    ]


def _unsplittable_heads(model: ModelSpec, serving: Serving) -> list[str]:
    """Attention TP must split the heads as the engines' QKV projections do.

    SGLang's ``QKVParallelLinear`` divides the query heads by the attention-TP
    size exactly, and the KV heads either divide over the ranks or are
    replicated to them (the ranks a multiple of the KV heads); anything else
    fails at model load, so a plan for it would promise a server that never starts.
    """
    tp = serving.attn_tp_size
    if tp == 1:
        return []
    what = f"{option('tp_size')} {serving.tp_size}" + (f" (attention TP {tp})" if tp != serving.tp_size else "")
    problems = []
    heads = model.num_attention_heads
    if heads and heads % tp:
        problems.append(
            f"{what} cannot split the {heads} attention heads of {model.name} evenly. "
            f"Use an attention TP size that divides {heads}: {_divisors(heads)}."
        )
    kv_heads = sorted({layer.num_kv_heads for layer in model.layers if layer.num_kv_heads > 1})
    bad = [kv for kv in kv_heads if kv % tp and tp % kv]
    if bad and not problems:
        problems.append(
            f"{what} can neither split nor replicate the {', '.join(map(str, bad))} KV heads of {model.name}: "
            f"the attention TP size must divide the KV heads or be a multiple of them."
        )
    return problems


def _divisors(n: int) -> str:
    small = [d for d in range(1, min(n, 1024) + 1) if n % d == 0]
    return ", ".join(map(str, small[:12])) + (", ..." if len(small) > 12 else "")


def _empty_pipeline_stages(model: ModelSpec, serving: Serving) -> list[str]:
    """A stage without layers cannot size anything (SGLang divides by a zero cell size)."""
    from kvpools_core.parallel import pp_layer_range

    ranges = [
        pp_layer_range(model.num_layers, r, serving.pp_size, serving.pp_layer_partition) for r in range(serving.pp_size)
    ]
    empty = [rank for rank, (start, end) in enumerate(ranges) if start == end]
    if not empty:
        return []
    return [
        f"Pipeline stage(s) {empty} of {option('pp_size')} {serving.pp_size} hold no layer of {model.name} "
        f"({model.num_layers} layers): give every stage at least one layer "
        f"({option('pp_layer_partition')}, or a smaller {option('pp_size')})."
    ]


@hookimpl(trylast=True)
def build_req_to_token_pool(plan: Any, device: str) -> Any:
    from kvpools_core.pools.req_to_token import ReqToTokenPool

    return ReqToTokenPool.from_plan(plan, device)


@hookimpl(trylast=True)
def buffer_layout(plan: Any, device: str) -> Any:
    from kvpools_core.pools.layout import PER_LAYER

    return PER_LAYER


@hookimpl(trylast=True)
def build_pool(plan: Any, device: str, layout: Any) -> Any:
    """Pools no architecture builds: every planned storage pool as byte rows (``pools.bytes.BytePool``)."""
    from kvpools_core.pools.bytes import BytePool

    return BytePool.from_plan(plan, device, layout=layout)


@hookimpl(trylast=True)
def build_allocator(plan: Any, pool: Any, device: str, checked: bool) -> Any:
    from kvpools_core.allocators import allocator_for_plan

    return allocator_for_plan(plan, device, checked=checked, kvcache=pool)
