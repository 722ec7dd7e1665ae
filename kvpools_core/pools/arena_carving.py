"""Carving an arena's sub-pools: the request a buffer layout answers, and SGLang's token-major carving.

A plan whose pools share one arena (``--enable-unified-memory``) is built as one ``uint8`` tensor
(:class:`kvpools_core.pools.unified.UnifiedArenaPool`); each sub-pool's per-layer views are carved from it by
the build's buffer layout (the ``buffer_layout`` hook's answer), through
:meth:`kvpools_core.pools.layout.BufferLayout.carve_arena`, one :class:`ArenaRequest` per sub-pool.  The core's
carving, :func:`carve_token_major`, is SGLang 0.5.23's on every platform it builds the pool for
(``layout/token_major.py`` ``build_dense_views``, ``UnifiedKVPool._build_mha_views``): slot ``s`` of layer ``l``'s
row ``r`` lies at ``s x entry + l x sum(rows) + sum(rows[:r])``; a state entry whose rows are its parts
(``row_order="part"``, ``build_mamba_entry_views``) at ``s x entry + L x sum(rows[:r]) + l x rows[r]``
(``ArenaSubPool.row_offset``).  SGLang's unified MHA pool names its layout
explicitly (``kv_cache_layout="page_major"``, which "wins over the platform default", ``memory_pool.py``), so the
ROCm AITER 5-d layout, HND and the NPU's page-major pools never apply to an arena; and an out-of-tree platform is
refused (``reject_out_of_tree_path``).  A platform that carves an arena otherwise overrides ``carve_arena``; the
core then checks what it returns (:func:`arena_carving_problem`).
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from kvpools_core.values import Arena, ArenaSubPool

__all__ = ["ArenaRequest", "arena_carving_problem", "carve_token_major"]


@attrs.frozen(kw_only=True)
class ArenaRequest:
    """What the core asks a buffer layout for: one sub-pool's per-layer views carved from the arena's buffer.

    ``buffer`` is the arena's one ``uint8`` tensor (``arena.bytes`` of it); ``sub_pool`` says the entry, the
    layers, each layer's rows (``row_bytes``: K and V, the latent, or a state entry's conv tensors and temporal
    state, part-major; empty: one opaque row per layer) and where they lie (``row_order``, ``row_offset``),
    ``max_slots`` and the page.  The answer is one list per layer of one ``uint8`` view per row
    (``[K, V]``, ``[latent]``, ``[conv_0, ..., temporal]``, ``[state]``), each ``(max_slots // page x page,
    row)`` bytes of ``buffer`` (or all ``max_slots`` rows).
    """

    arena: Arena
    sub_pool: ArenaSubPool
    buffer: Tensor = attrs.field(eq=False)

    @property
    def rows(self) -> tuple[int, ...]:
        """One layer's rows within an entry, in bytes (one row of ``entry // layers`` for a state entry)."""
        sub = self.sub_pool
        return sub.row_bytes or (sub.entry_bytes // sub.layer_num,)

    def describe(self) -> str:
        sub = self.sub_pool
        return (
            f"sub-pool {sub.pool!r} of arena {self.arena.name!r} ({sub.layer_num} layer(s) of rows {self.rows} B "
            f"in {sub.entry_bytes} B entries, {sub.max_slots} slots)"
        )


def carve_token_major(request: ArenaRequest) -> list[list[Tensor]]:
    """SGLang's carving: every slot one entry holding all layers' rows; views ``(rows, row)`` of stride entry, with
    SGLang's ``num_slots = max_slots // page x page`` rows (``_build_mha_views``: the whole pages of the index
    space; a state sub-pool's page is 1, so all ``max_slots``)."""
    sub = request.sub_pool
    rows_count = sub.max_slots // sub.page_size * sub.page_size
    slots = request.buffer[: rows_count * sub.entry_bytes].view(rows_count, sub.entry_bytes)
    out = []
    for layer in range(sub.layer_num):
        views = []
        for row, width in enumerate(request.rows):
            start = sub.row_offset(layer, row)
            views.append(slots[:, start : start + width])
        out.append(views)
    return out


def arena_carving_problem(views: object, request: ArenaRequest) -> str | None:
    """What is wrong with a layout's carving of ``request``, or None.

    One list per layer, one view per row; each a ``uint8`` tensor on the arena's device holding
    ``max_slots // page x page`` rows of its width (SGLang's whole pages; all ``max_slots`` rows are accepted
    too), inside the arena: on a real device its storage is the arena's and its bytes lie in
    ``[0, arena.bytes)``.  Views may overlap across sub-pools (each spans the whole arena, as SGLang's do).
    """
    sub, rows, buffer = request.sub_pool, request.rows, request.buffer
    if not isinstance(views, (list, tuple)) or len(views) != sub.layer_num:
        got = len(views) if isinstance(views, (list, tuple)) else type(views).__name__
        return f"{got} layer(s) for {sub.layer_num}"
    slot_counts = {sub.max_slots, sub.max_slots // sub.page_size * sub.page_size}
    for layer, layer_views in enumerate(views):
        if not isinstance(layer_views, (list, tuple)) or len(layer_views) != len(rows):
            return f"layer {layer}: not one view per row of {rows} B"
        for width, view in zip(rows, layer_views, strict=True):
            if not isinstance(view, Tensor) or view.dtype != torch.uint8:
                return f"layer {layer}: a {type(view).__name__} {getattr(view, 'dtype', '')}, not a uint8 view"
            if view.device.type != buffer.device.type or view.device.index != buffer.device.index:
                return f"layer {layer}: a view on {view.device}, not on the arena's {buffer.device}"
            if view.numel() not in {n * width for n in slot_counts}:
                whole = sub.max_slots // sub.page_size * sub.page_size
                return f"layer {layer}: a {tuple(view.shape)} view, not {whole} rows of {width} B"
            if buffer.device.type != "meta":
                problem = _outside(view, buffer)
                if problem is not None:
                    return f"layer {layer}: {problem}"
    return None


def _outside(view: Tensor, buffer: Tensor) -> str | None:
    if view.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr():
        return "a view of other memory than the arena's buffer"
    start = view.data_ptr() - buffer.data_ptr()
    end = start + sum((size - 1) * stride for size, stride in zip(view.shape, view.stride(), strict=True)) + 1
    if start < 0 or end > buffer.nbytes:
        return f"a view of bytes [{start}, {end}) outside the arena's [0, {buffer.nbytes})"
    return None
