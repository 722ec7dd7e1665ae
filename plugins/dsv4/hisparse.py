"""DeepSeek-V4 with HiSparse: the device bytes SGLang 0.5.23 adds beside the DSV4 pool (torch-free).

With ``--enable-hisparse`` on a DeepSeek-V4 model SGLang keeps the configurator's sizes (the c4 pool shrunk to
``full // (4 x host_to_device_ratio)``, ``DSV4PoolConfigurator.c4_shrink_factor``, ref-002) and builds:

* the c4 pool as ``HiSparseC4DevicePool`` (``mem_cache/deepseek_v4_memory_pool.py``): the same packed rows, plus
  one uint64 data pointer per c4 layer (``data_ptrs``; :data:`~.buffers.HISPARSE_PTRS_POOL`, planned by
  :mod:`.buffers`);
* ``DeepSeekV4HiSparseTokenToKVPoolAllocator`` around the usual ``SWATokenToKVPoolAllocator`` (ref-000
  ``_build_token_to_kv_pool_allocator``, lines 2166-2170 of ``000_fbd4f47288598fb9.txt``: "DeepSeek V4 HiSparse
  requires SWA mode."; ``mem_cache/allocator/hisparse.py``), which adds two device allocations of its own:

  - ``hisparse_attn_allocator``: a paged allocator (``PagedTokenToKVPoolAllocator``, the CUDA platform has no
    class of its own) over the c4 device pool's ``size`` rows (``c4_max_total_num_tokens``), paged by the c4
    pool's page ``P // 4`` (:data:`C4_HISPARSE_ALLOCATOR`);
  - ``full_to_hisparse_device_index_mapping``: int64, ``c4_logical_size + P // 4`` zeros and one ``-1``, where
    ``c4_logical_size = c128_size x 32`` (``DeepSeekV4TokenToKVPool.__init__``) (:data:`C4_HISPARSE_MAPPING`).

The logical allocator is the SWA allocator the plan already has (full and SWA pages, the full-to-SWA mapping).
The host copy (``DeepSeekV4PagedHostPool``) is host memory, and the ``HiSparseCoordinator``'s per-request device
working buffers are made by the scheduler after the pools, out of the memory SGLang leaves beside them, as for
DSA's HiSparse (:mod:`kvpools_core.parts.hisparse`): neither is a pool of this plan.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from kvpools_core.options import option
from kvpools_core.parts.hisparse import mapping_pool
from kvpools_core.parts.sizing import allocator_pool
from kvpools_core.values import ModelSpec, PoolSpec, Serving

__all__ = [
    "C4_HISPARSE_ALLOCATOR",
    "C4_HISPARSE_MAPPING",
    "C4_LOGICAL_PER_C128",
    "MAPPING_ENTRY_BYTES",
    "c4_device_rows",
    "c4_page",
    "dsv4_hisparse_problems",
    "hisparse_allocator_layout",
    "hisparse_mapping_entries",
    "uses_hisparse_allocator",
]

C4_HISPARSE_ALLOCATOR = "c4_hisparse_allocator"
"""``DeepSeekV4HiSparseTokenToKVPoolAllocator.hisparse_attn_allocator``: the c4 device rows' free pages."""
C4_HISPARSE_MAPPING = "c4_hisparse_mapping"
"""``full_to_hisparse_device_index_mapping``: c4 logical slot -> c4 device row (int64)."""
MAPPING_ENTRY_BYTES = 8
C4_LOGICAL_PER_C128 = 32
"""``c4_logical_size = c128_size * 32`` (``DeepSeekV4TokenToKVPool.__init__``)."""
C4_TOKENS, C128_TOKENS = "c4", "c128"

_Make = Callable[[str], PoolSpec]

SGLANG_TOPK_MESSAGE = (
    "The minimal HiSparse spec integration supports linear speculation only; use --speculative-eagle-topk 1."
)
SGLANG_ADAPTIVE_MESSAGE = (
    "HiSparse speculative decoding uses statically sized swap state; --speculative-adaptive is not supported."
)


