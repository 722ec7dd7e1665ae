"""vLLM 0.33's own planning code, run in the peers venv (``../shared/bench/setup_peers.sh``), as a subprocess.

vLLM is not a dependency of kvpools: it is installed ``--no-deps`` in a scratch venv (default
``/tmp/kvpools-peers-venv``, or ``$KVPOOLS_PEERS_VENV``) by ``setup_peers.sh`` from the shared checkout, and
``vllm_runner.py`` imports its planning modules there with ``peer_imports``.  Without the shared checkout or the
venv the differential tests skip (a user's clone); with ``KVPOOLS_REQUIRE_SHARED=1`` (CI) they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.oracle import locate

VLLM_VERSION = "0.33.0"
BENCH_DIR = locate.SHARED_DIR / "bench"
RUNNER = Path(__file__).with_name("vllm_runner.py")


def peers_venv() -> Path:
    return Path(os.environ.get("KVPOOLS_PEERS_VENV", "/tmp/kvpools-peers-venv"))


def _installed_vllm_version() -> str | None:
    site = next((peers_venv() / "lib").glob("python3*/site-packages"), None)
    if site is None:
        return None
    dist = next(site.glob("vllm-*.dist-info"), None)
    return dist.name.removeprefix("vllm-").removesuffix(".dist-info") if dist else None


def require_vllm() -> Path:
    """The peers venv's Python with vLLM 0.33.0, or skip/fail the caller (as ``locate`` does for the oracle)."""
    if not (BENCH_DIR / "peer_imports.py").is_file():
        locate._missing()
    python = peers_venv() / "bin" / "python"
    version = _installed_vllm_version() if python.is_file() else None
    if version != VLLM_VERSION:
        reason = (
            f"vLLM {VLLM_VERSION} is not installed in the peers venv {peers_venv()} (found {version}); the vLLM "
            f"differential tests need it: run `bash {BENCH_DIR}/setup_peers.sh` (or set KVPOOLS_PEERS_VENV)"
        )
        locate.skip_or_fail(reason)
    return python


class VllmPlanner:
    """One long-lived ``vllm_runner.py`` process: a case in, vLLM's answer out (JSON lines)."""

    def __init__(self, python: Path) -> None:
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives as long as the process; vLLM's warnings; a pipe nobody reads could fill and block
        self.process = subprocess.Popen(
            [str(python), str(RUNNER), str(BENCH_DIR)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, "PYTHONPATH": ""},
        )
        ready = self._read()
        if not ready.get("ready"):
            raise RuntimeError(f"vLLM runner did not start: {ready}")

    def _read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.log.seek(0)
            raise RuntimeError(f"vLLM runner exited: {self.log.read()[-4000:]}")
        return json.loads(line)

    def plan(self, case: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(case) + "\n")
        self.process.stdin.flush()
        answer = self._read()
        if "traceback" in answer:
            raise AssertionError(f"vLLM's planner failed unexpectedly:\n{answer['traceback']}")
        return answer

    def close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        self.process.wait(timeout=30)
        self.log.close()


__all__ = ["VllmPlanner", "require_vllm"]
