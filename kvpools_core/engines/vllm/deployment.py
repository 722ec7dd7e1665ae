"""``--accounting vllm``: a model, serving options and a budget planned as ``vllm serve`` 0.33 would size them.

:func:`plan_vllm` is the entry point ``kvpools plan`` / ``kvpools capacity`` dispatch to under
``--accounting vllm``; it does not bend SGLang's ``PoolSizing``: it asks the architecture plugin for vLLM's
layer specs (:func:`~kvpools_core.engines.vllm.model.worker_kv_cache_specs`), resolves each pipeline stage's
``available_kv_cache_memory`` (:func:`~kvpools_core.engines.vllm.budget.available_kv_cache_memory`) and plans them
with :func:`~kvpools_core.engines.vllm.planning.plan_kv_cache`.  The result carries vLLM's own names, the budget steps
and the ``vllm serve`` flags that realise the plan.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from kvpools_core.engines.vllm.budget import DEFAULT_GPU_MEMORY_UTILIZATION, VllmMemoryBudget, available_kv_cache_memory
from kvpools_core.engines.vllm.layouts import layout_change, layout_for_version
from kvpools_core.engines.vllm.model import DEFAULT_BLOCK_SIZE, worker_kv_cache_specs
from kvpools_core.engines.vllm.multimodal import MultimodalLimits, parse_multimodal_limits, tower_modalities
from kvpools_core.engines.vllm.offload import VllmCpuOffload, plan_cpu_offload
from kvpools_core.engines.vllm.planning import (
    KVCacheGroupSpec,
    VllmKVCachePlan,
    VllmLimits,
    format_gib,
    mamba_cache_mode_of,
    plan_kv_cache,
)
from kvpools_core.engines.vllm.runtime_memory import (
    RuntimeMemory,
    estimate_runtime_memory,
    graph_shape_of,
    load_profile,
    model_shape_of,
    version_key,
    vision_shape_of,
    vocab_size_of,
)
from kvpools_core.errors import ConfigError, NoProviderError, UnsupportedCombinationError, short_repr
from kvpools_core.models import launch_model_path, load_model, served_model
from kvpools_core.options import on_cli, option
from kvpools_core.parts.device_memory import TotalMemory
from kvpools_core.parts.vllm.layers import pp_layer_ranges
from kvpools_core.parts.vllm.specs import CircularBufferSpec, MambaSpec, SlidingWindowMLASpec, UniformTypeKVCacheSpecs
from kvpools_core.parts.weights.methods import (
    VLLM_FP8_DEPRECATION,
    VLLM_FP8_ONLINE_UNTIL,
    current_vllm_release,
    vllm_release,
)
from kvpools_core.pipeline.gpus import GPU, GiB, custom_gpu, find_gpu
from kvpools_core.registry import Registry, get_registry
from kvpools_core.units import parse_bytes
from kvpools_core.values import ModelSpec, PlatformTraits, Serving

if TYPE_CHECKING:
    from collections.abc import Sequence

VLLM_VERSION = "0.33.0"

VLLM_NAMES = {
    "context_length": "max_model_len",
    "max_running_requests": "max_num_seqs",
    "page_size": "block_size",
    "chunked_prefill_size": "max_num_batched_tokens",
    "mem_fraction_static": "gpu_memory_utilization",
}
"""SGLang's serving options that have a vLLM counterpart under ``--accounting vllm``."""

VLLM_READ_FIELDS = {
    "tp_size",
    "pp_size",
    "pp_layer_partition",
    "kv_cache_dtype",
    "quantization",
    "accounting",
    "platform",
}
"""The ``Serving`` fields vLLM's planning reads; the others are SGLang's and refused when set.  ``quantization`` is
vLLM's ``--quantization`` too: the weights estimate checks it with vLLM's rules (issue 34)."""
_RESOLVED_FIELDS = {"platform_traits", "workspaces", "plugin_options"}


def server_defaults(total_bytes: int | None, device_name: str = "", *, tier_160gib: bool = True) -> tuple[int, int]:
    """``EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`` for ``vllm serve``
    (``UsageContext.OPENAI_API_SERVER``, ``engine/arg_utils.py`` L2973-3006): ``(max_num_batched_tokens,
    max_num_seqs)`` by the device's total memory: >= 160 GiB 16384 / 1024; >= 70 GiB (not an A100) 8192 / 1024;
    otherwise 2048 / 256 (also vLLM's choice when it cannot read the device, as without a GPU here).
    ``tier_160gib`` False is vLLM before 0.28.0, whose ``get_batch_defaults`` has no 160 GiB tier (0.27.1
    ``engine/arg_utils.py`` L2544-2545: a >= 160 GiB GPU takes 8192 / 1024; the tier is 0.28.0 L2582-2591,
    ``RuntimeProfile.batch_defaults_160gib``)."""
    if tier_160gib and total_bytes is not None and total_bytes >= 160 * GiB:
        return 16384, 1024
    if total_bytes is not None and total_bytes >= 70 * GiB and "a100" not in device_name.lower():
        return 8192, 1024
    return 2048, 256


def max_concurrent_batches(pp_size: int) -> int:
    """``VllmConfig.max_concurrent_batches`` (``config/vllm.py`` L588) with vLLM's defaults: async scheduling
    on (L1719) and Model Runner V2 (``use_v2_model_runner``, L731): ``pp + 1``.  It only sizes the
    sliding-window and chunked-local groups (``max_in_flight_tokens``)."""
    return pp_size + 1


