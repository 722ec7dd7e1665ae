"""``PlatformTraits.pool_layouts`` (the contract a platform uses to select an architecture's pool layout).

A layout name the owning architecture plugin does not know is refused by it, naming the platform; a non-string
value is refused by the value itself; the traits keep the mapping through a plan's JSON.
"""

from __future__ import annotations

import types

import pytest

from kvpools_core import Serving, hookimpl, plan
from kvpools_core.errors import InvalidValueError, UnsupportedCombinationError
from kvpools_core.registry import Registry
from kvpools_core.values import PlatformTraits


def test_values_are_layout_names() -> None:
    assert PlatformTraits(platform="x", pool_layouts={"dsv4": "unified_bf16"}).pool_layouts == {"dsv4": "unified_bf16"}
    with pytest.raises(InvalidValueError, match="pool_layouts maps keys to layout names"):
        PlatformTraits(platform="x", pool_layouts={"dsv4": 3})
    assert PlatformTraits(platform="x").pool_layouts == {}


def test_an_unknown_layout_is_refused_by_the_architecture() -> None:
    """A third-party platform selecting a DeepSeek-V4 layout the dsv4 plugin does not plan: refused, not planned
    as the separate pools."""
    module = types.ModuleType("oddplatform")

    @hookimpl
    def platforms() -> dict[str, str]:
        return {"odd": "a platform with its own DeepSeek-V4 pool"}

    @hookimpl(tryfirst=True)
    def platform_traits(serving: Serving) -> PlatformTraits | None:
        return PlatformTraits(platform="odd", pool_layouts={"dsv4": "paged_nd"}) if serving.platform == "odd" else None

    module.platforms = platforms  # type: ignore[attr-defined]
    module.platform_traits = platform_traits  # type: ignore[attr-defined]
    registry = Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"oddplatform": module})
    serving = Serving(platform="odd", tp_size=8, page_size=256)
    with pytest.raises(UnsupportedCombinationError, match=r"pool layout 'paged_nd' \(PlatformTraits.pool_layouts\)"):
        plan("deepseek-v4-flash", serving, memory="60GiB", registry=registry)


def _odd_platform(planned: bool) -> Registry:
    module = types.ModuleType("oddplatform")

    @hookimpl
    def platforms() -> dict[str, str]:
        return {"odd": "a platform with its own DeepSeek-V4 pool"}

    @hookimpl(tryfirst=True)
    def platform_traits(serving: Serving) -> PlatformTraits | None:
        if serving.platform != "odd":
            return None
        own = frozenset({"dsv4"}) if planned else frozenset()
        return PlatformTraits(platform="odd", pool_layouts={"dsv4": "paged_nd"}, platform_planned_layouts=own)

    module.platforms = platforms  # type: ignore[attr-defined]
    module.platform_traits = platform_traits  # type: ignore[attr-defined]
    return Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"oddplatform": module})


def test_a_platform_planned_layout_must_be_sized_by_the_platform() -> None:
    """``platform_planned_layouts``: the dsv4 plugin no longer refuses the name, but it does not size the layout
    as its own pools either; a platform that declares it and answers no ``size_pools`` is refused, by name."""
    serving = Serving(platform="odd", tp_size=8, page_size=256)
    with pytest.raises(UnsupportedCombinationError, match=r"plans its own DeepSeek-V4 pools .* no plugin of that"):
        plan("deepseek-v4-flash", serving, memory="60GiB", registry=_odd_platform(planned=True))


def test_planned_layouts_name_selected_layouts() -> None:
    traits = PlatformTraits(platform="x", pool_layouts={"dsv4": "npu"}, platform_planned_layouts=["dsv4"])
    assert traits.platform_planned_layouts == frozenset({"dsv4"})
    with pytest.raises(InvalidValueError, match=r"platform_planned_layouts names \['mla'\], which pool_layouts"):
        PlatformTraits(platform="x", pool_layouts={"dsv4": "npu"}, platform_planned_layouts=["mla"])


def test_planned_layouts_survive_a_plans_json() -> None:
    """Ascend's traits (``{"dsv4"}``) through a plan's JSON."""
    from kvpools_core import Plan

    result = plan("deepseek-v4-flash", Serving(platform="ascend", tp_size=4), memory="60GiB")
    assert result.serving.traits.platform_planned_layouts == frozenset({"dsv4"})
    assert Plan.from_json(result.to_json()).serving.traits.platform_planned_layouts == frozenset({"dsv4"})
