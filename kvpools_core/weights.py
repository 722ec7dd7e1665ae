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
* expert parallelism (``ep_size``) gives each rank ``E / ep`` experts whose
  intermediate size splits over the remaining ``tp / ep`` ranks (SGLang's
  ``moe_tp_size``); with ``ep_size=1`` every expert is TP-sharded;
* pipeline parallelism keeps the layers of ``Serving.pp_rank``
  (:func:`~kvpools_core.parallel.pp_layer_range`), the embedding on the first
  stage and the final norm and LM head on the last (a tied head is a copy there).

Only the architectures below are modelled; any other ``model_type`` is
refused, naming the field, rather than guessed.
"""

from __future__ import annotations

import fnmatch
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from kvpools_core.config import ConfigReader, describe, model_dtype, resolve_model_source
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parallel import kv_heads_per_rank, pp_layer_range
from kvpools_core.values import Serving

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
FAMILIES = (
    "embedding",
    "lm_head",
    "attention",
    "mlp",
    "moe_experts",
    "moe_shared_experts",
    "moe_router",
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


@attrs.frozen
class _Tensor:
    """One weight (``count`` stacked copies of ``out × inner``), its shape on a rank, and where it lives."""

    family: str
    module: str
    out: int
    inner: int = 1
    count: int = 1
    rank_out: int | None = None
    rank_inner: int | None = None
    rank_count: int | None = None
    layer: int | None = None  # decoder layer index; None for embedding/head/final norm
    stage: str = "all"  # "first" / "last" for tensors outside the layers
    linear: bool = False  # a Linear weight, which a quantization_config may quantise
    mtp: bool = False
    element_bytes: int | None = None  # a dtype of its own (float32 router biases) instead of the model's

    @property
    def parameters(self) -> int:
        return self.count * self.out * self.inner

    def on_rank(self) -> tuple[int, int, int]:
        return (
            self.out if self.rank_out is None else self.rank_out,
            self.inner if self.rank_inner is None else self.rank_inner,
            self.count if self.rank_count is None else self.rank_count,
        )


@attrs.frozen
class _Quantisation:
    """How the quantised Linear weights are stored: bytes of ``count × out × inner`` values with their scales."""

    label: str
    bytes_of: Callable[[int, int, int], int]
    excluded: tuple[str, ...]

    def applies_to(self, tensor: _Tensor) -> bool:
        return tensor.linear and not any(_module_matches(tensor.module, pattern) for pattern in self.excluded)


def _module_matches(module: str, pattern: str) -> bool:
    """Hugging Face's ``modules_to_not_convert`` semantics: the module or a parent of it matches the pattern."""
    parts = module.split(".")
    return any(fnmatch.fnmatchcase(".".join(parts[:end]), pattern) for end in range(1, len(parts) + 1))


def _quantisation(reader: ConfigReader) -> _Quantisation | None:
    """The storage of quantised Linear weights from ``quantization_config``; unknown methods are refused."""
    if not reader.has("quantization_config"):
        return None
    quant = reader.child("quantization_config")
    method = quant.string("quant_method")
    excluded = quant.string_list("modules_to_not_convert") or quant.string_list("ignore")
    if method == "fp8":
        block = quant.integer_list("weight_block_size", minimum=1, maximum=1 << 20)
        if block:
            if len(block) != 2:
                raise quant.error("weight_block_size", f"is {describe(list(block))}", "It must be [rows, columns].")
            rows, cols = block
            return _Quantisation(
                f"float8_e4m3 + float32 scale per {rows}x{cols} block",
                lambda count, out, inner: count * (out * inner + 4 * math.ceil(out / rows) * math.ceil(inner / cols)),
                excluded,
            )
        return _Quantisation(
            "float8_e4m3 + one float32 scale per tensor",
            lambda count, out, inner: count * (out * inner + 4),
            excluded,
        )
    if method == "mxfp4":
        # OCP MX: 4-bit E2M1 values, one E8M0 (1 byte) scale per 32 values along the input dimension.
        return _Quantisation(
            "mxfp4 (4-bit + one e8m0 scale per 32 values)",
            lambda count, out, inner: count * out * (math.ceil(inner / 2) + math.ceil(inner / 32)),
            excluded,
        )
    raise quant.error(
        "quant_method",
        f"is {describe(method)}",
        "The weights estimate knows 'fp8' (per-tensor or block-wise) and 'mxfp4'; other methods are not modelled.",
    )


