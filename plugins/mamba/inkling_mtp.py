"""Inkling's MTP heads as SGLang 0.5.23 would size them (not planned yet: :func:`mtp_problem` refuses with the terms).

SGLang runs Inkling's MTP heads only on its multi-layer EAGLE path (``--speculative-algorithm EAGLE`` / ``NEXTN``
/ ``EAGLE3`` with ``--enable-multi-layer-eagle``: ``spec_info.py`` picks ``MultiLayerEagleWorkerV2``); a banded
head (``mtp_local_layer_ids`` set) without it raises in ``models/inkling.py``
(``InklingForConditionalGenerationMTP.__init__``: "a banded MTP head (mtp_local_layer_ids set) requires
--enable-multi-layer-eagle").  On that path:

* the **target's budget** (``HybridSWAPoolConfigurator.__init__`` / ``_recompute_cell_size``,
  ``model_executor/pool_configurator.py``) charges ``eagle_draft_num_layers = num_nextn_predict_layers`` draft
  layers per full token: the depths in ``mtp_local_layer_ids`` at the SWA per-token size *without* the
  ``swa_full_tokens_ratio`` (a full-capacity SWA ring), the others at the full per-token size;
* the **draft workers** (``TpModelWorker._init_multi_layer_eagle_model_runners``, ``managers/tp_worker.py``):
  one runner per draft step, ``draft_model_idx`` 0 .. ``speculative_num_steps - 1``; each owns one layer
  (``layer_setup.resolve_layer_indices``): a banded depth's KV goes to an SWA ring of *full* capacity
  (``_build_hybrid_swa_kv_pool``: ``size_swa = full_max_total_num_tokens``, ``draft_swa_full_capacity``) with an
  identity mapping of ``full + page + 1`` int64 (``_init_pools``' draft branch), any other depth's to a full pool;
  and each head clones the request pool with a short-conv state pool of its own over that one layer
  (``clone_with_new_mamba``: ``max_mamba_cache_size`` slots, no speculative intermediate state).
"""

from __future__ import annotations

import attrs

from kvpools_core.options import option
from kvpools_core.values import ModelSpec, Serving

from .sizing import SLOT_ALLOCATOR_ITEM_BYTES
from .state import state_shape

MULTI_LAYER_EAGLE = frozenset({"EAGLE", "EAGLE3", "NEXTN"})
"""The algorithms ``SpeculativeAlgorithm.is_eagle`` answers for (``NEXTN`` is an alias of ``EAGLE``): the only ones
``MultiLayerEagleWorkerV2`` serves, and so the only ones that build Inkling's per-depth heads."""
IDENTITY_MAPPING_ITEM_BYTES = 8
"""The banded head's identity mapping is int64 (``torch.arange(n + 1, dtype=torch.int64)``)."""


@attrs.frozen
class InklingMtpTerms:
    """SGLang's draft terms for an Inkling model (per attention-TP rank, bytes)."""

    draft_layers: int
    """``eagle_draft_num_layers``: ``num_nextn_predict_layers`` of the draft-mode config."""
    budget_swa_full_layers: int
    """``_draft_swa_full_layers_num``: the depths below ``draft_layers`` listed in ``mtp_local_layer_ids``."""
    budget_full_layers: int
    """``_draft_full_layers_num``: the other depths (``_draft_swa_layers_num`` stays 0: the list is never None)."""
    full_per_token: int
    swa_per_token: int
    heads: tuple[int, ...]
    """``draft_model_idx`` of each runner: ``range(speculative_num_steps)``."""
    banded_heads: tuple[int, ...]
    state_per_layer: int
    """One layer's short-conv state of one slot (``mamba2_cache_params``' shape: the same on every layer)."""

    @property
    def cell_extra(self) -> int:
        """Bytes per full token ``_recompute_cell_size`` adds for the draft."""
        return self.full_per_token * self.budget_full_layers + self.swa_per_token * self.budget_swa_full_layers

    def head_kv_bytes(self, full_tokens: int, page: int) -> dict[int, int]:
        """Each head's KV pool: one layer of ``full + page`` rows (a banded head's full-capacity SWA ring, or a
        full layer), plus the banded head's identity mapping of ``full + page + 1`` int64."""
        rows = full_tokens + page
        return {
            head: rows * self.swa_per_token + (rows + 1) * IDENTITY_MAPPING_ITEM_BYTES
            if head in self.banded_heads
            else rows * self.full_per_token
            for head in self.heads
        }

    def head_state_bytes(self, max_mamba_cache_size: int) -> int:
        """Each head's ``clone_with_new_mamba``: a ``MambaPool`` of ``max_mamba_cache_size`` slots (+1 padding)
        over its one layer and a ``MambaSlotAllocator`` of as many int64 slots; no speculative intermediate state
        (``speculative_num_draft_tokens`` is left None).  None of it is in ``_handle_max_mamba_cache``'s charge."""
        k = max_mamba_cache_size
        return (k + 1) * self.state_per_layer + k * SLOT_ALLOCATOR_ITEM_BYTES


