"""The ROCm platform: AMD GPUs through a HIP build of torch.

A separate distribution (``kvpools-rocm``), installed as a vendor ships it;
the core and the built-in plugins import nothing from it.  On ROCm, torch
names HIP devices ``cuda`` / ``cuda:N`` and ``torch.version.hip`` is set, so
this plugin answers for those devices only on a HIP build (on a CUDA build it
declines them and the ``cuda`` plugin measures).  SGLang's other name for the
platform, ``hip``, is an alias.
"""

from __future__ import annotations

import sys
from importlib import metadata as importlib_metadata
from typing import Any

import attrs

from kvpools_core import hookimpl
from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.values import GPU, ModelSpec, PageSizeRule, PlatformTraits, Serving, Workspace
from kvpools_rocm.dsa_defaults import *  # noqa: F403
from kvpools_rocm.dsa_defaults import DSA_PRESHUFFLE_OPTION
from kvpools_rocm.dsv4_layout import (
    FLASHMLA_BACKEND_OPTION,
    UNIFIED_KV_FP8_OPTION,
    pool_layouts,
    validate_dsv4_layout_options,
)
from kvpools_rocm.layout_hooks import *  # noqa: F403
from kvpools_rocm.layout_hooks import KV_CACHE_LAYOUT_OPTION, KV_CACHE_LAYOUTS

__version__ = "0.2.0"  # the one place it is written: pyproject.toml reads this literal

PLATFORM = "rocm"
ALIASES = {"hip": PLATFORM}
DEVICE_TYPE = "cuda"
"""torch's device type for HIP devices on a ROCm build."""

_NOT_ON_ROCM = ("modelopt", "modelopt_fp8", "modelopt_fp4", "modelopt_mixed", "awq_marlin", "gptq_marlin")
"""The SGLang methods kvpools models that are not in ``rocm_supported_quantization`` (model_config.py lines
2002-2016 of SGLang 0.5.23)."""
_ROCM_UNSUPPORTED = (
    "'{method} quantization is currently not supported in ROCm.' (srt/configs/model_config.py lines 2156-2160: "
    "SGLang 0.5.23's ROCm list has awq, fp8, compressed-tensors, mxfp4, quark, ... and no {method})"
)

TRAITS = PlatformTraits(
    platform=PLATFORM,
    page_size_rules=(
        PageSizeRule(
            kernels=("dsa",),
            sizes=(1,),
            multiple_of=16,
            reason="SGLang's DSA pool on HIP pages by 1, or by a multiple of 16 with AITER's preshuffled paged MQA",
        ),
    ),
    raw_mla_row_backends=frozenset({"tilelang", "triton", "aiter"}),
    decode_retraction_host_pool=False,
    marlin_conversions=frozenset({"gptq"}),
    refused_quantization={
        "gptq": "'Unknown quantization method: gptq' (srt/configs/model_config.py lines 2150-2155): SGLang "
        "0.5.23 registers gptq on NPU, CPU and XPU only (srt/layers/quantization/__init__.py lines 63-137)",
        **{method: _ROCM_UNSUPPORTED.format(method=method) for method in _NOT_ON_ROCM},
    },
)
"""What ROCm's kernels decide (SGLang's ``DSATokenToKVPool`` HIP branch and ``calculate_mla_kv_cache_dim``):
DSA pages of 1 or a multiple of 16, and the DSA backends that read raw latent rows (no FlashMLA fp8 packing).
SGLang 0.5.23's quantisation on HIP: a GPTQ checkpoint Marlin takes is converted to ``gptq_marlin`` (its check
asks the device capability alone, ``gptq/gptq.py`` lines 414-481 and ``marlin_utils.py`` lines 68-79, which
``torch.cuda`` reports on HIP: an MI300X's 9.4), an AWQ one is not (``awq/awq.py`` lines 409-410: CUDA only); no
plain ``gptq`` is registered, and ``_verify_quantization`` refuses every method outside ROCm's supported list
(``srt/configs/model_config.py`` lines 2002-2016 and 2156-2160), which of the methods kvpools models keeps fp8,
awq, compressed-tensors and mxfp4."""