@attrs.frozen
class _Sharding:
    tp: int
    ep: int
    pp: int
    pp_rank: int
    partition: tuple[int, ...] | None

    @property
    def moe_tp(self) -> int:
        return self.tp // self.ep


def _split(total: int, parts: int) -> int:
    """One rank's share of a dimension split ``parts`` ways (the last share may be short; the first is full)."""
    return math.ceil(total / parts)


def vocab_rows_per_rank(vocab: int, tp: int) -> int:
    """Embedding / LM-head rows on one rank: SGLang pads the vocabulary to a multiple of 64, or of ``64 * tp``
    when that does not split evenly (``VocabParallelEmbedding.__init__``, sglang/srt/layers/vocab_parallel_embedding.py,
    ``DEFAULT_VOCAB_PADDING_SIZE = 64``), then divides it over TP."""
    padded = math.ceil(vocab / 64) * 64
    if padded % tp:
        padded = math.ceil(vocab / (64 * tp)) * 64 * tp
    return padded // tp


def _expert_intermediate_per_rank(intermediate: int, sharding: _Sharding) -> int:
    """SGLang's ``FusedMoE`` asserts the expert intermediate size divides over ``moe_tp_size = tp / ep``."""
    if intermediate % sharding.moe_tp:
        raise UnsupportedCombinationError(
            f"The expert intermediate size {intermediate} does not split over tp / ep = {sharding.moe_tp} "
            f"(SGLang's FusedMoE asserts it does)."
        )
    return intermediate // sharding.moe_tp


class _Builder:
    """Collects the tensors of one model with their per-rank shapes."""

    def __init__(self, reader: ConfigReader, sharding: _Sharding) -> None:
        self.reader = reader
        self.sharding = sharding
        self.tensors: list[_Tensor] = []
        self.hidden = reader.integer("hidden_size")

    def add(self, family: str, module: str, out: int, inner: int = 1, **kwargs: Any) -> None:
        self.tensors.append(_Tensor(family, module, out, inner, **kwargs))

    def norm(self, module: str, layer: int | None, size: int | None = None, **kwargs: Any) -> None:
        self.add("norms", module, size or self.hidden, layer=layer, **kwargs)

    def column(self, family: str, module: str, out: int, inner: int, layer: int, bias: bool = False, **kw: Any) -> None:
        """A column-parallel Linear: output features split over TP (a bias splits with them)."""
        rank_out = _split(out, self.sharding.tp)
        self.add(family, module, out, inner, rank_out=rank_out, layer=layer, linear=True, **kw)
        if bias:
            self.add(family, f"{module}.bias", out, rank_out=rank_out, layer=layer, **kw)

    def row(self, family: str, module: str, out: int, inner: int, layer: int, bias: bool = False, **kw: Any) -> None:
        """A row-parallel Linear: input features split over TP (the bias is whole on every rank)."""
        self.add(family, module, out, inner, rank_inner=_split(inner, self.sharding.tp), layer=layer, linear=True, **kw)
        if bias:
            self.add(family, f"{module}.bias", out, layer=layer, **kw)

    def replicated(self, family: str, module: str, out: int, inner: int, layer: int, **kw: Any) -> None:
        """A Linear kept whole on every rank; routers pass ``linear=False`` as checkpoints keep them unquantised."""
        self.add(family, module, out, inner, layer=layer, **{"linear": True, **kw})

    def embeddings(self, tied: bool) -> None:
        vocab = self.reader.integer("vocab_size")
        rank_vocab = vocab_rows_per_rank(vocab, self.sharding.tp)
        self.add("embedding", "model.embed_tokens", vocab, self.hidden, rank_out=rank_vocab, stage="first")
        self.norm("model.norm", None, stage="last")
        if not tied:
            self.add("lm_head", "lm_head", vocab, self.hidden, rank_out=rank_vocab, stage="last")
        elif self.sharding.pp > 1:
            # SGLang's last stage keeps its own copy of a tied head; the checkpoint stores it once (out=0:
            # no parameters of its own, only the rows on the rank).
            self.add("lm_head", "lm_head", 0, self.hidden, rank_out=rank_vocab, stage="last")

    def gqa_attention(self, prefix: str, layer: int, head_dim: int, bias: bool, out_bias: bool, **kw: Any) -> None:
        """Grouped-query attention; KV heads replicate once TP exceeds them (SGLang's ``QKVParallelLinear``)."""
        heads = self.reader.integer("num_attention_heads")
        kv_heads = self.reader.integer("num_key_value_heads", heads)
        tp = self.sharding.tp
        self.column("attention", f"{prefix}.q_proj", heads * head_dim, self.hidden, layer, bias, **kw)
        rank_kv = kv_heads_per_rank(kv_heads, tp) * head_dim
        for name in ("k_proj", "v_proj"):
            module = f"{prefix}.{name}"
            self.add("attention", module, kv_heads * head_dim, self.hidden, rank_out=rank_kv, layer=layer, linear=True)
            if bias:
                self.add("attention", f"{module}.bias", kv_heads * head_dim, rank_out=rank_kv, layer=layer)
        self.row("attention", f"{prefix}.o_proj", self.hidden, heads * head_dim, layer, out_bias, **kw)

    def dense_mlp(
        self, prefix: str, layer: int, intermediate: int, family: str = "mlp", bias: bool = False, **kw: Any
    ) -> None:
        """A SwiGLU MLP: ``gate``/``up`` column-parallel, ``down`` row-parallel."""
        self.column(family, f"{prefix}.gate_proj", intermediate, self.hidden, layer, bias, **kw)
        self.column(family, f"{prefix}.up_proj", intermediate, self.hidden, layer, bias, **kw)
        self.row(family, f"{prefix}.down_proj", self.hidden, intermediate, layer, bias, **kw)

    def experts(self, prefix: str, layer: int, experts: int, intermediate: int, **kw: Any) -> None:
        """``experts`` SwiGLU experts: ``E / ep`` of them per rank, each intermediate split over ``tp / ep``."""
        sharding = self.sharding
        if experts % sharding.ep:
            raise UnsupportedCombinationError(
                f"{experts} experts do not split over ep_size {sharding.ep}; SGLang needs ep_size to divide them."
            )
        rank_count = experts // sharding.ep
        rank_inter = _expert_intermediate_per_rank(intermediate, sharding)
        shape = {"count": experts, "rank_count": rank_count, "layer": layer, "linear": True, **kw}
        self.add("moe_experts", f"{prefix}.gate_proj", intermediate, self.hidden, rank_out=rank_inter, **shape)
        self.add("moe_experts", f"{prefix}.up_proj", intermediate, self.hidden, rank_out=rank_inter, **shape)
        self.add("moe_experts", f"{prefix}.down_proj", self.hidden, intermediate, rank_inner=rank_inter, **shape)


