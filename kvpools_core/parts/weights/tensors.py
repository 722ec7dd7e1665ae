"""The tensors of a model, their shapes on one rank, and the builder an architecture plugin fills.

:class:`Builder` is the parts library's weights vocabulary: an architecture plugin reads its config and calls
:meth:`Builder.column` / :meth:`Builder.row` / :meth:`Builder.replicated` (one Linear, sharded as SGLang shards
it), :meth:`Builder.gqa_attention`, :meth:`Builder.dense_mlp`, :meth:`Builder.experts`,
:meth:`Builder.embeddings` and :meth:`Builder.norm`; :func:`kvpools_core.parts.weights.estimate` sums what it
collected.
"""

from __future__ import annotations

import math
from typing import Any

import attrs

from kvpools_core.config import ConfigReader
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parallel import kv_heads_per_rank
from kvpools_core.parts.weights.quantisation import Quantisation

__all__ = ["Builder", "Sharding", "Tensor", "expert_intermediate_per_rank", "split", "vocab_rows_per_rank"]


@attrs.frozen
class Tensor:
    """One weight (``count`` stacked copies of ``out × inner``), its shape on a rank, and where it lives."""

    family: str
    module: str
    out: int
    inner: int = 1
    count: int = 1
    rank_out: int | None = None
    rank_inner: int | None = None
    rank_count: int | None = None
    layer: int | None = None  # decoder layer index; None for embedding/head/final norm
    stage: str = "all"  # "first" / "last" for tensors outside the layers
    linear: bool = False  # a Linear weight, which a quantization_config may quantise
    mtp: bool = False
    element_bytes: int | None = None  # a dtype of its own (float32 router biases) instead of the model's

    @property
    def parameters(self) -> int:
        return self.count * self.out * self.inner

    def on_rank(self) -> tuple[int, int, int]:
        return (
            self.out if self.rank_out is None else self.rank_out,
            self.inner if self.rank_inner is None else self.rank_inner,
            self.count if self.rank_count is None else self.rank_count,
        )


@attrs.frozen
class Sharding:
    """How SGLang splits the model over one engine's ranks.

    ``attn_dp`` is the DP-attention width (``Serving.attn_dp_size``): the attention layers (and, in the models that
    support DP attention, the input embedding) shard over the attention-TP group of ``tp / attn_dp`` ranks
    (``derive_attn_tp_size``, sglang/srt/runtime_context.py), while experts, dense MLPs and the LM head keep TP/EP.
    """

    tp: int
    ep: int
    pp: int
    pp_rank: int
    partition: tuple[int, ...] | None
    attn_dp: int = 1
    engine: str = "sglang"  # whose module layout: "vllm" under --accounting vllm, else SGLang's

    @property
    def moe_tp(self) -> int:
        return self.tp // self.ep

    @property
    def attn_tp(self) -> int:
        """SGLang's ``attn_tp_size = tp_size // attn_dp_size // attn_cp_size`` (attention CP is not modelled)."""
        return self.tp // self.attn_dp

    def group(self, family: str) -> int:
        """The ranks a ``family``'s column/row-parallel Linears split over: attention's over attention TP."""
        return self.attn_tp if family == "attention" else self.tp


def split(total: int, parts: int) -> int:
    """One rank's share of a dimension split ``parts`` ways (the last share may be short; the first is full)."""
    return math.ceil(total / parts)


def vocab_rows_per_rank(vocab: int, tp: int) -> int:
    """Embedding / LM-head rows on one rank: SGLang pads the vocabulary to a multiple of 64, or of ``64 * tp``
    when that does not split evenly (``VocabParallelEmbedding.__init__``, sglang/srt/layers/vocab_parallel_embedding.py,
    ``DEFAULT_VOCAB_PADDING_SIZE = 64``), then divides it over TP."""
    padded = math.ceil(vocab / 64) * 64
    if padded % tp:
        padded = math.ceil(vocab / (64 * tp)) * 64 * tp
    return padded // tp


