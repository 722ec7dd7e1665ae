"""What SGLang decides from the class of the DeepSeek sparse-attention models (``architecture_traits`` hook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpools_core import hookimpl

MLA_BACKEND_ARCHITECTURES = (
    "DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "DeepseekV32ForCausalLM",
    "GlmMoeDsaForCausalLM",
    "GlmMoeDsaForCausalLMNextN",
    "Glm5NextForConditionalGeneration",
    "Glm5NextForConditionalGenerationNextN",
    "MistralLarge3ForCausalLM",
)
"""The DSA classes SGLang 0.5.23 runs with ``AttentionArch.MLA`` (``srt/configs/model_config.py`` lines 1366-1397
and after: ``use_mla_backend``); DSA keeps MLA's latent cache and backend.  ``PixtralForConditionalGeneration``,
which ``is_deepseek_dsa`` also accepts, is not among them."""


@hookimpl
def architecture_traits() -> Mapping[str, Sequence[str]]:
    return dict.fromkeys(MLA_BACKEND_ARCHITECTURES, ("mla_backend",))
