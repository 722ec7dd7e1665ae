"""Whole-GPU budgets by hand: total - runtime - weights - slack, with SGLang 0.5.23's default fraction.

The fractions follow ``handle_gpu_memory_settings`` (``srt/arg_groups/memory_hook.py`` of SGLang 0.5.23):
chunked prefill and decode ``max_bs`` by GPU memory (lines 89-170), ``reserved = 512 + 1.5 x activation tokens
+ tp x pp / 8 x 1024 + graphs`` (lines 298-313), the graphs ``2 x max_bs`` for decode and ``8 x len(prefill
capture sizes)`` or 1536 MiB with an MLA backend for prefill (``reserve_for_graph_mb``, lines 357-399), a
10240 MiB floor over 60 GiB (line 314) and ``round((G - reserved) / G, 3)`` (line 325).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from kvpools_core import ConfigError, InsufficientMemoryError, Serving, estimate_weights, find_gpu, plan
from kvpools_core.models import load_model
from kvpools_core.pipeline.gpus import sglang_memory_defaults
from kvpools_core.registry import get_registry

CONFIGS = Path(__file__).parents[1] / "weights" / "configs"
GiB = 1 << 30
MiB = 1 << 20


def config(name: str) -> str:
    return str(CONFIGS / f"{name}.json")


def kv_budget(total_mib: int, runtime: int, weights: int, fraction: float) -> int:
    """SGLang's ``_profile_available_bytes`` with free = pre-load = total - runtime, in its float-GiB order."""
    pre = total_mib * MiB - runtime
    return int(((pre - weights) / GiB - (pre / GiB) * (1 - fraction)) * GiB)


def llama70b_weights_per_rank(tp: int) -> int:
    """Llama-3.1-70B by hand: 80 layers of q, o (8192 x 8192), k, v (8192 x 1024), gate/up/down (8192 x 28672),
    all split over TP, two replicated norms per layer; vocab-parallel embedding and head (128256 x 8192); bf16."""
    per_layer = (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672) // tp + 2 * 8192
    params = 80 * per_layer + 2 * 128256 * 8192 // tp + 8192
    return 2 * params


@pytest.mark.parametrize(
    ("gpu", "tp", "fraction", "reserved"),
    [
        # H100 TP 4: 512 + 1.5 x 8192 + 4/8 x 1024 + 2 x 512 + 8 x 58 = 14800 MiB; 66759 / 81559 = 0.8185
        ("h100", 4, 0.819, 14800),
        # H200 TP 8: 512 + 12288 + 1024 + 2 x 512 + 8 x 58 = 15312 MiB; 128459 / 143771 = 0.8935
        ("h200", 8, 0.893, 15312),
    ],
)
def test_llama_3_1_70b_on_a_whole_gpu(gpu: str, tp: int, fraction: float, reserved: float) -> None:
    result = plan(config("meta-llama--Meta-Llama-3.1-70B"), Serving(tp_size=tp), gpu=gpu)
    budget = result.budget
    total_mib = find_gpu(gpu).total_mib
    weights = llama70b_weights_per_rank(tp)
    assert budget.gpu == gpu and budget.gpu_total_bytes == total_mib * MiB
    assert budget.runtime_bytes == 3 * GiB  # a TP group: communicators before the weights
    assert budget.pre_model_load_bytes == budget.free_bytes == total_mib * MiB - 3 * GiB
    assert budget.weights_bytes == weights
    assert budget.mem_fraction_static == fraction
    assert f"reserved {reserved:g} MiB" in (budget.mem_fraction_source or "")
    assert budget.slack_bytes == int(budget.pre_model_load_bytes / GiB * (1 - fraction) * GiB)
    assert budget.budget_bytes == kv_budget(int(total_mib), 3 * GiB, weights, fraction)
    sglang = plan(config("meta-llama--Meta-Llama-3.1-70B"), Serving(tp_size=tp, accounting="sglang"), gpu=gpu)
    # 8 / tp KV heads per rank x 128 x (k + v) x 2 bytes x 80 layers a token
    assert sglang.sizing.max_total_num_tokens == budget.budget_bytes // (8 // tp * 128 * 2 * 2 * 80)


def test_deepseek_v3_fp8_on_h200_tp8() -> None:
    """MLA: the prefill graph reserve is 1536 MiB; 512 + 12288 + 1024 + 1024 + 1536 = 16384 MiB, 0.886."""
    result = plan(config("deepseek-ai--DeepSeek-V3"), Serving(tp_size=8), gpu="h200")
    budget = result.budget
    weights = estimate_weights(config("deepseek-ai--DeepSeek-V3"), Serving(tp_size=8)).bytes_per_rank
    assert budget.mem_fraction_static == 0.886
    assert "prefill graph, MLA backend: 1536 MiB" in (budget.mem_fraction_source or "")
    assert budget.weights_bytes == weights
    assert budget.budget_bytes == kv_budget(143771, 3 * GiB, weights, 0.886)


