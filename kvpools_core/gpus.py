"""A catalogue of accelerators, and SGLang's memory defaults for a whole GPU.

Each :class:`GPU` carries the total memory **as SGLang reads it**:
``get_device_memory_capacity`` (``srt/utils/common.py`` of SGLang 0.5.23) takes
``nvidia-smi --query-gpu=memory.total`` in MiB on CUDA, the ``rocminfo`` "Pool 1"
size in KB / 1024 on ROCm, and the platform's total on out-of-tree platforms
(Ascend).  So ``total_bytes`` is that MiB figure x 2^20, never the marketing
"80 GB".  :func:`sglang_memory_defaults` reproduces SGLang 0.5.23's
``handle_gpu_memory_settings`` (``srt/arg_groups/memory_hook.py``): the
GPU-tiered ``chunked_prefill_size`` and decode CUDA-graph ``max_bs``, and the
``mem_fraction_static`` SGLang picks when it is not set.
"""

from __future__ import annotations

import difflib
import re

import attrs

from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.units import parse_bytes
from kvpools_core.values import ModelSpec, Serving

MiB = 1 << 20
GiB = 1 << 30


@attrs.frozen
class GPU:
    """One accelerator model: its total memory as the driver reports it, and the platform it runs on.

    ``platform`` is the kvpools platform name that plans for it (``cuda``,
    ``rocm``, ``ascend``); ``source`` says where ``total_bytes`` comes from.
    """

    name: str
    label: str
    total_bytes: int
    platform: str = "cuda"
    aliases: tuple[str, ...] = ()
    source: str = ""

    @property
    def total_mib(self) -> float:
        """SGLang's ``gpu_mem``: the total in MiB, the unit ``handle_gpu_memory_settings`` compares."""
        return self.total_bytes / MiB


_SMI = "nvidia-smi memory.total"


def _mib(value: float) -> int:
    return int(value * MiB)


