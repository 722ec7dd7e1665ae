"""The memory vLLM keeps outside the KV cache, estimated from the GPU and the model alone (issue 34).

``budget.available_kv_cache_memory`` subtracts what vLLM's profile run measured outside the KV cache from
``ceil(total x --gpu-memory-utilization)``; a planner that starts from the GPU has no profile run, so this module
estimates each term.  Every term is a formula with the vLLM source lines it follows; the constants a formula cannot
give (what the allocator and the forward pass leave at the sampler's peak, the NCCL buffers) are calibrated **per
engine version** in ``profiles/vllm-<version>.json``, which says what they were fitted on.  A version with no
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
from importlib import resources
from pathlib import Path
from typing import Any

import attrs

from kvpools_core.errors import ConfigError
from kvpools_core.values import GPU

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
class Term:
    """One term of the non-KV memory: its bytes, the formula that gave them, and where the formula comes from."""

    name: str
    bytes: int
    formula: str
    source: str


@attrs.frozen(kw_only=True)
class TotalMemory:
    """The device total vLLM multiplies by ``--gpu-memory-utilization`` (``torch.cuda.mem_get_info()[1]``)."""

    bytes: int
    measured: bool
    source: str


@attrs.frozen(kw_only=True)
class RuntimeProfile:
    """One vLLM version's calibrated constants (``profiles/vllm-<version>.json``)."""

    version: str
    sampler_base_bytes: int
    non_torch_bytes_by_tp: tuple[tuple[int, int], ...]
    non_torch_pp_bytes: int
    cudagraph_subtracted: bool
    cudagraph_first_capture_bytes: int
    cudagraph_per_graph_bytes: int
    default_max_num_seqs: int
    default_max_num_batched_tokens: int
    fitted_on: str
    file: str
    sampler_bytes_per_logit: int = SORT_BYTES_PER_LOGIT
    """Bytes per sampled logit at the dummy sampler run's peak (:data:`SORT_BYTES_PER_LOGIT`, or
    :data:`SORT_PATH_BYTES_PER_LOGIT` before vLLM 0.17)."""
    covers: tuple[str, ...] = ()
    """The vLLM versions (``major.minor``) the profile stands for."""


PROFILE_VERSIONS = ("0.16", "0.19", "0.33")
"""The vLLM versions that have a calibrated profile (``profiles/vllm-<version>.json``)."""

PROFILE_ALIASES = {"0.15": "0.16"}
"""Versions another version's profile stands for: vLLM 0.15 runs the same sort-based dummy sampler as 0.16."""


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
        return tuple(int(part) for part in version_key(text).split(".") if part.isdigit())

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
        sampler_base_bytes=_gib(data["sampler_base_gib"], "sampler_base_gib", file),
        non_torch_bytes_by_tp=by_tp,
        non_torch_pp_bytes=_gib(data["non_torch_pp_gib"], "non_torch_pp_gib", file),
        cudagraph_subtracted=bool(data["cudagraph_subtracted"]),
        cudagraph_first_capture_bytes=_gib(
            data.get("cudagraph_first_capture_gib", 0), "cudagraph_first_capture_gib", file
        ),
        cudagraph_per_graph_bytes=_gib(data.get("cudagraph_per_graph_gib", 0), "cudagraph_per_graph_gib", file),
        default_max_num_seqs=int(data["default_max_num_seqs"]),
        default_max_num_batched_tokens=int(data["default_max_num_batched_tokens"]),
        fitted_on=str(data["fitted_on"]["data"]),
        file=file,
        sampler_bytes_per_logit=int(data.get("sampler_bytes_per_logit", SORT_BYTES_PER_LOGIT)),
        covers=tuple(str(version) for version in data.get("covers", [key])),
    )


