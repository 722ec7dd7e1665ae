"""Which platform a plan is for: the installed platform plugins, their aliases and traits, the device's
free memory, the workspaces a platform charges, and the install line for one that is missing."""

from __future__ import annotations

import difflib

import attrs

from kvpools_core.errors import ConfigError, PluginResultError
from kvpools_core.options import option
from kvpools_core.registry import Registry
from kvpools_core.values import (
    ModelSpec,
    PoolSizing,
    Serving,
    Workspace,
)


def measure_free_bytes(device: str, serving: Serving, registry: Registry) -> tuple[int, tuple[str, ...]]:
    """The free bytes of ``device``, measured by the platform plugin that owns it, and who measured them."""
    reading, by = registry.call_first(
        "available_memory",
        f"no platform plugin measures memory of device {device!r}; installed platforms: "
        f"{', '.join(sorted(installed_platforms(registry))) or 'none'}.",
        device=device,
        serving=serving,
    )
    return int(reading["free_bytes"]), by


def installed_platforms(registry: Registry) -> dict[str, str]:
    """Platform name → the plugin that provides it; two providers of one name is a conflict."""
    return {name: plugin for name, (plugin, _) in registry.call_named("platforms", "Platform").items()}


VENDOR_DISTRIBUTIONS: dict[str, str] = {
    "ascend": "kvpools-ascend",
    "npu": "kvpools-ascend",
    "rocm": "kvpools-rocm",
    "hip": "kvpools-rocm",
}
"""Install hints only: the distribution that provides a platform (or alias) when it is not installed.

Dispatch never reads this table (which platform a device or host is on comes
from the plugins' ``platform_aliases`` and ``detect_platform``); it only words
the error for a platform nobody provides, so that ``--platform ascend`` without
the plugin says what to install rather than a guessed name.
"""


def install_command(*dists: str) -> str:
    """How to install vendor plugin distributions: from a package index, or from a kvpools checkout, whose
    ``plugins/`` directory ships them (they are not on every index)."""
    return (
        f"pip install {' '.join(dists)} (not on your package index? from a kvpools checkout: "
        f"pip install {' '.join(f'./plugins/{dist}' for dist in dists)})"
    )


def platform_aliases(registry: Registry) -> dict[str, str]:
    """Alias → platform name, from the plugins; each alias must name a platform its own plugin provides."""
    known = installed_platforms(registry)
    aliases: dict[str, str] = {}
    for alias, (plugin, target) in registry.call_named("platform_aliases", "Platform alias").items():
        label = registry.plugin(plugin).label
        if alias in known:
            raise PluginResultError(
                f"Plugin {label} declares the platform alias {alias!r}, which is already the name of a platform "
                f"(provided by {known[alias]!r}); an alias is another spelling, not a platform."
            )
        if known.get(target) != plugin:
            raise PluginResultError(
                f"Plugin {label} declares the platform alias {alias!r} for {target!r}, a platform it does not "
                f"provide (its platforms hook must name it)."
            )
        aliases[alias] = target
    return aliases


def select_platform(requested: str | None, device: str | None, registry: Registry) -> str:
    """The serving platform, as SGLang users choose it.

    ``requested`` (``--platform``, an alias resolved) wins; otherwise the
    platform plugins' claims (``detect_platform``) for ``device`` (``None`` and
    ``meta`` ask about this host): one claim selects it, two different ones are
    a ``ConfigError`` naming both; with no claim, the type of ``device``
    (an alias resolved), else the default ``Serving.platform``.
    """
    if requested:
        return platform_aliases(registry).get(requested, requested)
    probe = None if device is None or device == "meta" else str(device)
    known = installed_platforms(registry)
    claims: dict[str, str] = {}
    for plugin, name in registry.call_collect("detect_platform", device=probe):
        if known.get(name) != plugin:
            raise PluginResultError(
                f"Plugin {registry.plugin(plugin).label} claimed the platform {name!r} in detect_platform, "
                f"which it does not provide (its platforms hook must name it)."
            )
        claims.setdefault(name, plugin)
    if len(claims) > 1:
        found = " and ".join(f"{name!r} (plugin {registry.plugin(plugin).label})" for name, plugin in claims.items())
        where = f"device {probe!r}" if probe else "this host"
        raise ConfigError(
            f"Two platforms claim {where}: {found}. Choose one with {option('platform')} "
            f"({', '.join(sorted(claims))}), or disable the other's plugin with KVPOOLS_DISABLED_PLUGINS."
        )
    if claims:
        return next(iter(claims))
    if probe:
        kind = probe.split(":", 1)[0]
        return platform_aliases(registry).get(kind, kind)
    return str(attrs.fields(Serving).platform.default)


def resolve_platform(serving: Serving, registry: Registry) -> Serving:
    """``serving`` with its platform under its canonical name (an alias resolved), checked to be installed."""
    canonical = platform_aliases(registry).get(serving.platform, serving.platform)
    if canonical != serving.platform:
        serving = attrs.evolve(serving, platform=canonical)
    check_platform(serving, registry)
    return serving


