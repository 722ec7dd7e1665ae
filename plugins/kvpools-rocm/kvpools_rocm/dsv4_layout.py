"""SGLang 0.5.23's DeepSeek-V4 unified-KV pool on ROCm: which layout the HIP kernels select (torch-free).

On HIP SGLang builds DeepSeek-V4's KV as ``DeepSeekV4UnifiedKVPool`` (one row per SWA-ring slot and compressed
block per layer) instead of the CUDA separate-KV pools when ``SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton``
(``is_unified_kv_triton``, ``layers/attention/dsv4/unified_kv_gate.py``), in fp8 (a 512 B fp8 nope row plus a
bf16 rope row) when also ``SGLANG_DSV4_UNIFIED_KV_FP8=1`` on a gfx95 GPU (``is_unified_kv_fp8``; on gfx94x SGLang
warns and keeps bf16), per pool (``unified_fp8_for_dsv4_pool``, ref-000 lines 138-145).  kvpools reads no
environment: the plugin options :data:`FLASHMLA_BACKEND_OPTION` and :data:`UNIFIED_KV_FP8_OPTION` say what those
variables are, and :func:`pool_layouts` puts the choice in ``PlatformTraits.pool_layouts["dsv4"]``, which the
``dsv4`` plugin reads (``unified_bf16`` / ``unified_fp8``).
"""

from __future__ import annotations

from kvpools_core.options import option
from kvpools_core.values import ModelSpec, Serving

__all__ = [
    "FLASHMLA_BACKEND_OPTION",
    "UNIFIED_KV_FP8_OPTION",
    "pool_layouts",
    "validate_dsv4_layout_options",
]

FLASHMLA_BACKEND_OPTION = "rocm.flashmla_backend"
"""SGLang's ``SGLANG_HACK_FLASHMLA_BACKEND`` (default ``auto``); ``unified_kv_triton`` selects the unified pool."""
UNIFIED_KV_FP8_OPTION = "rocm.dsv4_unified_kv_fp8"
"""SGLang's ``SGLANG_DSV4_UNIFIED_KV_FP8`` (``on`` / ``off``, default off); only with ``unified_kv_triton``."""
UNIFIED_KV_TRITON = "unified_kv_triton"
DSV4_KEY = "dsv4"
SWITCH_VALUES = ("on", "off")


def _switch(serving: Serving, name: str) -> bool:
    return str(serving.plugin_options.get(name, "off")) == "on"


def pool_layouts(serving: Serving) -> dict[str, str]:
    """``PlatformTraits.pool_layouts`` for these options: ``{"dsv4": "unified_bf16" | "unified_fp8"}`` or none."""
    if str(serving.plugin_options.get(FLASHMLA_BACKEND_OPTION, "auto")) != UNIFIED_KV_TRITON:
        return {}
    return {DSV4_KEY: "unified_fp8" if _switch(serving, UNIFIED_KV_FP8_OPTION) else "unified_bf16"}


def validate_dsv4_layout_options(model: ModelSpec, serving: Serving) -> list[str]:
    """A switch that is neither on nor off, and fp8 without the unified backend (SGLang's gate then ignores it:
    ``is_unified_kv_fp8`` requires ``is_unified_kv_triton``), which would change nothing."""
    problems = []
    value = serving.plugin_options.get(UNIFIED_KV_FP8_OPTION)
    if value is not None and str(value) not in SWITCH_VALUES:
        problems.append(f"{option('plugin_options')} {UNIFIED_KV_FP8_OPTION}={value}: choose on or off.")
    elif _switch(serving, UNIFIED_KV_FP8_OPTION) and not pool_layouts(serving):
        problems.append(
            f"{option('plugin_options')} {UNIFIED_KV_FP8_OPTION}=on changes nothing without "
            f"{FLASHMLA_BACKEND_OPTION}={UNIFIED_KV_TRITON} (SGLang's is_unified_kv_fp8 needs is_unified_kv_triton): "
            f"add {FLASHMLA_BACKEND_OPTION}={UNIFIED_KV_TRITON}, or drop {UNIFIED_KV_FP8_OPTION}."
        )
    return problems
