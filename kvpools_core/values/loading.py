"""Loading the frozen values from JSON: every field type-checked against its annotation, every error at its path.

``Plan.from_json`` (and each value's ``from_dict``) reads text that may come
from another rank, another kvpools, a file a user edited or a hostile
sender.  :func:`load_value` walks the JSON against the attrs class's own
field annotations before the class is built, so a wrong JSON type, a
missing or unknown field, a non-finite number or an integer no tensor could
hold is reported as a :class:`~kvpools_core.errors.PlanFormatError` naming
the field's path (``plan.sizing.pools[2].slots``), the value seen and what
is expected; the class's own validators then check ranges, and their
errors are re-raised at the same path.  No other exception leaves a load.
"""

from __future__ import annotations

import functools
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from kvpools_core.errors import KvpoolsError, PlanFormatError, short_repr
from kvpools_core.options import option

T = TypeVar("T")

INT_BOUND = 1 << 63
"""Integers of a value's JSON lie in ``(-2**63, 2**63)``: sizes and counts index int64 tensors."""
MAX_FREE_DEPTH = 32
"""How deep free-form JSON (``params``, ``sglang_config``, ``plugin_options``) may nest."""

_PREPARE_HOOK = "_prepare_loaded"
"""A class may define ``classmethod _prepare_loaded(data, path) -> dict`` to read older spellings first."""


