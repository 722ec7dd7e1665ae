"""The weights of DeepSeek-V4 (``estimate_weights`` hook), from the parts library."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpools_core import hookimpl
from kvpools_core.parts.weights import Builder, WeightsConfig, WeightsEstimate, estimate_claimed, mxfp4, split
from kvpools_core.values import Serving


@hookimpl
def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> WeightsEstimate | None:
    """The weights of the ``model_type`` values of :data:`DECODERS`, from the parts library; None for any other."""
    return estimate_claimed(config, serving, ep_size, DECODERS, DP_ATTENTION, VLLM_METHODS)


def _deepseek_v4(builder: Builder, model_type: str) -> list[str]:
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
        builder.add("attention", f"{attn}.attn_sink", heads, rank_out=split(heads, tp), layer=layer, **f32, **kw)
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


DECODERS: dict[str, Callable[[Builder, str], list[str]]] = {
    "deepseek_v4": _deepseek_v4,
}
"""The ``model_type`` values whose weights this plugin estimates, and the function that lays out their tensors."""

DP_ATTENTION: dict[str, str] = {}
"""The model types whose SGLang attention (and input embedding) shards over the attention-TP group under
``enable_dp_attention`` (``parallel_group="attn_tp"``, checked against SGLang 0.5.23), with the module that builds
it; the estimate refuses DP attention for the others."""

VLLM_METHODS: dict[str, dict[str, str]] = {
    "deepseek_v4": {"fp8": "deepseek_v4_fp8", "deepseek_v4_fp8": "deepseek_v4_fp8"}
}
"""vLLM 0.33 ``DeepseekV4Fp8Config.override_quantization_method`` (models/deepseek_v4/quant_config.py L171-188):
an ``fp8`` checkpoint of DeepSeek-V4 is served as ``deepseek_v4_fp8`` (the core's ``resolve_quantization``
applies it; the core names no architecture)."""
