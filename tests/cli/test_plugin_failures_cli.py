"""A broken or hanging third-party plugin at the command line (issue 29).

Each case installs a fake distribution (a ``*.dist-info`` folder on
``PYTHONPATH``) and runs the real console script: a plugin's failure is one
line naming the plugin, its version and the hook, exit status 2, with the
traceback only under ``KVPOOLS_TRACEBACK=1``; Ctrl-C is one line, exit 130.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

MEMORY = ("--memory", "8GiB")


@pytest.fixture
def cli_env(cli_env: dict[str, str]) -> dict[str, str]:
    """The shared environment, without a KVPOOLS_TRACEBACK of the developer's shell (each test sets its own)."""
    return {name: value for name, value in cli_env.items() if name != "KVPOOLS_TRACEBACK"}


def install(site: Path, name: str, source: str, version: str = "0.7") -> None:
    """A fake distribution ``kvpools-NAME`` whose entry point ``NAME`` is the module ``fake_NAME``."""
    (site / f"fake_{name}.py").write_text(textwrap.dedent(source))
    info = site / f"kvpools_{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: kvpools-{name}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[kvpools]\n{name} = fake_{name}\n")


def run(exe: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([exe, *args], capture_output=True, text=True, env=env, timeout=120)


def one_line(out: subprocess.CompletedProcess[str], status: int) -> str:
    assert out.returncode == status, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("Error: ") and out.stderr.count("\n") == 1, out.stderr
    return out.stderr


CRASHER = """
    from kvpools_core import hookimpl

    @hookimpl(tryfirst=True)
    def estimate_cell_size(model, serving):
        raise RuntimeError("crashed on purpose")
"""


def test_a_crashing_plugin_exits_2_naming_plugin_version_and_hook(
    tmp_path: Path, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    """Defect 1: a raising hook used to exit 1, and KVPOOLS_TRACEBACK=1 showed no traceback."""
    install(tmp_path, "crasher", CRASHER)
    env = dict(cli_env, PYTHONPATH=str(tmp_path))
    message = one_line(run(kvpools_exe, env, "plan", "llama-3.1-8b", *MEMORY), status=2)
    assert '"crasher" (kvpools-crasher 0.7) failed in hook estimate_cell_size' in message
    assert "RuntimeError: crashed on purpose" in message and "KVPOOLS_TRACEBACK=1" in message

    out = run(kvpools_exe, dict(env, KVPOOLS_TRACEBACK="1"), "plan", "llama-3.1-8b", *MEMORY)
    assert out.returncode == 2, out.stderr
    assert "Traceback (most recent call last)" in out.stderr
    assert 'raise RuntimeError("crashed on purpose")' in out.stderr  # the plugin's own line
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith('Error: Plugin "crasher" (kvpools-crasher 0.7) failed in hook estimate_cell_size'), last


def test_traceback_off_spellings_print_no_traceback(tmp_path: Path, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    """Defect 6: KVPOOLS_TRACEBACK=0 used to be read as "on" (any non-empty value was)."""
    install(tmp_path, "crasher", CRASHER)
    env = dict(cli_env, PYTHONPATH=str(tmp_path), KVPOOLS_TRACEBACK="0")
    one_line(run(kvpools_exe, env, "plan", "llama-3.1-8b", *MEMORY), status=2)


@pytest.mark.parametrize("variable", ["KVPOOLS_TRACEBACK", "KVPOOLS_DISABLE_PLUGIN_AUTOLOAD", "KVPOOLS_TRACE_PLUGINS"])
def test_a_boolean_control_that_is_no_boolean_is_one_clear_line(
    variable: str, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    """Defect 6: ``KVPOOLS_DISABLE_PLUGIN_AUTOLOAD=maybe`` used to be read as "disable"."""
    message = one_line(run(kvpools_exe, dict(cli_env, **{variable: "maybe"}), "plugins"), status=1)
    assert f"{variable}='maybe' is not a boolean" in message and "1, true, yes or on" in message


def test_system_exit_in_a_hook_is_not_a_silent_success(
    tmp_path: Path, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    """Defect 2: ``SystemExit(0)`` in a hook used to end the command with status 0 and no output."""
    install(
        tmp_path,
        "exiter",
        """
        from kvpools_core import hookimpl

        @hookimpl(tryfirst=True)
        def estimate_cell_size(model, serving):
            raise SystemExit(0)
        """,
    )
    out = run(kvpools_exe, dict(cli_env, PYTHONPATH=str(tmp_path)), "plan", "llama-3.1-8b", *MEMORY)
    message = one_line(out, status=2)
    assert '"exiter" (kvpools-exiter 0.7) failed in hook estimate_cell_size: SystemExit: 0' in message


def test_system_exit_at_import_is_named_and_warn_skips_it(
    tmp_path: Path, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    """Defect 2: ``SystemExit(0)`` at import used to exit 0 silently, even under KVPOOLS_PLUGIN_ERRORS=warn."""
    install(tmp_path, "quitter", "raise SystemExit(0)\n")
    env = dict(cli_env, PYTHONPATH=str(tmp_path))
    message = one_line(run(kvpools_exe, env, "plan", "llama-3.1-8b", *MEMORY), status=1)
    assert 'Error loading plugin "quitter" (kvpools-quitter 0.7): SystemExit: 0' in message
    out = run(kvpools_exe, dict(env, KVPOOLS_TRACEBACK="1"), "plan", "llama-3.1-8b", *MEMORY)
    assert out.returncode == 1 and "Traceback" in out.stderr and "raise SystemExit(0)" in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith('Error: Error loading plugin "quitter"'), out.stderr
    out = run(kvpools_exe, dict(env, KVPOOLS_PLUGIN_ERRORS="warn"), "plan", "llama-3.1-8b", *MEMORY)
    assert out.returncode == 0, out.stderr
    assert '"quitter"' in out.stderr and "skipped: KVPOOLS_PLUGIN_ERRORS=warn" in out.stderr
    assert "llama-3.1-8b" in out.stdout


def test_a_preset_of_a_disabled_plugin_is_not_an_unknown_model(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    """Defect 7: with mha disabled, ``kvpools plan llama-3.1-8b`` used to say "Unknown model"."""
    out = run(kvpools_exe, dict(cli_env, KVPOOLS_DISABLED_PLUGINS="mha"), "plan", "llama-3.1-8b", *MEMORY)
    message = one_line(out, status=1)
    assert "Unknown model" not in message
    assert "'llama-3.1-8b' is a preset of the plugin \"mha\"" in message
    assert "remove mha from KVPOOLS_DISABLED_PLUGINS" in message


def test_build_on_a_device_no_platform_builds_on_is_one_clear_line(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    """Defect 8: ``--device xpu`` on a torch without XPU used to be torch's AssertionError, blamed on core."""
    import torch

    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        pytest.skip("this torch can allocate on xpu")
    out = run(
        kvpools_exe, cli_env, "build", "llama-3.1-8b", "--memory", "64MiB", "--platform", "cpu", "--device", "xpu"
    )
    message = one_line(out, status=1)
    assert "Cannot build on --device 'xpu'" in message and "Platforms that can build:" in message
    assert "[core]" not in message


SLEEPER = """
    import time
    from pathlib import Path
    from kvpools_core import hookimpl

    @hookimpl(tryfirst=True)
    def estimate_cell_size(model, serving):
        Path(__file__).with_name("asleep").write_text("1")
        time.sleep(120)
"""


def _interrupt_when_asleep(exe: str, env: dict[str, str], marker: Path, *args: str) -> tuple[int, str, str]:
    """Start the command, wait for the plugin to say it is asleep, send SIGINT; its status and output."""

    def default_sigint() -> None:  # a runner that ignores SIGINT must not make the child ignore it too
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen(
        [exe, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_sigint
    )
    try:
        deadline = time.monotonic() + 100
        while not marker.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                out, err = proc.communicate()
                pytest.fail(f"the plugin never went to sleep (status {proc.returncode}): {err}")
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT is a POSIX signal")
def test_ctrl_c_in_a_hanging_hook_exits_130_in_one_line(
    tmp_path: Path, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    """Defect 4: kvpools sets no timeout on a plugin; Ctrl-C ends the command cleanly (exit 130, no traceback)."""
    install(tmp_path, "sleeper", SLEEPER)
    env = dict(cli_env, PYTHONPATH=str(tmp_path))
    status, _, err = _interrupt_when_asleep(kvpools_exe, env, tmp_path / "asleep", "plan", "llama-3.1-8b", *MEMORY)
    assert status == 130, err
    assert err == "Error: interrupted (Ctrl-C).\n"


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT is a POSIX signal")
def test_ctrl_c_in_a_hanging_import_exits_130_in_one_line(
    tmp_path: Path, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    """Defect 4: the same while a plugin's import hangs, even under KVPOOLS_PLUGIN_ERRORS=warn."""
    install(
        tmp_path,
        "slowimport",
        """
        import time
        from pathlib import Path

        Path(__file__).with_name("asleep").write_text("1")
        time.sleep(120)
        """,
    )
    env = dict(cli_env, PYTHONPATH=str(tmp_path), KVPOOLS_PLUGIN_ERRORS="warn")
    status, _, err = _interrupt_when_asleep(kvpools_exe, env, tmp_path / "asleep", "plugins")
    assert status == 130, err
    assert err == "Error: interrupted (Ctrl-C).\n"
