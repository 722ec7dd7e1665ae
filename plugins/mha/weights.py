"""The weights of the dense and MoE decoders this plugin parses (``estimate_weights`` hook), from the parts library."""

from __future__ import annotations

from collections.abc import Callable

from kvpools_core import hookimpl
from kvpools_core.parallel import kv_heads_per_rank
from kvpools_core.parts.weights import Builder, WeightsConfig, WeightsEstimate, estimate_claimed, llama_decoder, split
from kvpools_core.values import Serving


@hookimpl
def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> WeightsEstimate | None:
    """The weights of the ``model_type`` values of :data:`DECODERS`, from the parts library; None for any other."""
    return estimate_claimed(config, serving, ep_size, DECODERS, DP_ATTENTION)


def _llama(builder: Builder, model_type: str) -> list[str]:
    """Llama, Mistral, Qwen2/Qwen3 dense decoders and Qwen3-MoE (:func:`~kvpools_core.parts.weights.llama_decoder`):
    Qwen2 biases q/k/v, Qwen3 and Qwen3-MoE norm q and k per head."""
    moe = model_type == "qwen3_moe"
    llama_decoder(builder, qkv_bias=model_type == "qwen2", qk_norm=model_type == "qwen3" or moe, moe=moe)
    return []


def _mimo(builder: Builder, model_type: str) -> list[str]:
    """MiMo-7B: a Qwen2 decoder (q/k/v biases) and ``num_nextn_predict_layers`` MTP layers
    (``model.mtp_layers.N``: a Qwen2 layer, ``token_layernorm``, ``hidden_layernorm``, ``input_proj`` from ``2·hidden``
    and ``final_layernorm``; they share the target's embedding and head, sglang/srt/models/mimo_mtp.py)."""
    reader = builder.reader
    hidden = builder.hidden
    llama_decoder(builder, qkv_bias=True)
    heads = reader.integer("num_attention_heads")
    head_dim = reader.integer("head_dim", hidden // heads)
    intermediate = reader.integer("intermediate_size")
    layers = reader.integer("num_hidden_layers")
    for index in range(reader.integer("num_nextn_predict_layers", 0, minimum=0)):
        prefix, layer = f"model.mtp_layers.{index}", layers + index
        builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, bias=True, out_bias=False, mtp=True)
        builder.dense_mlp(f"{prefix}.mlp", layer, intermediate, mtp=True)
        for name in ("input_layernorm", "post_attention_layernorm", "token_layernorm", "hidden_layernorm"):
            builder.norm(f"{prefix}.{name}", layer, mtp=True)
        builder.norm(f"{prefix}.final_layernorm", layer, mtp=True)
        builder.replicated("mtp", f"{prefix}.input_proj", hidden, 2 * hidden, layer, mtp=True)
    return []


def _minimax_m2(builder: Builder, model_type: str) -> list[str]:
    """MiniMax-M2 / M2.5: GQA with per-layer q/k norms over all heads (``qk_norm_type: per_layer``), and in every
    layer a sigmoid router with a float32 ``e_score_correction_bias`` and ``num_local_experts`` SwiGLU experts
    (``w1``/``w3``/``w2``) of ``intermediate_size`` (sglang/srt/models/minimax_m2.py)."""
    reader = builder.reader
    hidden = builder.hidden
    layers = reader.integer("num_hidden_layers")
    heads = reader.integer("num_attention_heads")
    kv_heads = reader.integer("num_key_value_heads", heads)
    head_dim = reader.integer("head_dim", hidden // heads)
    experts = reader.integer("num_local_experts")
    intermediate = reader.integer("intermediate_size")
    if reader.integer("shared_intermediate_size", 0, minimum=0):
        raise reader.error("shared_intermediate_size", "is not 0", "MiniMax shared experts are not modelled.")
    tp = builder.sharding.tp
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, bias=False, out_bias=False)
        if reader.boolean("use_qk_norm", False):
            builder.norm(f"{prefix}.self_attn.q_norm", layer, heads * head_dim, rank_out=split(heads * head_dim, tp))
            builder.norm(
                f"{prefix}.self_attn.k_norm",
                layer,
                kv_heads * head_dim,
                rank_out=kv_heads_per_rank(kv_heads, tp) * head_dim,
            )
        builder.norm(f"{prefix}.input_layernorm", layer)
        builder.norm(f"{prefix}.post_attention_layernorm", layer)
        moe = f"{prefix}.block_sparse_moe"
        builder.replicated("moe_router", f"{moe}.gate", experts, hidden, layer, linear=False)
        if reader.boolean("use_routing_bias", False):
            builder.add("moe_router", f"{moe}.e_score_correction_bias", experts, layer=layer, element_bytes=4)
        builder.experts(f"{moe}.experts", layer, experts, intermediate)
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    notes = []
    if reader.boolean("use_mtp", False):
        notes.append(
            "MiniMax MTP modules (use_mtp) are not counted: the config does not determine their shapes (the "
            "published 230B total matches the model without them)."
        )
    return notes


DECODERS: dict[str, Callable[[Builder, str], list[str]]] = {
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _llama,
    "qwen3": _llama,
    "qwen3_moe": _llama,
    "mimo": _mimo,
    "minimax_m2": _minimax_m2,
}
"""The ``model_type`` values whose weights this plugin estimates, and the function that lays out their tensors."""

DP_ATTENTION: dict[str, str] = {
    "qwen3": "sglang/srt/models/qwen3.py Qwen3Attention",
    "qwen3_moe": "sglang/srt/models/qwen3_moe.py Qwen3MoeAttention",
}
"""The model types whose SGLang attention (and input embedding) shards over the attention-TP group under
``enable_dp_attention`` (``parallel_group="attn_tp"``, checked against SGLang 0.5.23), with the module that builds
it; the estimate refuses DP attention for the others."""
