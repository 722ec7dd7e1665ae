"""TensorRT-LLM 1.2's PyTorch-backend KV cache manager, as pure arithmetic (no TensorRT-LLM, torch or GPU import).

Each function reproduces one step of ``tensorrt_llm/_torch/pyexecutor/resource_manager.py`` (``KVCacheManager``)
or ``_torch/pyexecutor/_util.py`` (``KvCacheCreator``); the docstrings name the step. kvpools does not copy their
code: the formulas are restated from what those functions compute (``docs/trtllm.md`` cites each source line).

What one layer costs is the architecture plugin's answer to the ``engine_layer_specs`` hook for ``trtllm``
(:class:`~kvpools_core.parts.trtllm.TrtllmLayer` values): :func:`trtllm_layers` asks for it and refuses what kvpools
does not model for TensorRT-LLM yet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from kvpools_core.errors import ConfigError, PluginResultError, UnsupportedCombinationError
from kvpools_core.parts.trtllm import ENGINE, TrtllmLayer, layer_values
from kvpools_core.registry import Registry, get_registry
from kvpools_core.values import ModelSpec, Serving

DEFAULT_FREE_GPU_MEMORY_FRACTION = 0.9
"""``KvCacheConfig.free_gpu_memory_fraction``'s default (``llmapi/llm_args.py``), also the manager's fallback
(``calculate_max_num_blocks``: ``... if free_gpu_memory_fraction is not None else 0.9``)."""
DEFAULT_TOKENS_PER_BLOCK = 32
"""``KvCacheConfig.tokens_per_block``'s default (the "tokens per block=32" of TensorRT-LLM's start-up log)."""
DEFAULT_MAX_BATCH_SIZE = 2048
"""``BaseLlmArgs.max_batch_size``'s default, ``trtllm-serve --max_batch_size``."""
DEFAULT_MAX_NUM_TOKENS = 8192
"""``BaseLlmArgs.max_num_tokens``'s default, ``trtllm-serve --max_num_tokens``."""

KV_DTYPES = {"auto": None, "bf16": 2.0, "fp16": 2.0, "fp8_e4m3": 1.0, "fp4_e2m1": 0.5}
"""kvpools' ``--kv-cache-dtype`` names TensorRT-LLM's manager takes (``get_cache_bytes_per_token`` accepts FP8,
HALF, BF16, NVFP4; ``auto`` is the model's dtype) and bytes per element; nvfp4 adds one fp8 scale per 16."""
TRTLLM_DTYPE_NAMES = {"bf16": "auto", "fp16": "auto", "auto": "auto", "fp8_e4m3": "fp8", "fp4_e2m1": "nvfp4"}
"""How ``kv_cache_config.dtype`` spells each (``auto`` keeps the checkpoint's)."""


def trtllm_layers(
    spec: ModelSpec, serving: Serving | None = None, registry: Registry | None = None
) -> tuple[TrtllmLayer, ...]:
    """The layers TensorRT-LLM's ``KVCacheManager`` would size for ``spec``: what the architecture plugin that
    parsed it answers the ``engine_layer_specs`` hook with for ``engine="trtllm"``
    (:class:`~kvpools_core.parts.trtllm.TrtllmLayer` values, :func:`~kvpools_core.parts.trtllm.trtllm_layer`).

    MHA/GQA layers keep K and V (``kv_factor`` 2, ``head_dim``); MLA layers keep the latent row only
    (``kv_factor`` 1 as ``CacheTypeCpp.SELFKONLY``, ``kv_lora_rank + qk_rope_head_dim``, one head).  Refused, with
    the reason: a model no plugin answers for (its plugin's own refusal passes through, naming the cache manager
    kvpools does not reproduce), and per-layer head sizes (TensorRT-LLM passes one ``head_dim`` to the manager for
    every layer).
    """
    registry = registry or get_registry()
    answer, shaped = registry.call("engine_layer_specs", engine=ENGINE, model=spec, serving=serving or Serving())
    if answer is None:
        answerers = ", ".join(registry.implementers("engine_layer_specs")) or "none"
        raise UnsupportedCombinationError(
            f"kvpools does not model {spec.name}'s architecture ({spec.architecture!r}) for --accounting trtllm yet: "
            f"no installed architecture plugin answers the engine_layer_specs hook for it (plugins answering it: "
            f"{answerers})."
        )
    try:
        layers = layer_values(answer)
    except TypeError as exc:
        label = registry.plugin(shaped[0]).label if shaped else "a plugin"
        raise PluginResultError(
            f"Plugin {label} answered engine_layer_specs for {ENGINE!r} with {exc}: the trtllm engine takes "
            "kvpools_core.parts.trtllm.TrtllmLayer values (trtllm_layer)."
        ) from None
    head_dims = {layer.head_dim for layer in layers if layer.has_kv}
    if len(head_dims) > 1:
        raise UnsupportedCombinationError(
            f"kvpools does not model {spec.name}'s per-layer head sizes "
            f"({sorted(head_dims)}) for --accounting trtllm yet: TensorRT-LLM's "
            "KVCacheManager takes one head_dim for every layer."
        )
    return layers


