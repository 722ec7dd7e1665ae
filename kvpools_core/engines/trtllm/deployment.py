"""``--accounting trtllm``: a model, serving options and a budget planned as ``trtllm-serve`` (TensorRT-LLM 1.2,
PyTorch backend, the default V1 ``KVCacheManager``) would size its KV cache.

TensorRT-LLM's budget is not a fraction of the GPU: ``KvCacheCreator`` runs a warm-up with a temporary KV cache,
measures the peak, and gives the KV cache ``free_gpu_memory_fraction`` of what is left:
``(total - peak + temporary KV) x fraction`` (``_cal_max_memory``).  kvpools cannot run the warm-up, so that
"free after warm-up" figure is an input: ``memory`` states it, or a ``gpu`` gives ``total - weights`` (the
warm-up's activation peak, NCCL and CUDA-graph memory taken as 0, so an upper bound; see ``notes``).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

from kvpools_core.engines.trtllm.drafting import Drafting, resolve_drafting
from kvpools_core.engines.trtllm.manager import (
    DEFAULT_FREE_GPU_MEMORY_FRACTION,
    DEFAULT_MAX_BATCH_SIZE,
    DEFAULT_MAX_NUM_TOKENS,
    DEFAULT_TOKENS_PER_BLOCK,
    KV_DTYPES,
    TRTLLM_DTYPE_NAMES,
    TrtllmLayer,
    WindowPool,
    adjust_window_sizes_for_vswa,
    available_kv_memory,
    cache_bytes_per_token,
    element_bytes,
    estimated_size_per_token,
    layer_elements,
    pp_layers,
    shortest_pattern,
    trtllm_layers,
    window_shares,
    window_upper_bound,
    window_vector,
)
from kvpools_core.engines.trtllm.runtime_memory import TrtllmRuntimeMemory, estimation_step_tokens, runtime_memory
from kvpools_core.errors import ConfigError, KvpoolsError, UnsupportedCombinationError, short_repr
from kvpools_core.models import launch_model_path, load_model, served_model
from kvpools_core.options import option
from kvpools_core.pipeline.gpus import GPU, custom_gpu, find_gpu
from kvpools_core.registry import Registry, get_registry
from kvpools_core.units import parse_bytes
from kvpools_core.values import ModelSpec, Serving

TRTLLM_VERSION = "1.2.1"

TRTLLM_NAMES = {
    "context_length": "max_seq_len",
    "max_running_requests": "max_batch_size",
    "page_size": "tokens_per_block",
    "chunked_prefill_size": "max_num_tokens",
    "mem_fraction_static": "kv_cache_free_gpu_memory_fraction",
    "max_total_tokens": "max_tokens",
    "enable_dp_attention": "enable_attention_dp",
    "speculative_algorithm": "decoding_type",
    "speculative_num_steps": "max_draft_len",
}
"""SGLang's serving options that have a TensorRT-LLM counterpart under ``--accounting trtllm``."""

TRTLLM_READ_FIELDS = {"tp_size", "pp_size", "kv_cache_dtype", "accounting", "platform"}
"""The ``Serving`` fields TensorRT-LLM's accounting reads; the others are SGLang's and refused when set."""
_RESOLVED_FIELDS = {"platform_traits", "workspaces", "plugin_options"}


MANAGER_V2_PLANNER: list[Callable[..., TrtllmPlanResult]] = []
"""The planner of layers a ``KVCacheManagerV2`` subclass keeps (``TrtllmLayer.v2``):
:func:`kvpools_core.engines.trtllm.deployment_v2.plan_v2`, registered when the package loads (it subclasses
:class:`TrtllmPlanResult`, so this module cannot import it)."""

CONTEXT_PARALLEL_PLANNER: list[Callable[..., TrtllmPlanResult]] = []
"""The planner of helix context parallelism (``context_parallel_size`` > 1, ``cp_config``):
:func:`kvpools_core.engines.trtllm.context_parallel.plan_helix`, registered when the package loads (as
:data:`MANAGER_V2_PLANNER`)."""


def trtllm_flag(name: str) -> str:
    """A TensorRT-LLM option as kvpools spells it (``trtllm-serve``'s own underscores)."""
    return f"--{name}"


def sglang_option_refused(name: str) -> str:
    """Why SGLang's option ``name`` is refused under ``--accounting trtllm``, naming TensorRT-LLM's where there is
    one."""
    from kvpools_core.options import option

    trt = TRTLLM_NAMES.get(name)
    fix = f"use {trtllm_flag(trt)}" if trt else "drop it (not modelled for TensorRT-LLM)"
    if name == "mem_fraction_static":
        fix += " (a fraction of the memory FREE AFTER TensorRT-LLM's warm-up, not of the total)"
    return f"{option(name)} is SGLang's option; {option('accounting')} trtllm does not read it: {fix}."


def _check_serving(serving: Serving) -> None:
    defaults = Serving()
    for field in attrs.fields(Serving):
        if field.name in TRTLLM_READ_FIELDS or field.name in _RESOLVED_FIELDS:
            continue
        if getattr(serving, field.name) == getattr(defaults, field.name):
            continue
        raise ConfigError(sglang_option_refused(field.name))
    if serving.platform != "cuda":
        raise UnsupportedCombinationError(
            f"TensorRT-LLM runs on NVIDIA GPUs only (platform {serving.platform!r}): --accounting trtllm plans "
            "the cuda platform; use --accounting sglang or vllm for other platforms."
        )
    if serving.kv_cache_dtype not in KV_DTYPES:
        raise UnsupportedCombinationError(
            f"--kv-cache-dtype {serving.kv_cache_dtype} is not a KV cache TensorRT-LLM's KVCacheManager keeps "
            "(get_cache_bytes_per_token takes FP8, HALF, BF16, NVFP4): use auto, bf16, fp16, fp8_e4m3 (fp8) or "
            "fp4_e2m1 (nvfp4)."
        )


