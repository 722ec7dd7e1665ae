"""``--quantization`` with the checkpoint's own method (issue 34): the engines' ``_verify_quantization`` rules.

Each case cites the engine lines it reproduces (vLLM 0.33 and SGLang 0.5.23 as installed in the peers venv; the
rules are restated in :mod:`kvpools_core.parts.weights.methods`).  The engines' own functions are not run here:
vLLM's ``_verify_quantization`` calls ``get_quantization_config``, which imports every method class (CUDA kernels,
model files) that the ``--no-deps`` peers install cannot import; the expected answers are read from the cited code.
"""

from __future__ import annotations

import attrs
import pytest
from kvpools_plugins.dsv4.weights import VLLM_METHODS as DSV4_METHODS
from kvpools_plugins.swa.weights import VLLM_METHODS as SWA_METHODS

from kvpools_core import ConfigError, Serving, UnsupportedCombinationError, estimate_weights, hookimpl
from kvpools_core.parts.weights.methods import resolve_quantization
from kvpools_core.pipeline.gpus import platform_traits_of
from kvpools_core.testing.registries import isolated_registry
from kvpools_core.values import PlatformTraits
from tests.weights.test_hybrids_and_quantisation import LINEARS, UNQUANTISED, tiny_llama

MODEL_METHODS = {**SWA_METHODS, **DSV4_METHODS}
"""The architecture-specific vLLM methods the plugins declare, by model type (the core names no architecture)."""

MIXED = {
    # the Qwen3.6-35B-A3B NVFP4 checkpoint's shape (plugins/mamba/presets/full/qwen3.6-35b-a3b-nvfp4.json)
    "quant_method": "modelopt",
    "quant_algo": "MIXED_PRECISION",
    "quantized_layers": {"model.layers.0.mlp.experts": {"quant_algo": "NVFP4"}, "x.o_proj": {"quant_algo": "FP8"}},
}
NVFP4 = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}
MODELOPT_FP8 = {"quant_method": "modelopt", "quant_algo": "FP8"}
FP8_BLOCK = {"quant_method": "fp8", "weight_block_size": [128, 128]}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
MXFP4 = {"quant_method": "mxfp4"}
CT = {"quant_method": "compressed-tensors"}

MISMATCH = "does not match the quantization method specified in the `quantization` argument"
CUDA = platform_traits_of("cuda")
"""The cuda plugin's traits: SGLang's rules on CUDA come from the platform, never from the core."""


@pytest.mark.parametrize(
    ("requested", "quant", "model_type", "resolved"),
    [
        # modelopt.py L288-305 + L1658-1664: a modelopt MIXED_PRECISION checkpoint overrides any request to
        # modelopt_mixed (club-3090#612/#652 ran `--quantization modelopt` on one)
        ("modelopt", MIXED, "qwen3_5_moe", "modelopt_mixed"),
        (None, MIXED, "qwen3_5_moe", "modelopt_mixed"),
        ("awq", MIXED, "qwen3_5_moe", "modelopt_mixed"),  # the override ignores user_quant
        # L776-782: NVFP4 -> modelopt_fp4; L453-459: FP8 -> modelopt
        ("modelopt", NVFP4, "llama", "modelopt_fp4"),
        ("modelopt_fp4", NVFP4, "llama", "modelopt_fp4"),
        ("fp8", MODELOPT_FP8, "llama", "modelopt"),
        # auto_gptq.py L214-233 / auto_awq.py L263-286: the GPTQ / AWQ names (and none) -> auto_gptq / auto_awq
        ("gptq", GPTQ, "llama", "auto_gptq"),
        ("gptq_marlin", GPTQ, "llama", "auto_gptq"),
        (None, GPTQ, "llama", "auto_gptq"),
        ("awq_marlin", AWQ, "llama", "auto_awq"),
        ("awq", AWQ, "llama", "auto_awq"),
        # mxfp4.py L129-146: gpt-oss's mxfp4 -> gpt_oss_mxfp4 whatever was asked; another model's stays mxfp4
        ("fp8", MXFP4, "gpt_oss", "gpt_oss_mxfp4"),
        ("mxfp4", MXFP4, "llama4", "mxfp4"),
        # no override (model.py L1452-1461): equal names pass
        ("fp8", FP8_BLOCK, "qwen3", "fp8"),
        ("compressed-tensors", CT, "llama", "compressed-tensors"),
        # an unquantised checkpoint: fp8 (deprecated, served as fp8_per_tensor: model_loader/weight_utils.py
        # L351-361) and the online shorthands (config/quantization.py L195-209) quantise at load, nothing else
        ("fp8", None, "llama", "fp8"),
        ("fp8_per_tensor", None, "llama", "fp8_per_tensor"),
        (None, None, "llama", None),
    ],
)
def test_vllm_accepts_and_resolves_as_its_verify_quantization(
    requested: str | None, quant: dict[str, object] | None, model_type: str, resolved: str | None
) -> None:
    assert resolve_quantization("vllm", requested, quant, model_methods=MODEL_METHODS.get(model_type)) == resolved


