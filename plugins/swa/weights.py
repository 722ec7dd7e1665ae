"""The weights of the sliding-window decoders this plugin parses (``estimate_weights`` hook), from the parts library."""

from __future__ import annotations

from collections.abc import Callable

from kvpools_core import hookimpl
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parallel import kv_heads_per_rank
from kvpools_core.parts.weights import (
    Builder,
    WeightsConfig,
    WeightsEstimate,
    estimate_claimed,
    expert_intermediate_per_rank,
    gemma3_vision,
    gemma4_vision_tower,
    llama4_vision,
    llama_decoder,
    split,
    vocab_rows_per_rank,
)
from kvpools_core.values import Serving


@hookimpl
def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> WeightsEstimate | None:
    """The weights of the ``model_type`` values of :data:`DECODERS`, from the parts library; None for any other."""
    return estimate_claimed(config, serving, ep_size, DECODERS, DP_ATTENTION, VLLM_METHODS)


def _gemma(builder: Builder, model_type: str) -> list[str]:
    """Gemma-2 and Gemma-3 (:func:`~kvpools_core.parts.weights.llama_decoder`): Gemma-2's four norms a layer, q/k
    norms over one head on Gemma-3, tied embeddings by default and, for the multimodal Gemma-3 checkpoints, the
    SigLIP vision tower (family ``vision``)."""
    gemma3 = model_type == "gemma3_text"
    llama_decoder(builder, qk_norm=gemma3, sandwich_norms=True, tied=True)
    if gemma3 and builder.outer.has("vision_config"):
        gemma3_vision(builder, builder.outer.child("vision_config"))
    return []


def _gemma4(builder: Builder, model_type: str) -> list[str]:
    """Gemma-4 text model (sglang/srt/models/gemma4_causal.py; SGLang renames ``global_head_dim`` to its
    ``head_dim`` and ``head_dim`` to ``swa_head_dim``): sliding layers of ``head_dim`` heads with
    ``num_key_value_heads``, full layers of ``global_head_dim`` heads with ``num_global_key_value_heads`` and, under
    ``attention_k_eq_v``, no ``v_proj`` (V is K); q/k norms over one head; a GELU MLP in every layer and, under
    ``enable_moe_block``, a parallel MoE (a router with its per-dimension ``scale``, ``per_expert_scale``, experts
    of ``moe_intermediate_size``); seven norms and a ``layer_scalar`` a layer."""
    reader = builder.reader
    hidden, tp = builder.hidden, builder.sharding.tp
    layers = reader.integer("num_hidden_layers")
    for key in ("hidden_size_per_layer_input", "num_kv_shared_layers"):
        if reader.integer(key, 0, minimum=0):
            raise reader.error(key, "is set", "Gemma-4's per-layer embeddings and KV-shared layers are not modelled.")
    layer_types = reader.string_list("layer_types", choices=("sliding_attention", "full_attention"))
    if len(layer_types) != layers:
        raise reader.error("layer_types", f"has {len(layer_types)} entries", f"List one per layer ({layers}).")
    heads = reader.integer("num_attention_heads")
    moe = reader.boolean("enable_moe_block", False)
    bias = reader.boolean("attention_bias", False)
    for layer, kind in enumerate(layer_types):
        prefix = f"model.language_model.layers.{layer}"
        attention = f"{prefix}.self_attn"
        if kind == "sliding_attention":
            head_dim = reader.integer("head_dim")
            builder.gqa_attention(attention, layer, head_dim, bias, bias, heads=heads)
        else:
            head_dim = reader.integer("global_head_dim", reader.integer("head_dim"))
            kv_heads = reader.integer("num_global_key_value_heads", reader.integer("num_key_value_heads"))
            if reader.boolean("attention_k_eq_v", False):
                builder.column("attention", f"{attention}.q_proj", heads * head_dim, hidden, layer, bias)
                rank_kv = kv_heads_per_rank(kv_heads, tp) * head_dim
                builder.add(
                    "attention",
                    f"{attention}.k_proj",
                    kv_heads * head_dim,
                    hidden,
                    rank_out=rank_kv,
                    layer=layer,
                    linear=True,
                )
                builder.row("attention", f"{attention}.o_proj", hidden, heads * head_dim, layer, bias)
            else:
                builder.gqa_attention(attention, layer, head_dim, bias, bias, heads=heads, kv_heads=kv_heads)
        builder.norm(f"{attention}.q_norm", layer, head_dim)
        builder.norm(f"{attention}.k_norm", layer, head_dim)
        norms = [
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ]
        builder.dense_mlp(f"{prefix}.mlp", layer, reader.integer("intermediate_size"))
        if moe:
            experts = reader.integer("num_experts")
            builder.norm(f"{prefix}.router.scale", layer)
            builder.replicated("moe_router", f"{prefix}.router.proj", experts, hidden, layer, linear=False)
            builder.add("moe_router", f"{prefix}.moe.per_expert_scale", experts, layer=layer)
            builder.experts(f"{prefix}.moe.experts", layer, experts, reader.integer("moe_intermediate_size"))
            norms += ["post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"]
        for norm in norms:
            builder.norm(f"{prefix}.{norm}", layer)
        builder.norm(f"{prefix}.layer_scalar", layer, 1)
    builder.embeddings(reader.boolean("tie_word_embeddings", builder.outer.boolean("tie_word_embeddings", True)))
    if builder.outer.has("vision_config"):
        gemma4_vision_tower(builder, builder.outer.child("vision_config"))
    return []


