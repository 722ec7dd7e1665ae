"""The layer specs vLLM 0.33 builds for DeepSeek-V4.1 (``--accounting vllm``).

Line numbers are vLLM 0.33.0's.  vLLM serves DeepSeek-V4.1 with a model of its own, ``DeepseekV41ForCausalLM``
(``model_executor/models/registry.py`` L387-390, ``vllm.models.deepseek_v41``, config class ``DeepseekV41Config``
for ``model_type`` ``deepseek_v41``): the name a V4.1 checkpoint gives, which SGLang rewrites to
``DeepseekV4ForCausalLM`` (``configs/deepseek_v41.py`` ``normalize_deepseek_v41_config``), so kvpools takes a config
of ``model_type`` ``deepseek_v41`` (or that architecture) for it.  Its CUDA implementation is ``nvidia/model.py``;
without ``--attention-backend`` a GPU other than SM100 and SM12x runs ``DeepseekV4FlashMLAAttention``
(``_select_dsv4_attn_cls``, L201-262), whose packed record is DeepSeek-V4's (``_use_v41_mxfp8_kv_record``,
``attention.py`` L133-140: 584-byte rows, 576-byte pages, L524-531).

Each decoder layer ``i`` (compress ratio 0, 1 or 2 only, L320-329) registers, in this order:

* the attention layer ``model.layers.i.attn`` itself (L433-436), whose cache only a *kv source* (a layer of
  ``kv_source_layer_ids``, L332-343) owns: one 584-byte row per ``ratio`` tokens in blocks of the cache block size
  (``get_kv_cache_spec``, L1206-1231); the other compressed layers read the latest kv source at or below them;
* on a layer that is a kv source and an index source (``index_source_layer_ids``), the indexer key cache
  ``...attn.indexer.k_cache`` (L444-455, L1274-1310): ``index_head_dim + index_head_dim // 128 * 4`` bytes per
  state; other index sources share their kv source's;
* its SWA cache ``...attn.swa_cache`` (L563-580): 32-token blocks of 584-byte rows, window ``sliding_window``,
  ``bounded_replay`` on (``CacheConfig.swa_bounded_replay`` defaults to True, model runner V2, CUDA);
* on a ratio-2 kv source, the compressor's ring ``...attn.compressor.state_cache``
  (``compressor.py`` L206-240, L306-314): a ``CircularBufferSpec`` of 8 float32 rows of ``2 x head_dim`` (the
  ring holds ``max(8, ...)`` rows for the drafts + 2, L221-223), one block per request.

Pages are padded to 576 bytes; ``customize_attention_spec`` (``v1/worker/utils.py`` L476-486) gives the latents and
indexer keys ``block_stride_alignment = MultipleOf(k)``, ``k`` the FlashMLA and indexer kernels' only block:
64 tokens on SM90, 128 on the other GPUs (``deepseek_v41/sparse_mla.py`` L115-116, ``indexer.py`` L365-366), which
is the block size vLLM settles on.  The indexer declares ``BLHNC`` / ``BLNHC`` (``indexer.py`` L349-352): packed
groups.  The decoder-side replay (``decoder_replay_layers.py``) holds no cache of its own; vLLM asserts that its cut,
the last kv source, has ratio <= 1 when the replay is on (``nvidia/model.py`` L858-867).

Refused, with vLLM's reason: ratios 4 and 128, a compressed layer without a kv source or index source at or below
it, an empty ``kv_source_layer_ids``, a kv source of ratio 0, a PP split inside a kv-sharing group, another
``--kv-cache-dtype``, more than 128 heads per rank, a replay cut of ratio 2.  Not modelled (refused): SM100 (mega
attention, the 528-byte MXFP8 records and the 288-byte NVFP4 compressed record) and SM12x (FlashInfer) GPUs, other
platforms (``amd/``), block sizes other than the kernel block, configs whose kv sources own no indexer key cache (no
declared layout), speculative decoding.  Without a known GPU (no ``--gpu``) the plan is SM90's (H100 / H200).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parts.vllm.layers import padded_page_block_size, pp_layer_ranges
from kvpools_core.parts.vllm.specs import CircularBufferSpec, KVCacheSpec, MLAAttentionSpec, SlidingWindowMLASpec

if TYPE_CHECKING:
    from kvpools_core.values import ModelSpec, Serving

VLLM_VERSION = "0.33.0"
PACKED_ROW_BYTES = 584
"""The V4 ``fp8_ds_mla`` record V4.1 keeps off SM100 (``deepseek_v41/attention.py`` L133-140, L522-527)."""
ROW_ALIGNMENT = 576
"""Its page alignment (``deepseek_v41/attention.py`` L531, L1284-1286)."""
INDEXER_QUANT_BLOCK = 128
"""The fp8 indexer key: 128 fp8 values + one fp32 scale per 128 (``_indexer_k_cache_head_dim``, L101-110)."""
INDEXER_LAYOUTS = ("BLHNC", "BLNHC")
"""``DeepseekV41IndexerBackend`` inherits ``DeepseekV4IndexerBackend.supported_kv_cache_layouts`` (``indexer.py``
L349-352)."""
SWA_KERNEL_BLOCK = 32
"""The SWA backend's ``MultipleOf(32)`` (``sparse_swa.py`` L161-162)."""
FLASHMLA_MAX_LOCAL_HEADS = 128
"""``DeepseekV4FlashMLAAttention.get_padded_num_q_heads`` (``deepseek_v41/nvidia/flashmla.py`` L81-88)."""

