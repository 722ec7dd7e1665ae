"""Hybrid decoders that mix softmax attention with linear attention or Mamba: Qwen3-Next, Qwen3.5 (and its vision
tower), Nemotron-H, Jamba."""

from __future__ import annotations

from typing import Any

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.pipeline.weights._model import _Builder, _split
from kvpools_core.pipeline.weights._vision import _qwen3_vl_vision

FLOAT32 = 4


def _gated_delta_net(builder: _Builder, prefix: str, layer: int, split_projections: bool, **kw: Any) -> None:
    """A Gated DeltaNet mixer (``Qwen3GatedDeltaNet``, sglang/srt/models/qwen3_next.py): q/k/v/z and b/a input
    projections (fused ``in_proj_qkvz``/``in_proj_ba`` in Qwen3-Next, four projections in Qwen3.5), a depthwise
    ``conv1d`` over q, k and v, per-value-head ``dt_bias`` and float32 ``A_log``, a gated RMSNorm over one value head
    and ``out_proj``.  SGLang splits every part by heads over the attention TP group."""
    reader = builder.reader
    hidden, tp = builder.hidden, builder.sharding.tp
    v_heads = reader.integer("linear_num_value_heads")
    key_dim = reader.integer("linear_num_key_heads") * reader.integer("linear_key_head_dim")
    v_head_dim = reader.integer("linear_value_head_dim")
    value_dim = v_heads * v_head_dim
    family = "linear_attention"
    if split_projections:
        builder.column(family, f"{prefix}.in_proj_qkv", 2 * key_dim + value_dim, hidden, layer, **kw)
        builder.column(family, f"{prefix}.in_proj_z", value_dim, hidden, layer, **kw)
        builder.column(family, f"{prefix}.in_proj_b", v_heads, hidden, layer, **kw)
        builder.column(family, f"{prefix}.in_proj_a", v_heads, hidden, layer, **kw)
    else:
        builder.column(family, f"{prefix}.in_proj_qkvz", 2 * key_dim + 2 * value_dim, hidden, layer, **kw)
        builder.column(family, f"{prefix}.in_proj_ba", 2 * v_heads, hidden, layer, **kw)
    conv_dim, kernel = 2 * key_dim + value_dim, reader.integer("linear_conv_kernel_dim")
    builder.add(family, f"{prefix}.conv1d", conv_dim, kernel, rank_out=_split(conv_dim, tp), layer=layer, **kw)
    builder.add(family, f"{prefix}.dt_bias", v_heads, rank_out=_split(v_heads, tp), layer=layer, **kw)
    a_log = {"rank_out": _split(v_heads, tp), "layer": layer, "element_bytes": FLOAT32, **kw}
    builder.add(family, f"{prefix}.A_log", v_heads, **a_log)
    builder.norm(f"{prefix}.norm", layer, v_head_dim, **kw)
    builder.row(family, f"{prefix}.out_proj", hidden, value_dim, layer, **kw)


def _qwen_moe_block(builder: _Builder, prefix: str, layer: int, **kw: Any) -> None:
    """Qwen2/3-style sparse MoE: a router, ``num_experts`` experts and an optional shared expert with its scalar
    sigmoid gate (``shared_expert_gate``, whole on every rank like the router)."""
    reader = builder.reader
    hidden = builder.hidden
    experts = reader.integer("num_experts")
    builder.replicated("moe_router", f"{prefix}.gate", experts, hidden, layer, linear=False, **kw)
    builder.experts(f"{prefix}.experts", layer, experts, reader.integer("moe_intermediate_size"), **kw)
    shared = reader.integer("shared_expert_intermediate_size", 0, minimum=0)
    if shared:
        builder.dense_mlp(f"{prefix}.shared_expert", layer, shared, family="moe_shared_experts", **kw)
        builder.replicated("moe_router", f"{prefix}.shared_expert_gate", 1, hidden, layer, linear=False, **kw)


def _qwen3_next(builder: _Builder, model_type: str) -> list[str]:
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
            _gated_delta_net(builder, f"{prefix}.linear_attn", layer, split_projections, **kw)
        builder.norm(f"{prefix}.input_layernorm", layer, **kw)
        builder.norm(f"{prefix}.post_attention_layernorm", layer, **kw)
        if sparse:
            _qwen_moe_block(builder, f"{prefix}.mlp", layer, **kw)
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
        _qwen3_vl_vision(builder, builder.outer.child("vision_config"))
    return notes


def _nemotron_h(builder: _Builder, model_type: str) -> list[str]:
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
            _mamba2(builder, mixer, layer)
        elif kind == "*":
            builder.gqa_attention(mixer, layer, head_dim, attention_bias, attention_bias)
        elif kind == "-":
            _relu2_mlp(builder, mixer, layer, reader.integer("intermediate_size"), "mlp", mlp_bias)
        else:
            experts = reader.integer("n_routed_experts")
            builder.replicated("moe_router", f"{mixer}.gate", experts, hidden, layer, linear=False)
            builder.add("moe_router", f"{mixer}.gate.e_score_correction_bias", experts, layer=layer, element_bytes=4)
            intermediate = reader.integer("moe_intermediate_size")
            builder.experts(f"{mixer}.experts", layer, experts, intermediate, gated=False)  # squared-ReLU experts
            shared = reader.integer("n_shared_experts", 0, minimum=0)
            if shared:
                shared_size = reader.integer("moe_shared_expert_intermediate_size") * shared
                _relu2_mlp(builder, f"{mixer}.shared_experts", layer, shared_size, "moe_shared_experts", mlp_bias)
    builder.embeddings(reader.boolean("tie_word_embeddings", False))
    return []


