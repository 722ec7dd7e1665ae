"""vLLM 0.33's per-layer KV-cache specs, as plain frozen values (no torch, no vLLM import).

Each class mirrors the vLLM class of the same name in ``vllm/v1/kv_cache_interface.py`` (0.33.0): the
fields that change a page's bytes or a request's worst-case blocks, and the two sizing formulas every
spec implements, ``page_size_bytes`` and ``max_memory_usage_bytes``.  Equality is field-wise and
class-exact, as vLLM's dataclass equality is, because grouping buckets layers by equal specs.

Modelled: one state per token (``tokens_per_state == 1``, i.e. no DeepSeek-V4 compression), dense or
``state_content_bytes``-packed content, ``page_size_padded``, no ``block_stride_alignment`` (the default
``None``, i.e. 1).  Dtypes are carried as their byte size (``get_dtype_size``); a ``MambaSpec`` also records
vLLM's ``mamba_type``, so two mixers with equal byte sizes still group apart, as in vLLM.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from kvpools_core.errors import InvalidValueError, UnsupportedCombinationError

if TYPE_CHECKING:
    from kvpools_core.vllm.planning import VllmLimits

S = TypeVar("S", bound="KVCacheSpec")


def cdiv(a: int, b: int) -> int:
    """``vllm.utils.math_utils.cdiv``: ceiling division."""
    return -(a // -b)


def _positive(_instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidValueError(f"{attribute.name} must be a positive integer, got {value!r}.")


def _non_negative(_instance: Any, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidValueError(f"{attribute.name} must be a non-negative integer, got {value!r}.")


def _one_of(choices: tuple[str, ...]) -> Any:
    def check(_instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in choices:
            raise InvalidValueError(f"{attribute.name} must be one of {', '.join(choices)}, got {value!r}.")

    return check


def _optional_positive(instance: Any, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        _positive(instance, attribute, value)


@attrs.frozen(kw_only=True)
class KVCacheSpec:
    """``KVCacheSpec`` (``kv_cache_interface.py`` L202): one layer's cache; ``block_size`` tokens per block."""

    block_size: int = attrs.field(validator=_positive)

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError

    def max_memory_usage_bytes(self, limits: VllmLimits) -> int:
        raise NotImplementedError

    def with_block_size(self: S, block_size: int) -> S:
        """``copy_with_new_block_size``: the same spec with another block size."""
        return attrs.evolve(self, block_size=block_size)


@attrs.frozen(kw_only=True)
class AttentionSpec(KVCacheSpec):
    """``AttentionSpec`` (L552): page = ``num_kv_heads * block_size * (head_size + head_size_v) * dtype_bytes``.

    ``state_content_bytes`` replaces ``(head_size + head_size_v) * dtype_bytes`` for packed layouts
    (``fp8_ds_mla``: 656 bytes per token, set by ``mla_attention.py`` L1386).  ``dcp_sharded`` defaults to
    True for attention, as in vLLM; ``max_tp_shards`` records how many distinct TP shards exist.
    """

    num_kv_heads: int = attrs.field(validator=_positive)
    head_size: int = attrs.field(validator=_positive)
    head_size_v: int = attrs.field(validator=_non_negative)
    dtype_bytes: int = attrs.field(validator=_positive)
    page_size_padded: int | None = attrs.field(default=None, validator=_optional_positive)
    state_content_bytes: int | None = attrs.field(default=None, validator=_optional_positive)
    dcp_sharded: bool = True
    max_tp_shards: int | None = attrs.field(default=None, validator=_optional_positive)

    def __attrs_post_init__(self) -> None:
        if self.page_size_padded is not None and self.page_size_padded < self.unpadded_page_size_bytes:
            raise InvalidValueError(
                f"page_size_padded ({self.page_size_padded}) is smaller than the page itself "
                f"({self.unpadded_page_size_bytes} bytes)."
            )

    @property
    def state_content_size_bytes(self) -> int:
        """Bytes one token stores per KV head (``state_content_size_bytes``)."""
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        return (self.head_size + self.head_size_v) * self.dtype_bytes

    @property
    def unpadded_page_size_bytes(self) -> int:
        return self.num_kv_heads * self.block_size * self.state_content_size_bytes

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None else self.unpadded_page_size_bytes


