"""The capacity record for orchestrators: one stable, versioned JSON record per GPU rank of a plan.

Orchestrators size and route against a few numbers a worker publishes at start-up.  Dynamo's SGLang worker
publishes ``total_kv_blocks = ceil(max_total_num_tokens / page_size)``, ``max_num_seqs`` (the per-DP-rank
``--max-running-requests``) and its data-parallel ranks (``components/src/dynamo/sglang/capacity.py``,
``runtime_capacity``); its mocker starts from ``num_gpu_blocks`` and ``block_size``; llm-d's KV index hashes
``blockSize`` tokens per block.  The record gives those numbers before the engine starts, from a
:class:`~kvpools_core.values.Plan`, together with what they hide on hybrid models: every token space and
state cache as a *group* with its own blocks and blocks per request, and the concurrency a stated context
reaches (:func:`kvpools_core.planning.capacity.concurrency`).  ``docs/capacity-record.md`` documents every field,
``docs/capacity-record.schema.json`` is its JSON Schema.

Records are wrapped in one document ``{"schema", "version", "context_len", "complete", "records"}``: one JSON
object that ``json.load`` (Python) or ``json.Unmarshal`` (Go) reads in one call, with the schema name and
version once.  ``version`` changes only when a field changes meaning or is removed; new fields may appear
within a version, so readers ignore fields they do not know.

A pipeline-parallel plan describes one stage (``Serving.pp_rank``): the stages keep the same token count
(SGLang's MIN all-reduce, ``kvpools_core.pipeline._sync_pipeline_stages``) but hold different layers, so their
bytes differ.  :func:`stage_plans` plans every stage; given fewer, the document lists the stages it covers
and says it is not ``complete``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import attrs

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.engines.trtllm.deployment import TRTLLM_VERSION
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.planning.capacity import STATE_SLOTS, Capacity, Limits, concurrency, limits_of, token_limit
from kvpools_core.planning.distributed import RankId
from kvpools_core.values import Plan, Serving

__all__ = [
    "SCHEMA",
    "VERSION",
    "capacity_document",
    "capacity_records",
    "rank_ids",
    "stage_plans",
    "trtllm_capacity_document",
]

SCHEMA = "kvpools.capacity-record"
"""The record's schema name; ``docs/capacity-record.schema.json`` is its JSON Schema."""
VERSION = 1
"""Raised only when a field changes meaning or is removed; added fields keep the version."""
ENGINE = "sglang"
"""The engine whose semantics every number follows (kvpools is exact against SGLang)."""


def rank_ids(serving: Serving) -> list[dict[str, int]]:
    """The ``tp_rank``, ``dp_rank`` and ``attn_tp_rank`` of every GPU of one pipeline stage, in SGLang's order.

    SGLang lays the TP ranks out as (attention DP, attention CP, attention TP), TP fastest:
    ``attn_tp_rank = tp_rank % attn_tp_size`` and ``attn_dp_rank = tp_rank // (attn_tp_size x attn_cp_size)``
    (``derive_attention_ranks``, ``sglang/srt/runtime_context.py``, SGLang 0.5.23).  With DP attention that
    attention-DP rank is the ``dp_rank``; without it ``dp_size`` replicas of ``tp_size`` ranks each run (SGLang's
    data-parallel controller) and ``dp_rank`` numbers the replica.
    """
    ranks = [RankId.of(tp, serving) for tp in range(serving.tp_size)]
    if serving.enable_dp_attention:
        return [{"tp_rank": r.tp_rank, "dp_rank": r.attn_dp_rank, "attn_tp_rank": r.attn_tp_rank} for r in ranks]
    return [
        {"tp_rank": r.tp_rank, "dp_rank": dp, "attn_tp_rank": r.attn_tp_rank}
        for dp in range(serving.dp_size)
        for r in ranks
    ]


