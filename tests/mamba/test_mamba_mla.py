"""MLA-based linear hybrids (Kimi-Linear: KDA layers + MLA full-attention layers) in the ``mamba`` plugin.

Where the field names come from:

* ``linear_attn_config`` (``kda_layers`` / ``full_attn_layers``, 1-based;
  ``num_heads``, ``head_dim``, ``short_conv_kernel_size``), ``kv_lora_rank``,
  ``qk_rope_head_dim``: SGLang's ``python/sglang/srt/configs/kimi_linear.py``
  (``KimiLinearConfig``: ``is_kda_layer(i)`` is ``(i + 1) in kda_layers``;
  ``mamba2_cache_params`` passes ``num_heads``, ``head_dim``,
  ``short_conv_kernel_size`` to ``KimiLinearStateShape.create``), sgl-project/sglang
  at 008b79d2358b08adf9b6c879625030f890c8c4e2, and the real config.json of
  Kimi-Linear-48B-A3B-Instruct (the preset ``kimi-linear-48b-a3b-instruct-nvfp4``, ``_source`` there).
* The state shapes: ``python/sglang/srt/configs/mamba_utils.py``
  (``KimiLinearStateShape.create``: conv ``(K - 1, q + k + v channels / tp)``,
  temporal ``(heads / tp, head_dim, head_dim)``; ``mamba2_state_dtype(None)``:
  conv bf16, SSM fp32), sgl-project/sglang at 02e208ded6769bd3332cbdc6cf0da939f541514f.
* MLA for ``KimiLinearForCausalLM``: SGLang's ``ModelConfig`` (``attention_arch = MLA``),
  so ``DefaultPoolConfigurator._compute_cell_size`` takes its ``use_mla_backend`` branch
  over the rank's ``full_attention_layer_ids`` (``../shared/reference/002_*``), and
  ``_build_hybrid_linear_kv_pool`` passes ``kv_lora_rank`` / ``qk_rope_head_dim`` with
  ``use_mla`` (``../shared/reference/000_*``).
"""

from __future__ import annotations

import copy
from typing import Any

import attrs
import pytest
import torch
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from kvpools_plugins import dsa, mamba, mla
from kvpools_plugins.mamba import hybrid_problems
from kvpools_plugins.mamba.pool import HybridLinearKVPool, HybridReqToTokenPool

from kvpools_core import Serving, build, plan
from kvpools_core.errors import ConfigError, InsufficientMemoryError
from kvpools_core.models import parse_config
from kvpools_core.pipeline import resolve_platform_traits
from kvpools_core.pools.mla import MLATokenToKVPool
from kvpools_core.registry import Registry, get_registry
from tests.oracle.locate import require_oracle

from .support import CHECKS, GiB, compare_hybrid, hybrid_budgets, hybrid_serving, parse, preset_config

KIMI = "kimi-linear-48b-a3b-instruct-nvfp4"
FULL_LAYERS = (3, 7, 11, 15, 19, 23, 26)  # full_attn_layers [4, 8, ..., 24, 27], 0-based
EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_draft_tokens": 4,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_draft_num_layers": 1,
    "max_running_requests": 128,
}


def kimi_config() -> dict[str, Any]:
    return copy.deepcopy(preset_config(KIMI))


# ---------------------------------------------------------------------------
# reading the config
# ---------------------------------------------------------------------------


def test_kimi_linear_layers_are_read_one_based() -> None:
    model = parse(kimi_config(), KIMI)
    assert model.architecture == "mamba"
    assert model.params["mixer"] == "kda"
    assert model.params["state"] == {"num_heads": 32, "head_dim": 128, "conv_kernel": 4}
    assert tuple(layer.index for layer in model.layers if layer.kind == "mla_attention") == FULL_LAYERS
    assert sum(layer.kind == "linear_attention" for layer in model.layers) == 20
    mla_layer = model.layers[3]
    assert (mla_layer.num_kv_heads, mla_layer.head_dim, mla_layer.v_head_dim) == (1, 512 + 64, 512)
    assert model.context_len == 1_048_576  # model_max_length, read before max_position_embeddings
    assert model.dtype == "bfloat16"


