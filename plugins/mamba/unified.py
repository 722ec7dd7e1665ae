"""What a hybrid linear-attention model's side states become under ``--enable-unified-memory`` (issue 31).

SGLang 0.5.23's unified Mamba stack (``mem_cache/unified_memory_pool.py``
``init_unified_mamba_pools``) holds the full-attention KV and the recurrent
state (conv + SSM of every state layer, one token-major entry per slot) in one
arena.  It has no place for the side states the static ``HybridReqToTokenPool``
keeps next to the recurrent state:

* ReplaySSM's rings.  ``init_unified_mamba_pools`` takes no ReplaySSM argument
  and ``UnifiedMambaPool`` sets ``enable_linear_replayssm`` /
  ``enable_linear_replayssm_spec`` to False ("GDN/KDA ReplaySSM / spec
  unsupported"), so neither ring is built and the decode runs the plain
  recurrent update.  The budget is another matter: ``_handle_max_mamba_cache``
  reads ``--enable-linear-replayssm-spec`` before any pool exists and still
  reserves the spec ring (GDN: per request row, KDA: per state slot), so under
  ``--enable-linear-replayssm-spec`` the arena's token budget is the static
  split's, ring reserve taken out, and the reserve stays unallocated.  kvpools
  plans exactly that: the ring pools dropped, the budget as SGLang splits it.
* Qwen4-Exp's per-layer short-conv and n-gram request state (PLE).
  ``UnifiedHybridReqToTokenPool._init_mamba_pool`` refuses it ("Qwen4-Exp PLE
  side states are not supported with --enable-unified-memory"), and the
  factory hands the pool no PLE geometry at all (its ``ShortConvPool`` and
  ``NGramPool`` are size 0): refused with SGLang's reason.
"""

from __future__ import annotations

from kvpools_core.options import option
from kvpools_core.parts.sizing import sglang_rest_gib
from kvpools_core.values import Budget, ModelSpec, Serving

from .ple import ple_state
from .replayssm import RING_POOL, sglang_spec_ring_per_req, spec_active
from .sizing import split_budget
from .state import sglang_stage_per_req

__all__ = ["UNIFIED_DROPPED_POOLS", "unified_side_state_notes", "unified_side_state_problems", "unified_token_budget"]

UNIFIED_DROPPED_POOLS = (RING_POOL,)
"""Static pools the unified Mamba stack does not build (beyond the slot allocator the unified allocators replace)."""

PLE_REASON = "Qwen4-Exp PLE side states are not supported with --enable-unified-memory"
"""SGLang 0.5.23's message (``UnifiedHybridReqToTokenPool._init_mamba_pool``)."""


def unified_token_budget(model: ModelSpec, serving: Serving, budget: Budget) -> int:
    """SGLang's token-side budget under unified memory: the profiled budget after ``_handle_max_mamba_cache``,
    which reserves ReplaySSM's spec ring when ``--enable-linear-replayssm-spec`` is on (GDN or KDA)."""
    replay = spec_active(model, serving)
    return split_budget(
        sglang_rest_gib(budget),
        serving,
        sglang_stage_per_req(model, serving),
        model.name,
        budget,
        replay_ring=sglang_spec_ring_per_req(model, serving) if replay else None,
        ring_per_request=replay and model.params["mixer"] == "gdn",
    ).kv_budget_bytes


def unified_side_state_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """SGLang's refusal of Qwen4-Exp's PLE state under unified memory; empty otherwise."""
    if not serving.enable_unified_memory or ple_state(model, serving) is None:
        return []
    return [
        f"SGLang 0.5.23 refuses {option('enable_unified_memory')} for {model.name}: {PLE_REASON} (its unified "
        "request pool builds no per-layer short-conv or n-gram state). Plan it without "
        f"{option('enable_unified_memory')}."
    ]


def unified_side_state_notes(model: ModelSpec, serving: Serving) -> tuple[str, ...]:
    """What the plan says about ReplaySSM under unified memory."""
    notes = []
    if serving.enable_linear_replayssm or serving.enable_linear_replayssm_spec:
        notes.append(
            "ReplaySSM under unified memory: SGLang's unified Mamba pool builds no ring (init_unified_mamba_pools "
            "takes no ReplaySSM argument; UnifiedMambaPool turns the flags off), so the arena's state entry is the "
            "recurrent state alone and decode runs the plain recurrent update"
        )
    if spec_active(model, serving):
        ring = sglang_spec_ring_per_req(model, serving)
        per = "request row" if model.params["mixer"] == "gdn" else "state slot"
        notes.append(
            f"{option('enable_linear_replayssm_spec')}: _handle_max_mamba_cache still reserves the spec ring "
            f"({ring:,} B per {per}) before the arena is sized; the reserve is not allocated"
        )
    return tuple(notes)
