"""The GPU catalogue (the accelerators the platform plugins contribute), and SGLang's memory defaults on it.

Each platform plugin lists its devices through the ``accelerators`` hook
(:class:`~kvpools_core.values.GPU`: the total memory **as SGLang reads it**,
``get_device_memory_capacity`` of SGLang 0.5.23, with its source); this module
keeps the generic machinery: lookup by name or alias with typo suggestions
(:func:`find_gpu`), totals given by the user (:func:`custom_gpu`), and
:func:`sglang_memory_defaults`, SGLang 0.5.23's ``handle_gpu_memory_settings``
(``srt/arg_groups/memory_hook.py``): the GPU-tiered ``chunked_prefill_size``
and decode CUDA-graph ``max_bs``, and the ``mem_fraction_static`` SGLang picks
when it is not set.  What differs by platform comes from the platform's traits
(:class:`~kvpools_core.values.PlatformTraits`): its own memory tiers, set
before the GPU tiers (Ascend's NPU tiers), and whether SGLang captures
breakable prefill graphs there (CUDA only).  The core names no device and no
platform.
"""

from __future__ import annotations

import difflib
import re
from typing import TYPE_CHECKING, Any

import attrs

from kvpools_core.errors import ConfigError, PluginConflictError, PluginResultError, short_repr
from kvpools_core.options import option
from kvpools_core.pipeline.sglang_profile import load_sglang_profile
from kvpools_core.units import parse_bytes
from kvpools_core.values import GPU as GPU  # re-exported: the catalogue's value, defined with the others
from kvpools_core.values import ModelSpec, PlatformTraits, Serving

if TYPE_CHECKING:
    from kvpools_core.registry import Registry

MiB = 1 << 20
GiB = 1 << 30


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def _registry(registry: Registry | None) -> Registry:
    from kvpools_core.registry import get_registry

    return registry or get_registry()


def accelerators(registry: Registry | None = None) -> tuple[GPU, ...]:
    """The catalogue: every loaded plugin's accelerators (``accelerators`` hook), built-in plugins first.

    Checked as it is read: a name or alias two entries share (case, spaces,
    ``-`` and ``_`` ignored) is an error naming the plugins, and so is an
    accelerator of a platform no loaded plugin provides.
    """
    registry = _registry(registry)
    providers = {name: plugin for name, (plugin, _) in registry.call_named("platforms", "Platform").items()}
    owners: dict[str, tuple[str, GPU]] = {}
    catalogue: list[GPU] = []
    # pluggy asks the last-registered plugin first; the catalogue lists them as registered (built-ins first)
    for plugin, offered in reversed(registry.call_collect("accelerators")):
        label = registry.plugin(plugin).label
        for gpu in offered:
            if gpu.platform not in providers:
                raise PluginResultError(
                    f"Plugin {label} contributes the accelerator {gpu.name!r} of platform {gpu.platform!r}, which "
                    f"no loaded plugin provides (installed platforms: {', '.join(sorted(providers)) or 'none'}); "
                    f"an accelerator names a platform by its canonical name, one a platforms hook answers."
                )
            for spelling in (gpu.name, *gpu.aliases):
                key = _key(spelling)
                if not key:
                    raise PluginResultError(f"Plugin {label}: accelerator {gpu.name!r} has an empty spelling.")
                if key in owners and owners[key][1] is not gpu:  # an entry may spell itself twice
                    other_plugin, other = owners[key]
                    if other_plugin == plugin:
                        raise PluginResultError(
                            f"Plugin {label} offers the GPU spelling {spelling!r} twice ({other.name!r} and "
                            f"{gpu.name!r}); names and aliases must be unique (case, spaces, - and _ ignored)."
                        )
                    raise PluginConflictError(
                        f"GPU {spelling!r} comes from two plugins: {registry.plugin(other_plugin).label} "
                        f"({other.name!r}) and {label} ({gpu.name!r}). Disable one with KVPOOLS_DISABLED_PLUGINS "
                        f"(NAME, or DIST:NAME)."
                    )
                owners[key] = (plugin, gpu)
            catalogue.append(gpu)
    return tuple(catalogue)