def _positive_int(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ConfigError(f"{trtllm_flag(name)} must be a positive integer, got {short_repr(value)}.")


def parse_int_list(name: str, value: str | Sequence[int] | None) -> tuple[int, ...] | None:
    """A comma-separated list of positive integers (``--max_attention_window 128,131072``)."""
    if value is None:
        return None
    items = [item.strip() for item in value.split(",")] if isinstance(value, str) else list(value)
    try:
        parsed = tuple(int(item) for item in items)
    except (TypeError, ValueError):
        parsed = ()
    if not parsed or any(item <= 0 for item in parsed):
        raise ConfigError(
            f"{trtllm_flag(name)} takes positive integers separated by commas (e.g. 128,131072), got "
            f"{short_repr(value)}."
        )
    return parsed


def parse_shares(value: str | Sequence[float] | None) -> tuple[float, ...] | None:
    """``TRTLLM_WINDOW_SIZE_SHARES``: floats separated by commas, as TensorRT-LLM reads the variable."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        parsed = tuple(float(item) for item in items)
    except (TypeError, ValueError):
        parsed = ()
    if not parsed or any(not 0 <= share <= 1 for share in parsed):
        raise ConfigError(
            f"--window_size_shares (TRTLLM_WINDOW_SIZE_SHARES) takes fractions separated by commas, one per "
            f"window size, smallest window first (e.g. 0.4,0.6), got {short_repr(value)}."
        )
    return parsed


@attrs.frozen(kw_only=True)
class TrtllmRank:
    """One pipeline stage's KV cache as ``KvCacheCreator`` and ``KVCacheManager`` size it (before the MIN
    across ranks)."""

    pp_rank: int
    layers: tuple[int, ...]
    free_after_warmup: int
    weights_memory: int | None
    available_kv_memory: int
    """``_cal_max_memory``: ``int(free_after_warmup x fraction)``, then ``max_tokens``' clamp."""
    estimated_size_per_token: int
    """``get_cache_size_per_token``, what ``KvCacheCreator`` divides the budget by."""
    cache_bytes_per_token: int
    """``get_cache_bytes_per_token``, what the manager divides by."""
    max_tokens: int
    """The tokens this rank's manager settles on (single window), or its VSWA pool bytes / window."""
    max_gpu_total_bytes: int
    """``kv_cache_config.max_gpu_total_bytes`` as ``KvCacheCreator`` writes it (the VSWA pool budget)."""
    draft_estimated_size_per_token: int = 0
    """The separate MTP draft manager's ``get_cache_size_per_token``, which ``_get_kv_size_per_token`` adds to
    the target's before dividing the budget (0 without one)."""


@attrs.frozen(kw_only=True)
class TrtllmDeployment:
    """What a ``trtllm-serve`` deployment is asked for, resolved: the model, the serving options, the budget's GPU
    and TensorRT-LLM's own options (defaults applied).  A :class:`TrtllmPlanResult` is one with its sizes;
    :class:`TrtllmInputs` one its planners read."""

    model: ModelSpec
    model_ref: str
    plugin: str
    serving: Serving
    gpu: GPU | None
    weights_source: str
    free_gpu_memory_fraction: float
    tokens_per_block: int
    max_batch_size: int
    max_num_tokens: int
    max_seq_len_requested: int
    max_tokens: int | None
    max_gpu_total_bytes: int | None
    max_attention_window: tuple[int, ...] | None
    window_size_shares: tuple[float, ...] | None
    host_cache_size: int | None
    enable_attention_dp: bool
    runtime: tuple[TrtllmRuntimeMemory, ...] = ()
    """Each pipeline stage's whole-GPU terms (a ``gpu`` budget; empty on a ``memory`` one):
    :mod:`kvpools_core.engines.trtllm.runtime_memory`."""


