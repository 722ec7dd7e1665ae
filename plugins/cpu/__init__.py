"""The CPU platform: host RAM as the budget, and the KV dtypes SGLang's CPU backend accepts."""

from __future__ import annotations

import os
from pathlib import Path

from kvpools_core import hookimpl
from kvpools_core.options import env_flag, option
from kvpools_core.values import KVDtypeRule, ModelSpec, PlatformTraits, Serving

PLATFORM = "cpu"
TRAITS = PlatformTraits(
    platform=PLATFORM,
    kv_dtype_rules=(
        # KVCacheConfigurator.configure refuses it before any pool exists (the reference's configure)
        KVDtypeRule(
            reason="SGLang's CPU backend has fp8 KV kernels for MHA only",
            refused=("fp8_e4m3",),
            kernels=("mla",),
            instead=("auto", "bf16", "fp16", "fp32"),
            engine_message="CPU FP8 KV cache is only supported for MHA.",
        ),
    ),
)
"""What SGLang's CPU backend decides about the KV cache: no fp8 MLA latent rows."""


@hookimpl
def platforms() -> dict[str, str]:
    return {PLATFORM: "host CPU and RAM (SGLang's CPU backend)"}


@hookimpl(tryfirst=True)
def platform_traits(serving: Serving) -> PlatformTraits | None:
    return TRAITS if serving.platform == PLATFORM else None


@hookimpl(tryfirst=True)
def available_memory(device: str, serving: Serving) -> dict[str, int] | None:
    if device != PLATFORM:
        return None
    import psutil

    memory = psutil.virtual_memory()
    return {"free_bytes": int(memory.available), "total_bytes": int(memory.total)}


@hookimpl
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    if serving.platform != PLATFORM:
        return None
    kv = serving.kv_cache_dtype
    if kv == "fp8_e4m3":
        if not has_amx():
            return [
                "CPU FP8 KV cache requires Intel AMX support, which this host lacks. "
                f"Use {option('kv_cache_dtype')} auto, bf16 or fp16 on the CPU platform, or set {AMX_ENV}=1 "
                "to plan for a serving host that has AMX."
            ]
    elif kv in ("fp8_e5m2", "fp4_e2m1", "fp4_mx_block16", "nvfp4", "mxfp8"):
        return [
            f"{option('kv_cache_dtype')} {kv} is not supported on the CPU platform. "
            f"Use auto, bf16, fp16, fp32 (or fp8_e4m3 with Intel AMX)."
        ]
    return None


AMX_ENV = "KVPOOLS_CPU_AMX"
"""Whether the CPU that will serve has Intel AMX: ``1`` / ``0`` (and yes/no, true/false, on/off); unset, probe."""


def has_amx() -> bool:
    """Intel AMX tiles back SGLang's CPU fp8 kernels: does the host that will serve have them?

    :data:`AMX_ENV` (read by :func:`kvpools_core.options.env_flag`) answers for a host other than this one
    (planning offline for another server, or a test pinning the answer so it cannot depend on the machine running
    it); unset, this host's ``/proc/cpuinfo`` decides (``amx_tile``).
    """
    told = os.environ.get(AMX_ENV, "")
    if told.strip():
        return env_flag(AMX_ENV)  # one spelling of yes and no for every kvpools control; anything else refused
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
