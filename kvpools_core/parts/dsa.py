"""DSA's per-layer storage as a contract for every plugin: the cell of DSA layers and IndexShare's layer pattern.

Pure DeepSeek sparse attention models (the ``dsa`` plugin) and linear-attention hybrids whose full-attention
side is DSA (GLM5-Next-style, the ``mamba`` plugin: SGLang 0.5.23's ``HybridLinearKVPool(use_dsa=True)``,
``kv_cache_configurator._build_hybrid_linear_kv_pool``) charge their DSA layers the same way, so the arithmetic
lives here and the plugins never import each other:

* :func:`dsa_cell_size`: per stored DSA layer the MLA latent row (:mod:`kvpools_core.parts.latent`) and the
  indexer key pages (:mod:`kvpools_core.parts.indexer`: ``132 / index_kpool`` B per token on the layers whose
  keys the pool allocates, replicated over DCP, scaled by HiSparse), the kpool-compress request tails, and
  SGLang's own charge (ref-002 lines 193-220: 132 B on every stored layer);
* :func:`skips_topk_pattern`: SGLang's ``dsa_layer_skips_topk`` per global layer id, read in this order from the
  served config:

  1. ``indexer_types``: layer ``i`` skips when ``indexer_types[i] == "shared"``;
  2. ``cli_factor`` > 1 (LongCat): every layer but each ``cli_factor``-th skips;
  3. ``index_topk_pattern``: layer ``i`` skips when its entry is ``"S"``;
  4. ``index_topk_freq`` (default 1) with ``index_skip_topk_offset`` (when set, > 0): layer ``i`` skips when
     ``max(i - offset + 1, 0) % freq != 0``, else when ``max(i - 1, 0) % freq != 0``.

  The pool builder then gives those layers a 0-row index buffer when ``_should_elide_dsa_index_k`` holds
  (:func:`kvpools_core.parts.indexer.elides_index_k`).  A hybrid asks it for its full-attention layers' global
  ids, as SGLang's ``skip_topk_layers=[dsa_layer_skips_topk(config, i) for i in full_attention_layer_ids]``.

The indexer part is named :data:`INDEX_PART` (``kvpools_core.pools.dsa.PAGED_INDEX_PART``: CUDA's pages); a
platform that stores the keys otherwise rewrites the part (kvpools-ascend).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpools_core.config import MULTIPLIER, ConfigReader
from kvpools_core.parts.indexer import (
    INDEX_EXTRA_SLOTS,
    INDEX_POOL,
    INDEX_TAIL_POOL,
    hisparse_ratio,
    index_layer_count,
    index_row_bytes,
    index_tail_bytes_per_request,
    index_token_bytes,
    latent_row,
    layer_split,
    stored_layers,
)
from kvpools_core.parts.latent import sglang_latent_cell
from kvpools_core.values import REQUEST, CellPart, CellSize, LayerSpec, ModelSpec, Serving

__all__ = ["INDEX_PART", "PACKED_ROW_NOTE", "dsa_cell_size", "skips_topk_pattern"]

INDEX_PART = "indexer"
"""The indexer's cell part: CUDA's fp8 keys and fp32 scales per page (``kvpools_core.pools.dsa.PAGED_INDEX_PART``)."""
PACKED_ROW_NOTE = "fp8 DSA latent row:"
"""How the note on the packed fp8 row begins (a platform without that row drops it)."""
SHARED = "shared"
SKIP_MARK = "S"


def dsa_cell_size(layers: Sequence[LayerSpec], model: ModelSpec, serving: Serving) -> CellSize:
    """Latent row + indexer key per stored DSA layer of ``layers`` (``ceil(L / cp) + 1`` under the cache layer split).

    The index pages store ``132 / index_kpool`` B per token per layer, on the
    layers whose keys the pool allocates (IndexShare layers none, where SGLang
    elides them), replicated over the DCP ranks (``slot_scale`` dcp: SGLang's
    ``(S + P) x dcp - P`` slots) and ``host_to_device_ratio`` times the device
    tokens under HiSparse.  SGLang's cell (ref-002 lines 193-220) charges 132 B
    on every stored layer whatever these are.  The kpool-compress tails are paid per request.

    ``num_layers`` stays the count of ``layers``: SGLang scales the draft's
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


def skips_topk_pattern(outer: ConfigReader, num_layers: int) -> list[bool]:
    """Per global layer id ``0..num_layers-1``, whether SGLang's ``dsa_layer_skips_topk`` says it reuses another
    layer's top-k (IndexShare)."""
    reader = _holder(outer)
    fix = "Fix the value in the config."
    if reader.has("indexer_types"):
        types = reader.string_list("indexer_types")
        return [i < len(types) and types[i] == SHARED for i in range(num_layers)]
    cli = reader.optional_integer("cli_factor", limit=MULTIPLIER) or 1
    if cli > 1:
        return [i % cli != 0 for i in range(num_layers)]
    if reader.has("index_topk_pattern"):
        pattern = reader.get("index_topk_pattern")
        if not isinstance(pattern, (str, list)) or not all(isinstance(c, str) for c in pattern):
            raise reader.error("index_topk_pattern", "must be a string (or list) of 'F' / 'S' marks", fix)
        return [i < len(pattern) and pattern[i] == SKIP_MARK for i in range(num_layers)]
    freq = reader.optional_integer("index_topk_freq", limit=MULTIPLIER) or 1
    offset = reader.optional_integer("index_skip_topk_offset", limit=MULTIPLIER)
    if offset is not None:
        return [max(i - offset + 1, 0) % freq != 0 for i in range(num_layers)]
    return [max(i - 1, 0) % freq != 0 for i in range(num_layers)]


def _holder(outer: ConfigReader) -> ConfigReader:
    """The reader that holds the IndexShare fields: the top level (SGLang reads ``hf_config``), else
    ``text_config`` (a multimodal wrapper copies them up: ``Glm5NextConfig``)."""
    keys = ("indexer_types", "cli_factor", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset")
    if any(outer.has(key) for key in keys):
        return outer
    return outer.text()
