"""The capacity record under ``--accounting trtllm`` (issue 35): the record's fields with TensorRT-LLM's meanings,
checked against the record's JSON Schema and the hand-computed numbers of docs/trtllm.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.planning.capacity_record import trtllm_capacity_document
from kvpools_core.values import Serving
from tests.capacity.test_capacity_record import validate

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "capacity-record.schema.json").read_text())
LLAMA70_TP4 = 2 * 80 * 2 * 128 * 2
"""llama-3.1-70b per token on one of 4 TP ranks: K+V x 80 layers x ceil(8/4) heads x 128 x 2 B = 81,920 B."""


def _cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_llama_70b_tp4_record() -> None:
    """docs/trtllm.md's worked example (h100, TP 4): get_kv_cache_capacity() = {maxNumBlocks: 16867,
    tokensPerBlock: 32, maxNumTokens: 539744}; an 8,192-token request holds 8192 / 32 = 256 blocks, so
    16867 // 256 = 65 requests, below max_batch_size 2048: the full pool binds."""
    result = plan_trtllm("llama-3.1-70b", Serving(tp_size=4), gpu="h100")
    document = trtllm_capacity_document(result, context_len=8192)
    assert validate(document, SCHEMA) == []
    records = document["records"]
    assert [(r["tp_rank"], r["attn_tp_rank"], r["dp_rank"]) for r in records] == [(t, t, 0) for t in range(4)]
    record = records[0]
    assert (record["engine"], record["accounting"], record["block_size"]) == ("trtllm", "trtllm", 32)
    assert (record["total_kv_blocks"], record["max_total_num_tokens"]) == (16867, 539744)
    assert (record["max_concurrency"], record["binding"], record["binding_group"]) == (65, "full tokens", "full")
    assert record["gpu_kv_bytes"] == 16867 * 32 * LLAMA70_TP4
    assert record["budget"]["budget_bytes"] == result.ranks[0].available_kv_memory >= record["gpu_kv_bytes"]
    assert record["trtllm"]["kv_cache_capacity"] == {
        "maxNumBlocks": 16867,
        "tokensPerBlock": 32,
        "maxNumTokens": 539744,
    }
    assert record["trtllm"]["bytes_per_token"] == LLAMA70_TP4


def test_vswa_record_has_one_group_per_window() -> None:
    """gpt-oss-120b under VSWA (max_attention_window 128,131072): a window_128 group whose request holds
    ceil(128 / 32) = 4 blocks and a full group; get_kv_cache_capacity() is not reproduced for VSWA (null)."""
    result = plan_trtllm("gpt-oss-120b", Serving(), memory="40GiB", max_attention_window="128,131072")
    document = trtllm_capacity_document(result, context_len=8192)
    assert validate(document, SCHEMA) == []
    record = document["records"][0]
    groups = {group["name"]: group for group in record["groups"]}
    assert set(groups) == {"window_128", "full"}
    assert (groups["window_128"]["blocks_per_request"], groups["full"]["blocks_per_request"]) == (4, 256)
    assert record["max_concurrency"] == result.concurrency_at(8192)
    assert record["trtllm"]["kv_cache_capacity"] is None


def test_refusals() -> None:
    result = plan_trtllm("llama-3.1-8b", Serving(), memory="40GiB", max_seq_len=4096)
    with pytest.raises(ConfigError, match="longer than the deployment's max_seq_len 4096"):
        trtllm_capacity_document(result, context_len=8192)
    vswa = plan_trtllm("gpt-oss-120b", Serving(pp_size=2), memory="40GiB", max_attention_window="128,131072")
    with pytest.raises(UnsupportedCombinationError, match="VSWA or hybrid pools over pipeline stages"):
        trtllm_capacity_document(vswa)


def test_plan_format_capacity_json_under_trtllm() -> None:
    result = _cli(
        "plan", "llama-3.1-70b", "--accounting", "trtllm", "--gpu", "h100", "--tp-size", "4",
        "--format", "capacity-json", "--context", "8k",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["context_len"] == 8192 and document["records"][0]["max_concurrency"] == 16867 // 256 == 65
