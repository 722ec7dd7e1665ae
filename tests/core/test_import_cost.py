"""Planning never imports torch: `kvpools plan` stays a sub-second command (torch loads only to build)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from kvpools_core import Serving, plan
for model, serving in [("llama-3.1-8b", Serving(page_size=16)), ("gpt-oss-20b", Serving()),
                       ("qwen3-next-80b-a3b-thinking", Serving()), ("deepseek-v3", Serving(kv_cache_dtype="fp8_e4m3"))]:
    plan(model, serving, memory="40GiB")
assert "torch" not in sys.modules, "planning imported torch"
print("ok")
"""


def test_planning_does_not_import_torch() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
