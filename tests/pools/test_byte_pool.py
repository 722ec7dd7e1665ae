"""The core's default ``build_pool``: an architecture that only parses and prices its storage gets it built.

A new plugin that describes its per-token (and per-request) storage as cell
parts and lets the core size it needs no ``build_pool``: the core allocates
every planned storage pool as byte rows, exactly the planned bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import torch

from kvpools_core import Serving, build, hookimpl, plan
from kvpools_core.errors import PoolPlanMismatchError
from kvpools_core.pools.bytes import BytePool
from kvpools_core.testing.registries import isolated_registry
from kvpools_core.values import CellPart, CellSize, LayerSpec, ModelSpec


class Minimal:
    """Parses ``model_type: minimal`` (4 layers of 96 B per token, 1 KiB of state per request); nothing else."""

    @hookimpl
    def parse_model_config(self, config: Mapping[str, Any], source: str) -> ModelSpec | None:
        if config.get("model_type") != "minimal":
            return None
        layers = [LayerSpec(index=i, kind="minimal") for i in range(4)]
        return ModelSpec(name=source, architecture="minimal", layers=layers, context_len=4096, dtype="bfloat16")

    @hookimpl
    def estimate_cell_size(self, model: ModelSpec, serving: Serving) -> CellSize | None:
        if model.architecture != "minimal":
            return None
        parts = [CellPart("latent", 4 * 96), CellPart("state", 1024, "minimal_state", unit="request")]
        return CellSize(parts=parts, sglang_bytes_per_token=4 * 96, num_layers=4)


@pytest.fixture
def minimal(tmp_path: Any) -> str:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "minimal"}')
    return str(path)


@pytest.mark.parametrize("page", [1, 16])
def test_the_core_builds_what_the_plan_charges(minimal: str, page: int) -> None:
    registry = isolated_registry(objects={"minimal": Minimal()})
    planned = plan(
        minimal, Serving(platform="cpu", page_size=page, max_running_requests=8), memory="64MiB", registry=registry
    )
    pools = build(planned, "meta", registry=registry)
    assert pools.provenance["build_pool"] == ("core",)
    assert isinstance(pools.kv_pool, BytePool)
    assert pools.allocated_by_pool() == {p.name: p.bytes for p in planned.pools}
    assert pools.allocated_bytes == planned.planned_bytes <= planned.budget.budget_bytes
    kv = pools.kv_pool.buffer("kv")
    assert tuple(kv.shape) == (planned.max_total_num_tokens + page, 384) and kv.dtype == torch.uint8
    assert tuple(pools.kv_pool.buffer("minimal_state").shape) == (8 + 1, 1024)  # row 0 pads


def test_rows_written_are_read_back(minimal: str) -> None:
    registry = isolated_registry(objects={"minimal": Minimal()})
    planned = plan(minimal, Serving(platform="cpu", page_size=16), memory="16MiB", registry=registry)
    pool = build(planned, "cpu", registry=registry).kv_pool
    loc = torch.tensor([17, 3, 40])
    rows = torch.randn(3, 4, 48, dtype=torch.bfloat16)  # 4 layers x 48 bf16 = 384 B per token
    pool.set_rows("kv", loc, rows)
    assert torch.equal(pool.get_rows("kv", loc).view(torch.bfloat16).reshape(3, 4, 48), rows)
    assert not pool.get_rows("kv", torch.tensor([0])).any()  # the padding slot stays zero


def test_a_pool_that_is_not_rows_is_refused(minimal: str) -> None:
    registry = isolated_registry(objects={"minimal": Minimal()})
    planned = plan(minimal, Serving(platform="cpu"), memory="16MiB", registry=registry)
    import attrs

    odd = attrs.evolve(planned.pool("kv"), bytes=planned.pool("kv").bytes + 1)
    sizing = attrs.evolve(planned.sizing, pools=[odd if p.name == "kv" else p for p in planned.pools])
    with pytest.raises(PoolPlanMismatchError, match=r"Pool 'kv'.*answers build_pool"):
        BytePool.from_plan(attrs.evolve(planned, sizing=sizing), "meta")


def test_architectures_with_their_own_stores_keep_them() -> None:
    pools = build(plan("llama-3.1-8b", Serving(platform="cpu"), memory="1GiB"), "meta")
    assert pools.provenance["build_pool"] == ("mha",) and not isinstance(pools.kv_pool, BytePool)
