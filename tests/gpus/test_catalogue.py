"""The GPU catalogue: totals as SGLang reads them, lookups by name and alias, typos, user-supplied totals."""

from __future__ import annotations

import pytest

from kvpools_core import GPU, GPUS, ConfigError, find_gpu
from kvpools_core.pipeline.gpus import custom_gpu

MiB = 1 << 20


@pytest.mark.parametrize(
    ("spelling", "name", "mib"),
    [
        ("h100", "h100", 81559),
        ("H100-SXM", "h100", 81559),
        ("h100 80gb", "h100", 81559),
        ("H200", "h200", 143771),
        ("b200", "b200", 183359),
        ("A100", "a100-80gb", 81920),
        ("a100_40gb", "a100-40gb", 40960),
        ("L40S", "l40s", 46068),
        ("RTX 6000 Ada", "rtx-6000-ada", 49140),
        ("MI300X", "mi300x", 196592),  # rocminfo 201310208 KB / 1024, as get_amdgpu_memory_capacity reads it
        ("910B", "ascend-910b", 65536),
    ],
)
def test_lookup_by_name_and_alias_is_case_and_dash_insensitive(spelling: str, name: str, mib: int) -> None:
    gpu = find_gpu(spelling)
    assert gpu.name == name
    assert gpu.total_bytes == mib * MiB
    assert gpu.total_mib == mib


def test_every_entry_has_a_source_a_known_platform_and_unique_spellings() -> None:
    spellings = [s.lower() for gpu in GPUS for s in (gpu.name, *gpu.aliases)]
    assert len(spellings) == len(set(spellings))
    for gpu in GPUS:
        assert gpu.source and gpu.platform in {"cuda", "rocm", "ascend"}
        assert find_gpu(gpu.name) is gpu


def test_platforms_of_vendor_parts() -> None:
    assert find_gpu("mi300x").platform == find_gpu("mi325x").platform == "rocm"
    assert find_gpu("ascend-910b").platform == "ascend"
    assert find_gpu("h200").platform == "cuda"


def test_a_typo_suggests_the_closest_entry() -> None:
    with pytest.raises(ConfigError, match=r"Unknown GPU 'h2000' \(gpu\)\. Did you mean 'h200'\?.*gpu_memory"):
        find_gpu("h2000")


def test_an_unknown_name_without_a_near_one_lists_the_catalogue() -> None:
    with pytest.raises(ConfigError, match=r"Known: h100, .*mi300x") as info:
        find_gpu("tpu-v5e")
    assert "Did you mean" not in str(info.value)


def test_custom_gpu_takes_a_size_with_a_unit() -> None:
    gpu = custom_gpu("96GiB")
    assert gpu == GPU("custom", "custom GPU, 96.00 GiB", 96 << 30, platform="cuda", source="user-supplied")
    assert custom_gpu(1 << 34, platform="rocm").platform == "rocm"
    with pytest.raises(ConfigError, match="gpu_memory"):
        custom_gpu("lots")
    with pytest.raises(ConfigError, match="must be positive"):
        custom_gpu(0)
