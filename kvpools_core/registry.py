"""The plugin registry: discovery, load controls, typed hook calls, provenance, blame.

A ``Registry`` owns its pluggy ``PluginManager`` and its own entry-point loop
(group ``kvpools``), so that a broken plugin is reported by name, distribution
and version, and the other plugins still load when asked to.  Nothing is
created at import time: ``get_registry()`` builds a default registry lazily
and caches it; tests and embedding engines build their own ``Registry(...)``.

Every hook implementation is instrumented once, at registration, so the
registry knows which plugin answered each call (provenance) and which plugin
raised (blame) without the plugins doing anything.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, cast

import attrs
import importlib_metadata
import pluggy

from kvpools_core import hookspecs
from kvpools_core.errors import (
    KvpoolsError,
    NoProviderError,
    PluginConflictError,
    PluginError,
    PluginHookError,
    PluginLoadError,
    PluginValidationError,
    UnknownPluginError,
)

ENTRY_POINT_GROUP = "kvpools"
CORE_PLUGIN = "core"

hookimpl = pluggy.HookimplMarker(hookspecs.PROJECT)
"""Decorator marking a plugin function as a kvpools hook implementation."""


class KvpoolsPluginWarning(UserWarning):
    """A plugin failed to load and was skipped (``KVPOOLS_PLUGIN_ERRORS=warn``)."""


@attrs.frozen
class PluginInfo:
    """One plugin as ``kvpools plugins`` shows it."""

    name: str
    distribution: str
    version: str
    status: str  # loaded | blocked | failed | not-loaded
    hooks: tuple[str, ...] = ()
    error: str | None = None
    module: str | None = None

    @property
    def label(self) -> str:
        return f'"{self.name}" ({self.distribution} {self.version})'


def _env_list(name: str) -> tuple[str, ...] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _kvpools_version() -> str:
    try:
        return importlib_metadata.version("kvpools")
    except importlib_metadata.PackageNotFoundError:
        return "0+unknown"


class _CallRecord:
    """What happened inside one hook call: who answered, who wrapped, who raised."""

    def __init__(self, hook: str) -> None:
        self.hook = hook
        self.answered: list[str] = []
        self.wrapped: list[str] = []
        self.raised: dict[int, str] = {}


class Registry:
    """Loads plugins and calls hooks on them.

    Arguments mirror the environment controls (an argument left ``None`` reads
    its variable): ``autoload`` (``KVPOOLS_DISABLE_PLUGIN_AUTOLOAD``),
    ``plugins`` — an allow-list of entry-point names that load even with
    autoload off (``KVPOOLS_PLUGINS``), ``disabled`` (``KVPOOLS_DISABLED_PLUGINS``),
    ``trace`` (``KVPOOLS_TRACE_PLUGINS``), ``on_plugin_error`` ``"raise"`` or
    ``"warn"`` (``KVPOOLS_PLUGIN_ERRORS``).  ``extra_plugins`` registers
    in-process plugin objects by name after the entry points (tests, engines).
    """

    def __init__(
        self,
        *,
        autoload: bool | None = None,
        plugins: Sequence[str] | None = None,
        disabled: Sequence[str] | None = None,
        trace: bool | None = None,
        on_plugin_error: str | None = None,
        extra_plugins: Mapping[str, object] | None = None,
        trace_stream: Any = None,
    ) -> None:
        self.autoload = (not _env_flag("KVPOOLS_DISABLE_PLUGIN_AUTOLOAD")) if autoload is None else autoload
        self.allowed = tuple(plugins) if plugins is not None else _env_list("KVPOOLS_PLUGINS")
        self.disabled = tuple(disabled) if disabled is not None else (_env_list("KVPOOLS_DISABLED_PLUGINS") or ())
        self.trace = _env_flag("KVPOOLS_TRACE_PLUGINS") if trace is None else trace
        mode = on_plugin_error if on_plugin_error is not None else os.environ.get("KVPOOLS_PLUGIN_ERRORS", "raise")
        if mode not in ("raise", "warn"):
            raise PluginError(f"KVPOOLS_PLUGIN_ERRORS must be 'raise' or 'warn', got {mode!r}.")
        self.on_plugin_error = mode
        self._trace_stream = trace_stream
        if CORE_PLUGIN in self.disabled:
            raise PluginError(
                f'The "{CORE_PLUGIN}" plugin holds the core defaults and cannot be disabled; '
                f"remove it from KVPOOLS_DISABLED_PLUGINS."
            )
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._infos: dict[str, PluginInfo] = {}
        self._records: list[_CallRecord] = []
        self._register_core()
        self._load_entry_points()
        for name, obj in (extra_plugins or {}).items():
            self._register(name, obj, "<in-process>", "-", module=getattr(obj, "__name__", None))
        self._check_pending()

    # -- loading ------------------------------------------------------------

    def _register_core(self) -> None:
        from kvpools_core import defaults

        self._register(CORE_PLUGIN, defaults, "kvpools", _kvpools_version(), module=defaults.__name__)

    def _entry_points(self) -> list[importlib_metadata.EntryPoint]:
        seen: dict[str, importlib_metadata.EntryPoint] = {}
        for ep in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP):
            other = seen.get(ep.name)
            if other is not None and other.value != ep.value:
                raise PluginConflictError(
                    f'Two distributions declare the kvpools plugin "{ep.name}": '
                    f"{_dist_label(other)} and {_dist_label(ep)}. Uninstall one of them."
                )
            seen[ep.name] = ep
        # Registration order makes equal-priority dispatch deterministic: pluggy calls the
        # last-registered first, so out-of-tree plugins (registered after the built-ins, by
        # name) are asked before the built-ins they may specialise.
        return sorted(seen.values(), key=lambda ep: (_dist_name_version(ep)[0] != "kvpools", ep.name))

    def _load_entry_points(self) -> None:
        eps = self._entry_points()
        names = {ep.name for ep in eps}
        if self.allowed is not None:
            missing = sorted(set(self.allowed) - names - {CORE_PLUGIN})
            if missing:
                raise UnknownPluginError(
                    f"KVPOOLS_PLUGINS names plugin(s) that are not installed: {', '.join(missing)}. "
                    f"Installed: {', '.join(sorted(names)) or 'none'}."
                )
        for ep in eps:
            dist, version = _dist_name_version(ep)
            if ep.name in self.disabled:
                self._infos[ep.name] = PluginInfo(ep.name, dist, version, "blocked", module=ep.value)
                continue
            wanted = ep.name in self.allowed if self.allowed is not None else self.autoload
            if not wanted:
                self._infos[ep.name] = PluginInfo(ep.name, dist, version, "not-loaded", module=ep.value)
                continue
            try:
                obj = ep.load()
            except Exception as exc:  # any import failure is the plugin's, and is named
                self._fail(
                    PluginLoadError(
                        f'Error loading plugin "{ep.name}" ({dist} {version}): {type(exc).__name__}: {exc}'
                    ),
                    PluginInfo(ep.name, dist, version, "failed", error=f"{type(exc).__name__}: {exc}", module=ep.value),
                    exc,
                )
                continue
            self._register(ep.name, obj, dist, version, module=ep.value)

    def _register(self, name: str, obj: object, dist: str, version: str, *, module: str | None) -> None:
        label = f'"{name}" ({dist} {version})'
        if name in self._infos and self._infos[name].status == "loaded":
            raise PluginConflictError(f"Plugin name {label} is already registered by {self._infos[name].label}.")
        try:
            self._pm.register(obj, name=name)
        except pluggy.PluginValidationError as exc:
            self._fail(
                PluginValidationError(f"Plugin {label} does not match the hook specifications: {exc}"),
                PluginInfo(name, dist, version, "failed", error=str(exc), module=module),
                exc,
            )
            return
        except ValueError as exc:
            self._fail(
                PluginLoadError(f"Error registering plugin {label}: {exc}"),
                PluginInfo(name, dist, version, "failed", error=str(exc), module=module),
                exc,
            )
            return
        hooks = []
        for caller in self._pm.get_hookcallers(obj) or []:
            hooks.append(caller.name)
            for impl in caller.get_hookimpls():
                if impl.plugin is obj:
                    # pluggy types HookImpl.function Final; instrumenting it is what gives provenance.
                    setattr(impl, "function", self._instrument(caller.name, name, impl))  # noqa: B010
        self._infos[name] = PluginInfo(name, dist, version, "loaded", tuple(sorted(hooks)), module=module)

    def _check_pending(self) -> None:
        """A hook implementation whose name matches no spec (``check_pending``) fails loudly."""
        while True:
            try:
                self._pm.check_pending()
                return
            except pluggy.PluginValidationError as exc:
                name = self._pm.get_name(exc.plugin) or "?"
                info = self._infos.get(name, PluginInfo(name, "?", "?", "loaded"))
                unknown = [c.name for c in self._pm.get_hookcallers(exc.plugin) or [] if c.spec is None]
                message = (
                    f"Plugin {info.label} implements unknown hook(s) {', '.join(unknown) or '?'}: "
                    f"no such hook specification (misspelt?). Known hooks: {', '.join(self.hook_names())}."
                )
                self._pm.unregister(exc.plugin)
                self._fail(PluginValidationError(message), attrs.evolve(info, status="failed", error=message), exc)

    def _fail(self, error: PluginError, info: PluginInfo, cause: BaseException) -> None:
        if info.name == CORE_PLUGIN or self.on_plugin_error == "raise":
            raise error from cause
        self._infos[info.name] = info
        warnings.warn(f"{error} (skipped: KVPOOLS_PLUGIN_ERRORS=warn)", KvpoolsPluginWarning, stacklevel=4)

    # -- instrumentation ----------------------------------------------------

    def _instrument(self, hook: str, plugin: str, impl: pluggy.HookImpl) -> Callable[..., Any]:
        function = impl.function
        records = self._records

        def note_raise(exc: BaseException) -> None:
            if records:
                records[-1].raised.setdefault(id(exc), plugin)

        if impl.wrapper or impl.hookwrapper:

            def note_changed() -> None:
                if records:
                    records[-1].wrapped.append(plugin)

            def wrapper(*args: Any) -> Any:
                try:
                    gen = cast(Generator[Any, Any, Any], function(*args))
                except BaseException as exc:
                    note_raise(exc)
                    raise
                return _blaming_generator(gen, note_raise, note_changed)

            return wrapper

        def plain(*args: Any) -> Any:
            try:
                result = function(*args)
            except BaseException as exc:
                note_raise(exc)
                raise
            if result is not None and records:
                records[-1].answered.append(plugin)
            return result

        return plain

    # -- calling ------------------------------------------------------------

    def call(self, hook: str, **kwargs: Any) -> tuple[Any, tuple[str, ...]]:
        """Call a hook; return its result and the plugins that shaped it (answerers, then wrappers).

        A raising implementation becomes a :class:`PluginHookError` naming the
        hook, the plugin and its distribution; a kvpools error raised on
        purpose by a plugin passes through unchanged.
        """
        result, record = self._invoke(hook, kwargs)
        shaped = tuple(record.answered) + tuple(p for p in record.wrapped if p not in record.answered)
        return result, shaped

    def call_collect(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call a collecting hook; return ``(plugin, result)`` for every non-None answer, in call order."""
        results, record = self._invoke(hook, kwargs)
        return list(zip(record.answered, results, strict=True))

    def call_first(self, hook: str, what: str, **kwargs: Any) -> tuple[Any, tuple[str, ...]]:
        """Call a firstresult hook that must be answered; no answer is a NoProviderError."""
        result, shaped = self.call(hook, **kwargs)
        if result is None:
            raise NoProviderError(hook, self.implementers(hook), what)
        return result, shaped

    def _invoke(self, hook: str, kwargs: Mapping[str, Any]) -> tuple[Any, _CallRecord]:
        caller = getattr(self._pm.hook, hook)
        record = _CallRecord(hook)
        self._records.append(record)
        try:
            result = caller(**kwargs)
        except KvpoolsError:
            raise
        except Exception as exc:
            plugin = record.raised.get(id(exc), "?")
            info = self._infos.get(plugin)
            label = info.label if info else f'"{plugin}"'
            raise PluginHookError(f"Plugin {label} failed in hook {hook}: {type(exc).__name__}: {exc}") from exc
        finally:
            self._records.pop()
        if self.trace:
            self._print_trace(hook, kwargs, record, result)
        return result, record

    def _print_trace(self, hook: str, kwargs: Mapping[str, Any], record: _CallRecord, result: Any) -> None:
        stream = self._trace_stream or sys.stderr
        args = ", ".join(f"{k}={_summary(v)}" for k, v in kwargs.items())
        answered = ", ".join(record.answered) or "nobody"
        wrapped = f"; wrapped by {', '.join(record.wrapped)}" if record.wrapped else ""
        order = " > ".join(self.implementers(hook))
        print(
            f"kvpools trace: {hook}({args}) asked [{order}] -> answered by {answered}{wrapped}: {_summary(result)}",
            file=stream,
        )

    # -- introspection ------------------------------------------------------

    def plugins(self) -> list[PluginInfo]:
        """Every plugin the registry knows, loaded or not, core first."""
        return sorted(self._infos.values(), key=lambda i: (i.name != CORE_PLUGIN, i.name))

    def plugin(self, name: str) -> PluginInfo:
        return self._infos[name]

    def implementers(self, hook: str) -> list[str]:
        """Plugins implementing ``hook`` in call order (tryfirst, plain LIFO, trylast)."""
        caller = getattr(self._pm.hook, hook)
        return [impl.plugin_name for impl in reversed(caller.get_hookimpls())]

    def hook_names(self) -> list[str]:
        """The hook specifications (not hooks that only a misspelt implementation created)."""
        return sorted(name for name, caller in vars(self._pm.hook).items() if getattr(caller, "spec", None) is not None)

    @property
    def plugin_manager(self) -> pluggy.PluginManager:
        """The underlying pluggy manager (for advanced embedding; prefer the typed calls)."""
        return self._pm


