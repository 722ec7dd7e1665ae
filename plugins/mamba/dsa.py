"""GLM5-Next-style hybrids: KDA linear-attention layers beside DSA full-attention layers.

SGLang 0.5.23's wider ``is_deepseek_dsa`` names ``Glm5NextForConditionalGeneration``; with ``index_topk`` set,
``kv_cache_configurator._build_hybrid_linear_kv_pool`` (ref-000 lines 1901-1927) builds a
``HybridLinearKVPool(use_dsa=True)`` whose full pool is a ``DSATokenToKVPool`` over the rank's
``full_attention_layer_ids`` only: per full layer an MLA latent row (``kv_cache_dim`` =
``calculate_mla_kv_cache_dim``: FlashMLA's packed fp8 row under fp8) and the indexer's key pages,
``skip_topk_layers = [dsa_layer_skips_topk(config, i) for i in full_attention_layer_ids]`` (IndexShare: no keys
where ``_should_elide_dsa_index_k`` holds), ``index_kpool`` pooled keys and their page rule
(``page_size % index_kpool == 0``, kernel page ``page_size // index_kpool``).  The KDA state pools are the
mamba plugin's as for Kimi-Linear.  The DSA arithmetic is the parts library's (:mod:`kvpools_core.parts.dsa`,
:mod:`kvpools_core.parts.indexer`), the store :class:`kvpools_core.pools.dsa.DSATokenToKVPool`.

What kvpools does not model on these hybrids yet is refused by name (:func:`dsa_hybrid_problems`): HiSparse,
decode context parallelism, the GLM DSA cache layer split, the kpool-compress request tails and speculative
decoding (the draft worker's DSA pool of one layer), and platforms other than CUDA and ROCm (Ascend's NPU DSA
pool stores the index keys otherwise).
"""

from __future__ import annotations

from typing import Any

import attrs

from kvpools_core.config import MULTIPLIER, ConfigReader
from kvpools_core.options import option
from kvpools_core.parts.dsa import skips_topk_pattern
from kvpools_core.parts.indexer import KPOOL, KPOOL_COMPRESS, SKIPS_TOPK, dsa_problems, index_kpool
from kvpools_core.values import EngineDefault, LayerSpec, ModelSpec, Serving

__all__ = ["GLM5_NEXT", "dsa_full_side", "dsa_hybrid_defaults", "dsa_hybrid_problems", "is_dsa_hybrid"]

GLM5_NEXT = "glm5_next"
"""The hybrid family of ``Glm5NextForConditionalGeneration`` (``configs/glm5_next.py``)."""
DSA = "dsa"
"""``ModelSpec.params`` key: the full-attention side is DSA (latent rows and index keys)."""
INDEXER_KEYS = ("index_head_dim", "index_topk", "index_n_heads")
PAGED_INDEX_PLATFORMS = frozenset({"cuda", "rocm"})
"""Platforms whose DSA pool pages the index keys as ``kvpools_core.pools.dsa``'s CUDA layout (Ascend's NPU pool
keeps plain rows, which its plugin rewrites for the ``dsa`` architecture only)."""
DSA_PAGE_TOKENS = 64
"""SGLang's default DSA page per pooled index group (``_deepseek_family_overrides``: 64 x index_kpool)."""


def _holder(outer: ConfigReader, reader: ConfigReader, key: str) -> ConfigReader:
    """``text_config`` wins over the top level (``Glm5NextConfig`` merges the top-level keys under it)."""
    return reader if reader.has(key) or not outer.has(key) else outer


def dsa_full_side(
    outer: ConfigReader, reader: ConfigReader, layers: list[LayerSpec]
) -> tuple[list[LayerSpec], dict[str, Any]]:
    """The full-attention layers with their indexer (``index_head_dim``, ``index_topk``, ``index_n_heads``,
    IndexShare's ``skips_topk`` by global layer id) and the model's DSA params (``index_kpool``,
    ``index_kpool_compress``, ``dsa``)."""
    head = _holder(outer, reader, "index_head_dim")
    topk = _holder(outer, reader, "index_topk")
    heads = _holder(outer, reader, "index_n_heads")
    indexer = {
        "index_head_dim": head.integer("index_head_dim"),
        "index_topk": topk.integer("index_topk"),
        "index_n_heads": heads.integer("index_n_heads", 0, minimum=0),
    }
    skips = skips_topk_pattern(outer, len(layers))
    full = [
        attrs.evolve(layer, params={**layer.params, **indexer, **({SKIPS_TOPK: True} if skip else {})})
        if layer.num_kv_heads
        else layer
        for layer, skip in zip(layers, skips, strict=True)
    ]
    params: dict[str, Any] = {DSA: True}
    kpool = _holder(outer, reader, KPOOL).optional_integer(KPOOL, limit=MULTIPLIER)
    if kpool is not None:
        params[KPOOL] = kpool
    if _holder(outer, reader, KPOOL_COMPRESS).boolean(KPOOL_COMPRESS, False):
        params[KPOOL_COMPRESS] = True
    return full, params


def is_dsa_hybrid(model: ModelSpec) -> bool:
    """Whether the hybrid's full-attention side is DSA (SGLang's ``use_dsa``)."""
    return bool(model.params.get(DSA, False))


def dsa_hybrid_defaults(model: ModelSpec) -> list[EngineDefault]:
    """SGLang 0.5.23's page for DeepSeek sparse attention when ``--page-size`` is unset, GLM5-Next included
    (``_deepseek_family_overrides`` in ``arg_groups/model_overrides/deepseek_v2.py`` registers
    ``Glm5NextForConditionalGeneration``): 64 x index_kpool."""
    kpool = index_kpool(model)
    reason = (
        f"SGLang 0.5.23's default for DeepSeek sparse attention (64 x index_kpool {kpool}, "
        "_deepseek_family_overrides in arg_groups/model_overrides/deepseek_v2.py, which names GLM5-Next)"
    )
    return [EngineDefault(option="page_size", value=DSA_PAGE_TOKENS * kpool, reason=reason)]


def dsa_hybrid_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """The DSA pool's own rules (latent, index head dim, kpool pages, platform page rules, PD) and what kvpools
    does not model on a DSA linear-attention hybrid yet."""
    unmodelled = [
        (serving.enable_hisparse, f"{option('enable_hisparse')} (HiSparse's index keys and allocators)"),
        (serving.dcp_size > 1, f"{option('dcp_size')} {serving.dcp_size} (the replicated DSA index buffer)"),
        (serving.enable_dsa_cache_layer_split, f"{option('enable_dsa_cache_layer_split')}"),
        (bool(model.params.get(KPOOL_COMPRESS)) and index_kpool(model) > 1, "index_kpool_compress (per-request tails)"),
        (serving.speculative, "speculative decoding (the draft worker's one-layer DSA pool)"),
        (
            serving.platform not in PAGED_INDEX_PLATFORMS,
            f"platform {serving.platform} (its DSA pool keeps the index keys otherwise than CUDA's pages)",
        ),
    ]
    problems = [
        f"kvpools does not model {what} on {model.name}, a linear-attention hybrid with a DSA full side "
        f"(SGLang's HybridLinearKVPool with use_dsa), yet. Drop it."
        for hit, what in unmodelled
        if hit
    ]
    return problems + dsa_problems(model, serving)