def dsv4_hisparse_problems(serving: Serving) -> list[str]:
    """What ``validate_hisparse`` (``arg_groups/hisparse_hook.py``) refuses beside the model class and the radix
    cache (the core's): speculative decoding with top-k above 1, or adaptive.  DeepSeek-V4 skips the DSA
    kv-cache-dtype and backend checks there ("DSv4 hisparse handles its own dtype/backend pairing")."""
    if not serving.enable_hisparse or not serving.speculative:
        return []
    o = option
    problems = []
    if (serving.speculative_eagle_topk or 1) != 1:
        problems.append(
            f"SGLang refuses {o('enable_hisparse')} with {o('speculative_eagle_topk')} "
            f"{serving.speculative_eagle_topk}: '{SGLANG_TOPK_MESSAGE}'"
        )
    if serving.speculative_adaptive:
        problems.append(
            f"SGLang refuses {o('enable_hisparse')} with {o('speculative_adaptive')}: '{SGLANG_ADAPTIVE_MESSAGE}' "
            f"Drop {o('speculative_adaptive')}."
        )
    return problems


def c4_page(page_size: int) -> int:
    """The c4 pool's page, ``page_size // 4`` (``_init_compressed_pools``), its allocator's ``hisparse_page_size``."""
    return max(page_size // 4, 1)


def uses_hisparse_allocator(model: ModelSpec, serving: Serving) -> bool:
    """SGLang wraps the allocator when HiSparse is on and the model has c4 layers (its c4 pool is then a
    ``HiSparseC4DevicePool``, even on a pipeline stage holding none of them: the pool is kept per model ratio)."""
    return serving.enable_hisparse and any(int(layer.params.get("compress_ratio", 0)) == 4 for layer in model.layers)


def c4_device_rows(c4_tokens: int, page_size: int) -> int:
    """The rows the c4 device allocator hands out: whole pages of ``P // 4`` (SGLang's paged allocator keeps
    ``num_pages = size // page_size``; ``c4_max_total_num_tokens = full // (4 x ratio)`` need not be whole pages)."""
    page = c4_page(page_size)
    return c4_tokens // page * page


def hisparse_mapping_entries(c128_tokens: int, page_size: int) -> int:
    """``c4_logical_size + hisparse_page_size`` zeros and the trailing ``-1``."""
    return c128_tokens * C4_LOGICAL_PER_C128 + c4_page(page_size) + 1


def hisparse_allocator_layout(c4_tokens: int, c128_tokens: int, page_size: int) -> list[tuple[int, _Make]]:
    """The allocator's two device allocations as ``(bytes, make(owner) -> PoolSpec)`` (:mod:`.buffers`' layout)."""
    page = c4_page(page_size)
    rows = c4_device_rows(c4_tokens, page_size)
    allocator = allocator_pool(rows, page, token_space=C4_TOKENS, name=C4_HISPARSE_ALLOCATOR)
    entries = hisparse_mapping_entries(c128_tokens, page_size)
    return [
        (allocator.bytes, partial(_allocator, rows, page)),
        (entries * MAPPING_ENTRY_BYTES, partial(_mapping, c128_tokens, page_size)),
    ]


def _allocator(c4_tokens: int, page: int, owner: str) -> PoolSpec:
    return allocator_pool(c4_tokens, page, token_space=C4_TOKENS, name=C4_HISPARSE_ALLOCATOR, owner=owner)


def _mapping(c128_tokens: int, page_size: int, owner: str) -> PoolSpec:
    """32 int64 entries per c128 token (the logical c4 slots), and ``P // 4 + 1`` more, fixed."""
    return mapping_pool(
        c128_tokens * C4_LOGICAL_PER_C128,
        c4_page(page_size),
        owner,
        name=C4_HISPARSE_MAPPING,
        token_space=C128_TOKENS,
        slot_space=C4_TOKENS,
        slots_per_token=C4_LOGICAL_PER_C128,
    )
