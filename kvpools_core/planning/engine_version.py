"""Which engine version a plan reproduces (``--engine-version ENGINE==X.Y``), and vLLM's plan from its options.

The two applications, the ``kvpools`` command line (:mod:`kvpools_core.cli`) and the HTTP service
(:mod:`kvpools_core.serve`), read ``--engine-version`` and plan ``--accounting vllm`` the same way: both call these
functions, so neither imports the other's helpers and their answers cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from kvpools_core.engines.vllm.runtime_memory import PROFILE_ALIASES, PROFILE_VERSIONS
from kvpools_core.errors import ConfigError, short_repr
from kvpools_core.values import Serving

__all__ = ["RUNTIME_PROFILES", "apply_engine_version", "plan_vllm"]

RUNTIME_PROFILES = tuple(sorted({*PROFILE_VERSIONS, *PROFILE_ALIASES}))
"""The vLLM versions ``--runtime-profile`` names: those with a profile file and those another file covers."""


def apply_engine_version(options: MutableMapping[str, Any]) -> str | None:
    """Take ``engine_version`` (``ENGINE==X.Y``) out of ``options`` and apply it there; the vLLM version it selects.

    It sets ``options["accounting"]`` to the engine and, for vLLM, ``options["runtime_profile"]`` to the version,
    whose calibrated profile it returns the version of (``None``: no ``engine_version``, or SGLang's).  A
    :class:`~kvpools_core.errors.ConfigError` refuses a malformed value, a version without a profile, an engine
    without per-version profiles, and an ``accounting`` or ``runtime_profile`` already in ``options`` that names
    something else.
    """
    given = options.pop("engine_version", None)
    if given is None:
        return None
    engine, sep, version = str(given).strip().lower().partition("==")
    engine, version = engine.strip(), version.strip()
    if not sep or not engine or not version:
        raise ConfigError(
            f"--engine-version must look like ENGINE==X.Y (vllm==0.19, vllm==0.33, sglang==0.5.23), got "
            f"{short_repr(given)}."
        )
    accounting = (options.get("accounting") or "").strip().lower()
    if accounting and accounting != engine:
        raise ConfigError(
            f"--engine-version {given} plans for {engine} but --accounting is {accounting}: drop one of them, or "
            f"name the same engine in both."
        )
    profile_version = None
    if engine == "vllm":
        from kvpools_core.engines.vllm.runtime_memory import load_profile

        profile = load_profile(version)  # a version without a profile: the ConfigError naming the profiles
        asked = options.get("runtime_profile")
        if asked is not None and load_profile(asked).version != profile.version:
            raise ConfigError(
                f"--engine-version {given} takes vLLM {profile.version}'s runtime profile but --runtime-profile is "
                f"{asked}: drop --runtime-profile (--engine-version sets it) or name the same version."
            )
        options["runtime_profile"] = version
        profile_version = version
    elif engine == "sglang":
        from kvpools_core.pipeline.sglang_profile import load_sglang_profile

        load_sglang_profile(version)  # a version without a profile: the ConfigError naming the profiles
    else:
        raise ConfigError(
            f"--engine-version {given}: kvpools has per-version runtime-memory profiles for vllm "
            f"({', '.join(RUNTIME_PROFILES)}) and sglang (0.5.23) only; kvpools does not model {engine}'s "
            f"per-version runtime memory yet. Use --accounting {engine} without --engine-version."
        )
    options["accounting"] = engine
    return profile_version


def plan_vllm(
    model: str,
    serving: Serving,
    memory: int | str | None,
    gpu: str | None,
    gpu_memory: int | str | None,
    weights_memory: int | str | None,
    args: Mapping[str, Any],
) -> Any:
    """vLLM's plan of ``model`` (the ``vllm`` engine's ``plan``, a ``VllmPlanResult``) with vLLM's own options.

    ``args`` are the engine's keyword options (``gpu_memory_utilization``, ``runtime_profile``, ``registry``, ...).
    ``engine_version_profile`` among them is the version :func:`apply_engine_version` returned: with a ``memory``
    budget (vLLM's ``--kv-cache-memory-bytes``) the KV budget is given, so that version's runtime profile is
    dropped; the release's own KV layout still applies (``engines/vllm/layouts.py``: vLLM before 0.33 has no Gated
    DeltaNet checkpoint grid).
    """
    from kvpools_core.engines import engine_for

    options = dict(args)
    version = options.pop("engine_version_profile", None)
    if version is not None and memory is not None:
        options["runtime_profile"] = None
        options["layout_version"] = version
    return engine_for("vllm", options.get("registry")).plan(
        model, serving, memory=memory, gpu=gpu, gpu_memory=gpu_memory, weights_memory=weights_memory, **options
    )