def pp_layers(num_layers: int, pp_size: int, pp_rank: int) -> range:
    """``Mapping.pp_layers``: ``torch.tensor_split(arange(num_layers), pp_size)[pp_rank]`` -- the first
    ``num_layers % pp_size`` stages hold one layer more."""
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (1 if pp_rank < extra else 0))


def heads_per_rank(num_kv_heads: int, tp_size: int, enable_attention_dp: bool) -> int:
    """``KVCacheManager.__init__``: ``(num_kv_heads + tp - 1) // tp`` per layer, ``tp = 1`` with attention DP."""
    tp = 1 if enable_attention_dp else tp_size
    return (num_kv_heads + tp - 1) // tp


def element_bytes(elements: int, dtype: str, model_dtype_bytes: int, *, scales: bool = True) -> int:
    """``get_size_in_bytes(elements, dtype)``, plus NVFP4's fp8 scale per 16 elements
    (``calculate_scaling_factor_size_bytes``, ``quant_vector_size=16``): ``e/2 + e/16``.  ``scales=False`` is
    the per-window division of ``calculate_max_num_blocks_for_vswa``, which adds no scale bytes."""
    width = KV_DTYPES[dtype]
    if width is None:
        return elements * model_dtype_bytes
    if dtype == "fp4_e2m1" and not scales:
        return elements // 2
    if dtype == "fp4_e2m1":
        if elements % 16:
            raise ConfigError(f"NVFP4 KV needs elements per token divisible by 16, got {elements}.")
        return elements // 2 + elements // 16
    return int(elements * width)


def layer_elements(layer: TrtllmLayer, tp_size: int, enable_attention_dp: bool) -> int:
    """Elements one token stores in ``layer`` on one rank: ``kv_factor x heads_per_rank x head_dim``."""
    heads = 1 if layer.kv_factor == 1 else heads_per_rank(layer.num_kv_heads, tp_size, enable_attention_dp)
    return layer.kv_factor * heads * layer.head_dim


def cache_bytes_per_token(
    layers: Sequence[TrtllmLayer], dtype: str, model_dtype_bytes: int, tp_size: int, enable_attention_dp: bool
) -> int:
    """``KVCacheManager.get_cache_bytes_per_token``: ``kv_factor x Σ heads_per_rank x head_dim`` elements over
    the rank's layers, in the KV dtype (NVFP4 with its scales); ``DSACacheManager.get_cache_bytes_per_token``
    adds each layer's indexer K cache in raw bytes (:attr:`TrtllmLayer.indexer_bytes`)."""
    elements = sum(layer_elements(layer, tp_size, enable_attention_dp) for layer in layers)
    return element_bytes(elements, dtype, model_dtype_bytes) + sum(layer.indexer_bytes for layer in layers)


