"""The vision tower vLLM builds for the multimodal classes this plugin parses, and what sizes vLLM's CUDA-graph
estimate for some of them (``architecture_traits`` hook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpools_core import hookimpl

VISION_TOWERS = {
    "Gemma3ForConditionalGeneration": "vllm_vision_gemma3_siglip",
    "Llama4ForConditionalGeneration": "vllm_vision_llama4_vit",
    "Gemma4ForConditionalGeneration": "vllm_vision_gemma4_hf",
}
"""Gemma-3: ``SiglipVisionModel`` and ``Gemma3MultiModalProjector`` (vLLM 0.19.0 ``gemma3_mm.py`` L420-460,
``siglip.py`` L285-570); Llama-4 (Scout / Maverick): ``Llama4VisionModel``, its pixel-shuffle adapter and
``Llama4MultiModalProjector`` (vLLM 0.33 ``mllama4.py`` L123-549, L765-777); Gemma-4: transformers' ``AutoModel``
and ``Gemma4MultimodalEmbedder`` (``gemma4_mm.py`` L1100-1113; its encoder pass read from transformers 5.20.2, issue
34), marked with image and video (under which vLLM leaves it out)."""


CUDAGRAPH_TRAITS = {
    "Gemma3ForConditionalGeneration": ("vllm_prefix_lm",),
    "GptOssForCausalLM": ("vllm_attention_sinks", "vllm_cudagraph_capture_1024"),
}
"""What sizes vLLM's CUDA-graph estimate for these classes: Gemma-3's multimodal class is one of vLLM 0.33's PrefixLM
models (``transformers_utils/model_arch_config_convertor.py`` L352-366: TRITON_ATTN on a Hopper, no split-KV buffers
in its FULL graphs; the text-only ``Gemma3ForCausalLM`` is not); gpt-oss's attention has sinks (no split-KV
accumulators) and its config hook raises the capture ceiling to 1024 (``model_executor/models/config.py``
L544-562)."""


@hookimpl
def architecture_traits() -> Mapping[str, Sequence[str]]:
    traits: dict[str, tuple[str, ...]] = {architecture: (tower,) for architecture, tower in VISION_TOWERS.items()}
    for architecture, names in CUDAGRAPH_TRAITS.items():
        traits[architecture] = (*traits.get(architecture, ()), *names)
    return traits
