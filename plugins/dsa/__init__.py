"""DSA (DeepSeek sparse attention, DeepSeek-V3.2 and GLM-5): MLA plus the lightning indexer's key cache.

Claims configs SGLang's ``is_deepseek_dsa`` recognises (a DSA architecture
with ``index_topk``); declines everything else.  Every layer caches the MLA
latent row and, in a separate paged buffer, the indexer key:
``index_head_dim`` fp8 values and one fp32 scale per 128 of them (132 bytes
for DeepSeek-V3.2) — the parts library's :mod:`kvpools_core.parts.indexer`,
stored by :class:`kvpools_core.pools.dsa.DSATokenToKVPool`.

With fp8 KV the latent row is FlashMLA's packed layout, 656 bytes for
DeepSeek-V3.2 (``calculate_mla_kv_cache_dim``), unless a TRTLLM DSA backend
(or a raw-layout ROCm backend) serves the local role; SGLang's configurator
still charges 576 for it, so ``--accounting sglang`` keeps that figure and
the exact accounting charges the 656 bytes the pool stores.

The indexer part is named :data:`INDEX_PART`, which tells the core's DSA
store to build CUDA's pages (``kvpools_core.pools.dsa.PAGED_INDEX_PART``); a
platform that stores the keys otherwise rewrites the part by wrapping
``estimate_cell_size`` for its plans (kvpools-ascend: plain ``index_k`` rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from kvpools_core import for_architecture, hookimpl
from kvpools_core.config import MULTIPLIER, ConfigReader, is_deepseek_dsa
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.indexer import (
    INDEX_EXTRA_SLOTS,
    INDEX_POOL,
    dsa_problems,
    index_row_bytes,
    latent_row,
    layer_split,
    stored_layers,
)
from kvpools_core.parts.latent import has_mla_latent, latent_model_spec, sglang_latent_cell
from kvpools_core.values import CellPart, CellSize, EngineDefault, LayerSpec, ModelSpec, Plan, Serving

from .traits import architecture_traits as architecture_traits
from .weights import estimate_weights as estimate_weights

if TYPE_CHECKING:
    from kvpools_core.pools.layout import BufferLayout

ARCHITECTURE = "dsa"
INDEX_KPOOL = "index_kpool"
"""The config key (and ``ModelSpec.params`` key) of the tokens one pooled index key spans (SGLang's
``get_dsa_index_kpool``: absent is 1)."""
DSA_PAGE_TOKENS = 64
"""Tokens of one physical DSA page (SGLang: "DSA requires 64-token physical pages")."""
INDEX_PART = "indexer"
"""The indexer's cell part: CUDA's fp8 keys and fp32 scales per page (``kvpools_core.pools.dsa.PAGED_INDEX_PART``)."""
PACKED_ROW_NOTE = "fp8 DSA latent row:"
"""How the note on the packed fp8 row begins (a platform without that row drops it)."""
PRESET_DIR = Path(__file__).parent / "presets"


@hookimpl
def presets() -> dict[str, str]:
    return {path.stem: str(path) for path in sorted(PRESET_DIR.glob("*.json"))}


@hookimpl
def engine_features() -> dict[str, list[str]]:
    """SGLang 0.5.23 runs HiSparse on DeepSeek sparse attention (``is_deepseek_dsa`` in ``validate_hisparse``)."""
    return {ARCHITECTURE: ["hisparse"]}


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    outer = ConfigReader(config, source)
    reader = outer.text()
    if not is_deepseek_dsa(outer) or not has_mla_latent(reader):
        return None
    indexer = {
        "index_head_dim": reader.integer("index_head_dim"),
        "index_topk": reader.integer("index_topk"),
        "index_n_heads": reader.integer("index_n_heads", 0, minimum=0),
    }
    spec = latent_model_spec(config, source, architecture=ARCHITECTURE, kind="dsa", layer_params=indexer)
    kpool = outer.optional_integer(INDEX_KPOOL, limit=MULTIPLIER)
    return spec if kpool is None else attrs.evolve(spec, params={**spec.params, INDEX_KPOOL: kpool})


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_defaults(model: ModelSpec, serving: Serving) -> list[EngineDefault] | None:
    """SGLang 0.5.23's page for DeepSeek sparse attention when ``--page-size`` is unset: ``64 x index_kpool``
    (``arg_groups/model_overrides/deepseek_v2.py``, ``_deepseek_family_overrides``, the ``is_deepseek_dsa``
    branch for CUDA and ROCm: "a logical page must own a whole pooled index group").  A platform whose engine
    forces its own page (Ascend's 128) answers first."""
    kpool = int(model.params.get(INDEX_KPOOL, 1))
    reason = (
        f"SGLang 0.5.23's default for DeepSeek sparse attention (64 x index_kpool {kpool}, "
        "_deepseek_family_overrides in arg_groups/model_overrides/deepseek_v2.py)"
    )
    defaults = [EngineDefault(option="page_size", value=DSA_PAGE_TOKENS * kpool, reason=reason)]
    if serving.dcp_size > 1:
        from kvpools_core.parts.indexer import TRTLLM_BACKEND

        # _dsa_dcp_overrides (deepseek_v2.py lines 18-34): both DSA backends TRT-LLM under decode context
        # parallelism, which then read (and store) the raw latent row, not FlashMLA's packed fp8 one
        dcp = (
            f"SGLang 0.5.23's default for DeepSeek sparse attention with {option('dcp_size')} {serving.dcp_size} "
            "(_dsa_dcp_overrides in arg_groups/model_overrides/deepseek_v2.py)"
        )
        defaults += [
            EngineDefault(option="dsa_prefill_backend", value=TRTLLM_BACKEND, reason=dcp),
            EngineDefault(option="dsa_decode_backend", value=TRTLLM_BACKEND, reason=dcp),
        ]
    return defaults


@hookimpl
@for_architecture(ARCHITECTURE)
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    problems = dsa_problems(model, serving)
    if serving.enable_hisparse:
        # SGLang runs it (engine_features above), with other pools: planning it as without would over-promise
        problems.append(
            f"kvpools does not model {option('enable_hisparse')} on DeepSeek sparse attention yet: SGLang 0.5.23 "
            "then keeps the latent rows of the device tokens but an index-key cache, a logical allocator and an "
            "int64 device mapping sized by host_to_device_ratio (mem_cache/hisparse_memory_pool.py, "
            f"allocator/hisparse.py), which this plan would leave out. Drop {option('enable_hisparse')} to plan "
            "without it."
        )
    return problems


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_layer_specs(engine: str, model: ModelSpec, serving: Serving) -> tuple[Any, ...] | None:
    """TensorRT-LLM serves these models with a cache manager kvpools does not reproduce yet: refused, with the
    reason (``--accounting trtllm``); None for other engines."""
    from kvpools_core.parts.trtllm import ENGINE, trtllm_refusal

    if engine == ENGINE:
        raise trtllm_refusal(model, "DeepSeek sparse attention (DSACacheManager: the indexer-K cache beside MLA)")
    return None


@hookimpl
@for_architecture(ARCHITECTURE)
def vllm_kv_cache_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, Any] | None:
    """vLLM's DeepSeek-V3.2 layer: the MLA latent (``MLAAttention``) and, beside it, the indexer's key cache
    (``DeepseekV32IndexerCache``), two ``MLAAttentionSpec`` per layer."""
    from kvpools_core.parts.vllm.layers import indexer_kv_cache_spec, latent_kv_cache_spec

    specs: dict[str, Any] = {}
    for layer in model.layers:
        prefix = f"model.layers.{layer.index}.self_attn"
        specs[f"{prefix}.attn"] = latent_kv_cache_spec(layer, model, serving, block_size)
        specs[f"{prefix}.indexer.k_cache"] = indexer_kv_cache_spec(int(layer.params["index_head_dim"]), block_size)
    return specs