def test_one_plugin_claims_kimi_linear() -> None:
    """``mla`` and ``dsa`` decline it (``linear_attn_config`` / ``kimi_linear`` mark a hybrid); ``mamba`` claims it."""
    config = kimi_config()
    assert mla.parse_model_config(config, KIMI) is None
    assert dsa.parse_model_config(config, KIMI) is None
    assert mamba.parse_model_config(config, KIMI) is not None
    assert parse_config(config, KIMI, get_registry())[1] == "mamba"
    # Kimi-Linear's field without the layout still is not plain MLA: mamba claims it and names the missing field.
    broken = {k: v for k, v in config.items() if k != "linear_attn_config"}
    assert mla.parse_model_config(broken, KIMI) is None
    with pytest.raises(ConfigError, match="'linear_attn_config' is missing"):
        parse_config(broken, KIMI, get_registry())
    # A plain MLA model is still the mla plugin's.
    assert parse_config(preset_config("kimi-k2-instruct"), "kimi-k2", get_registry())[1] == "mla"


@pytest.mark.parametrize(
    ("path", "match"),
    [
        (("linear_attn_config", "num_heads"), r"'linear_attn_config\.num_heads' is missing"),
        (("linear_attn_config", "head_dim"), r"'linear_attn_config\.head_dim' is missing"),
        (("linear_attn_config", "short_conv_kernel_size"), r"\.short_conv_kernel_size' is missing"),
        (("linear_attn_config", "kda_layers"), r"'linear_attn_config\.kda_layers' is missing"),
        (("kv_lora_rank",), r"'kv_lora_rank' is missing"),
        (("qk_rope_head_dim",), r"'qk_rope_head_dim' is missing"),
    ],
)
def test_a_state_or_row_that_cannot_be_derived_is_rejected_naming_the_field(path: tuple[str, ...], match: str) -> None:
    config = kimi_config()
    target = config
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    with pytest.raises(ConfigError, match=match):
        parse(config, KIMI)


def test_bad_layer_lists_are_rejected() -> None:
    config = kimi_config()
    config["linear_attn_config"]["kda_layers"] = [0, 1, 2]  # 0-based by mistake
    with pytest.raises(ConfigError, match=r"outside 1\.\.27"):
        parse(config, KIMI)
    config = kimi_config()
    config["linear_attn_config"]["kda_layers"] = [1, 2, 4]
    with pytest.raises(ConfigError, match=r"both list layer\(s\) \[4\]"):
        parse(config, KIMI)
    config = kimi_config()
    config["linear_attn_config"]["kda_layers"] = []
    config["linear_attn_config"]["full_attn_layers"] = list(range(1, 28))
    with pytest.raises(ConfigError, match="names no linear-attention or mamba layer"):
        parse(config, KIMI)


# ---------------------------------------------------------------------------
# bytes, by hand
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tp", "state_per_slot"),
    [
        # conv (4 - 1) x 3 x 32 x 128 bf16 = 73,728; SSM 32 x 128 x 128 fp32 = 2,097,152;
        # (73,728 + 2,097,152) x 20 KDA layers = 43,417,600 B per slot.
        (1, 43_417_600),
        # TP 4: conv 3 x 3 x 1024 x 2 = 18,432; SSM 8 x 128 x 128 x 4 = 524,288; x 20 = 10,854,400.
        (4, 10_854_400),
    ],
)
@pytest.mark.parametrize(
    ("kv", "cell"),
    [
        ("auto", 8064),  # (512 + 64) x 2 B x 7 MLA layers, whatever the TP
        ("fp8_e4m3", 4032),  # 576 x 1 B x 7
        ("fp4_e2m1", 2268),  # SGLang: 4032 // 2 + 576 // 16 x 7 x 1 = 2016 + 252; stored: 288 + 36 B per layer
    ],
)
def test_cell_and_state_bytes_by_hand(tp: int, state_per_slot: int, kv: str, cell: int) -> None:
    result = plan(KIMI, Serving(accounting="sglang", tp_size=tp, kv_cache_dtype=kv), memory="60GiB")
    assert result.cell.sglang_bytes_per_token == cell
    assert result.cell.bytes_per_token == cell
    assert result.cell.num_layers == 7
    assert result.cell.bytes_per_state_slot == state_per_slot
    state = result.pool("mamba_state")
    assert state.bytes_per_slot == state_per_slot
    assert state.bytes == (result.sizing.sglang_config["max_mamba_cache_size"] + 1) * state_per_slot


def test_ssm_dtype_flag_halves_the_ssm_state_and_the_config_field_does_not_count() -> None:
    # --mamba-ssm-dtype bfloat16: SSM 32 x 128 x 128 x 2 = 1,048,576; (73,728 + 1,048,576) x 20 = 22,446,080.
    serving = Serving(mamba_ssm_dtype="bfloat16")
    assert plan(KIMI, serving, memory="60GiB").cell.bytes_per_state_slot == 22_446_080
    config = kimi_config()
    config["mamba_ssm_dtype"] = "bfloat16"  # KimiLinearCacheParams never passes the config to mamba2_state_dtype
    model = parse(config, KIMI)
    assert plan(model, Serving(), memory="60GiB").cell.bytes_per_state_slot == 43_417_600


