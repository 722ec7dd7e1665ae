"""MHA / GQA: every layer keeps full-attention K and V for every token.

Recognises dense decoder configs (llama, mistral without a sliding window,
qwen2/3 and their MoE variants, minimax_m2, mimo, ...); declines configs that
have MLA latents, sliding windows, recurrent layers or a sparse-attention
indexer (``sparse_attention_config``), which belong to other plugins.  Cell
size follows SGLang's ``DefaultPoolConfigurator``: KV heads per
rank × (head_dim + v_head_dim) × layers × element size, with the fp4 scale
term; kvpools' exact figure also charges mxfp8 scales and DCP's head layout
(:mod:`kvpools_core.parts.attention`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpools_core import for_architecture, hookimpl
from kvpools_core.config import (
    ConfigReader,
    context_length,
    derived_head_dim,
    grouped_kv_heads,
    model_dtype,
    sliding_window_active,
)
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.attention import attention_cell_size, host_row_width_problems, scale_block_problems
from kvpools_core.values import CellSize, EngineDefault, LayerSpec, ModelSpec, Plan, Serving

from .traits import architecture_traits as architecture_traits
from .weights import estimate_weights as estimate_weights

if TYPE_CHECKING:
    from kvpools_core.pools.layout import BufferLayout

ARCHITECTURE = "mha"

DENSE_MODEL_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "minimax_m2",
        "mimo",
        "phi3",
        "phi",
        "gemma",
        "internlm2",
        "granite",
        "granitemoe",
        "olmo2",
        "exaone",
        "glm4",
        "starcoder2",
    }
)
"""Families whose every layer is full attention (unless a sliding window is switched on)."""

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
_KV_HEAD_KEYS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num", "num_attention_groups")
_FOREIGN_MARKERS = (
    "kv_lora_rank",
    "layer_types",
    "hybrid_layer_pattern",
    "hybrid_override_pattern",
    "layers_block_type",
    "sparse_attention_config",
    "full_attention_interval",  # Qwen3-Next-style linear-attention hybrids (the mamba plugin)
    "attn_layer_period",  # Jamba-style attention/Mamba interleaving (the mamba plugin)
)

PRESET_DIR = Path(__file__).parent / "presets"


@hookimpl
def presets() -> dict[str, str]:
    return {path.stem: str(path) for path in sorted(PRESET_DIR.glob("*.json"))}


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    outer = ConfigReader(config, source)
    reader = outer.text()
    if reader.string("model_type") not in DENSE_MODEL_TYPES and outer.string("model_type") not in DENSE_MODEL_TYPES:
        return None
    if any(reader.has(key) for key in _FOREIGN_MARKERS) or sliding_window_active(reader):
        return None
    num_layers = reader.integer("num_hidden_layers")
    num_heads = reader.integer("num_attention_heads")
    head_dim = reader.optional_integer("head_dim") or derived_head_dim(reader, num_heads)
    v_head_dim = reader.optional_integer("v_head_dim") or head_dim
    phi = reader.string("model_type") == "phi"
    kv_heads = num_heads if phi else grouped_kv_heads(reader, num_heads, _KV_HEAD_KEYS)
    if phi:
        # SGLang's PhiAttention caches every head (sglang/srt/models/phi.py L75-79, num_kv_heads=self.num_heads)
        # of hidden_size / num_attention_heads (L41), whatever num_key_value_heads says.
        kv_heads, head_dim = num_heads, reader.integer("hidden_size") // num_heads
        v_head_dim = head_dim
    layers = [
        LayerSpec(index=i, kind="attention", num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_head_dim)
        for i in range(num_layers)
    ]
    return ModelSpec(
        name=source,
        architecture=ARCHITECTURE,
        layers=layers,
        context_len=context_length(reader, _CONTEXT_KEYS),
        dtype=model_dtype(reader, float32_served_as=float32_served_as(reader.string("model_type", ""))),
        num_attention_heads=num_heads,
        model_type=reader.string("model_type") or outer.string("model_type"),
        hf_architectures=outer.string_list("architectures"),
        source=source,
        num_nextn_predict_layers=reader.integer("num_nextn_predict_layers", 0, minimum=0),
        is_multimodal=reader is not outer,
    )


@hookimpl
@for_architecture(ARCHITECTURE)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    start, end = rank_layer_range(model, serving)
    return attention_cell_size(model.layers[start:end], model, serving, nvfp4=True)


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_layer_specs(engine: str, model: ModelSpec, serving: Serving) -> tuple[Any, ...] | None:
    """TensorRT-LLM's ``KVCacheManager`` layers (``--accounting trtllm``): this plugin's layer kinds
    ("attention",), as :func:`kvpools_core.parts.trtllm.trtllm_layer` makes them; None for other engines."""
    from kvpools_core.parts.trtllm import ENGINE, trtllm_layers_of

    return trtllm_layers_of(model, ("attention",)) if engine == ENGINE else None


@hookimpl
@for_architecture(ARCHITECTURE)
def vllm_kv_cache_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, Any] | None:
    """vLLM's ``Attention.get_kv_cache_spec`` for a decoder layer: one ``FullAttentionSpec`` per layer, the heads
    of one TP rank (``vllm/model_executor/layers/attention/attention.py``)."""
    from kvpools_core.parts.vllm.layers import kv_element_bytes, kv_heads_per_rank
    from kvpools_core.parts.vllm.specs import FullAttentionSpec

    dtype_bytes = kv_element_bytes(model, serving)
    return {
        f"model.layers.{layer.index}.self_attn.attn": FullAttentionSpec(
            block_size=block_size,
            num_kv_heads=kv_heads_per_rank(layer.num_kv_heads, serving.tp_size),
            head_size=layer.head_dim,
            head_size_v=layer.v_head_dim,
            dtype_bytes=dtype_bytes,
        )
        for layer in model.layers
    }


@hookimpl
@for_architecture(ARCHITECTURE)
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    dims = [layer.head_dim for layer in model.layers] + [layer.v_head_dim for layer in model.layers]
    problems = scale_block_problems(dims, kv, model.name) + host_row_width_problems(model.layers, serving, model.name)
    if kv.name == "nvfp4":  # SGLang 0.5.23's NVFP4KVCacheMethod (kvpools_core.parts.nvfp4)
        from kvpools_core.parts.nvfp4 import nvfp4_problems

        k_dims = tuple(layer.head_dim for layer in model.layers)
        problems += nvfp4_problems(serving, k_dims, tuple(layer.v_head_dim for layer in model.layers))
    return problems


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_defaults(model: ModelSpec, serving: Serving) -> list[EngineDefault] | None:
    """``--kv-cache-dtype nvfp4``: SGLang 0.5.23 decodes with ``trtllm_mha`` (``handle_nvfp4_prefill_kv_dequant_dtype``,
    ``arg_groups/kv_cache_hook.py``), whose page constraint turns an unset (1) page into 64
    (``_mla_backend_page_constraints``, ``arg_groups/overrides.py``)."""
    if serving.kv_cache_dtype != "nvfp4":
        return None
    from kvpools_core.parts.nvfp4 import TRTLLM_MHA_DEFAULT_PAGE

    reason = (
        "SGLang 0.5.23 decodes nvfp4 with trtllm_mha, which pages by 16, 32, 64 or 128 (page 1 becomes 64: "
        "_mla_backend_page_constraints in arg_groups/overrides.py)"
    )
    return [EngineDefault(option="page_size", value=TRTLLM_MHA_DEFAULT_PAGE, reason=reason)]


@hookimpl
@for_architecture(ARCHITECTURE)
def retraction_host_pool(plan: Plan) -> bool:
    """A dense MHA pool (``MHATokenToKVPool``) is one SGLang's decode retraction backs up in a host pool."""
    return True


@hookimpl
@for_architecture(ARCHITECTURE)
def build_pool(plan: Plan, device: str, layout: BufferLayout | None) -> Any | None:
    from kvpools_core.pools.mha import MHATokenToKVPool, NoOpMHATokenToKVPool

    if plan.serving.prefill_only_disable_kv_cache:  # SGLang's _build_mha_kv_pool, ref-000 lines 2006-2010
        return NoOpMHATokenToKVPool.from_plan(plan, device, layout=layout)
    if plan.serving.kv_cache_dtype == "nvfp4":  # NVFP4KVCacheMethod's buffers
        from kvpools_core.pools.nvfp4 import Nvfp4MHATokenToKVPool

        return Nvfp4MHATokenToKVPool.from_plan(plan, device, layout=layout)
    return MHATokenToKVPool.from_plan(plan, device, layout=layout)


def float32_served_as(model_type: str) -> str:
    """SGLang's ``_get_and_verify_dtype`` (``configs/model_config.py`` L2284-2344): a float32 Gemma checkpoint is
    served in bfloat16, any other in float16."""
    return "bfloat16" if model_type.startswith("gemma") else "float16"
