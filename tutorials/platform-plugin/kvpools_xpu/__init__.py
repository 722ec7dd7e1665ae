"""The XPU platform: Intel GPUs through torch's ``xpu`` device type.

The plugin of the tutorial "write a platform plugin" (docs/tutorials/platform-plugin.md),
a distribution of its own (``kvpools-tutorial-xpu``).  It names its platform, claims
``xpu`` / ``xpu:N`` devices and a host whose torch is an XPU build, answers the traits of
plans made for ``xpu``, and measures an XPU's free memory with ``torch.xpu.mem_get_info``.
Planning never imports torch: only the memory probe does, and only for an ``xpu`` device.
It adds no workspace, buffer layout or allocator: builds get the core's.
"""

from __future__ import annotations

import sys
from importlib import metadata

from kvpools_core import hookimpl
from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.values import PlatformTraits, Serving

# --8<-- [start:names]
PLATFORM = "xpu"
"""SGLang's name for the platform (``--device xpu``), and torch's device type."""


@hookimpl
def platforms() -> dict[str, str]:
    return {PLATFORM: "Intel GPUs through torch.xpu (the platform plugin tutorial)"}


@hookimpl
def platform_aliases() -> dict[str, str]:
    return {"intel": PLATFORM}


# --8<-- [end:names]


# --8<-- [start:detect]
@hookimpl
def detect_platform(device: str | None) -> str | None:
    """``xpu`` / ``xpu:N`` devices; with no device (or ``meta``), a host whose torch is an XPU build."""
    if device is None:
        return PLATFORM if xpu_build() else None
    return PLATFORM if device.partition(":")[0] == PLATFORM else None


def xpu_build() -> bool:
    """Whether torch is an XPU build (``torch.version.xpu`` is set), judged without importing torch.

    Planning never imports torch, so a torch nobody imported yet is judged by
    its wheel's version: PyTorch's XPU wheels carry the local label ``+xpu``
    (``2.9.0+xpu``).
    """
    torch = sys.modules.get("torch")
    if torch is not None:
        return bool(getattr(getattr(torch, "version", None), "xpu", None))
    try:
        return "+xpu" in metadata.version("torch")
    except metadata.PackageNotFoundError:
        return False


# --8<-- [end:detect]


# --8<-- [start:traits]
TRAITS = PlatformTraits(platform=PLATFORM)
"""The core's neutral traits, answered by the platform itself: no page-size rule, and the core's defaults for the rest.

SGLang's XPU page-size rule, ``_intel_xpu_page_constraint``
(``python/sglang/srt/arg_groups/overrides.py``, run by
``ServerArgs._handle_attention_backend_compatibility`` in ``python/sglang/srt/server_args.py``),
binds its ``intel_xpu`` decode attention backend: 64 or 128 (16, 32, 64 or 128 for MLA
decode), any other page changed to 128.  That backend is chosen with
``--attention-backend`` (or ``--decode-attention-backend``) ``intel_xpu``
(``ServerArgs._get_default_attn_backend`` has no XPU branch and falls through to triton)
and is replaced by triton on a GPU without Intel XMX, so the rule belongs to a backend
option this plugin does not offer (kvpools-rocm's ``rocm.attention_backend`` shows how one
is declared and read).  The MLA row and slot dtype stay the core's defaults: this tutorial
does not model XPU's DSA kernels.
"""


@hookimpl(tryfirst=True)
def platform_traits(serving: Serving) -> PlatformTraits | None:
    return TRAITS if serving.platform == PLATFORM else None


# --8<-- [end:traits]


# --8<-- [start:probe]
@hookimpl(tryfirst=True)
def available_memory(device: str, serving: Serving) -> dict[str, int] | None:
    """Free and total bytes of an ``xpu`` / ``xpu:N`` device (``torch.xpu.mem_get_info``); None for other devices."""
    kind, _, index_text = device.partition(":")
    if kind != PLATFORM:
        return None
    if index_text and not index_text.isdigit():
        raise ConfigError(f"{option('device')} {device}: write xpu or xpu:N, with N a device index.")
    import torch  # here only: measuring a device is the one step of this plugin that needs torch

    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        build = "" if getattr(torch.version, "xpu", None) else " (this torch is not an XPU build)"
        raise ConfigError(
            f"{option('device')} {device}: no Intel GPU is visible to torch {torch.__version__} here{build}. "
            f"Plan without one by passing {option('memory')} or {option('free_memory')}, "
            f"and build on 'meta' (exact bytes, nothing allocated) or 'cpu'."
        )
    index = int(index_text) if index_text else xpu.current_device()
    count = xpu.device_count()
    if index >= count:
        raise ConfigError(f"{option('device')} {device}: only {count} XPU device(s) are visible.")
    mem_get_info = getattr(xpu, "mem_get_info", None)
    if mem_get_info is None:
        raise ConfigError(
            f"{option('device')} {device}: torch {torch.__version__} has no torch.xpu.mem_get_info to measure "
            f"free memory with. Upgrade torch, or pass {option('memory')} or {option('free_memory')}."
        )
    free, total = mem_get_info(index)
    return {"free_bytes": int(free), "total_bytes": int(total)}


# --8<-- [end:probe]
