"""Sum an architecture's tensors into a :class:`WeightsEstimate`: parameters, checkpoint bytes and one rank's bytes.

An architecture plugin answers the ``estimate_weights`` hook with :func:`estimate`, passing the function that
fills a :class:`~kvpools_core.parts.weights.tensors.Builder` with its decoder's tensors; this module shards them
(:func:`sharding`), applies the checkpoint's ``quantization_config``, keeps the layers of ``Serving.pp_rank`` and
adds the bytes up.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import attrs

from kvpools_core.config import ConfigReader, model_dtype
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parallel import pp_layer_range
from kvpools_core.parts.weights.methods import resolve_quantization
from kvpools_core.parts.weights.quantisation import (
    Quantisation,
    RuntimeFp8,
    quantisation_of,
    runtime_quantisation,
)
from kvpools_core.parts.weights.safetensors import Share
from kvpools_core.parts.weights.tensors import Builder, Sharding, Tensor
from kvpools_core.values import Serving

__all__ = [
    "DTYPE_BYTES",
    "FAMILIES",
    "Decoder",
    "WeightsConfig",
    "WeightsEstimate",
    "estimate",
    "estimate_claimed",
    "sharding",
]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_RUNTIME_NOTES = {
    "sglang": "--quantization {method}: the Linear weights are quantised to fp8 at load with a float32 scale per "
    "output row (per expert in MoE), as SGLang does on CUDA.",
    "per_tensor": "--quantization {method}: the Linear weights are quantised to fp8 at load with one float32 scale "
    "per vLLM layer (q/k/v and gate/up fused share one) and one per expert for w13 and w2 in MoE.",
    "per_channel": "--quantization {method}: the Linear weights and experts are quantised to fp8 at load with a "
    "float32 scale per output row.",
    "per_block": "--quantization {method}: the Linear weights and experts are quantised to fp8 at load with a "
    "float32 scale per 128x128 block (the experts' hidden and per-rank intermediate sizes padded to 128).",
}
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
"""The families a tensor belongs to (``Tensor.family``; ``mtp`` for every tensor of a multi-token-prediction
layer), in the order a report lists them."""


@attrs.frozen
class WeightsConfig:
    """The complete ``config.json`` a weights estimate reads, as the ``estimate_weights`` hook receives it.

    ``reader`` is the text model's config (``text_config`` when the checkpoint nests it), ``outer`` the top-level
    one (its ``quantization_config``, ``vision_config``, ``tie_word_embeddings``); ``model_type`` is the text
    model's (or the top level's when the text model names none): what an architecture plugin claims.
    """

    reader: ConfigReader
    outer: ConfigReader
    source: str
    model_type: str


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
    method: str = "estimate"
    """``"estimate"`` (from ``config.json``) or ``"safetensors"`` (the checkpoint's headers, sharded as estimated)."""
    shares: Mapping[str, Share] = attrs.field(factory=dict, eq=False, repr=False)
    """Each layout tensor's share on the rank, by Hugging Face module name (what :func:`exact_weights` shards the
    checkpoint's tensors by)."""
    served_dtype: str = "bfloat16"
    """The dtype unquantised tensors are served in (``--dtype``)."""

    @property
    def parameters_without_mtp(self) -> int:
        """The main model's parameters, as model cards that list MTP apart count them."""
        return self.parameters - self.parameters_by_family.get("mtp", 0)


Decoder = Callable[[Builder], Sequence[str]]
"""Fills a builder with one architecture's tensors and returns its notes (what is not counted, or assumed)."""


def estimate(
    config: WeightsConfig,
    serving: Serving,
    decoder: Decoder,
    *,
    ep_size: int = 1,
    dp_attention: bool = False,
    vllm_methods: Mapping[str, str] | None = None,
) -> WeightsEstimate:
    """The weights of ``config``'s model, whole and on one rank of ``serving``, from the tensors ``decoder`` adds.

    ``ep_size`` is SGLang's ``--ep-size``; ``dp_attention`` says the architecture's SGLang attention (and input
    embedding) shards over the attention-TP group under ``enable_dp_attention``, which the plugin checked against
    SGLang's model file; without it DP attention is refused (:func:`sharding`).  ``vllm_methods``: the
    architecture's own vLLM quantisation methods by checkpoint ``quant_method`` (:func:`resolve_quantization`).
    """
    reader, outer = config.reader, config.outer
    shards = sharding(serving, ep_size, config.model_type, dp_attention=dp_attention)
    builder = Builder(reader, shards, outer)
    notes = list(decoder(builder))
    dtype = model_dtype(reader) if serving.dtype == "auto" else serving.dtype
    element = DTYPE_BYTES[dtype]
    quant_reader = outer if outer.has("quantization_config") else reader
    checkpoint = quantisation_of(quant_reader)
    quant = quant_reader.child("quantization_config").config if quant_reader.has("quantization_config") else None
    engine = "vllm" if serving.accounting == "vllm" else "sglang"
    resolved = resolve_quantization(
        engine,
        serving.quantization,
        quant,
        model_methods=vllm_methods,
        traits=serving.traits,
    )
    modules = frozenset(tensor.module for tensor in builder.tensors)
    quantisation = runtime_quantisation(resolved, checkpoint, engine, modules)
    if isinstance(quantisation, RuntimeFp8):
        notes.append(_RUNTIME_NOTES[quantisation.scheme].format(method=serving.quantization))
    elif serving.quantization is not None and checkpoint is not None:
        notes.append(
            f"--quantization {serving.quantization}: the checkpoint is already quantised "
            f"({quant.get('quant_method') if quant else '?'}); the engine serves its own storage, nothing is "
            "quantised again."
        )
    if not (reader.has("torch_dtype") or reader.has("dtype")):
        notes.append("The config names no torch_dtype: unquantised tensors are taken as bfloat16.")

    start, end = pp_layer_range(reader.integer("num_hidden_layers"), shards.pp_rank, shards.pp, shards.partition)
    parameters = dict.fromkeys(FAMILIES, 0)
    labels: dict[str, set[str]] = {}
    bytes_total = bytes_per_rank = 0
    shares: dict[str, Share] = {}
    for tensor in builder.tensors:
        family = "mtp" if tensor.mtp else tensor.family
        parameters[family] += tensor.parameters
        storage = None if quantisation is None else quantisation.for_tensor(tensor)
        if builder.expert_storage is not None and tensor.family == "moe_experts":
            storage = builder.expert_storage.for_tensor(tensor)
        quantised = storage is not None
        own = tensor.element_bytes

        def size(
            count: int, out: int, inner: int, storage: Quantisation | None = storage, own: int | None = own
        ) -> int:
            if storage is not None:
                return storage.bytes_of(count, out, inner)
            return count * out * inner * (own or element)

        label = storage.label if storage is not None else dtype
        label = "float32" if own == 4 and not quantised else label
        labels.setdefault(family, set()).add(label)
        bytes_total += size(tensor.count, tensor.out, tensor.inner)
        out, inner, count = tensor.on_rank()
        held = not tensor.mtp and _on_stage(tensor, start, end, shards)
        previous = shares.get(tensor.module, Share(0, 0, tensor.element_bytes))
        rank_parameters = count * out * inner if held else 0
        runtime = None
        if isinstance(quantisation, RuntimeFp8) and storage is not None:
            runtime = (previous.quantised_bytes or 0) + size(tensor.count, tensor.out, tensor.inner)
        shares[tensor.module] = attrs.evolve(
            previous,
            rank=previous.rank + rank_parameters,
            total=previous.total + tensor.parameters,
            quantised_bytes=runtime,
        )
        if held:
            bytes_per_rank += size(count, out, inner)
    return WeightsEstimate(
        model=config.source,
        parameters=sum(parameters.values()),
        parameters_by_family={family: count for family, count in parameters.items() if count},
        bytes_total=bytes_total,
        bytes_per_rank=bytes_per_rank,
        dtypes={family: "; ".join(sorted(names)) for family, names in labels.items()},
        notes=tuple(notes),
        shares=shares,
        served_dtype=dtype,
    )


def estimate_claimed(
    config: WeightsConfig,
    serving: Serving,
    ep_size: int,
    decoders: Mapping[str, Callable[[Builder, str], Sequence[str]]],
    dp_attention: Collection[str] = (),
    vllm_methods: Mapping[str, Mapping[str, str]] | None = None,
) -> WeightsEstimate | None:
    """An ``estimate_weights`` answer keyed by ``model_type``: :func:`estimate` with ``decoders[config.model_type]``
    (called with the builder and the model type), DP attention for the model types in ``dp_attention``, vLLM's
    architecture-specific quantisation methods from ``vllm_methods[model_type]``; ``None`` (decline) for a model
    type ``decoders`` does not claim."""
    decoder = decoders.get(config.model_type)
    if decoder is None:
        return None
    return estimate(
        config,
        serving,
        lambda builder: decoder(builder, config.model_type),
        ep_size=ep_size,
        dp_attention=config.model_type in dp_attention,
        vllm_methods=(vllm_methods or {}).get(config.model_type),
    )


def sharding(serving: Serving, ep_size: int, model_type: str, *, dp_attention: bool = False) -> Sharding:
    """The ranks each tensor splits over; DP attention only where the architecture says its attention shards on
    attention TP (``dp_attention``).

    Attention context parallelism (``attn_cp_size > 1``) is refused: it shares the attention-TP group with
    context-parallel ranks (``attn_tp_size = tp // dp // cp``) and its per-model paths (DeepSeek's DCP,
    ``dcp_size``) are not modelled.
    """
    if serving.attn_cp_size > 1:
        raise UnsupportedCombinationError(
            f"The weights estimate does not model attn_cp_size {serving.attn_cp_size} (attention context "
            "parallelism regroups the attention ranks); give the weights' size yourself, or use attn_cp_size 1."
        )
    if serving.enable_dp_attention and not dp_attention:
        raise UnsupportedCombinationError(
            "The weights estimate models enable_dp_attention only for architectures whose SGLang attention was "
            f"checked to shard over attn_tp_size (its plugin says so); model_type {model_type!r} is not checked. "
            "Give the weights' size yourself, or serve without DP attention."
        )
    if ep_size < 1 or serving.tp_size % ep_size:
        raise UnsupportedCombinationError(
            f"ep_size {ep_size} must divide tp_size {serving.tp_size} (SGLang's experts split over ep, then tp / ep)."
        )
    return Sharding(
        serving.tp_size,
        ep_size,
        serving.pp_size,
        serving.pp_rank,
        serving.pp_layer_partition,
        attn_dp=serving.attn_dp_size,
        engine="vllm" if serving.accounting == "vllm" else "sglang",
    )


def _on_stage(tensor: Tensor, start: int, end: int, sharding: Sharding) -> bool:
    if tensor.layer is not None:
        return start <= tensor.layer < end
    if tensor.stage == "first":
        return sharding.pp_rank == 0
    if tensor.stage == "last":
        return sharding.pp_rank == sharding.pp - 1
    return True
