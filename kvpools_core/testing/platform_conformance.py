"""The conformance checks a platform plugin must pass, as plain functions.

A platform plugin (one that answers the ``platforms`` hook) is proven on its
own contract, not through one architecture: it names its platforms and their
aliases consistently; the accelerators it contributes (if any) are well
formed, uniquely named and planned on with its traits; its traits leave at least one page size for every
model and for every kernel family its rules name; it answers for its own
platforms and devices only (traits, workspaces, memory probes, layouts,
allocators, validation); every installed architecture's presets either plan
on it and build on ``meta`` to exactly the planned bytes, with the slot index
dtype its traits promise, or are refused with a message that names an
option; and planning for it never imports torch (a planner runs where no
device library is).

Each check raises :class:`~kvpools_core.testing.conformance.ConformanceFailure`
naming the plugin and, for a planning case, the ``kvpools plan`` command that
replays it.  :mod:`kvpools_core.testing.suite` runs them for
``pytest --kvpools-conformance=NAME`` when ``NAME`` is a platform plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from kvpools_core.errors import KvpoolsError
from kvpools_core.registry import Registry
from kvpools_core.testing.conformance import Case, ConformanceFailure, check_build, check_plan
from kvpools_core.testing.registries import FakeDeviceMemory, isolated_registry
from kvpools_core.testing.strategies import GiB, plugin_presets
from kvpools_core.values import GPU, PlatformTraits, Serving, to_dict

__all__ = [
    "FOREIGN_PLATFORM",
    "PAGE_CANDIDATES",
    "check_accelerators",
    "check_answers_only_for_its_platforms",
    "check_architectures_plan_and_build",
    "check_names_its_platforms",
    "check_plans_without_torch",
    "check_quantization_traits",
    "check_traits_leave_a_page",
    "platform_plugins",
]

FOREIGN_PLATFORM = "kvpools-conformance-foreign"
"""A platform no plugin provides: what a platform plugin is asked about to prove it declines."""
PAGE_CANDIDATES = tuple(range(1, 1025))
"""Page sizes tried for "some page is allowed" (SGLang's largest page in use is 256)."""
PLANNING_BUDGET = 80 * GiB
REFERENCE_PRESET = "llama-3.1-8b"
"""The model the decline and import checks plan (the built-in ``mha`` plugin's preset)."""
_BUILD_HOOKS = ("buffer_layout", "build_pool", "build_req_to_token_pool")


def platform_plugins(registry: Registry) -> dict[str, list[str]]:
    """Plugin name → the platforms it provides (the ``platforms`` hook), for every loaded plugin."""
    provided: dict[str, list[str]] = {}
    for plugin, names in registry.call_collect("platforms"):
        provided.setdefault(plugin, []).extend(names)
    return provided


def check_names_its_platforms(plugin: str, registry: Registry) -> list[str]:
    """The plugin provides at least one platform, described; its aliases resolve to its own platforms."""
    from kvpools_core.pipeline import platform_aliases, resolve_platform

    answers = [names for name, names in registry.call_collect("platforms") if name == plugin]
    names = {name: text for answer in answers for name, text in answer.items()}
    if not names:
        raise ConformanceFailure(f"plugin {plugin!r} provides no platform (its platforms hook answers nothing)")
    for name, text in names.items():
        if not str(text).strip():
            raise ConformanceFailure(f"plugin {plugin!r}: platform {name!r} has an empty description")
    try:
        aliases = platform_aliases(registry)
        for alias, target in aliases.items():
            if target in names and resolve_platform(Serving(platform=alias), registry).platform != target:
                raise ConformanceFailure(f"plugin {plugin!r}: alias {alias!r} does not resolve to {target!r}")
    except KvpoolsError as exc:
        raise ConformanceFailure(f"plugin {plugin!r}: its platform names are inconsistent: {exc}") from exc
    return sorted(names)


def check_accelerators(plugin: str, registry: Registry) -> list[GPU]:
    """The plugin's accelerators (``accelerators`` hook; none is fine) are well formed and usable.

    Each is a :class:`~kvpools_core.values.GPU` (the registry refuses anything
    else, naming the plugin) with a positive total and a source; of a platform a
    loaded plugin provides; named and aliased uniquely in the whole catalogue;
    found by :func:`~kvpools_core.pipeline.gpus.find_gpu` under every spelling; and SGLang's
    memory defaults resolve on it with its platform's traits (memory tiers,
    prefill graphs) into a fraction below 1.
    """
    from kvpools_core.models import load_model
    from kvpools_core.pipeline.gpus import accelerators, find_gpu, sglang_chunked_prefill_size, sglang_memory_defaults

    try:
        answers = [gpus for name, gpus in registry.call_collect("accelerators") if name == plugin]
        catalogue = accelerators(registry)
    except KvpoolsError as exc:
        raise ConformanceFailure(f"plugin {plugin!r}: its accelerators are refused: {exc}") from exc
    own = [gpu for answer in answers for gpu in answer]
    if REFERENCE_PRESET not in plugin_presets("mha", registry) and own:
        raise ConformanceFailure(f"the accelerator check plans {REFERENCE_PRESET!r}: install kvpools' mha plugin")
    for gpu in own:
        where = f"plugin {plugin!r}: accelerator {gpu.name!r}"
        if gpu not in catalogue:
            raise ConformanceFailure(f"{where} is missing from the catalogue")
        if not gpu.source.strip() or gpu.total_bytes <= 0:
            raise ConformanceFailure(f"{where} needs a positive total_bytes and a source, got {gpu!r}")
        for spelling in (gpu.name, *gpu.aliases):
            try:
                found = find_gpu(spelling, registry)
            except KvpoolsError as exc:
                raise ConformanceFailure(f"{where}: --gpu {spelling!r} is not found: {exc}") from exc
            if found != gpu:
                raise ConformanceFailure(f"{where}: --gpu {spelling!r} finds {found.name!r} instead")
        try:
            spec = load_model(REFERENCE_PRESET, registry)[0]
            chunk = sglang_chunked_prefill_size(gpu.total_mib, gpu.platform, registry=registry)
            serving = Serving(platform=gpu.platform, chunked_prefill_size=chunk)
            defaults = sglang_memory_defaults(gpu.total_mib, spec, serving, registry=registry)
        except KvpoolsError as exc:
            raise ConformanceFailure(f"{where}: SGLang's memory defaults fail on it: {exc}") from exc
        if not 0 < defaults.mem_fraction_static < 1:
            raise ConformanceFailure(
                f"{where}: SGLang's default mem_fraction_static on its {gpu.total_mib:g} MiB is "
                f"{defaults.mem_fraction_static} (reserved {defaults.reserved_mb:g} MiB): no KV cache would fit"
            )
    return own


def resolved_traits(platform: str, registry: Registry) -> PlatformTraits:
    """The traits a plan for ``platform`` is made under (the platform's plugin's, or the core's neutral ones)."""
    from kvpools_core.pipeline import resolve_platform, resolve_platform_traits

    serving = resolve_platform(Serving(platform=platform), registry)
    traits = resolve_platform_traits(serving, registry).traits
    assert traits is not None
    return traits


def check_traits_leave_a_page(plugin: str, platform: str, registry: Registry) -> PlatformTraits:
    """Some page size passes every rule for every model, and, for each kernel family named, its rules too.

    Rules that together allow no page would refuse every plan for the
    platform (or every model using those kernels) with a message no user can
    act on.
    """
    try:
        traits = resolved_traits(platform, registry)
    except KvpoolsError as exc:
        raise ConformanceFailure(f"plugin {plugin!r}: the traits of platform {platform!r} fail: {exc}") from exc
    every_model = [p for p in PAGE_CANDIDATES if not traits.page_size_problems(p)]
    if not every_model:
        raise ConformanceFailure(
            f"plugin {plugin!r}: the page size rules of platform {platform!r} allow no page size from 1 to "
            f"{PAGE_CANDIDATES[-1]}: {[rule.describe() for rule in traits.page_size_rules]}"
        )
    for rule in traits.page_size_rules:
        if not rule.reason.strip():
            raise ConformanceFailure(f"plugin {plugin!r}: a page size rule of {platform!r} gives no reason")
        for kernel in rule.kernels:
            if not any(not traits.page_size_problems(p, kernel=kernel) for p in every_model):
                raise ConformanceFailure(
                    f"plugin {plugin!r}: on platform {platform!r} no page size passes both the rules for every "
                    f"model and those for {kernel!r} kernels: every model using them would be refused"
                )
    if PlatformTraits.from_dict(json.loads(json.dumps(to_dict(traits)))) != traits:
        raise ConformanceFailure(f"plugin {plugin!r}: the traits of {platform!r} do not survive a JSON round trip")
    return traits


def check_quantization_traits(plugin: str, platform: str, registry: Registry) -> PlatformTraits:
    """The SGLang quantisation methods the platform refuses are methods kvpools models, and each is refused.

    A misspelt method in ``refused_quantization`` would never match a resolved
    method, so the refusal the platform declares would silently not happen:
    each key must be one of SGLang's ``--quantization`` names kvpools models,
    and a checkpoint of that method, served on the platform, must be refused
    with the platform's reason.
    """
    from kvpools_core.parts.weights.methods import resolve_quantization
    from kvpools_core.values import SGLANG_QUANTIZATION_METHODS

    traits = resolved_traits(platform, registry)
    for method, reason in traits.refused_quantization.items():
        if method not in SGLANG_QUANTIZATION_METHODS:
            raise ConformanceFailure(
                f"plugin {plugin!r}: platform {platform!r} refuses quantization {method!r}, which is none of the "
                f"SGLang methods kvpools models ({', '.join(SGLANG_QUANTIZATION_METHODS)}): the refusal never applies"
            )
        try:
            served = resolve_quantization("sglang", None, {"quant_method": method}, traits=traits)
        except KvpoolsError as exc:
            if reason.rstrip(".") not in str(exc):
                raise ConformanceFailure(
                    f"plugin {plugin!r}: a {method!r} checkpoint on {platform!r} is refused without the platform's "
                    f"reason: {exc}"
                ) from exc
            continue
        raise ConformanceFailure(
            f"plugin {plugin!r}: platform {platform!r} refuses quantization {method!r}, yet a {method!r} checkpoint "
            f"is served there as {served!r}"
        )
    return traits


def check_answers_only_for_its_platforms(plugin: str, registry: Registry) -> None:
    """Asked about another platform, its plan or its devices, the plugin declines every hook.

    A platform plugin that answers for every platform (traits, workspaces, a
    memory probe, a layout, an allocator, a validation message) silently takes
    over plans made for other hardware.
    """
    from kvpools_core.building import build
    from kvpools_core.pipeline import plan

    if REFERENCE_PRESET not in plugin_presets("mha", registry):
        raise ConformanceFailure(
            f"the decline check plans the preset {REFERENCE_PRESET!r}: install kvpools' mha plugin"
        )
    foreign = FakeDeviceMemory(FOREIGN_PLATFORM, free=PLANNING_BUDGET)
    under_test = registry.plugin_manager.get_plugin(plugin)  # installed or in-process, as the caller loaded it
    # the plugin registered last is asked first (pluggy's order within tryfirst): it cannot hide behind foreign
    own = isolated_registry(["mha"], objects={"foreign": foreign, plugin: under_test}, platforms=())
    serving = Serving(platform=FOREIGN_PLATFORM)
    device = f"{FOREIGN_PLATFORM}:0"

    def refuse(hook: str, answered: object) -> ConformanceFailure:
        return ConformanceFailure(
            f"plugin {plugin!r} answered {hook} for platform {FOREIGN_PLATFORM!r} (another platform's plan or "
            f"device) with {answered!r}; a platform plugin answers for its own platforms only and returns None"
        )

    traits, by = own.call("platform_traits", serving=serving)
    if plugin in by:
        raise refuse("platform_traits", traits)
    for name, answer in own.call_collect("detect_platform", device=device):
        if name == plugin:
            raise refuse("detect_platform", answer)
    reading, by = own.call("available_memory", device=device, serving=serving)
    if plugin in by:
        raise refuse("available_memory", reading)
    try:
        planned = plan(REFERENCE_PRESET, serving, memory=PLANNING_BUDGET, registry=own)
    except KvpoolsError as exc:
        raise ConformanceFailure(
            f"plugin {plugin!r} breaks a plan for another platform ({FOREIGN_PLATFORM!r}): {exc}"
        ) from exc
    for hook, by in planned.provenance.items():
        if plugin in by:
            raise refuse(hook, f"(provenance of the plan: {hook} by {', '.join(by)})")
    for name, answer in own.call_collect("workspaces", model=planned.model, serving=planned.serving):
        if name == plugin and answer:
            raise refuse("workspaces", answer)
    for name, answer in own.call_collect("validate", model=planned.model, serving=planned.serving):
        if name == plugin and answer:
            raise refuse("validate", answer)
    try:
        pools = build(planned, "meta", registry=own)
    except KvpoolsError as exc:
        raise ConformanceFailure(
            f"plugin {plugin!r} breaks building another platform's plan ({FOREIGN_PLATFORM!r}): {exc}"
        ) from exc
    for hook in (*_BUILD_HOOKS, "build_allocator"):
        if plugin in pools.provenance.get(hook, ()):
            raise refuse(hook, f"(provenance of the built pools: {hook} by {', '.join(pools.provenance[hook])})")


def architecture_presets(registry: Registry) -> dict[str, tuple[str, dict[str, Any]]]:
    """Preset name → (the architecture plugin that ships it, its config), for every loaded plugin."""
    owners = sorted({owner for owner, _ in registry.call_named("presets", "Preset").values()})
    return {name: (owner, config) for owner in owners for name, config in plugin_presets(owner, registry).items()}


def check_architectures_plan_and_build(
    plugin: str, platform: str, traits: PlatformTraits, registry: Registry, kv_dtypes: tuple[str, ...] = ("auto",)
) -> int:
    """Every installed architecture's presets plan on the platform and build exactly, or are refused by name.

    Each preset is tried at the page sizes the platform's every-model rules
    allow (the first that plans is kept) with each of ``kv_dtypes``; a plan
    must pass :func:`~kvpools_core.testing.conformance.check_plan` and
    :func:`~kvpools_core.testing.conformance.check_build` (the platform's
    layout and allocators allocate exactly the planned bytes) and its paged
    allocator hands out the traits' ``slot_index_dtype``.  Returns how many
    plans were built (zero proves nothing: the suite fails on it).
    """
    pages = [p for p in (1, 16, 64, 128, 256) if not traits.page_size_problems(p)]
    built = 0
    for preset, (owner, config) in sorted(architecture_presets(registry).items()):
        for kv_dtype in kv_dtypes:
            for page in pages:
                serving = Serving(platform=platform, page_size=page, kv_cache_dtype=kv_dtype)
                case = Case(owner, preset, config, serving, PLANNING_BUDGET)
                try:
                    planned = check_plan(case, registry)
                    if planned is None:
                        continue
                    pools = check_build(case, planned, registry)
                except ConformanceFailure as exc:
                    raise ConformanceFailure(f"platform {platform!r} (plugin {plugin!r}): {exc}") from exc
                dtype = getattr(pools.allocator, "index_dtype", None)
                if dtype is not None and str(dtype).removeprefix("torch.") != traits.slot_index_dtype:
                    raise ConformanceFailure(
                        f"platform {platform!r} (plugin {plugin!r}): preset {preset!r} built an allocator handing "
                        f"out {dtype} slot indices, but the platform's traits promise {traits.slot_index_dtype}\n"
                        f"  reproduce: {case.command_line()}"
                    )
                built += 1
                break
    return built


_NO_TORCH_SCRIPT = """
import importlib, json, sys
from kvpools_core.pipeline import plan
from kvpools_core.registry import Registry
from kvpools_core.values import Serving
def load(path):
    module, _, attr = path.partition(":")
    found = importlib.import_module(module)
    return getattr(found, attr) if attr else found
extra = {name: load(path) for name, path in json.loads(sys.argv[1]).items()}
plan(sys.argv[2], Serving(platform=sys.argv[3], page_size=int(sys.argv[4])), memory=int(sys.argv[5]),
     registry=Registry(extra_plugins=extra))
print(json.dumps(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))
"""


def check_plans_without_torch(
    plugin: str,
    platform: str,
    traits: PlatformTraits,
    *,
    modules: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Planning for the platform, in a fresh interpreter, imports no ``torch`` module.

    A planner (a capacity tool, an orchestrator) runs where the device
    library is absent or costs seconds to import: a platform plugin imports
    torch lazily, in the hooks that build.  ``modules`` registers in-process
    plugins by module path (the kit's own tests); installed plugins load
    through their entry points, as for users.  A path is ``module`` or
    ``module:attribute``.
    """
    page = next(p for p in PAGE_CANDIDATES if not traits.page_size_problems(p))
    command = [
        sys.executable,
        "-c",
        _NO_TORCH_SCRIPT,
        json.dumps(dict(modules or {})),
        REFERENCE_PRESET,
        platform,
        str(page),
        str(PLANNING_BUDGET),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    if done.returncode:
        raise ConformanceFailure(
            f"plugin {plugin!r}: planning {REFERENCE_PRESET} for platform {platform!r} in a fresh interpreter "
            f"failed:\n{done.stderr[-2000:]}"
        )
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    if imported:
        raise ConformanceFailure(
            f"plugin {plugin!r}: planning for platform {platform!r} imported torch ({', '.join(imported[:5])}); "
            f"import torch lazily, inside the hooks that build or measure (see kvpools-rocm's layout_hooks.py)"
        )
