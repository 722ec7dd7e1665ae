"""The vision towers vLLM builds for the multimodal classes this plugin parses (``architecture_traits`` hook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpools_core import hookimpl

VISION_TOWERS = {
    "Qwen3VLForConditionalGeneration": "vllm_vision_qwen3_vit",
    "Qwen3VLMoeForConditionalGeneration": "vllm_vision_qwen3_vit",
    "Mistral3ForConditionalGeneration": "vllm_vision_pixtral_hf",
}
"""Qwen3-VL: ``Qwen3_VisionTransformer`` (vLLM 0.33 ``qwen3_vl.py`` L561-870); Mistral-Small-3.1
(``Mistral3ForConditionalGeneration``): ``PixtralHFVisionModel`` and the Mistral-3 projector (vLLM 0.19.0
``mistral3.py`` L334-360, ``pixtral.py`` L1198-1300)."""


@hookimpl
def architecture_traits() -> Mapping[str, Sequence[str]]:
    return {architecture: (tower,) for architecture, tower in VISION_TOWERS.items()}
