"""kvpools ``--accounting sglang`` against SGLang's own sizing code (the oracle), MLA models.

Every case plans with kvpools and runs SGLang's ``pool_configurator.py`` /
``kv_cache_configurator.py`` on the same inputs; they must agree on
``max_total_num_tokens``, ``max_running_requests`` and the cell size, and fail
together (``tests.oracle.adapter.compare``).  The oracle's model is read from
the same ``config.json`` independently of kvpools' parser.
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

from .oracle_support import CHECKS, latent_configs, oracle_model, parse

require_oracle()

from tests.oracle.adapter import compare  # noqa: E402  (needs the oracle on sys.path)
from tests.oracle.strategies import GiB, aimed_budgets, serving_options  # noqa: E402

pytestmark = pytest.mark.oracle

PRESETS = ("deepseek-v3", "deepseek-r1", "deepseek-v2-lite", "kimi-k2-instruct")
KV_DTYPES = ("auto", "fp8_e4m3", "fp4_e2m1", "fp4_mx_block16", "nvfp4")


def preset_config(name: str) -> dict[str, Any]:
    return resolve_model_source(name, get_registry())[0]


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("preset", PRESETS)
def test_presets_across_tp_pages_and_drafts(preset: str, kv: str) -> None:
    """bf16 / fp8 / fp4 KV × TP (DP attention) × page sizes × no draft, NEXTN's MTP layer, a 2-layer EAGLE draft."""
    model = oracle_model(preset_config(preset))
    drafts: list[dict[str, Any]] = [{}, {"speculative_algorithm": "EAGLE", "speculative_draft_num_layers": 2}]
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
        for tp, page in ((1, 1), (8, 64), (16, 32)):
            dp = {"dp_size": tp, "enable_dp_attention": True} if tp > 1 else {}
            serving = Serving(kv_cache_dtype=kv, page_size=page, tp_size=tp, **dp, **draft)
            for memory in (3 * GiB + 12345, 40 * GiB, 140 * GiB):
                compare(preset, model, serving, memory=memory)


@pytest.mark.parametrize("preset", ("deepseek-v3", "kimi-k2-instruct"))
def test_presets_profiling_path_and_pipeline_stages(preset: str) -> None:
    """141 GiB free before the weights (H200); the weights of one stage; PP stages keep the smallest."""
    model = oracle_model(preset_config(preset))
    for serving in (
        Serving(tp_size=8, mem_fraction_static=0.88, kv_cache_dtype="fp8_e4m3", page_size=64),
        Serving(tp_size=4, pp_size=2, pp_rank=1, page_size=16, max_running_requests=512),
    ):
        for weights in (60 * GiB, 120 * GiB, 140 * GiB):
            compare(preset, model, serving, free_memory=141 * GiB, weights_memory=weights)


@settings(CHECKS, max_examples=250)
@given(st.data())
def test_generated_mla_models(data: st.DataObject) -> None:
    """Latent ranks, rope dims, layers; every KV dtype, page, TP/DP/CP/DCP, caps, disaggregation, speculation."""
    config = data.draw(latent_configs(dsa=False), label="config")
    spec = parse(config)
    serving = data.draw(serving_options(spec), label="serving")
    memory = data.draw(aimed_budgets(spec), label="memory")
    want, _ = compare(spec, oracle_model(config), serving, memory=memory)
    event(want.error or "planned")
    event(f"kv {serving.kv_cache_dtype}")


@settings(CHECKS, max_examples=40)
@given(st.data())
def test_generated_mla_models_pipeline_stages(data: st.DataObject) -> None:
    config = data.draw(latent_configs(dsa=False), label="config")
    spec = parse(config)
    if spec.num_layers < 2:
        spec = parse({**config, "num_hidden_layers": 2})
        config = {**config, "num_hidden_layers": 2}
    serving = data.draw(serving_options(spec, pp=True), label="serving")
    memory = data.draw(st.integers(GiB, 100 * GiB), label="memory")
    for rank in range(serving.pp_size):
        compare(spec, oracle_model(config), attrs.evolve(serving, pp_rank=rank), memory=memory)
