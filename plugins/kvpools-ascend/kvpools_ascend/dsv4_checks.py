"""DeepSeek-V4 on Ascend NPUs: what SGLang refuses there (its words), what kvpools does not model (by name), the cell.

The buffers are :mod:`kvpools_ascend.dsv4`'s; this module answers ``validate``, ``plugin_options`` and the
``estimate_cell_size`` wrapper for DeepSeek-V4 plans on ``ascend`` under SGLang's accountings.
"""

from __future__ import annotations

from collections.abc import Generator

import attrs

from kvpools_ascend.dsv4 import (
    C128_PAGE_OPTION,
    DEFAULT_C128_PAGE,
    INDEX_ROW_EXTRA,
    SGLANG_ACCOUNTINGS,
    SGLANG_C128_PAGE,
    SGLANG_HISPARSE,
    SGLANG_ONLINE,
    SGLANG_STATE_DTYPE,
    SGLANG_TRTLLM,
    arch35,
    c128_page_size,
    kv_row,
    on_npu_dsv4,
    ring_size,
    write_pad,
)
from kvpools_ascend.names import PLATFORM
from kvpools_core import hookimpl
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.values import CellSize, ModelSpec, Serving

__all__ = ["npu_dsv4_cell", "npu_dsv4_problems", "ring_problems"]


# ---------------------------------------------------------------------------
# what SGLang refuses on NPU, and what kvpools does not model there
# ---------------------------------------------------------------------------


def npu_dsv4_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """SGLang 0.5.23's refusals of a DeepSeek-V4 server on an NPU (its words), and kvpools' own, by name."""
    o = option
    problems = []
    sglang = "SGLang's NPU DeepSeek-V4 pool refuses it"
    if serving.enable_hisparse:
        problems.append(
            f"{o('enable_hisparse')} on {PLATFORM}: {sglang} ('{SGLANG_HISPARSE}', DSV4NPUTokenToKVPool."
            f"_make_kv_pool). Drop {o('enable_hisparse')}."
        )
    if serving.enable_online_compress:
        problems.append(
            f"{o('enable_online_compress')} on {PLATFORM}: {sglang} ('{SGLANG_ONLINE}', _make_compress_state_pool). "
            f"Drop {o('enable_online_compress')}."
        )
    if serving.dsv4_compress_state_dtype != "float32":
        problems.append(
            f"{o('dsv4_compress_state_dtype')} {serving.dsv4_compress_state_dtype} on {PLATFORM}: SGLang asserts "
            f"'{SGLANG_STATE_DTYPE}' (NPUCompressStatePool). Use {o('dsv4_compress_state_dtype')} float32."
        )
    cps = c128_page_size(serving)
    if cps <= 0 or cps % 16:
        value = serving.plugin_options.get(C128_PAGE_OPTION)
        problems.append(
            f"{o('plugin_options')} {C128_PAGE_OPTION}={value}: SGLang raises "
            f"'{SGLANG_C128_PAGE.format(value=value)}' (DSV4NPUTokenToKVPool). Use a positive multiple of 16 "
            f"(SGLang's default {DEFAULT_C128_PAGE})."
        )
    if serving.dsv4_attn_backend == "trtllm":
        problems.append(
            f"{o('dsv4_attn_backend')} trtllm on {PLATFORM}: SGLang's NPU pool asserts '{SGLANG_TRTLLM}' (it builds "
            f"PA_ND rows only, _make_kv_pool). Drop {o('dsv4_attn_backend')}."
        )
    low = sorted({int(layer.params.get("compress_ratio", 0)) for layer in model.layers} & {1, 2})
    if low:
        problems.append(
            f"{model.name} has compress ratio(s) {low} (DeepSeek-V4.1's kv_source layers): on {PLATFORM} SGLang's "
            f"DSV4NPUTokenToKVPool._make_indexer_pool takes no force_fp4 argument, so building their fp4 indexer "
            f"pools fails (TypeError: unexpected keyword argument 'force_fp4'). Serve it on another platform."
        )
    not_modelled = []
    if serving.dsv4_kv_layout not in ("auto", "v4"):
        not_modelled.append(
            f"{o('dsv4_kv_layout')} {serving.dsv4_kv_layout} (SGLang's NPU pool builder passes no layout; which "
            f"layout its attention backend then reads is not in the reference)"
        )
    if serving.speculative and serving.speculative_algorithm != "EAGLE":
        not_modelled.append(
            f"{o('speculative_algorithm')} {serving.speculative_algorithm} (the NPU draft worker's DeepSeek-V4 "
            f"pool; EAGLE is modelled)"
        )
    elif serving.speculative:
        problems += ring_problems(model, serving)
    if serving.enable_hierarchical_cache:
        not_modelled.append(
            f"{o('enable_hierarchical_cache')} (the NPU host pools: PA_ND pages, the C128 sidecar's host pool)"
        )
    if serving.enable_encoder_swa_bounded_replay:
        not_modelled.append(f"{o('enable_encoder_swa_bounded_replay')} (the request window in NPU PA_ND rows)")
    if serving.dcp_size > 1:
        not_modelled.append(f"{o('dcp_size')} {serving.dcp_size} (the NPU pools under decode context parallelism)")
    problems += [
        f"kvpools does not model {what} for DeepSeek-V4 on {PLATFORM} yet. Drop it, or plan for another platform."
        for what in not_modelled
    ]
    return problems


