"""The weights estimate of the hybrid, DSA, MiMo and MiniMax families and of NVFP4 / AWQ / GPTQ checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpools_core import ConfigError, Serving, UnsupportedCombinationError, estimate_weights

CONFIGS = Path(__file__).parent / "configs"  # sources in configs/README.md


def config(name: str) -> str:
    return str(CONFIGS / f"{name}.json")


def read(name: str) -> dict[str, object]:
    data: dict[str, object] = json.loads((CONFIGS / f"{name}.json").read_text())
    return data


# (config, what the source counts, published parameters, source).  "main" leaves out the MTP layers, as the cards
# of models that ship them separately count.
PUBLISHED = [
    ("deepseek-ai--DeepSeek-V3.2", "all", 685e9, "huggingface.co/deepseek-ai/DeepSeek-V3.2: 685B params"),
    (
        "Qwen--Qwen3-Next-80B-A3B-Thinking",
        "main",
        80e9,
        "huggingface.co/Qwen/Qwen3-Next-80B-A3B-Thinking card: Number of Parameters: 80B in total",
    ),
    # The Qwen3.5 cards count the text model and the vision tower, without the MTP layer.
    (
        "Qwen--Qwen3.5-397B-A17B",
        "main",
        397e9,
        "huggingface.co/Qwen/Qwen3.5-397B-A17B card: 397B total parameters, 17B activated",
    ),
    ("Qwen--Qwen3.5-35B-A3B", "main", 35e9, "huggingface.co/Qwen/Qwen3.5-35B-A3B card: 35B in total, 3B activated"),
    (
        "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "all",
        31.6e9,
        "huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 card: 31.6B total parameters",
    ),
    ("nvidia--Nemotron-H-56B-Base-8K", "all", 56e9, "huggingface.co/nvidia/Nemotron-H-56B-Base-8K card: 56B"),
    (
        "XiaomiMiMo--MiMo-V2-Flash",
        "all",
        309e9,
        "MiMo-V2-Flash Technical Report (arXiv:2601.02780), abstract: 309B total parameters and 15B active",
    ),
    (
        "ai21labs--AI21-Jamba-1.5-Mini",
        "all",
        52e9,
        "huggingface.co/ai21labs/AI21-Jamba-1.5-Mini card: Jamba 1.5 Mini (12B active/52B total)",
    ),
    (
        "google--gemma-4-26B-A4B",
        "text",
        25.2e9,
        "huggingface.co/google/gemma-4-26B-A4B card: 25.2B total parameters (the ~550M vision encoder listed apart)",
    ),
    (
        "deepseek-ai--DeepSeek-V4-Flash",
        "main",
        284e9,
        "huggingface.co/deepseek-ai/DeepSeek-V4-Flash card: 284B total parameters, 13B activated",
    ),
    # This config is MiniMax-M3's text model: its vision tower and MTP modules are not in it (noted).
    ("MiniMaxAI--MiniMax-M3", "all", 428e9, "huggingface.co/MiniMaxAI/MiniMax-M3 card: ~428B parameters"),
    (
        "MiniMaxAI--MiniMax-M2.5",
        "all",
        230e9,
        "huggingface.co/MiniMaxAI/MiniMax-M2 card: 230 billion total parameters (M2.5 keeps the architecture)",
    ),
]


@pytest.mark.parametrize(
    ("name", "counted", "published", "source"), PUBLISHED, ids=[f"{p[0]}-{p[1]}" for p in PUBLISHED]
)
def test_parameters_match_the_published_count(name: str, counted: str, published: float, source: str) -> None:
    estimate = estimate_weights(config(name))
    parameters = {
        "all": estimate.parameters,
        "main": estimate.parameters_without_mtp,
        "text": estimate.parameters - estimate.parameters_by_family.get("vision", 0),  # the encoder listed apart
    }[counted]
    assert parameters == pytest.approx(published, rel=0.01), source


def test_dsa_indexer_adds_its_projections_to_every_layer() -> None:
    """DeepSeek-V3.2 is DeepSeek-V3 plus, in each of its 61 layers and the MTP layer, the indexer: wq_b (64 heads x 128
    from the 1536 query latent), wk (128 from 7168), the LayerNorm k_norm (weight and bias) and weights_proj."""
    v3, v32 = (
        estimate_weights(config("deepseek-ai--DeepSeek-V3")),
        estimate_weights(config("deepseek-ai--DeepSeek-V3.2")),
    )
    indexer = 64 * 128 * 1536 + 128 * 7168 + 2 * 128 + 64 * 7168
    assert v32.parameters - v3.parameters == 62 * indexer
    assert v32.parameters_without_mtp - v3.parameters_without_mtp == 61 * indexer
    # wq_b and wk are fp8 (a scale per 128x128 block) and weights_proj bf16; at TP 8 all are whole on every rank.
    fp8 = 64 * 128 * 1536 + 4 * 64 * 12 + 128 * 7168 + 4 * 56
    extra = 2 * 128 * 2 + 64 * 7168 * 2 + fp8
    tp8 = Serving(tp_size=8)
    per_rank = estimate_weights(config("deepseek-ai--DeepSeek-V3.2"), tp8).bytes_per_rank
    assert per_rank - estimate_weights(config("deepseek-ai--DeepSeek-V3"), tp8).bytes_per_rank == 61 * extra


def test_deepseek_v4_layer_by_hand() -> None:
    """DeepSeek-V4-Flash layer 2 (compress ratio 4): attention (64 heads of 512 from the 1024 query latent, one KV
    head, 8 output groups of o_lora 1024), float32 sinks, the overlapping compressor (ape 4 x 1024, wkv and wgate
    1024 x 4096, norm 512) and the indexer (wq_b 64 x 128 from 1024, weights_proj 64, a compressor over 128);
    layer 3 (ratio 128) has a plain compressor and no indexer, layers 0 and 1 (ratio 0) none."""
    hidden, heads, head_dim, q_lora, o_lora, groups = 4096, 64, 512, 1024, 1024, 8
    attention = heads + q_lora * hidden + heads * head_dim * q_lora + head_dim * hidden
    attention += groups * o_lora * heads * head_dim // groups + hidden * groups * o_lora
    compressor4 = 4 * 1024 + 2 * 1024 * hidden
    indexer = 64 * 128 * q_lora + 64 * hidden + 4 * 256 + 2 * 256 * hidden
    compressor128 = 128 * 512 + 2 * 512 * hidden
    estimate = estimate_weights(config("deepseek-ai--DeepSeek-V4-Flash"))
    ratios = read("deepseek-ai--DeepSeek-V4-Flash")["compress_ratios"]
    assert isinstance(ratios, list)
    main = ratios[:43]
    expected = 43 * attention + main.count(4) * (compressor4 + indexer) + main.count(128) * compressor128
    assert estimate.parameters_by_family["attention"] == expected
    # fp4 experts: half a byte a value and a scale byte per 32 (expert_dtype); the fp8 config covers the rest.
    assert estimate.dtypes["moe_experts"].startswith("mxfp4")
    assert estimate.dtypes["moe_shared_experts"].startswith("float8_e4m3")


def test_minimax_m3_sparse_index_projections_by_hand() -> None:
    """MiniMax-M3: every layer's GQA (64 q heads, 4 KV heads of 128) with per-head q/k norms; the layers that
    sparse_attention_freq marks add the index projections (4 query heads and a key head of 128, a value head and
    index_o_proj unless sparse_disable_index_value) and their two norms."""
    hidden, head_dim, index_dim = 6144, 128, 128
    sparse = read("MiniMaxAI--MiniMax-M3")["sparse_attention_config"]
    assert isinstance(sparse, dict)
    marked = [i for i, flag in enumerate(sparse["sparse_attention_freq"]) if flag]
    without_value = sum(1 for i in marked if sparse["sparse_disable_index_value"][i])
    attention = 2 * 64 * head_dim * hidden + 2 * 4 * head_dim * hidden
    index = 4 * index_dim * hidden + index_dim * hidden
    value = index_dim * hidden + hidden * 4 * index_dim
    expected = 60 * attention + len(marked) * index + (len(marked) - without_value) * value
    assert estimate_weights(config("MiniMaxAI--MiniMax-M3")).parameters_by_family["attention"] == expected
    # The released config disables every index value; enabling them adds v and index_o_proj to each marked layer.
    with_values = {**sparse, "sparse_disable_index_value": [0] * 60}
    enabled = estimate_weights({**read("MiniMaxAI--MiniMax-M3"), "sparse_attention_config": with_values})
    assert enabled.parameters_by_family["attention"] == 60 * attention + len(marked) * (index + value)


def test_mimo_mtp_layer_by_hand() -> None:
    """No published count separates MiMo-7B's MTP layer, so one layer is checked by hand: a Qwen2 layer (q/k/v
    biases), four norms, input_proj from 2 x hidden and the final norm; embedding and head are shared."""
    hidden, heads, kv_heads, head_dim, inter = 4096, 32, 8, 128, 11008
    attention = 2 * heads * head_dim * hidden + 2 * kv_heads * head_dim * hidden + (heads + 2 * kv_heads) * head_dim
    layer = attention + 3 * inter * hidden + 2 * hidden
    estimate = estimate_weights(config("XiaomiMiMo--MiMo-7B-Base"))
    assert estimate.parameters_by_family["mtp"] == layer + 3 * hidden + 2 * hidden * hidden
    assert estimate.parameters_without_mtp == 36 * layer + 2 * 151680 * hidden + hidden


def test_qwen3_next_per_rank_at_tp4_ep4_by_hand() -> None:
    """Qwen3-Next-80B at TP 4, EP 4: 36 Gated DeltaNet and 12 gated-attention layers, 128 whole experts a rank.

    Attention splits its 16 query heads (q_proj doubled by the output gate) and keeps one of the 2 KV heads; the
    DeltaNet splits its heads (qkvz, ba, conv1d, dt_bias, float32 A_log, out_proj); the shared expert splits like a
    dense MLP; the routers, norms and the shared-expert gate are whole; the MTP layer is not on the rank."""
    hidden, head_dim, vocab = 2048, 256, 151936
    attention = 2 * (16 // 4) * head_dim * hidden + 2 * 1 * head_dim * hidden + hidden * (16 // 4) * head_dim
    attention_bytes = 2 * (attention + 2 * head_dim)
    key_dim, value_dim, v_heads = 16 * 128, 32 * 128, 32
    delta = (2 * key_dim + 2 * value_dim) // 4 * hidden + 2 * v_heads // 4 * hidden
    delta += (2 * key_dim + value_dim) // 4 * 4 + v_heads // 4 + 128 + hidden * value_dim // 4
    delta_bytes = 2 * delta + 4 * (v_heads // 4)
    moe = 512 * hidden + 128 * 3 * 512 * hidden + 3 * (512 // 4) * hidden + hidden
    common = 2 * (moe + 2 * hidden)
    expected = 12 * attention_bytes + 36 * delta_bytes + 48 * common + 2 * (2 * (vocab // 4) * hidden + hidden)
    estimate = estimate_weights(config("Qwen--Qwen3-Next-80B-A3B-Thinking"), Serving(tp_size=4), ep_size=4)
    assert estimate.bytes_per_rank == expected
    # With ep_size 1 each of the 512 experts keeps a quarter of its intermediate size: the same expert bytes.
    assert estimate_weights(config("Qwen--Qwen3-Next-80B-A3B-Thinking"), Serving(tp_size=4)).bytes_per_rank == expected


def test_mimo_v2_flash_attention_by_hand() -> None:
    """MiMo-V2-Flash: 9 full layers (64 q heads, 4 KV heads) and 39 sliding-window layers (64 q, 8 KV, and a
    per-head sink bias), q/k heads of 192 and v heads of 128 (o_proj reads 64 x 128)."""
    hidden = 4096

    def attention(kv_heads: int) -> int:
        return 64 * 192 * hidden + kv_heads * 192 * hidden + kv_heads * 128 * hidden + hidden * 64 * 128

    expected = 9 * attention(4) + 39 * (attention(8) + 64)
    assert estimate_weights(config("XiaomiMiMo--MiMo-V2-Flash")).parameters_by_family["attention"] == expected


def test_gemma3_12b_matches_the_technical_report_table() -> None:
    """Gemma 3 Technical Report (arXiv:2503.19786) table 1, Gemma 3 12B: vision encoder 417M, embedding 1,012M,
    non-embedding 10,759M parameters. The vision encoder is the SigLIP tower; the multimodal projector (its RMSNorm
    and the 1152 x 3840 projection, by hand) is counted under ``vision`` too but not in the table's figure."""
    families = estimate_weights(config("google--gemma-3-12b-it")).parameters_by_family
    projector = 1152 + 1152 * 3840
    assert families["vision"] - projector == pytest.approx(417e6, rel=0.01)
    assert families["embedding"] == pytest.approx(1012e6, rel=0.01)
    assert "lm_head" not in families  # tied
    non_embedding = sum(families.values()) - families["embedding"] - families["vision"]
    assert non_embedding == pytest.approx(10759e6, rel=0.01)


