"""The continuous-batching example (examples/continuous_batching.py), run small: same outputs as one at a time,
as many requests at once as the plan says fit, and every slot and row back when it ends."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("transformers")

from kvpools_core.integrations.transformers import KvpoolsCache

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "continuous_batching.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("continuous_batching_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page_size", [16, 1])
def test_the_example_serves_mixed_requests_like_one_at_a_time_generation(example: ModuleType, page_size: int) -> None:
    model = example.tiny_llama()
    pools = example.build_pools(model, page_size=page_size, max_running_requests=4, memory="1MiB")
    free_slots = pools.allocator.available_size()
    requests = example.mixed_requests(16)
    cache = KvpoolsCache(pools)

    run = example.serve(model, cache, requests)

    assert [r.output for r in run.requests] == [example.one_at_a_time(model, r) for r in requests]
    assert run.peak_running == pools.plan.max_running_requests == 4
    assert pools.allocator.available_size() == free_slots
    assert pools.req_to_token_pool.available_size() == 4
    assert not cache.requests


def test_with_little_memory_the_allocator_not_the_table_limits_admission(example: ModuleType) -> None:
    model = example.tiny_llama()
    pools = example.build_pools(model, page_size=16, max_running_requests=12, memory="64KiB")
    requests = example.mixed_requests(12)
    footprints = [example.footprint(r, 16) for r in requests]
    assert sum(footprints) > pools.plan.max_total_num_tokens  # they cannot all be held at once

    run = example.serve(model, KvpoolsCache(pools), requests)

    assert 1 <= run.peak_running < pools.plan.max_running_requests
    assert [r.output for r in run.requests] == [example.one_at_a_time(model, r) for r in requests]


def test_main_prints_the_plan_and_the_match(example: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    assert example.main(["--requests", "6", "--max-running-requests", "3"]) == 0
    printed = capsys.readouterr().out
    assert "3 request rows" in printed
    assert "at most 3 at once" in printed
    assert "identical to one-at-a-time generation: 6/6" in printed