def torch_total_memory(gpu: GPU) -> TotalMemory:
    """``torch.cuda.mem_get_info()[1]`` of ``gpu``: measured where a log printed it, else the catalogue's nvidia-smi
    total less :data:`SMI_TO_TORCH_GAP_BYTES`."""
    if gpu.name in _MEASURED_TOTALS:
        gib, source = _MEASURED_TOTALS[gpu.name]
        return TotalMemory(bytes=round(gib * GiB), measured=True, source=source)
    return TotalMemory(
        bytes=gpu.total_bytes - SMI_TO_TORCH_GAP_BYTES,
        measured=False,
        source=f"derived: catalogue total {gpu.total_bytes / GiB:.2f} GiB less the 0.46 GiB nvidia-smi-to-torch gap",
    )


def activation_peak(
    *, vocab_size: int, max_num_seqs: int, max_num_batched_tokens: int, profile: RuntimeProfile
) -> Term:
    """The torch peak of ``profile_run`` above the weights (``transient_peak_headroom``), at the dummy sampler run.

    ``profile_run`` (0.33 ``gpu_model_runner.py`` L6132-6140) runs ``max_num_batched_tokens`` tokens, then samples
    ``min(max_num_seqs, max_num_batched_tokens)`` rows over the vocabulary.  The sampler's tensors give the profile's
    ``sampler_bytes_per_logit`` per logit (:data:`SORT_BYTES_PER_LOGIT` from vLLM 0.17, the Triton top-k/top-p path;
    :data:`SORT_PATH_BYTES_PER_LOGIT` in 0.15 / 0.16, torch's sort); the rest of the peak (residual stream, allocator
    rounding) is the profile's ``sampler_base``.  Not modelled: MoE workspaces, multimodal encoders, pipeline stages
    without the sampler (the last stage samples; the others' peak is their forward pass).
    """
    rows = min(max_num_seqs, max_num_batched_tokens)
    per_logit = profile.sampler_bytes_per_logit
    sampled = rows * vocab_size * per_logit
    what = (
        "torch sort: logits, values, int64 indices, reverse indices, cub buffers"
        if per_logit == SORT_PATH_BYTES_PER_LOGIT
        else "fp32 logits, softmax, exponential noise"
    )
    return Term(
        name="activation peak",
        bytes=sampled + profile.sampler_base_bytes,
        formula=(
            f"{rows} rows x {vocab_size} vocab x {per_logit} B ({what}) "
            f"+ {profile.sampler_base_bytes / GiB:.4f} GiB sampler base (calibrated, {profile.file})"
        ),
        source=(
            "vLLM gpu_model_runner.profile_run / _dummy_sampler_run; topk_topp_sampler.apply_top_k_top_p (Triton from "
            "0.17, torch sort before)"
        ),
    )


def non_torch_memory(*, tp_size: int, pp_size: int, profile: RuntimeProfile) -> Term:
    """The non-torch increase since the worker's first snapshot (``non_torch_increase``, ``mem_utils.py`` L306):
    cuBLAS/cuDNN workspaces at TP 1, plus the NCCL and custom all-reduce buffers at TP >= 2; calibrated per TP size
    (the largest calibrated TP not above ``tp_size``), and per pipeline stage when ``pp_size > 1``."""
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


def cudagraph_capture_sizes(*, max_num_seqs: int, max_num_batched_tokens: int, blackwell: bool = False) -> list[int]:
    """vLLM 0.33's default ``cudagraph_capture_sizes`` without speculative decoding (``config/vllm.py``
    ``_set_cudagraph_sizes`` L2452-2605, decode query length 1): the ceiling ``min(max_num_seqs x 2, 512)`` (1024 on
    a Blackwell, device capability family 100) then ``min(max_num_batched_tokens, ceiling)``; sizes 1, 2, 4, every 8
    up to 248, every 16 from 256 to the ceiling, plus ``max_num_batched_tokens`` when it is within the ceiling and
    ``max_num_seqs`` when it is (the uniform-decode size)."""
    ceiling = min(max_num_seqs * 2, 1024 if blackwell else 512)
    decode = [max_num_seqs] if max_num_seqs <= ceiling else []
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