def test_gemma3_presets_count_the_siglip_tower_and_projector() -> None:
    """The gemma-3 presets name the checkpoints' complete configs (``_weights_config``, issue 34): before they held
    only the KV fields and ``estimate_weights`` refused them (``text_config.intermediate_size`` missing), so a
    whole-GPU plan from the preset name needed --weights-memory.  gemma-3-12b-it: the same 12,187,325,040
    parameters as its config (421,290,864 of them the SigLIP tower and projector).  gemma-3-27b-it by hand (62
    layers of 5376, 32 heads and 16 KV heads of 128, MLP 21504, vocabulary 262208 tied): attention (2 x 32 + 2 x 16)
    x 128 x 5376 = 66,060,288 a layer, 4,095,737,856; MLP 3 x 21504 x 5376 = 346,816,512 a layer,
    21,502,623,744; norms (4 x 5376 + 2 x 128) x 62 + 5376 = 1,354,496; embedding 262,208 x 5376 =
    1,409,630,208; the SigLIP tower as 12B's (416,866,032) and the projector 1152 + 1152 x 5376 = 6,194,304:
    27,432,406,640 parameters, 54,864,813,280 B in bfloat16 (51.10 GiB).  The technical report (arXiv:2503.19786,
    table 1, Gemma 3 27B): vision encoder 417M, non-embedding 25,600M (here 25,599,716,096)."""
    assert (
        estimate_weights("gemma-3-12b-it").parameters == estimate_weights(config("google--gemma-3-12b-it")).parameters
    )
    assert estimate_weights("gemma-3-12b-it").parameters_by_family["vision"] == 421_290_864
    hidden, layers = 5376, 62
    siglip = 416_866_032
    expected = {
        "attention": 66_060_288 * layers,
        "mlp": 3 * 21504 * hidden * layers,
        "norms": (4 * hidden + 2 * 128) * layers + hidden,
        "embedding": 262_208 * hidden,
        "vision": siglip + 1152 + 1152 * hidden,
    }
    big = estimate_weights("gemma-3-27b-it")
    assert {family: count for family, count in big.parameters_by_family.items() if count} == expected
    assert big.parameters == 27_432_406_640 and big.bytes_per_rank == 2 * 27_432_406_640
    assert expected["vision"] - 1152 - 1152 * hidden == pytest.approx(417e6, rel=0.001)
    assert expected["attention"] + expected["mlp"] + expected["norms"] == pytest.approx(25_600e6, rel=0.001)


