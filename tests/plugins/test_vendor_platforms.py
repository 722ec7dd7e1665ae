"""The vendor platform distributions (kvpools-rocm, kvpools-ascend) and platform selection.

No NPU or AMD GPU exists here: the memory probes run against a fake ``torch_npu``
module and fake HIP attributes of torch that the tests install.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import importlib_metadata
import pytest
import torch

from kvpools_core import Registry, Serving, hookimpl, plan
from kvpools_core.errors import ConfigError, PluginResultError
from kvpools_core.pipeline import measure_free_bytes, select_platform

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).parents[2]
VENDORS = {"rocm": ("kvpools-rocm", "kvpools_rocm"), "ascend": ("kvpools-ascend", "kvpools_ascend")}
GiB = 1 << 30


@pytest.fixture
def fake_torch_npu(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """A stand-in ``torch_npu`` with torch_npu's memory query (``torch_npu.npu.mem_get_info``), 2 NPUs."""
    npu = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 2,
        current_device=lambda: 1,
        mem_get_info=lambda index: (40 * GiB + index, 64 * GiB),
    )
    module = types.ModuleType("torch_npu")
    module.npu = npu  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    return npu


@pytest.fixture
def no_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # ``import torch_npu`` raises ImportError


@pytest.fixture
def hip_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch as a HIP (ROCm) build with 2 visible devices: HIP devices are ``cuda``/``cuda:N``."""
    monkeypatch.setattr(torch.version, "hip", "6.2.41133", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda index: (20 * GiB + index, 192 * GiB))


@pytest.fixture
def plain_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as it is: no torch_npu, a torch that is not a HIP build."""
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)


# -- the distributions ----------------------------------------------------------


@pytest.mark.parametrize("name", VENDORS)
def test_each_vendor_is_its_own_installed_distribution(name: str, registry: Registry) -> None:
    dist, package = VENDORS[name]
    project = tomllib.loads((ROOT / "plugins" / dist / "pyproject.toml").read_text())["project"]
    version = importlib.import_module(package).__version__  # its one source (tests/test_packaging.py)
    assert (project["name"], project["dynamic"], project["dependencies"]) == (dist, ["version"], ["kvpools>=0.2,<0.3"])
    assert project["entry-points"]["kvpools"] == {name: package}
    info = registry.plugin(name)
    assert (info.distribution, info.version, info.status) == (dist, version, "loaded")
    assert {"platforms", "platform_aliases", "detect_platform", "available_memory"} <= set(info.hooks)
    assert importlib_metadata.packages_distributions()[package] == [dist]
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert package not in root["tool"]["setuptools"]["packages"]  # not a package of kvpools itself
    assert name not in root["project"]["entry-points"]["kvpools"]


def test_the_core_and_the_builtins_import_neither_vendor() -> None:
    for folder in (ROOT / "kvpools_core", *(p.parent for p in (ROOT / "plugins").glob("*/__init__.py"))):
        for path in folder.rglob("*.py"):
            text = path.read_text()
            for _, package in VENDORS.values():
                assert package not in text, f"{path} names {package}"


