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

SGLang 0.5.23's other indexer rules: IndexShare layers (``dsa_layer_skips_topk``, :mod:`.indexshare`)
hold no index keys where ``_should_elide_dsa_index_k`` holds; ``index_kpool`` pages store ``132 / kpool``
B per token with a kernel page of ``page // kpool`` (and per-request tails with ``index_kpool_compress``);
under DCP the index buffer holds ``(S + P) x dcp - P`` slots; HiSparse (:mod:`.hisparse`) sizes the index
keys for ``S x host_to_device_ratio`` logical slots.  SGLang's configurator (ref-002) charges none of these,
so ``--accounting sglang`` keeps its count.  GLM5-Next, LongCat-Flash and HYV4 DSA models are refused by name.

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
from kvpools_core.config import MULTIPLIER, ConfigReader, first_architecture, is_deepseek_dsa
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.indexer import (
    INDEX_EXTRA_SLOTS,
    INDEX_POOL,
    INDEX_TAIL_POOL,
    KPOOL_COMPRESS,
    SKIPS_TOPK,
    dsa_problems,
    hisparse_ratio,
    index_layer_count,
    index_row_bytes,
    index_tail_bytes_per_request,
    index_token_bytes,
    latent_row,
    layer_split,
    stored_layers,
)
from kvpools_core.parts.latent import has_mla_latent, latent_model_spec, sglang_latent_cell
from kvpools_core.values import (
    REQUEST,
    Budget,
    CellPart,
    CellSize,
    EngineDefault,
    LayerSpec,
    ModelSpec,
    Plan,
    PoolSizing,
    Serving,
)

from .dcp import dcp_problems, kpool_dcp_problems
from .hisparse import dsa_hisparse_pools, hisparse_problems
from .indexshare import skips_topk_pattern
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
    refusal = unmodelled_dsa_family(outer, source)
    if refusal:
        raise UnsupportedCombinationError(refusal)
    if not is_deepseek_dsa(outer) or not has_mla_latent(reader):
        return None
    indexer = {
        "index_head_dim": reader.integer("index_head_dim"),
        "index_topk": reader.integer("index_topk"),
        "index_n_heads": reader.integer("index_n_heads", 0, minimum=0),
    }
    spec = latent_model_spec(config, source, architecture=ARCHITECTURE, kind="dsa", layer_params=indexer)
    skips = skips_topk_pattern(outer, spec.num_layers)
    if any(skips):  # IndexShare: these layers reuse another layer's top-k (SGLang's dsa_layer_skips_topk)
        layers = [
            attrs.evolve(layer, params={**layer.params, SKIPS_TOPK: True}) if skip else layer
            for layer, skip in zip(spec.layers, skips, strict=True)
        ]
        spec = attrs.evolve(spec, layers=layers)
    params = dict(spec.params)
    kpool = outer.optional_integer(INDEX_KPOOL, limit=MULTIPLIER)
    if kpool is not None:
        params[INDEX_KPOOL] = kpool
    if outer.boolean(KPOOL_COMPRESS, False):  # get_dsa_index_kpool_compress (absent: False)
        params[KPOOL_COMPRESS] = True
    return spec if params == dict(spec.params) else attrs.evolve(spec, params=params)


UNMODELLED_FAMILIES: dict[str, str] = {
    "Glm5NextForConditionalGeneration": (
        "GLM5-Next's DSA layers beside its KDA linear-attention layers (SGLang builds a HybridLinearKVPool with "
        "use_dsa: index keys on the full-attention layers, kv_cache_configurator._build_hybrid_linear_kv_pool)"
    ),
    "LongcatFlashForCausalLM": (
        "LongCat-Flash's DSA (two attention blocks per decoder layer, index keys shared every cli_factor layers)"
    ),
    "HYV4ForCausalLM": (
        "HYV4's DSA (configs/hy_v4.py fills index_topk 2048, indexer_types and layer_types when config.json omits them)"
    ),
}
"""Architectures SGLang 0.5.23's ``is_deepseek_dsa`` names whose DSA pools kvpools does not plan yet (their
``...NextN`` draft variants too); Dots3-Note's DSA full layers are the ``swa`` plugin's (hybrid MLA-SWA)."""


