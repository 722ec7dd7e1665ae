"""ROCm's AITER factor on ``mem_fraction_static`` (issue 34): SGLang 0.5.23's
``_handle_attention_backend_compatibility`` (``srt/arg_groups/attention_hook.py`` lines 243-269) multiplies
the fraction, default or given, by 0.85 when the attention backend is ``aiter`` (HIP's default for MHA models,
``model_override_base.py`` lines 323-345) and ``context_len > 8192``; an explicit fraction is kept only under
``SGLANG_AITER_HONOR_EXPLICIT_MEM_FRACTION``.

Hand-computed numbers: on a 288 GiB MI355X (294912 MiB), Qwen3-30B-A3B at TP 1 with SGLang's tier chunk 16384
(``memory_hook.py`` lines 156-170, over 160 GiB), ``reserved = 512 + 1.5 x 16384 + 1 x 1 / 8 x 1024 + 2 x 512
(decode max_bs 512) = 26240 MiB`` (no breakable prefill graph on ROCm), ``round((294912 - 26240) / 294912, 3) =
0.911``, the value SGLang printed there (github.com/sgl-project/sglang/pull/18263), and ``0.911 x 0.85 = 0.77435``.
"""

from __future__ import annotations

import pytest

from kvpools_core import Serving, plan
from kvpools_core.errors import InvalidValueError, UnsupportedCombinationError
from kvpools_core.values import PlatformTraits

pytestmark = pytest.mark.usefixtures("rocm_platform")

GiB = 1 << 30
MI355X = "288GiB"
CHUNK = 16384  # SGLang's chunked_prefill_size over 160 GiB (memory_hook.py lines 156-170)


def _fraction(serving: Serving, model: str = "qwen3-30b-a3b") -> float:
    return plan(model, serving, gpu_memory=MI355X).budget.mem_fraction_static


def test_aiter_scales_the_default_fraction_above_8192_tokens() -> None:
    # qwen3-30b-a3b's context is 40960 > 8192
    assert _fraction(Serving(platform="rocm", chunked_prefill_size=CHUNK)) == pytest.approx(0.911 * 0.85)


def test_the_step_says_where_the_factor_comes_from() -> None:
    result = plan("qwen3-30b-a3b", Serving(platform="rocm", chunked_prefill_size=CHUNK), gpu_memory=MI355X)
    text = " ".join(result.budget.steps)
    assert "x 0.85, the rocm attention backend's factor for context_len 40960 > 8192" in text


def test_no_factor_at_8192_tokens_or_without_aiter_or_on_cuda() -> None:
    assert _fraction(Serving(platform="rocm", chunked_prefill_size=CHUNK, context_length=8192)) == 0.911
    triton = Serving(platform="rocm", chunked_prefill_size=CHUNK, plugin_options={"rocm.attention_backend": "triton"})
    assert _fraction(triton) == 0.911
    # CUDA at the same size also reserves the breakable prefill graph: 8 x 58 capture sizes up to 16384 = 464 MiB
    # (cuda_graph_hook.py lines 480-497), round((294912 - 26704) / 294912, 3) = 0.909, and no factor
    assert _fraction(Serving(chunked_prefill_size=CHUNK)) == 0.909


def test_a_given_fraction_is_scaled_unless_honoured() -> None:
    assert _fraction(Serving(platform="rocm", mem_fraction_static=0.9)) == pytest.approx(0.765)
    honoured = Serving(
        platform="rocm", mem_fraction_static=0.9, plugin_options={"rocm.honor_explicit_mem_fraction": "on"}
    )
    assert _fraction(honoured) == 0.9
    # the honour only covers a given fraction: the default is still scaled (attention_hook.py lines 248-253)
    default = Serving(
        platform="rocm", chunked_prefill_size=CHUNK, plugin_options={"rocm.honor_explicit_mem_fraction": "on"}
    )
    assert _fraction(default) == pytest.approx(0.911 * 0.85)


def test_an_unknown_honour_value_is_refused() -> None:
    serving = Serving(platform="rocm", plugin_options={"rocm.honor_explicit_mem_fraction": "yes"})
    with pytest.raises(
        UnsupportedCombinationError, match=r"rocm\.honor_explicit_mem_fraction must be on or off, got 'yes'"
    ):
        plan("qwen3-30b-a3b", serving, gpu_memory=MI355X)


def test_sglang_0_5_7_mi355x_log_is_reproduced_from_the_gpu() -> None:
    """github.com/sgl-project/sglang/issues/18262 (SGLang 0.5.7, MI355X, TP 1, the 5-layer cut of
    Qwen3-30B-A3B-Instruct-2507, 12.79 GB of weights): 'KV Cache is allocated. #tokens: 21985288, K size: 104.83 GB,
    V size: 104.83 GB', i.e. 209.66 GiB.  kvpools: 288 - 1 (runtime) - 12.79 = 274.21 GiB after the weights, less
    287 x (1 - 0.77435) = 64.76155 GiB of slack = 209.44845 GiB (-0.10 %); without the factor it was 248.67 GiB
    (+18.6 %)."""
    serving = Serving(platform="rocm", chunked_prefill_size=CHUNK, accounting="sglang")
    result = plan(
        "benchmarks/data/configs/fxmarty--Qwen_Qwen3-30B-A3B-Instruct-2507-5-layers.json",
        serving,
        gpu_memory=MI355X,
        weights_memory="12.79GiB",
    )
    expected = 288 * GiB - GiB - round(12.79 * GiB) - 287 * GiB * (1 - 0.911 * 0.85)
    assert result.budget.budget_bytes == pytest.approx(expected, abs=2)
    assert abs(result.budget.budget_bytes / GiB - 209.66) / 209.66 < 0.002
    # 5 layers x 4 KV heads x 128 x 2 B x (K + V) = 10240 B a token
    assert result.cell.bytes_per_token == 10240
    assert abs(result.max_total_num_tokens - 21_985_288) / 21_985_288 < 0.002


@pytest.mark.parametrize("scale", [0, -0.5, 1.5, True])
def test_the_traits_refuse_a_factor_outside_0_1(scale: object) -> None:
    with pytest.raises(InvalidValueError, match=r"mem_fraction_scale must be a number in \(0, 1\]"):
        PlatformTraits(platform="x", mem_fraction_scale=scale)  # type: ignore[arg-type]
