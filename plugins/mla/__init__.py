"""MLA (multi-head latent attention): DeepSeek-V2/V3/R1, Kimi-K2 and other ``kv_lora_rank`` models.

Every layer caches one latent row per token, shared by all heads, so tensor
parallelism does not shard it: ``kv_lora_rank + qk_rope_head_dim`` elements
(SGLang's ``MLATokenToKVPool``; ``MLATokenToKVPoolFP4`` for fp4 KV).  Claims
configs with an MLA latent that are neither DeepSeek sparse attention (the
``dsa`` plugin claims those, :func:`kvpools_core.config.is_deepseek_dsa`) nor
DeepSeek-V4; declines everything else.  The row, its bytes and its store are
the parts library's (:mod:`kvpools_core.parts.latent`,
:class:`kvpools_core.pools.mla.MLATokenToKVPool`); the speculative wrapper
adds the draft model's latent layers (NEXTN drafts use ``num_nextn_predict_layers``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpools_core import for_architecture, hookimpl
from kvpools_core.config import ConfigReader, is_deepseek_dsa, is_deepseek_v4
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.latent import (
    LatentRow,
    has_mla_latent,
    latent_cell_size,
    latent_model_spec,
    mla_problems,
    model_dims,
)
from kvpools_core.values import CellSize, ModelSpec, Plan, Serving

from .traits import architecture_traits as architecture_traits
from .weights import estimate_weights as estimate_weights

if TYPE_CHECKING:
    from kvpools_core.pools.layout import BufferLayout

ARCHITECTURE = "mla"
PRESET_DIR = Path(__file__).parent / "presets"


@hookimpl
def presets() -> dict[str, str]:
    return {path.stem: str(path) for path in sorted(PRESET_DIR.glob("*.json"))}


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    outer = ConfigReader(config, source)
    if not has_mla_latent(outer.text()) or is_deepseek_dsa(outer) or is_deepseek_v4(outer):
        return None
    return latent_model_spec(config, source, architecture=ARCHITECTURE, kind="mla")


@hookimpl
@for_architecture(ARCHITECTURE)
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    return mla_problems(model, serving)


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_layer_specs(engine: str, model: ModelSpec, serving: Serving) -> tuple[Any, ...] | None:
    """TensorRT-LLM's ``KVCacheManager`` layers (``--accounting trtllm``): this plugin's layer kinds
    ("mla",), as :func:`kvpools_core.parts.trtllm.trtllm_layer` makes them; None for other engines."""
    from kvpools_core.parts.trtllm import ENGINE, trtllm_layers_of

    return trtllm_layers_of(model, ("mla",)) if engine == ENGINE else None


@hookimpl
@for_architecture(ARCHITECTURE)
def vllm_kv_cache_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, Any] | None:
    """vLLM's ``MLAAttention.get_kv_cache_spec``: one ``MLAAttentionSpec`` latent row per layer."""
    from kvpools_core.parts.vllm.layers import latent_kv_cache_spec

    return {
        f"model.layers.{layer.index}.self_attn.attn": latent_kv_cache_spec(layer, model, serving, block_size)
        for layer in model.layers
    }


@hookimpl
@for_architecture(ARCHITECTURE)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    start, end = rank_layer_range(model, serving)
    row = LatentRow(model_dims(model), resolve_kv_dtype(serving.kv_cache_dtype, model.dtype))
    return latent_cell_size(row, end - start)


@hookimpl
@for_architecture(ARCHITECTURE)
def build_pool(plan: Plan, device: str, layout: BufferLayout | None) -> Any | None:
    from kvpools_core.pools.mla import MLATokenToKVPool

    return MLATokenToKVPool.from_plan(plan, device, layout=layout)
