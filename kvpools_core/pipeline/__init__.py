"""The planning pipeline: model → cell size → budget → pool sizing → plan.

One direction only; each step is one hook call, dispatched once per plan.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import ConfigError, EngineRefusalError, KvpoolsError, UnsupportedCombinationError
from kvpools_core.models import load_model, served_model
from kvpools_core.options import option
from kvpools_core.parts.sizing import (
    DEFAULT_MEM_FRACTION_STATIC,
    explicit_budget,
    gpu_budget,
    profile_budget,
    summarize_notes,
)
from kvpools_core.parts.unified import UnifiedRequest, unified_memory_problems
from kvpools_core.parts.unified_plan import UNIFIED_FEATURE
from kvpools_core.pipeline.engine_defaults import apply_engine_defaults
from kvpools_core.pipeline.gpus import (
    GPU,
    custom_gpu,
    default_runtime_bytes,
    find_gpu,
    sglang_chunked_prefill_size,
    sglang_decode_max_bs,
    sglang_memory_defaults,
)
from kvpools_core.pipeline.host import host_reserve_flag_check, plan_host_tier, resolve_retraction_backup
from kvpools_core.pipeline.noop import noop_sizing, sizing_serving
from kvpools_core.pipeline.platforms import (
    VENDOR_DISTRIBUTIONS as VENDOR_DISTRIBUTIONS,
)
from kvpools_core.pipeline.platforms import _check_workspaces_charged
from kvpools_core.pipeline.platforms import (
    check_platform as check_platform,
)
from kvpools_core.pipeline.platforms import (
    check_plugin_options as check_plugin_options,
)
from kvpools_core.pipeline.platforms import (
    install_command as install_command,
)
from kvpools_core.pipeline.platforms import (
    installed_platforms as installed_platforms,
)
from kvpools_core.pipeline.platforms import (
    measure_free_bytes as measure_free_bytes,
)
from kvpools_core.pipeline.platforms import (
    platform_aliases as platform_aliases,
)
from kvpools_core.pipeline.platforms import (
    resolve_platform as resolve_platform,
)
from kvpools_core.pipeline.platforms import (
    resolve_platform_traits as resolve_platform_traits,
)
from kvpools_core.pipeline.platforms import (
    resolve_workspaces as resolve_workspaces,
)
from kvpools_core.pipeline.platforms import (
    select_platform as select_platform,
)
from kvpools_core.pipeline.post_capture import (
    POST_CAPTURE_VLM_RESERVE_MB,
    mamba_slack_floor_bytes,
    post_capture_planned,
    post_capture_reserved_mb,
    pre_capture_activation_reserve_mb,
)
from kvpools_core.registry import Registry, get_registry
from kvpools_core.units import parse_bytes
from kvpools_core.values import (
    FULL_TOKENS,
    SGLANG_ACCOUNTING_MODES,
    TOKEN,
    Budget,
    CellSize,
    DraftModel,
    ModelSpec,
    Plan,
    PlatformTraits,
    PoolSizing,
    Serving,
    is_unset,
)
from kvpools_core.values.serving import resolve_adaptive_speculation


def plan(
    model: str | ModelSpec,
    serving: Serving | None = None,
    *,
    memory: int | str | None = None,
    device: str | None = None,
    free_memory: int | str | None = None,
    weights_memory: int | str | None = None,
    reserved_memory: int | str | None = None,
    draft_model: str | ModelSpec | None = None,
    gpu: str | GPU | None = None,
    gpu_memory: int | str | None = None,
    runtime_memory: int | str | None = None,
    registry: Registry | None = None,
    budget: Budget | None = None,
    sync_stages: bool = True,
    host_memory: int | str | None = None,
    host_reserve: int | str | None = None,
) -> Plan:
    """Plan the KV-cache pools of ``model`` under ``serving`` within a budget.

    The budget is ``memory`` (bytes or ``"60GiB"``: the KV cache's own budget),
    or SGLang's profile arithmetic over ``free_memory`` (stated), the free
    memory of ``device`` (measured by the platform plugin), or a whole ``gpu``
    (a catalogue name, see :mod:`kvpools_core.pipeline.gpus`, or ``gpu_memory``: a total)
    less ``runtime_memory`` (the runtime's footprint before the weights), minus
    ``weights_memory`` (on a GPU: estimated from the model's config unless
    given), the runtime slack and ``reserved_memory``.  On a GPU an unset
    ``mem_fraction_static`` is SGLang's default for that GPU and the GPU's
    platform is planned for.  Sizes are bytes (int or float) or strings with a unit.
    ``budget`` is a budget already resolved (:func:`resolve_budget`, or one
    agreed across ranks), given instead of all of those.

    Under pipeline parallelism every stage keeps the smallest stage's tokens,
    each stage profiled alike (on a GPU, each with its own weights).
    ``sync_stages=False`` plans the stage ``serving.pp_rank`` alone, as one
    rank does before the cross-rank MIN: :mod:`kvpools_core.planning.distributed`
    agrees on the tokens of ranks whose budgets differ.

    With ``serving.enable_hierarchical_cache`` the plan also gets its host
    tier (``Plan.host``, :func:`kvpools_core.pipeline.host.plan_host_tier`), checked
    against ``host_memory`` (the node's available host memory; measured here
    when None) minus ``host_reserve`` (SGLang's 10 GiB when None).
    """
    serving = serving or Serving()
    if not isinstance(serving, Serving):
        raise ConfigError(f"serving must be a kvpools_core.Serving, got {type(serving).__name__}.")
    chosen_gpu = _resolve_gpu(
        gpu, gpu_memory, serving, memory=memory, device=device, free_memory=free_memory, registry=registry
    )
    if chosen_gpu is not None:
        serving = _gpu_chunk(_gpu_platform(serving, chosen_gpu), chosen_gpu, registry)
    elif runtime_memory is not None:
        raise ConfigError(f"{option('runtime_memory')} applies to a GPU budget only: pass {option('gpu')} too.")
    host_reserve_flag_check(host_memory, host_reserve, serving)
    return plan_basis(model, serving, draft_model=draft_model, registry=registry).plan(
        memory=memory,
        device=device,
        free_memory=free_memory,
        weights_memory=weights_memory,
        reserved_memory=reserved_memory,
        gpu=chosen_gpu,
        runtime_memory=runtime_memory,
        budget=budget,
        sync_stages=sync_stages,
        host_memory=host_memory,
        host_reserve=host_reserve,
    )


@attrs.define
class PlanBasis:
    """Everything of a plan that does not depend on its budget: the model, the resolved serving, its cell size.

    :func:`plan` is ``plan_basis(...).plan(budget...)``; a caller planning one
    model and serving under many budgets (``kvpools sweep``) resolves the
    platform, validates and prices the cell once, then sizes per budget.
    The cell is estimated on the first :meth:`plan`, after the budget was
    resolved, so a plan reports the same first error as before.
    """

    spec: ModelSpec
    serving: Serving
    registry: Registry
    provenance: dict[str, tuple[str, ...]]
    model: str | ModelSpec
    """The model as given (a name or path lets a GPU budget estimate the weights from the complete config)."""
    draft_model: str | ModelSpec | None = None
    """The draft model as given (``--speculative-draft-model-path``), for its weights beside a profiled budget."""
    notes: tuple[str, ...] = ()
    """What the basis decided that the plan must say: the engine defaults applied to unset options."""
    _cell: tuple[CellSize, tuple[str, ...]] | None = attrs.field(default=None, init=False)

    def cell(self) -> tuple[CellSize, tuple[str, ...]]:
        """The cell size and the plugins that shaped it (``estimate_cell_size``), estimated once."""
        if self._cell is None:
            self._cell = _cell(self.spec, self.serving, self.registry)
        return self._cell

    def plan(
        self,
        *,
        memory: int | str | None = None,
        device: str | None = None,
        free_memory: int | str | None = None,
        weights_memory: int | str | None = None,
        reserved_memory: int | str | None = None,
        gpu: GPU | None = None,
        runtime_memory: int | str | None = None,
        budget: Budget | None = None,
        sync_stages: bool = True,
        host_memory: int | str | None = None,
        host_reserve: int | str | None = None,
    ) -> Plan:
        """The plan within one budget (the keywords of :func:`plan`; ``gpu`` already resolved to a catalogue
        entry, whose platform the basis was resolved for), with its host tier when the serving asks for one."""
        spec, serving, registry = self.spec, self.serving, self.registry
        provenance = dict(self.provenance)
        stage_budget: Callable[[int], Budget] | None = None
        if budget is not None:
            passed = [
                option(name)
                for name, value in (
                    ("gpu", gpu),
                    ("memory", memory),
                    ("free_memory", free_memory),
                    ("device", device),
                    ("weights_memory", weights_memory),
                    ("reserved_memory", reserved_memory),
                )
                if value is not None
            ]
            if passed:
                raise ConfigError(f"Pass a resolved budget or {', '.join(passed)}, not both.")
        elif gpu is not None:
            _check_gpu_chunk(serving, gpu, registry)
            gpu_used = gpu

            def stage_budget(rank: int) -> Budget:
                """Each pipeline stage profiles its own GPU: its own weights, the same total and fraction."""
                stage = attrs.evolve(serving, pp_rank=rank)
                return _gpu_budget(
                    self.model, spec, stage, gpu_used, weights_memory, reserved_memory, runtime_memory, registry
                )

            budget = stage_budget(serving.pp_rank)
        else:
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
        cell, cell_by = self.cell()
        sized_as = sizing_serving(serving)  # the no-op KV pool keeps SGLang's token count (pipeline.noop)
        sizing, sizing_by = _size(spec, sized_as, cell, budget, registry)
        if serving.pp_size > 1 and sync_stages:
            sizing = _sync_pipeline_stages(spec, sized_as, budget, sizing, registry, stage_budget)
        if serving.prefill_only_disable_kv_cache:
            sizing = noop_sizing(spec, serving, cell, sizing)
        provenance["estimate_cell_size"] = cell_by
        provenance["size_pools"] = sizing_by
        _check_workspaces_charged(serving, sizing, sizing_by, registry)
        sizing = _note_unreachable_context(spec, serving, sizing)
        if self.notes:
            sizing = sizing.with_notes((*self.notes, *sizing.notes))
        draft_note = _draft_weights_note(self.draft_model, serving, budget, registry)
        if draft_note:
            sizing = sizing.with_notes((*sizing.notes, draft_note))
        result = Plan(model=spec, serving=serving, budget=budget, cell=cell, sizing=sizing, provenance=provenance)
        if serving.disaggregation_mode == "decode":
            result = resolve_retraction_backup(result, registry)
        if serving.host_tier:
            host, host_by = plan_host_tier(
                result, host_memory=host_memory, host_reserve=host_reserve, registry=registry
            )
            result = attrs.evolve(result, host=host, provenance={**provenance, **host_by})
        return result


def plan_basis(
    model: str | ModelSpec,
    serving: Serving | None = None,
    *,
    draft_model: str | ModelSpec | None = None,
    registry: Registry | None = None,
) -> PlanBasis:
    """The budget-independent steps of :func:`plan`: platform, traits, model, draft, validation, workspaces."""
    registry = registry or get_registry()
    serving = serving or Serving()
    if not isinstance(serving, Serving):
        raise ConfigError(f"serving must be a kvpools_core.Serving, got {type(serving).__name__}.")
    if serving.accounting not in SGLANG_ACCOUNTING_MODES and serving.accounting not in ("vllm", "trtllm"):
        raise UnsupportedCombinationError(
            f"{option('accounting')} {serving.accounting} is not SGLang's pools: it is another engine plugin's "
            f"accounting, which `kvpools plan --accounting {serving.accounting}` plans (kvpools_core.engines."
            f"engine_for); SGLang's pipeline takes {option('accounting')} {' or '.join(SGLANG_ACCOUNTING_MODES)}."
        )
    if serving.accounting not in SGLANG_ACCOUNTING_MODES:
        engine = {"vllm": "vLLM", "trtllm": "TensorRT-LLM"}[serving.accounting]
        raise UnsupportedCombinationError(
            f"{option('accounting')} {serving.accounting} plans {engine}'s KV cache, not SGLang's pools: use "
            f"kvpools_core.engines.{serving.accounting}.plan_{serving.accounting} (kvpools plan / kvpools capacity "
            f"--accounting {serving.accounting}); this command takes {option('accounting')} "
            f"{' or '.join(SGLANG_ACCOUNTING_MODES)}."
        )
    provenance: dict[str, tuple[str, ...]] = {}
    serving = resolve_platform(serving, registry)
    check_plugin_options(serving, registry)
    serving = resolve_platform_traits(serving, registry, provenance)

    spec = served_model(_resolve_model(model, registry, provenance), serving)
    if serving.context_length is not None:
        spec = attrs.evolve(spec, context_len=serving.context_length)
    serving, default_notes = apply_engine_defaults(spec, serving, registry, provenance)
    serving = resolve_adaptive_speculation(serving)  # SGLang's _init_adaptive_speculative_params
    serving = _resolve_draft(spec, serving, draft_model, registry)
    if serving.speculative_draft is not None:
        provenance["draft_parse_model_config"] = (serving.speculative_draft.parsed_by,)
        provenance["draft_estimate_cell_size"] = serving.speculative_draft.estimated_by
    _validate(spec, serving, registry, traits_by=provenance.get("platform_traits", ("core",))[0])
    serving = resolve_workspaces(spec, serving, registry, provenance)
    return PlanBasis(
        spec=spec,
        serving=serving,
        registry=registry,
        provenance=provenance,
        model=model,
        draft_model=draft_model,
        notes=default_notes,
    )


def resolve_budget(
    serving: Serving,
    registry: Registry,
    *,
    memory: int | float | str | None = None,
    device: str | None = None,
    free_memory: int | float | str | None = None,
    weights_memory: int | float | str | None = None,
    reserved_memory: int | float | str | None = None,
    pre_model_load_memory: int | None = None,
    multimodal: bool = False,
    provenance: dict[str, tuple[str, ...]] | None = None,
) -> Budget:
    """The KV budget from an explicit size, a stated free memory, or a device measurement.

    A profiled budget of a multimodal model also reserves SGLang's VLM cache
    (``mm_runtime_reservation_gb``: ``vlm_cache_size_mb``, plus ``mm_feature_cache_mb`` under a GPU
    ``mm_feature_transport``; :attr:`Serving.mm_reserved_bytes`) beside ``reserved_memory``.
    An explicit ``memory`` is the KV cache's own budget, so weights and
    reservations given beside it would be silently ignored: that is an error.
    ``pre_model_load_memory`` (bytes) is the free memory the runtime slack is
    taken from when it differs from ``free_memory`` (SGLang reduces both over
    the ranks separately: :mod:`kvpools_core.planning.distributed`).
    """
    o = option
    given = [name for name, value in (("memory", memory), ("free_memory", free_memory)) if value is not None]
    if len(given) > 1:
        raise ConfigError(
            f"Pass either {o('memory')} (the KV budget) or {o('free_memory')} (a device's free memory), not both."
        )
    if memory is not None:
        ignored = [o(n) for n, v in (("weights_memory", weights_memory), ("reserved_memory", reserved_memory)) if v]
        if serving.post_capture_kv_sizing:
            raise ConfigError(
                f"{o('post_capture_kv_sizing')} changes how SGLang sizes a profiled budget ({o('gpu')} or "
                f"{o('gpu_memory')}); {o('memory')} is already the KV cache's own budget. Drop one of them."
            )
        if serving.mem_fraction_static is not None:
            raise ConfigError(
                f"{o('mem_fraction_static')} {serving.mem_fraction_static} only applies to a profiled budget "
                f"({o('free_memory')}, {o('gpu')} or a measured {o('device')}), whose runtime slack it sets; "
                f"{o('memory')} is already the KV cache's own budget and would ignore it. Drop one of them."
            )
        if ignored:
            verb = "apply" if len(ignored) > 1 else "applies"
            raise ConfigError(
                f"{' and '.join(ignored)} only {verb} to a profiled budget ({o('free_memory')} or a measured "
                f"{o('device')}); {o('memory')} is already the KV cache's own budget. Drop one of them."
            )
        return explicit_budget(parse_bytes(memory, o("memory")))
    if serving.post_capture_kv_sizing:
        raise ConfigError(
            f"kvpools does not model {o('post_capture_kv_sizing')} on a stated or measured free memory yet (a Mamba "
            f"model's slack floor is a function of the GPU's total): plan on {o('gpu')} or {o('gpu_memory')}."
        )
    weights = parse_bytes(weights_memory or 0, o("weights_memory"))
    reserved = parse_bytes(reserved_memory or 0, o("reserved_memory"))
    if multimodal:
        reserved += serving.mm_reserved_bytes
    if free_memory is not None:
        free = parse_bytes(free_memory, o("free_memory"))
        return profile_budget(
            free_bytes=free,
            pre_model_load_bytes=free if pre_model_load_memory is None else pre_model_load_memory,
            mem_fraction_static=_fraction(serving),
            weights_bytes=weights,
            reserved_bytes=reserved,
            device=device,
            source="stated free memory",
        )
    if device is None:
        raise ConfigError(
            f"No memory budget: pass {o('memory')} (the KV budget, e.g. '60GiB'), {o('free_memory')} "
            f"(a device's free memory) or {o('device')} (measure cpu, cuda or cuda:N)."
        )
    free, by = measure_free_bytes(device, serving, registry)
    if provenance is not None:
        provenance["available_memory"] = by
    return profile_budget(
        free_bytes=free,
        pre_model_load_bytes=free,
        mem_fraction_static=_fraction(serving),
        weights_bytes=weights,
        reserved_bytes=reserved,
        device=device,
        source=f"measured by {by[0]}",
    )


def _fraction(serving: Serving) -> float:
    """The fraction a stated or measured budget uses: the given one, else kvpools' default."""
    return serving.mem_fraction_static if serving.mem_fraction_static is not None else DEFAULT_MEM_FRACTION_STATIC


def _resolve_gpu(
    gpu: str | GPU | None,
    gpu_memory: int | str | None,
    serving: Serving,
    *,
    memory: object,
    device: object,
    free_memory: object,
    registry: Registry | None = None,
) -> GPU | None:
    """The GPU a budget is planned on (an entry of ``registry``'s catalogue or a stated total), refusing a
    second budget source."""
    o = option
    if gpu is None and gpu_memory is None:
        return None
    if gpu is not None and gpu_memory is not None:
        raise ConfigError(f"Pass either {o('gpu')} (a catalogue GPU) or {o('gpu_memory')} (its total), not both.")
    others = [
        o(name) for name, value in (("memory", memory), ("device", device), ("free_memory", free_memory)) if value
    ]
    if others:
        raise ConfigError(
            f"{o('gpu') if gpu is not None else o('gpu_memory')} plans the budget of a whole GPU; "
            f"{' and '.join(others)} state another budget. Drop one of them."
        )
    if isinstance(gpu, GPU):
        return gpu
    if gpu is not None:
        return find_gpu(gpu, registry)
    assert gpu_memory is not None
    return custom_gpu(gpu_memory, platform=serving.platform)


def _gpu_platform(serving: Serving, gpu: GPU) -> Serving:
    """``serving`` on the GPU's platform: the default platform gives way to it, another one conflicts.  The GPU's
    compute capability rides on ``platform_traits`` (kept when the platform's plugin answers its traits)."""
    known = PlatformTraits(platform=gpu.platform, compute_capability=gpu.compute_capability)
    if serving.platform == gpu.platform:
        return attrs.evolve(serving, platform_traits=known) if gpu.compute_capability is not None else serving
    if serving.platform != attrs.fields(Serving).platform.default:
        raise ConfigError(
            f"{gpu.label} runs on the {gpu.platform!r} platform, not {serving.platform!r} "
            f"({option('platform')}): drop {option('platform')} or choose another {option('gpu')}."
        )
    traits = known if gpu.compute_capability is not None else None
    return attrs.evolve(serving, platform=gpu.platform, platform_traits=traits, workspaces=())


def _gpu_chunk(serving: Serving, gpu: GPU, registry: Registry | None) -> Serving:
    """``serving`` with an unset ``chunked_prefill_size`` resolved as SGLang resolves it on ``gpu``
    (``handle_gpu_memory_settings``: :func:`~kvpools_core.pipeline.gpus.sglang_chunked_prefill_size`), as
    ``kvpools plan --gpu`` does; a given chunk (even 8192) or ``None`` (chunked prefill off) is kept."""
    if not is_unset(serving.chunked_prefill_size):
        return serving
    chunk = sglang_chunked_prefill_size(gpu.total_mib, gpu.platform, registry=registry)
    return attrs.evolve(serving, chunked_prefill_size=chunk)


def _check_gpu_chunk(serving: Serving, gpu: GPU, registry: Registry) -> None:
    """A basis resolved without the GPU keeps the unset chunk's 8192; on a GPU whose SGLang default differs that
    would plan another server than SGLang starts (the default fraction reserves activations for the chunk)."""
    if not is_unset(serving.chunked_prefill_size):
        return
    chunk = sglang_chunked_prefill_size(gpu.total_mib, gpu.platform, registry=registry)
    if chunk != serving.chunked_prefill_size:
        raise ConfigError(
            f"SGLang's default {option('chunked_prefill_size')} on {gpu.label} is {chunk}, but this plan basis was "
            f"resolved without the GPU (its unset chunk reads {serving.chunked_prefill_size}): plan with "
            f"kvpools_core.plan(..., gpu=...), which resolves it, or give {option('chunked_prefill_size')}."
        )


def _gpu_budget(
    model: str | ModelSpec,
    spec: ModelSpec,
    serving: Serving,
    gpu: GPU,
    weights_memory: int | float | str | None,
    reserved_memory: int | float | str | None,
    runtime_memory: int | float | str | None,
    registry: Registry | None = None,
) -> Budget:
    """The KV budget of one rank on ``gpu``: total - runtime - weights - slack - reserved (see ``gpu_budget``)."""
    o = option
    if weights_memory is not None:
        weights = parse_bytes(weights_memory, o("weights_memory"))
        weights_from = f"weights: given ({o('weights_memory')})"
    else:
        weights, weights_from = _estimated_weights(model, spec, serving, registry)
    reserved = parse_bytes(reserved_memory or 0, o("reserved_memory"))
    if spec.is_multimodal:
        reserved += serving.mm_reserved_bytes
    runtime = (
        parse_bytes(runtime_memory, o("runtime_memory"))
        if runtime_memory is not None
        else default_runtime_bytes(serving)
    )
    post = post_capture_planned(spec, serving, registry=registry) if serving.post_capture_kv_sizing else None
    if serving.mem_fraction_static is not None:
        fraction, why = serving.mem_fraction_static, "given"
    elif post is not None and post.planned:
        fraction, why = _post_capture_fraction(gpu.total_mib, spec, serving)
    else:
        defaults = sglang_memory_defaults(gpu.total_mib, spec, serving, registry=registry)  # traits: for the GPU
        fraction = defaults.mem_fraction_static
        why = (
            f"SGLang 0.5.23's default for {gpu.total_mib:g} MiB = round((G - reserved) / G, 3), "
            f"reserved {defaults.reserved_mb:g} MiB = {' + '.join(defaults.terms)}"
        )
    fraction, why = _attention_fraction_scale(fraction, why, spec, serving)
    post_steps: tuple[str, ...] = ()
    slack_steps: tuple[str, ...] = ()
    if post is not None and not post.planned:
        post_steps = (f"post-capture KV sizing asked but not planned by SGLang: {post.why_not}; sized as without it",)
    elif post is not None and post.planned and post.mambaish:
        max_bs = sglang_decode_max_bs(
            gpu.total_mib, serving.tp_size, serving.platform_traits or serving.platform, registry=registry
        )
        if serving.max_running_requests is not None:
            max_bs = min(max_bs, serving.max_running_requests)
        extra, line = mamba_slack_floor_bytes(
            pre_model_load_bytes=gpu.total_bytes - runtime,
            mem_fraction_static=fraction,
            reserve_mb=pre_capture_activation_reserve_mb(gpu.total_mib, serving, max_bs),
        )
        reserved += extra
        slack_steps = (line,)
    if post is not None and post.planned:
        post_steps += (
            "post-capture KV sizing: the pre-capture pool planned here is an upper bound; SGLang re-sizes it after "
            "the graph capture from the memory then free (compute_post_capture_kv_resize), capped at this size",
        )
    budget = gpu_budget(
        gpu=gpu.name,
        gpu_total_bytes=gpu.total_bytes,
        runtime_bytes=runtime,
        mem_fraction_static=fraction,
        mem_fraction_source=why,
        weights_bytes=weights,
        reserved_bytes=reserved,
    )
    steps = (*budget.steps[:-1], *slack_steps, budget.steps[-1], *post_steps, weights_from)
    return attrs.evolve(budget, steps=steps)


def _attention_fraction_scale(fraction: float, why: str, spec: ModelSpec, serving: Serving) -> tuple[float, str]:
    """``fraction`` times the platform's attention-backend factor where the served context exceeds its threshold.

    SGLang 0.5.23's ``_handle_attention_backend_compatibility`` (``srt/arg_groups/attention_hook.py`` lines
    243-269) multiplies ``mem_fraction_static``, the default or the given one, by 0.85 when the attention backend is
    AITER (ROCm's default, ``model_override_base.py`` lines 323-345) and ``context_len > 8192``, leaving the AITER
    workspace it allocates after the KV pool room in the slack; the platform's traits carry the factor
    (:attr:`PlatformTraits.mem_fraction_scale`), its plugin decides when it applies.
    """
    traits = serving.platform_traits
    if traits is None or traits.mem_fraction_scale == 1.0 or spec.context_len <= traits.mem_fraction_scale_above:
        return fraction, why
    scaled = fraction * traits.mem_fraction_scale
    why = (
        f"{fraction:g} ({why}) x {traits.mem_fraction_scale:g}, the {traits.platform} attention backend's factor "
        f"for context_len {spec.context_len} > {traits.mem_fraction_scale_above} = {scaled:g}"
    )
    return scaled, why


def _post_capture_fraction(gpu_mib: float, spec: ModelSpec, serving: Serving) -> tuple[float, str]:
    """The default fraction when SGLang plans post-capture KV sizing (``memory_hook.py`` L291-295, L423-430)."""
    reserved = post_capture_reserved_mb(serving.tp_size, serving.pp_size)
    fraction = round((gpu_mib - reserved) / gpu_mib, 3)
    why = (
        f"SGLang 0.5.23's default for {gpu_mib:g} MiB under post-capture KV sizing = round((G - reserved) / G, 3), "
        f"reserved {reserved:g} MiB = 1536 MiB + tp {serving.tp_size} x pp {serving.pp_size} / 8 x 1024 (no graph, "
        f"activation or 10 GiB floor term)"
    )
    if spec.is_multimodal and serving.disaggregation_mode != "decode":
        fraction -= POST_CAPTURE_VLM_RESERVE_MB / gpu_mib
        why += f", less a multimodal model's 8192 MiB / G = {fraction:g}"
    return fraction, why


def _draft_weights_note(
    draft_model: str | ModelSpec | None, serving: Serving, budget: Budget, registry: Registry | None = None
) -> str | None:
    """Where a draft model's weights go under a profiled budget: SGLang starts the draft worker after the
    target's pools are sized (the draft reuses the target's ``memory_pool_config``, ref-000 lines 361-366), so
    its weights come out of the slack ``mem_fraction_static`` left, not out of the KV budget; the note says how
    much of that slack they take (SGLang's ``handle_gpu_memory_settings`` reserves nothing for them)."""
    if serving.speculative_draft is None or budget.slack_bytes is None:
        return None
    name = serving.speculative_draft.model.name
    slack = budget.slack_bytes
    where = f"the draft model {name}'s weights load after the KV budget was sized, out of the {slack:,} B slack"
    if not isinstance(draft_model, str):
        return f"{where} (not estimated: the draft was given as a ModelSpec, which carries no weight shapes)."
    from kvpools_core.pipeline.weights import estimate_weights

    try:
        weights = estimate_weights(draft_model, draft_worker_serving(serving), registry=registry).bytes_per_rank
    except KvpoolsError as error:
        return f"{where}; kvpools cannot estimate them ({error})"
    share = weights / slack * 100 if slack else float("inf")
    note = (
        f"the draft model {name}'s weights (~{weights:,} B a rank) load after the KV budget was sized, out of the "
        f"{slack:,} B slack (1 - mem_fraction_static) that also holds activations and CUDA graphs: {share:.0f}% of it."
    )
    if weights >= slack:
        note += f" They do not fit: lower {option('mem_fraction_static')} so the slack holds them."
    return note


def _estimated_weights(
    model: str | ModelSpec, spec: ModelSpec, serving: Serving, registry: Registry | None = None
) -> tuple[int, str]:
    """One rank's weights from the model's config, or exact from a local checkpoint's safetensors headers
    (``estimate_weights``), and a budget step saying which; or an error asking for them."""
    o = option
    if isinstance(model, ModelSpec):
        raise ConfigError(
            f"A GPU budget needs the weights' size: {spec.name} was given as a ModelSpec, which carries no "
            f"weight shapes. Pass {o('weights_memory')} (one rank's weights)."
        )
    from kvpools_core.pipeline.weights import estimate_weights

    try:
        estimate = estimate_weights(model, serving, registry=registry)
    except EngineRefusalError:
        raise  # the engine would not start: --weights-memory is no way around it
    except KvpoolsError as error:
        raise ConfigError(
            f"A GPU budget needs the weights' size and kvpools cannot estimate them for {spec.name}: {error} "
            f"Pass {o('weights_memory')} (one rank's weights), or a full config.json."
        ) from error
    if estimate.method == "safetensors":
        how = "exact, from the checkpoint's safetensors headers (sharded as the estimate shards each tensor)"
    else:
        how = "estimated from config.json (no safetensors checkpoint beside it)"
    return estimate.bytes_per_rank, f"weights: {how}, {estimate.served_dtype} where unquantised"


def _note_unreachable_context(spec: ModelSpec, serving: Serving, sizing: PoolSizing) -> PoolSizing:
    """Say so when the pool cannot hold one request at full context (SGLang starts anyway, silently)."""
    context_len = serving.context_length or spec.context_len
    tokens = sizing.max_total_num_tokens
    if tokens >= context_len:
        return sizing
    note = (
        f"the KV pool holds {tokens:,} tokens, fewer than one request at the context length {context_len:,}: "
        f"no request can reach its full context. Raise the budget or lower {option('context_length')}."
    )
    return sizing.with_notes(summarize_notes(sizing.notes, [note]))


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
    """Fill the draft's layer count (the draft model's, else a NEXTN model's own MTP layers) and, with a draft
    model of its own, :attr:`Serving.speculative_draft` (:func:`resolve_draft_model`)."""
    if draft_model is not None:
        if not serving.speculative:
            raise ConfigError(f"{option('draft_model')} needs {option('speculative_algorithm')}.")
        draft = resolve_draft_model(draft_model, serving, registry)
        return attrs.evolve(serving, speculative_draft_num_layers=draft.model.num_layers, speculative_draft=draft)
    if (
        (
            serving.speculative_algorithm == "NEXTN"
            or (serving.enable_multi_layer_eagle and serving.speculative_algorithm in ("EAGLE", "EAGLE3"))
        )
        and serving.speculative_draft_num_layers is None
        and spec.num_nextn_predict_layers
    ):  # the multi-layer EAGLE worker drafts with the model's own MTP depths (eagle_draft_num_layers)
        return attrs.evolve(serving, speculative_draft_num_layers=spec.num_nextn_predict_layers)
    return serving


DRAFT_MODEL_PROBE_BUDGET = 1 << 40
"""The explicit budget the draft's own ``size_pools`` is asked under, only to learn its token spaces (1 TiB)."""


def draft_worker_serving(serving: Serving) -> Serving:
    """The serving SGLang's draft worker sizes its own pools under: the target's, without speculation of its own.

    The draft worker's ``KVCacheConfigurator`` (``is_draft_worker``) takes the
    target's ``MemoryPoolConfig`` (``000_fbd4f47288598fb9.txt`` lines 361-366:
    the same ``max_total_num_tokens`` and ``max_running_requests``) and builds
    its token pool for the draft's model config with the same page size, KV
    dtype and attention TP; the target's request table and allocator are
    shared (lines 577-583, 2178), so nothing here asks for them again.  The
    draft model drafts for the target rather than speculating itself, and it
    is not pipeline-split (kvpools refuses PP with a draft model of its own).
    """
    return attrs.evolve(
        serving,
        speculative_algorithm=None,
        speculative_num_steps=None,
        speculative_eagle_topk=None,
        speculative_num_draft_tokens=None,
        speculative_draft_num_layers=None,
        speculative_draft=None,
    )


def resolve_draft_model(draft_model: str | ModelSpec, serving: Serving, registry: Registry) -> DraftModel:
    """The draft model parsed, validated and priced by its OWN architecture plugin (the registry's normal dispatch).

    Refused, with the reason, where SGLang's draft worker has no pools for it or kvpools does not model them:

    * a draft with per-request, state-slot or fixed parts (a Mamba / linear-attention hybrid): the draft worker
      shares the target's request table (``000_fbd4f47288598fb9.txt`` lines 577-583) and only an MTP head of a
      hybrid-SWA target clones a state pool of its own (lines 587-600); a separate draft model gets none;
    * a draft whose own sizing keeps a token space beside the full one (a sliding-window hybrid): its SWA pool
      reads the target allocator's full→SWA mapping (lines 2186-2220), which a target of another kind has not;
    * pipeline parallelism, and DCP, where SGLang's draft pools span the allocator's whole virtual slot space
      (``loc_space_scale``, lines 407-413, 426-432): not modelled.
    """
    o = option
    if isinstance(draft_model, ModelSpec):
        spec, parsed_by = draft_model, "given"
    else:
        spec, parsed_by = load_model(draft_model, registry)
    spec = served_model(spec, serving)
    if serving.pp_size > 1 or serving.dcp_size > 1:
        knob = o("pp_size") if serving.pp_size > 1 else o("dcp_size")
        raise UnsupportedCombinationError(
            f"{o('draft_model')} {spec.name} with {knob} > 1: kvpools does not model where SGLang places a draft "
            f"model's own pools under pipeline parallelism or decode context parallelism (DCP draft pools span "
            f"the allocator's virtual slots, loc_space_scale). Pass {o('speculative_draft_num_layers')} "
            f"{spec.num_layers} instead, which charges the draft in the target's per-layer geometry."
        )
    worker = draft_worker_serving(serving)
    if serving.context_length is not None:
        spec = attrs.evolve(spec, context_len=serving.context_length)
    try:
        _validate(spec, worker, registry, target=False)
    except UnsupportedCombinationError as error:
        raise UnsupportedCombinationError(f"The draft model {spec.name} ({o('draft_model')}): {error}") from error
    cell, estimated_by = _cell(spec, worker, registry)
    other = [part.name for part in cell.parts if part.unit != TOKEN]
    if other:
        raise UnsupportedCombinationError(
            f"The draft model {spec.name} ({o('draft_model')}, architecture {spec.architecture!r}) keeps "
            f"per-request or recurrent state ({', '.join(other)}); SGLang's draft worker shares the target's "
            f"request table and allocates no such state for a separate draft model, so SGLang cannot serve it "
            f"as one. Use a draft of attention layers only."
        )
    probe, _ = _size(spec, worker, cell, explicit_budget(DRAFT_MODEL_PROBE_BUDGET), registry)
    spaces = [space for space in probe.cost.token_spaces if space != FULL_TOKENS]
    if spaces:
        raise UnsupportedCombinationError(
            f"The draft model {spec.name} ({o('draft_model')}, architecture {spec.architecture!r}) keeps token "
            f"space(s) {', '.join(spaces)} beside the full one; SGLang's draft worker indexes them through the "
            f"target allocator's mapping, which kvpools models only for a draft the target's own plugin sizes. "
            f"Pass {o('speculative_draft_num_layers')} {spec.num_layers} instead."
        )
    return DraftModel(model=spec, cell=cell, parsed_by=parsed_by, estimated_by=estimated_by)


def _validate(
    spec: ModelSpec, serving: Serving, registry: Registry, *, traits_by: str = "core", target: bool = True
) -> None:
    """The platform's every-model rules (answered by ``traits_by``), then every plugin's ``validate`` problems.

    HiSparse is asked of the ``target`` model only: SGLang checks the served model's class, not a draft's.
    """
    traits = serving.traits
    kv = resolve_kv_dtype(serving.kv_cache_dtype, spec.dtype).name
    rules = [*traits.page_size_problems(serving.page_size), *traits.kv_dtype_problems(kv)]
    problems = [f"{message} [{traits_by}]" for message in rules]
    problems += [f"{message} [core]" for message in chunk_page_problems(serving)]
    if target:
        problems += [f"{message} [core]" for message in hisparse_problems(spec, serving, registry)]
        problems += [f"{message} [core]" for message in unified_model_problems(spec, serving, registry)]
        problems += [f"{message} [core]" for message in m3_fp8_problems(spec, serving, registry)]
        problems += [f"{message} [core]" for message in encoder_replay_model_problems(spec, serving, registry)]
    problems += [
        f"{message} [{plugin}]"
        for plugin, messages in registry.call_collect("validate", model=spec, serving=serving)
        for message in messages
    ]
    if problems:
        raise UnsupportedCombinationError(" ".join(problems))


def chunk_page_problems(serving: Serving) -> list[str]:
    """SGLang's ``check_server_args``: a prefill chunk must be whole pages.

    SGLang asserts ``chunked_prefill_size % page_size == 0`` ("chunked_prefill_size must be divisible by
    page_size") unless chunked prefill is off or the node is a disaggregated decode node; under DP attention
    on the chunk of one worker, ``chunked_prefill_size // dp_size``.  No other page size is refused on every
    platform: SGLang takes any page size its kernels do (the platform's rules say which they do not).
    """
    chunk, page = serving.chunked_prefill_size, serving.page_size
    if chunk is None or serving.disaggregation_mode == "decode":
        return []
    workers = serving.attn_dp_size
    per_worker = chunk // workers
    if per_worker % page == 0:
        return []
    o = option
    where = f" ({chunk} over {workers} DP-attention workers: {per_worker} each)" if workers > 1 else ""
    divisors = [p for p in (1, 16, 32, 64, 128, 256) if per_worker % p == 0]
    return [
        f"SGLang refuses {o('page_size')} {page} with {o('chunked_prefill_size')} {chunk}{where}: a prefill chunk "
        f"is whole pages ('chunked_prefill_size must be divisible by page_size'). Use a page size that divides "
        f"{per_worker} (such as {', '.join(map(str, divisors))}), or a {o('chunked_prefill_size')} that is a "
        f"multiple of {page * workers}."
    ]


def unified_model_problems(spec: ModelSpec, serving: Serving, registry: Registry) -> list[str]:
    """SGLang 0.5.23 builds its unified memory pool only for the model classes whose architecture plugin names
    ``"unified_memory"`` (``engine_features``); every other model gets SGLang's own refusal
    (``kv_cache_configurator.py`` ``_init_pools``).  The plugins that name it check the rest themselves
    (:func:`kvpools_core.parts.unified_plan.serving_problems`)."""
    if not serving.enable_unified_memory:
        return []
    supported = {
        architecture
        for _, answer in registry.call_collect("engine_features")
        for architecture, features in answer.items()
        if UNIFIED_FEATURE in features
    }
    if spec.architecture in supported:
        return []
    return [
        f"SGLang 0.5.23 refuses it for {spec.name}: {problem}" for problem in unified_memory_problems(UnifiedRequest())
    ]


def m3_fp8_problems(spec: ModelSpec, serving: Serving, registry: Registry) -> list[str]:
    """``m3_fp8_attn_gemm`` on a model whose architecture plugin does not name the feature ``"m3_fp8_attn_gemm"``
    (``engine_features`` hook): SGLang's fp8 attention-GEMM mode exists for MiniMax-M3's sparse models only."""
    if not serving.m3_fp8_attn_gemm:
        return []
    supported = sorted(
        architecture
        for _, answer in registry.call_collect("engine_features")
        for architecture, features in answer.items()
        if "m3_fp8_attn_gemm" in features
    )
    if spec.architecture in supported:
        return []
    where = f"architectures {', '.join(supported)}" if supported else "no installed architecture"
    return [
        f"{option('m3_fp8_attn_gemm')} is SGLang's fp8 attention-GEMM mode of the sparse models of {where}, not "
        f"of {spec.name} (architecture {spec.architecture!r}), whose pools it would not change. Drop "
        f"{option('m3_fp8_attn_gemm')}."
    ]


def encoder_replay_model_problems(spec: ModelSpec, serving: Serving, registry: Registry) -> list[str]:
    """``--enable-encoder-swa-bounded-replay`` on a model whose architecture plugin does not name the feature
    ``"encoder_swa_bounded_replay"`` (``engine_features`` hook): SGLang 0.5.23 raises "requires DeepSeek-V4.1"
    (``arg_groups/model_hook.py``, ``deepseek_v4_hook.py``) for every other model."""
    if not serving.enable_encoder_swa_bounded_replay:
        return []
    supported = {
        architecture
        for _, answer in registry.call_collect("engine_features")
        for architecture, features in answer.items()
        if "encoder_swa_bounded_replay" in features
    }
    if spec.architecture in supported:
        return []
    return [
        f"SGLang raises '--enable-encoder-swa-bounded-replay requires DeepSeek-V4.1' for {spec.name} (architecture "
        f"{spec.architecture!r}). Drop {option('enable_encoder_swa_bounded_replay')}."
    ]


def hisparse_problems(spec: ModelSpec, serving: Serving, registry: Registry) -> list[str]:
    """SGLang 0.5.23's ``validate_hisparse`` (``arg_groups/hisparse_hook.py``), which asserts two things first.

    The model class: ``--enable-hisparse`` "is only supported for" the models whose architecture plugin names the
    feature ``"hisparse"`` (``engine_features`` hook).  Then the radix cache: "Hierarchical sparse attention
    currently requires --disable-radix-cache" (an assert: SGLang does not turn the cache off itself; a PD decode
    node has it off already, ``Serving.radix_cache_disabled``).
    """
    o = option
    if not serving.enable_hisparse:
        if serving.hisparse_config is None:
            return []
        return [
            f"{o('hisparse_config')} configures HiSparse, which is off, so it would change nothing: add "
            f"{o('enable_hisparse')}, or drop {o('hisparse_config')}."
        ]
    supported = sorted(
        architecture
        for _, answer in registry.call_collect("engine_features")
        for architecture, features in answer.items()
        if "hisparse" in features
    )
    if spec.architecture not in supported:
        where = f"architectures {', '.join(supported)}" if supported else "no installed architecture"
        return [
            f"SGLang refuses {o('enable_hisparse')} for {spec.name} (architecture {spec.architecture!r}): it runs "
            f"HiSparse only on the sparse-attention models of {where} (their plugins say so; validate_hisparse in "
            f"SGLang 0.5.23's arg_groups/hisparse_hook.py asserts the model class). Drop {o('enable_hisparse')}."
        ]
    if not serving.radix_cache_disabled:
        return [
            f"SGLang refuses {o('enable_hisparse')} with the radix cache on ('Hierarchical sparse attention "
            f"currently requires --disable-radix-cache', validate_hisparse in SGLang 0.5.23's "
            f"arg_groups/hisparse_hook.py). Add {o('disable_radix_cache')}, or drop {o('enable_hisparse')}."
        ]
    return []


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
    spec: ModelSpec,
    serving: Serving,
    budget: Budget,
    own: PoolSizing,
    registry: Registry,
    stage_budget: Callable[[int], Budget] | None = None,
) -> PoolSizing:
    """Every stage keeps the smallest stage's token count (SGLang's MIN all-reduce), then re-solves.

    ``stage_budget(rank)`` is a stage's own budget where the stages' budgets differ (a GPU plan: each
    stage holds other weights); otherwise every stage has ``budget``.
    """
    stage_tokens = []
    for rank in range(serving.pp_size):
        if rank == serving.pp_rank:
            stage_tokens.append(own.max_total_num_tokens)
            continue
        stage = attrs.evolve(serving, pp_rank=rank)
        stage_cell, _ = _cell(spec, stage, registry)
        other = stage_budget(rank) if stage_budget is not None else budget
        stage_tokens.append(_size(spec, stage, stage_cell, other, registry)[0].max_total_num_tokens)
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
