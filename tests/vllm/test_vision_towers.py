"""vLLM's encoder profile pass for the Llama-4 vision tower, and the refusal of a tower kvpools does not model
(issue 34).  Every number is hand-computed from vLLM 0.33's sources (``/tmp/kvpools-peers-venv``):

* ``v1/worker/gpu_model_runner.py`` L6072-6146 (``profile_run``: the encoder runs on ``mm_max_items_per_batch`` items
  of the modality with the most tokens, its outputs kept in ``encoder_cache`` until the sampler has run);
  ``multimodal/encoder_budget.py`` L20-40 (tokens of an item: the dummy item's embeddings), L142-182 (items).
* ``model_executor/models/mllama4.py``: L564-575 (``get_patch_per_chunk``: (336 / 14)^2 / round(1 / 0.5^2) = 144),
  L577-585 (the dummy image: ``max_patches`` 16 tiles high, one wide), L630-636 (16 x 1 tiles + the global one = 17
  chunks), L679-685 (the embeddings are the ``<|patch|>`` tokens: 17 x 144 = 2448), L453-457 (unfold + linear),
  L510-549 (``Llama4VisionModel.forward``: class token, position, ``layernorm_pre`` kept by the caller through the
  encoder, ``layernorm_post``, the pixel-shuffle adapter), L370-387 (the layer: residuals not in place), L317-337
  (attention: ``qkv``, rotary, ``MMEncoderAttention``, ``o_proj``), L155-161 (MLP: ``fc1``, GELU, ``fc2``),
  L164-183 (projector into the text hidden size), L765-777 (the tower marked with ``image``);
  ``layers/rotary_embedding/llama4_vision_rope.py`` L55-76 (``forward_native``: fp32 copies of q and k, their complex
  products, cast back); ``v1/attention/ops/vit_attn_wrappers.py`` L26-86 (flash attention on views, one output).
* ``model_executor/models/gemma4_mm.py`` L1100-1113 (Gemma-4's tower, transformers' ``AutoModel``, marked with image
  and video): modelled since issue 34 (``test_gemma4_encoder.py``); LLaVA-NeXT / Kimi-VL shaped towers are refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpools_core.engines.vllm.deployment import plan_vllm
from kvpools_core.engines.vllm.multimodal import tower_modalities
from kvpools_core.engines.vllm.runtime_memory import (
    VisionShape,
    item_sizes,
    mm_encoder_profile,
    unmodelled_vision_tower,
    vision_shape_from_config,
    vision_shape_of,
)
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.models import registry_presets
from kvpools_core.pipeline.gpus import VLLM_VISION_LLAMA4, architecture_traits
from kvpools_core.values import Serving

MAVERICK = "llama-4-maverick"
CUBLAS = 33_554_432


def _maverick_config() -> dict[str, object]:
    from kvpools_core.engines.vllm.runtime_memory import _complete_config

    return dict(_complete_config(MAVERICK)[0])


def test_the_swa_plugin_gives_llama4_and_gemma4_their_vision_traits() -> None:
    """The towers are the ``swa`` plugin's traits of the classes (the core names no model type): Llama-4's marked
    with the image modality only (``mllama4.py`` L765), Gemma-4's (not modelled) with image and video (``gemma4_mm.py``
    L1101)."""
    from kvpools_core.engines.vllm.runtime_memory import _complete_config, vision_tower_of
    from kvpools_core.pipeline.gpus import VLLM_VISION_GEMMA4

    traits = architecture_traits()
    assert VLLM_VISION_LLAMA4 in traits["Llama4ForConditionalGeneration"]
    assert VLLM_VISION_GEMMA4 in traits["Gemma4ForConditionalGeneration"]
    assert tower_modalities(VLLM_VISION_LLAMA4) == ("image",)
    assert tower_modalities(VLLM_VISION_GEMMA4) == ("image", "video")
    assert vision_tower_of(_maverick_config()) == VLLM_VISION_LLAMA4
    assert vision_tower_of(dict(_complete_config("gemma-4-26b-a4b")[0])) == VLLM_VISION_GEMMA4
    assert vision_tower_of({"architectures": ["Gemma4ForConditionalGeneration"]}) is None  # no vision_config


def test_llama4_vision_shape() -> None:
    """plugins/swa/presets/full/llama-4-maverick.json: hidden 1408, intermediate 5632, 16 heads, 336-pixel tiles of
    14-pixel patches, pixel shuffle 0.5 (merge 2), projected into the text's 5120; 16 tiles at most."""
    assert vision_shape_of(MAVERICK) == VisionShape(
        hidden_size=1408,
        intermediate_size=5632,
        num_heads=16,
        out_hidden_size=5120,
        patch_size=14,
        temporal_patch_size=1,
        spatial_merge_size=2,
        image_size=336,
        max_tiles=16,
        tower=VLLM_VISION_LLAMA4,
    )
    config = _maverick_config()
    vision = dict(config["vision_config"])  # type: ignore[call-overload]
    # a tile side not a multiple of the patch (vLLM asserts) or a shuffle whose ds_ratio is no square: no shape
    for broken in ({"image_size": 340}, {"pixel_shuffle_ratio": 0.6}, {"pixel_shuffle_ratio": True}):
        assert vision_shape_from_config({**config, "vision_config": {**vision, **broken}}) is None
    # a ratio of 0.25 keeps 1 patch in 16: merge 4
    quarter = vision_shape_from_config({**config, "vision_config": {**vision, "pixel_shuffle_ratio": 0.25}})
    assert quarter is not None and quarter.spatial_merge_size == 4


