"""One error hierarchy: every failure a user can meet is a ``KvpoolsError``.

Messages say what was wrong, the value seen, and what to change; the CLI prints
them as one paragraph without a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def short_repr(value: Any, limit: int = 80) -> str:
    """``repr`` for an error message: clipped to ``limit``, and safe for an integer too long to print
    (``repr(10**5000)`` raises), since bad input and buggy plugins produce both."""
    if isinstance(value, int) and value.bit_length() > 256:
        return f"an integer of {value.bit_length():,} bits"
    shown = repr(value)
    return shown if len(shown) <= limit else f"{shown[: limit - 3]}..."


class KvpoolsError(Exception):
    """Base class of every error kvpools raises on purpose."""


class ConfigError(KvpoolsError, ValueError):
    """A model config, preset or serving option is missing, malformed or out of range."""


class InvalidValueError(ConfigError):
    """A frozen value (``CellPart``, ``LayerSpec``, ``PoolSpec`` ...) was built with a field out of range.

    Raised inside a hook implementation it is the plugin's bug, and the registry
    re-raises it as a :class:`PluginResultError` naming that plugin; raised by a
    caller's own code it stays a ``ConfigError``.  ``Serving`` options a user
    gives are plain ``ConfigError``s.
    """


class PlanFormatError(ConfigError):
    """JSON given to ``Plan.from_json`` (or any value's ``from_dict``) is malformed, or describes a plan kvpools
    cannot have made: a wrong JSON type, a missing or unknown field, a non-finite number, a size out of range,
    planned bytes over the budget.  ``path`` names the field (``plan.sizing.pools[2].slots``)."""

    def __init__(self, message: str, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class UnsupportedCombinationError(KvpoolsError, ValueError):
    """The model, serving options and platform cannot be combined (checked before allocation)."""


class EngineRefusalError(UnsupportedCombinationError):
    """The engine itself refuses these options at start-up (``--quantization`` against the checkpoint's method,
    ``_verify_quantization``): no kvpools option (``--weights-memory``) works around it, so callers do not wrap it
    in advice to pass one."""


class InsufficientMemoryError(KvpoolsError, RuntimeError):
    """The budget cannot hold even one page of KV cache (or one request)."""


class PluginError(KvpoolsError):
    """Base class of plugin failures; always names the plugin."""


class PluginLoadError(PluginError):
    """A plugin's entry point could not be imported or registered."""


class PluginValidationError(PluginError):
    """A plugin declares a hook implementation that matches no hook specification."""


class PluginHookError(PluginError):
    """A hook implementation raised; names the hook, the plugin and its distribution."""


class NoProviderError(PluginError):
    """No plugin answered a hook that needs an answer; lists the plugins asked."""

    def __init__(self, hook: str, asked: Sequence[str], what: str) -> None:
        self.hook = hook
        self.asked = tuple(asked)
        plugins = ", ".join(self.asked) if self.asked else "none"
        super().__init__(f"No plugin answered {hook}: {what} Plugins asked: {plugins}.")


class PluginConflictError(PluginError):
    """Two plugins claim the same model (or the same preset name)."""


class UnknownPluginError(PluginError):
    """An allow-list or block-list names a plugin that is not installed."""


class PluginResultError(PluginHookError):
    """A hook implementation or wrapper returned a value that breaks the hook's contract.

    Checked where the value leaves the plugin, so the plugin that returned it is
    named, not the next plugin or core step that trips over it.
    """


class PoolPlanMismatchError(KvpoolsError):
    """A pool would allocate other bytes than its plan charged (raised before anything is allocated)."""


class BufferLayoutError(PoolPlanMismatchError):
    """A buffer layout (``kvpools_core.pools.layout``) failed, or returned other buffers than the core asked for:
    not one view per layer, or a view of another shape, dtype or device, or views that overlap."""


class AllocatorError(KvpoolsError, ValueError):
    """A KV-slot allocator refused a call and changed nothing: a free of ids it never hands out (padding 0, -1,
    past the pool), of ids not given as integers, of more ids than are allocated or, in checked mode, of ids not
    allocated now (a double free); or a ``restore_state`` with a state that is not its own."""


class DistributedPlanError(KvpoolsError, RuntimeError):
    """The ranks of a process group could not agree on a plan (``kvpools_core.planning.distributed.plan_on_group``).

    Every rank raises it with the same message: ``ranks`` are the ranks at fault, ``errors`` maps each rank that
    reported a failure to its ``(error type, message)``.
    """

    def __init__(
        self, message: str, ranks: Sequence[int] = (), errors: dict[int, tuple[str, str]] | None = None
    ) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.errors = dict(errors or {})


class RankFailedError(DistributedPlanError):
    """One or more ranks raised while planning; ``ranks`` names them and ``errors`` says what they raised."""


class RankTimeoutError(DistributedPlanError):
    """One or more ranks did not report within the timeout (exited, hung, or never called); ``ranks`` names them."""


class RankMismatchError(DistributedPlanError):
    """Ranks plan different models or serving options (or mix budget kinds); ``ranks`` names those that differ
    from the group's first rank."""


class AllocatorStateError(AllocatorError, RuntimeError):
    """An allocator call out of order (``free_group_end`` without ``free_group_begin``, a second
    ``free_group_begin``): refused, nothing changed.  A ``RuntimeError`` too, as SGLang's allocators raise."""
