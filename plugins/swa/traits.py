"""The vision tower vLLM builds for the multimodal classes this plugin parses (``architecture_traits`` hook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpools_core import hookimpl

VISION_TOWERS = {"Gemma3ForConditionalGeneration": "vllm_vision_gemma3_siglip"}
"""Gemma-3: ``SiglipVisionModel`` and ``Gemma3MultiModalProjector`` (vLLM 0.19.0 ``gemma3_mm.py`` L420-460,
``siglip.py`` L285-570)."""


@hookimpl
def architecture_traits() -> Mapping[str, Sequence[str]]:
    return {architecture: (tower,) for architecture, tower in VISION_TOWERS.items()}
