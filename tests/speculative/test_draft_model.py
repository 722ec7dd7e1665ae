"""A speculative draft model of its own (``--speculative-draft-model-path``): its pools from its own plugin (issue 16).

The example of the issue: a STANDALONE llama-3.2-1b-shaped draft (16 layers, 8 KV
heads, head_dim 64) for llama-3.1-70b (80 layers, 8 KV heads, head_dim 128), at TP 4.
SGLang charges the draft as 16 of the target's layers; its draft worker allocates the
draft's own (half as wide) layers.  Every number below is derived by hand in its comment.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest

from kvpools_core import Plan, Serving, build, plan
from kvpools_core.building import draft_plan
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.pipeline import draft_worker_serving

GiB = 1 << 30
BUDGET = 40 * GiB  # 42,949,672,960 B


# The draft is conftest.py's LLAMA_3_2_1B. Per token at TP 4 (8 KV heads / 4 = 2 per rank), K and V, bf16 (2 B):
TARGET_BYTES = 2 * 128 * 2 * 2 * 80  # 81,920: llama-3.1-70b's 80 layers of head_dim 128
DRAFT_BYTES = 2 * 64 * 2 * 2 * 16  # 8,192: the draft's 16 layers of head_dim 64
SGLANG_CELL = int(TARGET_BYTES * (1 + 16 / 80))  # 98,304: SGLang's int(cell * (1 + D / L))
SGLANG_DRAFT_CHARGE = SGLANG_CELL - TARGET_BYTES  # 16,384: 16 layers of the target's geometry, 2x the draft's


def standalone(**options: Any) -> Serving:
    return Serving(tp_size=4, speculative_algorithm="STANDALONE", **options)


def test_exact_charges_the_drafts_own_geometry(draft_config: str) -> None:
    result = plan("llama-3.1-70b", standalone(), memory=BUDGET, draft_model=draft_config)
    draft = result.serving.speculative_draft
    assert draft is not None and draft.model.num_layers == 16 and draft.estimated_by == ("mha",)
    assert result.provenance["draft_parse_model_config"] == ("mha",)
    assert result.provenance["draft_estimate_cell_size"] == ("mha",)
    assert result.cell.pool_bytes_per_token() == {"kv": TARGET_BYTES, "draft_kv": DRAFT_BYTES}
    assert result.cell.sglang_bytes_per_token == SGLANG_CELL == 98_304
    # the exact solve: (T + 1) x (81,920 + 8,192) padded KV rows + 49 request-table rows (SGLang's speculative
    # default of 48 requests, _handle_eagle_family, + 1) of (131,072 + 4) x 4 B + an 8 B free-list entry per
    # token fit in 40 GiB: T = (42,949,672,960 - 49 x 524,304 - 90,112) // 90,120 = 476,297
    tokens = (BUDGET - 49 * (131072 + 4) * 4 - (TARGET_BYTES + DRAFT_BYTES)) // (TARGET_BYTES + DRAFT_BYTES + 8)
    assert result.max_total_num_tokens == tokens == 476_297
    assert result.pool("draft_kv").bytes == (tokens + 1) * DRAFT_BYTES
    assert result.pool("draft_kv").sglang_charged


def test_sglang_accounting_keeps_the_layer_count_scaling(draft_config: str) -> None:
    result = plan("llama-3.1-70b", standalone(accounting="sglang"), memory=BUDGET, draft_model=draft_config)
    assert result.cell.sglang_bytes_per_token == SGLANG_CELL
    assert result.max_total_num_tokens == BUDGET // SGLANG_CELL == 436_906
    # the pools are still what the draft worker allocates: the draft's own geometry
    assert result.pool("draft_kv").bytes_per_slot == DRAFT_BYTES


def test_the_difference_is_recorded(draft_config: str) -> None:
    result = plan("llama-3.1-70b", standalone(), memory=BUDGET, draft_model=draft_config)
    charge = result.cell.draft
    assert charge is not None
    assert (charge.model, charge.architecture, charge.num_layers) == ("llama-3.2-1b", "mha", 16)
    assert charge.exact_bytes_per_token == DRAFT_BYTES
    assert charge.sglang_draft_bytes_per_token == SGLANG_DRAFT_CHARGE == 2 * DRAFT_BYTES
    # SGLang's count: 40 GiB // 98,304 = 436,906; with the draft's own cell: 40 GiB // (81,920 + 8,192) = 476,625
    assert charge.tokens(BUDGET, 1) == (436_906, 476_625)
    assert charge.tokens(BUDGET, 64) == (436_906 // 64 * 64, 476_625 // 64 * 64)


def test_the_draft_config_is_named_after_its_directory(draft_config: str) -> None:
    result = plan("llama-3.1-70b", standalone(), memory=BUDGET, draft_model=draft_config)
    assert result.cell.draft is not None
    assert result.cell.draft.model == Path(draft_config).parent.name


def test_an_mla_target_with_an_mha_draft(draft_config: str) -> None:
    """deepseek-v2-lite (MLA, 27 layers of a 576-wide latent) with the llama-3.2-1b draft at TP 1."""
    serving = Serving(speculative_algorithm="EAGLE", page_size=64)
    result = plan("deepseek-v2-lite", serving, memory=20 * GiB, draft_model=draft_config)
    assert result.provenance["estimate_cell_size"] == ("mla", "speculative")
    assert result.provenance["draft_estimate_cell_size"] == ("mha",)
    # target: (512 + 64) x 2 B x 27 = 31,104; draft: 8 heads x 64 x 2 (K, V) x 2 B x 16 = 32,768
    assert result.cell.pool_bytes_per_token() == {"kv": 31_104, "draft_kv": 32_768}
    assert result.cell.sglang_bytes_per_token == int(31_104 * (1 + 16 / 27)) == 49_536
    built = build(result, "meta")
    assert built.provenance["draft_build_pool"] == ("mha",)
    assert type(built.draft_pool).__name__ == "MHATokenToKVPool" and built.draft_pool.layer_num == 16
    assert built.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    assert built.allocated_bytes == result.planned_bytes


def test_an_mha_target_with_an_mla_draft() -> None:
    """llama-3.1-8b (32 layers x 8 heads x 128 x 2 x 2 B = 131,072 B/token) drafted by deepseek-v2-lite's MLA."""
    serving = Serving(speculative_algorithm="EAGLE")
    result = plan("llama-3.1-8b", serving, memory=20 * GiB, draft_model="deepseek-v2-lite")
    assert result.cell.pool_bytes_per_token() == {"kv": 131_072, "draft_kv": 31_104}
    assert result.cell.sglang_bytes_per_token == int(131_072 * (1 + 27 / 32)) == 241_664
    built = build(result, "meta")
    assert built.provenance["draft_build_pool"] == ("mla",)
    assert type(built.draft_pool).__name__ == "MLATokenToKVPool"
    assert built.allocated_by_pool() == {p.name: p.bytes for p in result.pools}


