"""kvpools ``--accounting sglang`` against SGLang's own sizing code, dense MHA/GQA models (issue 2).

Every case plans with kvpools and runs SGLang's ``pool_configurator.py`` /
``kv_cache_configurator.py`` (the oracle) on the same inputs; they must agree
on ``max_total_num_tokens``, ``max_running_requests`` and the cell size, and
fail together (see ``adapter.compare``).
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from kvpools_core.errors import InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.models import load_model
from kvpools_core.pipeline import plan as kvpools_plan
from kvpools_core.registry import get_registry
from kvpools_core.values import ModelSpec, Plan, Serving
from tests.draft_shape import as_sglang_runs

from .adapter import OracleAnswer, compare, model_from_spec, oracle_plan, preset_model, suggested_fraction
from .locate import require_oracle
from .strategies import (
    GiB,
    MiB,
    aimed_budgets,
    dense_models,
    serving_options,
    splits_heads,
)

pytestmark = pytest.mark.oracle

require_oracle()

# Deterministic in CI: the same examples every run (no example database, no wall-clock deadline).
CHECKS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def outcome(want: OracleAnswer, serving: Serving) -> None:
    """Label the example for --hypothesis-show-statistics: which branch of SGLang's sizing it reached."""
    if want.error:
        event(want.error)
    elif want.max_running_requests == 0:
        event("zero requests (kvpools refuses)")
    else:
        capped = any(w.startswith("max_total_tokens=") for w in want.warnings)
        reduced = any(w.startswith("max_running_requests was reduced") for w in want.warnings)
        event("planned" + (", token cap above capacity" if capped else "") + (", requests reduced" if reduced else ""))
    event(f"kv {serving.kv_cache_dtype}, page {serving.page_size}")


@st.composite
def explicit_cases(draw: st.DrawFn, **serving_kwargs: object) -> tuple[ModelSpec, Serving, int]:
    model = draw(dense_models())
    return model, draw(serving_options(model, **serving_kwargs)), draw(aimed_budgets(model))


