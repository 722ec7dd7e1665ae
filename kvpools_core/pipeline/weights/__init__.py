"""Estimate a model's weights (parameters and bytes per rank) from its ``config.json`` alone.

The KV planner's :class:`~kvpools_core.values.ModelSpec` keeps only what the
cache needs, so this module reads the raw config again and rebuilds the
tensor shapes of the decoder the way the Hugging Face checkpoints and
SGLang's model files lay them out.  Each tensor carries its Hugging Face
module name (so a ``quantization_config``'s ``modules_to_not_convert`` /
``ignore`` list applies to it) and how SGLang shards it:

* tensor parallelism splits attention heads (column-parallel ``q/k/v``,
  row-parallel ``o``; KV heads are replicated once TP exceeds them), the dense
  MLP and the shared experts, and the vocabulary of the embedding and LM head;
* DP attention (``enable_dp_attention``, for :data:`DP_ATTENTION_ARCHITECTURES`)
  splits the attention heads and the embedding's vocabulary over the
  attention-TP group of ``tp / dp_size`` ranks instead; everything else keeps TP/EP;
* expert parallelism (``ep_size``) gives each rank ``E / ep`` experts whose
  intermediate size splits over the remaining ``tp / ep`` ranks (SGLang's
  ``moe_tp_size``); with ``ep_size=1`` every expert is TP-sharded;
* pipeline parallelism keeps the layers of ``Serving.pp_rank``
  (:func:`~kvpools_core.parallel.pp_layer_range`), the embedding on the first
  stage and the final norm and LM head on the last (a tied head is a copy there).

Only the architectures of :data:`ARCHITECTURES` are modelled (the family
functions live in ``_decoders`` and ``_hybrids``, the quantisation layouts in
``_quantisation``); any other ``model_type`` is refused, naming the field,
rather than guessed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs

from kvpools_core.config import ConfigReader, describe, model_dtype, read_config_file
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.models import registry_presets, resolve_model_source
from kvpools_core.parallel import pp_layer_range
from kvpools_core.pipeline.weights._decoders import (
    _deepseek,
    _deepseek_v4,
    _gemma4,
    _gpt_oss,
    _llama_like,
    _mimo,
    _mimo_v2_flash,
    _minimax_m2,
    _minimax_m3,
)
from kvpools_core.pipeline.weights._hybrids import _jamba, _nemotron_h, _qwen3_next
from kvpools_core.pipeline.weights._model import _Builder, _Sharding, _Tensor, vocab_rows_per_rank
from kvpools_core.pipeline.weights._quantisation import _Quantisation, _quantisation
from kvpools_core.values import Serving

__all__ = [
    "ARCHITECTURES",
    "DP_ATTENTION_ARCHITECTURES",
    "FAMILIES",
    "WeightsEstimate",
    "estimate_weights",
    "vocab_rows_per_rank",
]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
FAMILIES = (
    "embedding",
    "lm_head",
    "attention",
    "mlp",
    "moe_experts",
    "moe_shared_experts",
    "moe_router",
    "linear_attention",
    "mamba",
    "vision",
    "norms",
    "mtp",
)


@attrs.frozen
class WeightsEstimate:
    """Parameters and bytes of a model's weights, whole and on one rank.

    ``parameters`` counts every tensor of the checkpoint, multi-token-prediction
    layers included (``parameters_by_family['mtp']``); ``bytes_total`` is the
    checkpoint with its quantisation scales.  ``bytes_per_rank`` is what the
    rank ``(tp rank 0, Serving.pp_rank)`` holds when serving the target model;
    MTP layers are left out of it (SGLang loads them only as a speculative
    draft).  ``dtypes`` says how each family is stored.
    """

    model: str
    parameters: int
    parameters_by_family: Mapping[str, int]
    bytes_total: int
    bytes_per_rank: int
    dtypes: Mapping[str, str]
    notes: tuple[str, ...] = ()

    @property
    def parameters_without_mtp(self) -> int:
        """The main model's parameters, as model cards that list MTP apart count them."""
        return self.parameters - self.parameters_by_family.get("mtp", 0)


