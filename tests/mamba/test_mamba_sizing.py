"""The mamba budget split, slots per request and the request cap, by hand; exact accounting; errors; the CLI."""

from __future__ import annotations

import json
import subprocess

import pytest
from kvpools_plugins.mamba.sizing import mamba_ratio

from kvpools_core import Serving, plan
from kvpools_core.errors import InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.parts.sizing import sglang_rest_gib

GiB = 1 << 30
QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"
PER_SLOT = 77_266_944  # 36 GDN layers x (8192 x 3 x 2 + 32 x 128 x 128 x 4), see test_mamba_config
CELL = 2 * 256 * 2 * 2 * 12  # KV heads x (K + V dims) x bf16 x 12 full-attention layers = 24576


@pytest.mark.parametrize(
    ("options", "ratio"),
    [
        ({"disable_radix_cache": True}, 1),
        ({"disable_radix_cache": True, "enable_mamba_extra_buffer": True}, 1),
        ({}, 3),
        ({"mamba_skip_decode_lock": True}, 2 + 1),  # base drops to 2, no-buffer adds it back
        ({"enable_mamba_extra_buffer": True}, 3 + 2),  # ping-pong of 2 with the overlap schedule
        ({"enable_mamba_extra_buffer": True, "mamba_skip_decode_lock": True}, 2 + 2),
        ({"enable_mamba_extra_buffer": True, "enable_mamba_extra_buffer_lazy": True}, 3 + 1),
        (
            {"enable_mamba_extra_buffer": True, "enable_mamba_extra_buffer_lazy": True, "mamba_skip_decode_lock": True},
            3,
        ),
        ({"enable_mamba_extra_buffer": True, "disable_overlap_schedule": True}, 3 + 1),
        ({"disable_overlap_schedule": True}, 3),
    ],
)
def test_mamba_ratio(options: dict[str, bool], ratio: int) -> None:
    assert mamba_ratio(Serving(**options)) == ratio


