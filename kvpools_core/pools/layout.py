"""Buffer layouts: the one override point for how a platform carves a store's backing memory.

Every store of :mod:`kvpools_core.pools` asks for its token-indexed buffers
as :class:`BufferRequest` values — one per *role* of a pool (``"k"``, ``"v"``,
``"k_scale"``, ``"latent"``, ``"index_k"``, ...), covering all the layers of
that role that share one row shape — and allocates them through the
:class:`BufferLayout` it was given.  A layout decides only the *carving*: it
returns one view per layer in the request's **canonical** shape ``(rows,
*row_shape)``, and the store keeps doing everything else on those views
(addressing by global layer id, slot 0 / padding page, writes and quantised
reads, draft pools).  So a platform never subclasses a pool nor sets its
private attributes (SGLang's ``_create_buffers``), and never reinterprets
positional shape arguments (vllm-ascend's ``get_kv_cache_shape``).

The layout a build uses comes from the ``buffer_layout`` hook: platform plugins
answer (``tryfirst``) for their own devices; the core answers :data:`PER_LAYER`.
The core checks every layout where it is used:

* before anything is allocated (:func:`check_layout_bytes`), that
  ``layout.nbytes(request)`` is the request's canonical bytes — the bytes the
  plan charged — else a :class:`~kvpools_core.errors.PoolPlanMismatchError`
  naming the layout and the pool;
* after it allocated (:func:`allocate_buffers`), that it returned one tensor
  per layer of the canonical shape, dtype and device, and (off ``meta``) that
  no two of them overlap, else a :class:`~kvpools_core.errors.BufferLayoutError`
  (skipped for the core's own two layouts, so the default path costs what
  allocating did before layouts).

A request may declare named **column groups** of its last dimension
(``column_groups=(("nope", 512), ("rope", 64))``: the MLA latent row).  A
layout may then return, for every layer, a **column split** instead of the
canonical view: a tuple of one tensor per group, ``(rows, *row_shape[:-1],
width)`` each, in the declared order (SGLang's Ascend NPU stores the latent
and the rope key of an MLA row as two tensors, which no view of one
``(rows, 1, 576)`` tensor can be).  The bytes are the canonical bytes; the
core checks the split's shapes, dtype, device and overlap as it checks views.
Only stores that declare groups read splits (:func:`allocate_split_by_layer`);
a request without groups is never split (:func:`allocate_buffers`).

A request may declare ``row_indexed_ok=True`` (the MHA store's ``k`` / ``v``):
a layout may then return, per layer, a :class:`RowIndexedBuffer` instead of a
view — a native tensor whose rows are permuted within it (ROCm AITER's
vectorized 5-d K ``(blocks, heads, dim // X, page, X)`` interleaves the
tokens of a page, so no ``(rows, heads, dim)`` view of it exists), read and
written by row through a locator that maps canonical rows to native indices.
The core checks it like a view (canonical shape, dtype, device, the native
tensor's bytes are the canonical ones, no two layers share storage) and
refuses it for every other request.  Only stores that address rows by
index and never slice them read such buffers (:func:`allocate_rows_by_layer`).
:class:`PageMajorLayout` is the core's carving for a platform that pages its
buffers ``(layers, pages, page_size, ...)`` and splits grouped requests.

Core layouts: :data:`PER_LAYER` (``"per_layer"``: one tensor per layer,
SGLang's NHD lists; the default) and :data:`LAYER_MAJOR` (``"layer_major"``:
one ``(layers, rows, *row_shape)`` tensor per request with per-layer views —
the memory of SGLang's Ascend NPU pools, which view it as ``(layers, pages,
page, heads, dim)``).
"""

from __future__ import annotations

import itertools
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import attrs
import torch
from torch import Tensor

from kvpools_core.errors import BufferLayoutError, InvalidValueError, KvpoolsError, PoolPlanMismatchError

if TYPE_CHECKING:
    from kvpools_core.pools.arena_carving import ArenaRequest

