"""Shared fixtures: a fresh registry per test, so installed plugins never leak between tests."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvpools_core import Registry
from kvpools_core.registry import reset_registry

_CONTROLS = (
    "KVPOOLS_DISABLE_PLUGIN_AUTOLOAD",
    "KVPOOLS_PLUGINS",
    "KVPOOLS_DISABLED_PLUGINS",
    "KVPOOLS_TRACE_PLUGINS",
    "KVPOOLS_PLUGIN_ERRORS",
)


@pytest.fixture(autouse=True)
def _clean_plugin_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in _CONTROLS:
        monkeypatch.delenv(name, raising=False)
    reset_registry()
    yield
    reset_registry()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    """Report every shared-checkout skip at one location, so the summary prints its reason once."""
    report = yield
    if call.excinfo is not None and getattr(call.excinfo.value, "kvpools_shared_skip", False):
        assert isinstance(report.longrepr, tuple)
        raised = call.excinfo.tb
        while raised.tb_next is not None:
            raised = raised.tb_next
        report.longrepr = (raised.tb_frame.f_code.co_filename, raised.tb_lineno, report.longrepr[2])
    return report


@pytest.fixture(scope="session")
def registry() -> Registry:
    """The installed plugins (built-ins plus the example distribution), loaded once."""
    return Registry(autoload=True, plugins=None, disabled=(), trace=False, on_plugin_error="raise")


@pytest.fixture(scope="session")
def kvpools_exe() -> str:
    """The real console script of the environment running the tests."""
    candidate = Path(sys.executable).parent / "kvpools"
    found = str(candidate) if candidate.exists() else shutil.which("kvpools")
    if not found:
        pytest.fail("the kvpools console script is not installed in this environment (pip install -e .)")
    return found


@pytest.fixture
def cli_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CONTROLS}
    env["COLUMNS"] = "160"
    return env


@pytest.fixture(scope="session", autouse=True)
def _oracle_process_group() -> Iterator[None]:
    """Tear down the one-process gloo group (and its file store) that PP oracle emulation creates."""
    yield
    adapter = sys.modules.get("tests.oracle.adapter")
    if adapter is not None:
        adapter.shutdown()


@pytest.fixture
def rocm_platform() -> Iterator[None]:
    """The default registry, with the real ``rocm`` platform of the kvpools-rocm distribution loaded.

    The DSA plugin's ROCm page rules are tested through the real pipeline,
    which refuses a platform nobody provides.
    """
    from kvpools_core import registry

    loaded = Registry()
    info = {i.name: i for i in loaded.plugins()}.get("rocm")
    if info is None or info.status != "loaded" or info.distribution != "kvpools-rocm":
        pytest.fail(f"kvpools-rocm is not installed and loaded ({info}): pip install ./plugins/kvpools-rocm")
    registry._DEFAULT = loaded
    yield
    reset_registry()


LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 16,
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}
"""meta-llama/Llama-3.2-1B's KV-relevant config.json fields: the standalone draft the draft-model tests use."""


@pytest.fixture(scope="session")
def draft_config(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A config.json of :data:`LLAMA_3_2_1B` in a directory named ``llama-3.2-1b`` (the draft's model name)."""
    path = tmp_path_factory.mktemp("drafts") / "llama-3.2-1b" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(LLAMA_3_2_1B))
    return str(path)
