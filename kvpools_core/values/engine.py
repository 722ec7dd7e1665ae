"""What an engine accounting is (:class:`Engine`) and what every engine's plan answers in common
(:class:`EngineCapacity`): the values of the ``engine_accountings`` hook.

They live in the foundation so the hook's result contract (``kvpools_core.hookspecs.contracts``) can check an
answer without importing any engine; :mod:`kvpools_core.engines.base` re-exports them for engine authors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kvpools_core.errors import InvalidValueError


def _name(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value or value != value.strip().lower() or " " in value:
        raise InvalidValueError(
            f"Engine.{attribute.name} must be a non-empty lower-case name without spaces, got {value!r}."
        )


def _accountings(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, tuple) or not value:
        raise InvalidValueError(f"Engine.accountings must be a non-empty tuple of names, got {value!r}.")
    for mode in value:
        _name(instance, attribute, mode)
    if len(set(value)) != len(value):
        raise InvalidValueError(f"Engine.accountings names an accounting twice: {value!r}.")


def _callable(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not callable(value):
        raise InvalidValueError(f"Engine.{attribute.name} must be callable, got {type(value).__name__}.")


def _read_only(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(value))


@attrs.frozen(kw_only=True)
class EngineCapacity:
    """What one engine's plan holds on one rank (the first pipeline stage's), in the terms every engine shares:
    the KV budget it sized from, the bytes its KV cache takes, the tokens it holds and, where the engine caps
    them, the requests.  The conformance kit's engine suite and the command line read every engine through it."""

    engine: str
    accounting: str
    budget_bytes: int
    kv_bytes: int
    max_tokens: int
    max_requests: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class Engine:
    """One serving engine's memory accounting, as the planners and the command line call it.

    ``plan(model, serving, *, memory, **options)`` answers "what does this budget hold" exactly as the engine's
    own start-up does (``--accounting`` picks the engine by one of its ``accountings``); ``memory`` is the KV
    cache's budget per rank (bytes or ``"60GiB"``) as that engine reads it.  ``capacity(result)`` summarises a
    result as an :class:`EngineCapacity`.  ``version`` is the engine release whose code the accounting
    reproduces (the differential tests run that release); ``distribution`` is the distribution that ships it
    (named by the error for an accounting nobody installed); ``over_budget`` names the accountings whose
    cache may take more bytes than the budget, and why.
    """

    name: str = attrs.field(validator=_name)
    version: str
    accountings: tuple[str, ...] = attrs.field(validator=_accountings)
    plan: Callable[..., Any] = attrs.field(validator=_callable)
    capacity: Callable[[Any], EngineCapacity] = attrs.field(validator=_callable)
    summary: str
    docs: str
    distribution: str = "kvpools"
    over_budget: Mapping[str, str] = attrs.field(factory=dict, converter=_read_only)
    """Accountings whose ``kv_bytes`` may exceed ``budget_bytes`` -> why (the engine's own arithmetic does so);
    for every other accounting the conformance kit checks that the KV cache fits its budget."""


__all__ = ["Engine", "EngineCapacity"]
