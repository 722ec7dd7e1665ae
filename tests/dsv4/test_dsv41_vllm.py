"""DeepSeek-V4.1 under ``--accounting vllm``: vLLM 0.33's ``DeepseekV41ForCausalLM`` caches, groups and blocks by hand,
and its refusals.

The differential check against vLLM's own ``deepseek_v41`` layers and planner is ``tests/vllm/test_differential.py``
(``test_dsv41_specs_equal_vllm``, ``test_dsv41_plans_equal_vllm``); here the same numbers are worked out by hand from
vLLM 0.33.0's sources (line numbers theirs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.engines.vllm import (
    CircularBufferSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    UniformTypeKVCacheSpecs,
    VllmLimits,
    plan_kv_cache,
)
from kvpools_core.engines.vllm.model import worker_kv_cache_specs
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.models import parse_config
from kvpools_core.parts.vllm.specs import cdiv, round_up
from kvpools_core.registry import Registry
from kvpools_core.values import PlatformTraits, Serving

GiB = 1 << 30
ROW, ALIGN = 584, 576
"""DeepSeek-V4's fp8_ds_mla row, which V4.1 keeps off SM100 (deepseek_v41/attention.py L133-140, L522-531)."""
CONFIG = Path(__file__).parent / "configs" / "dsv41_vllm_synthetic.json"
"""8 layers, ratios 0 1 1 2 2 1 0 0 (+ MTP 0); kv sources 1, 3, 5; index sources 1, 2, 3, 5."""


def _config(**changes: Any) -> dict[str, Any]:
    return {**json.loads(CONFIG.read_text()), **changes}


def _worker(registry: Registry, config: dict[str, Any] | None = None, **serving: Any) -> dict[str, Any]:
    model, _ = parse_config(config or _config(), "dsv41", registry)
    (worker,) = worker_kv_cache_specs(model, Serving(**serving), registry)
    return worker