V41_MODEL_TYPES = ("deepseek_v41", "deepseek_v41_text")
"""``DeepseekV41Config.model_type`` (``transformers_utils/configs/deepseek_v41.py`` L18) and its text config's."""
V41_ARCHITECTURE = "DeepseekV41ForCausalLM"
V41_RATIOS = (0, 1, 2)
"""The compress ratios ``DeepseekV4Attention`` accepts (``deepseek_v41/attention.py`` L323-329)."""
V41_SWA_BLOCK_SIZE = 32
"""The SWA cache's block, fixed by ``DeepseekV4Attention`` (``deepseek_v41/attention.py`` L569)."""
RING_ROWS = 8
"""``CompressorStateCache.block_size``: ``max(8, 1 << (num_speculative_tokens + 1).bit_length())`` rows, 8 without
speculative decoding (``deepseek_v41/compressor.py`` L221-223)."""
STATE_DTYPE_BYTES = 4
"""The ring is float32 (``deepseek_v41/compressor.py`` L219, L308)."""
SM90_KERNEL_BLOCK = 64
OTHER_KERNEL_BLOCK = 128
"""FlashMLA's and the V4.1 indexer's kernel block: 64 tokens on the SM90 family, else 128 (``sparse_mla.py``
L115-116, ``indexer.py`` L365-366)."""


def is_dsv41(model: ModelSpec) -> bool:
    """A DeepSeek-V4.1 checkpoint, which vLLM serves with ``DeepseekV41ForCausalLM``."""
    return model.model_type in V41_MODEL_TYPES or V41_ARCHITECTURE in model.hf_architectures


def dsv41_vllm_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, KVCacheSpec]:
    """Every cache layer's spec on one TP rank, named and ordered as vLLM's DeepSeek-V4.1 registers them."""
    block = _check(model, serving, block_size)
    head_dim = model.params["qk_nope_head_dim"] + model.params["qk_rope_head_dim"]
    kv_sources = set(_backbone(model, "kv_source_layer_ids"))
    index_sources = set(_backbone(model, "index_source_layer_ids"))
    swa = SlidingWindowMLASpec(
        block_size=V41_SWA_BLOCK_SIZE,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=head_dim,
        dtype_bytes=1,
        sliding_window=model.params["window_size"],
        cache_dtype_str="fp8_ds_mla",
        state_content_bytes=PACKED_ROW_BYTES,
        alignment=ROW_ALIGNMENT,
        model_version="deepseek_v4",
        bounded_replay=True,
    )
    specs: dict[str, KVCacheSpec] = {}
    for layer in model.layers:
        prefix = f"model.layers.{layer.index}.attn"
        ratio = int(layer.params["compress_ratio"])
        source = layer.index in kv_sources
        if source:
            specs[prefix] = MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                head_size=head_dim,
                dtype_bytes=1,
                tokens_per_state=ratio,
                cache_dtype_str="fp8_ds_mla",
                alignment=ROW_ALIGNMENT,
                model_version="deepseek_v4",
                state_content_bytes=PACKED_ROW_BYTES,
                block_stride_alignment=block,
            )
        if source and layer.index in index_sources:
            index_head_dim = int(model.params["index_head_dim"])
            specs[f"{prefix}.indexer.k_cache"] = MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                head_size=index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * 4,
                dtype_bytes=1,
                tokens_per_state=ratio,
                alignment=ROW_ALIGNMENT,
                block_stride_alignment=block,
                supported_layouts=INDEXER_LAYOUTS,
            )
        specs[f"{prefix}.swa_cache"] = swa
        if source and ratio > 1:
            specs[f"{prefix}.compressor.state_cache"] = CircularBufferSpec(
                block_size=RING_ROWS,
                num_kv_heads=1,
                head_size=2 * head_dim,  # kv_state + score_state
                head_size_v=0,
                dtype_bytes=STATE_DTYPE_BYTES,
            )
    return specs


def _backbone(model: ModelSpec, key: str) -> list[int]:
    """The ids of ``key`` that name decoder layers (``is_backbone``, ``deepseek_v41/attention.py`` L342)."""
    return [int(i) for i in model.params.get(key, ()) if int(i) < model.num_layers]