def test_siglip_tower_by_hand() -> None:
    """Gemma-3's SigLIP: a 14 x 14 patch Conv2d (biased), 64 x 64 positions, 27 blocks (two LayerNorms, biased
    q/k/v/out, fc1 to 4304, fc2) and the post LayerNorm; at TP 2 the Linears halve on the first stage only."""
    hidden, inter = 1152, 4304
    block = 4 * hidden + 4 * (hidden * hidden + hidden) + inter * hidden + inter + hidden * inter + hidden
    tower = hidden * 3 * 14 * 14 + hidden + 4096 * hidden + 27 * block + 2 * hidden
    vision = estimate_weights(config("google--gemma-3-12b-it")).parameters_by_family["vision"]
    assert vision == tower + hidden + hidden * 3840
    text_only = {key: value for key, value in read("google--gemma-3-12b-it").items() if key != "vision_config"}
    serving = Serving(tp_size=2, pp_size=2, pp_rank=0)
    block_rank = 4 * hidden + (4 * hidden * hidden + 2 * inter * hidden) // 2 + 3 * hidden // 2 + hidden
    block_rank += inter // 2 + hidden
    tower_rank = hidden * 3 * 14 * 14 + hidden + 4096 // 2 * hidden + 27 * block_rank + 2 * hidden
    difference = (
        estimate_weights(config("google--gemma-3-12b-it"), serving).bytes_per_rank
        - estimate_weights(text_only, serving).bytes_per_rank
    )
    assert difference == 2 * (tower_rank + hidden + hidden * 3840)