def test_pages_by_hand(registry: Registry) -> None:
    """Block 64 (FlashMLA's and the indexer's SM90 kernel block, sparse_mla.py L115-116, indexer.py L365-366) for the
    kv sources' latents and indexer keys, 32 for the SWA caches (attention.py L569), 8 rows for the ratio-2 ring
    (compressor.py L221-223); the attention pages rounded up to 576 bytes, the ring not (no alignment)."""
    worker = _worker(registry)
    c1_latent = round_up(64 // 1 * ROW, ALIGN)  # 37376 -> 37440
    c2_latent = round_up(64 // 2 * ROW, ALIGN)  # 18688 -> 19008
    c1_index = round_up(64 // 1 * (128 + 128 // 128 * 4), ALIGN)  # 8448 -> 8640
    c2_index = round_up(64 // 2 * (128 + 128 // 128 * 4), ALIGN)  # 4224 -> 4608
    swa = round_up(32 * ROW, ALIGN)  # 18688 -> 19008
    ring = 8 * (2 * 512) * 4  # 8 float32 rows of kv_state + score_state
    assert (c1_latent, c2_latent, c1_index, c2_index, swa, ring) == (37440, 19008, 8640, 4608, 19008, 32768)
    assert list(worker) == [
        "model.layers.0.attn.swa_cache",
        "model.layers.1.attn",
        "model.layers.1.attn.indexer.k_cache",
        "model.layers.1.attn.swa_cache",
        "model.layers.2.attn.swa_cache",  # an index source reading layer 1's keys, a ratio-1 reader: no cache
        "model.layers.3.attn",
        "model.layers.3.attn.indexer.k_cache",
        "model.layers.3.attn.swa_cache",
        "model.layers.3.attn.compressor.state_cache",
        "model.layers.4.attn.swa_cache",  # reads layer 3's ratio-2 latent
        "model.layers.5.attn",
        "model.layers.5.attn.indexer.k_cache",
        "model.layers.5.attn.swa_cache",
        "model.layers.6.attn.swa_cache",
        "model.layers.7.attn.swa_cache",
    ]
    pages = {name: spec.page_size_bytes for name, spec in worker.items()}
    assert pages["model.layers.1.attn"] == pages["model.layers.5.attn"] == c1_latent
    assert pages["model.layers.3.attn"] == c2_latent
    assert pages["model.layers.1.attn.indexer.k_cache"] == c1_index
    assert pages["model.layers.3.attn.indexer.k_cache"] == c2_index
    assert pages["model.layers.0.attn.swa_cache"] == swa
    assert pages["model.layers.3.attn.compressor.state_cache"] == ring
    assert isinstance(worker["model.layers.3.attn.compressor.state_cache"], CircularBufferSpec)
    swa_spec = worker["model.layers.0.attn.swa_cache"]
    assert isinstance(swa_spec, SlidingWindowMLASpec) and swa_spec.bounded_replay  # swa_bounded_replay's default
    latent = worker["model.layers.1.attn"]
    assert isinstance(latent, MLAAttentionSpec) and latent.max_tp_shards is None  # V4.1 leaves it unset (L1217-1231)


def test_blocks_by_hand(registry: Registry) -> None:
    """10 GiB, 1M tokens, 2048 batched tokens x 2 in flight; BLHNC packs greedy uniform-type buckets
    (``_get_packed_kv_cache_groups``, kv_cache_planning.py L914-1041): the 8 SWA caches, the 6 latents + indexer
    keys (pages 37440 x 2, 8640 x 2, 19008, 4608: unbalanced, one group), the ring.  No balanced bucket mixes page
    sizes, so nothing repeats; the SWA caches and the ring are state buckets.  The anchor is the latents' 115,776
    bytes: 115776 // 19008 = 6 SWA pages fit, so the 8 SWA caches split into 2 groups of 4 (every other layer);
    115776 // 32768 = 3 rings fit, so the one ring stays one group."""
    worker = _worker(registry)
    widest = 2 * 37440 + 2 * 8640 + 19008 + 4608
    assert widest == 115_776
    limits = VllmLimits(max_model_len=1 << 20, max_num_batched_tokens=2048, max_concurrent_batches=2)
    plan = plan_kv_cache([worker], [10 * GiB], limits)
    assert plan.kv_cache_layout == "BLHNC"
    assert [len(group.layer_names) for group in plan.groups] == [4, 4, 6, 1]
    assert plan.groups[0].layer_names == tuple(f"model.layers.{i}.attn.swa_cache" for i in (0, 2, 4, 6))
    assert all(isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs) for group in plan.groups)
    assert plan.page_sizes == (4 * 19008, 4 * 19008, widest, 32768)
    assert plan.block_sizes == (32, 32, 64, 8)
    assert plan.bytes_per_block == (widest,)
    num_blocks = 10 * GiB // widest
    assert plan.num_gpu_blocks == num_blocks == 92743
    in_flight = 2 * 2048
    swa = cdiv(128 - 1 + in_flight, 32) + 1  # 133, in each SWA group
    full = cdiv(1 << 20, 64)  # 16384: every latent and key page of the request
    ring = 1  # CircularBufferSpec: one block for the request's life (kv_cache_interface.py L978-981)
    per_request = 2 * swa + full + ring
    assert plan.blocks_per_request == per_request == 16651
    assert plan.kv_cache_size_tokens == int(num_blocks / per_request * (1 << 20)) == 5_840_374


def test_block_128_off_sm90(registry: Registry) -> None:
    """On a GPU outside the SM90 family (A100: SM80) the kernels' block is 128: the latent pages double."""
    traits = PlatformTraits(platform="cuda", compute_capability=(8, 0))
    worker = _worker(registry, platform_traits=traits)
    assert worker["model.layers.1.attn"].block_size == 128
    assert worker["model.layers.1.attn"].page_size_bytes == round_up(128 * ROW, ALIGN) == 74880
    assert worker["model.layers.0.attn.swa_cache"].block_size == 32  # the SWA cache keeps its own


def _refused(registry: Registry, message: str, config: dict[str, Any] | None = None, **serving: Any) -> None:
    with pytest.raises(UnsupportedCombinationError, match=message):
        _worker(registry, config, **serving)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"compress_ratios": [0, 1, 1, 4, 2, 1, 0, 0, 0]},
            r"DeepSeek V4.1 layer 3 has compress_ratio=4; only 0 \(sliding window\), 1 and 2 are supported",
        ),
        ({"index_source_layer_ids": []}, "requires kv_source_layer_ids / index_source_layer_ids"),
        ({"kv_source_layer_ids": [2, 3, 5]}, "compressed layer 1 has no layer of 'kv_source_layer_ids' at or below"),
        (
            {"kv_source_layer_ids": [0, 1, 3, 5]},
            "kv source layer 0 has compress_ratio 0, and vLLM's DeepSeek V4.1 compressor supports",
        ),
        ({"index_source_layer_ids": [2, 3, 5]}, "compressed layer 1 has no layer of 'index_source_layer_ids'"),
        ({"index_source_layer_ids": [1, 3, 5, 6]}, "index source layer 6 has compress_ratio 0, so it has no kv source"),
        (
            {"index_source_layer_ids": [1, 4, 5]},
            r"index source layer 4 shares the indexer key cache of its kv source \(layer 3\)",
        ),
    ],
)
def test_topology_refusals_are_vllms(registry: Registry, changes: dict[str, Any], message: str) -> None:
    _refused(registry, message, _config(**changes))


def test_replay_cut_of_ratio_2_is_refused(registry: Registry) -> None:
    """The last kv source (3, ratio 2) starts the decoder replay, whose assert wants ratio <= 1 (nvidia/model.py
    L866); with that layer last there is no replay and no assert."""
    config = _config(compress_ratios=[0, 1, 1, 2, 2, 2, 0, 0, 0], kv_source_layer_ids=[1, 3])
    _refused(registry, r"vLLM asserts its compress_ratio <= 1 \(nvidia/model.py L866\), got 2", config)
    last = _config(
        compress_ratios=[0, 1, 1, 1, 1, 1, 1, 2, 0], kv_source_layer_ids=[1, 7], index_source_layer_ids=[1, 7]
    )
    assert "model.layers.7.attn.compressor.state_cache" in _worker(registry, last)


