"""vLLM's runtime quantisation of an unquantised checkpoint, by release (issue 34).

Read from the releases' own files (``pip download vllm==X --no-deps``): ``--quantization fp8`` quantises at load up
to 0.30 through ``Fp8Config(is_checkpoint_fp8_serialized=False)`` (0.19 ``quantization/fp8.py`` L500-547 per tensor
and L1008-1027 per expert, 0.30 L188-223 handing it to the per-tensor online methods). From 0.31 ``Fp8Config``
refuses to be built for an unquantised checkpoint (0.33 ``quantization/fp8.py`` L105-112: "The `fp8` quantization
method no longer supports online quantization"), but the loader never builds it there: ``get_quant_config`` warns
"--quantization fp8 is deprecated for online quantization; use --quantization fp8_per_tensor instead." and serves
``fp8_per_tensor`` (0.31 ``model_loader/weight_utils.py`` L341-349, 0.33 L351-361, 0.34 L380-390), so every release
takes ``fp8`` and stores it per tensor. The shorthands ``fp8_per_tensor`` / ``fp8_per_block`` exist from 0.20
(``quantization/__init__.py`` L40-43), ``fp8_per_channel`` from 0.24 (``config/quantization.py`` L125). What each
stores is vLLM 0.33's ``quantization/online/fp8.py`` (lines in the tests); every byte count below is worked by hand.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from kvpools_core import Serving, estimate_weights
from kvpools_core.cli import main
from kvpools_core.engines.vllm import plan_vllm, runtime_memory
from kvpools_core.engines.vllm.runtime_memory import moe_quant_scheme
from kvpools_core.errors import ConfigError, EngineRefusalError, UnsupportedCombinationError
from kvpools_core.parts.weights.methods import current_vllm_release, resolve_quantization, vllm_release
from tests.weights.test_dtype_and_runtime_quantisation import CONFIGS, LLAMA_8B

VLLM = Serving(accounting="vllm")
DEPRECATION = "--quantization fp8 is deprecated for online quantization; use --quantization fp8_per_tensor instead."
FP8_BLOCK = {"quant_method": "fp8", "weight_block_size": [128, 128]}

# Llama-3.1-8B per decoder layer: q 4096 x 4096, k and v 1024 x 4096, o 4096 x 4096, gate and up 14 336 x 4096,
# down 4096 x 14 336: 218 103 808 Linear parameters in 43 008 output rows; 32 layers hold 6 979 321 856 of them.
# The embedding and LM head (2 x 128 256 x 4096) and the 65 norms (x 4096) stay bf16: 2 101 878 784 B.
LLAMA_FP8 = 6_979_321_856
LLAMA_BF16_REST = 2_101_878_784


def _vllm(quantization: str | None, **kw: object) -> Serving:
    return Serving(accounting="vllm", quantization=quantization, **kw)  # type: ignore[arg-type]


# -- the rules per release


@pytest.mark.parametrize("release", [None, "0.16", "0.19", "0.24", "0.30", "0.31", "0.32", "0.34"])
def test_every_release_takes_fp8_on_an_unquantised_checkpoint(release: str | None) -> None:
    """Up to 0.30 ``Fp8Config`` quantises itself; from 0.31 the loader serves ``fp8_per_tensor`` in its place."""
    with vllm_release(release):
        assert resolve_quantization("vllm", "fp8", None) == "fp8"
    assert current_vllm_release() == (0, 33)  # the block restores 0.33's rules


@pytest.mark.parametrize(
    ("method", "first"), [("fp8_per_tensor", "0.20"), ("fp8_per_block", "0.20"), ("fp8_per_channel", "0.24")]
)
def test_the_online_shorthands_exist_from_their_release(method: str, first: str) -> None:
    before = {"0.20": "0.19", "0.24": "0.23"}[first]
    with vllm_release(first):
        assert resolve_quantization("vllm", method, None) == method
    with vllm_release(before), pytest.raises(EngineRefusalError) as error:
        resolve_quantization("vllm", method, None)
    # before 0.31 the fix is fp8 itself, which that release still quantises at load
    assert f"vLLM {before} has no such method (vLLM added it in {first}). Pass quantization fp8," in str(error.value)
    assert resolve_quantization("vllm", method, None) == method  # 0.33


def test_a_shorthand_on_a_quantised_checkpoint_is_vllms_mismatch() -> None:
    """``_verify_quantization`` (vllm/config/model.py L1452-1461): ``OnlineQuantizationConfig`` overrides nothing,
    so the shorthand differs from the checkpoint's ``fp8`` and vLLM fails to start."""
    with pytest.raises(UnsupportedCombinationError) as error:
        resolve_quantization("vllm", "fp8_per_tensor", FP8_BLOCK)
    assert "model config (fp8) does not match the quantization method specified in the `quantization` argument " in (
        str(error.value)
    )
    assert "(fp8_per_tensor)" in str(error.value) and "or pass quantization fp8." in str(error.value)