@attrs.frozen(kw_only=True)
class TrtllmPlanResult(TrtllmDeployment):
    """One ``trtllm-serve`` deployment planned: inputs, each stage's budget, the pools per window size."""

    max_seq_len: int
    """After ``_validate_and_adjust_attention_windows`` (lowered when one sequence cannot hold it)."""
    is_vswa: bool
    num_nextn_predict_layers: int | None = None
    """``speculative_config`` ``decoding_type: MTP``'s draft layers (one-model MTP), or None without drafting."""
    draft_kv_cache: str | None = None
    """Where the MTP layers' KV lives: ``"separate"`` (its own manager, TensorRT-LLM's default) or ``"target"``
    (appended to the target's manager: attention DP); None without drafting."""
    drafting: Drafting | None = None
    """A separate draft model's KV cache (Eagle3 one-/two-model, Draft_Target:
    :mod:`kvpools_core.engines.trtllm.drafting`), or None."""
    ranks: tuple[TrtllmRank, ...]
    pools: tuple[WindowPool, ...]
    """One per window size (one pool without VSWA), blocks after the MIN across ranks; a hybrid's attention pool
    and its recurrent-state pool (``WindowPool.recurrent``)."""
    warnings: tuple[str, ...] = ()
    hybrid_manager: str | None = None
    """``"CppMambaHybridCacheManager"`` for a Mamba / linear-attention hybrid (its unified pool), else None."""
    hybrid_stages: tuple[Any, ...] = ()
    """Each stage's :class:`~kvpools_core.engines.trtllm.hybrid.HybridStage` (affine costs and blocks)."""

    @property
    def kv_pools(self) -> tuple[WindowPool, ...]:
        """The pools that hold tokens (all but a hybrid's recurrent-state pool)."""
        return tuple(pool for pool in self.pools if not pool.recurrent)

    @property
    def kv_cache_dtype(self) -> str:
        return TRTLLM_DTYPE_NAMES[self.serving.kv_cache_dtype]

    @property
    def max_num_blocks(self) -> int | None:
        """``blocks_in_primary_pool`` of the (target's) single-window manager; None for VSWA and hybrids (several
        pools)."""
        return None if self.is_vswa or self.hybrid_manager else self.pools[0].primary_blocks

    @property
    def extra_tokens_per_request(self) -> int:
        """KV tokens a drafting request holds beyond its own: ``num_extra_kv_tokens`` (``get_num_extra_kv_tokens``:
        ``max_draft_len - 1`` for a one-engine drafter, ``max_draft_len = num_nextn_predict_layers``) added at
        its first context chunk, and the ``max_draft_len`` draft tokens of a generation step
        (``KVCacheManager.prepare_resources``); 0 without drafting; a separate draft model's
        (:attr:`Drafting.extra_tokens_per_request`)."""
        if self.drafting is not None:
            return self.drafting.extra_tokens_per_request
        layers = self.num_nextn_predict_layers
        return 0 if not layers else (layers - 1) + layers

    @property
    def max_kv_tokens(self) -> int:
        """Tokens the smallest pool holds (``maxNumTokens`` without VSWA); a hybrid's attention pool."""
        return min(pool.primary_blocks for pool in self.kv_pools) * self.tokens_per_block

    def kv_cache_capacity(self) -> dict[str, int] | None:
        """What ``LLM.get_kv_cache_capacity()`` publishes (``PyExecutor.get_kv_cache_capacity``):
        ``maxNumBlocks`` (``blocks_in_primary_pool``), ``tokensPerBlock`` and their product ``maxNumTokens``.
        None for VSWA and hybrids: it reads the C++ ``KVCacheStats.max_num_blocks`` over several window pools
        (a hybrid's attention and recurrent-state pools), which kvpools has not reproduced."""
        if self.max_num_blocks is None:
            return None
        return {
            "maxNumBlocks": self.max_num_blocks,
            "tokensPerBlock": self.tokens_per_block,
            "maxNumTokens": self.max_num_blocks * self.tokens_per_block,
        }

    def concurrency_at(self, context_len: int) -> int | None:
        """Requests of ``context_len`` tokens the pools hold at once, at most ``max_batch_size``; None past
        ``max_seq_len``.  Each request holds ``ceil(min(context, window) / tokens_per_block)`` blocks of each
        window's pool (kvpools' reading: the C++ ``WindowBlockManager``'s detaching of out-of-window blocks is not
        reproduced, so a sliding pool may hold a block more per request)."""
        if context_len <= 0:
            raise ConfigError(f"A context length must be positive, got {context_len}.")
        if context_len > self.max_seq_len:
            return None
        extra = self.extra_tokens_per_request
        fits = min(
            pool.primary_blocks // math.ceil((min(context_len, pool.window) + extra) / self.tokens_per_block)
            for pool in self.kv_pools
        )
        return min(fits, self.max_batch_size)

    @property
    def notes(self) -> tuple[str, ...]:
        """What the numbers assume that TensorRT-LLM would measure at start-up."""
        notes = []
        if self.gpu is None:
            notes.append(
                "--memory is the memory left free after TensorRT-LLM's warm-up (total - peak + its temporary KV "
                "cache): --kv_cache_free_gpu_memory_fraction applies to it, not to the GPU's total."
            )
        elif self.runtime:
            stage = self.runtime[0]
            notes.append(
                "free after warm-up = total - weights - activation - outside torch (KvCacheCreator."
                "configure_kv_cache_capacity / _cal_max_memory: total_gpu_memory - peak_memory + the temporary KV "
                f"cache); total {stage.total.bytes:,} B is torch.cuda.mem_get_info()'s ({stage.total.source}); "
                f"weights: {self.weights_source}."
            )
            notes.append(f"activation: {stage.activation.formula} ({stage.activation.source}).")
            notes.append(f"outside torch: {stage.outside_torch.formula}.")
            if stage.upper_bound:
                notes.append(
                    "so the KV cache is an upper bound of what TensorRT-LLM's profile leaves: subtract the rest of "
                    "the 'Peak memory during memory usage profiling' it logs, or pass --memory (free after warm-up)."
                )
        else:
            notes.append(
                f"free after warm-up = total - weights ({self.weights_source}); the warm-up's activation peak, "
                "NCCL and CUDA-graph memory are not profiled here (0), so the KV cache is an upper bound of what "
                "TensorRT-LLM's profile leaves: subtract the 'Peak memory during memory usage profiling' it logs."
            )
        if self.draft_kv_cache == "separate" and self.drafting is None:
            notes.append(
                f"MTP ({self.num_nextn_predict_layers} draft layer(s)): TensorRT-LLM adds the draft manager's bytes "
                "per token to the target's before dividing the budget, and both managers take that max_tokens, so "
                "the draft does not claim a budget of its own; each request holds blocks in both pools and "
                f"{self.extra_tokens_per_request} extra token(s) (num_extra_kv_tokens + the draft tokens of a step)."
            )
        elif self.drafting is not None:
            notes.append(self.drafting.note())
        elif self.draft_kv_cache == "target":
            notes.append(
                f"MTP with attention DP: the {self.num_nextn_predict_layers} draft layer(s) join the target's "
                "manager (no separate draft KV cache); TensorRT-LLM's estimate counts the target's layers only, "
                "its manager all of them."
            )
        if self.hybrid_manager:
            stage = self.hybrid_stages[0]
            notes.append(
                f"{self.model.name} is a Mamba / linear-attention hybrid: TensorRT-LLM's {self.hybrid_manager} keeps "
                f"the attention KV and the recurrent state in one pool; its budget is affine, "
                f"{stage.estimate.slope:,} B per token + {stage.estimate.intercept:,} B of state for max_batch_size "
                f"{self.max_batch_size} x pp_size {self.serving.pp_size} + 1 CUDA-graph dummy request(s) "
                f"({stage.state_bytes:,} B each), so a smaller --max_batch_size leaves more tokens. "
                "kv_cache_config.use_kv_cache_manager_v2: false selects this manager (the V2 manager is not modelled)."
            )
        if not self.is_vswa:
            windows = {layer.sliding_window for layer in self.model.layers if layer.sliding_window}
            if windows and self.max_attention_window is None:
                notes.append(
                    f"{self.model.name} has sliding-window layers ({sorted(windows)}), which TensorRT-LLM's "
                    "KVCacheManager sizes as full layers unless kv_cache_config.max_attention_window is given; "
                    f"--max_attention_window {','.join(map(str, self.suggested_windows()))} plans its VSWA pools."
                )
        return tuple(notes)

    def suggested_windows(self) -> tuple[int, ...]:
        windows = [layer.sliding_window or self.max_seq_len_requested for layer in self.model.layers]
        return shortest_pattern(windows)

    def extra_llm_api_options(self) -> dict[str, Any]:
        """The ``--extra_llm_api_options`` YAML's content that realises the plan."""
        kv: dict[str, Any] = {"tokens_per_block": self.tokens_per_block}
        if self.kv_cache_dtype != "auto":
            kv["dtype"] = self.kv_cache_dtype
        if self.max_tokens is not None:
            kv["max_tokens"] = self.max_tokens
        if self.max_gpu_total_bytes is not None:
            kv["max_gpu_total_bytes"] = self.max_gpu_total_bytes
        if self.max_attention_window is not None:
            kv["max_attention_window"] = list(self.max_attention_window)
        if self.host_cache_size is not None:
            kv["host_cache_size"] = self.host_cache_size
        if self.hybrid_manager:
            kv["use_kv_cache_manager_v2"] = False
        options: dict[str, Any] = {"kv_cache_config": kv}
        if self.num_nextn_predict_layers:
            options["speculative_config"] = {
                "decoding_type": "MTP",
                "num_nextn_predict_layers": self.num_nextn_predict_layers,
            }
        if self.drafting is not None:
            options["speculative_config"] = self.drafting.speculative_config()
        if self.enable_attention_dp:
            options["enable_attention_dp"] = True
        return options

    def extra_options_yaml(self) -> str:
        """:meth:`extra_llm_api_options` as YAML (flat values and lists only)."""
        lines = []
        for key, value in self.extra_llm_api_options().items():
            if isinstance(value, dict):
                lines.append(f"{key}:")
                lines.extend(f"  {name}: {_yaml(item)}" for name, item in value.items())
            else:
                lines.append(f"{key}: {_yaml(value)}")
        return "\n".join(lines) + "\n"

    def serve_command(self, options_file: str = "kvpools-trtllm.yaml") -> str:
        """The ``trtllm-serve`` line that realises this plan (with :meth:`extra_options_yaml` in
        ``options_file``)."""
        parts = [
            f"trtllm-serve {shlex.quote(self.model_ref)}",
            "--backend pytorch",
            f"--tp_size {self.serving.tp_size}",
            f"--pp_size {self.serving.pp_size}",
            f"--max_batch_size {self.max_batch_size}",
            f"--max_num_tokens {self.max_num_tokens}",
            f"--max_seq_len {self.max_seq_len_requested}",
            f"--kv_cache_free_gpu_memory_fraction {self.free_gpu_memory_fraction:g}",
            f"--extra_llm_api_options {shlex.quote(options_file)}",
        ]
        prefix = ""
        if self.window_size_shares is not None:
            prefix = f"TRTLLM_WINDOW_SIZE_SHARES={','.join(f'{s:g}' for s in self.window_size_shares)} "
        return prefix + " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The plan under TensorRT-LLM's names (``kvpools plan --accounting trtllm --json``)."""
        return {
            "accounting": "trtllm",
            "trtllm_version": TRTLLM_VERSION,
            "model": self.model.name,
            "source": self.model.source,
            "plugin": self.plugin,
            "gpu": self.gpu.name if self.gpu is not None else None,
            "tp_size": self.serving.tp_size,
            "pp_size": self.serving.pp_size,
            "enable_attention_dp": self.enable_attention_dp,
            "kv_cache_dtype": self.kv_cache_dtype,
            "tokens_per_block": self.tokens_per_block,
            "free_gpu_memory_fraction": self.free_gpu_memory_fraction,
            "max_batch_size": self.max_batch_size,
            "max_num_tokens": self.max_num_tokens,
            "max_seq_len_requested": self.max_seq_len_requested,
            "max_seq_len": self.max_seq_len,
            "max_tokens": self.max_tokens,
            "max_gpu_total_bytes": self.max_gpu_total_bytes,
            "max_attention_window": list(self.max_attention_window) if self.max_attention_window else None,
            "window_size_shares": list(self.window_size_shares) if self.window_size_shares else None,
            "host_cache_size": self.host_cache_size,
            "is_vswa": self.is_vswa,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "draft_kv_cache": self.draft_kv_cache,
            "drafting": self.drafting.to_dict() if self.drafting is not None else None,
            "hybrid_manager": self.hybrid_manager,
            "hybrid_stages": [attrs.asdict(stage) for stage in self.hybrid_stages],
            "ranks": [attrs.asdict(rank) for rank in self.ranks],
            "pools": [attrs.asdict(pool) for pool in self.pools],
            "kv_cache_capacity": self.kv_cache_capacity(),
            "max_kv_tokens": self.max_kv_tokens,
            "warnings": list(self.warnings),
            "serve_command": self.serve_command(),
            "extra_llm_api_options": self.extra_llm_api_options(),
            "runtime_memory": [stage.to_dict() for stage in self.runtime],
            "notes": list(self.notes),
        }


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(str(item) for item in value) + "]"
    return str(value)