def _pages(tokens: int, page: int) -> int:
    return -(-tokens // page)


def _groups(limits: Limits, answer: Capacity) -> list[dict[str, Any]]:
    """One group per token space and one for the state cache, each in blocks of one block id.

    A block id covers ``page`` tokens of context.  It holds ``page`` slots of the full space and of a windowed
    one (their allocators hand out whole pages), ``page / r`` slots of a compressed space of ratio ``r`` (its
    slot of full slot ``s`` is ``s // r``: no allocator of its own, :attr:`Plan.compression`), and no state
    slot (a state slot belongs to a request, whatever its length).
    """
    page = limits.page_size
    groups: list[dict[str, Any]] = []
    for space, slots in limits.tokens.items():
        ratio = limits.compressed.get(space)
        window = limits.windowed.get(space)
        per_block = limits.space_page(space)
        held = answer.tokens_per_request[space]
        groups.append(
            {
                "name": space,
                "kind": "window" if window else "compressed" if ratio else "full",
                "slots": slots,
                "slots_per_block": per_block,
                "tokens_per_block": page,
                "total_blocks": slots // per_block,
                "slots_per_request": held,
                "blocks_per_request": _pages(held, per_block),
                "max_requests": answer.limits[token_limit(space)],
                "compression_ratio": ratio,
                "window_tokens": window.window if window else None,
            }
        )
    if limits.slots_per_request:
        groups.append(
            {
                "name": "state",
                "kind": "state",
                "slots": limits.state_slots,
                "slots_per_block": 1,
                "tokens_per_block": None,
                "total_blocks": limits.state_slots,
                "slots_per_request": limits.slots_per_request,
                "blocks_per_request": limits.slots_per_request,
                "max_requests": answer.limits[STATE_SLOTS],
                "compression_ratio": None,
                "window_tokens": None,
            }
        )
    return groups


def _binding_group(binding: str, groups: list[dict[str, Any]]) -> str | None:
    """The group whose limit binds, or None when the request cap or the context length does."""
    for group in groups:
        limit = STATE_SLOTS if group["kind"] == "state" else token_limit(group["name"])
        if limit == binding:
            return str(group["name"])
    return None


_BUDGET_FIELDS = (
    "budget_bytes",
    "source",
    "device",
    "free_bytes",
    "weights_bytes",
    "pre_model_load_bytes",
    "mem_fraction_static",
    "slack_bytes",
    "reserved_bytes",
)


def _budget(plan: Plan) -> dict[str, Any]:
    """The budget terms the plan has; ``gpu`` / ``gpu_total_bytes`` are null until a GPU catalogue fills them."""
    budget = plan.budget
    terms = {name: getattr(budget, name) for name in _BUDGET_FIELDS}
    terms["gpu"] = getattr(budget, "gpu", None)
    terms["gpu_total_bytes"] = getattr(budget, "gpu_total_bytes", None)
    return terms


def _stage_record(plan: Plan, context_len: int) -> dict[str, Any]:
    """The fields every rank of ``plan``'s stage shares."""
    serving, model = plan.serving, plan.model
    limits = limits_of(plan)
    if limits.compressed_pages:
        raise UnsupportedCombinationError(
            f"kvpools does not model the capacity record of a compressed token space with a page allocator of its "
            f"own yet ({sorted(limits.compressed_pages)} of {model.name}: SGLang's NPU DeepSeek-V4 c128 pool, whose "
            f"pages are not the full space's block ids). `kvpools capacity` answers its limits."
        )
    answer = concurrency(plan, context_len)
    groups = _groups(limits, answer)
    page = serving.page_size
    return {
        "engine": ENGINE,
        "accounting": serving.accounting,
        "platform": serving.platform,
        **_model_fields(model, serving),
        "parallelism": {
            "tp_size": serving.tp_size,
            "pp_size": serving.pp_size,
            "dp_size": serving.dp_size,
            "enable_dp_attention": serving.enable_dp_attention,
            "attn_tp_size": serving.attn_tp_size,
            "attn_dp_size": serving.attn_dp_size,
            "attn_cp_size": serving.attn_cp_size,
            "dcp_size": serving.dcp_size,
        },
        "pp_rank": serving.pp_rank,
        "block_size": page,
        "tokens_per_block_id": page,
        "total_kv_blocks": plan.max_total_num_tokens // page,
        "max_total_num_tokens": plan.max_total_num_tokens,
        "groups": groups,
        "context_len": context_len,
        "max_concurrency": answer.concurrent_requests,
        "binding": answer.binding,
        "binding_group": _binding_group(answer.binding, groups),
        "max_running_requests": plan.max_running_requests,
        "gpu_kv_bytes": plan.planned_bytes,
        "budget": _budget(plan),
        "host_kv_bytes": plan.host_kv_bytes,
        "host_tokens": plan.host_tokens,
    }


def capacity_records(plan: Plan, *, context_len: int | None = None) -> list[dict[str, Any]]:
    """One record per GPU of ``plan``'s pipeline stage, at ``context_len`` (default: the model's context length).

    The ranks of one stage share every number: KV heads are split evenly over the attention TP ranks (or
    replicated when fewer), and every DP-attention worker is sized alike.
    """
    context = plan.model.context_len if context_len is None else context_len
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ConfigError(f"context_len must be a positive number of tokens, got {context_len!r}.")
    shared = _stage_record(plan, context)
    return [{**ids, **shared} for ids in rank_ids(plan.serving)]


def _check_stages(plans: Sequence[Plan]) -> None:
    first = plans[0]
    for other in plans[1:]:
        same = attrs.evolve(other.serving, pp_rank=first.serving.pp_rank) == first.serving
        if other.model.name != first.model.name or not same:
            raise ConfigError(
                "The plans of one capacity document must be stages of one deployment (the same model and serving "
                f"options but {option('pp_rank')}); got {first.model.name!r} and {other.model.name!r}."
            )
    ranks = [p.serving.pp_rank for p in plans]
    if len(set(ranks)) != len(ranks):
        raise ConfigError(f"The plans of one capacity document repeat pipeline stage(s): {sorted(ranks)}.")


def capacity_document(plans: Plan | Iterable[Plan], *, context_len: int | None = None) -> dict[str, Any]:
    """``{"schema", "version", "context_len", "complete", "pp_ranks", "records"}`` for the stages given.

    ``complete`` says whether every pipeline stage is covered (always, without pipeline parallelism).
    """
    stages = [plans] if isinstance(plans, Plan) else sorted(plans, key=lambda p: p.serving.pp_rank)
    if not stages:
        raise ConfigError("A capacity document needs at least one plan.")
    _check_stages(stages)
    context = stages[0].model.context_len if context_len is None else context_len
    records = [record for stage in stages for record in capacity_records(stage, context_len=context)]
    ranks = [stage.serving.pp_rank for stage in stages]
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "context_len": context,
        "complete": ranks == list(range(stages[0].serving.pp_size)),
        "pp_ranks": ranks,
        "records": records,
    }