GPUS: tuple[GPU, ...] = (
    GPU(
        "h100",
        "NVIDIA H100 80GB HBM3 (SXM)",
        _mib(81559),
        aliases=("h100-sxm", "h100-80gb", "h100-sxm5"),
        source=f"{_SMI} 81559 MiB ('NVIDIA H100 80GB HBM3 ... 1MiB / 81559MiB', "
        "github.com/sgl-project/sglang/issues/7478)",
    ),
    GPU(
        "h100-pcie",
        "NVIDIA H100 PCIe 80GB",
        _mib(81559),
        aliases=("h100pcie",),
        source=f"{_SMI} 81559 MiB (same 80 GB HBM2e total as the SXM part)",
    ),
    GPU(
        "h100-nvl",
        "NVIDIA H100 NVL 94GB",
        _mib(95830),
        aliases=("h100nvl", "h100-94gb"),
        source=f"{_SMI} 95830 MiB (public nvidia-smi captures of 'NVIDIA H100 NVL')",
    ),
    GPU(
        "h200",
        "NVIDIA H200 141GB HBM3e",
        _mib(143771),
        aliases=("h200-sxm", "h200-141gb"),
        source=f"{_SMI} 143771 MiB (public nvidia-smi captures of 'NVIDIA H200'; 140.4 GiB as in "
        "github.com/SemiAnalysisAI/InferenceX/issues/2128)",
    ),
    GPU(
        "gh200",
        "NVIDIA GH200 96GB",
        _mib(97871),
        aliases=("gh200-96gb",),
        source=f"{_SMI} 97871 MiB (public nvidia-smi captures of GH200 at 900 W)",
    ),
    GPU(
        "b200",
        "NVIDIA B200 180GB HBM3e",
        _mib(183359),
        aliases=("b200-sxm", "hgx-b200", "dgx-b200"),
        source=f"{_SMI} 183359 MiB (public nvidia-smi captures of 'NVIDIA B200')",
    ),
    GPU(
        "gb200",
        "NVIDIA GB200 (one Blackwell GPU, 186GB)",
        _mib(189471),
        aliases=("gb200-nvl72",),
        source=f"{_SMI} 189471 MiB (public nvidia-smi captures of 'NVIDIA GB200')",
    ),
    GPU(
        "a100-80gb",
        "NVIDIA A100 80GB (SXM4 or PCIe)",
        _mib(81920),
        aliases=("a100", "a100-80g", "a100-sxm4-80gb", "a800", "a800-80gb"),
        source=f"{_SMI} 81920 MiB (public nvidia-smi captures of 'A100-SXM4-80GB' and 'A100 80GB PCIe')",
    ),
    GPU(
        "a100-40gb",
        "NVIDIA A100 40GB (SXM4 or PCIe)",
        _mib(40960),
        aliases=("a100-40g", "a100-sxm4-40gb", "a100-pcie-40gb"),
        source=f"{_SMI} 40960 MiB (public nvidia-smi captures of 'A100-SXM4-40GB' and 'A100-PCIE-40GB')",
    ),
    GPU(
        "l40s",
        "NVIDIA L40S 48GB",
        _mib(46068),
        aliases=("l40",),
        source=f"{_SMI} 46068 MiB (public nvidia-smi captures of 'NVIDIA L40S')",
    ),
    GPU(
        "rtx-6000-ada",
        "NVIDIA RTX 6000 Ada Generation 48GB",
        _mib(49140),
        aliases=("rtx6000-ada", "rtx6000ada", "6000-ada"),
        source=f"{_SMI} 49140 MiB (public nvidia-smi captures of 'NVIDIA RTX 6000 Ada Gene...')",
    ),
    GPU(
        "l4",
        "NVIDIA L4 24GB",
        _mib(23034),
        source=f"{_SMI} 23034 MiB (public nvidia-smi captures of 'NVIDIA L4')",
    ),
    GPU(
        "a10g",
        "NVIDIA A10G 24GB",
        _mib(23028),
        source=f"{_SMI} 23028 MiB (public nvidia-smi captures of 'NVIDIA A10G', AWS g5)",
    ),
    GPU(
        "mi300x",
        "AMD Instinct MI300X 192GB",
        201310208 * 1024,
        platform="rocm",
        aliases=("mi300",),
        source="rocminfo 'Pool 1' Size 201310208 KB (0xbffc000), which SGLang's get_amdgpu_memory_capacity "
        "reads as 196592 MiB",
    ),
    GPU(
        "mi325x",
        "AMD Instinct MI325X 256GB",
        256 * GiB,
        platform="rocm",
        aliases=("mi325",),
        source="AMD MI325X specification: 256 GB HBM3E, taken as 256 GiB (no rocminfo reading cited; pass "
        "--gpu-memory with your rocminfo figure to be exact)",
    ),
    GPU(
        "ascend-910b",
        "Huawei Ascend 910B 64GB",
        64 * GiB,
        platform="ascend",
        aliases=("910b", "ascend910b", "ascend-910b3", "910b3", "atlas-800t-a2"),
        source="Ascend 910B (Atlas 800T A2) specification: 64 GB HBM, npu-smi HBM capacity 65536 MB",
    ),
)
"""The catalogue: every entry's total as SGLang reads it, with its source."""


def _key(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name.strip().lower())


def _index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in GPUS:
        for spelling in (gpu.name, *gpu.aliases):
            index[_key(spelling)] = gpu
    return index


def find_gpu(name: str) -> GPU:
    """The catalogue entry called ``name`` or one of its aliases (case, spaces, ``-`` and ``_`` ignored)."""
    index = _index()
    found = index.get(_key(name))
    if found is not None:
        return found
    close = difflib.get_close_matches(_key(name), list(index), n=1)
    hint = f" Did you mean {index[close[0]].name!r}?" if close else ""
    raise ConfigError(
        f"Unknown GPU {name!r} ({option('gpu')}).{hint} Known: {', '.join(g.name for g in GPUS)}; "
        f"for another accelerator pass {option('gpu_memory')} SIZE (its total memory, e.g. 96GiB)."
    )


def custom_gpu(memory: int | float | str, platform: str = "cuda") -> GPU:
    """A GPU known only by its total memory (``--gpu-memory``), on ``platform``."""
    total = parse_bytes(memory, option("gpu_memory"))
    if total <= 0:
        raise ConfigError(f"{option('gpu_memory')} must be positive, got {memory!r}.")
    return GPU("custom", f"custom GPU, {total / GiB:.2f} GiB", total, platform=platform, source="user-supplied")


