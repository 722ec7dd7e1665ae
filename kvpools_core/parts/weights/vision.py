"""Vision towers that multimodal checkpoints carry beside the text model, counted as the family ``vision``.

Both sit on the first pipeline stage; SGLang splits their attention and MLP Linears over TP like the text model's
(``QKVParallelLinear`` / ``ColumnParallelLinear`` / ``RowParallelLinear``, a row-parallel bias whole on every rank)
and their position table like a vocabulary (``VocabParallelEmbedding``).
"""

from __future__ import annotations

from typing import Any

from kvpools_core.config import ConfigReader
from kvpools_core.parts.weights.tensors import Builder, split, vocab_rows_per_rank

__all__ = [
    "gemma3_vision",
    "gemma4_vision_tower",
    "llama4_vision",
    "pixtral_vision",
    "qwen3_vl_vision",
    "siglip_vision",
]

FIRST: dict[str, Any] = {"stage": "first"}


def _linear(builder: Builder, module: str, rows: int, inner: int, column: bool) -> None:
    """A biased vision Linear, column- or row-parallel."""
    tp = builder.sharding.tp
    shape: dict[str, Any] = {"rank_out": split(rows, tp)} if column else {"rank_inner": split(inner, tp)}
    builder.add("vision", module, rows, inner, linear=True, **shape, **FIRST)
    builder.add("vision", f"{module}.bias", rows, **({"rank_out": split(rows, tp)} if column else {}), **FIRST)


def _layer_norm(builder: Builder, module: str, size: int) -> None:
    builder.add("vision", module, 2 * size, **FIRST)  # weight and bias


def _positions(builder: Builder, module: str, positions: int, hidden: int) -> None:
    rows = vocab_rows_per_rank(positions, builder.sharding.tp)
    builder.add("vision", module, positions, hidden, rank_out=rows, **FIRST)


