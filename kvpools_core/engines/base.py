"""What an engine accounting is: the interface every engine of :mod:`kvpools_core.engines` answers through."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs


@attrs.frozen(kw_only=True)
class Engine:
    """One serving engine's memory accounting, as the planners and the command line call it.

    ``plan(model, serving, **budget)`` answers "what does this budget hold" exactly as the engine's own
    start-up does (``--accounting`` picks the engine by one of its ``accountings``); ``version`` is the
    engine release whose code the accounting reproduces (the differential tests run that release).
    """

    name: str
    version: str
    accountings: tuple[str, ...]
    plan: Callable[..., Any]
    summary: str
    docs: str
