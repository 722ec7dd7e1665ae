"""Registries, plans and devices for plugin tests, without the plugins the test did not name."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kvpools_core.hookspecs import hookimpl
from kvpools_core.registry import Registry
from kvpools_core.values import Plan, Serving

__all__ = ["FakeDeviceMemory", "isolated_registry", "plan_and_build"]


def isolated_registry(
    names: Iterable[str] = (), *, objects: Mapping[str, object] | None = None, platforms: Iterable[str] = ("cpu",)
) -> Registry:
    """A registry holding only the installed plugins ``names`` (and the platforms ``platforms``), plus ``objects``.

    No other entry point loads, whatever is installed or set in the
    environment: a test sees exactly the plugins it names.  The core's
    defaults are always there.
    """
    allowed = list(dict.fromkeys([*names, *platforms]))
    return Registry(autoload=True, plugins=allowed, disabled=(), extra_plugins=dict(objects or {}))


def plan_and_build(
    model: Any, serving: Serving | None = None, *, memory: int | str, registry: Registry, device: str = "meta"
) -> tuple[Plan, Any]:
    """Plan ``model`` within ``memory`` and build it on ``device`` (``meta``: exact bytes, nothing allocated)."""
    from kvpools_core.building import build
    from kvpools_core.pipeline import plan

    planned = plan(model, serving or Serving(), memory=memory, registry=registry)
    return planned, build(planned, device, registry=registry)


class FakeDeviceMemory:
    """A platform plugin object whose devices report the free and total bytes a test chooses.

    Register it with ``isolated_registry(objects={"fake": FakeDeviceMemory("toy", free=...)})``;
    devices ``toy`` and ``toy:N`` are measured, every other device is declined.
    """

    def __init__(self, platform: str = "fake", *, free: int, total: int | None = None) -> None:
        self.platform, self.free, self.total = platform, free, total if total is not None else free

    @hookimpl
    def platforms(self) -> dict[str, str]:
        return {self.platform: "a fake device for tests (kvpools_core.testing)"}

    @hookimpl(tryfirst=True)
    def available_memory(self, device: str, serving: Serving) -> dict[str, int] | None:
        if device.split(":", 1)[0] != self.platform:
            return None
        return {"free_bytes": self.free, "total_bytes": self.total}
