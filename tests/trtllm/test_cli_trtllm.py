"""``kvpools plan`` / ``kvpools capacity`` under ``--accounting trtllm``: TensorRT-LLM's option names accepted there
only, SGLang's refused naming TensorRT-LLM's, the ``trtllm-serve`` line, JSON fields (issue 35)."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner

from kvpools_core.cli import main

GiB = 1 << 30


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_plan_json_names_trtllm_fields() -> None:
    result = cli("plan", "llama-3.1-70b", "--accounting", "trtllm", "--memory", "40GiB", "--tp-size", "4", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # 40 GiB x 0.9 // (2 x 80 x 2 x 128 x 2 B) = 471859 tokens // 32 = 14745 blocks
    assert data["kv_cache_capacity"] == {"maxNumBlocks": 14745, "tokensPerBlock": 32, "maxNumTokens": 471840}
    assert data["accounting"] == "trtllm" and data["trtllm_version"] == "1.2.1"
    assert data["serve_command"] == (
        "trtllm-serve meta-llama/Meta-Llama-3.1-70B --backend pytorch --tp_size 4 --pp_size 1 --max_batch_size 2048 "
        "--max_num_tokens 8192 --max_seq_len 131072 --kv_cache_free_gpu_memory_fraction 0.9 "
        "--extra_llm_api_options kvpools-trtllm.yaml"
    )


def test_trtllm_option_names() -> None:
    result = cli(
        "plan",
        "llama-3.1-70b",
        "--accounting",
        "trtllm",
        "--memory",
        "40GiB",
        "--tp-size",
        "4",
        "--kv_cache_free_gpu_memory_fraction",
        "0.5",
        "--tokens_per_block",
        "64",
        "--max_batch_size",
        "256",
        "--max_num_tokens",
        "4096",
        "--max_seq_len",
        "32768",
        "--kv-cache-dtype",
        "fp8_e4m3",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # fp8: 40960 B/token; 40 GiB x 0.5 // 40960 = 524288 tokens // 64 = 8192 blocks
    assert data["kv_cache_capacity"]["maxNumBlocks"] == 8192
    assert data["extra_llm_api_options"] == {"kv_cache_config": {"tokens_per_block": 64, "dtype": "fp8"}}
    assert "--max_batch_size 256 --max_num_tokens 4096 --max_seq_len 32768" in data["serve_command"]
    assert "--kv_cache_free_gpu_memory_fraction 0.5" in data["serve_command"]


def test_trtllm_options_only_with_trtllm_accounting() -> None:
    result = cli("plan", "llama-3.1-8b", "--memory", "10GiB", "--max_batch_size", "8")
    assert result.exit_code == 1
    assert "--max_batch_size is TensorRT-LLM's: only with --accounting trtllm" in result.stderr
    vllm = cli("plan", "llama-3.1-8b", "--accounting", "vllm", "--memory", "10GiB", "--tokens_per_block", "64")
    assert vllm.exit_code == 1 and "--tokens_per_block is TensorRT-LLM's" in vllm.stderr


def test_sglang_and_vllm_options_refused_under_trtllm() -> None:
    sglang = cli("plan", "llama-3.1-8b", "--accounting", "trtllm", "--memory", "10GiB", "--mem-fraction-static", "0.8")
    assert sglang.exit_code == 1
    assert "use --kv_cache_free_gpu_memory_fraction" in sglang.stderr and "FREE AFTER" in sglang.stderr
    vllm = cli("plan", "llama-3.1-8b", "--accounting", "trtllm", "--memory", "10GiB", "--block-size", "32")
    assert vllm.exit_code == 1 and "--block-size is vLLM's" in vllm.stderr
    free = cli("plan", "llama-3.1-8b", "--accounting", "trtllm", "--free-memory", "10GiB")
    assert free.exit_code == 1 and "--free-memory belongs to SGLang's planning" in free.stderr


def test_refusal_reaches_the_user_without_traceback() -> None:
    result = cli("plan", "deepseek-v4-flash", "--accounting", "trtllm", "--memory", "40GiB")
    assert result.exit_code == 1
    assert (
        "TensorRT-LLM refuses --tokens_per_block 32" in result.stderr and "Pass --tokens_per_block 128" in result.stderr
    )
    assert "Traceback" not in result.output


def test_capacity_vswa_table() -> None:
    result = cli(
        "capacity",
        "gpt-oss-120b",
        "--accounting",
        "trtllm",
        "--memory",
        "40GiB",
        "--max_attention_window",
        "128,131072",
        "--context",
        "8k,128k",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    blocks = int(40 * GiB * 0.9 * 0.5 / 36864) // 32  # 16383 per window pool
    assert [pool["primary_blocks"] for pool in data["pools"]] == [blocks, blocks]
    # 8192 tokens: the full pool needs 256 blocks, the 128 window 4 -> 16383 // 256 = 63 requests
    assert data["capacity"] == [
        {"context_len": 8192, "max_requests": blocks // 256},
        {"context_len": 131072, "max_requests": blocks // 4096},
    ]
    table = cli("capacity", "gpt-oss-120b", "--accounting", "trtllm", "--memory", "40GiB", "--context", "8k")
    assert table.exit_code == 0, table.output
    assert "--max_attention_window 128,131072" in table.stdout.replace("\n", " ").replace("  ", " ")


def test_compare_shows_the_third_engine() -> None:
    """Issue 35's check: `kvpools compare llama-3.1-70b --gpu h100 --tp-size 4` prints three engines.
    TensorRT-LLM: (H100 torch total - weights - MLP activation) x 0.9 // 81,920 B // 32 -- the same 16,867 blocks
    `kvpools plan --accounting trtllm` gives; 131,072-token requests need 4,096 blocks: 4 of them."""
    result = cli("compare", "llama-3.1-70b", "--gpu", "h100", "--tp-size", "4", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["sglang"] is not None and data["vllm"] is not None
    assert data["trtllm"]["kv_cache_capacity"] == {
        "maxNumBlocks": 16867,
        "tokensPerBlock": 32,
        "maxNumTokens": 539744,
    }
    assert data["contexts"][0]["trtllm_requests"] == 16867 // 4096
    table = cli("compare", "llama-3.1-70b", "--gpu", "h100", "--tp-size", "4")
    assert table.exit_code == 0, table.output
    assert "TensorRT-LLM flags" in table.stdout and "trtllm-serve meta-llama/Meta-Llama-3.1-70B" in table.stdout
    refused = cli("compare", "deepseek-v4-flash", "--memory", "40GiB", "--json")
    assert refused.exit_code == 0, refused.output
    refused_data = json.loads(refused.stdout)
    assert refused_data["trtllm"] is None
    assert "TensorRT-LLM refuses --tokens_per_block 32" in refused_data["trtllm_refusal"]
