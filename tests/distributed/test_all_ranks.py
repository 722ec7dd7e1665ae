"""Every rank's plan and their agreement, without a process group (kvpools_core.planning.distributed.plan_all_ranks)."""

from __future__ import annotations

import attrs
import pytest

from kvpools_core import Serving, plan
from kvpools_core.errors import ConfigError
from kvpools_core.planning.distributed import RankId, float32, plan_all_ranks, rank_ids, suggest_partition

GiB = 1 << 30


def test_rank_ids_follow_sglang_layout() -> None:
    """SGLang 0.5.23: rank = tp_size * pp_rank + tp_rank; attention ranks (dp, cp, tp) with tp fastest; DCP groups
    are contiguous blocks of the TP group."""
    serving = Serving(tp_size=8, pp_size=2, dp_size=4, enable_dp_attention=True)  # attention TP 2
    ids = rank_ids(serving)
    assert len(ids) == 16
    assert ids[13] == RankId(rank=13, pp_rank=1, tp_rank=5, attn_dp_rank=2, attn_tp_rank=1, dcp_rank=0)
    dcp = Serving(tp_size=8, dcp_size=4)
    assert [r.dcp_rank for r in rank_ids(dcp)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [r.attn_tp_rank for r in rank_ids(dcp)] == list(range(8))


def test_float32_spacing_at_141_gib_is_16_kib() -> None:
    """What SGLang's float32 all-reduce does to free bytes: at 2^37..2^38 B the float32 spacing is 2^14 B."""
    base = 141 * GiB
    assert float32(base) == base  # a multiple of 16 KiB
    assert float32(base + 8191) == base
    assert float32(base + 8193) == base + 16384
    assert float32(5 * GiB + 1) == 5 * GiB  # spacing 1 KiB at 4..8 GiB


def test_sglang_accounting_pp4_stage_tokens_hand_computed() -> None:
    """llama-3.1-70b, PP 4 (20 layers a stage), TP 1, bf16: 20 x 8 heads x 128 x 2 (K, V) x 2 B = 81,920 B a
    token, so 20 GiB holds 20 * 2^30 / 81,920 = 262,144 tokens and 40 GiB twice that; every stage keeps 262,144."""
    result = plan_all_ranks(
        "llama-3.1-70b", Serving(pp_size=4, accounting="sglang"), memory=["20GiB", "40GiB", "40GiB", "40GiB"]
    )
    agreement = result.agreement
    assert [row.own_tokens for row in agreement.ranks] == [262_144, 524_288, 524_288, 524_288]
    assert agreement.tokens == 262_144
    assert agreement.bound_by == 0
    assert [p.max_total_num_tokens for p in result.plans] == [262_144] * 4
    assert [row.bytes_per_token for row in agreement.ranks] == [81_920] * 4
    assert [row.layers for row in agreement.ranks] == [(0, 20), (20, 40), (40, 60), (60, 80)]


@pytest.mark.parametrize("accounting", ["exact", "sglang"])
def test_pp4_one_small_stage_binds_every_stage_exactly(accounting: str) -> None:
    """The issue's check: 20 GiB free on stage 0 and 40 GiB on the others gives every stage stage 0's tokens."""
    serving = Serving(pp_size=4, accounting=accounting)
    result = plan_all_ranks("llama-3.1-70b", serving, free_memory=["20GiB", "40GiB", "40GiB", "40GiB"])
    alone = plan("llama-3.1-70b", serving, free_memory="20GiB", sync_stages=False)
    assert result.agreement.tokens == alone.max_total_num_tokens
    assert {p.max_total_num_tokens for p in result.plans} == {alone.max_total_num_tokens}
    assert result.agreement.bound_by == 0
    # the other stages' budgets are their own (exact) or the world's float32 MIN (sglang)
    budgets = [row.budget_bytes for row in result.agreement.ranks]
    if accounting == "exact":
        assert budgets[1] > budgets[0]
    else:
        assert len(set(budgets)) == 1
        assert result.agreement.reduced_free_bytes == 20 * GiB
    # every rank's agreed plan fits its own budget in exact accounting
    if accounting == "exact":
        assert all(row.unused_bytes >= 0 for row in result.agreement.ranks)


def test_exact_agreement_is_an_integer_min_of_tokens() -> None:
    """Two TP ranks whose free memory differs by less than float32's spacing: exact accounting keeps each rank's
    bytes (the MIN is over tokens), SGLang's float32 reduction rounds the free memory first."""
    free = {0: 141 * GiB + 8000, 1: 141 * GiB + 12_000}
    exact = plan_all_ranks("llama-3.1-8b", Serving(tp_size=2), free_memory=free, weights_memory="8GiB")
    budgets = [row.budget_bytes for row in exact.agreement.ranks]
    assert budgets[1] - budgets[0] == 3600  # 4,000 more free bytes, less a slack of 10 % of them
    assert exact.agreement.tokens == min(row.own_tokens for row in exact.agreement.ranks)
    sglang = plan_all_ranks(
        "llama-3.1-8b", Serving(tp_size=2, accounting="sglang"), free_memory=free, weights_memory="8GiB"
    )
    assert sglang.agreement.reduced_pre_load_bytes == float32(141 * GiB + 8000) == 141 * GiB
    assert sglang.agreement.reduced_free_bytes == float32(133 * GiB + 8000)


def test_hybrid_ranks_agree_on_every_pool() -> None:
    """A sliding-window hybrid under PP 2 with unequal stages: the agreed full tokens re-solve the SWA pool too."""
    result = plan_all_ranks("gpt-oss-120b", Serving(pp_size=2), memory=["30GiB", "50GiB"])
    first, second = result.plans
    assert first.max_total_num_tokens == second.max_total_num_tokens == result.agreement.tokens
    assert first.sizing.token_counts == second.sizing.token_counts
    assert any("agree" in note for note in second.sizing.notes)


def test_suggested_partition_is_the_best_contiguous_split() -> None:
    """Brute force over every two-stage split of llama-3.1-8b's 32 layers: the suggestion is the best one."""
    serving = Serving(pp_size=2)
    budgets = ["6GiB", "18GiB"]
    result = plan_all_ranks("llama-3.1-8b", serving, memory=budgets)
    best = max(
        (
            min(
                plan(
                    "llama-3.1-8b",
                    attrs.evolve(serving, pp_rank=stage, pp_layer_partition=(split, 32 - split)),
                    memory=budgets[stage],
                    sync_stages=False,
                ).max_total_num_tokens
                for stage in (0, 1)
            ),
            split,
        )
        for split in range(1, 32)
    )
    suggestion = result.agreement.suggestion
    assert suggestion is not None
    assert suggestion.tokens == best[0]
    assert suggestion.partition[0] == best[1] or suggestion.tokens == best[0]
    assert suggestion.gained_tokens == best[0] - result.agreement.tokens > 0


def test_no_suggestion_when_stages_are_balanced() -> None:
    result = plan_all_ranks("llama-3.1-8b", Serving(pp_size=2), memory="10GiB")
    stage = plan("llama-3.1-8b", Serving(pp_size=2), memory="10GiB", sync_stages=False).budget
    assert result.agreement.suggestion is None
    assert suggest_partition("llama-3.1-8b", Serving(pp_size=2), [stage, stage], result.agreement.tokens) is None


def test_bad_inputs_name_the_option() -> None:
    with pytest.raises(ConfigError, match=r"memory lists 2 values; give one per pipeline stage \(pp_size 4\)"):
        plan_all_ranks("llama-3.1-70b", Serving(pp_size=4), memory=["1GiB", "2GiB"])
    with pytest.raises(ConfigError, match=r"Rank 1 .* has no budget"):
        plan_all_ranks("llama-3.1-8b", Serving(tp_size=2), memory={0: "10GiB"})
    with pytest.raises(ConfigError, match="not a mix"):
        plan_all_ranks("llama-3.1-8b", Serving(tp_size=2), memory={0: "10GiB"}, free_memory={1: "20GiB"})


LLAMA_70B = "tests/weights/configs/meta-llama--Meta-Llama-3.1-70B.json"


def test_ranks_on_a_gpu_profile_each_stage_with_its_own_weights() -> None:
    """On a GPU every stage profiles the same total with its own weights: the first stage holds the embedding and
    the last the LM head (each 128,256 x 8,192 bf16) and the final norm (8,192 bf16), so the last binds."""
    from pathlib import Path

    config = Path(__file__).parents[2] / LLAMA_70B
    result = plan_all_ranks(str(config), Serving(pp_size=4), gpu="h100")
    rows = result.agreement.ranks
    alone = [plan(str(config), Serving(pp_size=4, pp_rank=s), gpu="h100", sync_stages=False) for s in range(4)]
    assert [row.budget_bytes for row in rows] == [p.budget.budget_bytes for p in alone]
    assert rows[3].budget_bytes < rows[0].budget_bytes < rows[1].budget_bytes == rows[2].budget_bytes
    assert rows[0].budget_bytes - rows[3].budget_bytes == 8_192 * 2
    assert result.agreement.tokens == min(p.max_total_num_tokens for p in alone)
    assert {p.max_total_num_tokens for p in result.plans} == {result.agreement.tokens}
    with pytest.raises(ConfigError, match="not both"):
        plan_all_ranks(str(config), Serving(pp_size=4), gpu="h100", memory="10GiB")
