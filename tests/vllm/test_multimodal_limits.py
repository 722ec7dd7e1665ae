"""vLLM's ``--limit-mm-per-prompt`` / ``--language-model-only`` in ``plan_vllm`` and the CLI (issue 34).

vLLM 0.33: ``engine/arg_utils.py`` L419-421 (``json.loads``, the only spelling beside the dotted
``--limit-mm-per-prompt.image 2``), ``config/multimodal.py`` L210-235 (``count`` >= 0, default 999; the image /
video / audio dummy-size keys, anything else refused), L471-494 (a bare integer is the count), L696-709
(``get_limit_per_prompt``: 0 under ``--language-model-only``, 999 for a modality not named),
``model_executor/models/interfaces.py`` L346-392 (a tower whose modalities are all 0 is not built or loaded;
``qwen3_5.py`` L736 marks Qwen3.5 / 3.6's with image and video).  The encoder numbers are
``tests/vllm/test_runtime_terms.py``'s for the club-3090 runs (Qwen3.6-35B-A3B NVFP4 on an RTX 5090).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.engines.vllm import plan_vllm
from kvpools_core.engines.vllm.multimodal import MultimodalLimits, parse_multimodal_limits
from kvpools_core.errors import ConfigError
from kvpools_core.pipeline.weights import estimate_weights
from kvpools_core.values import Serving

QWEN36 = "qwen3.6-35b-a3b-nvfp4"
CUBLAS = 32 << 20
ENCODER = 2_022_703_104
"""One 16,384-token image: 65,536 patches x (1536 + 1152 + 72 + 12,672) x 2 B (test_runtime_terms.py)."""
HELD = 201_326_592 + 67_108_864
"""What one image leaves held through the language model's pass: its pixels and its encoder output."""
LANGUAGE = 696_254_464
"""The language model's activation peak alone at 8192 tokens, cuBLAS included (test_runtime_terms.py)."""
CLUB_3090 = {
    "gpu": "rtx-5090",
    "runtime_profile": "0.33",
    "max_num_seqs": 1,
    "max_num_batched_tokens": 8192,
    "max_model_len": 131072,
}
SERVING = Serving(kv_cache_dtype="fp8", quantization="modelopt")
CLI = (
    "plan", QWEN36, "--accounting", "vllm", "--gpu", "rtx-5090", "--runtime-profile", "0.33", "--kv-cache-dtype",
    "fp8", "--quantization", "modelopt", "--max-num-seqs", "1", "--max-num-batched-tokens", "8192",
    "--max-model-len", "131072",
)  # fmt: skip


def peak(result: Any) -> int:
    return int(result.runtime_memory.term("activation peak").bytes)


def test_the_forms_vllm_accepts() -> None:
    """A JSON object of counts, ``{"count": N}`` per modality (999 without a count), 999 for a modality not named,
    every limit 0 under ``--language-model-only`` whatever the object says."""
    limits = parse_multimodal_limits('{"image": 2, "video": {"count": 0}, "audio": {}}', None)
    assert limits is not None
    assert dict(limits.counts) == {"image": 2, "video": 0, "audio": 999}
    assert (limits.limit("image"), limits.limit("video"), limits.limit("audio"), limits.limit("vision_chunk")) == (
        2,
        0,
        999,
        999,
    )
    assert parse_multimodal_limits({"image": 0}, None) == MultimodalLimits(counts={"image": 0}, given={"image": 0})
    only = parse_multimodal_limits('{"image": 2}', True)
    assert only is not None and only.limit("image") == only.limit("video") == 0
    assert only.runtime_limits() == {"image": 0, "video": 0, "audio": 0}
    # a modality vLLM has no options class for (BaseDummyOptions) ignores other keys
    other = parse_multimodal_limits({"vision_chunk": {"count": 3, "size": 9}}, None)
    assert other is not None and other.limit("vision_chunk") == 3
    assert parse_multimodal_limits(None, None) is None
    assert parse_multimodal_limits(None, False) is None


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("image=2,video=0", r"does not take KEY=VALUE pairs.*got 'image=2,video=0'.*'\{\"image\": 2, \"video\": 0\}'"),
        ("[2]", r"must be a JSON object of items per modality, got '\[2\]'"),
        ('{"image": -1}', r"image must be a count >= 0 .*got -1"),
        ('{"image": true}', r"image must be a count >= 0 .*got True"),
        ('{"image": 2.5}', r"image must be a count >= 0 .*got 2.5"),
        ('{"image": {"count": 2, "width": 512}}', r"kvpools does not model the dummy item sizes yet.*Drop width"),
        ('{"video": {"count": 1, "fps": 2}}', r"video takes count, num_frames, width, height, got 'fps'"),
    ],
)
def test_what_is_refused_names_the_option_the_value_and_the_fix(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_multimodal_limits(value, None)


def test_a_python_caller_is_named_by_argument() -> None:
    with pytest.raises(ConfigError, match=r"^limit_mm_per_prompt's modalities are names"):
        parse_multimodal_limits({1: 2}, None)  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=r"^language_model_only is a flag"):
        parse_multimodal_limits(None, "yes")  # type: ignore[arg-type]


