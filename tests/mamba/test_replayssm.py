"""ReplaySSM (issue 33): ``--enable-linear-replayssm-spec`` and ``--enable-linear-replayssm`` on linear-attention
hybrids, against SGLang 0.5.23's ``_handle_max_mamba_cache`` (the oracle runs ref-000 L2440-2608) and the ring
shapes of ``MambaPool.__init__`` (``mem_cache/memory_pool.py``) / ``replayssm_ring_bytes_per_req``
(``configs/mamba_utils.py``), hand-computed.

Before this, kvpools had no ReplaySSM options at all.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from kvpools_core import Serving, build, plan
from kvpools_core.errors import KvpoolsError
from tests.oracle.locate import require_oracle

from .support import GiB, oracle_model, parse, preset_config, sglang_hybrid

QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"
KIMI = "kimi-linear-48b-a3b-instruct-nvfp4"
MTP = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_draft_tokens": 4,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_draft_num_layers": 1,
    "max_running_requests": 64,
}

# Qwen3-Next-80B at TP 1: HV = 32 value heads, H_k = 16 key heads, V = K = 128, 36 GDN layers, bf16 activations.
GDN_SPEC_RING_PER_LAYER_L16 = (
    32 * 16 * 128 * 2  # d
    + 16 * 16 * 128 * 2  # normalized k
    + 32 * 16 * 4  # scalar gate, fp32
    + 32 * 16 * 128 * 2  # d low part
    + 16 * 16 * 128 * 2  # k low part
)


def test_gdn_spec_ring_hand_computed_and_no_intermediate_ssm() -> None:
    """Qwen3-Next, EAGLE top-1, 64 requests: the ring is 395,264 B per layer x 36 per request row; the speculative
    state keeps only the conv windows (D x 8,192 x 3 x 2 B x 36); SGLang charges the ring as a fixed
    ``ring x (64 + 1)`` and reserves no intermediate state, so K rises."""
    base = plan(QWEN3_NEXT, Serving(accounting="sglang", **MTP), memory="60GiB")
    replay = plan(QWEN3_NEXT, Serving(accounting="sglang", enable_linear_replayssm_spec=True, **MTP), memory="60GiB")
    ring = replay.pool("mamba_replayssm_ring")
    assert GDN_SPEC_RING_PER_LAYER_L16 == 395_264
    assert ring.bytes_per_slot == 395_264 * 36
    assert (ring.slots, ring.padding_slots) == (64, 1) and ring.sglang_charged
    spec = replay.pool("mamba_spec_state")
    assert spec.bytes_per_slot == 4 * 8192 * 3 * 2 * 36 and not spec.sglang_charged
    assert base.pool("mamba_spec_state").bytes_per_slot == 4 * 77_266_944
    assert replay.sizing.sglang_config["max_mamba_cache_size"] > base.sizing.sglang_config["max_mamba_cache_size"]


def test_decode_ring_is_per_slot_in_the_ssm_dtype_and_uncharged() -> None:
    """``--enable-linear-replayssm``: d and k in the SSM dtype (float32), the fp32 gate; K + 1 rows; SGLang's
    split is unchanged (its budget does not count the ring)."""
    base = plan(QWEN3_NEXT, Serving(accounting="sglang"), memory="60GiB")
    ring_plan = plan(QWEN3_NEXT, Serving(accounting="sglang", enable_linear_replayssm=True), memory="60GiB")
    ring = ring_plan.pool("mamba_replayssm_ring")
    per_layer = 32 * 16 * 128 * 4 + 16 * 16 * 128 * 4 + 32 * 16 * 4
    assert ring.bytes_per_slot == per_layer * 36 and not ring.sglang_charged
    assert ring.slots == ring_plan.sizing.state_slots
    assert ring_plan.max_total_num_tokens == base.max_total_num_tokens
    half = plan(
        QWEN3_NEXT,
        Serving(accounting="sglang", enable_linear_replayssm=True, linear_replayssm_cache_len=8),
        memory="60GiB",
    )
    assert half.pool("mamba_replayssm_ring").bytes_per_slot * 2 == ring.bytes_per_slot


def test_the_ring_has_no_host_copy() -> None:
    """SGLang's ``MambaPoolHost`` mirrors conv, temporal and the side states only: no ReplaySSM ring on the host."""
    result = plan(
        QWEN3_NEXT,
        Serving(accounting="sglang", enable_linear_replayssm=True, enable_hierarchical_cache=True),
        memory="20GiB",
        host_memory="256GiB",
    )
    assert result.host is not None
    assert {pool.name for pool in result.host.pools} == {"kv", "mamba_state"}


