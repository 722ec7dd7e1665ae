"""Which ``--quantization`` the engines accept on a checkpoint, and what they resolve it to (issue 34).

Both engines take, besides the runtime ``fp8`` of an unquantised checkpoint, the *checkpoint's* method name; they
check it against the checkpoint's ``quantization_config`` and fail to start on a mismatch.  Each engine first
asks its method classes whether one *overrides* the request for this checkpoint (a kernel choice such as
``awq_marlin``, or a ModelOpt checkpoint's own algorithm), then compares what is left.  The rules are reproduced
here from the engines' code, each with its source lines; kvpools then plans the checkpoint's own storage (no
double quantisation), or the runtime fp8 of an unquantised one.

vLLM 0.33 (``ModelConfig._verify_quantization``, vllm/config/model.py L1383-1466): the method classes without
an override are probed first (none overrides), then, in order, ``auto_gptq`` / ``gptq`` / ``gptq_marlin``
(``AutoGPTQConfig.override_quantization_method``, model_executor/layers/quantization/auto_gptq.py L214-233: a
``gptq`` checkpoint with no request or ``gptq`` / ``gptq_marlin`` / ``auto_gptq`` / ``marlin`` -> ``auto_gptq``),
the AWQ names (auto_awq.py L263-286, the same for ``awq`` on a GPU -> ``auto_awq``), ``inc`` (``auto-round``
checkpoints), ``moe_wna16`` (only when asked for), the ModelOpt classes (modelopt.py L288-305, L453-459,
L776-782, L1236-1242, L1658-1664: a ``quant_method`` starting ``modelopt`` with ``quant_algo`` ``FP8`` ->
``modelopt``, containing ``NVFP4`` or ``FP4`` -> ``modelopt_fp4``, containing ``MXFP8`` -> ``modelopt_mxfp8``,
``MIXED_PRECISION`` -> ``modelopt_mixed``, whatever was asked), then the architecture's own methods, which
the plugin that claims the architecture declares (``model_methods``: gpt-oss's ``gpt_oss_mxfp4``, mxfp4.py
L129-146, and DeepSeek-V4's ``deepseek_v4_fp8``, models/deepseek_v4/quant_config.py L171-188, which also answers
when asked for by name).  An override replaces the request; then a
request that differs from the checkpoint's method fails: "Quantization method specified in the model config (X)
does not match the quantization method specified in the `quantization` argument (Y)."

SGLang 0.5.23 (``ModelConfig._verify_quantization``, srt/configs/model_config.py L2000-2160): a ModelOpt
checkpoint's ``quant_method`` is first refined from its ``quant_algo`` (``_parse_modelopt_quant_config``, L1838-1890:
``MIXED_PRECISION`` with NVFP4 layers -> ``modelopt_mixed``, without -> ``w4afp8``; ``FP4`` / ``NVFP4`` in it ->
``modelopt_fp4``; ``FP8`` -> ``modelopt_fp8``; ``MXFP8`` -> ``mxfp8``).  The overrides, in the registry's order
(layers/quantization/__init__.py L63-92): the ModelOpt classes (base_config.py L223-253: ``--quantization
modelopt`` becomes the algorithm's method, ``canonicalize_modelopt_quant_algo`` in layers/modelopt_utils.py;
otherwise a ``modelopt_fp8`` / ``modelopt_fp4`` checkpoint keeps its own method whatever was asked; a
``modelopt_mixed`` one likewise, modelopt_quant.py L830-835), ``awq_marlin`` (awq/awq.py L333-354 and L402-424:
a 4-bit AWQ checkpoint with zero points and ``group_size`` -1/32/64/128, asked for nothing or ``awq_marlin`` /
``marlin``) and ``gptq_marlin`` (gptq/gptq.py L414-438 and L459-481: 4/8-bit, ``sym``, the same group sizes,
``desc_act`` given, not already in Marlin format), both on a device of compute capability 8.0 or newer
(marlin_utils.py L68-139), the AWQ one on CUDA only (awq.py L409-410).  A differing request is then accepted only
where SGLang lists it compatible (``modelopt_fp8`` / ``modelopt_fp4`` / ``modelopt_mixed`` on a ``modelopt``
checkpoint, ``modelopt_fp4`` on an ``fp8`` one, which requantises the experts and kvpools refuses), else the same
mismatch error; last, the method must be in SGLang's registry, which it builds per platform (CUDA's and ROCm's
have no ``gptq``: layers/quantization/__init__.py L63-137, model_config.py L2150-2155), and on ROCm in its
supported list (L2156-2160).

vLLM's runtime quantisation of an unquantised checkpoint depends on the release (issue 34): up to 0.30 ``fp8``
builds ``Fp8Config(is_checkpoint_fp8_serialized=False)``, which quantises at load with one float32 scale per layer
and per expert (vLLM 0.19 ``quantization/fp8.py`` L500-547 and L1008-1027; 0.24 L188-196 and 0.30 L188-223 hand it
to the per-tensor online methods).  0.20 added the online shorthands ``fp8_per_tensor`` and ``fp8_per_block``
(``quantization/__init__.py`` L40-43), 0.24 ``fp8_per_channel`` (``config/quantization.py`` L125).  From 0.31
``Fp8Config`` reads fp8 checkpoints only (0.33 ``quantization/fp8.py`` L105-112 raises "The `fp8` quantization
method no longer supports online quantization" when built for another), but the loader never builds it for an
unquantised checkpoint: ``get_quant_config`` finds no config file for ``fp8``, warns "--quantization fp8 is
deprecated for online quantization; use --quantization fp8_per_tensor instead." and serves ``fp8_per_tensor``
(0.31 ``model_loader/weight_utils.py`` L341-349, 0.33 L351-361, 0.34 L380-390): the same storage, accepted by every
release.  The shorthands are online methods only: on a quantised checkpoint they differ from its method and fail
as any other mismatch (``_verify_quantization``; ``OnlineQuantizationConfig`` overrides nothing).  Which release's
rules apply is :func:`vllm_release`'s (0.33 unless a plan names an older one).

Which conversions run and which methods are refused is the platform's to say, not this module's: the platform
plugin declares them in its :class:`~kvpools_core.values.PlatformTraits` (``marlin_conversions``,
``refused_quantization``), which the pipeline resolves into ``Serving.platform_traits``; the core names no
platform.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kvpools_core.errors import ConfigError, EngineRefusalError, UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.values import SGLANG_QUANTIZATION_METHODS, VLLM_QUANTIZATION_METHODS, PlatformTraits

__all__ = [
    "ENGINE_METHODS",
    "VLLM_FP8_DEPRECATION",
    "VLLM_FP8_ONLINE_UNTIL",
    "VLLM_ONLINE_FP8_SINCE",
    "current_vllm_release",
    "resolve_quantization",
    "vllm_release",
]

ENGINE_METHODS = {"vllm": VLLM_QUANTIZATION_METHODS, "sglang": SGLANG_QUANTIZATION_METHODS}
"""The ``--quantization`` names kvpools models, per engine: those in the engine's own choices whose checkpoints
the weights estimate reads."""

_MISMATCH = (
    "Quantization method specified in the model config ({checkpoint}) does not match the quantization method "
    "specified in the `quantization` argument ({requested})"
)
_MARLIN_GROUPS = (-1, 32, 64, 128)
_MODELOPT_ALGO = {"FP8": "modelopt_fp8", "MXFP8": "mxfp8", "FP4": "modelopt_fp4", "NVFP4": "modelopt_fp4"}
_MODELOPT_ALGO |= {"NVFP4_AWQ": "modelopt_fp4", "W4A16_NVFP4": "modelopt_fp4"}
"""SGLang's ``_MODELOPT_QUANT_ALGO_TO_METHOD`` (srt/layers/modelopt_utils.py)."""
_SGLANG_COMPATIBLE = {
    "modelopt_fp8": ("modelopt",),
    "modelopt_fp4": ("modelopt", "fp8"),
    "modelopt_mixed": ("modelopt",),
}
"""SGLang's ``compatible_quantization_methods`` (model_config.py L2042-2055), the entries kvpools models."""

