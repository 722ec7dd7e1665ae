"""DeepSeek-V4's unified-KV buffers, allocated (``DeepSeekV4UnifiedKVPool``, SGLang 0.5.23 on ROCm).

Per stage layer one ``(rows, head_dim)`` bf16 buffer, or a ``(rows, 512)`` fp8 nope buffer and a ``(rows,
qk_rope)`` bf16 rope buffer (:mod:`.unified` has the shapes and cites SGLang); the draft worker's NextN layers keep
their ring rows alone.  The plan charges each buffer as its ring rows and its compressed rows
(:func:`.unified.unified_layout`), so :meth:`UnifiedKVBuffers.nbytes_by_pool` reports the same split.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from kvpools_core.pools.kv import allocate

from .unified import (
    DRAFT_UNIFIED_KV_POOL,
    DRAFT_UNIFIED_ROPE_POOL,
    UNIFIED_KV_POOL,
    UNIFIED_ROPE_POOL,
    UnifiedGeometry,
    compressed_name,
    ring_name,
)

__all__ = ["UnifiedKVBuffers", "unified_planned"]


def _buffers(u: UnifiedGeometry) -> list[tuple[str, bool, int, torch.dtype]]:
    """(name, draft, row width, dtype) of each buffer kind the geometry allocates."""
    kv = (u.kv_row_bytes, torch.float8_e4m3fn) if u.fp8 else (u.head_dim, torch.bfloat16)
    out = [(UNIFIED_KV_POOL, False, *kv), (DRAFT_UNIFIED_KV_POOL, True, *kv)]
    if u.fp8:
        out += [(UNIFIED_ROPE_POOL, False, u.rope_dim, torch.bfloat16)]
        out += [(DRAFT_UNIFIED_ROPE_POOL, True, u.rope_dim, torch.bfloat16)]
    return [entry for entry in out if u.layer_rows(entry[1])]


class UnifiedKVBuffers:
    """The unified rows of every stage layer (``kv_buffer``, ``kv_buffer_rope``) and of the draft's layers."""

    def __init__(self, geometry: UnifiedGeometry, device: str | torch.device) -> None:
        self.geometry = geometry
        self.swa_pages = geometry.swa_rows
        self.buffers: dict[str, list[Tensor]] = {
            name: [allocate((rows, width), dtype, device) for rows in geometry.layer_rows(draft)]
            for name, draft, width, dtype in _buffers(geometry)
        }
        self.kv_buffer = self.buffers[UNIFIED_KV_POOL]
        self.kv_buffer_rope = self.buffers.get(UNIFIED_ROPE_POOL)

    def nbytes_by_pool(self) -> dict[str, int]:
        """Each buffer's ring rows (the first ``swa_pages`` of every layer) and the rest, by plan pool name."""
        measured: dict[str, int] = {}
        for name, tensors in self.buffers.items():
            total = sum(t.numel() * t.element_size() for t in tensors)
            ring = sum(self.swa_pages * t.shape[1] * t.element_size() for t in tensors)
            measured[ring_name(name)] = ring
            if total - ring:
                measured[compressed_name(name)] = total - ring
        return measured


def unified_planned(u: UnifiedGeometry) -> Iterable[tuple[str, int, str]]:
    """``(pool, bytes, how)`` of each unified pool, for the plan check before allocating."""
    for name, draft, width, dtype in _buffers(u):
        item = torch.empty((), dtype=dtype).element_size()
        rows = u.layer_rows(draft)
        ring = u.swa_rows * width * item * len(rows)
        yield ring_name(name), ring, f"{len(rows)} layer(s) of {u.swa_rows} ring rows x {width} {dtype}"
        if sum(rows) * width * item - ring:
            yield compressed_name(name), sum(rows) * width * item - ring, f"compressed rows x {width} {dtype}"