def siglip_vision(builder: Builder, vision: ConfigReader, prefix: str) -> None:
    """A SigLIP vision tower (``SiglipVisionModel``, sglang/srt/models/siglip.py) without its pooling head: a biased
    Conv2d patch embedding, a position table of ``(image_size / patch_size)²`` rows, ``num_hidden_layers`` blocks
    (two LayerNorms, biased q/k/v/out projections, ``fc1`` / ``fc2``) and the final ``post_layernorm``."""
    if vision.boolean("vision_use_head", False):
        raise vision.error("vision_use_head", "is true", "SigLIP's pooling head is not modelled.")
    hidden, inter = vision.integer("hidden_size"), vision.integer("intermediate_size")
    patch = vision.integer("patch_size")
    builder.add(
        "vision", f"{prefix}.embeddings.patch_embedding", hidden, vision.integer("num_channels", 3) * patch**2, **FIRST
    )
    builder.add("vision", f"{prefix}.embeddings.patch_embedding.bias", hidden, **FIRST)
    _positions(builder, f"{prefix}.embeddings.position_embedding", (vision.integer("image_size") // patch) ** 2, hidden)
    for block in range(vision.integer("num_hidden_layers")):
        layer = f"{prefix}.encoder.layers.{block}"
        _layer_norm(builder, f"{layer}.layer_norm1", hidden)
        _layer_norm(builder, f"{layer}.layer_norm2", hidden)
        _linear(builder, f"{layer}.self_attn.qkv_proj", 3 * hidden, hidden, column=True)
        _linear(builder, f"{layer}.self_attn.out_proj", hidden, hidden, column=False)
        _linear(builder, f"{layer}.mlp.fc1", inter, hidden, column=True)
        _linear(builder, f"{layer}.mlp.fc2", hidden, inter, column=False)
    _layer_norm(builder, f"{prefix}.post_layernorm", hidden)


def gemma3_vision(builder: Builder, vision: ConfigReader) -> None:
    """Gemma-3's SigLIP tower and its multimodal projector (sglang/srt/models/gemma3_mm.py): the RMSNorm
    ``mm_soft_emb_norm`` over the vision width and ``mm_input_projection_weight`` to the text width, whole on
    every rank."""
    siglip_vision(builder, vision, "vision_tower.vision_model")
    width = vision.integer("hidden_size")
    builder.add("vision", "multi_modal_projector.mm_soft_emb_norm", width, **FIRST)
    builder.add("vision", "multi_modal_projector.mm_input_projection_weight", width, builder.hidden, **FIRST)


def gemma4_vision_tower(builder: Builder, vision: ConfigReader) -> None:
    """Gemma-4's vision encoder and its embedder (``Gemma4VisionEncoder``, sglang/srt/models/gemma4_vision_tower.py, and
    ``Gemma4MultimodalEmbedder``, gemma4_mm.py), on the first pipeline stage: the patch embedder (``input_proj``
    from ``3 · patch_size²`` with no bias and a ``2 x position_embedding_size x hidden_size`` position table, whole
    on every rank); ``num_hidden_layers`` blocks of fused q/k/v (``num_attention_heads`` and
    ``num_key_value_heads`` of ``head_dim``, column-parallel) and ``o_proj`` (row-parallel), q/k RMSNorms over one
    head (the v norm has no scale), a GELU ``gate_up`` / ``down_proj`` MLP of ``intermediate_size``, four RMSNorms
    and the ``layer_scalar`` buffer; the ``std_bias`` / ``std_scale`` buffers under ``standardize``; and the
    embedder's ``embedding_projection`` to the text width (``ReplicatedLinear``; its norm has no scale).  Biased
    or clipped Linears (``attention_bias``, ``use_clipped_linears``) are refused."""
    for key in ("attention_bias", "use_clipped_linears"):
        if vision.boolean(key, False):
            raise vision.error(
                key, "is true", "Gemma-4's vision encoder with biased or clipped Linears is not modelled."
            )
    hidden, inter = vision.integer("hidden_size"), vision.integer("intermediate_size")
    heads, kv_heads = vision.integer("num_attention_heads"), vision.integer("num_key_value_heads")
    head_dim = vision.integer("head_dim", hidden // heads)
    tp = builder.sharding.tp
    prefix = "model.vision_tower"
    patch = vision.integer("patch_size")
    builder.add("vision", f"{prefix}.patch_embedder.input_proj", hidden, 3 * patch**2, linear=True, **FIRST)
    table = 2 * vision.integer("position_embedding_size")
    builder.add("vision", f"{prefix}.patch_embedder.position_embedding_table", table, hidden, **FIRST)
    for block in range(vision.integer("num_hidden_layers")):
        layer = f"{prefix}.encoder.layers.{block}"
        qkv = (heads + 2 * kv_heads) * head_dim
        builder.add("vision", f"{layer}.self_attn.qkv_proj", qkv, hidden, linear=True, rank_out=split(qkv, tp), **FIRST)
        inner = heads * head_dim
        builder.add(
            "vision", f"{layer}.self_attn.o_proj", hidden, inner, linear=True, rank_inner=split(inner, tp), **FIRST
        )
        builder.add("vision", f"{layer}.self_attn.q_norm", head_dim, **FIRST)
        builder.add("vision", f"{layer}.self_attn.k_norm", head_dim, **FIRST)
        builder.add(
            "vision",
            f"{layer}.mlp.gate_up_proj",
            2 * inter,
            hidden,
            linear=True,
            rank_out=2 * split(inter, tp),
            **FIRST,
        )
        builder.add(
            "vision", f"{layer}.mlp.down_proj", hidden, inter, linear=True, rank_inner=split(inter, tp), **FIRST
        )
        for norm in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            builder.add("vision", f"{layer}.{norm}", hidden, **FIRST)
        builder.add("vision", f"{layer}.layer_scalar", 1, **FIRST)
    if vision.boolean("standardize", False):
        builder.add("vision", f"{prefix}.std_bias", hidden, **FIRST)
        builder.add("vision", f"{prefix}.std_scale", hidden, **FIRST)
    builder.add("vision", "model.embed_vision.embedding_projection", builder.hidden, hidden, linear=True, **FIRST)


def llama4_vision(builder: Builder, vision: ConfigReader) -> None:
    """Llama-4's vision tower and projector (``Llama4VisionModel`` and ``Llama4MultiModalProjector``,
    sglang/srt/models/mllama4.py), named as the checkpoint names them: the unfold patch embedding (a Linear from
    ``num_channels · patch_size²`` with no bias, column-parallel), ``class_embedding``, ``positional_embedding_vlm``
    of ``(image_size / patch_size)² + 1`` rows and the pre / post LayerNorms (whole on every rank);
    ``num_hidden_layers`` blocks of two LayerNorms, biased q/k/v (column-parallel) and ``o_proj`` (row-parallel) and
    a biased ``fc1`` / ``fc2`` MLP of ``intermediate_size``; the pixel-shuffle adapter's two Linears (``fc1`` from
    ``intermediate_size`` to ``projector_input_dim``, ``fc2`` to ``projector_output_dim``, biased only under
    ``multi_modal_projector_bias``); and the projector ``linear_1`` from ``vision_output_dim`` to the text width
    (transformers' ``nn.Linear``, whole on every rank)."""
    hidden, inter = vision.integer("hidden_size"), vision.integer("intermediate_size")
    patch, tp = vision.integer("patch_size"), builder.sharding.tp
    prefix = "vision_model"
    pixels = vision.integer("num_channels", 3) * patch**2
    builder.add("vision", f"{prefix}.patch_embedding.linear", hidden, pixels, rank_out=split(hidden, tp), **FIRST)
    builder.add("vision", f"{prefix}.class_embedding", hidden, **FIRST)
    positions = (vision.integer("image_size") // patch) ** 2 + 1
    builder.add("vision", f"{prefix}.positional_embedding_vlm", positions, hidden, **FIRST)
    _layer_norm(builder, f"{prefix}.layernorm_pre", hidden)
    _layer_norm(builder, f"{prefix}.layernorm_post", hidden)
    for block in range(vision.integer("num_hidden_layers")):
        layer = f"{prefix}.model.layers.{block}"
        _layer_norm(builder, f"{layer}.input_layernorm", hidden)
        _layer_norm(builder, f"{layer}.post_attention_layernorm", hidden)
        for name in ("q_proj", "k_proj", "v_proj"):
            _linear(builder, f"{layer}.self_attn.{name}", hidden, hidden, column=True)
        _linear(builder, f"{layer}.self_attn.o_proj", hidden, hidden, column=False)
        _linear(builder, f"{layer}.mlp.fc1", inter, hidden, column=True)
        _linear(builder, f"{layer}.mlp.fc2", hidden, inter, column=False)
    adapter_in, adapter_out = vision.integer("projector_input_dim"), vision.integer("projector_output_dim")
    biased = vision.boolean("multi_modal_projector_bias", False)
    adapter = f"{prefix}.vision_adapter.mlp"
    for module, rows, inner, column in (
        (f"{adapter}.fc1", adapter_in, inter, True),
        (f"{adapter}.fc2", adapter_out, adapter_in, False),
    ):
        if biased:
            _linear(builder, module, rows, inner, column=column)
        else:
            shape = {"rank_out": split(rows, tp)} if column else {"rank_inner": split(inner, tp)}
            builder.add("vision", module, rows, inner, linear=True, **shape, **FIRST)
    builder.add(
        "vision",
        "multi_modal_projector.linear_1",
        builder.hidden,
        vision.integer("vision_output_dim"),
        linear=True,
        **FIRST,
    )


def qwen3_vl_vision(builder: Builder, vision: ConfigReader) -> None:
    """The Qwen3-VL vision tower that Qwen3.5 checkpoints carry (``Qwen3VLMoeVisionModel``,
    sglang/srt/models/qwen3_vl.py), family ``vision``, on the first pipeline stage: a biased Conv3d patch embedding,
    a learned position table (vocab-parallel), ``depth`` blocks (two LayerNorms, biased ``qkv`` / ``proj``
    attention and ``linear_fc1`` / ``linear_fc2`` MLP, split over TP like the text model), and the patch merger
    (a LayerNorm over ``hidden_size``, then ``linear_fc1`` over ``hidden_size · spatial_merge_size²`` and
    ``linear_fc2`` to ``out_hidden_size``) plus one post-shuffle-normed merger per ``deepstack_visual_indexes``."""
    hidden = vision.integer("hidden_size")
    inter = vision.integer("intermediate_size")
    patch = (
        vision.integer("in_channels", 3) * vision.integer("temporal_patch_size", 2) * vision.integer("patch_size") ** 2
    )
    merged = hidden * vision.integer("spatial_merge_size", 2) ** 2
    out = vision.integer("out_hidden_size")
    builder.add("vision", "model.visual.patch_embed.proj", hidden, patch, **FIRST)
    builder.add("vision", "model.visual.patch_embed.proj.bias", hidden, **FIRST)
    _positions(builder, "model.visual.pos_embed", vision.integer("num_position_embeddings"), hidden)
    for block in range(vision.integer("depth")):
        prefix = f"model.visual.blocks.{block}"
        _layer_norm(builder, f"{prefix}.norm1", hidden)
        _layer_norm(builder, f"{prefix}.norm2", hidden)
        _linear(builder, f"{prefix}.attn.qkv", 3 * hidden, hidden, column=True)
        _linear(builder, f"{prefix}.attn.proj", hidden, hidden, column=False)
        _linear(builder, f"{prefix}.mlp.linear_fc1", inter, hidden, column=True)
        _linear(builder, f"{prefix}.mlp.linear_fc2", hidden, inter, column=False)
    deepstack = vision.integer_list("deepstack_visual_indexes", maximum=vision.integer("depth") - 1)
    for index, merger in enumerate(
        ["model.visual.merger"] + [f"model.visual.deepstack_merger_list.{i}" for i in range(len(deepstack))]
    ):
        _layer_norm(builder, f"{merger}.norm", merged if index else hidden)
        _linear(builder, f"{merger}.linear_fc1", merged, merged, column=True)
        _linear(builder, f"{merger}.linear_fc2", out, merged, column=False)


def pixtral_vision(builder: Builder, outer: ConfigReader) -> None:
    """Mistral-3's Pixtral tower and projector (``Mistral3ForConditionalGeneration``), family ``vision``, on the first
    pipeline stage.  vLLM 0.33 (0.19.0 alike) builds them under ``_mark_tower_model`` (``mistral3.py`` L478-495):
    ``PixtralHFVisionModel`` (``pixtral.py`` L1534-1560) holds ``patch_conv`` (a Conv2d of ``num_channels ·
    patch_size²`` inputs, no bias, whole on every rank) and the RMSNorm ``ln_pre``, then ``num_hidden_layers``
    blocks (L1390-1411): RMSNorms ``attention_norm`` / ``ffn_norm``, an unbiased ``qkv_proj`` over every head
    (``QKVParallelLinear`` with as many KV heads as heads, L1317) and ``o_proj`` (row-parallel, L1326), a gated
    ``gate_up_proj`` / ``down_proj`` MLP of ``intermediate_size`` (L1275-1290); ``Mistral3MultiModalProjector``
    (``mistral3.py`` L140-175) holds the RMSNorm ``norm`` over the vision width, the patch merger's
    ``merging_layer`` (an ``nn.Linear`` from ``hidden_size · spatial_merge_size²`` to ``hidden_size``, no bias,
    whole on every rank, L103) and ``linear_1`` (column-parallel, vision width to text width) and ``linear_2``
    (row-parallel, text width to text width), biased under ``multimodal_projector_bias``.  SGLang 0.5.23 builds
    the same tensors (``models/pixtral.py`` ``PixtralHFVisionModel``, split over TP alike) but takes the projector
    from transformers (``models/mistral.py`` L23 / L95): ``linear_1`` / ``linear_2`` whole on every rank.

    vLLM builds the tower only up to ``vision_feature_layer`` (``_get_num_hidden_layers``, L367-385); one that
    stops short of the last layer, or a list of them (whose projector widens with it in transformers), is refused.
    The rotary table (``PixtralRotaryEmbedding``'s non-persistent ``inv_freq`` buffer, ``(image_size /
    patch_size)² x head_dim`` float32, 3.1 MB for Mistral-Small-3.1) is not a parameter and is not counted."""
    vision = outer.child("vision_config")
    hidden, inter = vision.integer("hidden_size"), vision.integer("intermediate_size")
    layers = vision.integer("num_hidden_layers")
    feature = outer.get("vision_feature_layer", -1)
    if not isinstance(feature, int) or isinstance(feature, bool) or feature not in (-1, layers):
        raise outer.error(
            "vision_feature_layer",
            f"is {feature!r}",
            "kvpools does not model a Pixtral tower cut short of its last layer (or several feature layers) yet; "
            "use -1.",
        )
    patch, tp = vision.integer("patch_size"), builder.sharding.tp
    prefix = "vision_tower"
    builder.add("vision", f"{prefix}.patch_conv", hidden, vision.integer("num_channels", 3) * patch**2, **FIRST)
    builder.add("vision", f"{prefix}.ln_pre", hidden, **FIRST)
    for block in range(layers):
        layer = f"{prefix}.transformer.layers.{block}"
        builder.add("vision", f"{layer}.attention_norm", hidden, **FIRST)
        builder.add("vision", f"{layer}.ffn_norm", hidden, **FIRST)
        builder.add(
            "vision",
            f"{layer}.attention.qkv_proj",
            3 * hidden,
            hidden,
            linear=True,
            rank_out=3 * split(hidden, tp),
            **FIRST,
        )
        builder.add(
            "vision", f"{layer}.attention.o_proj", hidden, hidden, linear=True, rank_inner=split(hidden, tp), **FIRST
        )
        builder.add(
            "vision",
            f"{layer}.feed_forward.gate_up_proj",
            2 * inter,
            hidden,
            linear=True,
            rank_out=2 * split(inter, tp),
            **FIRST,
        )
        builder.add(
            "vision",
            f"{layer}.feed_forward.down_proj",
            hidden,
            inter,
            linear=True,
            rank_inner=split(inter, tp),
            **FIRST,
        )
    merge = outer.integer("spatial_merge_size", 2)
    projector = "multi_modal_projector"
    builder.add("vision", f"{projector}.norm", hidden, **FIRST)
    builder.add("vision", f"{projector}.patch_merger.merging_layer", hidden, hidden * merge**2, linear=True, **FIRST)
    text = builder.hidden
    if builder.sharding.engine == "vllm":
        _linear_maybe_biased(builder, f"{projector}.linear_1", text, hidden, column=True, outer=outer)
        _linear_maybe_biased(builder, f"{projector}.linear_2", text, text, column=False, outer=outer)
    else:
        biased = outer.boolean("multimodal_projector_bias", False)
        for module, inner in ((f"{projector}.linear_1", hidden), (f"{projector}.linear_2", text)):
            builder.add("vision", module, text, inner, linear=True, **FIRST)
            if biased:
                builder.add("vision", f"{module}.bias", text, **FIRST)


def _linear_maybe_biased(
    builder: Builder, module: str, rows: int, inner: int, *, column: bool, outer: ConfigReader
) -> None:
    """A vision Linear split over TP, biased only under the top-level ``multimodal_projector_bias``."""
    if outer.boolean("multimodal_projector_bias", False):
        _linear(builder, module, rows, inner, column=column)
        return
    tp = builder.sharding.tp
    shape: dict[str, Any] = {"rank_out": split(rows, tp)} if column else {"rank_inner": split(inner, tp)}
    builder.add("vision", module, rows, inner, linear=True, **shape, **FIRST)