ACCELERATORS: tuple[GPU, ...] = (
    GPU(
        "mi300x",
        "AMD Instinct MI300X 192GB",
        201310208 * 1024,
        platform=PLATFORM,
        aliases=("mi300",),
        source="rocminfo 'Pool 1' Size 201310208 KB (0xbffc000), which SGLang's get_amdgpu_memory_capacity "
        "reads as 196592 MiB",
    ),
    GPU(
        "mi325x",
        "AMD Instinct MI325X 256GB",
        256 << 30,
        platform=PLATFORM,
        aliases=("mi325",),
        source="AMD MI325X specification: 256 GB HBM3E, taken as 256 GiB (no rocminfo reading cited; pass "
        "--gpu-memory with your rocminfo figure to be exact)",
    ),
)
"""AMD Instinct GPUs, each with its total as SGLang reads it on ROCm: ``get_amdgpu_memory_capacity``
(``srt/utils/common.py`` of SGLang 0.5.23) takes ``rocminfo``'s "Pool 1" size in KB / 1024 as MiB."""


@hookimpl
def platforms() -> dict[str, str]:
    return {PLATFORM: "AMD GPUs through a HIP build of torch (torch.cuda on ROCm)"}


@hookimpl
def accelerators() -> list[GPU]:
    return list(ACCELERATORS)


@hookimpl
def platform_aliases() -> dict[str, str]:
    return dict(ALIASES)


@hookimpl
def detect_platform(device: str | None) -> str | None:
    """``cuda`` devices on a HIP build of torch; with no device, a HIP build of torch on this host."""
    if device is None:
        return PLATFORM if hip_build(import_torch=False) else None
    if device.split(":", 1)[0] == DEVICE_TYPE and hip_build(import_torch=True):
        return PLATFORM
    return None


@hookimpl(tryfirst=True)
def platform_traits(serving: Serving) -> PlatformTraits | None:
    """:data:`TRAITS`, with the DeepSeek-V4 pool layout the ``rocm.flashmla_backend`` options select, and AITER's
    ``mem_fraction_static`` factor where SGLang applies it (:func:`aiter_scales_fraction`)."""
    if serving.platform != PLATFORM:
        return None
    layouts = pool_layouts(serving)
    traits = attrs.evolve(TRAITS, pool_layouts=layouts) if layouts else TRAITS
    if aiter_scales_fraction(serving):
        traits = attrs.evolve(
            traits, mem_fraction_scale=AITER_FRACTION_SCALE, mem_fraction_scale_above=AITER_FRACTION_SCALE_ABOVE
        )
    return traits


AITER_FRACTION_SCALE = 0.85
AITER_FRACTION_SCALE_ABOVE = 8192
"""SGLang 0.5.23's ``_handle_attention_backend_compatibility`` (``srt/arg_groups/attention_hook.py`` lines 243-269):
with ``attention_backend == "aiter"`` and ``context_len > 8192`` it sets ``mem_fraction_static *= 0.85`` (the default
or the given fraction), leaving room for the AITER workspace it allocates after the KV pool; an explicit fraction
is kept as given only under ``SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION`` (``rocm.honor_explicit_mem_fraction``)."""
HONOR_EXPLICIT_FRACTION_OPTION = "rocm.honor_explicit_mem_fraction"
ON_OFF = ("on", "off")


def aiter_scales_fraction(serving: Serving) -> bool:
    """Whether SGLang scales this serving's ``mem_fraction_static`` by 0.85 above 8192 tokens of context: AITER is
    the attention backend (``rocm.attention_backend``, default ``aiter``: SGLang's HIP default,
    ``model_override_base.py`` lines 323-345) and no given fraction is honoured as is."""
    if attention_backend(serving) != AITER:
        return False
    honour = str(serving.plugin_options.get(HONOR_EXPLICIT_FRACTION_OPTION, "off")) == "on"
    return not (honour and serving.mem_fraction_static is not None)


@hookimpl(specname="validate")
def validate_honor_explicit_fraction(model: ModelSpec, serving: Serving) -> list[str] | None:
    """An unknown ``rocm.honor_explicit_mem_fraction`` value."""
    if serving.platform != PLATFORM or HONOR_EXPLICIT_FRACTION_OPTION not in serving.plugin_options:
        return None
    value = str(serving.plugin_options[HONOR_EXPLICIT_FRACTION_OPTION])
    if value in ON_OFF:
        return None
    return [f"{HONOR_EXPLICIT_FRACTION_OPTION} must be on or off, got {value!r}."]


@hookimpl(specname="validate")
def validate_dsv4_options(model: ModelSpec, serving: Serving) -> list[str] | None:
    return validate_dsv4_layout_options(model, serving) if serving.platform == PLATFORM else None


ATTENTION_BACKEND_OPTION = "rocm.attention_backend"
AITER = "aiter"
AITER_MLA_WORKSPACE = "aiter_mla_kv_indices"
AITER_INDEX_BYTES = 4
"""AITER's page indices are int32."""