def test_ratio_budget_qwen3_next_60gib() -> None:
    """rest 60 GiB x 0.9 / 1.9 = 30,516,872,893.47 B; K = (budget - per_slot) // per_slot = 393.

    KV gets 60 GiB - 394 x 77,266,944 = 33,981,333,504 B -> 33,981,333,504 // 24,576 = 1,382,704 tokens.
    Requests: int(1,382,704 / 262,144 x 512) = 2700, capped by 393 // 3 = 131 with SGLang's warning.
    """
    result = plan(QWEN3_NEXT, Serving(accounting="sglang"), memory="60GiB")
    mamba_budget = 60 * GiB * 0.9 / 1.9
    k = int((mamba_budget - PER_SLOT) // PER_SLOT)
    assert k == 393
    kv_budget = 60 * GiB - (k + 1) * PER_SLOT
    assert kv_budget == 33_981_333_504
    assert result.max_total_num_tokens == kv_budget // CELL == 1_382_704
    assert result.max_running_requests == 393 // 3 == 131
    assert result.sizing.sglang_config["max_mamba_cache_size"] == 393
    state = result.pool("mamba_state")
    assert (state.slots, state.padding_slots, state.bytes_per_slot, state.bytes) == (393, 1, PER_SLOT, 394 * PER_SLOT)
    assert (
        "max_running_requests is capped to 131 by the mamba state cache (max_mamba_cache_size=393, 3 state slots per "
        "request). To raise it: increase --mamba-full-memory-ratio or --max-mamba-cache-size, or halve the state size "
        "with --mamba-ssm-dtype bfloat16." in result.sizing.notes
    )
    assert not any(n.startswith("max_running_requests was reduced") for n in result.sizing.notes)


def test_eagle_d4_128_requests_joint_solve() -> None:
    """K = int((B - per x (1 + 4)) // (per x (1 + 4 / 3))) = 167; the intermediate for min(128, 167 // 3) + 1 = 56
    request slots, per x 56 x 4, comes out of the rest too.  Cell: int(24576 x (1 + 1 / 12)) = 26624."""
    serving = Serving(
        accounting="sglang",
        speculative_algorithm="EAGLE",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        speculative_draft_num_layers=1,
        max_running_requests=128,
    )
    result = plan(QWEN3_NEXT, serving, memory="60GiB")
    budget = 60 * GiB * 0.9 / 1.9
    k = int((budget - PER_SLOT * 5) // (PER_SLOT * (1 + 4 / 3)))
    assert k == 167
    rest = 60.0 - PER_SLOT * (min(128, k // 3) + 1) * 4 / GiB - (k + 1) * PER_SLOT / GiB
    assert result.cell.sglang_bytes_per_token == int(24576 * (1 + 1 / 12)) == 26624
    assert result.max_total_num_tokens == int(rest * GiB) // 26624 == 1_282_146
    assert result.max_running_requests == 55
    spec = result.pool("mamba_spec_state")
    assert (spec.slots, spec.padding_slots, spec.bytes_per_slot) == (55, 1, 4 * PER_SLOT)


def test_explicit_mamba_cache_size() -> None:
    result = plan(QWEN3_NEXT, Serving(accounting="sglang", max_mamba_cache_size=100), memory="60GiB")
    assert result.max_total_num_tokens == (60 * GiB - 101 * PER_SLOT) // CELL
    assert result.max_running_requests == 100 // 3
    dp = plan(
        QWEN3_NEXT,
        Serving(accounting="sglang", max_mamba_cache_size=100, tp_size=2, dp_size=2, enable_dp_attention=True),
        memory="60GiB",
    )
    assert dp.sizing.sglang_config["max_mamba_cache_size"] == 50  # per DP-attention shard


def test_radix_off_sizes_the_state_cache_from_the_requests() -> None:
    serving = Serving(accounting="sglang", disable_radix_cache=True, max_running_requests=64)
    result = plan(QWEN3_NEXT, serving, memory="60GiB")
    assert result.sizing.sglang_config["max_mamba_cache_size"] == 64
    assert result.max_running_requests == 64  # ratio 1
    assert result.max_total_num_tokens == (60 * GiB - 65 * PER_SLOT) // CELL


def test_extra_buffer_five_slots_per_request() -> None:
    result = plan(QWEN3_NEXT, Serving(accounting="sglang", enable_mamba_extra_buffer=True), memory="60GiB")
    assert result.max_running_requests == 393 // 5
    mapping = result.pool("mamba_req_mapping")
    assert mapping.bytes_per_slot == 4 + 2 * 8  # int32 slot + two int64 ping-pong slots per row


def test_pipeline_stage_charges_the_largest_stage_share() -> None:
    """Nemotron-3-Nano PP 2: stage 0 holds 12 of 23 mamba layers; both stages derive the same K."""
    k = [
        plan("nemotron-3-nano-30b-a3b", Serving(accounting="sglang", pp_size=2, pp_rank=r), memory="40GiB")
        for r in (0, 1)
    ]
    assert k[0].sizing.sglang_config["max_mamba_cache_size"] == k[1].sizing.sglang_config["max_mamba_cache_size"]
    per_layer = 6144 * 3 * 2 + 64 * 64 * 128 * 4
    assert k[0].pool("mamba_state").bytes_per_slot == 12 * per_layer
    assert k[1].pool("mamba_state").bytes_per_slot == 11 * per_layer
    assert k[0].max_total_num_tokens == k[1].max_total_num_tokens  # the smallest stage's


def test_profiled_budget_keeps_sglang_float_rest() -> None:
    """The carve-out runs on SGLang's float GiB rest, not on the whole bytes of the budget."""
    result = plan(
        QWEN3_NEXT,
        Serving(accounting="sglang", mem_fraction_static=0.87),
        free_memory="139GiB",
        weights_memory=80 * GiB + 12345,
    )
    rest = (139 * GiB - 80 * GiB - 12345) / GiB - 139 * (1 - 0.87)
    assert sglang_rest_gib(result.budget) == rest
    assert result.budget.budget_bytes == int(rest * GiB)


# ---------------------------------------------------------------------------
# exact accounting
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4,
            "speculative_draft_num_layers": 1,
            "max_running_requests": 128,
        },
        {"enable_mamba_extra_buffer": True, "page_size": 64},
        {"max_mamba_cache_size": 20},
    ],
)
def test_exact_plan_fits_the_budget_and_keeps_sglang_k(options: dict[str, object]) -> None:
    exact = plan(QWEN3_NEXT, Serving(**options), memory="60GiB")
    sglang = plan(QWEN3_NEXT, Serving(accounting="sglang", **options), memory="60GiB")
    budget = 60 * GiB
    assert exact.planned_bytes <= budget
    page_cost = exact.serving.page_size * exact.cell.bytes_per_token
    assert budget - exact.planned_bytes < page_cost + 8 * exact.serving.page_size + (1 << 20)
    assert exact.sizing.sglang_config["max_mamba_cache_size"] == sglang.sizing.sglang_config["max_mamba_cache_size"]
    assert exact.max_total_num_tokens < sglang.max_total_num_tokens


# ---------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------


def test_state_cache_too_small_for_one_slot() -> None:
    with pytest.raises(InsufficientMemoryError, match=r"max_mamba_cache_size=-?\d+ .* reduce --max-running-requests"):
        plan(QWEN3_NEXT, Serving(accounting="sglang"), memory="100MiB")


def test_state_cache_too_small_for_one_request() -> None:
    with pytest.raises(InsufficientMemoryError, match=r"too small to serve any request: max_mamba_cache_size=2, 3"):
        plan(QWEN3_NEXT, Serving(accounting="sglang", max_mamba_cache_size=2), memory="60GiB")


@pytest.mark.parametrize("accounting", ["sglang", "exact"])
def test_explicit_state_cache_larger_than_the_budget(accounting: str) -> None:
    with pytest.raises(InsufficientMemoryError, match=r"takes all of the .* lower --max-mamba-cache-size"):
        plan(QWEN3_NEXT, Serving(accounting=accounting, max_mamba_cache_size=1000), memory="60GiB")


def test_profiled_budget_exhausted_by_the_state_suggests_a_fraction() -> None:
    """SGLang's 'Loaded weights leave no GPU memory' branch after the carve-out, with its suggested fraction."""
    with pytest.raises(InsufficientMemoryError, match=r"above 0\.4\d\d \(minimum viable = 1 - available/pre = 0\.4"):
        plan(
            QWEN3_NEXT,
            Serving(accounting="sglang", max_mamba_cache_size=800),
            free_memory="100GiB",
            weights_memory="40GiB",
        )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tp_size": 3}, r"cannot be sharded over TP 3"),
        (
            {
                "disaggregation_mode": "prefill",
                "enable_mamba_extra_buffer": True,
                "enable_mamba_extra_buffer_lazy": True,
            },
            r"enable_mamba_extra_buffer_lazy is unsupported under PD disaggregation \(disaggregation_mode prefill\)",
        ),
        ({"pp_size": 4, "pp_layer_partition": (2, 2, 2, 42)}, r"stage\(s\) \[0, 2\] .* no full-attention layer"),
    ],
)
def test_unsupported_combinations(options: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match=message):
        plan(QWEN3_NEXT, Serving(**options), memory="60GiB")


