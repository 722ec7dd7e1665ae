"""Where SGLang's sizing oracle lives, for every differential test folder.

The oracle is not a package dependency: CI runs a clean clone with ``../shared``
beside the repository root.  Without it the differential tests cannot mean
anything, so they fail, saying where the oracle was looked for.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ORACLE_DIR = (Path(__file__).parents[2] / ".." / "shared" / "oracle").resolve()


def require_oracle() -> None:
    """Put the oracle on ``sys.path``; fail, naming the place it was looked for, when it is missing."""
    if not (ORACLE_DIR / "sglang_oracle" / "oracle.py").is_file():
        pytest.fail(
            f"this test needs SGLang's sizing oracle at {ORACLE_DIR} (the shared checkout beside the repository "
            f"root, ../shared/oracle/sglang_oracle). Clone or mount ../shared next to the repo, or deselect the "
            f"differential tests with -m 'not oracle'.",
            pytrace=False,
        )
    if str(ORACLE_DIR) not in sys.path:
        sys.path.insert(0, str(ORACLE_DIR))
