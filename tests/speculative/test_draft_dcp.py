"""A draft in the target's geometry under decode context parallelism (``--dcp-size k``).

SGLang's draft worker keeps *replicated* pools that address the shared allocator's virtual slots
``[0, max_total x k)`` untranslated: ``loc_space_scale = k``, ``pool_page_size = page x k`` and
``_derive_pool_sizes`` multiplies ``max_total_num_tokens`` by ``k`` (``000_fbd4f47288598fb9.txt`` lines
405-433), so each draft pool holds ``k x (S + P)`` rows.  Its configurator's cell size never counts that:
``--accounting sglang`` keeps SGLang's numbers, and the exact plan gives fewer tokens so that everything fits.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvpools_core import InsufficientMemoryError, Plan, Serving, build, plan
from kvpools_core.cli.plan_report import plan_summary
from kvpools_core.errors import UnsupportedCombinationError

GiB = 1 << 30
BUDGET = 20 * GiB
LATENT_ROW = (512 + 64) * 2
"""deepseek-v3's bf16 latent row: kv_lora_rank 512 + qk_rope_head_dim 64, 2 B each."""
TARGET_ROW = 61 * LATENT_ROW  # 70,272 B: 61 MLA layers per token
DRAFT_ROW = LATENT_ROW  # one NEXTN layer
DCP = 8
ALLOC_LEN = max(3 * 1, 4)
"""``get_alloc_len_per_decode`` = max(steps x top-k, draft tokens) at page x dcp > 1 and top-k 1, with the
(steps, top-k, draft tokens) = (3, 1, 4) SGLang's ``_auto_choose_speculative_params`` picks for
DeepseekV3ForCausalLM when they are unset (``arg_groups/speculative_hook.py``; 1 before issue 32's fix, when
kvpools read them as 1, 1, 0)."""
REQUEST_ROW = (163_840 + 2 * ALLOC_LEN + DCP - 1) * 4
"""The request-table row: context 163,840 + ``max(4 + draft tokens, 2 x alloc_len_per_decode + page x dcp - 1)``
= 15 int32 columns."""
REQUESTS = 48  # SGLang's speculative default when --max-running-requests is unset (_handle_eagle_family)
TOKENS_WITHOUT_DCP_DRAFT = 281_832
"""What kvpools planned before it counted the draft's ``dcp`` x rows (then SGLang overran the plan by ~2.3 GB)."""


def v3_serving(**changes: Any) -> Serving:
    return Serving(**{"tp_size": 8, "dcp_size": DCP, "speculative_algorithm": "NEXTN", **changes})


def test_exact_v3_dcp8_nextn_by_hand() -> None:
    """Every pool's bytes as a function of S: kv (S+1) x 70,272, draft 8 (S+1) x 1,152, the request table,
    8 B per token of free list and the DCP-widened allocator's ``page x dcp`` in-page offsets
    (``PagedTokenToKVPoolAllocator(S x 8, 8)``, ref-000 lines 2155-2164); the most S within 20 GiB."""
    planned = plan("deepseek-v3", v3_serving(), memory=BUDGET)
    per_token = TARGET_ROW + DCP * DRAFT_ROW + 8
    fixed = TARGET_ROW + DCP * DRAFT_ROW + (REQUESTS + 1) * REQUEST_ROW + 8 * 1 * DCP
    tokens = (BUDGET - fixed) // per_token
    assert tokens == 269_732 < TOKENS_WITHOUT_DCP_DRAFT
    assert planned.max_total_num_tokens == tokens
    assert planned.max_running_requests == REQUESTS
    draft = planned.pool("draft_kv")
    assert (draft.slots, draft.padding_slots, draft.bytes_per_slot) == (DCP * tokens, DCP, DRAFT_ROW)
    assert draft.bytes == DCP * (tokens + 1) * DRAFT_ROW == 2_485_859_328
    assert planned.pool("kv").bytes == (tokens + 1) * TARGET_ROW
    assert planned.planned_bytes == per_token * tokens + fixed == 21_474_810_204 <= BUDGET
    assert planned.cost.group("draft_kv").bytes_per_token == DCP * DRAFT_ROW
    assert planned.cost.bytes_for(**planned.counts) == planned.planned_bytes
    assert any("loc_space_scale" in note for note in planned.cell.notes)


def test_sglang_accounting_keeps_sglangs_numbers_and_counts_what_its_estimate_leaves_out() -> None:
    """SGLang's cell size is 71,424 B (target + 1/61 of it), whatever the DCP: 20 GiB // 71,424 tokens; the
    draft pool still holds 8 x (S + 1) rows, and the estimate leaves 7 x (S + 1) + 1 of its rows out."""
    planned = plan("deepseek-v3", v3_serving(accounting="sglang"), memory=BUDGET)
    assert planned.cell.sglang_bytes_per_token == TARGET_ROW + DRAFT_ROW == 71_424
    tokens = BUDGET // 71_424
    assert planned.max_total_num_tokens == tokens == 300_666
    draft = planned.pool("draft_kv")
    assert draft.bytes == DCP * (tokens + 1) * DRAFT_ROW and draft.sglang_charged
    summary = plan_summary(planned)
    assert summary["sglang_estimate_bytes"] == tokens * 71_424
    left_out = summary["sglang_leaves_out_bytes"]
    uncharged = planned.pool("req_to_token").bytes + planned.pool("allocator").bytes
    padding = planned.pool("kv").bytes - tokens * TARGET_ROW
    assert left_out == uncharged + padding + (draft.bytes - tokens * DRAFT_ROW)
    assert planned.planned_bytes > BUDGET  # SGLang's own plan overruns: the exact accounting exists for this


