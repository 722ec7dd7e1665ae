"""kvpools ``--accounting sglang`` against SGLang's own ``DSV4PoolConfigurator`` (the oracle), token-exact.

Every case plans with kvpools and runs SGLang's configurator (through
``kv_cache_configurator.py``'s profiling, token constraints,
``resolve_max_num_reqs`` and ``finalize_with_max_running_requests``) on the
same inputs; they must agree on every ``MemoryPoolConfig`` field (full, SWA,
c4, c128 tokens, both state pool sizes, requests) and the bytes per full token
(``support.compare_dsv4``).  The cases are the issue's Checks list, then
hypothesis-generated DeepSeek-V4 configs.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.pipeline import plan
from kvpools_core.values import Serving
from tests.oracle.locate import require_oracle

from .support import CHECKS, GiB, compare_dsv4, dsv4_params, oracle_model, preset_config, write_config

require_oracle()

pytestmark = pytest.mark.oracle

BASE = Serving(tp_size=8, page_size=256)
"""``--swa-full-tokens-ratio`` left unset: kvpools plans SGLang's DeepSeek-V4 default 0.1, which the oracle is given
as SGLang's model override sets it (``support.sglang_resolved``)."""
GENERIC_RATIO = attrs.evolve(BASE, swa_full_tokens_ratio=0.8)
"""SGLang's generic ratio, given explicitly (the numbers pinned before DeepSeek-V4's own default was applied)."""
EAGLE: dict[str, Any] = {
    "speculative_algorithm": "EAGLE",
    "speculative_draft_num_layers": 1,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}
MEMORIES = (40 * GiB, 60 * GiB + 12345, 131 * GiB)


def check(preset: str, serving: Serving, memory: int) -> tuple[int, ...] | None:
    return compare_dsv4(preset, oracle_model(preset_config(preset)), serving, memory).fields


@pytest.mark.parametrize("preset", ["deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v4-flash-fp8-sgl"])
def test_base_case(preset: str) -> None:
    for memory in MEMORIES:
        assert check(preset, BASE, memory) is not None


def test_base_case_the_numbers() -> None:
    """Default flags take SGLang's ratio 0.1 (SWA = int(F x 0.1) page aligned) and its 256 requests for DeepSeek-V4
    (``apply_deepseek_v4_defaults``: the c128 state is reserved for 257 slots x ring 128 = 32,896 rows); an explicit
    0.8 keeps its own; explicit 2048 requests give the numbers of SGLang's estimate before that default."""
    assert check("deepseek-v4-flash", BASE, 60 * GiB) == (8008448, 256, 8008448, 800768, 2002112, 62566, 50048, 32896)
    assert check("deepseek-v4-flash", GENERIC_RATIO, 60 * GiB) == (
        1778688,
        256,
        1778688,
        1422848,
        444672,
        13896,
        88928,
        32896,
    )
    assert check("deepseek-v4-flash", attrs.evolve(GENERIC_RATIO, max_running_requests=2048), 60 * GiB) == (
        1236992,
        2048,
        1236992,
        989440,
        309248,
        9664,
        61840,
        262272,
    )


def test_swa_ratio_with_requests() -> None:
    serving = attrs.evolve(BASE, swa_full_tokens_ratio=0.1, max_running_requests=256)
    for memory in MEMORIES:
        check("deepseek-v4-flash", serving, memory)
    assert check("deepseek-v4-flash", serving, 60 * GiB) == (
        8008448,
        256,
        8008448,
        800768,
        2002112,
        62566,
        50048,
        32896,
    )


@pytest.mark.parametrize("requests", [None, 64, 512])
def test_eagle(requests: int | None) -> None:
    serving = attrs.evolve(BASE, max_running_requests=requests, **EAGLE)
    for preset in ("deepseek-v4-flash", "deepseek-v4-pro"):
        for memory in MEMORIES:
            check(preset, serving, memory)