def _check(model: ModelSpec, serving: Serving, block_size: int) -> int:
    """What vLLM refuses (or kvpools does not model) before the specs exist, and the block size vLLM settles on."""
    name = f"{model.name}: vLLM {VLLM_VERSION}'s DeepSeek-V4.1"
    architecture = model.hf_architectures[0] if model.hf_architectures else V41_ARCHITECTURE
    if architecture not in ("DeepseekV4ForCausalLM", V41_ARCHITECTURE):
        raise UnsupportedCombinationError(
            f"{name}: {architecture} is a draft (MTP) model, which vLLM builds only beside its target for speculative "
            "decoding, not modelled under --accounting vllm; plan the DeepSeek-V4.1 model's config."
        )
    if serving.platform != "cuda":
        raise UnsupportedCombinationError(
            f"{name} is modelled on CUDA only (its {serving.platform} classes, deepseek_v41/amd/, build other caches); "
            f"use {option('platform')} cuda or --accounting sglang / exact."
        )
    capability = serving.platform_traits.compute_capability if serving.platform_traits else None
    if capability is not None and capability[0] in (10, 12):
        picked = (
            "mega attention or FlashMLA with DeepSeek-V4.1's own records (528-byte MXFP8 rows, 512-byte pages, the "
            "288-byte NVFP4 compressed record)"
            if capability[0] == 10
            else "the FlashInfer SM120 class"
        )
        raise UnsupportedCombinationError(
            f"{name}: on an SM{capability[0]}x GPU vLLM picks {picked} (_select_dsv4_attn_cls, nvidia/model.py "
            "L201-262), which kvpools does not model yet; plan an SM90 GPU (H100 / H200) or use --accounting sglang "
            "or exact."
        )
    kv = serving.kv_cache_dtype
    if kv != "auto" and not kv.startswith("fp8"):
        raise UnsupportedCombinationError(
            f"{name}: DeepseekV4 packed KV layouts only support fp8 kv-cache, got {kv} (vLLM raises this, "
            f"deepseek_v41/attention.py L160-164). Use {option('kv_cache_dtype')} auto or fp8."
        )
    heads = model.num_attention_heads
    if heads % serving.tp_size:
        raise UnsupportedCombinationError(
            f"{name} asserts num_attention_heads ({heads}) % tensor-parallel size == 0; use a {option('tp_size')} "
            f"that divides {heads}."
        )
    if heads // serving.tp_size > FLASHMLA_MAX_LOCAL_HEADS:
        raise UnsupportedCombinationError(
            f"{name}: DeepseekV4 FlashMLA does not support {heads // serving.tp_size} heads (FP8 decode kernel "
            f"requires h_q in {{64, 128}}; nvidia/flashmla.py L81-88); raise {option('tp_size')}."
        )
    _check_topology(model, name)
    _check_stages(model, serving, name)
    _check_replay_cut(model, serving, name)
    kernel = SM90_KERNEL_BLOCK if capability is None or capability[0] == 9 else OTHER_KERNEL_BLOCK
    kv_sources = set(_backbone(model, "kv_source_layer_ids"))
    if not kv_sources & set(_backbone(model, "index_source_layer_ids")):
        raise UnsupportedCombinationError(
            f"{name}: no kv source layer is also an index source, so no layer owns an indexer key cache, no backend "
            "declares a KV-cache layout and vLLM would group its mixed pages layer-outermost, which kvpools does not "
            "model; use --accounting sglang or exact."
        )
    kernels = [[SWA_KERNEL_BLOCK], [kernel], [kernel], [1]]
    return padded_page_block_size(block_size, kernels, kernel, family="DeepSeek-V4.1", name=name)