def test_gemma4_vision_encoder_by_hand() -> None:
    """Gemma-4-26B-A4B's vision encoder, now counted (issue 34; it was noted as left out), as SGLang builds it
    (sglang/srt/models/gemma4_vision.py Gemma4VisionPatchEmbedder, Gemma4VisionAttention, Gemma4VisionMLP,
    Gemma4VisionEncoderLayer, Gemma4VisionEncoder; gemma4_mm.py Gemma4MultimodalEmbedder): 27 layers of fused q/k/v
    3 x 1152 x 1152 = 3,981,312 (16 heads and 16 KV heads of 72), o_proj 1,327,104, q/k norms 2 x 72, gate_up
    2 x 4304 x 1152 = 9,916,416, down 4,958,208, four norms 4 x 1152 and ``layer_scalar``: 20,187,793 a layer,
    545,070,411; the patch projection 3 x 16² x 1152 = 884,736, the position table 2 x 10240 x 1152 = 23,592,960,
    ``std_bias`` / ``std_scale`` 2 x 1152 (``standardize``); the embedder's projection 2816 x 1152 = 3,244,032:
    572,794,443 (569,550,411 the encoder; the card's "~550M" is rounded).  At TP 4 on the first of two stages the
    q/k/v, o, gate_up and down Linears split four ways; the rest is whole."""
    layer = 3 * 1152 * 1152 + 1152 * 1152 + 2 * 72 + 2 * 4304 * 1152 + 4304 * 1152 + 4 * 1152 + 1
    assert layer == 20_187_793
    encoder = 27 * layer + 3 * 16**2 * 1152 + 2 * 10240 * 1152 + 2 * 1152
    assert encoder + 2816 * 1152 == 572_794_443
    assert estimate_weights(config("google--gemma-4-26B-A4B")).parameters_by_family["vision"] == 572_794_443
    full = read("google--gemma-4-26B-A4B")
    text_only = {key: value for key, value in full.items() if key != "vision_config"}
    serving = Serving(tp_size=4, pp_size=2, pp_rank=0)
    linears = 3 * 1152 * 1152 + 1152 * 1152 + 2 * 4304 * 1152 + 4304 * 1152
    layer_rank = linears // 4 + 2 * 72 + 4 * 1152 + 1
    rank = 27 * layer_rank + 3 * 16**2 * 1152 + 2 * 10240 * 1152 + 2 * 1152 + 2816 * 1152
    difference = estimate_weights(full, serving).bytes_per_rank - estimate_weights(text_only, serving).bytes_per_rank
    assert difference == 2 * rank