def check_platform(serving: Serving, registry: Registry) -> None:
    """The serving platform must be one an installed plugin provides (a typo must not plan for cuda)."""
    known = installed_platforms(registry)
    if serving.platform not in known:
        candidates = sorted(set(known) | set(platform_aliases(registry)))
        close = difflib.get_close_matches(serving.platform, candidates, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        install = _install_hint(serving.platform, registry)
        raise ConfigError(
            f"Unknown platform {serving.platform!r} ({option('platform')}, or the type of {option('device')}): "
            f"installed platform plugins provide {', '.join(sorted(known)) or 'none'}.{hint} {install}"
            f"{registry.loading_hint()}".rstrip()
        )


def _install_hint(platform: str, registry: Registry) -> str:
    """What to install for a vendor's platform (when installed but not loaded, the loading hint says why)."""
    dist = VENDOR_DISTRIBUTIONS.get(platform)
    if dist is None:
        return "A vendor's platform (npu, rocm, ...) comes with its kvpools plugin distribution. "
    installed = {info.distribution.lower().replace("_", "-") for info in registry.plugins()}
    if dist in installed:
        return f"Its distribution {dist} is installed but its plugin is not loaded. "
    return f"The {platform!r} platform comes with the {dist} distribution: {install_command(dist)}. "


def resolve_platform_traits(
    serving: Serving, registry: Registry, provenance: dict[str, tuple[str, ...]] | None = None
) -> Serving:
    """``serving`` with ``platform_traits`` answered by the platform's plugin (the core's neutral ones otherwise)."""
    traits, by = registry.call_first(
        "platform_traits", f"no plugin answers the traits of platform {serving.platform!r}.", serving=serving
    )
    if traits.platform != serving.platform:
        raise PluginResultError(
            f"Plugin {registry.plugin(by[0]).label} answered platform_traits for {traits.platform!r} when asked "
            f"about {serving.platform!r}; a platform plugin answers for its own platform only and declines others."
        )
    if provenance is not None and by != ("core",):
        provenance["platform_traits"] = by
    known = serving.platform_traits
    if known is not None and known.platform == traits.platform and known.compute_capability is not None:
        traits = attrs.evolve(traits, compute_capability=known.compute_capability)  # the planned GPU's (--gpu)
    return attrs.evolve(serving, platform_traits=traits)


def resolve_workspaces(
    model: ModelSpec, serving: Serving, registry: Registry, provenance: dict[str, tuple[str, ...]] | None = None
) -> Serving:
    """``serving`` with the workspaces every plugin declares for this model (each owned by its plugin)."""
    found: dict[str, Workspace] = {}
    for plugin, declared in registry.call_collect("workspaces", model=model, serving=serving):
        for workspace in declared:
            if workspace.name in found:
                raise PluginResultError(
                    f"Workspace {workspace.name!r} is declared twice: by {found[workspace.name].owner!r} and by "
                    f"plugin {registry.plugin(plugin).label}; workspace names must be unique."
                )
            found[workspace.name] = attrs.evolve(workspace, owner=plugin)
    if provenance is not None and found:
        provenance["workspaces"] = tuple(dict.fromkeys(w.owner for w in found.values()))
    workspaces = tuple(found.values())
    if workspaces == serving.workspaces:  # most plans declare none: the serving is already what it would become
        return serving
    return attrs.evolve(serving, workspaces=workspaces)


def _check_workspaces_charged(
    serving: Serving, sizing: PoolSizing, sizing_by: tuple[str, ...], registry: Registry
) -> None:
    """Every declared workspace must be a pool of the sizing: a plugin that forgets them would overfill memory."""
    pools = {pool.name: pool for pool in sizing.pools}
    missing = [w.name for w in serving.workspaces if pools.get(w.name) is None or pools[w.name].kind != "workspace"]
    if missing:
        raise PluginResultError(
            f"Plugin {registry.plugin(sizing_by[0]).label} sized the pools without the workspace(s) "
            f"{', '.join(map(repr, missing))} that {', '.join(sorted({w.owner for w in serving.workspaces}))} "
            f"declared; a size_pools implementation charges them with kvpools_core.parts.sizing.request_pools."
        )


def check_plugin_options(serving: Serving, registry: Registry) -> None:
    """Every ``plugin_options`` key must be declared by an installed plugin (a typo must not be ignored)."""
    if not serving.plugin_options:
        return
    declared = {key: plugin for key, (plugin, _) in registry.call_named("plugin_options", "Plugin option").items()}
    unknown = sorted(set(serving.plugin_options) - set(declared))
    if unknown:
        known = ", ".join(f"{key} ({plugin})" for key, plugin in sorted(declared.items())) or "none"
        raise ConfigError(
            f"No installed plugin reads the plugin option(s) {', '.join(map(repr, unknown))} "
            f"({option('plugin_options')}). Declared options: {known}."
        )