def stage_plans(model: Any, serving: Serving, **budget: Any) -> list[Plan]:
    """The plan of every pipeline stage of ``serving`` (one plan without pipeline parallelism).

    ``budget`` is what :func:`kvpools_core.plan` takes (``memory``, ``free_memory``, ...).
    """
    from kvpools_core.pipeline import plan as make_plan

    return [make_plan(model, attrs.evolve(serving, pp_rank=rank), **budget) for rank in range(serving.pp_size)]


def _trtllm_draft(result: Any, rank: Any, draft_pools: Sequence[Any]) -> dict[str, Any] | None:
    """The ``trtllm.draft`` object: where the draft's KV lives and, with a manager of its own, its pool."""
    if result.draft_kv_cache is None:
        return None
    drafting = result.drafting
    pool = draft_pools[0] if draft_pools else None
    return {
        "decoding_type": drafting.decoding_type if drafting is not None else "MTP",
        "kv_cache": result.draft_kv_cache,
        "layers": len(pool.layers) if pool is not None else result.num_nextn_predict_layers,
        "extra_tokens_per_request": result.extra_tokens_per_request,
        "estimated_size_per_token": rank.draft_estimated_size_per_token,
        "bytes_per_token": pool.bytes_per_token if pool is not None else None,
        "max_num_blocks": pool.primary_blocks if pool is not None else None,
        "max_num_tokens": pool.primary_blocks * result.tokens_per_block if pool is not None else None,
    }


