"""The layer specs vLLM 0.33 builds for DeepSeek-V4 (``--accounting vllm``).

Line numbers are vLLM 0.33.0's; ``DeepseekV4ForCausalLM`` is ``vllm.models.deepseek_v4`` (``registry.py`` L99),
its CUDA implementation ``nvidia/model.py``.  Without ``--attention-backend`` every CUDA GPU but SM12x runs
``DeepseekV4FlashMLAAttention`` (``_select_dsv4_attn_cls``, L537-568), whose ``fp8_ds_mla`` rows
(``use_fp8_ds_mla_layout``) turn ``--kv-cache-dtype auto`` / ``fp8*`` into ``fp8_ds_mla`` and refuse any other
(``_resolve_dsv4_kv_cache_dtype``, ``attention.py`` L94-132); SM12x's FlashInfer class uses the same layout.
Each decoder layer ``i`` registers, in this order (the order of ``static_forward_context``, which
``get_kv_cache_spec`` keeps):

* on a c4 layer, its indexer's key cache ``model.layers.i.attn.indexer.k_cache``
  (``DeepseekV4IndexerCache.get_kv_cache_spec``, ``attention.py`` L911-925: uint8 rows of ``index_head_dim +
  index_head_dim // 128 * 4`` bytes (L1024-1029), one per 4 tokens) and the indexer
  compressor's state ``...indexer.compressor.state_cache``;
* its SWA cache ``model.layers.i.attn.swa_cache`` (``DeepseekV4SWACache``, ``sparse_swa.py`` L76-147: 64-token
  blocks of 584-byte rows, window ``sliding_window``);
* on a c4 / c128 layer, the compressed latent ``model.layers.i.attn`` (``DeepseekV4Attention.get_kv_cache_spec``,
  ``attention.py`` L860-883: one 584-byte row per ``compress_ratio`` tokens; an SWA-only layer answers None) and
  its compressor's state ``...attn.compressor.state_cache``.

A compressor's state (``CompressorStateCache``, ``compressor.py`` L139-192) is a ``SlidingWindowMLASpec`` of
float32 ``2 x coff x head_dim`` rows (``coff`` 2 on c4, which overlaps windows, else 1), window ``coff x ratio``,
in 4-token (c4) or 8-token (c128) blocks.  Every page is padded to a multiple of 576 bytes (the ``alignment`` of
the ``fp8_ds_mla`` layout).  ``customize_attention_spec`` (``v1/worker/utils.py`` L476-486) gives the latent and
indexer caches ``block_stride_alignment = MultipleOf(256)``: their backends' only kernel block
(``sparse_mla.py`` L60, ``indexer.py`` L355).  The indexer's backend declares the layouts ``BLHNC`` / ``BLNHC``
(``indexer.py`` L349-352), so vLLM packs the pages block-outermost.  The attention block size is the backends'
common one (``Platform._preferred_block_size_for_backends``, ``platforms/interface.py`` L700-747): 256.  Nothing
here depends on the TP size (one latent head, ``max_tp_shards=1``).

DeepSeek-V4.1 (``model_type`` ``deepseek_v41``) is vLLM's ``DeepseekV41ForCausalLM``: :mod:`.vllm_v41`.  A
``deepseek_v4`` config with compress ratios 1 or 2 is refused: vLLM's DeepSeek-V4 classes have no compressor for them.

Refused, with the reason: any other ``--kv-cache-dtype`` (vLLM raises), ``--block-size`` other than 256 (vLLM
splits larger blocks into 256-token kernel blocks, which its padded pages do not support), a config without c4
layers (no backend declares a layout; vLLM's fallback grouping for those pages is not modelled), non-CUDA
platforms (their DeepSeek-V4 classes differ), and the MTP draft layer (speculative decoding is not modelled
under ``--accounting vllm``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.options import option
from kvpools_core.parts.vllm.layers import padded_page_block_size
from kvpools_core.parts.vllm.specs import KVCacheSpec, MLAAttentionSpec, SlidingWindowMLASpec

from .config import C1, C2, C4, C128

if TYPE_CHECKING:
    from kvpools_core.values import ModelSpec, Serving

VLLM_VERSION = "0.33.0"
SPARSE_MLA_KERNEL_BLOCK = 256
"""``DeepseekV4SparseMLABackend`` and ``DeepseekV4IndexerBackend`` kernel blocks (``sparse_mla.py`` L60-61,
``indexer.py`` L355-357)."""
SWA_KERNEL_BLOCK = 32
"""``DeepseekSparseSWABackend``: ``MultipleOf(32)`` (``sparse_swa.py`` L161-162)."""
SWA_BLOCK_SIZE = 64
"""``DeepseekV4SWACache``'s ``block_size`` default, which ``DeepseekV4Attention`` keeps (``sparse_swa.py`` L85)."""
PACKED_ROW_BYTES = 584
"""An ``fp8_ds_mla`` row: 448 B fp8 nope + 128 B bf16 rope + 8 B scales, a constant in vLLM (``attention.py`` L880-882,
``sparse_swa.py`` L86)."""
ROW_ALIGNMENT = 576
"""The ``fp8_ds_mla`` page alignment (``attention.py`` L877 and L923, ``compressor.py`` L191, ``sparse_swa.py`` L87)."""
INDEXER_QUANT_BLOCK = 128
"""``DeepseekV4Indexer.quant_block_size`` (``attention.py`` L1007): one fp32 scale per 128 fp8 values."""
STATE_DTYPE_BYTES = 4
"""``CompressorStateCache`` asserts float32 (``compressor.py`` L157)."""
STATE_BLOCK_SIZE = {4: 4, 128: 8}
"""``CompressorStateCache.block_size`` by compress ratio (``compressor.py`` L168-171)."""
INDEXER_LAYOUTS = ("BLHNC", "BLNHC")
"""``DeepseekV4IndexerBackend.supported_kv_cache_layouts`` (``indexer.py`` L349-352)."""
FLASHMLA_MAX_LOCAL_HEADS = 128
"""``DeepseekV4FlashMLAAttention.get_padded_num_q_heads``: its FP8 decode kernel takes up to 128 heads
(``nvidia/flashmla.py`` L77-84)."""


