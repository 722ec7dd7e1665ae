"""The ``accelerators`` hook: platform plugins contribute the GPU catalogue, their traits the memory defaults.

The core lists no device and names no platform: the NVIDIA GPUs come from the ``cuda`` plugin, the AMD ones
from ``kvpools-rocm``, the Ascend 910B from ``kvpools-ascend``, and any third-party plugin may add its own,
which ``kvpools plan --gpu NAME`` then plans on with its platform's memory tiers
(:attr:`PlatformTraits.memory_tiers`) and prefill-graph default (:attr:`PlatformTraits.breakable_prefill_graphs`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import Any

import pytest

import kvpools_core
from kvpools_core import hookimpl, pipeline
from kvpools_core.errors import ConfigError, InvalidValueError, PluginConflictError, PluginResultError
from kvpools_core.pipeline.gpus import accelerators, find_gpu, platform_traits_of, sglang_chunked_prefill_size
from kvpools_core.registry import Registry, get_registry
from kvpools_core.testing.registries import isolated_registry
from kvpools_core.values import GPU, MemoryTier, PlatformTraits, to_dict

MiB = 1 << 20
GiB = 1 << 30


def offering(*gpus: GPU, platforms: dict[str, str] | None = None) -> types.ModuleType:
    """An in-process plugin contributing ``gpus`` (and providing ``platforms``, if given)."""
    module = types.ModuleType("offering")

    @hookimpl
    def accelerators() -> list[GPU]:
        return list(gpus)

    module.accelerators = accelerators  # type: ignore[attr-defined]
    if platforms is not None:

        @hookimpl
        def platforms_hook() -> dict[str, str]:
            return dict(platforms)

        platforms_hook.__name__ = "platforms"
        module.platforms = platforms_hook  # type: ignore[attr-defined]
    return module


def rtx(name: str = "rtx-a6000", *aliases: str, platform: str = "cuda") -> GPU:
    """A card the bundled catalogue lacks (the RTX A6000: no cited nvidia-smi capture, docs/gpus.md)."""
    return GPU(name, "NVIDIA RTX A6000", 48 * GiB, platform=platform, aliases=aliases, source="a test")


def test_each_platform_plugin_contributes_its_own_devices() -> None:
    by_plugin = {plugin: [gpu.name for gpu in gpus] for plugin, gpus in get_registry().call_collect("accelerators")}
    assert by_plugin["cuda"][:2] == ["h100", "h100-pcie"] and len(by_plugin["cuda"]) == 20
    assert by_plugin["rocm"] == ["mi300x", "mi325x"]
    assert by_plugin["ascend"] == ["ascend-910b"]
    assert "core" not in by_plugin and "cpu" not in by_plugin
    # the catalogue lists them as the plugins registered: built-ins first
    assert [gpu.name for gpu in accelerators()][:20] == by_plugin["cuda"]
    assert accelerators() == kvpools_core.GPUS


def test_a_catalogue_without_a_vendor_plugin_lacks_its_devices_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = isolated_registry(["cuda"], platforms=())
    assert len(accelerators(registry)) == 20
    with pytest.raises(ConfigError, match=r"Unknown GPU 'mi300x'.*installed but not loaded: .*kvpools-rocm"):
        find_gpu("mi300x", registry)
    # a vendor distribution that is not installed at all: what to install
    monkeypatch.setitem(pipeline.VENDOR_DISTRIBUTIONS, "tpu", "kvpools-tpu")
    with pytest.raises(
        ConfigError,
        match=r"Vendor platforms bring their accelerators .*: pip install kvpools-tpu \(not on your package index\? "
        r"from a kvpools checkout: pip install \./plugins/kvpools-tpu\)\.",
    ):
        find_gpu("tpu-v5e")


def test_the_platform_traits_carry_the_memory_default_inputs() -> None:
    """CUDA alone captures breakable prefill graphs; Ascend brings SGLang's NPU tiers (npu/utils.py 103-160)."""
    cuda, rocm, ascend = (platform_traits_of(name) for name in ("cuda", "rocm", "ascend"))
    assert cuda.breakable_prefill_graphs and not rocm.breakable_prefill_graphs and not ascend.breakable_prefill_graphs
    assert cuda.memory_tiers == rocm.memory_tiers == ()
    assert [
        (t.max_mib, t.chunked_prefill_size, t.decode_max_bs, t.decode_max_bs_at_tp4) for t in ascend.memory_tiers
    ] == [
        (32768, 4096, 16, 64),
        (65536, 8192, 64, 256),
    ]
    # an alias resolves to its platform's traits; above the NPU tiers the GPU tiers apply
    assert sglang_chunked_prefill_size(32 * 1024, "npu") == 4096
    assert sglang_chunked_prefill_size(32 * 1024, "cuda") == 4096
    assert sglang_chunked_prefill_size(30 * 1024, "npu") == 4096 and sglang_chunked_prefill_size(30 * 1024) == 4096
    assert sglang_chunked_prefill_size(96 * 1024, "ascend") == 8192
    assert sglang_chunked_prefill_size(19 * 1024, "ascend") == 4096 and sglang_chunked_prefill_size(19 * 1024) == 2048


