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
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

import attrs
import torch
from torch import Tensor

from kvpools_core.errors import BufferLayoutError, InvalidValueError, KvpoolsError, PoolPlanMismatchError

__all__ = [
    "CORE_LAYOUTS",
    "LAYER_MAJOR",
    "PER_LAYER",
    "BufferLayout",
    "BufferLayoutError",
    "BufferRequest",
    "LayerMajorLayout",
    "PerLayerLayout",
    "allocate",
    "allocate_buffers",
    "allocate_by_layer",
    "check_layout_bytes",
    "describe_layout",
]


def _int_tuple(values: Iterable[int]) -> tuple[int, ...]:
    return tuple(values)


@attrs.frozen(kw_only=True)
class BufferRequest:
    """What a store asks a layout for: the buffers of one role of one pool, one per layer.

    ``rows`` is the leading dimension of the canonical shape: token slots
    including the padding page for token-indexed buffers, pages for paged ones
    (DSA's indexer, whose row is one page of keys and scales).  ``layers`` are
    the ids the store addresses the layers by (global layer ids, or a
    sub-pool's local indices), in the order of the returned views.
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

    @property
    def shape(self) -> tuple[int, ...]:
        """The canonical shape of each layer's view: ``(rows, *row_shape)``."""
        return (self.rows, *self.row_shape)

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
    role, interleaved, page-major, aligned) is the layout's business.
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
    def allocate(self, request: BufferRequest) -> Sequence[Tensor]:
        """One zeroed view per layer of ``request.layers``, each ``(rows, *row_shape)``, in layer order."""

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

    The views of :data:`PER_LAYER` and :data:`LAYER_MAJOR` (exactly those classes) are not re-checked.
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
        raise BufferLayoutError(
            f"Buffer layout {describe_layout(layout)} returned {problem} for the {request.describe()}; "
            f"a layout returns one view per layer, each {request.shape} {request.dtype} on {request.device}, "
            f"not overlapping."
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


def _problem(views: object, request: BufferRequest) -> str | None:
    if not isinstance(views, (list, tuple)):
        return f"a {type(views).__name__}, not a list of tensors"
    if len(views) != request.num_layers:
        return f"{len(views)} buffer(s) for {request.num_layers} layer(s)"
    shape, dtype, device = request.shape, request.dtype, request.device
    for i, view in enumerate(views):
        if not isinstance(view, Tensor):
            return f"a {type(view).__name__} for layer {request.layers[i]}"
        if view.shape != shape or view.dtype != dtype:
            return f"a {tuple(view.shape)} {view.dtype} buffer for layer {request.layers[i]}"
        if view.device.type != device.type or (device.index is not None and view.device.index != device.index):
            return f"a buffer on {view.device} for layer {request.layers[i]}"
    if device.type != "meta" and len(views) > 1 and request.layer_nbytes:
        return _overlap(views, request)
    return None


def _overlap(views: Sequence[Tensor], request: BufferRequest) -> str | None:
    """Two layers sharing memory would overwrite each other's rows: exact for contiguous views, else distinct starts."""
    if all(view.is_contiguous() for view in views):
        spans = sorted((view.data_ptr(), i) for i, view in enumerate(views))
        for (start, i), (next_start, j) in itertools.pairwise(spans):
            if next_start < start + request.layer_nbytes:
                return f"overlapping buffers for layers {request.layers[i]} and {request.layers[j]}"
        return None
    starts = {view.data_ptr() for view in views}
    return None if len(starts) == len(views) else "buffers that share memory"