def _check_serving(model: ModelSpec, serving: Serving, block_size: int) -> int:
    """What vLLM refuses before building the specs, and the attention block size it settles on."""
    name = f"{model.name}: vLLM {VLLM_VERSION}'s DeepSeek-V4"
    architecture = model.hf_architectures[0] if model.hf_architectures else "DeepseekV4ForCausalLM"
    if architecture != "DeepseekV4ForCausalLM":
        raise UnsupportedCombinationError(
            f"{name}: {architecture} is a draft (MTP) model, which vLLM builds only beside its target for speculative "
            "decoding, not modelled under --accounting vllm; plan the DeepseekV4ForCausalLM config."
        )
    if serving.platform != "cuda":
        raise UnsupportedCombinationError(
            f"{name} is modelled on CUDA only (its {serving.platform} classes build other caches); use "
            f"{option('platform')} cuda or --accounting sglang / exact."
        )
    kv = serving.kv_cache_dtype
    if kv != "auto" and not kv.startswith("fp8"):
        raise UnsupportedCombinationError(
            f"{name}: DeepseekV4 fp8_ds_mla layout only supports fp8 kv-cache, got {kv} (vLLM raises this). Use "
            f"{option('kv_cache_dtype')} auto or fp8."
        )
    heads = model.num_attention_heads
    if heads % serving.tp_size:
        raise UnsupportedCombinationError(
            f"{name} asserts num_attention_heads ({heads}) % tensor-parallel size == 0; use a {option('tp_size')} "
            f"that divides {heads}."
        )
    if heads // serving.tp_size > FLASHMLA_MAX_LOCAL_HEADS:
        raise UnsupportedCombinationError(
            f"{name}: FlashMLA does not support {heads // serving.tp_size} heads per rank (its FP8 decode kernel "
            f"takes up to {FLASHMLA_MAX_LOCAL_HEADS}); raise {option('tp_size')}."
        )
    low = sorted({layer.kind for layer in model.layers if layer.kind in (C1, C2)})
    if low:
        raise UnsupportedCombinationError(
            f"{name}: compress ratios 1 and 2 (layers of kind {', '.join(low)}) are DeepSeek-V4.1's, which vLLM "
            "serves with DeepseekV41ForCausalLM (model_type deepseek_v41); its DeepSeek-V4 classes build no compressor "
            "for them (CompressorStateCache asserts compress_ratio in [4, 128], deepseek_v4/compressor.py L158). Set "
            "'model_type' to 'deepseek_v41' for a DeepSeek-V4.1 checkpoint, or use --accounting sglang or exact."
        )
    if not any(layer.kind == C4 for layer in model.layers):
        raise UnsupportedCombinationError(
            f"{name}: a config without c4 layers has no indexer, so no backend declares a KV-cache layout and vLLM "
            "would group its mixed pages layer-outermost, which kvpools does not model; use --accounting sglang "
            "or exact."
        )
    kernels = [[SWA_KERNEL_BLOCK], [SPARSE_MLA_KERNEL_BLOCK], [SPARSE_MLA_KERNEL_BLOCK], [1]]
    return padded_page_block_size(block_size, kernels, SPARSE_MLA_KERNEL_BLOCK, family="DeepSeek-V4", name=name)