def test_memory_tiers_round_trip_and_are_checked() -> None:
    tier = MemoryTier(max_mib=1024, chunked_prefill_size=512, decode_max_bs=4, decode_max_bs_at_tp4=8)
    traits = PlatformTraits(platform="toy", memory_tiers=(tier,), breakable_prefill_graphs=True)
    assert PlatformTraits.from_dict(json.loads(json.dumps(to_dict(traits)))) == traits
    assert traits.memory_tier(1024) == tier and traits.memory_tier(1025) is None
    with pytest.raises(InvalidValueError, match="strictly ascending max_mib"):
        PlatformTraits(platform="toy", memory_tiers=(tier, tier))
    with pytest.raises(InvalidValueError, match=r"MemoryTier.decode_max_bs must be a positive integer"):
        MemoryTier(max_mib=1024, chunked_prefill_size=512, decode_max_bs=0, decode_max_bs_at_tp4=8)
    with pytest.raises(InvalidValueError, match="breakable_prefill_graphs must be True or False"):
        PlatformTraits(platform="toy", breakable_prefill_graphs="yes")  # type: ignore[arg-type]


def test_a_gpu_value_refuses_what_the_catalogue_cannot_use() -> None:
    with pytest.raises(InvalidValueError, match=r"GPU.total_bytes must be a positive integer"):
        GPU("x", "X", 0, source="s")
    with pytest.raises(InvalidValueError, match=r"GPU.source must be a non-empty string"):
        GPU("x", "X", GiB)
    with pytest.raises(InvalidValueError, match=r"GPU.aliases must be non-empty strings"):
        GPU("x", "X", GiB, aliases=("",), source="s")
    assert GPU.from_dict(rtx().to_dict()) == rtx()


def test_any_plugin_may_add_a_device_of_an_installed_platform() -> None:
    registry = isolated_registry(["cuda", "mha"], objects={"site": offering(rtx("rtx-a6000", "a6000"))}, platforms=())
    assert find_gpu("RTX A6000", registry) == rtx("rtx-a6000", "a6000")
    assert accelerators(registry)[-1].name == "rtx-a6000"  # in-process plugins come after the built-ins


def test_a_device_of_a_platform_nobody_provides_is_blamed_on_its_plugin() -> None:
    registry = Registry(extra_plugins={"site": offering(rtx(platform="tpu"))})
    with pytest.raises(PluginResultError, match=r"Plugin \"site\" .*platform 'tpu', which no loaded plugin provides"):
        find_gpu("h100", registry)


def test_a_name_two_plugins_offer_is_a_conflict_naming_both() -> None:
    registry = Registry(extra_plugins={"site": offering(rtx("H100 SXM"))})
    with pytest.raises(PluginConflictError, match=r"GPU 'H100 SXM' comes from two plugins: \"cuda\" .*\"site\""):
        accelerators(registry)


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ("h100", "str 'h100': not a list of GPU values"),
        ([{"name": "x"}], r"list of 1 item\(s\): its item\[0\] is dict"),
    ],
)
def test_a_wrong_answer_is_blamed_on_its_plugin(answer: Any, problem: str) -> None:
    module = types.ModuleType("garbage")

    @hookimpl
    def accelerators_hook() -> Any:
        return answer

    accelerators_hook.__name__ = "accelerators"
    module.accelerators = accelerators_hook  # type: ignore[attr-defined]
    with pytest.raises(PluginResultError, match=rf"Plugin \"garbage\" .*hook accelerators with {problem}"):
        accelerators(Registry(extra_plugins={"garbage": module}))