def test_online_mxfp4_is_not_modelled() -> None:
    """vLLM 0.33 takes ``--quantization mxfp4`` on an unquantised checkpoint as its online shorthand
    (config/quantization.py L214-217; ``Mxfp4Config.get_config_filenames()`` is empty, so ``get_quant_config`` serves
    ``OnlineQuantizationConfig``, model_loader/weight_utils.py L362-366): kvpools refuses it as not modelled rather
    than as a method reading absent scales."""
    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model online MXFP4 yet") as error:
        resolve_quantization("vllm", "mxfp4", None)
    assert not isinstance(error.value, EngineRefusalError)
    assert resolve_quantization("vllm", "mxfp4", {"quant_method": "mxfp4"}) == "mxfp4"  # a checkpoint's own


def test_sglang_keeps_fp8_and_has_no_shorthand() -> None:
    """SGLang 0.5.23's ``QUANTIZATION_CHOICES`` (srt/arg_groups/choices.py L34: ``fp8``, "MOE + linear online
    quantization") has no ``fp8_per_*``; its ``fp8`` still quantises an unquantised checkpoint."""
    assert resolve_quantization("sglang", "fp8", None) == "fp8"
    for method in ("fp8_per_tensor", "fp8_per_channel", "fp8_per_block"):
        with pytest.raises(ConfigError, match=f"{method} is not one of SGLang's quantization methods"):
            Serving(quantization=method, accounting="sglang")
        assert Serving(quantization=method, accounting="vllm").quantization == method


# -- the bytes each method stores (vLLM 0.33 quantization/online/fp8.py)


def test_fp8_per_tensor_keeps_one_scale_per_vllm_layer() -> None:
    """``Fp8PerTensorOnlineLinearMethod`` (L237-250): one float32 ``weight_scale`` per layer, and vLLM fuses
    q/k/v into ``qkv_proj`` and gate/up into ``gate_up_proj``: 4 layers x 4 B a decoder layer, 512 B in 32 layers.
    TP 2 halves the fp8 values (3 489 660 928 B) and the vocabulary (64 128 rows of embedding and head,
    1 050 673 152 B); the norms are whole (532 480 B) and each rank keeps its 4 scales a layer."""
    assert estimate_weights(LLAMA_8B, _vllm("fp8_per_tensor")).bytes_per_rank == LLAMA_FP8 + 512 + LLAMA_BF16_REST
    tp2 = estimate_weights(LLAMA_8B, _vllm("fp8_per_tensor", tp_size=2))
    assert tp2.bytes_per_rank == 3_489_660_928 + 512 + 1_050_673_152 + 532_480


