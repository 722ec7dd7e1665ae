"""``kvpools compare`` says what sized SGLang's sliding-window pool: ``--swa-full-tokens-ratio`` only where the ratio
did.

DeepSeek-V4.1 with the ratio unset is sized by SGLang 0.5.23's cap mode (``_resolve_swa_cap_tokens``: the request
cap and the radix prefix tails, 606,464 tokens at 20 GiB, ``tests/dsv4/test_dsv41_exact_swa_cap.py``); the
comparison used to call that pool "--swa-full-tokens-ratio 0.8 of the full pool's".
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

V41 = str(Path(__file__).parents[1] / "dsv4" / "configs" / "dsv41_vllm_synthetic.json")
"""A DeepSeek-V4.1 config vLLM plans too (kv_source_layer_ids and index_source_layer_ids)."""


def test_cap_mode_pool_is_not_called_the_ratios(kvpools_exe: str, cli_env: dict[str, str]) -> None:
    out = subprocess.run(
        [kvpools_exe, "compare", V41, "--memory", "20GiB", "--json"],
        capture_output=True,
        text=True,
        env=cli_env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    (group,) = [group for group in json.loads(out.stdout)["groups"] if group.get("token_space") == "swa"]
    why = " | ".join(group["why"])
    assert "SGLang: a pool of its own, 606,464 tokens; a request past the window holds at most 768 of them" in why
    assert "--swa-full-tokens-ratio 0.8" not in why
    assert "SGLang's swa pool: the dsv4 plugin sized it: SWA pool: SGLang 0.5.23's cap mode" in why
    assert "606,464 tokens from the request cap and radix prefix tails" in why