def test_gpt_oss_120b_mxfp4_on_one_h100() -> None:
    """One GPU: 1 GiB of runtime; 512 + 12288 + 128 + 2 x 256 + 8 x 58 = 13904 MiB, 67655 / 81559 = 0.8295."""
    result = plan(config("openai--gpt-oss-120b"), Serving(), gpu="h100")
    budget = result.budget
    weights = estimate_weights(config("openai--gpt-oss-120b")).bytes_per_rank
    assert budget.runtime_bytes == GiB
    assert budget.mem_fraction_static == 0.83
    assert budget.weights_bytes == weights
    assert budget.budget_bytes == kv_budget(81559, GiB, weights, 0.83)


def test_a_given_fraction_runtime_and_weights_are_used_as_given() -> None:
    result = plan(
        "llama-3.1-8b",
        Serving(mem_fraction_static=0.9),
        gpu="h100",
        weights_memory="15GiB",
        runtime_memory="512MiB",
    )
    budget = result.budget
    assert budget.mem_fraction_source == "given" and budget.mem_fraction_static == 0.9
    assert budget.runtime_bytes == 512 * MiB and budget.weights_bytes == 15 * GiB
    assert budget.budget_bytes == kv_budget(81559, 512 * MiB, 15 * GiB, 0.9)
    assert budget.steps[0].startswith("GPU h100 total 85520809984 B")


def test_gpu_memory_is_a_custom_total() -> None:
    budget = plan("llama-3.1-8b", gpu_memory="96GiB", weights_memory="15GiB").budget
    assert budget.gpu == "custom" and budget.gpu_total_bytes == 96 * GiB
    defaults = sglang_memory_defaults(96 * 1024, load_model("llama-3.1-8b", get_registry())[0], Serving())
    assert budget.mem_fraction_static == defaults.mem_fraction_static


@pytest.mark.parametrize(
    ("gpu", "tp", "fraction", "reserved", "chunk", "max_bs"),
    [
        # L40S (< 60 GiB): chunk 4096, max_bs 32; prefill sizes up to 4096: 50; no 10 GiB floor.
        # 512 + 6144 + 128 + 64 + 400 = 7248; 38820 / 46068 = 0.8427
        ("l40s", 1, 0.843, 7248, 4096, 32),
        # A100 40GB TP 4: max_bs 160 (tp >= 4); 512 + 6144 + 512 + 320 + 400 = 7888; 33072 / 40960 = 0.8074
        ("a100-40gb", 4, 0.807, 7888, 4096, 160),
        # B200 (>= 160 GiB) TP 8: chunk 16384, max_bs 512; prefill sizes up to 16384: 50 + 24 = 74.
        # 512 + 24576 + 1024 + 1024 + 592 = 27728; 155631 / 183359 = 0.8488
        ("b200", 8, 0.849, 27728, 16384, 512),
        # MI300X TP 8 (ROCm: no breakable prefill graph): 512 + 24576 + 1024 + 1024 = 27136; 169456 / 196592
        ("mi300x", 8, 0.862, 27136, 16384, 512),
        # L4 (< 35 GiB... 23034 MiB: < 35 GiB tier) TP 1: chunk 4096, max_bs 48; 512 + 6144 + 128 + 96 + 400
        # = 7280; 15754 / 23034 = 0.6840
        ("l4", 1, 0.684, 7280, 4096, 48),
        # H100 TP 1, under the 10 GiB floor? 13904 > 10240: no floor.
        ("h100", 1, 0.83, 13904, 8192, 256),
        # Ascend 910B TP 8: its own tier (npu/utils.py lines 135-160), chunk 8192, max_bs 256; no prefill graph.
        # 512 + 12288 + 1024 + 512 = 14336; 51200 / 65536 = 0.78125
        ("ascend-910b", 8, 0.781, 14336, 8192, 256),
    ],
)
def test_sglang_default_fraction(gpu: str, tp: int, fraction: float, reserved: float, chunk: int, max_bs: int) -> None:
    from kvpools_core.pipeline.gpus import sglang_chunked_prefill_size

    spec = load_model("llama-3.1-8b", get_registry())[0]
    chosen = find_gpu(gpu)
    serving = Serving(tp_size=tp, chunked_prefill_size=sglang_chunked_prefill_size(chosen.total_mib, chosen.platform))
    serving = attrs.evolve(serving, platform=chosen.platform)
    defaults = sglang_memory_defaults(chosen.total_mib, spec, serving)
    assert (defaults.chunked_prefill_size, defaults.decode_max_bs) == (chunk, max_bs)
    assert defaults.reserved_mb == reserved
    assert defaults.mem_fraction_static == fraction