def parse_json(text: Any, what: str = "plan") -> Any:
    """``json.loads`` for a value's JSON text: every failure a :class:`PlanFormatError` saying why."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise PlanFormatError(f"The {what} JSON must be text (str or bytes), got {type(text).__name__}.", path=what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanFormatError(
            f"The {what} is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.", path=what
        ) from None
    except RecursionError:
        raise PlanFormatError(f"The {what} JSON nests too deep for a {what}.", path=what) from None
    except ValueError as exc:  # not UTF-8, or an integer literal of more digits than Python converts
        reason = "it holds an integer of thousands of digits" if "integer string" in str(exc) else str(exc)
        raise PlanFormatError(f"The {what} JSON cannot be read: {reason}.", path=what) from None


def load_value(cls: type[T], data: Any, path: str | None = None) -> T:
    """Build ``cls`` (an attrs class) from its plain-JSON form ``data``; errors name ``path`` (default: the class)."""
    path = path or cls.__name__
    if not isinstance(data, Mapping):
        raise wrong(path, data, f"a JSON object (a {cls.__name__})")
    prepare = getattr(cls, _PREPARE_HOOK, None)
    if prepare is not None:
        data = prepare(data, path)
    fields = _fields(cls)  # type: ignore[arg-type]  # a class is hashable
    unknown = [key for key in data if key not in fields]
    if unknown:
        shown = ", ".join(repr(k) if isinstance(k, str) else short_repr(k) for k in sorted(map(str, unknown)))
        raise PlanFormatError(
            f"{path} has unknown field(s) {shown}: a {cls.__name__} has none such. Drop them, or load the value "
            "with the kvpools that wrote it.",
            path=path,
        )
    missing = [name for name, (_, required) in fields.items() if required and name not in data]
    if missing:
        first, *rest = (f"{path}.{name}" for name in missing)
        more = f" (and {', '.join(rest)})" if rest else ""
        raise PlanFormatError(
            f"{first}{more} is missing: a {cls.__name__} requires {'them' if rest else 'it'}.", path=first
        )
    kwargs = {name: fields[name][0](value, f"{path}.{name}") for name, value in data.items()}
    try:
        return cls(**kwargs)
    except PlanFormatError:
        raise
    except KvpoolsError as exc:
        message, at = _at(path, cls, str(exc))
        raise PlanFormatError(message, path=at) from None


def check_json(value: Any, path: str, depth: int = 0) -> Any:
    """Free-form JSON (a value's ``params``): plain JSON types, finite numbers, 64-bit integers, bounded nesting."""
    if depth > MAX_FREE_DEPTH:
        raise PlanFormatError(f"{path} nests deeper than {MAX_FREE_DEPTH} levels.", path=path)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return _int(value, path)
    if isinstance(value, float):
        return _finite(value, path)
    if isinstance(value, (list, tuple)):
        return [check_json(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        for key in value:
            if not isinstance(key, str):
                raise wrong(f"{path} key", key, "a string")
        return {key: check_json(item, f"{path}[{key!r}]", depth + 1) for key, item in value.items()}
    raise wrong(path, value, "plain JSON (null, a boolean, a number, a string, an array or an object)")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


Check = Callable[[Any, str], Any]
"""A field's checker: takes the JSON value and its path, returns the value to build with (arrays as tuples)."""


@functools.cache
def _fields(cls: type) -> dict[str, tuple[Check, bool]]:
    """Each field's checker, compiled once from its resolved annotation, and whether it is required."""
    hints = typing.get_type_hints(cls)
    return {f.name: (_checker(hints[f.name]), f.default is attrs.NOTHING) for f in attrs.fields(cls)}


def _checker(tp: Any) -> Check:
    """The checker of values annotated ``tp`` (the shapes the values use; anything else is a kvpools bug)."""
    if tp is Any:
        return check_json
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:  # ``X | None``
        (arm,) = [_checker(a) for a in args if a is not type(None)]
        return lambda value, path: None if value is None else arm(value, path)
    if isinstance(tp, type) and attrs.has(tp):
        return lambda value, path: value if isinstance(value, tp) else load_value(tp, value, path)
    if tp in _SCALARS:
        return _SCALARS[tp]
    if origin in (tuple, frozenset):
        item = _checker(args[0])
        frozen = origin is frozenset

        def check_array(value: Any, path: str) -> Any:
            if not isinstance(value, (list, tuple, frozenset, set)):
                raise wrong(path, value, "a JSON array")
            items = [item(each, f"{path}[{i}]") for i, each in enumerate(value)]
            return _frozen(items, path) if frozen else tuple(items)

        return check_array
    if origin is Mapping:
        entry = _checker(args[1])

        def check_object(value: Any, path: str) -> Any:
            if not isinstance(value, Mapping):
                raise wrong(path, value, "a JSON object")
            for key in value:
                if not isinstance(key, str):
                    raise wrong(f"{path} key", key, "a string")
            return {key: entry(each, f"{path}[{key!r}]") for key, each in value.items()}

        return check_object
    raise TypeError(f"kvpools_core.values.loading cannot load a field annotated {tp!r}")  # a kvpools bug


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        raise wrong(path, value, "true or false")
    return value


def _integer(value: Any, path: str) -> int:
    # bool is an int subclass, and not an integer here; other subclasses are (``Serving``'s unset markers, which
    # a dict from ``to_dict`` carries before any JSON text is written)
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong(path, value, "an integer")
    return _int(value, path)


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise wrong(path, value, "a number")
    return _int(value, path) if isinstance(value, int) else _finite(value, path)


def _string(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise wrong(path, value, "a string")
    return value


_SCALARS: dict[Any, Check] = {bool: _bool, int: _integer, float: _number, str: _string}


def _frozen(items: list[Any], path: str) -> frozenset[Any]:
    if len(set(items)) != len(items):
        raise wrong(path, items, "an array without repeated items")
    return frozenset(items)


def _int(value: int, path: str) -> int:
    if not -INT_BOUND < value < INT_BOUND:
        raise wrong(path, value, "an integer of at most 64 bits (below 2**63)")
    return value


def _finite(value: float, path: str) -> float:
    if not math.isfinite(value):
        raise wrong(path, value, "a finite number")
    return value


def wrong(path: str, value: Any, expected: str) -> PlanFormatError:
    return PlanFormatError(f"{path} must be {expected}, got {_seen(value)}.", path=path)


_KINDS = ((bool, "a boolean"), (int, "a number"), (float, "a number"), (str, "a string"), (Mapping, "an object"))


def _seen(value: Any) -> str:
    """The value as its JSON reads (``null``, ``"12"`` (a string), ``NaN``), clipped, with what kind it is."""
    if value is None:
        return "null"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 256:
        return short_repr(value)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return short_repr(value)
    text = text if len(text) <= 60 else text[:57] + "..."
    if isinstance(value, (list, tuple)):
        return f"{text} (an array)"
    kind = next((name for cls, name in _KINDS if isinstance(value, cls)), None)
    return f"{text} ({kind})" if kind else text


def _at(path: str, cls: type, message: str) -> tuple[str, str]:
    """A value's own validator message at ``path``: ``PoolSpec.slots must`` reads ``plan.sizing.pools[2].slots must``.

    Returns the message and the path of the field it names (``path`` itself when it names none).
    """
    for name in sorted(_fields(cls), key=len, reverse=True):
        for token in (f"{cls.__name__}.{name}", option(name), name):
            if re.match(rf"{re.escape(token)}(?![\w-])", message):
                flag = f" ({token})" if token.startswith("--") else ""
                return f"{path}.{name}{flag}{message[len(token) :]}", f"{path}.{name}"
    return f"{path}: {message}", path
