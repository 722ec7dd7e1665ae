"""MLA and DSA models on Ascend NPUs: SGLang's ``NPUMLATokenToKVPool``, before and on arch35 NPUs.

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

Arch35 NPUs (``is_npu_arch35``; ``--plugin-option ascend.soc=arch35``, default
``a2``: every NPU before it).  SGLang's builder (``000_*.txt``
``_build_ascend_mla_kv_pool`` ~line 1558) passes, on arch35, the packed fp8
width ``calculate_mla_kv_cache_dim`` (656 for DeepSeek-V3.2) as
``kv_cache_dim`` when the KV dtype is fp8_e4m3, and the compact
``indexer_layer_ids`` (the stage's layers for which ``dsa_layer_skips_topk``
is false) when ``_should_elide_dsa_index_k`` holds.  What the pool makes of
them (``python/sglang/srt/hardware_backend/npu/memory_pool_npu.py`` of
sgl-project/sglang @ 003fca80, ``NPUMLATokenToKVPool.__init__``):

* the latent is packed only with ``enable_npu_quant_lightning_indexer``
  (``dsa_kv_cache_store_fp8``: the flag, and a ``kv_cache_dim`` other than
  ``R + r``); the builder does not pass that flag, so an arch35 pool keeps
  the unpacked row and no index scales — the ``a2`` bytes;
* the compact subset drops exactly the layers that reuse another layer's
  top-k (``index_topk_freq`` / ``index_skip_topk_offset`` /
  ``index_topk_pattern`` / ``indexer_types``), which the DSA plugin reads
  (``skips_topk`` layer params) and drops on CUDA where SGLang passes
  ``skip_topk_layers``: on arch35 the plan keeps CUDA's count of index
  layers, before arch35 (no compact layout) every stage layer's, and the
  draft worker every layer's;
* ``--plugin-option ascend.npu_quant_lightning_indexer=true`` (arch35, fp8
  KV, ``index_head_dim`` 128: the pool's own preconditions) models a pool
  built with that flag, which the reference builder never sets: the latent
  row as ``calculate_mla_kv_cache_dim`` gives it (packed 656 B: 512 fp8 +
  4 fp32 tile scales + 64 bf16, ``fp8_contracts.get_dsa_fp8_packed_cache_dim``;
  ``v_buffer`` of width 0), fp8 ``index_k`` rows and an
  ``index_k_scale_buffer (layers, S // P + 1, P, 1)`` of fp32 — the cell
  parts ``index_k`` and ``index_k_scale``, which the core's DSA store builds.
  The NPU orders the packed row nope | rope | scales
  (``_pack_dsa_fp8_kv_cache``), FlashMLA nope | scales | rope: same bytes and
  shapes, but the core's store writes FlashMLA's order.  Refused with a draft
  model: which flag the draft worker's pool gets is not in the reference.

Refused (:func:`validate`): fp4 KV (the NPU's MLA pool has no fp4 layout)
and DSA's cache layer split (SGLang's NPU pool has none).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable

import attrs

from kvpools_ascend.names import PLATFORM
from kvpools_core import hookimpl
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts.indexer import (
    SKIPS_TOPK,
    elides_index_k,
    index_layer_count,
    index_row_bytes,
    index_token_bytes,
    layer_split,
)
from kvpools_core.parts.latent import model_dims
from kvpools_core.values import CellPart, CellSize, ModelSpec, Serving

__all__ = ["estimate_cell_size", "plugin_options", "validate"]

SOC_OPTION = "ascend.soc"
A2, ARCH35 = "a2", "arch35"
SOCS = (A2, ARCH35)
"""``a2``: the NPUs before arch35 (Atlas A2/A3); ``arch35``: SGLang's ``is_npu_arch35()``."""
QUANT_INDEXER_OPTION = "ascend.npu_quant_lightning_indexer"
"""``NPUMLATokenToKVPool(enable_npu_quant_lightning_indexer=...)``: ``true`` or ``false`` (default)."""
QUANT_INDEXER_HEAD_DIM = 128
"""``NPUMLATokenToKVPool`` refuses the quantised lightning indexer for any other ``index_head_dim``."""
INDEX_SCALE_BYTES = 4
"""One fp32 scale per token per indexer layer (``index_k_scale_buffer``)."""