VLLM_DEFAULT_RELEASE = (0, 33)
"""The vLLM release whose rules apply when a plan names none."""
VLLM_FP8_ONLINE_UNTIL = (0, 30)
"""The last vLLM release whose ``Fp8Config`` itself quantises an unquantised checkpoint; from 0.31 the loader serves
``--quantization fp8`` there as ``fp8_per_tensor`` after a deprecation warning (:data:`VLLM_FP8_DEPRECATION`)."""
VLLM_FP8_DEPRECATION = (
    "--quantization fp8 is deprecated for online quantization; use --quantization fp8_per_tensor instead."
)
"""vLLM 0.31+'s warning (``get_quant_config``, 0.33 ``model_loader/weight_utils.py`` L351-361)."""
VLLM_ONLINE_FP8_SINCE = {"fp8_per_tensor": (0, 20), "fp8_per_block": (0, 20), "fp8_per_channel": (0, 24)}
"""vLLM's online fp8 shorthands and the release that added each (``QuantizationMethods``, vLLM 0.20
``quantization/__init__.py`` L40-43; ``fp8_per_channel`` in 0.24's ``config/quantization.py`` L125-128)."""
_RELEASE: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("kvpools_vllm_release", default=None)


def _release(version: str) -> tuple[int, int]:
    """``(0, 19)`` of ``"0.19"``, ``"0.19.1"`` or ``"vllm==0.19"``."""
    parts = str(version).strip().lower().removeprefix("vllm==").split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise ConfigError(f"vLLM release {version!r} is not X.Y (0.19, 0.33).") from None