def test_fp8_up_to_0_30_is_stored_as_fp8_per_tensor() -> None:
    """vLLM 0.19's online ``fp8`` (``Fp8OnlineLinearMethod``, fp8.py L539-547: ``scaled_fp8_quant(weight,
    scale=None)``, one scale a layer) stores what ``fp8_per_tensor`` does: 9 081 201 152 B = 8.457 GiB (the
    llm-d-planner run llmd-v0.19-llama-3.1-8b-runtime-fp8 logs 8.49 GiB), not SGLang's per-row 9 086 705 664 B."""
    with vllm_release("0.19"):
        old = estimate_weights(LLAMA_8B, _vllm("fp8"))
    assert old.bytes_per_rank == LLAMA_FP8 + 512 + LLAMA_BF16_REST == 9_081_201_152
    assert estimate_weights(LLAMA_8B, Serving(quantization="fp8")).bytes_per_rank == 9_086_705_664  # SGLang's


def test_fp8_per_channel_keeps_a_scale_per_output_row() -> None:
    """``Fp8PtpcOnlineLinearMethod`` (L426-440): ``amax`` over the input dimension, one float32 a row: 43 008 rows
    a layer, 1 376 256 in 32 layers, 5 505 024 B."""
    estimate = estimate_weights(LLAMA_8B, _vllm("fp8_per_channel"))
    assert estimate.bytes_per_rank == LLAMA_FP8 + 5_505_024 + LLAMA_BF16_REST


def test_fp8_per_block_keeps_a_scale_per_128_block() -> None:
    """``Fp8PerBlockOnlineLinearMethod`` (L337-350) with ``per_block_cast_to_fp8`` (utils/deep_gemm.py L1027-1046):
    ``ceil(out/128) x ceil(in/128)`` float32 scales. A layer: q 32 x 32, k and v 8 x 32, o 32 x 32, gate and up
    112 x 32, down 32 x 112 = 13 312 blocks; 32 layers 425 984 scales, 1 703 936 B. At TP 2 each rank's shard
    has half the blocks: q 16 x 32, k and v 4 x 32, o 32 x 16, gate and up 56 x 32, down 32 x 56 = 6 656 a layer,
    851 968 B."""
    assert estimate_weights(LLAMA_8B, _vllm("fp8_per_block")).bytes_per_rank == (
        LLAMA_FP8 + 1_703_936 + LLAMA_BF16_REST
    )
    tp2 = estimate_weights(LLAMA_8B, _vllm("fp8_per_block", tp_size=2))
    assert tp2.bytes_per_rank == 3_489_660_928 + 851_968 + 1_050_673_152 + 532_480


# Qwen3-30B-A3B: 48 layers of 128 experts (gate and up 768 x 2048, down 2048 x 768) and attention q 4096 x 2048,
# k and v 512 x 2048, o 2048 x 4096; the router stays bf16 (kept unquantised by the model code).
QWEN_MOE = str(CONFIGS / "Qwen--Qwen3-30B-A3B.json")
EXPERTS = 48 * 128 * 3 * 768 * 2048
ATTENTION = 48 * (4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096)


@pytest.mark.parametrize(
    ("method", "scales"),
    [
        # Fp8PerTensorOnlineMoEMethod (L617-647): one scale per expert for w13 and one for w2 (48 x 128 x 2);
        # attention: qkv_proj and o_proj, 2 a layer
        ("fp8_per_tensor", 4 * (48 * 128 * 2 + 48 * 2)),
        # Fp8PtpcOnlineMoEMethod (L809-838): w13_scale (E, 2 x 768, 1), w2_scale a row of w2 (2048): 3584 rows an
        # expert; attention 4096 + 512 + 512 + 2048 rows a layer
        ("fp8_per_channel", 4 * (48 * 128 * 3584 + 48 * 7168)),
        # Fp8PerBlockOnlineMoEMethod (L697-742): (E, 2 x 768/128, 2048/128) and (E, 2048/128, 768/128): 288 blocks
        # an expert; attention q 32 x 16, k and v 4 x 16, o 16 x 32 = 1152 a layer
        ("fp8_per_block", 4 * (48 * 128 * 288 + 48 * 1152)),
    ],
)
def test_moe_experts_per_method(method: str, scales: int) -> None:
    plain = estimate_weights(QWEN_MOE, VLLM)
    quantised = estimate_weights(QWEN_MOE, _vllm(method))
    # bf16 -> fp8 halves the experts and the attention Linears; the scales add on
    assert plain.bytes_per_rank - quantised.bytes_per_rank == EXPERTS + ATTENTION - scales