def test_unsupported_combinations_are_rejected_before_sizing() -> None:
    model = parse(kimi_config(), KIMI)
    assert any("TP 3" in p for p in hybrid_problems(model, Serving(tp_size=3)))  # 32 KDA heads over TP 3
    assert any("mxfp8" in p for p in hybrid_problems(model, Serving(kv_cache_dtype="mxfp8")))
    on_cpu = resolve_platform_traits(Serving(kv_cache_dtype="fp8_e4m3", platform="cpu"), Registry())
    cpu_fp8 = hybrid_problems(model, on_cpu)  # the cpu plugin's traits refuse fp8 MLA latent rows
    assert any("CPU FP8 KV cache is only supported for MHA." in p for p in cpu_fp8)
    assert hybrid_problems(model, Serving(tp_size=8, kv_cache_dtype="fp8_e4m3")) == []


# ---------------------------------------------------------------------------
# SGLang's numbers (the oracle)
# ---------------------------------------------------------------------------

BUDGETS = (3 * GiB + 12345, 60 * GiB, 140 * GiB + 1)


@pytest.mark.oracle
@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3", "fp4_e2m1"])
def test_kimi_linear_against_sglang(kv: str) -> None:
    """Tokens, requests, the MLA cell and K agree with SGLang's sizing code, token- and slot-exact."""
    require_oracle()
    config = kimi_config()
    servings = [
        Serving(kv_cache_dtype=kv, tp_size=tp, page_size=page, mamba_full_memory_ratio=ratio)
        for tp, page in ((1, 1), (2, 64), (4, 16), (8, 1))
        for ratio in (0.5, 0.9, 3.0)
    ]
    servings += [
        Serving(kv_cache_dtype=kv, tp_size=4, **EAGLE),
        Serving(kv_cache_dtype=kv, tp_size=2, max_total_tokens=100_000),
        Serving(kv_cache_dtype=kv, max_mamba_cache_size=100),
        Serving(kv_cache_dtype=kv, disable_radix_cache=True, max_running_requests=64),
        Serving(kv_cache_dtype=kv, enable_mamba_extra_buffer=True, mamba_ssm_dtype="bfloat16"),
        Serving(kv_cache_dtype=kv, tp_size=4, dp_size=2, enable_dp_attention=True),
        Serving(kv_cache_dtype=kv, pp_size=2, pp_rank=1),
    ]
    for serving in servings:
        for memory in BUDGETS:
            compare_hybrid(KIMI, config, serving, memory=memory)


