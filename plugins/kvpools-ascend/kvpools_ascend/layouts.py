"""The Ascend NPU buffer layout: SGLang's ``NPU*TokenToKVPool`` memory, carved from the core's requests.

SGLang's NPU pools (``hardware_backend/npu/memory_pool_npu.py``; reference
``sglang-pools.md`` §3.3) allocate ONE tensor per buffer kind for all layers,
page-major: ``NPUMHATokenToKVPool._create_buffers`` makes ``k_buffer =
zeros((layer_num, size // page_size + 1, page_size, head_num, head_dim))`` and
``v_buffer`` the same with ``v_head_dim`` ("continuous memory improves Ascend
transmission"); the SWA composite builds both sub-pools with that class
(``_build_ascend_swa_kv_pool``), ``NPUMiniMaxSparseKVPool`` its main, index-KV
and K-only index pools.  :class:`AscendLayout` carves every token-indexed
:class:`~kvpools_core.pools.layout.BufferRequest` so: one ``(layers, rows //
page_size, page_size, *row_shape)`` tensor per request, handing the stores
per-layer views of the canonical ``(rows, *row_shape)``.  With the core's
``rows = size + page_size`` that is exactly SGLang's ``(L, S // P + 1, P, H, D)``.
It is the core's :class:`~kvpools_core.pools.layout.PageMajorLayout`, so a
request with column groups (the MLA row's ``nope`` / ``rope``) gets one such
tensor per group: ``NPUMLATokenToKVPool``'s ``k_buffer`` / ``v_buffer``.

The NPU always allocates whole pages, ``(S // P + 1) x P`` rows for ``S + P``
canonical ones; rows that are not whole pages would make it allocate other
bytes than the plan charged, so :meth:`AscendLayout.nbytes` says so and the
core refuses the build (plans are page-aligned, so real plans never hit it).

The hybrid models' recurrent state (``plugins/mamba``) asks for it by slot
(``page_size`` 1) in roles this layout knows:

* ``conv`` — rows of ``(channels, window)`` (SGLang's CUDA ``(conv_dim, K - 1)``):
  the NPU keeps the window BEFORE the channels (``_init_npu_conv_state``:
  ``(Lm, pool, K - 1, channels)``, ``conv1d`` Ascend C ops want the channels
  last), so the tensor is ``(layers, rows, window, channels)`` and each
  layer's view is its transpose — canonical shape, NPU memory.
* ``conv_window_first`` (KDA's ``(K - 1, channels)``) and ``ssm`` (SGLang's
  ``temporal``): the NPU's memory is the canonical one, one ``(layers, rows,
  *row_shape)`` tensor.

With speculative decoding SGLang's NPU conv window is ``K - 1 + D - 1``
(``extra_conv_len = speculative_num_draft_tokens - 1``), bytes kvpools does
not plan: :func:`validate_layouts` refuses that combination instead of building
other memory.

Under ``--enable-unified-memory`` the layout carves the one arena with the core's token-major
``carve_arena`` (not overridden): SGLang 0.5.23's NPU builds the same in-tree ``UnifiedKVPool``
(``_init_pools`` refuses only out-of-tree platforms), not its page-major NPU pools.

An engine hands the NPU kernels the whole tensors: :func:`npu_tensor` (the
``(L, pages, P, H, D)`` or ``(L, slots, window, channels)`` tensor of any
layer's view).
"""

from __future__ import annotations

import math

from torch import Tensor

from kvpools_ascend.names import PLATFORM
from kvpools_core.errors import InvalidValueError, PoolPlanMismatchError
from kvpools_core.options import option
from kvpools_core.pools.layout import (
    BufferRequest,
    LayerBuffer,
    PageMajorLayout,
    allocate,
    allocate_page_major,
)

__all__ = ["ASCEND_LAYOUT", "AscendLayout", "npu_tensor"]

