"""MLA-based hybrids (Kimi-Linear): the full-attention layers cache one MLA latent row per token.

SGLang sizes them with ``use_mla_backend`` (``DefaultPoolConfigurator._compute_cell_size``
over the rank's ``full_attention_layer_ids``) and builds ``HybridLinearKVPool(use_mla=True)``,
whose full pool is an ``MLATokenToKVPool`` of those layers only.  The row, its
bytes per KV dtype and SGLang's charge are the parts library's
(:mod:`kvpools_core.parts.latent`); this module only picks the layers.
"""

from __future__ import annotations

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.parts.latent import LatentRow, MLADims, latent_dtype_problems, platform_problems
from kvpools_core.parts.latent import latent_cell_size as _latent_cell_size
from kvpools_core.values import CellSize, LayerSpec, ModelSpec, Serving

from .config import MLA_ATTENTION


def is_mla_hybrid(model: ModelSpec) -> bool:
    """Whether the model's full-attention layers are MLA layers (SGLang's ``use_mla_backend``)."""
    return any(layer.kind == MLA_ATTENTION for layer in model.layers)


def latent_row(model: ModelSpec, serving: Serving) -> LatentRow:
    """The latent row every MLA layer of the model stores (one set of dims per model, as SGLang's ``ModelConfig``)."""
    first = next(layer for layer in model.layers if layer.kind == MLA_ATTENTION)
    return LatentRow(MLADims.of(first), resolve_kv_dtype(serving.kv_cache_dtype, model.dtype))


def latent_cell_size(layers: tuple[LayerSpec, ...], model: ModelSpec, serving: Serving) -> CellSize:
    """Cell size of this rank's MLA full-attention layers: one latent row per layer, whatever the TP."""
    return _latent_cell_size(latent_row(model, serving), len(layers))


def latent_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """KV dtypes the latent row cannot hold, and SGLang's CPU fp8 MLA rejection (the parts library's rules)."""
    row = latent_row(model, serving)
    return latent_dtype_problems(row.dims, row.kv, model.name) + platform_problems(row.kv, serving, model.name)
