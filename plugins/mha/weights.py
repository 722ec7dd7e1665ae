"""The weights of the dense and MoE decoders this plugin parses (``estimate_weights`` hook), from the parts library."""

from __future__ import annotations

from collections.abc import Callable

from kvpools_core import hookimpl
from kvpools_core.parallel import kv_heads_per_rank
from kvpools_core.parts.weights import (
    Builder,
    WeightsConfig,
    WeightsEstimate,
    estimate_claimed,
    llama_decoder,
    pixtral_vision,
    sparse_moe,
    split,
    vocab_rows_per_rank,
)
from kvpools_core.values import Serving


@hookimpl
def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> WeightsEstimate | None:
    """The weights of the ``model_type`` values of :data:`DECODERS`, from the parts library; None for any other."""
    return estimate_claimed(config, serving, ep_size, DECODERS, DP_ATTENTION)


def _llama(builder: Builder, model_type: str) -> list[str]:
    """Llama, Mistral, Qwen2/Qwen3 dense decoders and Qwen3-MoE (:func:`~kvpools_core.parts.weights.llama_decoder`):
    Qwen2 biases q/k/v, Qwen3 and Qwen3-MoE norm q and k per head.  A Mistral-3 checkpoint (``model_type``
    ``mistral3`` around a ``mistral`` text model) adds its Pixtral tower and projector
    (:func:`~kvpools_core.parts.weights.pixtral_vision`, family ``vision``); another multimodal wrapper's tower is
    refused rather than left out."""
    moe = model_type == "qwen3_moe"
    llama_decoder(builder, qkv_bias=model_type == "qwen2", qk_norm=model_type == "qwen3" or moe, moe=moe)
    outer = builder.outer
    if outer.has("vision_config"):
        if outer.string("model_type") != "mistral3":
            raise outer.error(
                "vision_config",
                f"is set on a {outer.string('model_type') or 'multimodal'} checkpoint",
                f"kvpools does not model its vision tower's weights yet (only Mistral-3's Pixtral tower around a "
                f"{model_type} text model); give the weights' size yourself.",
            )
        pixtral_vision(builder, outer)
    return []


def _gemma_granite(builder: Builder, model_type: str) -> list[str]:
    """Gemma (1) and Granite (3.x): the Llama layout. Gemma's ``head_dim`` is its own (256 for Gemma-7B's 16 heads
    of a 3072 width) and its embedding is tied unless the config says otherwise (``GemmaForCausalLM``,
    sglang/srt/models/gemma.py: no ``lm_head``); Granite's multipliers are scalars, not tensors
    (sglang/srt/models/granite.py)."""
    llama_decoder(builder, tied=model_type == "gemma")
    return []


