"""MLA and DSA models on Ascend NPUs: SGLang's ``NPUMLATokenToKVPool`` on NPUs before arch35.

SGLang's ascend attention backend builds every MLA-family model's KV cache as
one ``NPUMLATokenToKVPool`` (``_build_ascend_mla_kv_pool``):

* the latent row in two tensors, ``k_buffer (layers, size // P + 1, P, 1,
  kv_lora_rank)`` (the "nope" latent) and ``v_buffer (…, qk_rope_head_dim)``
  (the rope key), of the KV store dtype.  The bytes are the core MLA row's;
  only the carving differs, which the core's stores declare as the row's
  ``nope`` / ``rope`` column groups and a page-major layout splits
  (:class:`kvpools_core.pools.layout.PageMajorLayout`).  With fp8 KV the row
  stays unpacked (576 B per layer for DeepSeek-V3.2, not FlashMLA's 656);
* DSA's indexer keys as ``index_k_buffer (layers, size // P + 1, P, 1,
  index_head_dim)`` in the KV store dtype — 256 B per token per layer in
  bf16, 128 in fp8, where CUDA stores 132 (fp8 keys and an fp32 scale packed
  per page, ``(S + P + 1) // P`` pages).

:func:`estimate_cell_size` wraps the DSA architecture's answer for ascend plans
and rewrites those parts (:func:`npu_dsa_cell`): the indexer part becomes
``index_k`` (plain rows, no ``extra_slots``), which the core's DSA store reads
from the plan and builds.  It runs inside the speculative draft wrapper
(``trylast``) and gives the same cell outside it, so a DSA + MTP/EAGLE plan's
draft pool is the NPU's as well.  ``--accounting sglang`` keeps SGLang's own
(CUDA) cell unchanged: its configurator's NPU term is not modelled.

Not modelled (arch35 NPUs, ``is_npu_arch35``): the packed fp8 latent of the
quantised lightning indexer, its ``index_k_scale_buffer``, and the compact
indexer layer subset of ``_should_elide_dsa_index_k``; kvpools plans the
default NPU storage.  Refused (:func:`validate`): fp4 KV (the NPU's MLA pool
has no fp4 layout) and DSA's cache layer split (SGLang's NPU pool has none).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable

import attrs

from kvpools_ascend.names import PLATFORM
from kvpools_core import hookimpl
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.parts.indexer import index_row_bytes, layer_split
from kvpools_core.parts.latent import model_dims
from kvpools_core.values import CellPart, CellSize, ModelSpec, Serving

__all__ = ["estimate_cell_size", "validate"]

DSA_ARCHITECTURE = "dsa"
"""The DSA plugin's architecture (``ModelSpec.architecture``) whose cell the wrapper rewrites."""
LATENT_ARCHITECTURES = frozenset({"mla", DSA_ARCHITECTURE})
"""Architectures SGLang's ascend backend stores in ``NPUMLATokenToKVPool``."""
PAGED_INDEX_PART = "indexer"
"""CUDA's indexer part (``kvpools_core.pools.dsa.PAGED_INDEX_PART``; that module imports torch, planning must not)."""
INDEX_ROWS_PART = "index_k"
"""The plain-row indexer part the core's DSA store builds (``kvpools_core.pools.dsa.INDEX_ROWS_PART``)."""
PACKED_SCALE_PART = "latent_scale"
"""The fp32 block scales that only DSA's packed fp8 latent row has (``LatentRow.parts``)."""
PACKED_ROW_NOTE = "fp8 DSA latent row:"
"""How the DSA plugin's note on the packed fp8 row begins (the NPU stores no packed row)."""


@hookimpl(wrapper=True, trylast=True)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> Generator[None, CellSize | None, CellSize | None]:
    cell = yield
    if cell is None or serving.platform != PLATFORM or model.architecture != DSA_ARCHITECTURE:
        return cell
    return npu_dsa_cell(cell, model, serving)


@hookimpl
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    if serving.platform != PLATFORM or model.architecture not in LATENT_ARCHITECTURES:
        return None
    problems = []
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    if kv.is_fp4:
        problems.append(
            f"{option('kv_cache_dtype')} fp4_e2m1 is not supported for MLA models on ascend: SGLang's "
            f"NPUMLATokenToKVPool stores the latent and rope columns in the KV dtype and has no fp4 layout. "
            f"Use auto, bf16, fp16 or fp8_e4m3."
        )
    if model.architecture == DSA_ARCHITECTURE and layer_split(serving):
        problems.append(
            f"{option('enable_dsa_cache_layer_split')} is not supported on ascend: SGLang's NPUMLATokenToKVPool "
            f"keeps every layer of the stage on each rank. Leave it off, or plan for {option('platform')} cuda."
        )
    return problems


def npu_dsa_cell(cell: CellSize, model: ModelSpec, serving: Serving) -> CellSize:
    """A DSA cell as ``NPUMLATokenToKVPool`` stores it: plain index rows, the fp8 latent unpacked.

    Part by part (draft parts too, so it gives the same cell before or after
    the speculative wrapper added them): an ``indexer`` part of ``n`` layers
    becomes ``index_k`` of ``n × index_head_dim × element`` bytes with no
    ``extra_slots``; a packed fp8 latent (a pool with ``latent_scale``) loses
    its scales and keeps its rope in fp8.  ``sglang_bytes_per_token`` is kept.
    """
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    dims = model_dims(model)
    index_dim = int(model.layers[0].params["index_head_dim"])
    cuda_index, npu_index = index_row_bytes(model), index_dim * kv.element_bytes
    packed_pools = {part.pool for part in cell.parts if part.name.endswith(PACKED_SCALE_PART)}

    def rewrite(parts: Iterable[CellPart]) -> tuple[CellPart, ...]:
        out = []
        for part in parts:
            if part.name.endswith(PAGED_INDEX_PART):
                layers = part.bytes_per_token // cuda_index
                name = part.name[: -len(PAGED_INDEX_PART)] + INDEX_ROWS_PART
                out.append(attrs.evolve(part, name=name, bytes_per_token=layers * npu_index, extra_slots=0))
            elif part.pool in packed_pools and part.name.endswith(PACKED_SCALE_PART):
                continue
            elif part.pool in packed_pools and part.name.endswith("rope"):
                layers = part.bytes_per_token // (dims.qk_rope_head_dim * 2)  # the packed row's rope is bf16
                out.append(attrs.evolve(part, bytes_per_token=layers * dims.qk_rope_head_dim * kv.element_bytes))
            else:
                out.append(part)
        return tuple(out)

    note = (
        f"Ascend NPU (NPUMLATokenToKVPool): index keys as plain rows of {index_dim} {kv.name}, {npu_index} B per "
        f"token per layer in (S // P + 1) x P rows, where CUDA stores {cuda_index} B (fp8 keys and an fp32 scale "
        f"packed per page, (S + P + 1) // P pages); --accounting sglang keeps SGLang's CUDA cell"
    )
    if packed_pools:
        note += (
            f"; the fp8 latent unpacked, {dims.kv_lora_rank} + {dims.qk_rope_head_dim} B per layer "
            f"(FlashMLA's packed row on CUDA: {dims.kv_lora_rank + dims.kv_lora_rank // 128 * 4} + "
            f"{dims.qk_rope_head_dim * 2} B)"
        )
    return attrs.evolve(
        cell,
        parts=rewrite(cell.parts),
        draft_layer_parts=rewrite(cell.draft_layer_parts),
        notes=(*(n for n in cell.notes if not n.startswith(PACKED_ROW_NOTE)), note),
    )
