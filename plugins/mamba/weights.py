"""The weights of the linear-attention and Mamba hybrids this plugin parses (``estimate_weights`` hook), from the
parts library."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpools_core import hookimpl
from kvpools_core.parts.weights import (
    Builder,
    WeightsConfig,
    WeightsEstimate,
    estimate_claimed,
    gated_delta_net,
    mamba1,
    mamba2,
    qwen3_vl_vision,
    sparse_moe,
    ungated_mlp,
)
from kvpools_core.values import Serving


@hookimpl
def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> WeightsEstimate | None:
    """The weights of the ``model_type`` values of :data:`DECODERS`, from the parts library; None for any other."""
    return estimate_claimed(config, serving, ep_size, DECODERS, DP_ATTENTION)


def _qwen3_next(builder: Builder, model_type: str) -> list[str]:
    """Qwen3-Next and the Qwen3.5 text model: Gated DeltaNet layers with a gated softmax-attention layer every
    ``full_attention_interval`` (or as ``layer_types`` lists them), q/k norms, MoE (or a dense MLP) and MTP layers.

    The MTP module (``mtp.*``: ``fc`` from ``2·hidden``, two pre-fc norms, full-attention MoE layers and a final
    norm) shares the target's embedding and head (sglang/srt/models/qwen3_next_mtp.py).  Qwen3.5 names its count
    ``mtp_num_hidden_layers``; Qwen3-Next's config names none and its checkpoint ships one layer.
    """
    reader = builder.reader
    hidden = builder.hidden
    layers = reader.integer("num_hidden_layers")
    split_projections = model_type.startswith("qwen3_5")
    layer_types = reader.string_list("layer_types", choices=("linear_attention", "full_attention"))
    if layer_types and len(layer_types) != layers:
        raise reader.error("layer_types", f"has {len(layer_types)} entries", f"List one per layer ({layers}).")
    interval = reader.integer("full_attention_interval", 4)
    heads = reader.integer("num_attention_heads")
    head_dim = reader.integer("head_dim", hidden // heads)
    gated = reader.boolean("attn_output_gate", True)
    moe = reader.integer("num_experts", 0, minimum=0) > 0
    sparse_step = reader.integer("decoder_sparse_step", 1)
    dense_only = set(reader.integer_list("mlp_only_layers", maximum=layers - 1))

    # Qwen3.5's checkpoints (a text model under text_config) name the decoder model.language_model.
    root = "model.language_model" if builder.outer is not reader else "model"

    def full_attention(layer: int) -> bool:
        return layer_types[layer] == "full_attention" if layer_types else (layer + 1) % interval == 0

    def decoder_layer(prefix: str, layer: int, attention: bool, sparse: bool, **kw: Any) -> None:
        if attention:
            builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, False, False, gated=gated, **kw)
            builder.norm(f"{prefix}.self_attn.q_norm", layer, head_dim, **kw)
            builder.norm(f"{prefix}.self_attn.k_norm", layer, head_dim, **kw)
        else:
            gated_delta_net(builder, f"{prefix}.linear_attn", layer, split_projections, **kw)
        builder.norm(f"{prefix}.input_layernorm", layer, **kw)
        builder.norm(f"{prefix}.post_attention_layernorm", layer, **kw)
        if sparse:
            sparse_moe(builder, f"{prefix}.mlp", layer, **kw)
        else:
            builder.dense_mlp(f"{prefix}.mlp", layer, reader.integer("intermediate_size"), **kw)

    for layer in range(layers):
        sparse = moe and layer not in dense_only and (layer + 1) % sparse_step == 0
        decoder_layer(f"{root}.layers.{layer}", layer, full_attention(layer), sparse)
    tied = reader.boolean("tie_word_embeddings", builder.outer.boolean("tie_word_embeddings", False))
    builder.embeddings(tied)
    mtp_layers = reader.integer("mtp_num_hidden_layers", reader.integer("num_nextn_predict_layers", 1), minimum=0)
    for index in range(mtp_layers):
        decoder_layer(f"mtp.layers.{index}", layers + index, True, moe, mtp=True)
    if mtp_layers:
        builder.replicated("mtp", "mtp.fc", hidden, 2 * hidden, layers, mtp=True)
        for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
            builder.norm(f"mtp.{name}", layers, mtp=True)
    notes = []
    if not reader.has("mtp_num_hidden_layers") and not reader.has("num_nextn_predict_layers"):
        notes.append("The config names no MTP layer count; one MTP layer is counted, as the checkpoints ship.")
    if builder.outer.has("vision_config"):
        qwen3_vl_vision(builder, builder.outer.child("vision_config"))
    return notes


def _nemotron_h(builder: Builder, model_type: str) -> list[str]:
    """Nemotron-H: one mixer a layer as ``hybrid_override_pattern`` spells it (``M`` Mamba-2, ``*`` attention,
    ``-`` a squared-ReLU MLP, ``E`` a MoE with a float32 ``e_score_correction_bias`` and shared experts), each
    behind one RMSNorm (sglang/srt/models/nemotron_h.py; ``backbone.*`` in the checkpoint)."""
    reader = builder.reader
    hidden = builder.hidden
    layers = reader.integer("num_hidden_layers")
    pattern = reader.string("hybrid_override_pattern")
    if len(pattern) != layers or set(pattern) - set("M*-E"):
        raise reader.error(
            "hybrid_override_pattern",
            f"is {pattern!r}",
            f"Spell one of 'M', '*', '-', 'E' for each of the {layers} layers.",
        )
    heads = reader.integer("num_attention_heads")
    head_dim = reader.integer("head_dim", hidden // heads)
    attention_bias = reader.boolean("attention_bias", False)
    mlp_bias = reader.boolean("mlp_bias", False)
    for layer, kind in enumerate(pattern):
        prefix = f"backbone.layers.{layer}"
        builder.norm(f"{prefix}.norm", layer)
        mixer = f"{prefix}.mixer"
        if kind == "M":
            mamba2(builder, mixer, layer)
        elif kind == "*":
            builder.gqa_attention(mixer, layer, head_dim, attention_bias, attention_bias)
        elif kind == "-":
            ungated_mlp(builder, mixer, layer, reader.integer("intermediate_size"), "mlp", mlp_bias)
        else:
            experts = reader.integer("n_routed_experts")
            builder.replicated("moe_router", f"{mixer}.gate", experts, hidden, layer, linear=False)
            builder.add("moe_router", f"{mixer}.gate.e_score_correction_bias", experts, layer=layer, element_bytes=4)
            intermediate = reader.integer("moe_intermediate_size")
            builder.experts(f"{mixer}.experts", layer, experts, intermediate, gated=False)  # squared-ReLU experts
            shared = reader.integer("n_shared_experts", 0, minimum=0)
            if shared:
                shared_size = reader.integer("moe_shared_expert_intermediate_size") * shared
                ungated_mlp(builder, f"{mixer}.shared_experts", layer, shared_size, "moe_shared_experts", mlp_bias)
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    return []


def _jamba(builder: Builder, model_type: str) -> list[str]:
    """Jamba (transformers' ``modeling_jamba``): attention every ``attn_layer_period``-th layer from
    ``attn_layer_offset`` (Mamba-1 elsewhere), and a MoE (``router`` and ``num_experts`` SwiGLU experts) every
    ``expert_layer_period``-th layer from ``expert_layer_offset`` (a dense MLP elsewhere); ``input_layernorm`` and
    ``pre_ff_layernorm`` a layer.  SGLang has no Jamba; the shards are vLLM's (``MambaMixer``, ``FusedMoE``)."""
    reader = builder.reader
    hidden = builder.hidden
    layers = reader.integer("num_hidden_layers")
    attention_period, attention_offset = (
        reader.integer("attn_layer_period"),
        reader.integer("attn_layer_offset", 0, minimum=0),
    )
    expert_period, expert_offset = (
        reader.integer("expert_layer_period", 1),
        reader.integer("expert_layer_offset", 0, minimum=0),
    )
    experts = reader.integer("num_experts", 1)
    heads = reader.integer("num_attention_heads")
    head_dim = hidden // heads
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        if layer % attention_period == attention_offset:
            builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, False, False)
        else:
            mamba1(builder, f"{prefix}.mamba", layer)
        builder.norm(f"{prefix}.input_layernorm", layer)
        builder.norm(f"{prefix}.pre_ff_layernorm", layer)
        feed_forward = f"{prefix}.feed_forward"
        if experts > 1 and layer % expert_period == expert_offset:
            builder.replicated("moe_router", f"{feed_forward}.router", experts, hidden, layer, linear=False)
            builder.experts(f"{feed_forward}.experts", layer, experts, reader.integer("intermediate_size"))
        else:
            builder.dense_mlp(feed_forward, layer, reader.integer("intermediate_size"))
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    return ["Jamba is not served by SGLang: its per-rank shards follow vLLM's MambaMixer and FusedMoE."]


DECODERS: dict[str, Callable[[Builder, str], list[str]]] = {
    "qwen3_next": _qwen3_next,
    "qwen3_5_text": _qwen3_next,
    "qwen3_5_moe_text": _qwen3_next,
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
}
"""The ``model_type`` values whose weights this plugin estimates, and the function that lays out their tensors."""

DP_ATTENTION: dict[str, str] = {}
"""The model types whose SGLang attention (and input embedding) shards over the attention-TP group under
``enable_dp_attention`` (``parallel_group="attn_tp"``, checked against SGLang 0.5.23), with the module that builds
it; the estimate refuses DP attention for the others."""