def __getattr__(name: str) -> Any:
    """``GPUS``: the default registry's catalogue, read when asked (importing this module loads no plugin).

    ``MLA_ARCHITECTURES`` and ``PREFILL_GRAPH_INCOMPATIBLE`` (deprecated): the classes the default registry's
    plugins give the traits :data:`MLA_BACKEND` / :data:`NO_BREAKABLE_PREFILL_GRAPH`."""
    if name == "GPUS":
        return accelerators()
    if name in _DEPRECATED_LISTS:
        import warnings

        trait = _DEPRECATED_LISTS[name]
        warnings.warn(
            f"kvpools_core.gpus.{name} is deprecated: the architecture plugins answer it (architecture_traits "
            f"hook); use kvpools_core.gpus.model_traits(model) and the trait {trait!r}.",
            DeprecationWarning,
            stacklevel=2,
        )
        return frozenset(arch for arch, traits in architecture_traits().items() if trait in traits)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_DEPRECATED_LISTS = {"MLA_ARCHITECTURES": "mla_backend", "PREFILL_GRAPH_INCOMPATIBLE": "no_breakable_prefill_graph"}


def find_gpu(name: str, registry: Registry | None = None) -> GPU:
    """The catalogue entry called ``name`` or one of its aliases (case, spaces, ``-`` and ``_`` ignored).

    The catalogue is ``registry``'s (the default registry's when None): the
    accelerators its platform plugins contribute.
    """
    registry = _registry(registry)
    catalogue = accelerators(registry)
    index = {_key(spelling): gpu for gpu in catalogue for spelling in (gpu.name, *gpu.aliases)}
    found = index.get(_key(name))
    if found is not None:
        return found
    close = difflib.get_close_matches(_key(name), list(index), n=1)
    hint = f" Did you mean {index[close[0]].name!r}?" if close else ""
    raise ConfigError(
        f"Unknown GPU {short_repr(name)} ({option('gpu')}).{hint} "
        f"Known: {', '.join(g.name for g in catalogue) or 'none'}; "
        f"for another accelerator pass {option('gpu_memory')} SIZE (its total memory, e.g. 96GiB)."
        f"{_vendor_hint(registry)} {registry.loading_hint()}".rstrip()
    )


def _vendor_hint(registry: Registry) -> str:
    """Where the accelerators of vendor platforms not installed here come from (install hints only)."""
    from kvpools_core.pipeline.platforms import VENDOR_DISTRIBUTIONS, install_command

    installed = {info.distribution.lower().replace("_", "-") for info in registry.plugins()}
    missing = sorted(set(VENDOR_DISTRIBUTIONS.values()) - installed)
    if not missing:
        return ""
    return f" Vendor platforms bring their accelerators with their plugins: {install_command(*missing)}."


def custom_gpu(memory: int | float | str, platform: str = "cuda") -> GPU:
    """A GPU known only by its total memory (``--gpu-memory``), on ``platform``."""
    total = parse_bytes(memory, option("gpu_memory"))
    if total <= 0:
        raise ConfigError(f"{option('gpu_memory')} must be positive, got {memory!r}.")
    return GPU("custom", f"custom GPU, {total / GiB:.2f} GiB", total, platform=platform, source="user-supplied")


def platform_traits_of(platform: str | PlatformTraits, registry: Registry | None = None) -> PlatformTraits:
    """The traits of ``platform`` (a name or alias) as a plan for it resolves them; traits are returned as given."""
    if isinstance(platform, PlatformTraits):
        return platform
    from kvpools_core.pipeline.platforms import resolve_platform, resolve_platform_traits

    registry = _registry(registry)
    serving = resolve_platform_traits(resolve_platform(Serving(platform=platform), registry), registry)
    return serving.traits


