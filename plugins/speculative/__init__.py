"""Speculative decoding: charge the draft model's KV cache in the target's cell size.

A new-style wrapper around ``estimate_cell_size``, so no architecture repeats
it.  SGLang scales the target's cell: EAGLE / EAGLE3 / STANDALONE / NEXTN by
``int(cell * (1 + D / L))``, DFLASH by ``ceil(cell * (L + D) / L)``; NGRAM
writes no draft KV.  kvpools' exact parts add a separate ``draft_kv`` pool of
``D`` layers of the target's per-layer geometry (SGLang's own assumption; an
architecture may name one draft layer's parts in ``CellSize.draft_layer_parts``),
which the draft worker allocates with its own padding page.  Only token parts
are scaled: the target's per-request, per-state-slot and fixed parts stay as
they are (the draft keeps no recurrent state of its own).
"""

from __future__ import annotations

from collections.abc import Generator

import attrs

from kvpools_core import hookimpl
from kvpools_core.values import TOKEN, CellPart, CellSize, ModelSpec, Serving

EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "STANDALONE", "NEXTN"})
DFLASH_FAMILY = frozenset({"DFLASH"})


@hookimpl(wrapper=True)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> Generator[None, CellSize | None, CellSize | None]:
    cell = yield
    if cell is None or cell.draft_included:
        return cell
    return with_draft(cell, serving)


def with_draft(cell: CellSize, serving: Serving) -> CellSize:
    """The cell with the draft model's KV added (unchanged without draft KV)."""
    algorithm = serving.speculative_algorithm
    draft_layers = serving.speculative_draft_num_layers or 0
    layers = cell.num_layers
    if algorithm not in EAGLE_FAMILY | DFLASH_FAMILY or draft_layers <= 0 or layers <= 0:
        return cell
    if algorithm in EAGLE_FAMILY:
        sglang = float(int(cell.sglang_bytes_per_token * (1 + draft_layers / layers)))
    else:
        sglang = float(-(-int(cell.sglang_bytes_per_token) * (layers + draft_layers) // layers))
    if cell.draft_layer_parts:  # the architecture says what one draft layer stores
        one_layer = tuple(part for part in cell.draft_layer_parts if part.unit == TOKEN)
        draft_parts = tuple(_draft_part(part, part.bytes_per_token * draft_layers) for part in one_layer)
    else:
        draft_parts = tuple(
            _draft_part(part, -(-part.bytes_per_token * draft_layers // layers)) for part in cell.parts_of(TOKEN)
        )
    return attrs.evolve(
        cell,
        parts=cell.parts + draft_parts,
        sglang_bytes_per_token=sglang,
        draft_included=True,
        notes=(*cell.notes, f"{algorithm} draft: {draft_layers} layer(s) beside the target's {layers}"),
    )


def _draft_part(part: CellPart, bytes_per_token: int) -> CellPart:
    """The draft pool's copy of a target part (same layout, ``draft_`` names)."""
    return attrs.evolve(part, name=f"draft_{part.name}", bytes_per_token=bytes_per_token, pool=f"draft_{part.pool}")