def estimated_size_per_token(
    layers: Sequence[TrtllmLayer],
    num_rank_layers: int,
    dtype: str,
    model_dtype_bytes: int,
    tp_size: int,
    enable_attention_dp: bool,
    indexer_bytes: int = 0,
) -> int:
    """``KVCacheManager.get_cache_size_per_token`` (the static estimate ``KvCacheCreator`` divides the budget by).

    It differs from :func:`cache_bytes_per_token` in two ways TensorRT-LLM has: the heads are the model-level
    ``num_key_value_heads`` (averaged when per layer) and TP divides ``head_dim x heads`` with a floor (``//
    tp_size``, 1 with attention DP) instead of ceiling the heads; MLA takes ``kv_lora_rank + qk_rope_head_dim``
    unsharded; the layer count is the rank's (``len(mapping.pp_layers(num_attention_layers))``, at least 1).
    NVFP4 is ``ceil(e/2) + ceil(e/16)``; fp8 one byte; otherwise two (the checkpoint's half type).  ``layers``
    is the whole model's.  ``indexer_bytes`` is ``DSACacheManager.get_cache_size_per_token``'s addition: the
    rank's indexer layers x their raw indexer-K bytes per token.
    """
    first = layers[0]
    if first.kv_factor == 1:
        per_layer = first.head_dim
    else:
        heads = sum(layer.num_kv_heads for layer in layers) / len(layers)
        tp = 1 if enable_attention_dp else tp_size
        per_layer = int(first.head_dim * heads // tp)
    elements = first.kv_factor * max(num_rank_layers, 1) * per_layer
    if dtype == "fp8_e4m3":
        return elements + indexer_bytes
    if dtype == "fp4_e2m1":
        return math.ceil(elements / 2) + math.ceil(elements / 16) + indexer_bytes
    return elements * 2 + indexer_bytes


def window_vector(
    num_layers: int, rank_layers: range, max_seq_len: int, max_attention_window: Sequence[int] | None
) -> tuple[int, ...]:
    """Each of a rank's layers' attention window as ``KVCacheManager.__init__`` resolves
    ``kv_cache_config.max_attention_window``.

    None gives every layer ``max_seq_len`` (the V1 ``KVCacheManager`` does not read the model's sliding windows:
    a model's sliding layers are sized as full ones unless ``max_attention_window`` is given); a list of one
    window per model layer is indexed by global layer; any other list is a pattern repeated over the rank's
    local layers (``_get_window_size_to_layers``); each entry is clamped to ``max_seq_len``.
    """
    if not max_attention_window:
        return (max_seq_len,) * len(rank_layers)
    windows = [min(window, max_seq_len) for window in max_attention_window]
    if len(windows) == num_layers:
        return tuple(windows[i] for i in rank_layers)
    return tuple(windows[local % len(windows)] for local in range(len(rank_layers)))


def shortest_pattern(windows: Sequence[int]) -> tuple[int, ...]:
    """The shortest list whose repetition gives ``windows`` (the ``max_attention_window`` to suggest)."""
    for period in range(1, len(windows) + 1):
        if all(windows[i] == windows[i % period] for i in range(len(windows))):
            return tuple(windows[:period])
    return tuple(windows)


def available_kv_memory(free_after_warmup: int, fraction: float) -> int:
    """``KvCacheCreator._cal_max_memory``: ``int((total - peak + temporary_kv) x fraction)``, where
    ``total - peak + temporary_kv`` is the memory left free after the warm-up run (``free_after_warmup``)."""
    return int(free_after_warmup * fraction)


@attrs.frozen(kw_only=True)
class WindowPool:
    """One window size's pool: its layers (rank-local indices), bytes per token of those layers, blocks."""

    window: int
    layers: tuple[int, ...]
    bytes_per_token: int
    share: float
    primary_blocks: int
    secondary_blocks: int = 0
    draft: bool = False
    """The separate draft KV cache manager's pool (one-model MTP, ``_create_one_model_draft_kv_cache_manager``):
    its ``layers`` are the draft layers' indices after the target's."""
    recurrent_state_bytes: int = 0
    """A hybrid's recurrent-state pool (``CppMambaHybridCacheManager``, TensorRT-LLM's
    ``LinearCacheType.RECURRENT_STATES`` window; ``window`` 0 here): the bytes of one block, one request's state
    over the rank's recurrent ``layers``; 0 for a KV pool."""

    @property
    def recurrent(self) -> bool:
        """Whether this is a hybrid's recurrent-state pool (blocks are request states, not tokens)."""
        return self.recurrent_state_bytes > 0

    def primary_bytes(self, tokens_per_block: int) -> int:
        """The bytes the pool's primary blocks take."""
        if self.recurrent:
            return self.primary_blocks * self.recurrent_state_bytes
        return self.primary_blocks * tokens_per_block * self.bytes_per_token


def adjust_window_sizes_for_vswa(
    window_to_layers: Mapping[int, Sequence[int]],
    bytes_per_token_of: Mapping[int, int],
    pool_memory_bytes: int,
    max_tokens: int | None,
) -> dict[int, int]:
    """``KVCacheManager.adjust_window_sizes_for_vswa``: each window -> the window it runs with.

    When one sequence (``Σ_window window x bytes_per_token(layers of window)``) fits the pool, nothing changes;
    otherwise windows are walked from the smallest up, each taking what the remaining memory holds for the
    layers not yet placed, and a window the memory cannot fill gets the tokens reached so far (``max_tokens``
    clamps it).  ``bytes_per_token_of`` maps each layer to its bytes per token.
    """

    def cost(layer_ids: set[int]) -> int:
        return sum(bytes_per_token_of[i] for i in layer_ids)

    required = sum(window * cost(set(layers)) for window, layers in window_to_layers.items())
    if required < pool_memory_bytes:
        return {window: window for window in window_to_layers}
    remaining = pool_memory_bytes
    remaining_layers = {i for layers in window_to_layers.values() for i in layers}
    accumulated = previous = 0
    adjusted: dict[int, int] = {}
    for window in sorted(window_to_layers):
        if remaining > 0 and remaining_layers:
            per_token = cost(remaining_layers)
            tokens = min(remaining // per_token, window - previous)
            remaining -= tokens * per_token
            accumulated += tokens
            if accumulated < window:
                remaining = 0
            if max_tokens is not None:
                accumulated = min(max_tokens, accumulated)
                if accumulated == max_tokens:
                    remaining = 0
        adjusted[window] = accumulated
        remaining_layers -= set(window_to_layers[window])
        previous = window
    return adjusted


def window_upper_bound(blocks_in_primary_pool: int, tokens_per_block: int, max_beam_width: int = 1) -> int:
    """``KVCacheManager.get_max_atten_window_upper_bound`` (no sink tokens): the longest window one sequence can
    hold, ``floor(blocks x tokens_per_block / (beam x tokens_per_block)) x tokens_per_block``; TensorRT-LLM
    asserts "Impossible to fit in any sequence in kvCache" when it is 0."""
    max_blocks_per_seq = blocks_in_primary_pool * tokens_per_block // (max_beam_width * tokens_per_block)
    if max_blocks_per_seq <= 0:
        raise UnsupportedCombinationError(
            "TensorRT-LLM refuses this plan: 'Impossible to fit in any sequence in kvCache' (the KV cache holds "
            f"{blocks_in_primary_pool} blocks of {tokens_per_block} tokens). Give it more memory, a larger "
            "--kv_cache_free_gpu_memory_fraction, or fewer layers per GPU (--tp-size / --pp-size)."
        )
    return max_blocks_per_seq * tokens_per_block


def window_shares(windows: Sequence[int], shares: Sequence[float] | None) -> tuple[float, ...]:
    """``calculate_max_num_blocks_for_vswa``'s memory share of each window size (sorted ascending): equal by
    default, else ``TRTLLM_WINDOW_SIZE_SHARES`` -- one per window size, summing to exactly 1.0 (TensorRT-LLM
    asserts both)."""
    if shares is None:
        return tuple(1.0 / len(windows) for _ in windows)
    if len(shares) != len(windows):
        raise ConfigError(
            f"TRTLLM_WINDOW_SIZE_SHARES (--window_size_shares) has {len(shares)} shares for {len(windows)} window "
            f"sizes {sorted(windows)}: TensorRT-LLM asserts 'Number of shares in TRTLLM_WINDOW_SIZE_SHARES must "
            "match number of window sizes'. Give one share per window size, smallest window first."
        )
    if sum(shares) != 1.0:
        raise ConfigError(
            f"TRTLLM_WINDOW_SIZE_SHARES (--window_size_shares) {','.join(f'{s:g}' for s in shares)} sums to "
            f"{sum(shares)!r}: TensorRT-LLM asserts 'Sum of shares in TRTLLM_WINDOW_SIZE_SHARES must be 1.0' "
            "(compared exactly, as floats). Choose shares whose float sum is 1.0, e.g. 0.25,0.75."
        )
    return tuple(shares)


__all__ = [
    "DEFAULT_FREE_GPU_MEMORY_FRACTION",
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_NUM_TOKENS",
    "DEFAULT_TOKENS_PER_BLOCK",
    "KV_DTYPES",
    "TrtllmLayer",
    "WindowPool",
    "adjust_window_sizes_for_vswa",
    "available_kv_memory",
    "cache_bytes_per_token",
    "element_bytes",
    "estimated_size_per_token",
    "heads_per_rank",
    "layer_elements",
    "pp_layers",
    "shortest_pattern",
    "trtllm_layers",
    "window_shares",
    "window_upper_bound",
    "window_vector",
]