CONV_ROLE = "conv"
"""Recurrent conv state, rows of ``(channels, window)``: the NPU stores them ``(window, channels)``."""
WINDOW_FIRST_CONV_ROLE = "conv_window_first"
"""Conv state already window-first, ``(window, channels)`` (KDA): the NPU's memory is the canonical one."""
SSM_ROLE = "ssm"
"""Recurrent SSM (SGLang's ``temporal``) state: one ``(layers, slots, *row_shape)`` tensor on the NPU too."""
LAYER_MAJOR_STATE_ROLES = frozenset({WINDOW_FIRST_CONV_ROLE, SSM_ROLE})
STATE_ROLES = frozenset({CONV_ROLE, *LAYER_MAJOR_STATE_ROLES})
"""Roles indexed by state slot, not token: never paged."""


class AscendLayout(PageMajorLayout):
    """SGLang's NPU carving: one page-major ``(layers, pages, page, *row)`` tensor per request; conv window first.

    The core's :class:`~kvpools_core.pools.layout.PageMajorLayout` carving
    (which also splits a request's column groups into one tensor each: the
    NPU MLA pool's latent ``k_buffer`` and rope ``v_buffer``), plus the NPU's
    whole pages and its recurrent state.  Stateless; the whole tensor of any
    returned view is :func:`npu_tensor` (its ``_base``).
    """

    name = PLATFORM

    def nbytes(self, request: BufferRequest) -> int:
        """The NPU's bytes: whole pages for token-indexed buffers (``rows // page_size`` of them), else canonical."""
        if request.role in STATE_ROLES:
            return request.nbytes
        npu_rows = (request.rows // request.page_size) * request.page_size  # (S // P + 1) x P for rows = S + P
        return npu_rows * math.prod(request.row_shape) * request.dtype.itemsize * request.num_layers

    def allocate(self, request: BufferRequest) -> list[LayerBuffer]:
        if not request.layers:
            return []
        layers, rows, row_shape = request.num_layers, request.rows, request.row_shape
        dtype, device = request.dtype, request.device
        if request.role == CONV_ROLE:
            if len(row_shape) != 2:
                raise InvalidValueError(
                    f"The ascend layout stores a {CONV_ROLE!r} request's (channels, window) rows window first, but "
                    f"the {request.describe()} has rows of {row_shape}: ask for 2-D (channels, window) rows."
                )
            channels, window = row_shape
            whole = allocate((layers, rows, window, channels), dtype, device)
            return list(whole.transpose(-1, -2).unbind(0))
        if request.role in LAYER_MAJOR_STATE_ROLES:
            return list(allocate((layers, *request.shape), dtype, device).unbind(0))
        page = request.page_size
        if rows % page:
            raise PoolPlanMismatchError(
                f"The ascend layout allocates whole pages of {page} rows ((size // page_size + 1) x page_size, "
                f"SGLang's NPU pools), but the {request.describe()} has {rows} rows: the NPU would allocate "
                f"{rows // page * page}, bytes the plan did not charge. Plan that pool in whole pages of "
                f"{option('page_size')}, or build it for another platform."
            )
        return allocate_page_major(request)


ASCEND_LAYOUT = AscendLayout()


def npu_tensor(view: Tensor) -> Tensor:
    """The whole tensor an :class:`AscendLayout` view was carved from, shaped as SGLang's NPU pools hold it.

    ``(layers, pages, page_size, *row_shape)`` for a token-indexed view
    (``NPUMHATokenToKVPool.k_buffer``), ``(layers, slots, window, channels)``
    for a conv state view, ``(layers, slots, *row_shape)`` for the rest of the
    state; what an engine passes to the NPU kernels and transfer engines.
    """
    base = view._base
    shape = tuple(view.shape)
    if isinstance(base, Tensor) and base.dim() >= 2:
        whole = tuple(base.shape)
        if whole[1:] == shape:  # layer-major state
            return base
        if len(whole) == len(shape) + 2 and whole[1] * whole[2] == shape[0] and whole[3:] == shape[1:]:
            return base  # page-major
        if len(shape) == 3 and whole[1:] == (shape[0], shape[2], shape[1]):  # conv, window first
            return base
    raise InvalidValueError(
        f"npu_tensor: a {shape} tensor that the ascend buffer layout did not carve (its base is "
        f"{tuple(base.shape) if isinstance(base, Tensor) else None}); pass a buffer of a pool built for "
        f"platform {PLATFORM!r}."
    )
