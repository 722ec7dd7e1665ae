"""The tutorial's XPU platform plugin, tested as its author would: installed, on a machine without an Intel GPU.

The memory probe runs against ``torch.xpu`` functions the tests replace; planning and
building use the kit's fixtures (``kvpools_registry``, ``kvpools_fake_device``) so each
test sees only the plugins it names.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from importlib import metadata
from typing import Any

import kvpools_xpu
import pytest
import torch
from click.testing import CliRunner

from kvpools_core import ConfigError, Registry, Serving, plan
from kvpools_core.cli import main
from kvpools_core.testing.registries import plan_and_build

GiB = 1 << 30


# --8<-- [start:fixtures]
@pytest.fixture
def xpu_registry(kvpools_registry: Callable[..., Registry]) -> Registry:
    """The ``mha`` architecture (llama's presets) and the ``xpu`` platform, nothing else installed here."""
    return kvpools_registry(["mha"], platforms=("xpu",))


@pytest.fixture
def two_xpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.xpu as it reads on a host with two Intel GPUs: 20 GiB (+ the index) free of 24 GiB each."""
    monkeypatch.setattr(torch.xpu, "is_available", lambda: True)
    monkeypatch.setattr(torch.xpu, "device_count", lambda: 2)
    monkeypatch.setattr(torch.xpu, "current_device", lambda: 0)
    monkeypatch.setattr(torch.xpu, "mem_get_info", lambda index: (20 * GiB + index, 24 * GiB), raising=False)


# --8<-- [end:fixtures]


@pytest.fixture
def no_xpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's CPU build of torch: torch.xpu exists, no device is visible (forced, to hold on any host)."""
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)


def test_installed_as_its_own_distribution() -> None:
    info = Registry().plugin("xpu")
    assert (info.distribution, info.status) == ("kvpools-tutorial-xpu", "loaded")
    assert {"platforms", "platform_aliases", "detect_platform", "platform_traits", "available_memory"} <= set(
        info.hooks
    )


# -- planning ---------------------------------------------------------------------------


def test_plans_for_xpu_with_an_explicit_budget(
    xpu_registry: Registry, kvpools_registry: Callable[..., Registry]
) -> None:
    planned = plan("llama-3.1-8b", Serving(platform="xpu"), memory="60GiB", registry=xpu_registry)
    assert planned.serving.platform == "xpu"
    assert planned.serving.traits == kvpools_xpu.TRAITS
    assert planned.provenance["platform_traits"] == ("xpu",)
    assert plan("llama-3.1-8b", Serving(platform="intel"), memory="60GiB", registry=xpu_registry).serving.platform == (
        "xpu"
    )
    # Neutral traits: the same tokens as on cuda, whose only page rule is about DSA models.
    on_cuda = plan("llama-3.1-8b", memory="60GiB", registry=kvpools_registry(["mha"], platforms=("cuda",)))
    assert planned.max_total_num_tokens == on_cuda.max_total_num_tokens > 0


def test_the_cli_plans_for_xpu() -> None:
    result = CliRunner().invoke(main, ["plan", "llama-3.1-8b", "--memory", "60GiB", "--platform", "xpu", "--json"])
    assert result.exit_code == 0, result.output
    planned = json.loads(result.stdout)
    assert planned["plan"]["serving"]["platform"] == "xpu"
    assert planned["provenance"]["platform_traits"] == ["xpu"]


