"""A draft under ``--dcp-size`` against SGLang's sizing code: its numbers do not move.

SGLang's configurator divides the budget by a cell that never counts the draft worker's ``loc_space_scale``
(``000_fbd4f47288598fb9.txt`` lines 405-433): kvpools' ``--accounting sglang`` must give the same tokens,
requests and cell size while its draft pools hold ``dcp x (S + P)`` rows.
"""

from __future__ import annotations

import pytest

from kvpools_core.models import resolve_model_source
from kvpools_core.registry import get_registry
from kvpools_core.values import Plan, Serving
from tests.mla.oracle_support import oracle_model

from .locate import require_oracle

pytestmark = pytest.mark.oracle

require_oracle()

from .adapter import compare  # noqa: E402  (needs the oracle on sys.path)
from .strategies import GiB  # noqa: E402


@pytest.mark.parametrize(("preset", "page"), [("deepseek-v3", 1), ("deepseek-v3", 16), ("deepseek-v3.2", 64)])
@pytest.mark.parametrize("dcp", (2, 8))
@pytest.mark.parametrize("memory", (6 * GiB, 20 * GiB))
def test_sglang_numbers_are_unchanged_by_the_dcp_draft_pools(preset: str, page: int, dcp: int, memory: int) -> None:
    serving = Serving(tp_size=8, dcp_size=dcp, page_size=page, speculative_algorithm="NEXTN")
    model = oracle_model(resolve_model_source(preset, get_registry())[0])  # read as SGLang's ModelConfig
    _want, got = compare(preset, model, serving, memory=memory)
    assert isinstance(got, Plan)
    tokens = got.max_total_num_tokens
    for pool in got.pools:
        if pool.name.startswith("draft_"):
            assert (pool.slots, pool.padding_slots) == (dcp * tokens, dcp * page)
