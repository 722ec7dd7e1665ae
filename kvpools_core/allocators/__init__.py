"""KV-slot allocators: hand out and take back slots of the KV-cache pools.

``TokenAllocator`` (page size 1) and ``PagedAllocator`` follow SGLang's
allocator contract (``BaseTokenToKVPoolAllocator``: constructor, ``get_kvcache``,
host copies, reference counts; the divergences are in ``docs/allocators.md``);
their bookkeeping is one preallocated free stack whose size
``allocator_planned_nbytes(size, page_size, checked)`` gives in advance.
Every free is range checked (``AllocatorError``, nothing changed); checked
mode (``checked=True``) also refuses double frees (see ``base``) and every
other misuse: ``misuse.CHECKED_ONLY`` lists what only checked mode refuses.
The byte formulas import without torch (planning never needs it); the
allocator classes load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from kvpools_core.allocators.sizes import allocator_planned_nbytes

if TYPE_CHECKING:
    from kvpools_core.allocators.base import AllocatorState, BaseAllocator
    from kvpools_core.allocators.contract import BaseTokenToKVPoolAllocator
    from kvpools_core.allocators.factory import allocator_class, allocator_for_plan
    from kvpools_core.allocators.paged import PagedAllocator
    from kvpools_core.allocators.token import TokenAllocator

__all__ = [
    "AllocatorState",
    "BaseAllocator",
    "BaseTokenToKVPoolAllocator",
    "PagedAllocator",
    "TokenAllocator",
    "allocator_class",
    "allocator_for_plan",
    "allocator_planned_nbytes",
]

_LAZY = {
    "AllocatorState": "base",
    "BaseAllocator": "base",
    "BaseTokenToKVPoolAllocator": "contract",
    "PagedAllocator": "paged",
    "TokenAllocator": "token",
    "allocator_class": "factory",
    "allocator_for_plan": "factory",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
