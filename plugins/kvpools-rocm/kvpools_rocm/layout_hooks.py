"""The ROCm plugin's layout hooks, kept apart from the layout so planning never imports torch.

``rocm.kv_cache_layout`` is SGLang's ``SGLANG_AITER_KV_CACHE_LAYOUT``: ``nhd``
(the default: one ``(rows, heads, dim)`` tensor per layer) or ``vectorized_5d``
(AITER's 5-d K / V, :mod:`kvpools_rocm.layouts`).  :func:`buffer_layout`
imports that torch-heavy module only when a build of such a plan asks;
:func:`validate_kv_cache_layout` refuses at planning time what SGLang asserts
when it allocates.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpools_core import hookimpl
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.values import LayerSpec, ModelSpec, Plan, Serving
from kvpools_rocm.layout_names import (
    KV_CACHE_LAYOUT_OPTION as KV_CACHE_LAYOUT_OPTION,
)
from kvpools_rocm.layout_names import (
    KV_CACHE_LAYOUTS as KV_CACHE_LAYOUTS,
)
from kvpools_rocm.layout_names import (
    NHD as NHD,
)
from kvpools_rocm.layout_names import (
    VECTOR_BYTES as VECTOR_BYTES,
)
from kvpools_rocm.layout_names import (
    VECTORIZED_5D as VECTORIZED_5D,
)

if TYPE_CHECKING:
    from kvpools_core.pools.layout import BufferLayout

__all__ = ["buffer_layout", "validate_kv_cache_layout"]

PLATFORM = "rocm"
VECTORIZED_PAGE_SIZE = 64
"""SGLang's default page size under ``vectorized_5d`` (``_page_size_default``), suggested when a page is refused."""


def kv_cache_layout(serving: Serving) -> str:
    return str(serving.plugin_options.get(KV_CACHE_LAYOUT_OPTION, NHD))


@hookimpl(tryfirst=True)
def buffer_layout(plan: Plan, device: str) -> BufferLayout | None:
    """AITER's vectorized 5-d K / V for plans made for ``rocm`` with ``rocm.kv_cache_layout=vectorized_5d``."""
    if plan.serving.platform != PLATFORM or kv_cache_layout(plan.serving) != VECTORIZED_5D:
        return None
    from kvpools_rocm.layouts import AITER_VECTORIZED_LAYOUT

    return AITER_VECTORIZED_LAYOUT


@hookimpl(specname="validate")
def validate_kv_cache_layout(model: ModelSpec, serving: Serving) -> list[str] | None:
    """An unknown ``rocm.kv_cache_layout``, and what SGLang asserts for ``vectorized_5d``.

    SGLang asserts ``page_size % X``, ``head_dim % X`` and ``v_head_dim % X``
    (``X = 16 // store itemsize``) for its MHA pool.  Its FP4 and MXFP8 MHA
    pools are other classes with block-scale buffers, for which the reference
    documents no 5-d layout: kvpools refuses those dtypes with the option
    rather than build memory SGLang may not.  MLA models have no MHA pool
    (the layout leaves their buffers per layer), so only MHA layers are checked.
    """
    if serving.platform != PLATFORM or KV_CACHE_LAYOUT_OPTION not in serving.plugin_options:
        return None
    layout = kv_cache_layout(serving)
    given = f"{option('plugin_options')} {KV_CACHE_LAYOUT_OPTION}={layout}"
    if layout not in KV_CACHE_LAYOUTS:
        return [
            f"{given}: unknown KV cache layout; choose one of {', '.join(KV_CACHE_LAYOUTS)} (SGLang's "
            f"SGLANG_AITER_KV_CACHE_LAYOUT)."
        ]
    if layout != VECTORIZED_5D:
        return None
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    if kv.scale_block is not None:
        return [
            f"{given} with {option('kv_cache_dtype')} {kv.name}: SGLang's block-scaled MHA pools (FP4, MXFP8) "
            f"allocate their own data and scale buffers, with no documented 5-d layout. Use "
            f"{KV_CACHE_LAYOUT_OPTION}={NHD}, or an unscaled KV dtype (bf16, fp16, fp8_e4m3, fp8_e5m2)."
        ]
    x = VECTOR_BYTES // kv.element_bytes
    problems = []
    if serving.page_size % x:
        problems.append(
            f"{given}: {option('page_size')} {serving.page_size} is not a multiple of X = 16 // itemsize = {x} "
            f"({kv.name}), which AITER's 5-d K / V blocks need (SGLang asserts page_size % X == 0). Use "
            f"{option('page_size')} a multiple of {x} (SGLang's default under this layout is "
            f"{VECTORIZED_PAGE_SIZE}), or {KV_CACHE_LAYOUT_OPTION}={NHD}."
        )
    dims = sorted({(layer.head_dim, layer.v_head_dim or layer.head_dim) for layer in _mha_layers(model)})
    bad = [(d, dv) for d, dv in dims if d % x or dv % x]
    if bad:
        problems.append(
            f"{given}: {model.name} has MHA layers with (head_dim, v_head_dim) {bad}, not multiples of X = 16 // "
            f"itemsize = {x} ({kv.name}) as AITER's 5-d K / V need (SGLang asserts head_dim % X == 0 and "
            f"v_head_dim % X == 0). Use {KV_CACHE_LAYOUT_OPTION}={NHD} for this model."
        )
    return problems


def _mha_layers(model: ModelSpec) -> list[LayerSpec]:
    """Layers of K / V rows (MLA layers keep a latent row, which no MHA pool stores)."""
    return [
        layer
        for layer in model.layers
        if layer.num_kv_heads > 0 and layer.head_dim > 0 and "kv_lora_rank" not in layer.params
    ]
