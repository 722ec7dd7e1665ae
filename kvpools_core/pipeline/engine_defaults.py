"""The engine's own defaults for options the user left unset (the ``engine_defaults`` hook).

SGLang leaves some server args ``None`` and resolves them per model and per
platform before it sizes anything (0.5.23: ``arg_groups/model_overrides/*.py``
and the platforms' ``set_default_server_args``).  ``Serving`` marks such an
option unset (:func:`kvpools_core.values.is_unset`); this step asks every
plugin what the engine would choose, replaces the unset values with the first
answer per option in dispatch order (platform plugins, then the architecture),
and says so in a note.  An explicit option is never replaced.  The core names
no model here: the architecture and platform plugins answer.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvpools_core.errors import KvpoolsError, PluginResultError
from kvpools_core.options import option
from kvpools_core.registry import Registry
from kvpools_core.values import LATE_DEFAULT_OPTIONS, EngineDefault, LateDefaultInt, ModelSpec, Serving


def apply_engine_defaults(
    model: ModelSpec, serving: Serving, registry: Registry, provenance: dict[str, tuple[str, ...]] | None = None
) -> tuple[Serving, tuple[str, ...]]:
    """``serving`` with its unset options set to the engine's defaults for ``model``, and one note per default.

    Each option takes the first answer in dispatch order; the plugins whose
    answers were applied go to ``provenance["engine_defaults"]``.  A value the
    option refuses is blamed on the plugin that answered it.
    """
    unset = set(serving.unset_options)
    if not unset:
        return serving, ()
    chosen: dict[str, tuple[str, EngineDefault]] = {}
    for plugin, answers in registry.call_collect("engine_defaults", model=model, serving=serving):
        for answer in answers:
            if answer.option in unset and answer.option not in chosen:
                chosen[answer.option] = (plugin, answer)
    if not chosen:
        return serving, ()
    given: dict[str, Any] = {name: _given(answer.value) for name, (_, answer) in chosen.items()}
    for name in LATE_DEFAULT_OPTIONS:
        if name in given:  # declared after SGLang's memory settings read it unset (LateDefaultInt)
            given[name] = LateDefaultInt(given[name])
    try:
        resolved = attrs.evolve(serving, **given)  # one validation of the serving for all the answers
    except KvpoolsError:
        _blame(serving, chosen, registry)
        raise
    if provenance is not None:
        provenance["engine_defaults"] = tuple(dict.fromkeys(plugin for plugin, _ in chosen.values()))
    notes = tuple(
        f"{option(name)} {_shown(answer.value)}: {answer.reason}; {option(name)} overrides it"
        for name, (_, answer) in chosen.items()
    )
    return resolved, notes


def _blame(serving: Serving, chosen: dict[str, tuple[str, EngineDefault]], registry: Registry) -> None:
    """Raise for the first answer (in dispatch order) that ``Serving`` refuses on its own, naming its plugin."""
    for plugin, answer in chosen.values():
        field: dict[str, Any] = {answer.option: answer.value}
        try:
            attrs.evolve(serving, **field)
        except KvpoolsError as exc:
            raise PluginResultError(
                f"Plugin {registry.plugin(plugin).label} answered engine_defaults with {answer.option} "
                f"{answer.value!r}, which Serving refuses: {exc}"
            ) from exc


def _given(value: int | float | str) -> int | float | str:
    """A plain value (an answer that passed on an unset marker would stay replaceable)."""
    if type(value) in (int, float, str):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    return int(value) if isinstance(value, int) else float(value)


def _shown(value: int | float | str) -> str:
    return value if isinstance(value, str) else f"{value:g}"
