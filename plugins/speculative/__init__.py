"""Speculative decoding: charge the draft model's KV cache in the target's cell size.

A new-style wrapper around ``estimate_cell_size``, so no architecture repeats
it.  SGLang scales the target's cell: EAGLE / EAGLE3 / STANDALONE / NEXTN by
``int(cell * (1 + D / L))``, DFLASH by ``ceil(cell * (L + D) / L)``; NGRAM
writes no draft KV.  That scaled cell is what ``--accounting sglang`` divides
the budget by, whatever the draft is.

What the draft really stores is added as ``draft_*`` token parts (pools of
their own, which the draft worker allocates with its own padding page).  With
a draft model of its own (``Serving.speculative_draft``, resolved by the
pipeline from ``--speculative-draft-model-path``) they are the token parts of
the draft's own cell, as its own architecture plugin estimated it, and the
cell records the difference from SGLang's scaling (``CellSize.draft``).
Without one (EAGLE heads, NEXTN MTP layers, ``--speculative-draft-num-layers``)
they are ``D`` layers of the target's per-layer geometry (SGLang's own
assumption; an architecture may name one draft layer's parts in
``CellSize.draft_layer_parts``).  Only token parts are added: the target's
per-request, per-state-slot and fixed parts stay as they are (the draft worker
shares the target's request table and keeps no recurrent state of its own).
"""

from __future__ import annotations

from collections.abc import Generator

import attrs

from kvpools_core import hookimpl
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.values import TOKEN, CellPart, CellSize, DraftCharge, ModelSpec, Serving

EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "STANDALONE", "NEXTN"})
DFLASH_FAMILY = frozenset({"DFLASH"})


@hookimpl(wrapper=True)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> Generator[None, CellSize | None, CellSize | None]:
    cell = yield
    if cell is None:
        return cell
    if cell.draft_included:
        if serving.speculative_draft is not None and _has_draft_kv(serving):
            raise UnsupportedCombinationError(
                f"{model.name} (architecture {model.architecture!r}) sizes its draft layers in its own pools, in its "
                f"own geometry; kvpools does not model a draft model of its own ({option('draft_model')} "
                f"{serving.speculative_draft.model.name}) beside them. Pass {option('speculative_draft_num_layers')} "
                f"{serving.speculative_draft.model.num_layers} instead."
            )
        return cell
    return with_draft(cell, serving)


def _has_draft_kv(serving: Serving) -> bool:
    return serving.speculative_algorithm in EAGLE_FAMILY | DFLASH_FAMILY and bool(serving.speculative_draft_num_layers)


def sglang_draft_cell(cell_bytes: float, layers: int, draft_layers: int, algorithm: str) -> float:
    """SGLang's cell with the draft: ``pool_configurator.py`` (``002_50706b73e02ffb67.txt`` lines 148-175)."""
    if algorithm in EAGLE_FAMILY:
        return float(int(cell_bytes * (1 + draft_layers / layers)))
    return float(-(-int(cell_bytes) * (layers + draft_layers) // layers))


def with_draft(cell: CellSize, serving: Serving) -> CellSize:
    """The cell with the draft model's KV added (unchanged without draft KV)."""
    algorithm = serving.speculative_algorithm
    draft_layers = serving.speculative_draft_num_layers or 0
    layers = cell.num_layers
    if algorithm is None or not _has_draft_kv(serving) or layers <= 0:
        return cell
    sglang = sglang_draft_cell(cell.sglang_bytes_per_token, layers, draft_layers, algorithm)
    own = serving.speculative_draft
    charge = None
    if own is not None:  # a draft model of its own: its own architecture's token parts
        draft_parts = tuple(_draft_part(part, part.bytes_per_token) for part in own.cell.parts_of(TOKEN))
        charge = DraftCharge(
            model=own.model.name,
            architecture=own.model.architecture,
            num_layers=draft_layers,
            exact_bytes_per_token=own.cell.bytes_per_token,
            own_sglang_bytes_per_token=own.cell.sglang_bytes_per_token,
            target_sglang_bytes_per_token=cell.sglang_bytes_per_token,
            sglang_bytes_per_token=sglang,
        )
        note = (
            f"{algorithm} draft {own.model.name} ({own.model.architecture}): {draft_layers} layer(s) of its own "
            f"geometry, {own.cell.bytes_per_token:,} B/token; SGLang's scaling charges "
            f"{charge.sglang_draft_bytes_per_token:,.0f} B/token ({draft_layers} of the target's {layers} layers)"
        )
    elif cell.draft_layer_parts:  # the architecture says what one draft layer stores
        one_layer = tuple(part for part in cell.draft_layer_parts if part.unit == TOKEN)
        draft_parts = tuple(_draft_part(part, part.bytes_per_token * draft_layers) for part in one_layer)
        note = f"{algorithm} draft: {draft_layers} layer(s) beside the target's {layers}"
    else:
        draft_parts = tuple(
            _draft_part(part, -(-part.bytes_per_token * draft_layers // layers)) for part in cell.parts_of(TOKEN)
        )
        note = f"{algorithm} draft: {draft_layers} layer(s) beside the target's {layers}"
    return attrs.evolve(
        cell,
        parts=cell.parts + draft_parts,
        sglang_bytes_per_token=sglang,
        draft_included=True,
        draft=charge,
        notes=(*cell.notes, note),
    )


def _draft_part(part: CellPart, bytes_per_token: int) -> CellPart:
    """The draft pool's copy of a part (same layout, ``draft_`` names)."""
    return attrs.evolve(part, name=f"draft_{part.name}", bytes_per_token=bytes_per_token, pool=f"draft_{part.pool}")