VENDOR_X = """
from kvpools_core import hookimpl
from kvpools_core.values import GPU, MemoryTier, PlatformTraits

PLATFORM = "vendorx"
TRAITS = PlatformTraits(
    platform=PLATFORM,
    memory_tiers=(MemoryTier(max_mib=40960, chunked_prefill_size=2048, decode_max_bs=24, decode_max_bs_at_tp4=96),),
)

@hookimpl
def platforms():
    return {PLATFORM: "Vendor X accelerators (a test distribution)"}

@hookimpl(tryfirst=True)
def platform_traits(serving):
    return TRAITS if serving.platform == PLATFORM else None

@hookimpl
def accelerators():
    return [GPU("vx-40", "Vendor X VX-40 40GB", 40960 << 20, platform=PLATFORM, aliases=("vx40",),
                source="vendor-x-smi 40960 MiB (a test distribution)")%s]
"""


def install_vendor_x(tmp_path: Path, extra: str = "") -> dict[str, str]:
    """A third-party distribution ``kvpools-vendorx`` on the path of a fresh process (its entry point found
    as an installed one's is); ``extra`` adds a second device."""
    (tmp_path / "kvpools_vendorx.py").write_text(textwrap.dedent(VENDOR_X % extra))
    info = tmp_path / "kvpools_vendorx-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kvpools-vendorx\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[kvpools]\nvendorx = kvpools_vendorx\n")
    return {"PYTHONPATH": str(tmp_path)}


def kvpools(kvpools_exe: str, cli_env: dict[str, str], env: dict[str, str], *args: str) -> Any:
    return subprocess.run([kvpools_exe, *args], capture_output=True, text=True, env={**cli_env, **env}, timeout=120)


def test_a_third_party_platform_plugin_adds_a_gpu_that_kvpools_plan_uses(
    tmp_path: Path, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    """``--gpu vx40`` plans on the vendor's device for its platform, with its memory tier: the CLI's chunk 2048,
    decode max_bs 24; reserved 512 + 1.5 x 2048 + 128 + 2 x 24 = 3760 MiB, no prefill graph (not CUDA), no
    floor (<= 60 GiB): round((40960 - 3760) / 40960, 3) = 0.908."""
    env = install_vendor_x(tmp_path)
    out = kvpools(kvpools_exe, cli_env, env, "plan", "llama-3.1-8b", "--gpu", "vx40", "--weights-memory", "15GiB")
    assert out.returncode == 0, out.stderr
    assert "GPU vx-40 total 42949672960 B" in out.stdout
    data = json.loads(
        kvpools(
            kvpools_exe, cli_env, env, "plan", "llama-3.1-8b", "--gpu", "vx-40", "--weights-memory", "15GiB", "--json"
        ).stdout
    )
    plan = data.get("plan", data)
    assert plan["serving"]["platform"] == "vendorx" and plan["serving"]["chunked_prefill_size"] == 2048
    assert plan["budget"]["gpu"] == "vx-40" and plan["budget"]["mem_fraction_static"] == 0.908
    source = plan["budget"]["mem_fraction_source"]
    assert "reserved 3760 MiB" in source and "no prefill graph (platform vendorx" in source


def test_a_third_party_gpu_that_clashes_is_named_without_a_traceback(
    tmp_path: Path, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    env = install_vendor_x(
        tmp_path,
        extra=', GPU("vx-141", "Vendor X VX-141", 141 << 30, platform=PLATFORM, aliases=("h200",), source="x")',
    )
    out = kvpools(kvpools_exe, cli_env, env, "plan", "llama-3.1-8b", "--gpu", "vx40", "--weights-memory", "15GiB")
    assert out.returncode != 0
    assert "GPU 'h200' comes from two plugins" in out.stderr and "kvpools-vendorx 1.0" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_plugin_is_loaded_in_this_process_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same distribution through a registry built here: the device is found, its traits give the tier."""
    install_vendor_x(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("kvpools_vendorx", None)
    registry = Registry()
    gpu = find_gpu("VX-40", registry)
    assert (gpu.platform, gpu.total_mib) == ("vendorx", 40960)
    assert sglang_chunked_prefill_size(gpu.total_mib, gpu.platform, registry=registry) == 2048
