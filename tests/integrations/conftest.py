"""One intra-op thread for the integration tests: the models are tiny, and on a shared two-core machine torch's
thread pool spends more time contending than computing (a 1 s generation takes 10 s with the default count)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
