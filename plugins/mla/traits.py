"""What SGLang decides from the class of the MLA models this plugin parses (``architecture_traits`` hook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpools_core import hookimpl

MLA_BACKEND_ARCHITECTURES = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "Glm4MoeLiteForCausalLM",
    "Glm4MoeLiteForCausalLMNextN",
    "LongcatFlashForCausalLM",
    "LongcatFlashForCausalLMNextN",
    "HYV4ForCausalLM",
    "HYV4ForCausalLMNextN",
    "DotsVLMForCausalLM",
    "Dots3NoteForCausalLM",
    "Dots3NoteForCausalLMNextN",
    "MistralLarge3ForCausalLM",
    "MistralLarge3ForCausalLMEagle",
    "KimiK25ForConditionalGeneration",
    "Eagle3DeepseekV2ForCausalLM",
    "GigaChat35ForCausalLM",
    "GigaChat35ForCausalLMNextN",
    "MiniCPM3ForCausalLM",
    "KimiVLForConditionalGeneration",
    "KimiK3ForConditionalGeneration",
)
"""The latent-attention classes SGLang 0.5.23 runs with ``AttentionArch.MLA`` (``srt/configs/model_config.py``
lines 1366-1397 and the ``elif`` branches after them: ``use_mla_backend``), but for the DSA and Kimi-Linear ones
the dsa and mamba plugins name."""


@hookimpl
def architecture_traits() -> Mapping[str, Sequence[str]]:
    return dict.fromkeys(MLA_BACKEND_ARCHITECTURES, ("mla_backend",))