def test_the_club_3090_limits_charge_one_image() -> None:
    """``{"image": 2, "audio": 0}`` (their flag): one image fits the 8192-token budget (16,384 // 16,384), so the
    activation peak is the encoder's 2,022,703,104 + cuBLAS 33,554,432 = 2,056,257,536 B, as under vLLM's default of
    999 (the budget binds, not the count); the flag is echoed on the serve line and in --json."""
    given = plan_vllm(QWEN36, SERVING, limit_mm_per_prompt='{"image": 2, "audio": 0}', **CLUB_3090)  # type: ignore[arg-type]
    default = plan_vllm(QWEN36, SERVING, **CLUB_3090)  # type: ignore[arg-type]
    assert peak(given) == peak(default) == ENCODER + CUBLAS == 2_056_257_536
    assert given.weights_memory == default.weights_memory
    assert given.serve_command().endswith("""--limit-mm-per-prompt '{"image": 2, "audio": 0}'""")
    assert "--limit-mm-per-prompt" not in default.serve_command()
    data = given.to_dict()
    assert (data["limit_mm_per_prompt"], data["language_model_only"]) == ({"image": 2, "audio": 0}, False)
    assert "limit_mm_per_prompt" not in default.to_dict()


@pytest.mark.parametrize(
    "options",
    [{"limit_mm_per_prompt": {"image": 0, "video": 0}}, {"language_model_only": True}],
    ids=["limit-0", "language-model-only"],
)
def test_no_encoder_and_no_tower_when_images_and_videos_are_off(options: dict[str, Any]) -> None:
    """Every limit of the tower's modalities 0: no encoder pass (the language model's 696,254,464 B) and the vision
    tower's weights are not loaded: 446,571,248 parameters x 2 B (bf16) = 893,142,496 B less; the KV budget gains
    both, (2,056,257,536 - 696,254,464) + 893,142,496 = 2,253,145,568 B."""
    off = plan_vllm(QWEN36, SERVING, **CLUB_3090, **options)  # type: ignore[arg-type]
    default = plan_vllm(QWEN36, SERVING, **CLUB_3090)  # type: ignore[arg-type]
    assert peak(off) == LANGUAGE
    assert estimate_weights(QWEN36).parameters_by_family["vision"] == 446_571_248
    assert default.weights_memory[0] - off.weights_memory[0] == 446_571_248 * 2 == 893_142_496
    gained = off.budgets[0].available_kv_cache_memory - default.budgets[0].available_kv_cache_memory
    assert gained == (2_056_257_536 - LANGUAGE) + 893_142_496 == 2_253_145_568
    assert "less the vision tower's 0.83 GiB" in off.weights_source


def test_images_off_leaves_the_video_encoder_and_the_tower() -> None:
    """``{"image": 0}``: the video (unnamed: 999) is profiled, one 12,288-token video (``test_runtime_terms.py``),
    and the tower is loaded: the weights are the default's."""
    video = plan_vllm(QWEN36, SERVING, limit_mm_per_prompt={"image": 0}, **CLUB_3090)  # type: ignore[arg-type]
    default = plan_vllm(QWEN36, SERVING, **CLUB_3090)  # type: ignore[arg-type]
    assert video.weights_memory == default.weights_memory
    assert "1 video item(s) x 12288 tokens" in video.runtime_memory.term("activation peak").formula  # type: ignore[union-attr]


