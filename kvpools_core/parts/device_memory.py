"""The device total an engine's memory profile starts from: ``torch.cuda.mem_get_info()[1]`` per catalogue GPU.

Shared by the engines whose budget starts from what torch reports as the device's total (vLLM's
``requested_memory``, TensorRT-LLM's ``total_gpu_memory`` in ``KvCacheCreator._cal_max_memory``), so neither imports
the other's private helpers (issue 34).  Torch-free: the totals are measured where a log printed them, else derived
from the catalogue's nvidia-smi total.
"""

from __future__ import annotations

import attrs

from kvpools_core.values import GPU

GiB = 1 << 30

# torch.cuda.mem_get_info()[1] per catalogue GPU.  "measured": a vLLM log printed it; "derived": the catalogue's
# nvidia-smi total less the gap measured on the cards that have both.
_MEASURED_TOTALS: dict[str, tuple[float, str]] = {
    "h100": (
        79.19,
        "vLLM 0.19.0 worker snapshot 'total_memory=79.19GiB' on an H100 80GB HBM3 (github.com/llm-d-incubation/"
        "llm-d-planner accuracy/results/v0.19.0/logs); vLLM 0.6.5 on an older driver printed 79.22GiB "
        "(github.com/vllm-project/vllm/pull/10511)",
    ),
}
SMI_TO_TORCH_GAP_BYTES = round(0.46 * GiB)
"""nvidia-smi total less torch's total, measured: H100 81559 MiB (79.65 GiB) vs 79.19 GiB (0.46); an NVIDIA L20
46068 MiB (44.99 GiB, the L40S's figure too) vs 'total_gpu_memory: 44.52056884765625GiB' (0.47,
github.com/vllm-project/vllm/issues/14011); an RTX 4090 24564 MiB (23.99 GiB) vs '23.52 GiB total' (0.47,
github.com/vllm-project/vllm/issues/42049); an RTX 3090 24576 MiB (24.00 GiB) vs 23.58 GiB (0.42,
github.com/vllm-project/vllm/issues/10517).  Applied to catalogue GPUs with no measured total (for the L40S it
gives 44.53 GiB, the L20's 44.52)."""


@attrs.frozen(kw_only=True)
class TotalMemory:
    """The device total an engine starts from (``torch.cuda.mem_get_info()[1]``)."""

    bytes: int
    measured: bool
    source: str


def torch_total_memory(gpu: GPU) -> TotalMemory:
    """``torch.cuda.mem_get_info()[1]`` of ``gpu``: measured where a log printed it, else the catalogue's nvidia-smi
    total less :data:`SMI_TO_TORCH_GAP_BYTES`."""
    if gpu.name in _MEASURED_TOTALS:
        gib, source = _MEASURED_TOTALS[gpu.name]
        return TotalMemory(bytes=round(gib * GiB), measured=True, source=source)
    return TotalMemory(
        bytes=gpu.total_bytes - SMI_TO_TORCH_GAP_BYTES,
        measured=False,
        source=f"catalogue total {gpu.total_bytes / GiB:.2f} GiB less the 0.46 GiB nvidia-smi-to-torch gap",
    )