def test_llama4_item_sizes_by_hand() -> None:
    """17 chunks (16 x 1 tiles + the global one) of (336 / 14)^2 = 576 patches, 576 / 2^2 = 144 tokens each: 2448
    tokens and 9792 pixel patches an image; a processor of one tile has no global chunk (``patches_per_image`` 1)."""
    vision = vision_shape_of(MAVERICK)
    assert vision is not None
    assert item_sizes(vision) == {"image": (2448, 9792)}
    import attrs

    assert item_sizes(attrs.evolve(vision, max_tiles=1)) == {"image": (144, 576)}


def test_the_llama4_encoder_profile_by_hand() -> None:
    """vllm serve's defaults (8192 batched tokens, 1024 sequences): 8192 // 2448 = 3 images = 51 tiles of 577 tokens
    (576 patches and the class token).  Per token, bf16: the ``layernorm_pre`` output 1408 x 2 = 2816 + the larger
    block peak: attention (block input, ``input_layernorm`` output, ``qkv`` 3, the rotated q / k 2: 7 x 1408 x 2 =
    19,712, and the rotary's fp32 copies of q and k and their complex products 4 x 1408 x 4 = 22,528: 42,240) over
    the MLP ((3 x 1408 + 2 x 5632) x 2 = 30,976): 45,056.  51 x 577 x 45,056 = 1,325,862,912, + the pixels 51 x 576 x
    588 x 2 = 34,546,176: 1,360,409,088 B (1.267 GiB).  Held: the pixels + the projected outputs 3 x 2448 x 5120 x 2 =
    75,202,560."""
    vision = vision_shape_of(MAVERICK)
    assert vision is not None
    profile = mm_encoder_profile(vision, max_num_batched_tokens=8192, max_num_seqs=1024, max_model_len=1_048_576)
    assert profile is not None
    assert (profile.modality, profile.items, profile.tokens_per_item) == ("image", 3, 2448)
    assert profile.encoder_peak_bytes == 51 * 577 * 45_056 + 34_546_176 == 1_360_409_088
    assert profile.held_bytes == 34_546_176 + 75_202_560
    assert "51 tiles x 577 tokens" in profile.formula
    # one sequence of 4096 tokens: 1 x max(1, min(999, 4096 // 2448)) = 1 image (17 tiles)
    one = mm_encoder_profile(vision, max_num_batched_tokens=8192, max_num_seqs=1, max_model_len=4096)
    assert one is not None and one.items == 1
    assert one.encoder_peak_bytes == 17 * 577 * 45_056 + 17 * 576 * 588 * 2
    # float32: .float() and type_as are no copies, so the attention is 7 x 1408 x 4 = 39,424 and the MLP's
    # (3 x 1408 + 2 x 5632) x 4 = 61,952 binds: per token 1408 x 4 + 61,952 = 67,584
    import attrs

    wide = mm_encoder_profile(
        attrs.evolve(vision, dtype_bytes=4), max_num_batched_tokens=8192, max_num_seqs=1, max_model_len=4096
    )
    assert wide is not None and wide.encoder_peak_bytes == 17 * 577 * 67_584 + 17 * 576 * 588 * 4
    # --limit-mm-per-prompt '{"image": 0}' (the tower's only modality): no encoder pass
    assert (
        mm_encoder_profile(
            vision, mm_limits={"image": 0}, max_num_batched_tokens=8192, max_num_seqs=1, max_model_len=4096
        )
        is None
    )