def test_gemma4_attention_by_hand() -> None:
    """Gemma-4-26B-A4B: 25 sliding layers (16 heads of 256, 8 KV heads) and 5 full layers (16 heads of 512, 2 KV
    heads, no v_proj under attention_k_eq_v), q/k norms over one head. At TP 4 a full layer keeps one of its two
    K heads (replicated) and a quarter of q and o."""
    hidden = 2816
    sliding = 16 * 256 * hidden + 2 * 8 * 256 * hidden + hidden * 16 * 256
    full = 16 * 512 * hidden + 2 * 512 * hidden + hidden * 16 * 512
    estimate = estimate_weights(config("google--gemma-4-26B-A4B"))
    assert estimate.parameters_by_family["attention"] == 25 * sliding + 5 * full
    assert estimate.dtypes["attention"] == "bfloat16"
    layer_types = read("google--gemma-4-26B-A4B")["text_config"]["layer_types"]  # type: ignore[index]
    full_layer = layer_types.index("full_attention")
    tp4 = estimate_weights(config("google--gemma-4-26B-A4B"), Serving(tp_size=4, pp_size=30, pp_rank=full_layer))
    tp4_sliding = estimate_weights(config("google--gemma-4-26B-A4B"), Serving(tp_size=4, pp_size=30, pp_rank=1))
    full_rank = 4 * 512 * hidden + 1 * 512 * hidden + hidden * 4 * 512 + 2 * 512
    sliding_rank = 4 * 256 * hidden + 2 * 2 * 256 * hidden + hidden * 4 * 256 + 2 * 256
    assert tp4.bytes_per_rank - tp4_sliding.bytes_per_rank == 2 * (full_rank - sliding_rank)


def test_qwen3_5_counts_the_same_delta_net_with_split_projections() -> None:
    """Qwen3.5 stores in_proj_qkv / in_proj_z / in_proj_b / in_proj_a where Qwen3-Next fuses qkvz and ba; the
    parameters are the same, and the text model under text_config is read."""
    estimate = estimate_weights(config("Qwen--Qwen3.5-35B-A3B"))
    key_dim, value_dim, v_heads, hidden = 16 * 128, 32 * 128, 32, 2048
    delta = (2 * key_dim + 2 * value_dim + 2 * v_heads) * hidden + (2 * key_dim + value_dim) * 4 + 2 * v_heads
    delta += value_dim * hidden
    assert estimate.parameters_by_family["linear_attention"] == 30 * delta


def test_qwen3_5_vision_tower_by_hand() -> None:
    """Qwen3.5-35B-A3B's vision tower: Conv3d patch embedding (3 x 2 x 16 x 16 -> 1152, biased), 2304 positions,
    27 blocks (two LayerNorms, qkv, proj, fc1 to 4304, fc2, all biased) and the merger (LayerNorm over 1152, fc1
    over 4 x 1152, fc2 to 2048); it sits on the first pipeline stage, its Linears split over TP."""
    hidden, inter, merged, out = 1152, 4304, 4 * 1152, 2048
    block = 4 * hidden + 4 * hidden * hidden + 4 * hidden + 2 * (inter * hidden) + inter + hidden
    merger = 2 * hidden + merged * merged + merged + out * merged + out
    vision = hidden * 3 * 2 * 16 * 16 + hidden + 2304 * hidden + 27 * block + merger
    assert estimate_weights(config("Qwen--Qwen3.5-35B-A3B")).parameters_by_family["vision"] == vision
    # At TP 2 x PP 2 the first stage holds half of each Linear (biases of row-parallel ones whole) and of the
    # position table; the last stage none of it.
    block_rank = 4 * hidden + (4 * hidden * hidden + 2 * inter * hidden) // 2 + 3 * hidden // 2 + hidden
    block_rank += inter // 2 + hidden
    merger_rank = 2 * hidden + merged * merged // 2 + merged // 2 + out * merged // 2 + out
    vision_rank = hidden * 3 * 2 * 16 * 16 + hidden + 2304 // 2 * hidden + 27 * block_rank + merger_rank
    first, last = (
        estimate_weights(config("Qwen--Qwen3.5-35B-A3B"), Serving(tp_size=2, pp_size=2, pp_rank=rank))
        for rank in (0, 1)
    )
    text_only = {**read("Qwen--Qwen3.5-35B-A3B")}
    del text_only["vision_config"]
    text_first = estimate_weights(text_only, Serving(tp_size=2, pp_size=2, pp_rank=0))
    text_last = estimate_weights(text_only, Serving(tp_size=2, pp_size=2, pp_rank=1))
    assert first.bytes_per_rank - text_first.bytes_per_rank == 2 * vision_rank
    assert last.bytes_per_rank == text_last.bytes_per_rank


