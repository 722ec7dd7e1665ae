"""The CUDA platform: free device memory from ``torch.cuda.mem_get_info``, CUDA kernels' page rules, and the
NVIDIA GPUs of the catalogue (``--gpu``) with their totals as SGLang reads them."""

from __future__ import annotations

from kvpools_core import hookimpl
from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.values import GPU, PageSizeRule, PlatformTraits, Serving

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
    breakable_prefill_graphs=True,
    marlin_conversions=frozenset({"awq", "gptq"}),
    refused_quantization={
        "gptq": "'Unknown quantization method: gptq' (srt/configs/model_config.py lines 2150-2155): SGLang 0.5.23 "
        "registers gptq on NPU, CPU and XPU only (srt/layers/quantization/__init__.py lines 63-137); on CUDA it "
        "serves a GPTQ checkpoint as gptq_marlin, which needs 4/8-bit, sym, group_size -1/32/64/128, desc_act given "
        "and no Marlin format (gptq/gptq.py lines 414-481), with the quantization unset, marlin or gptq_marlin",
    },
)
"""What CUDA's kernels decide: SGLang's DSA pool asserts ``page_size == 64`` on CUDA (``DSATokenToKVPool``);
SGLang captures breakable prefill graphs by default on CUDA only (``default_prefill_backend``,
``srt/model_executor/cuda_graph_config.py`` lines 119-123 of SGLang 0.5.23), so its default
``mem_fraction_static`` reserves memory for them.  SGLang converts AWQ and GPTQ checkpoints to Marlin on CUDA
(``awq/awq.py`` lines 402-424 ask ``is_cuda()``, ``marlin_utils.py`` lines 68-79 a capability of 8.0 or more) and
its CUDA registry has no plain ``gptq``."""

MiB = 1 << 20
_SMI = "nvidia-smi memory.total"
_CC = "NVIDIA's compute capability table (developer.nvidia.com/cuda-gpus)"
"""Hopper (H100 / H200 / GH200 / H20) 9.0, Blackwell datacenter (B200 / GB200) 10.0, Blackwell RTX (RTX 5090, RTX PRO
6000 Blackwell) 12.0, Ampere A100 8.0 and A10G / A40 / RTX 3090 (Ti) 8.6, Ada (L40S, RTX 6000 Ada, L4, RTX 4090)
8.9: what ``torch.cuda.get_device_capability`` answers on them."""


def _mib(value: int) -> int:
    return value * MiB