# ---------------------------------------------------------------------------
# SGLang 0.5.23 handle_gpu_memory_settings (srt/arg_groups/memory_hook.py)
# ---------------------------------------------------------------------------

MLA_ARCHITECTURES = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV3ForCausalLMNextN",
        "Glm4MoeLiteForCausalLM",
        "Glm4MoeLiteForCausalLMNextN",
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaForCausalLMNextN",
        "Glm5NextForConditionalGeneration",
        "Glm5NextForConditionalGenerationNextN",
        "LongcatFlashForCausalLM",
        "LongcatFlashForCausalLMNextN",
        "HYV4ForCausalLM",
        "HYV4ForCausalLMNextN",
        "DotsVLMForCausalLM",
        "Dots3NoteForCausalLM",
        "Dots3NoteForCausalLMNextN",
        "MistralLarge3ForCausalLM",
        "MistralLarge3ForCausalLMEagle",
        "KimiK25ForConditionalGeneration",
        "Eagle3DeepseekV2ForCausalLM",
        "GigaChat35ForCausalLM",
        "GigaChat35ForCausalLMNextN",
        "MiniCPM3ForCausalLM",
        "KimiVLForConditionalGeneration",
        "KimiLinearForCausalLM",
        "KimiK3LinearForCausalLM",
        "KimiK3ForConditionalGeneration",
    }
)
"""Hugging Face architectures SGLang 0.5.23 runs with ``AttentionArch.MLA`` (``srt/configs/model_config.py``
lines 1366-1397 and the ``elif`` branches after them): ``use_mla_backend`` is true for them."""

PREFILL_GRAPH_INCOMPATIBLE = frozenset(
    {"DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark"}
)
"""Architectures whose breakable prefill CUDA graph SGLang turns off before sizing
(``disable_breakable_cudagraph_if_incompatible``, ``cuda_graph_hook.py`` lines 170-240: DeepSeek-V4)."""

MAX_PREFILL_TOKENS = 16384
"""SGLang's ``--max-prefill-tokens`` default: the activation tokens when chunked prefill is off."""


@attrs.frozen
class MemoryDefaults:
    """What ``handle_gpu_memory_settings`` resolves for one GPU and serving, with every term of the reserve.

    ``reserved_mb`` is SGLang's ``reserved_mem`` (MiB) and ``mem_fraction_static``
    ``round((gpu_mem - reserved_mem) / gpu_mem, 3)``; ``terms`` lists the
    reserve's parts in SGLang's order, for the report.
    """

    gpu_mib: float
    chunked_prefill_size: int
    decode_max_bs: int
    reserved_mb: float
    mem_fraction_static: float
    terms: tuple[str, ...]


def _npu_tier(gpu_mib: float, tp_size: int) -> tuple[int, int] | None:
    """Ascend's own ``(chunked_prefill_size, decode max_bs)``, set before the GPU tiers are read
    (``srt/hardware_backend/npu/utils.py`` lines 103-160 of SGLang 0.5.23); above 64 GiB the GPU tiers apply."""
    if gpu_mib <= 32 * 1024:
        return 4096, 16 if tp_size < 4 else 64
    if gpu_mib <= 64 * 1024:
        return 8192, 64 if tp_size < 4 else 256
    return None


def sglang_chunked_prefill_size(gpu_mib: float, platform: str = "cuda") -> int:
    """SGLang's ``chunked_prefill_size`` when unset, by GPU memory (``memory_hook.py`` lines 89-170)."""
    npu = _npu_tier(gpu_mib, 1) if platform == "ascend" else None
    if npu is not None:
        return npu[0]
    if gpu_mib < 20 * 1024:
        return 2048
    if gpu_mib < 60 * 1024:
        return 4096
    if gpu_mib < 160 * 1024:
        return 8192
    return 16384


