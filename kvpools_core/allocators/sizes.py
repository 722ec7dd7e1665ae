"""What an allocator holds on its device, from its geometry alone (no torch import).

The planner charges these bytes while sizing; the allocator classes report the
same formulas from ``planned_nbytes`` and measure their tensors in ``nbytes``,
and a test keeps the three equal.  Kept free of torch so planning a budget
never pays torch's import.
"""

from __future__ import annotations

__all__ = ["allocator_planned_nbytes", "check_geometry", "free_stack_nbytes", "paged_extra_nbytes"]


def check_geometry(size: int, page_size: int) -> None:
    """A pool of ``size`` slots must be a positive whole number of pages."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    if size < page_size or size % page_size:
        raise ValueError(
            f"size must be a positive multiple of page_size={page_size}, got {size}; "
            f"round it down to {size // page_size * page_size or page_size}"
        )


def free_stack_nbytes(size: int, page_size: int, checked: bool = False) -> int:
    """The int64 free stack (one entry per unit) plus, in checked mode, an int16 "allocated" map of unit ids
    0..units (``2 * (units + 1)`` bytes)."""
    check_geometry(size, page_size)
    units = size // page_size
    return 8 * units + (2 * (units + 1) if checked else 0)


def paged_extra_nbytes(page_size: int) -> int:
    """The paged allocator's kept table of in-page offsets (int64)."""
    return 8 * page_size


def allocator_planned_nbytes(tokens: int, page_size: int, checked: bool = False) -> int:
    """Bytes the allocator of a ``tokens``-slot pool holds; 0 for an empty pool (none is built).

    SGLang's choice of allocator: the token allocator at page size 1, else the paged one.
    The planner charges the default (unchecked) allocator; ``checked=True`` adds the
    ``2 * (pages + 1)`` bytes of checked mode's "allocated" map, which ``build(..., checked=True)``
    reports as a pool of its own (``allocator_checked``).
    """
    if tokens == 0:
        return 0
    extra = 0 if page_size == 1 else paged_extra_nbytes(page_size)
    return free_stack_nbytes(tokens, page_size, checked) + extra