def _trtllm_v2_document(result: Any, context: int) -> dict[str, Any]:
    """The capacity document of a ``KVCacheManagerV2`` plan (DeepSeek-V4's ``DeepseekV4CacheManager``,
    :class:`~kvpools_core.engines.trtllm.deployment_v2.TrtllmV2PlanResult`): one group per **pool group** of the
    runtime's solve, a block being one slot (one block of every buffer of the group's life cycles, ``tokens_per_block``
    tokens).  A request of ``context`` tokens holds ``ceil(L / tokens_per_block)`` slots of a window-less group and,
    of a windowed one, those less the blocks behind each life cycle's window (``PoolGroup.slots_for``, with ``L - 1``
    tokens attended, as :meth:`TrtllmV2PlanResult.concurrency_at` counts).  ``total_kv_blocks`` /
    ``max_total_num_tokens`` are the window-less group's slots and tokens (the tokens the pools hold);
    ``trtllm.kv_cache_capacity`` is what ``get_kv_cache_capacity()`` publishes (its ``maxNumBlocks`` is
    ``blocks_in_primary_pool``, the first layer's SWA page bound, not a count of token blocks)."""
    solve = result.v2
    block = result.tokens_per_block
    held = result.concurrency_at(context)
    groups: list[dict[str, Any]] = []
    names: set[str] = set()
    for group in solve.groups:
        slots = solve.slots[group.index]
        full = None in group.windows
        window = None if full else max(w for w in group.windows if w is not None)
        name = "full" if full else f"window_{window}"
        if name in names:
            name = f"{name}_group_{group.index}"
        names.add(name)
        per_request = max(group.slots_for(context, context - 1, block), 1)
        groups.append(
            {
                "name": name,
                "kind": "full" if full else "window",
                "slots": slots * block,
                "slots_per_block": block,
                "tokens_per_block": block,
                "total_blocks": slots,
                "slots_per_request": per_request * block,
                "blocks_per_request": per_request,
                "max_requests": slots // per_request,
                "compression_ratio": None,
                "window_tokens": window,
            }
        )
    rank = result.ranks[0]
    shared = _trtllm_stage(
        result,
        rank,
        context=context,
        groups=groups,
        held=held,
        total_kv_blocks=result.max_kv_tokens // block,
        gpu_kv_bytes=solve.total_bytes,
        host_blocks=None,
        bytes_per_token=rank.cache_bytes_per_token,
        draft=None,
        kv_cache_manager_v2={
            "manager": result.v2_manager,
            "quota": solve.quota,
            "max_gpu_total_bytes": rank.max_gpu_total_bytes,
            "pool_groups": [
                {
                    "name": entry["name"],
                    "windows": list(group.windows),
                    "slots": solve.slots[group.index],
                    "slot_bytes": group.slot_bytes,
                    "bytes": solve.group_bytes(group.index),
                    "ratio": solve.ratios[group.index],
                    "min_slots": solve.min_slots[group.index],
                }
                for group, entry in zip(solve.groups, groups, strict=True)
            ],
        },
    )
    return _trtllm_document(result, context, [shared])