__all__ = [
    "CORE_LAYOUTS",
    "LAYER_MAJOR",
    "PER_LAYER",
    "BufferLayout",
    "BufferLayoutError",
    "BufferRequest",
    "ColumnSplit",
    "LayerBuffer",
    "LayerMajorLayout",
    "LayoutBuffer",
    "PageMajorLayout",
    "PerLayerLayout",
    "RowBuffer",
    "RowIndexedBuffer",
    "RowLocator",
    "allocate",
    "allocate_buffers",
    "allocate_by_layer",
    "allocate_layer_buffers",
    "allocate_page_major",
    "allocate_rows_by_layer",
    "allocate_split_by_layer",
    "check_layout_bytes",
    "describe_layout",
]

ColumnSplit: TypeAlias = tuple[Tensor, ...]
"""One layer's buffer as one tensor per column group of its request, ``(rows, *row_shape[:-1], width)`` each."""
RowLocator: TypeAlias = Callable[[Tensor], tuple[Any, ...]]
"""Canonical row ids ``(n,)`` (int64) -> the index of the native tensor that selects those rows, row by row."""


class RowIndexedBuffer:
    """One layer's buffer whose rows lie permuted in a native tensor: addressed by row index, never viewed.

    ``native`` is the storage (what kernels read, e.g. AITER's 5-d
    ``(blocks, heads, dim // X, page, X)`` K); ``shape`` the canonical
    ``(rows, *row_shape)`` the store addresses.  ``locate(rows)`` maps ``n``
    canonical row ids to an index of ``native`` (ints, slices, index tensors)
    such that ``native[locate(rows)]`` holds those rows as ``(n,
    *native_row_shape)``, element-for-element the canonical ``(n, *row_shape)``
    once reshaped.  So one function serves reads (``buffer[loc]`` gathers
    rows) and writes (``buffer[loc] = rows`` scatters them), and both agree by
    construction.  Gathers are copies, as any advanced indexing is.
    """

    __slots__ = ("_locate", "_native_row_shape", "native", "shape")

    def __init__(
        self, native: Tensor, shape: Sequence[int], locate: RowLocator, native_row_shape: Sequence[int]
    ) -> None:
        self.native = native
        self.shape = tuple(shape)
        self._locate = locate
        self._native_row_shape = tuple(native_row_shape)
        if not self.shape or math.prod(self._native_row_shape) != math.prod(self.shape[1:]):
            raise InvalidValueError(
                f"RowIndexedBuffer: native rows of {self._native_row_shape} do not hold canonical rows of "
                f"{self.shape[1:]} element for element; give the locator's row shape with as many elements."
            )

    @property
    def dtype(self) -> torch.dtype:
        return self.native.dtype

    @property
    def device(self) -> torch.device:
        return self.native.device

    @property
    def nbytes(self) -> int:
        """Bytes of the native storage (on ``meta`` too)."""
        return self.native.numel() * self.native.element_size()

    def numel(self) -> int:
        return self.native.numel()

    def element_size(self) -> int:
        return self.native.element_size()

    def view(self, dtype: torch.dtype) -> RowIndexedBuffer:
        """The same bytes as another dtype of the same size (uint8-stored fp8 read as fp8), rows located alike."""
        if dtype.itemsize != self.native.element_size():
            raise InvalidValueError(
                f"RowIndexedBuffer.view({dtype}): the rows are located per element of {self.dtype}, so only a "
                f"dtype of the same size ({self.native.element_size()} B) reinterprets them; view the native tensor."
            )
        return RowIndexedBuffer(self.native.view(dtype), self.shape, self._locate, self._native_row_shape)

    def __getitem__(self, index: Any) -> Tensor:
        """The rows at ``index`` (int64 / bool tensor, int, slice), gathered as ``(*index_shape, *row_shape)``."""
        rows = self._rows(index)
        gathered = self.native[self._locate(rows.reshape(-1))]
        return gathered.reshape(*rows.shape, *self.shape[1:])

    def __setitem__(self, index: Any, value: Tensor | float) -> None:
        """Scatter ``value`` (broadcast to ``(*index_shape, *row_shape)``) into the rows at ``index``."""
        rows = self._rows(index)
        flat = rows.reshape(-1)
        data = torch.as_tensor(value, dtype=self.dtype, device=self.device)
        self.native[self._locate(flat)] = data.expand(*rows.shape, *self.shape[1:]).reshape(
            flat.shape[0], *self._native_row_shape
        )

    def _rows(self, index: Any) -> Tensor:
        if isinstance(index, Tensor) and index.dtype != torch.bool:
            return index.to(device=self.device, dtype=torch.int64)
        return torch.arange(self.shape[0], device=self.device)[index]

    def __repr__(self) -> str:
        return f"RowIndexedBuffer(shape={self.shape}, dtype={self.dtype}, native={tuple(self.native.shape)})"


