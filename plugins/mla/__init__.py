"""MLA (multi-head latent attention): DeepSeek-V2/V3/R1, Kimi-K2 and other ``kv_lora_rank`` models.

Every layer caches one latent row per token, shared by all heads, so tensor
parallelism does not shard it: ``kv_lora_rank + qk_rope_head_dim`` elements
(SGLang's ``MLATokenToKVPool``; ``MLATokenToKVPoolFP4`` for fp4 KV).  Claims
configs with an MLA latent that are neither DeepSeek sparse attention (the
``dsa`` plugin, see :func:`~.config.is_deepseek_dsa`) nor DeepSeek-V4;
declines everything else.  The speculative wrapper adds the draft model's
latent layers (NEXTN drafts use ``num_nextn_predict_layers``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpools_core import hookimpl
from kvpools_core.config import ConfigReader
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.parallel import rank_layer_range
from kvpools_core.values import CellSize, LayerSpec, ModelSpec, Plan, Serving

from .config import MLADims, has_mla_latent, is_deepseek_dsa, is_deepseek_v4, mla_model_spec
from .latent import LatentRow, latent_dtype_problems, platform_problems, sglang_latent_cell

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
    return mla_model_spec(config, source, architecture=ARCHITECTURE, kind="mla")


@hookimpl
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    if model.architecture != ARCHITECTURE:
        return None
    return mla_problems(model, serving)


@hookimpl
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    if model.architecture != ARCHITECTURE:
        return None
    start, end = rank_layer_range(model, serving)
    return latent_cell_size(model.layers[start:end], model, serving)


@hookimpl
def build_pool(plan: Plan, device: str) -> Any | None:
    if plan.model.architecture != ARCHITECTURE:
        return None
    from .pool import MLATokenToKVPool

    return MLATokenToKVPool.from_plan(plan, device)


def latent_cell_size(layers: tuple[LayerSpec, ...], model: ModelSpec, serving: Serving) -> CellSize:
    """Cell size of MLA layers on this rank: one latent row per layer, whatever the TP."""
    row = LatentRow(model_dims(model), resolve_kv_dtype(serving.kv_cache_dtype, model.dtype))
    sglang = sglang_latent_cell(row.dims, row.kv, len(layers))
    return CellSize(parts=row.cell_parts(len(layers)), sglang_bytes_per_token=max(sglang, 1), num_layers=len(layers))


def mla_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang's MLA pools cannot hold (shared with the DSA plugin)."""
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    dims = model_dims(model)
    return latent_dtype_problems(dims, kv, model.name) + platform_problems(kv, serving.platform, model.name)


def model_dims(model: ModelSpec) -> MLADims:
    """The latent dims of an MLA-family model (one per model, as SGLang's ``ModelConfig``)."""
    return MLADims.of(model.layers[0])
