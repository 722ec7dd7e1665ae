"""vLLM 0.33's encoder profile pass for Gemma-4's vision tower (issue 34: it was refused).  Every number is
hand-computed from the sources (vLLM 0.33 in ``/tmp/kvpools-peers-venv``; transformers 5.20.2, the newest vLLM 0.33's
``Requires-Dist: transformers<5.21.0,>=5.16.1`` accepts, read from its wheel):

* ``model_executor/models/gemma4_mm.py``: L124-126 (``_VIDEO_MAX_SOFT_TOKENS`` 70, ``_VIDEO_MAX_FRAMES`` 32),
  L272-296 (tokens an item: image ``default_output_length`` 280, video 32 x (70 + 2 + 6) = 2496, audio
  ``audio_seq_length``), L305-343 (``_compute_num_soft_tokens``), L526-554 (the dummy 224 x 224 image, 32 such frames),
  L1272-1303 (``_encoder_chunk``: ``max(1, min(free // 2, total // 10) // (patches x 4 x 10240 x 8))``), L1319-1472
  (images: per chunk ``torch.cat`` copies, outputs kept per image), L1474-1589 (video: all frames' padding mask,
  chunk slices, outputs listed then ``torch.cat``), L984-1022 (the embedder: RMSNorm, projection to 2816).
* transformers 5.20.2 ``models/gemma4/image_processing_gemma4.py`` L216-268 (patches padded to ``max_soft_tokens x 9``:
  2520 an image, 630 a frame); ``modeling_gemma4.py`` L585-627 (patch embedder, ``F.embedding``), L697-711 (MLP:
  gate, act, up, product: 3 intermediate live), L903-969 (attention), L972-1013 (layer: input kept by the caller,
  residual, normed input), L1016-1057 (encoder: bool ``[b, 1, S, S]`` mask, rotary cos / sin of ``head_dim``).
* ``google/gemma-4-26B-A4B`` (``tests/weights/configs``): vision hidden 1152, intermediate 4304, 16 heads of 72 (16 kv),
  patch 16, pooling 3, position table 10240, ``default_output_length`` 280; text hidden 2816.

Per patch (bf16, 2 B): MLP (3 x 1152 + 3 x 4304) x 2 = 32,736 B; attention (2 x 1152 + 1152 + 2 x 1152 + 2 x 1152)
x 2 = 16,128 B + the mask's bf16 conversion and its 16-padded copy (630 + 640) x 2 = 2,540 (video) -> 18,668, or
(2520 + 2528) x 2 = 10,096 (image) -> 26,224: the MLP binds.  A frame's patch carries besides: embeddings 1152 x 2 +
rotary 2 x 72 x 2 = 2,592, the mask 630 + 1: 35,959 B; an image's also the call's copies 768 x 2 + 16 + 1 = 1,553 and
the mask 2520 + 1: 39,402 B.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvpools_core.engines.vllm.deployment import plan_vllm
from kvpools_core.engines.vllm.runtime_memory import (
    GEMMA4_TRANSFORMERS,
    gemma4_encoder_batch,
    gemma4_soft_tokens,
    item_sizes,
    mm_encoder_profile,
    profiled_modality,
    unmodelled_vision_tower,
    vision_shape_of,
)
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.pipeline.gpus import VLLM_VISION_GEMMA4

GEMMA4 = "gemma-4-26b-a4b"
TOTAL = 85_000_000_000
FRAME_COST = 630 * 4 * 10240 * 8  # 206,438,400 B: vLLM's one_hot price of a 630-patch frame
IMAGE_COST = 2520 * 4 * 10240 * 8  # 825,753,600 B
VIDEO_INPUTS = 96 * 630 * (768 * 2 + 16)  # 93,864,960 B: 3 videos x 32 frames, bf16 pixels + int64 (x, y)


def _profile(limits: dict[str, int] | None = None, *, used: int = 50_000_000_000, total: int = TOTAL) -> object:
    vision = vision_shape_of(GEMMA4)
    assert vision is not None
    return mm_encoder_profile(
        vision,
        max_num_batched_tokens=8192,
        max_num_seqs=1024,
        max_model_len=262_144,
        mm_limits=limits,
        gpu_total_bytes=total,
        gpu_used_bytes=used,
    )


def test_the_gemma4_tower_is_read_from_the_config() -> None:
    vision = vision_shape_of(GEMMA4)
    assert vision is not None and vision.tower == VLLM_VISION_GEMMA4
    assert (vision.hidden_size, vision.intermediate_size, vision.num_heads, vision.attention_head_dim) == (
        1152,
        4304,
        16,
        72,
    )
    assert (vision.patch_size, vision.spatial_merge_size, vision.position_embedding_size) == (16, 3, 10240)
    assert (vision.image_tokens, vision.out_hidden_size, vision.audio_tokens) == (280, 2816, 0)
    from kvpools_core.engines.vllm.runtime_memory import _complete_config

    assert unmodelled_vision_tower(dict(_complete_config(GEMMA4)[0])) is None
    assert GEMMA4_TRANSFORMERS == "5.20.2"


def test_items_and_the_dummy_pictures() -> None:
    """Image 280 tokens over 2520 padded patches, video 2496 over 32 x 630; the dummy 224-pixel picture resizes to
    768 pixels at 280 (scale sqrt(2520 / 196) = 3.586, 224 x 3.586 / 48 = 16.7 -> 16 x 48): 48^2 / 9 = 256 tokens,
    and to 384 at 70 (sqrt(630 / 196) = 1.793 -> 8 x 48): 24^2 / 9 = 64."""
    vision = vision_shape_of(GEMMA4)
    assert vision is not None
    assert item_sizes(vision) == {"image": (280, 2520), "video": (2496, 20_160)}
    assert gemma4_soft_tokens(vision, 280) == 256
    assert gemma4_soft_tokens(vision, 70) == 64
    assert gemma4_soft_tokens(vision, 1120) == 1089  # sqrt(10080 / 196) = 7.171: 224 x 7.171 / 48 = 33.5 -> 99^2 / 9
    assert profiled_modality(vision) == "video"
    assert profiled_modality(vision, {"video": 0}) == "image"
    assert profiled_modality(vision, {"image": 0, "video": 0}) is None


def test_the_batch_bound_both_ways() -> None:
    """``_encoder_chunk``: the total's tenth binds while half the free memory is more (8.5e9 // 206,438,400 = 41),
    half the free memory where it is less (2,453,067,520 // 206,438,400 = 11); a budget <= 0 gives 1."""
    assert (
        gemma4_encoder_batch(
            patches_per_item=630, position_embedding_size=10240, free_bytes=35_000_000_000, total_bytes=TOTAL
        )
        == 41
    )
    assert (
        gemma4_encoder_batch(
            patches_per_item=630, position_embedding_size=10240, free_bytes=4_906_135_040, total_bytes=TOTAL
        )
        == 11
    )
    assert (
        gemma4_encoder_batch(patches_per_item=630, position_embedding_size=10240, free_bytes=0, total_bytes=TOTAL) == 1
    )
    assert (
        gemma4_encoder_batch(patches_per_item=630, position_embedding_size=10240, free_bytes=-5, total_bytes=TOTAL) == 1
    )


def test_video_by_default_bounded_by_the_total() -> None:
    """Defaults (999 a modality): video (2496 > 280); items min(8192 // 2496, 1024 x min(999, 262144 // 2496)) = 3,
    96 frames.  Free 85e9 - 50e9 - 93,864,960 inputs: half of it is above 8.5e9, so 41 frames a call: calls at frames
    0, 41, 82 (41, 41, 14).  The second: 41 x 630 x 2304 B earlier outputs + 41 x 630 x 35,959 = 988,333,290; the
    third 82 x 630 x 2304 + 14 x 630 x 35,959 = 436,183,020.  After: the listed outputs and their ``torch.cat`` 2 x 96
    x 630 x 2304 = 278,691,840 + 6144 pooled tokens x max(8 x 1152 + 2304, 4608 + 4608 + 5632) = 91,226,112.  Peak:
    inputs + the padding mask 60,480 + 988,333,290 = 1,082,258,730; held: inputs + 6144 x 2816 x 2 = 128,467,968."""
    profile = _profile()
    assert profile is not None
    assert (profile.modality, profile.items, profile.tokens_per_item) == ("video", 3, 2496)
    assert profile.encoder_peak_bytes == VIDEO_INPUTS + 60_480 + 988_333_290 == 1_082_258_730
    assert profile.held_bytes == VIDEO_INPUTS + 34_603_008 == 128_467_968
    assert "41 a tower call" in profile.formula and "the GPU's total / 10" in profile.formula
    assert profile == _profile({"image": 0})  # video only: the same pass


def test_video_bounded_by_the_free_memory_ends_at_the_outputs() -> None:
    """80e9 used: free 5e9 - 93,864,960, half 2,453,067,520: 11 frames a call (8 of 11, one of 8).  The largest call
    (at frame 77) 77 x 630 x 2304 + 11 x 630 x 35,959 = 360,962,910 is below the end, 278,691,840 + 91,226,112 =
    369,917,952: peak 93,925,440 + 369,917,952 = 463,843,392."""
    profile = _profile(used=80_000_000_000)
    assert profile is not None
    assert profile.encoder_peak_bytes == 93_925_440 + 369_917_952 == 463_843_392
    assert "11 a tower call" in profile.formula and "free / 2" in profile.formula


def test_images_only() -> None:
    """``{"video": 0}``: images, 8192 // 280 = 29 items of 2520 patches; 8.5e9 // 825,753,600 = 10 a call (10, 10, 9).
    Inputs 29 x 2520 x 1552 = 113,420,160.  The second call: 10 x 2520 x 2304 + 10 x 2520 x 39,402 = 1,050,991,200
    (the third 20 x 2520 x 2304 + 9 x 2520 x 39,402 = 1,009,758,960; the end 168,376,320 + 7424 x 14,848 less).
    Peak 1,164,411,360; held inputs + 29 x 256 x 2816 x 2 = 155,232,128."""
    profile = _profile({"video": 0})
    assert profile is not None
    assert (profile.modality, profile.items, profile.tokens_per_item) == ("image", 29, 280)
    assert profile.encoder_peak_bytes == 113_420_160 + 1_050_991_200 == 1_164_411_360
    assert profile.held_bytes == 113_420_160 + 41_811_968 == 155_232_128
    assert f"{IMAGE_COST}" not in profile.formula  # the price is shown by its factors
    assert "10 a tower call" in profile.formula


def test_no_modality_no_pass_and_the_total_is_needed() -> None:
    assert _profile({"image": 0, "video": 0}) is None
    vision = vision_shape_of(GEMMA4)
    assert vision is not None
    with pytest.raises(ConfigError, match="gpu_total_bytes"):
        mm_encoder_profile(vision, max_num_batched_tokens=8192, max_num_seqs=1024, max_model_len=262_144)


def test_gemma4_plans_with_the_encoder_term() -> None:
    """Before: refused under ``--runtime-profile``.  Now planned; the activation term names the encoder's pass: 41
    frames a call on the H100 (free 79.19 - 48.07 GiB weights - 0.25 GiB non-torch - inputs, half above 7.92 GiB)."""
    result = plan_vllm(GEMMA4, gpu="h100", runtime_profile="0.33")
    assert result.runtime_memory is not None
    term = result.runtime_memory.term("activation peak")
    assert "3 video item(s) x 2496 tokens = 96 video frames x 630 padded patches" in term.formula
    assert "41 a tower call" in term.formula and "transformers 5.20.2" in term.formula
    images = plan_vllm(GEMMA4, gpu="h100", runtime_profile="0.33", limit_mm_per_prompt={"video": 0})
    assert images.runtime_memory is not None
    assert (
        "29 image item(s) x 280 tokens = 29 images x 2520 padded patches"
        in images.runtime_memory.term("activation peak").formula
    )


def test_the_cli_plans_gemma4() -> None:
    from click.testing import CliRunner

    from kvpools_core.cli import main

    args = ["plan", GEMMA4, "--gpu", "h100", "--accounting", "vllm", "--runtime-profile", "0.33"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "multimodal encoder: 3 video item(s)" in result.output


def test_an_audio_tower_is_refused_only_where_audio_is_profiled(tmp_path: Path) -> None:
    """With an ``audio_config`` (750 tokens an item): video (2496) is still profiled by default and planned; with
    video at 0 audio (750 > 280) would be, and its tower is not modelled: refused, naming the limit; with audio at 0
    too, the images are; ``--language-model-only`` profiles nothing."""
    from kvpools_core.engines.vllm.runtime_memory import _complete_config

    config = {**_complete_config(GEMMA4)[0], "audio_config": {"model_type": "gemma4_audio"}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    weights = "48GiB"
    planned = plan_vllm(str(path), gpu="h100", runtime_profile="0.33", weights_memory=weights)
    assert planned.runtime_memory is not None
    assert "video item(s)" in planned.runtime_memory.term("activation peak").formula
    with pytest.raises(UnsupportedCombinationError, match="audio tower yet") as raised:
        plan_vllm(
            str(path), gpu="h100", runtime_profile="0.33", weights_memory=weights, limit_mm_per_prompt={"video": 0}
        )
    assert "'{\"audio\": 0}'" in str(raised.value)
    images = plan_vllm(
        str(path),
        gpu="h100",
        runtime_profile="0.33",
        weights_memory=weights,
        limit_mm_per_prompt={"video": 0, "audio": 0},
    )
    assert images.runtime_memory is not None
    assert "image item(s)" in images.runtime_memory.term("activation peak").formula
    text = plan_vllm(str(path), gpu="h100", runtime_profile="0.33", weights_memory=weights, language_model_only=True)
    assert text.runtime_memory is not None  # every modality 0, audio included: no encoder pass, nothing refused
    assert "multimodal encoder" not in text.runtime_memory.term("activation peak").formula
