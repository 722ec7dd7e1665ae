"""Real ranks: gloo process groups on CPU (torch.multiprocessing), each rank planning with its own memory."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from kvpools_core import Serving  # noqa: E402
from kvpools_core.planning.distributed import float32, plan_all_ranks, plan_on_group  # noqa: E402

GiB = 1 << 30


def _rank_main(rank: int, world: int, init_file: str, out_dir: str, case: dict[str, Any]) -> None:
    """One process: join the gloo group, plan its rank with its own free memory, write what it got."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        serving = Serving(**case["serving"])
        result = plan_on_group(
            case["model"],
            serving,
            free_memory=case["free"][rank],
            weights_memory=case["weights"][rank],
        )
        record = {
            "rank": result.rank,
            "tokens": result.plan.max_total_num_tokens,
            "token_counts": dict(result.plan.sizing.token_counts),
            "pp_rank": result.plan.serving.pp_rank,
            "agreement": result.agreement.to_dict(),
        }
        Path(out_dir, f"{rank}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()


def _run(tmp_path: Path, world: int, case: dict[str, Any]) -> list[dict[str, Any]]:
    init_file = tmp_path / "init"
    # fork where the platform has it: the ranks inherit the imported torch and plugins (spawn re-imports them)
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    mp.start_processes(
        _rank_main, args=(world, str(init_file), str(tmp_path), case), nprocs=world, join=True, start_method=method
    )
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(world)]


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))


def test_two_tp_ranks_agree_with_unequal_free_memory(tmp_path: Path) -> None:
    """TP 2, one rank with 3 GiB less free: both keep the smaller rank's tokens; the agreement every rank returns
    equals the process-group-free computation of the same inputs, byte for byte."""
    case = {
        "model": "llama-3.1-8b",
        "serving": {"tp_size": 2},
        "free": [f"{40 * GiB}", f"{37 * GiB}"],
        "weights": ["8GiB", "8GiB"],
    }
    records = _run(tmp_path, 2, case)
    expected = plan_all_ranks(
        "llama-3.1-8b", Serving(tp_size=2), free_memory={0: 40 * GiB, 1: 37 * GiB}, weights_memory="8GiB", suggest=False
    )
    assert [r["tokens"] for r in records] == [expected.agreement.tokens] * 2
    assert records[0]["agreement"] == records[1]["agreement"] == expected.agreement.to_dict()
    assert records[0]["agreement"]["bound_by"] == 1
    rows = records[0]["agreement"]["ranks"]
    assert rows[1]["own_tokens"] == expected.agreement.tokens < rows[0]["own_tokens"]
    assert rows[0]["unused_bytes"] > 2 * GiB


def test_four_ranks_pp2_tp2_unequal_stages(tmp_path: Path) -> None:
    """PP 2 x TP 2 with stage 1's ranks short of memory: stage 1 binds, every rank keeps its tokens exactly."""
    case = {
        "model": "llama-3.1-70b",
        "serving": {"tp_size": 2, "pp_size": 2},
        "free": [f"{70 * GiB}", f"{70 * GiB}", f"{60 * GiB}", f"{61 * GiB}"],
        "weights": ["35GiB"] * 4,
    }
    records = _run(tmp_path, 4, case)
    expected = plan_all_ranks(
        "llama-3.1-70b",
        Serving(tp_size=2, pp_size=2),
        free_memory={0: 70 * GiB, 1: 70 * GiB, 2: 60 * GiB, 3: 61 * GiB},
        weights_memory="35GiB",
        suggest=False,
    )
    assert [r["pp_rank"] for r in records] == [0, 0, 1, 1]
    assert {r["tokens"] for r in records} == {expected.agreement.tokens}
    assert all(r["agreement"] == expected.agreement.to_dict() for r in records)
    assert records[0]["agreement"]["bound_by"] == 2
    assert records[0]["agreement"]["bottleneck_stage"] == 1


def test_sglang_accounting_reduces_free_memory_in_float32(tmp_path: Path) -> None:
    """SGLang's float32 MIN: two ranks 12 KiB apart round to one free size, shared by both."""
    free = [141 * GiB + 8_000, 141 * GiB + 20_000]
    case = {
        "model": "llama-3.1-8b",
        "serving": {"tp_size": 2, "accounting": "sglang"},
        "free": [str(f) for f in free],
        "weights": ["16GiB", "16GiB"],
    }
    records = _run(tmp_path, 2, case)
    agreement = records[0]["agreement"]
    assert agreement["reduced_pre_load_bytes"] == min(float32(f) for f in free) == 141 * GiB
    assert agreement["reduced_free_bytes"] == float32(125 * GiB + 8_000)
    assert agreement["ranks"][0]["budget_bytes"] == agreement["ranks"][1]["budget_bytes"]
