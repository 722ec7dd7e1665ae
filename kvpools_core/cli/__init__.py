"""The ``kvpools`` command line: ``plan``, ``capacity``, ``compare``, ``build``, ``fit``, ``sweep``, ``plugins``,
``presets``, ``serve``.

Serving options are generated from the fields of :class:`Serving`, under
SGLang's server-arg names, so the CLI can never drift from the values.
Errors a user can fix print one paragraph and exit 1, never a traceback.
"""

from __future__ import annotations

from kvpools_core.cli import build, capacity, compare, fit, listing, plan, serve, sweep
from kvpools_core.cli.common import main

COMMAND_MODULES = (plan, capacity, compare, build, fit, sweep, listing, serve)
"""One module per command (each registers its command on :func:`main` when imported), its report beside it."""

__all__ = ["COMMAND_MODULES", "main"]