def mtp_terms(model: ModelSpec, serving: Serving, *, full_per_token: int, swa_per_token: int) -> InklingMtpTerms:
    """The draft terms of ``serving``'s speculative decoding on an Inkling ``model`` (see the module)."""
    draft = model.num_nextn_predict_layers or 0
    local = set(model.params.get("mtp_local_layer_ids") or ())
    swa_full = sum(depth in local for depth in range(draft))
    steps = serving.speculative_num_steps or 0
    heads = tuple(range(steps))
    return InklingMtpTerms(
        draft_layers=draft,
        budget_swa_full_layers=swa_full,
        budget_full_layers=draft - swa_full,
        full_per_token=full_per_token,
        swa_per_token=swa_per_token,
        heads=heads,
        banded_heads=tuple(head for head in heads if head in local),
        state_per_layer=state_shape(model, serving).bytes,
    )


def mtp_problem(model: ModelSpec, serving: Serving, terms: InklingMtpTerms) -> str:
    """Why ``serving``'s speculative decoding on an Inkling model is refused, with SGLang's terms for it."""
    o = option
    algorithm = serving.speculative_algorithm
    if algorithm not in MULTI_LAYER_EAGLE:
        return (
            f"kvpools does not model {o('speculative_algorithm')} {algorithm} on Inkling-class models: SGLang 0.5.23 "
            "runs Inkling's MTP heads only on its multi-layer EAGLE path (EAGLE, EAGLE3 or NEXTN with "
            "--enable-multi-layer-eagle, MultiLayerEagleWorkerV2). Plan it without "
            f"{o('speculative_algorithm')}, or with EAGLE."
        )
    banded = list(model.params.get("mtp_local_layer_ids") or ())
    requirement = (
        f"its banded MTP heads (mtp_local_layer_ids {banded}) require {o('enable_multi_layer_eagle')} in SGLang "
        "0.5.23 (InklingForConditionalGenerationMTP raises without it); "
        if banded and not serving.enable_multi_layer_eagle
        else ""
    )
    return (
        f"kvpools does not model Inkling's MTP heads yet ({o('speculative_algorithm')} {algorithm}): {requirement}"
        f"SGLang 0.5.23 would charge {terms.draft_layers} draft layer(s) per full token "
        f"({terms.budget_full_layers} full x {terms.full_per_token:,} B + {terms.budget_swa_full_layers} "
        f"full-capacity SWA x {terms.swa_per_token:,} B = {terms.cell_extra:,} B, no swa_full_tokens_ratio) and "
        f"(with {o('enable_multi_layer_eagle')}) build one head per draft step ({len(terms.heads)}: "
        f"{len(terms.banded_heads)} banded head(s) on an SWA ring of full capacity routed by mtp_local_layer_ids, "
        "the others on a full pool), each with a short-conv state "
        f"pool of its own (clone_with_new_mamba: one layer, {terms.state_per_layer:,} B per slot, outside the "
        f"budget). Plan it without {o('speculative_algorithm')}."
    )