LayerBuffer: TypeAlias = Tensor | ColumnSplit
"""What a store reading column splits gets per layer: the canonical ``(rows, *row_shape)`` view, or a split."""
RowBuffer: TypeAlias = Tensor | RowIndexedBuffer
"""What a store reading rows by index gets per layer: the canonical view, or a :class:`RowIndexedBuffer`."""
LayoutBuffer: TypeAlias = Tensor | ColumnSplit | RowIndexedBuffer
"""What a layout may return per layer (the split and the row-indexed buffer only where the request allows)."""


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


def _group_tuple(groups: Iterable[tuple[str, int]]) -> tuple[tuple[str, int], ...]:
    return tuple((name, width) for name, width in groups)


@attrs.frozen(kw_only=True)
class BufferRequest:
    """What a store asks a layout for: the buffers of one role of one pool, one per layer.

    ``rows`` is the leading dimension of the canonical shape: token slots
    including the padding page for token-indexed buffers, pages for paged ones
    (DSA's indexer, whose row is one page of keys and scales).  ``layers`` are
    the ids the store addresses the layers by (global layer ids, or a
    sub-pool's local indices), in the order of the returned views.
    ``column_groups`` (optional) names consecutive column ranges of the last
    dimension, ``(name, width)`` in order, summing to ``row_shape[-1]``: a
    store that declares them reads a layout's column split (see
    :class:`BufferLayout`); one that does not is never given one.
    """

    pool: str
    """The plan's pool name (``kv``, ``draft_kv``, ``kv_swa``, ``indexer``, ...)."""
    role: str
    """What the buffers hold; an open set: ``k``, ``v``, ``k_scale``, ``v_scale``, ``latent``,
    ``latent_scale``, ``index_k``, ``index_v``, ..."""
    rows: int
    page_size: int
    layers: tuple[int, ...] = attrs.field(converter=_int_tuple)
    row_shape: tuple[int, ...] = attrs.field(converter=_int_tuple)
    dtype: torch.dtype
    device: torch.device = attrs.field(converter=torch.device)
    column_groups: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_group_tuple)
    row_indexed_ok: bool = False
    """Whether the store reads these buffers only by row index (``buf[loc]``, ``buf[loc] = x``), so a layout may
    return :class:`RowIndexedBuffer` s for them; a store that slices or views its buffers leaves it False."""

    def __attrs_post_init__(self) -> None:
        sizes = (self.rows, *self.row_shape)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
            raise InvalidValueError(
                f"BufferRequest.rows and row_shape must be integers >= 0, got {self.rows!r} and {self.row_shape!r}."
            )
        if not isinstance(self.page_size, int) or self.page_size < 1:
            raise InvalidValueError(f"BufferRequest.page_size must be a positive integer, got {self.page_size!r}.")
        if not isinstance(self.dtype, torch.dtype):
            raise InvalidValueError(f"BufferRequest.dtype must be a torch.dtype, got {self.dtype!r}.")
        if not isinstance(self.row_indexed_ok, bool):
            raise InvalidValueError(f"BufferRequest.row_indexed_ok must be a bool, got {self.row_indexed_ok!r}.")
        if self.column_groups:
            self._check_groups()

    def _check_groups(self) -> None:
        names = [name for name, _width in self.column_groups]
        widths = [width for _name, width in self.column_groups]
        if not all(isinstance(name, str) and name for name in names) or len(set(names)) != len(names):
            raise InvalidValueError(f"BufferRequest.column_groups need distinct non-empty names, got {names!r}.")
        if not all(isinstance(w, int) and not isinstance(w, bool) and w > 0 for w in widths):
            raise InvalidValueError(f"BufferRequest.column_groups widths must be integers >= 1, got {widths!r}.")
        if not self.row_shape or sum(widths) != self.row_shape[-1]:
            raise InvalidValueError(
                f"BufferRequest.column_groups {self.column_groups!r} must split the last dimension of row_shape "
                f"{self.row_shape!r}: their widths sum to {sum(widths)}."
            )

    @property
    def shape(self) -> tuple[int, ...]:
        """The canonical shape of each layer's view: ``(rows, *row_shape)``."""
        return (self.rows, *self.row_shape)

    @property
    def group_shapes(self) -> tuple[tuple[int, ...], ...]:
        """The shape of each group's tensor in a column split: ``(rows, *row_shape[:-1], width)``."""
        return tuple((self.rows, *self.row_shape[:-1], width) for _name, width in self.column_groups)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def layer_nbytes(self) -> int:
        """Bytes of one layer's canonical buffer."""
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """The canonical bytes of the request: what the plan charges for these buffers."""
        return self.layer_nbytes * self.num_layers

    def describe(self) -> str:
        """``'k' buffers of the 'kv' pool (32 layer(s) of (1025, 8, 128) torch.bfloat16)``, for messages."""
        return (
            f"{self.role!r} buffers of the {self.pool!r} pool ({self.num_layers} layer(s) of {self.shape} {self.dtype})"
        )


