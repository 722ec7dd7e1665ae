"""SGLang's own allocators from the installed 0.5.23, driven over stdin/stdout (run by the peers venv's python).

``test_allocator_vs_sglang.py`` and ``test_segment_frees_vs_sglang.py`` start this once with the peers
venv's interpreter (SGLang is not a kvpools dependency, and its venv has its own torch) and send one JSON
request per line; every reply is ``{"out": <slots as a list, or null>, "available": <available_size()>,
"free": <the free list(s)>}``.  The allocator classes come from the shared checkout's
``bench/peer_imports.py``, which imports the real installed code without SGLang's heavy package
``__init__`` modules; the SWA allocators from ``benchmarks/sglang_swa_peer.py`` on top of it.

The free list is ``get_all_free_pages()`` (the token allocator: ``free_pages`` then ``release_pages``); for
the SWA allocators ``[full side, SWA side]`` and ``available`` is ``[full, swa]``.

usage: python sglang_peer_server.py <shared bench dir>
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    sys.path.insert(0, str(Path(__file__).parents[2]))  # the repository root: benchmarks.sglang_swa_peer
    import peer_imports  # type: ignore[import-not-found]
    import torch

    from benchmarks.sglang_swa_peer import StubSWAPool, import_sglang_swa

    token_cls, paged_cls, _ = peer_imports.import_sglang_allocators()
    swa = import_sglang_swa(sys.argv[1])
    alloc = None

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64)

    def segments(req: dict) -> list:
        return [(tensor(slots), start) for slots, start in req["segments"]]

    def free_list(a: object) -> list[int]:
        if isinstance(a, token_cls):
            return torch.cat((a.free_pages, a.release_pages)).tolist()
        return a.get_all_free_pages().tolist()

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        op, out = req["op"], None
        if op == "new":
            if req["page"] == 1:
                alloc = token_cls(req["size"], torch.bfloat16, "cpu", None, req["need_sort"])
            else:
                alloc = paged_cls(req["size"], req["page"], torch.bfloat16, "cpu", None, req["need_sort"])
        elif op == "new_swa":
            alloc = swa.SWATokenToKVPoolAllocator(
                req["size"], req["size_swa"], req["page"], torch.bfloat16, "cpu", StubSWAPool(), req["need_sort"]
            )
        elif op == "alloc":
            out = alloc.alloc(req["n"])
        elif op == "alloc_extend":
            pre, seq = tensor(req["pre"]), tensor(req["seq"])
            out = alloc.alloc_extend(pre, pre, seq, seq, tensor(req["last"]), req["n"])
        elif op == "alloc_decode":
            seq = tensor(req["seq"])
            out = alloc.alloc_decode(seq, seq, tensor(req["last"]))
        elif op == "free":
            alloc.free(tensor(req["slots"]))
        elif op in ("free_swa", "free_full", "free_page_ids"):
            getattr(alloc, op)(tensor(req["slots"]))
        elif op in ("free_segment", "free_swa_segment", "free_full_segment"):
            getattr(alloc, op)(tensor(req["slots"]), start_pos=req["start"])
        elif op in ("free_segments", "free_full_segments"):
            getattr(alloc, op)(segments(req))
        elif op == "group_begin":
            alloc.free_group_begin()
        elif op == "group_end":
            alloc.free_group_end()
        if isinstance(alloc, swa.SWATokenToKVPoolAllocator):
            available = [alloc.full_available_size(), alloc.swa_available_size()]
            free = [free_list(alloc.full_attn_allocator), free_list(alloc.swa_attn_allocator)]
        else:
            available, free = alloc.available_size(), free_list(alloc)
        reply = {"out": None if out is None else out.tolist(), "available": available, "free": free}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
