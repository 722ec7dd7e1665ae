"""kvpools ``--accounting sglang`` against SGLang's own sizing code (the oracle), hybrid linear-attention models.

Every case plans with kvpools and runs SGLang's ``_profile_available_bytes`` /
``_handle_max_mamba_cache`` / ``DefaultPoolConfigurator`` / ``resolve_max_num_reqs``
on the same inputs; they must agree on ``max_total_num_tokens``,
``max_running_requests``, the cell size and ``max_mamba_cache_size`` (the
state slots), carry SGLang's warnings, and fail together
(:func:`.support.compare_hybrid`).  The oracle's model and state bytes are
read from the same ``config.json`` independently of kvpools' parser.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from kvpools_plugins.mamba import hybrid_problems

from kvpools_core import Serving
from tests.draft_shape import as_sglang_runs
from tests.oracle.locate import require_oracle

from .support import (
    CHECKS,
    PRESETS,
    GiB,
    compare_hybrid,
    hybrid_budgets,
    hybrid_configs,
    hybrid_serving,
    parse,
    preset_config,
)

require_oracle()

pytestmark = pytest.mark.oracle

QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"
BUDGETS = (3 * GiB + 12345, 60 * GiB, 140 * GiB + 1)
EAGLE_128 = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_draft_tokens": 4,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_draft_num_layers": 1,
    "max_running_requests": 128,
}


def check(preset: str, serving: Serving, **budget: Any) -> None:
    compare_hybrid(preset, preset_config(preset), serving, **budget)


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3", "fp4_e2m1"])
def test_qwen3_next_ratio_budget(kv: str) -> None:
    """The default: K from rest x r / (1 + r), requests capped by K // 3; ratios, TP, pages, token caps."""
    for tp, page in ((1, 1), (2, 64), (4, 16), (8, 1)):
        for ratio in (0.5, 0.9, 3.0):
            for cap in (None, 100_000):
                serving = Serving(
                    kv_cache_dtype=kv, tp_size=tp, page_size=page, mamba_full_memory_ratio=ratio, max_total_tokens=cap
                )
                for memory in BUDGETS:
                    check(QWEN3_NEXT, serving, memory=memory)


@pytest.mark.parametrize("preset", [QWEN3_NEXT, "qwen3.5-35b-a3b", "nemotron-h-56b-base-8k"])
def test_eagle_d4_128_requests(preset: str) -> None:
    """The joint solve of K with speculation's intermediate state (D = 4), 128 requests; NEXTN's MTP layer."""
    drafts: list[dict[str, Any]] = [EAGLE_128, as_sglang_runs({**EAGLE_128, "speculative_algorithm": "NGRAM"})]
    if preset.startswith("qwen3.5"):
        drafts.append({**EAGLE_128, "speculative_algorithm": "NEXTN", "speculative_draft_num_layers": None})
    for draft in drafts:
        for tp in (1, 2, 8):
            for radix_off in (False, True):
                serving = Serving(tp_size=tp, disable_radix_cache=radix_off, **draft)
                for memory in BUDGETS:
                    check(preset, serving, memory=memory)


def test_explicit_mamba_cache_size() -> None:
    for k in (1, 2, 3, 100, 700, 5000):
        for extra in ({}, EAGLE_128, {"tp_size": 4, "dp_size": 2, "enable_dp_attention": True}):
            for memory in BUDGETS:
                check(QWEN3_NEXT, Serving(max_mamba_cache_size=k, **extra), memory=memory)


def test_radix_off_with_explicit_requests() -> None:
    eagle = {k: v for k, v in EAGLE_128.items() if k != "max_running_requests"}
    dp = {"dp_size": 4, "enable_dp_attention": True, "tp_size": 4}
    for requests in (1, 64, 512, 4096):
        for extra in ({}, eagle, dp):
            if requests < extra.get("dp_size", 1):
                continue  # fewer requests than DP-attention workers is refused (test_fixed_mismatches)
            serving = Serving(disable_radix_cache=True, max_running_requests=requests, **extra)
            for memory in BUDGETS:
                check(QWEN3_NEXT, serving, memory=memory)


@pytest.mark.parametrize(
    "buffer",
    [
        {"enable_mamba_extra_buffer": True},
        {"enable_mamba_extra_buffer": True, "enable_mamba_extra_buffer_lazy": True},
        {"enable_mamba_extra_buffer": True, "disable_overlap_schedule": True},
        {"enable_mamba_extra_buffer": True, "mamba_skip_decode_lock": True},
        {"mamba_skip_decode_lock": True},
    ],
)
def test_extra_buffer(buffer: dict[str, bool]) -> None:
    for preset in (QWEN3_NEXT, "jamba-1.5-mini"):
        for extra in ({}, {"max_running_requests": 48}, EAGLE_128):
            for memory in BUDGETS:
                check(preset, Serving(**buffer, **extra), memory=memory)


