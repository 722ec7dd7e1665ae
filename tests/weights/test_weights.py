"""The weights estimate against published parameter counts and hand-computed shardings and bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvpools_core import ConfigError, Serving, UnsupportedCombinationError, estimate_weights

CONFIGS = Path(__file__).parent / "configs"  # sources in configs/README.md


def config(name: str) -> str:
    return str(CONFIGS / f"{name}.json")


# (config, what the source counts, published parameters, source).  Counts include the embeddings and an untied head,
# as the model cards and Hugging Face's safetensors metadata state them.
PUBLISHED = [
    ("meta-llama--Meta-Llama-3.1-8B", "all", 8.03e9, "huggingface.co/meta-llama/Llama-3.1-8B: 8.03B params"),
    ("meta-llama--Meta-Llama-3.1-70B", "all", 70.6e9, "huggingface.co/meta-llama/Llama-3.1-70B: 70.6B params"),
    ("Qwen--Qwen3-8B", "all", 8.2e9, "huggingface.co/Qwen/Qwen3-8B card: Number of Parameters 8.2B"),
    ("Qwen--Qwen3-30B-A3B", "all", 30.5e9, "huggingface.co/Qwen/Qwen3-30B-A3B card: 30.5B in total"),
    ("Qwen--Qwen3-235B-A22B", "all", 235e9, "huggingface.co/Qwen/Qwen3-235B-A22B card: 235B in total"),
    # The card: "685B, which includes 671B of the Main Model weights and 14B of the MTP Module weights".
    ("deepseek-ai--DeepSeek-V3", "main", 671e9, "huggingface.co/deepseek-ai/DeepSeek-V3 card: 671B main model"),
    ("deepseek-ai--DeepSeek-V3", "all", 685e9, "huggingface.co/deepseek-ai/DeepSeek-V3 card: 685B with MTP"),
    ("openai--gpt-oss-120b", "all", 116.83e9, "gpt-oss model card (arXiv:2508.10925) table 1: 116.83B total"),
    ("openai--gpt-oss-20b", "all", 20.91e9, "gpt-oss model card (arXiv:2508.10925) table 1: 20.91B total"),
    ("google--gemma-2-9b", "all", 9.24e9, "huggingface.co/google/gemma-2-9b: 9.24B params"),
    ("mistralai--Mistral-7B-v0.1", "all", 7.24e9, "huggingface.co/mistralai/Mistral-7B-v0.1: 7.24B params"),
    ("Qwen--Qwen2-7B", "all", 7.62e9, "huggingface.co/Qwen/Qwen2-7B: 7.62B params"),
    ("deepseek-ai--DeepSeek-V2-Lite", "all", 15.7e9, "huggingface.co/deepseek-ai/DeepSeek-V2-Lite: 15.7B params"),
]


@pytest.mark.parametrize(
    ("name", "counted", "published", "source"), PUBLISHED, ids=[f"{p[0]}-{p[1]}" for p in PUBLISHED]
)
def test_parameters_match_the_published_count(name: str, counted: str, published: float, source: str) -> None:
    estimate = estimate_weights(config(name))
    parameters = estimate.parameters if counted == "all" else estimate.parameters_without_mtp
    assert parameters == pytest.approx(published, rel=0.01), source


@pytest.mark.parametrize(
    ("name", "published"),
    [("Qwen--Qwen3-8B", 6.95e9), ("Qwen--Qwen3-30B-A3B", 29.9e9), ("Qwen--Qwen3-235B-A22B", 234e9)],
)
def test_non_embedding_parameters_match_the_qwen3_cards(name: str, published: float) -> None:
    """The Qwen3 cards also state "Number of Parameters (Non-Embedding)" (embedding and untied head left out)."""
    families = estimate_weights(config(name)).parameters_by_family
    assert sum(families.values()) - families["embedding"] - families["lm_head"] == pytest.approx(published, rel=0.01)


def test_gpt_oss_20b_mxfp4_bytes_by_hand() -> None:
    """Experts in mxfp4 (half a byte per value, a one-byte scale per 32), everything else bf16 (the config's
    ``modules_to_not_convert``: attention, router, embeddings, head); the card's checkpoint is 12.8 GiB."""
    hidden, layers, heads, kv_heads, head_dim, experts, inter, vocab = 2880, 24, 64, 8, 64, 32, 2880, 201088
    attention = 2 * heads * head_dim * hidden + heads * head_dim + hidden  # q, o and their biases
    attention += 2 * (kv_heads * head_dim * hidden + kv_heads * head_dim) + heads  # k, v, biases, sinks
    bf16_per_layer = attention + 2 * hidden + experts * hidden + experts + experts * (2 * inter + hidden)
    mxfp4_per_layer = experts * (2 * inter + hidden) * (hidden // 2 + hidden // 32)
    expected = layers * (2 * bf16_per_layer + mxfp4_per_layer) + 2 * (2 * vocab * hidden + hidden)
    estimate = estimate_weights(config("openai--gpt-oss-20b"))
    assert estimate.bytes_total == expected == estimate.bytes_per_rank
    assert expected / 2**30 == pytest.approx(12.8, rel=0.01)
    assert estimate_weights(config("openai--gpt-oss-120b")).bytes_total / 2**30 == pytest.approx(60.8, rel=0.01)
    assert estimate.dtypes["attention"] == "bfloat16"
    assert "mxfp4" in estimate.dtypes["moe_experts"]


def test_fp8_block_scales_round_up_by_hand() -> None:
    """fp8 weights are a byte each plus a float32 scale per started 128x128 block; norms and embeddings stay bf16."""
    tiny = {
        "model_type": "llama",
        "hidden_size": 200,
        "intermediate_size": 300,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 100,
        "num_hidden_layers": 1,
        "vocab_size": 1000,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]},
    }
    q = o = 200 * 200 + 4 * 2 * 2
    k = v = 100 * 200 + 4 * 1 * 2
    gate = up = 300 * 200 + 4 * 3 * 2
    down = 200 * 300 + 4 * 2 * 3
    bf16 = 2 * (2 * 200 + 1000 * 200 + 200 + 1000 * 200)  # two layer norms, embedding, final norm, head
    estimate = estimate_weights(tiny)
    assert estimate.bytes_total == q + k + v + o + gate + up + down + bf16
    assert estimate.parameters == 200 * 200 * 2 + 2 * 100 * 200 + 3 * 300 * 200 + 2 * 200 + 2 * 1000 * 200 + 200
    # On the GPU SGLang pads the vocabulary to a multiple of 64: 1024 rows of embedding and of head.
    assert estimate.bytes_per_rank == estimate.bytes_total + 2 * 2 * 24 * 200


