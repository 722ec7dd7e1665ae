"""The request-to-token table: one int32 row of KV slot ids per running request.

SGLang's ``ReqToTokenPool`` / ``DecodeReqToTokenPool``: the table has one
padding row (row 0, which CUDA-graph padded batches point at) before the
usable rows, so row ids handed out are ``1..size``.  Free rows are a host-side
Python list, as in SGLang (requests come and go a few at a time; a device
round trip would cost more than the list).  A disaggregated decode node
pre-allocates ``pre_alloc_size`` more rows for requests whose KV is still in
transfer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from kvpools_core.parts.sizing import REQ_TO_TOKEN_ITEM_BYTES, req_to_token_row_len, req_to_token_rows
from kvpools_core.pools.kv import PoolPlanMismatchError, allocate
from kvpools_core.values import Plan

__all__ = ["DecodeReqToTokenPool", "DecodeRows", "ReqToTokenPool"]

PADDING_ROWS = 1


class ReqToTokenPool:
    """``req_to_token[(1 + size), max_context_len]`` int32, rows ``1..size`` handed out."""

    def __init__(self, size: int, max_context_len: int, device: str | torch.device = "cpu") -> None:
        if size < 0 or max_context_len < 1:
            raise ValueError(
                f"A request table needs size >= 0 and max_context_len >= 1, got {size} and {max_context_len}."
            )
        self.size = size
        self.max_context_len = max_context_len
        self._rows = self.usable_rows + PADDING_ROWS
        self.req_to_token = allocate((self._rows, max_context_len), torch.int32, device)
        self.device = self.req_to_token.device
        self.free_slots: list[int] = []
        self._in_use = bytearray(self._rows)
        self.clear()

    @classmethod
    def from_plan(cls, plan: Plan, device: str | torch.device) -> ReqToTokenPool:
        """The table of a plan's ``req_to_token`` pool (the decode variant on a disaggregated decode node)."""
        serving = plan.serving
        row_len = req_to_token_row_len(serving.context_length or plan.model.context_len, serving)
        rows, padding = req_to_token_rows(plan.max_running_requests, serving)
        spec = plan.pool("req_to_token")
        if (spec.slots, spec.padding_slots, spec.bytes_per_slot) != (rows, padding, row_len * REQ_TO_TOKEN_ITEM_BYTES):
            raise PoolPlanMismatchError(
                f"The plan's req_to_token pool ({spec.slots} rows + {spec.padding_slots} padding of "
                f"{spec.bytes_per_slot} B) is not the table of {plan.max_running_requests} requests "
                f"({rows} rows + {padding} padding of {row_len} int32 columns). Re-plan with this kvpools version."
            )
        if serving.decode_request_pools:
            return DecodeReqToTokenPool(
                plan.max_running_requests, row_len, device, pre_alloc_size=serving.decode_extra_slots
            )
        return cls(rows, row_len, device)

    @property
    def usable_rows(self) -> int:
        """Rows that can be handed out (row 0 pads)."""
        return self.size

    @property
    def nbytes(self) -> int:
        """Bytes of the device table, measured from the tensor (the host free list is not counted)."""
        return self.req_to_token.numel() * self.req_to_token.element_size()

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> list[int] | None:
        """``need_size`` free row ids (lowest first after a clear); ``None``, changing nothing, if too few are free."""
        if need_size < 0:
            raise ValueError(f"alloc needs a non-negative row count, got {need_size}.")
        if need_size > len(self.free_slots):
            return None
        taken = self.free_slots[:need_size]
        del self.free_slots[:need_size]
        for row in taken:
            self._in_use[row] = 1
        return taken

    def free(self, free_index: int | Iterable[int] | Tensor) -> None:
        """Return one row id or several; freeing the padding row, an unknown or a free row raises."""
        rows = [free_index] if isinstance(free_index, int) else [int(i) for i in free_index]
        for row in rows:
            if not 0 < row < self._rows or not self._in_use[row]:
                state = "not a row id" if not 0 < row < self._rows else "not allocated"
                raise ValueError(f"Cannot free request row {row}: {state} (rows 1..{self._rows - 1} are handed out).")
            self._in_use[row] = 0
        self.free_slots.extend(rows)

    def clear(self) -> None:
        """Every row free again (ids ascending); the table's contents are left as they are."""
        self.free_slots = list(range(PADDING_ROWS, self._rows))
        self._in_use = bytearray(self._rows)

    def write(self, indices: Any, values: Tensor | int) -> None:
        """``req_to_token[indices] = values`` (``indices`` may be a row, a tensor or ``(row, slice)``)."""
        self.req_to_token[indices] = values

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(rows={self._rows} incl. padding, max_context_len={self.max_context_len}, "
            f"free={len(self.free_slots)}, device={self.device})"
        )


class DecodeRows:
    """What a PD decode node adds to a request table (mixed in before it): ``pre_alloc_size`` rows for transfers.

    ``size`` stays the running-request limit, as in SGLang; every row
    (``size + pre_alloc_size`` of them) can be handed out.  ``req_generation``
    counts how often each row was handed out, so a late transfer into a
    reused row can be told apart.
    """

    size: int

    def __init__(
        self,
        size: int,
        max_context_len: int,
        device: str | torch.device = "cpu",
        *,
        pre_alloc_size: int = 0,
        **table: Any,
    ) -> None:
        if pre_alloc_size < 0:
            raise ValueError(f"pre_alloc_size must be non-negative, got {pre_alloc_size}.")
        self.pre_alloc_size = pre_alloc_size
        self.req_generation: list[int] = [0] * (size + pre_alloc_size + PADDING_ROWS)
        super().__init__(size, max_context_len, device, **table)  # type: ignore[call-arg]

    @property
    def usable_rows(self) -> int:
        return self.size + self.pre_alloc_size

    def alloc(self, need_size: int) -> list[int] | None:
        taken: list[int] | None = super().alloc(need_size)  # type: ignore[misc]
        for row in taken or ():
            self.req_generation[row] += 1
        return taken


class DecodeReqToTokenPool(DecodeRows, ReqToTokenPool):
    """The decode node's table (SGLang's ``DecodeReqToTokenPool``): :class:`DecodeRows` over the plain table."""
