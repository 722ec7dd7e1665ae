"""The memory vLLM keeps outside the KV cache, estimated from the GPU and the model alone (issue 34).

``budget.available_kv_cache_memory`` subtracts what vLLM's profile run measured outside the KV cache from
``ceil(total x --gpu-memory-utilization)``; a planner that starts from the GPU has no profile run, so this module
estimates each term.  Every term is a formula with the vLLM source lines it follows; the constants a formula cannot
give (the non-torch memory: CUDA workspaces and NCCL buffers; the CUDA-graph bytes) are calibrated **per engine
version** in ``profiles/vllm-<version>.json``, which says what they were fitted on.  The activation peak has no
calibrated constant: its terms are the tensors the cited lines allocate, sized from the model's config
(:class:`ModelShape`).  A version with no
profile is refused unless the caller names the profile to borrow, and the estimate then says so.

The terms of ``Worker.determine_available_memory`` (vLLM 0.33 ``v1/worker/gpu_worker.py`` L641-757):

* ``requested_memory = ceil(total_memory x gpu_memory_utilization)`` (``v1/worker/utils.py`` L724), where
  ``total_memory`` is ``torch.cuda.mem_get_info()[1]``: :func:`torch_total_memory`.
* ``non_kv_cache_memory = total_consumed + transient_peak_headroom`` (``utils/mem_utils.py`` L312-321):
  the weights, the non-torch increase since the worker's first snapshot (:func:`non_torch_memory`) and the torch
  peak of ``profile_run`` above the weights (:func:`activation_peak`).
* the CUDA-graph estimate, subtracted only where ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is on
  (vLLM 0.33 ``envs.py`` L2219 defaults it to 1; the vLLM 0.19 logs show it off).

kvpools does not copy vLLM code: the formulas below restate what the cited lines allocate.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.parts.device_memory import TotalMemory, torch_total_memory
from kvpools_core.pipeline.gpus import (
    VLLM_VISION_GEMMA4,
    VLLM_VISION_LLAMA4,
    VLLM_VISION_PIXTRAL,
    VLLM_VISION_QWEN3,
    VLLM_VISION_SIGLIP,
)
from kvpools_core.values import GPU

if TYPE_CHECKING:
    from kvpools_core.registry import Registry

GiB = 1 << 30
MiB = 1 << 20

SORT_BYTES_PER_LOGIT = 12
"""Bytes per logit alive at the dummy sampler run's peak from vLLM 0.17 on (profiles ``vllm-0.19``, ``vllm-0.33``).

``_dummy_sampler_run`` (0.33 ``gpu_model_runner.py`` L5866-5900) samples ``max_num_seqs`` rows of the whole
vocabulary with ``top_k = vocab - 1`` and ``top_p = 0.9``.  From vLLM 0.17.0 ``apply_top_k_top_p`` masks a batch of 8
rows or more in place with a Triton kernel (0.17.0 ``v1/sample/ops/topk_topp_sampler.py`` L245-255,
``topk_topp_triton.py`` L947-1001: one ``[min(SMs, rows), vocab]`` scratch buffer, not per row), so the peak is at
``random_sample``: the fp32 logits (4 B, ``sampler.py`` L90), their softmax (4 B) and the exponential noise ``q``
(4 B, ``torch.empty_like(probs)``).  Fitted, the Llama-3.1-8B and CodeLlama-7b rows of vLLM 0.19 give 12.2 B per
logit (``vllm-0.19.json``)."""

SORT_PATH_BYTES_PER_LOGIT = 36
"""Bytes per logit alive at the dummy sampler run's peak in vLLM 0.15 / 0.16 (profile ``vllm-0.16``), where
``apply_top_k_top_p`` always sorts (0.16.0 ``v1/sample/ops/topk_topp_sampler.py`` L243-283; the FlashInfer sampler is
opt-in, ``VLLM_USE_FLASHINFER_SAMPLER``, L35-62, so ``forward_native`` runs).  The peak is inside
``logits.sort(dim=-1)``: torch's CUDA sort of ``rows >= 128`` segments (``aten/src/ATen/native/cuda/SortStable.cu``
``segmented_sort_pairs``) holds, per logit, the fp32 logits (4 B) being sorted, the sorted values (4 B) and int64
indices (8 B) it returns, an int64 ``reverse_indices`` input (8 B) and cub's ``DeviceSegmentedRadixSort::SortPairs``
alternate key and value buffers (4 + 8 B, ``dispatch_radix_sort.cuh``: ``is_overwrite_okay`` false):
4 + 12 + 8 + 12 = 36 B.  After the sort (masks 1 + 1 B, softmax 4 B, the out-of-place ``scatter`` 4 B, L262-283)
fewer bytes are alive.  The rest of the peak is the same ``sampler_base`` as vLLM 0.19 (same ``_dummy_sampler_run``,
0.16.0 ``gpu_model_runner.py`` L4944-4986)."""


@attrs.frozen(kw_only=True)
class Term:
    """One term of the non-KV memory: its bytes, the formula that gave them, and where the formula comes from."""

    name: str
    bytes: int
    formula: str
    source: str


@attrs.frozen(kw_only=True)
class RuntimeProfile:
    """One vLLM version's calibrated constants (``profiles/vllm-<version>.json``)."""

    version: str
    non_torch_bytes_by_tp: tuple[tuple[int, int], ...]
    non_torch_pp_bytes: int
    cudagraph_subtracted: bool
    default_max_num_seqs: int
    default_max_num_batched_tokens: int
    fitted_on: str
    file: str
    sampler_bytes_per_logit: int = SORT_BYTES_PER_LOGIT
    """Bytes per sampled logit at the dummy sampler run's peak (:data:`SORT_BYTES_PER_LOGIT`, or
    :data:`SORT_PATH_BYTES_PER_LOGIT` before vLLM 0.17)."""
    covers: tuple[str, ...] = ()
    """The vLLM versions (``major.minor``) the profile stands for."""
    sampler_program_buffer: bool = True
    """Whether ``apply_top_k_top_p_triton`` keeps its per-program fp32 buffer in ``_TRITON_BUFFER_CACHE`` (vLLM 0.17
    on; the sort path of 0.15 / 0.16 has none)."""
    moe_workspace: bool = True
    """Whether the fused-MoE Triton experts take their buffers from the persistent ``WorkspaceManager``
    (:func:`moe_workspace_bytes`)."""
    flashinfer_workspace_scales: bool = False
    """Whether the FlashInfer attention builder sizes its float workspace to the prefill chunk, ``max(394 MiB,
    max_num_batched_tokens x heads x head_dim x 16)`` (vLLM 0.26.0 on), instead of the fixed 394 MiB (0.20-0.25):
    :func:`flashinfer_workspace_bytes`."""
    gdn_prefill_checkpoint: bool = True
    """Whether vLLM's Gated DeltaNet layers export a prefill checkpoint on FlashInfer's 64-token grid (vLLM 0.33.0
    on: blocks a multiple of 64 tokens and ``2 + 1`` Mamba blocks a request), or not (before 0.33: blocks on the
    attention kernel's 16-token grid, 2 Mamba blocks a request): :func:`kvpools_core.engines.vllm.layouts`."""
    cudagraph: CudaGraphConstants | None = None
    """The calibrated constants of :func:`cudagraph_memory` (None where ``cudagraph_subtracted`` is false)."""
    mamba2_prefill_checkpoint: bool = True
    """Whether vLLM's Mamba2 layers (``MambaMixer2``) declare one prefill checkpoint block a request (vLLM 0.32.0 on:
    ``2 + 1`` Mamba blocks a request in ``align`` mode), or none (before 0.32: 2):
    :func:`kvpools_core.engines.vllm.layouts`."""
    hybrid_prefix_caching_default: bool = True
    """Whether ``vllm serve`` turns prefix caching on for a hybrid (Mamba / linear-attention) model by default (vLLM
    0.26.0 on, ``ModelConfig.is_prefix_caching_supported``); before it only ``--enable-prefix-caching`` does, and
    without it vLLM runs ``mamba_cache_mode`` ``"none"``, which kvpools does not model: the plan is the ``align``
    layout the flag gives, and says so."""
    mamba_cache_mode_all: bool = False
    """Whether a model whose Mamba layers support prefix caching (vLLM's Mamba1 / Mamba2 families: Nemotron-H, Jamba,
    Falcon-H1, Granite-4.0-H) takes ``mamba_cache_mode`` ``"all"`` under prefix caching (vLLM up to 0.27; ``align``
    from 0.28.0): not modelled, such a plan is refused (:func:`kvpools_core.engines.vllm.layouts`)."""
    default_gpu_memory_utilization: float = 0.92
    """``CacheConfig.gpu_memory_utilization``'s default: 0.9 up to vLLM 0.19, 0.92 from 0.20.0."""
    batch_defaults_160gib: bool = True
    """Whether ``vllm serve``'s batch defaults have the ``>= 160 GiB`` tier (16384 tokens / 1024 sequences, vLLM
    0.28.0 on); before it such a GPU takes the ``>= 70 GiB`` one (8192 / 1024):
    :func:`kvpools_core.engines.vllm.deployment.server_defaults`."""
    blackwell_capture_1024: bool = True
    """Whether the default CUDA-graph capture ceiling is 1024 on a data-center Blackwell (device capability family 100;
    vLLM 0.28.0 on, ``config/vllm.py`` L1936-1940), where earlier releases cap every GPU at ``min(max_num_seqs x 2,
    512)`` (0.27.1 L1831-1835): :func:`cudagraph_capture_sizes`."""
    pixtral_dense_block_mask: bool = False
    """Whether Pixtral's vision tower builds the dense ``[patches, patches]`` block mask: without xformers (which vLLM
    does not install, 0.19.0 ``pixtral.py`` L88-98) ``PixtralHFVisionModel.forward`` takes transformers'
    ``generate_block_attention_mask`` (0.17.0 L1332-1344, 0.18.0 L1239-1251, 0.19.0 L1285-1294, 0.20.0 to 0.28.0
    L1433-1445; 0.15 / 0.16 taken as 0.17's); from vLLM 0.29.0 it packs the images for ``MMEncoderAttention`` with
    ``cu_seqlens`` instead (0.29.0 ``pixtral.py`` L1511-1527, 0.33 L1615-1631): no mask."""
    blackwell_head256_block_32: bool = False
    """Whether a hybrid's attention block aligns to 32 tokens, not 16, on a data-center Blackwell (device capability
    family 100) when the attention head size is 256 (vLLM 0.15-0.17: ``HybridAttentionMambaModelConfig`` with no
    ``--attention-backend`` or FlashInfer, 0.17.0 ``model_executor/models/config.py`` L469-480, flashinfer-ai/flashinfer
    #1993; 0.18.0 L149 aligns to 16 on every GPU): :func:`kvpools_core.engines.vllm.layouts`."""


PROFILE_VERSIONS = ("0.16", "0.17", "0.19", "0.24", "0.26", "0.28", "0.29", "0.32", "0.33")
"""The vLLM versions that have a calibrated profile (``profiles/vllm-<version>.json``): one file per range of
releases whose modelled behaviour is the same (each file's ``covers``)."""

PROFILE_ALIASES = {
    "0.15": "0.16",
    "0.18": "0.19",
    "0.20": "0.24",
    "0.21": "0.24",
    "0.22": "0.24",
    "0.23": "0.24",
    "0.25": "0.24",
    "0.27": "0.26",
    "0.30": "0.29",
    "0.31": "0.29",
}
"""Versions another version's profile stands for (that file's ``covers``): vLLM 0.15 runs the same sort-based dummy
sampler as 0.16; 0.18 is 0.19 (``vllm-0.19.json``: every switch read in the 0.18.0 wheel; 0.17 has its own file,
``vllm-0.17.json``, for what 0.18.0 changed: the CUDA-graph profiling inside the memory window and the hybrid block
alignment on a Blackwell); 0.20-0.25 subtract the CUDA-graph estimate, keep the fixed 394 MiB FlashInfer workspace
and lay hybrids out without prefill checkpoints (``vllm-0.24.json``); 0.27 is 0.26 (``vllm-0.26.json``: the
workspace sized to the prefill chunk); 0.30 and 0.31 are 0.29 (``vllm-0.29.json``: Pixtral without the dense block
mask).  Each file's notes cite the lines of every release it covers (wheels read one by one)."""


def _gib(value: Any, name: str, file: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"{file}: {name} must be a non-negative number of GiB, got {value!r}.")
    return round(value * GiB)


def version_key(version: str) -> str:
    """``"0.19"`` of ``"vllm==0.19.0"``, ``"0.19.0"`` or ``"0.19"``."""
    return ".".join(str(version).strip().removeprefix("vllm==").split(".")[:2])


def installed_vllm_version() -> str | None:
    """The vLLM installed beside kvpools (``importlib.metadata``), or None."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def _older_or_newer(profile: str, installed: str) -> str:
    def parts(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in version_key(text).split(".") if part.isascii() and part.isdigit())

    return "older than" if parts(profile) < parts(installed) else "newer than"


def load_profile(version: str) -> RuntimeProfile:
    """The calibrated profile of vLLM ``version`` (``0.19``, ``0.19.0`` or ``vllm==0.33``); refuses a version
    without one."""
    key = PROFILE_ALIASES.get(version_key(version), version_key(version))
    if key not in PROFILE_VERSIONS:
        known = ", ".join(sorted({*PROFILE_VERSIONS, *PROFILE_ALIASES}))
        raise ConfigError(
            f"kvpools has no calibrated runtime-memory profile for vLLM {version!r} (profiles: {known}). Pass the "
            f"logged budget instead (--memory, or --weights-memory with the profile of a version named "
            f"explicitly), or calibrate one from that version's start-up logs."
        )
    file = f"vllm-{key}.json"
    data = json.loads(resources.files(__package__).joinpath("profiles").joinpath(file).read_text(encoding="utf-8"))
    by_tp = tuple(
        sorted(
            (int(tp), _gib(value, f"non_torch_gib_by_tp[{tp}]", file))
            for tp, value in data["non_torch_gib_by_tp"].items()
        )
    )
    return RuntimeProfile(
        version=key,
        non_torch_bytes_by_tp=by_tp,
        non_torch_pp_bytes=_gib(data["non_torch_pp_gib"], "non_torch_pp_gib", file),
        cudagraph_subtracted=bool(data["cudagraph_subtracted"]),
        cudagraph=_cudagraph_constants(data, file),
        default_max_num_seqs=int(data["default_max_num_seqs"]),
        default_max_num_batched_tokens=int(data["default_max_num_batched_tokens"]),
        fitted_on=str(data["fitted_on"]["data"]),
        file=file,
        sampler_bytes_per_logit=int(data.get("sampler_bytes_per_logit", SORT_BYTES_PER_LOGIT)),
        covers=tuple(str(version) for version in data.get("covers", [key])),
        sampler_program_buffer=bool(data.get("sampler_program_buffer", True)),
        moe_workspace=bool(data.get("moe_workspace", True)),
        flashinfer_workspace_scales=bool(data.get("flashinfer_workspace_scales", False)),
        gdn_prefill_checkpoint=bool(data.get("gdn_prefill_checkpoint", True)),
        mamba2_prefill_checkpoint=bool(data.get("mamba2_prefill_checkpoint", True)),
        hybrid_prefix_caching_default=bool(data.get("hybrid_prefix_caching_default", True)),
        mamba_cache_mode_all=bool(data.get("mamba_cache_mode_all", False)),
        default_gpu_memory_utilization=_utilization(data.get("default_gpu_memory_utilization", 0.92), file),
        batch_defaults_160gib=bool(data.get("batch_defaults_160gib", True)),
        blackwell_capture_1024=bool(data.get("blackwell_capture_1024", True)),
        pixtral_dense_block_mask=bool(data.get("pixtral_dense_block_mask", False)),
        blackwell_head256_block_32=bool(data.get("blackwell_head256_block_32", False)),
    )


@attrs.frozen(kw_only=True)
class CudaGraphConstants:
    """A profile's calibrated constants of :func:`cudagraph_memory` (``cudagraph_*`` in ``vllm-<version>.json``)."""

    piecewise_first_bytes: int
    """The PIECEWISE first capture's part that does not scale with the MLP (``cudagraph_piecewise_first_mib``)."""
    piecewise_first_per_mlp_output: float
    """The PIECEWISE first capture's bytes per byte of one MLP up-projection output at the largest capture size
    (``cudagraph_piecewise_first_per_mlp_output``)."""
    piecewise_layer_bytes: float
    """A PIECEWISE graph's own memory per decoder layer (``cudagraph_piecewise_per_graph_mib_per_layer``)."""
    full_layer_bytes: float
    """A FULL graph's own memory per decoder layer (``cudagraph_full_per_graph_mib_per_layer``)."""