DSA_ARCHITECTURE = "dsa"
"""The DSA plugin's architecture (``ModelSpec.architecture``) whose cell the wrapper rewrites."""
LATENT_ARCHITECTURES = frozenset({"mla", DSA_ARCHITECTURE})
"""Architectures SGLang's ascend backend stores in ``NPUMLATokenToKVPool``."""
INDEX_SCALES_PART = "index_k_scale"
"""The fp32 scale rows beside fp8 ``index_k`` rows (``kvpools_core.pools.dsa.INDEX_SCALES_PART``)."""
PAGED_INDEX_PART = "indexer"
"""CUDA's indexer part (``kvpools_core.pools.dsa.PAGED_INDEX_PART``; that module imports torch, planning must not)."""
INDEX_ROWS_PART = "index_k"
"""The plain-row indexer part the core's DSA store builds (``kvpools_core.pools.dsa.INDEX_ROWS_PART``)."""
PACKED_SCALE_PART = "latent_scale"
"""The fp32 block scales that only DSA's packed fp8 latent row has (``LatentRow.parts``)."""
PACKED_ROW_NOTE = "fp8 DSA latent row:"
"""How the DSA plugin's note on the packed fp8 row begins (dropped where the NPU stores the row unpacked)."""


@hookimpl(wrapper=True, trylast=True)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> Generator[None, CellSize | None, CellSize | None]:
    cell = yield
    if cell is None or serving.platform != PLATFORM or model.architecture != DSA_ARCHITECTURE:
        return cell
    return npu_dsa_cell(cell, model, serving)


@hookimpl
def plugin_options() -> dict[str, str]:
    return {
        SOC_OPTION: f"the Ascend NPU generation: {A2} (default; NPUs before arch35) or {ARCH35} (SGLang's "
        f"is_npu_arch35: compact DSA indexer layers, the packed fp8 latent with the quantised indexer).",
        QUANT_INDEXER_OPTION: f"true to model NPUMLATokenToKVPool(enable_npu_quant_lightning_indexer=True) on "
        f"{SOC_OPTION}={ARCH35} with fp8_e4m3 KV (default false, as SGLang's builder): fp8 DSA index keys, one fp32 "
        f"scale per token per layer, and the packed fp8 latent (656 B per layer for DeepSeek-V3.2).",
    }


def soc(serving: Serving) -> str:
    """The ``ascend.soc`` plugin option (``a2`` when unset)."""
    return str(serving.plugin_options.get(SOC_OPTION, A2))


def quant_lightning_indexer(serving: Serving) -> bool:
    """Whether the plan models ``enable_npu_quant_lightning_indexer`` (``true`` / ``false``, bools accepted)."""
    return str(serving.plugin_options.get(QUANT_INDEXER_OPTION, "false")).lower() == "true"


@hookimpl
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    if serving.platform != PLATFORM:
        return None
    problems = option_problems(model, serving)
    if model.architecture not in LATENT_ARCHITECTURES:
        return problems
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    if kv.is_fp4:
        problems.append(
            f"{option('kv_cache_dtype')} {kv.name} is not supported for MLA models on ascend: SGLang's "
            f"NPUMLATokenToKVPool stores the latent and rope columns in the KV dtype and has no fp4 layout. "
            f"Use auto, bf16, fp16 or fp8_e4m3."
        )
    if model.architecture == DSA_ARCHITECTURE and layer_split(serving):
        problems.append(
            f"{option('enable_dsa_cache_layer_split')} is not supported on ascend: SGLang's NPUMLATokenToKVPool "
            f"keeps every layer of the stage on each rank. Leave it off, or plan for {option('platform')} cuda."
        )
    return problems