@pytest.mark.parametrize(
    ("requested", "quant", "model_type", "checkpoint"),
    [
        ("awq", FP8_BLOCK, "deepseek_v3", "fp8"),  # no override answers: model.py L1455-1461
        ("fp8", MXFP4, "llama4", "mxfp4"),  # not gpt_oss: no mxfp4 override
        ("gpt_oss_mxfp4", MXFP4, "llama4", "mxfp4"),
        ("fp8", CT, "llama", "compressed-tensors"),
        ("awq", GPTQ, "llama", "gptq"),  # auto_gptq.py L223-233: awq is not a GPTQ name
        ("gptq", AWQ, "llama", "awq"),
    ],
)
def test_vllm_refuses_a_mismatch_with_its_message(
    requested: str, quant: dict[str, object], model_type: str, checkpoint: str
) -> None:
    with pytest.raises(UnsupportedCombinationError) as error:
        resolve_quantization("vllm", requested, quant, model_methods=MODEL_METHODS.get(model_type))
    message = str(error.value)
    assert f"quantization {requested} on a checkpoint quantised with {quant['quant_method']!r}" in message
    assert f"model config ({checkpoint}) {MISMATCH} ({requested})" in message
    assert "vLLM refuses it" in message and "Drop quantization" in message


@pytest.mark.parametrize(
    ("requested", "quant", "resolved"),
    [
        # model_config.py L1727-1741 + L1855-1865: MIXED_PRECISION with NVFP4 layers is modelopt_mixed, which
        # ModelOptMixedPrecisionConfig keeps whatever was asked (modelopt_quant.py L830-835)
        ("modelopt", MIXED, "modelopt_mixed"),
        ("modelopt_mixed", MIXED, "modelopt_mixed"),
        ("fp8", MIXED, "modelopt_mixed"),
        # base_config.py L242-245: --quantization modelopt becomes the algorithm's method (modelopt_utils.py)
        ("modelopt", NVFP4, "modelopt_fp4"),
        ("modelopt", MODELOPT_FP8, "modelopt_fp8"),
        # L249-252: a modelopt_fp8 / modelopt_fp4 checkpoint keeps its own method whatever else was asked
        ("modelopt_fp4", MODELOPT_FP8, "modelopt_fp8"),
        ("awq", NVFP4, "modelopt_fp4"),
        # awq.py L333-354, L402-424: a Marlin-compatible AWQ checkpoint -> awq_marlin unless awq was asked
        (None, AWQ, "awq_marlin"),
        ("awq_marlin", AWQ, "awq_marlin"),
        ("awq", AWQ, "awq"),
        # gptq.py L414-438, L459-481: likewise gptq_marlin
        (None, GPTQ, "gptq_marlin"),
        ("gptq_marlin", GPTQ, "gptq_marlin"),
        ("fp8", FP8_BLOCK, "fp8"),
        ("mxfp4", MXFP4, "mxfp4"),
        ("compressed-tensors", CT, "compressed-tensors"),
        ("fp8", None, "fp8"),
    ],
)
def test_sglang_accepts_and_resolves_as_its_verify_quantization(
    requested: str | None, quant: dict[str, object] | None, resolved: str
) -> None:
    assert resolve_quantization("sglang", requested, quant, traits=CUDA) == resolved


