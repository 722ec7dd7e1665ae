"""Whole-GPU budgets by hand: total - runtime - weights - slack, with SGLang 0.5.23's default fraction.

The fractions follow ``handle_gpu_memory_settings`` (``srt/arg_groups/memory_hook.py`` of SGLang 0.5.23):
chunked prefill and decode ``max_bs`` by GPU memory (lines 89-170), ``reserved = 512 + 1.5 x activation tokens
+ tp x pp / 8 x 1024 + graphs`` (lines 298-313), the graphs ``2 x max_bs`` for decode and ``8 x len(prefill
capture sizes)`` or 1536 MiB with an MLA backend for prefill (``reserve_for_graph_mb``, lines 357-399), a
10240 MiB floor over 60 GiB (line 314) and ``round((G - reserved) / G, 3)`` (line 325).
"""

from __future__ import annotations

import json
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


# Issue 34: the library's unset chunk resolves from the GPU as SGLang's does (``memory_hook.py`` lines 89-178 of
# SGLang 0.5.23, ``cfg.chunked_prefill_size is None`` -> the GPU's tier), as ``kvpools plan --gpu`` always did.
# B200 (183359 MiB >= 160 GiB) TP 8, Llama-3.1-8B: chunk 16384, max_bs 512, prefill capture sizes up to 16384: 74;
# 512 + 1.5 x 16384 + 8/8 x 1024 + 2 x 512 + 8 x 74 = 27728 MiB; (183359 - 27728) / 183359 = 0.8488 -> 0.849.
# With the chunk kept at 8192 (the old silent default): 512 + 12288 + 1024 + 1024 + 8 x 58 = 15312 MiB;
# (183359 - 15312) / 183359 = 0.9165 -> 0.916, the mis-plan.


def test_the_library_resolves_an_unset_chunk_from_the_gpu() -> None:
    result = plan("llama-3.1-8b", Serving(tp_size=8), gpu="b200", weights_memory="4GiB")
    assert result.serving.chunked_prefill_size == 16384
    assert result.budget.mem_fraction_static == 0.849
    assert "reserved 27728 MiB" in (result.budget.mem_fraction_source or "")
    # an L4 (23034 MiB, the < 35 GiB tier): chunk 4096 (the fraction is test_sglang_default_fraction's 0.684)
    small = plan("llama-3.1-8b", Serving(), gpu="l4", weights_memory="4GiB")
    assert small.serving.chunked_prefill_size == 4096 and small.budget.mem_fraction_static == 0.684
    # a custom total takes the same tiers: 200 GiB -> 16384
    assert plan("llama-3.1-8b", Serving(), gpu_memory="200GiB", weights_memory="4GiB").serving.chunked_prefill_size == (
        16384
    )


def test_an_explicit_chunk_on_a_gpu_is_kept_even_the_old_default() -> None:
    given = plan("llama-3.1-8b", Serving(tp_size=8, chunked_prefill_size=8192), gpu="b200", weights_memory="4GiB")
    assert given.serving.chunked_prefill_size == 8192
    assert given.budget.mem_fraction_static == 0.916
    assert "reserved 15312 MiB" in (given.budget.mem_fraction_source or "")
    off = plan("llama-3.1-8b", Serving(chunked_prefill_size=None), gpu="b200", weights_memory="4GiB")
    assert off.serving.chunked_prefill_size is None
    # without a GPU the unset chunk reads as SGLang's 8192 (a --memory plan's SWA/activation terms see 8192)
    assert plan("llama-3.1-8b", Serving(), memory="20GiB").serving.chunked_prefill_size == 8192


def test_the_resolved_chunk_round_trips_through_json_and_serving() -> None:
    from kvpools_core import Plan
    from kvpools_core.values import is_unset
    from kvpools_core.values._fields import to_dict

    assert is_unset(Serving().chunked_prefill_size) and Serving().chunked_prefill_size == 8192
    loaded = Serving.from_dict(json.loads(json.dumps(to_dict(Serving()))))  # the JSON text: a plain 8192, given
    assert loaded.chunked_prefill_size == 8192 and not is_unset(loaded.chunked_prefill_size)
    result = plan("llama-3.1-8b", Serving(tp_size=8), gpu="b200", weights_memory="4GiB")
    data = json.loads(json.dumps(result.to_dict()))
    assert data["serving"]["chunked_prefill_size"] == 16384
    again = Plan.from_dict(data)
    assert again.serving.chunked_prefill_size == 16384 and again.budget.mem_fraction_static == 0.849
    # replanning the JSON's serving on the GPU gives the same plan: the resolved chunk is now given
    replanned = plan("llama-3.1-8b", again.serving, gpu="b200", weights_memory="4GiB")
    assert replanned.budget == result.budget


