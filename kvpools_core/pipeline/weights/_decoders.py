"""Dense and MoE decoders with softmax attention: Llama-like, DeepSeek (MLA, DSA, V4), Gemma-4, gpt-oss, MiMo
(and MiMo-V2-Flash), MiniMax-M2."""

from __future__ import annotations

from typing import Any

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parallel import kv_heads_per_rank
from kvpools_core.pipeline.weights._model import _Builder, _expert_intermediate_per_rank, _split
from kvpools_core.pipeline.weights._quantisation import mxfp4
from kvpools_core.pipeline.weights._vision import _gemma3_vision


def _llama_like(builder: _Builder, model_type: str) -> list[str]:
    """Llama, Mistral, Qwen2/Qwen3, Gemma-2 and Gemma-3 dense decoders, and Qwen3-MoE.

    Gemma-3 adds Gemma-2's four norms a layer, q/k norms over one head, tied embeddings by default and, for the
    multimodal checkpoints, the SigLIP vision tower (family ``vision``).
    """
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
        if model_type in ("qwen3", "gemma3_text") or moe:
            builder.norm(f"{prefix}.self_attn.q_norm", layer, head_dim)
            builder.norm(f"{prefix}.self_attn.k_norm", layer, head_dim)
        norms: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm")
        if model_type in ("gemma2", "gemma3_text"):
            norms += ("pre_feedforward_layernorm", "post_feedforward_layernorm")
        for norm in norms:
            builder.norm(f"{prefix}.{norm}", layer)
        if moe and layer not in dense_only and (layer + 1) % sparse_step == 0:
            builder.replicated("moe_router", f"{prefix}.mlp.gate", experts, builder.hidden, layer, linear=False)
            builder.experts(f"{prefix}.mlp.experts", layer, experts, moe_intermediate)
        else:
            builder.dense_mlp(f"{prefix}.mlp", layer, reader.integer("intermediate_size"), bias=mlp_bias)
    gemma = model_type in ("gemma2", "gemma3_text")
    builder.embeddings(reader.boolean("tie_word_embeddings", builder.outer.boolean("tie_word_embeddings", gemma)))
    if model_type == "gemma3_text" and builder.outer.has("vision_config"):
        _gemma3_vision(builder, builder.outer.child("vision_config"))
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
    if reader.has("index_topk"):
        _dsa_indexer(builder, f"{attn}.indexer", layer, q_lora, **kw)
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


def _dsa_indexer(builder: _Builder, prefix: str, layer: int, q_lora: int | None, **kw: Any) -> None:
    """DeepSeek-V3.2's sparse-attention indexer, whole on every rank as SGLang builds it (``Indexer.__init__``,
    sglang/srt/layers/attention/dsa/dsa_indexer.py): ``wq_b`` from the query latent to ``index_n_heads ×
    index_head_dim``, ``wk`` to one ``index_head_dim`` key, a LayerNorm ``k_norm`` (weight and bias) and the
    unquantised ``weights_proj`` (one weight per index head)."""
    reader = builder.reader
    if not q_lora:
        raise reader.error("q_lora_rank", "is missing", "DeepSeek-V3.2's indexer reads the query latent q_lora_rank.")
    index_heads, index_dim = reader.integer("index_n_heads"), reader.integer("index_head_dim")
    builder.replicated("attention", f"{prefix}.wq_b", index_heads * index_dim, q_lora, layer, **kw)
    builder.replicated("attention", f"{prefix}.wk", index_dim, builder.hidden, layer, **kw)
    builder.norm(f"{prefix}.k_norm", layer, index_dim, **kw)
    builder.norm(f"{prefix}.k_norm.bias", layer, index_dim, **kw)
    builder.replicated("attention", f"{prefix}.weights_proj", index_heads, builder.hidden, layer, linear=False, **kw)


def _deepseek(builder: _Builder, model_type: str) -> list[str]:
    """DeepSeek-V2/V3/V3.2 (and Kimi-K2): MLA (with V3.2's indexer), MoE after ``first_k_dense_replace`` dense
    layers, MTP layers."""
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
        sinks = f"{prefix}.self_attn.sinks"  # one per local head (GptOssAttention.sinks, sglang/srt/models/gpt_oss.py)
        builder.add("attention", sinks, heads, rank_out=_split(heads, sharding.attn_tp), layer=layer)
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


