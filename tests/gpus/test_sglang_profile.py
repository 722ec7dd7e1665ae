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


def test_the_runtime_from_the_source_is_read_off_every_rank_of_the_cited_log() -> None:
    """sgl-project/sglang#11716, 8 x H200 (143771 MiB = 140.4014 GiB): each rank's free memory before the
    torch.distributed init is its 'Load weight begin. avail mem' plus its 'Init torch distributed ends. mem usage'
    (137.29 + 2.01 = 137.34 + 1.96 = 139.30; TP7 137.52 + 1.77 = 139.29), so one rank's driver reservation and CUDA
    context are 140.4014 - 139.30 = 1.10 GiB; the group's init adds 2.01 GB on the ranks with least free memory,
    which is what SGLang sizes with (the MIN all-reduce, utils/common.py L571-572): 140.4014 - 137.29 = 3.11."""
    from benchmarks.startup_logs import load_startup_logs

    log = next(log for log in load_startup_logs() if log.id == "sglang-pr11716-h200-tp8-runtime")
    text = "\n".join(log.lines)
    begin = {rank: float(gb) for rank, gb in re.findall(r"TP(\d)\] Load weight begin\. avail mem=([0-9.]+) GB", text)}
    init = {
        rank: float(gb) for rank, gb in re.findall(r"TP(\d)\] Init torch distributed ends\. mem usage=([0-9.]+)", text)
    }
    assert sorted(begin) == sorted(init) == [str(rank) for rank in range(8)]
    total_gib = 143771 / 1024
    before_init = {round(begin[rank] + init[rank], 2) for rank in begin}
    assert before_init == {139.30, 139.29}
    profile = load_sglang_profile()
    assert profile.source_single_rank_bytes == round(1.10 * GiB)
    assert round(total_gib - max(before_init), 2) == 1.10
    lowest = min(begin, key=lambda rank: begin[rank])
    assert begin[lowest] == 137.29 and init[lowest] == 2.01
    assert profile.source_distributed_init_bytes == round(2.01 * GiB)
    assert profile.source_group_runtime_bytes == round(1.10 * GiB) + round(2.01 * GiB)
    assert round(total_gib - begin[lowest], 2) == 3.11
    # the values plans use are unchanged by the decomposition (1 GiB, 3 GiB): the benchmark reports both
    assert (profile.single_rank_runtime_bytes, profile.group_runtime_bytes) == (GiB, 3 * GiB)


def test_a_bad_part_of_the_runtime_from_the_source_is_refused(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json
    from importlib import resources

    import kvpools_core.pipeline.sglang_profile as module

    data = json.loads(resources.files(module.__package__).joinpath("profiles/sglang-0.5.23.json").read_text())
    data["runtime_before_weights_from_source"]["single_rank_gib"] = "1.1"
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "sglang-0.5.23.json").write_text(json.dumps(data))
    from types import SimpleNamespace

    # the module's own name for importlib.resources, replaced: the profile is read from tmp_path
    monkeypatch.setattr(module, "resources", SimpleNamespace(files=lambda _package: tmp_path))
    load_sglang_profile.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"runtime_before_weights_from_source\.single_rank_gib must be"):
            load_sglang_profile("0.5.23")
    finally:
        load_sglang_profile.cache_clear()
