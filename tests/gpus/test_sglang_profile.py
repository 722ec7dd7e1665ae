"""SGLang 0.5.23's runtime profile (``kvpools_core/pipeline/profiles/sglang-0.5.23.json``, issue 34): the one
calibrated term (what a rank holds before the weights) against the readings it cites, and the budget's other terms
documented with their source lines."""

from __future__ import annotations

import re

import pytest

from kvpools_core.errors import ConfigError
from kvpools_core.pipeline.gpus import DISTRIBUTED_RUNTIME_BYTES, SINGLE_RANK_RUNTIME_BYTES, default_runtime_bytes
from kvpools_core.pipeline.sglang_profile import load_sglang_profile
from kvpools_core.values import Serving

GiB = 1 << 30


def test_the_pipeline_constants_are_the_profiles() -> None:
    profile = load_sglang_profile("sglang==0.5.23")
    assert profile.single_rank_runtime_bytes == SINGLE_RANK_RUNTIME_BYTES == GiB
    assert profile.group_runtime_bytes == DISTRIBUTED_RUNTIME_BYTES == 3 * GiB
    assert default_runtime_bytes(Serving(tp_size=2)) == 3 * GiB
    assert default_runtime_bytes(Serving()) == GiB


def test_the_group_constant_is_within_the_readings_it_cites() -> None:
    """8 x H200 (143771 MiB = 140.40 GiB): 'Load weight begin. avail mem=137.34 GB' is 3.06 GiB below the total;
    12.25 + 125.65 = 137.90 GB at the start of another load is 2.50 GiB below. Each reading is within 0.5 GiB of
    the profile's 3 GiB and recomputes from its quoted line."""
    profile = load_sglang_profile()
    readings = [item for item in profile.evidence if item.get("runtime_gib") is not None]
    assert len(readings) == 2
    for item in readings:
        total_gib = item["gpu_mib"] / 1024
        numbers = [float(value) for value in re.findall(r"(?:avail mem|mem usage)=([0-9.]+) GB", item["line"])]
        free_gib = sum(numbers)  # 'begin': the free memory; 'end': free after the weights + the weights
        assert round(total_gib - free_gib, 2) == item["runtime_gib"]
        assert abs(item["runtime_gib"] - profile.group_runtime_bytes / GiB) <= 0.5
        assert item["source"].startswith("https://github.com/")


def test_every_term_names_its_source() -> None:
    terms = load_sglang_profile().terms
    assert [term["name"] for term in terms][:4] == ["GPU total", "runtime before the weights", "weights", "slack"]
    assert all(term["formula"] and term["source"] for term in terms)


def test_a_version_without_a_profile_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"no runtime-memory profile for SGLang '0\.4\.6'"):
        load_sglang_profile("0.4.6")