def test_vocabulary_pads_to_64_times_tp_when_64_does_not_split() -> None:
    """Vocab 1000 at TP 3: 1024 does not split in 3, so SGLang pads to a multiple of 192 (1152), 384 rows a rank."""
    tiny = {
        "model_type": "qwen3",
        "hidden_size": 192,
        "intermediate_size": 384,
        "num_attention_heads": 3,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "num_hidden_layers": 1,
        "vocab_size": 1000,
        "tie_word_embeddings": True,
    }
    sharded = 4 * 64 * 192 + 3 * 128 * 192  # a third of q, k, v, o and of gate, up, down
    norms = 2 * 64 + 2 * 192  # q/k norms and the two layer norms, whole on every rank
    estimate = estimate_weights(tiny, Serving(tp_size=3))
    assert estimate.bytes_per_rank == 2 * (sharded + norms + 384 * 192 + 192)  # the tied head shares the embedding
    assert estimate.parameters == 3 * sharded + norms + 1000 * 192 + 192


def test_deepseek_v3_quantises_linears_not_router_and_leaves_mtp_off_the_rank() -> None:
    estimate = estimate_weights(config("deepseek-ai--DeepSeek-V3"))
    assert estimate.dtypes["moe_experts"] == "float8_e4m3 + float32 scale per 128x128 block"
    assert estimate.dtypes["embedding"] == "bfloat16"
    assert estimate.dtypes["moe_router"] == "bfloat16; float32"  # the gate, and its float32 e_score_correction_bias
    hidden, vocab = 7168, 129280
    # The MTP layer: a MoE decoder layer, its eh_proj, three norms and its own embedding and head copies.
    assert estimate.parameters_by_family["mtp"] > 2 * vocab * hidden + 2 * hidden * hidden
    per_rank = estimate_weights(config("deepseek-ai--DeepSeek-V3"), Serving(tp_size=8), ep_size=8)
    assert per_rank.bytes_per_rank < estimate.bytes_total / 8