def _resolve_device(
    memory: int | str | None, gpu: str | GPU | None, gpu_memory: int | str | None, registry: Registry
) -> GPU | None:
    given = [flag for flag, value in (("--memory", memory), ("--gpu", gpu), ("--gpu-memory", gpu_memory)) if value]
    if len(given) != 1:
        what = f"got {' and '.join(given)}" if given else "got none"
        raise ConfigError(
            "--accounting trtllm needs one budget: --memory SIZE (the memory left free after TensorRT-LLM's "
            "warm-up, per GPU), or --gpu NAME / --gpu-memory SIZE (a whole GPU, less its weights); " + what + "."
        )
    if isinstance(gpu, GPU):
        return gpu
    if gpu is not None:
        return find_gpu(gpu, registry)
    if gpu_memory is not None:
        return custom_gpu(gpu_memory)
    return None


def _stage_weights(model_ref: str | ModelSpec, spec: ModelSpec, serving: Serving) -> tuple[int, ...]:
    """kvpools' weights estimate of each pipeline stage, with TensorRT-LLM's layer split (:func:`pp_layers`)."""
    if isinstance(model_ref, ModelSpec):
        raise ConfigError(
            f"A GPU budget needs the weights' size: {spec.name} was given as a ModelSpec, which carries no weight "
            "shapes. Pass --weights-memory (one rank's weights)."
        )
    from kvpools_core.pipeline.weights import estimate_weights

    partition = tuple(len(pp_layers(spec.num_layers, serving.pp_size, r)) for r in range(serving.pp_size))
    weights = []
    for rank in range(serving.pp_size):
        stage = attrs.evolve(
            serving, pp_rank=rank, pp_layer_partition=partition if serving.pp_size > 1 else None, accounting="exact"
        )
        try:
            weights.append(estimate_weights(model_ref, stage).bytes_per_rank)
        except KvpoolsError as error:
            raise ConfigError(
                f"A GPU budget needs the weights' size and kvpools cannot estimate them for {spec.name}: {error} "
                "Pass --weights-memory (one rank's weights)."
            ) from error
    return tuple(weights)


def _draft_weights(
    drafting: Drafting | None,
    chosen: GPU | None,
    weights_memory: int | str | None,
    draft_weights_memory: int | str | None,
) -> int | None:
    """The draft model's weights on each GPU of a GPU budget (``draft_weights_memory``), or None; refused where
    kvpools would otherwise leave them out (it does not estimate a draft's weights) or where they do not apply."""
    if draft_weights_memory is not None:
        if drafting is None:
            raise ConfigError(
                "--draft_weights_memory is a separate draft model's weights: it applies with --decoding_type "
                "Eagle3 / Eagle / Draft_Target only. Drop it."
            )
        if chosen is None:
            raise ConfigError(
                "--memory is the memory free after TensorRT-LLM's warm-up (the weights already loaded): "
                "--draft_weights_memory applies to a --gpu budget only. Drop one of them."
            )
        if weights_memory is not None:
            raise ConfigError(
                "--weights-memory is one rank's target + draft weights; --draft_weights_memory adds the draft's to "
                "kvpools' estimate of the target's. Give one of them."
            )
        return parse_bytes(draft_weights_memory, "--draft_weights_memory")
    if drafting is not None and chosen is not None and weights_memory is None:
        raise UnsupportedCombinationError(
            f"kvpools does not estimate the draft model's weights ({drafting.draft.name}) for --accounting trtllm "
            "yet (an Eagle3 head shares the target's embedding, a draft engine loads its own checkpoint), so a GPU "
            "budget would leave them out: pass --weights-memory (one rank's target + draft weights), "
            "--draft_weights_memory (the draft's weights on each GPU, added to kvpools' estimate of the target's), "
            "or --memory (the memory free after TensorRT-LLM's warm-up)."
        )
    return None