def sglang_decode_max_bs(gpu_mib: float, tp_size: int, platform: str = "cuda") -> int:
    """SGLang's decode CUDA-graph ``max_bs`` when unset, by GPU memory and TP (``memory_hook.py`` lines 89-170)."""
    npu = _npu_tier(gpu_mib, tp_size) if platform == "ascend" else None
    if npu is not None:
        return npu[1]
    if gpu_mib < 20 * 1024:
        return 8
    if gpu_mib < 35 * 1024:
        return 48 if tp_size < 4 else 160
    if gpu_mib < 60 * 1024:
        return 32 if tp_size < 4 else 160
    if gpu_mib < 160 * 1024:
        return 256 if tp_size < 4 else 512
    return 512


def _prefill_graph_sizes(max_bs: int) -> int:
    """``len(generate_prefill_cuda_graph_batch_sizes(max_bs))`` (``cuda_graph_hook.py`` lines 480-497)."""
    sizes = (
        list(range(4, 33, 4))
        + list(range(48, 257, 16))
        + list(range(288, 513, 32))
        + list(range(576, 1025, 64))
        + list(range(1280, 4097, 256))
        + list(range(4608, max_bs + 1, 512))
    )
    return sum(1 for size in sizes if size <= max_bs)


def prefill_graph_enabled(model: ModelSpec, serving: Serving) -> tuple[bool, str]:
    """Whether SGLang captures the breakable prefill graph before sizing, and why not.

    Breakable prefill graphs are the default on CUDA only (``cuda_graph_config.py``
    ``default_prefill_backend``); ``apply_cuda_graph_compatibility`` turns them off for
    pipeline parallelism, decode context parallelism, attention context parallelism,
    multimodal models and DeepSeek-V4 (``cuda_graph_hook.py`` lines 136-240), and a
    PD decode node has none (lines 560-577).
    """
    reasons = [
        (serving.platform != "cuda", f"platform {serving.platform} (breakable prefill graphs are CUDA-only)"),
        (serving.pp_size > 1, "pipeline parallelism"),
        (serving.dcp_size > 1, "decode context parallelism"),
        (serving.attn_cp_size > 1, "attention context parallelism"),
        (serving.disaggregation_mode == "decode", "a PD decode node"),
        (model.is_multimodal, "a multimodal model"),
        (bool(PREFILL_GRAPH_INCOMPATIBLE & set(model.hf_architectures)), "DeepSeek-V4"),
    ]
    for off, why in reasons:
        if off:
            return False, why
    return True, ""


