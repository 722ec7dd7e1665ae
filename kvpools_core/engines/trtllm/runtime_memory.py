"""The memory TensorRT-LLM keeps outside the KV cache, estimated from the GPU and the model alone (issue 34).

TensorRT-LLM 1.2's PyTorch backend sizes the KV cache from what is left after a profiling run
(``tensorrt_llm/_torch/pyexecutor/_util.py`` ``KvCacheCreator``, read at commit ``00043967``, the copy
``../shared/reference/engines.md`` section 3.2 pins):

* ``configure_kv_cache_capacity`` calls ``torch.cuda.empty_cache()`` and ``reset_peak_memory_stats()``, reads
  ``end, total_gpu_memory = torch.cuda.mem_get_info()`` and ``model_bytes`` = torch's ``allocated_bytes.all.current``
  (the weights, the temporary KV cache and every buffer alive; logged as "Memory used after loading model weights
  (inside torch)"), runs the dummy requests, then reads ``torch_peak_memory`` (``allocated_bytes.all.peak``),
  empties the cache again and takes ``extra_cost = max(total - free - torch_allocated, 0)`` ("Memory used outside
  torch (e.g., NCCL and CUDA graphs)");
* ``peak_memory = torch_peak_memory + extra_cost`` and ``_cal_max_memory`` gives the KV cache
  ``(total_gpu_memory - peak_memory + allocated_bytes) x free_gpu_memory_fraction``, ``allocated_bytes`` being the
  temporary KV cache, added back.

The order (``_torch/pyexecutor/py_executor_creator.py`` ``create_py_executor``, stored copies): the model is loaded,
``build_managers`` makes the temporary KV cache, ``create_py_executor_instance`` builds (and warms up) the
estimation executor, ``configure_kv_cache_capacity(py_executor)`` profiles, ``teardown_managers`` frees the
temporary cache, ``build_managers(resources, False)`` makes the final one, and the engines ``_release_cuda_graphs()``
to capture them again on top of it.

So the memory "free after warm-up" the fraction applies to is ``total - (weights + buffers) - activation peak -
memory outside torch``.  The estimation executor is a full ``PyExecutor`` whose warm-up (autotuner and the CUDA-graph
capture of the generation batch sizes) runs **before** the profiling (a TensorRT-LLM 1.1.0rc3 log prints "Creating
CUDA graph instances for 11 batch sizes" and the captures before "Memory used after loading model weights"), so the
graphs' pools are in ``extra_cost`` (reserved, not allocated, after ``empty_cache``) and are paid before the sizing.

This module gives each term with the lines it follows.  What the source cannot give -- the memory outside torch
(the CUDA context, NCCL and cuBLAS workspaces, the CUDA graphs' pools) and the rest of the activation peak
(attention workspaces, MoE kernels) -- needs measured start-up logs to calibrate, and kvpools has none of TensorRT-LLM
1.2 on a discrete GPU (see docs/trtllm.md, "Whole-GPU terms"): those terms are 0 here and the plan says the KV cache
is an upper bound.  kvpools does not copy TensorRT-LLM code: the formulas restate what the cited lines allocate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from kvpools_core.errors import ConfigError
from kvpools_core.parts.device_memory import TotalMemory, torch_total_memory
from kvpools_core.values import GPU, ModelSpec

GiB = 1 << 30

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}

_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


@attrs.frozen(kw_only=True)
class BudgetTerm:
    """One term of TensorRT-LLM's non-KV memory: its bytes, the formula, the source, and whether it is all of what
    TensorRT-LLM measures (``complete``; False: a floor, or 0 where the source does not give it)."""

    name: str
    bytes: int
    formula: str
    source: str
    complete: bool = True


@attrs.frozen(kw_only=True)
class MlpShape:
    """The sizes of the dense MLP the estimation forward runs (a ``config.json``'s)."""

    hidden_size: int
    intermediate_size: int
    dtype_bytes: int
    is_moe: bool


@attrs.frozen(kw_only=True)
class TrtllmRuntimeMemory:
    """One pipeline stage's whole-GPU budget: ``free_after_warmup = total - weights - activation - outside torch``."""

    total: TotalMemory
    weights: int
    weights_source: str
    activation: BudgetTerm
    outside_torch: BudgetTerm

    @property
    def free_after_warmup(self) -> int:
        """``total_gpu_memory - peak_memory + allocated_bytes`` of ``_cal_max_memory``, from the terms."""
        return self.total.bytes - self.weights - self.activation.bytes - self.outside_torch.bytes

    @property
    def upper_bound(self) -> bool:
        """Whether a term the source cannot give was taken as 0 (the KV cache is then an upper bound)."""
        return not (self.activation.complete and self.outside_torch.complete)

    def terms(self) -> tuple[BudgetTerm, ...]:
        return (
            BudgetTerm(
                name="total",
                bytes=self.total.bytes,
                formula="torch.cuda.mem_get_info()[1]",
                source=self.total.source,
                complete=True,
            ),
            BudgetTerm(name="weights", bytes=self.weights, formula="", source=self.weights_source, complete=True),
            self.activation,
            self.outside_torch,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "free_after_warmup": self.free_after_warmup,
            "upper_bound": self.upper_bound,
            "total_measured": self.total.measured,
            "terms": [attrs.asdict(term) for term in self.terms()],
        }


def mlp_shape_from_config(config: dict[str, Any], dtype: str) -> MlpShape | None:
    """The :class:`MlpShape` of a Hugging Face ``config.json`` (its ``text_config`` for a multimodal one), or None
    when it has no ``hidden_size`` / ``intermediate_size``.  A config naming routed experts is a MoE model."""
    for candidate in (config, config.get("text_config") or {}):
        hidden = candidate.get("hidden_size")
        intermediate = candidate.get("intermediate_size")
        if isinstance(hidden, int) and isinstance(intermediate, int) and _positive(hidden) and _positive(intermediate):
            is_moe = any(_positive(candidate.get(key)) for key in _EXPERT_KEYS)
            return MlpShape(
                hidden_size=hidden,
                intermediate_size=intermediate,
                dtype_bytes=_DTYPE_BYTES.get(dtype, 2),
                is_moe=is_moe,
            )
    return None


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def mlp_activation(shape: MlpShape | None, *, max_num_tokens: int, tp_size: int) -> BudgetTerm:
    """The estimation forward's live MLP tensors at their peak, on one rank.

    The dummy requests hold ``max_num_tokens`` prompt tokens in all (``KvCacheCreator._create_dummy_context_requests``:
    ``remaining_tokens = max_num_tokens``, requests of at most ``max_seq_len - 1`` tokens until none remain), one
    context step of ``T = max_num_tokens`` tokens.  ``GatedMLP.forward`` (``_torch/modules/gated_mlp.py``) keeps
    ``h1 = gate_up_proj(x)`` (``T x 2I / tp``, column parallel) alive while ``swiglu(h1)`` writes ``h2``
    (``T x I / tp``), beside the layer's input ``x`` and the residual (``T x H`` each, replicated over TP):
    ``T x (3 I / tp + 2 H) x dtype bytes``.  That is the activation peak's floor, not all of it: attention
    workspaces and the logits are not counted, and for a MoE model (fused MoE kernels whose workspaces the source
    does not size from the config alone) the term is not derived (0).
    """
    source = "_torch/modules/gated_mlp.py GatedMLP.forward; _util.py _create_dummy_context_requests"
    if shape is None:
        return BudgetTerm(
            name="activation",
            bytes=0,
            formula="not derived: the config has no hidden_size / intermediate_size",
            source=source,
            complete=False,
        )
    if shape.is_moe:
        return BudgetTerm(
            name="activation",
            bytes=0,
            formula="not derived: a MoE model's fused-MoE workspaces are not sized from the config",
            source=source,
            complete=False,
        )
    per_token = 3 * shape.intermediate_size // tp_size + 2 * shape.hidden_size
    value = max_num_tokens * per_token * shape.dtype_bytes
    formula = (
        f"max_num_tokens {max_num_tokens:,} x (3 x intermediate {shape.intermediate_size:,} / tp {tp_size} + "
        f"2 x hidden {shape.hidden_size:,}) x {shape.dtype_bytes} B = {value:,} B (the MLP's live tensors: a floor)"
    )
    return BudgetTerm(name="activation", bytes=value, formula=formula, source=source, complete=False)


OUTSIDE_TORCH = BudgetTerm(
    name="outside_torch",
    bytes=0,
    formula="not derived (0): the CUDA context, NCCL and cuBLAS workspaces and the CUDA graphs' pools, captured "
    "before the sizing, are measured by TensorRT-LLM ('Memory used outside torch') and kvpools has no TensorRT-LLM "
    "1.2 log of a discrete GPU to calibrate them on",
    source="_util.py configure_kv_cache_capacity: extra_cost = max(total_used_bytes - torch_used_bytes, 0)",
    complete=False,
)


def estimation_step_tokens(*, max_num_tokens: int, max_batch_size: int, max_seq_len: int) -> int:
    """The tokens of the estimation forward's context step: the dummy requests hold ``max_num_tokens`` tokens, each at
    most ``max_seq_len - 1`` (``_create_dummy_context_requests(max(1, net_max_seq_len - 1))``), and one step takes at
    most ``max_batch_size`` requests and ``max_num_tokens`` tokens."""
    return min(max_num_tokens, max_batch_size * max(1, max_seq_len - 1))


def runtime_memory(
    gpu: GPU,
    weights: int,
    weights_source: str,
    model: str | ModelSpec,
    spec: ModelSpec,
    *,
    max_num_tokens: int,
    tp_size: int,
    given_total: bool,
) -> TrtllmRuntimeMemory:
    """One stage's terms on ``gpu``; ``max_num_tokens`` the estimation step's tokens (:func:`estimation_step_tokens`).
    ``given_total``: ``gpu`` is ``--gpu-memory``'s, whose size is taken as torch's total as given."""
    if given_total:
        total = TotalMemory(bytes=gpu.total_bytes, measured=True, source="given (--gpu-memory)")
    else:
        total = torch_total_memory(gpu)
    shape = _mlp_shape(model, spec)
    return TrtllmRuntimeMemory(
        total=total,
        weights=weights,
        weights_source=weights_source,
        activation=mlp_activation(shape, max_num_tokens=max_num_tokens, tp_size=tp_size),
        outside_torch=OUTSIDE_TORCH,
    )


def _mlp_shape(model: str | ModelSpec, spec: ModelSpec) -> MlpShape | None:
    if isinstance(model, ModelSpec):
        return None
    try:
        config = _complete_config(model)
    except (ConfigError, OSError, ValueError):
        return None
    return mlp_shape_from_config(config, spec.dtype)


def _complete_config(model: str) -> dict[str, Any]:
    """The config ``model`` names: a preset's complete config where it points to one, else the config read."""
    from kvpools_core.config import read_config_file
    from kvpools_core.models import registry_presets, resolve_model_source
    from kvpools_core.pipeline.weights import WEIGHTS_CONFIG_KEY
    from kvpools_core.registry import get_registry

    registry = get_registry()
    config, source, name = resolve_model_source(model, registry)
    pointer = config.get(WEIGHTS_CONFIG_KEY)
    if source.startswith("preset:") and pointer:
        config = read_config_file(Path(registry_presets(registry)[name][1]).parent / str(pointer))
    return dict(config)