# --8<-- [start:no-torch]
def test_planning_does_not_import_torch() -> None:
    script = (
        "import sys; from kvpools_core import Serving, plan; "
        "plan('llama-3.1-8b', Serving(platform='xpu'), memory='8GiB'); "
        "assert 'torch' not in sys.modules, 'planning for xpu imported torch'"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


# --8<-- [end:no-torch]

# -- detection ----------------------------------------------------------------------------


def test_an_xpu_device_names_the_platform() -> None:
    assert kvpools_xpu.detect_platform("xpu:1") == "xpu"
    assert kvpools_xpu.detect_platform("xpu") == "xpu"
    result = CliRunner().invoke(main, ["plan", "llama-3.1-8b", "--memory", "8GiB", "--device", "xpu:1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["plan"]["serving"]["platform"] == "xpu"


def test_a_host_with_an_xpu_build_of_torch_is_claimed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "xpu", None, raising=False)
    assert kvpools_xpu.detect_platform(None) is None
    monkeypatch.setattr(torch.version, "xpu", "20250101", raising=False)
    assert kvpools_xpu.detect_platform(None) == "xpu"
    # Before anything imported torch (planning never does), the wheel's version says it.
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr(metadata, "version", lambda name: "2.9.0+xpu")
    assert kvpools_xpu.detect_platform(None) == "xpu"
    monkeypatch.setattr(metadata, "version", lambda name: "2.13.0+cpu")
    assert kvpools_xpu.detect_platform(None) is None


# -- the memory probe ---------------------------------------------------------------------


# --8<-- [start:probe-test]
@pytest.mark.usefixtures("two_xpus")
def test_the_probe_measures_the_device_it_is_given(xpu_registry: Registry) -> None:
    assert kvpools_xpu.available_memory("xpu:1", Serving()) == {"free_bytes": 20 * GiB + 1, "total_bytes": 24 * GiB}
    assert kvpools_xpu.available_memory("xpu", Serving()) == {"free_bytes": 20 * GiB, "total_bytes": 24 * GiB}
    measured = plan(
        "llama-3.1-8b", Serving(platform="xpu"), device="xpu:1", weights_memory="16GiB", registry=xpu_registry
    )
    stated = plan(
        "llama-3.1-8b",
        Serving(platform="xpu"),
        free_memory=20 * GiB + 1,
        weights_memory="16GiB",
        registry=xpu_registry,
    )
    assert measured.provenance["available_memory"] == ("xpu",)
    assert (measured.budget.free_bytes, measured.budget.source) == (20 * GiB + 1, "measured by xpu")
    assert measured.budget.budget_bytes == stated.budget.budget_bytes > 0
    with pytest.raises(ConfigError, match=r"device xpu:2: only 2 XPU device\(s\) are visible"):
        kvpools_xpu.available_memory("xpu:2", Serving())
    with pytest.raises(ConfigError, match=r"device xpu:one: write xpu or xpu:N"):
        kvpools_xpu.available_memory("xpu:one", Serving())


# --8<-- [end:probe-test]


@pytest.mark.usefixtures("no_xpu")
def test_no_visible_xpu_names_the_device_option(xpu_registry: Registry) -> None:
    with pytest.raises(ConfigError, match=r"^device xpu:0: no Intel GPU is visible to torch .*memory or free_memory"):
        plan("llama-3.1-8b", Serving(platform="xpu"), device="xpu:0", registry=xpu_registry)
    result = CliRunner().invoke(main, ["plan", "llama-3.1-8b", "--device", "xpu:0"])
    assert result.exit_code != 0
    assert "--device xpu:0: no Intel GPU is visible" in " ".join(result.output.split())


@pytest.mark.usefixtures("two_xpus")
def test_a_torch_without_mem_get_info_is_refused_not_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.xpu, "mem_get_info")
    with pytest.raises(ConfigError, match=r"has no torch.xpu.mem_get_info"):
        kvpools_xpu.available_memory("xpu:0", Serving())


# -- declining what is not its own --------------------------------------------------------


# --8<-- [start:declines]
@pytest.mark.usefixtures("two_xpus")
def test_declines_other_devices_and_platforms(
    kvpools_registry: Callable[..., Registry], kvpools_fake_device: Callable[..., Any]
) -> None:
    for device in ("cuda:0", "cuda", "cpu", "meta", "npu:0"):
        assert kvpools_xpu.available_memory(device, Serving()) is None
        assert kvpools_xpu.detect_platform(device) is None
    for platform in ("cuda", "cpu", "rocm"):
        assert kvpools_xpu.platform_traits(Serving(platform=platform)) is None
    # Installed beside another platform, the xpu plugin leaves it its traits and its devices.
    registry = kvpools_registry(["mha"], platforms=("xpu",), objects={"toy": kvpools_fake_device("toy", free=40 * GiB)})
    planned = plan("llama-3.1-8b", Serving(platform="toy"), device="toy:0", registry=registry)
    assert planned.provenance["available_memory"] == ("toy",)
    assert "platform_traits" not in planned.provenance  # the core's neutral traits, not xpu's
    assert planned.serving.traits.platform == "toy"


# --8<-- [end:declines]

# -- building -----------------------------------------------------------------------------


def test_a_build_on_meta_allocates_exactly_the_plan(xpu_registry: Registry) -> None:
    planned, pools = plan_and_build(
        "llama-3.1-8b", Serving(platform="xpu", page_size=64), memory="8GiB", registry=xpu_registry
    )
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in planned.pools}
    assert sum(pools.allocated_by_pool().values()) == sum(pool.bytes for pool in planned.pools) > 0
