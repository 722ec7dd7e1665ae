"""The allocator misuse catalogue: every allocator kind x every misuse, default and checked mode.

Each case sets an allocator up with valid calls, then makes one misuse.  Checked mode must refuse every
case with ``AllocatorError`` (or, where the contract says so, answer None) and leave the allocator exactly
as it was: counters, free stack, "allocated" map, reference counts, open free group, SWA mapping.
Default mode must do the same for every case not in ``kvpools_core.allocators.misuse.CHECKED_ONLY``; each
case listed there must still get past default mode on some kind (else the entry is stale), and the table
in ``docs/allocators.md`` must list exactly those cases.

Defects pinned here (issue 29): the SWA ``free_full`` of still-mapped slots leaked their SWA slots in both
modes (``free_full_still_mapped``, ``free_full_unmapped_slot_of_mapped_page``); checked mode raised plain
``ValueError`` for bad ``alloc_extend`` / ``alloc_decode`` batches and the SWA evicted-page checks
(``extend_*`` / ``decode_*``), ``RuntimeError`` for free-group misuse and ``NotImplementedError`` for a meta
tensor; a negative ``num_new_pages`` moved the free stack's head back over handed-out pages in both modes
(``*_num_new_pages_negative``, ``extend_prefix_above_seq_negative_total``); batch tensors of different
lengths or a slot gather that failed left the batch's pages taken (``*_length_mismatch``,
``extend_num_tokens_mismatch_open_page``); the page-1 SWA allocators ignored the lengths they were given
even in checked mode; ``get_cpu_copy`` / ``load_cpu_copy`` read and wrote the row of a negative slot id
(``host_copy_out_of_range``) and let a foreign copy through as ``KeyError`` / ``RuntimeError`` after
writing some rows (``load_cpu_copy_*``); token ``alloc(-1)`` and ``alloc_pages(-1)`` raised plain
``ValueError``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from kvpools_plugins.swa.allocator import PureSWAAllocator

from kvpools_core.allocators import PagedAllocator, TokenAllocator
from kvpools_core.allocators.base import BaseAllocator
from kvpools_core.allocators.misuse import CHECKED_ONLY
from kvpools_core.allocators.swa import SWATokenToKVPoolAllocator
from kvpools_core.errors import AllocatorError, AllocatorStateError
from kvpools_core.pools.host_copy import copy_rows_to_host, load_rows_from_host

DOCS = Path(__file__).resolve().parents[2] / "docs" / "allocators.md"


class RowsPool:
    """A KV pool of one row buffer, with the core's host copies (what the MHA pool's K / V buffers do)."""

    def __init__(self, rows: int, width: int = 2) -> None:
        self.rows = torch.arange(rows * width, dtype=torch.float32).reshape(rows, width)

    def get_cpu_copy(self, indices: torch.Tensor) -> list[list[torch.Tensor]]:
        return copy_rows_to_host([self.rows], indices)

    def load_cpu_copy(self, kv_cache_cpu: list[list[torch.Tensor]], indices: torch.Tensor) -> None:
        load_rows_from_host([self.rows], kv_cache_cpu, indices)


def _npu_class() -> type[PagedAllocator] | None:
    try:
        from kvpools_ascend.allocator import npu_paged_allocator_class  # type: ignore[import-untyped]
    except ImportError:  # the vendor plugin is not installed here
        return None
    cls: type[PagedAllocator] = npu_paged_allocator_class()
    return cls


@dataclass(frozen=True)
class Kind:
    """An allocator kind: its name, page size, units (slots or pages) and how to build one."""

    name: str
    page: int
    units: int
    family: str  # "token", "paged", "dual" or "pure"
    make: Callable[[bool], Any]

    @property
    def paged(self) -> bool:
        """Built on ``PagedAllocator`` (has ``free_pages`` / ``alloc_pages``)."""
        return self.family == "paged"

    @property
    def extends(self) -> bool:
        """Has ``alloc_extend`` / ``alloc_decode`` (the token allocator raises, as SGLang's)."""
        return self.family != "token"


def _kinds() -> list[Kind]:
    npu = _npu_class()
    kinds = [
        Kind("token", 1, 8, "token", lambda c: TokenAllocator(8, kvcache=RowsPool(9), checked=c)),
        Kind("paged1", 1, 8, "paged", lambda c: PagedAllocator(8, 1, kvcache=RowsPool(9), checked=c)),
        Kind("paged16", 16, 4, "paged", lambda c: PagedAllocator(64, 16, kvcache=RowsPool(80), checked=c)),
        Kind("dual1", 1, 8, "dual", lambda c: SWATokenToKVPoolAllocator(8, 6, 1, kvcache=RowsPool(9), checked=c)),
        Kind("dual16", 16, 4, "dual", lambda c: SWATokenToKVPoolAllocator(64, 48, 16, kvcache=RowsPool(80), checked=c)),
        Kind("pure1", 1, 8, "pure", lambda c: PureSWAAllocator(8, 1, kvcache=RowsPool(9), checked=c)),
        Kind("pure16", 16, 4, "pure", lambda c: PureSWAAllocator(64, 16, kvcache=RowsPool(80), checked=c)),
    ]
    if npu is not None:
        kinds.append(Kind("npu16", 16, 4, "paged", lambda c: npu(64, 16, kvcache=RowsPool(80), checked=c)))
    return kinds


KINDS = _kinds()


# ------------------------------------------------------------------------------------------- state
def _core_state(a: BaseAllocator) -> tuple[object, ...]:
    allocated = None if a._allocated is None else a._allocated.tolist()
    refs = None if a._refs is None else a._refs.tolist()
    pending = [t.tolist() for t in a._pending]
    # released + pending, and the free units: what lies between is never read (a free group may park a call
    # there that its settling refuses)
    buf = a._buf[: a._rel + a._pend].tolist() + a._buf[a._head :].tolist()
    return (a._head, a._rel, a._pend, a._in_group, buf, allocated, refs, pending, list(a._pending_bytes))


def state_of(a: Any) -> tuple[object, ...]:
    """Everything that defines an allocator's state, with its ``available_size()``."""
    if isinstance(a, SWATokenToKVPoolAllocator):
        parts: tuple[object, ...] = (
            _core_state(a.full_attn_allocator),
            _core_state(a.swa_attn_allocator),
            a.full_to_swa_index_mapping.tolist(),
        )
    elif isinstance(a, PureSWAAllocator):
        parts = (_core_state(a.swa_attn_allocator),)
    else:
        parts = (_core_state(a),)
    return (a.available_size(), *parts)


# ------------------------------------------------------------------------------------------- cases
Misuse = Callable[[], object]


@dataclass(frozen=True)
class Case:
    id: str
    setup: Callable[[Kind, Any], Misuse]  # valid calls, then the misuse to make
    applies: Callable[[Kind], bool]
    answer_none: bool = False  # refused by answering None (the contract of an allocation that does not fit)


CASES: dict[str, Case] = {}


def case(applies: Callable[[Kind], bool] = lambda k: True, *, answer_none: bool = False) -> Callable[..., Any]:
    def register(fn: Callable[[Kind, Any], Misuse]) -> Callable[[Kind, Any], Misuse]:
        CASES[fn.__name__] = Case(fn.__name__, fn, applies, answer_none)
        return fn

    return register


def i64(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def take(k: Kind, a: Any, units: int = 1) -> torch.Tensor:
    """``units`` whole units (slots / pages) handed out, as slot ids."""
    out: torch.Tensor | None = a.alloc(units * k.page)
    assert out is not None
    return out.to(torch.int64)


def unit_slots(k: Kind, unit: int) -> torch.Tensor:
    return torch.arange(unit * k.page, (unit + 1) * k.page, dtype=torch.int64)


def request(k: Kind, a: Any, tokens: int) -> torch.Tensor:
    """A request of ``tokens`` tokens extended from nothing: its slots."""
    out: torch.Tensor | None = a.alloc_extend(i64([0]), i64([tokens]), i64([-1]), tokens)
    assert out is not None
    return out.to(torch.int64)


PAGE1_FREE = lambda k: k.family in ("token", "dual", "pure") and k.page == 1  # noqa: E731  a token free
MULTI_PAGE = lambda k: k.page > 1  # noqa: E731
PAGED = lambda k: k.paged  # noqa: E731
DUAL = lambda k: k.family == "dual"  # noqa: E731
DUAL_PAGED = lambda k: k.family == "dual" and k.page > 1  # noqa: E731
EXTENDS = lambda k: k.extends  # noqa: E731
EXTENDS_PAGED = lambda k: k.extends and k.page > 1  # noqa: E731
COUNTS_PAGES = lambda k: k.family == "paged" or (k.extends and k.page > 1)  # noqa: E731  pages from lengths
REFCOUNTED = lambda k: k.family in ("token", "paged")  # noqa: E731


# -- frees ------------------------------------------------------------------------------------------
@case()
def double_free(k: Kind, a: Any) -> Misuse:
    """Nothing else held: caught by the count in every mode."""
    first = take(k, a)
    a.free(first)
    return lambda: a.free(first)


@case()
def double_free_while_held(k: Kind, a: Any) -> Misuse:
    first, _ = take(k, a), take(k, a)
    a.free(first)
    return lambda: a.free(first)


@case()
def double_free_in_free_group(k: Kind, a: Any) -> Misuse:
    first, _ = take(k, a), take(k, a)
    a.free_group_begin()
    a.free(first)
    return lambda: a.free(first)


@case(PAGED)
def double_free_pages_while_held(k: Kind, a: Any) -> Misuse:
    pages = a.alloc_pages(2)
    a.free_pages(pages[:1])
    return lambda: a.free_pages(pages[:1])


@case()
def free_never_allocated(k: Kind, a: Any) -> Misuse:
    """Nothing held: caught by the count in every mode."""
    return lambda: a.free(unit_slots(k, 2))


@case()
def free_never_allocated_while_held(k: Kind, a: Any) -> Misuse:
    take(k, a, 2)
    return lambda: a.free(unit_slots(k, k.units))


@case(PAGE1_FREE)
def repeat_in_one_free(k: Kind, a: Any) -> Misuse:
    slots = take(k, a, 3)
    return lambda: a.free(i64([int(slots[0])] * 2))


@case(PAGED)
def repeat_in_free_pages(k: Kind, a: Any) -> Misuse:
    pages = a.alloc_pages(3)
    return lambda: a.free_pages([pages[0], pages[0]])


@case(MULTI_PAGE)
def free_rest_of_freed_page(k: Kind, a: Any) -> Misuse:
    first, _ = take(k, a), take(k, a)
    a.free(first[:5])
    return lambda: a.free(first[5:])


@case()
def free_padding(k: Kind, a: Any) -> Misuse:
    take(k, a, 2)
    return lambda: a.free(i64([k.page - 1]))  # the padding page's last slot (slot 0 at page size 1)


@case()
def free_minus_one(k: Kind, a: Any) -> Misuse:
    held = take(k, a, 2)
    return lambda: a.free(i64([int(held[0]), -1]))


@case()
def free_negative(k: Kind, a: Any) -> Misuse:
    take(k, a, 2)
    return lambda: a.free([-(k.page + 1)])


@case()
def free_past_end(k: Kind, a: Any) -> Misuse:
    take(k, a, 2)
    return lambda: a.free(i64([(k.units + 1) * k.page]))


@case()
def free_huge(k: Kind, a: Any) -> Misuse:
    take(k, a, 2)
    return lambda: a.free([2**40])


@case()
def free_float_tensor(k: Kind, a: Any) -> Misuse:
    held = take(k, a)
    return lambda: a.free(held.to(torch.float32))


@case()
def free_bool_tensor(k: Kind, a: Any) -> Misuse:
    held = take(k, a)
    return lambda: a.free(torch.ones_like(held, dtype=torch.bool))


@case()
def free_float_list(k: Kind, a: Any) -> Misuse:
    held = take(k, a)
    return lambda: a.free([s + 0.5 for s in held.tolist()])


@case()
def free_none(k: Kind, a: Any) -> Misuse:
    take(k, a)
    return lambda: a.free(None)


@case()
def free_meta_tensor(k: Kind, a: Any) -> Misuse:
    """A tensor on another device that holds no data (``meta``): the allocator cannot read its ids."""
    held = take(k, a)
    return lambda: a.free(held.to("meta"))


@case(PAGED)
def free_pages_padding(k: Kind, a: Any) -> Misuse:
    a.alloc_pages(2)
    return lambda: a.free_pages([0])


@case(PAGED)
def free_pages_past_end(k: Kind, a: Any) -> Misuse:
    a.alloc_pages(2)
    return lambda: a.free_pages([k.units + 1])


@case(PAGED)
def free_pages_float(k: Kind, a: Any) -> Misuse:
    a.alloc_pages(2)
    return lambda: a.free_pages([1.0])


# -- the SWA allocators' two free paths --------------------------------------------------------------
@case(DUAL)
def free_full_still_mapped(k: Kind, a: Any) -> Misuse:
    """Defect (issue 29): ``free_full`` freed the full slots and left their SWA slots mapped and leaked."""
    held = take(k, a)
    return lambda: a.free_full(held)


@case(DUAL_PAGED)
def free_full_unmapped_slot_of_mapped_page(k: Kind, a: Any) -> Misuse:
    """Defect (issue 29): a request of 5 tokens maps 5 slots of its page; ``free_full`` of an unused slot of
    that page freed the page and leaked its SWA page."""
    slots = request(k, a, 5)
    return lambda: a.free_full(i64([int(slots[-1]) + 1]))


@case(DUAL)
def free_full_after_free(k: Kind, a: Any) -> Misuse:
    first, _ = take(k, a), take(k, a)
    a.free(first)
    return lambda: a.free_full(first)


@case(DUAL)
def free_after_free_full(k: Kind, a: Any) -> Misuse:
    first, _ = take(k, a), take(k, a)
    a.free_swa(first)
    a.free_full(first)
    return lambda: a.free(first)


@case(DUAL)
def free_swa_of_free_slots(k: Kind, a: Any) -> Misuse:
    first, _ = take(k, a), take(k, a)
    a.free(first)
    return lambda: a.free_swa(first)


@case(lambda k: k.family == "pure")
def pure_free_after_free_swa(k: Kind, a: Any) -> Misuse:
    first, _ = take(k, a), take(k, a)
    a.free_swa(first)
    return lambda: a.free(first)


# -- allocations ----------------------------------------------------------------------------------------
@case()
def alloc_negative(k: Kind, a: Any) -> Misuse:
    take(k, a)
    return lambda: a.alloc(-k.page)


@case(MULTI_PAGE)
def alloc_not_whole_pages(k: Kind, a: Any) -> Misuse:
    return lambda: a.alloc(k.page + 1)


@case(answer_none=True)
def alloc_beyond_capacity(k: Kind, a: Any) -> Misuse:
    take(k, a)
    return lambda: a.alloc(k.units * k.page)


@case(PAGED)
def alloc_pages_negative(k: Kind, a: Any) -> Misuse:
    return lambda: a.alloc_pages(-1)


@case(PAGED, answer_none=True)
def alloc_pages_beyond_capacity(k: Kind, a: Any) -> Misuse:
    a.alloc_pages(1)
    return lambda: a.alloc_pages(k.units)


@case(EXTENDS, answer_none=True)
def extend_beyond_capacity(k: Kind, a: Any) -> Misuse:
    take(k, a)
    n = k.units * k.page
    return lambda: a.alloc_extend(i64([0]), i64([n]), i64([-1]), n)


# -- alloc_extend / alloc_decode batches --------------------------------------------------------------------
@case(EXTENDS)
def extend_length_mismatch(k: Kind, a: Any) -> Misuse:
    return lambda: a.alloc_extend(i64([0, 0]), i64([3]), i64([-1]), 3)


@case(EXTENDS)
def extend_negative_tokens(k: Kind, a: Any) -> Misuse:
    return lambda: a.alloc_extend(i64([0]), i64([3]), i64([-1]), -1)


@case(EXTENDS)
def extend_float_lengths(k: Kind, a: Any) -> Misuse:
    """Lengths as floats are a caller bug, not rounded (as ids in a free are not)."""
    return lambda: a.alloc_extend(torch.tensor([0.0]), torch.tensor([3.5]), i64([-1]), 3)


@case(EXTENDS)
def decode_bool_lengths(k: Kind, a: Any) -> Misuse:
    held = request(k, a, 3)
    return lambda: a.alloc_decode(torch.tensor([True]), held[-1:])


@case(EXTENDS)
def extend_num_new_pages_negative(k: Kind, a: Any) -> Misuse:
    """Defect (issue 29): ``_take(-1)`` moved the head back over a handed-out page."""
    take(k, a, 2)
    return lambda: a.alloc_extend(i64([0]), i64([0]), i64([-1]), 0, num_new_pages=-1)


@case(COUNTS_PAGES)
def extend_prefix_above_seq_negative_total(k: Kind, a: Any) -> Misuse:
    """Two pages of prefix, none of sequence: -2 new pages, refused in every mode where pages are counted from
    the lengths (the page-1 SWA allocators take ``alloc(extend_num_tokens)``, here 0: nothing happens)."""
    take(k, a, 2)
    return lambda: a.alloc_extend(i64([2 * k.page]), i64([0]), i64([-1]), 0)


@case(EXTENDS)
def extend_prefix_above_seq(k: Kind, a: Any) -> Misuse:
    """Prefix 5, sequence 3: no new page and 0 tokens by the totals, but a request cannot shrink."""
    held = request(k, a, 5)
    return lambda: a.alloc_extend(i64([5]), i64([3]), held[-1:], 0)


@case(EXTENDS)
def extend_num_tokens_mismatch(k: Kind, a: Any) -> Misuse:
    return lambda: a.alloc_extend(i64([0]), i64([5]), i64([-1]), 3)


@case(EXTENDS_PAGED)
def extend_num_tokens_mismatch_open_page(k: Kind, a: Any) -> Misuse:
    """Defect (issue 29): continuing an open page, the slot gather failed after the batch's pages were taken."""
    held = request(k, a, 3)
    return lambda: a.alloc_extend(i64([3]), i64([20]), held[-1:], 80)


@case(EXTENDS)
def extend_num_new_pages_wrong(k: Kind, a: Any) -> Misuse:
    n = 2 * k.page
    return lambda: a.alloc_extend(i64([0]), i64([n]), i64([-1]), n, num_new_pages=1)


@case(EXTENDS_PAGED)
def extend_foreign_last_loc(k: Kind, a: Any) -> Misuse:
    take(k, a)
    free_page_slot = int(unit_slots(k, k.units)[2])
    return lambda: a.alloc_extend(i64([3]), i64([5]), i64([free_page_slot]), 2)


@case(EXTENDS_PAGED)
def extend_misplaced_last_loc(k: Kind, a: Any) -> Misuse:
    held = request(k, a, 3)
    return lambda: a.alloc_extend(i64([3]), i64([5]), held[:1], 2)


@case(EXTENDS_PAGED)
def extend_last_loc_past_pool(k: Kind, a: Any) -> Misuse:
    request(k, a, 3)
    return lambda: a.alloc_extend(i64([3]), i64([5]), i64([10**6 * k.page + 2]), 2)


@case(DUAL_PAGED)
def extend_from_evicted_swa_page(k: Kind, a: Any) -> Misuse:
    slots = request(k, a, 5)
    a.free_swa(slots)  # breaks the caller contract: the request's last page
    return lambda: a.alloc_extend(i64([5]), i64([6]), slots[-1:], 1)


@case(DUAL_PAGED)
def swa_tail_mid_page(k: Kind, a: Any) -> Misuse:
    return lambda: a.alloc_extend_swa_tail(i64([0]), i64([20]), i64([-1]), 20, 7)


@case(DUAL_PAGED)
def swa_tail_many_requests(k: Kind, a: Any) -> Misuse:
    return lambda: a.alloc_extend_swa_tail(i64([0, 0]), i64([16, 16]), i64([-1, -1]), 32, 16)


@case(DUAL_PAGED)
def swa_tail_longer_than_extend(k: Kind, a: Any) -> Misuse:
    return lambda: a.alloc_extend_swa_tail(i64([0]), i64([16]), i64([-1]), 16, 32)


@case(DUAL_PAGED)
def swa_tail_num_new_pages_negative(k: Kind, a: Any) -> Misuse:
    take(k, a, 2)
    return lambda: a.alloc_extend_swa_tail(i64([0]), i64([16]), i64([-1]), 16, 16, num_new_pages=-1)


@case(lambda k: k.family == "dual" and k.page == 1)
def swa_tail_at_page_size_1(k: Kind, a: Any) -> Misuse:
    return lambda: a.alloc_extend_swa_tail(i64([0]), i64([4]), i64([-1]), 4, 4)


@case(EXTENDS)
def decode_length_mismatch(k: Kind, a: Any) -> Misuse:
    held = request(k, a, 3)
    return lambda: a.alloc_decode(i64([4, 5]), held[-1:])


@case(EXTENDS)
def decode_num_new_pages_negative(k: Kind, a: Any) -> Misuse:
    held = request(k, a, 3)
    return lambda: a.alloc_decode(i64([4]), held[-1:], num_new_pages=-1)


@case(EXTENDS)
def decode_seq_len_zero(k: Kind, a: Any) -> Misuse:
    held = request(k, a, 3)
    return lambda: a.alloc_decode(i64([0]), held[-1:])


@case(EXTENDS)
def decode_num_new_pages_wrong(k: Kind, a: Any) -> Misuse:
    held = request(k, a, 3)
    return lambda: a.alloc_decode(i64([4]), held[-1:], num_new_pages=2)


@case(EXTENDS_PAGED)
def decode_foreign_last_loc(k: Kind, a: Any) -> Misuse:
    request(k, a, 3)
    free_page_slot = int(unit_slots(k, k.units)[2])
    return lambda: a.alloc_decode(i64([4]), i64([free_page_slot]))


@case(DUAL_PAGED)
def decode_from_evicted_swa_page(k: Kind, a: Any) -> Misuse:
    slots = request(k, a, 5)
    a.free_swa(slots)
    return lambda: a.alloc_decode(i64([6]), slots[-1:])


# -- reference counts ---------------------------------------------------------------------------------
@case(REFCOUNTED)
def retain_free_unit(k: Kind, a: Any) -> Misuse:
    take(k, a)
    return lambda: a.retain(unit_slots(k, k.units))


@case(REFCOUNTED)
def retain_out_of_range(k: Kind, a: Any) -> Misuse:
    take(k, a)
    return lambda: a.retain(i64([-1]))


@case(REFCOUNTED)
def free_beyond_retains(k: Kind, a: Any) -> Misuse:
    """Held twice (alloc + retain), freed twice: a third free is a double free, counted in every mode."""
    first, _ = take(k, a), take(k, a)
    a.retain(first)
    a.free(first)
    a.free(first)
    return lambda: a.free(first)


# -- host copies --------------------------------------------------------------------------------------------
@case()
def host_copy_out_of_range(k: Kind, a: Any) -> Misuse:
    """Defect (issue 29): slot -1 read (and wrote) the pool's last row, another request's KV."""
    take(k, a)
    return lambda: a.get_cpu_copy(i64([-1]))


@case()
def load_cpu_copy_out_of_range(k: Kind, a: Any) -> Misuse:
    held = take(k, a)
    copy = a.get_cpu_copy(held[:1])
    return lambda: a.load_cpu_copy(copy, i64([-1]))


@case()
def host_copy_of_free_slots(k: Kind, a: Any) -> Misuse:
    take(k, a)
    return lambda: a.get_cpu_copy(unit_slots(k, k.units)[:1])


def test_host_copies_may_read_a_slot_twice() -> None:
    """A host copy reads and writes slots, it frees none: a slot given twice is no double free, even checked."""
    a = TokenAllocator(8, kvcache=RowsPool(9), checked=True)
    held = a.alloc(2)
    assert held is not None
    twice = torch.cat((held[:1], held[:1]))
    copy = a.get_cpu_copy(twice)
    a.load_cpu_copy(copy, twice)
    assert torch.equal(copy[0][0], RowsPool(9).rows[twice])


@case()
def load_cpu_copy_foreign_object(k: Kind, a: Any) -> Misuse:
    held = take(k, a)
    return lambda: a.load_cpu_copy(object(), held[:1])


@case()
def load_cpu_copy_wrong_count(k: Kind, a: Any) -> Misuse:
    held = take(k, a, 2)
    copy = a.get_cpu_copy(held[:2])
    return lambda: a.load_cpu_copy(copy, held[-1:])


@case()
def load_cpu_copy_other_pool(k: Kind, a: Any) -> Misuse:
    """A copy from a pool with rows of another shape: refused before a row is written."""
    held = take(k, a)
    copy = RowsPool(80, width=3).get_cpu_copy(i64([1]))
    return lambda: a.load_cpu_copy(copy, held[:1])


# -- state and free groups -------------------------------------------------------------------------------
@case()
def restore_foreign_state(k: Kind, a: Any) -> Misuse:
    other = k.make(False)
    return lambda: a.restore_state(other.backup_state())


@case()
def restore_none(k: Kind, a: Any) -> Misuse:
    return lambda: a.restore_state(None)


@case()
def free_group_end_without_begin(k: Kind, a: Any) -> Misuse:
    take(k, a)
    return lambda: a.free_group_end()


@case()
def free_group_begin_twice(k: Kind, a: Any) -> Misuse:
    first = take(k, a)
    a.free_group_begin()
    a.free(first)
    return lambda: a.free_group_begin()


# ------------------------------------------------------------------------------------------------- tests
PAIRS = [pytest.param(k, c, id=f"{k.name}-{c.id}") for c in CASES.values() for k in KINDS if c.applies(k)]


def _refused_cleanly(kind: Kind, c: Case, checked: bool) -> tuple[bool, str]:
    """Whether the misuse is refused (``AllocatorError``, or None where the contract says so) with the
    allocator unchanged; and what happened."""
    a = kind.make(checked)
    misuse = c.setup(kind, a)
    a.backup_state()  # the setup's frees settled (a free group may check its frees when it settles)
    before = state_of(a)
    try:
        out = misuse()
    except AllocatorError as exc:
        if c.answer_none:
            return False, f"raised {exc!r} where None is the answer"
        changed = state_of(a) != before
        return not changed, f"refused ({exc}){' but changed the allocator' if changed else ''}"
    if c.answer_none and out is None:
        return state_of(a) == before, "answered None"
    try:  # a free inside a group may be checked when the group settles (backup_state is a settle point)
        a.backup_state()
    except AllocatorError as exc:
        changed = state_of(a) != before
        return not changed, f"refused when its group settled ({exc}){' but changed the allocator' if changed else ''}"
    return False, f"accepted, answering {out!r}"


@pytest.mark.parametrize(("kind", "c"), PAIRS)
def test_checked_mode_refuses_and_changes_nothing(kind: Kind, c: Case) -> None:
    refused, what = _refused_cleanly(kind, c, checked=True)
    assert refused, f"checked {kind.name}, {c.id}: {what}"


@pytest.mark.parametrize(("kind", "c"), [p for p in PAIRS if getattr(p.values[1], "id", None) not in CHECKED_ONLY])
def test_default_mode_refuses_and_changes_nothing(kind: Kind, c: Case) -> None:
    refused, what = _refused_cleanly(kind, c, checked=False)
    assert refused, f"default {kind.name}, {c.id} (not in CHECKED_ONLY): {what}"


@pytest.mark.parametrize("case_id", sorted(CHECKED_ONLY))
def test_each_checked_only_case_gets_past_default_mode(case_id: str) -> None:
    """A case default mode refuses on every kind does not belong in ``CHECKED_ONLY`` (nor in the docs)."""
    assert case_id in CASES, f"CHECKED_ONLY names {case_id!r}, which is no case of this catalogue"
    c = CASES[case_id]
    outcomes = {k.name: _refused_cleanly(k, c, checked=False) for k in KINDS if c.applies(k)}
    assert outcomes, f"{case_id} applies to no allocator kind"
    assert not all(ok for ok, _ in outcomes.values()), f"default mode refuses {case_id} everywhere: {outcomes}"


def test_free_group_misuse_is_a_runtime_error_too() -> None:
    """SGLang's allocators raise ``RuntimeError`` there; ``AllocatorStateError`` is both."""
    a = TokenAllocator(8)
    with pytest.raises(AllocatorStateError) as info:
        a.free_group_end()
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, AllocatorError)


def test_docs_table_lists_exactly_the_checked_only_cases() -> None:
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## Misuse", 1)[1].split("\n## ", 1)[0]
    assert "kvpools_core.allocators.misuse.CHECKED_ONLY" in section
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.MULTILINE)
    assert rows == list(CHECKED_ONLY), "docs/allocators.md's table must list CHECKED_ONLY, in its order"
