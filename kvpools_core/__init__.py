"""kvpools: plan and build the KV-cache memory pools of an LLM serving engine.

The core defines the hooks (:mod:`kvpools_core.hookspecs`), the frozen values
that flow between them (:mod:`kvpools_core.values`) and the pipeline
(:func:`plan`, :func:`build`); every architecture and platform is a plugin
found through the ``kvpools`` entry-point group.  Importing this package
loads no plugin and creates no plugin manager.
"""

from kvpools_core.building import build
from kvpools_core.errors import (
    ConfigError,
    InsufficientMemoryError,
    InvalidValueError,
    KvpoolsError,
    NoProviderError,
    PluginConflictError,
    PluginError,
    PluginHookError,
    PluginLoadError,
    PluginResultError,
    PluginValidationError,
    UnknownPluginError,
    UnsupportedCombinationError,
)
from kvpools_core.hookspecs import for_architecture, hookimpl
from kvpools_core.pipeline import plan
from kvpools_core.registry import Registry, get_registry
from kvpools_core.values import (
    Budget,
    CellPart,
    CellSize,
    LayerSpec,
    ModelSpec,
    Plan,
    PoolSizing,
    PoolSpec,
    Serving,
)

__all__ = [
    "Budget",
    "CellPart",
    "CellSize",
    "ConfigError",
    "InsufficientMemoryError",
    "InvalidValueError",
    "KvpoolsError",
    "LayerSpec",
    "ModelSpec",
    "NoProviderError",
    "Plan",
    "PluginConflictError",
    "PluginError",
    "PluginHookError",
    "PluginLoadError",
    "PluginResultError",
    "PluginValidationError",
    "PoolSizing",
    "PoolSpec",
    "Registry",
    "Serving",
    "UnknownPluginError",
    "UnsupportedCombinationError",
    "build",
    "for_architecture",
    "get_registry",
    "hookimpl",
    "plan",
]