def _gpt_oss(builder: Builder, model_type: str) -> list[str]:
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
    rank_count, rank_inter = experts // sharding.ep, expert_intermediate_per_rank(intermediate, sharding)
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, bias=True, out_bias=True)
        sinks = f"{prefix}.self_attn.sinks"  # one per local head (GptOssAttention.sinks, sglang/srt/models/gpt_oss.py)
        builder.add("attention", sinks, heads, rank_out=split(heads, sharding.attn_tp), layer=layer)
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


def _mimo_v2_flash(builder: Builder, model_type: str) -> list[str]:
    """MiMo-V2-Flash (sglang/srt/models/mimo_v2.py): per ``hybrid_layer_pattern`` a sliding-window layer (``1``:
    ``swa_num_attention_heads`` / ``swa_num_key_value_heads``, with a per-head ``attention_sink_bias`` under
    ``add_swa_attention_sink_bias``) or a full one, q/k heads of ``head_dim`` and v heads of ``v_head_dim``; per
    ``moe_layer_freq`` a MoE (a router SGLang holds in float32, ``moe_router_dtype``, a float32
    ``e_score_correction_bias`` under ``topk_method: noaux_tc``, ``n_routed_experts`` experts) or a dense MLP."""
    reader = builder.reader
    hidden, tp = builder.hidden, builder.sharding.tp
    layers = reader.integer("num_hidden_layers")
    swa = reader.integer_list("hybrid_layer_pattern", maximum=1)
    sparse = reader.integer_list("moe_layer_freq", maximum=1)
    for key, values in (("hybrid_layer_pattern", swa), ("moe_layer_freq", sparse)):
        if len(values) != layers:
            raise reader.error(key, f"has {len(values)} entries", f"List a 0 or 1 for each of the {layers} layers.")
    experts = reader.integer("n_routed_experts")
    if reader.integer("n_shared_experts", 0, minimum=0):
        raise reader.error("n_shared_experts", "is set", "MiMo-V2 shared experts are not modelled.")
    for layer in range(layers):
        prefix = f"model.layers.{layer}"
        kind = "swa_" if swa[layer] else ""
        heads = reader.integer(f"{kind}num_attention_heads")
        head_dim = reader.integer(f"{kind}head_dim")
        kv_heads = reader.integer(f"{kind}num_key_value_heads")
        v_head_dim = reader.integer(f"{kind}v_head_dim", head_dim)
        bias = reader.boolean("attention_bias", False)
        attention = f"{prefix}.self_attn"
        builder.gqa_attention(
            attention, layer, head_dim, bias, False, heads=heads, kv_heads=kv_heads, v_head_dim=v_head_dim
        )
        sink = "add_swa_attention_sink_bias" if swa[layer] else "add_full_attention_sink_bias"
        if reader.boolean(sink, False):
            builder.add(
                "attention", f"{prefix}.self_attn.attention_sink_bias", heads, rank_out=split(heads, tp), layer=layer
            )
        builder.norm(f"{prefix}.input_layernorm", layer)
        builder.norm(f"{prefix}.post_attention_layernorm", layer)
        if sparse[layer]:
            gate = f"{prefix}.mlp.gate"
            builder.add("moe_router", gate, experts, hidden, layer=layer, element_bytes=4)
            if reader.string("topk_method", "") == "noaux_tc":
                builder.add("moe_router", f"{gate}.e_score_correction_bias", experts, layer=layer, element_bytes=4)
            builder.experts(f"{prefix}.mlp.experts", layer, experts, reader.integer("moe_intermediate_size"))
        else:
            builder.dense_mlp(f"{prefix}.mlp", layer, reader.integer("intermediate_size"))
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    return [
        "MiMo-V2-Flash's MTP layers are not counted: the config does not say how many the checkpoint holds.",
        "The router weight is counted in float32, as SGLang holds it (moe_router_dtype).",
    ]


