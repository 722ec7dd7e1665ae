"""DeepSeek-V4 under ``--accounting vllm``: vLLM 0.33's pages, packed groups and blocks by hand, and its refusals.

The differential check against vLLM's own layers and planner is ``tests/vllm/test_differential.py``
(``test_dsv4_specs_equal_vllm``, ``test_dsv4_plans_equal_vllm``); here the same numbers are worked out by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.engines.vllm import (
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    UniformTypeKVCacheSpecs,
    VllmLimits,
    plan_kv_cache,
)
from kvpools_core.engines.vllm.model import worker_kv_cache_specs
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.models import load_model
from kvpools_core.parts.vllm.specs import cdiv, round_up
from kvpools_core.registry import Registry
from kvpools_core.values import Serving

GiB = 1 << 30
ROW, ALIGN = 584, 576
"""An fp8_ds_mla row (448 fp8 nope + 64 x 2 bf16 rope + 8 scale bytes) and its page alignment."""


def _flash(registry: Registry, **serving: object) -> dict[str, object]:
    model, _ = load_model("deepseek-v4-flash", registry)
    (worker,) = worker_kv_cache_specs(model, Serving(**serving), registry)  # type: ignore[arg-type]
    return worker


def test_flash_pages_by_hand(registry: Registry) -> None:
    """Block 256 for the latents and indexer keys, 64 for the SWA cache, 4 / 8 for the compressor states; every page
    rounded up to 576 bytes."""
    worker = _flash(registry)
    c4_latent = round_up(256 // 4 * ROW, ALIGN)  # 37376 -> 37440
    c128_latent = round_up(256 // 128 * ROW, ALIGN)  # 1168 -> 1728
    indexer = round_up(256 // 4 * (128 + 128 // 128 * 4), ALIGN)  # 8448 -> 8640
    swa = round_up(64 * ROW, ALIGN)  # 37376 -> 37440
    c4_state = round_up(4 * (2 * 2 * 512) * 4, ALIGN)  # 32768 -> 32832
    c4_indexer_state = round_up(4 * (2 * 2 * 128) * 4, ALIGN)  # 8192 -> 8640
    c128_state = round_up(8 * (2 * 1 * 512) * 4, ALIGN)  # 32768 -> 32832
    assert (c4_latent, c128_latent, indexer, swa, c4_state, c4_indexer_state, c128_state) == (
        37440,
        1728,
        8640,
        37440,
        32832,
        8640,
        32832,
    )
    pages = {name: spec.page_size_bytes for name, spec in worker.items()}  # type: ignore[attr-defined]
    assert pages["model.layers.0.attn.swa_cache"] == swa
    assert "model.layers.0.attn" not in pages  # an SWA-only layer's attention has no cache of its own
    assert pages["model.layers.2.attn"] == c4_latent
    assert pages["model.layers.2.attn.indexer.k_cache"] == indexer
    assert pages["model.layers.2.attn.indexer.compressor.state_cache"] == c4_indexer_state
    assert pages["model.layers.2.attn.compressor.state_cache"] == c4_state
    assert pages["model.layers.3.attn"] == c128_latent
    assert pages["model.layers.3.attn.compressor.state_cache"] == c128_state
    assert len(worker) == 43 + 21 * 4 + 20 * 2  # SWA cache per layer; c4: 4 caches more; c128: 2 more


def test_flash_blocks_by_hand(registry: Registry) -> None:
    """10 GiB, 1M tokens, 2048 batched tokens x 2 in flight.  V4-Flash has 2 SWA-only, 21 c4 and 20 c128 layers.

    BLHNC packs uniform-type buckets: the 43 SWA caches (balanced, one page size), the 62 latents + indexer keys
    (unbalanced: one group), the 21 + 21 c4 states (balanced, two page sizes: at least 21 repeats per group), the
    20 c128 states.  ``_approximate_gcd([43, 21, 20], >= 21)`` is 22 (padding 1 + 1 + 2), so the SWA caches split
    into 22 + 21 layers.  The widest group is the latents': 21 x 8640 + 21 x 37440 + 20 x 1728 = 1,002,240 bytes.
    """
    worker = _flash(registry)
    bytes_per_block = 21 * 8640 + 21 * 37440 + 20 * 1728
    budget = 10 * GiB
    limits = VllmLimits(max_model_len=1 << 20, max_num_batched_tokens=2048, max_concurrent_batches=2)
    plan = plan_kv_cache([worker], [budget], limits)  # type: ignore[list-item]
    assert plan.kv_cache_layout == "BLHNC"
    assert [len(group.layer_names) for group in plan.groups] == [22, 21, 62, 42, 20]
    assert all(isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs) for group in plan.groups)
    assert plan.page_sizes == (22 * 37440, 21 * 37440, bytes_per_block, 21 * 32832 + 21 * 8640, 20 * 32832)
    assert plan.block_sizes == (64, 64, 256, 4, 8)
    assert plan.bytes_per_block == (bytes_per_block,) == (1_002_240,)
    num_blocks = budget // bytes_per_block
    assert plan.num_gpu_blocks == num_blocks == 10713
    in_flight = 2 * 2048
    full = cdiv(1 << 20, 256)  # 4096
    swa = cdiv(128 - 1 + in_flight, 64) + 1  # 67, in each of the two SWA groups
    c4_state = cdiv(8 - 1 + in_flight, 4) + 1  # window 2 x 4: 1027
    c128_state = cdiv(128 - 1 + in_flight, 8) + 1  # window 128: 529
    per_request = full + 2 * swa + c4_state + c128_state
    assert plan.blocks_per_request == per_request == 5786
    assert plan.max_concurrency == num_blocks / per_request
    assert plan.kv_cache_size_tokens == int(num_blocks / per_request * (1 << 20)) == 1_941_478


def test_tp_does_not_change_the_specs(registry: Registry) -> None:
    """One latent head on every rank (``max_tp_shards=1``): TP 1 and TP 8 build the same caches."""
    assert _flash(registry, tp_size=1) == _flash(registry, tp_size=8)


@pytest.mark.parametrize(
    ("serving", "message"),
    [
        ({"kv_cache_dtype": "bf16"}, "fp8_ds_mla layout only supports fp8 kv-cache, got bf16"),
        ({"tp_size": 3}, "asserts num_attention_heads (64) % tensor-parallel size == 0"),
        ({"platform": "rocm"}, "is modelled on CUDA only"),
    ],
)
def test_refusals_name_the_fix(registry: Registry, serving: dict[str, object], message: str) -> None:
    with pytest.raises(UnsupportedCombinationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _flash(registry, **serving)


def test_block_size_other_than_256_is_refused(registry: Registry) -> None:
    model, _ = load_model("deepseek-v4-flash", registry)
    with pytest.raises(UnsupportedCombinationError, match="Padded KV pages do not support kernel block splitting"):
        worker_kv_cache_specs(model, Serving(), registry, block_size=512)
    (worker,) = worker_kv_cache_specs(model, Serving(), registry, block_size=256)
    assert isinstance(worker["model.layers.2.attn"], MLAAttentionSpec)
    assert isinstance(worker["model.layers.2.attn.swa_cache"], SlidingWindowMLASpec)


def test_cli_plan_serves_block_256() -> None:
    result = CliRunner().invoke(
        main,
        ["plan", "deepseek-v4-flash", "--accounting", "vllm", "--memory", "10GiB", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["num_gpu_blocks"] == 10713
    assert (data["block_size"], data["block_size_requested"]) == (256, 16)
    assert "--block-size 256 " in data["serve_command"]


def test_cpu_offload_of_packed_caches_is_refused() -> None:
    result = CliRunner().invoke(
        main,
        ["plan", "deepseek-v4-flash", "--accounting", "vllm", "--memory", "10GiB", "--kv-offloading-size", "10"],
    )
    assert result.exit_code == 1
    assert "--kv-offloading-size with the BLHNC KV-cache layout" in result.output
    assert "Traceback" not in result.output


def test_compare_plans_both_engines() -> None:
    """``kvpools compare`` sets vLLM's plan beside SGLang's; the packed groups of mixed block sizes have no single
    bytes per token, and the row says so."""
    result = CliRunner().invoke(
        main, ["compare", "deepseek-v4-flash", "--memory", "40GiB", "--page-size", "256", "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["vllm_refusal"] is None
    assert data["vllm"]["num_gpu_blocks"] == (40 * GiB) // 1_002_240
    assert data["vllm"]["block_size"] == 256


def test_mtp_draft_config_is_refused(registry: Registry) -> None:
    from kvpools_core.models import parse_config

    presets = Path(__file__).parents[2] / "plugins" / "dsv4" / "presets"
    config = json.loads((presets / "deepseek-v4-flash.json").read_text())
    config["architectures"] = ["DeepseekV4ForCausalLMNextN"]
    model, _ = parse_config(config, "nextn", registry)
    with pytest.raises(UnsupportedCombinationError, match="is a draft \\(MTP\\) model"):
        worker_kv_cache_specs(model, Serving(), registry)
