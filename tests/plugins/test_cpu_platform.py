"""The ``cpu`` platform's one host-dependent rule: SGLang's CPU fp8 KV kernels need Intel AMX.

The answer comes from ``KVPOOLS_CPU_AMX`` where it is set (planning for another host) and from this host's
``/proc/cpuinfo`` otherwise, so every test here pins it: each outcome is asserted on every machine.
"""

from __future__ import annotations

from pathlib import Path

import kvpools_plugins.cpu as cpu
import pytest

from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.pipeline import plan
from kvpools_core.values import Plan, Serving

FP8_ON_CPU = Serving(platform="cpu", kv_cache_dtype="fp8_e4m3")


@pytest.mark.parametrize("told", ["1", "yes", "TRUE", " on "])
def test_told_present_plans_fp8_on_cpu(monkeypatch: pytest.MonkeyPatch, told: str) -> None:
    monkeypatch.setenv(cpu.AMX_ENV, told)
    planned = plan("llama-3.1-8b", FP8_ON_CPU, memory="4GiB")
    assert isinstance(planned, Plan)
    # fp8 stores one byte per element: 32 layers x 8 KV heads x 128 x (K + V)
    assert planned.cell.bytes_per_token == 32 * 8 * 128 * 2


@pytest.mark.parametrize("told", ["0", "no", "False", "off"])
def test_told_absent_refuses_fp8_on_cpu_naming_the_variable(monkeypatch: pytest.MonkeyPatch, told: str) -> None:
    monkeypatch.setenv(cpu.AMX_ENV, told)
    with pytest.raises(UnsupportedCombinationError, match="requires Intel AMX") as refused:
        plan("llama-3.1-8b", FP8_ON_CPU, memory="4GiB")
    assert f"{cpu.AMX_ENV}=1" in str(refused.value)
    assert isinstance(plan("llama-3.1-8b", Serving(platform="cpu", kv_cache_dtype="bf16"), memory="4GiB"), Plan)


def test_an_unreadable_answer_is_refused_not_read_as_yes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu.AMX_ENV, "maybe")
    with pytest.raises(ConfigError, match=r"KVPOOLS_CPU_AMX='maybe' is not a boolean"):
        plan("llama-3.1-8b", FP8_ON_CPU, memory="4GiB")


@pytest.mark.parametrize(("cpuinfo", "expected"), [("flags: avx512f amx_tile amx_bf16", True), ("flags: avx2", False)])
def test_unset_reads_this_hosts_cpuinfo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cpuinfo: str, expected: bool
) -> None:
    monkeypatch.delenv(cpu.AMX_ENV, raising=False)
    fake = tmp_path / "cpuinfo"
    fake.write_text(cpuinfo)
    real_path = cpu.Path
    monkeypatch.setattr(cpu, "Path", lambda p: fake if p == "/proc/cpuinfo" else real_path(p))
    assert cpu.has_amx() is expected


def test_other_fp8_formats_are_refused_whatever_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu.AMX_ENV, "1")
    with pytest.raises(UnsupportedCombinationError, match="fp8_e5m2 is not supported on the CPU platform"):
        plan("llama-3.1-8b", Serving(platform="cpu", kv_cache_dtype="fp8_e5m2"), memory="4GiB")