@given(
    batched=st.integers(min_value=1, max_value=200_000),
    seqs=st.integers(min_value=1, max_value=2048),
    model_len=st.integers(min_value=1, max_value=2_000_000),
    limit=st.integers(min_value=1, max_value=999),
)
def test_the_llama4_pass_is_per_tile(batched: int, seqs: int, model_len: int, limit: int) -> None:
    """Every tile runs alone (no cross-tile mask, packed attention of 577 tokens): the pass and what it keeps are the
    item count times one image's (453,469,696 B; pixels 11,515,392 + outputs 25,067,520 B), and the item count is
    vLLM's (``encoder_budget.py`` L142-182) for 2448-token images."""
    vision = vision_shape_of(MAVERICK)
    assert vision is not None
    profile = mm_encoder_profile(
        vision, mm_limits={"image": limit}, max_num_batched_tokens=batched, max_num_seqs=seqs, max_model_len=model_len
    )
    assert profile is not None
    items = max(1, min(max(batched, 2448) // 2448, seqs * max(1, min(limit, model_len // 2448))))
    assert profile.items == items
    assert profile.encoder_peak_bytes == items * 453_469_696 == items * 17 * (577 * 45_056 + 576 * 588 * 2)
    assert profile.held_bytes == items * (11_515_392 + 25_067_520)


def test_a_maverick_plan_charges_the_llama4_encoder() -> None:
    """``plan_vllm("llama-4-maverick", tp_size 8, gpu h200, runtime_profile 0.33, 4 sequences)``: the language
    model's pass (forward 0.234 GiB) + the 104.7 MiB the encoder left held is under the encoder's 1,360,409,088 B,
    which binds: + cuBLAS 33,554,432 = 1,393,963,520 B (before: the language model's 0.391 GiB alone, the encoder
    pass left out).  The encoder is sized at TP 1 (vLLM shards its heads and MLP over TP: an upper bound).
    ``--language-model-only`` drops it and the tower's weights."""
    options = {"serving": Serving(tp_size=8), "gpu": "h200", "runtime_profile": "0.33", "max_num_seqs": 4}
    result = plan_vllm(MAVERICK, max_model_len=65536, **options)  # type: ignore[arg-type]
    assert result.runtime_memory is not None
    term = result.runtime_memory.term("activation peak")
    assert term.bytes == 1_360_409_088 + CUBLAS == 1_393_963_520
    assert ": encoder)" in term.formula and "multimodal encoder: 3 image item(s) x 2448 tokens" in term.formula
    text = plan_vllm(MAVERICK, max_model_len=65536, language_model_only=True, **options)  # type: ignore[arg-type]
    assert text.runtime_memory is not None
    assert text.runtime_memory.term("activation peak").bytes < 1_360_409_088
    assert text.weights_memory[0] < result.weights_memory[0]


def test_a_tower_kvpools_does_not_model_is_named() -> None:
    """A text-only config and a modelled tower (Maverick's, Gemma-4's since issue 34: test_gemma4_encoder.py) have
    nothing unmodelled; a class without a tower trait (LLaVA-NeXT's CLIP) and a modelled class whose
    ``vision_config`` lacks sizes are named by class and ``model_type``."""
    from kvpools_core.engines.vllm.runtime_memory import _complete_config

    assert unmodelled_vision_tower({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096}) is None
    assert unmodelled_vision_tower(_maverick_config()) is None
    assert unmodelled_vision_tower(dict(_complete_config("gemma-4-26b-a4b")[0])) is None
    assert unmodelled_vision_tower(LLAVA_NEXT) == "LlavaNextForConditionalGeneration's vision tower (clip_vision_model)"
    sizeless = {**_maverick_config(), "vision_config": {"model_type": "llama4_vision_model"}}
    assert unmodelled_vision_tower(sizeless) == "Llama4ForConditionalGeneration's vision tower (llama4_vision_model)"
    assert unmodelled_vision_tower({"vision_config": {"hidden_size": 1}}) == (
        "a config without architectures's vision tower"
    )


@pytest.mark.parametrize("limits", [None, {"image": 0}, {"video": 0}], ids=["default", "image-0", "video-0"])
def test_an_unmodelled_tower_is_refused_under_a_runtime_profile(tmp_path: Path, limits: dict[str, int] | None) -> None:
    """LLaVA-NeXT with ``--runtime-profile``: vLLM profiles its encoder (image or video reach a tower without a
    trait: 999 each where unnamed), kvpools cannot: refused, naming the limits that turn it off (image, video and
    audio: a tower without a trait names no modalities)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAVA_NEXT))
    with pytest.raises(UnsupportedCombinationError) as raised:
        plan_vllm(str(path), gpu="h100", runtime_profile="0.33", weights_memory="16GiB", limit_mm_per_prompt=limits)
    assert str(raised.value).startswith(
        "kvpools does not model the encoder profile pass of LlavaNextForConditionalGeneration's vision tower "
        "(clip_vision_model) yet"
    )
    assert 'language_model_only or limit_mm_per_prompt \'{"image": 0, "video": 0, "audio": 0}\'' in str(raised.value)


LLAVA_NEXT = {
    "architectures": ["LlavaNextForConditionalGeneration"],
    "model_type": "llava_next",
    "text_config": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
    },
    "vision_config": {
        "model_type": "clip_vision_model",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "patch_size": 14,
        "image_size": 336,
    },
}
KIMI_VL = {
    "architectures": ["KimiVLForConditionalGeneration"],
    "model_type": "kimi_vl",
    "text_config": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "hidden_size": 2048,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "intermediate_size": 11264,
        "moe_intermediate_size": 1408,
        "n_routed_experts": 64,
        "num_experts_per_tok": 6,
        "vocab_size": 163840,
        "max_position_embeddings": 131072,
    },
    "vision_config": {"model_type": "moonvit", "hidden_size": 1152, "intermediate_size": 4304, "patch_size": 14},
}


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (LLAVA_NEXT, "LlavaNextForConditionalGeneration's vision tower (clip_vision_model)"),
        (KIMI_VL, "KimiVLForConditionalGeneration's vision tower (moonvit)"),
    ],
    ids=["llava-next", "kimi-vl"],
)
def test_towers_without_a_trait_are_refused(tmp_path: Path, config: dict[str, object], named: str) -> None:
    """LLaVA-NeXT (CLIP) and Kimi-VL (MoonViT) shaped configs (no bundled configs: their sizes here are only
    plausible): the ``text_config`` plans, the tower has no trait.  Before, a whole-GPU plan with a runtime profile
    charged no encoder pass (activation peak 1.88 / 2.78 GiB, the language model's alone); now refused, and planned
    under ``--language-model-only``."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    weights = "16GiB"  # given: kvpools estimates no LLaVA-NeXT weights (test_llava_next_weights_are_refused)
    with pytest.raises(UnsupportedCombinationError, match=re.escape(f"encoder profile pass of {named} yet")):
        plan_vllm(str(path), gpu="h100", runtime_profile="0.33", weights_memory=weights)
    planned = plan_vllm(str(path), gpu="h100", runtime_profile="0.33", weights_memory=weights, language_model_only=True)
    assert planned.runtime_memory


def test_llava_next_weights_are_refused_naming_the_field(tmp_path: Path) -> None:
    """Its CLIP tower's weights are not estimated (only Mistral-3's Pixtral tower is, around a llama text model):
    a whole-GPU plan asks for the weights instead of planning the text model alone."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAVA_NEXT))
    with pytest.raises(ConfigError, match="'vision_config' is set on a llava_next checkpoint"):
        plan_vllm(str(path), gpu="h100", runtime_profile="0.33")


def test_the_cli_refuses_an_unmodelled_tower_without_a_traceback(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kvpools_core.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(KIMI_VL))
    args = ["plan", str(path), "--gpu", "h100", "--accounting", "vllm", "--runtime-profile", "0.33"]
    result = CliRunner().invoke(main, [*args, "--weights-memory", "16GiB"])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert "kvpools does not model the encoder profile pass of KimiVLForConditionalGeneration" in result.output
    assert "--language-model-only" in result.output and "--runtime-profile" in result.output


def test_every_preset_with_a_vision_config_is_modelled_or_named() -> None:
    """No preset plans a vision tower silently: each one with a ``vision_config`` has a modelled tower or is named
    by :func:`unmodelled_vision_tower` (and refused under a runtime profile)."""
    from kvpools_core.engines.vllm.runtime_memory import _complete_config

    seen = 0
    from kvpools_core.registry import get_registry

    for name in registry_presets(get_registry()):
        config = dict(_complete_config(name)[0])
        if isinstance(config.get("vision_config"), dict):
            seen += 1
            assert (vision_shape_from_config(config) is None) == (unmodelled_vision_tower(config) is not None), name
    assert seen >= 4


def test_gemma4_plans_without_its_tower_where_no_encoder_pass_runs() -> None:
    """``--language-model-only``, or the tower's image and video at 0 (``gemma4_mm.py`` L1101 marks it with both),
    runs no encoder and loads no tower: the plan goes on without the vision tower and embedder's 1,145,588,886 B
    (kvpools' estimate of the config less the one without ``vision_config``: 51,611,872,466 -> 50,466,283,580 B);
    without a runtime profile nothing is refused (the activation terms are 0, an upper bound)."""
    text = plan_vllm("gemma-4-26b-a4b", gpu="h100", runtime_profile="0.33", language_model_only=True)
    assert text.runtime_memory is not None and text.weights_memory == (50_466_283_580,)
    zero = {"image": 0, "video": 0}
    limited = plan_vllm("gemma-4-26b-a4b", gpu="h100", runtime_profile="0.33", limit_mm_per_prompt=zero)
    assert limited.weights_memory == (50_466_283_580,)
    plain = plan_vllm("gemma-4-26b-a4b", gpu="h100")
    assert plain.runtime_memory is None and plain.weights_memory == (51_611_872_466,)
