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
    PlanFormatError,
    PluginConflictError,
    PluginError,
    PluginHookError,
    PluginLoadError,
    PluginResultError,
    PluginValidationError,
    UnknownPluginError,
    UnsupportedCombinationError,
)
from kvpools_core.gpus import GPU, find_gpu
from kvpools_core.hookspecs import for_architecture, hookimpl
from kvpools_core.pipeline import plan
from kvpools_core.registry import Registry, get_registry
from kvpools_core.values import (
    Budget,
    CellPart,
    CellSize,
    CostModel,
    GroupCost,
    LayerSpec,
    ModelSpec,
    Plan,
    PoolSizing,
    PoolSpec,
    Serving,
)
from kvpools_core.weights import WeightsEstimate, estimate_weights

__version__ = "0.2.0"  # the one place it is written: pyproject.toml reads this literal

PUBLIC_MODULES: tuple[str, ...] = (
    "kvpools_core",
    "kvpools_core.allocators",
    "kvpools_core.allocators.*",
    "kvpools_core.config",
    "kvpools_core.dtypes",
    "kvpools_core.errors",
    "kvpools_core.gpus",
    "kvpools_core.options",
    "kvpools_core.parallel",
    "kvpools_core.parts",
    "kvpools_core.parts.*",
    "kvpools_core.pools",
    "kvpools_core.pools.*",
    "kvpools_core.sizing",
    "kvpools_core.units",
    "kvpools_core.values",
    "kvpools_core.vllm.layers",
    "kvpools_core.vllm.specs",
)
"""The modules a plugin may import; every other ``kvpools_core`` module is internal and may change.

Written here, beside ``__all__``, because the facade is the contract (as ``pytest``'s
``__init__`` is over ``_pytest``): ``__all__`` lists the public names of this package,
``PUBLIC_MODULES`` the public modules.  ``"pkg.*"`` makes every submodule of ``pkg``
public, so a store or part added there is public at once. Internal: ``registry``, ``pipeline``, ``building``,
``defaults``, ``cli``, ``report``, ``build_report``, ``capacity``, ``capacity_report``, ``compare``,
``compare_report``, ``fit``, ``fit_report``, ``weights``, the rest of ``vllm`` and ``hookspecs`` (plugins take
``hookimpl`` and ``for_architecture`` from ``kvpools_core``); ``integrations`` bridges the pools to other
tools and model runtimes for users (optional extras), never for plugins. Plugins reach other plugins only
through hooks, never by import. ``tests/plugins/test_boundaries.py`` enforces both rules on every built-in
plugin and on the example distribution;
``is_public_module`` reads this list.
"""


def __getattr__(name: str) -> object:
    """``GPUS``: the default registry's GPU catalogue (its platform plugins' accelerators), read when asked,
    since importing this package loads no plugin."""
    if name == "GPUS":
        from kvpools_core.gpus import accelerators

        return accelerators()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_public_module(name: str) -> bool:
    """Whether a plugin may import module ``name`` (an entry of :data:`PUBLIC_MODULES`, or under a ``.*`` one)."""
    return any(name == entry or (entry.endswith(".*") and name.startswith(entry[:-1])) for entry in PUBLIC_MODULES)


__all__ = [
    "GPU",
    "GPUS",
    "PUBLIC_MODULES",
    "Budget",
    "CellPart",
    "CellSize",
    "ConfigError",
    "CostModel",
    "GroupCost",
    "InsufficientMemoryError",
    "InvalidValueError",
    "KvpoolsError",
    "LayerSpec",
    "ModelSpec",
    "NoProviderError",
    "Plan",
    "PlanFormatError",
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
    "WeightsEstimate",
    "build",
    "estimate_weights",
    "find_gpu",
    "for_architecture",
    "get_registry",
    "hookimpl",
    "is_public_module",
    "plan",
]