@pytest.mark.parametrize("requests", [None, 128])
def test_online_compress(requests: int | None) -> None:
    for memory in MEMORIES:
        check(
            "deepseek-v4-flash", attrs.evolve(BASE, enable_online_compress=True, max_running_requests=requests), memory
        )
        mtp = attrs.evolve(
            BASE, enable_online_compress=True, enable_online_c128_mtp=True, max_running_requests=requests, **EAGLE
        )
        check("deepseek-v4-flash", mtp, memory)
        check("deepseek-v4-pro", mtp, memory)


def test_hisparse_and_bf16_state() -> None:
    for memory in MEMORIES:
        for preset in ("deepseek-v4-flash", "deepseek-v4-pro"):
            for ratio in (4, 2, 8):
                hisparse = attrs.evolve(
                    GENERIC_RATIO,
                    enable_hisparse=True,
                    disable_radix_cache=True,
                    hisparse_config=f'{{"host_to_device_ratio": {ratio}}}',
                )
                fields = check(preset, hisparse, memory)
                assert fields is not None and fields[4] == fields[2] // (4 * ratio)
                # the default ratio 0.1: SGLang and kvpools agree, a start-up failure included
                check(preset, attrs.evolve(hisparse, swa_full_tokens_ratio=BASE.swa_full_tokens_ratio), memory)
            check(
                preset, attrs.evolve(BASE, enable_hisparse=True, disable_radix_cache=True), memory
            )  # SGLang's default ratio 2
            check(preset, attrs.evolve(BASE, dsv4_compress_state_dtype="bfloat16"), memory)


@pytest.mark.parametrize("requests", [None, 256])
def test_decode_disaggregation_extra_slots(requests: int | None) -> None:
    for extra in (0, 32, 1000):
        serving = attrs.evolve(
            BASE, disaggregation_mode="decode", disaggregation_decode_extra_slots=extra, max_running_requests=requests
        )
        for memory in MEMORIES:
            fields = check("deepseek-v4-flash", serving, memory)
            assert fields is not None and fields[7] == (fields[1] + extra + 1) * 128


def test_constraint_path() -> None:
    """A cap below the profile re-derives every sub-pool through ``calculate_pool_sizes_from_max_tokens``."""
    for cap in (300, 1000, 123457, 10**6, 10**9):
        for serving in (BASE, attrs.evolve(BASE, max_running_requests=64, **EAGLE)):
            check("deepseek-v4-flash", attrs.evolve(serving, max_total_tokens=cap), 60 * GiB)
    assert check("deepseek-v4-flash", attrs.evolve(GENERIC_RATIO, max_total_tokens=123457), 60 * GiB) == (
        123392,
        256,
        123392,
        98560,
        30848,
        964,
        6160,
        32896,
    )


def test_dp_attention_and_pipeline_stages() -> None:
    dp = Serving(tp_size=8, dp_size=8, enable_dp_attention=True, page_size=256, max_running_requests=1024)
    check("deepseek-v4-pro", dp, 60 * GiB)
    for rank in range(3):
        check("deepseek-v4-pro", Serving(tp_size=8, pp_size=3, pp_rank=rank, page_size=256), 60 * GiB)
    check("deepseek-v4-flash", Serving(page_size=128), 60 * GiB)
    check("deepseek-v4-flash", Serving(page_size=512, context_length=65536), 60 * GiB)


def test_not_enough_memory() -> None:
    """Below the c128 state's fixed bytes SGLang has no full token ("Not enough memory"); kvpools refuses too."""
    for memory in (0, GiB, 20 * GiB):
        check("deepseek-v4-flash", BASE, memory)


def _oracle_error(serving: Serving) -> dict[str, Any]:
    from tests.oracle.adapter import run_oracle

    model = oracle_model(preset_config("deepseek-v4-flash"))
    out = run_oracle(dsv4_params(model, attrs.evolve(serving, accounting="sglang"), 60 * GiB))
    assert "error" in out, out.get("memory_pool_config")
    return out["error"]


