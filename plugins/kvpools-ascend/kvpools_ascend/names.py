"""The platform's names, shared by the plugin's modules (which must not import the package itself)."""

from __future__ import annotations

from typing import Any

PLATFORM = "ascend"
"""The platform's name (``--platform ascend``)."""
DEVICE_TYPE = "npu"
"""torch_npu's device type, also the platform's alias (``--device npu:0``, ``--platform npu``)."""
RUNTIME = "torch_npu"


def on_ascend(plan: Any = None, device: str | None = None) -> bool:
    """Whether a hook call is this platform's: a plan made for ``ascend``, or an ``npu`` device."""
    if device is not None and str(device).split(":", 1)[0] == DEVICE_TYPE:
        return True
    return plan is not None and plan.serving.platform == PLATFORM