R = TypeVar("R", bound=TrtllmPlanResult)


@attrs.frozen(kw_only=True)
class TrtllmInputs(TrtllmDeployment):
    """A deployment's resolved inputs as every planner reads them (:func:`plan_trtllm`'s own, the hybrid manager's,
    :data:`MANAGER_V2_PLANNER`'s and :data:`CONTEXT_PARALLEL_PLANNER`'s), with each pipeline stage's memory;
    :meth:`result` and :meth:`stage` build a planner's result from them.  The budget's fields (``gpu``,
    ``weights_source``, ``frees``, ``weights``) are set once it is resolved (``attrs.evolve``)."""

    frees: tuple[int, ...]
    """Each pipeline stage's memory free after warm-up (``memory``, or the GPU's total less the stage's weights)."""
    weights: tuple[int | None, ...]
    """Each pipeline stage's weights (None on a ``memory`` budget)."""

    def stage(self, rank: int, **fields: Any) -> TrtllmRank:
        """Pipeline stage ``rank``'s :class:`TrtllmRank`: its layers, free memory and weights from these inputs, the
        sizes the planner found from ``fields``."""
        return TrtllmRank(
            pp_rank=rank,
            layers=tuple(pp_layers(self.model.num_layers, self.serving.pp_size, rank)),
            free_after_warmup=self.frees[rank],
            weights_memory=self.weights[rank],
            **fields,
        )

    def result(self, cls: type[R], **fields: Any) -> R:
        """A ``cls`` of these inputs (:class:`TrtllmDeployment`'s fields) and the planner's ``fields`` (the sizes it
        found; a field given here wins)."""
        inputs = {field.name: getattr(self, field.name) for field in attrs.fields(TrtllmDeployment)}
        return cls(**{**inputs, **fields})