def test_unset_draft_tokens_are_sglangs_choice() -> None:
    """EAGLE with nothing but a draft layer: SGLang's ``_auto_choose_speculative_params`` gives 4 draft tokens and
    its speculative handler 48 requests before ``_handle_max_mamba_cache`` (``kv_cache_configurator.py``, at pool
    sizing) reads them, so the hybrid plan has both (issue 32; before, kvpools refused 'pass
    speculative_num_draft_tokens')."""
    got = plan(QWEN3_NEXT, Serving(speculative_algorithm="EAGLE", speculative_draft_num_layers=1), memory="60GiB")
    assert (got.serving.speculative_num_draft_tokens, got.max_running_requests) == (4, 48)
    assert got.pool("mamba_spec_state").slots == 48


# ---------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------


def test_json_summary_carries_k_and_the_state_pool() -> None:
    """What ``kvpools plan --json`` prints (``report.plan_summary``): SGLang's name for K, the state pool's slots."""
    from kvpools_core.cli.plan_report import plan_summary

    summary = json.loads(json.dumps(plan_summary(plan(QWEN3_NEXT, Serving(accounting="sglang"), memory="60GiB"))))
    assert summary["max_mamba_cache_size"] == 393
    state = next(p for p in summary["pools"] if p["name"] == "mamba_state")
    assert (state["slots"] + state["padding_slots"], state["bytes_per_slot"]) == (394, PER_SLOT)


def test_cli_report_shows_the_split(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = subprocess.run(
        [kvpools_exe, "plan", QWEN3_NEXT, "--memory", "60GiB"],
        capture_output=True,
        text=True,
        env=cli_env,
        check=True,
    ).stdout
    assert "mamba budget = 64,424,509,440 B x 0.9 / (1 + 0.9)" in out
    assert "max_mamba_cache_size = 393" in out
    assert "3 state slot(s) per running request" in out
    assert "max_running_requests is capped to 131 by the mamba state cache" in out
    assert "size_pools: mamba" in out


def test_block_scaled_kv_needs_head_dims_divisible_by_the_block() -> None:
    from kvpools_core.models import resolve_model_source
    from kvpools_core.registry import get_registry

    from .support import parse

    config = {**resolve_model_source(QWEN3_NEXT, get_registry())[0], "head_dim": 80}
    with pytest.raises(UnsupportedCombinationError, match=r"mxfp8 stores one scale per 32 values, .* \[80\]"):
        plan(parse(config), Serving(kv_cache_dtype="mxfp8"), memory="60GiB")