# ---------------------------------------------------------------------------
# SGLang 0.5.23 handle_gpu_memory_settings (srt/arg_groups/memory_hook.py)
# ---------------------------------------------------------------------------

MLA_BACKEND = "mla_backend"
"""The ``architecture_traits`` trait of a class SGLang runs with ``AttentionArch.MLA`` (``use_mla_backend``):
its prefill graph reserve is the MLA backend's 1.5 GiB."""

NO_BREAKABLE_PREFILL_GRAPH = "no_breakable_prefill_graph"
"""The ``architecture_traits`` trait of a class whose breakable prefill CUDA graph SGLang turns off before sizing
(``disable_breakable_cudagraph_if_incompatible``, ``cuda_graph_hook.py`` lines 170-240)."""

MAMBAISH_STATE = "mambaish_state"
"""The ``architecture_traits`` trait of a class SGLang gives a ``mambaish_config`` (a recurrent-state pool beside the
KV cache): under post-capture KV sizing its slack is at least the pre-capture activation reserve
(:mod:`kvpools_core.pipeline.post_capture`)."""

NO_POST_CAPTURE_KV_SIZING = "no_post_capture_kv_sizing"
"""The ``architecture_traits`` trait of a class for which SGLang never plans post-capture KV sizing
(``post_capture_kv_sizing_planned``: ``is_deepseek_v4`` / ``is_minimax_sparse``, ``overrides.py`` L1859-1860)."""

VLLM_VISION_QWEN3 = "vllm_vision_qwen3_vit"
"""The ``architecture_traits`` trait of a class whose vision tower vLLM builds as ``Qwen3_VisionTransformer``: its
encoder profile pass is :func:`kvpools_core.engines.vllm.runtime_memory.mm_encoder_profile`'s Qwen3-VL term."""

VLLM_VISION_PIXTRAL = "vllm_vision_pixtral_hf"
"""The ``architecture_traits`` trait of a class whose vision tower vLLM builds as ``PixtralHFVisionModel`` with the
Mistral-3 projector (its encoder profile pass: the Pixtral term)."""

VLLM_VISION_SIGLIP = "vllm_vision_gemma3_siglip"
"""The ``architecture_traits`` trait of a class whose vision tower vLLM builds as ``SiglipVisionModel`` with the
Gemma-3 projector (its encoder profile pass: the SigLIP term)."""

VLLM_VISION_LLAMA4 = "vllm_vision_llama4_vit"
"""The ``architecture_traits`` trait of a class whose vision tower vLLM builds as ``Llama4VisionModel`` with the
pixel-shuffle adapter and the Llama-4 projector (its encoder profile pass: the Llama-4 term)."""

VLLM_VISION_GEMMA4 = "vllm_vision_gemma4_hf"
"""The ``architecture_traits`` trait of a class whose vision tower vLLM builds as transformers' ``AutoModel`` with
the Gemma-4 embedder (``gemma4_mm.py`` L1100-1113): its encoder profile pass is the Gemma-4 term (transformers 5.20.2's
tower, vLLM's ``_encoder_chunk`` batch), and its image and video modalities say when vLLM leaves the tower out
(:mod:`kvpools_core.engines.vllm.multimodal`)."""

VLLM_PREFIX_LM = "vllm_prefix_lm"
"""The ``architecture_traits`` trait of a class vLLM runs as a PrefixLM multimodal model (bidirectional attention
over its image tokens, ``transformers_utils/model_arch_config_convertor.py`` L352-366 in 0.33): it needs
FlashAttention 4 (``flash_attn.py`` L498-512), which a Hopper does not run (``fa_utils.py`` L94-104), so it takes
TRITON_ATTN, whose FULL CUDA graphs capture no split-KV buffers (:func:`kvpools_core.engines.vllm.runtime_memory.
cudagraph_memory`)."""

VLLM_ATTENTION_SINKS = "vllm_attention_sinks"
"""The ``architecture_traits`` trait of a class whose attention layers carry learned sinks: FlashAttention's FULL
captures keep no split-KV accumulators for it (gpt-oss's logged FULL first capture is 6-8 MiB, not 256-512)."""

