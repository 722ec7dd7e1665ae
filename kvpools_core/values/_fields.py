"""Validators, converters and JSON helpers every value module shares (internal)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kvpools_core.errors import ConfigError, InvalidValueError
from kvpools_core.options import option

JSONScalar = int | float | str | bool | None

USER_OPTION_VALUES: tuple[type, ...] = ()
"""The values whose fields are the user's options (``Serving``, registered by its module): their validators
name the option as typed (``--tp-size``) and raise ``ConfigError``, not a plugin's ``InvalidValueError``."""


# ---------------------------------------------------------------------------
# validators and converters (errors name the option, the value and the fix)
# ---------------------------------------------------------------------------


def _flag(inst: object, attribute: attrs.Attribute[Any]) -> str:
    """A serving option as the caller typed it (``--tp-size`` / ``tp_size``); any other value's field
    qualified by its class (``CellPart.bytes_per_token``), since a plugin, not the user, built it."""
    if isinstance(inst, USER_OPTION_VALUES):
        return option(attribute.name)
    return f"{type(inst).__name__}.{attribute.name}"


def _invalid(inst: object, message: str) -> ConfigError:
    """A user's serving option is a ``ConfigError``; any other value's field is an ``InvalidValueError``,
    which the registry blames on the plugin that built the value."""
    return ConfigError(message) if isinstance(inst, USER_OPTION_VALUES) else InvalidValueError(message)


def positive(inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if type(value) is int and value >= 1:  # the common case first: every plan builds thousands of these
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a positive integer, got {value!r}.")


def non_negative(inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if type(value) is int and value >= 0:  # the common case first: every plan builds thousands of these
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a non-negative integer, got {value!r}.")


def optional_positive(inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        positive(inst, attribute, value)


def optional_non_negative(inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        non_negative(inst, attribute, value)


def fraction(inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    """A ratio in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a number in (0, 1], got {value!r}.")


def positive_ratio(inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a positive finite number, got {value!r}.")


def one_of(*choices: object) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value not in choices:
            shown = ", ".join("none" if c is None else str(c) for c in choices)
            raise _invalid(inst, f"{_flag(inst, attribute)} must be one of {shown}; got {value!r}.")

    return check


def frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """Freeze a JSON-like mapping: lists become tuples, dicts read-only proxies."""
    return MappingProxyType({str(k): _freeze(v) for k, v in (value or {}).items()})


_PLAIN = frozenset({int, float, str, bool, type(None)})
"""JSON scalars: frozen as they are (checked by exact type first: ``isinstance(value, Mapping)`` is an ABC check)."""


def _freeze(value: Any) -> Any:
    if type(value) in _PLAIN:
        return value
    if isinstance(value, Mapping):
        return frozen_mapping(value)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(_thaw(v) for v in value)
    if attrs.has(type(value)):
        return to_dict(value)
    return value


def to_dict(value: Any) -> dict[str, Any]:
    """Plain-JSON form of any value of this module (tuples become lists)."""
    return {f.name: _thaw(getattr(value, f.name)) for f in attrs.fields(type(value))}


def _str_tuple(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


def _int_tuple(items: Iterable[int]) -> tuple[int, ...]:
    return tuple(items)


def _int_tuple_or_none(items: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if items is None else tuple(items)


# ---------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------


def _positive_ints(inst: object, attribute: attrs.Attribute[Any], value: tuple[int, ...]) -> None:
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise InvalidValueError(f"{_flag(inst, attribute)} must be positive integers, got {value!r}.")


def _text(inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a non-empty string, got {value!r}.")


def _texts(inst: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if not all(isinstance(item, str) and item.strip() for item in value):
        raise _invalid(inst, f"{_flag(inst, attribute)} must be non-empty strings, got {value!r}.")