def option_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """The ascend plugin options' values, and the quantised indexer's preconditions (``NPUMLATokenToKVPool``'s)."""
    problems = []
    if soc(serving) not in SOCS:
        problems.append(
            f"{option('plugin_options')} {SOC_OPTION}={soc(serving)} is not an Ascend generation kvpools models: "
            f"use {' or '.join(SOCS)}."
        )
    flag = str(serving.plugin_options.get(QUANT_INDEXER_OPTION, "false")).lower()
    if flag not in ("true", "false"):
        problems.append(f"{option('plugin_options')} {QUANT_INDEXER_OPTION}={flag}: use true or false.")
    if not quant_lightning_indexer(serving):
        return problems
    where = f"{option('plugin_options')} {QUANT_INDEXER_OPTION}=true"
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    if soc(serving) != ARCH35:
        problems.append(
            f"{where} needs {SOC_OPTION}={ARCH35}: SGLang's quantised NPU indexer runs on arch35 NPUs only (it "
            f"needs their H128 buffer), and only there does the builder pass the packed fp8 width. Add "
            f"{option('plugin_options')} {SOC_OPTION}={ARCH35}, or drop {QUANT_INDEXER_OPTION}."
        )
    if model.architecture != DSA_ARCHITECTURE:
        problems.append(f"{where} applies to DSA models only (it is their indexer); {model.name!r} has none.")
    elif int(model.layers[0].params["index_head_dim"]) != QUANT_INDEXER_HEAD_DIM:
        problems.append(
            f"{where}: NPUMLATokenToKVPool requires index_head_dim={QUANT_INDEXER_HEAD_DIM} for the quantised "
            f"indexer, and {model.name!r} has {model.layers[0].params['index_head_dim']}. Drop the option."
        )
    if kv.name != "fp8_e4m3":
        problems.append(
            f"{where} requires {option('kv_cache_dtype')} fp8_e4m3 (NPUMLATokenToKVPool refuses the quantised "
            f"indexer with any other KV cache dtype), not {kv.name}."
        )
    if serving.speculative:
        problems.append(
            f"{where} is not supported with {option('speculative_algorithm')}: which indexer the draft worker's "
            f"NPUMLATokenToKVPool gets is not in SGLang's reference builder, so kvpools cannot size its pool. Drop "
            f"one of the two."
        )
    return problems


