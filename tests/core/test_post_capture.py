"""SGLang 0.5.23's post-capture KV sizing (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``, ``Serving.post_capture_kv_sizing``;
issue 34, ledger row 000-130), hand-computed from the installed SGLang's lines:

* ``srt/arg_groups/memory_hook.py`` L291-295: under post-capture sizing the default fraction's reserve is
  ``1536 + tp x pp / 8 x 1024`` MiB (no graph, activation or 10 GiB floor term); L423-430: a multimodal model
  loses ``8 x 1024 / G`` more;
* ``srt/runtime_context.py`` L1797-1817 ``pre_capture_activation_reserve_mb``;
* ``srt/mem_cache/kv_cache_configurator.py`` L3006-3030: a Mamba-state model's slack is
  ``max(pre x (1 - fraction), reserve / 1024)`` GiB;
* ``srt/arg_groups/overrides.py`` L1791-1862 ``post_capture_kv_sizing_planned``.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kvpools_core import plan
from kvpools_core.cli import main
from kvpools_core.errors import ConfigError
from kvpools_core.models import load_model
from kvpools_core.pipeline.gpus import MAMBAISH_STATE, model_traits
from kvpools_core.pipeline.post_capture import (
    largest_prefill_capture_size,
    post_capture_planned,
    post_capture_reserved_mb,
    pre_capture_activation_reserve_mb,
)
from kvpools_core.registry import get_registry
from kvpools_core.values import Serving

GiB = 1 << 30
H100_MIB = 81559
H100_BYTES = H100_MIB << 20


def test_the_reserve_formulas_by_hand() -> None:
    # memory_hook.py L294-295: 1536 + tp x pp / 8 x 1024
    assert post_capture_reserved_mb(1, 1) == 1536 + 128
    assert post_capture_reserved_mb(4, 2) == 1536 + 1024
    # runtime_context.py L1797-1817: 512 + 1.5 x max(chunk, 2048) + tp x pp / 8 x 1024, floor 10240 over 60 GiB
    assert pre_capture_activation_reserve_mb(H100_MIB, Serving(tp_size=4), 512) == 512 + 1.5 * 8192 + 512
    assert pre_capture_activation_reserve_mb(40960, Serving(chunked_prefill_size=1024), 32) == 512 + 1.5 * 2048 + 128
    assert pre_capture_activation_reserve_mb(H100_MIB, Serving(chunked_prefill_size=1024), 256) == 10240
    # chunked prefill off: max_prefill_tokens 16384
    assert pre_capture_activation_reserve_mb(40960, Serving(chunked_prefill_size=None), 32) == 512 + 1.5 * 16384 + 128
    # a PD decode node: max(running x draft tokens, 2048), running = --max-running-requests or the decode max_bs
    decode = Serving(disaggregation_mode="decode", max_running_requests=512)
    assert pre_capture_activation_reserve_mb(40960, decode, 32) == 512 + 1.5 * 2048 + 128
    assert pre_capture_activation_reserve_mb(40960, Serving(disaggregation_mode="decode"), 4096) == (
        512 + 1.5 * 4096 + 128
    )


def test_largest_prefill_capture_size() -> None:
    """``generate_prefill_cuda_graph_batch_sizes`` (``cuda_graph_hook.py`` L480-497): the tiers' chunks are captured,
    a chunk between two sizes is not."""
    assert largest_prefill_capture_size(8192) == 8192
    assert largest_prefill_capture_size(16384) == 16384
    assert largest_prefill_capture_size(2048) == 2048
    assert largest_prefill_capture_size(5000) == 4608
    assert largest_prefill_capture_size(3) == 0


def test_the_mamba_trait_comes_from_the_mamba_plugin() -> None:
    assert MAMBAISH_STATE in model_traits(load_model("qwen3-next-80b-a3b-thinking", get_registry())[0])
    assert MAMBAISH_STATE not in model_traits(load_model("llama-3.1-8b", get_registry())[0])


def test_dense_default_fraction_skips_the_graph_reserve() -> None:
    """llama-3.1-8b on an H100: reserved 1664 MiB, fraction round((81559 - 1664) / 81559, 3) = 0.98 (against 0.83
    without the switch); the budget is pre - weights - pre x 0.02."""
    serving = Serving(accounting="sglang", post_capture_kv_sizing=True)
    result = plan("llama-3.1-8b", serving, gpu="h100", weights_memory="15GiB")
    assert result.budget.mem_fraction_static == 0.98
    pre = H100_BYTES - GiB
    rest_gb = (pre - 15 * GiB) / GiB - pre / GiB * (1 - 0.98)
    assert result.budget.budget_bytes == int(rest_gb * GiB)
    assert result.max_total_num_tokens == int(rest_gb * GiB) // 131072
    without = plan("llama-3.1-8b", Serving(accounting="sglang"), gpu="h100", weights_memory="15GiB")
    assert without.budget.mem_fraction_static == 0.83
    assert any("upper bound" in step for step in result.budget.steps)


def test_mamba_slack_is_at_least_the_pre_capture_reserve() -> None:
    """qwen3-next TP 4 on an H100, 37 GiB of weights: fraction round((81559 - 2048) / 81559, 3) = 0.975, slack
    76.65 GiB x 0.025 = 1.92 GiB; the reserve 512 + 1.5 x 8192 + 512 = 13312 MiB = 13 GiB is larger, so the budget
    is pre - weights - 13 GiB (kv_cache_configurator.py L3006-3030, SGLang's float-GiB arithmetic)."""
    serving = Serving(tp_size=4, post_capture_kv_sizing=True)
    result = plan("qwen3-next-80b-a3b-thinking", serving, gpu="h100", weights_memory="37GiB")
    assert result.budget.mem_fraction_static == 0.975
    pre = H100_BYTES - 3 * GiB
    slack_gb = pre / GiB * (1 - 0.975)
    assert slack_gb < 13
    rest_gb = (pre - 37 * GiB) / GiB - max(slack_gb, 13312 / 1024)
    assert abs(result.budget.budget_bytes - int(rest_gb * GiB)) <= 1
    # the same with a given fraction: the floor does not depend on where the fraction came from
    given = plan(
        "qwen3-next-80b-a3b-thinking",
        Serving(tp_size=4, post_capture_kv_sizing=True, mem_fraction_static=0.9),
        gpu="h100",
        weights_memory="37GiB",
    )
    rest_given = (pre - 37 * GiB) / GiB - max(pre / GiB * 0.1, 13.0)
    assert abs(given.budget.budget_bytes - int(rest_given * GiB)) <= 1


@pytest.mark.parametrize(
    ("model", "serving", "why"),
    [
        ("deepseek-v3", Serving(tp_size=8), "MLA-backend"),
        ("llama-3.1-8b", Serving(pp_size=2), "no prefill CUDA graph"),
        ("llama-3.1-8b", Serving(chunked_prefill_size=5000), "not a captured prefill size"),
        ("llama-3.1-8b", Serving(chunked_prefill_size=None), "chunked prefill off"),
        ("llama-3.1-8b", Serving(dcp_size=2, tp_size=2), "decode context parallelism"),
    ],
)
def test_where_sglang_does_not_plan_it(model: str, serving: Serving, why: str) -> None:
    import attrs

    spec = load_model(model, get_registry())[0]
    result = post_capture_planned(spec, attrs.evolve(serving, post_capture_kv_sizing=True))
    assert not result.planned and why in result.why_not


def test_not_planned_plans_as_without_it_and_says_so() -> None:
    base = Serving(tp_size=8)
    on = plan("deepseek-v3", Serving(tp_size=8, post_capture_kv_sizing=True), gpu="h200", weights_memory="80GiB")
    off = plan("deepseek-v3", base, gpu="h200", weights_memory="80GiB")
    assert on.budget.budget_bytes == off.budget.budget_bytes
    assert any("not planned by SGLang: an MLA-backend model" in step for step in on.budget.steps)


def test_refused_outside_a_gpu_budget() -> None:
    with pytest.raises(ConfigError, match="already the KV cache's own budget"):
        plan("llama-3.1-8b", Serving(post_capture_kv_sizing=True), memory="20GiB")
    with pytest.raises(ConfigError, match="does not model post_capture_kv_sizing on a stated or measured"):
        plan("llama-3.1-8b", Serving(post_capture_kv_sizing=True), free_memory="60GiB")


def test_the_exact_path_is_unchanged() -> None:
    """Given --memory the plan does not depend on the new field (its default is off): the token count main gave."""
    runner = CliRunner()
    done = runner.invoke(main, ["plan", "llama-3.1-8b", "--memory", "20GiB", "--json"])
    assert done.exit_code == 0, done.output
    assert '"max_total_num_tokens": 155633' in done.output
