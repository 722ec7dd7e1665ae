"""The engine accountings: how many tokens and requests a budget holds, as each serving engine decides it.

Each engine is a plugin: a module of the ``kvpools`` entry-point group whose ``engine_accountings`` hook
returns its :class:`~kvpools_core.engines.base.Engine` values. The built-in ``sglang``, ``vllm`` and ``trtllm``
are subpackages of this package declared in kvpools' own ``pyproject.toml`` exactly as a third party declares
one (``docs/plugins.md``: "An engine plugin"); :func:`engines` finds every loaded one through the registry and
:func:`engine_for` picks the one that answers an ``--accounting`` mode. The planners
(:mod:`kvpools_core.planning`) and the command line call engines through it, never a subpackage by name.
"""

from __future__ import annotations

from kvpools_core.engines.base import Engine, EngineCapacity
from kvpools_core.errors import ConfigError, PluginConflictError
from kvpools_core.options import option
from kvpools_core.registry import Registry, get_registry

BUILTIN_ACCOUNTINGS = {"exact": "sglang", "sglang": "sglang", "vllm": "vllm", "trtllm": "trtllm"}
"""The accountings kvpools' own distribution provides -> the entry point (plugin) that provides each; named by
the error when that plugin is kept out (``KVPOOLS_PLUGINS``, ``KVPOOLS_DISABLED_PLUGINS``)."""


def engines(registry: Registry | None = None) -> dict[str, Engine]:
    """Every installed engine, by name: the answers of the loaded plugins' ``engine_accountings`` hooks.

    Two engines of one name, or one accounting two engines answer, is a :class:`PluginConflictError` naming
    both plugins.
    """
    registry = registry or get_registry()
    found: dict[str, tuple[str, Engine]] = {}
    owner: dict[str, tuple[str, Engine]] = {}
    for plugin, answered in registry.call_collect("engine_accountings"):
        for engine in answered:
            claims = [(found.get(engine.name), f"Engine {engine.name!r}")]
            claims += [(owner.get(mode), f"Accounting {mode!r}") for mode in engine.accountings]
            for taken, what in claims:
                if taken is not None and taken[1] is not engine:
                    raise PluginConflictError(
                        f"{what} comes from two engine plugins: {registry.plugin(taken[0]).label} and "
                        f"{registry.plugin(plugin).label}. Disable one with KVPOOLS_DISABLED_PLUGINS (NAME, or "
                        "DIST:NAME)."
                    )
            found[engine.name] = (plugin, engine)
            owner.update({mode: (plugin, engine) for mode in engine.accountings})
    return {name: engine for name, (_, engine) in found.items()}


def accountings(registry: Registry | None = None) -> dict[str, Engine]:
    """Every ``--accounting`` mode the installed engines answer -> its engine."""
    return {mode: engine for engine in engines(registry).values() for mode in engine.accountings}


def engine_for(accounting: str, registry: Registry | None = None) -> Engine:
    """The engine that answers ``--accounting accounting``; an accounting no installed engine answers is a
    :class:`ConfigError` naming the installed accountings and what to install (or let load)."""
    registry = registry or get_registry()
    known = accountings(registry)
    if accounting in known:
        return known[accounting]
    if accounting in BUILTIN_ACCOUNTINGS:
        plugin = BUILTIN_ACCOUNTINGS[accounting]
        missing = (
            f"it is kvpools' own engine plugin {plugin!r} (distribution kvpools), which was not loaded: "
            f"{registry.loading_hint() or 'reinstall kvpools.'}"
        )
    else:
        missing = (
            "no installed distribution provides it: install the engine plugin that does (a distribution "
            "declaring an engine_accountings hook in the kvpools entry-point group, docs/plugins.md)."
        )
    raise ConfigError(
        f"{option('accounting')} {accounting!r} is not an accounting of the installed engines "
        f"({', '.join(sorted(known)) or 'none'}): {missing}"
    )


__all__ = ["BUILTIN_ACCOUNTINGS", "Engine", "EngineCapacity", "accountings", "engine_for", "engines"]
