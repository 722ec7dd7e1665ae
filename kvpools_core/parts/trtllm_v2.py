"""What an architecture plugin answers for a layer TensorRT-LLM keeps in a ``KVCacheManagerV2`` subclass: the layer's
buffers, each with its life cycle (a sliding window or none), its bytes per cache entry and how many tokens one
entry stands for.

``KVCacheManagerV2`` (``tensorrt_llm/_torch/pyexecutor/kv_cache_manager_v2.py``; the runtime in
``tensorrt_llm/runtime/kv_cache_manager_v2/``) describes every layer as an ``AttentionLayerConfig`` with
``BufferConfig(role, size=bytes per block)`` buffers and a ``sliding_window_size``; the runtime groups buffers by life
cycle and size into pool groups and splits one GPU quota among them (the pool-ratio solve,
:mod:`kvpools_core.engines.trtllm.manager_v2`).  A plugin answers the ``engine_layer_specs`` hook for
``engine="trtllm"`` with :class:`~kvpools_core.parts.trtllm.TrtllmLayer` values whose ``v2`` is a
:class:`TrtllmV2Layer`, and the trtllm engine plans them with that solve -- the same contract for any architecture a
``KVCacheManagerV2`` subclass serves (DeepSeek-V4's ``DeepseekV4CacheManager`` is the first).
"""

from __future__ import annotations

import attrs


@attrs.frozen(kw_only=True)
class TrtllmBuffer:
    """One buffer of one layer in a ``KVCacheManagerV2``: ``kind`` names it (TensorRT-LLM's attention type, e.g.
    ``SWA``), ``entry_bytes`` are the bytes of one cache entry, ``ratio`` the tokens one entry stands for (a
    compressed cache keeps ``tokens_per_block // ratio`` entries per block), ``window`` the sliding window of its life
    cycle in tokens (None: every block of the sequence is kept)."""

    kind: str
    entry_bytes: int
    ratio: int = 1
    window: int | None = None

    def block_bytes(self, tokens_per_block: int) -> int:
        """``BufferConfig.size``: one block's bytes, ``entry_bytes x (tokens_per_block // ratio)``."""
        return self.entry_bytes * (tokens_per_block // self.ratio)

    @property
    def estimated_bytes_per_token(self) -> int:
        """The manager's estimate per token (DeepSeek-V4's ``_get_attn_bytes_per_token``): ``entry_bytes // ratio``
        -- a windowed buffer counts its full entry per token, as TensorRT-LLM's estimate does."""
        return self.entry_bytes // self.ratio


@attrs.frozen(kw_only=True)
class TrtllmV2Layer:
    """A layer as a ``KVCacheManagerV2`` subclass keeps it: the ``manager`` (its class name), the layer's
    ``buffers`` in the order the manager adds them, ``quota_extra_bytes`` the manager adds to the quota it derives from
    ``max_tokens`` (``_get_cache_quota``), and the ``tokens_per_block`` values it accepts (empty: any).  Model-level
    values repeat on every layer; the plugin refuses the KV dtypes the manager does not keep."""

    manager: str
    buffers: tuple[TrtllmBuffer, ...]
    quota_extra_bytes: int = 0
    tokens_per_block: tuple[int, ...] = ()

    @property
    def estimated_bytes_per_token(self) -> int:
        """The layer's share of the manager's ``get_cache_bytes_per_token``."""
        return sum(buffer.estimated_bytes_per_token for buffer in self.buffers)


__all__ = ["TrtllmBuffer", "TrtllmV2Layer"]
