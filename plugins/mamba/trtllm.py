"""The hybrid models' answer to ``engine_layer_specs`` for TensorRT-LLM (``--accounting trtllm``).

TensorRT-LLM 1.2's PyTorch backend serves the hybrids its ``is_hybrid_linear`` recognises
(``_torch/pyexecutor/config_utils.py``: Nemotron-H, a config with ``hybrid_override_pattern``; Qwen3-Next and
Qwen3.5, by architecture) with a Mamba cache manager, and normalises their state geometry into
``MambaKVCacheParams`` (``extract_mamba_kv_cache_params``).  kvpools plans the unified C++ pool,
``CppMambaHybridCacheManager`` (the route ``kv_cache_config.use_kv_cache_manager_v2: false`` selects): the
full-attention layers' KV blocks and one recurrent-state block per request in one ``KVCacheManager``.

Each model layer becomes a :class:`~kvpools_core.parts.trtllm.TrtllmLayer`: a full-attention layer its KV, a
Mamba2 / Gated DeltaNet layer its state (:class:`~kvpools_core.parts.trtllm.TrtllmMambaState`), an MLP / MoE
block nothing.  Refused, with the reason: the families TensorRT-LLM's hybrid path does not take (Falcon-H1,
Granite-4.0-H, Jamba: ``extract_mamba_kv_cache_params`` raises "is not a supported hybrid Mamba config"),
Kimi-Linear and Qwen4-Exp (managers kvpools has not reproduced).
"""

from __future__ import annotations

from kvpools_core.dtypes import MODEL_DTYPES
from kvpools_core.parts.trtllm import (
    TrtllmLayer,
    TrtllmMambaState,
    trtllm_layer,
    trtllm_refusal,
    trtllm_state_layer,
    trtllm_uncached_layer,
)
from kvpools_core.values import ModelSpec

from .config import ATTENTION, LINEAR_ATTENTION, MAMBA, NO_CACHE

TRTLLM_QWEN_ARCHITECTURES = frozenset(
    {
        "Qwen3NextForCausalLM",
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM",
        # Qwen3.5's VLM checkpoints: TensorRT-LLM flattens their text_config into Qwen3_5(Moe)ForCausalLM
        # (_Qwen35ConfigCompat.normalize).
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
    }
)


def _state_of(model: ModelSpec) -> TrtllmMambaState:
    geometry = model.params["state"]
    family = model.params["family"]
    readings = model.params.get("trtllm") or {}
    conv_bytes = MODEL_DTYPES[model.dtype]
    ssm_dtype = readings.get("ssm_dtype")
    if ssm_dtype is not None and ssm_dtype not in MODEL_DTYPES:
        raise trtllm_refusal(model, f"an SSM state dtype of {ssm_dtype!r}")
    ssm_bytes = MODEL_DTYPES[ssm_dtype] if ssm_dtype else conv_bytes
    if family == "qwen_gdn":  # state_size = linear_key_head_dim, n_groups = linear_num_key_heads, ...
        return TrtllmMambaState(
            state_size=geometry["k_head_dim"],
            conv_kernel=geometry["conv_kernel"],
            num_heads=geometry["num_v_heads"],
            n_groups=geometry["num_k_heads"],
            head_dim=geometry["v_head_dim"],
            conv_dtype_bytes=conv_bytes,
            ssm_dtype_bytes=ssm_bytes,
        )
    return TrtllmMambaState(
        state_size=geometry["state_size"],
        conv_kernel=geometry["conv_kernel"],
        num_heads=geometry["num_heads"],
        n_groups=geometry["n_groups"],
        head_dim=geometry["head_dim"],
        conv_dtype_bytes=conv_bytes,
        ssm_dtype_bytes=ssm_bytes,
    )


def hybrid_trtllm_layers(model: ModelSpec) -> tuple[TrtllmLayer, ...]:
    """Every layer of ``model`` as ``CppMambaHybridCacheManager`` sizes it (see the module docstring)."""
    family = model.params.get("family")
    architecture = (model.params.get("vllm") or {}).get("architecture", "")
    if model.params.get("ple"):
        raise trtllm_refusal(model, "Qwen4-Exp's per-layer embedding (PLE) state")
    supported = (family == "nemotron_h" and (model.params.get("trtllm") or {}).get("nemotron_pattern")) or (
        family == "qwen_gdn" and architecture in TRTLLM_QWEN_ARCHITECTURES
    )
    if not supported:
        raise trtllm_refusal(
            model,
            f"the {family} hybrid family ({architecture or model.model_type}): TensorRT-LLM 1.2's hybrid cache "
            "managers take Nemotron-H (hybrid_override_pattern) and Qwen3-Next / Qwen3.5 only "
            "(is_hybrid_linear; extract_mamba_kv_cache_params raises 'is not a supported hybrid Mamba config')",
        )
    state = _state_of(model)
    layers = []
    for layer in model.layers:
        if layer.kind == ATTENTION:
            layers.append(trtllm_layer(model, layer))
        elif layer.kind in (MAMBA, LINEAR_ATTENTION):
            layers.append(trtllm_state_layer(layer.index, state))
        elif layer.kind == NO_CACHE:
            layers.append(trtllm_uncached_layer(layer.index))
        else:
            raise trtllm_refusal(model, f"layer {layer.index} of kind {layer.kind!r}")
    return tuple(layers)


__all__ = ["TRTLLM_QWEN_ARCHITECTURES", "hybrid_trtllm_layers"]