def _state_spec(ratio: int, head_dim: int) -> SlidingWindowMLASpec:
    """``CompressorStateCache.get_kv_cache_spec`` (``compressor.py`` L179-192) of a compressor over ``head_dim``."""
    coff = 1 + (ratio == 4)
    return SlidingWindowMLASpec(
        block_size=STATE_BLOCK_SIZE[ratio],
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=2 * coff * head_dim,  # kv_state + score_state (L282-283)
        dtype_bytes=STATE_DTYPE_BYTES,
        sliding_window=coff * ratio,
        alignment=ROW_ALIGNMENT,
    )


def dsv4_vllm_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, KVCacheSpec]:
    """Every cache layer's spec on one TP rank, named and ordered as vLLM registers them (DeepSeek-V4.1's:
    :mod:`.vllm_v41`)."""
    from .vllm_v41 import dsv41_vllm_specs, is_dsv41

    if is_dsv41(model):
        return dsv41_vllm_specs(model, serving, block_size)
    block = _check_serving(model, serving, block_size)
    head_dim = model.params["qk_nope_head_dim"] + model.params["qk_rope_head_dim"]
    swa = SlidingWindowMLASpec(
        block_size=SWA_BLOCK_SIZE,
        num_kv_heads=1,
        max_tp_shards=1,
        head_size=head_dim,
        dtype_bytes=1,
        sliding_window=model.params["window_size"],
        cache_dtype_str="fp8_ds_mla",
        state_content_bytes=PACKED_ROW_BYTES,
        alignment=ROW_ALIGNMENT,
        model_version="deepseek_v4",
    )
    specs: dict[str, KVCacheSpec] = {}
    for layer in model.layers:
        prefix = f"model.layers.{layer.index}.attn"
        ratio = int(layer.params["compress_ratio"])
        if layer.kind == C4:
            index_head_dim = int(layer.params["index_head_dim"])
            specs[f"{prefix}.indexer.k_cache"] = MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                max_tp_shards=1,
                head_size=index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * 4,
                dtype_bytes=1,
                tokens_per_state=ratio,
                alignment=ROW_ALIGNMENT,
                block_stride_alignment=SPARSE_MLA_KERNEL_BLOCK,
                supported_layouts=INDEXER_LAYOUTS,
            )
            specs[f"{prefix}.indexer.compressor.state_cache"] = _state_spec(ratio, index_head_dim)
        specs[f"{prefix}.swa_cache"] = swa
        if layer.kind in (C4, C128):
            specs[prefix] = MLAAttentionSpec(
                block_size=block,
                num_kv_heads=1,
                max_tp_shards=1,
                head_size=head_dim,
                dtype_bytes=1,
                tokens_per_state=ratio,
                cache_dtype_str="fp8_ds_mla",
                alignment=ROW_ALIGNMENT,
                model_version="deepseek_v4",
                state_content_bytes=PACKED_ROW_BYTES,
                block_stride_alignment=SPARSE_MLA_KERNEL_BLOCK,
            )
            specs[f"{prefix}.compressor.state_cache"] = _state_spec(ratio, head_dim)
    return specs
