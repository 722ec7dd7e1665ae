"""The CUDA platform: free device memory from ``torch.cuda.mem_get_info``, and CUDA kernels' page rules."""

from __future__ import annotations

from kvpools_core import hookimpl
from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.values import PageSizeRule, PlatformTraits, Serving

PLATFORM = "cuda"

TRAITS = PlatformTraits(
    platform=PLATFORM,
    page_size_rules=(
        PageSizeRule(
            kernels=("dsa",),
            sizes=(64,),
            reason="SGLang's DSA pool and FlashMLA's sparse kernels page the cache by 64 tokens",
        ),
    ),
)
"""What CUDA's kernels decide: SGLang's DSA pool asserts ``page_size == 64`` on CUDA (``DSATokenToKVPool``)."""


@hookimpl
def platforms() -> dict[str, str]:
    return {PLATFORM: "NVIDIA GPUs through torch.cuda"}


@hookimpl(tryfirst=True)
def platform_traits(serving: Serving) -> PlatformTraits | None:
    return TRAITS if serving.platform == PLATFORM else None


@hookimpl(tryfirst=True)
def available_memory(device: str, serving: Serving) -> dict[str, int] | None:
    if device != "cuda" and not device.startswith("cuda:"):
        return None
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"{option('device')} {device}: no CUDA device is visible to torch here"
            f"{' (this torch is a CPU-only build)' if torch.version.cuda is None else ''}. "
            f"Plan without a GPU by passing {option('memory')} or {option('free_memory')}, "
            f"and build on 'meta' (exact bytes, nothing allocated) or 'cpu'."
        )
    index = int(device.split(":", 1)[1]) if ":" in device else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise ConfigError(f"{option('device')} {device}: only {torch.cuda.device_count()} CUDA device(s) are visible.")
    free, total = torch.cuda.mem_get_info(index)
    return {"free_bytes": int(free), "total_bytes": int(total)}