class BufferLayout(ABC):
    """How a platform carves the backing memory of a :class:`BufferRequest` (subclass it; set ``name``).

    A layout is stateless and shared by every store of a build.  ``allocate``
    returns one view per layer of ``request.layers``, each of the canonical
    shape ``(rows, *row_shape)``, ``request.dtype`` and ``request.device``,
    zeroed unless on ``meta`` (:func:`allocate` does that), the views not
    overlapping; how the views lie in memory (one tensor per layer, one per
    role, interleaved, page-major, aligned) is the layout's business.  For a
    request with ``column_groups`` it may instead return, for every layer (all
    or none), a column split: a tuple of one tensor per group, shapes
    ``request.group_shapes``, in group order — the same bytes, stored as
    separate tensors (:class:`PageMajorLayout` does).  For a request with
    ``row_indexed_ok`` it may return, for any layer, a
    :class:`RowIndexedBuffer` of the canonical shape whose native tensor holds
    the canonical bytes.
    ``nbytes`` says what ``allocate`` would allocate; it must equal the
    canonical ``request.nbytes`` (the bytes the plan charged), which the core
    checks before allocating anything.
    """

    name: str = ""
    """The layout's name in messages and build reports (``per_layer``, ``layer_major``, ``ascend_fia``, ...)."""

    def nbytes(self, request: BufferRequest) -> int:
        """Bytes ``allocate(request)`` allocates; by default the canonical bytes.

        Override it in a layout that pads or aligns: the core then refuses it
        (``PoolPlanMismatchError``), as the plan did not charge those bytes.
        """
        return request.nbytes

    @abstractmethod
    def allocate(self, request: BufferRequest) -> Sequence[LayoutBuffer]:
        """One zeroed view per layer of ``request.layers``, each ``(rows, *row_shape)`` (or a split / row-indexed)."""

    def carve_arena(self, request: ArenaRequest) -> list[list[Tensor]]:
        """One sub-pool's per-layer views carved from an arena's one ``uint8`` buffer (``--enable-unified-memory``).

        By default SGLang's token-major carving (:func:`~kvpools_core.pools.arena_carving.carve_token_major`),
        the one SGLang 0.5.23 builds on every platform; a platform that carves an arena otherwise overrides it,
        and the core checks its views (:func:`~kvpools_core.pools.arena_carving.arena_carving_problem`).
        """
        from kvpools_core.pools.arena_carving import carve_token_major

        return carve_token_major(request)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class PerLayerLayout(BufferLayout):
    """One tensor per layer, as SGLang's in-tree pools (``k_buffer[i]`` is ``(rows, heads, dim)``): the default."""

    name = "per_layer"

    def allocate(self, request: BufferRequest) -> list[Tensor]:
        shape, dtype, device = request.shape, request.dtype, request.device
        return [allocate(shape, dtype, device) for _ in request.layers]


class LayerMajorLayout(BufferLayout):
    """One ``(layers, rows, *row_shape)`` tensor per request; each layer's buffer is a view of it.

    The memory of SGLang's Ascend NPU pools, which allocate one ``(layers,
    pages, page, heads, dim)`` tensor per K / V (rows are whole pages, so it is
    the same bytes in the same order).  The whole tensor is the ``_base`` of
    any layer's view.
    """

    name = "layer_major"

    def allocate(self, request: BufferRequest) -> list[Tensor]:
        if not request.layers:
            return []
        whole = allocate((request.num_layers, *request.shape), request.dtype, request.device)
        return list(whole.unbind(0))


