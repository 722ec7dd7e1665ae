"""Hypothesis strategies: dense MHA/GQA models and the serving options SGLang sizes them under."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import strategies as st

from kvpools_core.values import LayerSpec, ModelSpec, Serving

GiB = 1 << 30
MiB = 1 << 20

HEAD_DIMS = (64, 80, 96, 128, 192, 256)
KV_DTYPES = ("auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1")
PAGE_SIZES = (1, 16, 64, 128)
MODEL_DTYPES = ("bfloat16", "float16", "float32")  # the dtype a ModelSpec is served in

SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "NEXTN", "DFLASH", "DSPARK", "NGRAM")
ARCHITECTURES = (
    ("LlamaForCausalLM", "llama"),
    ("Qwen2ForCausalLM", "qwen2"),
    ("Qwen3ForCausalLM", "qwen3"),
    ("Qwen3MoeForCausalLM", "qwen3_moe"),
    ("MistralForCausalLM", "mistral"),
    ("MiniMaxM2ForCausalLM", "minimax_m2"),
)

# Any budget from 1 B to 200 GiB, log-uniform so every scale (and "not one page") shows up.
budgets = st.sampled_from(range(38)).flatmap(lambda e: st.integers(1 << e, min(200 * GiB, (2 << e) - 1)))


def log_integers(max_exponent: int) -> st.SearchStrategy[int]:
    """Integers in [1, 2**(max_exponent + 1)), every binary order of magnitude equally likely."""
    return st.sampled_from(range(max_exponent + 1)).flatmap(lambda e: st.integers(1 << e, (2 << e) - 1))


def aimed_budgets(model: ModelSpec) -> st.SearchStrategy[int]:
    """Budgets aimed at the model (1 to 8M tokens of its unsharded bf16 KV, ± a few bytes), any budget, 200 GiB."""
    layer = model.layers[0]
    rough = model.num_layers * layer.num_kv_heads * (layer.head_dim + layer.v_head_dim) * 2
    tokens = log_integers(22)
    aimed = st.tuples(tokens, st.integers(-64, 64)).map(lambda t: min(200 * GiB, max(0, t[0] * rough + t[1])))
    return st.one_of(aimed, budgets, st.just(200 * GiB))


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def dense_models(draw: st.DrawFn, *, min_layers: int = 1, max_layers: int = 128, multimodal: bool = False) -> ModelSpec:
    """A uniform MHA/GQA model: 1–128 layers, 1–64 KV heads (attention heads a multiple), SGLang's head dims."""
    num_layers = draw(st.integers(min_layers, max_layers))
    kv_heads = draw(st.one_of(st.sampled_from((1, 2, 4, 8, 16, 32, 64)), st.integers(1, 64)))
    group = draw(st.integers(1, 8))
    head_dim = draw(st.sampled_from(HEAD_DIMS))
    v_head_dim = draw(st.one_of(st.just(head_dim), st.sampled_from(HEAD_DIMS)))
    arch, model_type = draw(st.sampled_from(ARCHITECTURES))
    context_len = draw(st.one_of(st.sampled_from((2048, 4096, 32768, 40960, 131072, 196608)), st.integers(16, 1 << 21)))
    layers = [
        LayerSpec(index=i, kind="attention", num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_head_dim)
        for i in range(num_layers)
    ]
    return ModelSpec(
        name="hypothesis-dense",
        architecture="mha",
        layers=layers,
        context_len=context_len,
        dtype=draw(st.sampled_from(MODEL_DTYPES)),
        num_attention_heads=kv_heads * group,
        model_type=model_type,
        hf_architectures=(arch,),
        num_nextn_predict_layers=draw(st.integers(0, 3)),
        is_multimodal=multimodal,
    )


def splits_heads(model: ModelSpec, attn_tp: int) -> bool:
    """The engines' QKV projections: query heads divide evenly; KV heads divide or are replicated."""
    if model.num_attention_heads and model.num_attention_heads % attn_tp:
        return False
    kv_heads = {layer.num_kv_heads for layer in model.layers if layer.num_kv_heads > 1}
    return all(kv % attn_tp == 0 or attn_tp % kv == 0 for kv in kv_heads)