@attrs.frozen(kw_only=True)
class VllmPlanResult:
    """One ``vllm serve`` deployment planned: the inputs, each stage's budget, vLLM's KV-cache plan.

    ``budgets`` holds one :class:`VllmMemoryBudget` per pipeline stage (each stage holds its own weights);
    ``weights_memory`` the weights charged per stage (empty with ``memory``, vLLM's ``--kv-cache-memory-bytes``).
    """

    model: ModelSpec
    model_ref: str
    plugin: str
    serving: Serving
    gpu: GPU | None
    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: int | None
    weights_memory: tuple[int, ...]
    weights_source: str
    budgets: tuple[VllmMemoryBudget, ...]
    limits: VllmLimits
    block_size: int
    """``--block-size`` as asked (16, vLLM's default, when not given)."""
    max_num_seqs: int
    num_gpu_blocks_override: int | None
    plan: VllmKVCachePlan
    offload: VllmCpuOffload | None = None
    """vLLM's CPU offload tier (``--kv-offloading-size``), or None without one."""
    max_model_len_auto: bool = False
    """``--max-model-len auto`` (or -1): ``plan.max_model_len`` is the auto-fitted length, at most the model's."""
    runtime_memory: RuntimeMemory | None = None
    """The runtime-memory profile's terms (``runtime_profile``), or None when they are taken as 0."""
    stage_activation_peaks: tuple[int, ...] = ()
    """Each pipeline stage's activation peak with a runtime profile (``runtime_memory``'s is the last stage's, the
    one that samples), else empty."""
    multimodal: MultimodalLimits | None = None
    """``--limit-mm-per-prompt`` / ``--language-model-only`` as given (None: neither, vLLM's 999 per modality)."""
    layout_note: str = ""
    """What an older vLLM's KV layout changed (``layout_version``, :mod:`kvpools_core.engines.vllm.layouts`), or
    empty."""
    quantization_note: str = ""
    """What vLLM's release does with ``--quantization`` (vLLM 0.31+'s deprecation of ``fp8`` for online
    quantisation, :func:`_quantization_note`), or empty."""

    @property
    def total_memory(self) -> int | None:
        """The device total the budget multiplies by ``--gpu-memory-utilization``: torch's with a runtime profile,
        else the catalogue's (None with ``--memory``)."""
        if self.runtime_memory is not None:
            return self.runtime_memory.total.bytes
        return self.gpu.total_bytes if self.gpu is not None else None

    @property
    def effective_block_size(self) -> int:
        """The attention block size vLLM runs with (``cache_config.block_size`` after start-up).

        The backends' kernels (MiniMax sparse's indexer: 128) and a Mamba hybrid's page alignment raise the
        asked ``--block-size``; the serve line and ``--json`` name the size vLLM really uses.
        """
        return attention_block_size(self.plan, self.block_size)

    @property
    def max_model_len(self) -> int:
        """The resolved ``max_model_len``: the one given, the model's, or under ``auto`` the auto-fitted one."""
        return self.plan.max_model_len

    @property
    def auto_fit_log_line(self) -> str | None:
        """vLLM's ``_auto_fit_max_model_len`` info line (``kv_cache_planning.py`` L1386-1409, a CUDA device),
        None without ``auto``."""
        if not self.max_model_len_auto or self.plan.auto_fit_memory is None:
            return None
        derived = self.limits.max_model_len
        memory = f"{format_gib(self.plan.auto_fit_memory)} GiB GPU"
        if self.plan.max_model_len >= derived:
            return (
                f"Auto-fit max_model_len: full model context length {derived} fits in available KV cache memory "
                f"({memory})"
            )
        return (
            f"Auto-fit max_model_len: reduced from {derived} to {self.plan.max_model_len} to fit in available KV "
            f"cache memory ({memory})"
        )

    @property
    def notes(self) -> tuple[str, ...]:
        """What the numbers assume that vLLM would measure at start-up (and an older vLLM's layout, if any)."""
        extra = (self.layout_note, self.quantization_note)
        return self._budget_notes() + tuple(note for note in extra if note)

    def _budget_notes(self) -> tuple[str, ...]:
        if self.gpu is None:
            return (
                "--memory is vLLM's --kv-cache-memory-bytes: each worker's KV cache, so "
                "--gpu-memory-utilization is not used.",
            )
        if self.runtime_memory is not None:
            runtime = self.runtime_memory
            terms = "; ".join(
                f"{term.name} {term.bytes / (1 << 30):.2f} GiB ({term.formula})" for term in runtime.terms
            )
            return tuple(
                text
                for text in (
                    f"weights: {self.weights_source}; total {runtime.total.bytes / (1 << 30):.2f} GiB as torch "
                    f"reports it ({'measured' if runtime.total.measured else 'derived'}: {runtime.total.source}); "
                    f"{terms}.",
                    runtime.note,
                )
                if text
            )
        return (
            f"weights: {self.weights_source}; activation peak, non-torch memory and CUDA graphs are not "
            "profiled here (0), so available_kv_cache_memory is an upper bound of what vLLM's profile leaves: "
            "subtract them as vLLM logs them.",
        )

    def serve_command(self) -> str:
        """The ``vllm serve`` line that realises this plan (MODEL: a preset's Hugging Face id, a config's directory,
        :func:`kvpools_core.models.launch_model_path`)."""
        parts = [f"vllm serve {shlex.quote(self.model_ref)}", f"--tensor-parallel-size {self.serving.tp_size}"]
        if self.serving.pp_size > 1:
            parts.append(f"--pipeline-parallel-size {self.serving.pp_size}")
        parts.append(f"--max-model-len {self.max_model_len}")
        if self.kv_cache_memory_bytes is not None:
            parts.append(f"--kv-cache-memory-bytes {self.kv_cache_memory_bytes}")
        else:
            parts.append(f"--gpu-memory-utilization {self.gpu_memory_utilization:g}")
        parts.append(f"--block-size {self.effective_block_size}")
        parts.append(f"--kv-cache-dtype {self.serving.kv_cache_dtype}")
        if self.serving.quantization is not None:
            parts.append(f"--quantization {self.serving.quantization}")
        parts.append(f"--max-num-seqs {self.max_num_seqs}")
        parts.append(f"--max-num-batched-tokens {self.limits.max_num_batched_tokens}")
        if self.multimodal is not None:
            parts.extend(self.multimodal.flags())
        if self.num_gpu_blocks_override is not None:
            parts.append(f"--num-gpu-blocks-override {self.num_gpu_blocks_override}")
        if self.offload is not None:
            parts.append(f"--kv-offloading-size {self.offload.kv_offloading_size:g}")
            parts.append(f"--kv-offloading-backend {self.offload.backend}")
        prefix = ""
        if self.serving.pp_layer_partition is not None:
            prefix = f"VLLM_PP_LAYER_PARTITION={','.join(map(str, self.serving.pp_layer_partition))} "
        return prefix + " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The plan under vLLM's names (``kvpools plan --accounting vllm --json``)."""
        plan = self.plan
        data: dict[str, Any] = {
            "accounting": "vllm",
            "vllm_version": VLLM_VERSION,
            "model": self.model.name,
            "source": self.model.source,
            "plugin": self.plugin,
            "gpu": self.gpu.name if self.gpu is not None else None,
            "tensor_parallel_size": self.serving.tp_size,
            "pipeline_parallel_size": self.serving.pp_size,
            "kv_cache_dtype": self.serving.kv_cache_dtype,
            "block_size": self.effective_block_size,
            "block_size_requested": self.block_size,
            "max_model_len": plan.max_model_len,
            "max_model_len_auto": self.max_model_len_auto,
            "max_model_len_before_auto_fit": self.limits.max_model_len if self.max_model_len_auto else None,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.limits.max_num_batched_tokens,
            "max_concurrent_batches": self.limits.max_concurrent_batches,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "num_gpu_blocks_override": self.num_gpu_blocks_override,
            "budget": [
                {
                    "pp_rank": rank,
                    "source": budget.source,
                    "total_memory": self.total_memory,
                    "requested_memory": budget.requested_memory,
                    "weights_memory": self.weights_memory[rank] if self.weights_memory else None,
                    "non_kv_cache_memory": budget.non_kv_cache_memory,
                    "cudagraph_memory": budget.cudagraph_memory,
                    "available_kv_cache_memory": budget.available_kv_cache_memory,
                }
                for rank, budget in enumerate(self.budgets)
            ],
            "kv_cache_groups": [group_dict(group) for group in plan.groups],
            "bytes_per_block": list(plan.bytes_per_block),
            "num_gpu_blocks": plan.num_gpu_blocks,
            "blocks_per_request": plan.blocks_per_request,
            "max_concurrency": plan.max_concurrency,
            "kv_cache_size_tokens": plan.kv_cache_size_tokens,
            "kv_cache_tensor_bytes": list(plan.kv_cache_tensor_bytes),
            "log_line": plan.log_line,
            "kv_offloading": None if self.offload is None else self.offload.to_dict(),
            "auto_fit_log_line": self.auto_fit_log_line,
            "serve_command": self.serve_command(),
            "notes": list(self.notes),
        }
        if self.multimodal is not None:  # only when given: the default --json is unchanged
            data.update(self.multimodal.to_dict())
        if self.runtime_memory is not None:  # only with a runtime profile: the default --json is unchanged
            runtime = self.runtime_memory
            data["runtime_memory"] = {
                "profile": f"vllm-{runtime.profile.version}",
                "total_memory": runtime.total.bytes,
                "total_measured": runtime.total.measured,
                "total_source": runtime.total.source,
                "terms": {
                    term.name: {"bytes": term.bytes, "formula": term.formula, "source": term.source}
                    for term in runtime.terms
                },
                "note": runtime.note,
                "stage_activation_peaks": list(self.stage_activation_peaks),
            }
        return data