@hookimpl
def plugin_options() -> dict[str, str]:
    return {
        ATTENTION_BACKEND_OPTION: f"SGLang's --attention-backend on ROCm (default {AITER}); {AITER} keeps an MLA "
        f"page-index workspace of requests x context_len int32 that the plan charges.",
        HONOR_EXPLICIT_FRACTION_OPTION: "on or off (default off): SGLang's SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION; "
        "on, a given --mem-fraction-static is kept as is, off (SGLang's default) AITER scales the fraction, given or "
        "default, by 0.85 when context_len > 8192 (attention_hook.py).",
        DSA_PRESHUFFLE_OPTION: "on or off (default off): whether SGLang's aiter_can_use_preshuffle_paged_mqa() "
        "holds (SGLANG_USE_AITER=1 and Triton >= 3.5); off, SGLang pages DeepSeek sparse attention by 1 on ROCm, "
        "on by 64 x index_kpool.",
        FLASHMLA_BACKEND_OPTION: "SGLang's SGLANG_HACK_FLASHMLA_BACKEND (default auto); unified_kv_triton builds "
        "DeepSeek-V4's unified-KV pool (one row per request-ring slot and compressed block per layer).",
        UNIFIED_KV_FP8_OPTION: "on or off (default off): SGLang's SGLANG_DSV4_UNIFIED_KV_FP8, the fp8 unified-KV "
        "pool (gfx95 GPUs; SGLang keeps bf16 on gfx94x), with rocm.flashmla_backend=unified_kv_triton.",
        KV_CACHE_LAYOUT_OPTION: f"SGLang's SGLANG_AITER_KV_CACHE_LAYOUT ({' or '.join(KV_CACHE_LAYOUTS)}, default "
        f"nhd); vectorized_5d stores MHA K as (blocks, H, D // X, page, X) and V as (blocks, H, page // X, Dv, X), "
        f"X = 16 // itemsize.",
    }


def attention_backend(serving: Serving) -> str:
    return str(serving.plugin_options.get(ATTENTION_BACKEND_OPTION, AITER))


@hookimpl
def workspaces(model: ModelSpec, serving: Serving) -> list[Workspace] | None:
    """AITER's MLA backend: an int32 page-index buffer of ``max_running_requests x context_len`` entries.

    SGLang's ``AiterAttnBackend`` (``init_cuda_graph_state``) allocates
    ``cuda_graph_kv_indices = zeros(max_bs * max_context_len, int32)`` for MLA
    models beside the KV cache, out of the memory the KV pool leaves; kvpools
    charges it per running request so an exact plan leaves room for it.
    """
    if serving.platform != PLATFORM or attention_backend(serving) != AITER or not _reads_mla_latents(model):
        return None
    context_len = serving.context_length or model.context_len
    return [
        Workspace(
            name=AITER_MLA_WORKSPACE,
            purpose="AITER MLA decode's page indices (int32, one per context token of each running request)",
            bytes_per_request=context_len * AITER_INDEX_BYTES,
            dtype="int32",
        )
    ]


def _reads_mla_latents(model: ModelSpec) -> bool:
    """An MLA model served by the MLA attention backend (DSA models use the DSA backends, which keep their own)."""
    layers = model.layers
    return bool(layers) and all(
        "kv_lora_rank" in layer.params and "index_head_dim" not in layer.params for layer in layers
    )


@hookimpl(tryfirst=True)
def available_memory(device: str, serving: Serving) -> dict[str, int] | None:
    kind, _, index_text = device.partition(":")
    if kind != DEVICE_TYPE or not hip_build(import_torch=True):
        return None
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"{option('device')} {device}: no HIP device is visible to torch {torch.version.hip} here. "
            f"Plan without a GPU by passing {option('memory')} or {option('free_memory')}, "
            f"and build on 'meta' (exact bytes, nothing allocated) or 'cpu'."
        )
    index = int(index_text) if index_text else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ConfigError(f"{option('device')} {device}: only {torch.cuda.device_count()} HIP device(s) are visible.")
    free, total = torch.cuda.mem_get_info(index)
    return {"free_bytes": int(free), "total_bytes": int(total)}


def hip_build(*, import_torch: bool) -> bool:
    """Whether torch is a HIP (ROCm) build: ``torch.version.hip``.

    Without ``import_torch`` (asked while planning, which never imports torch)
    an unimported torch is judged by its wheel's version (``2.5.1+rocm6.2``).
    """
    torch: Any = sys.modules.get("torch")
    if torch is None and import_torch:
        import torch
    if torch is not None:
        return bool(getattr(getattr(torch, "version", None), "hip", None))
    try:
        return "rocm" in importlib_metadata.version("torch")
    except importlib_metadata.PackageNotFoundError:
        return False
