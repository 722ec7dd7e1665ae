"""``kvpools serve``'s capacity endpoint under unified memory (issue 31): ``serving.enable_unified_memory`` gives the
answer of ``kvpools capacity --enable-unified-memory --json`` (the arena, each length's requests, the three modes)
(before, the endpoint refused it as not modelled)."""

from __future__ import annotations

from typing import Any

from tests.serve.conftest import cli_json
from tests.serve.test_api import ok, refused

QWEN3_NEXT = "qwen3-next-80b-a3b-thinking"


def test_unified_capacity_is_the_clis(client: Any, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    """Qwen3-Next TP 4, 20 GiB (docs/unified-memory.md's table, exact accounting): 133 and 46 requests in the
    arena at 8k and 32k, beside SGLang's static 110 / 27 and the best static 134 / 46."""
    cli = cli_json(
        kvpools_exe, cli_env, "capacity", QWEN3_NEXT, "--tp-size", "4", "--memory", "20GiB",
        "--enable-unified-memory", "--context", "8k,32k", "--json",
    )  # fmt: skip
    api = ok(
        client.post(
            "/api/v1/capacity",
            json={
                "model": QWEN3_NEXT,
                "memory": "20GiB",
                "contexts": ["8k", "32k"],
                "serving": {"tp_size": 4, "enable_unified_memory": True},
            },
        )
    )
    assert api == cli
    assert [c["concurrent_requests"] for c in api["capacity"]] == [133, 46]
    assert [(m["static"], m["best_static"], m["unified"]) for m in api["modes"]] == [(110, 134, 133), (27, 46, 46)]
    assert api["arena"]["labels"]["mamba_slot_full_token_cost"] == 1_572


def test_unified_capacity_refuses_what_it_does_not_answer(client: Any) -> None:
    body = {
        "model": QWEN3_NEXT,
        "memory": "20GiB",
        "requests": 4,
        "serving": {"tp_size": 4, "enable_unified_memory": True},
    }
    error = refused(client.post("/api/v1/capacity", json=body))
    assert "--requests" in error["message"] and "not modelled" in error["message"], error
    gemma = {"model": "gemma-3-27b-it", "memory": "20GiB", "serving": {"enable_unified_memory": True}}
    error = refused(client.post("/api/v1/capacity", json=gemma))
    assert "this model is neither" in error["message"], error


def test_unified_compare_is_the_clis(client: Any, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    """``kvpools compare --enable-unified-memory --json``'s ``unified`` object through ``POST /api/v1/compare``:
    Qwen3-Next TP 4, 20 GiB, 8k: SGLang static 112, unified 135, vLLM 156 (docs/unified-memory.md)."""
    cli = cli_json(
        kvpools_exe, cli_env, "compare", QWEN3_NEXT, "--tp-size", "4", "--memory", "20GiB", "--context", "8k",
        "--enable-unified-memory", "--json",
    )  # fmt: skip
    api = ok(
        client.post(
            "/api/v1/compare",
            json={
                "model": QWEN3_NEXT,
                "memory": "20GiB",
                "tp_size": 4,
                "contexts": ["8k"],
                "enable_unified_memory": True,
            },
        )
    )
    assert api["unified"] == cli["unified"]
    row = api["unified"]["contexts"][0]
    assert (row["sglang_static"], row["sglang_unified"], row["vllm_requests"]) == (112, 135, 156)
    plain = ok(client.post("/api/v1/compare", json={"model": QWEN3_NEXT, "memory": "20GiB", "tp_size": 4}))
    assert "unified" not in plain
