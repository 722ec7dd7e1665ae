"""The planning pipeline: model → cell size → budget → pool sizing → plan.

One direction only; each step is one hook call, dispatched once per plan.
"""

from __future__ import annotations

import attrs

from kvpools_core.config import load_model
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.registry import Registry, get_registry
from kvpools_core.sizing import explicit_budget, profile_budget, summarize_notes
from kvpools_core.units import parse_bytes
from kvpools_core.values import Budget, CellSize, ModelSpec, Plan, PoolSizing, Serving


def plan(
    model: str | ModelSpec,
    serving: Serving | None = None,
    *,
    memory: int | str | None = None,
    device: str | None = None,
    free_memory: int | str | None = None,
    weights_memory: int | str = 0,
    reserved_memory: int | str = 0,
    draft_model: str | ModelSpec | None = None,
    registry: Registry | None = None,
) -> Plan:
    """Plan the KV-cache pools of ``model`` under ``serving`` within a budget.

    The budget is ``memory`` (bytes or ``"60GiB"``: the KV cache's own budget),
    or SGLang's profile arithmetic over ``free_memory`` (stated) or the free
    memory of ``device`` (measured by the platform plugin), minus
    ``weights_memory``, the runtime slack and ``reserved_memory``.
    """
    registry = registry or get_registry()
    serving = serving or Serving()
    provenance: dict[str, tuple[str, ...]] = {}

    spec = _resolve_model(model, registry, provenance)
    if serving.context_length is not None:
        spec = attrs.evolve(spec, context_len=serving.context_length)
    serving = _resolve_draft(spec, serving, draft_model, registry)
    _validate(spec, serving, registry)
    budget = resolve_budget(
        serving,
        registry,
        multimodal=spec.is_multimodal,
        memory=memory,
        device=device,
        free_memory=free_memory,
        weights_memory=weights_memory,
        reserved_memory=reserved_memory,
        provenance=provenance,
    )

    cell, cell_by = _cell(spec, serving, registry)
    sizing, sizing_by = _size(spec, serving, cell, budget, registry)
    if serving.pp_size > 1:
        sizing = _sync_pipeline_stages(spec, serving, budget, sizing, registry)
    provenance["estimate_cell_size"] = cell_by
    provenance["size_pools"] = sizing_by
    return Plan(model=spec, serving=serving, budget=budget, cell=cell, sizing=sizing, provenance=provenance)


def resolve_budget(
    serving: Serving,
    registry: Registry,
    *,
    memory: int | str | None = None,
    device: str | None = None,
    free_memory: int | str | None = None,
    weights_memory: int | str = 0,
    reserved_memory: int | str = 0,
    multimodal: bool = False,
    provenance: dict[str, tuple[str, ...]] | None = None,
) -> Budget:
    """The KV budget from an explicit size, a stated free memory, or a device measurement.

    A profiled budget of a multimodal model also reserves SGLang's VLM cache
    (``mm_runtime_reservation_gb``: ``vlm_cache_size_mb``) beside ``reserved_memory``.
    """
    given = [name for name, value in (("--memory", memory), ("--free-memory", free_memory)) if value is not None]
    if len(given) > 1:
        raise ConfigError("Pass either --memory (the KV budget) or --free-memory (a device's free memory), not both.")
    if memory is not None:
        return explicit_budget(parse_bytes(memory, "--memory"))
    weights = parse_bytes(weights_memory, "--weights-memory")
    reserved = parse_bytes(reserved_memory, "--reserved-memory")
    if multimodal:
        reserved += serving.vlm_cache_size_mb << 20
    if free_memory is not None:
        free = parse_bytes(free_memory, "--free-memory")
        return profile_budget(
            free_bytes=free,
            pre_model_load_bytes=free,
            mem_fraction_static=serving.mem_fraction_static,
            weights_bytes=weights,
            reserved_bytes=reserved,
            device=device,
            source="stated free memory",
        )
    if device is None:
        raise ConfigError(
            "No memory budget: pass --memory SIZE (e.g. 60GiB), --free-memory SIZE or --device cpu|cuda[:N]."
        )
    reading, by = registry.call_first(
        "available_memory",
        f"no platform plugin measures memory of device {device!r}.",
        device=device,
        serving=serving,
    )
    if provenance is not None:
        provenance["available_memory"] = by
    free = int(reading["free_bytes"])
    return profile_budget(
        free_bytes=free,
        pre_model_load_bytes=free,
        mem_fraction_static=serving.mem_fraction_static,
        weights_bytes=weights,
        reserved_bytes=reserved,
        device=device,
        source=f"measured by {by[0]}",
    )


