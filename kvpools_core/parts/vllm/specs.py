"""vLLM 0.33's per-layer KV-cache specs, as plain frozen values (no torch, no vLLM import).

Each class mirrors the vLLM class of the same name in ``vllm/v1/kv_cache_interface.py`` (0.33.0): the
fields that change a page's bytes or a request's worst-case blocks, and the two sizing formulas every
spec implements, ``page_size_bytes`` and ``max_memory_usage_bytes``.  Equality is field-wise and
class-exact, as vLLM's dataclass equality is, because grouping buckets layers by equal specs.

Modelled: whole-token states (``tokens_per_state`` a positive integer: 1, or DeepSeek-V4's compression ratio;
vLLM's fractional states, Whisper's block pooling, are not), dense or ``state_content_bytes``-packed content,
``page_size_padded`` (and the DeepSeek-V4 row ``alignment`` that sets it at construction),
``block_stride_alignment`` in its ``MultipleOf(n)`` form (what ``customize_attention_spec`` gives a backend with
fixed kernel block sizes), and the KV-cache layouts a layer's backend declares (``supported_layouts``, which
``resolve_kv_cache_layout`` reads).  Dtypes are carried as their byte size (``get_dtype_size``); a ``MambaSpec``
also records vLLM's ``mamba_type``, so two mixers with equal byte sizes still group apart, as in vLLM.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, TypeVar

import attrs

from kvpools_core.errors import ConfigError, InvalidValueError, UnsupportedCombinationError

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


def round_up(value: int, multiple: int) -> int:
    """``vllm.utils.math_utils.round_up``."""
    return cdiv(value, multiple) * multiple


KV_CACHE_LAYOUTS = ("LBHNC", "LBNHC", "LHBNC", "BLHNC", "BLNHC", "BHLNC")
"""``KVCacheLayout`` members (``v1/kv_cache_layout.py`` L15-28), in the enum's order: each name spells the physical
order of the logical ``[L, B, H, N, C]`` axes (layer, block, head, state, content)."""


def _layouts(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    layouts = tuple(value)
    bad = [name for name in layouts if name not in KV_CACHE_LAYOUTS]
    if not layouts or bad:
        raise InvalidValueError(f"supported_layouts must name KV-cache layouts of {KV_CACHE_LAYOUTS}, got {value!r}.")
    return layouts


MAMBA_CACHE_MODES = ("none", "align", "all")


@attrs.frozen(kw_only=True)
class VllmLimits:
    """The ``VllmConfig`` numbers the sizing formulas read.

    ``max_in_flight_tokens`` is ``VllmConfig.max_in_flight_tokens`` (``config/vllm.py`` L601):
    ``max_concurrent_batches * max_num_batched_tokens``, where ``max_concurrent_batches`` is the
    pipeline-parallel size (``pp + 1`` with async scheduling on the V2 runner, 2 with async scheduling at
    PP 1; L588).  ``mamba_cache_mode`` is ``CacheConfig.mamba_cache_mode``.
    """

    max_model_len: int
    max_num_batched_tokens: int = 2048
    max_concurrent_batches: int = 1
    decode_context_parallel_size: int = 1
    mamba_cache_mode: str = "none"

    def __attrs_post_init__(self) -> None:
        for name in (
            "max_model_len",
            "max_num_batched_tokens",
            "max_concurrent_batches",
            "decode_context_parallel_size",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}.")
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise ConfigError(f"--mamba-cache-mode must be one of {MAMBA_CACHE_MODES}, got {self.mamba_cache_mode!r}.")

    @property
    def max_in_flight_tokens(self) -> int:
        return self.max_concurrent_batches * self.max_num_batched_tokens

    def with_max_model_len(self, max_model_len: int) -> VllmLimits:
        return attrs.evolve(self, max_model_len=max_model_len)


@attrs.frozen(kw_only=True)
class KVCacheSpec:
    """``KVCacheSpec`` (``kv_cache_interface.py`` L202): one layer's cache; ``block_size`` tokens per block.

    ``block_stride_alignment`` is ``n`` of vLLM's ``MultipleOf(n)`` (``None``: no alignment): blocks are split into
    kernel blocks of ``n`` tokens, so a block's stride must hold whole kernel pages (``get_block_stride_alignment``,
    L224-234).  ``supported_layouts`` is not vLLM's spec field but its layer's backend's
    ``supported_kv_cache_layouts()`` (``None``: any layout), carried here so the planner resolves the layout from the
    specs alone; it takes no part in equality.
    """

    block_size: int = attrs.field(validator=_positive)
    block_stride_alignment: int | None = attrs.field(default=None, validator=_optional_positive)
    supported_layouts: tuple[str, ...] | None = attrs.field(default=None, converter=_layouts, eq=False)

    @property
    def page_size_bytes(self) -> int:
        raise NotImplementedError

    def get_block_stride_alignment(self) -> int:
        """``get_block_stride_alignment`` (L224): 1 when the block is one kernel block, else one kernel block's page
        (kernel block = ``gcd(n, block_size)``)."""
        if self.block_stride_alignment is None:
            return 1
        kernel_block_size = math.gcd(self.block_stride_alignment, self.block_size)
        if kernel_block_size == self.block_size:
            return 1
        return self.with_block_size(kernel_block_size).page_size_bytes

    def max_memory_usage_bytes(self, limits: VllmLimits) -> int:
        raise NotImplementedError

    def with_block_size(self: S, block_size: int) -> S:
        """``copy_with_new_block_size``: the same spec with another block size."""
        return attrs.evolve(self, block_size=block_size)


@attrs.frozen(kw_only=True)
class AttentionSpec(KVCacheSpec):
    """``AttentionSpec`` (L552): page = ``num_kv_heads * num_states * (head_size + head_size_v) * dtype_bytes``,
    ``num_states = block_size // tokens_per_state`` (``get_num_kernel_states``, L268-275).

    ``state_content_bytes`` replaces ``(head_size + head_size_v) * dtype_bytes`` for packed layouts
    (``fp8_ds_mla``: 656 bytes per token, set by ``mla_attention.py`` L1386; DeepSeek-V4's 584).  ``dcp_sharded``
    defaults to True for attention, as in vLLM; ``max_tp_shards`` records how many distinct TP shards exist.
    ``tokens_per_state`` > 1 compresses that many tokens into one stored state (DeepSeek-V4's c4 / c128 caches).
    """

    num_kv_heads: int = attrs.field(validator=_positive)
    head_size: int = attrs.field(validator=_positive)
    head_size_v: int = attrs.field(validator=_non_negative)
    dtype_bytes: int = attrs.field(validator=_positive)
    page_size_padded: int | None = attrs.field(default=None, validator=_optional_positive)
    state_content_bytes: int | None = attrs.field(default=None, validator=_optional_positive)
    dcp_sharded: bool = True
    max_tp_shards: int | None = attrs.field(default=None, validator=_optional_positive)
    tokens_per_state: int = attrs.field(default=1, validator=_positive)

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
    def num_states(self) -> int:
        """States one block stores (``num_states``, L264): ``block_size // tokens_per_state``."""
        return self.block_size // self.tokens_per_state

    @property
    def unpadded_page_size_bytes(self) -> int:
        return self.num_kv_heads * self.num_states * self.state_content_size_bytes

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


def _apply_alignment_padding(spec: MLAAttentionSpec | SlidingWindowMLASpec) -> None:
    """``_apply_alignment_padding`` (L719-726), run at construction: the page rounded up to ``alignment`` bytes.

    As in vLLM, a page that is already aligned keeps whatever ``page_size_padded`` it was built with (a copy made by
    ``copy_with_new_block_size`` carries the old one)."""
    if spec.alignment is not None:
        actual = spec.unpadded_page_size_bytes
        padded = round_up(actual, spec.alignment)
        if padded != actual:
            object.__setattr__(spec, "page_size_padded", padded)
    AttentionSpec.__attrs_post_init__(spec)


@attrs.frozen(kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """``MLAAttentionSpec`` (L729): one latent per state (``head_size_v = 0``); ``cache_role`` is
    ``"indexer"`` for DeepSeek-V3.2's indexer cache (``deepseek_v2.py`` L658-666), ``"sparse"`` otherwise.

    DeepSeek-V4's fields: ``alignment`` pads the page to a multiple of it at construction (576 bytes for FlashMLA's
    ``fp8_ds_mla`` rows), ``model_version`` (``"deepseek_v4"`` on its latent caches) only takes part in equality.
    """

    head_size_v: int = attrs.field(default=0, validator=_non_negative)
    cache_dtype_str: str | None = None
    cache_role: str = attrs.field(default="sparse", validator=attrs.validators.in_(("sparse", "indexer")))
    alignment: int | None = attrs.field(default=None, validator=_optional_positive)
    model_version: str | None = None

    def __attrs_post_init__(self) -> None:
        _apply_alignment_padding(self)


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


@attrs.frozen(kw_only=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """``SlidingWindowMLASpec`` (L1008): a sliding window over MLA rows (``head_size_v = 0``), padded to
    ``alignment`` like :class:`MLAAttentionSpec`: DeepSeek-V4's SWA cache (``sparse_swa.py`` L120-147) and its
    compressors' state caches (``compressor.py`` L179-192).  ``bounded_replay`` is DeepSeek-V4.1's (L1016, set by
    ``deepseek_v41/attention.py`` L538-579): it keeps the window out of prefix caching and rebuilds it on a prefix hit,
    which changes no page nor any request's blocks (``max_admission_blocks_per_request`` does not read it), only
    equality, ``merge`` and ``is_uniform_with_collection`` (L1082-1090).

    vLLM's ``merge`` of these compares only the fields listed in :data:`SLIDING_WINDOW_MLA_MERGE_FIELDS`, so layers
    that differ elsewhere still share a group
    (:func:`kvpools_core.engines.vllm.planning.get_kv_cache_groups` models it).
    """

    head_size_v: int = attrs.field(default=0, validator=_non_negative)
    cache_dtype_str: str | None = None
    alignment: int | None = attrs.field(default=None, validator=_optional_positive)
    model_version: str | None = attrs.field(default=None, validator=attrs.validators.in_((None, "deepseek_v4")))
    bounded_replay: bool = False

    def __attrs_post_init__(self) -> None:
        _apply_alignment_padding(self)


@attrs.frozen(kw_only=True)
class CircularBufferSpec(AttentionSpec):
    """``CircularBufferSpec`` (L957-996): one block per request for its whole life, a ring of ``block_size`` rows
    (DeepSeek-V4.1's ratio-2 compressor state, ``deepseek_v41/compressor.py`` L206-240); never prefix-cached, and
    uniform only with other circular buffers."""

    def max_memory_usage_bytes(self, limits: VllmLimits) -> int:
        return self.page_size_bytes


SLIDING_WINDOW_MLA_MERGE_FIELDS = (
    "cache_dtype_str",
    "tokens_per_state",
    "model_version",
    "sliding_window",
    "extra_retained_tokens",
    "bounded_replay",
    "block_stride_alignment",
    "dcp_sharded",
    "max_tp_shards",
)
"""The fields ``SlidingWindowMLASpec.merge`` (L1036-1080) requires equal across a group."""


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


LAYER_SPEC_TYPES = (
    FullAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    SlidingWindowMLASpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    MambaSpec,
)
"""The per-layer spec classes kvpools models (vLLM registers more: cross-attention, HiSparse)."""


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

    def get_max_layers_per_page_size(self) -> int:
        """``get_max_layers_per_page_size`` (L1378): the most layers sharing one page size."""
        return max(Counter(spec.page_size_bytes for spec in self.kv_cache_specs.values()).values())