def plan_trtllm(
    model: str | ModelSpec,
    serving: Serving | None = None,
    *,
    memory: int | str | None = None,
    gpu: str | GPU | None = None,
    gpu_memory: int | str | None = None,
    weights_memory: int | str | None = None,
    kv_cache_free_gpu_memory_fraction: float | None = None,
    max_batch_size: int | None = None,
    max_num_tokens: int | None = None,
    tokens_per_block: int | None = None,
    max_seq_len: int | None = None,
    max_tokens: int | None = None,
    max_gpu_total_bytes: int | str | None = None,
    max_attention_window: str | Sequence[int] | None = None,
    window_size_shares: str | Sequence[float] | None = None,
    host_cache_size: int | str | None = None,
    enable_attention_dp: bool = False,
    num_nextn_predict_layers: int | None = None,
    decoding_type: str | None = None,
    speculative_model_dir: str | ModelSpec | None = None,
    max_draft_len: int | None = None,
    eagle3_one_model: bool | None = None,
    draft_weights_memory: int | str | None = None,
    context_parallel_size: int | None = None,
    cp_type: str | None = None,
    registry: Registry | None = None,
) -> TrtllmPlanResult:
    """Plan ``model`` as ``trtllm-serve`` (TensorRT-LLM 1.2, PyTorch backend, ``KVCacheManager``) sizes its KV
    cache: ``KvCacheCreator.configure_kv_cache_capacity`` then ``KVCacheManager.__init__``.

    The budget is ``memory`` -- the memory left free after TensorRT-LLM's warm-up run, per GPU, which
    ``kv_cache_free_gpu_memory_fraction`` (default 0.9) applies to -- or a whole ``gpu`` / ``gpu_memory``, whose
    free-after-warm-up kvpools takes as ``total - weights`` (each stage's, ``weights_memory`` or kvpools'
    estimate).  The other options are ``KvCacheConfig``'s and ``trtllm-serve``'s, under their own names;
    ``num_nextn_predict_layers`` is ``speculative_config``'s (``decoding_type: MTP``, one-model): its draft layers
    copy the target's last layer and, as TensorRT-LLM 1.2 does by default, get a KV cache manager of their own
    (appended to the target's manager with attention DP) whose per-token cost is added to the target's before the
    budget is divided (``KvCacheCreator._get_kv_size_per_token``).  ``decoding_type`` (``Eagle3``, ``Eagle``,
    ``Draft_Target``) with ``speculative_model_dir`` and ``max_draft_len`` (and Eagle's ``eagle3_one_model``)
    plan a separate draft model's KV cache the same way (:mod:`kvpools_core.engines.trtllm.drafting`); on a GPU
    budget ``draft_weights_memory`` (the draft's weights on each GPU, which kvpools does not estimate) is added to
    kvpools' estimate of the target's, where ``weights_memory`` is not given.
    ``context_parallel_size`` > 1 (``cp_type`` HELIX) plans helix context parallelism
    (:mod:`kvpools_core.engines.trtllm.context_parallel`).
    Raises :class:`~kvpools_core.errors.KvpoolsError` subclasses where TensorRT-LLM refuses, with its reason.
    """
    registry = registry or get_registry()
    serving = attrs.evolve(serving or Serving(), accounting="trtllm")
    _check_serving(serving)
    for name, value in (
        ("max_batch_size", max_batch_size),
        ("max_num_tokens", max_num_tokens),
        ("tokens_per_block", tokens_per_block),
        ("max_seq_len", max_seq_len),
        ("max_tokens", max_tokens),
        ("num_nextn_predict_layers", num_nextn_predict_layers),
        ("max_draft_len", max_draft_len),
        ("context_parallel_size", context_parallel_size),
    ):
        _positive_int(name, value)
    fraction = (
        DEFAULT_FREE_GPU_MEMORY_FRACTION
        if kv_cache_free_gpu_memory_fraction is None
        else (kv_cache_free_gpu_memory_fraction)
    )
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError(
            f"--kv_cache_free_gpu_memory_fraction must be in (0, 1), got {short_repr(fraction)}: TensorRT-LLM's "
            "KvCacheConfig takes [0, 1] and its KVCacheManager asserts 'freeMemFraction ... must be smaller than "
            "1.0'; 0 leaves no KV cache."
        )
    windows = parse_int_list("max_attention_window", max_attention_window)
    shares = parse_shares(window_size_shares)
    mgtb = None if max_gpu_total_bytes is None else parse_bytes(max_gpu_total_bytes, "--max_gpu_total_bytes")
    host = None if host_cache_size is None else parse_bytes(host_cache_size, "--host_cache_size")
    if isinstance(model, ModelSpec):
        spec, plugin, model_ref = model, "given ModelSpec", model.name
    else:
        spec, plugin = load_model(model, registry)
        model_ref = launch_model_path(model, registry)
    spec = served_model(spec, serving)
    layers = trtllm_layers(spec, serving, registry)
    block = DEFAULT_TOKENS_PER_BLOCK if tokens_per_block is None else tokens_per_block
    seq_len = spec.context_len if max_seq_len is None else max_seq_len
    inputs = TrtllmInputs(
        model=spec,
        model_ref=model_ref,
        plugin=plugin,
        serving=serving,
        free_gpu_memory_fraction=float(fraction),
        tokens_per_block=block,
        max_batch_size=max_batch_size or DEFAULT_MAX_BATCH_SIZE,
        max_num_tokens=max_num_tokens or DEFAULT_MAX_NUM_TOKENS,
        max_seq_len_requested=seq_len,
        max_tokens=max_tokens,
        max_gpu_total_bytes=mgtb,
        max_attention_window=windows,
        window_size_shares=shares,
        host_cache_size=host,
        enable_attention_dp=enable_attention_dp,
        gpu=None,
        weights_source="",
        frees=(),
        weights=(),
    )
    if (context_parallel_size or 1) > 1 or cp_type is not None:
        # kvpools_core.engines.trtllm.context_parallel (imported by the package) registers the helix planner.
        return CONTEXT_PARALLEL_PLANNER[0](
            inputs,
            layers=layers,
            registry=registry,
            context_parallel_size=context_parallel_size or 1,
            cp_type=cp_type,
            memory=memory,
            gpu=gpu,
            gpu_memory=gpu_memory,
            weights_memory=weights_memory,
            drafting={
                "--num_nextn_predict_layers": num_nextn_predict_layers,
                "--decoding_type": decoding_type,
                "--speculative_model_dir": speculative_model_dir,
                "--max_draft_len": max_draft_len,
                "--eagle3_one_model": eagle3_one_model,
            },
        )
    drafting = resolve_drafting(
        spec=spec,
        layers=layers,
        serving=serving,
        registry=registry,
        decoding_type=decoding_type,
        speculative_model_dir=speculative_model_dir,
        max_draft_len=max_draft_len,
        eagle3_one_model=eagle3_one_model,
        num_nextn_predict_layers=num_nextn_predict_layers,
        max_attention_window=max_attention_window,
        enable_attention_dp=enable_attention_dp,
        host_cache_size=host_cache_size,
    )
    if drafting is not None:
        # A separate draft model always has a manager of its own (resolve_drafting refuses Eagle3 one-model with
        # attention DP, where TensorRT-LLM appends the draft layers to the target's manager).
        draft_layers, separate_draft = drafting.layers, True
    else:
        draft_layers = _mtp_layers(spec, layers, serving, num_nextn_predict_layers, max_attention_window)
        separate_draft = bool(draft_layers) and not enable_attention_dp
    if separate_draft and host_cache_size is not None:
        raise UnsupportedCombinationError(
            "kvpools does not model the host cache beside the MTP draft KV cache for --accounting trtllm yet: "
            "TensorRT-LLM splits host_cache_size between the target's and the draft's managers "
            "(_split_kv_cache_budget_for_draft). Drop --host_cache_size or --num_nextn_predict_layers."
        )
    if any(layer.indexer_bytes for layer in layers) and serving.kv_cache_dtype == "fp4_e2m1":
        raise UnsupportedCombinationError(
            f"kvpools does not model {spec.name}'s DeepSeek sparse attention with an nvfp4 KV cache for "
            "--accounting trtllm yet (DSACacheManager's estimate counts 2 bytes per latent element unless the KV "
            "cache is fp8); use --kv-cache-dtype auto or fp8_e4m3."
        )
    if spec.dtype not in ("bfloat16", "float16") and serving.kv_cache_dtype == "auto":
        raise UnsupportedCombinationError(
            f"{spec.name}'s dtype is {spec.dtype}: kvpools models TensorRT-LLM's half-precision (bf16/fp16), fp8 "
            "and nvfp4 KV caches only; pass --kv-cache-dtype."
        )
    model_bytes = 2
    chosen = _resolve_device(memory, gpu, gpu_memory, registry)
    if memory is not None and weights_memory is not None:
        raise ConfigError(
            "--memory is the memory free after TensorRT-LLM's warm-up (the weights already loaded): "
            "--weights-memory applies to a --gpu budget only. Drop one of them."
        )
    draft_weights = _draft_weights(drafting, chosen, weights_memory, draft_weights_memory)
    if chosen is None:
        assert memory is not None
        free = parse_bytes(memory, "--memory")
        frees = (free,) * serving.pp_size
        weights: tuple[int | None, ...] = (None,) * serving.pp_size
        weights_source = ""
        runtime: tuple[TrtllmRuntimeMemory, ...] = ()
    else:
        if weights_memory is not None:
            weights = (parse_bytes(weights_memory, "--weights-memory"),) * serving.pp_size
            weights_source = "given (--weights-memory)"
        else:
            weights = _stage_weights(model, spec, serving)
            weights_source = "kvpools' estimate of each stage's layers from the model config (estimate_weights)"
            if draft_weights is not None:
                weights = tuple((w or 0) + draft_weights for w in weights)
                weights_source += f", plus the draft's {draft_weights:,} B given (--draft_weights_memory)"
        runtime = tuple(
            runtime_memory(
                chosen,
                w or 0,
                weights_source,
                model,
                spec,
                max_num_tokens=estimation_step_tokens(
                    max_num_tokens=inputs.max_num_tokens,
                    max_batch_size=inputs.max_batch_size,
                    max_seq_len=inputs.max_seq_len_requested,
                ),
                tp_size=serving.tp_size,
                given_total=gpu is None,
            )
            for w in weights
        )
        frees = tuple(term.free_after_warmup for term in runtime)
        short = [r for r, f in enumerate(frees) if f <= 0]
        if short:
            raise UnsupportedCombinationError(
                f"The weights of pipeline stage {short[0]} ({weights[short[0]]} bytes) do not fit "
                f"{chosen.label}'s {chosen.total_bytes} bytes: raise --tp-size or --pp-size."
            )
    inputs = attrs.evolve(
        inputs, gpu=chosen, weights_source=weights_source, frees=frees, weights=weights, runtime=runtime
    )
    if any(layer.v2 is not None for layer in layers):
        # kvpools_core.engines.trtllm.deployment_v2 (imported by the package) registers the KVCacheManagerV2 planner.
        return MANAGER_V2_PLANNER[0](inputs, layers, num_nextn_predict_layers=num_nextn_predict_layers)
    if any(layer.state is not None for layer in layers):
        return _plan_hybrid(inputs, layers, draft_layers)
    warnings: list[str] = []
    ranks = []
    rank_pools: list[dict[int, tuple[int, int, tuple[int, ...], int, float]]] = []
    is_vswa = False
    for rank in range(serving.pp_size):
        span = pp_layers(spec.num_layers, serving.pp_size, rank)
        local = [layers[i] for i in span]
        indexer = sum(layer.indexer_bytes for layer in local)
        est = estimated_size_per_token(
            layers, len(local), serving.kv_cache_dtype, model_bytes, serving.tp_size, enable_attention_dp, indexer
        )
        draft_est = 0
        if draft_layers and separate_draft:
            # _get_kv_size_per_token: the one-model draft's cost, get_cache_size_per_token(num_layers=N, is_draft)
            draft_est = estimated_size_per_token(
                draft_layers,
                len(draft_layers),
                serving.kv_cache_dtype,
                model_bytes,
                serving.tp_size,
                enable_attention_dp,
                sum(layer.indexer_bytes for layer in draft_layers),
            )
        elif draft_layers:
            # attention DP: get_pp_layers appends the MTP layers to the target's manager on the last PP rank; the
            # static estimate (num_layers None) still counts the target's layers only.
            local = local + list(draft_layers)
        real = cache_bytes_per_token(local, serving.kv_cache_dtype, model_bytes, serving.tp_size, enable_attention_dp)
        rank_windows = window_vector(spec.num_layers, span, seq_len, windows)
        vswa = len(set(rank_windows)) > 1
        is_vswa = is_vswa or vswa
        if vswa and indexer:
            raise UnsupportedCombinationError(
                f"kvpools does not model {spec.name}'s DeepSeek sparse attention indexer K cache with attention "
                "windows (--max_attention_window) for --accounting trtllm yet; drop --max_attention_window."
            )
        budget = available_kv_memory(frees[rank], fraction)
        if max_tokens is not None:
            if vswa and rank == 0:
                warnings.append("max_tokens should not be set for VSWA case as it is ambiguous concept for VSWA.")
            budget = min(budget, (est + draft_est) * max_tokens)
        config_tokens = budget // (est + draft_est)
        pool_bytes = budget if mgtb is None or mgtb <= 0 else min(budget, mgtb)
        if not vswa:
            # calculate_max_num_blocks: min(max_tokens, fraction x free / bytes per token); the V1 manager reads
            # max_tokens, which KvCacheCreator set before clamping by max_gpu_total_bytes.
            tokens = min(config_tokens, fraction * frees[rank] / real)
            secondary = (host // real) // block if host else 0
            rank_pools.append({rank_windows[0]: (int(tokens // block), secondary, tuple(range(len(local))), real, 1.0)})
            if separate_draft:
                # The draft manager is built after the target's (build_managers): the same kv_cache_config.max_tokens,
                # and the free memory less the target's pool.
                draft_real = cache_bytes_per_token(
                    draft_layers, serving.kv_cache_dtype, model_bytes, serving.tp_size, enable_attention_dp
                )
                left = frees[rank] - int(tokens // block) * block * real
                draft_tokens = min(config_tokens, fraction * max(left, 0) / draft_real)
                draft_pool = (
                    int(draft_tokens // block),
                    tuple(layer.index for layer in draft_layers),
                    draft_real,
                )
            ranks.append(
                inputs.stage(
                    rank,
                    available_kv_memory=budget,
                    estimated_size_per_token=est,
                    cache_bytes_per_token=real,
                    max_tokens=int(tokens),
                    max_gpu_total_bytes=pool_bytes,
                    draft_estimated_size_per_token=draft_est,
                )
            )
            continue
        by_window: dict[int, list[int]] = {}
        for position, window in enumerate(rank_windows):
            by_window.setdefault(window, []).append(position)
        per_layer = {
            i: element_bytes(
                layer_elements(local[i], serving.tp_size, enable_attention_dp),
                serving.kv_cache_dtype,
                model_bytes,
            )
            for i in range(len(local))
        }
        adjusted = adjust_window_sizes_for_vswa(by_window, per_layer, pool_bytes, max_tokens)
        merged: dict[int, list[int]] = {}
        for window in sorted(by_window):
            merged.setdefault(adjusted[window], []).extend(by_window[window])
        if any(adjusted[w] != w for w in by_window):
            warnings.append(
                f"pipeline stage {rank}: one sequence does not fit the windows {sorted(by_window)}; "
                f"TensorRT-LLM shrinks them to {sorted(merged)} (adjust_window_sizes_for_vswa)."
            )
        rank_shares = window_shares(sorted(merged), shares)
        pools = {}
        for share, window in zip(rank_shares, sorted(merged), strict=True):
            elements = sum(layer_elements(local[i], serving.tp_size, enable_attention_dp) for i in merged[window])
            per_token = element_bytes(elements, serving.kv_cache_dtype, model_bytes, scales=False)
            primary = int((pool_bytes * share / per_token) // block)
            secondary = int((host * share / per_token) // block) if host else 0
            pools[window] = (primary, secondary, tuple(merged[window]), per_token, share)
        rank_pools.append(pools)
        ranks.append(
            inputs.stage(
                rank,
                available_kv_memory=budget,
                estimated_size_per_token=est,
                cache_bytes_per_token=real,
                max_tokens=config_tokens,
                max_gpu_total_bytes=pool_bytes,
            )
        )
        if max_tokens is not None:
            warnings.append(
                f"kv_cache_config.max_tokens is not None ({max_tokens}) but we are operating on VSWA scheme. "
                "Ignoring the configuration."
            )
    # MIN all-reduce across ranks, per window size (the stages share the scheduler's token budget).
    keys = sorted(rank_pools[0])
    if any(sorted(pools) != keys for pools in rank_pools):
        raise UnsupportedCombinationError(
            "kvpools does not model pipeline stages that end with different window sizes yet (TensorRT-LLM "
            "all-reduces blocks per window size); use --pp-size 1 or give every stage the same windows."
        )
    final_windows = {}
    pools_out = []
    seq_after = seq_len
    for window in keys:
        primary = min(pools[window][0] for pools in rank_pools)
        secondary = min(pools[window][1] for pools in rank_pools)
        _, _, members, per_token, share = rank_pools[0][window]
        upper = window_upper_bound(primary, block)
        runs = window
        if window > upper:
            warnings.append(
                f"Attention window size {window} exceeds upper bound {upper} for available blocks. Reducing to {upper}."
            )
            runs = upper
        final_windows[window] = runs
        pools_out.append(
            WindowPool(
                window=runs,
                layers=members,
                bytes_per_token=per_token,
                share=share,
                primary_blocks=primary,
                secondary_blocks=secondary,
            )
        )
    if separate_draft:
        primary, members, per_token = draft_pool
        upper = window_upper_bound(primary, block)
        pools_out.append(
            WindowPool(
                window=min(seq_len, upper),
                layers=members,
                bytes_per_token=per_token,
                share=1.0,
                primary_blocks=primary,
                draft=True,
            )
        )
    if any(final_windows[w] != w for w in final_windows):
        seq_after = max(final_windows.values())
        warnings.append(f"Adjusted max_seq_len to {seq_after}")
    return inputs.result(
        TrtllmPlanResult,
        max_seq_len=min(seq_after, seq_len),
        is_vswa=is_vswa,
        num_nextn_predict_layers=num_nextn_predict_layers,
        draft_kv_cache=None if not draft_layers else "separate" if separate_draft else "target",
        drafting=drafting,
        ranks=tuple(ranks),
        pools=tuple(pools_out),
        warnings=tuple(warnings),
    )


def _plan_hybrid(
    inputs: TrtllmInputs, layers: Sequence[TrtllmLayer], draft_layers: Sequence[TrtllmLayer]
) -> TrtllmPlanResult:
    """A Mamba / linear-attention hybrid in ``CppMambaHybridCacheManager``'s unified pool
    (:mod:`kvpools_core.engines.trtllm.hybrid`).  Refused, with the reason: MTP drafting, attention windows and
    window shares beside it (not modelled)."""
    from kvpools_core.engines.trtllm.hybrid import HYBRID_MANAGER, hybrid_pools, plan_stage

    spec, serving, block = inputs.model, inputs.serving, inputs.tokens_per_block
    if draft_layers:
        raise UnsupportedCombinationError(
            f"kvpools does not model the MTP draft KV cache of a Mamba / linear-attention hybrid ({spec.name}) for "
            "--accounting trtllm yet (TensorRT-LLM's hybrid cost then adds attention-only draft layers and draft "
            "state slots); drop --num_nextn_predict_layers."
        )
    if inputs.max_attention_window is not None or inputs.window_size_shares is not None:
        raise UnsupportedCombinationError(
            f"kvpools does not model attention windows beside {HYBRID_MANAGER} ({spec.name}) for --accounting "
            "trtllm yet: the manager replaces kv_cache_config.max_attention_window with one window per layer "
            "(max_seq_len for attention, RECURRENT_STATES for the recurrent layers). Drop --max_attention_window "
            "and --window_size_shares."
        )
    stages = [
        plan_stage(
            spec=spec,
            layers=layers,
            rank=rank,
            pp_size=serving.pp_size,
            tp_size=serving.tp_size,
            enable_attention_dp=inputs.enable_attention_dp,
            kv_cache_dtype=serving.kv_cache_dtype,
            free_after_warmup=inputs.frees[rank],
            fraction=inputs.free_gpu_memory_fraction,
            tokens_per_block=block,
            max_batch_size=inputs.max_batch_size,
            max_tokens=inputs.max_tokens,
            max_gpu_total_bytes=inputs.max_gpu_total_bytes,
            host_cache_size=inputs.host_cache_size,
        )
        for rank in range(serving.pp_size)
    ]
    seq_len = inputs.max_seq_len_requested
    pools, seq_after, warnings = hybrid_pools(stages, seq_len, block)
    ranks = tuple(
        inputs.stage(
            rank,
            available_kv_memory=stage.budget,
            estimated_size_per_token=stage.estimate.slope,
            cache_bytes_per_token=stage.manager.slope,
            max_tokens=stage.max_tokens,
            max_gpu_total_bytes=stage.pool_bytes,
        )
        for rank, stage in enumerate(stages)
    )
    return inputs.result(
        TrtllmPlanResult,
        max_seq_len=min(seq_after, seq_len),
        is_vswa=False,
        ranks=ranks,
        pools=pools,
        warnings=warnings,
        hybrid_manager=HYBRID_MANAGER,
        hybrid_stages=tuple(stages),
    )


def _mtp_layers(
    spec: ModelSpec,
    layers: Sequence[TrtllmLayer],
    serving: Serving,
    num_nextn_predict_layers: int | None,
    max_attention_window: str | Sequence[int] | None,
) -> tuple[TrtllmLayer, ...]:
    """The one-model MTP draft layers TensorRT-LLM's KV cache holds: ``get_num_spec_layers`` =
    ``num_nextn_predict_layers`` layers, laid out as the target's (``_get_effective_draft_config`` falls back to
    the target model's config for MTP), so each copies the target's last layer, indexed after the target's.
    Refused, with the reason: pipeline stages (the draft layers sit on the last stage only) and attention windows
    (the draft manager's windows are derived from the draft config), which kvpools does not model yet."""
    if not num_nextn_predict_layers:
        return ()
    if not spec.num_nextn_predict_layers:
        raise UnsupportedCombinationError(
            f"TensorRT-LLM's MTP runs the checkpoint's own MTP layers and {spec.name} has none "
            "(num_nextn_predict_layers is 0 in its config): drop --num_nextn_predict_layers."
        )
    if serving.pp_size > 1:
        raise UnsupportedCombinationError(
            f"kvpools does not model the MTP draft KV cache over pipeline stages ({option('pp_size')} "
            f"{serving.pp_size}) for --accounting trtllm yet: TensorRT-LLM puts the draft layers on the last stage "
            "only. Plan with --pp-size 1."
        )
    windows = {layer.sliding_window for layer in layers} - {None}
    if max_attention_window is not None or windows:
        raise UnsupportedCombinationError(
            f"kvpools does not model the MTP draft KV cache beside attention windows ({spec.name}) for "
            "--accounting trtllm yet: TensorRT-LLM derives the draft manager's windows from the draft config "
            "(_derive_draft_max_attention_window) and splits max_gpu_total_bytes between target and draft "
            "(_split_kv_cache_budget_for_draft)."
        )
    last = layers[-1]
    return tuple(attrs.evolve(last, index=spec.num_layers + i) for i in range(num_nextn_predict_layers))


def capacity_dict(result: TrtllmPlanResult, contexts: Sequence[int]) -> dict[str, Any]:
    """``kvpools capacity --accounting trtllm --json``: the plan and the requests at each context length."""
    return {
        **result.to_dict(),
        "capacity": [{"context_len": length, "max_requests": result.concurrency_at(length)} for length in contexts],
    }


__all__ = [
    "TRTLLM_NAMES",
    "TRTLLM_READ_FIELDS",
    "TRTLLM_VERSION",
    "TrtllmDeployment",
    "TrtllmInputs",
    "TrtllmLayer",
    "TrtllmPlanResult",
    "TrtllmRank",
    "capacity_dict",
    "plan_trtllm",
    "sglang_option_refused",
]