ARCHITECTURES: dict[str, Callable[[_Builder, str], list[str]]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": _llama_like,
    "qwen3": _llama_like,
    "qwen3_moe": _llama_like,
    "gemma2": _llama_like,
    "gemma3_text": _llama_like,
    "gemma4_text": _gemma4,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "deepseek_v32": _deepseek,
    "deepseek_v4": _deepseek_v4,
    "gpt_oss": _gpt_oss,
    "mimo": _mimo,
    "mimo_v2_flash": _mimo_v2_flash,
    "minimax_m2": _minimax_m2,
    "minimax_m3": _minimax_m3,
    "qwen3_next": _qwen3_next,
    "qwen3_5_text": _qwen3_next,
    "qwen3_5_moe_text": _qwen3_next,
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
}


def _load_config(model: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    if isinstance(model, Mapping):
        return model, "config"
    from kvpools_core.registry import get_registry

    registry = get_registry()
    config, source, name = resolve_model_source(os.fspath(model), registry)
    pointer = config.get(WEIGHTS_CONFIG_KEY)
    if source.startswith("preset:") and pointer:
        full = Path(registry_presets(registry)[name][1]).parent / str(pointer)
        return read_config_file(full), f"{source} ({WEIGHTS_CONFIG_KEY} {pointer})"
    return config, source


WEIGHTS_CONFIG_KEY = "_weights_config"
"""A preset's pointer to the complete ``config.json`` it was excerpted from (a path beside the preset).

Presets keep only what the KV cache needs; the weights estimate reads the
complete config this key names, so ``estimate_weights("llama-3.1-8b")`` and
``kvpools plan llama-3.1-8b --gpu h100`` need no ``--weights-memory``.
"""


DP_ATTENTION_ARCHITECTURES = {
    "deepseek_v2": "sglang/srt/models/deepseek_v2.py DeepseekV2AttentionMLA",
    "deepseek_v3": "sglang/srt/models/deepseek_v2.py DeepseekV2AttentionMLA",
    "kimi_k2": "sglang/srt/models/deepseek_v2.py DeepseekV2AttentionMLA",
    "deepseek_v32": "sglang/srt/models/deepseek_v2.py DeepseekV2AttentionMLA",
    "qwen3": "sglang/srt/models/qwen3.py Qwen3Attention",
    "qwen3_moe": "sglang/srt/models/qwen3_moe.py Qwen3MoeAttention",
    "gpt_oss": "sglang/srt/models/gpt_oss.py GptOssAttention",
}
"""The architectures whose weights are modelled under DP attention, and the SGLang module that builds their
attention on the attention-TP group (``parallel_group="attn_tp"``, heads over ``attn_tp_size``).

Only these were checked against SGLang 0.5.23: each shards its attention and input embedding over attention TP and
keeps its MLP, experts and LM head on TP/EP.  Other model files either build attention on the full TP group (Llama's
``LlamaAttention``) or were not checked, so they are refused under DP attention rather than guessed.
"""


def _sharding(serving: Serving, ep_size: int, model_type: str) -> _Sharding:
    """The ranks each tensor splits over; DP attention only for :data:`DP_ATTENTION_ARCHITECTURES`.

    Attention context parallelism (``attn_cp_size > 1``) is refused: it shares the attention-TP group with
    context-parallel ranks (``attn_tp_size = tp // dp // cp``) and its per-model paths (DeepSeek's DCP,
    ``dcp_size``) are not modelled.
    """
    if serving.attn_cp_size > 1:
        raise UnsupportedCombinationError(
            f"The weights estimate does not model attn_cp_size {serving.attn_cp_size} (attention context "
            "parallelism regroups the attention ranks); give the weights' size yourself, or use attn_cp_size 1."
        )
    if serving.enable_dp_attention and model_type not in DP_ATTENTION_ARCHITECTURES:
        raise UnsupportedCombinationError(
            f"The weights estimate models enable_dp_attention only for {', '.join(sorted(DP_ATTENTION_ARCHITECTURES))}"
            f" (whose SGLang attention shards over attn_tp_size); model_type {model_type!r} is not checked. Give the "
            "weights' size yourself, or serve without DP attention."
        )
    if ep_size < 1 or serving.tp_size % ep_size:
        raise UnsupportedCombinationError(
            f"ep_size {ep_size} must divide tp_size {serving.tp_size} (SGLang's experts split over ep, then tp / ep)."
        )
    return _Sharding(
        serving.tp_size,
        ep_size,
        serving.pp_size,
        serving.pp_rank,
        serving.pp_layer_partition,
        attn_dp=serving.attn_dp_size,
    )


def estimate_weights(
    model: str | os.PathLike[str] | Mapping[str, Any], serving: Serving | None = None, *, ep_size: int = 1
) -> WeightsEstimate:
    """Parameters and bytes of ``model``'s weights, and what one rank of ``serving`` holds.

    ``model`` is what :func:`kvpools_core.plan` takes by name or path (a preset, a
    ``config.json`` or its directory) or the config mapping itself; the config must
    carry the full shapes (``intermediate_size``, ``vocab_size``, expert counts).
    A preset keeps only the KV fields and names the complete config it came from
    (``_weights_config``); a preset without one is refused naming the first
    missing field.  ``ep_size`` is SGLang's ``--ep-size``.
    """
    serving = serving or Serving()
    config, source = _load_config(model)
    outer = ConfigReader(config, source)
    reader = outer.text()
    model_type = reader.string("model_type", "") or outer.string("model_type", "")
    architecture = ARCHITECTURES.get(model_type)
    if architecture is None:
        raise reader.error(
            "model_type",
            f"is {describe(model_type or None)}",
            f"The weights estimate models {', '.join(sorted(ARCHITECTURES))}; other architectures are not guessed.",
        )
    sharding = _sharding(serving, ep_size, model_type)
    builder = _Builder(reader, sharding, outer)
    notes = architecture(builder, model_type)
    dtype = model_dtype(reader)
    element = DTYPE_BYTES[dtype]
    quantisation = _quantisation(outer if outer.has("quantization_config") else reader)
    if not (reader.has("torch_dtype") or reader.has("dtype")):
        notes.append("The config names no torch_dtype: unquantised tensors are taken as bfloat16.")

    start, end = pp_layer_range(reader.integer("num_hidden_layers"), sharding.pp_rank, sharding.pp, sharding.partition)
    parameters = dict.fromkeys(FAMILIES, 0)
    labels: dict[str, set[str]] = {}
    bytes_total = bytes_per_rank = 0
    for tensor in builder.tensors:
        family = "mtp" if tensor.mtp else tensor.family
        parameters[family] += tensor.parameters
        storage = None if quantisation is None else quantisation.for_tensor(tensor)
        if builder.expert_storage is not None and tensor.family == "moe_experts":
            storage = builder.expert_storage.for_tensor(tensor)
        quantised = storage is not None
        own = tensor.element_bytes

        def size(
            count: int, out: int, inner: int, storage: _Quantisation | None = storage, own: int | None = own
        ) -> int:
            if storage is not None:
                return storage.bytes_of(count, out, inner)
            return count * out * inner * (own or element)

        label = storage.label if storage is not None else dtype
        label = "float32" if own == 4 and not quantised else label
        labels.setdefault(family, set()).add(label)
        bytes_total += size(tensor.count, tensor.out, tensor.inner)
        if tensor.mtp or not _on_stage(tensor, start, end, sharding):
            continue
        out, inner, count = tensor.on_rank()
        bytes_per_rank += size(count, out, inner)
    return WeightsEstimate(
        model=source,
        parameters=sum(parameters.values()),
        parameters_by_family={family: count for family, count in parameters.items() if count},
        bytes_total=bytes_total,
        bytes_per_rank=bytes_per_rank,
        dtypes={family: "; ".join(sorted(names)) for family, names in labels.items()},
        notes=tuple(notes),
    )


def _on_stage(tensor: _Tensor, start: int, end: int, sharding: _Sharding) -> bool:
    if tensor.layer is not None:
        return start <= tensor.layer < end
    if tensor.stage == "first":
        return sharding.pp_rank == 0
    if tensor.stage == "last":
        return sharding.pp_rank == sharding.pp - 1
    return True
