"""Hybrid MLA-SWA: what the full and the sliding layers of an MLA model store per token, and what is refused.

SGLang's ``_build_hybrid_mla_swa_kv_pool`` keeps the full layers in an
``MLATokenToKVPool`` (or a ``DSATokenToKVPool`` when ``is_deepseek_dsa``: the
row in ``calculate_mla_kv_cache_dim``'s layout plus the paged indexer key) and
the sliding layers in an ``MLATokenToKVPool`` of their own latent dims, inside
one ``SWAKVPool``.  The rows are the parts library's
(:mod:`kvpools_core.parts.latent`, :mod:`kvpools_core.parts.indexer`), applied
to the layers of each kind (:func:`latent_view`); the swa plugin's two-pool
sizing, mapping and dual allocator are unchanged.

``--accounting sglang`` is refused (:data:`SGLANG_ACCOUNTING_PROBLEM`): the
reference ``HybridSWAPoolConfigurator`` charges MHA geometry
(``get_num_kv_heads(tp) × (head_dim + v_head_dim)``, and the ``swa_*``
equivalents) even for MLA layers, and what SGLang's ``ModelConfig`` reports
for those fields on a hybrid MLA-SWA architecture is not established.
"""

from __future__ import annotations

import attrs

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.parts.indexer import dsa_problems, index_row_bytes, latent_row, layer_split
from kvpools_core.parts.latent import LatentRow, mla_problems, model_dims
from kvpools_core.values import LayerSpec, ModelSpec, Serving

from .config import FULL, LATENT, SLIDING

__all__ = [
    "SGLANG_ACCOUNTING_PROBLEM",
    "full_row",
    "index_bytes",
    "is_dsa",
    "is_latent",
    "latent_bytes_per_layer",
    "latent_problems",
    "latent_view",
    "swa_row",
]

SGLANG_ACCOUNTING_PROBLEM = (
    "--accounting sglang is not supported for hybrid MLA-SWA models ({name}): SGLang's HybridSWAPoolConfigurator "
    "(pool_configurator.py) charges get_num_kv_heads(tp) x (head_dim + v_head_dim) bytes per token per full layer "
    "and get_swa_num_kv_heads(tp) x (swa_head_dim + swa_v_head_dim) per sliding layer even when both are MLA, and "
    "the values SGLang's ModelConfig gives those fields for a hybrid MLA-SWA architecture cannot be established "
    "from its source (the ModelConfig source at hand has no swa_kv_lora_rank and runs such an architecture as "
    "MHA; the revision the hybrid MLA-SWA pool builder reads it from is not available). Use --accounting exact: "
    "it charges the MLA{dsa} latent rows the pools store."
)
"""Why ``--accounting sglang`` is refused for these models (``docs/sizing.md``, "Hybrid sliding window")."""


def is_latent(model: ModelSpec) -> bool:
    """Whether a swa-plugin model is hybrid MLA-SWA (its layers cache MLA latent rows)."""
    return model.params.get(LATENT) is not None


def is_dsa(model: ModelSpec) -> bool:
    """Whether the full layers of a hybrid MLA-SWA model are DSA (row + indexer key)."""
    return model.params.get(LATENT) == "dsa"


def latent_view(model: ModelSpec, kind: str) -> ModelSpec | None:
    """The layers of one kind as a model of their own (re-indexed), for the latent / indexer parts.

    Those parts read a model's latent dims from its first layer; a view
    gives them the full (or the sliding) layers only.  None when the model
    has no layer of that kind.
    """
    layers = [attrs.evolve(layer, index=i) for i, layer in enumerate(_of_kind(model.layers, kind))]
    return attrs.evolve(model, layers=layers) if layers else None


def full_row(model: ModelSpec, serving: Serving) -> LatentRow | None:
    """The full layers' row: DSA's (``calculate_mla_kv_cache_dim``, packed with fp8) or MLA's; None without any."""
    view = latent_view(model, FULL)
    if view is None:
        return None
    if is_dsa(model):
        return latent_row(view, serving)
    return LatentRow(model_dims(view), resolve_kv_dtype(serving.kv_cache_dtype, model.dtype))


def swa_row(model: ModelSpec, serving: Serving) -> LatentRow:
    """The sliding layers' MLA row (``swa_kv_lora_rank + swa_qk_rope_head_dim`` elements, never packed)."""
    view = latent_view(model, SLIDING)
    assert view is not None, "a swa-plugin model has sliding layers"
    return LatentRow(model_dims(view), resolve_kv_dtype(serving.kv_cache_dtype, model.dtype))


def index_bytes(model: ModelSpec) -> int:
    """DSA indexer bytes per token per full layer (132 for ``index_head_dim`` 128); 0 for MLA full layers."""
    view = latent_view(model, FULL)
    return index_row_bytes(view) if view is not None and is_dsa(model) else 0


def latent_bytes_per_layer(model: ModelSpec, serving: Serving) -> tuple[int, int]:
    """(full, sliding) bytes per token per layer really stored: row (+ indexer key), row."""
    row = full_row(model, serving)
    full = row.row_bytes + index_bytes(model) if row is not None else 0
    return full, swa_row(model, serving).row_bytes


def latent_problems(model: ModelSpec, serving: Serving, draft_kv: bool) -> list[str]:
    """What kvpools refuses for a hybrid MLA-SWA model under these serving options."""
    problems: list[str] = []
    if serving.accounting == "sglang":
        dsa = " (and DSA indexer)" if is_dsa(model) else ""
        problems.append(SGLANG_ACCOUNTING_PROBLEM.format(name=model.name, dsa=dsa))
    full, swa = latent_view(model, FULL), latent_view(model, SLIDING)
    if full is not None:
        problems += dsa_problems(full, serving) if is_dsa(model) else mla_problems(full, serving)
    if swa is not None:
        problems += mla_problems(swa, serving)
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    if kv.is_fp4:
        problems.append(
            f"{option('kv_cache_dtype')} {kv.name} is not supported for hybrid MLA-SWA models ({model.name}): SGLang's "
            f"hybrid MLA-SWA pool builds plain MLATokenToKVPool sub-pools, not MLATokenToKVPoolFP4 (the fp4 row and "
            f"its scales), so what it stores is not established. Use auto, bf16, fp16, fp8_e4m3 or fp8_e5m2."
        )
    if draft_kv:
        problems.append(
            f"{option('speculative_algorithm')} {serving.speculative_algorithm} allocates a draft KV pool, which "
            f"kvpools "
            f"cannot size exactly for hybrid MLA-SWA models ({model.name}): the draft's layer geometry (full or "
            f"sliding latent, MLA or DSA) is the draft model's own. Use NGRAM or no speculative decoding."
        )
    if is_dsa(model) and layer_split(serving):
        problems.append(
            f"{option('enable_dsa_cache_layer_split')} is not supported for hybrid MLA-SWA models ({model.name}): "
            f"SGLang's "
            f"hybrid pool builds the full DSA pool without the split. Drop the flag or use {option('attn_cp_size')} 1."
        )
    return list(dict.fromkeys(problems))


def _of_kind(layers: tuple[LayerSpec, ...], kind: str) -> list[LayerSpec]:
    return [layer for layer in layers if layer.kind == kind]