def _blaming_generator(
    gen: Generator[Any, Any, Any], note_raise: Callable[[BaseException], None], note_changed: Callable[[], None]
) -> Generator[Any, Any, Any]:
    """Proxy a new-style wrapper's generator: blame what it raises, notice when it changes the result."""
    try:
        value = next(gen)
    except BaseException as exc:
        note_raise(exc)
        raise
    while True:
        try:
            sent = yield value
        except GeneratorExit:
            gen.close()
            raise
        except BaseException as thrown:
            try:
                value = gen.throw(thrown)
            except StopIteration as stop:
                note_changed()
                return stop.value
            except BaseException as exc:
                if exc is not thrown:
                    note_raise(exc)
                raise
        else:
            try:
                value = gen.send(sent)
            except StopIteration as stop:
                if stop.value is not sent:
                    note_changed()
                return stop.value
            except BaseException as exc:
                note_raise(exc)
                raise


def _dist_name_version(ep: importlib_metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "?", "?"
    return dist.metadata["Name"] or dist.name, dist.version


def _dist_label(ep: importlib_metadata.EntryPoint) -> str:
    dist, version = _dist_name_version(ep)
    return f"{dist} {version} ({ep.value})"


def _summary(value: Any) -> str:
    """A short description of a hook argument or result for traces (never a tensor dump)."""
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return f"{type(value).__name__}({name})"
    if isinstance(value, (int, float, str, bool)) or value is None:
        return repr(value)
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[{len(value)}]"
    return type(value).__name__


_DEFAULT: Registry | None = None


def get_registry() -> Registry:
    """The process-wide default registry, built on first use (never at import)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Registry()
    return _DEFAULT


def reset_registry() -> None:
    """Forget the cached default registry (the next ``get_registry`` reloads plugins)."""
    global _DEFAULT
    _DEFAULT = None
