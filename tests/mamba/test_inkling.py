"""Inkling-class models (issue 33): full KV + sliding-window KV + a short-conv state on every layer.

The ``inkling-defaults`` preset has no public source: no Inkling ``config.json`` is published.  It is SGLang
0.5.23's ``InklingModelConfig`` defaults (``configs/inkling.py``: 16 layers, hidden 1,536, 12 heads, 4 KV heads of
128, window 512, sconv kernel 4) with ``local_layer_ids`` every layer but each fourth (12 SWA, 4 full; the class
default is none, which SGLang's configurator refuses) and a 32,768-token context.

SGLang references: ``configs/inkling.py`` (the state), ``configs/model_config.py`` ``get_hybrid_layer_ids``,
``arg_groups/model_overrides/inkling.py`` (``_inkling_overrides``: both ratios 0.1, the extra-buffer strategy),
``mem_cache/kv_cache_configurator.py`` ``_handle_max_mamba_cache`` and ``model_executor/pool_configurator.py``
``HybridSWAPoolConfigurator``.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
from kvpools_plugins.mamba.inkling import kv_budget_bytes, sglang_swa_shape
from kvpools_plugins.mamba.inkling_mtp import mtp_terms

from kvpools_core import Serving, build, plan
from kvpools_core.errors import ConfigError, InsufficientMemoryError, KvpoolsError
from kvpools_core.parts.sizing import sglang_tokens
from kvpools_core.values import ModelSpec
from tests.oracle import locate

from .support import parse, preset_config

PRESET = "inkling-defaults"
GiB = 1 << 30
ON = {"enable_mamba_extra_buffer": True}  # SGLang pins the extra-buffer strategy for Inkling


def _plan(memory: str = "20GiB", **serving: Any):  # type: ignore[no-untyped-def]
    return plan(PRESET, Serving(**{"accounting": "sglang", **ON, **serving}), memory=memory)


def test_the_preset_parses_as_sglangs_config_class_reads_it() -> None:
    model = parse(preset_config(PRESET))
    assert model.architecture == "mamba" and model.params["family"] == "inkling"
    kinds = [layer.kind for layer in model.layers]
    # get_hybrid_layer_ids: layers in local_layer_ids slide, the others are full
    assert [i for i, k in enumerate(kinds) if k == "attention"] == [3, 7, 11, 15]
    assert kinds.count("sliding_attention") == 12
    assert model.params["sliding_window"] == 512 and model.context_len == 32_768


def test_static_three_pool_stack_by_hand() -> None:
    """20 GiB, TP 1, bf16, page 1, SGLang's Inkling defaults (both ratios 0.1, extra buffer with overlap).

    * state per slot (InklingConvCacheParams.mamba_cache_per_req): 16 layers x 3 rows x (512 + 512 + 512 + 512 +
      1,536 + 1,536) x 2 B = 491,520 B;
    * _handle_max_mamba_cache: mamba budget = 20 GiB x 0.1 / 1.1; K = (budget - 491,520) // 491,520 = 3,970;
      the KV budget = 20 GiB - 3,971 x 491,520 = 19,523,010,560 B;
    * HybridSWAPoolConfigurator: cell = 2,048 x 4 full layers + 0.1 x 2,048 x 12 SWA layers = 10,649.6 B
      (4 KV heads x (128 + 128) x 2 B per layer); full = int(19,523,010,560 // 10,649.6) = 1,833,215,
      SWA = int(1,833,215 x 0.1) = 183,321;
    * requests: K // (3 + 2 extra-buffer slots) = 794 (below resolve_max_num_reqs' 2,048).
    """
    p = _plan()
    assert kv_budget_bytes(p.model, p.serving, p.budget) == 19_523_010_560
    assert p.sizing.sglang_config == {
        "max_total_num_tokens": 1_833_215,
        "max_running_requests": 794,
        "full_max_total_num_tokens": 1_833_215,
        "swa_max_total_num_tokens": 183_321,
        "max_mamba_cache_size": 3_970,
    }
    assert p.pool("mamba_state").bytes_per_slot == 16 * 3 * (4 * 512 + 2 * 1_536) * 2 == 491_520
    assert p.pool("mamba_state").bytes == 3_971 * 491_520
    assert p.pool("kv_full").bytes == (1_833_215 + 1) * 4 * 2_048
    assert p.pool("kv_swa").bytes == (183_321 + 1) * 12 * 2_048
    assert p.sizing.state_slots_per_request == 5
    notes = " ".join(p.sizing.notes)
    assert "swa_full_tokens_ratio 0.1: SGLang 0.5.23's default for Inkling" in notes
    assert "mamba_full_memory_ratio 0.1: SGLang 0.5.23's default for Inkling" in notes


def test_the_extra_buffer_is_planned_as_sglang_pins_it() -> None:
    """``_inkling_overrides`` pins the extra-buffer strategy while the radix cache is on: without
    ``--enable-mamba-extra-buffer`` the plan is the same (5 state slots per request, the ping-pong columns), and
    says why; with the radix cache off there is no extra buffer (1 slot per request)."""
    pinned = _plan()
    default = plan(PRESET, Serving(accounting="sglang"), memory="20GiB")
    assert default.sizing.sglang_config == pinned.sizing.sglang_config
    assert [(q.name, q.bytes) for q in default.pools] == [(q.name, q.bytes) for q in pinned.pools]
    assert any("planned with it" in n for n in default.sizing.notes)
    assert build(default, "meta").allocated_bytes == default.planned_bytes
    off = plan(PRESET, Serving(accounting="sglang", disable_radix_cache=True), memory="20GiB")
    assert off.sizing.state_slots_per_request == 1
    assert off.pool("mamba_req_mapping").bytes_per_slot == 4  # int32 state slot, no ping-pong columns


def test_a_given_ratio_wins_over_inklings_default() -> None:
    p = _plan(swa_full_tokens_ratio=0.2, mamba_full_memory_ratio=0.1)
    full = p.sizing.sglang_config["full_max_total_num_tokens"]
    assert full == int(19_523_010_560 // (2_048 * 4 + 0.2 * 2_048 * 12))
    assert p.sizing.sglang_config["swa_max_total_num_tokens"] == int(full * 0.2)


@pytest.mark.parametrize(
    ("serving", "memory"),
    [({}, "20GiB"), ({"page_size": 64, "tp_size": 2}, "8GiB"), ({"accounting": "exact"}, "6GiB")],
)
def test_build_on_meta_allocates_the_plan_to_the_byte(serving: dict[str, Any], memory: str) -> None:
    p = _plan(memory, **serving)
    pools = build(p, "meta")
    assert pools.allocated_bytes == p.planned_bytes
    assert pools.allocated_by_pool() == {q.name: q.bytes for q in p.pools}
    if serving.get("accounting") == "exact":
        assert p.planned_bytes <= 6 * GiB


def test_a_cpu_build_routes_sliding_layers_through_the_mapping() -> None:
    import torch

    p = _plan("64MiB", accounting="exact")
    pools = build(p, "cpu")
    alloc = pools.allocator
    kv = pools.kv_pool
    slots = alloc.alloc(4)
    assert slots is not None
    k = torch.ones((4, 4, 128), dtype=torch.bfloat16)
    kv.set_kv_buffer(0, slots, k, k * 2)  # layer 0 slides: its rows are the mapped SWA slots
    swa = kv.full_to_swa_index_mapping[slots]
    assert bool((swa > 0).all())
    assert torch.equal(kv.swa_kv_pool.get_key_buffer(0)[swa], k)
    kv.set_kv_buffer(3, slots, k * 3, k)  # layer 3 is full: full slot ids
    assert torch.equal(kv.full_kv_pool.get_key_buffer(0)[slots], k * 3)
    # the request table holds the short-conv state: 6 conv windows per layer, no temporal state
    state = pools.req_to_token_pool.mamba_pool
    conv, _ = state.layer_cache(5)
    assert [tuple(c.shape[1:]) for c in conv] == [(3, 512)] * 4 + [(3, 1_536)] * 2


@pytest.mark.parametrize(
    ("serving", "message"),
    [
        (
            {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
                "max_running_requests": 8,
            },
            "plans Inkling's MTP heads only with enable_multi_layer_eagle",
        ),
        (  # SpeculativeAlgorithm.is_eagle is False for STANDALONE: no MultiLayerEagleWorkerV2, no Inkling MTP head
            {
                "speculative_algorithm": "STANDALONE",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
                "max_running_requests": 8,
            },
            "only on its multi-layer EAGLE path",
        ),
        ({"enable_hierarchical_cache": True}, "does not model a host tier for Inkling-class models yet"),
        ({"pp_size": 2}, "does not model pipeline parallelism for Inkling-class models yet"),
        ({"kv_cache_dtype": "fp4_e2m1"}, "for Inkling-class models yet"),
        (
            {"disable_radix_cache": True, "max_running_requests": 16, "chunked_prefill_size": 4096},
            "SWA chunk cap",
        ),
    ],
)
def test_what_is_not_modelled_is_refused(serving: dict[str, Any], message: str) -> None:
    with pytest.raises(KvpoolsError, match=message):
        _plan(**serving)


def test_vllm_accounting_is_refused() -> None:
    from kvpools_core.engines.vllm import plan_vllm

    with pytest.raises(KvpoolsError, match=r"vLLM 0\.33 has no Inkling model"):
        plan_vllm(PRESET, Serving(accounting="vllm"), memory="20GiB")


def test_an_swa_pool_below_one_window_is_refused_as_sglang_does() -> None:
    """``validate_swa_pool_size``: SWA tokens must exceed the window + a page."""
    with pytest.raises(InsufficientMemoryError, match=r"cannot hold even one request.*sliding_window_size \(512\)"):
        _plan("40MiB", page_size=64)


def test_config_errors_name_the_field() -> None:
    config = preset_config(PRESET)
    for local, problem in (([0, 0, 1], "repeats a layer id"), ([], "is empty: no layer slides")):
        bad = {**copy.deepcopy(config), "local_layer_ids": local}
        with pytest.raises(ConfigError, match=problem):
            parse(bad)


def test_a_multimodal_wrapper_takes_its_mtp_config() -> None:
    """``InklingMMConfig.__init__``: ``mtp_config`` sets the draft depth and the banded MTP heads."""
    text = {k: v for k, v in preset_config(PRESET).items() if k not in ("architectures", "torch_dtype")}
    config = {
        "architectures": ["InklingForConditionalGeneration"],
        "model_type": "inkling_mm_model",
        "torch_dtype": "bfloat16",
        "text_config": text,
        "mtp_config": {"n_layers": 4, "local_layer_ids": [1, 3], "local_extent": 256},
    }
    model = parse(config)
    assert model.num_nextn_predict_layers == 4
    assert tuple(model.params["mtp_local_layer_ids"]) == (1, 3) and model.params["mtp_local_extent"] == 256


# -- differential: SGLang's own config class and pool configurator ----------------------------------------------


def _peer(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    python, bench = locate.require_sglang_peer()
    script = Path(__file__).with_name("inkling_peer.py")
    out = subprocess.run(
        [str(python), str(script), str(bench), json.dumps(cases)], capture_output=True, text=True, check=True
    )
    return list(json.loads(out.stdout))


_VARIANTS = [
    ({}, {}, "20GiB"),
    ({}, {"tp_size": 2, "page_size": 64}, "8GiB"),
    ({"num_key_value_heads": 2}, {"tp_size": 4}, "4GiB"),  # 2 KV heads // 4: SGLang keeps one head per rank
    ({"swa_num_key_value_heads": 8, "swa_head_dim": 64, "sconv_kernel_size": 3}, {"tp_size": 2}, "12GiB"),
    ({"local_layer_ids": [0, 2, 4], "num_hidden_layers": 6}, {"swa_full_tokens_ratio": 0.5}, "3GiB"),
]


@pytest.mark.oracle
def test_state_layers_and_split_equal_sglangs() -> None:
    """The state per slot, the layer split and the full / SWA token counts are what SGLang's own
    ``InklingModelConfig`` and ``HybridSWAPoolConfigurator`` give for the same KV budget."""
    cases, plans = [], []
    for overrides, serving, memory in _VARIANTS:
        config = {**preset_config(PRESET), **overrides}
        p = plan(parse(config), Serving(**{"accounting": "sglang", **ON, **serving}), memory=memory)
        plans.append(p)
        kv_budget = kv_budget_bytes(p.model, p.serving, p.budget)  # _handle_max_mamba_cache's rest, in bytes
        text = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
        cases.append(
            {
                "config": text,
                "tp": p.serving.attn_tp_size,
                "available": kv_budget,
                "page": p.serving.page_size,
                "ratio": p.serving.swa_full_tokens_ratio,
            }
        )
    for p, theirs in zip(plans, _peer(cases), strict=True):
        assert theirs["error"] is None
        assert theirs["layers"] == list(range(p.model.num_layers))
        assert theirs["full_ids"] == [layer.index for layer in p.model.layers if layer.kind == "attention"]
        assert p.pool("mamba_state").bytes_per_slot == theirs["mamba_cache_per_req"]
        assert p.sizing.sglang_config["full_max_total_num_tokens"] == theirs["full_tokens"]
        assert p.sizing.sglang_config["swa_max_total_num_tokens"] == theirs["swa_tokens"]


# -- the MTP heads: SGLang's draft terms (refused, with these terms in the message) ---------------------------------

_EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}


def _mtp_terms(model: ModelSpec, serving: Serving):  # type: ignore[no-untyped-def]
    s = attrs.evolve(serving, **_EAGLE)
    shape = sglang_swa_shape(model, s)
    return shape, mtp_terms(model, s, full_per_token=shape.full_per_token, swa_per_token=shape.swa_per_token)


def test_mtp_draft_terms_by_hand() -> None:
    """``HybridSWAPoolConfigurator`` (pool_configurator.py, the draft block after the scale-block terms and
    ``_recompute_cell_size``): ``eagle_draft_num_layers`` = ``num_nextn_predict_layers`` = 8 draft layers; the
    banded depths (``mtp_local_layer_ids`` [1, 3]) at the SWA per-token size without the ratio, the other 6 at the
    full size.  bf16, TP 1: full = 4 KV heads x (128 + 128) x 2 B = 2,048 B; SWA = 2 x 256 x 2 = 1,024 B; extra
    = 6 x 2,048 + 2 x 1,024 = 14,336 B per full token.  ``_init_multi_layer_eagle_model_runners``: one head per
    draft step (3), ``draft_model_idx`` 0..2; head 1 is banded.  Heads' KV at 1,000 full tokens, page 1: a full
    head 1,001 rows x 2,048 = 2,050,048 B; the banded head's full-capacity SWA ring 1,001 x 1,024 = 1,025,024 B
    plus its identity mapping 1,002 x 8 = 8,016 B."""
    config = {**preset_config(PRESET), "swa_num_key_value_heads": 2, "mtp_local_layer_ids": [1, 3]}
    shape, terms = _mtp_terms(parse(config), Serving(accounting="sglang", **ON))
    assert (shape.full_per_token, shape.swa_per_token) == (2048, 1024)
    assert (terms.draft_layers, terms.budget_full_layers, terms.budget_swa_full_layers) == (8, 6, 2)
    assert terms.cell_extra == 14_336
    assert terms.heads == (0, 1, 2) and terms.banded_heads == (1,)
    assert terms.head_kv_bytes(1000, 1) == {0: 2_050_048, 1: 1_025_024 + 8_016, 2: 2_050_048}
    # clone_with_new_mamba: one layer of the state (3 rows x (2 x 512 full + 2 x 256 SWA + 2 x 1,536 hidden) x
    # 2 B = 27,648 B; the full KV width 4 x 128, the SWA width 2 x 128), K + 1 slots, and K int64 free slots
    assert terms.state_per_layer == 3 * (2 * 512 + 2 * 256 + 2 * 1536) * 2 == 27_648
    assert terms.head_state_bytes(100) == 101 * 27_648 + 100 * 8


def test_mtp_heads_are_refused_with_sglangs_terms() -> None:
    """Without ``--enable-multi-layer-eagle`` (the preset, no banded depth): 8 full draft layers x 2,048 B = 16,384 B
    per full token, and the advice to pass the flag."""
    with pytest.raises(
        KvpoolsError,
        match=r"only with enable_multi_layer_eagle.*8 full x 2,048 B \+ 0 full-capacity SWA .* = 16,384 B.*"
        r"Pass enable_multi_layer_eagle",
    ):
        _plan(max_running_requests=8, **_EAGLE)


def test_banded_mtp_heads_need_multi_layer_eagle() -> None:
    """``InklingForConditionalGenerationMTP.__init__`` (models/inkling.py) raises for banded heads without
    ``--enable-multi-layer-eagle``; the refusal says so."""
    config = {**preset_config(PRESET), "mtp_local_layer_ids": [0]}
    with pytest.raises(KvpoolsError, match=r"mtp_local_layer_ids \[0\]\) require enable_multi_layer_eagle"):
        plan(parse(config), Serving(accounting="sglang", max_running_requests=8, **ON, **_EAGLE), memory="20GiB")


_MLE = {**_EAGLE, "speculative_eagle_topk": 1, "enable_multi_layer_eagle": True}


def test_mtp_heads_planned_by_hand() -> None:
    """``--enable-multi-layer-eagle``, EAGLE, 3 steps, top-k 1, 4 draft tokens, 20 GiB, the preset (no banded depth);
    ``--max-running-requests`` unset is SGLang's 48 under speculation.

    * ``_handle_max_mamba_cache`` (kv_cache_configurator.py, the spec branch of the ratio budget): mamba budget =
      20 GiB x 0.1 / 1.1; K = int((budget - 491,520 x (1 + 4)) // (491,520 x (1 + 4 / 5))) = 2,203; the
      intermediate state of min(48, 2,203 // 5) + 1 = 49 rows x 4 draft tokens x 491,520 B = 96,337,920 B; the KV
      budget = 20 GiB - 96,337,920 - 2,204 x 491,520 = 20,295,188,480 B;
    * ``HybridSWAPoolConfigurator`` with the draft (``_recompute_cell_size``): cell = 10,649.6 + 8 x 2,048 =
      27,033.6 B; full = int(20,295,188,480 // 27,033.6) = 750,739; SWA = int(750,739 x 0.1) = 75,073;
    * the target's state pool (``MambaPool`` with ``speculative_num_draft_tokens``, memory_pool.py): the dense
      intermediate conv windows (``InklingConvStateShape.disable_conv_window_dedup``; no temporal state:
      ``temporal=(0, 0, 0)``) of 48 + 1 rows x 4 x 491,520 B;
    * 3 heads (``_init_multi_layer_eagle_model_runners``), each one full layer of 750,740 rows x 2,048 B =
      1,537,515,520 B and a ``clone_with_new_mamba`` state pool of 2,204 slots x 30,720 B (one of 16 layers) +
      2,203 int64 free slots.
    """
    p = _plan(**_MLE)
    assert p.serving.speculative_draft_num_layers == 8  # the MTP config's num_nextn_predict_layers
    assert kv_budget_bytes(p.model, p.serving, p.budget) == 20_295_188_480
    assert p.sizing.sglang_config == {
        "max_total_num_tokens": 750_739,
        "max_running_requests": 48,
        "full_max_total_num_tokens": 750_739,
        "swa_max_total_num_tokens": 75_073,
        "max_mamba_cache_size": 2_203,
    }
    assert int(20_295_188_480 // (2_048 * 4 + 0.1 * 2_048 * 12 + 8 * 2_048)) == 750_739
    assert p.pool("mamba_spec_state").bytes == 49 * 4 * 491_520 == 96_337_920
    for head in range(3):
        assert p.pool(f"mtp{head}_kv").bytes == 750_740 * 2_048 == 1_537_515_520
        assert p.pool(f"mtp{head}_state").bytes == 2_204 * 30_720
        assert p.pool(f"mtp{head}_state_allocator").bytes == 2_203 * 8
    assert not any(q.name.startswith("mtp3") or q.name.startswith("draft_") for q in p.pools)  # no second draft
    pools = build(p, "meta")
    assert pools.allocated_by_pool() == {q.name: q.bytes for q in p.pools}


def test_banded_mtp_heads_planned_and_built() -> None:
    """A banded depth (``mtp_local_layer_ids`` [1, 3], SWA 2 KV heads): head 1 is an SWA ring of full capacity (one
    SWA layer of ``full + page`` rows x 1,024 B) with an identity mapping of ``full + page + 1`` int64; the budget
    charges 6 full x 2,048 + 2 x 1,024 = 14,336 B per full token for the draft."""
    config = {**preset_config(PRESET), "swa_num_key_value_heads": 2, "mtp_local_layer_ids": [1, 3]}
    p = plan(parse(config), Serving(accounting="sglang", **ON, **_MLE), memory="20GiB")
    full = p.sizing.sglang_config["full_max_total_num_tokens"]
    kv_budget = kv_budget_bytes(p.model, p.serving, p.budget)
    assert full == int(kv_budget // (2_048 * 4 + 0.1 * 1_024 * 12 + 14_336))
    assert p.pool("mtp1_kv").bytes == (full + 1) * 1_024
    assert p.pool("mtp1_kv_mapping").bytes == (full + 2) * 8
    assert p.pool("mtp0_kv").bytes == p.pool("mtp2_kv").bytes == (full + 1) * 2_048
    assert build(p, "meta").allocated_by_pool() == {q.name: q.bytes for q in p.pools}


@pytest.mark.parametrize(("serving", "memory"), [({}, "6GiB"), ({"page_size": 64, "tp_size": 2}, "4GiB")])
def test_mtp_heads_under_exact_accounting_fit_the_budget(serving: dict[str, Any], memory: str) -> None:
    """``--accounting exact``: every pool, the heads' included, within the budget, and built to the byte."""
    p = _plan(memory, accounting="exact", **_MLE, **serving)
    assert p.planned_bytes <= p.budget.budget_bytes
    assert build(p, "meta").allocated_by_pool() == {q.name: q.bytes for q in p.pools}
    heads = sum(q.bytes for q in p.pools if q.name.startswith("mtp"))
    assert heads > 3 * p.sizing.sglang_config["full_max_total_num_tokens"] * 1_024


@pytest.mark.parametrize(
    ("serving", "message"),
    [
        ({"speculative_num_steps": 9, "speculative_num_draft_tokens": 10}, r"speculative_num_steps 9 .* has 8"),
        ({"speculative_draft_num_layers": 2}, r"speculative_draft_num_layers 2 .* Drop speculative_draft_num_layers"),
        ({"enable_unified_memory": True}, r"MTP heads under enable_unified_memory yet"),
    ],
)
def test_what_the_planned_mtp_heads_refuse(serving: dict[str, Any], message: str) -> None:
    with pytest.raises(KvpoolsError, match=message):
        _plan(**{**_MLE, **serving})


_MTP_VARIANTS = [
    ({}, {}, "20GiB"),
    ({"mtp_local_layer_ids": [1, 3], "swa_num_key_value_heads": 2}, {"tp_size": 2}, "8GiB"),
    ({"mtp_local_layer_ids": [0, 1, 2, 3, 4, 5, 6, 7], "swa_head_dim": 64}, {"page_size": 64}, "12GiB"),
    ({"mtp_local_layer_ids": [1], "num_nextn_predict_layers": 2}, {}, "4GiB"),
]


@pytest.mark.oracle
def test_mtp_draft_terms_equal_sglangs_configurator() -> None:
    """SGLang's own ``HybridSWAPoolConfigurator`` on an EAGLE target (``eagle_draft_num_layers`` = the config's
    ``num_nextn_predict_layers``) splits the draft layers and sizes the cell and the tokens as :func:`mtp_terms`."""
    cases, expected = [], []
    for overrides, serving, memory in _MTP_VARIANTS:
        config = {**preset_config(PRESET), **overrides}
        p = plan(parse(config), Serving(**{"accounting": "sglang", **ON, **serving}), memory=memory)
        shape, terms = _mtp_terms(p.model, p.serving)  # the plan's serving: Inkling's ratio 0.1 applied
        kv_budget = kv_budget_bytes(p.model, p.serving, p.budget)
        text = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
        cases.append(
            {
                "config": text,
                "tp": p.serving.attn_tp_size,
                "available": kv_budget,
                "page": p.serving.page_size,
                "ratio": p.serving.swa_full_tokens_ratio,
                "draft": {"layers": terms.draft_layers, "mtp_local_layer_ids": config["mtp_local_layer_ids"]},
            }
        )
        expected.append((shape, terms, sglang_tokens(kv_budget, shape.cell + terms.cell_extra, p.serving.page_size)))
    planned = []
    for overrides, serving, memory in _MTP_VARIANTS:  # the same, planned under --enable-multi-layer-eagle
        config = {**preset_config(PRESET), **overrides}
        steps = min(3, config.get("num_nextn_predict_layers", 8))
        s = {"accounting": "sglang", **ON, **serving, **_MLE, "speculative_num_steps": steps}
        p = plan(parse(config), Serving(**{**s, "speculative_num_draft_tokens": steps + 1}), memory=memory)
        planned.append(p)
        kv_budget = kv_budget_bytes(p.model, p.serving, p.budget)  # with the intermediate state taken out
        text = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
        cases.append(
            {
                "config": text,
                "tp": p.serving.attn_tp_size,
                "available": kv_budget,
                "page": p.serving.page_size,
                "ratio": p.serving.swa_full_tokens_ratio,
                "draft": {
                    "layers": p.serving.speculative_draft_num_layers,
                    "mtp_local_layer_ids": config["mtp_local_layer_ids"],
                },
            }
        )
    answers = _peer(cases)
    for p, theirs in zip(planned, answers[len(expected) :], strict=True):
        assert theirs["error"] is None
        assert p.sizing.sglang_config["full_max_total_num_tokens"] == theirs["full_tokens"]
        assert p.sizing.sglang_config["swa_max_total_num_tokens"] == theirs["swa_tokens"]
    for (shape, terms, full), theirs in zip(expected, answers[: len(expected)], strict=True):
        assert (theirs["draft_full_layers"], theirs["draft_swa_full_layers"]) == (
            terms.budget_full_layers,
            terms.budget_swa_full_layers,
        )
        assert theirs["cell_size"] == pytest.approx(shape.cell + terms.cell_extra, rel=1e-12)
        assert theirs["full_tokens"] == full
        # a head's clone_with_new_mamba keeps one layer of the same mamba2_cache_params
        assert terms.state_per_layer * len(theirs["layers"]) == theirs["mamba_cache_per_req"]


def test_a_full_mtp_head_without_a_full_layer_is_refused() -> None:
    """Every layer slides: a non-banded head has no full geometry to take (refused, not built as something else)."""
    config = {**preset_config(PRESET), "local_layer_ids": list(range(16))}
    with pytest.raises(KvpoolsError, match=r"does not model an Inkling MTP head on a full layer"):
        plan(parse(config), Serving(accounting="sglang", **ON, **_MLE), memory="20GiB")


def test_mtp_heads_build_on_cpu_in_their_own_geometry() -> None:
    """A CPU build (exact, 256 MiB): the banded head 1 keeps one SWA layer (2 KV heads of 128 here), the others
    one full layer (4 KV heads), each of ``full + page`` rows; the banded head's mapping is the identity."""
    import torch

    config = {**preset_config(PRESET), "swa_num_key_value_heads": 2, "mtp_local_layer_ids": [1]}
    p = plan(parse(config), Serving(accounting="exact", **ON, **_MLE), memory="256MiB")
    pools = build(p, "cpu")
    assert pools.allocated_bytes == p.planned_bytes <= 256 << 20
    rows = p.sizing.sglang_config["full_max_total_num_tokens"] + 1
    heads = pools.kv_pool.mtp_heads
    assert tuple(heads.kv[0].get_key_buffer(0).shape) == (rows, 4, 128)
    assert tuple(heads.kv[1].get_key_buffer(0).shape) == (rows, 2, 128)
    assert torch.equal(heads.tensors["mtp1_kv_mapping"][0], torch.arange(rows + 1))