@contextmanager
def vllm_release(version: str | None) -> Iterator[None]:
    """Within the block, vLLM's quantisation rules are those of release ``version`` (a runtime profile's
    ``RuntimeProfile.version``: ``"0.19"``, ``"0.24"``); ``None`` keeps 0.33's.  vLLM's plan sets it around the
    weights estimate, which reaches :func:`resolve_quantization` through the architecture plugins' hook."""
    token = _RELEASE.set(None if version is None else _release(version))
    try:
        yield
    finally:
        _RELEASE.reset(token)


def current_vllm_release() -> tuple[int, int]:
    """The vLLM release whose rules apply here (:func:`vllm_release`; 0.33 outside one)."""
    return _RELEASE.get() or VLLM_DEFAULT_RELEASE


def _shown(release: tuple[int, int]) -> str:
    return ".".join(map(str, release))


def _vllm_online(requested: str | None) -> str | None:
    """vLLM's answer to ``--quantization requested`` on an unquantised checkpoint, by release: ``fp8`` everywhere
    (per tensor; deprecated from 0.31), a shorthand from the release that added it."""
    release = current_vllm_release()
    since = VLLM_ONLINE_FP8_SINCE.get(str(requested))
    if since is None or release >= since:
        return requested
    raise EngineRefusalError(
        f"{option('quantization')} {requested}: vLLM {_shown(release)} has no such method (vLLM added it in "
        f"{_shown(since)}). Pass {option('quantization')} fp8, which that release quantises per tensor at load, or "
        f"plan a release from {_shown(since)} on."
    )


