"""A memo of the last ``(model, serving)`` a function was asked about, by identity (issue 37).

One plan asks several times for what the DeepSeek-V4 plugin derives from the model and the serving alone (the
stage's layers by compress ratio, the configurator's shape): the cell, the validation, the exact search and the
pool values of its answer.  Both arguments are frozen values, so the answer for the same two objects cannot
change; the memo keeps them alive, so their identities are not reused while they are remembered.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

from kvpools_core.values import ModelSpec, Serving

T = TypeVar("T")


def last_pair(fn: Callable[[ModelSpec, Serving], T]) -> Callable[[ModelSpec, Serving], T]:
    """``fn`` remembering its answer for the last ``(model, serving)`` objects it was called with."""
    last: list[tuple[ModelSpec, Serving, T]] = []

    @functools.wraps(fn)
    def remembered(model: ModelSpec, serving: Serving) -> T:
        if last:
            seen_model, seen_serving, value = last[0]
            if seen_model is model and seen_serving is serving:
                return value
        value = fn(model, serving)
        last[:] = [(model, serving, value)]
        return value

    return remembered


def per_model(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn(model, *args)`` remembered per model object (by identity) and ``args`` (hashable), for a few dozen models.

    What a ``ModelSpec`` says of its layers (their compress ratios, the stage's layers of each) is the same for the
    spec's life, and a preset's spec is one object for every plan of it (``kvpools_core.models.load_model``), so
    a 61-layer walk is done once per preset and stage, not once per plan."""
    seen: dict[tuple[int, tuple[object, ...]], tuple[ModelSpec, T]] = {}

    @functools.wraps(fn)
    def remembered(model: ModelSpec, *args: object) -> T:
        key = (id(model), args)
        hit = seen.get(key)
        if hit is not None and hit[0] is model:
            return hit[1]
        value = fn(model, *args)
        if len(seen) >= MODELS_REMEMBERED:
            seen.clear()
        seen[key] = (model, value)  # the model is kept alive with its entry: its id is not reused meanwhile
        return value

    return remembered


MODELS_REMEMBERED = 64