def test_sglang_refuses_a_mismatch_and_what_it_cannot_serve_on_cuda() -> None:
    # model_config.py L2142-2148: no override, not in compatible_quantization_methods
    with pytest.raises(UnsupportedCombinationError, match=rf"model config \(mxfp4\) {MISMATCH} \(fp8\)"):
        resolve_quantization("sglang", "fp8", MXFP4, traits=CUDA)
    # awq_marlin on an AWQ checkpoint without zero points: Marlin's only zero-point type is uint4 (marlin_utils.py
    # L93-95), so no override, and awq_marlin != awq
    with pytest.raises(UnsupportedCombinationError, match=rf"model config \(awq\) {MISMATCH} \(awq_marlin\)"):
        resolve_quantization("sglang", "awq_marlin", {**AWQ, "zero_point": False}, traits=CUDA)
    # --quantization modelopt on a MIXED_PRECISION checkpoint of FP8 layers only: w4afp8 (L1863-1865), and
    # modelopt is not compatible with it
    fp8_only = {**MIXED, "quantized_layers": {"a": {"quant_algo": "FP8"}}}
    with pytest.raises(UnsupportedCombinationError, match=rf"model config \(w4afp8\) {MISMATCH} \(modelopt\)"):
        resolve_quantization("sglang", "modelopt", fp8_only, traits=CUDA)
    # modelopt_fp4 is "compatible" with an fp8 checkpoint (L2046) because SGLang requantises its experts online:
    # kvpools does not model that
    with pytest.raises(UnsupportedCombinationError, match="does not model online requantisation"):
        resolve_quantization("sglang", "modelopt_fp4", FP8_BLOCK, traits=CUDA)
    # CUDA's registry has no gptq (layers/quantization/__init__.py L63-92): a GPTQ checkpoint Marlin cannot take
    # (desc_act unset) fails as "Unknown quantization method: gptq", asked for or not
    for requested in (None, "gptq"):
        with pytest.raises(UnsupportedCombinationError, match="Unknown quantization method: gptq"):
            resolve_quantization("sglang", requested, {**GPTQ, "desc_act": None}, traits=CUDA)
    # ... and so is gptq on a Marlin-compatible one (gptq.py L431-437 keeps what was asked)
    with pytest.raises(UnsupportedCombinationError, match="Unknown quantization method: gptq"):
        resolve_quantization("sglang", "gptq", GPTQ, traits=CUDA)
    # on a platform whose traits declare neither conversions nor refusals only the comparison applies
    assert resolve_quantization("sglang", "gptq", GPTQ, traits=PlatformTraits(platform="cuda")) == "gptq"


@pytest.mark.parametrize(
    ("platform", "requested", "quant", "resolved"),
    [
        # CUDA: both Marlin conversions (awq.py L409-424, gptq.py L414-481, marlin_utils.py L68-79 on sm80+)
        ("cuda", None, AWQ, "awq_marlin"),
        ("cuda", None, GPTQ, "gptq_marlin"),
        # ROCm: AWQMarlinConfig.is_awq_marlin_compatible returns False off CUDA (awq.py L409-410), so AWQ stays
        # awq, which ROCm's list has (model_config.py L2002-2016)
        ("rocm", None, AWQ, "awq"),
        ("rocm", "awq", AWQ, "awq"),
        ("rocm", "fp8", FP8_BLOCK, "fp8"),
        ("rocm", "compressed-tensors", CT, "compressed-tensors"),
        # Ascend NPUs register gptq (layers/quantization/__init__.py L107-116); torch.cuda reports no capability
        # there (utils/common.py L1170-1193: -1 < 80), so no Marlin conversion
        ("ascend", None, GPTQ, "gptq"),
        ("ascend", None, AWQ, "awq"),
        # SGLang's CPU registry has gptq (L119-128) and no capability: the same
        ("cpu", None, GPTQ, "gptq"),
    ],
)
def test_sglang_quantization_follows_the_platform_traits(
    platform: str, requested: str | None, quant: dict[str, object], resolved: str
) -> None:
    assert resolve_quantization("sglang", requested, quant, traits=platform_traits_of(platform)) == resolved