def _resolve_model(model: str | ModelSpec, registry: Registry, provenance: dict[str, tuple[str, ...]]) -> ModelSpec:
    if isinstance(model, ModelSpec):
        provenance["parse_model_config"] = ("given",)
        return model
    spec, plugin = load_model(model, registry)
    provenance["parse_model_config"] = (plugin,)
    return spec


def _resolve_draft(
    spec: ModelSpec, serving: Serving, draft_model: str | ModelSpec | None, registry: Registry
) -> Serving:
    """Fill the draft's layer count: the draft model's, else a NEXTN model's own MTP layers."""
    if draft_model is not None:
        if not serving.speculative:
            raise ConfigError("--speculative-draft-model-path needs --speculative-algorithm.")
        draft = draft_model if isinstance(draft_model, ModelSpec) else load_model(draft_model, registry)[0]
        return attrs.evolve(serving, speculative_draft_num_layers=draft.num_layers)
    if (
        serving.speculative_algorithm == "NEXTN"
        and serving.speculative_draft_num_layers is None
        and spec.num_nextn_predict_layers
    ):
        return attrs.evolve(serving, speculative_draft_num_layers=spec.num_nextn_predict_layers)
    return serving


def _validate(spec: ModelSpec, serving: Serving, registry: Registry) -> None:
    problems = [
        f"{message} [{plugin}]"
        for plugin, messages in registry.call_collect("validate", model=spec, serving=serving)
        for message in messages
    ]
    if problems:
        raise UnsupportedCombinationError(" ".join(problems))


def _cell(spec: ModelSpec, serving: Serving, registry: Registry) -> tuple[CellSize, tuple[str, ...]]:
    result: tuple[CellSize, tuple[str, ...]] = registry.call_first(
        "estimate_cell_size",
        f"no architecture computes the cell size of {spec.name} (architecture {spec.architecture!r}).",
        model=spec,
        serving=serving,
    )
    return result


def _size(
    spec: ModelSpec, serving: Serving, cell: CellSize, budget: Budget, registry: Registry
) -> tuple[PoolSizing, tuple[str, ...]]:
    result: tuple[PoolSizing, tuple[str, ...]] = registry.call_first(
        "size_pools",
        f"no plugin sizes the pools of {spec.name}.",
        model=spec,
        serving=serving,
        cell=cell,
        budget=budget,
    )
    return result


def _sync_pipeline_stages(
    spec: ModelSpec, serving: Serving, budget: Budget, own: PoolSizing, registry: Registry
) -> PoolSizing:
    """Every stage keeps the smallest stage's token count (SGLang's MIN all-reduce), then re-solves."""
    stage_tokens = []
    for rank in range(serving.pp_size):
        if rank == serving.pp_rank:
            stage_tokens.append(own.max_total_num_tokens)
            continue
        stage = attrs.evolve(serving, pp_rank=rank)
        stage_cell, _ = _cell(spec, stage, registry)
        stage_tokens.append(_size(spec, stage, stage_cell, budget, registry)[0].max_total_num_tokens)
    synced = min(stage_tokens)
    if synced >= own.max_total_num_tokens:
        return own
    capped = attrs.evolve(serving, max_total_tokens=synced)
    cell, _ = _cell(spec, capped, registry)
    resized, _ = _size(spec, capped, cell, budget, registry)
    note = (
        f"pipeline stages hold {stage_tokens} tokens; every stage keeps the smallest, {synced} "
        f"(this stage, rank {serving.pp_rank}, could hold {own.max_total_num_tokens})."
    )
    extra = [n for n in resized.notes if not n.startswith("max_total_tokens=")]
    return attrs.evolve(resized, notes=summarize_notes(own.notes, [note], extra))
