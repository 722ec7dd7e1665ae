"""kvpools ``--accounting sglang`` against SGLang's own sizing code (the oracle), DSA models.

SGLang's configurator charges the raw ``kv_lora_rank + qk_rope_head_dim`` row
plus the indexer key per (effective) layer; kvpools' ``--accounting sglang``
must reproduce its tokens, requests and cell size exactly, whatever the
packed fp8 row really stores.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvpools_core import Serving
from kvpools_core.models import resolve_model_source
from kvpools_core.registry import get_registry
from tests.oracle.locate import require_oracle

from ..mla.oracle_support import CHECKS, latent_configs, oracle_model, parse

require_oracle()

from tests.oracle.adapter import compare  # noqa: E402  (needs the oracle on sys.path)
from tests.oracle.strategies import GiB, aimed_budgets, serving_options  # noqa: E402

pytestmark = pytest.mark.oracle

BACKENDS = ("flashmla_sparse", "flashmla_kv", "trtllm", "tilelang", "fa3")


def preset_config(name: str) -> dict[str, Any]:
    return resolve_model_source(name, get_registry())[0]


@pytest.mark.parametrize("kv", ("auto", "fp8_e4m3", "fp4_e2m1"))
@pytest.mark.parametrize("preset", ("deepseek-v3.2", "deepseek-v3.2-exp"))
def test_presets_across_tp_drafts_and_budgets(preset: str, kv: str) -> None:
    model = oracle_model(preset_config(preset))
    drafts: list[dict[str, Any]] = [{}, {"speculative_algorithm": "EAGLE", "speculative_draft_num_layers": 1}]
    if model.num_nextn_predict_layers:
        drafts.append(
            {
                "speculative_algorithm": "NEXTN",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 4,
            }
        )
    for draft in drafts:
        for tp in (1, 8, 16):
            dp = {"dp_size": tp, "enable_dp_attention": True} if tp > 1 else {}
            serving = Serving(kv_cache_dtype=kv, page_size=64, tp_size=tp, **dp, **draft)
            for memory in (3 * GiB + 12345, 43 * GiB, 140 * GiB):
                compare(preset, model, serving, memory=memory)


def test_the_real_deployment_and_its_profile() -> None:
    """DeepSeek-V3.2-Exp, 8×B200, DP attention, fp8 KV: explicit budgets and a profiled 178 GiB B200."""
    model = oracle_model(preset_config("deepseek-v3.2-exp"))
    serving = Serving(tp_size=8, dp_size=8, enable_dp_attention=True, kv_cache_dtype="fp8_e4m3", page_size=64)
    for memory in (40 * GiB, 43 * GiB + 687 * (1 << 20), 45 * GiB):
        compare("deepseek-v3.2-exp", model, serving, memory=memory)
    for weights in (83 * GiB, 120 * GiB):
        compare("deepseek-v3.2-exp", model, serving, free_memory=178 * GiB, weights_memory=weights)


@pytest.mark.parametrize("cp", (2, 4, 8))
def test_cache_layer_split(cp: int) -> None:
    """``ceil(L / cp) + 1`` layers in the cell; the EAGLE draft still scales by the stage's layers."""
    model = oracle_model(preset_config("deepseek-v3.2"))
    for draft in ({}, {"speculative_algorithm": "NEXTN"}):
        for pp in (1, 2):
            serving = Serving(
                tp_size=8,
                attn_cp_size=cp,
                enable_dsa_cache_layer_split=True,
                kv_cache_dtype="fp8_e4m3",
                page_size=64,
                pp_size=pp,
                disaggregation_mode="prefill",  # SGLang runs the split on a PD prefill node only
                **draft,
            )
            for rank in range(pp):
                compare("deepseek-v3.2", model, attrs.evolve(serving, pp_rank=rank), memory=30 * GiB)


@pytest.mark.usefixtures("rocm_platform")
@settings(CHECKS, max_examples=250)
@given(st.data())
def test_generated_dsa_models(data: st.DataObject) -> None:
    """CUDA (page 64) and ROCm (any page), backends, layer split, every KV dtype, parallelism, caps, speculation."""
    config = data.draw(latent_configs(dsa=True), label="config")
    spec = parse(config)
    serving = data.draw(serving_options(spec), label="serving")
    if data.draw(st.booleans(), label="cuda"):
        serving = attrs.evolve(serving, page_size=64)
    else:
        serving = attrs.evolve(serving, platform="rocm")
    serving = attrs.evolve(
        serving,
        dsa_prefill_backend=data.draw(st.sampled_from(BACKENDS), label="prefill backend"),
        dsa_decode_backend=data.draw(st.sampled_from(BACKENDS), label="decode backend"),
        enable_dsa_cache_layer_split=data.draw(st.booleans(), label="layer split"),
    )
    if serving.page_size == 1 and serving.dcp_size > 1:
        serving = attrs.evolve(serving, dcp_size=1)  # refused as not modelled (test_dsa_indexer_rules.py)
    if serving.enable_dsa_cache_layer_split or (serving.disaggregation_mode == "decode" and serving.attn_cp_size > 1):
        # SGLang refuses the split off a PD prefill node and prefill CP on a decode node (dsa_problems)
        serving = attrs.evolve(serving, disaggregation_mode="prefill")
    if serving.dcp_size > 1 and serving.disaggregation_mode != "null":
        # SGLang refuses DSA DCP on a PD node (_dsa_dcp_overrides; test_dsa_indexer_rules.py)
        serving = attrs.evolve(serving, dcp_size=1)
    memory = data.draw(aimed_budgets(spec), label="memory")
    want, _ = compare(spec, oracle_model(config), serving, memory=memory)
    event(want.error or "planned")
    event(f"kv {serving.kv_cache_dtype}, {serving.platform}")
    if serving.enable_dsa_cache_layer_split and serving.attn_cp_size > 1:
        event("layer split active")