def unmodelled_dsa_family(outer: ConfigReader, source: str) -> str | None:
    """The refusal for a DSA model of a family kvpools does not plan (so no plugin plans it without its index
    keys), or None.  HYV4 is DSA whatever its config.json says (``HYV4Config`` defaults ``index_topk``)."""
    first = first_architecture(outer)
    family = (first or "").removesuffix("NextN")
    if family not in UNMODELLED_FAMILIES or not (family == "HYV4ForCausalLM" or is_deepseek_dsa(outer)):
        return None
    return (
        f"{source} ({first}) is a DeepSeek sparse attention model to SGLang 0.5.23 (is_deepseek_dsa), but kvpools "
        f"does not model {UNMODELLED_FAMILIES[family]} yet: planning it without its index keys would promise more "
        "tokens than SGLang allocates."
    )


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
    return (
        dsa_problems(model, serving)
        + hisparse_problems(model, serving)
        + dcp_problems(serving)
        + kpool_dcp_problems(model, serving)
    )


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_layer_specs(engine: str, model: ModelSpec, serving: Serving) -> tuple[Any, ...] | None:
    """TensorRT-LLM's ``DSACacheManager`` layers (``--accounting trtllm``): each "dsa" layer's MLA latent row and
    its indexer K cache, as :func:`kvpools_core.parts.trtllm.trtllm_dsa_layers` makes them; None for other
    engines."""
    from kvpools_core.parts.trtllm import ENGINE, trtllm_dsa_layers

    return trtllm_dsa_layers(model, "dsa") if engine == ENGINE else None


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
def size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing | None:
    """HiSparse's pools (:mod:`.hisparse`); without HiSparse the core's default sizing."""
    if not serving.enable_hisparse:
        return None
    return dsa_hisparse_pools(model, serving, cell, budget, owner=ARCHITECTURE)


@hookimpl
@for_architecture(ARCHITECTURE)
def build_allocator(plan: Plan, pool: Any, device: str, checked: bool) -> Any | None:
    """HiSparse's logical and device allocators and their mapping (:mod:`.hisparse_allocator`); else the core's."""
    serving = plan.serving
    if not serving.enable_hisparse:
        return None
    from kvpools_core.pools.hisparse import HiSparseAllocator

    return HiSparseAllocator(
        plan.max_total_num_tokens,
        serving.page_size,
        hisparse_ratio(serving),
        device=device,
        kvcache=pool,
        need_sort=serving.disaggregation_mode != "null",
        checked=checked,
    )


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

    The index pages store ``132 / index_kpool`` B per token per layer, on the
    layers whose keys the pool allocates (IndexShare layers none, where SGLang
    elides them), replicated over the DCP ranks (``slot_scale`` dcp: SGLang's
    ``(S + P) x dcp - P`` slots) and ``host_to_device_ratio`` times the device
    tokens under HiSparse (the pool itself is laid out by :mod:`.hisparse`).
    SGLang's cell (ref-002 lines 193-220) charges 132 B on every stored layer
    whatever these are.  The kpool-compress tails are paid per request.

    ``num_layers`` stays the stage's layer count: SGLang scales the draft's
    share by it, not by the split's stored layers; the draft keeps every layer
    (and every layer's keys), so one draft layer's parts are given explicitly.
    """
    num_layers = len(layers)
    stored = stored_layers(num_layers, serving)
    row = latent_row(model, serving)
    index_bytes = index_token_bytes(model)
    indexed = stored if layer_split(serving) else index_layer_count(layers, serving)
    sglang = sglang_latent_cell(row.dims, row.kv, stored) + index_row_bytes(model) * stored
    scale = hisparse_ratio(serving) * serving.dcp_size
    parts = [*row.cell_parts(stored)]
    if indexed:
        parts.append(CellPart(INDEX_PART, index_bytes * indexed, INDEX_POOL, INDEX_EXTRA_SLOTS, slot_scale=scale))
    tails = index_tail_bytes_per_request(model, serving, indexed)
    if tails:
        parts.append(CellPart("index_tails", tails, INDEX_TAIL_POOL, unit=REQUEST))
    one_layer = (*row.cell_parts(1), CellPart(INDEX_PART, index_bytes, INDEX_POOL, INDEX_EXTRA_SLOTS))
    notes = []
    if indexed < stored:
        notes.append(
            f"IndexShare: {stored - indexed} of {stored} layer(s) reuse another layer's top-k and hold no index "
            f"keys (SGLang's skip_topk_layers); SGLang's cell size charges the indexer on all {stored}"
        )
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
        draft_layer_parts=one_layer,
        notes=notes,
    )
