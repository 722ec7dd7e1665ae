"""How a message names an option: the CLI flag to a CLI user, the Python name to an API caller.

Errors are written once, in the core and in plugins, with :func:`option`:
``f"{option('tp_size')} 3 cannot split ..."`` reads ``--tp-size 3 ...`` under
``kvpools plan`` and ``tp_size 3 ...`` from ``kvpools_core.plan(...)``.  The CLI
enters :func:`cli_surface` around its work; nothing else changes the surface,
and a context variable keeps concurrent API callers (threads, tasks) apart.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator
from contextlib import contextmanager

from kvpools_core.errors import ConfigError, short_repr

__all__ = ["FALSE_SPELLINGS", "TRUE_SPELLINGS", "cli_surface", "env_flag", "on_cli", "option"]

_ON_CLI: contextvars.ContextVar[bool] = contextvars.ContextVar("kvpools_on_cli", default=False)

# ``plan()`` keyword arguments whose CLI flag is not the argument's name.
_FLAG_OF = {"draft_model": "--speculative-draft-model-path", "plugin_options": "--plugin-option"}


def option(name: str) -> str:
    """``name`` (a ``Serving`` field or a ``plan()`` argument) as the caller typed it."""
    if not _ON_CLI.get():
        return name
    return _FLAG_OF.get(name, "--" + name.replace("_", "-"))


def on_cli() -> bool:
    """True inside the ``kvpools`` command line."""
    return _ON_CLI.get()


@contextmanager
def cli_surface() -> Iterator[None]:
    """Name options as CLI flags for the duration (the ``kvpools`` command)."""
    token = _ON_CLI.set(True)
    try:
        yield
    finally:
        _ON_CLI.reset(token)


TRUE_SPELLINGS = ("1", "true", "yes", "on")
FALSE_SPELLINGS = ("0", "false", "no", "off", "")
"""How every kvpools on/off environment control is spelt (the core's and the plugins' alike)."""


def env_flag(name: str) -> bool:
    """A boolean environment control: ``1/true/yes/on`` or ``0/false/no/off``/empty/unset (any case).

    Anything else is refused (a ``ConfigError`` naming the variable), so that a
    value such as ``maybe`` is not silently read as one or the other.
    """
    raw = os.environ.get(name)
    value = "" if raw is None else raw.strip().lower()
    if value in TRUE_SPELLINGS:
        return True
    if value in FALSE_SPELLINGS:
        return False
    raise ConfigError(
        f"{name}={short_repr(raw)} is not a boolean: use {', '.join(TRUE_SPELLINGS[:-1])} or {TRUE_SPELLINGS[-1]} "
        f"to turn it on, and {', '.join(FALSE_SPELLINGS[:-1])} or empty (or unset it) to turn it off."
    )
