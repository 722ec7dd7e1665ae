"""The engine accountings: how many tokens and requests a budget holds, as each serving engine decides it.

Each engine is a subpackage (``sglang``, ``vllm``) exposing one :class:`~kvpools_core.engines.base.Engine`
as ``ENGINE``; :func:`engine_for` picks the one that answers an ``--accounting`` mode. The planners
(:mod:`kvpools_core.planning`) and the command line call engines through it, never a subpackage by name,
so adding an engine is adding a folder and one line to :data:`BUILTIN_ENGINES` (``docs/architecture.md``
explains why this is a registry inside the core for now, and how it becomes a hook).
"""

from __future__ import annotations

import importlib

from kvpools_core.engines.base import Engine
from kvpools_core.errors import ConfigError
from kvpools_core.options import option

BUILTIN_ENGINES = ("kvpools_core.engines.sglang", "kvpools_core.engines.vllm", "kvpools_core.engines.trtllm")
"""The engine subpackages, imported when first asked for (the vLLM model is not loaded for an SGLang plan)."""


def engines() -> dict[str, Engine]:
    """Every engine, by name."""
    found = [importlib.import_module(path).ENGINE for path in BUILTIN_ENGINES]
    return {engine.name: engine for engine in found}


def engine_for(accounting: str) -> Engine:
    """The engine that answers ``--accounting accounting``."""
    for engine in engines().values():
        if accounting in engine.accountings:
            return engine
    known = sorted(mode for engine in engines().values() for mode in engine.accountings)
    raise ConfigError(f"{option('accounting')} {accounting!r} is not an accounting kvpools has: use one of {known}.")


__all__ = ["BUILTIN_ENGINES", "Engine", "engine_for", "engines"]