def _llama4(builder: Builder, model_type: str) -> list[str]:
    """Llama-4's text model (``Llama4ForCausalLM`` under ``Llama4ForConditionalGeneration``, sglang/srt/models/
    llama4.py), named as the checkpoint names it (``language_model.model.*``): per layer GQA attention (the q/k norm
    of ``use_qk_norm`` has no weights), two norms and, where ``(layer + 1) % interleave_moe_layer_step == 0``
    (``_is_moe_layer``), a MoE (``feed_forward.router``, ``num_local_experts`` experts of ``intermediate_size``
    stored fused as ``experts.gate_up_proj`` / ``experts.down_proj``, and a ``shared_expert`` of the same size);
    a dense MLP of ``intermediate_size_mlp`` elsewhere; a checkpoint's ``vision_config`` adds the vision tower, the
    pixel-shuffle adapter and the projector (:func:`~kvpools_core.parts.weights.llama4_vision`, family ``vision``)."""
    reader = builder.reader
    hidden = builder.hidden
    sharding = builder.sharding
    layers = reader.integer("num_hidden_layers")
    heads = reader.integer("num_attention_heads")
    head_dim = reader.integer("head_dim", hidden // heads)
    experts = reader.integer("num_local_experts")
    moe_inter = reader.integer("intermediate_size")
    step = reader.integer("interleave_moe_layer_step", 1, minimum=0)
    if experts % sharding.ep:
        raise UnsupportedCombinationError(
            f"{experts} experts do not split over ep_size {sharding.ep}; SGLang needs ep_size to divide them."
        )
    root = "language_model.model" if builder.outer.has("text_config") else "model"
    for layer in range(layers):
        prefix = f"{root}.layers.{layer}"
        builder.gqa_attention(f"{prefix}.self_attn", layer, head_dim, bias=False, out_bias=False)
        builder.norm(f"{prefix}.input_layernorm", layer)
        builder.norm(f"{prefix}.post_attention_layernorm", layer)
        moe = experts > 0 if step == 0 else (layer + 1) % step == 0
        ff = f"{prefix}.feed_forward"
        if not moe:
            builder.dense_mlp(ff, layer, reader.integer("intermediate_size_mlp"))
            continue
        builder.replicated("moe_router", f"{ff}.router", experts, hidden, layer, linear=False)
        rank_inter = expert_intermediate_per_rank(moe_inter, sharding)
        shape = {"count": experts, "rank_count": experts // sharding.ep, "layer": layer, "linear": True}
        builder.add(
            "moe_experts", f"{ff}.experts.gate_up_proj", 2 * moe_inter, hidden, rank_out=2 * rank_inter, **shape
        )
        builder.add("moe_experts", f"{ff}.experts.down_proj", hidden, moe_inter, rank_inner=rank_inter, **shape)
        builder.dense_mlp(f"{ff}.shared_expert", layer, moe_inter, family="moe_shared_experts")
    vocab = reader.integer("vocab_size")
    head = "language_model.lm_head" if root != "model" else "lm_head"
    builder.add(
        "embedding",
        f"{root}.embed_tokens",
        vocab,
        hidden,
        rank_out=vocab_rows_per_rank(vocab, sharding.tp),
        stage="first",
    )
    builder.norm(f"{root}.norm", None, stage="last")
    builder.add("lm_head", head, vocab, hidden, rank_out=vocab_rows_per_rank(vocab, sharding.tp), stage="last")
    if builder.outer.has("vision_config"):
        llama4_vision(builder, builder.outer.child("vision_config"))
    return []


DECODERS: dict[str, Callable[[Builder, str], list[str]]] = {
    "gemma2": _gemma,
    "gemma3_text": _gemma,
    "gemma4_text": _gemma4,
    "gpt_oss": _gpt_oss,
    "mimo_v2_flash": _mimo_v2_flash,
    "llama4_text": _llama4,
}
"""The ``model_type`` values whose weights this plugin estimates, and the function that lays out their tensors."""

DP_ATTENTION: dict[str, str] = {
    "gpt_oss": "sglang/srt/models/gpt_oss.py GptOssAttention",
}
"""The model types whose SGLang attention (and input embedding) shards over the attention-TP group under
``enable_dp_attention`` (``parallel_group="attn_tp"``, checked against SGLang 0.5.23), with the module that builds
it; the estimate refuses DP attention for the others."""

VLLM_METHODS: dict[str, dict[str, str]] = {"gpt_oss": {"mxfp4": "gpt_oss_mxfp4", "gpt_oss_mxfp4": "gpt_oss_mxfp4"}}
"""vLLM 0.33 ``GptOssMxfp4Config.override_quantization_method`` (model_executor/layers/quantization/mxfp4.py
L129-146): an ``mxfp4`` checkpoint of gpt-oss is served as ``gpt_oss_mxfp4`` whatever ``--quantization`` asked
(the core's ``resolve_quantization`` applies it; the core names no architecture)."""