@hookimpl
@for_architecture(ARCHITECTURE)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    start, end = rank_layer_range(model, serving)
    return dsa_cell_size(model.layers[start:end], model, serving)


@hookimpl
@for_architecture(ARCHITECTURE)
def host_mirrors(plan: Plan) -> dict[str, str | None] | None:
    """SGLang's DSA host pools: the latent rows' own (``MLATokenToKVPoolHost``), and the indexer keys riding on
    its slots in whole pages with slack (``DSAIndexerPoolHost``: ``indexer_page_num = (size + page + 1) // page``,
    ``pool_host/dsa.py``; ``make_dsa_indexer_pool_decl`` declares ``indices_from_pool=KV``)."""
    names = [pool.name for pool in plan.pools]
    mirrors: dict[str, str | None] = {"kv": None} if "kv" in names else {}
    if INDEX_POOL in names and mirrors:
        mirrors[INDEX_POOL] = "kv"
    return mirrors or None


@hookimpl
@for_architecture(ARCHITECTURE)
def build_pool(plan: Plan, device: str, layout: BufferLayout | None) -> Any | None:
    from kvpools_core.pools.dsa import DSATokenToKVPool

    return DSATokenToKVPool.from_plan(plan, device, layout=layout)


def dsa_cell_size(layers: tuple[LayerSpec, ...], model: ModelSpec, serving: Serving) -> CellSize:
    """Latent row + indexer key per stored layer (``ceil(L / cp) + 1`` of them under the cache layer split).

    ``num_layers`` stays the stage's layer count: SGLang scales the draft's
    share by it, not by the split's stored layers; the draft keeps every layer,
    so one draft layer's parts are given explicitly.
    """
    num_layers = len(layers)
    stored = stored_layers(num_layers, serving)
    row = latent_row(model, serving)
    index_bytes = index_row_bytes(model)
    sglang = sglang_latent_cell(row.dims, row.kv, stored) + index_bytes * stored
    parts = [*row.cell_parts(stored), CellPart(INDEX_PART, index_bytes * stored, INDEX_POOL, INDEX_EXTRA_SLOTS)]
    one_layer = (*row.cell_parts(1), CellPart(INDEX_PART, index_bytes, INDEX_POOL, INDEX_EXTRA_SLOTS))
    notes = []
    if row.packed_fp8:
        notes.append(
            f"{PACKED_ROW_NOTE} {row.row_bytes} B per layer (FlashMLA's packed layout); SGLang's cell size "
            f"charges {row.dims.kv_cache_dim} B for it"
        )
    if row.kv.is_fp4:
        notes.append("fp4 DSA latent: stored as MLATokenToKVPoolFP4 rows (SGLang's DSA pool has no fp4 layout)")
    if layer_split(serving):
        notes.append(
            f"DSA cache layer split over {serving.attn_cp_size} CP ranks: {stored - 1} owned layer(s) of "
            f"{num_layers} plus one remote scratch layer"
        )
    return CellSize(
        parts=parts,
        sglang_bytes_per_token=max(sglang, 1),
        num_layers=num_layers,
        draft_layer_parts=one_layer if layer_split(serving) else (),
        notes=notes,
    )