def test_kvpools_plugins_lists_them(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = subprocess.run([kvpools_exe, "plugins", "--json"], capture_output=True, text=True, env=cli_env, timeout=120)
    assert out.returncode == 0, out.stderr
    by_name = {p["name"]: p for p in json.loads(out.stdout)}
    for name, (dist, package) in VENDORS.items():
        assert (by_name[name]["distribution"], by_name[name]["version"], by_name[name]["status"]) == (
            dist,
            importlib.import_module(package).__version__,
            "loaded",
        )


# -- memory probes ----------------------------------------------------------------


@pytest.mark.usefixtures("hip_torch")
def test_rocm_measures_hip_devices(registry: Registry) -> None:
    assert measure_free_bytes("cuda:1", Serving(platform="rocm"), registry) == (20 * GiB + 1, ("rocm",))
    assert measure_free_bytes("cuda", Serving(platform="rocm"), registry) == (20 * GiB, ("rocm",))
    from kvpools_rocm import available_memory

    for other in ("cpu", "npu:0", "meta"):
        assert available_memory(other, Serving()) is None
    with pytest.raises(ConfigError, match=r"cuda:2: only 2 HIP device\(s\)"):
        available_memory("cuda:2", Serving())


@pytest.mark.usefixtures("plain_host")
def test_rocm_declines_cuda_devices_on_a_cuda_build() -> None:
    from kvpools_rocm import available_memory, detect_platform

    assert available_memory("cuda:0", Serving()) is None
    assert detect_platform("cuda:0") is None
    assert detect_platform(None) is None


def test_ascend_measures_npus_through_torch_npu(fake_torch_npu: Any, registry: Registry) -> None:
    assert measure_free_bytes("npu:0", Serving(platform="ascend"), registry) == (40 * GiB, ("ascend",))
    assert measure_free_bytes("npu", Serving(platform="ascend"), registry) == (40 * GiB + 1, ("ascend",))
    from kvpools_ascend import available_memory

    for other in ("cpu", "cuda:0", "meta"):
        assert available_memory(other, Serving()) is None
    assert available_memory("npu:1", Serving()) == {"free_bytes": 40 * GiB + 1, "total_bytes": 64 * GiB}
    with pytest.raises(ConfigError, match=r"npu:2: only 2 NPU"):
        available_memory("npu:2", Serving())


@pytest.mark.usefixtures("no_torch_npu")
def test_ascend_without_torch_npu_says_so(registry: Registry) -> None:
    with pytest.raises(ConfigError, match=r"npu:0: torch_npu is not importable.*free_memory"):
        measure_free_bytes("npu:0", Serving(platform="ascend"), registry)


def test_a_profiled_budget_on_an_npu(fake_torch_npu: Any) -> None:
    result = plan(
        "llama-3.1-8b", device="npu:0", serving=Serving(platform="npu", page_size=128), weights_memory="16GiB"
    )
    assert result.serving.platform == "ascend"
    assert result.provenance["available_memory"] == ("ascend",)


# -- platform selection -------------------------------------------------------------


@pytest.mark.usefixtures("plain_host")
def test_selection_on_this_host(registry: Registry) -> None:
    assert select_platform(None, None, registry) == "cuda"  # nothing detected: the default, as before
    assert select_platform(None, "meta", registry) == "cuda"
    assert select_platform(None, "cpu", registry) == "cpu"
    assert select_platform(None, "cuda:1", registry) == "cuda"
    assert select_platform(None, "npu", registry) == "ascend"  # the device type only ascend claims
    assert select_platform(None, "npu:3", registry) == "ascend"
    assert select_platform("npu", None, registry) == "ascend"  # aliases
    assert select_platform("hip", None, registry) == "rocm"
    assert select_platform("ascend", "cpu", registry) == "ascend"  # a requested platform wins
    assert select_platform("cpu", "npu:0", registry) == "cpu"


@pytest.mark.usefixtures("fake_torch_npu")
def test_detected_runtime_selects_its_platform(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert select_platform(None, None, registry) == "ascend"
    assert select_platform(None, "cpu", registry) == "cpu"  # an explicit device type is not claimed


@pytest.mark.usefixtures("hip_torch", "no_torch_npu")
def test_hip_build_selects_rocm(registry: Registry) -> None:
    assert select_platform(None, None, registry) == "rocm"
    assert select_platform(None, "cuda:0", registry) == "rocm"
    assert select_platform(None, "cpu", registry) == "cpu"


@pytest.mark.usefixtures("hip_torch", "fake_torch_npu")
def test_two_detected_platforms_is_an_error_naming_both(registry: Registry) -> None:
    with pytest.raises(ConfigError, match=r"Two platforms claim this host: 'rocm' .*kvpools-rocm.* and 'ascend'") as e:
        select_platform(None, None, registry)
    assert "Choose one with platform (ascend, rocm)" in str(e.value)  # --platform on the command line
    assert select_platform("ascend", None, registry) == "ascend"


def test_an_alias_is_resolved_in_the_api(registry: Registry) -> None:
    result = plan("llama-3.1-8b", Serving(platform="npu", page_size=128), memory="8GiB", registry=registry)
    assert result.serving.platform == "ascend"
    assert plan("llama-3.1-8b", Serving(platform="hip"), memory="8GiB", registry=registry).serving.platform == "rocm"


def test_mha_plans_elsewhere_are_those_of_cuda(registry: Registry) -> None:
    """An MHA model stores the same rows everywhere (the NPU's page-major tensor holds the same ``S + P`` rows):
    an Ascend or ROCm plan of llama at page 128 equals the CUDA one."""
    cuda = plan("llama-3.1-8b", Serving(page_size=128), memory="8GiB", registry=registry)
    for platform in ("ascend", "rocm"):
        other = plan("llama-3.1-8b", Serving(platform=platform, page_size=128), memory="8GiB", registry=registry)
        assert other.max_total_num_tokens == cuda.max_total_num_tokens


def _without(monkeypatch: pytest.MonkeyPatch, dist: str) -> None:
    """Pretend ``dist`` is not installed: its entry points are not discovered."""
    original = Registry._entry_points

    def entry_points() -> dict[str, list[Any]]:
        groups = original()
        return {
            name: kept
            for name, group in groups.items()
            if (kept := [ep for ep in group if ep.dist is None or ep.dist.metadata["Name"] != dist])
        }

    monkeypatch.setattr(Registry, "_entry_points", staticmethod(entry_points))


@pytest.mark.parametrize("requested", ["ascend", "npu"])
def test_a_platform_not_installed_names_the_distribution(monkeypatch: pytest.MonkeyPatch, requested: str) -> None:
    _without(monkeypatch, "kvpools-ascend")
    with pytest.raises(ConfigError) as error:
        plan("llama-3.1-8b", Serving(platform=requested), memory="8GiB", registry=Registry())
    message = str(error.value)
    assert f"Unknown platform {requested!r}" in message
    assert "installed platform plugins provide cpu, cuda, rocm" in message
    assert "pip install kvpools-ascend" in message


def test_a_disabled_platform_says_it_is_disabled() -> None:
    with pytest.raises(ConfigError) as error:
        plan("llama-3.1-8b", Serving(platform="ascend"), memory="8GiB", registry=Registry(disabled=("ascend",)))
    message = str(error.value)
    assert "kvpools-ascend is installed but its plugin is not loaded" in message
    version = importlib.import_module("kvpools_ascend").__version__
    assert f'Disabled by Registry(disabled=...): "ascend" (kvpools-ascend {version})' in message
    assert "pip install" not in message


def test_the_cli_selects_and_refuses(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [kvpools_exe, "plan", "llama-3.1-8b", "--memory", "8GiB", *args],
            capture_output=True,
            text=True,
            env={**cli_env, **env},
            timeout=120,
        )

    out = run("--device", "npu:0", "--page-size", "128", "--json")
    assert out.returncode == 0, out.stderr
    serving = json.loads(out.stdout)["plan"]["serving"]
    assert serving["platform"] == "ascend"
    assert serving["platform_traits"]["slot_index_dtype"] == "int32"  # the plan records the rules it was made under
    out = run("--device", "npu:0", "--json")  # left unset, the page is SGLang's NPU default
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["plan"]["serving"]["page_size"] == 128
    out = run("--device", "npu:0", "--page-size", "1")  # an explicit page the Ascend backend refuses
    assert out.returncode == 1
    assert "Every model needs --page-size 128 on ascend" in out.stderr
    assert "At this moment Ascend attention backend only supports a page_size of 128" in out.stderr
    assert "Traceback" not in out.stderr
    out = run("--platform", "ascend", KVPOOLS_DISABLED_PLUGINS="ascend")
    assert out.returncode == 1
    assert "Unknown platform 'ascend'" in out.stderr and "Disabled by KVPOOLS_DISABLED_PLUGINS" in out.stderr


# -- the hooks' contracts ---------------------------------------------------------------


class _Vendor:
    def __init__(self, provides: str, aliases: dict[str, str] | None = None, claim: str | None = None) -> None:
        self.provides, self.aliases, self.claim = provides, aliases, claim

    @hookimpl
    def platforms(self) -> dict[str, str]:
        return {self.provides: "a test platform"}

    @hookimpl
    def platform_aliases(self) -> dict[str, str] | None:
        return self.aliases

    @hookimpl
    def detect_platform(self, device: str | None) -> str | None:
        return self.claim


@pytest.fixture
def only_builtins(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setitem(sys.modules, "torch_npu", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    yield


@pytest.mark.usefixtures("only_builtins")
@pytest.mark.parametrize(
    ("vendor", "match"),
    [
        (_Vendor("toy", {"toy2": "cuda"}), r"alias 'toy2' for 'cuda', a platform it does not provide"),
        (_Vendor("toy", {"cpu": "toy"}), r"alias 'cpu', which is already the name of a platform"),
        (_Vendor("toy", claim="cuda"), r"claimed the platform 'cuda' in detect_platform, which it does not provide"),
    ],
)
def test_aliases_and_claims_name_the_plugins_platforms(vendor: _Vendor, match: str) -> None:
    registry = Registry(extra_plugins={"vendor": vendor})
    with pytest.raises(PluginResultError, match=match):
        select_platform(None, "toy2", registry)


@pytest.mark.usefixtures("only_builtins")
def test_a_third_party_claim_and_alias() -> None:
    registry = Registry(extra_plugins={"vendor": _Vendor("toy", {"tpu": "toy"}, claim="toy")})
    assert select_platform(None, None, registry) == "toy"
    assert select_platform("tpu", None, registry) == "toy"
    with pytest.raises(PluginResultError, match=r"detect_platform.*a platform name"):
        select_platform(None, None, Registry(extra_plugins={"vendor": _Vendor("toy", claim="")}))
