"""The weights of MiniMax-M3 (``estimate_weights`` hook), from the parts library."""

from __future__ import annotations

from collections.abc import Callable

from kvpools_core import hookimpl
from kvpools_core.parts.weights import Builder, WeightsConfig, WeightsEstimate, estimate_claimed
from kvpools_core.values import Serving


@hookimpl
def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> WeightsEstimate | None:
    """The weights of the ``model_type`` values of :data:`DECODERS`, from the parts library; None for any other."""
    return estimate_claimed(config, serving, ep_size, DECODERS, DP_ATTENTION)


def _minimax_m3(builder: Builder, model_type: str) -> list[str]:
    """MiniMax-M3 (sglang/srt/models/minimax_m3.py): GQA with q/k norms (``qk_norm_type`` ``per_head`` over one
    head, or ``per_layer`` over all), plus in the layers ``sparse_attention_config.sparse_attention_freq`` marks the
    MiniMax Sparse Attention index projections (``sparse_num_index_heads`` query heads and one key head of
    ``sparse_index_dim``, a value head and ``index_o_proj`` unless ``sparse_disable_index_value``, their q/k norms);
    per ``moe_layer_freq`` a MoE (router, float32 ``e_score_correction_bias``, ``num_local_experts`` experts and
    ``n_shared_experts`` shared ones, all of ``intermediate_size``) or a dense MLP of ``dense_intermediate_size``."""
    reader = builder.reader
    hidden, tp = builder.hidden, builder.sharding.tp
    layers = reader.integer("num_hidden_layers")
    if reader.boolean("attention_output_gate", False):
        raise reader.error("attention_output_gate", "is true", "MiniMax-M3's gated attention output is not modelled.")
    norm_type = reader.string("qk_norm_type", "per_head")
    if norm_type not in ("per_head", "per_layer"):
        raise reader.error(
            "qk_norm_type", f"is {norm_type!r}", "The weights estimate models 'per_head' and 'per_layer'."
        )
    heads, head_dim = reader.integer("num_attention_heads"), reader.integer("head_dim")
    kv_heads = reader.integer("num_key_value_heads")
    sparse = reader.child("sparse_attention_config") if reader.has("sparse_attention_config") else None
    index_layers = sparse.integer_list("sparse_attention_freq", maximum=1) if sparse else ()
    no_value = (sparse.integer_list("sparse_disable_index_value", maximum=1) if sparse else ()) or (0,) * layers
    moe_layers = reader.integer_list("moe_layer_freq", maximum=1) or (1,) * layers
    for key, values in (("moe_layer_freq", moe_layers), ("sparse_disable_index_value", no_value)):
        if len(values) != layers:
            raise reader.error(key, f"has {len(values)} entries", f"List a 0 or 1 for each of the {layers} layers.")
    if index_layers and len(index_layers) != layers:
        raise reader.error("sparse_attention_config", "lists sparse_attention_freq of another length", "Fix it.")
    experts, intermediate = reader.integer("num_local_experts"), reader.integer("intermediate_size")
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        attention = f"{prefix}.self_attn"
        builder.gqa_attention(attention, layer, head_dim, False, False)
        per_head = norm_type == "per_head"
        builder.norm(f"{attention}.q_norm", layer, head_dim if per_head else heads * head_dim)
        builder.norm(f"{attention}.k_norm", layer, head_dim if per_head else kv_heads * head_dim)
        if index_layers and index_layers[layer]:
            assert sparse is not None
            index_heads, index_dim = sparse.integer("sparse_num_index_heads"), sparse.integer("sparse_index_dim")
            rank_heads = index_heads // min(tp, index_heads)  # SGLang splits index heads over at most their count
            builder.add(
                "attention",
                f"{attention}.index_q_proj",
                index_heads * index_dim,
                hidden,
                rank_out=rank_heads * index_dim,
                layer=layer,
                linear=True,
            )
            value = not no_value[layer]
            for name in ("index_k_proj", "index_v_proj") if value else ("index_k_proj",):
                builder.replicated("attention", f"{attention}.{name}", index_dim, hidden, layer)
            if value:
                builder.add(
                    "attention",
                    f"{attention}.index_o_proj",
                    hidden,
                    index_heads * index_dim,
                    rank_inner=rank_heads * index_dim,
                    layer=layer,
                    linear=True,
                )
            builder.norm(f"{attention}.index_q_norm", layer, index_dim)
            builder.norm(f"{attention}.index_k_norm", layer, index_dim)
        builder.norm(f"{prefix}.input_layernorm", layer)
        builder.norm(f"{prefix}.post_attention_layernorm", layer)
        mlp = f"{prefix}.block_sparse_moe"
        if moe_layers[layer]:
            builder.replicated("moe_router", f"{mlp}.gate", experts, hidden, layer, linear=False)
            if reader.boolean("use_routing_bias", False):
                builder.add("moe_router", f"{mlp}.e_score_correction_bias", experts, layer=layer, element_bytes=4)
            builder.experts(f"{mlp}.experts", layer, experts, intermediate)
            shared = reader.integer("n_shared_experts", 0, minimum=0)
            if shared:
                builder.dense_mlp(f"{mlp}.shared_experts", layer, intermediate * shared, family="moe_shared_experts")
        else:
            builder.dense_mlp(f"{prefix}.mlp", layer, reader.integer("dense_intermediate_size"))
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    return [
        "MiniMax-M3's MTP modules and vision tower are not counted: this config does not describe them.",
    ]


DECODERS: dict[str, Callable[[Builder, str], list[str]]] = {
    "minimax_m3": _minimax_m3,
}
"""The ``model_type`` values whose weights this plugin estimates, and the function that lays out their tensors."""

DP_ATTENTION: dict[str, str] = {}
"""The model types whose SGLang attention (and input embedding) shards over the attention-TP group under
``enable_dp_attention`` (``parallel_group="attn_tp"``, checked against SGLang 0.5.23), with the module that builds
it; the estimate refuses DP attention for the others."""