@pytest.mark.parametrize(
    ("target", "options", "builder"),
    [
        ("minimax-m3", {"tp_size": 8}, "minimax_sparse"),
        (
            "qwen3-next-80b-a3b-thinking",
            {
                "tp_size": 4,
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
                "max_running_requests": 64,
            },
            "mamba",
        ),
    ],
)
def test_target_builders_leave_the_draft_to_its_own_plugin(
    draft_config: str, target: str, options: dict[str, Any], builder: str
) -> None:
    """Targets whose builders used to build the draft in their own geometry (MiniMax's mixed layers, a hybrid's
    MHA pool) hand it to the draft's plugin: 16 layers x (8 heads // TP) x 64 x (K, V) x 2 B per token."""
    result = plan(target, Serving(speculative_algorithm="EAGLE", **options), memory=20 * GiB, draft_model=draft_config)
    assert result.pool("draft_kv").bytes_per_slot == 16 * (8 // options["tp_size"]) * 64 * 2 * 2
    built = build(result, "meta")
    assert built.provenance["build_pool"] == (builder,) and built.provenance["draft_build_pool"] == ("mha",)
    assert built.allocated_by_pool() == {p.name: p.bytes for p in result.pools}


def test_the_built_draft_shares_the_targets_counts(draft_config: str) -> None:
    """One allocator and request table for both; the draft pool has the target's rows (tokens + padding page)."""
    result = plan("llama-3.1-70b", standalone(page_size=16), memory=4 * GiB, draft_model=draft_config)
    built = build(result, "cpu")
    assert built.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    assert built.allocated_bytes == result.planned_bytes
    assert set(built.allocated_by_pool()) == {"kv", "draft_kv", "req_to_token", "allocator"}
    assert built.draft_pool.size == built.kv_pool.size == result.max_total_num_tokens
    assert built.kv_pool.draft is None  # the target's builder left the draft to its own architecture
    k = built.draft_pool.get_key_buffer(0)
    assert tuple(k.shape) == (result.max_total_num_tokens + 16, 2, 64)


def test_draft_plan_is_the_draft_workers_view(draft_config: str) -> None:
    result = plan("llama-3.1-70b", standalone(), memory=BUDGET, draft_model=draft_config)
    sub = draft_plan(result)
    assert sub is not None
    assert sub.model.num_layers == 16 and not sub.serving.speculative
    assert [p.name for p in sub.pools] == ["kv"]
    assert sub.pool("kv").bytes == result.pool("draft_kv").bytes
    assert sub.max_total_num_tokens == result.max_total_num_tokens
    assert draft_worker_serving(result.serving).speculative_draft is None


def test_a_plan_with_a_draft_round_trips_and_builds(draft_config: str) -> None:
    result = plan("llama-3.1-70b", standalone(), memory=BUDGET, draft_model=draft_config)
    again = Plan.from_json(result.to_json())
    assert again == result
    assert build(again, "meta").allocated_bytes == result.planned_bytes


def test_without_a_draft_model_nothing_changes() -> None:
    """--speculative-draft-num-layers 16: 16 layers of the target's geometry, as before (16,384 B/token)."""
    result = plan("llama-3.1-70b", standalone(speculative_draft_num_layers=16), memory=BUDGET)
    assert result.serving.speculative_draft is None and result.cell.draft is None
    assert result.cell.pool_bytes_per_token() == {"kv": TARGET_BYTES, "draft_kv": SGLANG_DRAFT_CHARGE}
    built = build(result, "meta")
    assert built.draft_pool is None and built.kv_pool.draft is not None
    assert built.allocated_bytes == result.planned_bytes


def test_ngram_with_a_draft_model_writes_no_draft_kv(draft_config: str) -> None:
    serving = Serving(tp_size=4, speculative_algorithm="NGRAM")
    result = plan("llama-3.1-70b", serving, memory=BUDGET, draft_model=draft_config)
    assert result.cell.draft is None and "draft_kv" not in {p.name for p in result.pools}
    assert build(result, "meta").draft_pool is None


@pytest.mark.parametrize(
    ("target", "draft", "options", "message"),
    [
        ("llama-3.1-8b", "falcon-h1-0.5b", {}, "keeps per-request or recurrent state"),
        ("llama-3.1-8b", "gemma-2-9b", {}, "keeps token space(s) swa"),
        ("gemma-2-9b", "llama-3.1-8b", {}, "sizes its draft layers in its own pools"),
        ("llama-3.1-70b", "llama-3.1-8b", {"pp_size": 2}, "pp_size > 1: kvpools does not model"),
        ("llama-3.1-70b", "llama-3.1-8b", {"tp_size": 4, "dcp_size": 2}, "dcp_size > 1: kvpools does not model"),
        (
            "llama-3.1-8b",
            "deepseek-v3.2",
            {},
            "The draft model deepseek-v3.2 (draft_model): DSA models need page_size 64",
        ),
    ],
)
def test_drafts_sglang_has_no_pools_for_are_refused(
    target: str, draft: str, options: dict[str, Any], message: str
) -> None:
    serving = Serving(speculative_algorithm="EAGLE", **options)
    with pytest.raises(UnsupportedCombinationError) as caught:
        plan(target, serving, memory=BUDGET, draft_model=draft)
    assert message in str(caught.value)


def test_a_draft_spec_may_be_given_as_a_model_spec(draft_config: str) -> None:
    from kvpools_core.models import load_model
    from kvpools_core.registry import get_registry

    spec, _ = load_model(draft_config, get_registry())
    given = plan("llama-3.1-70b", standalone(), memory=BUDGET, draft_model=spec)
    by_path = plan("llama-3.1-70b", standalone(), memory=BUDGET, draft_model=draft_config)
    assert given.serving.speculative_draft is not None
    assert given.serving.speculative_draft.parsed_by == "given"
    assert given.sizing == by_path.sizing and given.cell == by_path.cell


def test_context_length_reaches_the_draft(draft_config: str) -> None:
    result = plan("llama-3.1-70b", standalone(context_length=8192), memory=BUDGET, draft_model=draft_config)
    assert result.serving.speculative_draft is not None
    assert result.serving.speculative_draft.model.context_len == 8192


def _kvpools(exe: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, *args], capture_output=True, text=True, timeout=120, check=False, env=env)