def trtllm_capacity_document(result: Any, *, context_len: int | None = None) -> dict[str, Any]:
    """The capacity document of a ``--accounting trtllm`` plan (:class:`~kvpools_core.engines.trtllm.TrtllmPlanResult`):
    the same document and record fields, with TensorRT-LLM's meanings, and a ``trtllm`` object per record with what
    ``LLM.get_kv_cache_capacity()`` publishes.

    ``block_size`` is ``tokens_per_block``; one group per attention-window pool (``full``, or ``window_W``), each
    with the blocks the MIN across stages leaves it; ``total_kv_blocks`` and ``max_total_num_tokens`` are the
    smallest pool's (``maxNumBlocks`` / ``maxNumTokens`` without VSWA); ``max_running_requests`` is
    ``max_batch_size``; ``budget_bytes`` the stage's ``free_gpu_memory_fraction`` of its memory free after
    warm-up (``free_bytes``).  Refused, with the reason, where kvpools does not model it: a context past
    ``max_seq_len`` (TensorRT-LLM refuses the request) and VSWA pools over pipeline stages (their bytes per stage).
    """
    context = result.max_seq_len if context_len is None else context_len
    if isinstance(context, bool) or not isinstance(context, int) or context < 1:
        raise ConfigError(f"context_len must be a positive number of tokens, got {context_len!r}.")
    if context > result.max_seq_len:
        raise ConfigError(
            f"{option('context')} {context} is longer than the deployment's max_seq_len {result.max_seq_len}: "
            "TensorRT-LLM refuses such a request. Pass a shorter context, or plan with --max_seq_len."
        )
    serving = result.serving
    if (result.is_vswa or result.hybrid_manager) and serving.pp_size > 1:
        raise UnsupportedCombinationError(
            "kvpools does not model the capacity record of TensorRT-LLM's VSWA or hybrid pools over pipeline stages "
            "yet (each stage's bytes per window); use --pp-size 1, or kvpools plan --accounting trtllm --json."
        )
    if getattr(result, "context_parallel", None) is not None:
        # A helix request's blocks are split over the CP ranks (rank 0 holds the most), which the record's one
        # blocks-per-request field cannot say.
        raise UnsupportedCombinationError(
            "kvpools does not model the capacity record of TensorRT-LLM's helix context parallelism yet (a request's "
            "blocks are split over the CP ranks); use kvpools capacity --accounting trtllm --json."
        )
    if getattr(result, "v2_manager", None):
        return _trtllm_v2_document(result, context)
    block = result.tokens_per_block
    held = result.concurrency_at(context)
    # A drafting request holds num_extra_kv_tokens + a step's draft tokens beyond its own, in both managers' pools
    # (TrtllmPlanResult.extra_tokens_per_request; 0 without drafting).
    extra = result.extra_tokens_per_request
    groups = []
    for pool in result.pools:
        if pool.recurrent:
            # CppMambaHybridCacheManager's RECURRENT_STATES pool: one block per request (one of them the CUDA-graph
            # padding dummy's), each one request's state over the stage's recurrent layers.
            groups.append(
                {
                    "name": "state",
                    "kind": "state",
                    "slots": pool.primary_blocks,
                    "slots_per_block": 1,
                    "tokens_per_block": None,
                    "total_blocks": pool.primary_blocks,
                    "slots_per_request": 1,
                    "blocks_per_request": 1,
                    "max_requests": pool.primary_blocks - 1,
                    "compression_ratio": None,
                    "window_tokens": None,
                }
            )
            continue
        full = pool.window >= result.max_seq_len or pool.draft
        per_request = _pages(min(context, pool.window) + extra, block)
        groups.append(
            {
                "name": "draft" if pool.draft else "full" if full else f"window_{pool.window}",
                "kind": "full" if full else "window",
                "slots": pool.primary_blocks * block,
                "slots_per_block": block,
                "tokens_per_block": block,
                "total_blocks": pool.primary_blocks,
                "slots_per_request": min(context, pool.window) + extra,
                "blocks_per_request": per_request,
                "max_requests": pool.primary_blocks // per_request,
                "compression_ratio": None,
                "window_tokens": None if full else pool.window,
            }
        )
    # The target's pools: get_kv_cache_capacity() publishes the target's manager, the draft's is a group of its own.
    smallest = min(pool.primary_blocks for pool in result.kv_pools if not pool.draft)
    draft_pools = [pool for pool in result.kv_pools if pool.draft]
    host_blocks = min(pool.secondary_blocks for pool in result.kv_pools)
    stages = []
    for rank in result.ranks:
        per_token = (
            rank.cache_bytes_per_token
            if not result.is_vswa
            else sum(pool.bytes_per_token for pool in result.pools)  # VSWA: one stage (refused above otherwise)
        )
        kv_bytes = (
            smallest * block * per_token
            if not result.is_vswa
            else sum(pool.primary_blocks * block * pool.bytes_per_token for pool in result.pools)
        ) + sum(pool.primary_bytes(block) for pool in result.pools if pool.recurrent or pool.draft)
        stages.append(
            _trtllm_stage(
                result,
                rank,
                context=context,
                groups=groups,
                held=held,
                total_kv_blocks=smallest,
                gpu_kv_bytes=kv_bytes,
                host_blocks=host_blocks,
                bytes_per_token=per_token,
                draft=_trtllm_draft(result, rank, draft_pools),
            )
        )
    return _trtllm_document(result, context, stages)