def group_spec_kind(group: KVCacheGroupSpec) -> str:
    """The group spec's vLLM class name; a uniform-type group names the layer classes inside it."""
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        inner = sorted({type(layer).__name__ for layer in spec.kv_cache_specs.values()})
        return f"UniformTypeKVCacheSpecs({', '.join(inner)})"
    return type(spec).__name__


def group_dict(group: KVCacheGroupSpec) -> dict[str, Any]:
    return {
        "spec": group_spec_kind(group),
        "num_layers": len(group.layer_names),
        "block_size": group.kv_cache_spec.block_size,
        "page_size_bytes": group.kv_cache_spec.page_size_bytes,
        "layer_names": list(group.layer_names),
    }


def _check_serving(serving: Serving) -> None:
    """Refuse SGLang's options vLLM's planning would silently ignore, naming vLLM's flag where there is one."""
    defaults = Serving()
    for field in attrs.fields(Serving):
        if field.name in VLLM_READ_FIELDS or field.name in _RESOLVED_FIELDS:
            continue
        if getattr(serving, field.name) == getattr(defaults, field.name):
            continue
        raise ConfigError(sglang_option_refused(field.name))


def sglang_option_refused(name: str) -> str:
    """Why SGLang's option ``name`` is refused under ``--accounting vllm``, naming vLLM's where there is one."""
    vllm = VLLM_NAMES.get(name)
    fix = f"use {option(vllm)}" if vllm else "drop it (not modelled for vLLM)"
    if name == "mem_fraction_static":
        fix += " (a fraction of the TOTAL memory, not of the memory left after the weights)"
    return f"{option(name)} is SGLang's option; {option('accounting')} vllm does not read it: {fix}."


