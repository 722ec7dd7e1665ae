"""What SGLang decides from the class of the hybrid models this plugin parses (``architecture_traits`` hook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpools_core import hookimpl

MLA_BACKEND_ARCHITECTURES = ("KimiLinearForCausalLM", "KimiK3LinearForCausalLM")
"""Kimi-Linear's classes: their full-attention layers are MLA, and SGLang 0.5.23 runs them with
``AttentionArch.MLA`` (``srt/configs/model_config.py`` lines 1366-1397 and after: ``use_mla_backend``)."""

QWEN3_VISION_ARCHITECTURES = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
"""Qwen3.5 / 3.6: vLLM builds their vision tower as ``Qwen3_VisionTransformer`` (vLLM 0.33 ``qwen3_5.py`` L473 /
L703), whose encoder profile pass kvpools models (``vllm_vision_qwen3_vit``)."""


@hookimpl
def architecture_traits() -> Mapping[str, Sequence[str]]:
    """Every class this plugin parses has a recurrent state (SGLang's ``mambaish_config``); Kimi-Linear's also run
    the MLA backend; Qwen3.5 / 3.6 have vLLM's Qwen3-VL vision tower."""
    from .config import _FAMILY_BY_ARCHITECTURE

    traits: dict[str, tuple[str, ...]] = dict.fromkeys(_FAMILY_BY_ARCHITECTURE, ("mambaish_state",))
    for architecture in MLA_BACKEND_ARCHITECTURES:
        traits[architecture] = (*traits.get(architecture, ()), "mla_backend")
    for architecture in QWEN3_VISION_ARCHITECTURES:
        traits[architecture] = (*traits.get(architecture, ()), "vllm_vision_qwen3_vit")
    return traits
