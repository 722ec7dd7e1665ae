"""The unified memory pool's one arena (SGLang's ``UnifiedKVPool``): a ``uint8`` buffer and every sub-pool's
per-layer views carved from it by the build's buffer layout (``BufferLayout.carve_arena``; by default SGLang's
token-major carving, ``layout/token_major.py``: all layers of one slot contiguous, on every platform).

A KV sub-pool of entry ``E`` over ``L`` layers sees the arena as ``max_slots`` rows of ``E`` bytes; layer ``l``'s
K (or latent) and V rows are the byte columns ``[l x row, (l + 1) x row)`` of each, so slot ``s`` of layer ``l``
lies at ``s x E + offset``.  A state sub-pool has one view of its whole entry per slot.  The views are raw
bytes (``uint8``): the dtype a kernel reads them as is its own.  Every sub-pool's views span the whole arena,
as SGLang's do; which slots hold what is the allocators' business (``kvpools_core.allocators.unified``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kvpools_core.errors import BufferLayoutError, KvpoolsError
from kvpools_core.pools.arena_carving import ArenaRequest, arena_carving_problem
from kvpools_core.pools.layout import PER_LAYER, BufferLayout, describe_layout
from kvpools_core.values import Arena, Plan

__all__ = ["UnifiedArenaPool", "carve_arena_views"]


def carve_arena_views(layout: BufferLayout, request: ArenaRequest) -> list[list[Tensor]]:
    """``layout.carve_arena(request)``, checked unless the layout keeps the core's carving (see
    :func:`~kvpools_core.pools.arena_carving.arena_carving_problem`); a defect is a ``BufferLayoutError``."""
    try:
        views = layout.carve_arena(request)
    except KvpoolsError:
        raise
    except Exception as exc:
        raise BufferLayoutError(
            f"Buffer layout {describe_layout(layout)} failed to carve the {request.describe()}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if type(layout).carve_arena is BufferLayout.carve_arena:  # the core's carving: trusted
        return views
    problem = arena_carving_problem(views, request)
    if problem is not None:
        sub = request.sub_pool
        raise BufferLayoutError(
            f"Buffer layout {describe_layout(layout)} carved the {request.describe()} wrongly: {problem}. "
            f"carve_arena returns, per layer, one uint8 view per row of the arena's buffer, "
            f"{sub.max_slots // sub.page_size * sub.page_size} rows each; fix the layout's carve_arena, or leave it "
            f"to the core's token-major carving."
        )
    return views


class UnifiedArenaPool:
    """One arena of a plan (``plan.sizing.arenas``) on a device, with its sub-pools' views."""

    def __init__(self, arena: Arena, device: str | torch.device = "cpu", *, layout: BufferLayout | None = None) -> None:
        self.arena = arena
        self.device = torch.device(device)
        self.layout = layout or PER_LAYER
        """The layout that carved the views (the build's ``buffer_layout``; the core's carving when None)."""
        self.buffer = torch.empty(arena.bytes, dtype=torch.uint8, device=self.device)
        self.views: dict[str, list[list[Tensor]]] = {
            sub.pool: carve_arena_views(self.layout, ArenaRequest(arena=arena, sub_pool=sub, buffer=self.buffer))
            for sub in arena.sub_pools
        }

    @classmethod
    def from_plan(
        cls, plan: Plan, device: str | torch.device, *, layout: BufferLayout | None = None
    ) -> UnifiedArenaPool:
        (arena,) = plan.sizing.arenas
        return cls(arena, device, layout=layout)

    def layer_views(self, pool: str, layer: int) -> list[Tensor]:
        """Layer ``layer``'s views of sub-pool ``pool`` (``[K, V]``, ``[latent]`` or ``[state]``)."""
        return self.views[pool][layer]

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)

    def nbytes_by_pool(self) -> dict[str, int]:
        return {self.arena.name: self.nbytes}

    def __repr__(self) -> str:
        subs: Any = ", ".join(f"{s.pool}({s.grows})" for s in self.arena.sub_pools)
        return f"UnifiedArenaPool({self.arena.bytes:,} B on {self.device}: {subs})"
