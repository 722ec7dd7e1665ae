"""DeepSeek-V4 under ``--accounting trtllm``: each layer's buffers as TensorRT-LLM's ``DeepseekV4CacheManager`` (a
``KVCacheManagerV2``) declares them, answered through the core's ``engine_layer_specs`` hook as
:class:`~kvpools_core.parts.trtllm.TrtllmLayer` values with a :class:`~kvpools_core.parts.trtllm_v2.TrtllmV2Layer`.

Sources (``NVIDIA/TensorRT-LLM``):

- ``tensorrt_llm/_torch/attention_backend/sparse/deepseek_v4/cache_manager.py``@``10ce7685``:
  ``DeepseekV4CacheManager._build_cache_config`` adds, per layer, an SWA buffer (window ``window_size +
  max_draft_len``), and for a compressed layer (ratio > 1) a COMPRESS buffer (no window) and COMPRESSOR_STATE /
  COMPRESSOR_SCORE buffers (window ``(2 if ratio == 4 else 1) x ratio + max_draft_len``, ``_get_window_size``), and
  for a sparse layer (ratio 4) INDEXER_COMPRESS (no window) and INDEXER_COMPRESSOR_STATE / _SCORE (same window);
  ``_get_attn_bytes_per_block`` = token bytes x ``tokens_per_block`` (``// ratio`` for the two compressed kinds);
  ``_get_cache_quota(max_tokens)`` = ``max_tokens x get_cache_bytes_per_token() + len(DeepseekV4AttentionType) x
  2 MiB``; ``__init__`` asserts ``SELFKONLY``, one KV head, a BF16 or FP8 cache and ``tokens_per_block in [128,
  256]``;
- ``.../sparse/deepseek_v4/deepseek_v4.py``@``58597602``: ``get_attn_dim`` (``head_dim`` for SWA and COMPRESS,
  ``state_factor x head_dim`` for the compressor's state and score, ``index_head_dim`` and ``state_factor x
  index_head_dim`` for the indexer's), ``get_token_bytes`` (2 B per element, 1 B with an fp8 KV cache, 4 B for every
  state and score, and the indexer's fp8-blockwise row ``index_head_dim + index_head_dim // 128 x 4``);
- ``tensorrt_llm/llmapi/llm_args.py`` ``DeepSeekV4SparseAttentionConfig.normalize_compress_ratios`` (stored copy):
  a checkpoint's ratio 0 (SWA only) is 1.
"""

from __future__ import annotations

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.parts.trtllm import TrtllmLayer
from kvpools_core.parts.trtllm_v2 import TrtllmBuffer, TrtllmV2Layer
from kvpools_core.values import ModelSpec, Serving

MANAGER = "DeepseekV4CacheManager"
ATTENTION_TYPES = 7
"""``len(DeepseekV4AttentionType)``: SWA, COMPRESS, COMPRESSOR_STATE, COMPRESSOR_SCORE, INDEXER_COMPRESS,
INDEXER_COMPRESSOR_STATE, INDEXER_COMPRESSOR_SCORE."""
QUOTA_PAD = 2 << 20
"""``_get_cache_quota``'s 2 MiB per attention type."""
TOKENS_PER_BLOCK = (128, 256)
SPARSE_RATIO = 4
"""``DEEPSEEK_V4_SPARSE_RATIO`` (the layers with an indexer) and ``DEEPSEEK_V4_OVERLAP_COMPRESSOR_RATIO``."""
STATE_BYTES = 4
"""The compressors' state and score are float32 (``compressor_dtype == DataType.FLOAT``, asserted)."""
KV_DTYPE_BYTES = {"auto": 2, "bf16": 2, "fp8_e4m3": 1}
"""``DeepseekV4CacheManager`` asserts BF16 or FP8 (``has_fp8_kv_cache``: 1 B, else 2 B)."""


def indexer_row_bytes(index_head_dim: int) -> int:
    """``get_token_bytes`` of INDEXER_COMPRESS with the fp8-blockwise indexer cache the manager sets
    (``_indexer_cache_dtype = KVCacheDtype.FP8_BLOCKWISE``): one byte a value, one fp32 scale per 128."""
    return index_head_dim + index_head_dim // 128 * 4