def _mimo(builder: _Builder, model_type: str) -> list[str]:
    """MiMo-7B: a Qwen2 decoder (q/k/v biases) and ``num_nextn_predict_layers`` MTP layers
    (``model.mtp_layers.N``: a Qwen2 layer, ``token_layernorm``, ``hidden_layernorm``, ``input_proj`` from ``2·hidden``
    and ``final_layernorm``; they share the target's embedding and head, sglang/srt/models/mimo_mtp.py)."""
    reader = builder.reader
    hidden = builder.hidden
    _llama_like(builder, "qwen2")
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


def _minimax_m2(builder: _Builder, model_type: str) -> list[str]:
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
            builder.norm(f"{prefix}.self_attn.q_norm", layer, heads * head_dim, rank_out=_split(heads * head_dim, tp))
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


def _mimo_v2_flash(builder: _Builder, model_type: str) -> list[str]:
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
                "attention", f"{prefix}.self_attn.attention_sink_bias", heads, rank_out=_split(heads, tp), layer=layer
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


def _gemma4(builder: _Builder, model_type: str) -> list[str]:
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
    notes = []
    if builder.outer.has("vision_config"):
        notes.append("Gemma-4's vision tower (vision_config) is not counted; only the text model is.")
    return notes


def _deepseek_v4(builder: _Builder, model_type: str) -> list[str]:
    """DeepSeek-V4 (sglang/srt/models/deepseek_v4.py, layers/attention/dsv4/): per layer a single-KV-head attention
    (``wq_a`` → ``q_norm`` → ``wq_b``, ``wkv`` → ``kv_norm``, grouped output ``wo_a`` / ``wo_b``, float32
    ``attn_sink``), a KV compressor where ``compress_ratios[layer]`` is set (float32 ``ape``, ``wkv`` and ``wgate``,
    a float32 norm; overlapping, hence doubled, at ratio 4), an indexer at ratio 4 (``wq_b``, ``weights_proj`` and
    its own compressor over ``index_head_dim``), the float32 manifold-constrained hyper-connection mixers of the
    attention and the FFN, and a MoE whose first ``num_hash_layers`` route by token id (an int32 ``tid2eid`` table
    instead of the correction bias); the model ends in the float32 ``hc_head``.  ``expert_dtype: fp4`` experts
    are stored as mxfp4."""
    reader = builder.reader
    hidden, tp = builder.hidden, builder.sharding.tp
    layers = reader.integer("num_hidden_layers")
    ratios = reader.integer_list("compress_ratios", maximum=1 << 10)
    mtp_layers = reader.integer("num_nextn_predict_layers", 0, minimum=0)
    if len(ratios) != layers + mtp_layers:
        raise reader.error(
            "compress_ratios",
            f"has {len(ratios)} entries",
            f"List one per layer and MTP layer ({layers + mtp_layers}).",
        )
    heads, head_dim = reader.integer("num_attention_heads"), reader.integer("head_dim")
    q_lora, o_lora, groups = reader.integer("q_lora_rank"), reader.integer("o_lora_rank"), reader.integer("o_groups")
    index_heads, index_dim = reader.integer("index_n_heads"), reader.integer("index_head_dim")
    hc = reader.integer("hc_mult")
    mix, hc_dim = (2 + hc) * hc, hc * hidden
    experts, vocab = reader.integer("n_routed_experts"), reader.integer("vocab_size")
    hash_layers = reader.integer("num_hash_layers", 0, minimum=0)
    f32 = {"element_bytes": 4}
    if reader.string("expert_dtype", "") == "fp4":
        builder.expert_storage = mxfp4()

    def compressor(prefix: str, layer: int, ratio: int, dim: int, **kw: Any) -> None:
        width = (2 if ratio == 4 else 1) * dim
        builder.add("attention", f"{prefix}.ape", ratio, width, layer=layer, **f32, **kw)
        builder.replicated("attention", f"{prefix}.wkv", width, hidden, layer, linear=False, **kw)
        builder.replicated("attention", f"{prefix}.wgate", width, hidden, layer, linear=False, **kw)
        builder.add("norms", f"{prefix}.norm", dim, layer=layer, **f32, **kw)

    def decoder_layer(prefix: str, layer: int, **kw: Any) -> None:
        attn = f"{prefix}.attn"
        builder.add("attention", f"{attn}.attn_sink", heads, rank_out=_split(heads, tp), layer=layer, **f32, **kw)
        builder.replicated("attention", f"{attn}.wq_a", q_lora, hidden, layer, **kw)
        builder.norm(f"{attn}.q_norm", layer, q_lora, **kw)
        builder.column("attention", f"{attn}.wq_b", heads * head_dim, q_lora, layer, **kw)
        builder.replicated("attention", f"{attn}.wkv", head_dim, hidden, layer, **kw)
        builder.norm(f"{attn}.kv_norm", layer, head_dim, **kw)
        builder.column("attention", f"{attn}.wo_a", groups * o_lora, heads * head_dim // groups, layer, **kw)
        builder.row("attention", f"{attn}.wo_b", hidden, groups * o_lora, layer, **kw)
        ratio = ratios[layer]
        if ratio:
            compressor(f"{attn}.compressor", layer, ratio, head_dim, **kw)
        if ratio == 4:
            indexer = f"{attn}.indexer"
            builder.replicated("attention", f"{indexer}.wq_b", index_heads * index_dim, q_lora, layer, **kw)
            builder.replicated("attention", f"{indexer}.weights_proj", index_heads, hidden, layer, linear=False, **kw)
            compressor(f"{indexer}.compressor", layer, 4, index_dim, **kw)
        builder.norm(f"{prefix}.attn_norm", layer, **kw)
        builder.norm(f"{prefix}.ffn_norm", layer, **kw)
        for part in ("attn", "ffn"):
            builder.add("norms", f"{prefix}.hc_{part}_fn", mix, hc_dim, layer=layer, **f32, **kw)
            builder.add("norms", f"{prefix}.hc_{part}_base", mix, layer=layer, **f32, **kw)
            builder.add("norms", f"{prefix}.hc_{part}_scale", 3, layer=layer, **f32, **kw)
        ffn = f"{prefix}.ffn"
        builder.replicated("moe_router", f"{ffn}.gate.weight", experts, hidden, layer, linear=False, **kw)
        if layer < hash_layers and not kw.get("mtp"):
            topk = reader.integer("num_experts_per_tok")
            builder.add("moe_router", f"{ffn}.gate.tid2eid", vocab, topk, layer=layer, **f32, **kw)
        else:
            builder.add("moe_router", f"{ffn}.gate.bias", experts, layer=layer, **f32, **kw)
        builder.experts(f"{ffn}.experts", layer, experts, reader.integer("moe_intermediate_size"), **kw)
        shared = reader.integer("moe_intermediate_size") * reader.integer("n_shared_experts", 0, minimum=0)
        if shared:
            builder.dense_mlp(f"{ffn}.shared_experts", layer, shared, family="moe_shared_experts", **kw)

    for layer in range(layers):
        decoder_layer(f"layers.{layer}", layer)
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    for name, rows, inner in (("hc_head_fn", hc, hc_dim), ("hc_head_base", hc, 1), ("hc_head_scale", 1, 1)):
        builder.add("norms", name, rows, inner, stage="last", **f32)
    for index in range(layers, layers + mtp_layers):
        prefix = f"mtp.{index - layers}"
        decoder_layer(prefix, index, mtp=True)
        for name in ("enorm", "hnorm", "norm"):
            builder.norm(f"{prefix}.{name}", index, mtp=True)
        builder.replicated("mtp", f"{prefix}.e_proj", hidden, hidden, index, mtp=True)
        builder.replicated("mtp", f"{prefix}.h_proj", hidden, hidden, index, mtp=True)
        for name, rows, inner in (("hc_head_fn", hc, hc_dim), ("hc_head_base", hc, 1), ("hc_head_scale", 1, 1)):
            builder.add("norms", f"{prefix}.{name}", rows, inner, layer=index, mtp=True, **f32)
    notes = [
        "DeepSeek-V4's MTP layer is counted without embedding or head copies (SGLang's NextN module shares the "
        "target's; whether the checkpoint stores its own is not in the config)."
    ]
    return notes


def _minimax_m3(builder: _Builder, model_type: str) -> list[str]:
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
