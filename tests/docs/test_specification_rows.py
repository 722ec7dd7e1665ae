"""Branches of the specification files that the ledger (``docs/specification.md``) found without a test of
their own: each test here is cited by its row, with the lines of ``../shared/reference/000_*.txt`` it follows."""

from __future__ import annotations

import attrs

from kvpools_core import Serving, plan

QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"
"""48 layers, full attention every 4th (12 layers), 2 KV heads of 256 (its preset's config.json)."""


def test_a_pd_prefill_node_keeps_no_speculative_state() -> None:
    """Row 000-057: ``_build_hybrid_req_pool`` passes ``speculative_num_draft_tokens=None`` on a PD prefill node
    (not NPU), lines 1161-1165, so its ``HybridReqToTokenPool`` has no per-draft-token state: a prefill server
    never runs TARGET_VERIFY.  A null node with the same options keeps it."""
    serving = Serving(
        speculative_algorithm="EAGLE",
        speculative_draft_num_layers=1,
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        max_running_requests=16,
    )
    null = plan(QWEN3_NEXT, serving, memory="20GiB")
    prefill = plan(QWEN3_NEXT, attrs.evolve(serving, disaggregation_mode="prefill"), memory="20GiB")
    assert "mamba_spec_state" in {pool.name for pool in null.pools}
    assert "mamba_spec_state" not in {pool.name for pool in prefill.pools}
    assert prefill.pool("mamba_state").bytes == null.pool("mamba_state").bytes  # the same K state slots


def test_mxfp8_full_attention_layers_of_a_linear_hybrid_keep_their_scales() -> None:
    """Row 000-108: ``_build_hybrid_linear_kv_pool`` gives an mxfp8 cache the block-scaled full pool
    (``MHATokenToKVPoolMXFP8``, lines 1931-1937): per token, 12 full layers x 2 heads x (256 + 256) fp8 values
    = 12,288 B, and one e8m0 scale per 32 values = 384 B; fp8 without scales is the 12,288 B alone."""
    mxfp8 = plan(QWEN3_NEXT, Serving(kv_cache_dtype="mxfp8"), memory="20GiB")
    fp8 = plan(QWEN3_NEXT, Serving(kv_cache_dtype="fp8_e4m3"), memory="20GiB")
    assert fp8.cell.bytes_per_token == 12 * 2 * (256 + 256) == 12_288
    assert mxfp8.cell.bytes_per_token == 12_288 + 12_288 // 32 == 12_672