def _relu2_mlp(builder: _Builder, prefix: str, layer: int, size: int, family: str, bias: bool) -> None:
    """An ungated MLP (``up_proj`` then ``down_proj``), as Nemotron-H's squared-ReLU MLPs and shared experts."""
    builder.column(family, f"{prefix}.up_proj", size, builder.hidden, layer, bias)
    builder.row(family, f"{prefix}.down_proj", builder.hidden, size, layer, bias)


def _mamba2(builder: _Builder, prefix: str, layer: int) -> None:
    """A Mamba-2 mixer (``MambaMixer2``): ``in_proj`` to z, x, B, C and dt, a depthwise ``conv1d`` (with its bias
    under ``use_conv_bias``) over x, B and C, per-head ``dt_bias``, ``A_log`` and ``D``, a gated RMSNorm over the
    intermediate size and ``out_proj``; TP splits heads and groups (``n_groups`` must divide, or be 1)."""
    reader = builder.reader
    hidden, tp = builder.hidden, builder.sharding.tp
    mamba_heads = reader.integer("mamba_num_heads")
    intermediate = mamba_heads * reader.integer("mamba_head_dim")
    groups, state = reader.integer("n_groups", 1), reader.integer("ssm_state_size")
    bias = reader.boolean("use_bias", False)
    family = "mamba"
    # With n_groups = 1 below TP, SGLang replicates the group's B and C on every rank (MambaMixer2.__init__).
    if groups % tp and groups != 1:
        raise UnsupportedCombinationError(
            f"Mamba-2 n_groups {groups} does not split over tp_size {tp}; SGLang's MambaMixer2 needs tp to divide "
            "n_groups (or n_groups = 1, replicated)."
        )
    rank_groups = groups // tp if groups % tp == 0 else groups
    rank_bc = 2 * rank_groups * state
    rank_inter, rank_heads = _split(intermediate, tp), _split(mamba_heads, tp)
    projection = 2 * intermediate + 2 * groups * state + mamba_heads
    in_rank = 2 * rank_inter + rank_bc + rank_heads
    builder.add(family, f"{prefix}.in_proj", projection, hidden, rank_out=in_rank, layer=layer, linear=True)
    if bias:
        builder.add(family, f"{prefix}.in_proj.bias", projection, rank_out=in_rank, layer=layer)
    conv_dim, kernel = intermediate + 2 * groups * state, reader.integer("conv_kernel")
    conv_rank = rank_inter + rank_bc
    builder.add(family, f"{prefix}.conv1d", conv_dim, kernel, rank_out=conv_rank, layer=layer)
    if reader.boolean("use_conv_bias", True):
        builder.add(family, f"{prefix}.conv1d.bias", conv_dim, rank_out=conv_rank, layer=layer)
    for name in ("dt_bias", "A_log", "D"):
        builder.add(family, f"{prefix}.{name}", mamba_heads, rank_out=rank_heads, layer=layer)
    builder.norm(f"{prefix}.norm", layer, intermediate, rank_out=rank_inter)
    builder.row(family, f"{prefix}.out_proj", hidden, intermediate, layer, bias)


def _jamba(builder: _Builder, model_type: str) -> list[str]:
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
            _mamba1(builder, f"{prefix}.mamba", layer)
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


def _mamba1(builder: _Builder, prefix: str, layer: int) -> None:
    """A Mamba-1 mixer (Jamba's): ``in_proj`` to x and z (``2·d_inner``, ``d_inner = mamba_expand · hidden``), a
    depthwise ``conv1d`` (with its bias under ``mamba_conv_bias``), ``x_proj`` to dt, B and C
    (``dt_rank + 2·d_state``), ``dt_proj`` back to ``d_inner`` (biased), ``A_log`` ``[d_inner, d_state]``, ``D``,
    ``out_proj``, and Jamba's ``dt_layernorm`` / ``b_layernorm`` / ``c_layernorm``; TP splits ``d_inner``."""
    reader = builder.reader
    hidden, tp = builder.hidden, builder.sharding.tp
    inner = reader.integer("mamba_expand", 2) * hidden
    state, kernel = reader.integer("mamba_d_state"), reader.integer("mamba_d_conv")
    dt_rank = -(-hidden // 16) if reader.get("mamba_dt_rank") == "auto" else reader.integer("mamba_dt_rank")
    bias = reader.boolean("mamba_proj_bias", False)
    rank_inner = _split(inner, tp)
    family = "mamba"
    builder.add(family, f"{prefix}.in_proj", 2 * inner, hidden, rank_out=2 * rank_inner, layer=layer, linear=True)
    if bias:
        builder.add(family, f"{prefix}.in_proj.bias", 2 * inner, rank_out=2 * rank_inner, layer=layer)
    builder.add(family, f"{prefix}.conv1d", inner, kernel, rank_out=rank_inner, layer=layer)
    if reader.boolean("mamba_conv_bias", True):
        builder.add(family, f"{prefix}.conv1d.bias", inner, rank_out=rank_inner, layer=layer)
    builder.row(family, f"{prefix}.x_proj", dt_rank + 2 * state, inner, layer)
    builder.column(family, f"{prefix}.dt_proj", inner, dt_rank, layer, bias=True)
    builder.add(family, f"{prefix}.A_log", inner, state, rank_out=rank_inner, layer=layer)
    builder.add(family, f"{prefix}.D", inner, rank_out=rank_inner, layer=layer)
    builder.row(family, f"{prefix}.out_proj", hidden, inner, layer, bias)
    for name, size in (("dt_layernorm", dt_rank), ("b_layernorm", state), ("c_layernorm", state)):
        builder.norm(f"{prefix}.{name}", layer, size)
