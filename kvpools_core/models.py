"""Which plugin parses which model: presets, config files and directories, and the plugins' claims on them.

``load_model`` resolves what the user typed (a preset name, a ``config.json`` path or a directory holding
one), reads the JSON (:mod:`kvpools_core.config`), and asks the architecture plugins to claim it
(``parse_model_config``): exactly one must.
"""

from __future__ import annotations

import difflib
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvpools_core.config import HF_ID_KEY, WEIGHTS_CONFIG_KEY, describe, read_config_file
from kvpools_core.errors import ConfigError, PluginConflictError, short_repr
from kvpools_core.readonly import readonly_config

if TYPE_CHECKING:
    from kvpools_core.registry import Registry
    from kvpools_core.values import ModelSpec, Serving


def resolve_model_source(model: str, registry: Registry) -> tuple[dict[str, Any], str, str]:
    """(config, source label, name) for a preset name, a config file or a directory."""
    presets = registry_presets(registry)
    if model in presets:
        path = Path(presets[model][1])
        return read_config_file(path), f"preset:{model}", model
    try:
        path = Path(model).expanduser()  # "~user" of no such user: RuntimeError
        is_dir, is_file = path.is_dir(), path.is_file()
    except (OSError, ValueError, RuntimeError) as exc:  # a name the file system refuses (too long, a NUL byte): no path
        raise ConfigError(
            f"Unknown model {short_repr(model)}: it is not a preset, and not a path this system can open "
            f"({getattr(exc, 'strerror', None) or exc}). Pass a preset name (kvpools presets), a config.json "
            f"or its directory."
        ) from None
    if is_dir:
        candidate = path / "config.json"
        if not candidate.is_file():
            raise ConfigError(f"Directory {path} holds no config.json. Point MODEL at a config.json or a preset name.")
        return read_config_file(candidate), str(candidate), path.resolve().name
    if is_file:
        return (
            read_config_file(path),
            str(path),
            path.stem if path.name != "config.json" else path.resolve().parent.name,
        )
    owner = registry.kept_out_preset_owner(model)
    if owner is not None:
        raise ConfigError(
            f"Model {model!r} is a preset of the plugin {owner.label}, which is "
            f"{'disabled' if owner.status == 'blocked' else 'not loaded'}, so kvpools does not know it. "
            f"To use it, {registry.enable_hint(owner)}"
        )
    close = difflib.get_close_matches(model.lower(), sorted(presets), n=3, cutoff=0.6)
    hint = f"Did you mean {' or '.join(map(repr, close))}? " if close else ""
    known = ", ".join(sorted(presets)) or f"none installed. {registry.loading_hint()}".rstrip()
    raise ConfigError(
        f"Unknown model {short_repr(model)}: it is neither a preset nor an existing config.json path or directory. "
        f"{hint}Presets: {known}."
    )


_PRESETS: weakref.WeakKeyDictionary[Registry, dict[str, tuple[str, str]]] = weakref.WeakKeyDictionary()
"""Each registry's presets, asked once: a plugin's preset set is fixed for the registry's life (the ``presets``
hook's contract), and asking every plugin to glob its folder again was a third of a preset plan's time."""
_PARSED: weakref.WeakKeyDictionary[Registry, dict[tuple[str, str, int, int], tuple[ModelSpec, str]]] = (
    weakref.WeakKeyDictionary()
)
"""Each registry's parsed presets, keyed by the preset's name and its file's path, modification time and size
(an edited file is parsed again).  A ``ModelSpec`` is frozen, so one parse serves every plan of the preset."""


def registry_presets(registry: Registry) -> dict[str, tuple[str, str]]:
    """Preset name → (plugin, path) across plugins; the same name from two plugins is a conflict."""
    found = _PRESETS.get(registry)
    if found is None:
        found = {name: (plugin, str(path)) for name, (plugin, path) in registry.call_named("presets", "Preset").items()}
        _PRESETS[registry] = found
    return dict(found)


