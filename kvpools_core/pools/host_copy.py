"""Host copies of KV rows: what SGLang's ``get_cpu_copy`` / ``load_cpu_copy`` do for a retracted request.

SGLang's ``MHATokenToKVPool.get_cpu_copy(indices)`` (``srt/mem_cache/memory_pool.py`` of 0.5.23, L2791-2811)
copies, layer by layer and in chunks of ``cpu_offloading_chunk_size`` (8,192) slots, the rows of the
given slots to host memory; ``load_cpu_copy(kv_cache_cpu, indices)`` writes them back into (new) slots.
Here one function pair does it for any list of row-indexed buffers (a pool's K, V, scales, latent rows),
so every kvpools pool gets it the same way: each buffer's rows are copied, not only K and V, so a pool
with scales (fp8 / fp4 caches) or a split latent round-trips exactly.  The copy is opaque to callers,
as SGLang's: hand it back to the same pool's ``load_cpu_copy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["HOST_COPY_CHUNK", "copy_rows_to_host", "load_rows_from_host"]

HOST_COPY_CHUNK = 8192
"""Slots per copy (SGLang's ``cpu_offloading_chunk_size``): bounds the temporary on the device."""


def copy_rows_to_host(buffers: Sequence[Any], indices: Tensor) -> list[list[Tensor]]:
    """Per buffer, the chunks of its rows at ``indices``, on the host."""
    index = _as_index(indices, buffers)
    copies = [
        [
            buffer[index[i : i + HOST_COPY_CHUNK]].to("cpu", non_blocking=True)
            for i in range(0, len(index), HOST_COPY_CHUNK)
        ]
        for buffer in buffers
    ]
    _synchronize(buffers)  # non-blocking device-to-host copies must land before the caller reads them
    return copies


def load_rows_from_host(buffers: Sequence[Any], copies: Sequence[Sequence[Tensor]], indices: Tensor) -> None:
    """Write ``copy_rows_to_host``'s result for the same buffers into rows ``indices``.

    The whole copy is checked against the buffers (count, chunks, row shape, dtype) before a row is written.
    """
    if not isinstance(copies, Sequence) or len(copies) != len(buffers):
        held = f"{len(copies)} buffers" if isinstance(copies, Sequence) else f"a {type(copies).__name__}"
        raise ValueError(
            f"load_cpu_copy(): the copy holds {held} but this pool has {len(buffers)}; "
            "load a copy into the pool that made it"
        )
    index = _as_index(indices, buffers)
    for buffer, chunks in zip(buffers, copies, strict=True):
        _check_chunks(buffer, chunks, len(index))
    for buffer, chunks in zip(buffers, copies, strict=True):
        for n, chunk in enumerate(chunks):
            start = n * HOST_COPY_CHUNK
            buffer[index[start : start + chunk.shape[0]]] = chunk.to(_device(buffer), non_blocking=True)
    _synchronize(buffers)


def _check_chunks(buffer: Any, chunks: Any, slots: int) -> None:
    """Refuse chunks that are not ``copy_rows_to_host``'s of ``slots`` rows of ``buffer``."""
    sizes = [min(HOST_COPY_CHUNK, slots - i) for i in range(0, slots, HOST_COPY_CHUNK)]
    if not isinstance(chunks, Sequence) or not all(isinstance(chunk, Tensor) for chunk in chunks):
        raise ValueError(f"load_cpu_copy(): a buffer's copy is a {type(chunks).__name__}, not its chunks of rows")
    got = [int(chunk.shape[0]) if chunk.dim() else 0 for chunk in chunks]
    if got != sizes:
        raise ValueError(
            f"load_cpu_copy(): the copy holds {sum(got)} slots but {slots} indices were given; "
            "pass as many new slots as were copied"
        )
    row, dtype = tuple(buffer.shape[1:]), buffer.dtype
    for chunk in chunks:
        if tuple(chunk.shape[1:]) != row or chunk.dtype != dtype:
            raise ValueError(
                f"load_cpu_copy(): the copy has rows of {tuple(chunk.shape[1:])} {chunk.dtype} where this pool "
                f"holds {row} {dtype}; load a copy into the pool that made it"
            )


def _as_index(indices: Tensor, buffers: Sequence[Any]) -> Tensor:
    device = _device(buffers[0]) if buffers else torch.device("cpu")
    return torch.as_tensor(indices).to(device=device, dtype=torch.int64).reshape(-1)


def _device(buffer: Any) -> torch.device:
    return torch.device(buffer.device)


def _synchronize(buffers: Sequence[Any]) -> None:
    """Wait for the device's queue (any accelerator with torch's device-module API; nothing on CPU)."""
    if not buffers:
        return
    device = _device(buffers[0])
    if device.type in ("cpu", "meta"):
        return
    module = getattr(torch, device.type, None)
    sync = getattr(module, "synchronize", None)
    if sync is not None:
        sync(device)