CLI_ARGS = ("llama-3.1-70b", "--memory", "40GiB", "--tp-size", "4", "--speculative-algorithm", "STANDALONE")


def test_cli_plan_shows_target_and_draft(kvpools_exe: str, cli_env: dict[str, str], draft_config: str) -> None:
    args = (*CLI_ARGS, "--speculative-draft-model-path", draft_config)
    out = _kvpools(kvpools_exe, cli_env, "plan", *args, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["max_total_num_tokens"] == 476_297
    assert [p["name"] for p in data["pools"]] == ["kv", "draft_kv", "req_to_token", "allocator"]
    draft = data["draft"]
    assert draft["model"] == "llama-3.2-1b" and draft["estimated_by"] == ["mha"] and draft["pools"] == ["draft_kv"]
    assert (draft["exact_bytes_per_token"], draft["sglang_draft_bytes_per_token"]) == (8_192, 16_384)
    assert (draft["sglang_tokens"], draft["own_cell_tokens"], draft["token_difference"]) == (436_906, 476_625, 39_719)
    assert data["provenance"]["draft_estimate_cell_size"] == ["mha"]
    assert Plan.from_dict(data).cell.draft is not None

    table = _kvpools(kvpools_exe, cli_env, "plan", *args)
    assert table.returncode == 0, table.stderr
    assert "llama-3.2-1b (mha; parsed by mha, cell by mha): 16 layers in draft_kv, 8,192 B/token" in table.stdout
    assert "SGLang's layer-count scaling charges 16,384 B/token" in table.stdout
    assert "476,625 tokens (+39,719)" in table.stdout
    assert "draft_estimate_cell_size: mha" in table.stdout


def test_cli_plan_without_a_draft_model_has_no_draft_section(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = _kvpools(kvpools_exe, cli_env, "plan", *CLI_ARGS, "--speculative-draft-num-layers", "16", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["draft"] is None


def test_cli_build_allocates_the_drafts_pools(kvpools_exe: str, cli_env: dict[str, str], draft_config: str) -> None:
    args = (*CLI_ARGS, "--speculative-draft-model-path", draft_config, "--device", "meta", "--json")
    out = _kvpools(kvpools_exe, cli_env, "build", *args)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["matches_plan"] is True
    assert data["allocated_by_pool"]["draft_kv"] == (476_297 + 1) * 8_192
    assert data["provenance"]["draft_build_pool"] == ["mha"]


def test_cli_refusal_is_one_paragraph(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    args = ("llama-3.1-8b", "--memory", "8GiB", "--speculative-algorithm", "EAGLE")
    out = _kvpools(kvpools_exe, cli_env, "plan", *args, "--speculative-draft-model-path", "falcon-h1-0.5b")
    assert out.returncode == 1
    assert "keeps per-request or recurrent state" in out.stderr and "Traceback" not in out.stderr


def test_sglang_mode_and_exact_mode_share_the_draft(draft_config: str) -> None:
    exact = plan("llama-3.1-70b", standalone(), memory=BUDGET, draft_model=draft_config)
    sglang = plan("llama-3.1-70b", standalone(accounting="sglang"), memory=BUDGET, draft_model=draft_config)
    assert exact.cell == sglang.cell
    assert attrs.evolve(exact.serving, accounting="sglang") == sglang.serving


def test_draft_weights_are_measured_against_the_slack_they_load_into(draft_config: str) -> None:
    """SGLang sizes the target's pools first and starts the draft worker after (ref-000 lines 361-366), so under
    a GPU budget the draft's weights come out of the (1 - mem_fraction_static) slack, not the KV budget."""
    from kvpools_core.pipeline.weights import estimate_weights

    serving = standalone()
    result = plan("llama-3.1-70b", serving, gpu="h200", draft_model="llama-3.1-8b")
    slack = result.budget.slack_bytes
    assert slack is not None and slack > 0
    weights = estimate_weights("llama-3.1-8b", draft_worker_serving(result.serving)).bytes_per_rank
    assert 3 * GiB < weights < 5 * GiB  # 8B bf16 params over 4 ranks
    (note,) = [n for n in result.sizing.notes if n.startswith("the draft model")]
    assert f"~{weights:,} B a rank" in note and f"{slack:,} B slack" in note
    assert f"{weights / slack * 100:.0f}% of it" in note
    assert ("do not fit" in note) == (weights >= slack)
    # the same budget as without the draft: SGLang reserves nothing for its weights
    alone = plan("llama-3.1-70b", Serving(tp_size=4), gpu="h200")
    assert result.budget.budget_bytes == alone.budget.budget_bytes
    # a draft config without the weight shapes says so; an explicit KV budget has no slack to speak of
    partial = plan("llama-3.1-70b", serving, gpu="h200", draft_model=draft_config)
    assert any("cannot estimate them" in n for n in partial.sizing.notes)
    explicit = plan("llama-3.1-70b", serving, memory=BUDGET, draft_model=draft_config)
    assert not any(n.startswith("the draft model") for n in explicit.sizing.notes)
