"""``kvpools fit --accounting trtllm`` (issue 35): trtllm-serve configurations on the fewest GPUs, each planned by
the trtllm engine; hand-computed against docs/trtllm.md's Llama-3.1-70B example."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.engines.trtllm import plan_trtllm
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.planning.trtllm_fit import fit_trtllm
from kvpools_core.values import Serving


def test_llama_70b_on_four_h100() -> None:
    """TP 4 on h100 keeps 16,867 blocks of 32 tokens per rank (docs/trtllm.md, get_kv_cache_capacity); an
    8,192-token request holds 256 of them: 16867 // 256 = 65 requests, one engine of 4 GPUs holds 64 (headroom
    65/64). No configuration of fewer GPUs plans (TP 1 and TP 2 x PP 1 do not fit the weights or hold too little);
    fp8 KV holds about twice as many, so it ranks first."""
    result = fit_trtllm("llama-3.1-70b", 64, 8192, gpu="h100", max_gpus=4, kv_cache_dtype="auto")
    assert {f.gpus for f in result.fits} == {4}
    tp4 = next(f for f in result.fits if f.describe() == "TP 4 · kv auto")
    assert (tp4.replicas, tp4.requests_held, tp4.headroom) == (1, 65, 65 / 64)
    assert tp4.result.max_num_blocks == 16867
    both = fit_trtllm("llama-3.1-70b", 64, 8192, gpu="h100", max_gpus=4)
    fp8 = plan_trtllm("llama-3.1-70b", Serving(tp_size=4, kv_cache_dtype="fp8_e4m3"), gpu="h100", max_seq_len=8192)
    assert both.fits[0].describe() == "TP 4 · kv fp8" and both.fits[0].requests_held == fp8.concurrency_at(8192)


def test_replicas_when_one_engine_is_not_enough() -> None:
    """700 requests: one TP 4 fp8 engine holds fp8.concurrency_at(8192) of them; ceil(700 / that) replicas."""
    fp8 = plan_trtllm("llama-3.1-70b", Serving(tp_size=4, kv_cache_dtype="fp8_e4m3"), gpu="h100", max_seq_len=8192)
    held = fp8.concurrency_at(8192)
    result = fit_trtllm("llama-3.1-70b", 700, 8192, gpu="h100", max_gpus=32, kv_cache_dtype="fp8_e4m3")
    assert result.fits and result.fits[0].gpus <= -(-700 // held) * 4
    for found in result.fits:  # each holds the 700 with the fewest replicas of its engine
        per_engine = found.requests_held // found.replicas
        assert found.requests_held >= 700 > found.requests_held - per_engine


def test_a_model_trtllm_is_not_modelled_for_is_refused() -> None:
    with pytest.raises(UnsupportedCombinationError, match="kvpools does not model the falcon_h1 hybrid family"):
        fit_trtllm("falcon-h1-0.5b", 8, 8192, gpu="h100", max_gpus=8)


def test_deepseek_v4_configurations_are_skipped_with_trtllms_block_size_refusal() -> None:
    """DeepSeek-V4 is planned under --accounting trtllm (issue 35) but DeepseekV4CacheManager asserts
    tokens_per_block in [128, 256] and fit searches with TensorRT-LLM's default 32: every configuration whose
    weights fit is skipped with that refusal, none fits."""
    found = fit_trtllm("deepseek-v4-flash", 8, 8192, gpu="h100", max_gpus=8)
    assert not found.fits
    assert any("TensorRT-LLM refuses --tokens_per_block N" in reason for reason in found.skipped)


def test_cli_fit_trtllm() -> None:
    runner = CliRunner()
    shown = runner.invoke(main, ["fit", "llama-3.1-70b", "--requests", "64", "--context", "8k", "--gpu", "h100",
                                 "--max-gpus", "4", "--accounting", "trtllm", "--kv-cache-dtype", "auto",
                                 "--json"])  # fmt: skip
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert data["engine"] == "trtllm" and {f["gpus"] for f in data["fits"]} == {4}
    first = next(f for f in data["fits"] if (f["tp_size"], f["pp_size"], f["enable_attention_dp"]) == (4, 1, False))
    assert first["kv_cache_capacity"] == {"maxNumBlocks": 16867, "tokensPerBlock": 32, "maxNumTokens": 539744}
    assert "--max_seq_len 8192" in first["launch"]
    refused = runner.invoke(main, ["fit", "llama-3.1-70b", "--requests", "64", "--context", "8k", "--gpu", "h100",
                                   "--accounting", "trtllm", "--page-size", "32"])  # fmt: skip
    assert refused.exit_code == 1 and "--page-size belongs to SGLang's launch, not to fit --accounting trtllm" in (
        refused.output
    )
    vllm = runner.invoke(main, ["fit", "llama-3.1-70b", "--requests", "64", "--context", "8k", "--gpu", "h100",
                                "--accounting", "vllm"])  # fmt: skip
    assert vllm.exit_code != 0 and "vllm" in vllm.output
