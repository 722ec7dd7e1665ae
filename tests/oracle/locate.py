"""Where the shared checkout (SGLang's sizing oracle, the real model configs) lives.

Neither is a package dependency.  A user who clones the repository has no
``../shared``: the differential tests then *skip*, all with one reason, so the
README's test command passes on a fresh clone.  CI has ``../shared`` beside the
clone and sets ``KVPOOLS_REQUIRE_SHARED=1`` (``.ci/run``): there a missing
oracle *fails* the run, so the differential tests can never silently vanish.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

SHARED_DIR = (Path(__file__).parents[2] / ".." / "shared").resolve()
ORACLE_DIR = SHARED_DIR / "oracle"
MODEL_CONFIGS = SHARED_DIR / "model-configs"
REQUIRE_ENV = "KVPOOLS_REQUIRE_SHARED"


def shared_required() -> bool:
    """True where the shared checkout must be present (CI)."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def oracle_available() -> bool:
    return (ORACLE_DIR / "sglang_oracle" / "oracle.py").is_file()


MISSING_REASON = (
    f"the shared checkout (SGLang's sizing oracle, real model configs) is not at {SHARED_DIR}; "
    f"the differential tests need it: put ../shared beside the clone to run them"
)
"""The one reason every differential test skips with on a clone without ``../shared``."""


def _missing() -> None:
    """Skip (a user's clone) or fail (CI) the current test or module, with one shared reason."""
    skip_or_fail(MISSING_REASON)


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason`` (a user's clone), or fail under ``KVPOOLS_REQUIRE_SHARED`` (CI).

    pytest's summary folds skips by (file, line, reason) and reports a skip raised inside a test at the test's
    own line: ``tests/conftest.py`` moves every skip raised here back to the ``raise`` below, where a module-level
    skip is reported anyway, so a clone without ``../shared`` prints the reason once, with its count.
    """
    if shared_required():
        pytest.fail(f"{reason}. {REQUIRE_ENV} is set, so its absence is a failure.", pytrace=False)
    exc = pytest.skip.Exception(reason, allow_module_level=True)
    exc.kvpools_shared_skip = True  # type: ignore[attr-defined]  # read by tests/conftest.py
    raise exc


def require_oracle() -> None:
    """Put SGLang's sizing oracle on ``sys.path``, or skip/fail the caller when it is missing."""
    if not oracle_available():
        _missing()
    if str(ORACLE_DIR) not in sys.path:
        sys.path.insert(0, str(ORACLE_DIR))


PEERS_VENV = Path(os.environ.get("KVPOOLS_PEERS_VENV", "/tmp/kvpools-peers-venv"))
"""SGLang 0.5.23 installed by the shared ``bench/setup_peers.sh`` (``benchmarks/run_bench.sh`` builds it)."""


def require_sglang_peer() -> tuple[Path, Path]:
    """The peers venv's python and the shared ``bench`` folder (its ``peer_imports.py`` imports SGLang's
    allocators), or skip/fail the caller when either is missing."""
    python, bench = PEERS_VENV / "bin" / "python", SHARED_DIR / "bench"
    sglang = list(PEERS_VENV.glob("lib/python*/site-packages/sglang/srt/mem_cache/allocator"))
    if not python.is_file() or not sglang or not (bench / "peer_imports.py").is_file():
        _missing()
    return python, bench


def require_model_configs() -> Path:
    """The real ``config.json`` excerpts, or skip/fail the caller when they are missing."""
    if not MODEL_CONFIGS.is_dir() or not any(MODEL_CONFIGS.glob("*.json")):
        _missing()
    return MODEL_CONFIGS
