"""kvpools: plan and build the KV-cache memory pools of an LLM serving engine.

The core defines the hooks (:mod:`kvpools_core.hookspecs`), the frozen values
that flow between them (:mod:`kvpools_core.values`) and the pipeline
(:func:`plan`, :func:`build`); every architecture and platform is a plugin
found through the ``kvpools`` entry-point group.  Importing this package
loads no plugin and creates no plugin manager.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

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
from kvpools_core.hookspecs import for_architecture, hookimpl
from kvpools_core.pipeline import plan
from kvpools_core.pipeline.gpus import GPU, find_gpu
from kvpools_core.pipeline.weights import WeightsEstimate, estimate_weights
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

MOVED_MODULES: dict[str, str] = {
    "kvpools_core.vllm.specs": "kvpools_core.parts.vllm.specs",
    "kvpools_core.vllm.layers": "kvpools_core.parts.vllm.layers",
    "kvpools_core.vllm.report": "kvpools_core.cli.vllm_report",
    "kvpools_core.vllm.model": "kvpools_core.engines.vllm.model",
    "kvpools_core.vllm.planning": "kvpools_core.engines.vllm.planning",
    "kvpools_core.vllm.budget": "kvpools_core.engines.vllm.budget",
    "kvpools_core.vllm.deployment": "kvpools_core.engines.vllm.deployment",
    "kvpools_core.vllm.offload": "kvpools_core.engines.vllm.offload",
    "kvpools_core.vllm": "kvpools_core.engines.vllm",
    "kvpools_core.sizing": "kvpools_core.parts.sizing",
    "kvpools_core.gpus": "kvpools_core.pipeline.gpus",
    "kvpools_core.weights": "kvpools_core.pipeline.weights",
    "kvpools_core.host": "kvpools_core.pipeline.host",
    "kvpools_core.engine_defaults": "kvpools_core.pipeline.engine_defaults",
    "kvpools_core.capacity_record": "kvpools_core.planning.capacity_record",
    "kvpools_core.capacity_report": "kvpools_core.cli.capacity_report",
    "kvpools_core.capacity": "kvpools_core.planning.capacity",
    "kvpools_core.split": "kvpools_core.planning.split",
    "kvpools_core.replay": "kvpools_core.planning.replay",
    "kvpools_core.fit_report": "kvpools_core.cli.fit_report",
    "kvpools_core.fit": "kvpools_core.planning.fit",
    "kvpools_core.sweep_report": "kvpools_core.cli.sweep_report",
    "kvpools_core.sweep": "kvpools_core.planning.sweep",
    "kvpools_core.compare_report": "kvpools_core.cli.compare_report",
    "kvpools_core.compare": "kvpools_core.planning.compare",
    "kvpools_core.distributed": "kvpools_core.planning.distributed",
    "kvpools_core.rank_exchange": "kvpools_core.planning.rank_exchange",
    "kvpools_core.report": "kvpools_core.cli.plan_report",
    "kvpools_core.build_report": "kvpools_core.cli.build_report",
    "kvpools_core.ranks_report": "kvpools_core.cli.ranks_report",
    "kvpools_core.plots": "kvpools_core.cli.plots",
    "kvpools_core.loading": "kvpools_core.values.loading",
}
"""Modules that 0.3 moved into the layered packages (issue 30), old path -> new path.

Importing an old path still works for one release and warns (``DeprecationWarning``): the old name
is bound to the very module object of the new path, so classes, functions and ``monkeypatch`` targets are
the same objects under both names."""


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves :data:`MOVED_MODULES`' old paths to the modules at their new paths."""

    def __init__(self) -> None:
        self._real_specs: dict[str, object] = {}

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = MOVED_MODULES[spec.name]
        warnings.warn(
            f"{spec.name} moved to {new} in kvpools 0.3; the old path is removed in 0.4: import {new}.",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._real_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # the import system stamped the alias' spec on the real module: give it its own back
        module.__spec__ = self._real_specs.pop(module.__spec__.name if module.__spec__ else "", module.__spec__)  # type: ignore[assignment]


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModuleFinder())

__version__ = "0.2.0"  # the one place it is written: pyproject.toml reads this literal

PUBLIC_MODULES: tuple[str, ...] = (
    "kvpools_core",
    "kvpools_core.allocators",
    "kvpools_core.allocators.*",
    "kvpools_core.config",
    "kvpools_core.dtypes",
    "kvpools_core.errors",
    "kvpools_core.options",
    "kvpools_core.parallel",
    "kvpools_core.parts",
    "kvpools_core.parts.*",
    "kvpools_core.pipeline.gpus",
    "kvpools_core.pools",
    "kvpools_core.pools.*",
    "kvpools_core.units",
    "kvpools_core.values",
    "kvpools_core.values.*",
)
"""The modules a plugin may import; every other ``kvpools_core`` module is internal and may change.

Written here, beside ``__all__``, because the facade is the contract (as ``pytest``'s
``__init__`` is over ``_pytest``): ``__all__`` lists the public names of this package,
``PUBLIC_MODULES`` the public modules.  ``"pkg.*"`` makes every submodule of ``pkg``
public, so a store or part added there is public at once (``parts.sizing``: SGLang's sizing helpers;
``parts.vllm.*``: vLLM's per-layer specs). Internal: ``registry``, ``models``, ``defaults``, ``building``,
``pipeline`` (but its GPU catalogue), ``engines``, ``planning``, ``cli`` and ``hookspecs`` (plugins take
``hookimpl`` and ``for_architecture`` from ``kvpools_core``); ``docs/architecture.md`` shows the layers.
``integrations`` bridges the pools to other
tools and model runtimes for users (optional extras), never for plugins. Plugins reach other plugins only
through hooks, never by import. ``tests/plugins/test_boundaries.py`` enforces both rules on every built-in
plugin and on the example distribution;
``is_public_module`` reads this list.
"""


def __getattr__(name: str) -> object:
    """``GPUS``: the default registry's GPU catalogue (its platform plugins' accelerators), read when asked,
    since importing this package loads no plugin."""
    if name == "GPUS":
        from kvpools_core.pipeline.gpus import accelerators

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