# Issue 34: SGLang's --disable-cuda-graph sets both graph backends DISABLED (cuda_graph_hook.py lines 54-57), so
# reserve_for_graph_mb (memory_hook.py lines 357-399) adds neither the decode 2 x max_bs (line 366) nor the prefill
# term (line 379), while DP attention's padding (lines 369-377) is not gated on the backend; the 10 GiB floor stays.


def test_disable_cuda_graph_drops_both_graph_reserves() -> None:
    spec = load_model("llama-3.1-8b", get_registry())[0]
    # H100 TP 1: 512 + 1.5 x 8192 + 1/8 x 1024 = 12928 MiB (with graphs 13904: + 2 x 256 + 8 x 58);
    # (81559 - 12928) / 81559 = 0.84149 -> 0.841 (with graphs 0.83)
    off = sglang_memory_defaults(81559, spec, Serving(chunked_prefill_size=8192, disable_cuda_graph=True))
    assert off.reserved_mb == 12928 and off.mem_fraction_static == 0.841
    assert "no decode graph (--disable-cuda-graph)" in off.terms
    assert any(term.startswith("no prefill graph (--disable-cuda-graph") for term in off.terms)
    # under the floor it is still 10240 MiB: 512 + 3072 + 128 = 3712 -> 10240; 71319 / 81559 = 0.874
    small = sglang_memory_defaults(81559, spec, Serving(chunked_prefill_size=2048, disable_cuda_graph=True))
    assert small.reserved_mb == 10240 and small.mem_fraction_static == 0.874
    # DP attention 8 on H200 TP 8 keeps its 3 x 512 x 8 + 1.5 x 512 x 8 = 18432 MiB: 512 + 12288 + 1024 + 18432
    dp = sglang_memory_defaults(
        143771, spec, Serving(tp_size=8, dp_size=8, enable_dp_attention=True, disable_cuda_graph=True)
    )
    assert dp.reserved_mb == 13824 + 18432 and dp.mem_fraction_static == 0.776  # 111515 / 143771 = 0.77564


def test_disable_cuda_graph_on_a_whole_gpu_plan_and_post_capture() -> None:
    result = plan("llama-3.1-8b", Serving(disable_cuda_graph=True), gpu="h100", weights_memory="15GiB")
    assert result.budget.mem_fraction_static == 0.841
    assert "reserved 12928 MiB" in (result.budget.mem_fraction_source or "")
    assert result.budget.budget_bytes == kv_budget(81559, GiB, 15 * GiB, 0.841)
    # post-capture KV sizing is never planned without a decode graph (overrides.py lines 1838-1842)
    post = plan(
        "llama-3.1-8b",
        Serving(disable_cuda_graph=True, post_capture_kv_sizing=True),
        gpu="h100",
        weights_memory="15GiB",
    )
    assert post.budget.mem_fraction_static == 0.841
    assert any("--disable-cuda-graph (L1838-1842)" in step for step in post.budget.steps)


def test_a_basis_resolved_without_the_gpu_refuses_a_gpu_whose_chunk_differs() -> None:
    from kvpools_core.pipeline import plan_basis

    basis = plan_basis("llama-3.1-8b", Serving(tp_size=8))
    with pytest.raises(ConfigError, match=r"default chunked_prefill_size on .* is 16384"):
        basis.plan(gpu=find_gpu("b200"), weights_memory="4GiB")
    # an H100's default is the 8192 the unset chunk reads: nothing differs
    assert plan_basis("llama-3.1-8b", Serving()).plan(gpu=find_gpu("h100"), weights_memory="4GiB").budget.gpu == "h100"