def test_the_floor_and_the_request_cap_and_dp_attention() -> None:
    spec = load_model("llama-3.1-8b", get_registry())[0]
    # H100 with 2048-token chunks: 512 + 3072 + 128 + 512 + 8 x 50 = 4624 -> the 10240 MiB floor; 71319 / 81559
    small = sglang_memory_defaults(81559, spec, Serving(chunked_prefill_size=2048))
    assert small.reserved_mb == 10240 and small.mem_fraction_static == 0.874
    # --max-running-requests 64 caps the decode max_bs 256 (lines 182-188): 2 x 64
    capped = sglang_memory_defaults(81559, spec, Serving(max_running_requests=64))
    assert capped.decode_max_bs == 64 and capped.reserved_mb == 13904 - 512 + 128
    # DP attention 8 on H200 TP 8: + 3 x 512 x 8 + 1.5 x 512 x 8 (max_bs > 300) = 18432 MiB
    dp = sglang_memory_defaults(143771, spec, Serving(tp_size=8, dp_size=8, enable_dp_attention=True))
    assert dp.reserved_mb == 15312 + 18432
    # chunked prefill off: max_prefill_tokens 16384 activation tokens, the prefill graph captures nothing
    off = sglang_memory_defaults(81559, spec, Serving(chunked_prefill_size=None))
    assert off.reserved_mb == 512 + 1.5 * 16384 + 128 + 512


def test_platform_follows_the_gpu(rocm_platform: None) -> None:
    result = plan("llama-3.1-8b", gpu="mi300x", weights_memory="15GiB")
    assert result.serving.platform == "rocm"
    assert "no prefill graph (platform rocm" in (result.budget.mem_fraction_source or "")


def test_ascend_plans_on_its_plugin_or_says_what_to_install() -> None:
    """With kvpools-ascend installed the 910B plans for ``ascend`` (its 128-token pages); else the install hint."""
    installed = any(info.name == "ascend" and info.status == "loaded" for info in get_registry().plugins())
    if installed:
        result = plan("llama-3.1-8b", Serving(page_size=128), gpu="ascend-910b", weights_memory="15GiB")
        assert result.serving.platform == "ascend"
        # Ascend's tier (npu/utils.py): 64 GiB -> chunk 8192, max_bs 64; no prefill graph;
        # 512 + 12288 + 128 + 128 = 13056 MiB over the 10240 floor; 52480 / 65536 = 0.8008
        assert "no prefill graph (platform ascend" in (result.budget.mem_fraction_source or "")
        assert "reserved 13056 MiB" in (result.budget.mem_fraction_source or "")
        assert result.budget.mem_fraction_static == 0.801
    else:
        with pytest.raises(ConfigError, match="pip install kvpools-ascend"):
            plan("llama-3.1-8b", gpu="ascend-910b", weights_memory="15GiB")


def test_a_conflicting_platform_and_budget_sources_are_refused() -> None:
    with pytest.raises(ConfigError, match="runs on the 'rocm' platform"):
        plan("llama-3.1-8b", Serving(platform="cpu"), gpu="mi300x", weights_memory="15GiB")
    with pytest.raises(ConfigError, match="memory"):
        plan("llama-3.1-8b", gpu="h100", memory="60GiB")
    with pytest.raises(ConfigError, match="not both"):
        plan("llama-3.1-8b", gpu="h100", gpu_memory="80GiB")
    with pytest.raises(ConfigError, match="runtime_memory applies to a GPU budget"):
        plan("llama-3.1-8b", memory="60GiB", runtime_memory="1GiB")


def test_a_preset_without_shapes_asks_for_the_weights() -> None:
    with pytest.raises(ConfigError, match=r"'intermediate_size' is missing.*Pass weights_memory"):
        plan("mistral-7b-v0.1", gpu="h100")


def test_weights_that_do_not_fit_name_tp() -> None:
    with pytest.raises(InsufficientMemoryError, match="tp_size"):
        plan(config("meta-llama--Meta-Llama-3.1-70B"), gpu="h100")


def test_multimodal_model_needs_a_stated_fraction() -> None:
    spec = load_model("llama-3.1-8b", get_registry())[0]
    with pytest.raises(ConfigError, match="vision tower"):
        sglang_memory_defaults(81559, attrs.evolve(spec, is_multimodal=True), Serving())


def test_pipeline_stages_hold_their_own_weights() -> None:
    """PP 2: each stage profiles its own weights (embedding on the first, head on the last); the min wins."""
    result = plan(config("meta-llama--Meta-Llama-3.1-70B"), Serving(tp_size=2, pp_size=2), gpu="h100")
    last = plan(config("meta-llama--Meta-Llama-3.1-70B"), Serving(tp_size=2, pp_size=2, pp_rank=1), gpu="h100")
    assert (
        result.budget.weights_bytes
        == estimate_weights(config("meta-llama--Meta-Llama-3.1-70B"), Serving(tp_size=2, pp_size=2)).bytes_per_rank
    )
    assert result.sizing.max_total_num_tokens == last.sizing.max_total_num_tokens