def _phi3(builder: Builder, model_type: str) -> list[str]:
    """Phi-3 / Phi-4 (``Phi3ForCausalLM``): the Llama layout with the checkpoint's fused ``self_attn.qkv_proj`` and
    ``mlp.gate_up_proj`` (sglang serves it with ``LlamaForCausalLM``'s modules, sglang/srt/models/phi3.py is absent
    and ``Phi3ForCausalLM`` is registered in llama.py); a rank holds its q heads and its KV heads (replicated once TP
    exceeds them) of the fused projection, and half of each of gate and up."""
    reader = builder.reader
    hidden = builder.hidden
    heads = reader.integer("num_attention_heads")
    kv_heads = reader.integer("num_key_value_heads", heads)
    head_dim = reader.integer("head_dim", hidden // heads)
    intermediate = reader.integer("intermediate_size")
    tp = builder.sharding.attn_tp
    for layer in range(reader.integer("num_hidden_layers")):
        prefix = f"model.layers.{layer}"
        rank_rows = split(heads, tp) * head_dim + 2 * kv_heads_per_rank(kv_heads, tp) * head_dim
        builder.add(
            "attention",
            f"{prefix}.self_attn.qkv_proj",
            (heads + 2 * kv_heads) * head_dim,
            hidden,
            rank_out=rank_rows,
            layer=layer,
            linear=True,
        )
        builder.row("attention", f"{prefix}.self_attn.o_proj", hidden, heads * head_dim, layer)
        builder.column("mlp", f"{prefix}.mlp.gate_up_proj", 2 * intermediate, hidden, layer)
        builder.row("mlp", f"{prefix}.mlp.down_proj", hidden, intermediate, layer)
        builder.norm(f"{prefix}.input_layernorm", layer)
        builder.norm(f"{prefix}.post_attention_layernorm", layer)
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    return []


def _phi(builder: Builder, model_type: str) -> list[str]:
    """Phi-1 / Phi-1.5 / Phi-2 (``PhiForCausalLM``, sglang/srt/models/phi.py): per layer one LayerNorm (weight and
    bias) before a parallel attention and MLP, biased q/k/v (``QKVParallelLinear``, every head a KV head) and
    ``dense`` (row-parallel), biased ``fc1`` / ``fc2``; the final LayerNorm and an LM head with a bias."""
    reader = builder.reader
    hidden = builder.hidden
    intermediate = reader.integer("intermediate_size")
    for layer in range(reader.integer("num_hidden_layers")):
        prefix = f"model.layers.{layer}"
        builder.norm(f"{prefix}.input_layernorm", layer)
        builder.norm(f"{prefix}.input_layernorm.bias", layer)
        for name in ("q_proj", "k_proj", "v_proj"):
            builder.column("attention", f"{prefix}.self_attn.{name}", hidden, hidden, layer, bias=True)
        builder.row("attention", f"{prefix}.self_attn.dense", hidden, hidden, layer, bias=True)
        builder.column("mlp", f"{prefix}.mlp.fc1", intermediate, hidden, layer, bias=True)
        builder.row("mlp", f"{prefix}.mlp.fc2", hidden, intermediate, layer, bias=True)
    vocab = reader.integer("vocab_size")
    rows = vocab_rows_per_rank(vocab, builder.sharding.tp)
    builder.add("embedding", "model.embed_tokens", vocab, hidden, rank_out=rows, stage="first")
    builder.norm("model.final_layernorm", None, stage="last")
    builder.norm("model.final_layernorm.bias", None, stage="last")
    builder.add("lm_head", "lm_head", vocab, hidden, rank_out=rows, stage="last")
    builder.add("lm_head", "lm_head.bias", vocab, rank_out=rows, stage="last")
    return []


def _mixtral(builder: Builder, model_type: str) -> list[str]:
    """Mixtral (``MixtralForCausalLM``, sglang/srt/models/mixtral.py): GQA attention and in every layer
    ``block_sparse_moe``: a router (``gate``) over ``num_local_experts`` SwiGLU experts of ``intermediate_size``,
    stored ``w1`` (gate), ``w3`` (up) and ``w2`` (down)."""
    reader = builder.reader
    hidden = builder.hidden
    heads = reader.integer("num_attention_heads")
    head_dim = reader.integer("head_dim", hidden // heads)
    experts = reader.integer("num_local_experts")
    intermediate = reader.integer("intermediate_size")
    for layer in range(reader.integer("num_hidden_layers")):
        prefix = f"model.layers.{layer}"
        builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, bias=False, out_bias=False)
        builder.norm(f"{prefix}.input_layernorm", layer)
        builder.norm(f"{prefix}.post_attention_layernorm", layer)
        moe = f"{prefix}.block_sparse_moe"
        builder.replicated("moe_router", f"{moe}.gate", experts, hidden, layer, linear=False)
        builder.experts(f"{moe}.experts", layer, experts, intermediate, names=("w1", "w3", "w2"))
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    return []


def _qwen2_moe(builder: Builder, model_type: str) -> list[str]:
    """Qwen2-MoE / Qwen1.5-MoE (``Qwen2MoeForCausalLM``, sglang/srt/models/qwen2_moe.py): Qwen2's attention (q/k/v
    biases) and every ``decoder_sparse_step``-th layer outside ``mlp_only_layers`` a sparse MoE (router,
    ``num_experts`` experts of ``moe_intermediate_size``, a shared expert of ``shared_expert_intermediate_size`` with
    its scalar ``shared_expert_gate``); a dense MLP of ``intermediate_size`` elsewhere."""
    reader = builder.reader
    hidden = builder.hidden
    layers = reader.integer("num_hidden_layers")
    heads = reader.integer("num_attention_heads")
    head_dim = reader.integer("head_dim", hidden // heads)
    step = reader.integer("decoder_sparse_step", 1)
    dense_only = set(reader.integer_list("mlp_only_layers", maximum=layers - 1))
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, bias=True, out_bias=False)
        builder.norm(f"{prefix}.input_layernorm", layer)
        builder.norm(f"{prefix}.post_attention_layernorm", layer)
        if layer not in dense_only and reader.integer("num_experts", 0, minimum=0) and (layer + 1) % step == 0:
            sparse_moe(builder, f"{prefix}.mlp", layer)
        else:
            builder.dense_mlp(f"{prefix}.mlp", layer, reader.integer("intermediate_size"))
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
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
    "gemma": _gemma_granite,
    "granite": _gemma_granite,
    "phi3": _phi3,
    "phi": _phi,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
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