@pytest.mark.parametrize(
    ("platform", "requested", "quant", "refusal"),
    [
        # gptq.py L431-437 keeps an explicit gptq; neither CUDA's nor HIP's registry has it (L63-137, L2150-2155)
        ("cuda", "gptq", GPTQ, "refuses on platform 'cuda': 'Unknown quantization method: gptq'"),
        ("rocm", None, {**GPTQ, "desc_act": None}, "refuses on platform 'rocm': 'Unknown quantization method: gptq'"),
        # HIP converts a Marlin-compatible GPTQ checkpoint (the capability check alone, gptq.py L459-481; torch.cuda
        # reports an MI300X's 9.4), then refuses gptq_marlin: not in ROCm's list (model_config.py L2156-2160)
        (
            "rocm",
            None,
            GPTQ,
            "serves it as 'gptq_marlin'.*'gptq_marlin quantization is currently not supported in ROCm",
        ),
        # a ModelOpt checkpoint keeps its own method (base_config.py L249-252), which ROCm's list lacks
        ("rocm", None, NVFP4, "'modelopt_fp4 quantization is currently not supported in ROCm"),
        ("rocm", "modelopt", MIXED, "'modelopt_mixed quantization is currently not supported in ROCm"),
        # no AWQ conversion on HIP, so awq_marlin asked for is the mismatch SGLang raises first (L2142-2148)
        ("rocm", "awq_marlin", AWQ, rf"model config \(awq\) {MISMATCH} \(awq_marlin\)"),
    ],
)
def test_sglang_refuses_what_the_platform_refuses(
    platform: str, requested: str | None, quant: dict[str, object], refusal: str
) -> None:
    with pytest.raises(UnsupportedCombinationError, match=refusal):
        resolve_quantization("sglang", requested, quant, traits=platform_traits_of(platform))


def test_no_marlin_conversion_below_compute_capability_8() -> None:
    """marlin_utils.py L78: ``if device_capability < 80: return []``, so on a T4 (7.5) neither conversion runs:
    AWQ stays awq, and GPTQ is gptq, which CUDA's registry lacks."""
    t4 = attrs.evolve(CUDA, compute_capability=(7, 5))
    assert resolve_quantization("sglang", None, AWQ, traits=t4) == "awq"
    with pytest.raises(UnsupportedCombinationError, match="Unknown quantization method: gptq"):
        resolve_quantization("sglang", None, GPTQ, traits=t4)
    assert resolve_quantization("sglang", None, GPTQ, traits=attrs.evolve(CUDA, compute_capability=(8, 0))) == (
        "gptq_marlin"
    )


class VendorPlatform:
    """A third party's platform: SGLang converts AWQ to Marlin there and refuses modelopt_fp4 (made up)."""

    @hookimpl
    def platforms(self) -> dict[str, str]:
        return {"vendorhw": "a vendor's accelerator (kvpools' tests)"}

    @hookimpl(tryfirst=True)
    def platform_traits(self, serving: Serving) -> PlatformTraits | None:
        if serving.platform != "vendorhw":
            return None
        return PlatformTraits(
            platform="vendorhw",
            marlin_conversions={"awq"},
            refused_quantization={"modelopt_fp4": "no FP4 kernels on vendorhw"},
        )


def test_a_third_party_platform_declares_its_rules_and_estimate_weights_reads_them() -> None:
    """``estimate_weights`` resolves the platform's traits itself (the Serving is unresolved), so the vendor's
    declaration decides; the core names no platform."""
    registry = isolated_registry(["mha"], objects={"vendor": VendorPlatform()})
    on_vendor = Serving(platform="vendorhw", accounting="sglang")
    assert on_vendor.platform_traits is None
    marlin = estimate_weights(
        tiny_llama(AWQ, "float16"), attrs.evolve(on_vendor, quantization="awq_marlin"), registry=registry
    )
    assert marlin.bytes_total == estimate_weights(tiny_llama(AWQ, "float16"), registry=registry).bytes_total
    with pytest.raises(UnsupportedCombinationError, match="refuses on platform 'vendorhw': no FP4 kernels"):
        estimate_weights(tiny_llama(NVFP4), on_vendor, registry=registry)
    # gptq: the vendor declares no GPTQ conversion, so an explicit gptq_marlin is a mismatch (SGLang's L2142-2148)
    with pytest.raises(UnsupportedCombinationError, match=rf"model config \(gptq\) {MISMATCH} \(gptq_marlin\)"):
        estimate_weights(tiny_llama(GPTQ), attrs.evolve(on_vendor, quantization="gptq_marlin"), registry=registry)
    # the cpu plugin declares neither (SGLang's CPU registry has gptq, L119-128): an explicit gptq is served as is
    on_cpu = Serving(platform="cpu", accounting="sglang", quantization="gptq")
    served = estimate_weights(tiny_llama(GPTQ), on_cpu, registry=isolated_registry(["mha"]))
    assert any("already quantised (gptq)" in note for note in served.notes)


