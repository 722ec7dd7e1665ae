"""The core's default KV pool: every planned storage pool as rows of bytes.

An architecture that describes its storage with cell parts and sizes it with
the core (``default_size_pools``, or its own ``size_pools`` with
``kvpools_core.parts.sizing`` pools) gets its pools built without writing
``build_pool``: one ``(rows, bytes_per_slot)`` uint8 buffer per plan pool,
allocated through the build's buffer layout, exactly the planned bytes.  The
core cannot know a new architecture's row layout, so it hands out bytes; a
plugin views them as it needs (``buffer(name).view(dtype)``) or answers
``build_pool`` with a typed store (``kvpools_core.pools.mha`` and friends).

Pools other parts of a build own are left out: the request table
(``request``), allocators' free lists (``allocator``), index mappings
(``mapping``, written by allocators) and platform workspaces (``workspace``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kvpools_core.errors import PoolPlanMismatchError
from kvpools_core.pools.layout import PER_LAYER, BufferLayout, BufferRequest, allocate_by_layer
from kvpools_core.values import Plan, PoolSpec

__all__ = ["NOT_BUILT_HERE", "BytePool"]

NOT_BUILT_HERE = frozenset({"request", "allocator", "mapping", "workspace"})
"""Pool kinds another part of the build allocates (request table, allocators, the core's workspaces)."""
ROLE = "bytes"


class BytePool:
    """The plan's storage pools as ``(rows, bytes_per_slot)`` uint8 buffers, one per pool (slot 0.. rows - 1)."""

    def __init__(self, pools: list[PoolSpec], page_size: int, device: str | torch.device, layout: BufferLayout) -> None:
        self.device = torch.device(device)
        self.layout = layout
        requests = [_request(pool, page_size, self.device) for pool in pools]
        buffers = allocate_by_layer(layout, requests)
        self.buffers: dict[str, Tensor] = {pool.name: buffers[_role(pool)][0] for pool in pools}

    @classmethod
    def from_plan(cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None) -> BytePool:
        pools = [pool for pool in plan.pools if pool.kind not in NOT_BUILT_HERE]
        for pool in pools:
            if pool.bytes != (pool.slots + pool.padding_slots) * pool.bytes_per_slot:
                raise PoolPlanMismatchError(
                    f"Pool {pool.name!r} (owner {pool.owner!r}) plans {pool.bytes:,} B, not its rows "
                    f"({pool.slots:,} + {pool.padding_slots:,} padding) x {pool.bytes_per_slot:,} B per slot: the "
                    f"core's byte pool cannot lay it out. Its plugin answers build_pool for pools of another shape."
                )
        return cls(pools, plan.serving.page_size, device, layout or PER_LAYER)

    def buffer(self, name: str) -> Tensor:
        """Pool ``name``'s ``(rows, bytes_per_slot)`` uint8 buffer; row ``i`` is slot ``i`` (slot 0 pads)."""
        return self.buffers[name]

    def set_rows(self, name: str, loc: Tensor, rows: Tensor) -> None:
        """Write whole rows (any dtype, viewed as bytes) at slots ``loc``."""
        buffer = self.buffers[name]
        self.buffers[name][loc] = rows.contiguous().view(torch.uint8).reshape(len(loc), buffer.shape[1])

    def get_rows(self, name: str, loc: Tensor) -> Tensor:
        return self.buffers[name][loc]

    @property
    def nbytes(self) -> int:
        return sum(int(b.nbytes) for b in self.buffers.values())

    def nbytes_by_pool(self) -> dict[str, int]:
        return {name: int(b.nbytes) for name, b in self.buffers.items()}

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}: {tuple(b.shape)}" for name, b in self.buffers.items())
        return f"BytePool({shown}; layout {self.layout.name!r})"


def _role(pool: PoolSpec) -> str:
    return f"{ROLE}:{pool.name}"


def _request(pool: PoolSpec, page_size: int, device: torch.device) -> BufferRequest:
    token = pool.unit == "token"
    return BufferRequest(
        pool=pool.name,
        role=_role(pool),
        rows=pool.slots + pool.padding_slots,
        page_size=page_size if token and (pool.slots + pool.padding_slots) % page_size == 0 else 1,
        layers=(0,),
        row_shape=(pool.bytes_per_slot,),
        dtype=torch.uint8,
        device=device,
    )