def npu_dsa_cell(cell: CellSize, model: ModelSpec, serving: Serving) -> CellSize:
    """A DSA cell as ``NPUMLATokenToKVPool`` stores it: plain index rows (and scales), the fp8 latent unpacked (or not).

    Part by part (draft parts too, so it gives the same cell before or after
    the speculative wrapper added them): an ``indexer`` part of ``n`` layers
    becomes ``index_k`` of ``n × index_head_dim × element`` bytes with no
    ``extra_slots``; without the quantised indexer a packed fp8 latent (a pool
    with ``latent_scale``) loses its scales and keeps its rope in fp8.  With the quantised lightning
    indexer (arch35) the latent stays as SGLang's ``calculate_mla_kv_cache_dim``
    gives it (packed unless a TRTLLM backend reads raw rows) and ``index_k``
    (fp8) is followed by ``index_k_scale`` of ``n × 4`` bytes.  The layer
    count is the planned one: the compact arch35 subset is every layer here
    (module docstring).  ``sglang_bytes_per_token`` is kept.
    """
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    dims = model_dims(model)
    index_dim = int(model.layers[0].params["index_head_dim"])
    cuda_index, npu_index = index_row_bytes(model), index_dim * kv.element_bytes
    start, end = rank_layer_range(model, serving)
    compact = soc(serving) == ARCH35 and elides_index_k(serving)  # _build_ascend_mla_kv_pool's indexer_layer_ids
    quantised = quant_lightning_indexer(serving)
    packed_pools = {part.pool for part in cell.parts if part.name.endswith(PACKED_SCALE_PART)}
    unpacked_pools = set() if quantised else packed_pools

    def rewrite(parts: Iterable[CellPart], every: int | None) -> tuple[CellPart, ...]:
        """``every``: the layers whose keys the target's NPU pool keeps (None: one draft layer's parts)."""
        out = []
        for part in parts:
            if part.name.endswith(PAGED_INDEX_PART):
                prefix = part.name[: -len(PAGED_INDEX_PART)]
                # CUDA's count (IndexShare layers dropped where SGLang drops them) is arch35's compact count and
                # the draft's; before arch35 the NPU pool keeps every layer's keys
                counted = part.bytes_per_token // index_token_bytes(model)
                layers = counted if prefix or compact or every is None else every
                out.append(
                    attrs.evolve(part, name=prefix + INDEX_ROWS_PART, bytes_per_token=layers * npu_index, extra_slots=0)
                )
                if quantised:
                    scales = layers * INDEX_SCALE_BYTES
                    out.append(
                        attrs.evolve(part, name=prefix + INDEX_SCALES_PART, bytes_per_token=scales, extra_slots=0)
                    )
            elif part.pool in unpacked_pools and part.name.endswith(PACKED_SCALE_PART):
                continue
            elif part.pool in unpacked_pools and part.name.endswith("rope"):
                layers = part.bytes_per_token // (dims.qk_rope_head_dim * 2)  # the packed row's rope is bf16
                out.append(attrs.evolve(part, bytes_per_token=layers * dims.qk_rope_head_dim * kv.element_bytes))
            else:
                out.append(part)
        return tuple(out)

    generation = "arch35, " if soc(serving) == ARCH35 else ""
    note = (
        f"Ascend NPU ({generation}NPUMLATokenToKVPool): index keys as plain rows of {index_dim} {kv.name}, "
        f"{npu_index} B per token per layer in (S // P + 1) x P rows"
    )
    if quantised:
        note += f" and one fp32 scale per token ({npu_index} + {INDEX_SCALE_BYTES} B, the quantised lightning indexer)"
    note += (
        f", where CUDA stores {cuda_index} B (fp8 keys and an fp32 scale packed per page, (S + P + 1) // P pages); "
        f"--accounting sglang keeps SGLang's CUDA cell"
    )
    shared = sum(bool(layer.params.get(SKIPS_TOPK)) for layer in model.layers[start:end])
    if compact and not shared:
        note += "; no layer shares top-k (IndexShare), so arch35's compact indexer layers are all of them"
    elif shared:
        note += (
            f"; arch35's compact indexer layers: {index_layer_count(model.layers[start:end], serving)} of "
            f"{end - start} (IndexShare)"
            if compact
            else "; every layer keeps its index keys (SGLang's NPU pool drops IndexShare layers on arch35 only)"
        )
    if unpacked_pools:
        note += (
            f"; the fp8 latent unpacked, {dims.kv_lora_rank} + {dims.qk_rope_head_dim} B per layer "
            f"(FlashMLA's packed row on CUDA: {dims.kv_lora_rank + dims.kv_lora_rank // 128 * 4} + "
            f"{dims.qk_rope_head_dim * 2} B)"
        )
    elif packed_pools:
        note += (
            f"; the fp8 latent packed as on CUDA, {dims.kv_lora_rank} fp8 + {dims.kv_lora_rank // 128 * 4} B of fp32 "
            f"scales + {dims.qk_rope_head_dim * 2} B of bf16 rope per layer in one k_buffer row (v_buffer of width 0; "
            f"the NPU orders it nope | rope | scales)"
        )
    keep_packed_note = quantised and bool(packed_pools)
    return attrs.evolve(
        cell,
        parts=rewrite(cell.parts, cell.num_layers),
        draft_layer_parts=rewrite(cell.draft_layer_parts, None),
        notes=(*(n for n in cell.notes if keep_packed_note or not n.startswith(PACKED_ROW_NOTE)), note),
    )