def test_spec_flag_resolves_the_ssm_dtype_to_float32() -> None:
    """SGLang sets ``--mamba-ssm-dtype float32`` when the spec flag is on and it is unset (attention_hook.py),
    over the config's ``mamba_ssm_dtype``; an explicit value wins."""
    config = preset_config(QWEN3_NEXT) | {"mamba_ssm_dtype": "bfloat16"}
    model = parse(config, "bf16-ssm")
    bf16 = plan(model, Serving(accounting="sglang"), memory="60GiB")
    forced = plan(
        model, Serving(accounting="sglang", enable_linear_replayssm_spec=True, max_running_requests=64), memory="60GiB"
    )
    kept = plan(
        model,
        Serving(
            accounting="sglang", enable_linear_replayssm_spec=True, mamba_ssm_dtype="bfloat16", max_running_requests=64
        ),
        memory="60GiB",
    )
    ssm = 32 * 128 * 128
    assert forced.cell.bytes_per_state_slot - bf16.cell.bytes_per_state_slot == ssm * 2 * 36
    assert kept.cell.bytes_per_state_slot == bf16.cell.bytes_per_state_slot


def test_spec_flag_is_inert_on_a_mamba2_hybrid() -> None:
    """``_build_hybrid_req_pool`` passes the flag only for GDN / KDA: Nemotron-H plans as without (its SSM dtype
    is float32 either way)."""
    options = {**MTP}
    a = plan("nemotron-h-56b-base-8k", Serving(accounting="sglang", **options), memory="60GiB")
    b = plan(
        "nemotron-h-56b-base-8k",
        Serving(accounting="sglang", enable_linear_replayssm_spec=True, **options),
        memory="60GiB",
    )
    assert {p.name: p.bytes for p in a.pools} == {p.name: p.bytes for p in b.pools}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"enable_linear_replayssm": True, "enable_linear_replayssm_spec": True}, "mutually exclusive"),
        ({"enable_linear_replayssm": True, "enable_mamba_extra_buffer": True}, "no_buffer mamba strategy"),
        ({"enable_linear_replayssm": True, "disaggregation_mode": "decode"}, "not supported under PD"),
        ({"enable_linear_replayssm_spec": True, **MTP, "speculative_eagle_topk": 4}, "linear draft chain"),
        ({"enable_linear_replayssm_spec": True, **MTP, "disaggregation_mode": "prefill"}, "PD prefill server"),
        ({"enable_linear_replayssm_spec": True}, "max.running.requests"),
        (
            {"enable_linear_replayssm_spec": True, **MTP, "speculative_algorithm": "DFLASH"},
            "with DSPARK/DFLASH requires a KDA model",
        ),
    ],
)
def test_sglang_refusals(options: dict[str, Any], match: str) -> None:
    with pytest.raises(KvpoolsError, match=match):
        plan(QWEN3_NEXT, Serving(**options), memory="60GiB")


def test_decode_ring_on_mamba2_is_refused_by_name() -> None:
    with pytest.raises(KvpoolsError, match=r"kvpools does not model (--)?enable.linear.replayssm on"):
        plan("nemotron-h-56b-base-8k", Serving(enable_linear_replayssm=True), memory="60GiB")


def test_kda_ring_rules() -> None:
    """KDA: the spec ring is per state slot, its length a power of two and at least twice the draft tokens
    (``MambaPool.__init__`` raises otherwise)."""
    for length, match in ((12, "power of two"), (4, "early-flush margin")):
        with pytest.raises(KvpoolsError, match=match):
            plan(
                KIMI,
                Serving(enable_linear_replayssm_spec=True, linear_replayssm_cache_len=length, **MTP),
                memory="60GiB",
            )
    result = plan(KIMI, Serving(accounting="sglang", enable_linear_replayssm_spec=True, **MTP), memory="60GiB")
    ring = result.pool("mamba_replayssm_ring")
    # Kimi-Linear-48B: 32 heads of 128, 20 KDA layers; rawv + rawk + beta + vector g + d + k at L = 16
    per_layer = 32 * 16 * 128 * 2 * 4 + 32 * 16 * 4 + 32 * 16 * 128 * 4
    assert ring.bytes_per_slot == per_layer * 20 and ring.slots == result.sizing.state_slots and ring.sglang_charged