def expert_intermediate_per_rank(intermediate: int, sharding: Sharding) -> int:
    """SGLang's ``FusedMoE`` asserts the expert intermediate size divides over ``moe_tp_size = tp / ep``."""
    if intermediate % sharding.moe_tp:
        raise UnsupportedCombinationError(
            f"The expert intermediate size {intermediate} does not split over tp / ep = {sharding.moe_tp} "
            f"(SGLang's FusedMoE asserts it does)."
        )
    return intermediate // sharding.moe_tp


class Builder:
    """Collects the tensors of one model with their per-rank shapes."""

    def __init__(self, reader: ConfigReader, sharding: Sharding, outer: ConfigReader | None = None) -> None:
        self.reader = reader
        self.outer = outer or reader  # the top-level config, when the text model nests under text_config
        # How the routed experts are stored when the checkpoint keeps them apart from quantization_config
        # (DeepSeek-V4's ``expert_dtype: fp4``); set by the architecture.
        self.expert_storage: Quantisation | None = None
        self.sharding = sharding
        self.tensors: list[Tensor] = []
        self.hidden = reader.integer("hidden_size")

    def add(self, family: str, module: str, out: int, inner: int = 1, **kwargs: Any) -> None:
        self.tensors.append(Tensor(family, module, out, inner, **kwargs))

    def norm(self, module: str, layer: int | None, size: int | None = None, **kwargs: Any) -> None:
        self.add("norms", module, size or self.hidden, layer=layer, **kwargs)

    def column(self, family: str, module: str, out: int, inner: int, layer: int, bias: bool = False, **kw: Any) -> None:
        """A column-parallel Linear: output features split over TP, attention TP for ``family`` ``attention``
        (``parallel_group="attn_tp"`` in SGLang's attention modules); a bias splits with them."""
        rank_out = split(out, self.sharding.group(family))
        self.add(family, module, out, inner, rank_out=rank_out, layer=layer, linear=True, **kw)
        if bias:
            self.add(family, f"{module}.bias", out, rank_out=rank_out, layer=layer, **kw)

    def row(self, family: str, module: str, out: int, inner: int, layer: int, bias: bool = False, **kw: Any) -> None:
        """A row-parallel Linear: input features split over TP, or attention TP as :meth:`column` (the bias is whole
        on every rank)."""
        rank_inner = split(inner, self.sharding.group(family))
        self.add(family, module, out, inner, rank_inner=rank_inner, layer=layer, linear=True, **kw)
        if bias:
            self.add(family, f"{module}.bias", out, layer=layer, **kw)

    def replicated(self, family: str, module: str, out: int, inner: int, layer: int, **kw: Any) -> None:
        """A Linear kept whole on every rank; routers pass ``linear=False`` as checkpoints keep them unquantised."""
        self.add(family, module, out, inner, layer=layer, **{"linear": True, **kw})

    def embeddings(self, tied: bool) -> None:
        """The input embedding, final norm and LM head.

        Under DP attention the embedding splits its vocabulary over attention TP (``use_attn_tp_group=
        is_dp_attention_enabled()``: ``get_embedding_tp_kwargs`` in sglang/srt/layers/vocab_parallel_embedding.py for
        DeepSeek, ``Qwen2Model`` / ``Qwen2MoeModel`` / ``GptOssModel`` in sglang/srt/models/qwen2.py, qwen2_moe.py,
        gpt_oss.py); the LM head keeps full TP (``use_attn_tp_group=enable_dp_lm_head``, off by default and not a
        ``Serving`` field).  A tied head on one stage is the embedding itself.
        """
        vocab = self.reader.integer("vocab_size")
        rank_vocab = vocab_rows_per_rank(vocab, self.sharding.tp)
        embedding_rows = vocab_rows_per_rank(vocab, self.sharding.attn_tp)
        self.add("embedding", "model.embed_tokens", vocab, self.hidden, rank_out=embedding_rows, stage="first")
        self.norm("model.norm", None, stage="last")
        if not tied:
            self.add("lm_head", "lm_head", vocab, self.hidden, rank_out=rank_vocab, stage="last")
        elif self.sharding.pp > 1:
            # SGLang's last stage keeps its own copy of a tied head; the checkpoint stores it once (out=0:
            # no parameters of its own, only the rows on the rank).
            self.add("lm_head", "lm_head", 0, self.hidden, rank_out=rank_vocab, stage="last")

    def gqa_attention(
        self,
        prefix: str,
        layer: int,
        head_dim: int,
        bias: bool,
        out_bias: bool,
        *,
        heads: int | None = None,
        kv_heads: int | None = None,
        gated: bool = False,
        v_head_dim: int | None = None,
        **kw: Any,
    ) -> None:
        """Grouped-query attention over attention TP; KV heads replicate once it exceeds them (SGLang's
        ``QKVParallelLinear(parallel_group="attn_tp")``, ``num_kv_heads = max(1, total_num_kv_heads // attn_tp_size)``
        in sglang/srt/models/qwen3_moe.py ``Qwen3MoeAttention.__init__`` and gpt_oss.py ``GptOssAttention``).

        ``gated`` doubles ``q_proj`` for the per-head output gate of Qwen3-Next / Qwen3.5 (``attn_output_gate``);
        ``v_head_dim`` narrows ``v_proj`` and ``o_proj`` (MiMo-V2-Flash's 128 against its 192 q/k head).
        """
        heads = heads or self.reader.integer("num_attention_heads")
        kv_heads = kv_heads or self.reader.integer("num_key_value_heads", heads)
        tp = self.sharding.attn_tp
        q_out = heads * head_dim * (2 if gated else 1)
        self.column("attention", f"{prefix}.q_proj", q_out, self.hidden, layer, bias, **kw)
        v_dim = v_head_dim or head_dim
        rank_kv_heads = kv_heads_per_rank(kv_heads, tp)
        for name, dim in (("k_proj", head_dim), ("v_proj", v_dim)):
            module = f"{prefix}.{name}"
            shape = {"rank_out": rank_kv_heads * dim, "layer": layer, **kw}
            self.add("attention", module, kv_heads * dim, self.hidden, linear=True, **shape)
            if bias:
                self.add("attention", f"{module}.bias", kv_heads * dim, **shape)
        self.row("attention", f"{prefix}.o_proj", self.hidden, heads * v_dim, layer, out_bias, **kw)

    def dense_mlp(
        self, prefix: str, layer: int, intermediate: int, family: str = "mlp", bias: bool = False, **kw: Any
    ) -> None:
        """A SwiGLU MLP: ``gate``/``up`` column-parallel, ``down`` row-parallel."""
        self.column(family, f"{prefix}.gate_proj", intermediate, self.hidden, layer, bias, **kw)
        self.column(family, f"{prefix}.up_proj", intermediate, self.hidden, layer, bias, **kw)
        self.row(family, f"{prefix}.down_proj", self.hidden, intermediate, layer, bias, **kw)

    def experts(
        self,
        prefix: str,
        layer: int,
        experts: int,
        intermediate: int,
        gated: bool = True,
        names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
        **kw: Any,
    ) -> None:
        """``experts`` SwiGLU experts (``gated=False``: up and down only): ``E / ep`` of them per rank, each
        intermediate split over ``tp / ep``. ``names`` are the checkpoint's gate, up and down names (Mixtral's
        ``w1``, ``w3``, ``w2``)."""
        sharding = self.sharding
        if experts % sharding.ep:
            raise UnsupportedCombinationError(
                f"{experts} experts do not split over ep_size {sharding.ep}; SGLang needs ep_size to divide them."
            )
        rank_count = experts // sharding.ep
        rank_inter = expert_intermediate_per_rank(intermediate, sharding)
        shape = {"count": experts, "rank_count": rank_count, "layer": layer, "linear": True, **kw}
        gate, up, down = names
        if gated:
            self.add("moe_experts", f"{prefix}.{gate}", intermediate, self.hidden, rank_out=rank_inter, **shape)
        self.add("moe_experts", f"{prefix}.{up}", intermediate, self.hidden, rank_out=rank_inter, **shape)
        self.add("moe_experts", f"{prefix}.{down}", self.hidden, intermediate, rank_inner=rank_inter, **shape)
