"""Qwen4-Exp's PLE request state (issue 32's silent omission, issue 33's family): planned, built, and checked
against SGLang 0.5.23's own ``ShortConvPool`` / ``NGramPool`` (``mem_cache/ple_state_pool.py``) on CPU.

Before this, a Qwen4-Exp config planned as a plain GDN hybrid with no PLE pool at all.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import Serving, build, plan
from kvpools_core.errors import ConfigError, KvpoolsError
from kvpools_core.parallel import rank_layer_range
from tests.oracle import locate

from .support import parse, preset_config

PRESET = "qwen4-exp-defaults"
GiB = 1 << 30
PLE_POOLS = ("ple_short_conv", "ple_short_conv_spec", "ple_ngram", "ple_ngram_spec")
EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
    "max_running_requests": 64,
}


def _without_ple() -> dict[str, Any]:
    config = copy.deepcopy(preset_config(PRESET))
    config["text_config"]["ple_layer_ids"] = []
    return config


def test_preset_plans_the_short_conv_and_ngram_state_hand_computed() -> None:
    """48 PLE layers x (hidden 2048 x hc_count 4) x ((kernel 4 - 1) x ngram 3) bf16 = 7,077,888 B per slot;
    n-gram context ngram_size - 1 = 2 int64 = 16 B (configs/qwen4_exp.py ``short_conv_state_shape``,
    ``ngram_context_len``); both over K + 1 rows (ple_state_pool.py ``size + 1``)."""
    result = plan(PRESET, Serving(accounting="sglang"), memory="20GiB")
    k = result.sizing.state_slots
    conv, ngram = result.pool("ple_short_conv"), result.pool("ple_ngram")
    assert conv.bytes_per_slot == 48 * 2048 * 4 * 9 * 2 == 7_077_888
    assert conv.bytes == (k + 1) * 7_077_888
    assert ngram.bytes == (k + 1) * 2 * 8
    assert not conv.sglang_charged and not ngram.sglang_charged
    assert any("Qwen4-Exp PLE request state" in note for note in result.sizing.notes)


def test_sglang_accounting_allocates_it_beyond_the_budget_exact_fits_it() -> None:
    """``_handle_max_mamba_cache`` charges the GDN state only: SGLang's tokens and K are those of the same model
    without PLE layers, and the PLE pools come on top; ``--accounting exact`` fits them in (fewer tokens)."""
    bare = parse(_without_ple(), "no-ple")
    with_ple = parse(preset_config(PRESET), PRESET)
    assert bare.params["ple"]["ngram_context_len"] == 0
    for accounting in ("sglang", "exact"):
        a = plan(with_ple, Serving(accounting=accounting), memory="20GiB")
        b = plan(bare, Serving(accounting=accounting), memory="20GiB")
        assert not any(p.name.startswith("ple_") for p in b.pools)
        assert a.sizing.state_slots == b.sizing.state_slots
        if accounting == "sglang":
            assert a.max_total_num_tokens == b.max_total_num_tokens
            assert a.planned_bytes - b.planned_bytes == sum(a.pool(n).bytes for n in ("ple_short_conv", "ple_ngram"))
        else:
            assert a.max_total_num_tokens < b.max_total_num_tokens
            assert a.planned_bytes <= 20 * GiB


@pytest.mark.parametrize("accounting", ["exact", "sglang"])
def test_preset_builds_on_meta_with_the_planned_bytes(accounting: str) -> None:
    for options in ({}, {"tp_size": 2, **EAGLE}, {"pp_size": 2}, {"disaggregation_mode": "decode", **EAGLE}):
        result = plan(PRESET, Serving(accounting=accounting, **options), memory="80GiB")
        pools = build(result, "meta")
        assert pools.allocated_by_pool() == {p.name: p.bytes for p in result.pools}, options
        assert "ple_short_conv" in pools.allocated_by_pool()


def test_host_tier_packs_the_ple_state_into_the_state_host_rows() -> None:
    """SGLang's ``MambaPoolHost`` mirrors the MambaPool's side states (``extra_checkpoint_buffers``) in its own
    rows: ``get_size_per_token`` = state + the side states' per-slot rows (``mem_cache/pool_host/mamba.py``)."""
    result = plan(
        PRESET, Serving(accounting="sglang", enable_hierarchical_cache=True), memory="20GiB", host_memory="256GiB"
    )
    assert result.host is not None
    host = {pool.name: pool for pool in result.host.pools}
    assert set(host) == {"kv", "mamba_state"}
    assert host["mamba_state"].bytes_per_slot == 77_266_944 + 7_077_888 + 16


