"""How a DSA store keeps its indexer keys: CUDA's fp8 pages, or plain rows of the KV dtype (and scale rows).

:class:`IndexStorage` carries what the plan's ``indexer`` pool parts name (:func:`index_storage`): the paged
layout of SGLang's ``IndexKeyCache`` (``page_size // index_kpool`` keys of 132 B per page, ``(slots + page + 1)
// page`` pages per layer) or the Ascend NPU's plain rows; :class:`kvpools_core.pools.dsa.DSATokenToKVPool`
allocates them.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.errors import ConfigError, PoolPlanMismatchError
from kvpools_core.options import option
from kvpools_core.parts.indexer import INDEX_BLOCK, INDEX_SCALE_BYTES, index_head_dim, index_kpool, index_pages
from kvpools_core.parts.names import INDEX_POOL
from kvpools_core.pools.kv import check_planned_bytes
from kvpools_core.pools.layout import BufferRequest
from kvpools_core.pools.quant import codec_for
from kvpools_core.values import TOKEN, Plan

__all__ = [
    "INDEX_ROWS_PART",
    "INDEX_SCALES_PART",
    "INDEX_SCALE_ROLE",
    "PAGED_INDEX_PART",
    "IndexStorage",
    "check_index_bytes",
    "index_request",
    "index_storage",
]

_SCALE_BYTES = INDEX_SCALE_BYTES
PAGED_INDEX_PART = "indexer"
"""The indexer part of a plan whose keys are CUDA's pages: fp8 keys and fp32 scales (132 B per token per layer)."""
INDEX_ROWS_PART = "index_k"
"""The indexer part of a plan whose keys are plain rows of the KV store dtype (SGLang NPU's ``index_k_buffer``)."""
INDEX_SCALES_PART = "index_k_scale"
"""Beside :data:`INDEX_ROWS_PART`: one fp32 scale per token slot, its own buffer (NPU's ``index_k_scale_buffer``)."""
INDEX_SCALE_ROLE = "index_k_scale"
"""The buffer role of those scales: rows of one fp32 (a layout carves it as it carves the key rows)."""