@pytest.mark.parametrize("preset", [QWEN3_NEXT, "nemotron-3-nano-30b-a3b", "falcon-h1-7b", "jamba-1.5-mini"])
def test_pp2(preset: str) -> None:
    """Every stage charges the largest stage's state share; stages keep the smallest stage's token count."""
    for rank in (0, 1):
        for extra in ({}, EAGLE_128, {"max_mamba_cache_size": 50}, {"tp_size": 2, "page_size": 16}):
            serving = Serving(pp_size=2, pp_rank=rank, **extra)
            for memory in BUDGETS:
                check(preset, serving, memory=memory)
    check(preset, Serving(pp_size=3, pp_rank=2, pp_layer_partition=_partition(preset)), memory=40 * GiB)


def _partition(preset: str) -> tuple[int, ...]:
    layers = parse(preset_config(preset)).num_layers
    return (layers // 2, layers // 4, layers - layers // 2 - layers // 4)


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_across_tp_and_budgets(preset: str) -> None:
    for tp in (1, 2, 4):
        for extra in ({}, {"max_running_requests": 256}, {"mamba_ssm_dtype": "bfloat16"}):
            for memory in (1 * GiB, *BUDGETS):
                check(preset, Serving(tp_size=tp, **extra), memory=memory)


@pytest.mark.parametrize("preset", PRESETS)
def test_presets_profiling_path(preset: str) -> None:
    """141 GiB free before the weights (H200), the weights, --mem-fraction-static; VLM reservation for Qwen3.5."""
    for fraction in (0.6, 0.88):
        for weights in (20 * GiB + 4097, 80 * GiB, 130 * GiB):
            for extra in ({}, {"max_mamba_cache_size": 300}):
                check(
                    preset,
                    Serving(mem_fraction_static=fraction, **extra),
                    free_memory=141 * GiB,
                    weights_memory=weights,
                )


@pytest.mark.parametrize("preset", [QWEN3_NEXT, "nemotron-h-56b-base-8k", "jamba-1.5-mini"])
def test_disaggregated_nodes(preset: str) -> None:
    """Prefill and decode nodes: the decode node's radix cache off and its pre-allocated rows (SGLang's default
    or given) as ``handle_pd_disaggregation`` resolves them (the adapter passes the resolved server args), with
    and without --max-running-requests, speculation and an explicit K; the state pool checked by compare_hybrid."""
    variants: list[dict[str, Any]] = [
        {"disaggregation_mode": "prefill"},
        {"disaggregation_mode": "prefill", **EAGLE_128},
        {"disaggregation_mode": "decode"},
        {"disaggregation_mode": "decode", "max_running_requests": 16},
        {"disaggregation_mode": "decode", "max_running_requests": 16, "disaggregation_decode_extra_slots": 0},
        {"disaggregation_mode": "decode", "max_running_requests": 256, "disaggregation_decode_extra_slots": 64},
        {"disaggregation_mode": "decode", "max_mamba_cache_size": 40, "max_running_requests": 24},
        {"disaggregation_mode": "decode", "enable_mamba_extra_buffer": True},
        {"disaggregation_mode": "decode", **EAGLE_128},
        {"disaggregation_mode": "decode", **EAGLE_128, "disaggregation_decode_extra_slots": 8},
    ]
    for variant in variants:
        for tp in (1, 4):
            for memory in BUDGETS:
                check(preset, Serving(tp_size=tp, **variant), memory=memory)


@settings(CHECKS, max_examples=1000)
@given(st.data())
def test_generated_hybrids(data: st.DataObject) -> None:
    """Every family, layouts, state geometries, TP/DP, pages, KV dtypes, mamba knobs, caps, speculation."""
    config = data.draw(hybrid_configs(), label="config")
    spec = parse(config)
    serving = data.draw(hybrid_serving(spec), label="serving")
    assume(not hybrid_problems(spec, serving))
    memory = data.draw(hybrid_budgets(spec), label="memory")
    want, _ = compare_hybrid(spec, config, serving, memory=memory)
    event(want.error.split(":")[0] if want.error else "planned")
    event(spec.params["family"])


@settings(CHECKS, max_examples=300)
@given(st.data())
def test_generated_hybrids_pipeline_and_profiling(data: st.DataObject) -> None:
    """SGLang's profiling arithmetic (free memory, weights, slack, VLM reservation), one or several PP stages."""
    config = data.draw(hybrid_configs(), label="config")
    spec = parse(config)
    serving = data.draw(hybrid_serving(spec, pp=data.draw(st.booleans(), label="pp")), label="serving")
    assume(not hybrid_problems(spec, serving))
    free = data.draw(st.integers(8 * GiB, 192 * GiB), label="free")
    weights = data.draw(st.integers(0, free), label="weights")
    want, _ = compare_hybrid(spec, config, serving, free_memory=free, weights_memory=weights)
    event(want.error.split(":")[0] if want.error else "planned")
