"""The kit's platform checks prove what they claim: the sound toy platform passes each, and each
deliberately broken variant (``tests/testing/toy_platforms.py``) fails the check written for it.

The built-in and vendor platforms pass them in CI (``pytest --kvpools-conformance=rocm`` in the nox
tests session).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvpools_core.registry import Registry
from kvpools_core.testing import platform_conformance as pc
from kvpools_core.testing.conformance import ConformanceFailure
from kvpools_core.testing.registries import isolated_registry
from kvpools_core.values import Serving
from tests.testing.toy_platforms import PLATFORM, ToyPlatform

ROOT = Path(__file__).resolve().parents[2]


def registry_of(toy: ToyPlatform) -> Registry:
    """The built-in architectures (their presets are the matrix), cpu, and the toy platform."""
    return isolated_registry(["mha", "mla", "dsa", "swa", "mamba"], objects={"toy": toy})


def run_checks(toy: ToyPlatform) -> int:
    registry = registry_of(toy)
    names = pc.check_names_its_platforms("toy", registry)
    pc.check_accelerators("toy", registry)
    pc.check_answers_only_for_its_platforms("toy", registry)
    built = 0
    for name in names:
        traits = pc.check_traits_leave_a_page("toy", name, registry)
        assert pc.check_quantization_traits("toy", name, registry) == traits
        built += pc.check_architectures_plan_and_build("toy", name, traits, registry)
    return built


def test_the_sound_toy_platform_passes_and_plans_every_architecture() -> None:
    built = run_checks(ToyPlatform())
    registry = registry_of(ToyPlatform())
    presets = pc.architecture_presets(registry)
    assert pc.platform_plugins(registry)["toy"] == [PLATFORM]
    assert built == len(presets) > 20  # each preset planned at the toy's page 16 or 64 and built exactly


def test_the_toy_platform_traits_and_workspace_reach_the_plan() -> None:
    """What the checks rely on: the toy's traits and workspace really are in a plan made for it."""
    from kvpools_core.pipeline import plan

    planned = plan(
        "llama-3.1-8b", Serving(platform=PLATFORM, page_size=16), memory="40GiB", registry=registry_of(ToyPlatform())
    )
    assert planned.serving.traits.slot_index_dtype == "int32"
    assert "toy-scratch" in {pool.name for pool in planned.pools}


@pytest.mark.parametrize(
    ("defect", "caught"),
    [
        ("undescribed", "empty description"),
        ("no_page", "allow no page size"),
        ("no_page_for_kernel", "'dsa' kernels"),
        ("answers_everywhere", "answered"),
        ("workspace_everywhere", "answered"),
        ("detects_every_device", "answered detect_platform"),
        ("probes_every_device", "answered available_memory"),
        ("layout_everywhere", "answered buffer_layout"),
        ("pads_buffers", "build(plan, 'meta') failed"),
        ("int64_slots", "int64 slot indices"),
        ("refuses_an_unknown_method", "refuses quantization 'gptq_v9', which is none of the SGLang methods"),
        ("accelerator_not_a_gpu", r'accelerators are refused: Plugin "toy" .*accelerators.*item\[0\] is str'),
        ("accelerator_without_source", r'Plugin "toy" .*invalid value in hook accelerators: GPU.source'),
        ("accelerator_twice", r"Plugin \"toy\" .*offers the GPU spelling 'toy24' twice"),
        ("accelerator_elsewhere", r"platform 'nowhere', which no loaded plugin provides"),
    ],
)
def test_each_platform_defect_is_caught(defect: str, caught: str) -> None:
    pattern = caught if defect.startswith("accelerator") else caught.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(ConformanceFailure, match=pattern):
        run_checks(ToyPlatform(defect))


def test_the_toy_accelerators_are_checked_and_plan_with_the_toy_memory_tier() -> None:
    """What check_accelerators relies on: the toy's devices are in the catalogue, and a plan on the 24 GiB one
    takes the toy's own tier (chunk 2048, max_bs 8), the 48 GiB one the GPU tier (4096, 32); no prefill graph."""
    from kvpools_core.pipeline import plan
    from kvpools_core.pipeline.gpus import sglang_chunked_prefill_size

    registry = registry_of(ToyPlatform())
    assert [gpu.name for gpu in pc.check_accelerators("toy", registry)] == ["toy-24g", "toy-48g"]
    chunk = sglang_chunked_prefill_size(24 * 1024, PLATFORM, registry=registry)
    assert chunk == 2048 and sglang_chunked_prefill_size(48 * 1024, PLATFORM, registry=registry) == 4096
    serving = Serving(page_size=16, chunked_prefill_size=chunk)
    small = plan("llama-3.1-8b", serving, gpu="toy24", weights_memory="15GiB", registry=registry)
    assert small.serving.platform == PLATFORM
    # 512 + 1.5 x 2048 + 128 + 2 x 8 = 3728 MiB; round((24576 - 3728) / 24576, 3) = 0.848
    assert "decode graph 2 x max_bs 8 = 16 MiB" in (small.budget.mem_fraction_source or "")
    assert "no prefill graph (platform toyhw" in (small.budget.mem_fraction_source or "")
    assert small.budget.mem_fraction_static == 0.848
    large = plan("llama-3.1-8b", Serving(page_size=16), gpu="toy-48g", weights_memory="15GiB", registry=registry)
    assert "decode graph 2 x max_bs 32 = 64 MiB" in (large.budget.mem_fraction_source or "")


def test_a_platform_plan_that_imports_torch_is_caught() -> None:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    traits = pc.resolved_traits(PLATFORM, registry_of(ToyPlatform()))
    pc.check_plans_without_torch("toy", PLATFORM, traits, modules={"toy": "tests.testing.toy_platforms:SOUND"}, env=env)
    with pytest.raises(ConformanceFailure, match="imported torch"):
        pc.check_plans_without_torch(
            "toy", PLATFORM, traits, modules={"toy": "tests.testing.toy_platforms:IMPORTS_TORCH"}, env=env
        )


def test_the_suite_tells_platform_plugins_from_architectures() -> None:
    """``--kvpools-conformance=cpu`` selects the platform checks (and no architecture check) on cpu.

    Collection only: the nox ``tests`` session runs ``--kvpools-conformance=cpu`` itself, so running its checks
    here too would only run them twice.
    """
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kvpools-conformance=cpu", "--co"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    selected = {line.split("::")[1].split("[")[0] for line in done.stdout.splitlines() if "::" in line}
    assert {
        "test_platform_traits_leave_a_page_for_every_model_and_kernel",
        "test_platform_answers_only_for_its_own_platforms",
        "test_every_architecture_plans_and_builds_exactly_on_the_platform",
        "test_planning_for_the_platform_imports_no_torch",
    } <= selected
    assert not any(name.startswith("test_claims") for name in selected)


def test_a_registry_without_the_plugin_is_named() -> None:
    with pytest.raises(ConformanceFailure, match="provides no platform"):
        pc.check_names_its_platforms("toy", isolated_registry(["mha"]))
