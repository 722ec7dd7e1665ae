"""IndexShare: which DSA layers reuse another layer's top-k and so keep no index keys.

SGLang 0.5.23's ``dsa_layer_skips_topk(config, layer_id)`` (``configs/model_config.py``), read in
this order from the served config:

1. ``indexer_types``: layer ``i`` skips when ``indexer_types[i] == "shared"``;
2. ``cli_factor`` > 1 (LongCat): every layer but each ``cli_factor``-th skips;
3. ``index_topk_pattern``: layer ``i`` skips when its entry is ``"S"``;
4. ``index_topk_freq`` (default 1) with ``index_skip_topk_offset`` (when set, > 0): layer ``i`` skips
   when ``max(i - offset + 1, 0) % freq != 0``, else when ``max(i - 1, 0) % freq != 0``.

The pool builder (``_build_dsa_kv_pool``) then gives those layers a 0-row index buffer when
``_should_elide_dsa_index_k`` holds (:func:`kvpools_core.parts.indexer.elides_index_k`).
"""

from __future__ import annotations

from kvpools_core.config import MULTIPLIER, ConfigReader

__all__ = ["skips_topk_pattern"]

SHARED = "shared"
SKIP_MARK = "S"


def skips_topk_pattern(outer: ConfigReader, num_layers: int) -> list[bool]:
    """Per layer, whether SGLang's ``dsa_layer_skips_topk`` says it reuses another layer's top-k."""
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