VLLM_CUDAGRAPH_CAPTURE_1024 = "vllm_cudagraph_capture_1024"
"""The ``architecture_traits`` trait of a class whose vLLM config hook raises ``max_cudagraph_capture_size`` to 1024
(0.33 ``model_executor/models/config.py`` L544-562, "from 67 to 83" graphs)."""

ARCHITECTURE_TRAITS = (
    MLA_BACKEND,
    NO_BREAKABLE_PREFILL_GRAPH,
    MAMBAISH_STATE,
    NO_POST_CAPTURE_KV_SIZING,
    VLLM_VISION_QWEN3,
    VLLM_VISION_PIXTRAL,
    VLLM_VISION_SIGLIP,
    VLLM_VISION_LLAMA4,
    VLLM_VISION_GEMMA4,
    VLLM_PREFIX_LM,
    VLLM_ATTENTION_SINKS,
    VLLM_CUDAGRAPH_CAPTURE_1024,
)
"""The traits an architecture plugin may give a Hugging Face class (``architecture_traits`` hook)."""


def architecture_traits(registry: Registry | None = None) -> dict[str, frozenset[str]]:
    """Hugging Face architecture → the SGLang traits the loaded architecture plugins give its class.

    The core names no architecture: each plugin names the classes it parses that SGLang treats apart
    (``architecture_traits`` hook); a class two plugins name has the union of their traits, and a trait name
    outside :data:`ARCHITECTURE_TRAITS` is an error naming the plugin.
    """
    registry = _registry(registry)
    traits: dict[str, set[str]] = {}
    for plugin, answer in registry.call_collect("architecture_traits"):
        for architecture, names in answer.items():
            unknown = sorted(set(names) - set(ARCHITECTURE_TRAITS))
            if unknown:
                raise PluginResultError(
                    f"Plugin {registry.plugin(plugin).label} gives {architecture!r} the unknown trait(s) "
                    f"{', '.join(map(repr, unknown))} (architecture_traits); known: {', '.join(ARCHITECTURE_TRAITS)}."
                )
            traits.setdefault(architecture, set()).update(names)
    return {architecture: frozenset(names) for architecture, names in traits.items()}


def model_traits(model: ModelSpec, registry: Registry | None = None) -> frozenset[str]:
    """The SGLang traits of ``model``'s classes (``ModelSpec.hf_architectures``), as :func:`architecture_traits`."""
    known = architecture_traits(registry)
    return frozenset(trait for architecture in model.hf_architectures for trait in known.get(architecture, ()))


MAX_PREFILL_TOKENS = 16384
"""SGLang's ``--max-prefill-tokens`` default: the activation tokens when chunked prefill is off."""


@attrs.frozen
class MemoryDefaults:
    """What ``handle_gpu_memory_settings`` resolves for one GPU and serving, with every term of the reserve.

    ``reserved_mb`` is SGLang's ``reserved_mem`` (MiB) and ``mem_fraction_static``
    ``round((gpu_mem - reserved_mem) / gpu_mem, 3)``; ``terms`` lists the
    reserve's parts in SGLang's order, for the report.
    """

    gpu_mib: float
    chunked_prefill_size: int
    decode_max_bs: int
    reserved_mb: float
    mem_fraction_static: float
    terms: tuple[str, ...]


def sglang_chunked_prefill_size(
    gpu_mib: float, platform: str | PlatformTraits = "cuda", *, registry: Registry | None = None
) -> int:
    """SGLang's ``chunked_prefill_size`` when unset, by GPU memory (``memory_hook.py`` lines 89-170).

    A platform with memory tiers of its own (:attr:`PlatformTraits.memory_tiers`, Ascend's) sets it first;
    ``platform`` is its name (its traits resolved through ``registry``) or its traits.
    """
    tier = platform_traits_of(platform, registry).memory_tier(gpu_mib)
    if tier is not None:
        return tier.chunked_prefill_size
    if gpu_mib < 20 * 1024:
        return 2048
    if gpu_mib < 60 * 1024:
        return 4096
    if gpu_mib < 160 * 1024:
        return 8192
    return 16384


