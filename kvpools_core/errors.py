"""One error hierarchy: every failure a user can meet is a ``KvpoolsError``.

Messages say what was wrong, the value seen, and what to change; the CLI prints
them as one paragraph without a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence


class KvpoolsError(Exception):
    """Base class of every error kvpools raises on purpose."""


class ConfigError(KvpoolsError, ValueError):
    """A model config, preset or serving option is missing, malformed or out of range."""


class UnsupportedCombinationError(KvpoolsError, ValueError):
    """The model, serving options and platform cannot be combined (checked before allocation)."""


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