def _trtllm_stage(
    result: Any,
    rank: Any,
    *,
    context: int,
    groups: list[dict[str, Any]],
    held: int | None,
    total_kv_blocks: int,
    gpu_kv_bytes: int,
    host_blocks: int | None,
    bytes_per_token: int,
    draft: dict[str, Any] | None,
    **manager: Any,
) -> dict[str, Any]:
    """The record fields a pipeline stage's TP ranks share, for a V1 / hybrid (:func:`trtllm_capacity_document`) or
    ``KVCacheManagerV2`` (:func:`_trtllm_v2_document`) plan: ``groups`` and ``held`` (the requests of ``context``
    tokens) as the caller counted them, the binding group the one holding the fewest requests unless
    ``max_batch_size`` binds first; ``host_blocks`` the host tier's blocks (None: none modelled); ``manager`` more
    ``trtllm`` fields."""
    serving, model = result.serving, result.model
    block = result.tokens_per_block
    tightest = min(groups, key=lambda group: group["max_requests"])
    binding_group = None if held == result.max_batch_size < tightest["max_requests"] else tightest["name"]
    dp = result.enable_attention_dp
    return {
        "pp_rank": rank.pp_rank,
        "engine": "trtllm",
        "accounting": "trtllm",
        "platform": serving.platform,
        **_model_fields(model, serving),
        "parallelism": {
            "tp_size": serving.tp_size,
            "pp_size": serving.pp_size,
            "dp_size": serving.tp_size if dp else 1,
            "enable_dp_attention": dp,
            "attn_tp_size": 1 if dp else serving.tp_size,
            "attn_dp_size": serving.tp_size if dp else 1,
            "attn_cp_size": 1,
            "dcp_size": 1,
        },
        "block_size": block,
        "tokens_per_block_id": block,
        "total_kv_blocks": total_kv_blocks,
        "max_total_num_tokens": total_kv_blocks * block,
        "groups": groups,
        "context_len": context,
        "max_concurrency": held,
        "binding": "request cap" if binding_group is None else f"{binding_group} tokens",
        "binding_group": binding_group,
        "max_running_requests": result.max_batch_size,
        "gpu_kv_bytes": gpu_kv_bytes,
        "budget": {
            "budget_bytes": rank.available_kv_memory,
            "source": "free after warm-up",
            "device": None,
            "free_bytes": rank.free_after_warmup,
            "weights_bytes": rank.weights_memory,
            "pre_model_load_bytes": None,
            "mem_fraction_static": None,
            "slack_bytes": None,
            "reserved_bytes": None,
            "gpu": result.gpu.name if result.gpu is not None else None,
            "gpu_total_bytes": result.gpu.total_bytes if result.gpu is not None else None,
        },
        "host_kv_bytes": result.host_cache_size if host_blocks is not None else None,
        "host_tokens": host_blocks * block if host_blocks is not None and result.host_cache_size else None,
        "trtllm": {
            "version": TRTLLM_VERSION,
            "free_gpu_memory_fraction": result.free_gpu_memory_fraction,
            "max_seq_len": result.max_seq_len,
            "max_num_tokens": result.max_num_tokens,
            "bytes_per_token": bytes_per_token,
            "kv_cache_capacity": result.kv_cache_capacity(),
            "draft": draft,
            **manager,
        },
    }


def _model_fields(model: Any, serving: Any) -> dict[str, Any]:
    """A record's ``model`` object and ``kv_cache_dtype`` (the KV cache's resolved dtype), whatever the engine."""
    return {
        "model": {
            "name": model.name,
            "source": model.source,
            "architecture": model.architecture,
            "context_len": model.context_len,
            "num_layers": model.num_layers,
        },
        "kv_cache_dtype": resolve_kv_dtype(serving.kv_cache_dtype, model.dtype).name,
    }


def _trtllm_document(result: Any, context: int, stages: list[dict[str, Any]]) -> dict[str, Any]:
    """The capacity document of a TensorRT-LLM plan: one record per TP rank of each stage (``stages``, from
    :func:`_trtllm_stage`), its DP-attention ids."""
    dp = result.enable_attention_dp
    records = [
        {"tp_rank": tp, "dp_rank": tp if dp else 0, "attn_tp_rank": 0 if dp else tp, **shared}
        for shared in stages
        for tp in range(result.serving.tp_size)
    ]
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "context_len": context,
        "complete": True,
        "pp_ranks": [shared["pp_rank"] for shared in stages],
        "records": records,
    }
