"""Qwen4-Exp's PLE request state: the per-layer short-conv window and the request's n-gram context.

SGLang 0.5.23 (``KVCacheConfigurator._get_ple_req_pool_kwargs``, ref-000 L1047-1061) passes a
``Qwen4ExpTextConfig``'s ``short_conv_layer_ids`` (those of this pipeline rank), ``short_conv_state_shape``,
``ngram_context_len`` and ``eos_token_id`` to the hybrid request table, whose ``_init_mamba_pool``
(``mem_cache/memory_pool.py``) builds, beside the ``MambaPool`` and addressed by its slots
(``mem_cache/ple_state_pool.py``):

* ``ShortConvPool.conv_state``: ``(local short-conv layers, mamba_size + 1, hidden_size x hc_count,
  (ple_conv_kernel_size - 1) x ngram_size)`` in the mamba conv dtype, *not* sharded over TP; with speculative
  verification also ``intermediate_conv_state`` ``(layers, spec_state_size + 1, D) + shape``;
* ``NGramPool.context``: ``(mamba_size + 1, ngram_size - 1)`` int64 on every rank; with speculation also
  ``intermediate_context`` ``(spec_state_size + 1, D, ngram_size - 1)``.

``mamba_size`` is the state pool's slot count (K, raised on a PD decode node), ``spec_state_size`` the
speculative state's request rows.  ``_handle_max_mamba_cache`` does not charge any of it (its
``mamba_cache_per_req`` is the GDN state alone): under ``--accounting sglang`` the pools are allocated on top
of SGLang's budget, as SGLang does; ``--accounting exact`` fits them in.
"""

from __future__ import annotations

import math

import attrs

from kvpools_core.dtypes import MODEL_DTYPES
from kvpools_core.parallel import rank_layer_range
from kvpools_core.values import ModelSpec, Serving

from .state import state_shape

SHORT_CONV_POOL = "ple_short_conv"
SHORT_CONV_SPEC_POOL = "ple_short_conv_spec"
NGRAM_POOL = "ple_ngram"
NGRAM_SPEC_POOL = "ple_ngram_spec"
NGRAM_ITEM_BYTES = 8  # torch.long token ids


@attrs.frozen
class PleState:
    """One rank's PLE state: its short-conv layers and their window shape, and the n-gram context length."""

    layer_ids: tuple[int, ...]
    shape: tuple[int, int] | None
    conv_dtype: str
    ngram_context_len: int

    @property
    def short_conv_bytes_per_slot(self) -> int:
        """One state slot's short-conv windows over this rank's PLE layers (0 when the pool is disabled)."""
        if not self.layer_ids or self.shape is None:
            return 0
        return len(self.layer_ids) * math.prod(self.shape) * MODEL_DTYPES[self.conv_dtype]

    @property
    def ngram_bytes_per_slot(self) -> int:
        return self.ngram_context_len * NGRAM_ITEM_BYTES

    def describe(self) -> str:
        conv = "no short-conv layer on this rank"
        if self.short_conv_bytes_per_slot and self.shape is not None:
            conv = f"{len(self.layer_ids)} short-conv layer(s) x {'x'.join(map(str, self.shape))} {self.conv_dtype}"
        return f"{conv}; n-gram context {self.ngram_context_len} int64"


def ple_state(model: ModelSpec, serving: Serving) -> PleState | None:
    """This rank's PLE state, or None for a model that is not Qwen4-Exp or keeps none."""
    geometry = model.params.get("ple")
    if not geometry:
        return None
    start, end = rank_layer_range(model, serving)
    layer_ids = tuple(i for i in geometry["short_conv_layer_ids"] if start <= i < end)
    shape = (geometry["channels"], geometry["state_len"]) if geometry["short_conv_layer_ids"] else None
    state = PleState(layer_ids, shape, state_shape(model, serving).conv_dtype, geometry["ngram_context_len"])
    if not state.short_conv_bytes_per_slot and not state.ngram_bytes_per_slot:
        return None
    return state
