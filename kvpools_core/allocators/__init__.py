"""KV-slot allocators: hand out and take back slots of the KV-cache pools.

``TokenAllocator`` (page size 1) and ``PagedAllocator`` follow SGLang's
allocator interface; their bookkeeping is one preallocated free stack whose
size ``planned_nbytes(size, page_size, debug)`` gives in advance.
"""

from kvpools_core.allocators.base import AllocatorState, BaseAllocator
from kvpools_core.allocators.factory import allocator_class, allocator_for_plan, allocator_planned_nbytes
from kvpools_core.allocators.paged import PagedAllocator
from kvpools_core.allocators.token import TokenAllocator

__all__ = [
    "AllocatorState",
    "BaseAllocator",
    "PagedAllocator",
    "TokenAllocator",
    "allocator_class",
    "allocator_for_plan",
    "allocator_planned_nbytes",
]
