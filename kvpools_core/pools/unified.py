"""The unified memory pool's one arena (SGLang's ``UnifiedKVPool``): a ``uint8`` buffer and every sub-pool's
per-layer views carved from it, token-major (``layout/token_major.py``: all layers of one slot contiguous).

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

from kvpools_core.values import Arena, ArenaSubPool, Plan

__all__ = ["UnifiedArenaPool"]


class UnifiedArenaPool:
    """One arena of a plan (``plan.sizing.arenas``) on a device, with its sub-pools' views."""

    def __init__(self, arena: Arena, device: str | torch.device = "cpu") -> None:
        self.arena = arena
        self.device = torch.device(device)
        self.buffer = torch.empty(arena.bytes, dtype=torch.uint8, device=self.device)
        self.views: dict[str, list[list[Tensor]]] = {sub.pool: self._views(sub) for sub in arena.sub_pools}

    @classmethod
    def from_plan(cls, plan: Plan, device: str | torch.device) -> UnifiedArenaPool:
        (arena,) = plan.sizing.arenas
        return cls(arena, device)

    def _views(self, sub: ArenaSubPool) -> list[list[Tensor]]:
        """Each layer's row views (K, V or latent; the whole per-layer share for a state entry)."""
        slots = self.buffer[: sub.max_slots * sub.entry_bytes].view(sub.max_slots, sub.entry_bytes)
        rows = sub.row_bytes or (sub.entry_bytes // sub.layer_num,)
        layer_bytes = sum(rows)
        out = []
        for layer in range(sub.layer_num):
            start, views = layer * layer_bytes, []
            for width in rows:
                views.append(slots[:, start : start + width])
                start += width
            out.append(views)
        return out

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