_CUDAGRAPH_FIELDS = (
    "cudagraph_piecewise_first_mib",
    "cudagraph_piecewise_first_per_mlp_output",
    "cudagraph_piecewise_per_graph_mib_per_layer",
    "cudagraph_full_per_graph_mib_per_layer",
)


def _cudagraph_constants(data: dict[str, Any], file: str) -> CudaGraphConstants | None:
    if not data["cudagraph_subtracted"]:
        return None
    values = []
    for name in _CUDAGRAPH_FIELDS:
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigError(
                f"{file}: {name} must be a non-negative number (the profile subtracts the CUDA-graph estimate), "
                f"got {value!r}."
            )
        values.append(float(value))
    first, per_output, piecewise, full = values
    return CudaGraphConstants(
        piecewise_first_bytes=round(first * MiB),
        piecewise_first_per_mlp_output=per_output,
        piecewise_layer_bytes=piecewise * MiB,
        full_layer_bytes=full * MiB,
    )


def _utilization(value: Any, file: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigError(f"{file}: default_gpu_memory_utilization must be in (0, 1], got {value!r}.")
    return float(value)


PIPELINE_STAGES = ("last", "first", "middle")
"""A pipeline stage as the profile run sees it: the ``last`` samples (``get_pp_group().is_last_rank``), every stage but
the ``first`` receives its input into ``make_empty_intermediate_tensors`` buffers."""

H100_SMS = 132
"""Streaming multiprocessors of an H100 SXM, taken for a GPU :data:`SM_COUNTS` does not list."""

SM_COUNTS = {
    "h100": 132,
    "h100-nvl": 132,
    "h100-pcie": 114,
    "h200": 132,
    "gh200": 132,
    "a100-80gb": 108,
    "a100-40gb": 108,
    "l40s": 142,
    "rtx-6000-ada": 142,
    "l4": 58,
    "rtx-4090": 128,
    "rtx-3090": 82,
    "rtx-5090": 170,
}
"""``torch.cuda.get_device_properties().multi_processor_count`` per catalogue GPU (NVIDIA's product specifications):
the row count of the top-k/top-p kernel's cached buffer (:func:`sampler_program_buffer_bytes`)."""


CUBLAS_WORKSPACE_BYTES = 4096 * 8 * 1024
"""torch's default cuBLAS workspace on compute capability 9.x, 10.x and 12.x (``CUBLAS_WORKSPACE_CONFIG`` unset:
``aten/src/ATen/cuda/CublasHandlePool.cpp`` ``getChosenWorkspaceSize``, "32MiB for Hopper and Blackwell"; vLLM 0.19
pins torch 2.10, ``requirements/cuda.txt`` L7), 32 MiB.  ``getNewWorkspace`` takes it from the caching allocator at
the first matmul on a (handle, stream), which is the profile run's, so it is in the torch peak."""

CUBLAS_WORKSPACE_OLDER_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
"""torch's ``:4096:2:16:8`` default cuBLAS workspace on other GPUs (Ampere, Ada): 8.125 MiB."""


def cublas_workspace_bytes(compute_capability: tuple[int, int] | None) -> int:
    """torch's default cuBLAS workspace on a GPU of ``compute_capability`` (the H100's when not catalogued)."""
    if compute_capability is None or compute_capability[0] in (9, 10, 12):
        return CUBLAS_WORKSPACE_BYTES
    return CUBLAS_WORKSPACE_OLDER_BYTES


def _size(minimum: int) -> Any:
    def check(inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"ModelShape.{attribute.name} must be an integer >= {minimum}, got {value!r}.")

    return check


MOE_QUANT_SCHEMES = ("", "fp8", "fp8-static", "fp8-block", "nvfp4", "nvfp4-a16", "mxfp4", "wna16", "other")
"""The routed experts' quantisation schemes :func:`moe_workspace_bytes` tells apart: "" unquantised (bf16 / fp16),
"fp8" (per-tensor FP8 weights, dynamic per-tensor activation scales: ``Fp8Config``'s default), "fp8-static"
(per-tensor FP8 weights and static per-tensor activation scales: ModelOpt FP8, ``activation_scheme: static``),
"fp8-block" (128 x 128 block-scaled FP8 weights, dynamic per-group activations, DeepSeek-style), "nvfp4" (NVFP4
weights and activations, W4A4), "nvfp4-a16" (NVFP4 weights, 16-bit activations: ModelOpt ``W4A16_NVFP4``,
compressed-tensors' weight-only FP4), "mxfp4" (gpt-oss), "wna16" (AWQ / GPTQ / compressed-tensors int4 or int8
weight-only), "other" (anything else: the Triton experts' workspace is kept)."""

_SCHEME_OF_METHOD = {
    "mxfp4": "mxfp4",
    "modelopt_fp4": "nvfp4",
    "awq": "wna16",
    "awq_marlin": "wna16",
    "gptq": "wna16",
    "gptq_marlin": "wna16",
    "fp8": "fp8",
}
"""The schemes a ``quant_method`` names without the rest of its ``quantization_config``."""


def _moe_scheme(inst: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and value not in MOE_QUANT_SCHEMES:
        raise ConfigError(
            f"ModelShape.{attribute.name} must be None or one of {', '.join(map(repr, MOE_QUANT_SCHEMES))}, got "
            f"{value!r}."
        )


@attrs.frozen(kw_only=True)
class ModelShape:
    """The model sizes the profile run's tensors depend on (a ``config.json``'s, :func:`model_shape_of`)."""

    hidden_size: int = attrs.field(validator=_size(1))
    dense_intermediate_size: int = attrs.field(default=0, validator=_size(0))
    """The widest non-expert MLP: the dense layers' ``intermediate_size``, else the shared experts' width, else 0."""
    num_experts_per_tok: int = attrs.field(default=0, validator=_size(0))
    """0 for a dense model."""
    moe_intermediate_size: int = attrs.field(default=0, validator=_size(0))
    """One routed expert's width (``moe_intermediate_size``, Mixtral's ``intermediate_size``)."""
    dtype_bytes: int = attrs.field(default=2, validator=attrs.validators.in_((2, 4)))
    """The activations' bytes per value: 2 for bfloat16 / float16, 4 for float32 (``--dtype``)."""
    num_attention_heads: int = attrs.field(default=0, validator=_size(0))
    """The attention layers' query heads (``num_attention_heads``); 0 when not known."""
    head_dim: int = attrs.field(default=0, validator=_size(0))
    """The attention layers' head size (``head_dim``, else ``hidden_size / num_attention_heads``); 0 for an MLA
    model (``kv_lora_rank``: vLLM's MLA backends, not FlashInfer's paged attention) or when not known."""
    quant_method: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    """The checkpoint's ``quantization_config.quant_method`` (lower case; "" unquantised), which picks vLLM's MoE
    kernel (:func:`moe_workspace_bytes`)."""
    moe_quant: str | None = attrs.field(default=None, validator=_moe_scheme)
    """The routed experts' quantisation scheme (:data:`MOE_QUANT_SCHEMES`, :func:`moe_quant_scheme`); None: read
    off ``quant_method`` alone (:attr:`experts_scheme`)."""

    @property
    def experts_scheme(self) -> str:
        """``moe_quant``, else the scheme ``quant_method`` names by itself ("other" where it needs the rest of the
        ``quantization_config``, or names a method whose MoE kernels kvpools does not tell apart)."""
        if self.moe_quant is not None:
            return self.moe_quant
        return _SCHEME_OF_METHOD.get(self.quant_method, "other" if self.quant_method else "")

    @property
    def is_moe(self) -> bool:
        return self.num_experts_per_tok > 0 and self.moe_intermediate_size > 0


def sampler_program_buffer_bytes(*, rows: int, vocab_size: int, sm_count: int) -> int:
    """The fp32 ``[min(next_power_of_2(programs), SMs), vocab]`` buffer ``apply_top_k_top_p_triton`` keeps in
    ``_TRITON_BUFFER_CACHE`` for the rest of the process, ``programs = min(SMs, rows)`` (vLLM 0.19
    ``v1/sample/ops/topk_topp_triton.py`` L1010-1019, 0.33 L1692-1696): alive at the sampler's peak."""
    programs = min(sm_count, rows)
    return min(1 << (programs - 1).bit_length(), sm_count) * vocab_size * 4


MONOLITHIC_MXFP4_CAPABILITIES = ((9, 0), (11, 0))
"""The CUDA compute capabilities ``[low, high)`` on which vLLM runs an mxfp4 checkpoint's experts with a monolithic
kernel.  vLLM 0.19.0 ``fused_moe/oracle/mxfp4.py``: ``_get_priority_backends`` (L169-183) tries
FLASHINFER_TRTLLM_MXFP4_BF16 (``TrtLlmMxfp4ExpertsMonolithic`` first, L80-91; SM 10.x with FlashInfer,
``experts/trtllm_mxfp4_moe.py`` L78-81), then TRITON (``[OAITritonMxfp4ExpertsMonolithic, OAITritonExperts]``,
monolithic first, L103-110; SM 9.0 up to 11.0, ``gpt_oss_triton_kernels_moe.py`` L887-896); a monolithic class
that fits is taken (L345-352).  vLLM 0.33 (``_get_priority_backends_for_gpt_oss``, L402-436; ``experts/
gpt_oss_triton_kernels_moe.py`` L41-53, L1525) the same on SM 9.0 and 10.x; SM 12.x and Ampere / Ada fall to
Marlin (the modular ``MarlinExperts``)."""


MOE_BACKEND_NOT_MODELLED = ("HUMMING", "VLLM_CUTLASS", "DEEPGEMM", "other")
"""Backends :func:`vllm_moe_backend` names whose ``workspace_shapes`` kvpools does not reproduce: the Triton experts'
workspace is charged for them (``moe_workspace_bytes`` says so in the activation term's formula)."""


def vllm_moe_backend(scheme: str, capability: tuple[int, int]) -> str:
    """The fused-MoE backend vLLM 0.33 picks on CUDA for experts of ``scheme`` (:data:`MOE_QUANT_SCHEMES`) on a GPU
    of ``capability``, with default environment variables, no LoRA, no expert / data parallelism and the packages of
    vLLM's container (FlashInfer, and ``humming-kernels``, a requirement of the 0.33 wheel).  Each oracle tries its
    backends in order and takes the first whose ``is_supported_config`` (``modular_kernel.py`` L580-633: device,
    quantisation scheme, activation, routing) holds; paths are under ``model_executor/layers/fused_moe/``.

    * unquantised (``oracle/unquantized.py`` L69-80, L359-366): FLASHINFER_TRTLLM, FLASHINFER_CUTLASS, TRITON, with
      both FlashInfer ones moved behind TRITON on SM 9.x.  SM 10.x: FlashInfer TRT-LLM's monolithic kernel
      (``experts/trtllm_bf16_moe.py`` L98-101 family 100; ``TrtLlmBf16ExpertsMonolithic`` L244-271, L118-121: SiLU, the
      Renormalize / DeepSeek-V3 / Llama-4 / sigmoid routings); SM 12.x: FLASHINFER_CUTLASS
      (``experts/flashinfer_cutlass_moe.py`` L128-138: SM 9.0, families 100 and 120, not SM 11.0; L155-161
      unquantised from 9.0); else TRITON.  A SWIGLUOAI model (gpt-oss in bf16) moves FlashInfer behind TRITON
      (L92-94): not told apart.
    * FP8 (``oracle/fp8.py`` L88-104: AITER (ROCm), FLASHINFER_TRTLLM, FLASHINFER_CUTLASS, DEEPGEMM, VLLM_CUTLASS
      (only where the method allows it: not ``Fp8Config``, ``quantization/fp8.py`` L523-528, nor ModelOpt's),
      TRITON, MARLIN).  "fp8" (dynamic per-tensor): no FlashInfer kernel takes dynamic per-tensor scales
      (``experts/trtllm_fp8_moe.py`` L378-390, ``flashinfer_cutlass_moe.py`` L155-170) and DeepGEMM is block-only,
      so TRITON from SM 8.9 (``experts/triton_moe.py`` L159-166, ``supports_fp8``), MARLIN below (``marlin_moe.py``
      L601-620).  "fp8-static": SM 10.x FlashInfer TRT-LLM's monolithic kernel (L386, L399-431), SM 9.0 / 12.x
      FLASHINFER_CUTLASS (L155-161), else TRITON / MARLIN.  "fp8-block": SM 9.0 TRITON, moved ahead of the
      FlashInfer and DeepGEMM backends for TP (``oracle/fp8.py`` L122-132); SM 10.x FlashInfer TRT-LLM's
      monolithic kernel; SM 12.x DEEPGEMM where the ``deep_gemm`` package is installed (``TritonOrDeepGemmExperts``,
      ``utils/deep_gemm.py`` L113-118, ``platforms/cuda.py`` L691-697; its workspace is not modelled), else TRITON /
      MARLIN.
    * "nvfp4" (``oracle/nvfp4.py`` L203-212, L304-316): FLASHINFER_TRTLLM, FLASHINFER_CUTEDSL(_BATCHED),
      FLASHINFER_CUTLASS, VLLM_CUTLASS, MARLIN (HUMMING ahead of MARLIN on SM 9.0: ``quantization/utils/humming/
      priority.py`` L11-23).  SM 10.x: ``TrtLlmNvFp4ExpertsMonolithic`` (``experts/trtllm_nvfp4_moe.py`` L203-211,
      L477-508); SM 12.x: FLASHINFER_CUTLASS (the TRT-LLM and CuTe-DSL kernels need family 100,
      ``experts/flashinfer_cutedsl_moe.py`` L88-94; ``flashinfer_cutlass_moe.py`` L172-180 takes NVFP4 W4A4 from
      capability 10.0); SM 11.x: VLLM_CUTLASS (``experts/cutlass_moe.py`` L716-733); SM 9.0: HUMMING; below: MARLIN
      (``experts/marlin_moe.py`` L592-595 from SM 7.5).
    * "nvfp4-a16": the same oracle with no activation key (``quantization/modelopt.py`` L857-858 for
      ``W4A16_NVFP4``): every FlashInfer and vLLM CUTLASS kernel wants NVFP4 activations (``flashinfer_cutlass_moe.py``
      L172-180, ``flashinfer_cutedsl_moe.py`` L104-109, ``cutlass_moe.py`` L729-733); MARLIN takes any activation
      (``marlin_moe.py`` L601-620): MARLIN, HUMMING on SM 9.0.
    * "mxfp4": :data:`MONOLITHIC_MXFP4_CAPABILITIES` (monolithic), else MARLIN.
    * "wna16" (``oracle/int_wna16.py`` L126-143): FLASHINFER_TRTLLM (SM 10.x, only group-32 symmetric int4 without
      zero points, ``experts/trtllm_mxint4_moe.py``: AWQ / GPTQ checkpoints are group 128), MARLIN; HUMMING on SM
      9.0.
    * "other": kvpools does not tell the backend apart."""
    major = capability[0]
    if scheme == "":
        if major == 10:
            return "FLASHINFER_TRTLLM (monolithic)"
        return "FLASHINFER_CUTLASS" if major == 12 else "TRITON"
    if scheme in ("fp8", "fp8-static", "fp8-block"):
        if scheme != "fp8" and major == 10:
            return "FLASHINFER_TRTLLM (monolithic)"
        if scheme == "fp8-static" and (capability == (9, 0) or major == 12):
            return "FLASHINFER_CUTLASS"
        if scheme == "fp8-block" and major == 12:
            return "DEEPGEMM"
        return "TRITON" if capability >= (8, 9) else "MARLIN"
    if scheme == "mxfp4":
        low, high = MONOLITHIC_MXFP4_CAPABILITIES
        return "monolithic" if low <= capability < high else "MARLIN"
    if scheme in ("nvfp4", "nvfp4-a16", "wna16"):
        if scheme == "nvfp4" and major == 10:
            return "FLASHINFER_TRTLLM (monolithic)"
        if scheme == "nvfp4" and major == 12:
            return "FLASHINFER_CUTLASS"
        if scheme == "nvfp4" and major == 11:
            return "VLLM_CUTLASS"
        return "HUMMING" if capability == (9, 0) else "MARLIN"
    return "other"


def moe_workspace_bytes(
    *, shape: ModelShape, tokens: int, tp_size: int = 1, compute_capability: tuple[int, int] | None = None
) -> int:
    """The modular fused-MoE kernel's workspace for ``tokens`` tokens, held by vLLM's ``WorkspaceManager``; 0 where
    vLLM runs a monolithic experts kernel, which allocates its buffers inside the kernel.  The backend is
    :func:`vllm_moe_backend`'s for ``shape``'s :attr:`ModelShape.experts_scheme` on ``compute_capability`` (None:
    the H100's, as the rest of the profile).

    ``_allocate_buffers`` (0.19 ``modular_kernel.py`` L1062-1067, 0.33 L1124-1220) takes ``workspace13`` (shared
    with the output, the larger of the two) and ``workspace2`` from ``get_simultaneous``, each rounded up to 256 B
    (0.33 ``v1/worker/workspace.py`` L181-207), in the activations' dtype (``workspace_dtype``, L864-866), and
    ``_ensure_workspace_size`` keeps the ``torch.empty`` for the process: unlike the dense MLP's temporaries it is
    still allocated when the sampler runs.  Per backend, with ``M = tokens``, ``K = hidden``, ``I =
    moe_intermediate / tp``:

    * TRITON: ``TritonExperts.workspace_shapes`` (0.19 ``fused_moe/fused_moe.py`` L1976-1991, 0.33
      ``experts/triton_moe.py`` L240-255), ``N = 2I``: ``workspace13 = (M, topk, max(I, K))`` against the ``(M,
      K)`` output, ``workspace2 = (M, topk, max(2I, K))``.
    * MARLIN: ``MarlinExperts.workspace_shapes`` (0.33 ``experts/marlin_moe.py`` L691-718, ``N = I`` from
      ``marlin_moe_intermediate_size``, L653-678; 0.19 ``fused_marlin_moe.py`` L666-696): ``(M x topk, max(I, K))``
      against ``(M, K)`` and ``(M x topk x max(2I, K),)``: the Triton experts' bytes.  For mxfp4 experts Marlin
      pads ``I`` to a multiple of 128 and the hidden size to 256 (0.33 ``oracle/mxfp4.py`` L865-870, through
      ``maybe_roundup_sizes``, ``quantization/mxfp4.py`` L183-197, ``routed_experts.py`` L171-184), and the runner
      pads the hidden states to it (``runner/moe_runner.py`` L530-557): ``I`` and ``K`` are the padded sizes.
    * FLASHINFER_CUTLASS: ``FlashInferExperts.workspace_shapes`` (0.33 ``experts/flashinfer_cutlass_moe.py``
      L208-243): ``workspace13 = (M, K')`` with ``K'`` the quantised input's last dimension (``hidden / 2`` packed
      for NVFP4, ``hidden`` unquantised), the output ``(M, 2K')`` for NVFP4, else ``(M, K')``, and no
      ``workspace2``: ``M x hidden`` values.  FlashInfer's own CUTLASS scratch is allocated per call inside its
      runner and freed.
    * monolithic (mxfp4 on SM 9.0-10.x, FLASHINFER_TRTLLM's monolithic kernels): ``FusedMoEKernelMonolithicImpl``
      (0.19 ``modular_kernel.py`` L1393-1500) never calls ``_allocate_buffers``: 0 (the vLLM 0.19.0 H100 log of
      gpt-oss-20b says "Using 'TRITON' Mxfp4 MoE backend" and "Using MoEPrepareAndFinalizeNoDPEPMonolithic").
    * HUMMING (SM 9.0's quantised-weight path: NVFP4, AWQ / GPTQ), VLLM_CUTLASS (NVFP4 on SM 11.x), DEEPGEMM
      (block FP8 on SM 12.x) and "other": not modelled; the Triton experts' workspace is charged.

    The routing vLLM's monolithic kernels need (``_supports_routing_method``) and the activation are taken as
    supported.  The backend is 0.33's for every profile: vLLM 0.24.0's NVFP4 oracle tries the same order
    (``oracle/nvfp4.py`` L165-173) and its ``MarlinExperts`` take the same shapes (``experts/marlin_moe.py``
    L711-741); the 0.19 oracles were not read beyond mxfp4's."""
    if not shape.is_moe:
        return 0
    capability = (9, 0) if compute_capability is None else compute_capability
    backend = vllm_moe_backend(shape.experts_scheme, capability)
    hidden, dtype = shape.hidden_size, shape.dtype_bytes
    if backend in ("monolithic", "FLASHINFER_TRTLLM (monolithic)"):
        return 0
    if backend == "FLASHINFER_CUTLASS":
        return _round_up(tokens * hidden * dtype, 256)
    inner = shape.moe_intermediate_size // tp_size
    topk = shape.num_experts_per_tok
    if backend == "MARLIN" and shape.experts_scheme == "mxfp4":
        inner, hidden = _round_up(inner, 128), _round_up(hidden, 256)
    common = max(tokens * topk * max(inner, hidden), tokens * hidden) * dtype
    second = tokens * topk * max(2 * inner, hidden) * dtype
    return _round_up(common, 256) + _round_up(second, 256)


VISION_TOWERS = (VLLM_VISION_QWEN3, VLLM_VISION_PIXTRAL, VLLM_VISION_SIGLIP, VLLM_VISION_LLAMA4, VLLM_VISION_GEMMA4)
"""The vision towers :func:`mm_encoder_profile` models, as the ``architecture_traits`` an architecture plugin gives
a Hugging Face class (the core names no architecture): vLLM 0.33's ``Qwen3_VisionTransformer`` (``qwen3_vl.py``
L561-870; ``qwen3_5.py`` L473 / L703 build it for Qwen3.5 / 3.6), ``PixtralHFVisionModel`` with the Mistral-3
projector (vLLM 0.19.0 ``pixtral.py`` L1198-1300, ``mistral3.py`` L75-170), ``SiglipVisionModel`` with the
Gemma-3 projector (0.19.0 ``siglip.py`` L285-570, ``gemma3_mm.py`` L420-460), vLLM 0.33's ``Llama4VisionModel``
with its pixel-shuffle adapter and projector (``mllama4.py`` L123-549, L765-777; the older profiles take 0.33's
pass, their ``mllama4.py`` not read) and Gemma-4's transformers ``AutoModel`` tower with ``Gemma4MultimodalEmbedder``
(0.33 ``gemma4_mm.py`` L1100-1113, L1272-1589; transformers :data:`GEMMA4_TRANSFORMERS`).  A multimodal class with
another tower is refused where its encoder pass would be profiled (:func:`unmodelled_vision_tower`)."""

UNMODELLED_VISION_TOWERS: tuple[str, ...] = ()
"""Vision-tower traits whose encoder pass kvpools does not model (none since Gemma-4's is, issue 34): such a trait
would name the tower's modalities (vLLM leaves its weights out when they are all 0) while
:func:`unmodelled_vision_tower` names the tower and the planner refuses its profile pass."""

GEMMA4_TRANSFORMERS = "5.20.2"
"""The transformers release whose Gemma-4 vision tower (``models/gemma4/modeling_gemma4.py``) the Gemma-4 encoder term
reads: the newest vLLM 0.33 accepts (its wheel's ``Requires-Dist: transformers<5.21.0,>=5.16.1``).  The releases it
accepts do not differ in what the term counts: 5.16.1, 5.17.0, 5.18.0 and 5.20.0 / 5.20.2 (one file) differ in the
tower only in how the rotary table is computed (``Gemma4VisionRotaryEmbedding``, small fp32 temporaries per position
before the layers), and all look the patch positions up with ``F.embedding`` (5.20.2 L596-616, 5.16.1 L590-610): the
``F.one_hot`` transient vLLM's ``_encoder_chunk`` prices (``gemma4_mm.py`` L1272-1303) is in none of them, so it only
sets the batch, not the peak."""

GEMMA4_DUMMY_IMAGE_SIDE = 224
"""The side of vLLM 0.33's dummy Gemma-4 image and video frame: ``Gemma4ImageProcessor.size`` is None (transformers
5.20.2 ``image_processing_gemma4.py`` L140), so ``get_dummy_mm_data`` falls back to 224 x 224 (``gemma4_mm.py``
L526-531); the processor then resizes it to its soft-token budget (:func:`gemma4_soft_tokens`).  A checkpoint whose
``preprocessor_config.json`` sets a ``size`` is not read (stated assumption)."""

GEMMA4_VIDEO_FRAMES = 32
"""``_VIDEO_MAX_FRAMES`` (vLLM 0.33 ``gemma4_mm.py`` L126): the dummy video's frames (L550-554) and the frames
``get_mm_max_tokens_per_item`` counts (L290-295; a ``num_frames`` video option below it is not modelled)."""

GEMMA4_VIDEO_SOFT_TOKENS = 70
"""``_VIDEO_MAX_SOFT_TOKENS`` (``gemma4_mm.py`` L125): each frame is processed as an image of this soft-token budget
(L662-673); a video item counts ``frames x (70 + 2 + 6)`` tokens (boi, eoi and the timestamp, L289-295): 2496."""

GEMMA4_AUDIO_SEQ_LENGTH = 750
"""``Gemma4Processor.audio_seq_length``'s default (transformers 5.20.2 ``processing_gemma4.py`` L62), an audio item's
tokens (``gemma4_mm.py`` L285-288) where the config has an ``audio_config``: the audio tower is not modelled, so a
plan whose profiled modality is audio is refused (a checkpoint's ``processor_config.json`` is not read)."""

LLAMA4_MAX_TILES = 16
"""``max_patches`` of the Llama-4 Scout / Maverick checkpoints' ``preprocessor_config.json``
(Llama4ImageProcessorFast; transformers' default too), which ``get_max_num_tiles`` reads (vLLM 0.33 ``mllama4.py``
L577-579): the dummy image is 16 tiles of ``image_size`` high and one wide (L581-585)."""

QWEN_VL_IMAGE_MAX_PIXELS = 16_777_216
"""``size.longest_edge`` of the Qwen3-VL / Qwen3.5 / Qwen3.6 checkpoints' ``preprocessor_config.json`` (4096 x 4096
pixels; Qwen2VLImageProcessorFast), which ``get_image_size_with_most_features`` reads (vLLM 0.33 ``qwen2_vl.py``
L1100-1110)."""

QWEN_VL_VIDEO_MAX_PIXELS = 25_165_824
"""``size.longest_edge`` of the same checkpoints' ``video_preprocessor_config.json`` (Qwen3VLVideoProcessor), which
``get_max_video_tokens`` halves for the temporal patch (vLLM 0.33 ``qwen3_vl.py`` L1040-1068)."""

DEFAULT_MM_LIMIT = 999
"""vLLM's ``limit_mm_per_prompt`` for a modality the option does not name (vLLM 0.33 ``config/multimodal.py``
``get_limit_per_prompt`` L696-709; 0 for every modality under ``--language-model-only``)."""


@attrs.frozen(kw_only=True)
class VisionShape:
    """A vision tower's sizes (``vision_config``), the tower it is (:data:`VISION_TOWERS`) and its processors' caps.

    ``out_hidden_size`` is the width of one encoder output token (the Qwen3-VL merger's ``out_hidden_size``; the
    text model's ``hidden_size`` for the Pixtral, SigLIP and Llama-4 towers, whose projectors map into it).
    ``image_size`` is the Pixtral / SigLIP native square image side (Llama-4's tile side) and ``image_tokens`` the
    Gemma-3 tokens per image (``mm_tokens_per_image``); the Qwen3-VL tower sizes its items from the pixel caps
    instead."""

    hidden_size: int = attrs.field(validator=_size(1))
    intermediate_size: int = attrs.field(validator=_size(1))
    num_heads: int = attrs.field(validator=_size(1))
    out_hidden_size: int = attrs.field(validator=_size(1))
    patch_size: int = attrs.field(validator=_size(1))
    temporal_patch_size: int = attrs.field(validator=_size(1))
    spatial_merge_size: int = attrs.field(validator=_size(1))
    in_channels: int = attrs.field(default=3, validator=_size(1))
    image_max_pixels: int = attrs.field(default=QWEN_VL_IMAGE_MAX_PIXELS, validator=_size(1))
    video_max_pixels: int = attrs.field(default=QWEN_VL_VIDEO_MAX_PIXELS, validator=_size(1))
    dtype_bytes: int = attrs.field(default=2, validator=attrs.validators.in_((2, 4)))
    tower: str = attrs.field(default=VLLM_VISION_QWEN3, validator=attrs.validators.in_(VISION_TOWERS))
    image_size: int = attrs.field(default=0, validator=_size(0))
    image_tokens: int = attrs.field(default=0, validator=_size(0))
    max_tiles: int = attrs.field(default=0, validator=_size(0))
    """Llama-4: the image processor's most tiles an image is cut into (:data:`LLAMA4_MAX_TILES`); 0 otherwise."""
    head_dim: int = attrs.field(default=0, validator=_size(0))
    """The attention head size where the config states it (Pixtral, Gemma-4), else ``hidden_size // num_heads``."""
    num_kv_heads: int = attrs.field(default=0, validator=_size(0))
    """Gemma-4: the key / value heads (``num_key_value_heads``); 0 for ``num_heads``."""
    position_embedding_size: int = attrs.field(default=0, validator=_size(0))
    """Gemma-4: the patch position table's length (``position_embedding_size``), which vLLM's batch bound reads."""
    audio_tokens: int = attrs.field(default=0, validator=_size(0))
    """Gemma-4 with an ``audio_config``: an audio item's tokens (:data:`GEMMA4_AUDIO_SEQ_LENGTH`); 0 without one."""

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads


def _ints(section: Any, keys: tuple[str, ...]) -> dict[str, int] | None:
    if not isinstance(section, dict):
        return None
    values = {key: section.get(key) for key in keys}
    if any(not isinstance(value, int) or isinstance(value, bool) or value < 1 for value in values.values()):
        return None
    return values  # type: ignore[return-value]


def _optional_int(section: dict[str, Any], key: str, default: int) -> int:
    value = section.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def _text_hidden(config: dict[str, Any]) -> int | None:
    text = config.get("text_config")
    found = _ints(text, ("hidden_size",))
    return found["hidden_size"] if found else None


_PROJECTED_TOWER_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "patch_size", "image_size")
"""The ``vision_config`` sizes a tower with a projector into the text model needs (Pixtral, SigLIP, Llama-4)."""


def _projected_tower(config: dict[str, Any], vision: dict[str, Any]) -> tuple[dict[str, int], int] | None:
    """A projected tower's :data:`_PROJECTED_TOWER_KEYS` and the text ``hidden_size`` its projector maps into; None
    when one is missing."""
    values = _ints(vision, _PROJECTED_TOWER_KEYS)
    text_hidden = _text_hidden(config)
    if values is None or text_hidden is None:
        return None
    return values, text_hidden


def _qwen3_vision(config: dict[str, Any], vision: dict[str, Any], dtype_bytes: int) -> VisionShape | None:
    keys = ("hidden_size", "intermediate_size", "num_heads", "out_hidden_size", "patch_size", "temporal_patch_size")
    values = _ints(vision, keys)
    if values is None:
        return None
    return VisionShape(
        hidden_size=values["hidden_size"],
        intermediate_size=values["intermediate_size"],
        num_heads=values["num_heads"],
        out_hidden_size=values["out_hidden_size"],
        patch_size=values["patch_size"],
        temporal_patch_size=values["temporal_patch_size"],
        spatial_merge_size=_optional_int(vision, "spatial_merge_size", 2),
        in_channels=_optional_int(vision, "in_channels", 3),
        dtype_bytes=dtype_bytes,
    )


def _pixtral_vision(config: dict[str, Any], vision: dict[str, Any], dtype_bytes: int) -> VisionShape | None:
    """``Mistral3Config``: the Pixtral ``vision_config`` (``num_attention_heads``, ``head_dim``, ``image_size``,
    ``num_channels``), the top-level ``spatial_merge_size`` (transformers' default 2) and the text ``hidden_size``
    the projector's ``linear_2`` outputs (vLLM 0.19.0 ``mistral3.py`` L125-170)."""
    found = _projected_tower(config, vision)
    if found is None:
        return None
    values, text_hidden = found
    return VisionShape(
        hidden_size=values["hidden_size"],
        intermediate_size=values["intermediate_size"],
        num_heads=values["num_attention_heads"],
        head_dim=_optional_int(vision, "head_dim", 0),
        out_hidden_size=text_hidden,
        patch_size=values["patch_size"],
        temporal_patch_size=1,
        spatial_merge_size=_optional_int(config, "spatial_merge_size", 2),
        in_channels=_optional_int(vision, "num_channels", 3),
        image_size=values["image_size"],
        dtype_bytes=dtype_bytes,
        tower=VLLM_VISION_PIXTRAL,
    )


def _siglip_vision(config: dict[str, Any], vision: dict[str, Any], dtype_bytes: int) -> VisionShape | None:
    """``Gemma3Config``: the SigLIP ``vision_config``, the top-level ``mm_tokens_per_image`` (transformers' default
    256) and the text ``hidden_size`` the projector's ``mm_input_projection_weight`` maps into (vLLM 0.19.0
    ``gemma3_mm.py`` L420-460)."""
    found = _projected_tower(config, vision)
    if found is None:
        return None
    values, text_hidden = found
    return VisionShape(
        hidden_size=values["hidden_size"],
        intermediate_size=values["intermediate_size"],
        num_heads=values["num_attention_heads"],
        out_hidden_size=text_hidden,
        patch_size=values["patch_size"],
        temporal_patch_size=1,
        spatial_merge_size=1,
        in_channels=_optional_int(vision, "num_channels", 3),
        image_size=values["image_size"],
        image_tokens=_optional_int(config, "mm_tokens_per_image", 256),
        dtype_bytes=dtype_bytes,
        tower=VLLM_VISION_SIGLIP,
    )


def _llama4_vision(config: dict[str, Any], vision: dict[str, Any], dtype_bytes: int) -> VisionShape | None:
    """``Llama4Config``: the ``vision_config`` (``num_attention_heads``, ``image_size`` the tile side, ``patch_size``,
    ``num_channels``, ``pixel_shuffle_ratio``) and the text ``hidden_size`` the projector's ``linear_1`` outputs
    (vLLM 0.33 ``mllama4.py`` L164-183).  The pixel shuffle keeps ``ratio^2`` of a tile's patches
    (``get_patch_per_chunk``, L564-575: ``ds_ratio = round(1 / ratio^2)``, 4 at 0.5), read as a ``spatial_merge_size``
    of ``sqrt(ds_ratio)``; a tile side not a multiple of the patch (vLLM asserts it) or a ratio whose ``ds_ratio`` is
    no square is no shape."""
    found = _projected_tower(config, vision)
    ratio = vision.get("pixel_shuffle_ratio", 0.5)
    if found is None or isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        return None
    values, text_hidden = found
    merge = math.isqrt(ds_ratio := round(1 / ratio**2))
    if merge * merge != ds_ratio or values["image_size"] % values["patch_size"]:
        return None
    return VisionShape(
        hidden_size=values["hidden_size"],
        intermediate_size=values["intermediate_size"],
        num_heads=values["num_attention_heads"],
        out_hidden_size=text_hidden,
        patch_size=values["patch_size"],
        temporal_patch_size=1,
        spatial_merge_size=merge,
        in_channels=_optional_int(vision, "num_channels", 3),
        image_size=values["image_size"],
        max_tiles=LLAMA4_MAX_TILES,
        dtype_bytes=dtype_bytes,
        tower=VLLM_VISION_LLAMA4,
    )


def _gemma4_vision(config: dict[str, Any], vision: dict[str, Any], dtype_bytes: int) -> VisionShape | None:
    """``Gemma4Config``: the ``vision_config`` (``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
    ``patch_size``, ``pooling_kernel_size`` read as the ``spatial_merge_size``, ``position_embedding_size``,
    ``default_output_length`` the soft tokens of an image) and the text ``hidden_size`` the embedder's
    ``embedding_projection`` maps into (vLLM 0.33 ``gemma4_mm.py`` L984-1022); an ``audio_config`` adds the audio
    modality (:data:`GEMMA4_AUDIO_SEQ_LENGTH` tokens).  The patch embedder's ``input_proj`` takes ``3 x patch^2``
    pixels (transformers 5.20.2 ``modeling_gemma4.py`` L593)."""
    keys = (
        "hidden_size",
        "intermediate_size",
        "num_attention_heads",
        "patch_size",
        "pooling_kernel_size",
        "position_embedding_size",
        "default_output_length",
    )
    values = _ints(vision, keys)
    text_hidden = _text_hidden(config)
    if values is None or text_hidden is None:
        return None
    audio = config.get("audio_config")
    return VisionShape(
        hidden_size=values["hidden_size"],
        intermediate_size=values["intermediate_size"],
        num_heads=values["num_attention_heads"],
        num_kv_heads=_optional_int(vision, "num_key_value_heads", values["num_attention_heads"]),
        head_dim=_optional_int(vision, "head_dim", 0),
        out_hidden_size=text_hidden,
        patch_size=values["patch_size"],
        temporal_patch_size=1,
        spatial_merge_size=values["pooling_kernel_size"],
        in_channels=3,
        image_tokens=values["default_output_length"],
        position_embedding_size=values["position_embedding_size"],
        audio_tokens=GEMMA4_AUDIO_SEQ_LENGTH if isinstance(audio, dict) and audio else 0,
        dtype_bytes=dtype_bytes,
        tower=VLLM_VISION_GEMMA4,
    )


_VISION_READERS = {
    VLLM_VISION_QWEN3: _qwen3_vision,
    VLLM_VISION_PIXTRAL: _pixtral_vision,
    VLLM_VISION_SIGLIP: _siglip_vision,
    VLLM_VISION_LLAMA4: _llama4_vision,
    VLLM_VISION_GEMMA4: _gemma4_vision,
}
"""How each modelled tower's :class:`VisionShape` is read from a ``config.json``."""


def vision_shape_from_config(
    config: dict[str, Any], *, dtype_bytes: int = 2, registry: Registry | None = None
) -> VisionShape | None:
    """The :class:`VisionShape` of a multimodal ``config.json`` whose class (``architectures``) an architecture
    plugin gives a vision-tower trait (:data:`VISION_TOWERS`, ``architecture_traits`` hook), None for a checkpoint
    without a ``vision_config``, with another vision tower (not modelled) or with sizes missing."""
    from kvpools_core.pipeline.gpus import architecture_traits

    vision = config.get("vision_config")
    classes = config.get("architectures")
    if not isinstance(vision, dict) or not isinstance(classes, list):
        return None
    traits = architecture_traits(registry)
    towers = {
        tower for name in classes if isinstance(name, str) for tower in traits.get(name, ()) if tower in VISION_TOWERS
    }
    if len(towers) != 1:
        return None
    return _VISION_READERS[towers.pop()](config, vision, dtype_bytes)


def vision_tower_of(config: dict[str, Any], *, registry: Registry | None = None) -> str | None:
    """The vision-tower trait (:data:`VISION_TOWERS` or :data:`UNMODELLED_VISION_TOWERS`) the plugins give the
    classes of a ``config.json`` with a ``vision_config``; None without one, or with no or several such traits."""
    from kvpools_core.pipeline.gpus import architecture_traits

    classes = config.get("architectures")
    if not isinstance(config.get("vision_config"), dict) or not isinstance(classes, list):
        return None
    known = (*VISION_TOWERS, *UNMODELLED_VISION_TOWERS)
    traits = architecture_traits(registry)
    towers = {tower for name in classes if isinstance(name, str) for tower in traits.get(name, ()) if tower in known}
    return towers.pop() if len(towers) == 1 else None


def vision_shape_of(model: str, *, dtype_bytes: int = 2) -> VisionShape | None:
    """:func:`vision_shape_from_config` of ``model``'s complete config (as :func:`vocab_size_of` reads it)."""
    return vision_shape_from_config(_complete_config(model)[0], dtype_bytes=dtype_bytes)


def unmodelled_vision_tower(config: dict[str, Any], *, registry: Registry | None = None) -> str | None:
    """What a multimodal ``config.json`` carries that :func:`mm_encoder_profile` does not model: a ``vision_config``
    no modelled tower reads (:func:`vision_shape_from_config` None: a class no plugin gives a
    :data:`VISION_TOWERS` trait, such as LLaVA-NeXT's CLIP or Kimi-VL's MoonViT, or a modelled one whose sizes are
    missing), named by its
    classes and ``model_type``; None for a text-only config or a modelled tower.  vLLM runs such a tower on its
    largest dummy items in ``profile_run`` all the same (``gpu_model_runner.py`` L6072-6146), so an activation peak
    without it would be a silent underestimate: the planner refuses it (:func:`~kvpools_core.engines.vllm.
    deployment.plan_vllm`)."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict) or not vision:
        return None
    if vision_shape_from_config(config, registry=registry) is not None:
        return None
    classes = config.get("architectures")
    named = [name for name in classes if isinstance(name, str)] if isinstance(classes, list) else []
    kind = vision.get("model_type")
    return f"{' / '.join(named) or 'a config without architectures'}'s vision tower" + (
        f" ({kind})" if isinstance(kind, str) and kind else ""
    )


def max_tokens_per_item(vision: VisionShape, max_pixels: int) -> int:
    """The encoder tokens of the item with the most features under ``max_pixels``
    (``get_image_size_with_most_features``, vLLM 0.33 ``qwen2_vl.py`` L1079-1128): ``n = max_pixels // unit^2``
    merged patches, ``unit = patch x merge``; the largest ``n' <= n`` whose closest factor pair ``h <= w`` has
    ``w / h <= 200``; ``h x w`` tokens (``_get_vision_info``, ``qwen3_vl.py`` L959-1015: the resize keeps that size, one
    temporal patch, ``patches / merge^2`` tokens)."""
    unit = vision.patch_size * vision.spatial_merge_size
    for count in range(max_pixels // (unit * unit), 0, -1):
        height = next(d for d in range(math.isqrt(count), 0, -1) if count % d == 0)
        if (count // height) / height <= 200:
            return count
    return 0


@attrs.frozen(kw_only=True)
class MmEncoderProfile:
    """What ``profile_run`` runs through the vision encoder before the language model, and what it keeps."""

    modality: str
    items: int
    tokens_per_item: int
    encoder_peak_bytes: int
    """The torch peak of the encoder pass (above the weights), cuBLAS workspace excluded."""
    held_bytes: int
    """Still allocated while the language model's dummy run and the sampler run: the dummy pixel values and the
    encoder outputs kept in ``encoder_cache``."""
    formula: str


def mm_encoder_profile(
    vision: VisionShape,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    mm_limits: dict[str, int] | None = None,
    chunked_prefill: bool = True,
    dense_block_mask: bool = False,
    gpu_total_bytes: int | None = None,
    gpu_used_bytes: int = 0,
) -> MmEncoderProfile | None:
    """The multimodal part of ``profile_run`` (vLLM 0.33 ``v1/worker/gpu_model_runner.py`` L6072-6146), or None when
    every modality's ``limit_mm_per_prompt`` is 0 (no encoder is profiled, ``encoder_budget.py`` L75-94, L352-358).

    The budget (``multimodal/encoder_budget.py`` L43-191, ``v1/core/encoder_cache_manager.py`` L333-380): ``T`` the
    most tokens of one item per modality (:func:`max_tokens_per_item`; a video's pixel cap is halved for its temporal
    patch), the modality with the most is profiled (ties to the later name); ``budget = max(max_num_batched_tokens,
    T)`` (``max_num_encoder_input_tokens`` and ``encoder_cache_size`` are ``max_num_batched_tokens``,
    ``config/scheduler.py`` L306-307); ``items = max(1, min(budget // T, reqs x max(1, min(limit, max_model_len //
    T))))`` with ``reqs = max_num_seqs`` (``min(max_num_seqs, max_num_batched_tokens // T)`` without chunked
    prefill).  ``P = items x T x merge^2`` patches go through the tower at once.

    The encoder's peak, per patch, ``dtype`` bytes each (``Qwen3_VisionTransformer.forward`` L862-905, eager: the
    encoder is not compiled by default): the dummy pixel values (``in_channels x temporal x patch^2``, cast to the
    model dtype by ``context.py`` L366-367 and held by ``profile_run``'s ``batched_dummy_mm_inputs``), the position
    embeddings (``hidden``) and the rotary cos / sin tables (``head_dim``) of ``prepare_encoder_metadata``, and the
    larger of a block's two peaks (``Qwen3_VisionBlock.forward`` L487-506; an argument stays referenced by the
    caller until the call returns, so the block's input and the ``norm1`` / ``norm2`` output passed to the attention
    / MLP are alive through them): attention (``Qwen2_5_VisionAttention.forward``, ``qwen2_5_vl.py`` L406-465) holds
    the block input, the ``norm1`` output, the ``qkv`` output (3 hidden, the local ``x``), the contiguous ``qk``
    copy and its rotated copy (2 + 2 hidden, locals to the end), the attention output and the ``proj`` output
    (1 + 1): 11 hidden; the MLP (``Qwen3_VisionMLP``, eager ``linear_fc2(act_fn(linear_fc1(x)))``) the block input,
    the residual after the attention, the ``norm2`` output, ``fc1``'s output and its activation:
    ``3 hidden + 2 intermediate``.  Held afterwards: the pixel values and the encoder outputs
    (``items x T x out_hidden``) in ``encoder_cache``, until ``profile_run`` clears it after the sampler.

    The Pixtral tower (Mistral-Small-3.1; vLLM 0.19.0 ``pixtral.py`` L1243-1312, eager), per patch: the pixels
    (``in_channels x patch^2``), the conv outputs ``patch_embeds_list`` keeps and the ``ln_pre`` output the
    transformer's caller keeps (``hidden`` each), the HF rotary cos / sin (``2 x head_dim``), and the larger of a
    block's peaks (L1134-1149): the MLP (L1028-1033) holds the block input, the attention's ``r``, ``h``, the
    ``ffn_norm`` output, ``gate_up`` (``2 intermediate``), its activation and the down output:
    ``5 hidden + 3 intermediate``; the attention (L1075-1109) the block input, the ``attention_norm`` output,
    ``qkv`` (3), the rotated ``q`` / ``k`` (2), the attention output and its ``reshape`` copy (or ``o_proj``'s):
    ``9 hidden`` (vLLM 0.33, L1345-1378: the two ``contiguous`` copies for ``MMEncoderAttention`` instead of the
    ``reshape``: 10).  Where vLLM builds the dense block mask (``dense_block_mask``,
    :attr:`RuntimeProfile.pixtral_dense_block_mask`) it adds ``P x P x dtype`` (1.09 GiB for Mistral-Small-3.1's two
    12,100-patch images).  The projector (``mistral3.py`` L125-170) runs after the tower returns, on ``P / merge^2``
    tokens: under the tower's peak.

    The SigLIP tower with the Gemma-3 projector (0.19.0 ``siglip.py`` L341-571, ``gemma3_mm.py`` L420-460), per
    patch: the pixels, the embeddings (the conv output, the position added in place; the encoder's
    ``hidden_states_pool`` keeps it) and the larger block peak (L505-519, residuals added in place): attention
    (L420-431; flash attention takes the ``qkv`` views) the block input, the ``layer_norm1`` output, ``qkv`` (3), the
    attention output and ``out_proj``'s: ``7 hidden``; the MLP the block input, the residual, the ``layer_norm2``
    output, ``fc1`` and its activation: ``3 hidden + 2 intermediate``.  The projector's ``contiguous`` copy and the
    pooled tokens come after the tower's peak, under it.

    The Llama-4 tower (vLLM 0.33 ``mllama4.py``, eager: ``compile_mm_encoder`` and ``cudagraph_mm_encoder`` are off
    by default, ``config/compilation.py`` L520, L528; ``profile_run`` calls ``embed_multimodal``), per tile of
    ``(image_size / patch)^2 + 1`` tokens (the class token, L518-523), bytes: the pixels (``in_channels x patch^2``
    per patch, ``dtype``), the ``layernorm_pre`` output (``hidden x dtype``: ``Llama4VisionModel.forward``'s local
    through the encoder, L536-540) and the larger block peak (L370-387, residuals not in place): the attention
    (L317-337) holds the block input, the ``input_layernorm`` output, ``qkv`` (3 hidden) and, at the end of the
    vision rotary (``llama4_vision_rope.py`` L55-76), the fp32 copies of q and k and their complex products (4 x
    ``4 hidden`` bytes; none for a float32 model, whose ``.float()`` and ``type_as`` copy nothing) and the rotated q
    and k in the model dtype (2): ``7 hidden x dtype + 16 hidden``; flash attention (vLLM's first ViT backend on
    CUDA for a head size that is a multiple of 8: 88, ``platforms/cuda.py`` L521-568, ``flash_attn.py`` L425-429)
    then reads views of them and writes one output (``vit_attn_wrappers.py`` L26-86), under that.  The MLP
    (L155-161) holds the block input, the residual, the ``post_attention_layernorm`` output, ``fc1`` and its GELU:
    ``(3 hidden + 2 intermediate) x dtype``.  The pixel-shuffle adapter and the projector (L186-236, L164-183) run on
    ``tokens / merge^2`` of each tile after the encoder: under its peak.  Sized at TP 1: vLLM shards the tower's
    heads and MLP over TP (``mm_encoder_tp_mode`` "weights"; the ``o_proj`` / ``fc2`` all-reduces hold two hidden
    at most), so at TP > 1 the term is an upper bound.

    Gemma-4's tower (transformers :data:`GEMMA4_TRANSFORMERS`'s ``Gemma4VisionModel`` pieces, which vLLM 0.33 calls
    itself, ``gemma4_mm.py`` L1319-1589; eager, replicated: sized at any TP) runs the dummy pictures
    (:func:`item_sizes`; a video's 32 frames each a picture) in calls of :func:`gemma4_encoder_batch` pictures,
    from ``gpu_total_bytes`` and the free memory, the total less ``gpu_used_bytes`` and the dummy inputs.  Held
    through the pass: the inputs (pixels ``3 x patch^2 x dtype`` and int64 (x, y) positions, 16 B, a padded patch)
    and, for video, the padding mask of every frame (1 B a patch).  A call holds the earlier calls' tower outputs
    (``hidden x dtype`` a patch) and, per patch: an image call's ``torch.cat`` copies (pixels, positions, padding:
    ``3 patch^2 x dtype + 17`` B; a video call slices), the embeddings ``hidden`` and rotary cos / sin ``2 head_dim``
    (``dtype``), the bool ``[b, 1, S, S]`` mask and its inverse (``S + 1`` B, ``modeling_gemma4.py`` L1026-1057) and
    the larger block peak (L972-1013): the MLP (L697-711) ``(3 hidden + 3 intermediate) x dtype`` (the layer input
    its caller keeps, the residual, the normed input, the gate's activation, up and their product); the attention
    (L903-969, SDPA) the input, normed input, q, k, v, the SDPA output and its ``contiguous`` copy, plus SDPA's
    dtype copy of the mask and its copy padded to 16 columns.  After the calls: every picture's output (twice for
    video: the list and its ``torch.cat``) with the pooled fp32 tokens and the embedder's cast, norm and projection
    (the larger of ``8 hidden + hidden x dtype`` and ``4 hidden + 2 hidden x dtype + text x dtype`` B a kept
    token).  Kept: the projected tokens (:func:`gemma4_soft_tokens` a picture x the text ``hidden_size``).  An
    audio item (an ``audio_config``) that would be profiled is refused: its tower is not modelled."""
    limits = _mm_limits(mm_limits)
    modality = profiled_modality(vision, mm_limits)
    if modality is None:
        return None
    per_item, item_patches = item_sizes(vision)[modality]
    budget = max(max_num_batched_tokens, per_item)
    reqs = max_num_seqs if chunked_prefill else min(max_num_seqs, max_num_batched_tokens // per_item)
    per_prompt = max(1, min(limits[modality], max_model_len // per_item))
    items = max(1, min(budget // per_item, reqs * per_prompt))
    if vision.tower == VLLM_VISION_GEMMA4:
        if modality == "audio":
            raise UnsupportedCombinationError(
                f"kvpools does not model Gemma-4's audio tower's encoder pass yet: vLLM profiles audio, its modality "
                f"with the most tokens ({per_item}) at these limits ({limits}). Limit audio to 0 "
                "(limit_mm_per_prompt {'audio': 0}) to profile the vision tower."
            )
        if gpu_total_bytes is None:
            raise ConfigError(
                "Gemma-4's encoder profile term needs gpu_total_bytes (vLLM sizes its encoder batch from the GPU's "
                "total and free memory): pass the planned GPU's total."
            )
        return _gemma4_profile(
            vision,
            modality=modality,
            items=items,
            tokens_per_item=per_item,
            total_bytes=gpu_total_bytes,
            used_bytes=gpu_used_bytes,
        )
    patches = items * item_patches
    dtype = vision.dtype_bytes
    pixels = vision.in_channels * vision.temporal_patch_size * vision.patch_size**2
    peak, what = _encoder_pass_bytes(vision, patches, pixels, dense_block_mask=dense_block_mask)
    outputs = items * per_item * vision.out_hidden_size * dtype
    held = patches * pixels * dtype + outputs
    return MmEncoderProfile(
        modality=modality,
        items=items,
        tokens_per_item=per_item,
        encoder_peak_bytes=peak,
        held_bytes=held,
        formula=(
            f"{items} {modality} item(s) x {per_item} tokens = {patches} patches x {what} = {peak / GiB:.3f} GiB; "
            f"held after it: pixels {patches * pixels * dtype / MiB:.1f} MiB + encoder cache {items * per_item} x "
            f"{vision.out_hidden_size} x {dtype} B = {held / MiB:.1f} MiB"
        ),
    )


def _mm_limits(mm_limits: dict[str, int] | None) -> dict[str, int]:
    return {"image": DEFAULT_MM_LIMIT, "video": DEFAULT_MM_LIMIT, "audio": DEFAULT_MM_LIMIT, **(mm_limits or {})}


def profiled_modality(vision: VisionShape, mm_limits: dict[str, int] | None = None) -> str | None:
    """The modality ``profile_run`` runs through the encoder (``get_modality_with_max_tokens``): of those
    :func:`item_sizes` gives and ``mm_limits`` leaves above 0 (:data:`DEFAULT_MM_LIMIT` where unnamed), the one with
    the most tokens an item (ties to the later name); None when none is left."""
    limits = _mm_limits(mm_limits)
    sizes = {modality: size for modality, size in item_sizes(vision).items() if limits[modality] > 0 and size[0] > 0}
    if not sizes:
        return None
    return max(sizes.items(), key=lambda item: (item[1][0], item[0]))[0]


def item_sizes(vision: VisionShape) -> dict[str, tuple[int, int]]:
    """Per modality the tokens (``get_num_embeds`` of the dummy item, ``encoder_budget.py`` L15-40) and the patches
    the tower runs for the item with the most features.

    Qwen3-VL: :func:`max_tokens_per_item` of the image and the (temporally halved) video caps, ``merge^2`` patches
    a token.  Pixtral (vLLM 0.19.0 ``mistral3.py`` L186-201, ``pixtral.py`` L945-994): a square ``image_size``
    image (1540 on Mistral-Small-3.1), ``ceil(image_size / (patch x merge))^2`` tokens (the image tokens between
    the ``[IMG_BREAK]`` / ``[IMG_END]`` ones, which are no embeddings), ``merge^2`` patches a token.  SigLIP with
    the Gemma-3 projector (``gemma3_mm.py`` L194-210; pan-and-scan is off by default, so one crop): the
    ``image_size`` image (896), ``(image_size / patch)^2`` patches (4096) average-pooled to ``mm_tokens_per_image``
    tokens (256).  Llama-4 (vLLM 0.33 ``mllama4.py`` L564-585, L630-636, L679-685): the dummy image is
    ``max_tiles`` tiles high and one wide, which the processor cuts into its 16 x 1 tiles plus the global one: 17
    chunks of ``(image_size / patch)^2`` patches (576 at 336 / 14), each pixel-shuffled to ``patches / merge^2``
    tokens (144; the embeddings are the ``<|patch|>`` tokens, L684-685): 2448 tokens.  Gemma-4 (vLLM 0.33
    ``gemma4_mm.py`` L272-296): an image counts ``default_output_length`` tokens (280) and a video ``32 x (70 + 2 +
    6)`` (2496, so vLLM profiles video by default); the tower runs the processor's padded patches, ``max_soft_tokens x
    pooling^2`` a picture (transformers 5.20.2 ``image_processing_gemma4.py`` L216-268: 2520 an image, 630 a frame;
    the embeddings kept are fewer, :func:`gemma4_soft_tokens`); audio (``audio_config``) counts its
    ``audio_seq_length`` and runs no vision patches (its tower is not modelled)."""
    if vision.tower == VLLM_VISION_QWEN3:
        merge = vision.spatial_merge_size**2
        image = max_tokens_per_item(vision, vision.image_max_pixels)
        video = max_tokens_per_item(vision, vision.video_max_pixels // vision.temporal_patch_size)
        return {"image": (image, image * merge), "video": (video, video * merge)}
    if vision.tower == VLLM_VISION_PIXTRAL:
        grid = -(-vision.image_size // (vision.patch_size * vision.spatial_merge_size))
        return {"image": (grid * grid, (grid * vision.spatial_merge_size) ** 2)}
    if vision.tower == VLLM_VISION_GEMMA4:
        pooled = vision.spatial_merge_size**2
        sizes = {
            "image": (vision.image_tokens, vision.image_tokens * pooled),
            "video": (
                GEMMA4_VIDEO_FRAMES * (GEMMA4_VIDEO_SOFT_TOKENS + 8),
                GEMMA4_VIDEO_FRAMES * GEMMA4_VIDEO_SOFT_TOKENS * pooled,
            ),
        }
        if vision.audio_tokens:
            sizes["audio"] = (vision.audio_tokens, 0)
        return sizes
    side = vision.image_size // vision.patch_size
    if vision.tower == VLLM_VISION_LLAMA4:
        chunks = vision.max_tiles + 1 if vision.max_tiles > 1 else 1
        return {"image": (chunks * (side * side // vision.spatial_merge_size**2), chunks * side * side)}
    return {"image": (vision.image_tokens, side * side)}


def gemma4_soft_tokens(vision: VisionShape, max_soft_tokens: int) -> int:
    """The embeddings of the dummy ``GEMMA4_DUMMY_IMAGE_SIDE``-square picture at a ``max_soft_tokens`` budget
    (``_compute_num_soft_tokens``, vLLM 0.33 ``gemma4_mm.py`` L305-343, the processor's resize, transformers 5.20.2
    ``image_processing_gemma4.py`` L33-85): ``unit = patch x pooling``, the side scaled by ``sqrt(max_soft_tokens x
    pooling^2 / (224 / patch)^2)`` and floored to a multiple of ``unit`` (at least one), ``(side / patch)^2 /
    pooling^2`` tokens, at most ``max_soft_tokens``.  At patch 16, pooling 3: a 768-pixel image, 256 tokens of 280
    (2304 real patches of the 2520 padded); a 384-pixel frame, 64 of 70 (576 of 630)."""
    side, patch, pooling = GEMMA4_DUMMY_IMAGE_SIDE, vision.patch_size, vision.spatial_merge_size
    unit = patch * pooling
    scale = math.sqrt(max_soft_tokens * pooling**2 / ((side / patch) * (side / patch)))
    target = max(unit, math.floor(side * scale / unit) * unit)
    return min((target // patch) ** 2 // pooling**2, max_soft_tokens)


def gemma4_encoder_batch(
    *, patches_per_item: int, position_embedding_size: int, free_bytes: int, total_bytes: int
) -> int:
    """vLLM 0.33's ``_encoder_chunk`` (``gemma4_mm.py`` L1272-1303): the pictures one tower call takes,
    ``max(1, min(free // 2, total // 10) // (patches x 4 x position_embedding_size x 8))`` (1 for a budget <= 0),
    priced for an ``F.one_hot`` position lookup none of the transformers releases 0.33 accepts makes
    (:data:`GEMMA4_TRANSFORMERS`): it bounds the batch, the peak is the tower's own.  The caller takes the smaller of
    it and the pictures (L1364-1372, L1505-1514)."""
    budget = min(free_bytes // 2, total_bytes // 10)
    cost = patches_per_item * 4 * position_embedding_size * 8
    if budget <= 0 or cost <= 0:
        return 1
    return max(1, budget // cost)


def _gemma4_profile(
    vision: VisionShape, *, modality: str, items: int, tokens_per_item: int, total_bytes: int, used_bytes: int
) -> MmEncoderProfile:
    """Gemma-4's encoder pass (see :func:`mm_encoder_profile`) over ``items`` dummy images or videos."""
    hidden, inner, dtype, text = (
        vision.hidden_size,
        vision.intermediate_size,
        vision.dtype_bytes,
        vision.out_hidden_size,
    )
    head_dim = vision.attention_head_dim
    width = vision.num_heads * head_dim
    kv_width = (vision.num_kv_heads or vision.num_heads) * head_dim
    pooled = vision.spatial_merge_size**2
    video = modality == "video"
    budget_tokens = GEMMA4_VIDEO_SOFT_TOKENS if video else vision.image_tokens
    pictures = items * (GEMMA4_VIDEO_FRAMES if video else 1)
    seq = budget_tokens * pooled
    kept = pictures * gemma4_soft_tokens(vision, budget_tokens)
    pixels = vision.in_channels * vision.patch_size**2
    inputs = pictures * seq * (pixels * dtype + 16)
    free = total_bytes - used_bytes - inputs
    batch = min(
        pictures,
        gemma4_encoder_batch(
            patches_per_item=seq,
            position_embedding_size=vision.position_embedding_size,
            free_bytes=free,
            total_bytes=total_bytes,
        ),
    )
    copies = 0 if video else pixels * dtype + 16 + 1
    mlp = (3 * hidden + 3 * inner) * dtype
    attention = (2 * hidden + width + 2 * kv_width + max(2 * width, width + hidden)) * dtype
    attention += seq * dtype + _round_up(seq, 16) * dtype
    per_patch = copies + (hidden + 2 * head_dim) * dtype + seq + 1 + max(mlp, attention)
    chunks = max(
        start * seq * hidden * dtype + min(batch, pictures - start) * seq * per_patch
        for start in range(0, pictures, batch)
    )
    outputs = (2 if video else 1) * pictures * seq * hidden * dtype
    project = kept * max(8 * hidden + hidden * dtype, 4 * hidden + 2 * hidden * dtype + text * dtype)
    base = inputs + (pictures * seq if video else 0)
    peak = base + max(chunks, outputs + project)
    held = inputs + kept * text * dtype
    bound = "the GPU's total / 10" if total_bytes // 10 <= free // 2 else "free / 2"
    what = "video frames" if video else "images"
    return MmEncoderProfile(
        modality=modality,
        items=items,
        tokens_per_item=tokens_per_item,
        encoder_peak_bytes=peak,
        held_bytes=held,
        formula=(
            f"{items} {modality} item(s) x {tokens_per_item} tokens = {pictures} {what} x {seq} padded patches "
            f"(transformers {GEMMA4_TRANSFORMERS}'s tower), {batch} a tower call (vLLM's _encoder_chunk: "
            f"min(free {max(free, 0) / GiB:.2f} GiB / 2, total {total_bytes / GiB:.2f} GiB / 10: {bound}) / "
            f"({seq} x 4 x {vision.position_embedding_size} x 8 B)); peak {peak / GiB:.3f} GiB = inputs "
            f"{inputs / MiB:.1f} MiB (pixels {pixels} x {dtype} B + int64 positions a patch"
            + (", the padding mask" if video else "")
            + f") + max(last call {chunks / GiB:.3f} GiB (earlier calls' outputs {hidden} x {dtype} B a patch + "
            f"{batch} x {seq} patches x {per_patch} B: "
            + ("" if video else f"the call's copies {copies} + ")
            + f"embeddings {hidden} + rotary 2 x {head_dim} ({dtype} B) + mask {seq} + 1 B + block max(MLP (3 x "
            f"{hidden} + 3 x {inner}) x {dtype}, attention {attention} B)), outputs {outputs / MiB:.1f} MiB + pooled "
            f"and projected {kept} tokens {project / MiB:.1f} MiB); held after it: inputs + encoder cache {kept} x "
            f"{text} x {dtype} B = {held / MiB:.1f} MiB"
        ),
    )


def _encoder_pass_bytes(vision: VisionShape, patches: int, pixels: int, *, dense_block_mask: bool) -> tuple[int, str]:
    """The encoder pass's torch peak for ``patches`` patches, and its formula (see :func:`mm_encoder_profile`)."""
    hidden, inner, dtype = vision.hidden_size, vision.intermediate_size, vision.dtype_bytes
    head_dim = vision.attention_head_dim
    if vision.tower == VLLM_VISION_PIXTRAL:
        attention = 9 if dense_block_mask else 10
        per_patch = pixels + 2 * hidden + 2 * head_dim + max(attention * hidden, 5 * hidden + 3 * inner)
        mask = patches * patches if dense_block_mask else 0
        peak = (patches * per_patch + mask) * dtype
        return peak, (
            f"(pixels {pixels} + patch embeddings and ln_pre {hidden} + {hidden} + rotary cos / sin 2 x {head_dim} "
            f"+ block max({attention} x {hidden}, 5 x {hidden} + 3 x {inner})) x {dtype} B"
            + (f" + the dense block mask {patches} x {patches} x {dtype} B" if dense_block_mask else "")
        )
    if vision.tower == VLLM_VISION_LLAMA4:
        return _llama4_pass_bytes(vision, patches, pixels)
    if vision.tower == VLLM_VISION_SIGLIP:
        per_patch = pixels + hidden + max(7 * hidden, 3 * hidden + 2 * inner)
        return patches * per_patch * dtype, (
            f"(pixels {pixels} + embeddings {hidden} + block max(7 x {hidden}, 3 x {hidden} + 2 x {inner})) x {dtype} B"
        )
    block = max(11 * hidden, 3 * hidden + 2 * inner)
    return patches * (pixels + hidden + head_dim + block) * dtype, (
        f"(pixels {pixels} + position {hidden} + rotary {head_dim} + block max(11 x {hidden}, 3 x {hidden} + "
        f"2 x {inner})) x {dtype} B"
    )


def _llama4_pass_bytes(vision: VisionShape, patches: int, pixels: int) -> tuple[int, str]:
    """``Llama4VisionModel``'s pass over ``patches`` pixel patches (see :func:`mm_encoder_profile`): each tile's
    ``(image_size / patch)^2`` patches and its class token run as one sequence."""
    hidden, inner, dtype = vision.hidden_size, vision.intermediate_size, vision.dtype_bytes
    side = vision.image_size // vision.patch_size
    chunks, sequence = patches // (side * side), side * side + 1
    rotary = 0 if dtype >= 4 else 16 * hidden
    attention = 7 * hidden * dtype + rotary
    mlp = (3 * hidden + 2 * inner) * dtype
    tokens = chunks * sequence
    peak = patches * pixels * dtype + tokens * (hidden * dtype + max(attention, mlp))
    return peak, (
        f"(pixels {pixels} x {dtype} B) + {chunks} tiles x {sequence} tokens x (layernorm_pre {hidden} x "
        f"{dtype} B + block max(attention 7 x {hidden} x {dtype} B + fp32 rotary 16 x {hidden} B, MLP (3 x {hidden} "
        f"+ 2 x {inner}) x {dtype} B))"
    )


def forward_peak_bytes(*, shape: ModelShape, tokens: int, tp_size: int = 1) -> int:
    """The dense forward pass's transient peak for ``tokens`` tokens, inside an MLP: the two inputs of the compiled
    piece after the attention (its output and the residual, ``hidden`` each), the new residual, the
    ``gate_up_proj`` output (``2 x intermediate / tp``) and the ``SiluAndMul`` output (``intermediate / tp``):
    ``tokens x (3 hidden + 3 intermediate / tp) x dtype``.  The profile run skips attention (``attn_metadata``
    None: vLLM 0.19 ``gpu_model_runner.py`` ``_dummy_run``, ``flash_attn.py`` L666-667), so the MLP is the
    largest."""
    inner = shape.dense_intermediate_size // tp_size
    return tokens * (3 * shape.hidden_size + 3 * inner) * shape.dtype_bytes


def activation_peak(
    *,
    vocab_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    profile: RuntimeProfile,
    shape: ModelShape | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    pp_stage: str = "last",
    sm_count: int = H100_SMS,
    compute_capability: tuple[int, int] | None = None,
    vision: VisionShape | None = None,
    max_model_len: int | None = None,
    mm_limits: dict[str, int] | None = None,
    gpu_total_bytes: int | None = None,
    gpu_used_bytes: int = 0,
) -> Term:
    """The torch peak of ``profile_run`` above the weights (``torch_peak_increase``), one worker.

    ``profile_run`` (vLLM 0.19 ``gpu_model_runner.py`` L5782-5795, 0.33 L6132-6146) runs ``max_num_batched_tokens``
    tokens and, on the last pipeline stage, ``_dummy_sampler_run`` on ``rows = min(max_num_seqs, tokens)`` rows while
    it still holds the ``[tokens, hidden]`` hidden states and their ``[rows, hidden]`` gather (``_dummy_run``'s
    return, 0.19 L5553).  At the sampler's peak (``random_sample``) are alive, per logit: the model's logits
    ``_dummy_sampler_run`` holds (``dtype`` bytes, 0.19 L5571), the sampler's fp32 copy (4, ``sampler.py`` L90; none
    for a float32 model), their softmax (4) and the exponential noise (4) (``sampler_bytes_per_logit`` 12 from vLLM
    0.17, 36 for 0.15 / 0.16's torch sort, which counts the fp32 copy among its own); plus the ``torch.rand_like``
    of the gathered rows (0.19 L5569) and the top-k/top-p kernel's cached buffer
    (:func:`sampler_program_buffer_bytes`).  The forward pass's own peak (:func:`forward_peak_bytes`) is over by
    then; the peak is the larger of the two.  A MoE model adds the persistent fused-MoE workspace
    (:func:`moe_workspace_bytes`) to both, and every stage but the first of a pipeline its
    ``make_empty_intermediate_tensors`` buffers (hidden states and residual, ``[tokens, hidden]`` each, 0.19
    L5440-5448).  A non-last stage has no sampler peak.  The profile run's first matmul adds torch's cuBLAS
    workspace (:func:`cublas_workspace_bytes`).  No constant is calibrated.  Without ``shape`` the terms that need
    the hidden size are left out.  MLA's chunked-prefill workspace is not in it: the metadata builder allocates it
    (vLLM 0.19.0 ``model_executor/layers/attention/mla_attention.py`` L1501-1527) when ``initialize_kv_cache`` creates
    the attention backends (``gpu_model_runner.py`` L6769-6781), after the peak is read.  A multimodal model with a
    ``vision`` tower (:func:`mm_encoder_profile`, sized by ``max_model_len`` and ``mm_limits``) runs its encoder first
    (0.33 L6072-6130): the peak is then the larger of the encoder pass's and the language model's plus what the
    encoder left held (pixel values, encoder cache), which the MoE workspace is not part of (it is first taken in the
    language model's pass); Gemma-4's batches its tower calls from ``gpu_total_bytes`` and the free memory, the total
    less ``gpu_used_bytes``.  Not modelled: vision towers other than :data:`VISION_TOWERS` (``vision`` None: the
    encoder is left out), the encoder under pipeline parallelism (left out), the MoE backends
    :func:`moe_workspace_bytes` charges the Triton experts' workspace for (Humming, vLLM CUTLASS, DeepGEMM, schemes it
    does not tell apart), fewer than 8 sampled rows on vLLM 0.17-0.19 (``max_num_seqs``
    < 8: ``apply_top_k_top_p`` sorts them with torch, 0.19.0 ``topk_topp_sampler.py`` L251-255).
    """
    if pp_stage not in PIPELINE_STAGES:
        raise ConfigError(f"pp_stage must be one of {', '.join(PIPELINE_STAGES)}, got {pp_stage!r}.")
    rows = min(max_num_seqs, max_num_batched_tokens)
    tokens = max_num_batched_tokens
    dtype = shape.dtype_bytes if shape is not None else 2
    hidden = shape.hidden_size if shape is not None else 0
    parts: list[str] = []
    sampler = 0
    if pp_stage == "last":
        per_logit = dtype + profile.sampler_bytes_per_logit - (4 if dtype == 4 else 0)
        what = (
            "torch sort: logits, values, int64 indices, reverse indices, cub buffers"
            if profile.sampler_bytes_per_logit == SORT_PATH_BYTES_PER_LOGIT
            else "fp32 logits, softmax, exponential noise"
        )
        sampler = rows * vocab_size * per_logit
        parts.append(f"{rows} rows x {vocab_size} vocab x {per_logit} B (held {dtype} B logits; {what})")
        if profile.sampler_program_buffer:
            buffer = sampler_program_buffer_bytes(rows=rows, vocab_size=vocab_size, sm_count=sm_count)
            sampler += buffer
            parts.append(f"top-k/top-p buffer {buffer / MiB:.1f} MiB ({sm_count} SMs)")
        held = (tokens + 2 * rows) * hidden * dtype
        sampler += held
        if shape is not None:
            parts.append(f"held hidden states ({tokens} + 2 x {rows}) x {hidden} x {dtype} B")
    forward = forward_peak_bytes(shape=shape, tokens=tokens, tp_size=tp_size) if shape is not None else 0
    if forward:
        parts.append(f"forward {forward / GiB:.3f} GiB")
    workspace = 0
    if shape is not None and profile.moe_workspace:
        workspace = moe_workspace_bytes(
            shape=shape, tokens=tokens, tp_size=tp_size, compute_capability=compute_capability
        )
    if workspace and shape is not None:
        backend = vllm_moe_backend(shape.experts_scheme, compute_capability or (9, 0))
        unmodelled = "the experts' backend" if backend == "other" else backend
        kernel = f"TRITON's bytes: {unmodelled} not modelled" if backend in MOE_BACKEND_NOT_MODELLED else backend
        parts.append(f"fused-MoE workspace {workspace / MiB:.1f} MiB ({kernel})")
    receive = 2 * tokens * hidden * dtype if pp_size > 1 and pp_stage != "first" else 0
    if receive:
        parts.append(f"pipeline receive buffers 2 x {tokens} x {hidden} x {dtype} B")
    base = cublas_workspace_bytes(compute_capability)
    language = max(sampler, forward) + workspace + receive
    peak = "sampler" if sampler >= forward else "forward"
    head = (
        f"max(sampler {sampler / GiB:.3f} GiB, forward {forward / GiB:.3f} GiB: {peak}) + workspace + receive + "
        f"{base / MiB:.3f} MiB cuBLAS workspace; "
    )
    encoder = None
    if vision is not None and pp_size == 1:
        if max_model_len is None:
            raise ConfigError(
                "The multimodal encoder's profile term needs max_model_len (it caps the items per prompt): pass the "
                "planned max_model_len with the vision shape."
            )
        encoder = mm_encoder_profile(
            vision,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
            mm_limits=mm_limits,
            dense_block_mask=profile.pixtral_dense_block_mask,
            gpu_total_bytes=gpu_total_bytes,
            gpu_used_bytes=gpu_used_bytes,
        )
    if encoder is not None:
        bound = "encoder" if encoder.encoder_peak_bytes >= language + encoder.held_bytes else "language model"
        head = (
            f"max(encoder {encoder.encoder_peak_bytes / GiB:.3f} GiB, language model {language / GiB:.3f} GiB + held "
            f"{encoder.held_bytes / MiB:.1f} MiB: {bound}) + {base / MiB:.3f} MiB cuBLAS workspace; language model: "
            + head.split(" + ")[0]
            + " + workspace + receive; "
        )
        parts.append(f"multimodal encoder: {encoder.formula}")
        language = max(encoder.encoder_peak_bytes, language + encoder.held_bytes)
    total = language + base
    return Term(
        name="activation peak",
        bytes=total,
        formula=(
            head
            + "; ".join(parts)
            + ("" if shape is not None else "; model shape not given: hidden-state and forward terms left out")
            + ("" if pp_stage == "last" else f"; pipeline {pp_stage} stage: no sampler")
        ),
        source=(
            "vLLM gpu_model_runner.profile_run / _dummy_run / _dummy_sampler_run; sampler.Sampler.forward; "
            "topk_topp_sampler.forward_native / random_sample; topk_topp_triton.apply_top_k_top_p_triton (Triton from "
            "0.17, torch sort before); fused_moe TritonExperts.workspace_shapes, v1/worker/workspace.py; torch "
            "CublasHandlePool.cpp getChosenWorkspaceSize"
        ),
    )


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def non_torch_memory(*, tp_size: int, pp_size: int, profile: RuntimeProfile) -> Term:
    """The non-torch increase since the worker's first snapshot (``non_torch_increase``, ``mem_utils.py`` L306):
    cuBLAS/cuDNN workspaces at TP 1, plus the NCCL and custom all-reduce buffers at TP >= 2; calibrated per TP size
    (the largest calibrated TP not above ``tp_size``), and per pipeline stage when ``pp_size > 1``.

    It depends on the version, not on the GPU or TP alone: vLLM 0.18 and 0.19 profile the CUDA graphs inside the
    ``memory_profiling`` window (0.19.0 ``gpu_worker.py`` L366-381), so the increase holds what those captures leave
    outside torch; 0.15-0.17 do not profile them (0.13 GiB at TP 1 in llm-d-planner's sweep against 0.19's 0.25), and
    0.33 profiles them after the window closes (``gpu_worker.py`` L686-717).  The 0.16 and 0.33 profiles carry
    0.19's constants until a log of theirs calibrates them (``profiles/vllm-0.16.json``, ``vllm-0.33.json``)."""
    if pp_size > 1 and tp_size == 1:
        return Term(
            name="non-torch",
            bytes=profile.non_torch_pp_bytes,
            formula=f"{profile.non_torch_pp_bytes / GiB:.2f} GiB per pipeline stage (calibrated, {profile.file})",
            source="vLLM utils/mem_utils.py memory_profiling: non_torch_increase",
        )
    candidates = [(tp, size) for tp, size in profile.non_torch_bytes_by_tp if tp <= tp_size]
    tp, size = candidates[-1]
    return Term(
        name="non-torch",
        bytes=size,
        formula=f"{size / GiB:.2f} GiB calibrated at TP {tp} ({profile.file})",
        source="vLLM utils/mem_utils.py memory_profiling: non_torch_increase",
    )


FLASHINFER_WORKSPACE_BYTES = 394 * MiB
"""``VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE``'s default, 394 MiB (vLLM 0.24.0 ``envs.py`` L1549-1551, 0.33.0
L1817-1819): the float workspace ``FlashInferMetadataBuilder._get_workspace_buffer`` allocates with ``torch.zeros``
(0.24.0 ``v1/attention/backends/flashinfer.py`` L785-793)."""

FLASHINFER_INT_WORKSPACE_BYTES = 8 * MiB
"""The int workspace each FlashInfer ``BatchDecodeWithPagedKVCacheWrapper`` allocates with ``torch.empty`` in its
``__init__`` (flashinfer-python 0.6.12, which vLLM 0.24.0 pins, ``decode.py`` L756-758)."""

FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM = 16
"""vLLM 0.26.0 on: the float workspace is at least ``max_num_batched_tokens x num_qo_heads x head_dim x 16`` bytes
(0.26.0 ``flashinfer.py`` L85, L936-958; 0.33.0 L104, L1255-1278)."""

FLASH_ATTN_HEAD_DIM_LIMIT = 256
"""FlashAttention's largest head size without FA4 (vLLM 0.24.0 ``flash_attn.py`` ``supports_head_size`` L173-180)."""


def attention_backend(*, compute_capability: tuple[int, int] | None, kv_cache_dtype: str, head_dim: int) -> str | None:
    """The attention backend vLLM picks on CUDA for a non-MLA model: ``"FLASHINFER"``, ``"FLASH_ATTN"`` or None
    (not known: an MLA model, ``head_dim`` 0, or a GPU without a compute capability).

    ``_get_backend_priorities`` (vLLM 0.24.0 ``platforms/cuda.py`` L143-159; 0.33.0 the same order, but for models
    with a multimodal prefix or non-causal attention, not modelled): FlashInfer first on compute capability 10.x,
    FlashAttention first elsewhere.  FlashAttention refuses an fp8 cache except
    with FA3 on Hopper (0.24.0 ``flash_attn.py`` ``supports_kv_cache_dtype`` L183-193) and a head size that is not
    a multiple of 8 or above 256 (L173-180); FlashInfer takes compute capability 8.0-12.1 (L426-434) and fp8 caches
    (L327-335).  Below 8.0 neither is modelled (None)."""
    if compute_capability is None or head_dim <= 0 or compute_capability < (8, 0):
        return None
    if compute_capability[0] == 10:
        return "FLASHINFER"
    fp8 = kv_cache_dtype.lower().startswith("fp8")
    flash_attn = (
        head_dim % 8 == 0
        and head_dim <= FLASH_ATTN_HEAD_DIM_LIMIT
        and (not fp8 or (compute_capability[0] == 9 and kv_cache_dtype.lower() != "fp8_e5m2"))
    )
    if flash_attn:
        return "FLASH_ATTN"
    return "FLASHINFER" if compute_capability <= (12, 1) else None


def flashinfer_workspace_bytes(
    *, profile: RuntimeProfile, max_num_batched_tokens: int, num_qo_heads: int, head_dim: int
) -> int:
    """The FlashInfer attention builder's float workspace: 394 MiB (:data:`FLASHINFER_WORKSPACE_BYTES`), from vLLM
    0.26.0 at least ``max_num_batched_tokens x num_qo_heads x head_dim x 16`` (``num_qo_heads`` on one TP rank)."""
    if not profile.flashinfer_workspace_scales:
        return FLASHINFER_WORKSPACE_BYTES
    return max(
        FLASHINFER_WORKSPACE_BYTES,
        max_num_batched_tokens * num_qo_heads * head_dim * FLASHINFER_PREFILL_WORKSPACE_BYTES_PER_ELEM,
    )


def cudagraph_capture_sizes(
    *, max_num_seqs: int, max_num_batched_tokens: int, blackwell: bool = False, max_capture_size: int | None = None
) -> list[int]:
    """vLLM 0.33's default ``cudagraph_capture_sizes`` without speculative decoding (``config/vllm.py``
    ``_set_cudagraph_sizes`` L2452-2605, decode query length 1): the ceiling ``min(max_num_seqs x 2, 512)`` (1024 on
    a Blackwell, device capability family 100) then ``min(max_num_batched_tokens, ceiling)``; sizes 1, 2, 4, every 8
    up to 248, every 16 from 256 to the ceiling, plus ``max_num_batched_tokens`` when it is within the ceiling and
    ``max_num_seqs`` when it is (the uniform-decode size).  ``max_capture_size`` is a ``max_cudagraph_capture_size``
    set before (gpt-oss's 1024, :attr:`GraphShape.max_capture_size`): it is the ceiling, and no uniform-decode size
    is added (L2457-2460: those are "populated only when the default is computed here")."""
    if max_capture_size is None:
        ceiling = min(max_num_seqs * 2, 1024 if blackwell else 512)
        decode = [max_num_seqs] if max_num_seqs <= ceiling else []
    else:
        ceiling, decode = max_capture_size, []
    ceiling = min(max_num_batched_tokens, ceiling)
    sizes = [size for size in (1, 2, 4) if size <= ceiling]
    if ceiling >= 8:
        sizes += list(range(8, min(ceiling + 1, 256), 8))
    if ceiling >= 256:
        sizes += list(range(256, ceiling + 1, 16))
    if max_num_batched_tokens <= ceiling:
        sizes.append(max_num_batched_tokens)
    sizes += [size for size in decode if size <= max_num_batched_tokens]
    return sorted(set(sizes))


FA_CUDAGRAPH_MAX_SPLITS = 32
"""vLLM's ``flash_attn_max_num_splits_for_cuda_graph`` default (0.33 ``config/attention.py`` L61; 0.19 the same):
the split-KV bound FlashAttention's metadata builder passes while a FULL graph is captured
(``v1/attention/backends/flash_attn.py`` L767-771, L855-865)."""


@attrs.frozen(kw_only=True)
class GraphShape:
    """The model sizes vLLM's CUDA-graph profiling depends on (:func:`graph_shape_from_config`)."""

    layers: int = attrs.field(validator=_size(1))
    """``num_hidden_layers`` (a pipeline stage captures its own share)."""
    attention_heads: int = attrs.field(validator=_size(1))
    value_head_dim: int = attrs.field(validator=_size(1))
    """The width decode attention writes per head: ``head_dim`` (``hidden / heads``), an MLA model's
    ``kv_lora_rank`` (its decode attends in the latent space)."""
    mlp_width: int = attrs.field(validator=_size(0))
    """The widest MLP a token runs: ``max(dense intermediate, experts per token x expert width)``."""
    split_kv: bool = True
    """Whether a FULL graph captures FlashAttention's split-KV accumulators: false for float32 (TRITON_ATTN), a
    PrefixLM multimodal model and a model with attention sinks (gpt-oss: its logged FULL first capture is 6-8 MiB,
    not the accumulators' 256-512 MiB), which the plugins' ``vllm_prefix_lm`` / ``vllm_attention_sinks`` traits
    name (:mod:`kvpools_core.pipeline.gpus`)."""
    dtype_bytes: int = attrs.field(default=2, validator=attrs.validators.in_((2, 4)))
    max_capture_size: int | None = None
    """A ``max_cudagraph_capture_size`` the model's config hook sets: 1024 for a class with the
    ``vllm_cudagraph_capture_1024`` trait (gpt-oss: vLLM 0.33 ``model_executor/models/config.py`` L544-562, "from 67
    to 83" graphs), else None (vLLM's default)."""


def graph_shape_from_config(
    config: dict[str, Any], *, dtype_bytes: int = 2, registry: Registry | None = None
) -> GraphShape | None:
    """The :class:`GraphShape` of a Hugging Face ``config.json`` (its ``text_config`` for a multimodal one), or None
    without ``hidden_size`` / ``num_hidden_layers`` / ``num_attention_heads``."""
    shape = model_shape_from_config(config, dtype_bytes=dtype_bytes)
    text = config if isinstance(config.get("hidden_size"), int) else (config.get("text_config") or {})
    layers, heads = text.get("num_hidden_layers"), text.get("num_attention_heads")
    if shape is None or not isinstance(layers, int) or not isinstance(heads, int) or layers < 1 or heads < 1:
        return None
    stated, latent = text.get("head_dim"), text.get("kv_lora_rank")
    head_dim = stated if isinstance(stated, int) and stated > 0 else shape.hidden_size // heads
    from kvpools_core.pipeline.gpus import (
        VLLM_ATTENTION_SINKS,
        VLLM_CUDAGRAPH_CAPTURE_1024,
        VLLM_PREFIX_LM,
        architecture_traits,
    )

    by_class = architecture_traits(registry)
    classes = [name for name in (config.get("architectures") or ()) if isinstance(name, str)]
    traits = frozenset().union(*(by_class.get(name, frozenset()) for name in classes))
    return GraphShape(
        layers=layers,
        attention_heads=heads,
        value_head_dim=latent if isinstance(latent, int) and latent > 0 else max(head_dim, 1),
        mlp_width=max(shape.dense_intermediate_size, shape.num_experts_per_tok * shape.moe_intermediate_size),
        split_kv=dtype_bytes == 2 and not traits & {VLLM_PREFIX_LM, VLLM_ATTENTION_SINKS},
        dtype_bytes=dtype_bytes,
        max_capture_size=1024 if VLLM_CUDAGRAPH_CAPTURE_1024 in traits else None,
    )


def graph_shape_of(model: str, *, dtype_bytes: int = 2) -> GraphShape | None:
    """:func:`graph_shape_from_config` of ``model`` (a preset, a ``config.json`` or its directory)."""
    return graph_shape_from_config(_complete_config(model)[0], dtype_bytes=dtype_bytes)


def cudagraph_memory(
    *,
    profile: RuntimeProfile,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    graph: GraphShape | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    flashinfer_workspace: int = 0,
    attention: str | None = None,
    blackwell: bool = False,
) -> Term:
    """The CUDA-graph estimate vLLM subtracts before sizing the KV cache, for one worker.

    Zero for a version that captures the graphs after sizing it (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` off,
    as in vLLM 0.19).  vLLM 0.33 turns it on (``envs.py`` L2219) and ``profile_cudagraph_memory``
    (``v1/worker/gpu_model_runner.py`` L6268-6415) captures, per mode, the largest and the second-largest size into
    one temporary graph pool, reads the free-memory drop of each (L6330-6344: ``first_capture``, and ``per_graph``,
    at least 1 MiB) and estimates ``max over modes(first_capture) + sum over modes(per_graph x (graphs - 1))``
    (L6395-6407).  The default mode ``FULL_AND_PIECEWISE`` captures a PIECEWISE graph per capture size and a FULL
    graph per uniform-decode size (the capture sizes up to ``max_num_seqs``).

    What the two readings hold, and kvpools' term for each (``graph``, :func:`graph_shape_of`; a stage holds
    ``ceil(layers / pp)`` layers, a rank ``heads / tp`` heads and ``mlp_width / tp`` of the MLP):

    - FULL first capture: the whole decode step at the largest FULL size ``S_F``; FlashAttention captures with
      ``num_splits`` = :data:`FA_CUDAGRAPH_MAX_SPLITS` (``flash_attn.py`` L855-865, whose comment names the cost:
      ``[num_splits, num_heads, num_tokens, head_size]`` intermediate buffers), so the pool keeps the fp32 split
      accumulators ``32 x S_F x heads x (value_head_dim + 1) x 4 B`` (output and log-sum-exp), plus the graph's own
      memory (a FULL graph's per-graph term).  Nothing where :attr:`GraphShape.split_kv` is false.
    - PIECEWISE first capture: the piece outputs between the attention splits at the largest size ``S_P``, the
      warm-up run's activations the caching allocator keeps, and the graph's own memory: calibrated as
      ``a + b x (S_P x 2 x mlp_width / tp x dtype bytes)`` (the MLP up-projection's output is the largest of them).
    - Per graph (second capture, same pool): the graph executable's own device memory, which grows with the kernels
      captured, i.e. with the layers: ``max(1 MiB, c_mode x layers)``.

    ``flashinfer_workspace`` (:func:`flashinfer_workspace_bytes`; 0 when the attention backend is not FlashInfer,
    :func:`attention_backend`) is what the FULL mode's first capture allocates besides the graph where the backend is
    FlashInfer (it then holds no FlashAttention accumulators), which vLLM's free-memory drop counts (vLLM 0.24.0
    ``v1/worker/gpu_model_runner.py``): ``profile_cudagraph_memory`` builds the attention backends on a minimal KV
    cache (L6449, ``_init_minimal_kv_cache_for_profiling`` L6314-6336), whose
    FlashInfer builder allocates nothing yet (``flashinfer.py`` L566-760: ``_workspace_buffer = None``), empties
    torch's cache (L6506), then, per mode, reads ``mem_get_info`` around ``_warmup_and_capture`` (L6512-6528).  A FULL
    capture's warm-up forces attention (L6673), so ``_dummy_run`` builds the metadata (L5846-5879); FlashInfer's
    ``build`` creates the decode wrapper of that batch size (L1293) on ``_get_workspace_buffer``'s ``torch.zeros``
    (L785-793), and the wrapper its own 8 MiB int workspace (:data:`FLASHINFER_INT_WORKSPACE_BYTES`).  So the FULL
    first capture holds the float workspace + 8 MiB, each further FULL graph (a new batch size, a new wrapper) 8 MiB
    more, and the estimate ``max(first captures) + sum(per-graph)`` (L6582-6584) carries them (the float workspace
    inside the FULL first capture, so inside the max); the builder is freed after (``_cleanup_profiling_kv_cache``,
    L6376-6406), so nothing of it stays in the non-torch memory.  vLLM 0.33
    runs the same steps (``profile_cudagraph_memory`` L6268-6415, the workspace ``flashinfer.py`` L1255-1278).

    ``attention`` is the backend :func:`attention_backend` picks (None: not known, taken as FlashAttention, what the
    calibration logs ran): the split-KV accumulators are captured under ``"FLASH_ATTN"`` only.  ``blackwell`` (device
    capability family 100) raises the default capture ceiling to 1024 (:func:`cudagraph_capture_sizes`).

    ``a``, ``b``, ``c_PIECEWISE`` and ``c_FULL`` are the profile's (``profiles/vllm-<version>.json``), fitted on half
    of llm-d-planner's vLLM 0.19.0 H100 DEBUG logs (``benchmarks/data/cudagraph_estimates.json``, same procedure
    as 0.33's) and checked on the other half; the per-graph readings are whole 2 MiB pages, so a mode's
    ``(graphs - 1) x per_graph`` carries +-50 MiB of rounding at 51 graphs.  Not modelled: speculative decoding's
    widened decode sizes, encoder graphs, MLA backends other than FLASH_ATTN_MLA, an allocator segment that one
    rank's second capture may open (+20 MiB a graph on some TP 2 logs), and hybrid (GDN / Mamba) models, whose
    layers all count at the dense rate: no log of theirs states the per-mode lines."""
    if not profile.cudagraph_subtracted or profile.cudagraph is None:
        return Term(
            name="CUDA graphs",
            bytes=0,
            formula=f"0: vLLM {profile.version} captures the graphs after sizing the KV cache",
            source="VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 in that version's logs",
        )
    if graph is None:
        raise ConfigError(
            f"vLLM {profile.version} subtracts its CUDA-graph estimate, which kvpools derives from the model's "
            f"layers, attention heads and MLP width: pass the model by name or config path (a config.json with "
            f"num_hidden_layers and num_attention_heads), or a runtime profile that does not subtract it."
        )
    constants = profile.cudagraph
    seqs = profile.default_max_num_seqs if max_num_seqs is None else max_num_seqs
    batched = profile.default_max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    sizes = cudagraph_capture_sizes(
        max_num_seqs=seqs, max_num_batched_tokens=batched, blackwell=blackwell, max_capture_size=graph.max_capture_size
    )
    if not sizes:
        return Term(name="CUDA graphs", bytes=0, formula="0: no capture size", source="config/vllm.py")
    full_sizes = [size for size in sizes if size <= seqs]
    layers = -(-graph.layers // pp_size)
    heads = max(graph.attention_heads // tp_size, 1)
    per_piecewise = max(round(constants.piecewise_layer_bytes * layers), MiB)
    per_full = max(round(constants.full_layer_bytes * layers), MiB)
    mlp_output = sizes[-1] * 2 * (graph.mlp_width // tp_size) * graph.dtype_bytes
    first_piecewise = constants.piecewise_first_bytes + round(constants.piecewise_first_per_mlp_output * mlp_output)
    flash_attn = attention in (None, "FLASH_ATTN") and not flashinfer_workspace
    accumulators = (
        FA_CUDAGRAPH_MAX_SPLITS * full_sizes[-1] * heads * (graph.value_head_dim + 1) * 4
        if graph.split_kv and flash_attn and full_sizes
        else 0
    )
    # FlashInfer: the float workspace and a decode wrapper's int workspace in the first FULL capture, another int
    # workspace in each further one
    wrapper = FLASHINFER_INT_WORKSPACE_BYTES if flashinfer_workspace and full_sizes else 0
    first_full = accumulators + flashinfer_workspace + wrapper + per_full if full_sizes else 0
    total = (
        max(first_piecewise, first_full)
        + (len(sizes) - 1) * per_piecewise
        + max(len(full_sizes) - 1, 0) * (per_full + wrapper)
    )
    flashinfer = (
        f" [FlashInfer workspace {flashinfer_workspace / MiB:.0f} MiB + {wrapper / MiB:.0f} MiB a FULL graph]"
        if wrapper
        else ""
    )
    return Term(
        name="CUDA graphs",
        bytes=total,
        formula=(
            f"max(PIECEWISE first {first_piecewise / MiB:.1f} MiB, FULL first {first_full / MiB:.1f} MiB "
            f"[split-KV {accumulators / MiB:.1f}]) + (PIECEWISE {len(sizes)} - 1) x {per_piecewise / MiB:.2f} MiB + "
            f"(FULL {len(full_sizes)} - 1) x {per_full / MiB:.2f} MiB ({layers} layers, {heads} heads x "
            f"{graph.value_head_dim}, largest capture size {sizes[-1]}; {profile.file}, docs/vllm.md)" + flashinfer
        ),
        source=(
            "vLLM 0.33 gpu_model_runner.profile_cudagraph_memory; config/vllm.py _set_cudagraph_sizes"
            + (
                "; v1/attention/backends/flashinfer.py _get_workspace_buffer; flashinfer decode.py"
                if flashinfer
                else ""
            )
        ),
    )


def vocab_size_of(model: str) -> int:
    """``vocab_size`` of ``model`` (a preset, a ``config.json`` or its directory): from the complete config a preset
    names (``_weights_config``), or the config itself; the text config of a multimodal one."""
    config, source = _complete_config(model)
    for candidate in (config, config.get("text_config") or {}):
        value = candidate.get("vocab_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ConfigError(
        f"{source}: the runtime-memory profile needs the model's vocab_size (the sampler's peak is rows x vocabulary) "
        f"and the config has none. Use a preset with a complete config, a config.json that has it, or drop the "
        f"runtime profile."
    )


def model_shape_from_config(
    config: dict[str, Any], *, dtype_bytes: int = 2, quantization: str | None = None
) -> ModelShape | None:
    """The :class:`ModelShape` of a Hugging Face ``config.json`` (its ``text_config`` for a multimodal one), or None
    when it has no ``hidden_size``.  Experts: ``num_experts_per_tok`` of ``num_local_experts`` / ``num_experts`` /
    ``n_routed_experts``, each ``moe_intermediate_size`` wide (Mixtral's ``intermediate_size``).  Non-expert MLPs:
    ``intermediate_size`` where the model has dense layers (a dense model, DeepSeek's ``first_k_dense_replace``,
    Qwen-MoE's ``mlp_only_layers`` / ``decoder_sparse_step`` > 1), else the shared experts
    (``shared_expert_intermediate_size``, ``n_shared_experts x moe_intermediate_size``).  A MoE model's
    ``quantization_config.quant_method`` (top level or ``text_config``) is kept as ``quant_method``, and its experts'
    scheme, with ``--quantization`` (``quantization``), as ``moe_quant`` (:func:`moe_quant_scheme`)."""

    def number(source: dict[str, Any], key: str) -> int:
        value = source.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    text = config if number(config, "hidden_size") else (config.get("text_config") or {})
    hidden = number(text, "hidden_size")
    if not hidden:
        return None
    heads = number(text, "num_attention_heads")
    head_dim = 0 if number(text, "kv_lora_rank") else number(text, "head_dim") or (hidden // heads if heads else 0)
    experts = max(number(text, key) for key in ("num_local_experts", "num_experts", "n_routed_experts"))
    topk = number(text, "num_experts_per_tok") if experts else 0
    intermediate = number(text, "intermediate_size")
    if not topk:
        return ModelShape(
            hidden_size=hidden,
            dense_intermediate_size=intermediate,
            dtype_bytes=dtype_bytes,
            num_attention_heads=heads,
            head_dim=head_dim,
        )
    quant_config = config.get("quantization_config") or text.get("quantization_config") or {}
    method = quant_config.get("quant_method") if isinstance(quant_config, dict) else None
    expert = number(text, "moe_intermediate_size") or intermediate
    dense_layers = (
        number(text, "first_k_dense_replace") > 0
        or bool(text.get("mlp_only_layers"))
        or number(text, "decoder_sparse_step") > 1
    )
    if dense_layers and number(text, "moe_intermediate_size"):
        dense = intermediate
    else:
        dense = number(text, "shared_expert_intermediate_size") or number(text, "n_shared_experts") * expert
    return ModelShape(
        hidden_size=hidden,
        dense_intermediate_size=dense,
        num_experts_per_tok=topk,
        moe_intermediate_size=expert,
        dtype_bytes=dtype_bytes,
        num_attention_heads=heads,
        head_dim=head_dim,
        quant_method=method.lower() if isinstance(method, str) else "",
        moe_quant=moe_quant_scheme(quant_config if isinstance(quant_config, dict) else {}, runtime=quantization),
    )


def model_shape_of(model: str, *, dtype_bytes: int = 2, quantization: str | None = None) -> ModelShape | None:
    """:func:`model_shape_from_config` of ``model`` (a preset, a ``config.json`` or its directory), read as
    :func:`vocab_size_of` reads it; ``quantization`` is ``--quantization``."""
    return model_shape_from_config(_complete_config(model)[0], dtype_bytes=dtype_bytes, quantization=quantization)


_MODELOPT_SCHEMES = {
    "FP8": "fp8-static",
    "FP8_PB_WO": "fp8-block",
    "FP8_BLOCK_SCALES": "fp8-block",
    "NVFP4": "nvfp4",
    "W4A16_NVFP4": "nvfp4-a16",
}
"""ModelOpt ``quant_algo`` values and the experts' scheme each gives (vLLM 0.33 ``quantization/modelopt.py``
L1889-1911: block FP8 (L132) through ``Fp8MoEMethod``, ``FP8`` (static per-tensor activations, L498-504),
``NVFP4`` and ``W4A16_NVFP4`` experts; L857-858:
``W4A16_NVFP4`` runs NVFP4 weights with no activation quantisation); ``MXFP8`` and others are "other"."""


def _experts_entry(entries: dict[str, Any]) -> Any:
    """The entry of a ``{module or target: spec}`` map that covers the routed experts: the first key naming
    ``experts``, else (compressed-tensors) the one whose ``targets`` name them or the generic ``Linear``."""
    for key, value in entries.items():
        if "experts" in key.lower():
            return value
    groups = [value for value in entries.values() if isinstance(value, dict)]
    for wanted in ("experts", "linear"):
        for group in groups:
            targets = group.get("targets")
            if isinstance(targets, list) and any(isinstance(t, str) and wanted in t.lower() for t in targets):
                return group
    return groups[0] if len(groups) == 1 else None


def _compressed_tensors_scheme(group: Any) -> str:
    """A compressed-tensors ``config_groups`` entry's scheme: FP4 weights (``type: float``, 4 bits, groups of 16)
    with FP4 input activations is NVFP4, without them weight-only FP4; FP8 weights with ``strategy: block`` are
    block-scaled, per tensor with static per-tensor input scales "fp8-static", others "other" (compressed-tensors
    lets vLLM's CUTLASS FP8 experts run them, ``compressed_tensors_moe_w8a8_fp8.py`` L88-112, which kvpools does not
    model); integer weights without input activations are WNA16."""
    if not isinstance(group, dict):
        return "other"
    weights, inputs = group.get("weights"), group.get("input_activations")
    if not isinstance(weights, dict):
        return "other"
    bits, kind = weights.get("num_bits"), weights.get("type")
    if kind == "float" and bits == 4:
        if weights.get("group_size") != 16:  # MXFP4 (group 32, E8M0 scales) is another scheme
            return "other"
        return "nvfp4" if isinstance(inputs, dict) and inputs.get("num_bits") == 4 else "nvfp4-a16"
    if kind == "float" and bits == 8:
        if weights.get("strategy") == "block":
            return "fp8-block"
        static = isinstance(inputs, dict) and inputs.get("dynamic") is False and inputs.get("strategy") == "tensor"
        # per-channel weights or dynamic activations may run vLLM CUTLASS, which compressed-tensors allows
        return "fp8-static" if static and weights.get("strategy") == "tensor" else "other"
    if kind == "int" and bits in (4, 8) and not inputs:
        return "wna16"
    return "other"


_ONLINE_MOE_SCHEMES = {"fp8": "fp8", "fp8_per_tensor": "fp8", "fp8_per_block": "fp8-block"}
"""The experts' scheme of an unquantised checkpoint quantised at load, by ``--quantization``: per-tensor fp8 weights
with dynamic per-tensor activations (``Fp8PerTensorOnlineMoEMethod``, vLLM 0.33 ``quantization/online/fp8.py``
L594-615, which ``fp8`` gets too), 128 x 128 block weights with dynamic per-group activations
(``_Fp8OnlineMoEBase`` with a block size, L495-506).  ``fp8_per_channel``'s per-channel weights and per-token
activations (``Fp8PtpcOnlineMoEMethod``, L767-806, which refuses the Marlin and FlashInfer backends) are none of
:data:`MOE_QUANT_SCHEMES` and read "other"."""


def moe_quant_scheme(quantization_config: dict[str, Any], *, runtime: str | None = None) -> str:
    """The routed experts' scheme (:data:`MOE_QUANT_SCHEMES`) of a checkpoint's ``quantization_config`` and
    ``--quantization`` ``runtime``: an unquantised checkpoint under ``--quantization fp8`` (served as
    ``fp8_per_tensor`` from vLLM 0.31) or ``fp8_per_tensor`` is "fp8", under ``fp8_per_block`` "fp8-block", under
    ``fp8_per_channel`` "other" (:data:`_ONLINE_MOE_SCHEMES`); ``fp8`` with ``weight_block_size`` is "fp8-block", with
    ``activation_scheme: static`` "fp8-static" (``quantization/fp8.py`` L509-519); ``modelopt`` /
    ``modelopt_fp4`` by ``quant_algo`` (top level or its ``quantization`` section; ``MIXED_PRECISION`` by the
    experts' entry of ``quantized_layers``); ``compressed-tensors`` by the ``config_groups`` entry that covers the
    experts; AWQ / GPTQ are "wna16", mxfp4 "mxfp4"; anything else "other"."""
    method = quantization_config.get("quant_method")
    method = method.lower() if isinstance(method, str) else ""
    if not method:
        if runtime is None:
            return ""
        return _ONLINE_MOE_SCHEMES.get(runtime, "other")
    if method == "fp8":
        if quantization_config.get("weight_block_size"):
            return "fp8-block"
        return "fp8-static" if quantization_config.get("activation_scheme") == "static" else "fp8"
    if method in ("modelopt", "modelopt_fp4"):
        nested = quantization_config.get("quantization")
        section = nested if isinstance(nested, dict) else quantization_config
        algo = section.get("quant_algo")
        if algo == "MIXED_PRECISION":
            layers = section.get("quantized_layers") or quantization_config.get("quantized_layers")
            entry = _experts_entry(layers) if isinstance(layers, dict) else None
            algo = entry.get("quant_algo") if isinstance(entry, dict) else None
        if algo is None and method == "modelopt_fp4":
            return "nvfp4"
        return _MODELOPT_SCHEMES.get(algo, "other") if isinstance(algo, str) else "other"
    if method == "compressed-tensors":
        groups = quantization_config.get("config_groups")
        return _compressed_tensors_scheme(_experts_entry(groups)) if isinstance(groups, dict) else "other"
    return _SCHEME_OF_METHOD.get(method, "other")


def _complete_config(model: str) -> tuple[dict[str, Any], str]:
    from kvpools_core.config import read_config_file
    from kvpools_core.models import registry_presets, resolve_model_source
    from kvpools_core.pipeline.weights import WEIGHTS_CONFIG_KEY
    from kvpools_core.registry import get_registry

    registry = get_registry()
    config, source, name = resolve_model_source(model, registry)
    pointer = config.get(WEIGHTS_CONFIG_KEY)
    if source.startswith("preset:") and pointer:
        config = read_config_file(Path(registry_presets(registry)[name][1]).parent / str(pointer))
    return dict(config), source


def _flashinfer_workspace(
    *, gpu: GPU, shape: ModelShape | None, kv_cache_dtype: str, tp_size: int, profile: RuntimeProfile, batched: int
) -> int:
    """:func:`flashinfer_workspace_bytes` where vLLM's attention backend is FlashInfer (:func:`attention_backend`),
    else 0 (also without a shape's heads, or off CUDA).

    Not modelled, left 0: compute capability 10.x, where vLLM decodes with TRTLLM-gen when its cubins can be fetched
    (``supports_trtllm_attention``, vLLM 0.24.0 ``utils/flashinfer.py`` L374-386: network access at start-up decides),
    whose global workspace (``_get_trtllm_gen_workspace_buffer``, ``flashinfer.py`` L89-95) replaces the decode
    wrappers' in the FULL captures."""
    if shape is None or gpu.platform != "cuda" or not shape.num_attention_heads:
        return 0
    if gpu.compute_capability is not None and gpu.compute_capability[0] == 10:
        return 0
    backend = attention_backend(
        compute_capability=gpu.compute_capability, kv_cache_dtype=kv_cache_dtype, head_dim=shape.head_dim
    )
    if backend != "FLASHINFER":
        return 0
    return flashinfer_workspace_bytes(
        profile=profile,
        max_num_batched_tokens=batched,
        num_qo_heads=max(1, shape.num_attention_heads // tp_size),
        head_dim=shape.head_dim,
    )


def _attention(*, gpu: GPU, shape: ModelShape | None, kv_cache_dtype: str) -> str | None:
    """:func:`attention_backend` for the CUDA-graph estimate, or None where it is not known (no shape's heads, an MLA
    model, a GPU without a compute capability).  The split-KV accumulators it gates were measured on CUDA H100 logs
    only; another platform's backend is not modelled (a GPU with a compute capability is taken as CUDA's)."""
    if shape is None or not shape.num_attention_heads:
        return None
    return attention_backend(
        compute_capability=gpu.compute_capability, kv_cache_dtype=kv_cache_dtype, head_dim=shape.head_dim
    )


@attrs.frozen(kw_only=True)
class RuntimeMemory:
    """The whole-GPU budget's terms outside the weights, for one worker."""

    total: TotalMemory
    terms: tuple[Term, ...]
    profile: RuntimeProfile
    note: str = ""

    @property
    def non_kv_bytes(self) -> int:
        """Everything subtracted from the request besides the weights."""
        return sum(term.bytes for term in self.terms)

    def term(self, name: str) -> Term:
        return next(term for term in self.terms if term.name == name)


def estimate_runtime_memory(
    *,
    gpu: GPU,
    vocab_size: int,
    tp_size: int = 1,
    pp_size: int = 1,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    engine_version: str = "0.19",
    profile_version: str | None = None,
    shape: ModelShape | None = None,
    pp_stage: str = "last",
    vision: VisionShape | None = None,
    max_model_len: int | None = None,
    mm_limits: dict[str, int] | None = None,
    graph: GraphShape | None = None,
    kv_cache_dtype: str = "auto",
    weights_bytes: int | None = None,
) -> RuntimeMemory:
    """vLLM ``engine_version``'s memory outside the KV cache and the weights on ``gpu``.

    ``profile_version`` borrows another version's calibration; the result's ``note`` then says the plan was made
    with a profile that is not the engine's.  ``shape`` (:func:`model_shape_of`) gives the activation peak its
    forward, hidden-state and MoE terms; ``pp_stage`` picks the pipeline stage (``last``, the one that samples and
    whose budget binds, by default).  ``vision`` (:func:`vision_shape_of`) adds the multimodal encoder's profile pass
    (:func:`mm_encoder_profile`), sized by ``max_model_len`` and ``mm_limits`` (vLLM's ``limit_mm_per_prompt``: 999
    per modality it does not name, ``{"image": 0, "video": 0}`` for ``--language-model-only``).  ``graph``
    (:func:`graph_shape_of`) sizes the CUDA-graph estimate of a profile that subtracts it (:func:`cudagraph_memory`).
    ``kv_cache_dtype`` (``--kv-cache-dtype``) with the GPU and ``shape``'s heads picks the attention backend
    (:func:`attention_backend`): FlashInfer's workspace, or FlashAttention's split-KV accumulators, are in the
    CUDA-graph estimate.  ``weights_bytes`` (one worker's) is in the memory allocated when Gemma-4's encoder reads
    the free memory (:func:`mm_encoder_profile`): the weights and the non-torch term (the CUDA context is in no term),
    0 where not given.
    """
    for name, value in (("vocab_size", vocab_size), ("tp_size", tp_size), ("pp_size", pp_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}.")
    profile = load_profile(profile_version or engine_version)
    engine_key = version_key(engine_version)
    notes = []
    if engine_key not in profile.covers:
        notes.append(f"made with vLLM {profile.version}'s calibrated profile for vLLM {engine_version}")
    installed = installed_vllm_version()
    if installed is not None and version_key(installed) not in profile.covers:
        notes.append(
            f"the profile (vLLM {profile.version}) is {_older_or_newer(profile.version, installed)} the installed "
            f"vLLM {installed}"
        )
    note = "; ".join(notes)
    seqs = profile.default_max_num_seqs if max_num_seqs is None else max_num_seqs
    batched = profile.default_max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    non_torch = non_torch_memory(tp_size=tp_size, pp_size=pp_size, profile=profile)
    total = torch_total_memory(gpu)
    terms = (
        activation_peak(
            vocab_size=vocab_size,
            max_num_seqs=seqs,
            max_num_batched_tokens=batched,
            profile=profile,
            shape=shape,
            tp_size=tp_size,
            pp_size=pp_size,
            pp_stage=pp_stage,
            sm_count=SM_COUNTS.get(gpu.name, H100_SMS),
            compute_capability=gpu.compute_capability,
            vision=vision,
            max_model_len=max_model_len,
            mm_limits=mm_limits,
            gpu_total_bytes=total.bytes,
            gpu_used_bytes=(weights_bytes or 0) + non_torch.bytes,
        ),
        non_torch,
        cudagraph_memory(
            profile=profile,
            max_num_seqs=seqs,
            max_num_batched_tokens=batched,
            graph=graph,
            tp_size=tp_size,
            pp_size=pp_size,
            flashinfer_workspace=_flashinfer_workspace(
                gpu=gpu, shape=shape, kv_cache_dtype=kv_cache_dtype, tp_size=tp_size, profile=profile, batched=batched
            ),
            attention=_attention(gpu=gpu, shape=shape, kv_cache_dtype=kv_cache_dtype),
            blackwell=profile.blackwell_capture_1024
            and gpu.compute_capability is not None
            and gpu.compute_capability[0] == 10,
        ),
    )
    return RuntimeMemory(total=total, terms=terms, profile=profile, note=note)