def test_nemotron_h_mamba2_layer_by_hand() -> None:
    """One Mamba-2 layer of Nemotron-3-Nano: in_proj to z, x (64 heads x 64), B and C (8 groups x 128) and dt,
    conv1d over x, B, C with its bias, dt_bias / A_log / D per head, the gated norm and out_proj; the 23 Mamba
    layers of the pattern hold it."""
    hidden, heads, inter, groups, state = 2688, 64, 64 * 64, 8, 128
    conv = inter + 2 * groups * state
    layer = (2 * inter + 2 * groups * state + heads) * hidden + conv * 4 + conv + 3 * heads + inter * hidden
    estimate = estimate_weights(config("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"))
    pattern = read("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")["hybrid_override_pattern"]
    assert isinstance(pattern, str)
    assert estimate.parameters_by_family["mamba"] == pattern.count("M") * layer  # the gated norm is under norms


def test_jamba_mamba1_layer_by_hand() -> None:
    """One Mamba-1 layer of Jamba-1.5-Mini (d_inner 8192, dt_rank 256, d_state 16): in_proj to x and z, conv1d and
    its bias, x_proj to dt/B/C, dt_proj with its bias, A_log, D, out_proj and the dt/B/C norms; 28 of the 32 layers
    (attention at 4, 12, 20, 28). At TP 2 the d_inner dimension halves, the three small norms stay whole."""
    hidden, inner, rank, state = 4096, 8192, 256, 16
    layer = 2 * inner * hidden + inner * 4 + inner + (rank + 2 * state) * inner + inner * rank + inner
    layer += inner * state + inner + hidden * inner
    norms = rank + 2 * state
    estimate = estimate_weights(config("ai21labs--AI21-Jamba-1.5-Mini"))
    assert estimate.parameters_by_family["mamba"] == 28 * layer
    half = estimate_weights(config("ai21labs--AI21-Jamba-1.5-Mini"), Serving(tp_size=2, pp_size=4, pp_rank=0))
    # Stage 0 of 4 holds layers 0-7: layer 4 is attention, 1, 3, 5, 7 are MoE; d_inner splits in two.
    shard = inner // 2
    mamba_rank = 2 * shard * hidden + shard * 4 + shard + (rank + 2 * state) * shard + shard * rank + shard
    mamba_rank += shard * state + shard + hidden * shard + norms
    attention = 2 * (32 // 2) * 128 * hidden + 2 * (8 // 2) * 128 * hidden
    moe = 16 * hidden + 16 * 3 * 14336 // 2 * hidden
    dense = 3 * 14336 // 2 * hidden
    stage = 7 * mamba_rank + attention + 4 * moe + 4 * dense + 8 * 2 * hidden + 65536 // 2 * hidden
    assert half.bytes_per_rank == 2 * stage


def test_mamba2_groups_must_split_over_tp() -> None:
    with pytest.raises(UnsupportedCombinationError, match="n_groups 8 does not split over tp_size 16"):
        estimate_weights(config("nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"), Serving(tp_size=16))


def tiny_llama(quantization: dict[str, object], dtype: str = "bfloat16") -> dict[str, object]:
    """One layer of 256 hidden, 512 intermediate, 2 heads of 128 (1 KV head), vocab 1024: seven Linear weights."""
    return {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 128,
        "num_hidden_layers": 1,
        "vocab_size": 1024,
        "torch_dtype": dtype,
        "quantization_config": quantization,
    }


# (out, in) of q, k, v, o, gate, up, down in tiny_llama.
LINEARS = [(256, 256), (128, 256), (128, 256), (256, 256), (512, 256), (512, 256), (256, 512)]
UNQUANTISED = 2 * 256 + 2 * 1024 * 256 + 256  # two layer norms, embedding and head, final norm


def test_nvfp4_modelopt_bytes_by_hand() -> None:
    """Half a byte a value, an fp8 scale per 16 inputs, float32 weight_scale_2 and input_scale per tensor; the
    excluded lm_head and the norms stay bf16."""
    quant = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    expected = sum(out * inner // 2 + out * inner // 16 + 8 for out, inner in LINEARS) + 2 * UNQUANTISED
    assert estimate_weights(tiny_llama(quant)).bytes_total == expected
    nested = {"quant_method": "modelopt", "quantization": {"quant_algo": "NVFP4", "group_size": 16}}
    assert estimate_weights(tiny_llama(nested)).bytes_total == expected
    compressed = {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "config_groups": {
            "group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float", "group_size": 16}}
        },
        "ignore": ["lm_head"],
    }
    assert estimate_weights(tiny_llama(compressed)).bytes_total == expected


