"""DeepSeek-V4 with DSPARK speculative decoding (issue 33).

The reference configurator treats every speculative algorithm alike on DeepSeek-V4
(``002_50706b73e02ffb67.txt`` lines 573-588: speculative rings and the ``(L + 1) / L`` inflation), which the
oracle checks for DSPARK.  SGLang 0.5.23's DSpark draft pool adds ``swa_valid_from``, one int64 per request
slot, off HIP (``mem_cache/deepseek_v4_memory_pool.py`` lines 1247-1260; ``num_req_slots = max_num_reqs + 1``,
line 1006): hand-computed here and built on ``meta``.
"""

from __future__ import annotations

import attrs
import pytest

from kvpools_core import build
from kvpools_core.pipeline import plan
from kvpools_core.values import Serving
from tests.oracle.locate import require_oracle

from .support import GiB, compare_dsv4, oracle_model, preset_config

DSPARK = Serving(
    tp_size=8,
    page_size=256,
    max_running_requests=64,
    speculative_algorithm="DSPARK",
    speculative_draft_num_layers=1,
    speculative_num_draft_tokens=8,
)


def test_the_dspark_draft_pool_keeps_one_int64_per_request_slot() -> None:
    """64 requests: the request table has 64 + 1 rows, so swa_valid_from is 65 x 8 = 520 B; built exactly."""
    got = plan("deepseek-v4-flash", DSPARK, memory=40 * GiB)
    valid_from = got.pool("draft_swa_valid_from")
    assert valid_from.bytes == 65 * 8
    assert got.pool("draft_kv_swa").bytes > 0
    assert build(got, "meta").allocated_by_pool() == {p.name: p.bytes for p in got.pools}


@pytest.mark.parametrize(
    "serving",
    (
        attrs.evolve(DSPARK, platform="rocm"),  # HIP addresses the draft SWA through the target's mapping
        attrs.evolve(  # not is_dspark_spec(); SGLang asserts top-k 1 for EAGLE on DeepSeek-V4
            DSPARK,
            speculative_algorithm="EAGLE",
            speculative_num_steps=1,
            speculative_eagle_topk=1,
            speculative_num_draft_tokens=2,
        ),
    ),
)
def test_no_valid_from_mark_off_cuda_dspark(serving: Serving) -> None:
    got = plan("deepseek-v4-flash", serving, memory=40 * GiB)
    assert "draft_swa_valid_from" not in {p.name for p in got.pools}
    assert build(got, "meta").allocated_by_pool() == {p.name: p.bytes for p in got.pools}


@pytest.mark.parametrize("memory", (40 * GiB, 131 * GiB))
def test_dspark_sizes_as_the_reference_configurator(memory: int) -> None:
    """The oracle's DSV4PoolConfigurator with DSPARK: the same fields as with EAGLE (any algorithm inflates)."""
    require_oracle()
    oracle = oracle_model(preset_config("deepseek-v4-flash"))
    dspark = compare_dsv4("deepseek-v4-flash", oracle, DSPARK, memory).fields
    eagle = compare_dsv4(
        "deepseek-v4-flash",
        oracle,
        # steps 7: with top-k 1 SGLang makes EAGLE's draft tokens steps + 1, DSPARK's 8 (issue 32)
        attrs.evolve(DSPARK, speculative_algorithm="EAGLE", speculative_num_steps=7, speculative_eagle_topk=1),
        memory,
    ).fields
    assert dspark is not None
    assert dspark == eagle
