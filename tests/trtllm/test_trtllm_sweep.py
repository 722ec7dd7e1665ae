"""``kvpools sweep --accounting trtllm`` (issue 35): one row per point, each the trtllm engine's plan."""

from __future__ import annotations

import json

from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.planning.trtllm_sweep import sweep_trtllm


def test_rows_by_hand() -> None:
    """llama-3.1-8b, 10 GiB free after warm-up: 0.9 x 10 GiB = 9,663,676,416 B over 32-token blocks of
    131,072 B per token (4,194,304 B) = 2,304 blocks, 73,728 tokens; an 8,192-token request holds 256 blocks: 9.
    deepseek-v4-flash is a row with TensorRT-LLM's refusal of 32-token blocks (DeepseekV4CacheManager), not an abort."""
    rows = sweep_trtllm(
        ["llama-3.1-8b", "deepseek-v4-flash"], budgets=[{"memory": "10GiB"}], contexts=["8k"], tp_sizes=[1]
    )
    assert rows[0] == {
        "model": "llama-3.1-8b",
        "tp_size": 1,
        "kv_cache_dtype": "auto",
        "budget": "memory=10GiB",
        "tokens_per_block": 32,
        "max_num_blocks": 2304,
        "max_kv_tokens": 73728,
        "max_batch_size": 2048,
        "requests@8192": 9,
        "error": None,
    }
    assert "TensorRT-LLM refuses --tokens_per_block 32" in rows[1]["error"]


def test_cli_sweep_trtllm() -> None:
    runner = CliRunner()
    shown = runner.invoke(main, ["sweep", "--model", "llama-3.1-70b", "--tp-size", "4", "--gpu", "h100",
                                 "--context", "8k", "--accounting", "trtllm", "--format", "json"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    (row,) = json.loads(shown.output)
    assert (row["max_num_blocks"], row["requests@8192"]) == (16867, 16867 // 256)  # docs/trtllm.md
    refused = runner.invoke(main, ["sweep", "--model", "llama-3.1-8b", "--memory", "10GiB", "--accounting", "trtllm",
                                   "--axis", "dp_size=1,2"])  # fmt: skip
    assert refused.exit_code == 1 and "--axis: kvpools does not model it for sweep --accounting trtllm yet" in (
        refused.output
    )
    vllm = runner.invoke(main, ["sweep", "--model", "llama-3.1-8b", "--memory", "10GiB", "--accounting", "vllm"])
    assert vllm.exit_code == 1 and "kvpools does not sweep --accounting vllm yet" in vllm.output