def sglang_decode_max_bs(
    gpu_mib: float, tp_size: int, platform: str | PlatformTraits = "cuda", *, registry: Registry | None = None
) -> int:
    """SGLang's decode CUDA-graph ``max_bs`` when unset, by GPU memory and TP (``memory_hook.py`` lines 89-170),
    after the platform's own memory tiers (as :func:`sglang_chunked_prefill_size`)."""
    tier = platform_traits_of(platform, registry).memory_tier(gpu_mib)
    if tier is not None:
        return tier.decode_max_bs_for(tp_size)
    if gpu_mib < 20 * 1024:
        return 8
    if gpu_mib < 35 * 1024:
        return 48 if tp_size < 4 else 160
    if gpu_mib < 60 * 1024:
        return 32 if tp_size < 4 else 160
    if gpu_mib < 160 * 1024:
        return 256 if tp_size < 4 else 512
    return 512


def _prefill_graph_sizes(max_bs: int) -> int:
    """``len(generate_prefill_cuda_graph_batch_sizes(max_bs))`` (``cuda_graph_hook.py`` lines 480-497)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return sum(1 for size in sizes if size <= max_bs)


def prefill_graph_enabled(model: ModelSpec, serving: Serving, *, registry: Registry | None = None) -> tuple[bool, str]:
    """Whether SGLang captures the breakable prefill graph before sizing, and why not.

    Breakable prefill graphs are a platform's default or not (``cuda_graph_config.py``
    ``default_prefill_backend``: CUDA only), which its traits say
    (:attr:`PlatformTraits.breakable_prefill_graphs`; ``serving.platform_traits``, else resolved
    through ``registry``); ``apply_cuda_graph_compatibility`` turns them off for
    pipeline parallelism, decode context parallelism, attention context parallelism,
    multimodal models and the classes an architecture plugin gives :data:`NO_BREAKABLE_PREFILL_GRAPH`
    (DeepSeek-V4's; ``cuda_graph_hook.py`` lines 136-240), and a PD decode node has none (lines 560-577).
    """
    traits = serving.platform_traits or platform_traits_of(serving.platform, registry)
    classes = architecture_traits(registry)
    incompatible = [arch for arch in model.hf_architectures if NO_BREAKABLE_PREFILL_GRAPH in classes.get(arch, ())]
    reasons = [
        (
            not traits.breakable_prefill_graphs,
            f"platform {serving.platform} (SGLang captures no breakable prefill graph there by default)",
        ),
        (serving.disable_cuda_graph, "--disable-cuda-graph (cuda_graph_hook.py lines 54-57)"),
        (serving.pp_size > 1, "pipeline parallelism"),
        (serving.dcp_size > 1, "decode context parallelism"),
        (serving.attn_cp_size > 1, "attention context parallelism"),
        (serving.disaggregation_mode == "decode", "a PD decode node"),
        (model.is_multimodal, "a multimodal model"),
        (bool(incompatible), f"{', '.join(incompatible)} (SGLang turns its prefill graph off)"),
    ]
    for off, why in reasons:
        if off:
            return False, why
    return True, ""


VLM_BASE_FACTOR = 0.95
"""``base_mem_fraction_reduction_ratio`` of SGLang 0.5.23's ``adjust_mem_fraction_for_vlm`` (``memory_hook.py``
L417-462)."""


def vlm_fraction_factor(vit_layers: int, vit_hidden: int) -> tuple[float, str]:
    """What SGLang 0.5.23 multiplies a multimodal model's default ``mem_fraction_static`` by (``memory_hook.py``
    L330-337, L417-462): ``0.95 x clamp(1 - 0.1 x (complexity - 1), 0.8, 1.05)``, ``complexity`` the vision tower's
    ``layers x hidden^2`` over ViT-L/14's ``24 x 1024^2``; with the reason, for the plan's terms."""
    complexity = vit_layers * vit_hidden**2 / (24 * 1024**2)
    dynamic = max(0.8, min(1.05, 1.0 - 0.1 * (complexity - 1.0)))
    factor = VLM_BASE_FACTOR * dynamic
    return factor, (
        f"{factor:.6g} (adjust_mem_fraction_for_vlm: 0.95 x clamp(1 - 0.1 x ({vit_layers} x {vit_hidden}^2 / "
        f"(24 x 1024^2) - 1), 0.8, 1.05) = 0.95 x {dynamic:.6g})"
    )


def sglang_memory_defaults(
    gpu_mib: float, model: ModelSpec, serving: Serving, *, registry: Registry | None = None
) -> MemoryDefaults:
    """SGLang 0.5.23's ``handle_gpu_memory_settings`` for a GPU of ``gpu_mib`` MiB (``memory_hook.py``).

    The platform's part comes from its traits (``serving.platform_traits`` once
    the pipeline resolved them, else through ``registry``, the default one when None):
    its own memory tiers and whether prefill graphs are captured.

    ``serving.chunked_prefill_size`` is the chunk the server runs with (``None``:
    chunked prefill off, SGLang's ``-1``).  Post-capture KV sizing is off by default
    (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``), DeepEP is not modelled (its 2 GiB
    a2a reserve applies only with ``--moe-a2a-backend deepep``); ``serving.disable_cuda_graph`` drops the decode and
    prefill graph terms (DP attention's padding term stays, lines 369-377).
    A multimodal model's default is then lowered by its vision tower's size (:func:`vlm_fraction_factor`,
    ``adjust_mem_fraction_for_vlm``), from ``model.vision_tower``; a multimodal model whose ``vision_config`` is
    not known must state ``mem_fraction_static``.
    """
    vlm = model.is_multimodal and serving.disaggregation_mode != "decode"
    if vlm and model.vision_tower is None:
        raise ConfigError(
            f"SGLang lowers the default {option('mem_fraction_static')} of a multimodal model by its vision "
            f"tower's size (adjust_mem_fraction_for_vlm), and {model.name}'s config carries no vision_config: "
            f"pass {option('mem_fraction_static')} for it on a GPU, or the checkpoint's complete config.json."
        )
    traits = serving.platform_traits or platform_traits_of(serving.platform, registry)
    tp, pp = serving.tp_size, serving.pp_size
    max_bs = sglang_decode_max_bs(gpu_mib, tp, traits)
    # lines 182-188: a smaller --max-running-requests caps the default decode max_bs
    # (the option as given: DeepSeek-V4's and speculative decoding's defaults come after, LateDefaultInt)
    given_requests = serving.given_max_running_requests
    if given_requests is not None and max_bs > given_requests:
        max_bs = given_requests
    chunk = serving.chunked_prefill_size if serving.chunked_prefill_size is not None else -1
    mla = MLA_BACKEND in model_traits(model, registry)

    # lines 298-307: the tokens the activation working set scales with
    if serving.disaggregation_mode == "decode":
        running = given_requests or max_bs or 1
        activation = max(running * (serving.speculative_num_draft_tokens or 1), 2048)
        activation_why = f"max(running {running} x draft tokens {serving.speculative_num_draft_tokens or 1}, 2048)"
    elif chunk > 0:
        activation = max(chunk, 2048)
        activation_why = f"max(chunked_prefill_size {chunk}, 2048)"
    else:
        activation = max(MAX_PREFILL_TOKENS, 2048)
        activation_why = f"max(max_prefill_tokens {MAX_PREFILL_TOKENS}, 2048)"
    terms = [
        "512 MiB constant",
        f"1.5 x {activation} activation tokens ({activation_why}) = {1.5 * activation:g} MiB",
        f"tp {tp} x pp {pp} / 8 x 1024 = {tp * pp / 8 * 1024:g} MiB",
    ]
    reserved = 512 + activation * 1.5 + tp * pp / 8 * 1024

    # reserve_for_graph_mb, lines 357-399
    graph = 0.0
    if serving.disaggregation_mode != "prefill":
        if serving.disable_cuda_graph:  # the decode backend is DISABLED: no 2 x max_bs (line 366)
            terms.append("no decode graph (--disable-cuda-graph)")
        else:
            graph += max_bs * 2
            terms.append(f"decode graph 2 x max_bs {max_bs} = {max_bs * 2} MiB")
        if serving.enable_dp_attention:  # not gated on the decode backend (lines 369-377)
            dp = serving.attn_dp_size
            extra = max_bs * dp * 3 + (max_bs * dp * 1.5 if max_bs > 300 else 0)
            graph += extra
            terms.append(f"DP attention 3{' + 1.5' if max_bs > 300 else ''} x max_bs x dp {dp} = {extra:g} MiB")
    if serving.platform_traits is None:
        serving = attrs.evolve(serving, platform_traits=traits)
    prefill_on, prefill_off_why = prefill_graph_enabled(model, serving, registry=registry)
    if prefill_on:
        if mla:
            graph += 1.5 * 1024
            terms.append("prefill graph, MLA backend: 1536 MiB")
        else:
            capture = chunk
            if serving.max_total_tokens is not None:
                capture = min(capture, serving.max_total_tokens)
            sizes = _prefill_graph_sizes(capture)
            graph += sizes * 8
            terms.append(f"prefill graph 8 x {sizes} capture sizes (up to {capture} tokens) = {sizes * 8} MiB")
    else:
        terms.append(f"no prefill graph ({prefill_off_why})")
    reserved += graph
    if gpu_mib > 60 * 1024 and reserved < 10 * 1024:
        terms.append(f"floor: {reserved:g} MiB raised to 10240 MiB (GPUs over 60 GiB)")
        reserved = 10 * 1024.0
    fraction = round((gpu_mib - reserved) / gpu_mib, 3)
    if vlm:
        assert model.vision_tower is not None
        factor, why = vlm_fraction_factor(*model.vision_tower)
        terms.append(f"multimodal: round(...) x {why}")
        fraction *= factor
    return MemoryDefaults(
        gpu_mib=gpu_mib,
        chunked_prefill_size=chunk,
        decode_max_bs=max_bs,
        reserved_mb=reserved,
        mem_fraction_static=fraction,
        terms=tuple(terms),
    )


# ---------------------------------------------------------------------------
# the runtime's own footprint before the weights load
# ---------------------------------------------------------------------------

SINGLE_RANK_RUNTIME_BYTES = load_sglang_profile("0.5.23").single_rank_runtime_bytes
"""1 GiB (``profiles/sglang-0.5.23.json``): estimate of what one rank's CUDA context, torch and library
workspaces take before the weights (no torch.distributed communicators): kvpools' estimate, not a citable
measurement; override with ``runtime_memory`` / ``--runtime-memory``."""

DISTRIBUTED_RUNTIME_BYTES = load_sglang_profile("0.5.23").group_runtime_bytes
"""3 GiB (``profiles/sglang-0.5.23.json``): what a rank of a TP/PP group holds before the weights, context
and NCCL/custom all-reduce buffers included: SGLang logs 'Load weight begin. avail mem=137.34 GB' on TP0 of an
8 x H200 server (github.com/sgl-project/sglang/pull/11716), 3.06 GiB below the 143771 MiB total, and
'avail mem=12.25 GB, mem usage=125.65 GB' at the end of the load (137.90 GiB before it, 2.50 GiB below the total;
github.com/SemiAnalysisAI/InferenceX/issues/2128).  kvpools takes 3 GiB."""


def default_runtime_bytes(serving: Serving) -> int:
    """The runtime footprint before the weights that a GPU plan assumes unless told (see the two constants)."""
    return DISTRIBUTED_RUNTIME_BYTES if serving.tp_size * serving.pp_size > 1 else SINGLE_RANK_RUNTIME_BYTES
