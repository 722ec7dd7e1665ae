"""Run SGLang 0.5.23's own ``SWATokenToKVPoolAllocator`` in per-request ring mode (the peers venv, CPU).

Usage: ``python sglang_swa_ring_peer.py BENCH_DIR`` with a JSON list of cases on stdin, each
``{"full": F, "swa": S, "page": P, "ring": R, "slots": N, "taken": k}``; prints one JSON list of answers: per case
``is_swa_req_ring``, ``swa_ring_cost_tokens``, ``size_swa``, and ``swa_available_size`` / ``available_size``
after ``k`` request slots are taken.

The allocator module (``mem_cache/allocator/swa.py``) is the installed code, imported as
``benchmarks/sglang_swa_peer.py`` imports it; its ``kvcache`` is that file's ``StubSWAPool`` with
``swa_req_ring_size = R`` (what ``DeepSeekV4TokenToKVPool`` sets on the unified-KV layout), its request table a
stand-in whose ``available_size`` is the free slots.  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


class _Table:
    def __init__(self, free: int) -> None:
        self.free = free

    def available_size(self) -> int:
        return self.free


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository root: benchmarks.sglang_swa_peer
    import torch

    from benchmarks.sglang_swa_peer import StubSWAPool, import_sglang_swa

    swa = import_sglang_swa(sys.argv[1])
    answers: list[dict[str, Any]] = []
    for case in json.load(sys.stdin):
        pool = StubSWAPool()
        pool.swa_req_ring_size = case["ring"]
        table = _Table(case["slots"])
        alloc = swa.SWATokenToKVPoolAllocator(
            case["full"],
            case["swa"],
            page_size=case["page"],
            dtype=torch.bfloat16,
            device="cpu",
            kvcache=pool,
            need_sort=False,
            req_to_token_pool=table,
        )
        table.free -= case["taken"]
        answers.append(
            {
                "is_swa_req_ring": swa.is_swa_req_ring(alloc),
                "swa_ring_cost_tokens": alloc.swa_ring_cost_tokens,
                "size_swa": alloc.size_swa,
                "swa_available_size": alloc.swa_available_size(),
                "available_size": alloc.available_size(),
            }
        )
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
