"""The plan pool names more than one architecture uses, and the draft model's share of them.

A plan names each physically separate allocation (``PoolSpec.name``); builders
look their bytes up by these names, so a name is part of the contract between
the plugin that sizes a pool and the store that allocates it.  A speculative
plan's draft model keeps its KV in a pool of its own, ``draft_<name>``.
"""

from __future__ import annotations

from kvpools_core.values import ModelSpec, Plan, Serving

__all__ = [
    "DRAFT_INDEX_POOL",
    "DRAFT_KV_POOL",
    "INDEX_POOL",
    "KV_POOL",
    "draft_name",
    "draft_num_layers",
    "draft_pool_geometry",
    "packs_draft_into_host",
]

KV_POOL = "kv"
"""The token-indexed KV of a single-token-space model (K/V rows or latent rows)."""
INDEX_POOL = "indexer"
"""A sparse-attention indexer's key cache (DSA, MiniMax sparse)."""
DRAFT_PREFIX = "draft_"


def draft_name(pool: str) -> str:
    """The draft model's pool of the same kind: ``kv`` → ``draft_kv``."""
    return DRAFT_PREFIX + pool


DRAFT_KV_POOL = draft_name(KV_POOL)
DRAFT_INDEX_POOL = draft_name(INDEX_POOL)


def draft_num_layers(plan: Plan, pool: str = DRAFT_KV_POOL) -> int | None:
    """The draft model's layers when the target's pool builder builds the draft pool ``pool``, else None.

    None when the plan has no such pool, and when the draft is a model of its own (``plan.cell.draft``): the
    core's ``build`` then builds the draft's pools through the draft architecture's own ``build_pool``
    (:func:`kvpools_core.building.draft_plan`), so the target's builder leaves them alone.
    """
    if plan.cell.draft is not None or not any(p.name == pool for p in plan.pools):
        return None
    return plan.serving.speculative_draft_num_layers or 0


def draft_pool_geometry(plan: Plan, pool: str = DRAFT_KV_POOL) -> tuple[int, int]:
    """``(size, page_size)`` the draft pool ``pool`` is built with: the plan's, times its ``slot_scale``.

    SGLang's draft worker under DCP builds its replicated pools over ``max_total_num_tokens x dcp`` slots in
    pages of ``page_size x dcp`` (``loc_space_scale`` and ``pool_page_size``, ``000_fbd4f47288598fb9.txt``
    lines 405-433); the speculative plugin records that factor as the parts' ``CellPart.slot_scale``.
    """
    scale = plan.cell.pool_slot_scale().get(pool, 1)
    return plan.max_total_num_tokens * scale, plan.serving.page_size * scale


PACKED_MTP_FAMILY = frozenset({"EAGLE", "NEXTN"})
"""Drafts SGLang may pack into the target's host pool: ``is_eagle()`` but not EAGLE3 (NEXTN becomes EAGLE)."""


def packs_draft_into_host(model: ModelSpec, serving: Serving) -> bool:
    """Whether SGLang packs the draft's KV layers into the target's host pool (``HiCacheDraftMode.PACKED``).

    ``_can_pack_hicache_mtp`` (``speculative/base_spec_worker.py``): an EAGLE
    draft (NEXTN is EAGLE, ``arg_groups/speculative_hook.py``), not EAGLE3,
    whose config declares ``num_nextn_predict_layers``, i.e. an MTP model's own
    next-token layers.  SGLang reads the draft runner's config: kvpools reads the
    draft model's own (``--speculative-draft-model-path``) when there is one,
    else the target's, whose MTP layers the draft loads.  Every other draft with
    KV is a sidecar (``SIDECAR``).
    """
    draft_config = serving.speculative_draft.model if serving.speculative_draft is not None else model
    return serving.speculative_algorithm in PACKED_MTP_FAMILY and bool(draft_config.num_nextn_predict_layers)
