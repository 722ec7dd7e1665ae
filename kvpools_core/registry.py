"""The plugin registry: discovery, load controls, typed hook calls, checked answers, provenance, blame.

A ``Registry`` owns its pluggy ``PluginManager`` and its own entry-point loop
(group ``kvpools``), so that a broken plugin is reported by name, distribution
and version, and the other plugins still load when asked to.  Nothing is
created at import time: ``get_registry()`` builds a default registry lazily
and caches it; tests and embedding engines build their own ``Registry(...)``.

Every hook implementation is instrumented once, at registration, so the
registry knows which plugin answered each call (provenance) and which plugin
raised (blame) without the plugins doing anything, and checks each answer
against its hook's contract (``hookspecs.RESULTS``) where it leaves the plugin,
so a wrong value is blamed on the plugin that returned it.

Load controls: the built-in plugins (entry points of the ``kvpools``
distribution itself) always load; third-party entry points load unless
autoload is off.  An allow-list, when given, is exact: it alone decides which
entry points load, built-ins included.  A block-list disables names (or one
distribution's declaration of a name, ``DIST:NAME``) in every case.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import threading
import types
import warnings
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from typing import Any, cast

import attrs
import importlib_metadata
import pluggy

from kvpools_core import defaults, hookspecs
from kvpools_core.errors import (
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
    short_repr,
)
from kvpools_core.hookspecs import ResultContract, describe_value
from kvpools_core.options import env_flag

ENTRY_POINT_GROUP = "kvpools"
CORE_PLUGIN = "core"
BUILTIN_DISTRIBUTION = "kvpools"
"""Entry points declared by this distribution are the built-in plugins (loaded even with autoload off)."""


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


def _kvpools_version() -> str:
    try:
        return importlib_metadata.version("kvpools")
    except importlib_metadata.PackageNotFoundError:
        return "0+unknown"


class _CallRecord:
    """What happened inside one hook call: who answered, which wrappers ran and changed it, who raised."""

    def __init__(self, hook: str) -> None:
        self.hook = hook
        self.answered: list[str] = []
        self.wrappers: list[str] = []
        self.wrapped: list[str] = []
        self.raised: dict[int, str] = {}


class _RecordStack(threading.local):
    """The records of the hook calls running in this thread, innermost last.

    Per thread: one registry serves several threads at once (``kvpools serve`` plans each request in a worker
    thread), and a record shared between them would credit one thread's answers to another's call.
    """

    def __init__(self) -> None:
        self.stack: list[_CallRecord] = []

    def append(self, record: _CallRecord) -> None:
        self.stack.append(record)

    def pop(self) -> _CallRecord:
        return self.stack.pop()

    def __getitem__(self, index: int) -> _CallRecord:
        return self.stack[index]

    def __bool__(self) -> bool:
        return bool(self.stack)


class Registry:
    """Loads plugins and calls hooks on them.

    Arguments mirror the environment controls (an argument left ``None`` reads
    its variable): ``autoload`` (``KVPOOLS_DISABLE_PLUGIN_AUTOLOAD``) — off, only
    the built-in plugins load; ``plugins`` — an exact allow-list of entry-point
    names, built-ins included, that load whatever ``autoload`` says
    (``KVPOOLS_PLUGINS``); ``disabled`` — names, or ``DIST:NAME`` for one
    distribution's declaration of a name, never loaded (``KVPOOLS_DISABLED_PLUGINS``);
    ``trace`` (``KVPOOLS_TRACE_PLUGINS``); ``on_plugin_error`` ``"raise"`` or
    ``"warn"`` (``KVPOOLS_PLUGIN_ERRORS``).  ``extra_plugins`` registers
    in-process plugin objects by name after the entry points (tests, engines).
    Naming a plugin that is not installed in either list is an ``UnknownPluginError``.
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
        self.autoload = (not env_flag("KVPOOLS_DISABLE_PLUGIN_AUTOLOAD")) if autoload is None else autoload
        self._autoload_source = "KVPOOLS_DISABLE_PLUGIN_AUTOLOAD=1" if autoload is None else "Registry(autoload=False)"
        self.allowed = tuple(plugins) if plugins is not None else _env_list("KVPOOLS_PLUGINS")
        self._allowed_source = "KVPOOLS_PLUGINS" if plugins is None else "Registry(plugins=...)"
        self.disabled = tuple(disabled) if disabled is not None else (_env_list("KVPOOLS_DISABLED_PLUGINS") or ())
        self._disabled_source = "KVPOOLS_DISABLED_PLUGINS" if disabled is None else "Registry(disabled=...)"
        self.trace = env_flag("KVPOOLS_TRACE_PLUGINS") if trace is None else trace
        mode = on_plugin_error if on_plugin_error is not None else os.environ.get("KVPOOLS_PLUGIN_ERRORS", "raise")
        if mode not in ("raise", "warn"):
            raise PluginError(f"KVPOOLS_PLUGIN_ERRORS must be 'raise' or 'warn', got {mode!r}.")
        self.on_plugin_error = mode
        self._trace_stream = trace_stream
        self._disabled_names = {item for item in self.disabled if ":" not in item}
        self._disabled_qualified = {
            (_canonical(dist), name) for dist, _, name in (item.partition(":") for item in self.disabled if ":" in item)
        }
        if CORE_PLUGIN in self._disabled_names or any(name == CORE_PLUGIN for _, name in self._disabled_qualified):
            raise PluginError(
                f'The "{CORE_PLUGIN}" plugin holds the core defaults and cannot be disabled; '
                f"remove it from {self._disabled_source}."
            )
        extras = dict(extra_plugins or {})
        self._pm = pluggy.PluginManager(hookspecs.PROJECT)
        self._pm.add_hookspecs(hookspecs)
        self._infos: dict[str, PluginInfo] = {}
        self._records = _RecordStack()
        self._skipped: dict[str, importlib_metadata.EntryPoint] = {}
        self._register_core()
        self._load_entry_points(extras)
        for name, obj in extras.items():
            module = getattr(obj, "__name__", None)
            if name in self._disabled_names:
                self._infos[name] = PluginInfo(name, "<in-process>", "-", "blocked", module=module)
                continue
            self._register(name, obj, "<in-process>", "-", module=module)
        self._check_pending()

    # -- loading ------------------------------------------------------------

    def _register_core(self) -> None:
        self._register(CORE_PLUGIN, defaults, "kvpools", _kvpools_version(), module=defaults.__name__)

    @staticmethod
    def _entry_points() -> dict[str, list[importlib_metadata.EntryPoint]]:
        """The group's entry points by name; one module declared twice (a distribution seen twice) counts once."""
        groups: dict[str, list[importlib_metadata.EntryPoint]] = {}
        for ep in importlib_metadata.entry_points(group=ENTRY_POINT_GROUP):
            group = groups.setdefault(ep.name, [])
            if all(other.value != ep.value for other in group):
                group.append(ep)
        return groups

    def _load_entry_points(self, extras: Mapping[str, object]) -> None:
        groups = self._entry_points()
        self._check_named(groups, extras)
        chosen: list[importlib_metadata.EntryPoint] = []
        skipped: list[tuple[importlib_metadata.EntryPoint, str]] = []
        for name, group in groups.items():
            live = []
            for ep in group:
                if self._is_disabled(ep):
                    skipped.append((ep, "blocked"))
                elif self._wanted(ep):
                    live.append(ep)
                else:
                    skipped.append((ep, "not-loaded"))
            # A conflict matters only between declarations that would load: a disabled
            # (or unwanted) one resolves it.
            if len(live) > 1:
                raise PluginConflictError(self._conflict_message(name, live))
            chosen += live
        # Registration order makes equal-priority dispatch deterministic: pluggy calls the
        # last-registered first, so out-of-tree plugins (registered after the built-ins, by
        # name) are asked before the built-ins they may specialise.
        for ep in sorted(chosen, key=lambda ep: (not _is_builtin(ep), ep.name)):
            self._load(ep)
        for ep, status in skipped:
            dist, version = _dist_name_version(ep)
            key = ep.name if ep.name not in self._infos else f"{dist}:{ep.name}"
            self._infos[key] = PluginInfo(ep.name, dist, version, status, module=ep.value)
            self._skipped[key] = ep

    def _load(self, ep: importlib_metadata.EntryPoint) -> None:
        dist, version = _dist_name_version(ep)
        try:
            obj = ep.load()
        except KeyboardInterrupt:  # Ctrl-C during a slow import is the user's, not the plugin's failure
            raise
        except BaseException as exc:  # any import failure (even SystemExit) is the plugin's, and is named
            cause = _describe_exception(exc)
            self._fail(
                PluginLoadError(f'Error loading plugin "{ep.name}" ({dist} {version}): {cause}'),
                PluginInfo(ep.name, dist, version, "failed", error=cause, module=ep.value),
                exc,
            )
            return
        self._register(ep.name, obj, dist, version, module=ep.value, entry_point=f"{ep.name} = {ep.value}")

    def _wanted(self, ep: importlib_metadata.EntryPoint) -> bool:
        if self.allowed is not None:
            return ep.name in self.allowed
        return self.autoload or _is_builtin(ep)

    def _is_disabled(self, ep: importlib_metadata.EntryPoint) -> bool:
        dist = _canonical(_dist_name_version(ep)[0])
        return ep.name in self._disabled_names or (dist, ep.name) in self._disabled_qualified

    def _check_named(
        self, groups: Mapping[str, list[importlib_metadata.EntryPoint]], extras: Mapping[str, object]
    ) -> None:
        """Every name in the allow- and block-lists must be installed: a typo must not pass silently."""
        names = sorted(set(groups) | set(extras))
        declared = {(_canonical(_dist_name_version(ep)[0]), ep.name) for group in groups.values() for ep in group}
        qualified = sorted(f"{_dist_name_version(ep)[0]}:{ep.name}" for group in groups.values() for ep in group)

        def installed(item: str) -> bool:
            dist, qualified_by, name = item.partition(":")
            return (_canonical(dist), name) in declared if qualified_by else item in names

        unknown = [item for item in self.disabled if not installed(item)]
        if unknown:
            raise UnknownPluginError(
                f"{self._disabled_source} names plugin(s) that are not installed: "
                f"{_with_suggestions(unknown, names, qualified)}. Installed: {', '.join(names) or 'none'}"
                + (f" (by distribution: {', '.join(qualified)})" if any(":" in item for item in unknown) else "")
                + ". Fix or remove the name."
            )
        if self.allowed is not None:
            missing = [name for name in self.allowed if name not in names and name != CORE_PLUGIN]
            if missing:
                raise UnknownPluginError(
                    f"{self._allowed_source} names plugin(s) that are not installed: "
                    f"{_with_suggestions(missing, names, qualified)}. Installed: {', '.join(names) or 'none'}."
                )

    def _conflict_message(self, name: str, live: Sequence[importlib_metadata.EntryPoint]) -> str:
        labels = " and ".join(_dist_label(ep) for ep in live)
        keep = _dist_name_version(live[-1])[0]
        drop = ",".join(f"{_dist_name_version(ep)[0]}:{name}" for ep in live[:-1])
        return (
            f'{len(live)} distributions declare the kvpools plugin "{name}": {labels}. Uninstall all but one, '
            f"or disable the others by distribution: KVPOOLS_DISABLED_PLUGINS={drop} keeps {keep}'s "
            f'("DIST:NAME"; a plain {name} disables every "{name}").'
        )

    def _register(
        self, name: str, obj: object, dist: str, version: str, *, module: str | None, entry_point: str | None = None
    ) -> None:
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
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # a duplicate object (ValueError), or an attribute that raises when read
            self._fail(
                PluginLoadError(f"Error registering plugin {label}: {_describe_exception(exc)}"),
                PluginInfo(name, dist, version, "failed", error=_describe_exception(exc), module=module),
                exc,
            )
            return
        callers = self._pm.get_hookcallers(obj) or []
        if not callers:
            # pluggy registers any object, and one without @hookimpl functions (a function or a number named
            # by the entry point, a module that forgot the decorator) would load silently and never answer.
            self._pm.unregister(obj)
            message = _no_hooks_message(label, obj, entry_point)
            self._fail(
                PluginLoadError(message),
                PluginInfo(name, dist, version, "failed", error=message, module=module),
                None,
            )
            return
        hooks = []
        for caller in callers:
            hooks.append(caller.name)
            firstresult = bool(caller.spec and caller.spec.opts.get("firstresult"))
            for impl in caller.get_hookimpls():
                if impl.plugin is obj:
                    # pluggy types HookImpl.function Final; instrumenting it is what gives provenance.
                    setattr(impl, "function", self._instrument(caller.name, name, impl, firstresult))  # noqa: B010
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

    def _fail(self, error: PluginError, info: PluginInfo, cause: BaseException | None) -> None:
        if info.name == CORE_PLUGIN or self.on_plugin_error == "raise":
            raise error from cause
        self._infos[info.name] = info
        warnings.warn(f"{error} (skipped: KVPOOLS_PLUGIN_ERRORS=warn)", KvpoolsPluginWarning, stacklevel=4)

    # -- instrumentation ----------------------------------------------------

    def _instrument(self, hook: str, plugin: str, impl: pluggy.HookImpl, firstresult: bool) -> Callable[..., Any]:
        function = impl.function
        records = self._records
        contract = hookspecs.RESULTS.get(hook)

        def note_raise(exc: BaseException) -> None:
            if records:
                records[-1].raised.setdefault(id(exc), plugin)

        if impl.wrapper or impl.hookwrapper:
            old_style = bool(impl.hookwrapper)

            def on_change(new: Any, old: Any) -> None:
                record = records[-1] if records else None
                if record is not None:
                    record.wrapped.append(plugin)
                # pluggy turns an exception in an old-style teardown into a warning first; the
                # final check after the call (``_check_final``) blames an old-style wrapper instead.
                if contract is not None and not old_style and not isinstance(new, BaseException):
                    answered = record.answered if record is not None else None
                    self._check_replacement(hook, plugin, firstresult, contract, new, old, answered)

            def wrapper(*args: Any, **kwargs: Any) -> Any:
                if records:
                    records[-1].wrappers.append(plugin)
                try:
                    gen = cast(Generator[Any, Any, Any], function(*args, **kwargs))
                except BaseException as exc:
                    note_raise(exc)
                    raise
                return _blaming_generator(gen, note_raise, on_change, old_style=old_style)

            return wrapper

        def plain(*args: Any, **kwargs: Any) -> Any:
            try:
                result = function(*args, **kwargs)
            except BaseException as exc:
                note_raise(exc)
                raise
            if result is not None:
                if contract is not None:
                    self._check_answer(hook, plugin, contract, result)
                if records:
                    records[-1].answered.append(plugin)
            return result

        return plain

    # -- checking answers ---------------------------------------------------

    def _check_answer(self, hook: str, plugin: str, contract: ResultContract, value: Any) -> None:
        """One implementation's own answer, before any wrapper or core step sees it."""
        problem = _problem(contract, value)
        if problem is not None:
            raise PluginResultError(
                f"Plugin {self._label(plugin)} answered hook {hook} with {describe_value(value)}: {problem}. "
                f"Expected {contract.expected}."
            )

    def _check_replacement(
        self,
        hook: str,
        plugin: str,
        firstresult: bool,
        contract: ResultContract,
        new: Any,
        old: Any,
        answered: Sequence[str] | None,
    ) -> None:
        """A wrapper's replacement of the result: the same contract, and nothing silently dropped."""
        label = self._label(plugin)
        by = ", ".join(answered or ()) or "nobody"
        if firstresult:
            if new is None:
                if old is not None and not isinstance(old, BaseException):
                    raise PluginResultError(
                        f"Wrapper {label} of hook {hook} returned None, discarding the answer of {by} "
                        f"({describe_value(old)}); a wrapper returns the result it received (return (yield)) "
                        f"or a replacement."
                    )
                return
            problem = _problem(contract, new)
            if problem is not None:
                raise PluginResultError(
                    f"Wrapper {label} replaced the answer of {by} to hook {hook} with {describe_value(new)}: "
                    f"{problem}. Expected {contract.expected}."
                )
            return
        self._check_collected(hook, f"Wrapper {label}", contract, new, answered)

    def _check_collected(
        self, hook: str, culprit: str, contract: ResultContract, results: Any, answered: Sequence[str] | None
    ) -> None:
        """A collecting hook's result list: one valid answer per answering plugin, so each stays attributed."""
        if not isinstance(results, list):
            raise PluginResultError(
                f"{culprit} of collecting hook {hook} returned {describe_value(results)}; expected the list it "
                f"received (one answer per plugin), each {contract.expected}."
            )
        if answered is not None and len(results) != len(answered):
            raise PluginResultError(
                f"{culprit} of collecting hook {hook} returned {len(results)} answer(s) for {len(answered)} "
                f"plugin(s) ({', '.join(answered) or 'none'}); a wrapper of a collecting hook may change answers "
                f"but not add or drop them."
            )
        for index, item in enumerate(results):
            problem = "None is no answer" if item is None else _problem(contract, item)
            if problem is not None:
                source = f" (from {answered[index]})" if answered is not None else ""
                raise PluginResultError(
                    f"{culprit} of hook {hook} made answer {index}{source} {describe_value(item)}: {problem}. "
                    f"Expected {contract.expected}."
                )

    def _check_final(self, hook: str, result: Any, record: _CallRecord) -> None:
        """After wrappers ran: catches what identity checks cannot see (a result changed in place)."""
        contract = hookspecs.RESULTS.get(hook)
        caller = getattr(self._pm.hook, hook)
        if contract is None or caller.spec is None:
            return
        culprits = record.wrapped or record.wrappers
        culprit = f"Wrapper(s) {', '.join(self._label(p) for p in dict.fromkeys(culprits))}"
        if not caller.spec.opts.get("firstresult"):
            self._check_collected(hook, culprit, contract, result, record.answered)
            return
        problem = _problem(contract, result)
        if problem is not None:
            raise PluginResultError(
                f"{culprit} of hook {hook} left the answer of {', '.join(record.answered) or 'nobody'} as "
                f"{describe_value(result)}: {problem}. Expected {contract.expected}."
            )

    def _label(self, plugin: str) -> str:
        info = self._infos.get(plugin)
        return info.label if info else f'"{plugin}"'

    # -- calling ------------------------------------------------------------

    def call(self, hook: str, **kwargs: Any) -> tuple[Any, tuple[str, ...]]:
        """Call a hook; return its result and the plugins that shaped it (answerers, then wrappers).

        A raising implementation becomes a :class:`PluginHookError` naming the
        hook, the plugin and its distribution; an answer that breaks the hook's
        contract a :class:`PluginResultError` naming the plugin that returned it;
        a kvpools error raised on purpose by a plugin passes through unchanged.
        """
        result, record = self._invoke(hook, kwargs)
        shaped = tuple(record.answered) + tuple(p for p in record.wrapped if p not in record.answered)
        return result, shaped

    def call_collect(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call a collecting hook; return ``(plugin, result)`` for every non-None answer, in call order."""
        results, record = self._invoke(hook, kwargs)
        return list(zip(record.answered, results, strict=True))

    def call_named(self, hook: str, what: str, **kwargs: Any) -> dict[str, tuple[str, Any]]:
        """Call a collecting hook whose answers map names to values (presets, platforms, plugin options).

        Returns name → (plugin, value); one name from two plugins is a
        :class:`PluginConflictError` naming both (``what`` says what the name is,
        e.g. ``"Preset"``).
        """
        merged: dict[str, tuple[str, Any]] = {}
        for plugin, offered in self.call_collect(hook, **kwargs):
            for name, value in offered.items():
                if name in merged and merged[name][0] != plugin:
                    raise PluginConflictError(
                        f"{what} {name!r} comes from two plugins: {self._label(merged[name][0])} and "
                        f"{self._label(plugin)}. Disable one with KVPOOLS_DISABLED_PLUGINS (NAME, or DIST:NAME)."
                    )
                merged[name] = (plugin, value)
        return merged

    def call_first(self, hook: str, what: str, **kwargs: Any) -> tuple[Any, tuple[str, ...]]:
        """Call a firstresult hook that must be answered; no answer is a NoProviderError."""
        result, shaped = self.call(hook, **kwargs)
        if result is None:
            raise self.no_provider_error(hook, what)
        return result, shaped

    def no_provider_error(self, hook: str, what: str) -> NoProviderError:
        """The error for a hook nobody answered: the plugins asked, and why others were not (:meth:`loading_hint`)."""
        error = NoProviderError(hook, self.implementers(hook), what)
        hint = self.loading_hint()
        if hint:
            error.args = (f"{error} {hint}",)
        return error

    def loading_hint(self) -> str:
        """Which installed plugins the controls kept out, and how to let them in ("" when none were)."""
        infos = self.plugins()

        def labels(status: str) -> str:
            return ", ".join(info.label for info in infos if info.status == status)

        parts = []
        not_loaded = labels("not-loaded") or "none"
        if self.allowed is not None:
            parts.append(
                f"{self._allowed_source} loads only {', '.join(self.allowed) or 'nothing'} (and core); installed "
                f"but not loaded: {not_loaded}. Add the plugin you need to it, or unset it."
            )
        elif not self.autoload:
            parts.append(
                f"Plugin autoload is off ({self._autoload_source}), so only the built-in plugins load; installed "
                f"but not loaded: {not_loaded}. Unset it, or name every plugin to load in KVPOOLS_PLUGINS "
                f"(built-ins included)."
            )
        if blocked := labels("blocked"):
            parts.append(f"Disabled by {self._disabled_source}: {blocked}.")
        if failed := labels("failed"):
            parts.append(f"Failed to load (skipped): {failed}.")
        return " ".join(parts)

    def kept_out_preset_owner(self, preset: str) -> PluginInfo | None:
        """The built-in plugin the controls kept out (``blocked`` or ``not-loaded``) that ships ``preset``, if any.

        For an error message only: the built-in plugin is imported to ask its
        ``presets`` hook, but not registered.  A third-party plugin kept out is
        never imported (a user may have disabled it because its import fails).
        """
        for key, ep in self._skipped.items():
            if not _is_builtin(ep):
                continue
            try:
                obj = ep.load()
                offered = obj.presets() if self._pm.parse_hookimpl_opts(obj, "presets") is not None else None
            except Exception:  # a message helper: a built-in that cannot answer is simply not named
                continue
            if isinstance(offered, Mapping) and preset in offered:
                return self._infos[key]
        return None

    def enable_hint(self, info: PluginInfo) -> str:
        """How to let a plugin the load controls kept out load (one sentence, for error messages)."""
        if info.status == "blocked":
            named = [item for item in self.disabled if item.partition(":")[2] == info.name or item == info.name]
            return f"remove {' and '.join(named) or info.name} from {self._disabled_source}."
        if self.allowed is not None:
            return f"add {info.name} to {self._allowed_source} (or unset it)."
        if self._autoload_source.startswith("KVPOOLS_"):
            return "turn plugin autoload back on (unset KVPOOLS_DISABLE_PLUGIN_AUTOLOAD)."
        return "turn plugin autoload back on (Registry(autoload=True))."

    def _invoke(self, hook: str, kwargs: Mapping[str, Any]) -> tuple[Any, _CallRecord]:
        caller = getattr(self._pm.hook, hook)
        record = _CallRecord(hook)
        self._records.append(record)
        try:
            result = caller(**kwargs)
            if record.wrappers and result is not None:
                self._check_final(hook, result, record)
        except InvalidValueError as exc:
            # a frozen value built with a bad field inside a plugin: the plugin's bug, named
            plugin = record.raised.get(id(exc))
            if plugin is None:
                raise
            invalid = PluginResultError(f"Plugin {self._label(plugin)} built an invalid value in hook {hook}: {exc}")
            self._print_trace(hook, kwargs, record, None, invalid)
            raise invalid from exc
        except KvpoolsError as exc:
            self._print_trace(hook, kwargs, record, None, exc)
            raise
        except KeyboardInterrupt:  # Ctrl-C in a slow hook: the user's wish, passed on (the CLI exits 130)
            raise
        except BaseException as exc:  # anything else a plugin raises, even SystemExit(0), is its failure, named
            plugin = record.raised.get(id(exc), "?")
            error = PluginHookError(f"Plugin {self._label(plugin)} failed in hook {hook}: {_describe_exception(exc)}")
            self._print_trace(hook, kwargs, record, None, error)
            raise error from exc
        finally:
            self._records.pop()
        self._print_trace(hook, kwargs, record, result)
        return result, record

    def _print_trace(
        self, hook: str, kwargs: Mapping[str, Any], record: _CallRecord, result: Any, error: BaseException | None = None
    ) -> None:
        if not self.trace:
            return
        stream = self._trace_stream or sys.stderr
        args = ", ".join(f"{k}={_summary(v)}" for k, v in kwargs.items())
        answered = ", ".join(record.answered) or "nobody"
        wrapped = f"; wrapped by {', '.join(record.wrapped)}" if record.wrapped else ""
        order = " > ".join(self.implementers(hook))
        outcome = _summary(result) if error is None else f"raised {type(error).__name__}: {error}"
        print(
            f"kvpools trace: {hook}({args}) asked [{order}] -> answered by {answered}{wrapped}: {outcome}",
            file=stream,
        )

    # -- introspection ------------------------------------------------------

    def plugins(self) -> list[PluginInfo]:
        """Every plugin the registry knows, loaded or not, core first."""
        return sorted(self._infos.values(), key=lambda i: (i.name != CORE_PLUGIN, i.name, i.distribution))

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


def _problem(contract: ResultContract, value: Any) -> str | None:
    """What breaks the contract; a check that itself fails (a raising ``nbytes``) is a problem too."""
    try:
        return contract.problem(value)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return f"checking it raised {_describe_exception(exc)}"


def _describe_exception(exc: BaseException) -> str:
    """``Type: message`` of what a plugin raised; an exception that is not an error is said to be one."""
    text = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, SystemExit):
        text += " (a plugin must not exit the process; raise an exception instead)"
    elif not isinstance(exc, Exception):
        text += " (a BaseException that is not an Exception)"
    return text


def _no_hooks_message(label: str, obj: object, entry_point: str | None) -> str:
    """Why an object with no ``@hookimpl`` attributes is no plugin, naming what the entry point pointed at."""
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(obj, types.ModuleType):
        what = f"the module {obj.__name__}, which has no @kvpools_core.hookimpl functions"
    elif isinstance(qualname, str):
        kind = "class" if isinstance(obj, type) else "function"
        what = (
            f"the {kind} {getattr(obj, '__module__', '?')}.{qualname}, which has no @kvpools_core.hookimpl attributes"
        )
    else:
        kind = type(obj).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        what = f"{short_repr(obj, 60)} ({article} {kind}), which has no @kvpools_core.hookimpl attributes"
    declared = f" Its entry point {entry_point} names {what}." if entry_point else f" It is {what}."
    return (
        f"Plugin {label} registers no kvpools hooks.{declared} A plugin is a module (or an object) whose hook "
        f"implementations are functions decorated with @kvpools_core.hookimpl: point the entry point at that "
        f"module, or decorate the functions."
    )


def _blaming_generator(
    gen: Generator[Any, Any, Any],
    note_raise: Callable[[BaseException], None],
    on_change: Callable[[Any, Any], None],
    *,
    old_style: bool = False,
) -> Generator[Any, Any, Any]:
    """Proxy a wrapper's generator: blame what it raises, notice (and check) when it changes the result.

    A new-style wrapper changes the result by returning another object; an
    old-style ``hookwrapper`` by ``force_result`` on the ``Result`` it is sent.
    """
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
                on_change(stop.value, thrown)
                return stop.value
            except BaseException as exc:
                if exc is not thrown:
                    note_raise(exc)
                raise
        else:
            before = _outcome(sent) if old_style else sent
            try:
                value = gen.send(sent)
            except StopIteration as stop:
                after = _outcome(sent) if old_style else stop.value
                if after is not before:
                    on_change(after, before)
                return stop.value
            except BaseException as exc:
                note_raise(exc)
                raise


def _outcome(result: Any) -> Any:
    """The value (or exception) an old-style hookwrapper's ``pluggy.Result`` holds now."""
    exception = getattr(result, "exception", None)
    return exception if exception is not None else result.get_result()


def _canonical(dist: str) -> str:
    """A distribution name compared as packaging does (``Kvpools_Foo`` is ``kvpools-foo``)."""
    return re.sub(r"[-_.]+", "-", dist).lower()


def _is_builtin(ep: importlib_metadata.EntryPoint) -> bool:
    return _canonical(_dist_name_version(ep)[0]) == BUILTIN_DISTRIBUTION


def _dist_name_version(ep: importlib_metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "?", "?"
    return dist.metadata["Name"] or dist.name, dist.version


def _dist_label(ep: importlib_metadata.EntryPoint) -> str:
    dist, version = _dist_name_version(ep)
    return f"{dist} {version} ({ep.value})"


def _with_suggestions(unknown: Iterable[str], names: Sequence[str], qualified: Sequence[str]) -> str:
    """Each unknown name, with the installed names it is close to (a typo's likely meaning)."""
    shown = []
    for item in unknown:
        close = difflib.get_close_matches(item, qualified if ":" in item else names, n=3, cutoff=0.6)
        shown.append(f"{item} (did you mean {' or '.join(close)}?)" if close else item)
    return ", ".join(shown)


def _summary(value: Any) -> str:
    """A short description of a hook argument or result for traces (never a tensor dump)."""
    name = getattr(value, "name", None)
    if isinstance(name, str):
        return f"{type(value).__name__}({name})"
    if isinstance(value, (int, float, str, bool)) or value is None:
        return short_repr(value)
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