def test_fp8_per_block_pads_the_experts_to_128() -> None:
    """``Fp8PerBlockOnlineMoEMethod.maybe_roundup_sizes`` (L680-695) rounds the per-rank intermediate size up to
    128: at TP 4 Qwen3-30B-A3B's 768 / 4 = 192 becomes 256, so each rank stores gate, up and down of 256 x 2048 fp8
    (524 288 B each) with 2 x 16 scales each (128 B): 1 573 248 B an expert, 9 666 035 712 B for 48 x 128, where
    bf16 held 48 x 128 x 3 x 192 x 2048 x 2 = 14 495 514 624 B. Attention on a rank (q 1024 x 2048, k and v
    128 x 2048, o 2048 x 1024: 4 718 592 parameters, 9 437 184 B in bf16) becomes 4 718 592 B of fp8 and
    8 x 16 + 1 x 16 + 1 x 16 + 16 x 8 = 288 scales (1 152 B): 4 717 440 B less a layer."""
    plain = estimate_weights(QWEN_MOE, _vllm(None, tp_size=4))
    block = estimate_weights(QWEN_MOE, _vllm("fp8_per_block", tp_size=4))
    assert plain.bytes_per_rank - block.bytes_per_rank == (14_495_514_624 - 9_666_035_712) + 48 * 4_717_440


def test_the_experts_scheme_of_each_online_method() -> None:
    """The experts' MoE backend input: per-tensor weights with dynamic per-tensor activations (L594-615), 128-blocks
    with dynamic per-group activations (L495-506); per-channel weights are none of kvpools' schemes."""
    assert moe_quant_scheme({}, runtime="fp8_per_tensor") == moe_quant_scheme({}, runtime="fp8") == "fp8"
    assert moe_quant_scheme({}, runtime="fp8_per_block") == "fp8-block"
    assert moe_quant_scheme({}, runtime="fp8_per_channel") == "other"


# -- the plan and the command line


def test_plan_vllm_plans_fp8_per_tensor_and_notes_the_deprecation() -> None:
    """``plan_vllm`` plans ``fp8`` as vLLM stores it (per tensor: 9 081 201 152 B for Llama-3.1-8B, as
    ``fp8_per_tensor``) in every release, and from 0.31 (0.33 by default) repeats vLLM's deprecation warning; a
    release up to 0.30 (here 0.24's layout) has none. Under ``--memory`` (no weights estimated) a shorthand older
    than the release is refused alike."""
    new = plan_vllm("llama-3.1-8b", _vllm("fp8"), gpu="h100")
    shorthand = plan_vllm("llama-3.1-8b", _vllm("fp8_per_tensor"), gpu="h100")
    old = plan_vllm("llama-3.1-8b", _vllm("fp8"), gpu="h100", layout_version="0.24")
    assert new.weights_memory == shorthand.weights_memory == old.weights_memory == (9_081_201_152,)
    assert any(DEPRECATION in note and "vLLM 0.33 warns" in note for note in new.notes)
    assert not any(DEPRECATION in note for note in (*shorthand.notes, *old.notes))
    assert "--quantization fp8 " in new.serve_command()
    with pytest.raises(EngineRefusalError, match=r"vLLM 0\.19 has no such method \(vLLM added it in 0\.20\)"):
        plan_vllm("llama-3.1-8b", _vllm("fp8_per_tensor"), memory="20GiB", layout_version="0.19")


@pytest.fixture
def _no_installed_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime_memory, "installed_vllm_version", lambda: None)


