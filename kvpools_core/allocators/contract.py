"""SGLang's allocator contract: the abstract base that scheduler code and engine subclasses are written against.

An engine that hands its scheduler kvpools' allocators in place of its own needs
them to be what SGLang's ``BaseTokenToKVPoolAllocator`` is (``srt/mem_cache/
allocator/base.py`` of SGLang 0.5.23): the constructor ``(size, page_size,
dtype, device, kvcache, need_sort)``; the KV pool held and returned by
``get_kvcache``; ``get_cpu_copy`` / ``load_cpu_copy`` and ``alloc_extend`` /
``alloc_decode`` that raise ``NotImplementedError`` until a subclass provides
them (SGLang's token allocator relies on the latter two raising); ``clear``,
``alloc`` and ``free`` left abstract; and ``available_size``,
``merge_and_sort_free`` and the free group over the ``free_pages`` /
``release_pages`` tensors a subclass written for SGLang keeps; and the segment
frees SGLang 0.5.23's scheduler and radix cache call (``free_full``,
``free_segment`` / ``free_segments``, ``free_full_segment`` /
``free_full_segments``), with SGLang's defaults over ``free`` / ``free_full``.

A *segment* is ``kv_row[start_pos : start_pos + n]`` of one request's row of the
request-to-token table: ``start_pos`` sits on a page boundary (SGLang asserts it;
kvpools refuses it with ``AllocatorError``), each page's slots come in position
order, and the segment covers pages ``start_pos // page_size`` up to the page of
its last slot, the last one possibly partly.  A paged allocator therefore frees
one page per ``page_size`` slots given (``free_index[::page_size]``) without
de-duplicating them, and pays its range check once per segment, on those pages.

:class:`~kvpools_core.allocators.TokenAllocator`,
:class:`~kvpools_core.allocators.PagedAllocator` and
:class:`~kvpools_core.allocators.swa.SWATokenToKVPoolAllocator` derive from it;
``docs/allocators.md`` ("Allocator contract") lists where they differ from SGLang's.
"""

from __future__ import annotations

import abc
import operator
from typing import Any

import torch

from kvpools_core.errors import AllocatorError, KvpoolsError

__all__ = [
    "BaseTokenToKVPoolAllocator",
    "check_segment_start",
    "host_copy_of",
    "load_host_copy_into",
    "page_disjoint_segments",
]


