"""Hook specifications: the whole contract between the core and its plugins.

Dispatch order (written once, in ``docs/dispatch.md``, and tested): within a
hook, pluggy calls ``tryfirst`` implementations first (platform plugins), then
plain ones (architecture plugins, later-registered first), then ``trylast``
ones (the core defaults).  Architecture plugins return ``None`` for models they
do not recognise.  Cross-cutting concerns (speculative-decoding draft scaling)
are new-style wrappers (``wrapper=True``) owned by the plugin of that concern.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import pluggy

if TYPE_CHECKING:
    from kvpools_core.parts.weights import WeightsConfig, WeightsEstimate
    from kvpools_core.pools.layout import BufferLayout
    from kvpools_core.values import (
        GPU,
        Budget,
        CellSize,
        EngineDefault,
        HostPool,
        ModelSpec,
        PackedInto,
        Plan,
        PlatformTraits,
        PoolSizing,
        Serving,
        Workspace,
    )

PROJECT = "kvpools"

_spec = pluggy.HookspecMarker(PROJECT)

hookimpl = pluggy.HookimplMarker(PROJECT)
"""Decorator marking a plugin function as a kvpools hook implementation (``from kvpools_core import hookimpl``).

Defined beside the specifications, so the core's own implementations (``defaults``) and the
registry both depend on this module and not on each other."""

F = TypeVar("F", bound=Callable[..., Any])


def for_architecture(*architectures: str) -> Callable[[F], F]:
    """Let a hook implementation answer only for models of its own architecture(s); ``None`` for any other.

    Architecture plugins answer for the models they parsed (``ModelSpec.architecture``)
    and decline the rest; this says it once instead of an ``if`` in every hook::

        @hookimpl
        @for_architecture("mha")
        def estimate_cell_size(model, serving): ...

    The implementation must take ``model`` (a ``ModelSpec``) or ``plan`` (a
    ``Plan``); pluggy still sees its own argument names (the wrapper keeps
    them, via ``functools.wraps``), so it may take only the arguments it uses.
    """
    if not architectures or not all(isinstance(name, str) and name for name in architectures):
        raise TypeError(f"for_architecture needs one or more architecture names, got {architectures!r}.")
    owned = frozenset(architectures)

    def decorate(func: F) -> F:
        names = list(inspect.signature(func).parameters)
        architecture_of: Callable[[Any], str]
        if "model" in names:
            key, architecture_of = "model", _model_architecture
        elif "plan" in names:
            key, architecture_of = "plan", _plan_architecture
        else:
            raise TypeError(
                f"@for_architecture: {func.__qualname__} takes neither 'model' nor 'plan', so it has no model to "
                f"check; decline other architectures in the function itself."
            )
        position = names.index(key)

        @functools.wraps(func)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            value = args[position] if position < len(args) else kwargs[key]
            if architecture_of(value) not in owned:
                return None
            return func(*args, **kwargs)

        return guarded  # type: ignore[return-value]

    return decorate


def _model_architecture(model: ModelSpec) -> str:
    return model.architecture


def _plan_architecture(plan: Plan) -> str:
    return plan.model.architecture


@_spec
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    """Turn a Hugging Face ``config.json`` into a :class:`ModelSpec`.

    Every implementation is called; the results are collected.  Exactly one
    plugin may claim a config: an architecture returns ``None`` for configs it
    does not recognise, and two claims are reported as a conflict naming both.

    :param config: the parsed ``config.json``, read-only to its nested dicts and lists (a write is a ``TypeError``).
    :param source: where it came from (a path or ``preset:NAME``), for errors.
    :returns: the model's per-layer description, or ``None`` to decline.
    """


@_spec
def presets() -> Mapping[str, str] | None:
    """Name the bundled model configs a plugin ships.

    Every implementation is called; the results are collected.  Two plugins
    offering the same preset name is a conflict naming both.  A registry asks
    once and keeps the answer (the set of presets is fixed for its life), and
    parses each preset file once per version of the file (its modification
    time and size): ``parse_model_config`` must answer the same spec for the
    same config, which a pure parser does.

    :returns: preset name → path of a ``config.json`` file.
    """


@_spec
def platforms() -> Mapping[str, str] | None:
    """Name the platforms a plugin provides, so a platform nobody provides is an error.

    Every implementation is called; the results are collected.  Two plugins
    providing the same platform name is a conflict naming both.  A platform
    plugin answers ``available_memory`` and the build hooks for its devices.

    :returns: platform name (``cpu``, ``cuda``, ``npu``, ...) → one-line description.
    """


@_spec
def platform_aliases() -> Mapping[str, str] | None:
    """Name other spellings of the platforms a plugin provides (a device type, SGLang's name).

    Every implementation is called; the results are collected.  Each alias
    maps to a platform name the same plugin provides (``platforms``); the core
    resolves ``--platform ALIAS`` and a device type equal to an alias to that
    platform, so ``Serving.platform`` always holds the canonical name.  An alias
    offered by two plugins, one equal to a platform name, or one naming a
    platform its plugin does not provide is an error naming the plugin.

    :returns: alias (``npu``, ``hip``, ...) → platform name (``ascend``, ``rocm``, ...).
    """


@_spec
def detect_platform(device: str | None) -> str | None:
    """Claim the platform of a device, or of this host, when no platform was requested.

    Every implementation is called; the results are collected.  A platform
    plugin returns the name of a platform it provides when it owns ``device``
    (for example a device type only it names, or ``cuda`` devices on a HIP
    build of torch), or, with ``device`` ``None`` (no device, or ``meta``),
    when its vendor runtime is importable here; otherwise ``None``.  Asked only
    when no platform was requested (``--platform``).  One claim selects the
    platform; two different claims are an error naming both; none leaves the
    type of ``device`` (or the default platform).

    :param device: the device string given by the user, or ``None``.
    :returns: the name of a platform the plugin provides, or ``None``.
    """


@_spec(firstresult=True)
def platform_traits(serving: Serving) -> PlatformTraits | None:
    """Say what the serving platform's kernels decide about the KV cache: page sizes, KV dtypes, MLA rows, slot dtype.

    Stops at the first non-None result; return None to decline.  The plugin
    that provides ``serving.platform`` answers (``tryfirst``) for it only; the
    core's default (``trylast``) answers neutral traits.  The pipeline stores
    the answer in ``Serving.platform_traits`` before anything else is asked,
    so architectures read the platform's facts (``serving.traits``) instead of
    its name, and the core checks its rules for every model (page sizes, KV dtypes)
    and applies the engine rules they state (SGLang's Marlin conversions and the
    quantisation methods it refuses there, read by the weights estimate).

    :param serving: the serving options (``platform`` is the canonical name).
    :returns: a :class:`kvpools_core.values.PlatformTraits` whose ``platform`` is ``serving.platform``.
    """


@_spec
def accelerators() -> Sequence[GPU] | None:
    """Contribute accelerator models to the GPU catalogue (``--gpu NAME``, :mod:`kvpools_core.pipeline.gpus`).

    Every implementation is called; the results are collected.  A platform
    plugin lists the devices of its platforms, each a :class:`kvpools_core.values.GPU`
    with its total memory as SGLang reads it on that platform and the source of
    the figure; any plugin may add devices of a platform an installed plugin
    provides.  A name or alias (compared without case, spaces, ``-`` or ``_``)
    offered twice, or a device of a platform nobody provides, is an error
    naming the plugin.  The platform's :class:`~kvpools_core.values.PlatformTraits`
    (``memory_tiers``, ``breakable_prefill_graphs``) say how SGLang's memory
    defaults treat its devices.

    :returns: the plugin's accelerators, or ``None``/``[]``.
    """


@_spec
def workspaces(model: ModelSpec, serving: Serving) -> list[Workspace] | None:
    """Declare device memory the platform's kernels keep beside the KV cache, per request and once.

    Every implementation is called; the results are collected.  A platform
    plugin answers for its own platform, an attention backend's plugin for its
    backend.  Every sizing plugin charges them through
    :func:`kvpools_core.parts.sizing.request_pools`, which the pipeline checks, and
    ``build`` allocates them, so an exact plan leaves room for them.  Names
    must be unique.

    :param model: the parsed model.
    :param serving: the serving options (``serving.traits`` resolved).
    :returns: a list of :class:`kvpools_core.values.Workspace`, or ``None``/``[]``.
    """


@_spec
def plugin_options() -> Mapping[str, str] | None:
    """Declare the ``--plugin-option KEY=VALUE`` keys a plugin reads from ``Serving.plugin_options``.

    Every implementation is called; the results are collected.  A key that no
    plugin declares is an error (a typo must not be silently ignored); two
    plugins declaring the same key is a conflict naming both.

    :returns: key → one-line help.
    """


@_spec
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    """Reject unsupported combinations before anything is sized or allocated.

    Every implementation is called; the results are collected.  Each plugin
    returns the problems it owns (one message each, naming the option and the
    supported alternatives), or ``None``/``[]`` when it has none.

    :param model: the parsed model.
    :param serving: the serving options.
    :returns: error messages.
    """


@_spec
def engine_features() -> Mapping[str, Sequence[str]] | None:
    """Say which optional engine features SGLang runs for the architectures a plugin parses.

    Every implementation is called; the results are collected.  An
    architecture plugin names its own architectures (``ModelSpec.architecture``)
    and, for each, the features the engine accepts for their models, so the core
    refuses a feature for every other model without naming any architecture:
    ``"hisparse"`` (``--enable-hisparse``; SGLang 0.5.23's ``validate_hisparse``,
    ``arg_groups/hisparse_hook.py``, asserts the model class) and ``"unified_memory"``
    (``--enable-unified-memory``; SGLang's ``_init_pools`` builds the unified pool for
    hybrid Mamba and hybrid SWA models only) and ``"encoder_swa_bounded_replay"``
    (``--enable-encoder-swa-bounded-replay``: "requires DeepSeek-V4.1").

    :returns: architecture → the engine features it supports.
    """


@_spec
def engine_defaults(model: ModelSpec, serving: Serving) -> Sequence[EngineDefault] | None:
    """Say what the engine sets itself for this model, on this platform, for the options the user left unset.

    Every implementation is called; the results are collected.  An
    architecture plugin answers for its own models (SGLang 0.5.23's per-model
    server-arg overrides, ``arg_groups/model_overrides/``: DeepSeek sparse
    attention pages by 64 and takes TRT-LLM backends under DCP, DeepSeek-V4
    pages by 256, MiniMax-M3 by 128 on CUDA), a platform plugin
    (``tryfirst``) for its platform's forced defaults (Ascend: page 128 for
    every model).  For each option the first answer in dispatch order wins
    (platform, then architecture); an option the user gave is never replaced.
    The pipeline applies the answers before ``validate``, notes each on the
    plan and names the plugin in its provenance.

    :param model: the parsed model.
    :param serving: the serving options (``serving.traits`` resolved; ``serving.unset_options`` says what was
        left unset).
    :returns: a list of :class:`kvpools_core.values.EngineDefault`, or ``None``/``[]``.
    """


@_spec
def engine_accountings() -> Sequence[Any] | None:
    """Name the serving engines' memory accountings a plugin provides (``--accounting``).

    Every implementation is called; the results are collected.  An engine plugin (the built-in ``sglang``,
    ``vllm`` and ``trtllm``, entry points of the ``kvpools`` group like any other plugin, or a third party's)
    returns its :class:`kvpools_core.engines.base.Engine` values; ``kvpools_core.engines.engines()`` merges them.
    Two engines of one name, or one accounting answered by two engines, is an error naming both plugins.

    :returns: a list of ``Engine`` values, or ``None``/``[]``.
    """


@_spec(firstresult=True)
def engine_layer_specs(engine: str, model: ModelSpec, serving: Serving) -> Sequence[Any] | None:
    """What one engine needs to know of each layer of this model, in that engine's own per-layer values.

    Stops at the first non-None result; return None to decline.  An engine that sizes its cache per layer
    (``trtllm``: :class:`kvpools_core.parts.trtllm.TrtllmLayer`) asks the architecture that parsed the model
    through this hook, keyed by its name, so one architecture plugin answers every engine and a third-party
    engine needs no core edit: it documents the values it expects under its ``engine`` name.  An architecture
    whose models the engine cannot serve may raise a kvpools error naming why (``kvpools does not model X for
    --accounting ENGINE yet``) instead of declining, so the refusal carries its reason.

    :param engine: the engine's name (``Engine.name``); answer only for engines whose values you know.
    :param model: the parsed model.
    :param serving: the serving options.
    :returns: one value per layer with a cache, in layer order (a non-empty list or tuple), or None.
    """


@_spec
def architecture_traits() -> Mapping[str, Sequence[str]] | None:
    """Say what SGLang decides from a model's class: Hugging Face architecture → the engine traits of its models.

    Every implementation is called; the results are collected.  A class two plugins name has the union of their
    traits.  An architecture plugin names the classes (``config.json``'s ``architectures``,
    ``ModelSpec.hf_architectures``) it parses that SGLang treats apart, so the GPU memory defaults
    (:func:`kvpools_core.pipeline.gpus.sglang_memory_defaults`) name no architecture: ``"mla_backend"`` (SGLang 0.5.23
    runs the class with ``AttentionArch.MLA``, ``srt/configs/model_config.py``: its prefill graph reserve is the
    MLA backend's) and ``"no_breakable_prefill_graph"`` (``disable_breakable_cudagraph_if_incompatible``,
    ``cuda_graph_hook.py``, turns prefill graphs off for it).  The vLLM vision-tower traits
    (``"vllm_vision_qwen3_vit"``, ``"vllm_vision_pixtral_hf"``, ``"vllm_vision_gemma3_siglip"``,
    ``"vllm_vision_llama4_vit"``, ``"vllm_vision_gemma4_hf"``) say which encoder
    profile pass vLLM runs for the class (:func:`kvpools_core.engines.vllm.runtime_memory.mm_encoder_profile`).
    ``"vllm_prefix_lm"``, ``"vllm_attention_sinks"`` and ``"vllm_cudagraph_capture_1024"`` size vLLM's CUDA-graph
    estimate for the class (:func:`kvpools_core.engines.vllm.runtime_memory.cudagraph_memory`).
    Another trait name is an error naming the plugin (:data:`kvpools_core.pipeline.gpus.ARCHITECTURE_TRAITS`).

    :returns: Hugging Face architecture → its traits.
    """


@_spec(firstresult=True)
def available_memory(device: str, serving: Serving) -> Mapping[str, int] | None:
    """Measure the memory a device offers the KV cache.

    Stops at the first non-None result; return None to decline.  The platform
    plugin that owns ``device`` (``cpu``, ``cuda:N``, ``npu:N``, ...) answers.

    :param device: the device string given by the user.
    :param serving: the serving options.
    :returns: ``{"free_bytes": ..., "total_bytes": ...}`` as measured now.
    """


@_spec(firstresult=True)
def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> WeightsEstimate | None:
    """Estimate a model's weights from its complete ``config.json``: parameters, checkpoint bytes, one rank's bytes.

    Stops at the first non-None result; return None to decline.  The architecture plugin that claims
    ``config.model_type`` answers, building its decoder's tensors from the parts library
    (:mod:`kvpools_core.parts.weights`: ``Builder`` blocks, then ``estimate``); no answer refuses the model
    naming the field.  A GPU budget (``--gpu``, ``kvpools fit``, GPU sweeps) subtracts ``bytes_per_rank``.

    :param config: the complete config (:class:`kvpools_core.parts.weights.WeightsConfig`: the text model's
        reader, the top-level reader, the source and ``model_type``), not the KV-only :class:`ModelSpec`.
    :param serving: the serving options (TP, PP rank, DP attention shard the weights).
    :param ep_size: SGLang's ``--ep-size`` (experts per rank ``E / ep``).
    :returns: a :class:`kvpools_core.parts.weights.WeightsEstimate`, or ``None`` to decline.
    """


@_spec(firstresult=True)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    """Compute what one token (and one request) of the KV cache costs on this rank.

    Stops at the first non-None result; return None to decline.  The
    architecture that parsed the model answers; wrappers of cross-cutting
    concerns (draft KV for speculative decoding) adjust the answer.  A draft
    model of its own is asked about too, as ``model`` under the draft worker's
    serving (``kvpools_core.pipeline.resolve_draft_model``): answer it as any model.

    :param model: the parsed model.
    :param serving: the serving options (parallelism decides the rank's share).
    :returns: the cell size, with SGLang's figure beside kvpools' exact one.
    """


@_spec(firstresult=True)
def vllm_kv_cache_specs(model: ModelSpec, serving: Serving, block_size: int) -> Mapping[str, Any] | None:
    """The per-layer KV-cache specs vLLM 0.33 builds for this model on one TP rank (``--accounting vllm``).

    Stops at the first non-None result; return None to decline.  The architecture that parsed the model
    answers with what its vLLM model class's attention layers return from ``get_kv_cache_spec`` (a
    ``kvpools_core.engines.vllm`` spec per layer: full, sliding window, chunked local, MLA, the DSA indexer, Mamba);
    the core groups, unifies and sizes them as vLLM does (``kvpools_core.engines.vllm.planning``).

    :param model: the parsed model.
    :param serving: the serving options (``tp_size`` shards the heads, ``kv_cache_dtype`` the bytes).
    :param block_size: vLLM's ``--block-size`` (tokens per block) for the attention layers; 16 is vLLM's
        default, which an answer may replace by the size vLLM's platform settles on (a Mamba hybrid's aligned
        block, a backend's kernel block: ``kvpools_core.parts.vllm.layers``).
    :returns: layer name -> spec for every layer with a cache, named as vLLM names them: exactly one dotted
        part of each name is an integer, the layer index (vLLM's ``extract_layer_index``), which places the
        layer on its pipeline stage; an index ``num_layers + i`` (a decoder layer's second cache, as vLLM names
        Falcon-H1's SSM branch) is placed with layer ``i``.
    """


@_spec(firstresult=True)
def size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing | None:
    """Split a budget into token counts, request count and pools.

    Stops at the first non-None result; return None to decline.  The core's
    default (``trylast``) reproduces SGLang's ``DefaultPoolConfigurator`` and
    token constraints for single-pool models; hybrid architectures answer
    for their own models.  Pools that share one allocation whose split moves at
    run time (``serving.enable_unified_memory``) are answered as an arena:
    ``PoolSizing.arenas`` and ``PoolSpec.arena`` on its members
    (:func:`kvpools_core.parts.unified_plan.unified_sizing`).

    :param model: the parsed model.
    :param serving: the serving options (``accounting`` picks SGLang's or exact sizing).
    :param cell: the cell size from :func:`estimate_cell_size`.
    :param budget: the KV budget.
    :returns: the sizing, whose pools ``build`` must allocate exactly.
    """


@_spec(firstresult=True)
def host_mirrors(plan: Plan) -> Mapping[str, str | PackedInto | None] | None:
    """Say which device pools of a plan have a host (HiCache) mirror, and which ride on another's host slots.

    Stops at the first non-None result; return None to decline.  Asked only
    for plans with a host tier (``serving.host_tier``), after sizing, by
    :func:`kvpools_core.pipeline.host.plan_host_tier`.  The architecture that owns
    ``plan.model.architecture`` answers where SGLang's host pools differ from
    the core's default (``trylast``: every token pool of kind ``"kv"`` and every
    state-slot pool of kind ``"state"``, each a host pool of its own).  A pool
    whose value is ``None`` is sized from its own device slots (``--hicache-ratio``,
    or its share of ``--hicache-size``); one whose value names another mirrored
    pool rides on that pool's host slots and takes no share (SGLang's DSA and
    MiniMax indexer host pools share the KV host pool's slots); a
    :class:`~kvpools_core.values.PackedInto` value packs the pool's rows into
    that mirrored pool's host rows (SGLang's packed MTP draft layers: the host
    pool's bytes per slot grow, its slots do not).  Pools not named have no
    mirror.  The speculative plugin wraps this hook to place the ``draft_*``
    pools (packed, or a sidecar riding on the target's host slots).  An architecture whose host pools kvpools does not
    model refuses ``enable_hierarchical_cache`` in :func:`validate` instead.

    :param plan: the device plan (``plan.host`` is still None).
    :returns: device pool name → ``None`` (own host pool) or the name of the pool it rides on.
    """


@_spec(firstresult=True)
def host_pools(plan: Plan) -> Sequence[HostPool] | None:
    """Size every host (HiCache) pool of one rank of a plan, for an architecture SGLang sizes by rules of its own.

    Stops at the first non-None result; return None to decline.  The core then
    mirrors pools by :func:`host_mirrors` and sizes them by ``HostKVCache``'s
    rule.  Asked only for plans with a host tier (``serving.host_tier``),
    before ``host_mirrors``, by :func:`kvpools_core.pipeline.host.plan_host_tier`, also
    for other ``--hicache-ratio`` / ``--hicache-size`` values (``plan.serving``
    evolved) when the node check looks for what fits.  DeepSeek-V4 answers:
    its ``DeepSeekV4PagedHostPool`` / ``DeepSeekV4StateHostPool`` mirrors are
    counted in whole padded pages (:attr:`HostPool.page_bytes`) from the device
    page counts, not in rows from the device slots.  Every pool's ``bytes`` is
    what ``build`` allocates for it.

    :param plan: the device plan (``plan.host`` is still None).
    :returns: the host pools, in the order SGLang builds them.
    """


@_spec(firstresult=True)
def retraction_host_pool(plan: Plan) -> bool | None:
    """Say whether SGLang's PD decode retraction can back a request's KV up in a host pool for this plan.

    Stops at the first non-None result; return None to decline.  SGLang 0.5.23
    (``resolve_decode_retraction_backup``, ``mem_cache/kv_cache_builder.py``)
    allows the ``host_pool`` backup for an ``MHATokenToKVPool`` or an
    ``SWAKVPool`` with full-attention layers, on a model without recurrent
    state; the architecture that builds such a pool answers True.  The core's
    default (``trylast``) is False.  Asked for decode plans only, by the
    pipeline: an explicit ``--disaggregation-decode-retraction-backup host_pool``
    on a plan answered False is refused with SGLang's message, and the unset
    option's resolution is stated in a note.

    :param plan: the device plan (``plan.host`` is still None).
    """


@_spec(firstresult=True)
def build_req_to_token_pool(plan: Plan, device: str, checked: bool, layout: BufferLayout) -> Any | None:
    """Build the request-to-token table of a plan.

    Stops at the first non-None result; return None to decline.  Hybrid and
    disaggregated-decode variants answer for their plans; the core's default
    (``trylast``) builds the plain table.

    :param plan: the plan.
    :param device: torch device string (``cpu``, ``cuda:0``, ``meta``, ...).
    :param checked: as for :func:`build_allocator`: a table that owns per-request
        state slots (the mamba state pool) builds their allocator in checked mode.
        An implementation may leave it out of its signature.
    :param layout: the build's buffer layout (from :func:`buffer_layout`, resolved before the
        table): a table that owns per-request state tensors (mamba's conv and SSM state)
        allocates them through it, so a platform carves them as it carves the KV pool.
        An implementation may leave it out of its signature.
    :returns: the request table object.
    """


@_spec(firstresult=True)
def buffer_layout(plan: Plan, device: str) -> BufferLayout | None:
    """Choose how the KV pool's buffers are carved on a device: the platform's buffer layout.

    Stops at the first non-None result; return None to decline.  Platform
    plugins (``tryfirst``) answer for their own platform or device and decline
    the rest; the core's default (``trylast``) answers the per-layer layout
    (one tensor per layer).  ``build`` resolves it once and passes it to
    :func:`build_pool` as ``layout``.  A layout only carves: it returns
    per-layer views of the canonical shape and may not change the bytes the
    plan charged (the stores check both, before and after allocating).  A
    plan with an arena (``--enable-unified-memory``) is built as one ``uint8``
    tensor whose sub-pools' views the layout carves (``carve_arena``; SGLang's
    token-major carving unless the layout overrides it).

    :param plan: the plan.
    :param device: torch device string.
    :returns: a :class:`kvpools_core.pools.layout.BufferLayout`.
    """


@_spec(firstresult=True)
def build_pool(plan: Plan, device: str, layout: BufferLayout) -> Any | None:
    """Build the KV pool (the token-indexed tensors) of a plan.

    Stops at the first non-None result; return None to decline.  Platform
    plugins (``tryfirst``) answer first for their devices, then the
    architecture that owns ``plan.model.architecture``.  A plan with a draft
    model of its own (``plan.cell.draft``) calls it again with the draft's plan
    (``kvpools_core.building.draft_plan``), for the draft's architecture to
    build the ``draft_*`` pools; the target's builder leaves them alone.

    :param plan: the plan.
    :param device: torch device string.
    :param layout: the build's buffer layout (from :func:`buffer_layout`): pass it to the
        stores of :mod:`kvpools_core.pools` (``from_plan(plan, device, layout=layout)``),
        which allocate every token-indexed buffer through it.  An implementation may leave
        it out of its signature (its pool then ignores the platform's layout).
    :returns: the KV pool object.
    """


@_spec(firstresult=True)
def build_allocator(plan: Plan, pool: Any, device: str, checked: bool) -> Any | None:
    """Build the slot allocator of a plan's KV pool.

    Stops at the first non-None result; return None to decline.  Platform
    plugins first, then architectures with their own allocators, then the
    core's token / paged allocator (``trylast``).

    :param plan: the plan.
    :param pool: the KV pool built by :func:`build_pool`; the allocator holds it, as
        SGLang's does (``kvcache=pool``: ``get_kvcache()`` returns it and
        ``get_cpu_copy`` / ``load_cpu_copy`` go through it).
    :param device: torch device string.
    :param checked: build the allocator in checked mode (``build(..., checked=True)``):
        it also refuses double frees and frees of never-allocated ids, at the cost
        of an "allocated" map it reports apart (``<pool>_checked`` in
        ``nbytes_by_pool()``) since the plan does not charge it.  Every allocator
        refuses out-of-range ids either way.  An implementation may leave the
        argument out of its signature (and then builds unchecked allocators).
    :returns: the allocator object.
    """


# The result contracts (``RESULTS``) live beside the specifications, in ``kvpools_core.hookspecs.contracts``.
from kvpools_core.hookspecs.contracts import RESULTS as RESULTS  # noqa: E402
from kvpools_core.hookspecs.contracts import ResultContract as ResultContract  # noqa: E402
from kvpools_core.hookspecs.contracts import describe_value as describe_value  # noqa: E402
