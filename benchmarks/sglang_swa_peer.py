"""SGLang 0.5.23's own ``SWATokenToKVPoolAllocator`` / ``PureSWATokenToKVPoolAllocator``, importable on a CPU box.

Runs in the peers venv (``KVPOOLS_PEERS_VENV``, SGLang installed ``--no-deps``).  The shared checkout's
``bench/peer_imports.py`` makes SGLang's token and paged allocators importable without SGLang's heavy package
``__init__`` modules; the SWA module imports four more things, answered here with the smallest stand-ins that
leave the installed allocator code itself untouched:

* ``sglang.srt.mem_cache.base_swa_memory_pool.BaseSWAKVPool``: the allocator asserts its ``kvcache`` is one;
  :class:`StubSWAPool` is (no per-request ring, no sub-pools, the mapping registered as SGLang's pools do);
* ``sglang.srt.utils.invariants``: ``expect`` does nothing, which is SGLang's default level
  (``SGLANG_INVARIANT_CHECK`` unset: ``InvariantCheckLevel.OFF``);
* ``sglang.srt.utils.common.async_h2d`` / ``get_num_new_pages`` (the latter compiled from the installed file);
* ``current_platform.get_paged_allocator_cls()`` answers None (no platform allocator on CPU).

Used by ``benchmarks/swa_bench.py`` and ``tests/allocators/sglang_peer_server.py``.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class StubSWAPool:
    """The ``kvcache`` SGLang's SWA allocator asserts it gets (made a ``BaseSWAKVPool`` on import)."""

    swa_req_ring_size = None
    full_kv_pool = None
    swa_kv_pool = None
    full_to_swa_index_mapping: Any = None

    def register_mapping(self, mapping: Any) -> None:
        self.full_to_swa_index_mapping = mapping

    def translate_loc_from_full_to_swa(self, kv_indices: Any) -> Any:
        return self.full_to_swa_index_mapping[kv_indices]


class _Invariant:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass


def _expect(*args: Any, **kwargs: Any) -> None:
    """SGLang's ``expect`` at its default level (checks off)."""


def import_sglang_swa(bench_dir: str) -> types.ModuleType:
    """SGLang's ``sglang.srt.mem_cache.allocator.swa`` module, imported from the peers venv's installed SGLang."""
    if bench_dir not in sys.path:
        sys.path.insert(0, bench_dir)
    import peer_imports  # type: ignore[import-not-found]
    import torch

    peer_imports.import_sglang_allocators()
    stub = peer_imports._STUB
    stub.add("sglang.srt.mem_cache.base_swa_memory_pool", BaseSWAKVPool=StubSWAPool)
    stub.add(
        "sglang.srt.utils.invariants",
        Invariant=_Invariant,
        expect=_expect,
        Bucket=types.SimpleNamespace(FATAL_UNCONTAINABLE="fatal_uncontainable", GUARD="guard"),
        IsTrue=lambda: None,
    )
    utils = importlib.import_module("sglang.srt.utils")
    utils.is_npu = lambda: False  # type: ignore[attr-defined]
    stub.add(
        "sglang.srt.utils.common",
        async_h2d=lambda values, dtype, device: torch.tensor(values, dtype=dtype, device=device),
        get_num_new_pages=utils.get_num_new_pages,
    )
    platform = importlib.import_module("sglang.srt.platforms").current_platform
    type(platform).get_paged_allocator_cls = lambda self: None
    return importlib.import_module("sglang.srt.mem_cache.allocator.swa")
