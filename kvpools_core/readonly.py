"""Read-only views of a model config, so that no plugin can change what another plugin (or the caller) reads.

Every architecture plugin is asked to parse the same ``config.json``; a plugin
that declines after writing ``config["text_config"]["num_hidden_layers"] = 1``
must not change how the next one parses the model, nor the caller's own dict.
:func:`readonly_config` copies the config once into :class:`ReadOnlyDict` and
:class:`ReadOnlyList` (subclasses of ``dict`` and ``list``, so ``isinstance``
checks, ``json.dumps``, ``dict(config)`` and ``copy.deepcopy(config)`` work as
on the parsed JSON) whose every in-place change raises a ``TypeError`` naming
the key.  A plugin that needs a changed config copies it first:
``copy.deepcopy(config)`` gives plain, writable dicts and lists.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, NoReturn, SupportsIndex


def readonly_config(config: Mapping[str, Any], root: str = "config") -> ReadOnlyDict:
    """A read-only deep copy of ``config``: mappings become ``ReadOnlyDict``, lists and tuples ``ReadOnlyList``.

    Built without recursion (a config may nest as deep as the JSON parser
    allowed); a structure met twice (or a cycle, from the Python API) is
    copied once.
    """
    made: dict[int, Any] = {}
    top = ReadOnlyDict(path=root)
    made[id(config)] = top
    pending: list[tuple[Any, Any]] = [(config, top)]
    while pending:
        source, target = pending.pop()
        items = source.items() if isinstance(target, dict) else enumerate(source)
        for key, value in items:
            if isinstance(value, (Mapping, list, tuple)):
                if id(value) not in made:
                    path = f"{target.path}[{key!r}]"
                    made[id(value)] = ReadOnlyDict(path=path) if isinstance(value, Mapping) else ReadOnlyList(path=path)
                    pending.append((value, made[id(value)]))
                value = made[id(value)]
            if isinstance(target, dict):
                dict.__setitem__(target, key, value)
            else:
                list.append(target, value)
    return top


def _refuse(path: str, change: str) -> NoReturn:
    raise TypeError(
        f"The model config is read-only for plugins: cannot {change} {path}. Every plugin (and the caller) reads "
        f"the same config; copy it first (copy.deepcopy(config) gives plain dicts and lists) to change it."
    )


class ReadOnlyDict(dict):  # type: ignore[type-arg]
    """A ``dict`` whose every in-place change raises ``TypeError``; ``path`` names it in the error."""

    __slots__ = ("path",)

    def __init__(self, *args: Any, path: str = "config", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # as ``dict(...)``: what ``type(x)(items)`` copies (attrs' asdict) pass
        self.path = path

    def __setitem__(self, key: Any, value: Any) -> NoReturn:
        _refuse(f"{self.path}[{key!r}]", "set")

    def __delitem__(self, key: Any) -> NoReturn:
        _refuse(f"{self.path}[{key!r}]", "delete")

    def __ior__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse(self.path, "update")

    def clear(self) -> NoReturn:
        _refuse(self.path, "clear")

    def pop(self, key: Any, *default: Any) -> NoReturn:
        _refuse(f"{self.path}[{key!r}]", "pop")

    def popitem(self) -> NoReturn:
        _refuse(self.path, "pop an item of")

    def setdefault(self, key: Any, default: Any = None) -> NoReturn:
        _refuse(f"{self.path}[{key!r}]", "setdefault")

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(self.path, "update")

    def copy(self) -> dict[Any, Any]:
        """A plain ``dict`` of the same items (as ``dict.copy``: shallow, so nested values stay read-only)."""
        return dict(self)

    def __copy__(self) -> dict[Any, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[Any, Any]:
        thawed: dict[Any, Any] = {}
        memo[id(self)] = thawed
        for key, value in self.items():
            thawed[copy.deepcopy(key, memo)] = copy.deepcopy(value, memo)
        return thawed

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


class ReadOnlyList(list):  # type: ignore[type-arg]
    """A ``list`` whose every in-place change raises ``TypeError``; ``path`` names it in the error."""

    __slots__ = ("path",)

    def __init__(self, *args: Any, path: str = "config") -> None:
        super().__init__(*args)  # as ``list(...)``: what ``type(x)(items)`` copies (attrs' asdict) pass
        self.path = path

    def __setitem__(self, index: Any, value: Any) -> NoReturn:
        _refuse(f"{self.path}[{index!r}]", "set")

    def __delitem__(self, index: Any) -> NoReturn:
        _refuse(f"{self.path}[{index!r}]", "delete")

    def __iadd__(self, other: Any) -> NoReturn:  # type: ignore[misc]
        _refuse(self.path, "extend")

    def __imul__(self, count: SupportsIndex) -> NoReturn:
        _refuse(self.path, "repeat")

    def append(self, value: Any) -> NoReturn:
        _refuse(self.path, "append to")

    def extend(self, values: Any) -> NoReturn:
        _refuse(self.path, "extend")

    def insert(self, index: SupportsIndex, value: Any) -> NoReturn:
        _refuse(self.path, "insert into")

    def pop(self, index: SupportsIndex = -1) -> NoReturn:
        _refuse(self.path, "pop from")

    def remove(self, value: Any) -> NoReturn:
        _refuse(self.path, "remove from")

    def clear(self) -> NoReturn:
        _refuse(self.path, "clear")

    def sort(self, *args: Any, **kwargs: Any) -> NoReturn:
        _refuse(self.path, "sort")

    def reverse(self) -> NoReturn:
        _refuse(self.path, "reverse")

    def copy(self) -> list[Any]:
        return list(self)

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        thawed: list[Any] = []
        memo[id(self)] = thawed
        thawed.extend(copy.deepcopy(value, memo) for value in self)
        return thawed

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))
