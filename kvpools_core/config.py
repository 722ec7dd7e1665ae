"""Reading model configs: presets, files, directories, and typed field access.

``load_model`` resolves what the user typed (a preset name, a ``config.json``
path or a directory holding one), reads the JSON, and asks the architecture
plugins to claim it.  ``ConfigReader`` gives plugins typed access whose errors
name the field and the file.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kvpools_core.errors import ConfigError, NoProviderError, PluginConflictError

if TYPE_CHECKING:
    from kvpools_core.registry import Registry
    from kvpools_core.values import ModelSpec

_MISSING = object()


class ConfigReader:
    """Typed, error-naming access to a ``config.json`` mapping.

    Multimodal wrappers keep the language model under ``text_config``;
    :meth:`text` returns a reader of that part (or of the whole config).
    """

    def __init__(self, config: Mapping[str, Any], source: str, prefix: str = "") -> None:
        self.config = config
        self.source = source
        self.prefix = prefix

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.config.get(key)
        return default if value is None else value

    def text(self) -> ConfigReader:
        nested = self.config.get("text_config")
        if isinstance(nested, Mapping):
            return ConfigReader(nested, self.source, prefix=f"{self.prefix}text_config.")
        return self

    def error(self, key: str, problem: str, fix: str) -> ConfigError:
        return ConfigError(f"{self.source}: field {self.prefix}{key!r} {problem}. {fix}")

    def integer(self, key: str, default: Any = _MISSING, *, minimum: int = 1) -> int:
        value = self.config.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error(key, "is missing", f"Add {key!r} (an integer >= {minimum}) to the config.")
            return int(default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"must be an integer >= {minimum}, got {value!r}", "Fix the value in the config.")
        return value

    def optional_integer(self, key: str, *, minimum: int = 1) -> int | None:
        return None if self.config.get(key) is None else self.integer(key, minimum=minimum)

    def string(self, key: str, default: str = "") -> str:
        value = self.config.get(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {value!r}", "Fix the value in the config.")
        return value

    def string_list(self, key: str) -> tuple[str, ...]:
        value = self.config.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(key, f"must be a list of strings, got {value!r}", "Fix the value in the config.")
        return tuple(value)


def model_dtype(reader: ConfigReader) -> str:
    """The dtype SGLang serves a config in under ``--dtype auto``.

    The config's ``torch_dtype`` (or newer ``dtype``); bf16 when absent; a
    float32 checkpoint is served in float16 (SGLang's ``_get_and_verify_dtype``),
    so ``--kv-cache-dtype auto`` follows float16 too.
    """
    from kvpools_core.dtypes import MODEL_DTYPES

    for key in ("torch_dtype", "dtype"):
        value = reader.config.get(key)
        if value is not None:
            name = str(value).removeprefix("torch.")
            name = {
                "bf16": "bfloat16",
                "fp16": "float16",
                "half": "float16",
                "float": "float32",
                "fp32": "float32",
            }.get(name, name)
            if name not in MODEL_DTYPES:
                raise ConfigError(
                    f"{reader.source}: field {reader.prefix}{key!r} is {value!r}; kvpools knows "
                    f"{', '.join(MODEL_DTYPES)}. Fix the config or pass --kv-cache-dtype explicitly."
                )
            return "float16" if name == "float32" else name
    return "bfloat16"


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a ``config.json``; errors name the file and the JSON problem."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"Cannot read model config {path}: {exc.strerror or exc}.") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"Model config {path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}). "
            f"Fix the file or point MODEL at another config."
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"Model config {path} must hold a JSON object, got {type(data).__name__}.")
    return data


def resolve_model_source(model: str, registry: Registry) -> tuple[dict[str, Any], str, str]:
    """(config, source label, name) for a preset name, a config file or a directory."""
    presets = registry_presets(registry)
    if model in presets:
        path = Path(presets[model][1])
        return read_config_file(path), f"preset:{model}", model
    path = Path(model).expanduser()
    if path.is_dir():
        candidate = path / "config.json"
        if not candidate.is_file():
            raise ConfigError(f"Directory {path} holds no config.json. Point MODEL at a config.json or a preset name.")
        return read_config_file(candidate), str(candidate), path.resolve().name
    if path.is_file():
        return (
            read_config_file(path),
            str(path),
            path.stem if path.name != "config.json" else path.resolve().parent.name,
        )
    known = ", ".join(sorted(presets)) or "none installed"
    raise ConfigError(
        f"Unknown model {model!r}: it is neither a preset nor an existing config.json path or directory. "
        f"Presets: {known}."
    )


def registry_presets(registry: Registry) -> dict[str, tuple[str, str]]:
    """Preset name → (plugin, path) across plugins; the same name from two plugins is a conflict."""
    merged: dict[str, tuple[str, str]] = {}
    for plugin, offered in registry.call_collect("presets"):
        for name, path in offered.items():
            if name in merged and merged[name][0] != plugin:
                raise PluginConflictError(
                    f"Preset {name!r} is offered by two plugins: {registry.plugin(merged[name][0]).label} "
                    f"and {registry.plugin(plugin).label}. Disable one with KVPOOLS_DISABLED_PLUGINS."
                )
            merged[name] = (plugin, str(path))
    return merged


def parse_config(config: Mapping[str, Any], source: str, registry: Registry) -> tuple[ModelSpec, str]:
    """Ask every architecture to claim the config; exactly one must."""
    claims = registry.call_collect("parse_model_config", config=MappingProxyType(dict(config)), source=source)
    if not claims:
        model_type = config.get("model_type", "?")
        raise NoProviderError(
            "parse_model_config",
            registry.implementers("parse_model_config"),
            f"no architecture plugin recognises {source} (model_type {model_type!r}, "
            f"architectures {config.get('architectures')}). Install a plugin for it or check the config.",
        )
    if len(claims) > 1:
        labels = " and ".join(registry.plugin(plugin).label for plugin, _ in claims)
        raise PluginConflictError(
            f"Two plugins claim the model {source}: {labels}. A model must have exactly one architecture; "
            f"disable one with KVPOOLS_DISABLED_PLUGINS."
        )
    plugin, spec = claims[0]
    return spec, plugin


def load_model(model: str, registry: Registry, name: str | None = None) -> tuple[ModelSpec, str]:
    """Resolve, read and parse ``model``; returns the spec and the plugin that claimed it."""
    import attrs

    config, source, default_name = resolve_model_source(model, registry)
    spec, plugin = parse_config(config, source, registry)
    return attrs.evolve(spec, name=name or default_name, source=source), plugin