def sglang_memory_defaults(gpu_mib: float, model: ModelSpec, serving: Serving) -> MemoryDefaults:
    """SGLang 0.5.23's ``handle_gpu_memory_settings`` for a GPU of ``gpu_mib`` MiB (``memory_hook.py``).

    ``serving.chunked_prefill_size`` is the chunk the server runs with (``None``:
    chunked prefill off, SGLang's ``-1``).  Post-capture KV sizing is off by default
    (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``), DeepEP is not modelled (its 2 GiB
    a2a reserve applies only with ``--moe-a2a-backend deepep``), CUDA graphs are on.
    A multimodal model's vision-tower correction needs the ViT's shape, which a
    kvpools model does not carry: such a model must state ``mem_fraction_static``.
    """
    if model.is_multimodal and serving.disaggregation_mode != "decode":
        raise ConfigError(
            f"SGLang lowers the default {option('mem_fraction_static')} of a multimodal model by its vision "
            f"tower's size (adjust_mem_fraction_for_vlm), which kvpools does not model: pass "
            f"{option('mem_fraction_static')} for {model.name} on a GPU."
        )
    tp, pp = serving.tp_size, serving.pp_size
    max_bs = sglang_decode_max_bs(gpu_mib, tp, serving.platform)
    # lines 182-188: a smaller --max-running-requests caps the default decode max_bs
    if serving.max_running_requests is not None and max_bs > serving.max_running_requests:
        max_bs = serving.max_running_requests
    chunk = serving.chunked_prefill_size if serving.chunked_prefill_size is not None else -1
    mla = bool(MLA_ARCHITECTURES & set(model.hf_architectures))

    # lines 298-307: the tokens the activation working set scales with
    if serving.disaggregation_mode == "decode":
        running = serving.max_running_requests or max_bs or 1
        activation = max(running * (serving.speculative_num_draft_tokens or 1), 2048)
        activation_why = f"max(running {running} x draft tokens {serving.speculative_num_draft_tokens or 1}, 2048)"
    elif chunk > 0:
        activation = max(chunk, 2048)
        activation_why = f"max(chunked_prefill_size {chunk}, 2048)"
    else:
        activation = max(MAX_PREFILL_TOKENS, 2048)
        activation_why = f"max(max_prefill_tokens {MAX_PREFILL_TOKENS}, 2048)"
    terms = [
        "512 MiB constant",
        f"1.5 x {activation} activation tokens ({activation_why}) = {1.5 * activation:g} MiB",
        f"tp {tp} x pp {pp} / 8 x 1024 = {tp * pp / 8 * 1024:g} MiB",
    ]
    reserved = 512 + activation * 1.5 + tp * pp / 8 * 1024

    # reserve_for_graph_mb, lines 357-399
    graph = 0.0
    if serving.disaggregation_mode != "prefill":
        graph += max_bs * 2
        terms.append(f"decode graph 2 x max_bs {max_bs} = {max_bs * 2} MiB")
        if serving.enable_dp_attention:
            dp = serving.attn_dp_size
            extra = max_bs * dp * 3 + (max_bs * dp * 1.5 if max_bs > 300 else 0)
            graph += extra
            terms.append(f"DP attention 3{' + 1.5' if max_bs > 300 else ''} x max_bs x dp {dp} = {extra:g} MiB")
    prefill_on, prefill_off_why = prefill_graph_enabled(model, serving)
    if prefill_on:
        if mla:
            graph += 1.5 * 1024
            terms.append("prefill graph, MLA backend: 1536 MiB")
        else:
            capture = chunk
            if serving.max_total_tokens is not None:
                capture = min(capture, serving.max_total_tokens)
            sizes = _prefill_graph_sizes(capture)
            graph += sizes * 8
            terms.append(f"prefill graph 8 x {sizes} capture sizes (up to {capture} tokens) = {sizes * 8} MiB")
    else:
        terms.append(f"no prefill graph ({prefill_off_why})")
    reserved += graph
    if gpu_mib > 60 * 1024 and reserved < 10 * 1024:
        terms.append(f"floor: {reserved:g} MiB raised to 10240 MiB (GPUs over 60 GiB)")
        reserved = 10 * 1024.0
    fraction = round((gpu_mib - reserved) / gpu_mib, 3)
    return MemoryDefaults(
        gpu_mib=gpu_mib,
        chunked_prefill_size=chunk,
        decode_max_bs=max_bs,
        reserved_mb=reserved,
        mem_fraction_static=fraction,
        terms=tuple(terms),
    )


# ---------------------------------------------------------------------------
# the runtime's own footprint before the weights load
# ---------------------------------------------------------------------------

SINGLE_RANK_RUNTIME_BYTES = 1 * GiB
"""Estimate of what one rank's CUDA context, torch and library workspaces take before the weights (no
torch.distributed communicators): kvpools' estimate, not a citable measurement; override with
``runtime_memory`` / ``--runtime-memory``."""

DISTRIBUTED_RUNTIME_BYTES = 3 * GiB
"""What a rank of a TP/PP group holds before the weights, context and NCCL/custom all-reduce buffers
included: SGLang logs 'Load weight begin. avail mem=137.34 GB' on TP0 of an 8 x H200 server
(github.com/sgl-project/sglang/pull/11716), 3.06 GiB below the 143771 MiB total, and 'avail mem=12.25 GB,
mem usage=125.65 GB' at the end of the load (137.90 GiB before it, 2.50 GiB below the total;
github.com/SemiAnalysisAI/InferenceX/issues/2128).  kvpools takes 3 GiB."""


def default_runtime_bytes(serving: Serving) -> int:
    """The runtime footprint before the weights that a GPU plan assumes unless told (see the two constants)."""
    return DISTRIBUTED_RUNTIME_BYTES if serving.tp_size * serving.pp_size > 1 else SINGLE_RANK_RUNTIME_BYTES