PLAN = ("plan", "llama-3.1-8b", "--accounting", "vllm", "--gpu", "h100")


def test_cli_plans_fp8_on_vllm_0_33_with_its_deprecation() -> None:
    result = CliRunner().invoke(main, [*PLAN, "--quantization", "fp8"])
    assert result.exit_code == 0, result.output
    assert DEPRECATION in " ".join(result.output.split())
    assert "--quantization fp8 " in result.output


@pytest.mark.parametrize("method", ["fp8_per_tensor", "fp8_per_channel", "fp8_per_block"])
def test_cli_plans_and_echoes_each_shorthand(method: str) -> None:
    result = CliRunner().invoke(main, [*PLAN, "--quantization", method, "--json"])
    assert result.exit_code == 0, result.output
    assert f"--quantization {method} " in json.dumps(json.loads(result.output))


@pytest.mark.usefixtures("_no_installed_vllm")
def test_cli_older_release_keeps_fp8_and_lacks_the_newer_shorthands() -> None:
    result = CliRunner().invoke(
        main, [*PLAN[:2], "--gpu", "h100", "--engine-version", "vllm==0.24", "--quantization", "fp8"]
    )
    assert result.exit_code == 0, result.output
    assert "--quantization fp8 " in result.output
    refused = CliRunner().invoke(
        main, [*PLAN[:2], "--gpu", "h100", "--engine-version", "vllm==0.19", "--quantization", "fp8_per_channel"]
    )
    assert refused.exit_code == 1 and "Traceback" not in refused.output
    assert "vLLM 0.19 has no such method (vLLM added it in 0.24)" in refused.output


def test_the_release_asked_for_decides_not_its_profile_file() -> None:
    """vLLM 0.21 plans with ``vllm-0.24.json`` (0.20-0.25 behave the same for memory), but ``fp8_per_channel`` came in
    0.24 (``config/quantization.py`` L125): the rules are 0.21's, and its error names 0.21, not the file's 0.24."""
    args = [*PLAN[:2], "--gpu", "h100", "--quantization", "fp8_per_channel", "--engine-version"]
    refused = CliRunner().invoke(main, [*args, "vllm==0.21"])
    assert refused.exit_code == 1 and "vLLM 0.21 has no such method (vLLM added it in 0.24)" in refused.output
    assert CliRunner().invoke(main, [*args, "vllm==0.24"]).exit_code == 0


# -- invariants of the storage rules


@given(
    count=st.integers(1, 8),
    out=st.integers(1, 2048),
    inner=st.integers(1, 2048),
    parts=st.sampled_from([1, 2, 4, 8]),
)
def test_scales_split_over_column_parallel_ranks(count: int, out: int, inner: int, parts: int) -> None:
    """Splitting the output rows over ``parts`` ranks (column parallel, rows divisible): per-channel scales follow
    the rows, so the ranks' bytes add up to the whole; a per-tensor scale is kept once per rank (``amax`` all-reduced,
    ``amax_for_tp_weight_quant``); block scales add up when the rows split in whole 128-blocks, and cover at least
    the fp8 values otherwise."""
    from kvpools_core.parts.weights.quantisation import RuntimeFp8

    rows = out * parts

    class Linear:
        family, module, linear = "mlp", "model.layers.0.mlp.down_proj", True

    def storage(scheme: str) -> Any:
        quantisation = RuntimeFp8(scheme).for_tensor(Linear())
        assert quantisation is not None
        return quantisation.bytes_of

    assert storage("per_channel")(count, rows, inner) == parts * storage("per_channel")(count, out, inner)
    assert storage("per_tensor")(count, rows, inner) + (parts - 1) * 4 * count == parts * storage("per_tensor")(
        count, out, inner
    )
    block = storage("per_block")
    assert block(count, out, inner) >= count * out * inner
    if out % 128 == 0:
        assert block(count, rows, inner) == parts * block(count, out, inner)
