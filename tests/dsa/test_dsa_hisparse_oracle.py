"""``--accounting sglang`` with HiSparse on DSA against SGLang's own sizing code (the oracle), and IndexShare.

The oracle runs the reference configurator (ref-002 / ref-000) with ``enable_hisparse`` and ``hisparse_config``
set: its DSA cell charges the 132 B index key once per layer whatever ``host_to_device_ratio`` is (ref-002 lines
193-220), so the device tokens are the same as without HiSparse; and it charges every layer's key whatever
IndexShare skips.  kvpools' SGLang-accounted plans must give the same tokens, requests and cell size.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from kvpools_core import Serving, plan
from kvpools_core.models import parse_config, resolve_model_source
from kvpools_core.registry import get_registry
from tests.oracle.locate import require_oracle

require_oracle()

from tests.mla.oracle_support import oracle_model  # noqa: E402  (needs the oracle on sys.path)
from tests.oracle.adapter import oracle_params, run_oracle  # noqa: E402

pytestmark = pytest.mark.oracle
GiB = 1 << 30


def _config(name: str) -> dict[str, Any]:
    return dict(resolve_model_source(name, get_registry())[0])


def _sglang(config: dict[str, Any], serving: Serving, memory: int) -> dict[str, Any]:
    params = oracle_params(oracle_model(config), serving, memory=memory)
    params["server_args"]["enable_hisparse"] = serving.enable_hisparse
    params["server_args"]["hisparse_config"] = serving.hisparse_config
    out = run_oracle(params)
    assert "error" not in out, out.get("error")
    return out


@pytest.mark.parametrize("ratio", [None, 4])
@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
@pytest.mark.parametrize("tp", [1, 8])
def test_hisparse_tokens_match_sglang(ratio: int | None, kv: str, tp: int) -> None:
    config = None if ratio is None else f'{{"host_to_device_ratio": {ratio}}}'
    serving = Serving(
        tp_size=tp,
        page_size=64,
        kv_cache_dtype=kv,
        enable_hisparse=True,
        disable_radix_cache=True,
        hisparse_config=config,
        accounting="sglang",
    )
    for memory in (20 * GiB + 12345, 60 * GiB):
        want = _sglang(_config("deepseek-v3.2"), serving, memory)
        got = plan("deepseek-v3.2", serving, memory=memory)
        pool = want["memory_pool_config"]
        assert (got.max_total_num_tokens, got.max_running_requests) == (
            pool["max_total_num_tokens"],
            pool["max_running_requests"],
        )
        assert got.cell.sglang_bytes_per_token == want["cell_size"]


def test_indexshare_sglang_accounting_matches_sglang() -> None:
    """GLM-5.2 (57 of 78 layers share top-k): the reference configurator charges all 78 layers' keys."""
    config = _config("glm-5.2")
    spec, _ = parse_config(config, "glm-5.2", get_registry())
    serving = Serving(tp_size=8, page_size=64, kv_cache_dtype="fp8_e4m3", accounting="sglang")
    for memory in (30 * GiB, 60 * GiB):
        want = _sglang(config, serving, memory)
        got = plan(spec, attrs.evolve(serving), memory=memory)
        assert got.max_total_num_tokens == want["memory_pool_config"]["max_total_num_tokens"]
        assert got.cell.sglang_bytes_per_token == want["cell_size"]
