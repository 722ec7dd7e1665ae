"""Differential tests against SGLang's own sizing code (the oracle in ``../shared/oracle``).

The oracle is not a package dependency: CI runs a clean clone with ``../shared``
beside the repository root.  Without it these tests cannot mean anything, so
collection fails with a message saying where the oracle was looked for.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ORACLE_DIR = (Path(__file__).parents[2] / ".." / "shared" / "oracle").resolve()

if not (ORACLE_DIR / "sglang_oracle" / "oracle.py").is_file():
    pytest.fail(
        f"tests/oracle needs SGLang's sizing oracle at {ORACLE_DIR} (the shared checkout beside the "
        f"repository root, ../shared/oracle/sglang_oracle). Clone or mount ../shared next to the repo, "
        f"or leave this folder out with --ignore=tests/oracle.",
        pytrace=False,
    )
if str(ORACLE_DIR) not in sys.path:
    sys.path.insert(0, str(ORACLE_DIR))


@pytest.fixture(scope="session", autouse=True)
def _oracle_process_group() -> Iterator[None]:
    """Tear down the one-process gloo group the PP emulation creates (and its file store)."""
    from . import adapter

    yield
    adapter.shutdown()