@pytest.mark.parametrize("accounting", ["exact", "sglang"])
def test_builds_on_meta_with_the_planned_bytes(accounting: str) -> None:
    for preset, options in (
        (QWEN3_NEXT, {"enable_linear_replayssm_spec": True, **MTP}),
        (QWEN3_NEXT, {"enable_linear_replayssm_spec": True, "tp_size": 2, **MTP, "disaggregation_mode": "decode"}),
        (QWEN3_NEXT, {"enable_linear_replayssm": True, "tp_size": 4}),
        (KIMI, {"enable_linear_replayssm_spec": True, **MTP}),
        (KIMI, {"enable_linear_replayssm": True}),
    ):
        result = plan(preset, Serving(accounting=accounting, **options), memory="80GiB")
        pools = build(result, "meta")
        assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}, (preset, options)
        assert "mamba_replayssm_ring" in pools.allocated_by_pool()
        if accounting == "exact":
            assert result.planned_bytes <= 80 * GiB


# -- differential: SGLang's _handle_max_mamba_cache through the oracle --------------------------------------------


def _ring_per_record(config: dict[str, Any], serving: Serving) -> int:
    """``replayssm_ring_bytes_per_req(1)`` over every GDN or KDA layer, read from the config independently of
    kvpools (``configs/mamba_utils.py``; bf16 activations)."""
    hybrid = sglang_hybrid(config, serving)
    tp = serving.attn_tp_size
    if "linear_attn_config" in config:  # KDA: rawv, rawk, beta, the per-K gate, d, k
        heads, dim = config["linear_attn_config"]["num_heads"], config["linear_attn_config"]["head_dim"]
        hv, h_k = heads // tp, math.ceil(heads / tp)
        kda = hv * dim * 2 + h_k * dim * 2 + hv * 4 + hv * dim * 4 + hv * dim * 2 + h_k * dim * 2
        return kda * len(hybrid.mamba_layer_ids)
    hv, v, k = config["linear_num_value_heads"] // tp, config["linear_value_head_dim"], config["linear_key_head_dim"]
    h_k = math.ceil(config["linear_num_key_heads"] / tp)
    per_layer = 2 * (hv * v * 2 + h_k * k * 2) + hv * 4  # d, k and their low parts (bf16), the fp32 gate
    return per_layer * len(hybrid.mamba_layer_ids)


@pytest.mark.oracle
@pytest.mark.parametrize(
    "options",
    [
        {},
        {"tp_size": 2},
        {"mamba_full_memory_ratio": 3.0},
        {"max_mamba_cache_size": 300},
        {"disable_radix_cache": True},
        {"linear_replayssm_cache_len": 64},
        {"disaggregation_mode": "decode"},
    ],
)
@pytest.mark.parametrize("preset", [QWEN3_NEXT, KIMI])
def test_spec_ring_split_matches_sglang(preset: str, options: dict[str, Any]) -> None:
    """Tokens, requests and K with the spec ring (GDN: fixed scratch; KDA: per slot), against SGLang's own
    ``_handle_max_mamba_cache``."""
    require_oracle()
    from tests.oracle.adapter import oracle_params, run_oracle

    config = preset_config(preset)
    serving = Serving(accounting="sglang", enable_linear_replayssm_spec=True, **{**MTP, **options})
    params = oracle_params(oracle_model(config, serving), serving, memory=60 * GiB)
    params["server_args"].update(
        enable_linear_replayssm_spec=True, linear_replayssm_cache_len=serving.linear_replayssm_cache_len
    )
    params["model"]["mamba"]["replayssm_ring_bytes_per_record"] = _ring_per_record(config, serving)
    out = run_oracle(params)
    assert not out.get("error"), out.get("error")
    got = plan(preset, serving, memory=60 * GiB)
    ours = (got.max_total_num_tokens, got.max_running_requests, got.sizing.sglang_config["max_mamba_cache_size"])
    config_out = out["memory_pool_config"]
    theirs = (
        config_out["max_total_num_tokens"],
        config_out["max_running_requests"],
        out["mamba"]["max_mamba_cache_size"],
    )
    assert ours == theirs, options


def test_unified_memory_plans_replayssm_without_a_ring_and_refuses_ple() -> None:
    """Under unified memory SGLang 0.5.23 builds no ReplaySSM ring (``init_unified_mamba_pools`` takes no ReplaySSM
    argument): the plan has none; Qwen4-Exp's PLE state is refused with SGLang's reason
    (``UnifiedHybridReqToTokenPool._init_mamba_pool``).  Against SGLang's code: ``tests/unified/test_page_major.py``."""
    unified = plan(
        "qwen3-next-80b-a3b-thinking",
        Serving(enable_unified_memory=True, enable_linear_replayssm=True, max_running_requests=32, tp_size=4),
        memory="60GiB",
    )
    assert "mamba_replayssm_ring" not in {pool.name for pool in unified.pools} and unified.problems() == []
    with pytest.raises(KvpoolsError, match="Qwen4-Exp PLE side states are not supported with --enable-unified-memory"):
        plan("qwen4-exp-defaults", Serving(enable_unified_memory=True), memory="60GiB")