@attrs.frozen
class IndexStorage:
    """How a DSA store keeps the indexer keys: CUDA's fp8 pages, or plain rows of ``rows_dtype`` (and scale rows)."""

    index_head_dim: int
    rows_dtype: torch.dtype | None = None
    """None: paged fp8 keys and fp32 scales (:data:`PAGED_INDEX_PART`); else one row per slot of this dtype."""
    scale_dtype: torch.dtype | None = None
    """Plain rows only: one scale of this dtype per slot in a buffer of its own (:data:`INDEX_SCALES_PART`)."""
    kpool: int = 1
    """Paged only: tokens one pooled key spans (``index_kpool``); a page of ``P`` tokens holds ``P // kpool`` keys."""

    def __attrs_post_init__(self) -> None:
        if self.scale_dtype is not None and self.rows_dtype is None:
            raise ValueError("index scale rows need plain key rows (rows_dtype); paged keys carry their scales")
        if self.kpool != 1 and self.rows_dtype is not None:
            raise ValueError("pooled index keys (kpool > 1) are paged; plain index rows hold one key per token")

    @property
    def paged(self) -> bool:
        return self.rows_dtype is None

    @property
    def row_bytes(self) -> int:
        """Bytes per token per layer: 132 / kpool paged (index_head_dim 128), ``index_head_dim × element`` as rows."""
        if self.rows_dtype is None:
            return (self.index_head_dim + self.index_head_dim // INDEX_BLOCK * _SCALE_BYTES) // self.kpool
        return self.index_head_dim * self.rows_dtype.itemsize

    @property
    def scale_bytes(self) -> int:
        """Bytes per token per layer of the separate scale rows (0 without them)."""
        return 0 if self.scale_dtype is None else self.scale_dtype.itemsize

    def requests(
        self, pool: str, size: int, page_size: int, layers: Sequence[int], device: str | torch.device
    ) -> list[BufferRequest]:
        """The key request (:meth:`request`), then the scale rows' (``size + page_size`` rows of one scale)."""
        keys = self.request(pool, size, page_size, layers, device)
        if self.scale_dtype is None:
            return [keys]
        return [keys, attrs.evolve(keys, role=INDEX_SCALE_ROLE, row_shape=(1,), dtype=self.scale_dtype)]

    def request(
        self, pool: str, size: int, page_size: int, layers: Sequence[int], device: str | torch.device
    ) -> BufferRequest:
        """The owned layers' request: pages of ``page_size × 132`` bytes, or ``size + page_size`` plain rows."""
        if self.rows_dtype is None:
            return index_request(pool, size, page_size, self.row_bytes, layers, device)
        return BufferRequest(
            pool=pool,
            role="index_k",
            rows=size + page_size,
            page_size=page_size,
            layers=layers,
            row_shape=(1, self.index_head_dim),
            dtype=self.rows_dtype,
            device=device,
        )

    def nbytes(self, size: int, page_size: int, num_layers: int) -> int:
        """Bytes of ``num_layers`` layers' index buffers of ``size`` token slots: whole pages, or plain rows."""
        if self.rows_dtype is None:
            return index_pages(size, page_size) * page_size * self.row_bytes * num_layers
        return (size + page_size) * (self.row_bytes + self.scale_bytes) * num_layers

    def check(self, plan: Plan, pool: str, size: int, page_size: int, num_layers: int) -> None:
        """Refuse to build indexer buffers whose bytes differ from the plan's ``pool``."""
        if self.rows_dtype is None:
            check_index_bytes(plan, pool, size, page_size, self.row_bytes, num_layers)
            return
        rows = size + page_size
        scales = "" if self.scale_dtype is None else f" and {rows} {self.scale_dtype} scales"
        check_planned_bytes(
            pool,
            rows * (self.row_bytes + self.scale_bytes) * num_layers,
            plan.pool(pool).bytes,
            f"{num_layers} layer(s) of {rows} rows × {self.index_head_dim} {self.rows_dtype}{scales}",
        )


def index_storage(plan: Plan) -> IndexStorage:
    """The indexer storage the plan's ``indexer`` pool parts name.

    :data:`PAGED_INDEX_PART`, :data:`INDEX_ROWS_PART`, or :data:`INDEX_ROWS_PART`
    with :data:`INDEX_SCALES_PART` (fp32 scale rows beside fp8 key rows).
    Rows are stored in the KV store dtype (uint8 for fp8), so a KV dtype with
    block scales (fp4, mxfp8) has no plain index row and is refused; scale
    rows need fp8 keys (they are the scales of the fp8 values).
    """
    model = plan.model
    dim = index_head_dim(model)
    names = sorted({part.name for part in plan.cell.parts_of(TOKEN) if part.pool == INDEX_POOL})
    if names == [PAGED_INDEX_PART]:
        return IndexStorage(dim, kpool=index_kpool(model))
    if names in ([INDEX_ROWS_PART], [INDEX_ROWS_PART, INDEX_SCALES_PART]):
        kv = resolve_kv_dtype(plan.serving.kv_cache_dtype, model.dtype)
        codec = codec_for(kv)
        if codec.scale_shape(1, 1, dim) is not None:
            raise ConfigError(
                f"The plan stores DSA index keys as plain rows ({INDEX_ROWS_PART!r}) of the KV dtype, but "
                f"{kv.name} has block scales, so it has no plain row: plan with {option('kv_cache_dtype')} bf16 or "
                f"fp8_e4m3."
            )
        if INDEX_SCALES_PART not in names:
            return IndexStorage(dim, codec.store_dtype)
        if kv.name != "fp8_e4m3":
            raise ConfigError(
                f"The plan stores fp32 scales beside the DSA index key rows ({INDEX_SCALES_PART!r}), but the rows "
                f"are {kv.name}, which has no fp8 values to scale: plan with {option('kv_cache_dtype')} fp8_e4m3."
            )
        return IndexStorage(dim, codec.store_dtype, torch.float32)
    raise PoolPlanMismatchError(
        f"The plan's {INDEX_POOL!r} pool has the part(s) {names}, but a DSA store keeps its index keys as "
        f"{PAGED_INDEX_PART!r} (fp8 keys and fp32 scales per page), {INDEX_ROWS_PART!r} (plain rows of the KV "
        f"dtype) or both {INDEX_ROWS_PART!r} and {INDEX_SCALES_PART!r} (fp8 rows, fp32 scale rows). "
        f"Re-plan with this kvpools version, or report it to the plugin that sized the pool."
    )


def index_request(
    pool: str, size: int, page_size: int, index_row: int, layers: Sequence[int], device: str | torch.device
) -> BufferRequest:
    """The indexer's request: per layer, ``(pages, page_size × index row)`` uint8 (its rows are pages)."""
    return BufferRequest(
        pool=pool,
        role="index_k",
        rows=index_pages(size, page_size),
        page_size=page_size,
        layers=layers,
        row_shape=(page_size * index_row,),
        dtype=torch.uint8,
        device=device,
    )


def check_index_bytes(plan: Plan, pool: str, size: int, page_size: int, index_row: int, num_layers: int) -> None:
    """Refuse to build indexer buffers whose bytes differ from the plan's ``pool``."""
    pages = index_pages(size, page_size)
    check_planned_bytes(
        pool,
        pages * page_size * index_row * num_layers,
        plan.pool(pool).bytes,
        f"{num_layers} layer(s) of {pages} pages × {page_size} tokens × {index_row} B",
    )