class BaseTokenToKVPoolAllocator(abc.ABC):
    """SGLang's allocator interface (``BaseTokenToKVPoolAllocator``), with its constructor and defaults."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        kvcache: Any = None,
        need_sort: bool = False,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        """The KV dtype of the pool the slots index (SGLang keeps it; the allocator itself never reads it)."""
        self.device: torch.device | str = device
        self._kvcache = kvcache
        self.need_sort = need_sort

    @property
    def size_full(self) -> int:
        """Full-attention slots (SGLang: ``size`` for a single pool)."""
        return self.size

    def get_kvcache(self) -> Any:
        """The KV pool whose slots this allocator hands out (``None`` when built without one)."""
        return self._kvcache

    def debug_print(self) -> str:
        return ""

    # -- what SGLang's base leaves to subclasses (raising here is the contract, not a gap) ---------------
    # SGLang's base raises for these, and scheduler code tells allocator kinds apart by it: a token allocator
    # must refuse alloc_extend / alloc_decode.  Every kvpools allocator overrides get_cpu_copy / load_cpu_copy
    # (through its pool); the base keeps SGLang's behaviour for an engine's own subclass that does not.

    def get_cpu_copy(self, *args: Any, **kwargs: Any) -> Any:
        """The KV of slots ``indices`` copied to host memory (a subclass delegates to its pool)."""
        raise NotImplementedError(f"{type(self).__name__} does not copy KV to host memory (get_cpu_copy)")

    def load_cpu_copy(self, *args: Any, **kwargs: Any) -> None:
        """Write a :meth:`get_cpu_copy` result back into slots ``indices`` (a subclass delegates to its pool)."""
        raise NotImplementedError(f"{type(self).__name__} does not load KV back from host memory (load_cpu_copy)")

    def alloc_extend(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("alloc_extend is only for paged allocator")

    def alloc_decode(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("alloc_decode is only for paged allocator")

    @abc.abstractmethod
    def clear(self) -> None:
        """Everything free again."""

    @abc.abstractmethod
    def alloc(self, need_size: int) -> Any:
        """``need_size`` slots, or None when they are not free."""

    @abc.abstractmethod
    def free(self, free_index: Any) -> None:
        """Give slots back."""

    # -- SGLang's defaults over ``free_pages`` / ``release_pages`` tensors (for subclasses that keep them) ----

    def available_size(self) -> int:
        """Free slots: SGLang's default counts the subclass's ``free_pages`` and ``release_pages`` tensors."""
        free, released = getattr(self, "free_pages"), getattr(self, "release_pages")  # noqa: B009
        return (len(free) + len(released)) * self.page_size

    def merge_and_sort_free(self) -> None:
        """SGLang's default: fold ``release_pages`` into ``free_pages``, sorted."""
        free, released = getattr(self, "free_pages"), getattr(self, "release_pages")  # noqa: B009
        if len(released):
            setattr(self, "free_pages", torch.sort(torch.cat((free, released))).values)  # noqa: B010
            setattr(self, "release_pages", released[:0])  # noqa: B010

    def free_group_begin(self) -> None:
        """SGLang's default: collect frees in ``free_group`` until :meth:`free_group_end`."""
        if getattr(self, "free_group", None) is not None:
            raise RuntimeError("free_group_begin() called twice without free_group_end()")
        self.free_group: list[Any] | None = []

    def free_group_end(self) -> None:
        """SGLang's default: free what the group collected, in one call."""
        pending, self.free_group = getattr(self, "free_group", None), None
        if pending:
            self.free(torch.cat(pending))

    # -- SGLang 0.5.23's segment frees: defaults over ``free`` / ``free_full`` (allocators override them) -----

    def free_full(self, free_index: Any) -> None:
        """Free full-attention slots whose SWA peers are gone; one pool has no SWA side, so: ``free``."""
        self.free(free_index)

    def free_segment(self, free_index: Any, *, start_pos: int) -> None:
        """Free segment ``kv_row[start_pos : start_pos + len(free_index)]`` of one request (see the module).

        ``start_pos`` must be a multiple of ``page_size`` (``AllocatorError`` otherwise, nothing freed).
        """
        check_segment_start(start_pos, self.page_size, "free_segment")
        self.free(free_index)

    def free_segments(self, segments: Any) -> None:
        """Free ``(free_index, start_pos)`` segments of one request's row, ascending and page-disjoint.

        Every segment's start and the disjointness are checked before any is freed (``AllocatorError``).
        """
        for free_index, start_pos in page_disjoint_segments(segments, self.page_size, "free_segments"):
            self.free_segment(free_index, start_pos=start_pos)

    def free_full_segment(self, free_index: Any, *, start_pos: int) -> None:
        """``free_full`` of a segment (``start_pos`` page-aligned, as ``free_segment``)."""
        check_segment_start(start_pos, self.page_size, "free_full_segment")
        self.free_full(free_index)

    def free_full_segments(self, segments: Any) -> None:
        """``free_segments`` for the full side alone: ``free_full_segment`` of each segment."""
        for free_index, start_pos in page_disjoint_segments(segments, self.page_size, "free_full_segments"):
            self.free_full_segment(free_index, start_pos=start_pos)


