"""The service under test: one app per session (plugins and presets load once), driven in-process.

Every fixture here skips, naming the missing package, where the ``serve`` extra (fastapi, uvicorn) or the
in-process client (httpx2, which starlette's TestClient drives) is not installed: ``nox -s serve`` installs them.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

EXTRA = "the serve extra is not installed (pip install -e '.[serve]' httpx2; nox -s serve runs these tests)"


def need_extra() -> None:
    pytest.importorskip("fastapi", reason=EXTRA)
    pytest.importorskip("uvicorn", reason=EXTRA)
    pytest.importorskip("httpx2", reason=EXTRA)


@pytest.fixture(scope="session")
def app() -> Any:
    need_extra()
    from kvpools_core.serve.app import create_app

    return create_app()


@pytest.fixture(scope="session")
def client(app: Any) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def cli_json(exe: str, env: dict[str, str], *args: str) -> Any:
    """The CLI's JSON answer for ``args`` (the real console script)."""
    out = subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def cli_error(exe: str, env: dict[str, str], *args: str) -> str:
    """The CLI's error text for ``args`` (its ``Error: `` paragraph, without the prefix)."""
    out = subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1, out.stdout
    assert out.stderr.startswith("Error: "), out.stderr
    return out.stderr.removeprefix("Error: ").strip()