def parse_config(config: Mapping[str, Any], source: str, registry: Registry) -> tuple[ModelSpec, str]:
    """Ask every architecture to claim the config; exactly one must."""
    # One read-only deep copy for every plugin: none can change what the next one (or the caller) reads.
    claims = registry.call_collect("parse_model_config", config=readonly_config(config), source=source)
    if not claims:
        raise registry.no_provider_error(
            "parse_model_config",
            f"no architecture plugin recognises {source} (model_type {describe(config.get('model_type', '?'))}, "
            f"architectures {describe(config.get('architectures'))}). Install a plugin for it or check the config.",
        )
    if len(claims) > 1:
        labels = " and ".join(registry.plugin(plugin).label for plugin, _ in claims)
        raise PluginConflictError(
            f"Two plugins claim the model {source}: {labels}. A model must have exactly one architecture; "
            f"disable one with KVPOOLS_DISABLED_PLUGINS (NAME, or DIST:NAME)."
        )
    plugin, spec = claims[0]
    return _with_vision_tower(spec, config), plugin


_VISION_DEFAULTS = (("num_hidden_layers", 24), ("hidden_size", 1024))
"""SGLang 0.5.23's ``getattr`` defaults in ``adjust_mem_fraction_for_vlm`` (``arg_groups/memory_hook.py`` L436-437)."""


def _with_vision_tower(spec: ModelSpec, config: Mapping[str, Any]) -> ModelSpec:
    """``spec`` with its ``vision_tower`` read from ``config``'s ``vision_config`` (a multimodal model's only)."""
    import attrs

    vision = config.get("vision_config")
    if not spec.is_multimodal or not isinstance(vision, Mapping):
        return spec
    sizes = []
    for key, default in _VISION_DEFAULTS:
        value = vision.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return spec  # unreadable: as if unknown (SGLang's default fraction is then refused by name)
        sizes.append(value)
    return attrs.evolve(spec, vision_tower=(sizes[0], sizes[1]))


def load_model(model: str, registry: Registry, name: str | None = None) -> tuple[ModelSpec, str]:
    """Resolve, read and parse ``model``; returns the spec and the plugin that claimed it."""
    import attrs

    preset = registry_presets(registry).get(model)
    if preset is not None:
        spec, plugin = _parsed_preset(model, Path(preset[1]), registry)
        # the cached spec is named after its preset: the same frozen value serves every plan of it
        return (spec if spec.name == (name or model) else attrs.evolve(spec, name=name or model)), plugin
    config, source, default_name = resolve_model_source(model, registry)
    spec, plugin = parse_config(config, source, registry)
    return attrs.evolve(spec, name=name or default_name, source=source), plugin


def _parsed_preset(model: str, path: Path, registry: Registry) -> tuple[ModelSpec, str]:
    """The preset's spec as its plugin parsed it, once per registry and file version (see ``_PARSED``)."""
    import attrs

    stat = path.stat()
    key = (model, str(path), stat.st_mtime_ns, stat.st_size)
    parsed = _PARSED.setdefault(registry, {})
    if key not in parsed:
        source = f"preset:{model}"
        config = read_config_file(path)
        spec, plugin = parse_config(config, source, registry)
        complete = config.get(WEIGHTS_CONFIG_KEY)
        if spec.vision_tower is None and isinstance(complete, str):
            # a preset holds the KV fields; the checkpoint's complete config it names holds the vision tower
            spec = _with_vision_tower(spec, read_config_file(path.parent / complete))
        parsed[key] = (attrs.evolve(spec, source=source, name=model), plugin)
    return parsed[key]


def launch_model_path(model: str, registry: Registry) -> str:
    """What an engine's ``--model-path`` (SGLang) or ``vllm serve MODEL`` takes for ``model`` as kvpools was given it.

    A preset is a name no engine knows: its Hugging Face id (the preset's ``_hf_id``), or the preset's name when
    a plugin's preset carries none. A ``config.json`` is its directory (where the engine reads the config and the
    weights); a directory or another file is the path given.
    """
    presets = registry_presets(registry)
    if model in presets:
        hf_id = read_config_file(Path(presets[model][1])).get(HF_ID_KEY)
        return hf_id if isinstance(hf_id, str) and hf_id else model
    path = Path(model)
    if path.name == "config.json" and path.is_file():
        return str(path.parent)
    return model


def served_model(spec: ModelSpec, serving: Serving) -> ModelSpec:
    """``spec`` in the dtype ``--dtype`` serves it in: the parsed dtype (SGLang's ``auto``) unless ``serving.dtype``
    names one (SGLang's and vLLM's ``_get_and_verify_dtype``: an explicit dtype wins, upcasting a half-precision
    checkpoint to float32 included), so ``--kv-cache-dtype auto`` follows it."""
    import attrs

    if serving.dtype == "auto" or serving.dtype == spec.dtype:
        return spec
    return attrs.evolve(spec, dtype=serving.dtype)