def test_estimate_weights_on_rocm_refuses_a_gptq_checkpoint_as_sglang_does() -> None:
    """The rocm plugin's traits through the default registry: SGLang on HIP serves this GPTQ checkpoint as
    gptq_marlin and refuses it (model_config.py L2156-2160); on CUDA it plans its storage."""
    assert estimate_weights(tiny_llama(GPTQ), Serving(accounting="sglang")).bytes_total > 0
    with pytest.raises(UnsupportedCombinationError, match="gptq_marlin quantization is currently not supported in"):
        estimate_weights(tiny_llama(GPTQ), Serving(platform="rocm", accounting="sglang"))


def test_a_checkpoint_method_on_an_unquantised_checkpoint_is_refused() -> None:
    # the fix names the engine's online method: SGLang's fp8, vLLM 0.33's fp8_per_tensor (its fp8 is deprecated for
    # online quantisation from 0.31: vllm/model_executor/model_loader/weight_utils.py L351-361)
    for engine, online in (("vllm", "fp8_per_tensor"), ("sglang", "fp8")):
        with pytest.raises(UnsupportedCombinationError, match=rf"no quantization_config.*quantization {online} to "):
            resolve_quantization(engine, "modelopt", None)


def test_engine_names_are_checked_per_accounting() -> None:
    # vLLM 0.33's QuantizationMethods has no modelopt_fp8 (SGLang's name); SGLang's choices have no auto_awq
    with pytest.raises(ConfigError, match=r"not one of vLLM's quantization methods.*modelopt: vLLM resolves"):
        Serving(quantization="modelopt_fp8", accounting="vllm")
    with pytest.raises(ConfigError, match="auto_awq is not one of SGLang's quantization methods"):
        Serving(quantization="auto_awq", accounting="sglang")
    assert Serving(quantization="auto_awq", accounting="vllm").quantization == "auto_awq"
    assert Serving(quantization="modelopt_fp8").quantization == "modelopt_fp8"


@pytest.mark.parametrize("method", ["bitsandbytes", "gguf", "w8a8_int8", "moe_wna16", "torchao", "quark"])
def test_methods_kvpools_does_not_model_are_refused_by_name(method: str) -> None:
    with pytest.raises(ConfigError, match=rf"kvpools does not model {method} weights yet"):
        Serving(quantization=method)
    with pytest.raises(ConfigError, match="must be one of none, fp8, modelopt"):
        Serving(quantization="int3")


def test_the_checkpoint_is_planned_as_it_is_stored_never_quantised_twice() -> None:
    """An AWQ checkpoint under ``--quantization awq`` / ``awq_marlin``: the AWQ bytes of
    ``test_hybrids_and_quantisation`` (qweight + qzeros int32, fp16 scales per 128-group), not fp8 of them."""
    config = tiny_llama(AWQ, "float16")
    plain = estimate_weights(config)
    expected = sum(
        inner * (out // 8 * 4) + (inner // 128) * (out // 8 * 4) + (inner // 128) * out * 2 for out, inner in LINEARS
    )
    assert plain.bytes_total == expected + 2 * UNQUANTISED
    for accounting, method in (("sglang", "awq"), ("sglang", "awq_marlin"), ("vllm", "auto_awq"), ("vllm", "awq")):
        served = estimate_weights(config, Serving(quantization=method, accounting=accounting))
        assert served.bytes_total == plain.bytes_total, (accounting, method)
        assert any("already quantised (awq)" in note for note in served.notes)
    # fp8 on the same checkpoint: both engines refuse (no override answers for fp8)
    for accounting in ("sglang", "vllm"):
        with pytest.raises(UnsupportedCombinationError, match=rf"model config \(awq\) {MISMATCH} \(fp8\)"):
            estimate_weights(config, Serving(quantization="fp8", accounting=accounting))