def test_nvfp4_checkpoint_excludes_its_routers() -> None:
    """nvidia/Qwen3-235B-A22B-NVFP4: its hf_quant_config.json (ModelOpt) excludes every mlp.gate and lm_head."""
    hf_quant = read("nvidia--Qwen3-235B-A22B-NVFP4.hf_quant_config")
    quantisation = {"quant_method": "modelopt", **hf_quant["quantization"]}  # type: ignore[dict-item]
    estimate = estimate_weights({**read("nvidia--Qwen3-235B-A22B-NVFP4"), "quantization_config": quantisation})
    assert estimate.dtypes["moe_experts"].startswith("nvfp4")
    assert estimate.dtypes["moe_router"] == "bfloat16"
    expert = 3 * (1536 * 4096 // 2 + 1536 * 4096 // 16 + 8)  # gate/up/down of one expert: same shapes either way
    assert estimate.bytes_total < estimate.parameters * 2 / 3
    assert estimate.bytes_total > 94 * 128 * expert


def test_modelopt_mixed_precision_by_module() -> None:
    """nvidia/Qwen3.6-35B-A3B-NVFP4 (ModelOpt MIXED_PRECISION): the DeltaNet and attention projections FP8 (weight
    and input scales), experts, shared experts and the LM head W4A16_NVFP4 (one float32 scalar, no input scale),
    everything else, MTP layer included, bf16. Each listed module is checked alone against the bf16 checkpoint."""
    quantised = read("nvidia--Qwen3.6-35B-A3B-NVFP4")
    estimate = estimate_weights(quantised)
    assert estimate.dtypes["moe_experts"] == "nvfp4 (4-bit + fp8 e4m3 scale per 16 values + 1 float32 scalar)"
    assert estimate.dtypes["attention"] == "float8_e4m3 + 2 float32 scalars per tensor"
    assert estimate.dtypes["lm_head"] == estimate.dtypes["moe_experts"]
    assert estimate.dtypes["mtp"] == estimate.dtypes["vision"] == "bfloat16"
    plain = {key: value for key, value in quantised.items() if key != "quantization_config"}
    bf16 = estimate_weights(plain).bytes_total

    def only(module: str, algo: str) -> int:
        layers = {module: {"quant_algo": algo, "group_size": 16}}
        mixed = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "quantized_layers": layers}
        return bf16 - estimate_weights({**plain, "quantization_config": mixed}).bytes_total

    hidden, vocab = 2048, 248320
    assert only("lm_head", "W4A16_NVFP4") == 2 * vocab * hidden - (vocab * (hidden // 2 + hidden // 16) + 4)
    qkv = (2 * 16 * 128 + 32 * 128) * hidden  # in_proj_qkv of layer 0: q, k and v of the DeltaNet
    assert only("model.language_model.layers.0.linear_attn.in_proj_qkv", "FP8") == 2 * qkv - (qkv + 8)
    experts = 256 * 3 * 512 * hidden  # layer 0's experts: gate, up (512 x 2048) and down (2048 x 512), each scaled
    nvfp4 = 256 * (2 * (512 * (hidden // 2 + hidden // 16) + 4) + hidden * (512 // 2 + 512 // 16) + 4)
    assert only("model.language_model.layers.0.mlp.experts", "W4A16_NVFP4") == 2 * experts - nvfp4


def test_awq_bytes_by_hand() -> None:
    """AutoAWQ GEMM: int32 qweight [in, out/8], int32 qzeros and fp16 scales per group of 128 inputs."""
    quant = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"}
    expected = sum(inner * out // 2 + (inner // 128) * (out // 2 + 2 * out) for out, inner in LINEARS)
    assert estimate_weights(tiny_llama(quant, "float16")).bytes_total == expected + 2 * UNQUANTISED


@pytest.mark.parametrize("bits", [4, 8])
def test_gptq_bytes_by_hand(bits: int) -> None:
    """GPTQ: int32 qweight [in*bits/32, out], qzeros [groups, out*bits/32], fp16 scales, and the int32 g_idx."""
    quant = {"quant_method": "gptq", "bits": bits, "group_size": 128, "desc_act": False, "sym": True}
    expected = sum(
        inner * out * bits // 8 + (inner // 128) * (out * bits // 8 + 2 * out) + 4 * inner for out, inner in LINEARS
    )
    assert estimate_weights(tiny_llama(quant, "float16")).bytes_total == expected + 2 * UNQUANTISED


def test_gptq_without_groups_keeps_one_scale_row() -> None:
    quant = {"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": False, "sym": True}
    expected = sum(inner * out // 2 + out // 2 + 2 * out + 4 * inner for out, inner in LINEARS)
    assert estimate_weights(tiny_llama(quant, "float16")).bytes_total == expected + 2 * UNQUANTISED


def test_unmodelled_quantisations_are_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"'quantization_config.bits' is 3.*AWQ checkpoints are 4-bit"):
        estimate_weights(tiny_llama({"quant_method": "awq", "bits": 3}))
    with pytest.raises(ConfigError, match=r"'quantization_config.quant_algo' is 'W4A8_AWQ'"):
        estimate_weights(tiny_llama({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"}))
    with pytest.raises(ConfigError, match=r"'quantization_config.quantized_layers' is missing"):
        estimate_weights(tiny_llama({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION"}))
    with pytest.raises(ConfigError, match=r"'quantization_config.quant_method' is 'bitsandbytes'"):
        estimate_weights(tiny_llama({"quant_method": "bitsandbytes"}))


@pytest.mark.parametrize("model_type", ["minimax_m1", "falcon_h1", "kimi_linear", "granitemoehybrid"])
def test_families_not_modelled_yet_are_refused(model_type: str) -> None:
    with pytest.raises(ConfigError, match=rf"model_type' is '{model_type}'.*not guessed"):
        estimate_weights({**read("MiniMaxAI--MiniMax-M3"), "model_type": model_type})


@pytest.mark.parametrize("accounting", ["vllm", "sglang"])
def test_qwen3_6_nvfp4_mtp_is_counted_but_not_loaded_and_the_vision_tower_is(accounting: str) -> None:
    """The qwen3.6-35b-a3b-nvfp4 preset (issue 34): its MTP layer, by hand (text_config hidden 2048, 256 experts of
    512, one shared expert of 512, 16 heads x 256 with the output gate, 2 KV heads, mtp_use_dedicated_embeddings
    false): experts 256 x 3 x 2048 x 512 = 805,306,368 + shared expert 3 x 2048 x 512 = 3,145,728 + its gate 2048 +
    router 256 x 2048 = 524,288 + q_proj 2048 x 8192 = 16,777,216 + k / v 2 x 2048 x 512 = 2,097,152 + o_proj
    4096 x 2048 = 8,388,608 + q / k norms 512 + fc 4096 x 2048 = 8,388,608 + 5 norms of 2048 = 10,240:
    844,640,768 bf16 parameters (the ModelOpt config ignores ``mtp*``).  Neither engine loads them without
    speculative decoding: vLLM's ``Qwen3_5MoeForConditionalGeneration`` inherits the ``hf_to_vllm_mapper`` that
    drops ``mtp.`` (vLLM 0.33 ``model_executor/models/qwen3_5.py`` L476-479; L327-329 for the text model), SGLang
    0.5.23's ``Qwen3_5MoeForConditionalGeneration.load_weights`` skips every name holding ``mtp``
    (``srt/models/qwen3_5.py`` L2659, L2772; the text model's L2006), so they are in ``bytes_total`` and not on the
    rank.  The vision tower is loaded (``language_model_only`` off): 27
    blocks of (qkv 1152 x 3456 + 3456, proj 1152^2 + 1152, fc1 1152 x 4304 + 4304, fc2 4304 x 1152 + 1152, two
    LayerNorms 4 x 1152) = 27 x 15,239,504 + patch embedding 1536 x 1152 + 1152 + position embedding 2304 x 1152 +
    merger (LayerNorm 2 x 1152, fc1 4608^2 + 4608, fc2 4608 x 2048 + 2048) = 446,571,248."""
    estimate = estimate_weights("qwen3.6-35b-a3b-nvfp4", Serving(accounting=accounting))  # type: ignore[arg-type]
    mtp = 805_306_368 + 3_145_728 + 2048 + 524_288 + 16_777_216 + 2_097_152 + 8_388_608 + 512 + 8_388_608 + 10_240
    assert estimate.parameters_by_family["mtp"] == mtp == 844_640_768
    assert estimate.dtypes["mtp"] == "bfloat16"
    assert estimate.bytes_total - estimate.bytes_per_rank == 2 * mtp
    block = 1152 * 3456 + 3456 + 1152 * 1152 + 1152 + 2 * 1152 * 4304 + 4304 + 1152 + 4 * 1152
    merger = 2 * 1152 + 4608 * 4608 + 4608 + 4608 * 2048 + 2048
    assert block == 15_239_504
    assert estimate.parameters_by_family["vision"] == 27 * block + 1536 * 1152 + 1152 + 2304 * 1152 + merger
    assert estimate.parameters_by_family["vision"] == 446_571_248
