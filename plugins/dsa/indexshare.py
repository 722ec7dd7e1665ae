"""IndexShare: which DSA layers reuse another layer's top-k and so keep no index keys.

SGLang 0.5.23's ``dsa_layer_skips_topk(config, layer_id)`` (``configs/model_config.py``); the rules live in the
parts library (:func:`kvpools_core.parts.dsa.skips_topk_pattern`), shared with the DSA full side of
linear-attention hybrids (the ``mamba`` plugin).
"""

from __future__ import annotations

from kvpools_core.parts.dsa import skips_topk_pattern

__all__ = ["skips_topk_pattern"]