@attrs.frozen(kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """``FullAttentionSpec`` (L619): a request at ``max_model_len`` holds ``cdiv(L', block_size)`` pages,
    ``L' = cdiv(max_model_len, dcp)`` when the cache is DCP-sharded."""

    def max_memory_usage_bytes(self, limits: VllmLimits) -> int:
        max_model_len = limits.max_model_len
        if self.dcp_sharded and limits.decode_context_parallel_size > 1:
            max_model_len = cdiv(max_model_len, limits.decode_context_parallel_size)
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes


@attrs.frozen(kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """``MLAAttentionSpec`` (L729): one latent per token (``head_size_v = 0``); ``cache_role`` is
    ``"indexer"`` for DeepSeek-V3.2's indexer cache (``deepseek_v2.py`` L658-666), ``"sparse"`` otherwise."""

    head_size_v: int = attrs.field(default=0, validator=_non_negative)
    cache_dtype_str: str | None = None
    cache_role: str = attrs.field(default="sparse", validator=attrs.validators.in_(("sparse", "indexer")))


@attrs.frozen(kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """``SlidingWindowSpec`` (L901): ``cdiv(min(window - 1 + extra + in_flight, L), block_size) + 1`` pages
    (the ``+ 1``: a window may straddle a block boundary)."""

    sliding_window: int = attrs.field(validator=_positive)
    extra_retained_tokens: int = attrs.field(default=0, validator=_non_negative)

    def max_memory_usage_bytes(self, limits: VllmLimits) -> int:
        if self.dcp_sharded and limits.decode_context_parallel_size > 1:
            raise UnsupportedCombinationError(
                "vLLM does not support sliding-window layers under decode context parallelism "
                "(SlidingWindowSpec asserts 'DCP not support sliding window.'); use "
                "--decode-context-parallel-size 1."
            )
        num_tokens = min(
            self.sliding_window - 1 + self.extra_retained_tokens + limits.max_in_flight_tokens, limits.max_model_len
        )
        return (cdiv(num_tokens, self.block_size) + 1) * self.page_size_bytes


@attrs.frozen(kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """``ChunkedLocalAttentionSpec`` (L861): ``cdiv(min(chunk + in_flight, L), block_size)`` pages."""

    attention_chunk_size: int = attrs.field(validator=_positive)

    def max_memory_usage_bytes(self, limits: VllmLimits) -> int:
        num_tokens = min(self.attention_chunk_size + limits.max_in_flight_tokens, limits.max_model_len)
        return cdiv(num_tokens, self.block_size) * self.page_size_bytes


def _shape_tuple(shapes: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(d) for d in shape) for shape in shapes)


def _int_tuple(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


MAMBA_TYPES = ("mamba1", "mamba2", "short_conv", "linear", "gdn_attn")
"""``MambaAttentionBackendEnum`` members (``v1/attention/backends/registry.py`` L290-294), lower-cased: the mixer
kind a ``MambaSpec`` records (part of its equality, so two mixers never share a group)."""


@attrs.frozen(kw_only=True)
class MambaSpec(KVCacheSpec):
    """``MambaSpec`` (L1094): one state per request, page = ``Σ prod(shape) * dtype_bytes`` whatever the block
    size; ``mamba_cache_mode == "align"`` holds ``2 + spec + checkpoint`` pages, otherwise ``1 + spec``.

    ``mamba_type``, ``mamba_cache_mode`` and ``prefill_checkpoint_alignment`` change no size but are fields of
    vLLM's dataclass, so they take part in equality (grouping) as there; the size formulas read the mode from
    ``VllmLimits``, as vLLM reads ``cache_config.mamba_cache_mode``.
    """

    shapes: tuple[tuple[int, ...], ...] = attrs.field(converter=_shape_tuple)
    dtype_bytes: tuple[int, ...] = attrs.field(converter=_int_tuple)
    page_size_padded: int | None = attrs.field(default=None, validator=_optional_positive)
    mamba_type: str = attrs.field(default="mamba2", validator=_one_of(MAMBA_TYPES))
    mamba_cache_mode: str = attrs.field(default="none", validator=_one_of(("none", "align", "all")))
    num_speculative_blocks: int = attrs.field(default=0, validator=_non_negative)
    num_prefill_checkpoint_blocks: int = attrs.field(default=0, validator=_non_negative)
    prefill_checkpoint_alignment: int | None = attrs.field(default=None, validator=_optional_positive)

    def __attrs_post_init__(self) -> None:
        if not self.shapes or len(self.shapes) != len(self.dtype_bytes):
            raise InvalidValueError(
                f"MambaSpec needs one dtype size per state shape, got {len(self.shapes)} shapes and "
                f"{len(self.dtype_bytes)} dtype sizes."
            )
        if self.page_size_padded is not None and self.page_size_padded < self.state_bytes:
            raise InvalidValueError(
                f"page_size_padded ({self.page_size_padded}) is smaller than the state ({self.state_bytes} bytes)."
            )

    @property
    def state_bytes(self) -> int:
        return sum(math.prod(shape) * size for shape, size in zip(self.shapes, self.dtype_bytes, strict=True))

    @property
    def page_size_bytes(self) -> int:
        return self.page_size_padded if self.page_size_padded is not None else self.state_bytes

    def max_memory_usage_bytes(self, limits: VllmLimits) -> int:
        if limits.mamba_cache_mode == "align":
            return self.page_size_bytes * (2 + self.num_speculative_blocks + self.num_prefill_checkpoint_blocks)
        return self.page_size_bytes * (1 + self.num_speculative_blocks)


LAYER_SPEC_TYPES = (FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MambaSpec)
"""The per-layer spec classes kvpools models (vLLM registers more: cross-attention, HiSparse, DeepSeek-V4's)."""


@attrs.frozen(kw_only=True)
class UniformTypeKVCacheSpecs:
    """``UniformTypeKVCacheSpecs`` (L1291): layers of one type (same token-slot need) but different page sizes,
    kept as one group: page = ``Σ`` layer pages, a request holds ``max_i cdiv(mem_i, page_i)`` of those pages."""

    block_size: int
    kv_cache_specs: dict[str, KVCacheSpec] = attrs.field(eq=False)

    @property
    def page_size_bytes(self) -> int:
        return sum(spec.page_size_bytes for spec in self.kv_cache_specs.values())

    def max_memory_usage_pages(self, limits: VllmLimits) -> int:
        return max(
            cdiv(spec.max_memory_usage_bytes(limits), spec.page_size_bytes) for spec in self.kv_cache_specs.values()
        )

    def max_memory_usage_bytes(self, limits: VllmLimits) -> int:
        return self.max_memory_usage_pages(limits) * self.page_size_bytes
