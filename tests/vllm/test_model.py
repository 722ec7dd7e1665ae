"""The ``vllm_kv_cache_specs`` hook: what the architecture plugins answer, placed on pipeline stages."""

from __future__ import annotations

import types
from typing import Any

import attrs
import pytest

from kvpools_core import hookimpl
from kvpools_core.engines.vllm import (
    FullAttentionSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    VllmLimits,
    VllmMemoryError,
    plan_kv_cache,
)
from kvpools_core.engines.vllm.model import backend_block_size, kv_heads_per_rank, layer_index, worker_kv_cache_specs
from kvpools_core.errors import PluginResultError, UnsupportedCombinationError
from kvpools_core.models import load_model
from kvpools_core.registry import Registry
from kvpools_core.values import Serving

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


def test_gated_deltanet_hybrid_state_block_and_checkpoint(registry: Registry) -> None:
    """qwen3-next: 48 layers, full attention every 4th (2 KV heads x 256), GDN 16 key / 32 value heads x 128,
    conv kernel 4, bf16; vLLM keeps the SSM state in the conv's dtype (no mamba_ssm_dtype hook for Qwen3-Next)."""
    model, _ = load_model("qwen3-next-80b-a3b-thinking", registry)
    (specs,) = worker_kv_cache_specs(model, Serving(tp_size=2), registry)
    mamba = specs["model.layers.0.linear_attn"]
    assert isinstance(mamba, MambaSpec)
    conv_dim = 2 * 16 * 128 + 32 * 128  # q and k over the key heads, v over the value heads
    assert mamba.shapes == ((3, conv_dim // 2), (16, 128, 128)) and mamba.dtype_bytes == (2, 2)
    state = 3 * 4096 * 2 + 16 * 128 * 128 * 2
    attention = specs["model.layers.3.self_attn.attn"]
    assert isinstance(attention, FullAttentionSpec)
    per_token = 1 * (256 + 256) * 2  # 2 KV heads over TP 2
    # FlashInfer's GDN checkpoint makes blocks multiples of lcm(16, 64) = 64 tokens
    block = 64 * -(-state // (64 * per_token))
    assert (attention.block_size, mamba.block_size, mamba.page_size_bytes) == (block, block, block * per_token)
    assert mamba.page_size_padded == block * per_token > state
    assert (mamba.mamba_type, mamba.mamba_cache_mode) == ("gdn_attn", "align")
    assert (mamba.num_prefill_checkpoint_blocks, mamba.prefill_checkpoint_alignment) == (1, block)
    assert sum(isinstance(spec, MambaSpec) for spec in specs.values()) == 36


def test_mamba2_prefill_checkpoint_block_nemotron_h_56b(registry: Registry) -> None:
    """Defect (issue 32): kvpools gave the prefill checkpoint block to Gated DeltaNet layers only, but vLLM 0.33's
    ``MambaMixer2.get_kv_cache_spec`` (``mamba_mixer2.py`` L1108-1118) adds it to every Mamba2 layer (alignment 1),
    so in ``align`` mode a request holds 2 + 1 blocks per Mamba group (``MambaSpec.max_memory_usage_bytes``,
    ``kv_cache_interface.py`` L1135-1141), not 2.  kvpools planned 14 blocks per request, 74,313 tokens and 9.07x.

    nemotron-h-56b-base-8k, TP 1, bf16: 118 layers, 54 Mamba2 (``M``), 10 attention (``*``), 54 MLP (``-``).
    Mamba2: 256 heads x 64, 8 groups, state 256, conv 4: conv ``(3, 256 x 64 + 2 x 8 x 256)`` in bf16, SSM
    ``(256, 64, 256)`` in float32 (Nemotron-H's default SSM cache dtype); attention 8 KV heads x 128 in bf16."""
    model, _ = load_model("nemotron-h-56b-base-8k", registry)
    (specs,) = worker_kv_cache_specs(model, Serving(tp_size=1), registry)
    mamba = specs["model.layers.0.mixer"]
    assert isinstance(mamba, MambaSpec) and mamba.mamba_type == "mamba2"
    assert (mamba.num_prefill_checkpoint_blocks, mamba.prefill_checkpoint_alignment) == (1, 1)
    state = 3 * 20480 * 2 + 256 * 64 * 256 * 4  # 16,900,096 B
    per_token = 2 * 8 * 128 * 2  # K and V
    block = 16 * -(-state // (16 * per_token))  # alignment 1 leaves FlashAttention's grid of 16: 4128 tokens
    page = block * per_token  # 16,908,288 B
    assert (block, mamba.block_size, mamba.page_size_bytes) == (4128, 4128, page)
    limits = VllmLimits(max_model_len=8192, mamba_cache_mode="align")
    plan = plan_kv_cache([specs], [20 * GiB], limits)
    # six groups of 9 Mamba2 layers and one of the 10 attention layers: a block holds 10 pages
    assert plan.bytes_per_block == (10 * page,) and plan.num_gpu_blocks == 20 * GiB // (10 * page) == 127
    # per request: 2 attention blocks (cdiv(8192, 4128)) + 6 Mamba groups x (2 + 1 checkpoint)
    assert plan.blocks_per_request == 2 + 6 * 3 == 20
    assert plan.max_concurrency == 127 / 20  # vLLM logs 6.35x
    assert plan.kv_cache_size_tokens == int(127 / 20 * 8192) == 52019
    # 16 blocks (2,705,326,080 B) fit the 14 blocks kvpools asked for, not vLLM's 20: vLLM refuses to start
    with pytest.raises(VllmMemoryError, match=r"max seq len \(8192\)"):
        plan_kv_cache([specs], [16 * 10 * page], limits)
    assert 16 * 10 * page == 2_705_326_080


def test_kimi_linear_kda_state_beside_mla_latent(registry: Registry) -> None:
    """kimi-linear-48b: 27 layers, MLA at 1-based 4, 8, ..., 24, 27, KDA elsewhere; 32 KDA heads x 128, conv 4, bf16;
    latent 512 + rope 64.  Hand-computed from kda_state_shape / kda_state_dtype and _align_hybrid_block_size."""
    model, _ = load_model("kimi-linear-48b-a3b-instruct-nvfp4", registry)
    (specs,) = worker_kv_cache_specs(model, Serving(tp_size=2), registry)
    assert list(specs) == [f"model.layers.{i}.self_attn" for i in range(27)]
    kda, latent = specs["model.layers.0.self_attn"], specs["model.layers.3.self_attn"]
    assert isinstance(kda, MambaSpec) and isinstance(latent, MLAAttentionSpec)
    # conv: 3 (kernel - 1) x (3 x 32 x 128) / 2 in bf16; recurrent: 16 heads x 128 x 128 in float32
    assert kda.shapes == ((3, 6144), (16, 128, 128)) and kda.dtype_bytes == (2, 4)
    state = 3 * 6144 * 2 + 16 * 128 * 128 * 4  # 1,085,440 B
    per_token = 576 * 2  # one latent row, whatever the TP
    # MLA hybrids align to 128 tokens: 128 x cdiv(1,085,440, 128 x 1152) = 128 x 8 = 1024
    assert (kda.block_size, latent.block_size) == (1024, 1024)
    assert kda.page_size_padded == latent.page_size_bytes == 1024 * per_token > state
    assert (kda.mamba_type, kda.mamba_cache_mode, kda.num_prefill_checkpoint_blocks) == ("gdn_attn", "align", 0)
    assert sum(isinstance(spec, MambaSpec) for spec in specs.values()) == 20
    plan = plan_kv_cache([specs], [10 * GiB], VllmLimits(max_model_len=131072, mamba_cache_mode="align"))
    # one group of the 7 MLA layers, the 20 KDA layers in groups of 7, 7 and 6: a block holds 7 pages
    assert [len(group.layer_names) for group in plan.groups] == [7, 7, 6, 7]
    assert plan.page_sizes == (1024 * per_token,) * 4 and plan.bytes_per_block == (7 * 1024 * per_token,)
    assert plan.num_gpu_blocks == 10 * GiB // (7 * 1024 * per_token) == 1300


@pytest.mark.parametrize(
    ("change", "serving", "message"),
    [
        ({"use_full_rank_gate": True}, Serving(), "use_full_rank_gate selects Kimi-K3's KimiK3DeltaAttention"),
        ({"mla_use_nope": False}, Serving(), "asserts mla_use_nope"),
        ({}, Serving(kv_cache_dtype="fp32"), "takes a fp32 KV cache"),
        ({}, Serving(tp_size=64), "cannot shard the recurrent state over TP 64"),
    ],
)
def test_kimi_linear_paths_vllm_does_not_take_are_refused(
    registry: Registry, change: dict[str, Any], serving: Serving, message: str
) -> None:
    model, _ = load_model("kimi-linear-48b-a3b-instruct-nvfp4", registry)
    readings = {**model.params["vllm"], **change}
    model = attrs.evolve(model, params={**model.params, "vllm": readings})
    with pytest.raises(UnsupportedCombinationError, match=message):
        worker_kv_cache_specs(model, serving, registry)


def test_ssm_dtype_follows_vllms_config_hooks(registry: Registry) -> None:
    qwen35, _ = load_model("qwen3.5-35b-a3b", registry)  # text_config.mamba_ssm_dtype float32
    nemotron, _ = load_model("nemotron-3-nano-30b-a3b", registry)  # mamba_ssm_cache_dtype float32
    jamba, _ = load_model("jamba-1.5-mini", registry)  # no hook: the conv's bf16
    for model, dtypes in ((qwen35, (2, 4)), (nemotron, (2, 4)), (jamba, (2, 2))):
        (specs,) = worker_kv_cache_specs(model, Serving(), registry)
        assert {spec.dtype_bytes for spec in specs.values() if isinstance(spec, MambaSpec)} == {dtypes}
    # --kv-cache-dtype changes the attention pages, not the state
    (specs,) = worker_kv_cache_specs(jamba, Serving(kv_cache_dtype="fp8"), registry)
    states = {spec.state_bytes for spec in specs.values() if isinstance(spec, MambaSpec)}
    assert states == {3 * 8192 * 2 + 8192 * 16 * 2}


def test_falcon_h1_ssm_branch_is_named_past_the_layers_and_placed_with_its_layer(registry: Registry) -> None:
    model, _ = load_model("falcon-h1-7b", registry)  # 44 parallel-hybrid layers
    workers = worker_kv_cache_specs(model, Serving(pp_size=2), registry)
    first, second = (set(worker) for worker in workers)
    # falcon_h1.py: the SSM branch of layer i registers as model.{44 + i}.mixer, after the layer's attention
    assert list(workers[0])[:2] == ["model.layers.0.attn", "model.44.mixer"]
    assert {"model.layers.21.attn", "model.65.mixer"} <= first and {"model.layers.22.attn", "model.66.mixer"} <= second
    assert len(first) == len(second) == 44


def test_state_that_tp_does_not_divide_is_refused(registry: Registry) -> None:
    model, _ = load_model("qwen3-next-80b-a3b-thinking", registry)
    with pytest.raises(UnsupportedCombinationError, match="cannot shard the recurrent state over TP 3"):
        worker_kv_cache_specs(model, Serving(tp_size=3), registry)


def test_minimax_m3_indexer_and_backend_block_size(registry: Registry) -> None:
    model, _ = load_model("minimax-m3", registry)  # 60 layers: 3 dense, 57 sparse; 4 KV heads x 128; index 128
    (specs,) = worker_kv_cache_specs(model, Serving(tp_size=4, kv_cache_dtype="fp8"), registry)
    index = specs["model.layers.3.self_attn.attn.index_cache"]
    assert isinstance(index, MLAAttentionSpec) and index.cache_role == "indexer"
    # the index key stays bf16 whatever --kv-cache-dtype: 128 tokens x 128 x 2 B; the main K/V is fp8
    assert (index.block_size, index.page_size_bytes) == (128, 128 * 128 * 2)
    assert specs["model.layers.3.self_attn.attn"].page_size_bytes == 128 * 1 * (128 + 128) * 1
    assert "model.layers.0.self_attn.attn.index_cache" not in specs and len(specs) == 60 + 57
    # an explicit block size must be a multiple of the sparse kernels' 128
    (specs,) = worker_kv_cache_specs(model, Serving(tp_size=4), registry, block_size=256)
    assert {spec.block_size for spec in specs.values()} == {256}
    with pytest.raises(UnsupportedCombinationError, match="--block-size 64 is not a multiple of the kernel block"):
        worker_kv_cache_specs(model, Serving(tp_size=4), registry, block_size=64)


@pytest.mark.parametrize(
    ("block_size", "kernels", "expected"),
    [(16, [[16]], 16), (16, [[16], [128]], 128), (32, [[16]], 32), (16, [[64, 32], [48]], 96), (256, [[128]], 256)],
)
def test_backend_block_size(block_size: int, kernels: list[list[int]], expected: int) -> None:
    assert backend_block_size(block_size, kernels, "test backends") == expected
