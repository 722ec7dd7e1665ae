"""SGLang's allocators in the peers venv (``sglang_peer_server.py``), one JSON line per call."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

SERVER = Path(__file__).with_name("sglang_peer_server.py")


class Peer:
    """The server process; :meth:`call` sends one operation and returns its reply (``out``, ``available``,
    ``free``)."""

    def __init__(self, python: Path, bench: Path) -> None:
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
        reply: dict[str, Any] = json.loads(self._line())
        return reply

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