def resolve_quantization(
    engine: str,
    requested: str | None,
    quant: Mapping[str, Any] | None,
    *,
    model_methods: Mapping[str, str] | None = None,
    traits: PlatformTraits | None = None,
) -> str | None:
    """The method ``engine`` serves ``quant`` (a checkpoint's ``quantization_config``, or ``None``) with under
    ``--quantization requested``, as its ``_verify_quantization`` resolves it; a mismatch the engine refuses is an
    :class:`UnsupportedCombinationError` naming the option, the checkpoint's method and the fix.  ``engine`` is
    ``"vllm"`` or ``"sglang"``; ``None`` is an unquantised checkpoint served unquantised.  ``traits`` are the
    serving platform's (``serving.traits``): SGLang's Marlin conversions run where they declare them
    (:meth:`~kvpools_core.values.PlatformTraits.converts_to_marlin`), and a resolved method they list in
    ``refused_quantization`` is refused with their reason; ``None`` (or traits declaring neither): the comparison
    of the request with the checkpoint alone.
    ``model_methods`` maps a checkpoint's ``quant_method`` to the vLLM method that overrides it for this
    architecture only (the claiming plugin's declaration, e.g. gpt-oss's ``{"mxfp4": "gpt_oss_mxfp4"}``): the core
    names no architecture."""
    name = "vLLM" if engine == "vllm" else "SGLang"
    if requested is not None and requested not in ENGINE_METHODS[engine]:
        raise EngineRefusalError(
            f"{option('quantization')} {requested}: {name}'s {option('quantization')} has no such method that "
            f"kvpools models (it takes {', '.join(ENGINE_METHODS[engine])})."
            + (" Use modelopt (vLLM resolves the checkpoint's algorithm)." if requested == "modelopt_fp8" else "")
        )
    if quant is None:
        online = "fp8"
        if engine == "vllm":
            if requested is None or requested == "fp8" or requested in VLLM_ONLINE_FP8_SINCE:
                return _vllm_online(requested)
            if requested == "mxfp4":  # a checkpoint method and, from 0.28, an online shorthand too
                raise UnsupportedCombinationError(
                    f"{option('quantization')} mxfp4 on a checkpoint with no quantization_config: vLLM quantises it "
                    "to MXFP4 at load (the online shorthand, vllm/config/quantization.py L214-217, served by "
                    "get_quant_config, model_loader/weight_utils.py L362-366); kvpools does not model online MXFP4 "
                    f"yet. Plan an MXFP4 checkpoint, or {option('quantization')} fp8_per_tensor / fp8_per_channel / "
                    "fp8_per_block."
                )
            # fp8 still works from 0.31 but is deprecated there: name the method vLLM asks for
            online = "fp8" if current_vllm_release() <= VLLM_FP8_ONLINE_UNTIL else "fp8_per_tensor"
        elif requested is None or requested == "fp8":
            return requested
        raise EngineRefusalError(
            f"{option('quantization')} {requested} on a checkpoint with no quantization_config: {requested} reads "
            f"the scales of a checkpoint quantised with it, which this one is not. Drop {option('quantization')}, "
            f"or pass {option('quantization')} {online} to quantise the weights at load."
        )
    if engine == "vllm":
        checkpoint, resolved = _vllm(requested, quant, model_methods or {})
    else:
        checkpoint, resolved = _sglang(requested, quant, traits)
    if resolved is not None and checkpoint is not None and resolved != checkpoint:
        if engine == "sglang" and checkpoint in _SGLANG_COMPATIBLE.get(resolved, ()):
            if checkpoint == "fp8":
                raise UnsupportedCombinationError(
                    f"{option('quantization')} {resolved} on a checkpoint quantised with 'fp8': SGLang requantises "
                    f"the MoE experts to NVFP4 at load; kvpools does not model online requantisation yet. Drop "
                    f"{option('quantization')} (the checkpoint's fp8 is served)."
                )
            return resolved
        raise EngineRefusalError(
            f"{option('quantization')} {requested} on a checkpoint quantised with {quant.get('quant_method')!r}: "
            f"{name} refuses it ('{_MISMATCH.format(checkpoint=checkpoint, requested=resolved)}'). Drop "
            f"{option('quantization')} (the checkpoint's own method is used)"
            + (f" or pass {option('quantization')} {checkpoint}." if checkpoint in ENGINE_METHODS[engine] else ".")
        )
    method = resolved if resolved is not None else checkpoint
    if engine == "sglang" and traits is not None and method in traits.refused_quantization:
        refusal = traits.refused_quantization[str(method)]
        raise EngineRefusalError(
            f"{option('quantization')} {requested or '(unset)'} on a checkpoint quantised with "
            f"{quant.get('quant_method')!r}: SGLang 0.5.23 serves it as {method!r}, which it refuses on platform "
            f"{traits.platform!r}: {refusal.rstrip('.')}. Plan a checkpoint (or {option('quantization')}) SGLang "
            f"serves there, or plan another engine's accounting ({option('accounting')} vllm)."
        )
    return method