AUTO_MAX_MODEL_LEN = -1
"""``--max-model-len auto`` (or ``-1``): vLLM's ``human_readable_int_or_auto`` (``utils/argparse_utils.py`` L77)
turns both into -1, ``ModelConfig`` starts from the model's derived length (``config/model.py`` L2642) and
``get_kv_cache_configs`` lowers it to what fits (``_auto_fit_max_model_len``, ``kv_cache_planning.py`` L1545)."""


def parse_max_model_len(value: int | str | None) -> int | None:
    """``--max-model-len``: a positive integer, ``auto`` or ``-1`` (:data:`AUTO_MAX_MODEL_LEN`), or None."""
    if value is None:
        return None
    parsed: object = value
    if isinstance(value, str):
        text = value.strip()
        if text.lower() == "auto":
            return AUTO_MAX_MODEL_LEN
        negative = text.startswith("-")
        digits = text[1:] if negative else text
        significant = digits.lstrip("0")  # int() counts leading zeros against its 4,300-digit limit
        # beyond 18 digits no model's context, and int() of 4,300+ digits raises
        if digits.isascii() and digits.isdigit() and len(significant) <= 18:  # not "¹": int() refuses it
            parsed = -int(significant or "0") if negative else int(significant or "0")
    if isinstance(parsed, bool) or not isinstance(parsed, int) or (parsed <= 0 and parsed != AUTO_MAX_MODEL_LEN):
        raise ConfigError(
            f"{option('max_model_len')} must be a positive integer, or auto (-1: the largest length the KV cache "
            f"fits, at most the model's), got {short_repr(value)}."
        )
    return parsed


