"""The SGLang side of the unified-pool differential tests, and the kvpools side built from the same specs.

A spec is a dict the peer server (``unified_peer_server.py``, run by the peers
venv's python) turns into SGLang's ``MHASubPoolSpec`` / ``MLASubPoolSpec`` /
``MambaSubPoolSpec`` (bf16 KV and conv state, fp32 temporal state) and
:func:`entry` into kvpools' :class:`~kvpools_core.parts.unified.SubPoolEntry`.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

from kvpools_core.allocators.unified import MultiEndedAllocator
from kvpools_core.allocators.unified_float import FloatAllocator
from kvpools_core.parts.unified import SubPoolEntry, mha_entry, mla_entry, state_entry
from tests.oracle import locate

SERVER = Path(__file__).with_name("unified_peer_server.py")


def entry(spec: dict[str, Any]) -> SubPoolEntry:
    """kvpools' entry for one peer spec."""
    if spec["kind"] == "mha":
        return mha_entry(
            spec["name"],
            layer_num=spec["layers"],
            head_num=spec["heads"],
            head_dim=spec["head_dim"],
            v_head_dim=spec.get("v_head_dim"),
            itemsize=2,
        )
    if spec["kind"] == "mla":
        return mla_entry(
            spec["name"], layer_num=spec["layers"], kv_lora_rank=spec["rank"], qk_rope_head_dim=spec["rope"], itemsize=2
        )
    return state_entry(
        spec["name"],
        layer_num=spec["layers"],
        conv_row_bytes=[math.prod(s) * 2 for s in spec["conv"]],
        temporal_row_bytes=math.prod(spec["temporal"]) * 4,
    )


class Peer:
    """SGLang's unified pool in the peers venv, one JSON line per call."""

    def __init__(self) -> None:
        python, bench = locate.require_sglang_peer()
        self.proc = subprocess.Popen(
            [str(python), str(SERVER), str(bench)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert json.loads(self._line()) == {"ready": True}

    def _line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the SGLang peer exited ({self.proc.poll()}); see its stderr above")
        return line

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.proc.stdin.flush()
        return dict(json.loads(self._line()))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def member_state(m: MultiEndedAllocator) -> dict[str, Any]:
    """One kvpools END in the peer server's ``state`` shape."""
    return {
        "wm": m.watermark_physical,
        "avail": m.available_size(),
        "sched": m.schedulable_available_size(),
        "holes": sorted(m.holes.tolist()),
        "v2p": m.virtual_to_physical.tolist(),
        "p2v": m.physical_to_virtual.tolist(),
        "live": m.allocated_count(),
        "fv": None if m.free_virtual_ids is None else m.free_virtual_ids.tolist(),
        "span": [m.low_wm, m.high_wm] if isinstance(m, FloatAllocator) else None,
    }
