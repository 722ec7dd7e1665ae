"""A careless user at the command line: every mistake is one paragraph naming the option and the fix.

Each case runs the real console script and asserts the exit status, that no
traceback reaches the user, and the words that tell them what to change.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import psutil
import pytest


def run(exe: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)


def _fails(out: subprocess.CompletedProcess[str], *phrases: str, status: int = 1) -> None:
    assert out.returncode == status, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("Error: "), out.stderr
    assert out.stderr.count("\n") == 1, f"one paragraph, got: {out.stderr!r}"
    for phrase in phrases:
        assert phrase in out.stderr, (phrase, out.stderr)


MEMORY = ("--memory", "10GiB")

CASES = {
    "tp-3-llama-8b": (("plan", "llama-3.1-8b", "--tp-size", "3", *MEMORY), ("--tp-size 3", "32 attention heads", "16")),
    "tp-3-llama-70b": (("plan", "llama-3.1-70b", "--tp-size", "3", *MEMORY), ("--tp-size 3", "64 attention heads")),
    "tp-3-deepseek": (("plan", "deepseek-v3", "--tp-size", "3", *MEMORY), ("--tp-size 3", "128 attention heads")),
    "unknown-platform": (("plan", "llama-3.1-8b", "--platform", "tpu", *MEMORY), ("'tpu'", "cpu, cuda")),
    "unowned-plugin-option": (
        ("plan", "llama-3.1-8b", "--plugin-option", "foo=bar", *MEMORY),
        ("'foo'", "--plugin-option", "Declared options"),
    ),
    "weights-with-memory": (
        ("plan", "llama-3.1-8b", "--weights-memory", "5GiB", *MEMORY),
        ("--weights-memory", "--memory", "Drop one"),
    ),
    "weights-exceed-free": (
        ("plan", "llama-3.1-8b", "--free-memory", "80GiB", "--weights-memory", "81GiB"),
        ("no --mem-fraction-static can", "--tp-size"),
    ),
    "absurd-memory": (("plan", "llama-3.1-8b", "--memory", "99999999TiB"), ("--memory", "1 EiB")),
    "dp-share-rounds-to-zero": (
        (
            "plan",
            "llama-3.1-70b",
            "--tp-size",
            "8",
            "--dp-size",
            "8",
            "--enable-dp-attention",
            "--max-running-requests",
            "4",
            "--memory",
            "40GiB",
        ),
        ("--max-running-requests 4", "8 DP-attention workers", "at least 8"),
    ),
    "build-device-xyz": (("build", "llama-3.1-8b", "--device", "xyz", "--platform", "cpu", *MEMORY), ("'xyz'",)),
    "build-device-xyz-as-platform": (("build", "llama-3.1-8b", "--device", "xyz", *MEMORY), ("'xyz'", "platform")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_clear_paragraph(case: str, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    args, phrases = CASES[case]
    _fails(run(kvpools_exe, cli_env, *args), *phrases)


def test_build_larger_than_host_memory_is_refused_before_allocating(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    """A plan of twice the host's RAM on cpu: refused with the numbers, not killed by the kernel."""
    too_big = 2 * psutil.virtual_memory().total
    out = run(kvpools_exe, cli_env, "build", "llama-3.1-8b", "--memory", str(too_big), "--device", "cpu")
    _fails(out, "free there", "meta")


def test_build_on_cuda_without_a_gpu_is_a_clear_error(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    out = run(kvpools_exe, dict(cli_env, CUDA_VISIBLE_DEVICES=""), "build", "llama-3.1-8b", *MEMORY, "--device", "cuda")
    _fails(out, "no CUDA device is visible", "meta")
    assert "AssertionError" not in out.stderr and "[core]" not in out.stderr


def test_config_that_is_not_utf8(tmp_path: Path, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    bad = tmp_path / "config.json"
    bad.write_bytes(b'{"model_type": "llama", "name": "\xff\xfe"}')
    _fails(run(kvpools_exe, cli_env, "plan", str(bad), *MEMORY), str(bad), "UTF-8")


def test_unreachable_context_is_noted(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, "plan", "llama-3.1-8b", "--memory", "1GiB", "--context-length", "10000000")
    assert out.returncode == 0, out.stderr
    assert "no request can reach its full context" in out.stdout
    assert "--context-length" in out.stdout


def test_build_prints_no_torch_warning(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = run(kvpools_exe, cli_env, "build", "llama-3.1-8b", "--memory", "256MiB", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""


def test_an_internal_error_is_one_line_and_the_traceback_is_opt_in(
    tmp_path: Path, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    """A bug (here: a broken hook forced through an in-process plugin file) never prints a traceback by default."""
    plugin = tmp_path / "sitecustomize.py"
    plugin.write_text(
        "import kvpools_core.pipeline as p\n"
        "def boom(*a, **k):\n"
        "    raise ZeroDivisionError('planted bug')\n"
        "p.check_plugin_options = boom\n"
    )
    env = dict(cli_env, PYTHONPATH=str(tmp_path))
    out = run(kvpools_exe, env, "plan", "llama-3.1-8b", *MEMORY)
    _fails(out, "internal error", "ZeroDivisionError: planted bug", "KVPOOLS_TRACEBACK=1", status=2)
    out = run(kvpools_exe, dict(env, KVPOOLS_TRACEBACK="1"), "plan", "llama-3.1-8b", *MEMORY)
    assert "Traceback" in out.stderr and "planted bug" in out.stderr
