"""The ``vllm_kv_cache_specs`` hook: what the architecture plugins answer, placed on pipeline stages."""

from __future__ import annotations

import types
from typing import Any

import pytest

from kvpools_core import hookimpl
from kvpools_core.config import load_model
from kvpools_core.errors import PluginResultError, UnsupportedCombinationError
from kvpools_core.registry import Registry
from kvpools_core.values import Serving
from kvpools_core.vllm import FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec, VllmLimits, plan_kv_cache
from kvpools_core.vllm.model import kv_heads_per_rank, layer_index, worker_kv_cache_specs

GiB = 1 << 30


def test_mha_layers_are_full_attention_on_one_tp_rank(registry: Registry) -> None:
    model, _ = load_model("qwen3-235b-a22b", registry)  # 94 layers, 4 KV heads x 128, bf16
    workers = worker_kv_cache_specs(model, Serving(tp_size=4), registry)
    (specs,) = workers
    assert len(specs) == 94 and {type(spec) for spec in specs.values()} == {FullAttentionSpec}
    spec = specs["model.layers.0.self_attn.attn"]
    # 4 heads over TP 4 -> 1 per rank: page = 16 x 1 x (128 + 128) x 2 = 8192
    assert (spec.num_kv_heads, spec.block_size, spec.page_size_bytes) == (1, 16, 8192)
    # TP 8 replicates the 4 heads: still one per rank
    assert kv_heads_per_rank(4, 8) == 1


def test_swa_layers_keep_their_windows_and_pp_splits_by_layer_index(registry: Registry) -> None:
    model, _ = load_model("gpt-oss-120b", registry)  # 36 layers, sliding 128 / full alternating, 8 x 64
    workers = worker_kv_cache_specs(model, Serving(pp_size=2), registry, block_size=32)
    assert [len(worker) for worker in workers] == [18, 18]
    assert layer_index(next(iter(workers[1]))) == 18
    kinds = [type(spec) for spec in workers[0].values()]
    assert kinds.count(SlidingWindowSpec) == 9 and kinds.count(FullAttentionSpec) == 9
    window = next(spec for spec in workers[0].values() if isinstance(spec, SlidingWindowSpec))
    assert (window.sliding_window, window.block_size, window.page_size_bytes) == (128, 32, 32 * 8 * 128 * 2)
    plan = plan_kv_cache(workers, [10 * GiB] * 2, VllmLimits(max_model_len=model.context_len))
    # each stage holds 9 + 9 layers: two global groups of 18, a block on one stage spans 9 layers x 65536 B
    assert len(plan.groups) == 2 and plan.bytes_per_block == (9 * 65536, 9 * 65536)


def test_unmodelled_kv_dtypes_are_refused_by_name(registry: Registry) -> None:
    model, _ = load_model("llama-3.1-8b", registry)
    with pytest.raises(
        UnsupportedCombinationError, match="kv_cache_dtype fp4_e2m1 is not modelled for --accounting vllm"
    ):
        worker_kv_cache_specs(model, Serving(kv_cache_dtype="fp4_e2m1"), registry)
    fp8 = worker_kv_cache_specs(model, Serving(kv_cache_dtype="fp8"), registry)[0]
    assert fp8["model.layers.0.self_attn.attn"].page_size_bytes == 16 * 8 * 256  # one byte per element


@hookimpl(tryfirst=True)
def vllm_kv_cache_specs(model: Any, serving: Any, block_size: int) -> Any:
    """An answer whose layer name carries no layer index."""
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, head_size_v=8, dtype_bytes=2)
    return {"model.layers.attn": spec}


def test_an_answer_without_a_layer_index_breaks_the_contract(registry: Registry) -> None:
    model, _ = load_model("llama-3.1-8b", registry)
    bad = types.ModuleType("bad_vllm")
    bad.vllm_kv_cache_specs = vllm_kv_cache_specs  # type: ignore[attr-defined]
    local = Registry(autoload=True, plugins=None, disabled=(), extra_plugins={"bad-vllm": bad})
    with pytest.raises(PluginResultError, match=r'"bad-vllm".*vllm_kv_cache_specs.*no single integer part'):
        worker_kv_cache_specs(model, Serving(), local)


def test_mla_layers_cache_one_latent_row_on_every_rank(registry: Registry) -> None:
    model, _ = load_model("deepseek-v3", registry)  # 61 layers, kv_lora_rank 512 + rope 64, bf16
    (specs,) = worker_kv_cache_specs(model, Serving(tp_size=8), registry, block_size=64)
    spec = specs["model.layers.0.self_attn.attn"]
    assert isinstance(spec, MLAAttentionSpec) and len(specs) == 61
    assert (spec.num_kv_heads, spec.head_size_v, spec.page_size_bytes) == (1, 0, 64 * 576 * 2)


def test_dsa_layers_add_the_indexer_key_cache(registry: Registry) -> None:
    model, _ = load_model("deepseek-v3.2-exp", registry)
    (specs,) = worker_kv_cache_specs(model, Serving(), registry, block_size=64)
    indexer = specs["model.layers.3.self_attn.indexer.k_cache"]
    # index_head_dim 128 fp8 values + one fp32 scale per 128: 132 uint8 bytes per token
    assert (indexer.cache_role, indexer.page_size_bytes) == ("indexer", 64 * 132)
    plan = plan_kv_cache([specs], [20 * GiB], VllmLimits(max_model_len=163840))
    # latent and indexer are both full-attention typed with one block size: one uniform-type group
    assert len(plan.groups) == 1 and plan.page_sizes == (61 * 64 * (576 * 2 + 132),)