def _check_topology(model: ModelSpec, name: str) -> None:
    """``DeepseekV4Attention.__init__``'s checks, layer by layer (``deepseek_v41/attention.py`` L314-361, L444-466,
    L588-614), then the model's ``max(kv_source_layer_ids)`` (``nvidia/model.py`` L860)."""
    kv_sources = _backbone(model, "kv_source_layer_ids")
    index_sources = _backbone(model, "index_source_layer_ids")
    for layer in model.layers:
        i, ratio = layer.index, int(layer.params["compress_ratio"])
        if ratio not in V41_RATIOS:
            raise UnsupportedCombinationError(
                f"{name}: DeepSeek V4.1 layer {i} has compress_ratio={ratio}; only 0 (sliding window), 1 and 2 are "
                "supported (vLLM raises this, deepseek_v41/attention.py L323-329). Ratios 4 and 128 are DeepSeek-V4's: "
                "fix 'compress_ratios', or plan with --accounting sglang or exact."
            )
        if ratio > 0:
            if not kv_sources or not index_sources:
                raise UnsupportedCombinationError(
                    f"{name}: DeepSeek V4.1 requires kv_source_layer_ids / index_source_layer_ids in the config for "
                    f"compressed layers (layer {i} has compress_ratio={ratio}) (vLLM raises this, attention.py "
                    "L345-351); add both lists to the config."
                )
            for key, ids in (("kv_source_layer_ids", kv_sources), ("index_source_layer_ids", index_sources)):
                if not any(s <= i for s in ids):
                    raise UnsupportedCombinationError(
                        f"{name}: compressed layer {i} has no layer of '{key}' at or below it, so vLLM's "
                        f"max(s for s in {key} if s <= {i}) fails at start-up (attention.py L353-358); list a source "
                        f"at or before layer {i}."
                    )
        if i in index_sources and i not in kv_sources:
            if ratio == 0:
                raise UnsupportedCombinationError(
                    f"{name}: index source layer {i} has compress_ratio 0, so it has no kv source, and vLLM asserts "
                    "one for the indexer key cache it shares (deepseek_v41/attention.py L354-361, L457); drop the "
                    "layer from 'index_source_layer_ids' or fix its ratio."
                )
            source = max((s for s in kv_sources if s <= i), default=None)
            if source is None or source not in index_sources:
                raise UnsupportedCombinationError(
                    f"{name}: index source layer {i} shares the indexer key cache of its kv source "
                    f"({'none' if source is None else f'layer {source}'}), which owns none (not an index source "
                    "itself), so vLLM raises 'Indexer K cache source ... not found on this rank' (attention.py "
                    f"L456-466); make layer {i}'s kv source an index source too."
                )
        if i in kv_sources and ratio == 0:
            raise UnsupportedCombinationError(
                f"{name}: kv source layer {i} has compress_ratio 0, and vLLM's DeepSeek V4.1 compressor supports "
                "compress_ratio 1 (full-length compressed cache) and 2; got 0 (compressor.py L264-270); drop the "
                "layer from 'kv_source_layer_ids' or fix its ratio."
            )
    if not model.params.get("kv_source_layer_ids"):
        raise UnsupportedCombinationError(
            f"{name}: the config lists no kv_source_layer_ids, and vLLM's DeepSeek-V4.1 model takes "
            "max(config.kv_source_layer_ids) at start-up (nvidia/model.py L860), which fails on an empty list; add "
            "'kv_source_layer_ids' to the config."
        )


def _check_stages(model: ModelSpec, serving: Serving, name: str) -> None:
    """A compressed layer and the source it reads sit on one pipeline stage (``attention.py`` L456-466, L600-614:
    'PP splits inside a v4.1 kv-sharing group are not supported')."""
    if serving.pp_size == 1:
        return
    stage_of = {
        index: stage
        for stage, layers in enumerate(pp_layer_ranges(model.num_layers, serving.pp_size, serving.pp_layer_partition))
        for index in layers
    }
    kv_sources = _backbone(model, "kv_source_layer_ids")
    for layer in model.layers:
        if int(layer.params["compress_ratio"]) == 0 or layer.index in kv_sources:
            continue
        source = max(s for s in kv_sources if s <= layer.index)
        if stage_of[source] != stage_of[layer.index]:
            raise UnsupportedCombinationError(
                f"{name}: Compressed-KV source model.layers.{source}.attn not found on this rank; PP splits inside a "
                f"v4.1 kv-sharing group are not supported (vLLM raises this for layer {layer.index} on stage "
                f"{stage_of[layer.index]}, its source on stage {stage_of[source]}; attention.py L600-614). Move "
                f"{option('pp_layer_partition')} so each source and its readers share a stage."
            )


def _check_replay_cut(model: ModelSpec, serving: Serving, name: str) -> None:
    """The decoder-side SWA bounded replay's assertion (``nvidia/model.py`` L858-867, L1288-1321): the replay starts
    at the last kv source, which must have ratio <= 1, when the stage holding it holds every later layer, no Engram
    layer sits at or after it and a later layer exists."""
    cut = max(int(i) for i in model.params["kv_source_layer_ids"])  # the raw list, MTP ids included
    if cut >= model.num_layers - 1:
        return
    last_stage = pp_layer_ranges(model.num_layers, serving.pp_size, serving.pp_layer_partition)[-1]
    if cut not in last_stage:
        return
    if any(int(i) >= cut for i in model.params.get("engram_layer_ids", ())):
        return
    ratio = int(model.layers[cut].params["compress_ratio"])
    if ratio > 1:
        raise UnsupportedCombinationError(
            f"{name}: the decoder SWA bounded replay starts at the last kv source, layer {cut}, and vLLM asserts its "
            f"compress_ratio <= 1 (nvidia/model.py L866), got {ratio}: vLLM fails to start. Make the last kv source a "
            "ratio-1 layer."
        )
