"""DeepSeek-V4 on Ascend, ``--accounting sglang``, against the specification's own configurator (the oracle).

SGLang 0.5.23's ``DSV4PoolConfigurator`` on an NPU charges the 584 B row unpadded (``_get_paged_kv_bytes_per_token``:
``if self._unified or _is_npu or ...: return self.kv_bytes``), which is ``reference/002``'s arithmetic (it has no page
pad on any platform), at the NPU's page 128.  So the oracle, which runs ``002_*.txt`` itself, gives the NPU's
``MemoryPoolConfig``: kvpools-ascend's :class:`~kvpools_ascend.dsv4_sizing.NPUConfigurator` must agree on every field
and the bytes per full token (``tests/dsv4/support.compare_dsv4``).  Skips without the oracle.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from kvpools_core.values import Serving
from tests.dsv4.support import GiB, compare_dsv4, oracle_model, preset_config
from tests.oracle.locate import require_oracle

require_oracle()

pytestmark = pytest.mark.oracle

ASCEND = Serving(platform="ascend", tp_size=4)
EAGLE: dict[str, Any] = {
    "speculative_algorithm": "EAGLE",
    "speculative_draft_num_layers": 1,
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}


@pytest.mark.parametrize(
    "serving",
    [
        ASCEND,
        attrs.evolve(ASCEND, max_running_requests=64),
        attrs.evolve(ASCEND, swa_full_tokens_ratio=0.5),
        attrs.evolve(ASCEND, **EAGLE),
        attrs.evolve(ASCEND, pp_size=2, pp_rank=1),
        attrs.evolve(ASCEND, disaggregation_mode="decode", disaggregation_decode_extra_slots=8),
    ],
    ids=["default", "64-requests", "ratio-0.5", "eagle", "pp-stage-1", "decode"],
)
@pytest.mark.parametrize("preset", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_the_npu_configurator_is_sglangs(preset: str, serving: Serving) -> None:
    oracle = oracle_model(preset_config(preset))
    for memory in (24 * GiB, 60 * GiB + 12345):
        assert compare_dsv4(preset, oracle, serving, memory).fields is not None
