"""The per-request SWA ring (ledger row 000-024) against SGLang 0.5.23's own ``SWATokenToKVPoolAllocator``.

``sglang_swa_ring_peer.py`` builds the installed allocator (``mem_cache/allocator/swa.py``) in ring mode from the
numbers of a kvpools plan (full and paged SWA tokens, page, ring, request slots) and reports its
``is_swa_req_ring``, ``swa_ring_cost_tokens``, ``size_swa`` (ref-000 ``configure`` lines 377-387: the
``swa_max_total_num_tokens`` SGLang reports) and its available sizes with request slots taken; kvpools' plan and
its built allocator must answer the same.  Skips without the peers venv (fails under ``KVPOOLS_REQUIRE_SHARED=1``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import attrs
import pytest
from kvpools_plugins.dsv4.swa_req_ring import RING_COST, RING_TOTAL

from kvpools_core import Serving, build, plan
from tests.oracle import locate

PYTHON, BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_swa_ring_peer.py")
pytestmark = pytest.mark.usefixtures("rocm_platform")
UNIFIED = {"rocm.flashmla_backend": "unified_kv_triton"}
EAGLE: dict[str, Any] = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
    "speculative_draft_num_layers": 1,
}


def _peer(cases: list[dict[str, int]]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(PYTHON), str(PEER), str(BENCH)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "changes",
    [{}, {"max_running_requests": 48}, {**EAGLE, "max_running_requests": 100}],
    ids=["default", "48-requests", "eagle"],
)
def test_plan_and_build_answer_as_sglangs_allocator(changes: dict[str, Any]) -> None:
    serving = Serving(platform="rocm", tp_size=8, page_size=256, swa_full_tokens_ratio=0.1, plugin_options=UNIFIED)
    p = plan("deepseek-v4-flash", attrs.evolve(serving, **changes), memory="60GiB")
    pools = build(p, "meta")
    config, alloc = p.sizing.sglang_config, pools.allocator
    ring = pools.kv_pool.unified_kv_pool.geometry.ring
    taken = 5
    case = {
        "full": config["full_max_total_num_tokens"],
        "swa": config["swa_max_total_num_tokens"],
        "page": 256,
        "ring": ring,
        "slots": pools.req_to_token_pool.available_size(),
        "taken": taken,
    }
    (sglang,) = _peer([case])
    assert sglang["is_swa_req_ring"]
    assert config[RING_COST] == alloc.swa_ring_cost_tokens == sglang["swa_ring_cost_tokens"]
    assert config[RING_TOTAL] == alloc.size_swa == sglang["size_swa"]
    rows = pools.req_to_token_pool.alloc(taken)
    assert rows is not None
    assert alloc.swa_available_size() == sglang["swa_available_size"]
    assert alloc.available_size() == sglang["available_size"]