def test_vllm_accounting_is_refused_by_name() -> None:
    from kvpools_core.engines.vllm import plan_vllm

    with pytest.raises(KvpoolsError, match="kvpools does not model Qwen4-Exp's PLE state under"):
        plan_vllm(PRESET, Serving(accounting="vllm"), memory="20GiB")


def test_config_refusals_name_the_field() -> None:
    config = copy.deepcopy(preset_config(PRESET))
    config["text_config"]["hc_count"] = 1
    with pytest.raises(ConfigError, match=r"hc_count.*requires hc_count > 1"):
        parse(config)
    config = copy.deepcopy(preset_config(PRESET))
    config["text_config"]["ple_layer_ids"] = [0, 5]
    with pytest.raises(ConfigError, match="ple_layer_ids"):
        parse(config)


def test_qsa_layers_are_refused_by_name() -> None:
    """QSA layers without a QSA profile are refused; a profile is SGLang's ``QSATokenToKVPool`` (ref-000
    L1938-1957), planned in ``tests/mamba/test_qsa.py``."""
    config = copy.deepcopy(preset_config(PRESET))
    text = config["text_config"]
    text["layer_types"] = ["qwen_sparse_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48)]
    with pytest.raises(ConfigError, match="kvpools does not model QSA"):
        parse(config)
    # parse_qsa_profile (layers/attention/qsa/config.py) keys on the text config's indexer_n_heads alone, and
    # _parse_compressed then requires every indexer field.
    config = copy.deepcopy(preset_config(PRESET))
    config["text_config"]["indexer_n_heads"] = 16
    with pytest.raises(ConfigError, match=r"QSA config is missing required fields"):
        parse(config)


# -- differential: SGLang's own pool classes ------------------------------------------------------------------


def _peer(cases: list[dict[str, Any]]) -> list[dict[str, int | None]]:
    python, bench = locate.require_sglang_peer()
    script = Path(__file__).with_name("ple_peer.py")
    out = subprocess.run(
        [str(python), str(script), str(bench), json.dumps(cases)], capture_output=True, text=True, check=True
    )
    *answers, stubbed = json.loads(out.stdout)
    # Only plumbing is stubbed: the CUDA memory-pool helpers and the memory saver, never a size.
    assert stubbed == [
        "sglang.srt.constants",
        "sglang.srt.mem_cache.utils",
        "sglang.srt.utils.torch_memory_saver_adapter",
    ]
    return answers


@pytest.mark.oracle
def test_pools_match_sglangs_short_conv_and_ngram_pools() -> None:
    """Every PLE pool of kvpools' plan has the bytes SGLang's classes allocate for the same slots and rows."""
    config = preset_config(PRESET)
    some_layers = copy.deepcopy(config)
    some_layers["text_config"].update(ple_layer_ids=[2, 3, 17, 40, 48], ngram_size=5, ple_conv_kernel_size=3)
    cases, plans = [], []
    for name, cfg in ((PRESET, config), ("some-layers", some_layers)):
        model = parse(cfg, name)
        for options in (
            {},
            {"tp_size": 2, **EAGLE},
            {"pp_size": 2, "pp_rank": 1},
            {"disaggregation_mode": "decode", **EAGLE},
            {"disaggregation_mode": "prefill", **EAGLE},
        ):
            serving = Serving(accounting="sglang", **options)
            result = plan(model, serving, memory="40GiB")
            start, end = rank_layer_range(model, serving)
            spec_rows = next((p.slots for p in result.pools if p.name == "mamba_spec_state"), None)
            cases.append(
                {
                    "text_config": cfg["text_config"],
                    "start": start,
                    "end": end,
                    "size": result.sizing.state_slots,
                    "spec_state_size": spec_rows or 0,
                    "draft_tokens": None if spec_rows is None else 4,
                    "dtype": "bfloat16",
                }
            )
            plans.append((name, options, result))
    for (name, options, result), sglang in zip(plans, _peer(cases), strict=True):
        ours = {p.name: p.bytes for p in result.pools if p.name in PLE_POOLS}
        theirs = {pool: n for pool, n in sglang.items() if n}
        assert ours == theirs, (name, options)
