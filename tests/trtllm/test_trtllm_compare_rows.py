"""``kvpools compare``: TensorRT-LLM beside SGLang and vLLM in each layer-group row (issue 35)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.planning.compare import compare_engines
from kvpools_core.values import Serving


def test_llama_70b_tp4_three_engines_per_row() -> None:
    """The issue's check: ``kvpools compare llama-3.1-70b --gpu h100 --tp-size 4`` prints three engines.  The full
    row carries TensorRT-LLM's pool: 2 x 80 x 2 x 128 x 2 B = 81,920 B per token (the same as SGLang's and vLLM's
    row), 16,867 blocks of 32 tokens = 539,744 tokens (docs/trtllm.md's worked example)."""
    comparison = compare_engines("llama-3.1-70b", Serving(tp_size=4), gpu="h100")
    (row,) = comparison.groups
    assert row.sglang_bytes_per_unit == row.vllm_bytes_per_token == row.trtllm_bytes_per_token == 81_920
    assert (row.trtllm_windows, row.trtllm_blocks, row.trtllm_layers) == ((131_072,), (16_867,), 80)
    assert row.trtllm_tokens == 16_867 * 32 == 539_744
    assert any(line.startswith("TensorRT-LLM: one pool of its own") for line in row.why)
    shown = CliRunner().invoke(
        main, ["compare", "llama-3.1-70b", "--gpu", "h100", "--tp-size", "4"], terminal_width=250
    )
    assert shown.exit_code == 0, shown.output
    header = shown.stdout.splitlines()[0]
    assert "SGLang" in header and "vLLM" in header and "TensorRT-LLM" in header
    assert "full attention: TensorRT-LLM: one pool of its own" in shown.stdout and "539,744 tokens" in shown.stdout


def test_gpt_oss_rows_say_where_trtllm_puts_the_sliding_layers() -> None:
    """gpt-oss-120b, 40 GiB: TensorRT-LLM's V1 manager keeps one pool of all 36 layers (2 x 36 x 8 x 64 x 2 B =
    73,728 B per token; 0.9 x 40 GiB // 73,728 // 32 = 16,384 blocks) in the full row; the sliding row has no
    TensorRT-LLM pool and says why."""
    data = json.loads(CliRunner().invoke(main, ["compare", "gpt-oss-120b", "--memory", "40GiB", "--json"]).stdout)
    full, window = data["groups"]
    assert (full["token_space"], full["trtllm_bytes_per_token"], full["trtllm_blocks"]) == ("full", 73_728, [16_384])
    assert 38_654_705_664 // 73_728 // 32 == 16_384
    assert any("18 of those layers are sliding-window layers" in line for line in full["why"])
    assert window["trtllm_windows"] == [] and window["trtllm_tokens"] is None
    assert any("unless kv_cache_config.max_attention_window is given" in line for line in window["why"])


def test_dsa_row_agrees_across_three_engines() -> None:
    """DeepSeek-V3.2: SGLang's, vLLM's and TensorRT-LLM's MLA + indexer row all cost 61 x (576 x 2 + 132) =
    78,324 B per token; TensorRT-LLM's 0.9 x 40 GiB // 78,324 // 32 = 15,422 blocks."""
    data = json.loads(CliRunner().invoke(main, ["compare", "deepseek-v3.2", "--memory", "40GiB", "--json"]).stdout)
    (row,) = data["groups"]
    assert row["sglang_bytes_per_unit"] == row["vllm_bytes_per_token"] == row["trtllm_bytes_per_token"] == 78_324
    assert row["trtllm_blocks"] == [15_422] and data["trtllm_refusal"] is None