def _llama_like(builder: _Builder, model_type: str) -> list[str]:
    """Llama, Mistral, Qwen2/Qwen3 and Gemma-2 dense decoders, and Qwen3-MoE."""
    reader = builder.reader
    layers = reader.integer("num_hidden_layers")
    heads = reader.integer("num_attention_heads")
    head_dim = reader.integer("head_dim", builder.hidden // heads)
    qkv_bias = model_type == "qwen2" or reader.boolean("attention_bias", False)
    out_bias = model_type != "qwen2" and reader.boolean("attention_bias", False)
    mlp_bias = reader.boolean("mlp_bias", False)
    moe = model_type == "qwen3_moe"
    if moe:
        experts = reader.integer("num_experts")
        moe_intermediate = reader.integer("moe_intermediate_size")
        sparse_step = reader.integer("decoder_sparse_step", 1)
        dense_only = set(reader.integer_list("mlp_only_layers", maximum=layers - 1))
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, qkv_bias, out_bias)
        if model_type == "qwen3" or moe:
            builder.norm(f"{prefix}.self_attn.q_norm", layer, head_dim)
            builder.norm(f"{prefix}.self_attn.k_norm", layer, head_dim)
        norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
        if model_type == "gemma2":
            norms += ("pre_feedforward_layernorm", "post_feedforward_layernorm")
        for norm in norms:
            builder.norm(f"{prefix}.{norm}", layer)
        if moe and layer not in dense_only and (layer + 1) % sparse_step == 0:
            builder.replicated("moe_router", f"{prefix}.mlp.gate", experts, builder.hidden, layer, linear=False)
            builder.experts(f"{prefix}.mlp.experts", layer, experts, moe_intermediate)
        else:
            builder.dense_mlp(f"{prefix}.mlp", layer, reader.integer("intermediate_size"), bias=mlp_bias)
    builder.embeddings(reader.boolean("tie_word_embeddings", model_type == "gemma2"))
    return []