def test_engram_after_the_cut_turns_the_replay_off(registry: Registry) -> None:
    """An Engram layer at or after the cut switches the replay off (nvidia/model.py L1307-1308): no assert then."""
    config = _config(compress_ratios=[0, 1, 1, 2, 2, 2, 0, 0, 0], kv_source_layer_ids=[1, 3], engram_layer_ids=[6])
    assert "model.layers.3.attn.compressor.state_cache" in _worker(registry, config)


def test_pp_split_inside_a_sharing_group_is_refused(registry: Registry) -> None:
    """PP 2 puts layers 0-3 and 4-7 apart: layer 4 reads layer 3's ratio-2 latent across stages."""
    _refused(registry, "PP splits inside a v4.1 kv-sharing group are not supported", pp_size=2)
    model, _ = parse_config(_config(), "dsv41", registry)
    stages = worker_kv_cache_specs(model, Serving(pp_size=2, pp_layer_partition=(5, 3)), registry)
    assert [len(stage) for stage in stages] == [10, 5]  # 0-4 | 5-7: every reader beside its source


@pytest.mark.parametrize(
    ("serving", "message"),
    [
        ({"kv_cache_dtype": "bf16"}, "packed KV layouts only support fp8 kv-cache, got bf16"),
        ({"tp_size": 3}, r"asserts num_attention_heads \(64\) % tensor-parallel size == 0"),
        ({"platform": "rocm"}, "is modelled on CUDA only"),
        ({"platform_traits": PlatformTraits(platform="cuda", compute_capability=(10, 0))}, "on an SM10x GPU"),
        ({"platform_traits": PlatformTraits(platform="cuda", compute_capability=(12, 0))}, "FlashInfer SM120"),
    ],
)
def test_serving_refusals_name_the_fix(registry: Registry, serving: dict[str, Any], message: str) -> None:
    _refused(registry, message, **serving)


def test_block_size_other_than_the_kernel_block_is_refused(registry: Registry) -> None:
    model, _ = parse_config(_config(), "dsv41", registry)
    with pytest.raises(UnsupportedCombinationError, match="Padded KV pages do not support kernel block splitting"):
        worker_kv_cache_specs(model, Serving(), registry, block_size=128)
    (worker,) = worker_kv_cache_specs(model, Serving(), registry, block_size=64)
    assert worker["model.layers.1.attn"].block_size == 64


def test_v4_config_with_low_ratios_is_refused_with_vllms_reason(registry: Registry) -> None:
    """A ``deepseek_v4`` config is vLLM's DeepSeek-V4 model, whose compressors take ratios 4 and 128 only."""
    config = _config(model_type="deepseek_v4")
    _refused(registry, r"CompressorStateCache asserts compress_ratio in \[4, 128\]", config)


def test_cli_plan_and_compare() -> None:
    """``kvpools plan --accounting vllm`` serves block 64; ``kvpools compare`` sets vLLM's plan beside SGLang's."""
    plan = CliRunner().invoke(
        main, ["plan", str(CONFIG), "--accounting", "vllm", "--memory", "10GiB", "--json"], catch_exceptions=False
    )
    assert plan.exit_code == 0, plan.output
    data = json.loads(plan.output)
    assert data["num_gpu_blocks"] == 92743
    assert (data["block_size"], data["block_size_requested"]) == (64, 16)
    assert "--block-size 64 " in data["serve_command"]
    compare = CliRunner().invoke(main, ["compare", str(CONFIG), "--memory", "40GiB", "--json"])
    assert compare.exit_code == 0, compare.output
    both = json.loads(compare.output)
    assert both["vllm_refusal"] is None
    assert both["vllm"]["num_gpu_blocks"] == 40 * GiB // 115_776
    assert both["vllm"]["block_size"] == 64


def test_cli_gpu_capability_reaches_the_specs() -> None:
    """``--gpu b200`` (SM100) is refused by name; ``--gpu a100-80gb`` (SM80) serves block 128."""
    runner = CliRunner()
    b200 = runner.invoke(
        main, ["plan", str(CONFIG), "--accounting", "vllm", "--gpu", "b200", "--weights-memory", "20GiB"]
    )
    assert b200.exit_code == 1 and "on an SM10x GPU" in b200.output and "Traceback" not in b200.output
    a100 = runner.invoke(
        main, ["plan", str(CONFIG), "--accounting", "vllm", "--gpu", "a100-80gb", "--weights-memory", "20GiB", "--json"]
    )
    assert a100.exit_code == 0, a100.output
    assert json.loads(a100.output)["block_size"] == 128


def test_tp_does_not_change_the_specs(registry: Registry) -> None:
    """One latent head on every rank: TP 1 and TP 8 build the same caches."""
    assert _worker(registry, tp_size=1) == _worker(registry, tp_size=8)
