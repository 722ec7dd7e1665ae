"""vLLM 0.33's CPU KV offload (``--kv-offloading-size``) against hand-computed ``CPUOffloadingSpec`` numbers.

``num_cpu_blocks = int(S x 2^30) // round_up(bytes_per_block x copies, 4096)``, ``copies`` the TP x PP workers
(one for an MLA model replicated over TP): ``v1/kv_offload/cpu/spec.py`` L97-130.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.engines.vllm import plan_vllm
from kvpools_core.errors import ConfigError, InsufficientMemoryError, UnsupportedCombinationError
from kvpools_core.values import Serving

GiB = 1 << 30
LLAMA_BLOCK = 32 * 16 * 8 * 128 * 2 * 2
"""llama-3.1-8b, one block: 32 layers x 16 tokens x 8 KV heads x 128 x (K + V) x 2 B = 2 MiB."""
NODE = "1TiB"


def test_llama_16_gib_by_hand() -> None:
    result = plan_vllm("llama-3.1-8b", memory="40GiB", kv_offloading_size=16, host_memory=NODE)
    offload = result.offload
    assert offload is not None
    assert offload.worker_kv_bytes_per_block == LLAMA_BLOCK == 2 * 1024**2
    assert offload.cpu_bytes_to_use == 16 * GiB
    assert offload.num_cpu_blocks == 16 * GiB // LLAMA_BLOCK == 8192
    assert offload.host_tokens == 8192 * 16 == 131072
    assert offload.bytes_per_rank == offload.region_bytes == 16 * GiB
    assert "--kv-offloading-size 16 --kv-offloading-backend native" in result.serve_command()


def test_tp_shares_the_size_and_splits_the_block() -> None:
    # TP 2: each worker's block is half (4 KV heads); the chunk holds both workers' halves: the same 2 MiB.
    result = plan_vllm("llama-3.1-8b", Serving(tp_size=2), memory="40GiB", kv_offloading_size=16, host_memory=NODE)
    offload = result.offload
    assert offload is not None
    assert offload.worker_kv_bytes_per_block == LLAMA_BLOCK // 2
    assert offload.num_copies == 2 and offload.num_cpu_blocks == 8192
    assert offload.bytes_per_rank == 8192 * (LLAMA_BLOCK // 2) == 8 * GiB
    assert offload.region_bytes == 16 * GiB


def test_hybrid_sliding_window_model_by_hand() -> None:
    # gpt-oss-20b at TP 2: 12 full + 12 sliding layers, a layer's page 16 x 4 KV heads x 64 x 2 x 2 B = 16 KiB;
    # a block is the widest group's 12 pages = 196,608 B per worker; two workers: 393,216 B (96 x 4 KiB).
    result = plan_vllm("gpt-oss-20b", Serving(tp_size=2), memory="20GiB", kv_offloading_size=16, host_memory=NODE)
    offload = result.offload
    assert offload is not None
    assert result.plan.bytes_per_block == (12 * 16 * 4 * 64 * 2 * 2,) == (196608,)
    assert offload.aligned_kv_bytes_per_chunk == offload.kv_bytes_per_chunk == 393216
    assert offload.num_cpu_blocks == 16 * GiB // 393216 == 43690
    assert offload.region_bytes == 43690 * 393216 < 16 * GiB


def test_mla_over_tp_keeps_one_page_aligned_copy() -> None:
    # deepseek-v3 at TP 8: every rank holds the same latent, 16 x 61 x 576 x 2 B = 1,124,352 B per block, one copy
    # (replicated_layout), page aligned to 1,126,400 B.
    result = plan_vllm("deepseek-v3", Serving(tp_size=8), memory="40GiB", kv_offloading_size=16, host_memory=NODE)
    offload = result.offload
    assert offload is not None
    assert offload.replicated_layout and offload.num_copies == 1
    assert offload.worker_kv_bytes_per_block == 16 * 61 * 576 * 2 == 1124352
    assert offload.aligned_kv_bytes_per_chunk == 275 * 4096 == 1126400
    assert offload.num_cpu_blocks == 16 * GiB // 1126400 == 15252
    assert offload.bytes_per_rank == 15252 * 1124352


def test_the_node_check_and_what_fits() -> None:
    with pytest.raises(InsufficientMemoryError) as refused:
        plan_vllm("llama-3.1-8b", memory="40GiB", kv_offloading_size=16, host_memory="10GiB")
    text = str(refused.value)
    assert f"{16 * GiB:,} B" in text and "kv_offloading_size 10 (GiB) fits" in text
    fits = plan_vllm("llama-3.1-8b", memory="40GiB", kv_offloading_size=10, host_memory="10GiB").offload
    assert fits is not None and fits.region_bytes <= 10 * GiB
    with pytest.raises(InsufficientMemoryError):
        plan_vllm("llama-3.1-8b", memory="40GiB", kv_offloading_size=10, host_memory="10GiB", host_reserve="1GiB")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"kv_offloading_size": 0}, ConfigError, "positive size in GiB"),
        ({"kv_offloading_size": 0.001}, ConfigError, "holds no block"),
        ({"kv_offloading_size": 4, "kv_offloading_backend": "lmcache"}, UnsupportedCombinationError, "LMCache"),
        ({"host_memory": "1TiB"}, ConfigError, "only exists with kv_offloading_size"),
    ],
)
def test_refusals_name_the_flag(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        plan_vllm("llama-3.1-8b", memory="40GiB", **{"host_memory": NODE, **kwargs})


def test_rocm_is_refused() -> None:
    with pytest.raises(UnsupportedCombinationError, match="shared pinned region"):
        plan_vllm("llama-3.1-8b", Serving(platform="rocm"), memory="40GiB", kv_offloading_size=4, host_memory=NODE)


def test_cli_json_and_report() -> None:
    args = ["plan", "llama-3.1-8b", "--accounting", "vllm", "--memory", "40GiB", "--kv-offloading-size", "16"]
    out = CliRunner().invoke(main, [*args, "--host-memory", NODE, "--json"])
    assert out.exit_code == 0, out.output
    offload = json.loads(out.output)["kv_offloading"]
    assert offload["num_cpu_blocks"] == 8192 and offload["host_tokens"] == 131072
    assert offload["memory"]["available_bytes"] == 1024**4 and offload["memory"]["reserve_bytes"] == 0
    text = CliRunner().invoke(main, [*args, "--host-memory", NODE])
    assert text.exit_code == 0, text.output
    assert "num_cpu_blocks: 8,192" in text.output and "absolute budget for the engine" in text.output
    refused = CliRunner().invoke(main, [*args, "--host-memory", "4GiB"])
    assert refused.exit_code == 1 and "--kv-offloading-size" in refused.output and "Traceback" not in refused.output
    sglang = CliRunner().invoke(main, ["plan", "llama-3.1-8b", "--memory", "40GiB", "--kv-offloading-size", "16"])
    assert sglang.exit_code == 1 and "only with --accounting vllm" in sglang.output