def _deepseek_layer(builder: _Builder, layer: int, prefix: str, moe: bool, **kw: Any) -> None:
    """One DeepSeek-V2/V3 decoder layer: multi-head latent attention and a dense or MoE MLP."""
    reader = builder.reader
    hidden = builder.hidden
    heads = reader.integer("num_attention_heads")
    nope, rope = reader.integer("qk_nope_head_dim"), reader.integer("qk_rope_head_dim")
    v_dim, kv_lora = reader.integer("v_head_dim"), reader.integer("kv_lora_rank")
    attn = f"{prefix}.self_attn"
    q_lora = reader.optional_integer("q_lora_rank")
    if q_lora:  # SGLang keeps the low-rank down projections whole on every rank (ReplicatedLinear)
        builder.replicated("attention", f"{attn}.q_a_proj", q_lora, hidden, layer, **kw)
        builder.norm(f"{attn}.q_a_layernorm", layer, q_lora, **kw)
        builder.column("attention", f"{attn}.q_b_proj", heads * (nope + rope), q_lora, layer, **kw)
    else:
        builder.column("attention", f"{attn}.q_proj", heads * (nope + rope), hidden, layer, **kw)
    builder.replicated("attention", f"{attn}.kv_a_proj_with_mqa", kv_lora + rope, hidden, layer, **kw)
    builder.norm(f"{attn}.kv_a_layernorm", layer, kv_lora, **kw)
    builder.column("attention", f"{attn}.kv_b_proj", heads * (nope + v_dim), kv_lora, layer, **kw)
    builder.row("attention", f"{attn}.o_proj", hidden, heads * v_dim, layer, **kw)
    builder.norm(f"{prefix}.input_layernorm", layer, **kw)
    builder.norm(f"{prefix}.post_attention_layernorm", layer, **kw)
    if not moe:
        builder.dense_mlp(f"{prefix}.mlp", layer, reader.integer("intermediate_size"), **kw)
        return
    experts = reader.integer("n_routed_experts")
    moe_intermediate = reader.integer("moe_intermediate_size")
    builder.replicated("moe_router", f"{prefix}.mlp.gate", experts, hidden, layer, linear=False, **kw)
    if reader.string("topk_method", "") == "noaux_tc":
        # float32 in the checkpoint and in SGLang's MoEGate (sglang/srt/models/deepseek_v2.py).
        bias = f"{prefix}.mlp.gate.e_score_correction_bias"
        builder.add("moe_router", bias, experts, layer=layer, element_bytes=4, **kw)
    builder.experts(f"{prefix}.mlp.experts", layer, experts, moe_intermediate, **kw)
    shared = reader.integer("n_shared_experts", 0, minimum=0)
    if shared:
        family = "moe_shared_experts"
        builder.dense_mlp(f"{prefix}.mlp.shared_experts", layer, moe_intermediate * shared, family=family, **kw)


def _deepseek(builder: _Builder, model_type: str) -> list[str]:
    """DeepSeek-V2/V3 (and Kimi-K2): MLA, MoE after ``first_k_dense_replace`` dense layers, MTP layers."""
    reader = builder.reader
    layers = reader.integer("num_hidden_layers")
    first_dense = reader.integer("first_k_dense_replace", 0, minimum=0)
    frequency = reader.integer("moe_layer_freq", 1)
    has_experts = reader.integer("n_routed_experts", 0, minimum=0) > 0

    def is_moe(layer: int) -> bool:
        return has_experts and layer >= first_dense and layer % frequency == 0

    for layer in range(layers):
        _deepseek_layer(builder, layer, f"model.layers.{layer}", is_moe(layer))
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    mtp_layers = reader.integer("num_nextn_predict_layers", 0, minimum=0)
    vocab, hidden = reader.integer("vocab_size"), builder.hidden
    for index in range(layers, layers + mtp_layers):
        # The checkpoint's MTP layer (model.layers.61 of DeepSeek-V3) holds its own embedding and head copies.
        prefix = f"model.layers.{index}"
        _deepseek_layer(builder, index, prefix, is_moe(index), mtp=True)
        for name in ("enorm", "hnorm", "shared_head.norm"):
            builder.norm(f"{prefix}.{name}", index, mtp=True)
        builder.replicated("mtp", f"{prefix}.eh_proj", hidden, 2 * hidden, index, mtp=True)
        builder.add("mtp", f"{prefix}.embed_tokens", vocab, hidden, layer=index, mtp=True)
        builder.add("mtp", f"{prefix}.shared_head.head", vocab, hidden, layer=index, mtp=True)
    return []


