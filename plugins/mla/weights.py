"""The weights of the MLA decoders this plugin parses (``estimate_weights`` hook), from the parts library."""

from __future__ import annotations

from collections.abc import Callable

from kvpools_core import hookimpl
from kvpools_core.parts.weights import Builder, WeightsConfig, WeightsEstimate, estimate_claimed, mla_decoder
from kvpools_core.values import Serving


@hookimpl
def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> WeightsEstimate | None:
    """The weights of the ``model_type`` values of :data:`DECODERS`, from the parts library; None for any other."""
    return estimate_claimed(config, serving, ep_size, DECODERS, DP_ATTENTION)


def _mla(builder: Builder, model_type: str) -> list[str]:
    """DeepSeek-V2/V3 and Kimi-K2 (:func:`~kvpools_core.parts.weights.mla_decoder`): MLA, MoE after
    ``first_k_dense_replace`` dense layers, MTP layers."""
    mla_decoder(builder)
    return []


DECODERS: dict[str, Callable[[Builder, str], list[str]]] = {
    "deepseek_v2": _mla,
    "deepseek_v3": _mla,
    "kimi_k2": _mla,
}
"""The ``model_type`` values whose weights this plugin estimates, and the function that lays out their tensors."""

DP_ATTENTION: dict[str, str] = {
    "deepseek_v2": "sglang/srt/models/deepseek_v2.py DeepseekV2AttentionMLA",
    "deepseek_v3": "sglang/srt/models/deepseek_v2.py DeepseekV2AttentionMLA",
    "kimi_k2": "sglang/srt/models/deepseek_v2.py DeepseekV2AttentionMLA",
}
"""The model types whose SGLang attention (and input embedding) shards over the attention-TP group under
``enable_dp_attention`` (``parallel_group="attn_tp"``, checked against SGLang 0.5.23), with the module that builds
it; the estimate refuses DP attention for the others."""
