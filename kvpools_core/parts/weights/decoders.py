"""Whole decoders whose layout several architectures share, named by their layout, not by a model.

:func:`llama_decoder` is the pre-norm decoder of grouped-query attention and a SwiGLU MLP (or Qwen's MoE) that
Llama, Mistral, Qwen2/Qwen3 and Gemma-2/3 checkpoints lay out, each with its switches; :func:`mla_decoder` is
DeepSeek-V2/V3's multi-head latent attention with DeepSeekMoE and MTP layers, which the MLA and DSA plugins both
estimate.  The plugin that claims a ``model_type`` sets the switches; nothing here reads the ``model_type``.
"""

from __future__ import annotations

from typing import Any

from kvpools_core.parts.weights.blocks import mla_attention, routed_moe
from kvpools_core.parts.weights.tensors import Builder

__all__ = ["llama_decoder", "mla_decoder"]


def llama_decoder(
    builder: Builder,
    *,
    qkv_bias: bool = False,
    qk_norm: bool = False,
    sandwich_norms: bool = False,
    moe: bool = False,
    tied: bool = False,
) -> None:
    """A Llama-shaped decoder: per layer grouped-query attention, two RMSNorms and a SwiGLU MLP, then the embedding,
    the final norm and the LM head.

    ``qkv_bias`` biases q/k/v always (Qwen2's layout; ``o_proj`` then has none), else ``attention_bias`` biases all
    four; ``qk_norm`` adds per-head q/k norms (Qwen3, Gemma-3); ``sandwich_norms`` Gemma-2's norms before and after
    the feed-forward; ``moe`` Qwen3-MoE's experts (``num_experts`` of ``moe_intermediate_size`` every
    ``decoder_sparse_step``-th layer but ``mlp_only_layers``, with their router); ``tied`` is what
    ``tie_word_embeddings`` defaults to.
    """
    reader = builder.reader
    layers = reader.integer("num_hidden_layers")
    heads = reader.integer("num_attention_heads")
    head_dim = reader.integer("head_dim", builder.hidden // heads)
    attention_bias = not qkv_bias and reader.boolean("attention_bias", False)  # Qwen2's o_proj has no bias
    mlp_bias = reader.boolean("mlp_bias", False)
    if moe:
        experts = reader.integer("num_experts")
        moe_intermediate = reader.integer("moe_intermediate_size")
        sparse_step = reader.integer("decoder_sparse_step", 1)
        dense_only = set(reader.integer_list("mlp_only_layers", maximum=layers - 1))
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, qkv_bias or attention_bias, attention_bias)
        if qk_norm or moe:
            builder.norm(f"{prefix}.self_attn.q_norm", layer, head_dim)
            builder.norm(f"{prefix}.self_attn.k_norm", layer, head_dim)
        norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
        if sandwich_norms:
            norms += ("pre_feedforward_layernorm", "post_feedforward_layernorm")
        for norm in norms:
            builder.norm(f"{prefix}.{norm}", layer)
        if moe and layer not in dense_only and (layer + 1) % sparse_step == 0:
            builder.replicated("moe_router", f"{prefix}.mlp.gate", experts, builder.hidden, layer, linear=False)
            builder.experts(f"{prefix}.mlp.experts", layer, experts, moe_intermediate)
        else:
            builder.dense_mlp(f"{prefix}.mlp", layer, reader.integer("intermediate_size"), bias=mlp_bias)
    builder.embeddings(reader.boolean("tie_word_embeddings", builder.outer.boolean("tie_word_embeddings", tied)))


def mla_decoder(builder: Builder) -> None:
    """DeepSeek-V2/V3's decoder (Kimi-K2's, and V3.2's with its indexer): per layer MLA (:func:`mla_attention`),
    two norms, and DeepSeekMoE (:func:`routed_moe`) after ``first_k_dense_replace`` dense layers every
    ``moe_layer_freq``-th layer (a dense MLP elsewhere); then ``num_nextn_predict_layers`` MTP layers, each a
    decoder layer with its ``enorm`` / ``hnorm`` / head norm, ``eh_proj`` and its own embedding and head copies
    (``model.layers.61`` of DeepSeek-V3)."""
    reader = builder.reader
    layers = reader.integer("num_hidden_layers")
    first_dense = reader.integer("first_k_dense_replace", 0, minimum=0)
    frequency = reader.integer("moe_layer_freq", 1)
    has_experts = reader.integer("n_routed_experts", 0, minimum=0) > 0

    def decoder_layer(prefix: str, layer: int, mtp: bool = False) -> None:
        kw: dict[str, Any] = {"mtp": True} if mtp else {}
        mla_attention(builder, f"{prefix}.self_attn", layer, **kw)
        builder.norm(f"{prefix}.input_layernorm", layer, **kw)
        builder.norm(f"{prefix}.post_attention_layernorm", layer, **kw)
        if has_experts and layer >= first_dense and layer % frequency == 0:
            routed_moe(builder, f"{prefix}.mlp", layer, **kw)
        else:
            builder.dense_mlp(f"{prefix}.mlp", layer, reader.integer("intermediate_size"), **kw)

    for layer in range(layers):
        decoder_layer(f"model.layers.{layer}", layer)
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    mtp_layers = reader.integer("num_nextn_predict_layers", 0, minimum=0)
    vocab, hidden = reader.integer("vocab_size"), builder.hidden
    for index in range(layers, layers + mtp_layers):
        prefix = f"model.layers.{index}"
        decoder_layer(prefix, index, mtp=True)
        for name in ("enorm", "hnorm", "shared_head.norm"):
            builder.norm(f"{prefix}.{name}", index, mtp=True)
        builder.replicated("mtp", f"{prefix}.eh_proj", hidden, 2 * hidden, index, mtp=True)
        builder.add("mtp", f"{prefix}.embed_tokens", vocab, hidden, layer=index, mtp=True)
        builder.add("mtp", f"{prefix}.shared_head.head", vocab, hidden, layer=index, mtp=True)