@st.composite
def kimi_linear_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A Kimi-Linear ``config.json``: any KDA / MLA layout, KDA and latent geometry."""
    n = draw(st.integers(2, 48))
    kda = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    kda[0], kda[-1] = True, False  # at least one of each
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "num_hidden_layers": n,
        "num_attention_heads": draw(st.sampled_from((8, 16, 32, 64))),
        "hidden_size": 2304,
        "head_dim": 72,  # unused by the MLA row (SGLang's ModelConfig sets 72 for Kimi-Linear)
        "kv_lora_rank": draw(st.sampled_from((128, 256, 512))),
        "qk_rope_head_dim": draw(st.sampled_from((32, 64))),
        "model_max_length": draw(st.sampled_from((4096, 131072, 1048576))),
        "torch_dtype": draw(st.sampled_from(("bfloat16", "float16"))),
        "linear_attn_config": {
            "kda_layers": [i + 1 for i in range(n) if kda[i]],
            "full_attn_layers": [i + 1 for i in range(n) if not kda[i]],
            "num_heads": draw(st.sampled_from((8, 16, 32, 64))),
            "head_dim": draw(st.sampled_from((64, 128))),
            "short_conv_kernel_size": draw(st.sampled_from((2, 4))),
        },
    }


@pytest.mark.oracle
@settings(CHECKS, max_examples=500)
@given(data=st.data())
def test_generated_kimi_linear_configs_against_sglang(data: st.DataObject) -> None:
    require_oracle()
    config = data.draw(kimi_linear_configs())
    spec = parse(config)
    serving = data.draw(hybrid_serving(spec, pp=True))
    assume(serving.kv_cache_dtype != "fp32" and not hybrid_problems(spec, serving))
    memory = data.draw(hybrid_budgets(spec))
    want, _got = compare_hybrid(spec, config, serving, memory=memory)
    event("SGLang fails" if want.error else "planned")


# ---------------------------------------------------------------------------
# building: the plan, per pool
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("accounting", ["exact", "sglang"])
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"tp_size": 4, **EAGLE},
        {"kv_cache_dtype": "fp8_e4m3", "enable_mamba_extra_buffer": True, "page_size": 64},
        {"kv_cache_dtype": "fp4_e2m1", "pp_size": 2, "pp_rank": 1},
    ],
)
def test_build_on_meta_equals_the_plan_per_pool(accounting: str, options: dict[str, Any]) -> None:
    result = plan(KIMI, Serving(accounting=accounting, **options), memory="80GiB")
    pools = build(result, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    assert pools.allocated_bytes == result.planned_bytes
    if accounting == "exact":
        assert result.planned_bytes <= 80 * GiB
    kv = pools.kv_pool
    assert isinstance(kv, HybridLinearKVPool) and kv.use_mla
    assert isinstance(kv.full, MLATokenToKVPool)
    assert isinstance(pools.req_to_token_pool, HybridReqToTokenPool)
    state = pools.req_to_token_pool.mamba_pool
    tp, stage = result.serving.attn_tp_size, result.serving.pp_size
    assert tuple(state.conv[0].shape[2:]) == (3, 3 * 32 * 128 // tp)
    assert tuple(state.ssm.shape[2:]) == (32 // tp, 128, 128)
    assert state.ssm.dtype == torch.float32 and state.conv[0].dtype == torch.bfloat16
    if stage == 1:
        assert kv.full_attention_layer_ids == FULL_LAYERS
        assert len(state.layer_ids) == 20


@settings(CHECKS, max_examples=100)
@given(data=st.data())
def test_generated_exact_plans_fit_and_build_on_meta(data: st.DataObject) -> None:
    """Any Kimi-Linear layout and serving: the exact plan fits its budget and builds on meta byte for byte."""
    spec = parse(data.draw(kimi_linear_configs(), label="config"))
    serving = attrs.evolve(data.draw(hybrid_serving(spec, pp=True), label="serving"), accounting="exact")
    assume(not hybrid_problems(spec, serving))
    memory = data.draw(hybrid_budgets(spec), label="memory")
    try:
        result = plan(spec, serving, memory=memory)
    except InsufficientMemoryError:
        event("refused")
        return
    assert result.planned_bytes <= memory
    pools = build(result, "meta")
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}
    event("planned")


def test_build_refuses_a_plan_whose_latent_bytes_differ() -> None:
    from kvpools_core.pools import PoolPlanMismatchError

    result = plan(KIMI, Serving(), memory="20GiB")
    kv = result.pool("kv")
    tampered = attrs.evolve(
        result,
        sizing=attrs.evolve(
            result.sizing,
            pools=[attrs.evolve(p, bytes=p.bytes - 1) if p.name == "kv" else p for p in result.sizing.pools],
        ),
    )
    assert kv.bytes != tampered.pool("kv").bytes
    with pytest.raises(PoolPlanMismatchError):
        build(tampered, "meta")


def test_latent_rows_round_trip_by_global_layer_id_on_cpu() -> None:
    config = kimi_config()
    config["linear_attn_config"]["num_heads"] = 2  # a small state for a real allocation
    config["linear_attn_config"]["head_dim"] = 16
    model = parse(config, "small-kimi")
    result = plan(model, Serving(max_total_tokens=64, max_mamba_cache_size=4), memory="1GiB")
    pools = build(result, "cpu")
    kv = pools.kv_pool
    loc = torch.tensor([1, 5])
    k_nope, k_rope = torch.randn(2, 1, 512, dtype=torch.bfloat16), torch.randn(2, 1, 64, dtype=torch.bfloat16)
    kv.set_mla_kv_buffer(26, loc, k_nope, k_rope)
    nope, rope = kv.get_mla_kv(26, loc)
    assert torch.equal(nope, k_nope) and torch.equal(rope, k_rope)
    assert torch.equal(kv.get_kv(26, loc)[0], k_nope)
    assert not kv.get_key_buffer(23)[loc].any()  # another layer's rows are untouched
    with pytest.raises(IndexError, match="keeps no KV on this rank"):
        kv.get_key_buffer(0)  # a KDA layer
    rows = pools.req_to_token_pool.alloc(1)  # K = 4 slots, 3 per request with the radix cache: one request
    assert rows is not None
    assert pools.req_to_token_pool.get_mamba_indices(torch.tensor(rows)).tolist() == [1]
