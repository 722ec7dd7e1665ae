"""kvpools allocators as adapters of the shared trace-replay benchmark.

Load with ``bench_alloc.py --plugin benchmarks.bench_adapter:register`` (see
``benchmarks/README.md``).  Every adapter mirrors the matching peer adapter of
the harness: list <-> tensor conversions happen outside the timed call, and
``_CoreTimer`` records the time spent inside our allocator methods only
("peer core s" in the harness's table).

Adapters:

* ``kvpools-token``: ``TokenAllocator``, batched (one ``alloc`` per step),
  frees in a free group per step -- as ``sglang-token``.
* ``kvpools-paged{16,64}-extend``: ``PagedAllocator.alloc_extend`` /
  ``alloc_decode`` / ``free`` -- as ``sglang-paged*-extend``.
* ``kvpools-paged{16,64}-pages``: ``PagedAllocator.alloc_pages`` /
  ``free_pages`` with Python ints, one call per request -- as
  ``vllm-blockpool16`` / ``vllm-blockpool64`` (the harness's vLLM adapter at
  page 64, registered here).
* ``kvpools-token-checked``: ``kvpools-token`` with ``checked=True`` (double
  and foreign frees refused): compared with ``kvpools-token``.

``KVPOOLS_BENCH_ROOT``: the checkout whose ``kvpools_core.allocators`` is
measured (default: this one), to measure another version with the same
adapters and trace.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

try:  # the harness puts its own folder on sys.path before loading plugins
    import bench_alloc as _b  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - only when imported outside the harness
    sys.path.insert(0, os.environ.get("KVPOOLS_BENCH_DIR", "/work/shared/bench"))
    import bench_alloc as _b


def _import_allocators() -> Any:
    """``kvpools_core.allocators``, which needs only torch.

    Falls back to this checkout when kvpools is not installed in the venv, and
    to loading the subpackage without running ``kvpools_core/__init__`` (the
    planner and its dependencies) when importing the whole package fails.
    """
    root = os.environ.get("KVPOOLS_BENCH_ROOT") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        if os.environ.get("KVPOOLS_BENCH_ROOT"):
            raise ImportError("measure the checkout KVPOOLS_BENCH_ROOT names")
        import kvpools_core.allocators as mod
    except Exception:
        if root not in sys.path:
            sys.path.insert(0, root)
        for name in [m for m in sys.modules if m == "kvpools_core" or m.startswith("kvpools_core.")]:
            del sys.modules[name]
        try:
            import kvpools_core.allocators as mod
        except Exception:
            for name in [m for m in sys.modules if m == "kvpools_core" or m.startswith("kvpools_core.")]:
                del sys.modules[name]
            bare = types.ModuleType("kvpools_core")
            bare.__path__ = [os.path.join(root, "kvpools_core")]
            sys.modules["kvpools_core"] = bare
            mod = importlib.import_module("kvpools_core.allocators")
    return mod


if TYPE_CHECKING:
    from kvpools_core.allocators import PagedAllocator, TokenAllocator
else:
    _alloc = _import_allocators()
    PagedAllocator = _alloc.PagedAllocator
    TokenAllocator = _alloc.TokenAllocator

VERSION = "kvpools 0.1.0"


def register(reg: Callable[[str, Callable[[int], Any]], None]) -> None:
    """Register our adapters with the harness (``--plugin ...:register``)."""
    reg("kvpools-token", KvpoolsTokenAdapter)
    reg("kvpools-token-checked", partial(KvpoolsTokenAdapter, checked=True))
    reg("vllm-blockpool64", lambda capacity_tokens: _b.VllmBlockPoolAdapter(capacity_tokens, 64, enable_caching=False))
    for page_size in (16, 64):
        reg(f"kvpools-paged{page_size}-extend", partial(KvpoolsExtendAdapter, page_size=page_size))
        reg(f"kvpools-paged{page_size}-pages", partial(KvpoolsPageAdapter, page_size=page_size))


def _i64(values: Sequence[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


class KvpoolsTokenAdapter(_b.TokenAdapter, _b._CoreTimer):  # type: ignore[misc]
    """``TokenAllocator`` used like SGLang's token allocator (batched)."""

    name = "kvpools-token"
    version = VERSION
    batched = True

    def __init__(self, capacity_tokens: int, checked: bool = False) -> None:
        super().__init__(capacity_tokens)
        self.a = TokenAllocator(capacity_tokens, checked=checked)
        if checked:
            self.name = "kvpools-token-checked"

    def available_tokens(self) -> int:
        return self.a.available_size()

    def alloc(self, n: int) -> list[int] | None:
        out = self._timed(self.a.alloc, n)
        return None if out is None else out.tolist()

    def free(self, slots: Sequence[int]) -> None:
        self._timed(self.a.free, _i64(slots), bucket="free")

    def free_batch_begin(self) -> None:
        self.a.free_group_begin()

    def free_batch_end(self) -> None:
        self._timed(self.a.free_group_end, bucket="free")

    def index_limit(self) -> int:
        return int(self.capacity_tokens) + 1


