"""kvpools ``--accounting sglang`` against SGLang's own sizing code (the oracle), MiniMax sparse attention.

SGLang's ``DefaultPoolConfigurator`` sizes MiniMax-M3 as main K+V over every
local layer plus the indexer (2 × index-value layers + key-only layers) in the
model dtype, with no fp4 scale term; kvpools must agree on tokens, requests
and the cell size.
"""

from __future__ import annotations

import attrs
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvpools_core import Serving
from kvpools_core.models import resolve_model_source
from kvpools_core.registry import get_registry
from tests.oracle.locate import require_oracle

from ..mla.oracle_support import CHECKS, minimax_sparse_configs, oracle_model, parse

require_oracle()

from tests.oracle.adapter import compare  # noqa: E402  (needs the oracle on sys.path)
from tests.oracle.strategies import GiB, aimed_budgets, serving_options  # noqa: E402

pytestmark = pytest.mark.oracle


@pytest.mark.parametrize("kv", ("auto", "fp8_e4m3", "fp4_e2m1"))
def test_minimax_m3_preset(kv: str) -> None:
    model = oracle_model(resolve_model_source("minimax-m3", get_registry())[0])
    for draft in (
        {},
        {
            "speculative_algorithm": "NEXTN",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4,
        },
    ):
        for tp, page in ((1, 1), (4, 64), (8, 128), (16, 16)):
            for pp in (1, 3):
                serving = Serving(kv_cache_dtype=kv, tp_size=tp, page_size=page, pp_size=pp, **draft)
                for rank in range(pp):
                    for memory in (3 * GiB + 12345, 60 * GiB):
                        compare("minimax-m3", model, attrs.evolve(serving, pp_rank=rank), memory=memory)


@settings(CHECKS, max_examples=250)
@given(st.data())
def test_generated_minimax_sparse_models(data: st.DataObject) -> None:
    """Dense/sparse layer patterns, key-only and key+value indexers; every KV dtype, parallelism, cap and draft."""
    config = data.draw(minimax_sparse_configs(), label="config")
    spec = parse(config)
    serving = data.draw(serving_options(spec), label="serving")
    memory = data.draw(aimed_budgets(spec), label="memory")
    want, _ = compare(spec, oracle_model(config), serving, memory=memory)
    event(want.error or "planned")
    event(f"kv {serving.kv_cache_dtype}")


@settings(CHECKS, max_examples=40)
@given(st.data())
def test_generated_minimax_sparse_pipeline_stages(data: st.DataObject) -> None:
    config = data.draw(minimax_sparse_configs(), label="config")
    spec = parse(config)
    if spec.num_layers < 2:
        return
    serving = data.draw(serving_options(spec, pp=True), label="serving")
    memory = data.draw(st.integers(GiB, 100 * GiB), label="memory")
    for rank in range(serving.pp_size):
        compare(spec, oracle_model(config), attrs.evolve(serving, pp_rank=rank), memory=memory)
