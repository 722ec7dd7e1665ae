"""Shared fixtures of the allocator tests."""

from __future__ import annotations

import warnings

import pytest

with warnings.catch_warnings():
    # a torch wheel installed without numpy warns once at import; warnings are errors here
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy", category=UserWarning)
    import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    """Every device torch sees here: the allocators must behave the same on each."""
    return str(request.param)