def test_dense_tp_and_pp_sharding_by_hand() -> None:
    """Llama-3.1-8B at TP 2 x PP 2: 16 layers a stage, heads and MLP halved, the vocab halved at each end."""
    hidden, inter, head_dim, vocab = 4096, 14336, 128, 128256
    layer = 16 * head_dim * hidden * 2 + 4 * head_dim * hidden * 2 + 3 * inter // 2 * hidden + 2 * hidden
    first = estimate_weights(config("meta-llama--Meta-Llama-3.1-8B"), Serving(tp_size=2, pp_size=2, pp_rank=0))
    last = estimate_weights(config("meta-llama--Meta-Llama-3.1-8B"), Serving(tp_size=2, pp_size=2, pp_rank=1))
    assert first.bytes_per_rank == 2 * (16 * layer + vocab // 2 * hidden)
    assert last.bytes_per_rank == 2 * (16 * layer + vocab // 2 * hidden + hidden)


def test_kv_heads_replicate_when_tp_exceeds_them() -> None:
    """8 KV heads at TP 16: every rank keeps one whole KV head (SGLang's QKVParallelLinear replication)."""
    hidden, inter, head_dim, vocab = 4096, 14336, 128, 128256
    layer = 2 * head_dim * hidden * 2 + 1 * head_dim * hidden * 2 + 3 * inter // 16 * hidden + 2 * hidden
    estimate = estimate_weights(config("meta-llama--Meta-Llama-3.1-8B"), Serving(tp_size=16))
    assert estimate.bytes_per_rank == 2 * (32 * layer + 2 * (vocab // 16) * hidden + hidden)


@pytest.mark.parametrize("ep_size", [1, 2, 4])
def test_moe_expert_and_tensor_parallel_sharding_by_hand(ep_size: int) -> None:
    """Qwen3-30B-A3B at TP 4: 128 experts of 768 split as E/ep experts x 768/(tp/ep) hold the same bytes."""
    hidden, layers, head_dim, experts, inter, vocab = 2048, 48, 128, 128, 768, 151936
    attention = 2 * (32 // 4) * head_dim * hidden + 2 * (4 // 4) * head_dim * hidden + 2 * head_dim
    layer = attention + 2 * hidden + experts * hidden + experts // 4 * 3 * inter * hidden
    estimate = estimate_weights(config("Qwen--Qwen3-30B-A3B"), Serving(tp_size=4), ep_size=ep_size)
    assert estimate.bytes_per_rank == 2 * (layers * layer + 2 * (vocab // 4) * hidden + hidden)


def test_expert_parallelism_must_divide_tp_and_experts() -> None:
    with pytest.raises(UnsupportedCombinationError, match="ep_size 3 must divide tp_size 4"):
        estimate_weights(config("Qwen--Qwen3-30B-A3B"), Serving(tp_size=4), ep_size=3)
    with pytest.raises(UnsupportedCombinationError, match="128 experts do not split over ep_size 3"):
        estimate_weights(config("Qwen--Qwen3-30B-A3B"), Serving(tp_size=6), ep_size=3)


def test_unknown_architecture_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"field 'model_type' is 'falcon_h1'.*not guessed"):
        estimate_weights({"model_type": "falcon_h1", "hidden_size": 1024})


def test_unknown_quantisation_is_refused_naming_the_field() -> None:
    llama = {**_read("meta-llama--Meta-Llama-3.1-8B"), "quantization_config": {"quant_method": "hqq"}}
    with pytest.raises(ConfigError, match=r"'quantization_config.quant_method' is 'hqq'"):
        estimate_weights(llama)


def test_a_kv_only_preset_is_refused_naming_the_missing_shape() -> None:
    """A preset that keeps only KV fields and names no complete config: the estimate names the first shape it
    lacks instead of guessing."""
    with pytest.raises(ConfigError, match=r"preset:mistral-7b-v0.1: field 'intermediate_size' is missing"):
        estimate_weights("mistral-7b-v0.1")


@pytest.mark.parametrize(
    ("preset", "full"),
    [
        ("llama-3.1-8b", "meta-llama--Meta-Llama-3.1-8B"),
        ("deepseek-v3", "deepseek-ai--DeepSeek-V3"),
        ("gpt-oss-120b", "openai--gpt-oss-120b"),
        ("qwen3-next-80b-a3b-thinking", "Qwen--Qwen3-Next-80B-A3B-Thinking"),
    ],
)
def test_a_preset_reads_the_complete_config_it_names(preset: str, full: str) -> None:
    """``_weights_config`` points a KV-only preset at the complete config.json it was excerpted from."""
    serving = Serving(tp_size=4)
    by_preset = estimate_weights(preset, serving)
    by_config = estimate_weights(_read(full), serving)
    assert by_preset.parameters == by_config.parameters
    assert by_preset.bytes_per_rank == by_config.bytes_per_rank
    assert by_preset.model.startswith(f"preset:{preset}")


def _fp8(out: int, inner: int) -> int:
    """DeepSeek-V3's fp8 Linear: a byte a weight and a float32 scale per started 128x128 block."""
    return out * inner + 4 * -(-out // 128) * -(-inner // 128)


def _deepseek_v3_attention_and_embedding(attn_tp: int) -> int:
    """The bytes of DeepSeek-V3 that DP attention moves onto attention TP: per layer ``q_b_proj`` (128 heads x 192
    from the 1536 latent), ``kv_b_proj`` (128 x (128 + 128) from 512) and ``o_proj`` (7168 from 128 x 128), all
    fp8, over ``attn_tp``; and the bf16 embedding, 129280 rows (a multiple of 64 that splits evenly) over it."""
    heads, hidden, vocab, layers = 128, 7168, 129280, 61
    layer = (
        _fp8(heads * 192 // attn_tp, 1536) + _fp8(heads * 256 // attn_tp, 512) + _fp8(hidden, heads * 128 // attn_tp)
    )
    return layers * layer + 2 * vocab // attn_tp * hidden


@pytest.mark.parametrize("dp_size", [8, 2])
def test_deepseek_v3_dp_attention_shards_attention_and_embedding_over_attention_tp(dp_size: int) -> None:
    """DeepSeek-V3 at TP 8 with DP attention: MLA's q_b/kv_b/o and the embedding split over ``attn_tp = 8 / dp``
    (whole at DP 8); the replicated q_a/kv_a projections, experts, dense MLPs and the LM head are as at plain TP 8."""
    model = config("deepseek-ai--DeepSeek-V3")
    plain = estimate_weights(model, Serving(tp_size=8), ep_size=8).bytes_per_rank
    dp = Serving(tp_size=8, dp_size=dp_size, enable_dp_attention=True)
    estimate = estimate_weights(model, dp, ep_size=8)
    attn_tp = 8 // dp_size
    expected = plain - _deepseek_v3_attention_and_embedding(8) + _deepseek_v3_attention_and_embedding(attn_tp)
    assert estimate.bytes_per_rank == expected


def test_qwen3_235b_dp_attention_8_by_hand() -> None:
    """Qwen3-235B-A22B at TP 8, DP attention 8 (Qwen3MoeAttention on attn_tp 1): every rank holds whole attention
    (64 q heads, 4 KV heads of 128) and the whole 151936-row embedding (a multiple of 64), an eighth of each of the
    128 experts' 1536 intermediate and of the LM head, all bf16."""
    hidden, layers, head_dim, experts, inter, vocab = 4096, 94, 128, 128, 1536, 151936
    attention = 2 * 64 * head_dim * hidden + 2 * 4 * head_dim * hidden + 2 * head_dim
    layer = attention + 2 * hidden + experts * hidden + experts * 3 * (inter // 8) * hidden
    serving = Serving(tp_size=8, dp_size=8, enable_dp_attention=True)
    estimate = estimate_weights(config("Qwen--Qwen3-235B-A22B"), serving)
    assert estimate.bytes_per_rank == 2 * (layers * layer + vocab * hidden + vocab // 8 * hidden + hidden)


@pytest.mark.parametrize("name", ["deepseek-ai--DeepSeek-V3", "Qwen--Qwen3-235B-A22B", "openai--gpt-oss-120b"])
def test_dp_attention_1_is_the_plain_estimate(name: str) -> None:
    plain = estimate_weights(config(name), Serving(tp_size=8))
    one = estimate_weights(config(name), Serving(tp_size=8, dp_size=1, enable_dp_attention=True))
    assert one == plain


def test_gpt_oss_sinks_follow_attention_tp() -> None:
    """gpt-oss keeps one sink per local head (GptOssAttention.sinks): at attn_tp 1 all 64, at TP 8 eight."""
    model = config("openai--gpt-oss-120b")
    whole = estimate_weights(model, Serving(tp_size=8, dp_size=8, enable_dp_attention=True), ep_size=8)
    plain = estimate_weights(model, Serving(tp_size=8), ep_size=8)
    hidden, head_dim, layers, vocab = 2880, 64, 36, 201088
    # q (64 heads) and o grow from an eighth to whole; k/v (8 heads) from one head to eight; biases and sinks too.
    per_layer_growth = 7 * (2 * 8 * head_dim * hidden + 8 * head_dim + 2 * head_dim * hidden + 2 * head_dim + 8)
    embedding_growth = 7 * vocab // 8 * hidden
    assert whole.bytes_per_rank - plain.bytes_per_rank == 2 * (layers * per_layer_growth + embedding_growth)


def test_dp_attention_is_refused_where_sglang_attention_is_not_on_attention_tp() -> None:
    """Llama's SGLang attention (LlamaAttention) builds q/k/v on the full TP group: not modelled, refused."""
    with pytest.raises(UnsupportedCombinationError, match="enable_dp_attention only for"):
        estimate_weights(
            config("meta-llama--Meta-Llama-3.1-8B"), Serving(tp_size=2, dp_size=2, enable_dp_attention=True)
        )


def test_attention_context_parallelism_is_refused() -> None:
    with pytest.raises(UnsupportedCombinationError, match="attn_cp_size 2"):
        estimate_weights(config("Qwen--Qwen3-8B"), Serving(tp_size=2, attn_cp_size=2))


def _read(name: str) -> dict[str, object]:
    import json

    data: dict[str, object] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


def test_pipeline_stages_hold_their_layers_and_the_last_a_copy_of_a_tied_head() -> None:
    tiny = {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 3,
        "vocab_size": 640,
        "tie_word_embeddings": True,
    }
    layer = 4 * 128 * 128 + 3 * 256 * 128 + 2 * 128
    first, last = (estimate_weights(tiny, Serving(pp_size=2, pp_rank=rank)) for rank in (0, 1))
    assert first.bytes_per_rank == 2 * (1 * layer + 640 * 128)  # SGLang's last stage takes the odd layer
    assert last.bytes_per_rank == 2 * (2 * layer + 128 + 640 * 128)
    assert first.parameters == last.parameters == 3 * layer + 640 * 128 + 128
