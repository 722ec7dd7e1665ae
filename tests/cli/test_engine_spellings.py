"""The engines' own spellings of a KV dtype work on the command line: a user pastes ``vllm serve`` flags."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main


def _plan(*args: str) -> dict:
    result = CliRunner().invoke(main, ["plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize(
    ("spelling", "canonical"), [("fp8", "fp8_e4m3"), ("bfloat16", "bf16"), ("float16", "fp16"), ("FP8", "fp8_e4m3")]
)
def test_vllm_spelling_plans_as_the_canonical_dtype(spelling: str, canonical: str) -> None:
    """vLLM's ``--kv-cache-dtype fp8`` is fp8_e4m3 on CUDA (``CacheDType``, vllm/config/cache.py): 1 B per element,
    so Llama-3.1-8B's 32 layers x 8 KV heads x 128 x 2 (K and V) = 65,536 B per token."""
    given = _plan("llama-3.1-8b", "--memory", "20GiB", "--kv-cache-dtype", spelling)
    named = _plan("llama-3.1-8b", "--memory", "20GiB", "--kv-cache-dtype", canonical)
    assert given["plan"]["serving"]["kv_cache_dtype"] == canonical
    assert given["max_total_num_tokens"] == named["max_total_num_tokens"]
    if canonical == "fp8_e4m3":
        assert given["bytes_per_token"] == 32 * 8 * 128 * 2 == 65_536


def test_vllm_spelling_under_vllm_accounting() -> None:
    given = _plan("llama-3.1-8b", "--accounting", "vllm", "--memory", "20GiB", "--kv-cache-dtype", "fp8")
    named = _plan("llama-3.1-8b", "--accounting", "vllm", "--memory", "20GiB", "--kv-cache-dtype", "fp8_e4m3")
    assert given["num_gpu_blocks"] == named["num_gpu_blocks"] > 0


def test_an_unknown_spelling_names_the_choices() -> None:
    result = CliRunner().invoke(main, ["plan", "llama-3.1-8b", "--memory", "20GiB", "--kv-cache-dtype", "fp9"])
    assert result.exit_code == 2
    assert "--kv-cache-dtype" in result.output and "fp8_e4m3" in result.output and "Traceback" not in result.output
