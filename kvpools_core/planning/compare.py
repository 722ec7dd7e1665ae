"""``kvpools compare``: one model through SGLang's accounting and vLLM's, side by side, per layer group, and
TensorRT-LLM's (``--accounting trtllm``) as a third engine: its budget, pools and requests per context length.

:func:`compare_engines` plans the model twice from the same budget -- SGLang's pipeline
(:func:`kvpools_core.pipeline.plan`, ``accounting="sglang"``) and vLLM's
(:func:`kvpools_core.engines.vllm.plan_vllm`) --
and lines their pools up by what they store:

* the full-attention (or MLA latent) layers: SGLang's token pools of the ``"full"`` token space, vLLM's
  ``FullAttentionSpec`` / ``MLAAttentionSpec`` groups (a DSA indexer rides in the same uniform-type group);
* sliding-window (or chunked-local) layers: SGLang's windowed token space (:attr:`Plan.windows`), vLLM's
  ``SlidingWindowSpec`` / ``ChunkedLocalAttentionSpec`` groups;
* recurrent state: SGLang's state-slot pools, vLLM's ``MambaSpec`` groups.

"The same budget" is the KV cache's bytes with ``memory`` (SGLang's explicit budget; vLLM's
``--kv-cache-memory-bytes``), and each engine's own arithmetic on the same GPU with ``gpu`` / ``gpu_memory``
(SGLang: total - runtime - weights - slack at its default ``--mem-fraction-static``; vLLM: ``ceil(total x
--gpu-memory-utilization)`` - weights), both budgets shown.  Every difference is explained from the two plans'
own numbers (:attr:`LayerGroupComparison.why`, :attr:`EngineComparison.notes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from kvpools_core.errors import ConfigError, KvpoolsError, UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parts.vllm.specs import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvpools_core.planning.capacity import concurrency, window_pool_sizing
from kvpools_core.units import format_bytes
from kvpools_core.values import FULL_TOKENS, STATE_SLOT, TOKEN, Plan, PoolSpec, Serving, is_unset

if TYPE_CHECKING:
    from kvpools_core.engines.trtllm.deployment import TrtllmPlanResult
    from kvpools_core.engines.vllm.deployment import VllmPlanResult
    from kvpools_core.engines.vllm.planning import KVCacheGroupSpec
    from kvpools_core.pipeline.gpus import GPU
    from kvpools_core.registry import Registry

WINDOW = "window"
"""The row key of vLLM's windowed groups when SGLang's plan has no (or more than one) windowed token space."""


@attrs.frozen(kw_only=True)
class LayerGroupComparison:
    """One kind of layer in both engines: what a token (or a state slot) costs, how many fit, and why they differ.

    ``unit`` is ``"token"`` or ``"state_slot"``; ``token_space`` the SGLang token space of a token row.
    SGLang's side: the pools its estimate charges (``sglang_pools``), their bytes per unit, slots and bytes.
    vLLM's side: the KV-cache groups of this kind (indices into ``VllmKVCachePlan.groups``), their layers,
    block size and page bytes (one layer's page; a uniform-type group's is the sum of its layers'),
    ``vllm_bytes_per_token`` the bytes the groups' layers store per token (per request for state),
    ``vllm_charged_bytes_per_token`` what a token takes of the shared pool (each group's block spans the widest
    group's layers), ``vllm_tokens`` the tokens of this kind the usable blocks hold were they all given to it,
    and ``vllm_blocks_per_request`` a request's blocks at each compared context length.
    """

    kind: str
    unit: str
    token_space: str | None
    sglang_pools: tuple[str, ...] = ()
    sglang_bytes_per_unit: int | None = None
    sglang_slots: int | None = None
    sglang_bytes: int | None = None
    vllm_groups: tuple[int, ...] = ()
    vllm_specs: tuple[str, ...] = ()
    vllm_layers: int = 0
    vllm_block_size: int | None = None
    vllm_page_size_bytes: tuple[int, ...] = ()
    vllm_bytes_per_token: float | None = None
    vllm_charged_bytes_per_token: float | None = None
    vllm_tokens: int | None = None
    vllm_blocks_per_request: tuple[int, ...] = ()
    trtllm_windows: tuple[int, ...] = ()
    """TensorRT-LLM's window pools of this kind (``WindowPool.window``; one full pool without VSWA)."""
    trtllm_layers: int = 0
    trtllm_bytes_per_token: int | None = None
    """What a token costs in those pools' layers (``get_cache_bytes_per_token`` of the pool's layers)."""
    trtllm_blocks: tuple[int, ...] = ()
    """Each pool's ``blocks_in_primary_pool`` (after the MIN across ranks)."""
    trtllm_tokens: int | None = None
    """The tokens the smallest of those pools holds (``blocks x tokens_per_block``)."""
    why: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in attrs.asdict(self, recurse=False).items()
        }


@attrs.frozen(kw_only=True)
class ContextComparison:
    """Concurrent requests of ``context_len`` tokens in each engine.

    SGLang: :func:`kvpools_core.planning.capacity.concurrency` (whole requests of each pool, page-rounded, capped by
    ``max_running_requests``) and what binds.  vLLM: ``max_concurrency`` as its start-up log computes it
    (``num_gpu_blocks / Σ_groups blocks``, the null block counted, a fraction), and ``vllm_requests`` whole
    requests of the usable blocks (``(num_gpu_blocks - 1) // blocks``) capped by ``--max-num-seqs``.
    ``None`` where vLLM was not planned or the length is past its ``max_model_len``.
    """

    context_len: int
    sglang_requests: int
    sglang_binding: str
    vllm_max_concurrency: float | None = None
    vllm_blocks_per_request: int | None = None
    vllm_requests: int | None = None
    vllm_binding: str | None = None
    trtllm_requests: int | None = None
    """TensorRT-LLM's requests of this length (:meth:`TrtllmPlanResult.concurrency_at`), None without its plan or
    past its ``max_seq_len``."""

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class EngineComparison:
    """The same model planned by SGLang's accounting and by vLLM's, from the same budget.

    ``vllm`` is None when vLLM's accounting is not modelled for the architecture or vLLM would refuse to start
    (``vllm_refusal`` says which, in kvpools' or vLLM's words).  ``budget_basis`` is ``"memory"`` (both engines
    get ``sglang_budget`` = ``vllm_budget`` bytes of KV cache) or ``"gpu"`` (each engine's own budget on the
    GPU: they differ, ``notes`` say by how much and why).
    """

    model: str
    budget_basis: str
    sglang: Plan
    vllm: VllmPlanResult | None
    vllm_refusal: str | None
    groups: tuple[LayerGroupComparison, ...]
    contexts: tuple[ContextComparison, ...]
    notes: tuple[str, ...]
    exact_max_total_num_tokens: int | None = None
    """What ``kvpools plan`` gives from the same budget under its default ``--accounting exact`` (which also fits
    the pools SGLang's estimate leaves out), or None when that accounting does not plan it."""
    trtllm: TrtllmPlanResult | None = None
    """The third engine, TensorRT-LLM (``--accounting trtllm``), or None where kvpools does not model it or
    TensorRT-LLM would refuse (``trtllm_refusal``)."""
    trtllm_refusal: str | None = None

    @property
    def sglang_budget(self) -> int:
        return self.sglang.budget.budget_bytes

    @property
    def vllm_budget(self) -> int | None:
        """vLLM's ``available_kv_cache_memory`` (one worker), or None without a vLLM plan."""
        return None if self.vllm is None else self.vllm.budgets[0].available_kv_cache_memory

    def to_dict(self) -> dict[str, Any]:
        """``kvpools compare --json``."""
        vllm = self.vllm
        return {
            "model": self.model,
            "budget_basis": self.budget_basis,
            "sglang": {
                "budget_bytes": self.sglang_budget,
                "budget_steps": list(self.sglang.budget.steps),
                "cell_size_bytes": self.sglang.cell.sglang_bytes_per_token,
                "max_total_num_tokens": self.sglang.max_total_num_tokens,
                "token_counts": dict(self.sglang.sizing.token_counts),
                "state_slots": self.sglang.sizing.state_slots,
                "max_running_requests": self.sglang.max_running_requests,
                "page_size": self.sglang.serving.page_size,
                "context_length": self.sglang.model.context_len,
                "sglang_estimate_bytes": self.sglang.sizing.sglang_estimate_bytes,
                "exact_max_total_num_tokens": self.exact_max_total_num_tokens,
            },
            "vllm": None
            if vllm is None
            else {
                "available_kv_cache_memory": self.vllm_budget,
                "num_gpu_blocks": vllm.plan.num_gpu_blocks,
                "bytes_per_block": vllm.plan.bytes_per_block[0],
                "block_size": vllm.effective_block_size,
                "max_model_len": vllm.max_model_len,
                "max_num_seqs": vllm.max_num_seqs,
                "max_concurrency": vllm.plan.max_concurrency,
                "kv_cache_size_tokens": vllm.plan.kv_cache_size_tokens,
                "log_line": vllm.plan.log_line,
                "serve_command": vllm.serve_command(),
            },
            "vllm_refusal": self.vllm_refusal,
            "trtllm": None if self.trtllm is None else _trtllm_dict(self.trtllm),
            "trtllm_refusal": self.trtllm_refusal,
            "groups": [group.to_dict() for group in self.groups],
            "contexts": [context.to_dict() for context in self.contexts],
            "notes": list(self.notes),
        }


COMPARE_SERVING_FIELDS = ("tp_size", "kv_cache_dtype", "platform")
"""The ``Serving`` fields both engines read alike (vLLM's planning reads no other SGLang option)."""


def compare_engines(
    model: str,
    serving: Serving | None = None,
    *,
    contexts: Sequence[int] = (),
    memory: int | str | None = None,
    gpu: str | GPU | None = None,
    gpu_memory: int | str | None = None,
    weights_memory: int | str | None = None,
    context_length: int | None = None,
    page_size: int | None = None,
    block_size: int | None = None,
    tokens_per_block: int | None = None,
    registry: Registry | None = None,
) -> EngineComparison:
    """Plan ``model`` with SGLang's accounting and vLLM's from the same budget, and line the two up.

    ``serving`` carries what both engines read (``tp_size``, ``kv_cache_dtype``); ``context_length`` is SGLang's
    ``--context-length`` and vLLM's ``--max-model-len`` (default: the model's); ``page_size`` is SGLang's
    (default 1) and ``block_size`` vLLM's (default 16), each engine's own default otherwise; ``tokens_per_block`` is
    TensorRT-LLM's ``kv_cache_config.tokens_per_block`` (default 32; DeepSeek-V4's manager takes 128 or 256).
    The budget is ``memory`` (the KV cache's bytes, for both) or a whole GPU (``gpu`` / ``gpu_memory``, each
    engine's own arithmetic, with ``weights_memory`` or kvpools' estimate).  ``contexts`` are the lengths concurrency is
    compared at (default: the context length).  Pipeline parallelism is refused (the per-group rows are one
    rank's).
    """
    from kvpools_core.engines import engine_for
    from kvpools_core.engines.vllm.planning import VllmMemoryError

    plan_sglang, plan_vllm = engine_for("sglang").plan, engine_for("vllm").plan

    serving = serving or Serving()
    if serving.pp_size != 1:
        raise ConfigError(
            f"kvpools compare lines up one rank's pools: {option('pp_size')} {serving.pp_size} is not compared "
            "yet; compare one stage's layers with --pp-size 1, or plan each engine with `kvpools plan`."
        )
    other = [
        field.name
        for field in attrs.fields(Serving)
        if field.name not in (*COMPARE_SERVING_FIELDS, "accounting", "platform_traits", "workspaces", "page_size")
        and getattr(serving, field.name) != getattr(Serving(), field.name)
    ]
    if other:
        raise ConfigError(
            f"kvpools compare plans both engines from the options they share (--tp-size, --kv-cache-dtype, "
            f"--context-length, --page-size for SGLang, --block-size for vLLM); {option(other[0])} is one engine's."
        )
    if memory is not None and weights_memory is not None:
        raise ConfigError(
            f"{option('memory')} is the KV cache's own budget for both engines; {option('weights_memory')} applies "
            f"to a {option('gpu')} budget only. Drop one of them."
        )
    sglang_serving = attrs.evolve(
        serving,
        accounting="sglang",
        context_length=context_length,
        page_size=serving.page_size if page_size is None else page_size,
    )
    budget: dict[str, Any] = {"memory": memory, "gpu": gpu, "gpu_memory": gpu_memory, "weights_memory": weights_memory}
    if gpu is not None or gpu_memory is not None:
        sglang_serving = _sglang_gpu_defaults(sglang_serving, gpu, gpu_memory)
    sglang = plan_sglang(model, sglang_serving, registry=registry, **budget)
    try:  # what `kvpools plan` (default --accounting exact) gives from this budget, to say why it differs
        exact: Plan | None = plan_sglang(
            model, attrs.evolve(sglang_serving, accounting="exact"), registry=registry, **budget
        )
    except KvpoolsError:
        exact = None
    vllm: VllmPlanResult | None = None
    refusal: str | None = None
    try:
        vllm = plan_vllm(
            model,
            attrs.evolve(serving, accounting="vllm", page_size=Serving().page_size),
            max_model_len=context_length,
            block_size=block_size,
            registry=registry,
            **budget,
        )
    except UnsupportedCombinationError as error:
        refusal = f"vLLM's accounting is not modelled for this model: {error}"
    except VllmMemoryError as error:
        refusal = f"vLLM would refuse it: {error}"
    trtllm, trtllm_refusal = _plan_trtllm(model, serving, context_length, budget, registry, tokens_per_block)
    lengths = tuple(contexts) or (sglang.model.context_len if context_length is None else context_length,)
    groups = _with_trtllm(_rows(sglang, vllm, lengths), sglang, trtllm)
    trt_notes = () if trtllm is None else (_trtllm_note(trtllm, memory is not None),)
    return EngineComparison(
        model=sglang.model.name,
        budget_basis="memory" if memory is not None else "gpu",
        sglang=sglang,
        vllm=vllm,
        vllm_refusal=refusal,
        groups=groups,
        contexts=tuple(
            attrs.evolve(
                _context(sglang, vllm, length),
                trtllm_requests=None if trtllm is None else trtllm.concurrency_at(length),
            )
            for length in lengths
        ),
        notes=(*_notes(sglang, vllm, refusal, memory is not None), *trt_notes, _exact_note(sglang, exact)),
        exact_max_total_num_tokens=None if exact is None else exact.max_total_num_tokens,
        trtllm=trtllm,
        trtllm_refusal=trtllm_refusal,
    )


def _plan_trtllm(
    model: str,
    serving: Serving,
    context_length: int | None,
    budget: dict[str, Any],
    registry: Registry | None,
    tokens_per_block: int | None = None,
) -> tuple[TrtllmPlanResult | None, str | None]:
    """TensorRT-LLM's plan from the same budget: ``memory`` is taken as its free memory after warm-up (so its KV
    cache is 0.9 of it), a GPU is its own arithmetic; or why it is not planned."""
    from kvpools_core.engines import engine_for

    try:
        result = engine_for("trtllm").plan(
            model,
            attrs.evolve(serving, accounting="trtllm", page_size=Serving().page_size),
            max_seq_len=context_length,
            tokens_per_block=tokens_per_block,
            registry=registry,
            **budget,
        )
    except KvpoolsError as error:
        return None, f"TensorRT-LLM's accounting is not planned for this model: {error}"
    return result, None


def _trtllm_dict(result: TrtllmPlanResult) -> dict[str, Any]:
    rank = result.ranks[0]
    return {
        "available_kv_memory": rank.available_kv_memory,
        "free_gpu_memory_fraction": result.free_gpu_memory_fraction,
        "cache_bytes_per_token": rank.cache_bytes_per_token,
        "tokens_per_block": result.tokens_per_block,
        "pools": [
            {"window": pool.window, "layers": len(pool.layers), "primary_blocks": pool.primary_blocks}
            for pool in result.pools
        ],
        "kv_cache_capacity": result.kv_cache_capacity(),
        "max_seq_len": result.max_seq_len,
        "max_batch_size": result.max_batch_size,
        "serve_command": result.serve_command(),
    }


def _trtllm_note(result: TrtllmPlanResult, explicit: bool) -> str:
    rank = result.ranks[0]
    basis = (
        "--memory taken as its memory free after warm-up"
        if explicit
        else f"total - weights {format_bytes(rank.weights_memory or 0)} taken as its memory free after warm-up "
        "(the warm-up's peak not profiled: an upper bound)"
    )
    return (
        f"TensorRT-LLM's budget {rank.available_kv_memory:,} B ({format_bytes(rank.available_kv_memory)}): {basis}, "
        f"x --kv_cache_free_gpu_memory_fraction {result.free_gpu_memory_fraction:g}; {rank.cache_bytes_per_token:,} "
        f"B per token in {len(result.pools)} pool(s) of {result.tokens_per_block}-token blocks (docs/trtllm.md)"
    )


def _sglang_gpu_defaults(serving: Serving, gpu: str | GPU | None, gpu_memory: int | str | None) -> Serving:
    """SGLang's chunked-prefill size for the GPU, as ``kvpools plan --gpu`` resolves it (its default fraction
    depends on it)."""
    from kvpools_core.pipeline.gpus import GPU as GpuValue
    from kvpools_core.pipeline.gpus import custom_gpu, find_gpu, sglang_chunked_prefill_size

    chosen = gpu if isinstance(gpu, GpuValue) else find_gpu(gpu) if gpu is not None else custom_gpu(gpu_memory or 0)
    if not is_unset(serving.chunked_prefill_size):  # given (even 8192), or None: chunked prefill off
        return serving
    return attrs.evolve(serving, chunked_prefill_size=sglang_chunked_prefill_size(chosen.total_mib, chosen.platform))


# ---------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------


def _group_kind(group: KVCacheGroupSpec) -> tuple[str, str]:
    """(unit, label) of one vLLM group."""
    spec = group.kv_cache_spec
    layers = list(spec.kv_cache_specs.values()) if isinstance(spec, UniformTypeKVCacheSpecs) else [spec]
    if any(isinstance(layer, MambaSpec) for layer in layers):
        return STATE_SLOT, "mamba state"
    if any(isinstance(layer, CircularBufferSpec) for layer in layers):
        return STATE_SLOT, "compressor ring"
    if any(isinstance(layer, SlidingWindowSpec) for layer in layers):
        return TOKEN, "sliding window"
    if any(isinstance(layer, ChunkedLocalAttentionSpec) for layer in layers):
        return TOKEN, "chunked local"
    mla = [layer for layer in layers if isinstance(layer, MLAAttentionSpec)]
    if mla:
        return TOKEN, "MLA + indexer" if any(layer.cache_role == "indexer" for layer in mla) else "MLA"
    return TOKEN, "full attention"


def _windowed_space(plan: Plan) -> str:
    spaces = [window.token_space for window in plan.windows]
    return spaces[0] if len(spaces) == 1 else WINDOW


def _key_of_group(group: KVCacheGroupSpec, plan: Plan) -> tuple[str, str | None, str]:
    unit, label = _group_kind(group)
    if unit == STATE_SLOT:
        return STATE_SLOT, None, label
    if label in ("sliding window", "chunked local"):
        return TOKEN, _windowed_space(plan), label
    return TOKEN, FULL_TOKENS, label


def _group_block_bytes(group: KVCacheGroupSpec) -> int:
    """The bytes one block of this group's layers store (the sum of their pages)."""
    return sum(group.layer_spec(name).page_size_bytes for name in group.layer_names)


def _rows(plan: Plan, vllm: VllmPlanResult | None, lengths: Sequence[int]) -> tuple[LayerGroupComparison, ...]:
    keys: dict[tuple[str, str | None], dict[str, Any]] = {}
    for pool in plan.pools:
        if not pool.sglang_charged or pool.unit not in (TOKEN, STATE_SLOT):
            continue
        key = (pool.unit, pool.token_space if pool.unit == TOKEN else None)
        keys.setdefault(key, {"pools": [], "groups": [], "label": None})["pools"].append(pool)
    if vllm is not None:
        for index, group in enumerate(vllm.plan.groups):
            unit, space, label = _key_of_group(group, plan)
            entry = keys.setdefault((unit, space), {"pools": [], "groups": [], "label": None})
            entry["groups"].append((index, group))
            entry["label"] = entry["label"] or label
    order = sorted(keys, key=lambda key: (key[0] == STATE_SLOT, key[1] != FULL_TOKENS, str(key[1])))
    return tuple(_row(key, keys[key], plan, vllm, lengths) for key in order)


def _bytes_per_unit(pool: PoolSpec) -> int:
    """A pool's bytes per token (or state slot) of the plan: a token pool spanning ``k`` slots per token (a draft
    pool under DCP, ``CellPart.slot_scale``) pays ``k`` slots' bytes, which its recorded cost says."""
    if pool.unit != TOKEN:
        return pool.bytes_per_slot
    cost = pool.group_cost
    return cost.token_bytes // cost.token_block


def _default_label(unit: str, space: str | None) -> str:
    if unit == STATE_SLOT:
        return "state"
    return "full attention" if space == FULL_TOKENS else f"{space} tokens"


def _row(
    key: tuple[str, str | None],
    entry: dict[str, Any],
    plan: Plan,
    vllm: VllmPlanResult | None,
    lengths: Sequence[int],
) -> LayerGroupComparison:
    unit, space = key
    pools = entry["pools"]
    row: dict[str, Any] = {"kind": entry["label"] or _default_label(unit, space), "unit": unit, "token_space": space}
    if pools:
        slots = plan.sizing.token_counts.get(space, 0) if space is not None else plan.sizing.state_slots
        row.update(
            sglang_pools=tuple(pool.name for pool in pools),
            sglang_bytes_per_unit=sum(_bytes_per_unit(pool) for pool in pools),
            sglang_slots=slots,
            sglang_bytes=sum(pool.bytes for pool in pools),
        )
    groups: list[tuple[int, KVCacheGroupSpec]] = entry["groups"]
    if vllm is not None and groups:
        block_sizes = {group.kv_cache_spec.block_size for _, group in groups}
        block_size = next(iter(block_sizes)) if len(block_sizes) == 1 else None
        per_block = vllm.plan.bytes_per_block[0]
        stored = sum(_group_block_bytes(group) for _, group in groups)
        usable = vllm.plan.num_gpu_blocks - 1
        row.update(
            vllm_groups=tuple(index for index, _ in groups),
            vllm_specs=tuple(_spec_name(group) for _, group in groups),
            vllm_layers=sum(len(group.layer_names) for _, group in groups),
            vllm_block_size=block_size,
            vllm_page_size_bytes=tuple(group.kv_cache_spec.page_size_bytes for _, group in groups),
            vllm_blocks_per_request=tuple(
                sum(group.blocks_per_request(vllm.limits.with_max_model_len(length)) for _, group in groups)
                if length <= vllm.max_model_len
                else 0
                for length in lengths
            ),
        )
        if unit == STATE_SLOT:
            row.update(vllm_bytes_per_token=float(stored), vllm_charged_bytes_per_token=float(len(groups) * per_block))
        elif block_size is not None:
            row.update(
                vllm_bytes_per_token=_exact(stored / block_size),
                vllm_charged_bytes_per_token=_exact(len(groups) * per_block / block_size),
                vllm_tokens=usable // len(groups) * block_size,
            )
    result = LayerGroupComparison(**row)
    return attrs.evolve(result, why=_why(result, plan, vllm))


def _trtllm_key(result: TrtllmPlanResult, pool: Any, plan: Plan) -> tuple[str, str | None]:
    """The row a TensorRT-LLM pool belongs to: the full (or MLA latent) row when one of its layers has no sliding
    window of its own, else the windowed row (compare plans one rank, so a pool's layers are global indices)."""
    model_layers = result.model.layers
    full = any(model_layers[index].sliding_window is None for index in pool.layers)
    return (TOKEN, FULL_TOKENS) if full else (TOKEN, _windowed_space(plan))


def _with_trtllm(
    rows: tuple[LayerGroupComparison, ...], plan: Plan, result: TrtllmPlanResult | None
) -> tuple[LayerGroupComparison, ...]:
    """``rows`` with TensorRT-LLM's pools filled in beside SGLang's pools and vLLM's groups of the same kind; a
    pool of a kind neither other engine has gets a row of its own."""
    if result is None:
        return rows
    by_key: dict[tuple[str, str | None], list[Any]] = {}
    state_key = next(((row.unit, row.token_space) for row in rows if row.unit == STATE_SLOT), (STATE_SLOT, None))
    for pool in result.pools:
        key = state_key if pool.recurrent else _trtllm_key(result, pool, plan)
        by_key.setdefault(key, []).append(pool)
    out = []
    for row in rows:
        pools = by_key.pop((row.unit, row.token_space), [])
        out.append(_trtllm_row(row, pools, result))
    for (unit, space), pools in by_key.items():
        out.append(
            _trtllm_row(
                LayerGroupComparison(kind=_default_label(unit, space), unit=unit, token_space=space), pools, result
            )
        )
    return tuple(out)


def _trtllm_row(row: LayerGroupComparison, pools: list[Any], result: TrtllmPlanResult) -> LayerGroupComparison:
    if not pools:
        line = "TensorRT-LLM: no pool of this kind"
        if row.unit == TOKEN and row.token_space != FULL_TOKENS and not result.is_vswa:
            line += (
                ": its KVCacheManager sizes these layers as full ones, in the full-attention pool, unless "
                "kv_cache_config.max_attention_window is given (`kvpools plan --accounting trtllm "
                "--max_attention_window ...`, docs/trtllm.md)"
            )
        return attrs.evolve(row, why=(*row.why, line))
    if all(pool.recurrent for pool in pools):
        blocks = tuple(pool.primary_blocks for pool in pools)
        line = (
            f"TensorRT-LLM: the recurrent-state pool of {result.hybrid_manager}, {', '.join(f'{b:,}' for b in blocks)} "
            f"blocks of {pools[0].recurrent_state_bytes:,} B (one request's state over "
            f"{sum(len(p.layers) for p in pools)} layers; max_batch_size x pp_size + 1 CUDA-graph dummy)"
        )
        return attrs.evolve(
            row,
            trtllm_layers=sum(len(pool.layers) for pool in pools),
            trtllm_blocks=blocks,
            why=(*row.why, line),
        )
    block = result.tokens_per_block
    per_token = sum(pool.bytes_per_token for pool in pools)
    blocks = tuple(pool.primary_blocks for pool in pools)
    tokens = min(blocks) * block
    windows = tuple(pool.window for pool in pools)
    line = (
        f"TensorRT-LLM: {'one pool' if len(pools) == 1 else f'{len(pools)} pools'} of its own "
        f"(window {', '.join(f'{w:,}' for w in windows)}), {sum(len(p.layers) for p in pools)} layers at "
        f"{per_token:,} B per token, {', '.join(f'{b:,}' for b in blocks)} blocks of {block} tokens: {tokens:,} tokens"
    )
    if row.sglang_slots is not None:
        line += f" ({tokens - row.sglang_slots:+,} vs SGLang)"
    sliding = sum(1 for pool in pools for index in pool.layers if result.model.layers[index].sliding_window)
    if sliding and row.token_space == FULL_TOKENS:
        line += f"; {sliding} of those layers are sliding-window layers sized at max_seq_len"
    return attrs.evolve(
        row,
        trtllm_windows=windows,
        trtllm_layers=sum(len(pool.layers) for pool in pools),
        trtllm_bytes_per_token=per_token,
        trtllm_blocks=blocks,
        trtllm_tokens=tokens,
        why=(*row.why, line),
    )


def _exact(value: float) -> float:
    return int(value) if float(value).is_integer() else value


def _spec_name(group: KVCacheGroupSpec) -> str:
    from kvpools_core.engines.vllm.deployment import group_spec_kind

    return group_spec_kind(group)


def _why(row: LayerGroupComparison, plan: Plan, vllm: VllmPlanResult | None) -> tuple[str, ...]:
    """Where this row's numbers differ between the engines, from the two plans' own figures."""
    why: list[str] = []
    if vllm is None:
        return ("vLLM not planned (see the notes)",)
    if not row.sglang_pools:
        why.append("SGLang has no pool of this kind for this model (kvpools' SGLang plan stores none)")
        return tuple(why)
    if not row.vllm_groups:
        why.append("vLLM's specs for this model have no group of this kind")
        return tuple(why)
    per_block = vllm.plan.bytes_per_block[0]
    if row.unit == STATE_SLOT:
        why.append(
            f"SGLang: its own pool of {row.sglang_slots:,} state slots of {row.sglang_bytes_per_unit:,} B "
            f"({plan.sizing.state_slots_per_request or 1} per running request at most)"
        )
        why.append(
            f"vLLM: each request holds {len(row.vllm_groups)} block(s) of the shared pool for it, "
            f"{per_block:,} B each (pages padded to the largest)"
        )
        return tuple(why)
    stored, charged = row.vllm_bytes_per_token, row.vllm_charged_bytes_per_token
    if stored is None:
        why.append(
            f"vLLM's groups of this kind use different block sizes (pages {row.vllm_page_size_bytes}), so they have no "
            "single bytes per token"
        )
    elif stored == row.sglang_bytes_per_unit:
        why.append(f"same bytes per token: {row.sglang_bytes_per_unit:,} B")
    else:
        why.append(f"bytes per token: SGLang {row.sglang_bytes_per_unit:,} B, vLLM {stored:,} B")
    if charged is not None and stored is not None and charged > stored:
        why.append(
            f"vLLM's hybrid allocator pads: every block spans the widest group ({per_block:,} B), so a token of "
            f"this kind takes {charged:,} B of the pool (+{_exact(charged - stored):,} B)"
        )
    window = plan.sizing.window(row.token_space) if row.token_space is not None else None
    if window is not None:
        full_pool = any(
            pool.sglang_charged and pool.unit == TOKEN and pool.token_space == FULL_TOKENS for pool in plan.pools
        )
        sized = window_pool_sizing(plan, window.token_space) if full_pool else None
        share = (
            f" (--swa-full-tokens-ratio {plan.serving.swa_full_tokens_ratio:g} of the full pool's)"
            if full_pool and sized is None
            else ""
        )
        why.append(
            f"SGLang: a pool of its own, {row.sglang_slots:,} tokens{share}; a request past the window holds at most "
            f"{window.per_request} of them"
        )
        if sized is not None:
            why.append(f"SGLang's {window.token_space} pool: {sized}")
        block = row.vllm_block_size if row.vllm_block_size is not None else "the group's block size"
        why.append(
            "vLLM: the window's blocks come from the one shared pool: cdiv(min(window - 1 + "
            f"{vllm.limits.max_in_flight_tokens} in-flight tokens, L), {block}) + 1 per request"
        )
        return tuple(why)
    others = [space for space in plan.sizing.token_counts if space != row.token_space]
    if others:
        fraction = (row.sglang_bytes or 0) / max(1, plan.sizing.sglang_estimate_bytes or plan.budget.budget_bytes)
        why.append(
            f"SGLang gives this pool {fraction:.1%} of its KV bytes (the rest to {', '.join(others)}); vLLM's groups "
            "draw on one shared block pool"
        )
    if row.vllm_tokens is not None and row.sglang_slots is not None:
        why.append(
            f"tokens: SGLang {row.sglang_slots:,}, vLLM {row.vllm_tokens:,} "
            f"(its {vllm.plan.num_gpu_blocks - 1:,} usable blocks x {row.vllm_block_size}"
            f"{f' / {len(row.vllm_groups)} groups' if len(row.vllm_groups) > 1 else ''}): "
            f"{row.vllm_tokens - row.sglang_slots:+,}"
        )
    return tuple(why)


# ---------------------------------------------------------------------------
# concurrency and notes
# ---------------------------------------------------------------------------


def _context(plan: Plan, vllm: VllmPlanResult | None, length: int) -> ContextComparison:
    from kvpools_core.engines.vllm.deployment import concurrency_at

    sglang = concurrency(plan, length)
    answer = ContextComparison(
        context_len=length, sglang_requests=sglang.concurrent_requests, sglang_binding=sglang.binding
    )
    if vllm is None:
        return answer
    value = concurrency_at(vllm, length)
    if value is None:
        return attrs.evolve(answer, vllm_binding="max_model_len")
    blocks = sum(group.blocks_per_request(vllm.limits.with_max_model_len(length)) for group in vllm.plan.groups)
    by_blocks = (vllm.plan.num_gpu_blocks - 1) // blocks
    requests = min(by_blocks, vllm.max_num_seqs)
    return attrs.evolve(
        answer,
        vllm_max_concurrency=value,
        vllm_blocks_per_request=blocks,
        vllm_requests=requests,
        vllm_binding="blocks" if by_blocks <= vllm.max_num_seqs else "max_num_seqs",
    )


def _notes(plan: Plan, vllm: VllmPlanResult | None, refusal: str | None, explicit: bool) -> tuple[str, ...]:
    notes: list[str] = []
    budget = plan.budget
    if explicit:
        notes.append(
            f"budget: the same {budget.budget_bytes:,} B ({format_bytes(budget.budget_bytes)}) of KV cache for "
            "both: SGLang's explicit budget, vLLM's --kv-cache-memory-bytes"
        )
    else:
        weights = format_bytes(budget.weights_bytes or 0)
        notes.append(
            f"SGLang's budget {budget.budget_bytes:,} B ({format_bytes(budget.budget_bytes)}): total "
            f"{format_bytes(budget.gpu_total_bytes or 0)} - runtime {format_bytes(budget.runtime_bytes or 0)} - "
            f"weights {weights} - slack {format_bytes(budget.slack_bytes or 0)} (--mem-fraction-static "
            f"{budget.mem_fraction_static:g}, a fraction of the memory free before the weights)"
        )
        if vllm is not None:
            stage = vllm.budgets[0]
            notes.append(
                f"vLLM's budget {stage.available_kv_cache_memory:,} B "
                f"({format_bytes(stage.available_kv_cache_memory)}): ceil(total x --gpu-memory-utilization "
                f"{vllm.gpu_memory_utilization:g}) {format_bytes(stage.requested_memory or 0)} - weights "
                f"{format_bytes(vllm.weights_memory[0])} (a fraction of the TOTAL memory; activations, non-torch "
                "memory and CUDA graphs not profiled here: an upper bound)"
            )
            diff = stage.available_kv_cache_memory - budget.budget_bytes
            notes.append(f"budget difference: vLLM {diff:+,} B ({'+' if diff >= 0 else '-'}{format_bytes(abs(diff))})")
    cell = plan.cell.sglang_bytes_per_token
    unused = budget.budget_bytes - plan.sizing.sglang_estimate_bytes
    notes.append(  # 002_50706b73e02ffb67.txt L284-285; with a window pool L403; with fixed state L485
        f"SGLang: its configurator divides the budget (less any fixed state) by the cell size {cell:,.10g} B, "
        f"int(), aligned down to --page-size {plan.serving.page_size}: max_total_num_tokens "
        f"{plan.max_total_num_tokens:,}; its estimate leaves {unused:,} B of the budget unspent"
    )
    if vllm is None:
        notes.append(refusal or "vLLM not planned")
        return tuple(notes)
    per_block = vllm.plan.bytes_per_block[0]
    available = vllm.plan.available_kv_cache_memory[0]
    blocks = vllm.plan.num_gpu_blocks
    notes.append(
        f"vLLM: num_gpu_blocks = {available:,} B // {per_block:,} B per block = {blocks:,} ({available % per_block:,} "
        f"B unspent); block 0 is the null block ({per_block:,} B), so {blocks - 1:,} are usable"
    )
    if len(vllm.plan.groups) > 1:
        notes.append(
            f"vLLM: {len(vllm.plan.groups)} KV-cache groups share one block pool (hybrid allocator); a block is "
            f"{per_block:,} B whichever group holds it"
        )
    notes.append(
        "concurrency: vLLM's max_concurrency is its start-up log's, num_gpu_blocks / blocks per request (the null "
        f"block counted, a fraction); 'requests' is whole requests of the usable blocks, capped by --max-num-seqs "
        f"{vllm.max_num_seqs}. SGLang's is whole requests of each pool (pages rounded up), capped by "
        f"max_running_requests {plan.max_running_requests:,}"
    )
    if vllm.max_model_len != plan.model.context_len:
        notes.append(f"vLLM's max_model_len {vllm.max_model_len:,}; SGLang's context length {plan.model.context_len:,}")
    return tuple(notes)


def _exact_note(plan: Plan, exact: Plan | None) -> str:
    """Why ``kvpools plan`` (``--accounting exact``) gives other tokens than this comparison's SGLang side."""
    head = (
        f"SGLang's side is SGLang's own estimate (`kvpools plan --accounting sglang`: {plan.max_total_num_tokens:,} "
        "tokens); `kvpools plan` defaults to --accounting exact"
    )
    if exact is None:
        return f"{head}, which does not plan this model in this budget"
    left_out = [pool for pool in exact.pools if not pool.sglang_charged and pool.bytes]
    fewer = plan.max_total_num_tokens - exact.max_total_num_tokens
    pools = ", ".join(f"{pool.name} {pool.bytes:,} B ({format_bytes(pool.bytes)})" for pool in left_out)
    return (
        f"{head}, which fits in the same budget the pools SGLang's estimate leaves out"
        f"{f' ({pools})' if pools else ''}: max_total_num_tokens {exact.max_total_num_tokens:,}, "
        f"{abs(fewer):,} {'fewer' if fewer >= 0 else 'more'}"
    )


__all__ = [
    "ContextComparison",
    "EngineComparison",
    "LayerGroupComparison",
    "compare_engines",
]