@pytest.mark.parametrize("accounting", ("exact", "sglang"))
def test_meta_build_allocates_the_draft_over_dcp_times_the_slots(accounting: str) -> None:
    planned = plan("deepseek-v3", v3_serving(accounting=accounting), memory=BUDGET)
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    draft = pools.kv_pool.draft
    tokens = planned.max_total_num_tokens
    assert (draft.size, draft.page_size) == (DCP * tokens, DCP)
    assert draft.kv_buffer[0].shape[0] == DCP * (tokens + 1)
    assert pools.kv_pool.kv_buffer[0].shape[0] == tokens + 1  # the target stays DCP-sharded


def test_dsa_v32_dcp8_draft_latent_and_indexer() -> None:
    """deepseek-v3.2 at page 64: the draft's pool page is 512, its indexer ``(8 S + 512 + 1) // 512`` pages."""
    planned = plan("deepseek-v3.2", v3_serving(page_size=64), memory=BUDGET)
    tokens, page = planned.max_total_num_tokens, 64
    rows = DCP * (tokens + page)
    assert planned.pool("draft_kv").bytes == rows * DRAFT_ROW
    index = planned.pool("draft_indexer")
    assert (index.slots, index.padding_slots) == (DCP * tokens, DCP * page)
    assert index.bytes == (DCP * tokens + DCP * page + 1) // (DCP * page) * (DCP * page) * 132 == rows * 132
    assert planned.planned_bytes <= BUDGET
    assert planned.cost.bytes_for(tokens=tokens + page, requests=planned.max_running_requests) > BUDGET
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    draft = pools.kv_pool.draft
    assert (draft.size, draft.page_size) == (DCP * tokens, DCP * page)
    assert draft.kv_buffer[0].shape[0] == rows
    assert draft.index_k_with_scale_buffer[0].shape == (rows // (DCP * page), DCP * page * 132)


@pytest.mark.parametrize("preset", ("qwen3-next-80b-a3b-thinking", "kimi-linear-48b-a3b-instruct-nvfp4"))
def test_hybrid_draft_under_dcp_builds_exactly(preset: str) -> None:
    """Linear hybrids build their draft through the MHA / MLA stores, which read the same scale."""
    serving = v3_serving(
        dcp_size=2,
        speculative_draft_num_layers=1,
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        max_running_requests=64,
    )
    planned = plan(preset, serving, memory=BUDGET)
    draft = planned.pool("draft_kv")
    assert (draft.slots, draft.padding_slots) == (2 * planned.max_total_num_tokens, 2)
    assert planned.planned_bytes <= BUDGET
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}


def test_dsv4_refuses_a_draft_under_dcp() -> None:
    with pytest.raises(UnsupportedCombinationError, match=r"dcp.size 2 with .*NEXTN.*loc_space_scale"):
        plan("deepseek-v4-flash", v3_serving(dcp_size=2, page_size=256), memory=BUDGET)


CASES = (("deepseek-v3", (1, 16, 64)), ("deepseek-v3.2", (64,)), ("llama-3.1-8b", (1, 16)), ("minimax-m3", (1, 16)))


@st.composite
def dcp_draft_plans(draw: st.DrawFn) -> Plan:
    preset, pages = draw(st.sampled_from(CASES))
    serving = Serving(
        tp_size=8,
        dcp_size=draw(st.sampled_from((1, 2, 4, 8))),
        page_size=draw(st.sampled_from(pages)),
        speculative_algorithm=draw(st.sampled_from(("NEXTN", "EAGLE"))),
        speculative_draft_num_layers=draw(st.integers(1, 2)),
    )
    memory = draw(st.integers(2 * GiB, 40 * GiB))
    try:
        return plan(preset, serving, memory=memory)
    except InsufficientMemoryError:
        assume(False)
        raise


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dcp_draft_plans())
def test_exact_dcp_draft_plans_fit_and_build_exactly(planned: Plan) -> None:
    dcp, page, tokens = planned.serving.dcp_size, planned.serving.page_size, planned.max_total_num_tokens
    assert planned.planned_bytes <= planned.budget.budget_bytes
    assert planned.cost.bytes_for(**planned.counts) == planned.planned_bytes
    drafts = [p for p in planned.pools if p.name.startswith("draft_")]
    assert drafts and all(p.slots == dcp * tokens and p.padding_slots >= dcp * page for p in drafts)
    pools = build(planned, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    draft = pools.kv_pool.draft
    assert (draft.size, draft.page_size) == (dcp * tokens, dcp * page)