def check_segment_start(start_pos: Any, page_size: int, method: str) -> None:
    """Refuse a segment that does not start on a page boundary (SGLang asserts ``start_pos % page_size == 0``)."""
    if type(start_pos) is not int:
        try:
            start_pos = operator.index(start_pos)
        except TypeError:
            raise AllocatorError(
                f"{method}(start_pos={start_pos!r}): start_pos is the segment's first position in the request's "
                "row, an int; nothing was freed"
            ) from None
    if start_pos < 0 or start_pos % page_size:
        raise AllocatorError(
            f"{method}(start_pos={start_pos}): a segment starts on a page boundary, a multiple of "
            f"page_size={page_size} >= 0 (its pages are freed whole from there); free the positions before "
            f"{start_pos // page_size * page_size} with the segment that holds their page; nothing was freed"
        )


def page_disjoint_segments(segments: Any, page_size: int, method: str) -> list[tuple[Any, int]]:
    """The non-empty ``(free_index, start_pos)`` of ``segments``, each start page-aligned and each segment's
    pages after the previous one's (SGLang's ``_page_disjoint``), checked all before any is freed."""
    out: list[tuple[Any, int]] = []
    prev_end: int | None = None
    for free_index, start_pos in segments:
        n = _numel(free_index)
        if not n:
            continue
        check_segment_start(start_pos, page_size, method)
        if prev_end is not None and start_pos // page_size <= (prev_end - 1) // page_size:
            raise AllocatorError(
                f"{method}(): the segment at position {start_pos} shares a page with the one ending at "
                f"{prev_end} (page_size={page_size}); give ascending segments whose pages do not overlap "
                "(merge adjacent ones); nothing was freed"
            )
        prev_end = start_pos + n
        out.append((free_index, start_pos))
    return out


def _numel(free_index: Any) -> int:
    if isinstance(free_index, torch.Tensor):
        return free_index.numel()
    try:
        return len(free_index)
    except TypeError:
        raise AllocatorError(
            f"a segment's free_index is a tensor or a list of slot ids; got {type(free_index).__name__}; "
            "nothing was freed"
        ) from None


def host_copy_of(allocator: BaseTokenToKVPoolAllocator, indices: Any) -> Any:
    """``allocator``'s pool's ``get_cpu_copy(indices)``, or a clear error naming what is missing."""
    return _pool_method(allocator, "get_cpu_copy")(indices)


def load_host_copy_into(allocator: BaseTokenToKVPoolAllocator, kv_cache_cpu: Any, indices: Any) -> None:
    """``allocator``'s pool's ``load_cpu_copy(kv_cache_cpu, indices)``, or a clear error naming what is missing.

    A copy the pool cannot take (another pool's, another kind of object, of another number of slots) is
    refused with ``AllocatorError``; the allocator is unchanged, the KV of ``indices`` unspecified.
    """
    method = _pool_method(allocator, "load_cpu_copy")
    try:
        method(kv_cache_cpu, indices)
    except KvpoolsError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise AllocatorError(
            f"load_cpu_copy(): the {type(kv_cache_cpu).__name__} given is not a copy this "
            f"{type(allocator.get_kvcache()).__name__}'s get_cpu_copy() made for {_count(indices)} slots "
            f"({type(exc).__name__}: {exc}); load a copy into the pool that made it, into as many slots"
        ) from exc


def _count(indices: Any) -> int | str:
    try:
        return int(torch.as_tensor(indices).numel())
    except (TypeError, ValueError, RuntimeError):
        return "?"


def _pool_method(allocator: BaseTokenToKVPoolAllocator, name: str) -> Any:
    pool = allocator.get_kvcache()
    if pool is None:
        raise AllocatorError(
            f"{name}() copies the KV of slots through the allocator's KV pool, and this "
            f"{type(allocator).__name__} was built without one: pass kvcache=<the pool> to its constructor "
            "(kvpools_core.build(plan, device) does)"
        )
    method = getattr(pool, name, None)
    if method is None:
        raise AllocatorError(
            f"{name}(): the KV pool {type(pool).__name__} has no host copies (kvpools' MHA, MLA and SWA pools "
            "have them); retract requests by recomputing their KV instead"
        )
    return method