def _vllm(
    requested: str | None, quant: Mapping[str, Any], model_methods: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """vLLM 0.33: the checkpoint's method and the request after the first override that answers."""
    method = str(quant.get("quant_method", ""))
    lowered = method.lower()
    override = None
    if lowered == "gptq" and requested in (None, "gptq", "gptq_marlin", "auto_gptq", "marlin"):
        override = "auto_gptq"
    elif lowered == "awq" and requested in (None, "awq", "awq_marlin", "auto_awq", "marlin"):
        override = "auto_awq"
    elif lowered.startswith("modelopt"):
        inner = quant.get("quantization")
        algo = str((inner if isinstance(inner, Mapping) else quant).get("quant_algo", "")).upper()
        if algo == "FP8":
            override = "modelopt"
        elif "NVFP4" in algo or "FP4" in algo:
            override = "modelopt_fp4"
        elif "MXFP8" in algo:
            override = "modelopt_mxfp8"
        elif algo == "MIXED_PRECISION":
            override = "modelopt_mixed"
    elif method in model_methods:
        override = model_methods[method]
    elif method in ("fp8", "deepseek_v4_fp8") and requested == "deepseek_v4_fp8":
        override = "deepseek_v4_fp8"
    if override is not None:
        return override, override
    return method or None, requested


def _sglang(
    requested: str | None, quant: Mapping[str, Any], traits: PlatformTraits | None
) -> tuple[str | None, str | None]:
    """SGLang 0.5.23: the checkpoint's method (refined for ModelOpt) and the request after overrides, the Marlin
    ones where ``traits`` say SGLang converts."""
    method = quant.get("quant_method")
    algo = ""
    if method is None or method == "modelopt":
        inner = quant.get("quantization")
        flat = inner if isinstance(inner, Mapping) else quant
        algo = str(flat.get("quant_algo") or "")
        if algo == "MIXED_PRECISION":
            layers = flat.get("quantized_layers") or {}
            nvfp4 = any(
                str(layer.get("quant_algo", "")).upper() in ("NVFP4", "W4A16_NVFP4")
                for layer in layers.values()
                if isinstance(layer, Mapping)
            )
            method = "modelopt_mixed" if nvfp4 else "w4afp8"
        elif algo and ("FP4" in algo or "NVFP4" in algo):
            method = "modelopt_fp4"
        elif algo == "FP8":
            method = "modelopt_fp8"
        elif algo == "MXFP8":
            method = "mxfp8"
    checkpoint = str(method if method is not None else (requested or "")).lower()
    override = None
    if requested == "modelopt" and _MODELOPT_ALGO.get(algo.upper()) is not None:
        override = _MODELOPT_ALGO[algo.upper()]
    elif checkpoint in ("modelopt_fp8", "modelopt_fp4", "modelopt_mixed"):
        override = checkpoint
    elif checkpoint in ("awq", "gptq") and traits is not None and traits.converts_to_marlin(checkpoint):
        marlin = f"{checkpoint}_marlin"
        if requested in (None, "marlin", marlin) and (_awq_marlin if checkpoint == "awq" else _gptq_marlin)(quant):
            override = marlin
    if override is not None:
        return override, override
    return checkpoint or None, requested


def _awq_marlin(quant: Mapping[str, Any]) -> bool:
    """``AWQMarlinConfig.is_awq_marlin_compatible`` where SGLang converts AWQ: 4-bit with zero points (Marlin's only
    zero-point type is ``uint4``) and a Marlin group size."""
    return quant.get("bits") == 4 and quant.get("zero_point") is True and quant.get("group_size") in _MARLIN_GROUPS


def _gptq_marlin(quant: Mapping[str, Any]) -> bool:
    """``GPTQMarlinConfig`` where SGLang converts GPTQ: not already Marlin format, 4/8-bit symmetric, a Marlin
    group size, ``desc_act`` given."""
    if quant.get("checkpoint_format") == "marlin" or quant.get("is_marlin_format", False):
        return False
    if quant.get("desc_act") is None or quant.get("sym") is not True:
        return False
    return quant.get("bits") in (4, 8) and quant.get("group_size") in _MARLIN_GROUPS