ACCELERATORS: tuple[GPU, ...] = (
    GPU(
        "h100",
        "NVIDIA H100 80GB HBM3 (SXM)",
        _mib(81559),
        aliases=("h100-sxm", "h100-80gb", "h100-sxm5"),
        source=f"{_SMI} 81559 MiB ('NVIDIA H100 80GB HBM3 ... 1MiB / 81559MiB', "
        "github.com/sgl-project/sglang/issues/7478)",
        compute_capability=(9, 0),
        capability_source=_CC,
    ),
    GPU(
        "h100-pcie",
        "NVIDIA H100 PCIe 80GB",
        _mib(81559),
        aliases=("h100pcie",),
        source=f"{_SMI} 81559 MiB (same 80 GB HBM2e total as the SXM part)",
        compute_capability=(9, 0),
        capability_source=_CC,
    ),
    GPU(
        "h100-nvl",
        "NVIDIA H100 NVL 94GB",
        _mib(95830),
        aliases=("h100nvl", "h100-94gb"),
        source=f"{_SMI} 95830 MiB (public nvidia-smi captures of 'NVIDIA H100 NVL')",
        compute_capability=(9, 0),
        capability_source=_CC,
    ),
    GPU(
        "h200",
        "NVIDIA H200 141GB HBM3e",
        _mib(143771),
        aliases=("h200-sxm", "h200-141gb"),
        source=f"{_SMI} 143771 MiB (public nvidia-smi captures of 'NVIDIA H200'; 140.4 GiB as in "
        "github.com/SemiAnalysisAI/InferenceX/issues/2128)",
        compute_capability=(9, 0),
        capability_source=_CC,
    ),
    GPU(
        "gh200",
        "NVIDIA GH200 96GB",
        _mib(97871),
        aliases=("gh200-96gb",),
        source=f"{_SMI} 97871 MiB (public nvidia-smi captures of GH200 at 900 W)",
        compute_capability=(9, 0),
        capability_source=_CC,
    ),
    GPU(
        "b200",
        "NVIDIA B200 180GB HBM3e",
        _mib(183359),
        aliases=("b200-sxm", "hgx-b200", "dgx-b200"),
        source=f"{_SMI} 183359 MiB (public nvidia-smi captures of 'NVIDIA B200')",
        compute_capability=(10, 0),
        capability_source=_CC,
    ),
    GPU(
        "gb200",
        "NVIDIA GB200 (one Blackwell GPU, 186GB)",
        _mib(189471),
        aliases=("gb200-nvl72",),
        source=f"{_SMI} 189471 MiB (public nvidia-smi captures of 'NVIDIA GB200')",
        compute_capability=(10, 0),
        capability_source=_CC,
    ),
    GPU(
        "a100-80gb",
        "NVIDIA A100 80GB (SXM4 or PCIe)",
        _mib(81920),
        aliases=("a100", "a100-80g", "a100-sxm4-80gb", "a800", "a800-80gb"),
        source=f"{_SMI} 81920 MiB (public nvidia-smi captures of 'A100-SXM4-80GB' and 'A100 80GB PCIe')",
        compute_capability=(8, 0),
        capability_source=_CC,
    ),
    GPU(
        "a100-40gb",
        "NVIDIA A100 40GB (SXM4 or PCIe)",
        _mib(40960),
        aliases=("a100-40g", "a100-sxm4-40gb", "a100-pcie-40gb"),
        source=f"{_SMI} 40960 MiB (public nvidia-smi captures of 'A100-SXM4-40GB' and 'A100-PCIE-40GB')",
        compute_capability=(8, 0),
        capability_source=_CC,
    ),
    GPU(
        "l40s",
        "NVIDIA L40S 48GB",
        _mib(46068),
        aliases=("l40",),
        source=f"{_SMI} 46068 MiB (public nvidia-smi captures of 'NVIDIA L40S')",
        compute_capability=(8, 9),
        capability_source=_CC,
    ),
    GPU(
        "rtx-6000-ada",
        "NVIDIA RTX 6000 Ada Generation 48GB",
        _mib(49140),
        aliases=("rtx6000-ada", "rtx6000ada", "6000-ada"),
        source=f"{_SMI} 49140 MiB (public nvidia-smi captures of 'NVIDIA RTX 6000 Ada Gene...')",
        compute_capability=(8, 9),
        capability_source=_CC,
    ),
    GPU(
        "l4",
        "NVIDIA L4 24GB",
        _mib(23034),
        source=f"{_SMI} 23034 MiB (public nvidia-smi captures of 'NVIDIA L4')",
        compute_capability=(8, 9),
        capability_source=_CC,
    ),
    GPU(
        "h20",
        "NVIDIA H20 96GB",
        _mib(97871),
        aliases=("h20-96gb",),
        source=f"{_SMI} 97871 MiB ('NVIDIA H20 ... 0MiB /  97871MiB', github.com/NVIDIA/nvtrust/issues/128)",
        compute_capability=(9, 0),
        capability_source=_CC,
    ),
    GPU(
        "rtx-pro-6000",
        "NVIDIA RTX PRO 6000 Blackwell 96GB (Workstation, Max-Q or Server Edition)",
        _mib(97887),
        aliases=("rtx-pro-6000-blackwell", "rtxpro6000", "pro-6000", "rtx-6000-pro"),
        source=f"{_SMI} 97887 MiB ('NVIDIA RTX PRO 6000 Blac... 94490MiB /  97887MiB', "
        "github.com/vllm-project/vllm/issues/27542)",
        compute_capability=(12, 0),
        capability_source=_CC,
    ),
    GPU(
        "rtx-5090",
        "NVIDIA GeForce RTX 5090 32GB",
        _mib(32607),
        aliases=("5090", "geforce-rtx-5090"),
        source=f"{_SMI} 32607 MiB ('NVIDIA GeForce RTX 5090 ... 492MiB /  32607MiB', "
        "github.com/noonghunna/club-3090/issues/617)",
        compute_capability=(12, 0),
        capability_source=_CC,
    ),
    GPU(
        "rtx-4090",
        "NVIDIA GeForce RTX 4090 24GB",
        _mib(24564),
        aliases=("4090", "geforce-rtx-4090"),
        source=f"{_SMI} 24564 MiB ('NVIDIA GeForce RTX 4090 ... 507MiB /  24564MiB', "
        "github.com/RLinf/RLinf/issues/255)",
        compute_capability=(8, 9),
        capability_source=_CC,
    ),
    GPU(
        "rtx-3090",
        "NVIDIA GeForce RTX 3090 24GB",
        _mib(24576),
        aliases=("3090", "geforce-rtx-3090"),
        source=f"{_SMI} 24576 MiB ('NVIDIA GeForce RTX 3090 ... 15005MiB /  24576MiB', "
        "github.com/noonghunna/club-3090/issues/390)",
        compute_capability=(8, 6),
        capability_source=_CC,
    ),
    GPU(
        "rtx-3090-ti",
        "NVIDIA GeForce RTX 3090 Ti 24GB",
        _mib(24564),
        aliases=("3090-ti", "3090ti", "geforce-rtx-3090-ti"),
        source=f"{_SMI} 24564 MiB ('NVIDIA GeForce RTX 3090 Ti ... 22624MiB /  24564MiB', "
        "github.com/noonghunna/club-3090/issues/769)",
        compute_capability=(8, 6),
        capability_source=_CC,
    ),
    GPU(
        "a40",
        "NVIDIA A40 48GB",
        _mib(46068),
        aliases=("a40-48gb",),
        source=f"{_SMI} 46068 MiB (an NVIDIA A40 whose memory size is given as '46068MiB', "
        "github.com/guqiong96/Lvllm/issues/35; the L40S's figure too)",
        compute_capability=(8, 6),
        capability_source=_CC,
    ),
    GPU(
        "a10g",
        "NVIDIA A10G 24GB",
        _mib(23028),
        source=f"{_SMI} 23028 MiB (public nvidia-smi captures of 'NVIDIA A10G', AWS g5)",
        compute_capability=(8, 6),
        capability_source=_CC,
    ),
)
"""NVIDIA GPUs, each with ``nvidia-smi --query-gpu=memory.total`` in MiB: what SGLang's
``get_device_memory_capacity`` reads on CUDA (``srt/utils/common.py`` of SGLang 0.5.23), never the marketing
"80 GB"."""


@hookimpl
def platforms() -> dict[str, str]:
    return {PLATFORM: "NVIDIA GPUs through torch.cuda"}


@hookimpl
def accelerators() -> list[GPU]:
    return list(ACCELERATORS)


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
