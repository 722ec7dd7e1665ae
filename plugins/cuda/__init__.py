"""The CUDA platform: free device memory from ``torch.cuda.mem_get_info``."""

from __future__ import annotations

from kvpools_core import hookimpl
from kvpools_core.errors import ConfigError
from kvpools_core.values import Serving


@hookimpl(tryfirst=True)
def available_memory(device: str, serving: Serving) -> dict[str, int] | None:
    if device != "cuda" and not device.startswith("cuda:"):
        return None
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"--device {device}: no CUDA device is visible to torch here. "
            f"Pass --memory SIZE or --free-memory SIZE to plan without a GPU."
        )
    index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ConfigError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) are visible.")
    free, total = torch.cuda.mem_get_info(index)
    return {"free_bytes": int(free), "total_bytes": int(total)}
