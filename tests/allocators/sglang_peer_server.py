"""SGLang's own allocators from the installed 0.5.23, driven over stdin/stdout (run by the peers venv's python).

``test_allocator_vs_sglang.py`` starts this once with the peers venv's interpreter (SGLang is not a
kvpools dependency, and its venv has its own torch) and sends one JSON request per line; every reply is
``{"out": <slots as a list, or null>, "available": <available_size()>}``.  The allocator classes come from
the shared checkout's ``bench/peer_imports.py``, which imports the real installed code without SGLang's
heavy package ``__init__`` modules.

usage: python sglang_peer_server.py <shared bench dir>
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    sys.path.insert(0, sys.argv[1])
    import peer_imports  # type: ignore[import-not-found]
    import torch

    token_cls, paged_cls, _ = peer_imports.import_sglang_allocators()
    alloc = None

    def tensor(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64)

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        op, out = req["op"], None
        if op == "new":
            if req["page"] == 1:
                alloc = token_cls(req["size"], torch.bfloat16, "cpu", None, req["need_sort"])
            else:
                alloc = paged_cls(req["size"], req["page"], torch.bfloat16, "cpu", None, req["need_sort"])
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
        elif op == "group_begin":
            alloc.free_group_begin()
        elif op == "group_end":
            alloc.free_group_end()
        reply = {"out": None if out is None else out.tolist(), "available": alloc.available_size()}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