def _positive(flag: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ConfigError(f"{flag} must be a positive integer, got {value!r}.")


def _specs(spec: ModelSpec, plugin: str, serving: Serving, registry: Registry, block_size: int) -> list[dict[str, Any]]:
    try:
        return worker_kv_cache_specs(spec, serving, registry, block_size=block_size)
    except NoProviderError as error:
        raise UnsupportedCombinationError(
            f"{spec.name} is parsed by the {plugin!r} plugin, which does not answer vllm_kv_cache_specs: "
            "--accounting vllm is not modelled for it yet; use --accounting sglang or exact."
        ) from error


def _stage_weights(
    model_ref: str | ModelSpec, spec: ModelSpec, serving: Serving, registry: Registry | None = None
) -> tuple[int, ...]:
    """kvpools' weights estimate of each vLLM pipeline stage: its layers as vLLM's ``get_pp_indices`` places them
    (passed to ``estimate_weights`` as an explicit partition, since SGLang gives the remainder to other stages)."""
    if isinstance(model_ref, ModelSpec):
        raise ConfigError(
            f"A GPU budget needs the weights' size: {spec.name} was given as a ModelSpec, which carries no weight "
            f"shapes. Pass {option('weights_memory')} (one rank's weights)."
        )
    from kvpools_core.errors import EngineRefusalError, KvpoolsError
    from kvpools_core.pipeline.weights import estimate_weights

    ranges = pp_layer_ranges(spec.num_layers, serving.pp_size, serving.pp_layer_partition)
    partition = tuple(len(r) for r in ranges)
    weights = []
    for rank in range(serving.pp_size):
        stage = attrs.evolve(serving, pp_rank=rank, pp_layer_partition=partition if serving.pp_size > 1 else None)
        try:
            weights.append(estimate_weights(model_ref, stage, registry=registry).bytes_per_rank)
        except EngineRefusalError:
            raise  # vLLM would not start: --weights-memory is no way around it
        except KvpoolsError as error:
            raise ConfigError(
                f"A GPU budget needs the weights' size and kvpools cannot estimate them for {spec.name}: {error} "
                f"Pass {option('weights_memory')} (one rank's weights)."
            ) from error
    return tuple(weights)


def _quantization_note(serving: Serving, release: str | None) -> str:
    """vLLM 0.31+ keeps ``--quantization fp8`` on an unquantised checkpoint working but deprecated: the loader
    warns and serves ``fp8_per_tensor`` (``get_quant_config``, 0.33 ``model_loader/weight_utils.py`` L351-361),
    the storage kvpools plans; empty for another method or an older release (where ``Fp8Config`` itself quantises
    per tensor)."""
    if serving.quantization != "fp8":
        return ""
    with vllm_release(release):
        planned = current_vllm_release()
    if planned <= VLLM_FP8_ONLINE_UNTIL:
        return ""
    return (
        f"--quantization fp8: on an unquantised checkpoint vLLM {'.'.join(map(str, planned))} warns "
        f"'{VLLM_FP8_DEPRECATION}' and serves fp8_per_tensor (one float32 scale a layer and an expert), as the "
        "weights are planned; an fp8 checkpoint is read as stored."
    )


def _check_quantization(model_ref: str | ModelSpec, serving: Serving, registry: Registry | None) -> None:
    """vLLM's check of ``--quantization`` against the checkpoint where no weights are estimated (a ``--memory``
    budget): the weights estimate applies its rules (:func:`~kvpools_core.parts.weights.methods.resolve_quantization`,
    the release :func:`~kvpools_core.parts.weights.methods.vllm_release` sets), and what it refuses vLLM refuses at
    start-up whatever the budget; a model whose weights kvpools cannot estimate is not checked."""
    if serving.quantization is None or isinstance(model_ref, ModelSpec):
        return
    from kvpools_core.errors import EngineRefusalError, KvpoolsError
    from kvpools_core.pipeline.weights import estimate_weights

    try:
        estimate_weights(model_ref, serving, registry=registry)
    except EngineRefusalError:
        raise
    except KvpoolsError:
        return


def plan_vllm(
    model: str | ModelSpec,
    serving: Serving | None = None,
    *,
    memory: int | str | None = None,
    gpu: str | GPU | None = None,
    gpu_memory: int | str | None = None,
    gpu_memory_utilization: float | None = None,
    weights_memory: int | str | None = None,
    max_model_len: int | str | None = None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    block_size: int | None = None,
    num_gpu_blocks_override: int | None = None,
    kv_offloading_size: float | None = None,
    kv_offloading_backend: str | None = None,
    host_memory: int | float | str | None = None,
    host_reserve: int | float | str | None = None,
    runtime_profile: str | None = None,
    limit_mm_per_prompt: str | Mapping[str, Any] | None = None,
    language_model_only: bool | None = None,
    registry: Registry | None = None,
    layout_version: str | None = None,
) -> VllmPlanResult:
    """Plan ``model`` as ``vllm serve`` 0.33 sizes its KV cache (``Worker.determine_available_memory`` +
    ``get_kv_cache_configs``).

    The budget is ``memory`` (vLLM's ``--kv-cache-memory-bytes``: each worker's KV cache) or a whole ``gpu``
    (catalogue name) / ``gpu_memory`` (its total): ``ceil(total x gpu_memory_utilization)`` (default 0.92,
    ``config/cache.py`` L215; the release's own default under ``runtime_profile`` / ``layout_version``, 0.9 before
    vLLM 0.20) minus each stage's weights (``weights_memory``, else kvpools' estimate of the
    stage's layers).  The profile's activation peak, non-torch memory and CUDA-graph estimate are 0: kvpools
    does not run the model, so with a GPU the KV memory is an upper bound (``VllmPlanResult.notes``).
    ``max_model_len`` defaults to the model's context length; ``"auto"`` or -1 is vLLM's ``--max-model-len auto``:
    the model's context length lowered to the largest that every stage's KV cache fits
    (``VllmPlanResult.max_model_len_auto``); ``max_num_seqs`` / ``max_num_batched_tokens`` to
    ``vllm serve``'s defaults for the GPU (:func:`server_defaults`); ``block_size`` to 16.
    ``kv_offloading_size`` (GiB, the whole engine's) adds vLLM's CPU offload tier
    (:mod:`kvpools_core.engines.vllm.offload`),
    checked against the node's ``host_memory`` (stated, else measured) less ``host_reserve`` (0 unless given).
    ``runtime_profile`` (a vLLM version with a calibrated profile, e.g. ``"0.19"``; off by default) estimates those
    three terms and the GPU's total as torch reports it (:mod:`kvpools_core.engines.vllm.runtime_memory`) instead of
    taking them as 0 and the catalogue's nvidia-smi total; it applies to a ``gpu`` / ``gpu_memory`` budget only.
    ``limit_mm_per_prompt`` (vLLM's JSON object, or a mapping: items per modality, 999 for one not named) and
    ``language_model_only`` (every limit 0) size the multimodal encoder's profile pass under a runtime profile, and a
    vision tower whose modalities are all limited to 0 leaves the estimated weights, as vLLM 0.33 does not load it
    (:mod:`kvpools_core.engines.vllm.multimodal`); both are echoed on the ``vllm serve`` line.
    ``layout_version`` (a vLLM version with a profile; ``runtime_profile`` when not given, so ``--engine-version``
    sets it with or without ``--memory``) lays the KV cache out as that release does where it differs from 0.33
    (:mod:`kvpools_core.engines.vllm.layouts`: the Gated DeltaNet checkpoint grid, new in 0.33).
    Raises :class:`~kvpools_core.engines.vllm.planning.VllmMemoryError` with vLLM's text where vLLM refuses to start.
    """
    registry = registry or get_registry()
    serving = attrs.evolve(serving or Serving(), accounting="vllm")
    _check_serving(serving)
    multimodal = parse_multimodal_limits(limit_mm_per_prompt, language_model_only)
    model_len = parse_max_model_len(max_model_len)
    auto = model_len == AUTO_MAX_MODEL_LEN
    for name, value in (
        ("max_num_seqs", max_num_seqs),
        ("max_num_batched_tokens", max_num_batched_tokens),
        ("block_size", block_size),
        ("num_gpu_blocks_override", num_gpu_blocks_override),
    ):
        _positive(option(name), value)
    if isinstance(model, ModelSpec):
        spec, plugin, model_ref = model, "given ModelSpec", model.name
    else:
        spec, plugin = load_model(model, registry)
        model_ref = launch_model_path(model, registry)
    spec = served_model(spec, serving)
    chosen = _resolve_device(memory, gpu, gpu_memory, serving, registry)
    if memory is not None and runtime_profile is not None:
        raise ConfigError(
            "--memory is vLLM's --kv-cache-memory-bytes (the KV cache itself): a runtime-memory profile estimates "
            "what a --gpu budget loses outside the KV cache and does not apply to it. Drop one of them."
        )
    if memory is not None and (gpu_memory_utilization is not None or weights_memory is not None):
        raise ConfigError(
            "--memory is vLLM's --kv-cache-memory-bytes (the KV cache itself): --gpu-memory-utilization and "
            "--weights-memory apply to a --gpu budget only. Drop one of them."
        )
    if kv_offloading_size is None:
        given = [
            option(name)
            for name, value in (
                ("kv_offloading_backend", kv_offloading_backend),
                ("host_memory", host_memory),
                ("host_reserve", host_reserve),
            )
            if value is not None
        ]
        if given:
            raise ConfigError(
                f"{' and '.join(given)} {'describes' if len(given) == 1 else 'describe'} vLLM's CPU offload, which "
                f"only exists with "
                f"{option('kv_offloading_size')} (GiB); add it, or drop {' and '.join(given)}."
            )
    block = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    workers = _specs(spec, plugin, _with_capability(serving, chosen), registry, block)
    layout = layout_version or runtime_profile
    layout_note = ""
    release = load_profile(layout) if layout is not None else None
    # the release whose --quantization rules the weights estimate applies: the one asked for (vLLM 0.21, not its
    # profile file's 0.24: fp8_per_channel came in 0.24), 0.33's without a profile
    quantization_release = version_key(layout) if layout is not None else None
    if release is not None:
        # an older vLLM's layout (the Gated DeltaNet / Mamba2 prefill checkpoints before 0.33 / 0.32,
        # engines/vllm/layouts.py)
        capability = chosen.compute_capability if chosen is not None else None
        laid_out = layout_for_version(workers, release, block, capability)
        change = layout_change(workers, release, capability)
        if change:
            layout_note = f"KV layout of vLLM {release.version}: {change} (engines/vllm/layouts.py)"
        workers = laid_out
    default_batched, default_seqs = server_defaults(
        chosen.total_bytes if chosen else None,
        chosen.label if chosen else "",
        tier_160gib=release is None or release.batch_defaults_160gib,
    )
    limits = VllmLimits(
        max_model_len=spec.context_len if auto or model_len is None else model_len,
        max_num_batched_tokens=max_num_batched_tokens or default_batched,
        max_concurrent_batches=max_concurrent_batches(serving.pp_size),
        mamba_cache_mode=mamba_cache_mode_of(workers),
    )
    utilization: float | None = None
    kv_bytes: int | None = None
    weights: tuple[int, ...] = ()
    weights_source = ""
    if chosen is None:
        assert memory is not None  # _resolve_device: exactly one budget source
        kv_bytes = parse_bytes(memory, option("memory"))
        with vllm_release(quantization_release):
            _check_quantization(model, serving, registry)
        budgets = tuple(available_kv_cache_memory(kv_cache_memory_bytes=kv_bytes) for _ in workers)
    else:
        default_utilization = (
            DEFAULT_GPU_MEMORY_UTILIZATION if release is None else release.default_gpu_memory_utilization
        )
        utilization = default_utilization if gpu_memory_utilization is None else gpu_memory_utilization
        if weights_memory is not None:
            weights = (parse_bytes(weights_memory, option("weights_memory")),) * serving.pp_size
            weights_source = "given (--weights-memory)"
        else:
            with vllm_release(quantization_release):
                weights = _stage_weights(model, spec, serving, registry)
                tower, modalities = _skipped_tower_weights(model, serving, multimodal, registry)
            weights_source = "kvpools' estimate of each stage's layers from the model config (estimate_weights)"
            if any(tower):
                weights = tuple(stage - skipped for stage, skipped in zip(weights, tower, strict=True))
                weights_source += (
                    f"; less the vision tower's {format_gib(max(tower))} GiB, which vLLM does not load with "
                    f"{' and '.join(modalities)} limited to 0 (--limit-mm-per-prompt / --language-model-only)"
                )
        runtime = None
        peaks = (0,) * len(weights)
        if runtime_profile is not None:
            runtime, peaks = _runtime_memory(
                model, chosen, serving, default_seqs, limits, runtime_profile, max_num_seqs, multimodal, weights[0]
            )
        total = chosen.total_bytes if runtime is None else runtime.total.bytes
        terms = {} if runtime is None else {term.name: term.bytes for term in runtime.terms}
        budgets = tuple(
            available_kv_cache_memory(
                total_memory=total,
                gpu_memory_utilization=utilization,
                weights_memory=stage_weights,
                activation_peak_memory=stage_peak,
                non_torch_memory=terms.get("non-torch", 0),
                cudagraph_memory_estimate=terms.get("CUDA graphs", 0),
            )
            for stage_weights, stage_peak in zip(weights, peaks, strict=True)
        )
    plan = plan_kv_cache(
        workers,
        [budget.available_kv_cache_memory for budget in budgets],
        limits,
        num_gpu_blocks_override=num_gpu_blocks_override,
        auto_fit_max_model_len=auto,
    )
    offload = None
    if kv_offloading_size is not None:
        offload = plan_cpu_offload(
            plan,
            kv_offloading_size=kv_offloading_size,
            backend=kv_offloading_backend or "native",
            tp_size=serving.tp_size,
            pp_size=serving.pp_size,
            block_size=attention_block_size(plan, block),
            platform=serving.platform,
            host_memory=host_memory,
            host_reserve=host_reserve,
        )
    return VllmPlanResult(
        model=spec,
        model_ref=model_ref,
        plugin=plugin,
        serving=serving,
        gpu=chosen,
        gpu_memory_utilization=utilization,
        kv_cache_memory_bytes=kv_bytes,
        weights_memory=weights,
        weights_source=weights_source,
        budgets=budgets,
        limits=limits,
        block_size=block,
        max_num_seqs=max_num_seqs or default_seqs,
        num_gpu_blocks_override=num_gpu_blocks_override,
        plan=plan,
        offload=offload,
        max_model_len_auto=auto,
        runtime_memory=runtime if chosen is not None else None,
        stage_activation_peaks=peaks if chosen is not None and runtime is not None else (),
        multimodal=multimodal,
        layout_note=layout_note,
        quantization_note=_quantization_note(serving, quantization_release),
    )


PLANNED_VLLM_VERSION = "0.33"
"""The vLLM whose KV-cache sizing :func:`plan_vllm` reproduces; a runtime profile of another version says so."""


def _runtime_memory(
    model: str | ModelSpec,
    chosen: GPU,
    serving: Serving,
    default_seqs: int,
    limits: VllmLimits,
    version: str,
    max_num_seqs: int | None,
    multimodal: MultimodalLimits | None = None,
    weights: int | None = None,
) -> tuple[RuntimeMemory, tuple[int, ...]]:
    """The runtime terms of ``version``'s profile for this plan (the last pipeline stage's: it samples), and each
    stage's activation peak (only the last samples; every stage but the first holds the receive buffers); a
    ``--gpu-memory`` total is taken as torch's."""
    if isinstance(model, ModelSpec):
        raise ConfigError(
            f"A runtime-memory profile needs the model's vocabulary size: {model.name} was given as a ModelSpec, "
            f"which carries none. Pass the model by name or config path."
        )
    options: dict[str, Any] = {
        "gpu": chosen,
        "vocab_size": vocab_size_of(model),
        "tp_size": serving.tp_size,
        "pp_size": serving.pp_size,
        "max_num_seqs": max_num_seqs or default_seqs,
        "max_num_batched_tokens": limits.max_num_batched_tokens,
        "engine_version": PLANNED_VLLM_VERSION,
        "profile_version": version,
        # vLLM serves a float32 checkpoint in 16 bits under --dtype auto (config._get_and_verify_dtype)
        # --quantization fp8 on an unquantised MoE checkpoint picks vLLM's FP8 experts (moe_workspace_bytes)
        "shape": model_shape_of(
            model, dtype_bytes=4 if serving.dtype == "float32" else 2, quantization=serving.quantization
        ),
        # a Qwen3-VL-style vision tower's profile pass, at --limit-mm-per-prompt (vLLM's 999 per modality unnamed)
        "vision": vision_shape_of(model, dtype_bytes=4 if serving.dtype == "float32" else 2),
        # vLLM's CUDA-graph estimate (subtracted from 0.21 on): layers, heads, MLP width, attention backend
        "graph": graph_shape_of(model, dtype_bytes=4 if serving.dtype == "float32" else 2),
        "max_model_len": limits.max_model_len,
        # with the GPU and the heads, it picks the attention backend (FlashInfer's workspace, cudagraph_memory)
        "kv_cache_dtype": serving.kv_cache_dtype,
        # allocated when Gemma-4's encoder reads the free memory that sizes its batch (with the non-torch term)
        "weights_bytes": weights,
    }
    if multimodal is not None:
        options["mm_limits"] = multimodal.runtime_limits()
    _refuse_unmodelled_encoder(model, multimodal)
    runtime = estimate_runtime_memory(**options)
    if chosen.name == "custom":
        runtime = attrs.evolve(
            runtime, total=TotalMemory(bytes=chosen.total_bytes, measured=True, source="given (--gpu-memory)")
        )
    stages = ("last",) if serving.pp_size == 1 else ("first",) + ("middle",) * (serving.pp_size - 2) + ("last",)
    peaks = tuple(
        estimate_runtime_memory(**options, pp_stage=stage).term("activation peak").bytes
        if stage != "last"
        else runtime.term("activation peak").bytes
        for stage in stages
    )
    return runtime, peaks


def _refuse_unmodelled_encoder(model: str, multimodal: MultimodalLimits | None) -> None:
    """A vision tower whose encoder profile pass kvpools does not model (``unmodelled_vision_tower``) is refused
    unless no modality reaches it: ``--language-model-only``, or its trait's modalities (image, video and audio for a
    tower without one) and, with an ``audio_config``, audio all limited to 0."""
    from kvpools_core.engines.vllm.runtime_memory import _complete_config, unmodelled_vision_tower, vision_tower_of

    config = dict(_complete_config(model)[0])
    tower = unmodelled_vision_tower(config)
    if tower is None:
        _refuse_unmodelled_audio(config, multimodal)
        return
    reach = tower_modalities(vision_tower_of(config)) or ("image", "video", "audio")
    if isinstance(config.get("audio_config"), dict) and config["audio_config"] and "audio" not in reach:
        reach = (*reach, "audio")
    if multimodal is not None and multimodal.skips_tower(reach):
        return
    zeros = json.dumps(dict.fromkeys(reach, 0))
    raise UnsupportedCombinationError(
        f"kvpools does not model the encoder profile pass of {tower} yet: vLLM runs the encoder on its largest "
        f"dummy items before it sizes the KV cache, so {option('runtime_profile')} cannot estimate the activation "
        f"peak. Pass {option('language_model_only')} or {option('limit_mm_per_prompt')} '{zeros}' (no encoder "
        f"pass), or plan without {option('runtime_profile')} (the activation terms are then 0, an upper bound of "
        "the KV budget)."
    )


def _refuse_unmodelled_audio(config: dict[str, Any], multimodal: MultimodalLimits | None) -> None:
    """A modelled vision tower whose checkpoint has an audio tower (Gemma-4's ``audio_config``) is refused where vLLM
    would profile audio, its modality with the most tokens an item at these limits (``profiled_modality``): the audio
    tower's pass is not modelled."""
    from kvpools_core.engines.vllm.runtime_memory import profiled_modality, vision_shape_from_config

    vision = vision_shape_from_config(config)
    limits = multimodal.runtime_limits() if multimodal is not None else None
    if vision is None or not vision.audio_tokens or profiled_modality(vision, limits) != "audio":
        return
    classes = " / ".join(name for name in config.get("architectures") or () if isinstance(name, str))
    raise UnsupportedCombinationError(
        f"kvpools does not model the encoder profile pass of {classes or 'the model'}'s audio tower yet: vLLM profiles "
        f"audio ({vision.audio_tokens} tokens an item, more than the vision modalities left at these limits), so "
        f"{option('runtime_profile')} cannot estimate the activation peak. Pass {option('limit_mm_per_prompt')} "
        "'{\"audio\": 0}' (the vision tower's pass is modelled), or plan without "
        f"{option('runtime_profile')}."
    )


def _skipped_tower_weights(
    model: str | ModelSpec, serving: Serving, multimodal: MultimodalLimits | None, registry: Registry | None
) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Each stage's vision-tower bytes that vLLM 0.33 does not load (``_mark_tower_model``: every modality of the
    tower limited to 0), and those modalities; zeros without a limit, a ``vision_config`` or an estimate to take
    them from.  The tower's bytes are kvpools' estimate with the ``vision_config`` less the one without it."""
    zeros = (0,) * serving.pp_size
    if multimodal is None or isinstance(model, ModelSpec):
        return zeros, ()
    from kvpools_core.engines.vllm.runtime_memory import _complete_config, vision_tower_of
    from kvpools_core.pipeline.weights import estimate_weights

    config = dict(_complete_config(model)[0])
    modalities = tower_modalities(vision_tower_of(config, registry=registry))
    if "vision_config" not in config or modalities is None or not multimodal.skips_tower(modalities):
        return zeros, ()
    text_only = {key: value for key, value in config.items() if key != "vision_config"}
    spec = load_model(model, registry or get_registry())[0]
    ranges = pp_layer_ranges(spec.num_layers, serving.pp_size, serving.pp_layer_partition)
    partition = tuple(len(r) for r in ranges)
    tower = []
    for rank in range(serving.pp_size):
        stage = attrs.evolve(serving, pp_rank=rank, pp_layer_partition=partition if serving.pp_size > 1 else None)
        with_tower = estimate_weights(config, stage, registry=registry).bytes_per_rank
        tower.append(with_tower - estimate_weights(text_only, stage, registry=registry).bytes_per_rank)
    return tuple(tower), modalities


def _with_capability(serving: Serving, chosen: GPU | None) -> Serving:
    """``serving`` carrying the planned GPU's compute capability on ``platform_traits``, which the layer specs read
    where vLLM picks by ``torch.cuda.get_device_capability`` (DeepSeek-V4.1's kernel block and attention class)."""
    if chosen is None or chosen.compute_capability is None or chosen.platform != serving.platform:
        return serving
    known = serving.platform_traits or PlatformTraits(platform=serving.platform)
    return attrs.evolve(serving, platform_traits=attrs.evolve(known, compute_capability=chosen.compute_capability))


def _resolve_device(
    memory: int | str | None, gpu: str | GPU | None, gpu_memory: int | str | None, serving: Serving, registry: Registry
) -> GPU | None:
    """The GPU planned on (from ``registry``'s catalogue), or None for an explicit KV budget; one budget source."""
    given = [flag for flag, value in (("--memory", memory), ("--gpu", gpu), ("--gpu-memory", gpu_memory)) if value]
    if len(given) != 1:
        what = f"got {' and '.join(given)}" if given else "got none"
        raise ConfigError(
            "--accounting vllm needs one budget: --memory SIZE (vLLM's --kv-cache-memory-bytes, per worker), "
            f"--gpu NAME or --gpu-memory SIZE (a whole GPU, with --gpu-memory-utilization); {what}."
        )
    if isinstance(gpu, GPU):
        return gpu
    if gpu is not None:
        return find_gpu(gpu, registry)
    if gpu_memory is not None:
        return custom_gpu(gpu_memory, platform=serving.platform)
    return None


def concurrency_at(result: VllmPlanResult, context_len: int) -> float | None:
    """vLLM's ``max_concurrency`` for requests of ``context_len`` tokens on this plan's blocks:
    ``num_gpu_blocks / Σ_groups blocks_per_request(context_len)`` (``kv_cache_utils.py`` L1061, the formula
    of the start-up log at another length); None past ``max_model_len``, which vLLM refuses."""
    _positive(option("context") if on_cli() else "context_len", context_len)
    if context_len > result.max_model_len:
        return None
    limits = result.limits.with_max_model_len(context_len)
    blocks = sum(group.blocks_per_request(limits) for group in result.plan.groups)
    return result.plan.num_gpu_blocks / blocks


def capacity_dict(result: VllmPlanResult, contexts: Sequence[int]) -> dict[str, Any]:
    """``kvpools capacity --accounting vllm --json``: the plan and the concurrency at each context length."""
    return {
        **result.to_dict(),
        "capacity": [{"context_len": length, "max_concurrency": concurrency_at(result, length)} for length in contexts],
    }


__all__ = [
    "AUTO_MAX_MODEL_LEN",
    "VLLM_READ_FIELDS",
    "VLLM_VERSION",
    "VllmPlanResult",
    "capacity_dict",
    "concurrency_at",
    "group_dict",
    "max_concurrent_batches",
    "parse_max_model_len",
    "plan_vllm",
    "server_defaults",
]


def attention_block_size(plan: VllmKVCachePlan, asked: int) -> int:
    """The block size vLLM resolved for the attention layers (``cache_config.block_size`` after start-up): the
    smallest attention group's (page-size unification only grows a group's block from it).  Groups of Mamba
    states and of ``SlidingWindowMLASpec`` caches are left out: their blocks are not sizes vLLM was asked for (a
    Mamba block is its state; DeepSeek-V4's SWA and compressor-state caches fix their own, ``sparse_swa.py`` L85,
    ``compressor.py`` L168-171), nor DeepSeek-V4.1's compressor rings (``CircularBufferSpec``, a ring of at least 8
    rows, ``deepseek_v41/compressor.py`` L221-223); ``asked`` for a model of such layers only."""
    sizes = {
        group.kv_cache_spec.block_size
        for group in plan.groups
        if not any(
            isinstance(group.layer_spec(name), (MambaSpec, SlidingWindowMLASpec, CircularBufferSpec))
            for name in group.layer_names
        )
    }
    return min(sizes) if sizes else asked
