"""The oracle's process-group teardown for this folder's differential tests."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _swa_oracle_process_group() -> Iterator[None]:
    """Tear down the gloo group (and its file store) that pipeline-parallel oracle runs create."""
    yield
    if "tests.oracle.adapter" in sys.modules:
        sys.modules["tests.oracle.adapter"].shutdown()
