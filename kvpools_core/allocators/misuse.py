"""The allocator misuse that only checked mode refuses: one list, cited by ``docs/allocators.md``.

Every allocator (token, paged, NPU paged, dual and pure SWA) refuses misuse with
``AllocatorError`` and changes nothing.  Default mode does so with checks that
cost O(1) Python work or one vectorised op over the ids given (ranges, integer
dtypes, counts, batch tensors of one length, counts >= 0, a free of more ids
than are allocated, an SWA ``free_full`` of slots still mapped).  What needs
state per id (an "allocated" map) or a reduction over a batch (a device sync on
an accelerator) is left to checked mode (``checked=True``, ``build(plan, device,
checked=True)``, ``--checked-allocators``): the misuse below.  Each key is a case
of ``tests/allocators/test_misuse_catalogue.py``, which checks that checked mode
refuses it, that default mode refuses every case not listed here, and that each
one listed here still gets past default mode on some allocator (so none goes
stale); the docs table is checked equal to this list.
"""

from __future__ import annotations

__all__ = ["CHECKED_ONLY"]

CHECKED_ONLY: dict[str, str] = {
    "double_free_while_held": (
        "a slot / page freed a second time while at least as many others are allocated: it is put on the free "
        "list twice and later handed out to two requests"
    ),
    "double_free_in_free_group": (
        "the same, inside a free group (the paged allocator de-duplicates a group's pages at its end, so there it "
        "is freed once)"
    ),
    "double_free_pages_while_held": "`free_pages([q])` of a page freed already, while others are allocated: as above",
    "free_never_allocated_while_held": (
        "a free of a slot / page that is in range but free now, while others are allocated: as a double free"
    ),
    "repeat_in_one_free": (
        "one slot twice in one token free (`free([s, s])`) while others are allocated: as a double free (the paged "
        "allocator frees each page once, whatever the repeats)"
    ),
    "repeat_in_free_pages": "one page twice in one `free_pages([q, q])` while others are allocated: as a double free",
    "free_rest_of_freed_page": (
        "paged: a free of the other slots of a page already freed through some of its slots: a double free of the page"
    ),
    "free_full_after_free": "SWA: `free_full` of full slots `free` gave back already: a double free of the full slots",
    "free_after_free_full": (
        "SWA: `free` of full slots `free_swa` + `free_full` gave back already: a double free of the full slots"
    ),
    "free_swa_of_free_slots": "SWA: `free_swa` of full slots that are free now: nothing happens (they map to nothing)",
    "pure_free_after_free_swa": (
        "pure SWA: `free` of slots `free_swa` gave back (both free the one pool): a double free"
    ),
    "extend_prefix_above_seq": (
        "`alloc_extend` with `prefix_lens > seq_lens`: the pages counted per request are wrong (a negative total "
        "is refused always)"
    ),
    "extend_num_tokens_mismatch": (
        "`alloc_extend` whose `extend_num_tokens` is not `sum(seq_lens - prefix_lens)`: that many slots are "
        "returned, not the batch's (where the slot gather fails, the pages are given back and the call refused)"
    ),
    "extend_num_new_pages_wrong": (
        "`alloc_extend(num_new_pages=k)` with `k` not the pages the batch needs: fewer pages taken than "
        "slots handed out (a page handed out twice), or pages leaked"
    ),
    "extend_foreign_last_loc": (
        "`alloc_extend` continuing an open page through a `last_loc` in a page not allocated: slots of a free "
        "page are handed out"
    ),
    "extend_misplaced_last_loc": (
        "`alloc_extend` whose `last_loc` is not the slot before position `prefix_lens` in its page: "
        "slots of the wrong offsets are handed out"
    ),
    "extend_last_loc_past_pool": (
        "`alloc_extend` continuing a page through a `last_loc` past the pool: slot ids past the pool are "
        "handed out (the SWA allocator refuses it always: its mapping has no entry there)"
    ),
    "extend_from_evicted_swa_page": (
        "SWA: `alloc_extend` continuing a page whose SWA page `free_swa` gave back: the SWA side continues "
        "the padding page"
    ),
    "swa_tail_mid_page": (
        "SWA: `alloc_extend_swa_tail` whose tail starts mid-page: its SWA pages do not line up with the full pages"
    ),
    "decode_seq_len_zero": "`alloc_decode` with `seq_lens < 1`: a slot before the request's first is handed out",
    "decode_num_new_pages_wrong": (
        "`alloc_decode(num_new_pages=k)` with `k` not the requests that start a page: as for `alloc_extend`"
    ),
    "decode_foreign_last_loc": (
        "`alloc_decode` continuing a page through a `last_loc` in a page not allocated: a free slot is handed out"
    ),
    "decode_from_evicted_swa_page": (
        "SWA: `alloc_decode` continuing a page whose SWA page `free_swa` gave back: as for `alloc_extend`"
    ),
    "host_copy_of_free_slots": (
        "`get_cpu_copy` / `load_cpu_copy` of slots in range but free now: rows of free slots are read or written"
    ),
}
"""Case id -> what default mode does with that misuse (checked mode refuses it, changing nothing)."""