@st.composite
def parallel_options(draw: st.DrawFn, model: ModelSpec) -> dict[str, Any]:
    """TP 1–16 (TP above the KV heads included), DP attention 2/4/8, and now and then CP / DCP;
    the attention-TP size always splits the model's heads (other sizes fail at model load)."""
    if draw(st.booleans()):
        dp = draw(st.sampled_from((2, 4, 8)))
        tp = dp * draw(st.sampled_from([k for k in (1, 2, 4) if dp * k <= 16]))
        dp_attention = True
    else:
        dp = draw(st.sampled_from((1, 1, 1, 2, 4)))  # plain DP: independent replicas
        tp = draw(st.sampled_from([t for t in range(1, 17) if any(splits_heads(model, t // c) for c in divisors(t))]))
        dp_attention = False
    rest = tp // (dp if dp_attention else 1)
    cps = [c for c in divisors(rest) if splits_heads(model, rest // c)]  # never empty: rest // rest == 1
    cp = draw(st.sampled_from(cps)) if 1 not in cps else draw(st.one_of(st.just(1), st.sampled_from(cps)))
    dcp = draw(st.one_of(st.just(1), st.sampled_from(divisors(rest // cp))))
    return {"tp_size": tp, "dp_size": dp, "enable_dp_attention": dp_attention, "attn_cp_size": cp, "dcp_size": dcp}


@st.composite
def speculative_options(draw: st.DrawFn, model: ModelSpec, *, always: bool = False) -> dict[str, Any]:
    algorithm = draw(
        st.sampled_from(SPEC_ALGORITHMS) if always else st.one_of(st.none(), st.sampled_from(SPEC_ALGORITHMS))
    )
    if algorithm is None:
        return {}
    options: dict[str, Any] = {
        "speculative_algorithm": algorithm,
        "speculative_num_steps": draw(st.integers(1, 8)),
        "speculative_eagle_topk": draw(st.sampled_from((1, 2, 4, 8))),
        "speculative_num_draft_tokens": draw(st.integers(1, 16)),
    }
    # what SGLang 0.5.23 runs (issue 32; kvpools refuses the values its handlers would override): top-k 1 makes
    # EAGLE's draft tokens steps + 1, NGRAM's top-k is its BFS breadth 10, DFLASH's steps and top-k are 1
    if algorithm in ("EAGLE", "EAGLE3", "STANDALONE", "NEXTN") and options["speculative_eagle_topk"] == 1:
        options["speculative_num_draft_tokens"] = options["speculative_num_steps"] + 1
    elif algorithm == "NGRAM":
        options["speculative_eagle_topk"] = 10
    elif algorithm == "DFLASH":
        options |= {"speculative_num_steps": 1, "speculative_eagle_topk": 1}
    draft = draw(st.integers(1, 8))
    if algorithm == "NEXTN" and model.num_nextn_predict_layers and draw(st.booleans()):
        draft = None  # the model's own MTP layers are the draft
    if algorithm == "NGRAM" and draw(st.booleans()):
        draft = None
    options["speculative_draft_num_layers"] = draft
    return options


def pp_partitions(num_layers: int, pp_size: int) -> st.SearchStrategy[tuple[int, ...] | None]:
    """None (SGLang's even split) or an explicit SGLANG_PP_LAYER_PARTITION with no empty stage."""

    def to_sizes(cuts: list[int]) -> tuple[int, ...]:
        bounds = [0, *sorted(cuts), num_layers]
        return tuple(b - a for a, b in itertools.pairwise(bounds))

    cuts = st.lists(st.integers(1, num_layers - 1), min_size=pp_size - 1, max_size=pp_size - 1, unique=True)
    return st.one_of(st.none(), cuts.map(to_sizes))


@st.composite
def serving_options(
    draw: st.DrawFn,
    model: ModelSpec,
    *,
    pp: bool = False,
    speculative: bool | None = None,
    caps: bool = True,
) -> Serving:
    """Serving for ``model``: KV dtype, page, parallelism, caps, disaggregation, speculation."""
    options: dict[str, Any] = {
        "kv_cache_dtype": draw(st.sampled_from(KV_DTYPES)),
        "page_size": draw(st.sampled_from(PAGE_SIZES)),
        **draw(parallel_options(model)),
    }
    if pp:
        pp_size = draw(st.integers(2, min(4, model.num_layers)))
        options["pp_size"] = pp_size
        options["pp_layer_partition"] = draw(pp_partitions(model.num_layers, pp_size))
    if draw(st.integers(0, 4)) == 0:
        options["context_length"] = draw(st.integers(16, 1 << 20))
    if caps:
        requests = draw(st.one_of(st.none(), log_integers(13)))
        width = options["dp_size"] if options["enable_dp_attention"] else 1
        options["max_running_requests"] = None if requests is None else max(requests, width)
        options["max_total_tokens"] = draw(st.one_of(st.none(), st.none(), log_integers(22)))
    if draw(st.integers(0, 5)) == 0:
        options["disaggregation_mode"] = draw(st.sampled_from(("prefill", "decode")))
        options["disaggregation_decode_extra_slots"] = draw(st.integers(0, 64))
    if speculative is not False:
        options.update(draw(speculative_options(model, always=bool(speculative))))
    if options.get("speculative_algorithm") == "DSPARK":
        options.update(dspark_options(draw, options))
    return Serving(accounting="sglang", **options)


def dspark_options(draw: st.DrawFn, options: dict[str, Any]) -> dict[str, Any]:
    """What SGLang's ``_handle_dspark`` lets through: top-k and steps 1, gamma + 1 >= 2 draft tokens; PP only on a
    PD prefill node and no context-parallel attention under DP attention (else the draw plays DFLASH instead)."""
    pp_refused = options.get("pp_size", 1) > 1 and options.get("disaggregation_mode") != "prefill"
    cp_refused = options["enable_dp_attention"] and options["dp_size"] > 1 and options["attn_cp_size"] > 1
    if pp_refused or cp_refused:
        return {"speculative_algorithm": "DFLASH", "speculative_num_steps": 1, "speculative_eagle_topk": 1}
    return {
        "speculative_num_steps": 1,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": draw(st.integers(2, 16)),
    }