class KvpoolsExtendAdapter(_b.ExtendDecodeAdapter, _b._CoreTimer):  # type: ignore[misc]
    """``PagedAllocator`` through SGLang's batched ``alloc_extend`` / ``alloc_decode``."""

    version = VERSION

    def __init__(self, capacity_tokens: int, page_size: int) -> None:
        super().__init__(capacity_tokens, page_size)
        self.name = f"kvpools-paged{page_size}-extend"
        self.a = PagedAllocator(capacity_tokens, page_size)

    def available_tokens(self) -> int:
        return self.a.available_size()

    def alloc_extend(
        self, prefix_lens: list[int], seq_lens: list[int], last_loc: list[int], extend_num_tokens: int
    ) -> list[int] | None:
        # like the SGLang adapter: tensors built outside, page count computed inside the timed call
        pre, seq, last = _i64(prefix_lens), _i64(seq_lens), _i64(last_loc)
        out = self._timed(self.a.alloc_extend, pre, seq, last, extend_num_tokens)
        return None if out is None else out.tolist()

    def alloc_decode(self, seq_lens: list[int], last_loc: list[int]) -> list[int] | None:
        seq, last = _i64(seq_lens), _i64(last_loc)
        out = self._timed(self.a.alloc_decode, seq, last)
        return None if out is None else out.tolist()

    def free(self, slots: Sequence[int]) -> None:
        self._timed(self.a.free, _i64(slots), bucket="free")

    def free_batch_begin(self) -> None:
        self.a.free_group_begin()

    def free_batch_end(self) -> None:
        self._timed(self.a.free_group_end, bucket="free")

    def index_limit(self) -> int:
        page_size = int(self.page_size)
        return (int(self.capacity_tokens) // page_size + 1) * page_size


class KvpoolsPageAdapter(_b.PageAdapter, _b._CoreTimer):  # type: ignore[misc]
    """``PagedAllocator.alloc_pages`` / ``free_pages`` used like vLLM's BlockPool."""

    version = VERSION

    def __init__(self, capacity_tokens: int, page_size: int) -> None:
        super().__init__(capacity_tokens, page_size)
        self.name = f"kvpools-paged{page_size}-pages"
        self.a = PagedAllocator(capacity_tokens, page_size)

    def available_pages(self) -> int:
        return self.a.available_size() // int(self.page_size)

    def alloc_pages(self, n: int) -> list[int] | None:
        out: list[int] | None = self._timed(self.a.alloc_pages, n)
        return out

    def free_pages(self, pages: list[int]) -> None:
        self._timed(self.a.free_pages, pages, bucket="free")

    def index_limit(self) -> int:
        return int(self.capacity_pages) + 1
