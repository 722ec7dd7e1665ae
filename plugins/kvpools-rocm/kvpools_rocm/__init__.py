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

from kvpools_core import hookimpl
from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.values import Serving

PLATFORM = "rocm"
ALIASES = {"hip": PLATFORM}
DEVICE_TYPE = "cuda"
"""torch's device type for HIP devices on a ROCm build."""


@hookimpl
def platforms() -> dict[str, str]:
    return {PLATFORM: "AMD GPUs through a HIP build of torch (torch.cuda on ROCm)"}


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