class PageMajorLayout(BufferLayout):
    """One ``(layers, rows // page_size, page_size, *row_shape)`` tensor per request, split by column group.

    SGLang's Ascend NPU carving (``NPUMHATokenToKVPool``, ``NPUMLATokenToKVPool``):
    the memory of :class:`LayerMajorLayout`, paged, and a request with
    ``column_groups`` gets one such tensor per group (the NPU's MLA
    ``k_buffer`` latent and ``v_buffer`` rope) and a column split per layer.
    A platform subclasses it (setting ``name``) or calls
    :func:`allocate_page_major` from its own ``allocate``.
    """

    name = "page_major"

    def allocate(self, request: BufferRequest) -> list[LayerBuffer]:
        return allocate_page_major(request)


def allocate_page_major(request: BufferRequest, *, split_columns: bool = True) -> list[LayerBuffer]:
    """Per layer, a view of one ``(layers, pages, page_size, *row_shape)`` tensor (one per group when split).

    A request with ``column_groups`` (and ``split_columns``) gets one tensor per
    group, ``(layers, pages, page_size, *row_shape[:-1], width)``, and a column
    split per layer.  Rows that are not a whole number of pages are not paged:
    ``(layers, rows, ...)``, the same memory.
    """
    if not request.layers:
        return []
    rows, page = request.rows, request.page_size
    lead = (request.num_layers, rows // page, page) if rows % page == 0 else (request.num_layers, rows)
    if not (split_columns and request.column_groups):
        whole = allocate((*lead, *request.row_shape), request.dtype, request.device)
        return list(whole.reshape(request.num_layers, *request.shape).unbind(0))
    groups = [
        allocate((*lead, *shape[1:]), request.dtype, request.device).reshape(request.num_layers, *shape).unbind(0)
        for shape in request.group_shapes
    ]
    return [tuple(views) for views in zip(*groups, strict=True)]


PER_LAYER = PerLayerLayout()
"""The default layout: one tensor per layer (what every store allocated before layouts existed)."""
LAYER_MAJOR = LayerMajorLayout()
"""One tensor per request, per-layer views (SGLang NPU's carving)."""
CORE_LAYOUTS: Mapping[str, BufferLayout] = MappingProxyType({PER_LAYER.name: PER_LAYER, LAYER_MAJOR.name: LAYER_MAJOR})
"""The core's layouts by name, for platforms that only pick one."""
_CORE_TYPES = (PerLayerLayout, LayerMajorLayout)


def allocate(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device) -> Tensor:
    """A zeroed buffer (SGLang zeroes its pools); on ``meta`` only the shape exists."""
    if torch.device(device).type == "meta":
        return torch.empty(shape, dtype=dtype, device=device)
    return torch.zeros(shape, dtype=dtype, device=device)


def describe_layout(layout: BufferLayout) -> str:
    """``'layer_major'``, or ``'ascend' (vendor_pkg.layouts.AscendLayout)`` for a layout outside the core."""
    cls = type(layout)
    if cls.__module__ == __name__:
        return repr(layout.name)
    return f"{layout.name!r} ({cls.__module__}.{cls.__qualname__})"


def check_layout_bytes(layout: BufferLayout, requests: Iterable[BufferRequest]) -> None:
    """Refuse, before anything is allocated, a layout that would allocate other bytes than the canonical ones."""
    for request in requests:
        try:
            claimed = layout.nbytes(request)
        except KvpoolsError:
            raise
        except Exception as exc:
            raise BufferLayoutError(
                f"Buffer layout {describe_layout(layout)} failed to size the {request.describe()}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if not isinstance(claimed, int) or isinstance(claimed, bool) or claimed != request.nbytes:
            raise PoolPlanMismatchError(
                f"The {request.pool!r} pool would allocate {claimed!r} B for its {request.role!r} buffers under "
                f"buffer layout {describe_layout(layout)}, but their canonical shape ({request.num_layers} "
                f"layer(s) of {request.shape} {request.dtype}) is {request.nbytes} B, which the plan charges. "
                f"A layout may carve the planned bytes differently but not add or drop any: fix the layout "
                f"(its nbytes and allocate), or use one whose bytes the plan charges."
            )


def allocate_buffers(layout: BufferLayout, request: BufferRequest) -> list[Tensor]:
    """``layout.allocate(request)``, checked: one view per layer of the canonical shape, dtype and device.

    For stores that read whole rows: a column split is refused (a request without groups never gets one).
    The views of :data:`PER_LAYER` and :data:`LAYER_MAJOR` (exactly those classes) are not re-checked.
    """
    buffers = allocate_layer_buffers(layout, request)
    if any(isinstance(buffer, tuple) for buffer in buffers):
        raise BufferLayoutError(
            f"Buffer layout {describe_layout(layout)} split the {request.describe()} by column group, but its "
            f"store reads whole rows: allocate it with allocate_split_by_layer (a store that reads splits)."
        )
    _refuse_row_indexed(layout, request, buffers, "views")
    return cast("list[Tensor]", buffers)


def _refuse_row_indexed(layout: BufferLayout, request: BufferRequest, buffers: Sequence[object], reads: str) -> None:
    """A store that set ``row_indexed_ok`` but reads its buffers through a function for stores that do not."""
    if any(isinstance(buffer, RowIndexedBuffer) for buffer in buffers):
        raise BufferLayoutError(
            f"Buffer layout {describe_layout(layout)} returned row-indexed buffers for the {request.describe()}, "
            f"but its store reads {reads}: allocate it with allocate_rows_by_layer (a store that reads rows by "
            f"index), or leave row_indexed_ok False in its requests."
        )


def allocate_layer_buffers(layout: BufferLayout, request: BufferRequest) -> list[LayoutBuffer]:
    """``layout.allocate(request)``, checked: per layer a canonical view, a column split or a row-indexed buffer.

    Splits only for requests with ``column_groups``, row-indexed buffers only for ``row_indexed_ok`` ones.
    """
    try:
        views = layout.allocate(request)
    except KvpoolsError:
        raise
    except Exception as exc:
        raise BufferLayoutError(
            f"Buffer layout {describe_layout(layout)} failed to allocate the {request.describe()}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if type(layout) in _CORE_TYPES:  # the core's own layouts: trusted, so the default path costs what it did
        return list(views)
    problem = _problem(views, request)
    if problem is not None:
        split = f", or (all layers) a split of {request.group_shapes}" if request.column_groups else ""
        rows = ", or a RowIndexedBuffer of that shape holding its bytes" if request.row_indexed_ok else ""
        raise BufferLayoutError(
            f"Buffer layout {describe_layout(layout)} returned {problem} for the {request.describe()}; "
            f"a layout returns one view per layer, each {request.shape} {request.dtype} on {request.device}"
            f"{split}{rows}, not overlapping."
        )
    return list(views)


def allocate_by_layer(layout: BufferLayout, requests: Iterable[BufferRequest]) -> dict[str, dict[int, Tensor]]:
    """A store's buffers: every request's bytes checked first, then each allocated; ``{role: {layer id: view}}``."""
    requests = list(requests)
    check_layout_bytes(layout, requests)
    buffers: dict[str, dict[int, Tensor]] = {}
    for request in requests:
        buffers.setdefault(request.role, {}).update(zip(request.layers, allocate_buffers(layout, request), strict=True))
    return buffers


def allocate_split_by_layer(
    layout: BufferLayout, requests: Iterable[BufferRequest]
) -> dict[str, dict[int, LayerBuffer]]:
    """As :func:`allocate_by_layer`, for a store that reads column splits of its grouped requests."""
    requests = list(requests)
    check_layout_bytes(layout, requests)
    buffers: dict[str, dict[int, LayerBuffer]] = {}
    for request in requests:
        allocated = allocate_layer_buffers(layout, request)
        _refuse_row_indexed(layout, request, allocated, "views and column splits")
        buffers.setdefault(request.role, {}).update(
            zip(request.layers, cast("list[LayerBuffer]", allocated), strict=True)
        )
    return buffers


def allocate_rows_by_layer(layout: BufferLayout, requests: Iterable[BufferRequest]) -> dict[str, dict[int, RowBuffer]]:
    """As :func:`allocate_by_layer`, for a store that reads rows by index: its ``row_indexed_ok`` requests may get
    :class:`RowIndexedBuffer` s (the others views).  Column splits are refused, as :func:`allocate_buffers` does."""
    requests = list(requests)
    check_layout_bytes(layout, requests)
    buffers: dict[str, dict[int, RowBuffer]] = {}
    for request in requests:
        allocated = allocate_layer_buffers(layout, request)
        if any(isinstance(buffer, tuple) for buffer in allocated):
            raise BufferLayoutError(
                f"Buffer layout {describe_layout(layout)} split the {request.describe()} by column group, but its "
                f"store reads whole rows: allocate it with allocate_split_by_layer (a store that reads splits)."
            )
        buffers.setdefault(request.role, {}).update(
            zip(request.layers, cast("list[RowBuffer]", allocated), strict=True)
        )
    return buffers


def _problem(views: object, request: BufferRequest) -> str | None:
    if not isinstance(views, (list, tuple)):
        return f"a {type(views).__name__}, not a list of tensors"
    if len(views) != request.num_layers:
        return f"{len(views)} buffer(s) for {request.num_layers} layer(s)"
    row_indexed = [
        layer for layer, view in zip(request.layers, views, strict=True) if isinstance(view, RowIndexedBuffer)
    ]
    if row_indexed and not request.row_indexed_ok:
        return (
            f"a row-indexed buffer for layer {row_indexed[0]}, whose store reads views (the request's "
            f"row_indexed_ok is False)"
        )
    splits = [isinstance(view, tuple) for view in views]
    if any(splits) and not request.column_groups:
        return "a column split (a tuple of tensors) for a request without column groups"
    if any(splits) and not all(splits):
        return "a column split for some layers only"
    tensors: list[tuple[int, Tensor]] = []  # (layer id, buffer): every group's of a split
    for i, view in enumerate(views):
        layer = request.layers[i]
        if isinstance(view, RowIndexedBuffer):
            problem = _row_indexed_problem(view, request, layer)
            if problem is not None:
                return problem
            tensors.append((layer, view.native))
            continue
        parts = view if isinstance(view, tuple) else (view,)
        shapes = request.group_shapes if isinstance(view, tuple) else (request.shape,)
        if len(parts) != len(shapes):
            return f"a split of {len(parts)} tensor(s) for layer {layer}, not one per group of {request.column_groups}"
        for part, shape in zip(parts, shapes, strict=True):
            problem = _tensor_problem(part, shape, request, layer)
            if problem is not None:
                return problem
        tensors += [(layer, part) for part in parts]
    if request.device.type != "meta" and len(tensors) > 1 and request.layer_nbytes:
        return _overlap(tensors)
    return None


def _tensor_problem(view: object, shape: tuple[int, ...], request: BufferRequest, layer: int) -> str | None:
    if not isinstance(view, (Tensor, RowIndexedBuffer)):
        return f"a {type(view).__name__} for layer {layer}"
    if view.shape != shape or view.dtype != request.dtype:
        return f"a {tuple(view.shape)} {view.dtype} buffer for layer {layer}"
    device = request.device
    if view.device.type != device.type or (device.index is not None and view.device.index != device.index):
        return f"a buffer on {view.device} for layer {layer}"
    return None


def _row_indexed_problem(buffer: RowIndexedBuffer, request: BufferRequest, layer: int) -> str | None:
    problem = _tensor_problem(buffer, request.shape, request, layer)
    if problem is not None:
        return f"row-indexed {problem.removeprefix('a ')}"
    if buffer.nbytes != request.layer_nbytes:
        return (
            f"a row-indexed buffer for layer {layer} whose native {tuple(buffer.native.shape)} tensor holds "
            f"{buffer.nbytes} B, not the {request.layer_nbytes} B of its canonical shape"
        )
    return None


def _overlap(tensors: Sequence[tuple[int, Tensor]]) -> str | None:
    """Two buffers sharing memory would overwrite each other's rows: exact for contiguous ones, else distinct starts.

    ``tensors`` are ``(layer id, buffer)`` of every layer (each group's buffer of a column split).
    """
    if all(view.is_contiguous() for _layer, view in tensors):
        spans = sorted((view.data_ptr(), view.data_ptr() + view.nbytes, layer) for layer, view in tensors)
        for (_start, end, layer), (next_start, _end, other) in itertools.pairwise(spans):
            if next_start < end:
                return f"overlapping buffers for layers {layer} and {other}"
        return None
    starts = {view.data_ptr() for _layer, view in tensors}
    return None if len(starts) == len(tensors) else "buffers that share memory"