def ring_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """``_assert_ring_serves_draft_tokens`` (``pool_configurator.py`` lines 1291-1307): a verify batch writes its
    draft tokens into the c4 / c128 state rings, which keep at most ``ring - window + 2`` of them."""
    drafts = serving.max_speculative_num_draft_tokens or 0
    start, end = rank_layer_range(model, serving)
    ratios = {int(layer.params.get("compress_ratio", 0)) for layer in model.layers[start:end]}
    problems = []
    for ratio in (4, 128):
        ring = ring_size(ratio, serving)
        most = write_pad(ratio, ring)
        if ratio in ratios and drafts > most:
            problems.append(
                f"{option('speculative_num_draft_tokens')} {drafts}: SGLang asserts 'speculative_num_draft_tokens="
                f"{drafts} exceeds what the c{ratio} compress state ring can keep resident (ring_size={ring} serves "
                f"at most {most} draft tokens).' (DSV4PoolConfigurator). Use at most {most}."
            )
    return problems


# ---------------------------------------------------------------------------
# the cell
# ---------------------------------------------------------------------------


def npu_dsv4_cell(cell: CellSize, model: ModelSpec, serving: Serving) -> CellSize:
    """The ``dsv4`` plugin's cell with the rows SGLang's NPU pool stores (SGLang's bytes per full token kept).

    KV rows become PA_ND rows (1024 B bf16 per layer; 640 B fp8 on arch35, where CUDA stores 584); the c4
    indexer row is the kept packed row plus the NPU's int8 key and fp16 scale (132 + 128 + 2 B; 132 + 128 + 4
    on arch35); the compressor states are unchanged (float32)."""
    nope = int(model.layers[0].params["qk_nope_head_dim"])
    rope = int(model.layers[0].params["qk_rope_head_dim"])
    index_dim = int(model.params.get("index_head_dim", 0))
    kv_dim, item = kv_row(serving, nope, rope)
    row = kv_dim * item
    cuda_row = nope + 2 * rope + 8
    packed_index = index_dim + index_dim // 128 * INDEX_ROW_EXTRA
    npu_index = packed_index + index_dim + (4 if arch35(serving) else 2)
    parts = []
    for part in cell.parts:
        if part.pool in ("kv_swa", "kv_c4", "kv_c128"):
            parts.append(attrs.evolve(part, bytes_per_token=part.bytes_per_token // cuda_row * row))
        elif part.pool == "c4_indexer":
            parts.append(attrs.evolve(part, bytes_per_token=part.bytes_per_token // packed_index * npu_index))
        else:
            parts.append(part)
    dtype = f"fp8 (A5 packed, {kv_dim} B)" if arch35(serving) else f"bf16 ({nope} + {rope} values)"
    note = (
        f"Ascend NPU (DSV4NPUTokenToKVPool): SWA / c4 / c128 rows are PA_ND {dtype}, {row} B per token per layer "
        f"where CUDA packs {cuda_row}; the c4 indexer keeps the packed {packed_index} B row and adds "
        f"{npu_index - packed_index} B ({'fp8 key, fp32 scale' if arch35(serving) else 'int8 key, fp16 scale'}); "
        f"SGLang's configurator still charges {cuda_row} B and {packed_index} B (its bytes per full token below); "
        f"{option('kv_cache_dtype')} does not change these rows: SGLang sets the NPU's DeepSeek-V4 KV cache to "
        "bfloat16 whatever it says (_deepseek_v4_kv_cache_dtype, arg_groups/overrides.py), and the row type "
        "follows ascend.soc"
    )
    notes = [n for n in cell.notes if not n.startswith(option("kv_cache_dtype"))]
    return attrs.evolve(cell, parts=tuple(parts), notes=(*notes, note))


# ---------------------------------------------------------------------------
# hooks
# ---------------------------------------------------------------------------


@hookimpl(specname="validate")
def validate_dsv4(model: ModelSpec, serving: Serving) -> list[str] | None:
    if not on_npu_dsv4(model, serving) or serving.accounting not in SGLANG_ACCOUNTINGS:
        return None
    return npu_dsv4_problems(model, serving)


@hookimpl(specname="plugin_options")
def dsv4_plugin_options() -> dict[str, str]:
    return {
        C128_PAGE_OPTION: f"SGLang's --c128-page-size: the physical page of the NPU DeepSeek-V4 c128 KV pool and its "
        f"allocator (a positive multiple of 16; default {DEFAULT_C128_PAGE})."
    }


@hookimpl(specname="estimate_cell_size", wrapper=True)
def estimate_dsv4_cell(model: ModelSpec, serving: Serving) -> Generator[None, CellSize | None, CellSize | None]:
    cell = yield
    if cell is None or not on_npu_dsv4(model, serving) or serving.accounting not in SGLANG_ACCOUNTINGS:
        return cell
    return npu_dsv4_cell(cell, model, serving)