@st.composite
def profile_cases(draw: st.DrawFn) -> tuple[ModelSpec, Serving, int, int]:
    """Free memory before the weights load, the weights, --mem-fraction-static, multimodal reservation."""
    model = draw(dense_models(multimodal=draw(st.booleans())))
    serving = draw(serving_options(model))
    serving = attrs.evolve(
        serving,
        mem_fraction_static=draw(st.integers(1, 1000)) / 1000,
        vlm_cache_size_mb=draw(st.sampled_from((100, 0, 1, 512, 4096))),
    )
    free = draw(st.one_of(st.integers(MiB, 4 * GiB), st.integers(MiB, 200 * GiB)))
    weights = draw(st.one_of(st.integers(0, free), st.integers(0, free + free // 4)))
    return model, serving, free, weights


@st.composite
def mm_transport_cases(draw: st.DrawFn) -> tuple[ModelSpec, Serving, int, int]:
    """A profiled budget with SGLang's multimodal feature transport: ``mm_runtime_reservation_gb`` (ref-000
    lines 156-173) adds ``SGLANG_MM_FEATURE_CACHE_MB`` for cuda_ipc / cuda_vmm, multimodal models only."""
    model, serving, free, weights = draw(profile_cases())
    transport = draw(st.sampled_from((None, "cpu", "cuda_ipc", "cuda_vmm")))
    cache_mb = draw(st.sampled_from((1024, 0, 1, 3000))) if transport in ("cuda_ipc", "cuda_vmm") else 1024
    return model, attrs.evolve(serving, mm_feature_transport=transport, mm_feature_cache_mb=cache_mb), free, weights


@st.composite
def pipeline_cases(draw: st.DrawFn) -> tuple[ModelSpec, Serving, dict[str, int]]:
    model = draw(dense_models(min_layers=2))
    serving = draw(serving_options(model, pp=True))
    if draw(st.booleans()):
        budget = {"memory": draw(aimed_budgets(model))}
    else:
        free = draw(st.integers(GiB, 160 * GiB))
        budget = {"free_memory": free, "weights_memory": draw(st.integers(0, free))}
    return model, serving, budget


@settings(CHECKS, max_examples=800)
@given(explicit_cases())
def test_explicit_budget(case: tuple[ModelSpec, Serving, int]) -> None:
    """--memory: layers, heads, head dims, KV dtypes, pages, TP/DP/CP/DCP, caps, disaggregation, speculation."""
    model, serving, memory = case
    want, _ = compare(model, model_from_spec(model), serving, memory=memory)
    outcome(want, serving)


@settings(CHECKS, max_examples=500)
@given(profile_cases())
def test_profiling_path(case: tuple[ModelSpec, Serving, int, int]) -> None:
    """--free-memory/--weights-memory ↔ SGLang's available (after weights) and pre-load memory.

    Covers the "Loaded weights leave no GPU memory" error (same suggested
    --mem-fraction-static) and "Not enough memory".
    """
    model, serving, free, weights = case
    want, _ = compare(model, model_from_spec(model), serving, free_memory=free, weights_memory=weights)
    outcome(want, serving)


@settings(CHECKS, max_examples=150)
@given(mm_transport_cases())
def test_mm_feature_transport_reservation(case: tuple[ModelSpec, Serving, int, int]) -> None:
    """--mm-feature-transport / --mm-feature-cache-mb ↔ SGLANG_MM_FEATURE_CACHE_MB in SGLang's profiled budget."""
    model, serving, free, weights = case
    want, _ = compare(model, model_from_spec(model), serving, free_memory=free, weights_memory=weights)
    outcome(want, serving)
    event(f"multimodal {model.is_multimodal}, transport {serving.mm_feature_transport}")


@settings(CHECKS, max_examples=250)
@given(pipeline_cases())
def test_pipeline_parallel_every_rank(case: tuple[ModelSpec, Serving, dict[str, int]]) -> None:
    """PP 2–4 (even split or an explicit partition): every rank keeps the smallest stage's tokens."""
    model, serving, budget = case
    oracle_model = model_from_spec(model)
    for rank in range(serving.pp_size):
        want, _ = compare(model, oracle_model, attrs.evolve(serving, pp_rank=rank), **budget)
    outcome(want, serving)
    event(f"pp {serving.pp_size}, {'explicit' if serving.pp_layer_partition else 'even'} split")
    if want.stage_tokens and len(set(want.stage_tokens)) > 1:
        event("stages differ: MIN re-solve")


@settings(CHECKS, max_examples=500)
@given(explicit_cases(speculative=True))
def test_speculative_draft_kv(case: tuple[ModelSpec, Serving, int]) -> None:
    """EAGLE / EAGLE3 / STANDALONE / NEXTN (draft layers or the model's MTP layers), DFLASH, NGRAM."""
    model, serving, memory = case
    want, _ = compare(model, model_from_spec(model), serving, memory=memory)
    outcome(want, serving)


@st.composite
def capped_cases(draw: st.DrawFn) -> tuple[ModelSpec, Serving, int]:
    model = draw(dense_models())
    serving = draw(serving_options(model, caps=False))
    return model, serving, draw(st.integers(GiB // 4, 100 * GiB))


@settings(CHECKS, max_examples=400)
@given(capped_cases(), st.data())
def test_caps_around_capacity(case: tuple[ModelSpec, Serving, int], data: st.DataObject) -> None:
    """--max-total-tokens and --max-running-requests just below, at and above what the budget holds."""
    model, serving, memory = case
    oracle_model = model_from_spec(model)
    base = oracle_plan(oracle_model, attrs.evolve(serving, accounting="sglang"), memory=memory)
    assume(base.error is None and base.max_running_requests)
    tokens, requests = base.max_total_num_tokens, base.max_running_requests
    assert tokens is not None and requests is not None
    page = serving.page_size
    token_cap = data.draw(
        st.one_of(
            st.sampled_from([tokens - page, tokens - 1, tokens, tokens + 1, tokens + page, 2 * tokens]),
            st.integers(1, 2 * tokens),
        ).filter(lambda n: n > 0),
        label="max_total_tokens",
    )
    dp = serving.attn_dp_size
    request_cap = data.draw(
        st.one_of(
            st.sampled_from([requests * dp - 1, requests * dp, requests * dp + 1, tokens // 2 * dp + dp]),
            st.integers(1, 4 * requests * dp),
        ).filter(lambda n: n >= dp),  # fewer than one per DP-attention worker is refused (test_fixed_mismatches)
        label="max_running_requests",
    )
    for capped in (
        attrs.evolve(serving, max_total_tokens=token_cap),
        attrs.evolve(serving, max_running_requests=request_cap),
        attrs.evolve(serving, max_total_tokens=token_cap, max_running_requests=request_cap),
    ):
        want, _ = compare(model, oracle_model, capped, memory=memory)
        outcome(want, capped)


# ---------------------------------------------------------------------------
# the real presets, table-driven
# ---------------------------------------------------------------------------

PRESETS = (
    "llama-3.1-8b",
    "llama-3.1-70b",
    "qwen3-8b",
    "qwen2.5-7b-instruct",
    "qwen3-30b-a3b",
    "qwen3-235b-a22b",
    "mimo-7b-base",
    "minimax-m2.5",
    "phi-2",  # PhiForCausalLM: every head a KV head of hidden / heads = 80 (sglang/srt/models/phi.py L41, L75-79)
)
PRESET_KV = ("bf16", "fp8_e4m3", "fp4_e2m1", "fp4_mx_block16")


def resolve_preset(name: str) -> ModelSpec:
    return load_model(name, get_registry())[0]


@pytest.mark.parametrize("kv", PRESET_KV)
@pytest.mark.parametrize("page", (1, 16, 64))
@pytest.mark.parametrize("tp", (1, 2, 4, 8, 16))
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_explicit_budget(preset: str, tp: int, page: int, kv: str) -> None:
    oracle_model = preset_model(preset)
    serving = Serving(kv_cache_dtype=kv, page_size=page, tp_size=tp)
    if not splits_heads(resolve_preset(preset), tp):  # SGLang's sizing plans it; its model load fails
        with pytest.raises(UnsupportedCombinationError, match="cannot split"):
            kvpools_plan(preset, serving, memory=40 * GiB)
        return
    for memory in (3 * GiB + 12345, 40 * GiB, 200 * GiB):
        compare(preset, oracle_model, serving, memory=memory)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_profiling_path(preset: str) -> None:
    """80 GiB free before loading; light and too-heavy weights; DP attention and PP stages."""
    oracle_model = preset_model(preset)
    tp = 8 if splits_heads(resolve_preset(preset), 8) else 4  # Qwen2.5-7B's 28 heads do not split 8 ways
    for serving in (
        Serving(tp_size=tp, mem_fraction_static=0.88),
        Serving(tp_size=8, dp_size=8, enable_dp_attention=True, kv_cache_dtype="fp8_e4m3", page_size=64),
        Serving(tp_size=4, pp_size=3, pp_rank=2, kv_cache_dtype="fp8_e5m2", page_size=16, max_running_requests=300),
    ):
        for weights in (9 * GiB, 60 * GiB, 75 * GiB, 79 * GiB):
            compare(preset, oracle_model, serving, free_memory=80 * GiB, weights_memory=weights)


@pytest.mark.parametrize("algorithm", ("NEXTN", "EAGLE", "EAGLE3", "STANDALONE", "DFLASH", "NGRAM"))
@pytest.mark.parametrize("preset", ("mimo-7b-base", "llama-3.1-8b", "qwen3-235b-a22b"))
def test_preset_speculative(preset: str, algorithm: str) -> None:
    oracle_model = preset_model(preset)
    draft = None if algorithm in ("NEXTN", "NGRAM") and oracle_model.num_nextn_predict_layers else 2
    if algorithm == "NEXTN" and draft is None:
        assert oracle_model.num_nextn_predict_layers == 1  # mimo's MTP layer is the draft
    options = {
        "speculative_algorithm": algorithm,
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 4,
        "speculative_num_draft_tokens": 8,
    }
    serving = Serving(tp_size=2, page_size=16, speculative_draft_num_layers=draft, **as_sglang_runs(options))
    compare(preset, oracle_model, serving, memory=50 * GiB)


@pytest.mark.parametrize("draft", (1, 2, 5))
@pytest.mark.parametrize("preset", ("mimo-7b-base", "llama-3.1-8b", "qwen3-235b-a22b"))
def test_preset_dspark(preset: str, draft: int) -> None:
    """DSPARK scales the cell as DFLASH does (``is_dflash_family``, ref-002 lines 159-175), run by the oracle."""
    serving = Serving(
        tp_size=2,
        page_size=16,
        speculative_algorithm="DSPARK",
        speculative_num_draft_tokens=8,
        speculative_draft_num_layers=draft,
    )
    want, _ = compare(preset, preset_model(preset), serving, memory=50 * GiB)
    dflash, _ = compare(
        preset, preset_model(preset), attrs.evolve(serving, speculative_algorithm="DFLASH"), memory=50 * GiB
    )
    assert want.max_total_num_tokens == dflash.max_total_num_tokens


# ---------------------------------------------------------------------------
# the two start-up failures, spelled out
# ---------------------------------------------------------------------------


def test_loaded_weights_leave_no_memory_same_suggestion() -> None:
    """SGLang: 1 GiB left after weights, 8 GiB slack (80 GiB × 0.1) → raise above 0.988 (0.9875)."""
    oracle_model = preset_model("llama-3.1-8b")
    want, got = compare("llama-3.1-8b", oracle_model, Serving(), free_memory=80 * GiB, weights_memory=79 * GiB)
    assert want.error == "no_memory_for_kv"
    assert isinstance(got, InsufficientMemoryError)
    assert suggested_fraction(str(got)) == ("0.988", "0.9875")


def test_not_enough_memory_for_one_page() -> None:
    oracle_model = preset_model("llama-3.1-70b")
    serving = Serving(page_size=64)
    want, got = compare("llama-3.1-70b", oracle_model, serving, memory=64 * 327680 - 1)
    assert want.error == "not_enough_memory"
    assert isinstance(got, InsufficientMemoryError)
    # One byte more holds exactly one page.
    want, got = compare("llama-3.1-70b", oracle_model, serving, memory=64 * 327680)
    assert want.max_total_num_tokens == 64
    assert isinstance(got, Plan)
    assert got.max_total_num_tokens == 64


@pytest.mark.parametrize("memory", (0, 1))
def test_no_budget_at_all(memory: int) -> None:
    want, got = compare("qwen3-8b", preset_model("qwen3-8b"), Serving(), memory=memory)
    assert want.error == "not_enough_memory"
    assert isinstance(got, InsufficientMemoryError)
