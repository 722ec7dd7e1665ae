"""Summarise a ``bench_alloc.py`` JSON: our core time against the faster peer of each kind.

usage: python benchmarks/summarize.py RESULTS.json

The target is "at most half the core alloc+free time of the faster peer of
the same kind" (token: SGLang's token allocator; extend_decode: SGLang's paged
allocator, page 16 or 64; page: vLLM's BlockPool).  Only adapters present in
the file are compared.
"""

from __future__ import annotations

import json
import sys
from typing import Any

PEERS = {
    "token": ["sglang-token"],
    "extend_decode": ["sglang-paged16-extend", "sglang-paged64-extend"],
    "page": ["vllm-blockpool16", "vllm-blockpool64"],
}
TARGET = 0.5


def core(row: dict[str, Any]) -> float:
    return float(row["core_alloc_s"]) + float(row["core_free_s"])


def summarize(doc: dict[str, Any]) -> str:
    lines = []
    for scen in doc["scenarios"]:
        rows = {r["adapter"]: r for r in scen["results"]}
        lines += [
            f"### {scen['summary'].get('scenario', '')}".rstrip(),
            "",
            "| adapter | kind (page) | core alloc s | core free s | core alloc+free s | faster peer (alloc+free s) "
            "| ratio | target <= 0.5 |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, r in rows.items():
            if r.get("core_alloc_s") is None:
                continue
            peers = [rows[p] for p in PEERS.get(r["kind"], []) if p in rows and p != name]
            is_peer = name in {p for ps in PEERS.values() for p in ps}
            if is_peer or not peers:
                best, ratio, ok = "-", "-", "-"
            else:
                fastest = min(peers, key=core)
                best = f"{fastest['adapter']} ({core(fastest):.4f})"
                value = core(r) / core(fastest)
                ratio, ok = f"{value:.2f}", "yes" if value <= TARGET else "NO"
            lines.append(
                f"| {name} | {r['kind']} ({r['page_size']}) | {r['core_alloc_s']:.4f} | {r['core_free_s']:.4f} "
                f"| {core(r):.4f} | {best} | {ratio} | {ok} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as fh:
        print(summarize(json.load(fh)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
