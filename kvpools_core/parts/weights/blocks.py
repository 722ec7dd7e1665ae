"""The building blocks of a decoder's weights that more than one architecture uses, each sharded as SGLang shards it.

Attention beside :meth:`~kvpools_core.parts.weights.tensors.Builder.gqa_attention`: multi-head latent attention
(:func:`mla_attention`) and DeepSeek sparse attention's indexer (:func:`dsa_indexer`); mixture-of-experts blocks
(:func:`routed_moe`: router, correction bias, experts and shared experts in DeepSeek's layout; :func:`sparse_moe`:
Qwen's, with its shared-expert gate); an ungated MLP (:func:`ungated_mlp`); linear-attention and state-space mixers
(:func:`gated_delta_net`, :func:`mamba2`, :func:`mamba1`).  Each reads its own config keys from
``builder.reader`` (the text model's config) and adds its tensors to ``builder``.
"""

from __future__ import annotations

from typing import Any

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parts.weights.tensors import Builder, split

__all__ = [
    "dsa_indexer",
    "gated_delta_net",
    "mamba1",
    "mamba2",
    "mla_attention",
    "routed_moe",
    "sparse_moe",
    "ungated_mlp",
]

FLOAT32 = 4


def mla_attention(builder: Builder, prefix: str, layer: int, **kw: Any) -> None:
    """Multi-head latent attention (``DeepseekV2AttentionMLA``, sglang/srt/models/deepseek_v2.py): the query through
    the ``q_lora_rank`` latent when the config sets one (``q_a_proj`` and its norm whole on every rank, SGLang's
    ``ReplicatedLinear``) or ``q_proj``, the shared ``kv_a_proj_with_mqa`` to ``kv_lora_rank + qk_rope_head_dim``
    and its norm (whole), ``kv_b_proj`` and ``o_proj`` over attention TP; with ``index_topk`` the DSA indexer
    (:func:`dsa_indexer`)."""
    reader = builder.reader
    hidden = builder.hidden
    heads = reader.integer("num_attention_heads")
    nope, rope = reader.integer("qk_nope_head_dim"), reader.integer("qk_rope_head_dim")
    v_dim, kv_lora = reader.integer("v_head_dim"), reader.integer("kv_lora_rank")
    q_lora = reader.optional_integer("q_lora_rank")
    if q_lora:  # SGLang keeps the low-rank down projections whole on every rank (ReplicatedLinear)
        builder.replicated("attention", f"{prefix}.q_a_proj", q_lora, hidden, layer, **kw)
        builder.norm(f"{prefix}.q_a_layernorm", layer, q_lora, **kw)
        builder.column("attention", f"{prefix}.q_b_proj", heads * (nope + rope), q_lora, layer, **kw)
    else:
        builder.column("attention", f"{prefix}.q_proj", heads * (nope + rope), hidden, layer, **kw)
    builder.replicated("attention", f"{prefix}.kv_a_proj_with_mqa", kv_lora + rope, hidden, layer, **kw)
    builder.norm(f"{prefix}.kv_a_layernorm", layer, kv_lora, **kw)
    builder.column("attention", f"{prefix}.kv_b_proj", heads * (nope + v_dim), kv_lora, layer, **kw)
    builder.row("attention", f"{prefix}.o_proj", hidden, heads * v_dim, layer, **kw)
    if reader.has("index_topk"):
        dsa_indexer(builder, f"{prefix}.indexer", layer, q_lora, **kw)


def dsa_indexer(builder: Builder, prefix: str, layer: int, q_lora: int | None, **kw: Any) -> None:
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


def gated_delta_net(builder: Builder, prefix: str, layer: int, split_projections: bool, **kw: Any) -> None:
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
    builder.add(family, f"{prefix}.conv1d", conv_dim, kernel, rank_out=split(conv_dim, tp), layer=layer, **kw)
    builder.add(family, f"{prefix}.dt_bias", v_heads, rank_out=split(v_heads, tp), layer=layer, **kw)
    a_log = {"rank_out": split(v_heads, tp), "layer": layer, "element_bytes": FLOAT32, **kw}
    builder.add(family, f"{prefix}.A_log", v_heads, **a_log)
    builder.norm(f"{prefix}.norm", layer, v_head_dim, **kw)
    builder.row(family, f"{prefix}.out_proj", hidden, value_dim, layer, **kw)


def sparse_moe(builder: Builder, prefix: str, layer: int, **kw: Any) -> None:
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


def ungated_mlp(builder: Builder, prefix: str, layer: int, size: int, family: str, bias: bool) -> None:
    """An ungated MLP (``up_proj`` then ``down_proj``), as Nemotron-H's squared-ReLU MLPs and shared experts."""
    builder.column(family, f"{prefix}.up_proj", size, builder.hidden, layer, bias)
    builder.row(family, f"{prefix}.down_proj", builder.hidden, size, layer, bias)


def mamba2(builder: Builder, prefix: str, layer: int) -> None:
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
    rank_inter, rank_heads = split(intermediate, tp), split(mamba_heads, tp)
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


def mamba1(builder: Builder, prefix: str, layer: int) -> None:
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
    rank_inner = split(inner, tp)
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


def routed_moe(builder: Builder, prefix: str, layer: int, **kw: Any) -> None:
    """DeepSeek's MoE layout (``DeepseekV2MoE``): a router over ``n_routed_experts`` (with its float32
    ``e_score_correction_bias`` under ``topk_method: noaux_tc``), the experts of ``moe_intermediate_size`` and
    ``n_shared_experts`` shared experts fused into one MLP."""
    reader = builder.reader
    hidden = builder.hidden
    experts = reader.integer("n_routed_experts")
    moe_intermediate = reader.integer("moe_intermediate_size")
    builder.replicated("moe_router", f"{prefix}.gate", experts, hidden, layer, linear=False, **kw)
    if reader.string("topk_method", "") == "noaux_tc":
        # float32 in the checkpoint and in SGLang's MoEGate (sglang/srt/models/deepseek_v2.py).
        bias = f"{prefix}.gate.e_score_correction_bias"
        builder.add("moe_router", bias, experts, layer=layer, element_bytes=4, **kw)
    builder.experts(f"{prefix}.experts", layer, experts, moe_intermediate, **kw)
    shared = reader.integer("n_shared_experts", 0, minimum=0)
    if shared:
        family = "moe_shared_experts"
        builder.dense_mlp(f"{prefix}.shared_experts", layer, moe_intermediate * shared, family=family, **kw)