def _gpt_oss(builder: _Builder, model_type: str) -> list[str]:
    """gpt-oss: GQA with biases and per-head sinks; every layer a biased MoE (fused ``gate_up_proj``)."""
    reader = builder.reader
    hidden = builder.hidden
    layers = reader.integer("num_hidden_layers")
    heads = reader.integer("num_attention_heads")
    head_dim = reader.integer("head_dim", hidden // heads)
    experts = reader.integer("num_local_experts")
    intermediate = reader.integer("intermediate_size")
    sharding = builder.sharding
    if experts % sharding.ep:
        raise UnsupportedCombinationError(f"{experts} experts do not split over ep_size {sharding.ep}.")
    rank_count, rank_inter = experts // sharding.ep, _expert_intermediate_per_rank(intermediate, sharding)
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, bias=True, out_bias=True)
        builder.add("attention", f"{prefix}.self_attn.sinks", heads, rank_out=_split(heads, sharding.tp), layer=layer)
        builder.norm(f"{prefix}.input_layernorm", layer)
        builder.norm(f"{prefix}.post_attention_layernorm", layer)
        builder.replicated("moe_router", f"{prefix}.mlp.router", experts, hidden, layer, linear=False)
        builder.add("moe_router", f"{prefix}.mlp.router.bias", experts, layer=layer)
        shape = {"count": experts, "rank_count": rank_count, "layer": layer}
        module = f"{prefix}.mlp.experts"
        gate_up = {"rank_out": 2 * rank_inter, **shape}
        builder.add("moe_experts", f"{module}.gate_up_proj", 2 * intermediate, hidden, linear=True, **gate_up)
        builder.add("moe_experts", f"{module}.gate_up_proj_bias", 2 * intermediate, **gate_up)
        down = {"rank_inner": rank_inter, **shape}
        builder.add("moe_experts", f"{module}.down_proj", hidden, intermediate, linear=True, **down)
        builder.add("moe_experts", f"{module}.down_proj_bias", hidden, **shape)
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    return ["gpt-oss: SGLang's padding of the mxfp4 expert intermediate size per rank is not modelled."]


ARCHITECTURES: dict[str, Callable[[_Builder, str], list[str]]] = {
    "llama": _llama_like,
    "mistral": _llama_like,
    "qwen2": _llama_like,
    "qwen3": _llama_like,
    "qwen3_moe": _llama_like,
    "gemma2": _llama_like,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "gpt_oss": _gpt_oss,
}


def _load_config(model: str | os.PathLike[str] | Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    if isinstance(model, Mapping):
        return model, "config"
    from kvpools_core.registry import get_registry

    config, source, _ = resolve_model_source(os.fspath(model), get_registry())
    return config, source


def _sharding(serving: Serving, ep_size: int) -> _Sharding:
    if serving.enable_dp_attention or serving.attn_cp_size > 1:
        raise UnsupportedCombinationError(
            "The weights estimate models plain TP/EP/PP sharding; enable_dp_attention and attn_cp_size > 1 "
            "(which replicate or regroup attention and embeddings) are not modelled."
        )
    if ep_size < 1 or serving.tp_size % ep_size:
        raise UnsupportedCombinationError(
            f"ep_size {ep_size} must divide tp_size {serving.tp_size} (SGLang's experts split over ep, then tp / ep)."
        )
    return _Sharding(serving.tp_size, ep_size, serving.pp_size, serving.pp_rank, serving.pp_layer_partition)


def estimate_weights(
    model: str | os.PathLike[str] | Mapping[str, Any], serving: Serving | None = None, *, ep_size: int = 1
) -> WeightsEstimate:
    """Parameters and bytes of ``model``'s weights, and what one rank of ``serving`` holds.

    ``model`` is what :func:`kvpools_core.plan` takes by name or path (a preset, a
    ``config.json`` or its directory) or the config mapping itself; the config must
    carry the full shapes (``intermediate_size``, ``vocab_size``, expert counts):
    the bundled presets keep only the KV fields, so they are refused naming the
    first missing field.  ``ep_size`` is SGLang's ``--ep-size``.
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
    sharding = _sharding(serving, ep_size)
    builder = _Builder(reader, sharding)
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
        quantised = quantisation is not None and quantisation.applies_to(tensor)

        own = tensor.element_bytes

        def size(count: int, out: int, inner: int, quantised: bool = quantised, own: int | None = own) -> int:
            if quantised:
                assert quantisation is not None
                return quantisation.bytes_of(count, out, inner)
            return count * out * inner * (own or element)

        label = quantisation.label if quantised and quantisation is not None else dtype
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