def layer_buffers(
    ratio: int, head_dim: int, index_head_dim: int, window: int, dtype_bytes: int, max_draft_len: int = 0
) -> tuple[TrtllmBuffer, ...]:
    """One layer's buffers in ``_build_cache_config``'s order."""
    ratio = ratio or 1
    state_factor = 2 if ratio == SPARSE_RATIO else 1
    buffers = [TrtllmBuffer(kind="SWA", entry_bytes=head_dim * dtype_bytes, window=window + max_draft_len)]
    if ratio > 1:
        state_window = state_factor * ratio + max_draft_len
        state = state_factor * head_dim * STATE_BYTES
        buffers += [
            TrtllmBuffer(kind="COMPRESS", entry_bytes=head_dim * dtype_bytes, ratio=ratio),
            TrtllmBuffer(kind="COMPRESSOR_STATE", entry_bytes=state, window=state_window),
            TrtllmBuffer(kind="COMPRESSOR_SCORE", entry_bytes=state, window=state_window),
        ]
        if ratio == SPARSE_RATIO:
            index_state = state_factor * index_head_dim * STATE_BYTES
            buffers += [
                TrtllmBuffer(kind="INDEXER_COMPRESS", entry_bytes=indexer_row_bytes(index_head_dim), ratio=ratio),
                TrtllmBuffer(kind="INDEXER_COMPRESSOR_STATE", entry_bytes=index_state, window=state_window),
                TrtllmBuffer(kind="INDEXER_COMPRESSOR_SCORE", entry_bytes=index_state, window=state_window),
            ]
    return tuple(buffers)


def dsv4_trtllm_layers(model: ModelSpec, serving: Serving) -> tuple[TrtllmLayer, ...]:
    """Every decoder layer of a DeepSeek-V4 model as ``DeepseekV4CacheManager`` keeps it.  Refused, with the reason:
    KV dtypes the manager does not keep (its assertion), compress ratios TensorRT-LLM's DeepSeek-V4 metadata does not
    take (``_supported_ratios = {1, 4, 128}``), DeepSeek-V4.1's shared KV sources, and a window other than 128
    (``DeepseekV4TrtllmAttentionMetadata`` asserts ``window_size == 128``)."""
    dtype = serving.kv_cache_dtype
    if dtype not in KV_DTYPE_BYTES:
        raise UnsupportedCombinationError(
            f"TensorRT-LLM refuses --kv-cache-dtype {dtype} for {model.name}: DeepseekV4CacheManager asserts "
            "'Unsupported dtype ..., only support BF16 and FP8'. Use --kv-cache-dtype auto, bf16 or fp8_e4m3."
        )
    raw = [int(layer.params.get("compress_ratio", 0)) for layer in model.layers]
    low = sorted({ratio for ratio in raw if ratio in (1, 2)})
    if low:
        raise UnsupportedCombinationError(
            f"kvpools does not model {model.name}'s ratio-{'/'.join(map(str, low))} compressed layers (DeepSeek-V4.1) "
            "for --accounting trtllm yet: TensorRT-LLM's DeepSeekV4SparseAttentionConfig normalizes a checkpoint's 0 "
            "(SWA only) to 1, so a compressed ratio-1 layer would be planned as SWA only, and its DeepSeek-V4 metadata "
            "takes ratios 1, 4 and 128 only; use --accounting sglang or vllm."
        )
    ratios = [ratio or 1 for ratio in raw]
    unsupported = sorted(set(ratios) - {1, SPARSE_RATIO, 128})
    if unsupported:
        raise UnsupportedCombinationError(
            f"TensorRT-LLM refuses {model.name}'s compress ratios {unsupported}: DeepseekV4TrtllmAttentionMetadata "
            "asserts 'Unsupported compress ratios ... Only {1, 4, 128} are supported'; use --accounting sglang or vllm."
        )
    if model.params.get("kv_source_layer_ids"):
        raise UnsupportedCombinationError(
            f"kvpools does not model {model.name}'s shared KV sources (kv_source_layer_ids) for --accounting trtllm "
            "yet: DeepseekV4CacheManager gives every layer its own buffers; use --accounting sglang or vllm."
        )
    window = int(model.params["window_size"])
    if window != 128:
        raise UnsupportedCombinationError(
            f"TensorRT-LLM refuses {model.name}'s window of {window}: DeepseekV4TrtllmAttentionMetadata asserts "
            "'Dual-pool sparse MLA requires window_size == 128'."
        )
    head_dim = int(model.params["qk_nope_head_dim"]) + int(model.params["qk_rope_head_dim"])
    index_head_dim = int(model.params.get("index_head_dim", 0))
    dtype_bytes = KV_DTYPE_BYTES[dtype]
    layers = []
    for layer, ratio in zip(model.layers, ratios, strict=True):
        layers.append(
            TrtllmLayer(
                index=layer.index,
                num_kv_heads=1,
                head_dim=head_dim,
                kv_factor=1,
                v2=TrtllmV2Layer(
                    manager=MANAGER,
                    buffers=layer_buffers(ratio, head_dim, index_head_dim, window, dtype_bytes),
                    quota_extra_bytes=ATTENTION_TYPES * QUOTA_PAD,
                    tokens_per_block=TOKENS_PER_BLOCK,
                ),
            )
        )
    return tuple(layers)


__all__ = ["MANAGER", "dsv4_trtllm_layers", "indexer_row_bytes", "layer_buffers"]