def test_the_two_rejections() -> None:
    """bf16 state with online compress, and online compress with MTP without the experimental switch:
    SGLang fails at start-up; kvpools refuses in validate, before sizing, quoting SGLang."""
    bf16 = attrs.evolve(BASE, enable_online_compress=True, dsv4_compress_state_dtype="bfloat16")
    mtp = attrs.evolve(BASE, enable_online_compress=True, **EAGLE)
    for serving, kind in ((bf16, "ValueError"), (mtp, "AssertionError")):
        error = _oracle_error(serving)
        assert error["type"] == kind
        with pytest.raises(UnsupportedCombinationError) as ours:
            plan("deepseek-v4-flash", attrs.evolve(serving, accounting="sglang"), memory=60 * GiB)
        assert error["message"].split(";")[0].split(",")[0] in str(ours.value)


# ---------------------------------------------------------------------------
# hypothesis: DeepSeek-V4 configs and the serving options SGLang sizes them under
# ---------------------------------------------------------------------------


@st.composite
def dsv4_configs(draw: st.DrawFn) -> dict[str, Any]:
    n = draw(st.integers(2, 64))
    ratios = draw(
        st.one_of(
            st.lists(st.sampled_from((0, 4, 128)), min_size=n, max_size=n),
            st.just([0, 0] + [4, 128] * ((n - 2) // 2) + [4] * ((n - 2) % 2)),
            st.just([128] * n),
        )
    )
    mtp = draw(st.sampled_from((0, 1)))
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        "num_hidden_layers": n,
        "num_attention_heads": 64,
        "num_key_value_heads": 1,
        "head_dim": draw(st.sampled_from((256, 512))),
        "qk_rope_head_dim": 64,
        "index_head_dim": draw(st.sampled_from((64, 128, 256))),
        "index_n_heads": 64,
        "index_topk": 512,
        "sliding_window": draw(st.sampled_from((64, 128, 256))),
        "max_position_embeddings": draw(st.sampled_from((8192, 131072, 1048576))),
        "torch_dtype": "bfloat16",
        "num_nextn_predict_layers": mtp,
        "compress_ratios": ratios + [0] * mtp,
    }


@st.composite
def dsv4_servings(draw: st.DrawFn) -> Serving:
    tp = draw(st.sampled_from((1, 2, 4, 8)))
    dp = draw(st.sampled_from((1, tp)))
    kwargs: dict[str, Any] = {
        "tp_size": tp,
        "dp_size": dp,
        "enable_dp_attention": dp > 1,
        "page_size": draw(st.sampled_from((128, 256, 384, 512))),
        "swa_full_tokens_ratio": draw(st.sampled_from((0.8, 0.5, 0.1, 1.0))),
        "max_running_requests": draw(st.one_of(st.none(), st.integers(max(dp, 1), 5000))),
        "max_total_tokens": draw(st.one_of(st.none(), st.none(), st.integers(1, 10**7))),
        "dsv4_compress_state_dtype": draw(st.sampled_from(("float32", "bfloat16"))),
    }
    if 8192 // dp % kwargs["page_size"]:  # SGLang asserts a prefill chunk (per DP worker) is whole pages
        kwargs["chunked_prefill_size"] = kwargs["page_size"] * dp * 16
    if draw(st.booleans()):
        kwargs.update(EAGLE)
    if draw(st.booleans()):
        kwargs.update(
            enable_hisparse=True,
            disable_radix_cache=True,
            hisparse_config=f'{{"host_to_device_ratio": {draw(st.integers(1, 8))}}}',
        )
    if draw(st.integers(0, 3)) == 0:
        kwargs.update(disaggregation_mode="decode", disaggregation_decode_extra_slots=draw(st.integers(0, 256)))
    if kwargs["dsv4_compress_state_dtype"] == "float32" and draw(st.integers(0, 3)) == 0:
        kwargs["enable_online_compress"] = True
        if "speculative_algorithm" in kwargs:
            kwargs["enable_online_c128_mtp"] = True
    return Serving(**kwargs)


@CHECKS
@given(config=dsv4_configs(), serving=dsv4_servings(), memory=st.integers(GiB, 200 * GiB))
def test_generated_against_the_oracle(
    tmp_path_factory: Any, config: dict[str, Any], serving: Serving, memory: int
) -> None:
    path = write_config(tmp_path_factory.mktemp("dsv4"), config)
    compare_dsv4(path, oracle_model(config), serving, memory)