def cudagraph_memory(
    *, profile: RuntimeProfile, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None
) -> Term:
    """The CUDA-graph estimate vLLM subtracts before sizing the KV cache.

    Zero for a version that captures the graphs after sizing it (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` off,
    as in vLLM 0.19).  vLLM 0.33 turns it on (``envs.py`` L2219) and ``profile_cudagraph_memory``
    (``v1/worker/gpu_model_runner.py`` L6268-6415) captures the first two graphs of each mode and estimates
    ``max over modes(first capture) + sum over modes(second capture x (graphs - 1))``.  The default mode
    ``FULL_AND_PIECEWISE`` captures a PIECEWISE graph per capture size and a FULL graph per uniform-decode size
    (the capture sizes up to ``max_num_seqs``); the first-capture and per-graph bytes are the profile's calibrated
    constants (``profiles/vllm-<version>.json``).  Not modelled: speculative decoding's widened decode sizes and
    encoder graphs."""
    if not profile.cudagraph_subtracted:
        return Term(
            name="CUDA graphs",
            bytes=0,
            formula=f"0: vLLM {profile.version} captures the graphs after sizing the KV cache",
            source="VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0 in that version's logs",
        )
    seqs = profile.default_max_num_seqs if max_num_seqs is None else max_num_seqs
    batched = profile.default_max_num_batched_tokens if max_num_batched_tokens is None else max_num_batched_tokens
    sizes = cudagraph_capture_sizes(max_num_seqs=seqs, max_num_batched_tokens=batched)
    piecewise, full = len(sizes), sum(1 for size in sizes if size <= seqs)
    graphs = (piecewise - 1) + max(full - 1, 0)
    total = profile.cudagraph_first_capture_bytes + graphs * profile.cudagraph_per_graph_bytes
    return Term(
        name="CUDA graphs",
        bytes=total,
        formula=(
            f"{profile.cudagraph_first_capture_bytes / GiB:.4f} GiB first capture + (PIECEWISE {piecewise} - 1 + FULL "
            f"{full} - 1) x {profile.cudagraph_per_graph_bytes / (1 << 20):.1f} MiB per graph (calibrated, "
            f"{profile.file}, low confidence: vLLM measures the model's own captures, docs/vllm.md; largest "
            f"capture size {sizes[-1] if sizes else 0})"
        ),
        source="vLLM 0.33 gpu_model_runner.profile_cudagraph_memory; config/vllm.py _set_cudagraph_sizes",
    )


def vocab_size_of(model: str) -> int:
    """``vocab_size`` of ``model`` (a preset, a ``config.json`` or its directory): from the complete config a preset
    names (``_weights_config``), or the config itself; the text config of a multimodal one."""
    from kvpools_core.config import read_config_file
    from kvpools_core.models import registry_presets, resolve_model_source
    from kvpools_core.pipeline.weights import WEIGHTS_CONFIG_KEY
    from kvpools_core.registry import get_registry

    registry = get_registry()
    config, source, name = resolve_model_source(model, registry)
    pointer = config.get(WEIGHTS_CONFIG_KEY)
    if source.startswith("preset:") and pointer:
        config = read_config_file(Path(registry_presets(registry)[name][1]).parent / str(pointer))
    for candidate in (config, config.get("text_config") or {}):
        value = candidate.get("vocab_size")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ConfigError(
        f"{source}: the runtime-memory profile needs the model's vocab_size (the sampler's peak is rows x vocabulary) "
        f"and the config has none. Use a preset with a complete config, a config.json that has it, or drop the "
        f"runtime profile."
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
) -> RuntimeMemory:
    """vLLM ``engine_version``'s memory outside the KV cache and the weights on ``gpu``.

    ``profile_version`` borrows another version's calibration; the result's ``note`` then says the plan was made
    with a profile that is not the engine's.
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
    terms = (
        activation_peak(vocab_size=vocab_size, max_num_seqs=seqs, max_num_batched_tokens=batched, profile=profile),
        non_torch_memory(tp_size=tp_size, pp_size=pp_size, profile=profile),
        cudagraph_memory(profile=profile, max_num_seqs=seqs, max_num_batched_tokens=batched),
    )
    return RuntimeMemory(total=torch_total_memory(gpu), terms=terms, profile=profile, note=note)