def test_a_count_lowers_the_items_as_vllm_budgets_them() -> None:
    """At 32,768 tokens a step the budget holds 32,768 // 16,384 = 2 images (999 allowed: min(2, 1 x min(999,
    131072 // 16384 = 8)) = 2), ``{"image": 1, "video": 0}`` one (min(2, 1 x 1)).  With ``L`` the language model's
    peak (the ``--language-model-only`` plan's, cuBLAS included) the activation peak is
    ``max(items x 2,022,703,104, L - cuBLAS + items x 268,435,456) + cuBLAS``."""
    wide = {**CLUB_3090, "max_num_batched_tokens": 32768}
    language = peak(plan_vllm(QWEN36, SERVING, language_model_only=True, **wide)) - CUBLAS  # type: ignore[arg-type]
    one = plan_vllm(QWEN36, SERVING, limit_mm_per_prompt='{"image": 1, "video": 0}', **wide)  # type: ignore[arg-type]
    default = plan_vllm(QWEN36, SERVING, **wide)  # type: ignore[arg-type]
    assert peak(one) == max(ENCODER, language + HELD) + CUBLAS
    assert peak(default) == max(2 * ENCODER, language + 2 * HELD) + CUBLAS
    assert peak(one) < peak(default)
    assert "1 image item(s)" in one.runtime_memory.term("activation peak").formula  # type: ignore[union-attr]
    assert "2 image item(s)" in default.runtime_memory.term("activation peak").formula  # type: ignore[union-attr]


def test_a_text_model_and_a_kv_budget_echo_the_flags_and_plan_the_same() -> None:
    """Llama-3.1-8B has no tower and ``--memory`` no profile: the plan is the same, the serve line carries them."""
    plain = plan_vllm("llama-3.1-8b", memory="20GiB")
    limited = plan_vllm("llama-3.1-8b", memory="20GiB", limit_mm_per_prompt={"image": 0}, language_model_only=True)
    assert limited.plan == plain.plan
    flags = """ --limit-mm-per-prompt '{"image": 0}' --language-model-only"""
    assert limited.serve_command() == plain.serve_command() + flags


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_the_cli_end_to_end() -> None:
    """``kvpools plan`` takes vLLM's spelling, prints it back on the serve line, and plans what the API plans."""
    result = cli(*CLI, "--limit-mm-per-prompt", '{"image": 0, "video": 0}', "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["runtime_memory"]["terms"]["activation peak"]["bytes"] == LANGUAGE
    assert data["serve_command"].endswith("""--limit-mm-per-prompt '{"image": 0, "video": 0}'""")
    default = json.loads(cli(*CLI, "--json").stdout)
    assert default["budget"][0]["weights_memory"] - data["budget"][0]["weights_memory"] == 893_142_496
    only = cli(*CLI, "--language-model-only")
    assert only.exit_code == 0, only.output
    assert "--language-model-only" in only.output.replace("\n", " ")
    capacity = cli(
        "capacity", QWEN36, "--accounting", "vllm", "--gpu", "rtx-5090", "--runtime-profile", "0.33",
        "--kv-cache-dtype", "fp8", "--quantization", "modelopt", "--max-num-seqs", "1", "--language-model-only",
        "--json",
    )  # fmt: skip
    assert capacity.exit_code == 0, capacity.output
    assert json.loads(capacity.stdout)["serve_command"].endswith("--language-model-only")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--limit-mm-per-prompt", "image=2"), "--limit-mm-per-prompt must be a JSON object"),
        (("--limit-mm-per-prompt", '{"image": {"count": 1, "height": 64}}'), "Drop height"),
    ],
)
def test_the_cli_refuses_with_one_line(args: tuple[str, ...], message: str) -> None:
    result = cli(*CLI, *args)
    assert result.exit_code == 1
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("accounting", ["sglang", "exact"])
@pytest.mark.parametrize("flag", [("--limit-mm-per-prompt", '{"image": 0}'), ("--language-model-only",)])
def test_other_accountings_refuse_them(accounting: str, flag: tuple[str, ...]) -> None:
    result = cli("plan", "llama-3.1-8b", "--memory", "20GiB", "--accounting", accounting, *flag)
    assert result.exit_code == 1
    assert f"{flag[0]} is vLLM's: only with --accounting vllm" in result.output


def test_gemma_3s_tower_is_marked_with_images_only() -> None:
    """``gemma3_mm.py`` L552 marks Gemma-3's tower with image alone: ``{"image": 0}`` drops its 421,290,864 bf16
    parameters (842,581,728 B), ``{"video": 0}`` drops nothing (and no runtime profile: Gemma-3's encoder pass is not
    modelled, the weights still are)."""
    config = "tests/weights/configs/google--gemma-3-12b-it.json"
    default = plan_vllm(config, gpu="h100")
    images_off = plan_vllm(config, gpu="h100", limit_mm_per_prompt={"image": 0})
    videos_off = plan_vllm(config, gpu="h100", limit_mm_per_prompt={"video": 0})
    assert estimate_weights(config).parameters_by_family["vision"] == 421_290_864
    assert default.weights_memory[0] - images_off.weights_memory[0] == 421_290_864 * 2 == 842_581_728
    assert videos_off.weights_memory == default.weights_memory
