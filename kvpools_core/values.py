"""The frozen values that flow through the pipeline, one direction only.

``ModelSpec`` + ``Serving`` + ``Budget`` → ``CellSize`` → ``PoolSizing`` →
``Plan``, whose ``cost`` (a ``CostModel`` of one ``GroupCost`` per pool) says
what its bytes are per token, per request, per state slot and fixed.
Every value is an ``attrs.frozen`` class with validators, so no plugin can
mutate what another plugin sees; change one with ``attrs.evolve``.
Every value converts to plain JSON (``to_dict``) and back (``from_dict``) so a
plan computed on one rank can be broadcast and loaded into an equal plan; loading
checks every field's JSON type, then its validators, then (``Plan.problems``) the
plan as a whole, and raises ``PlanFormatError`` naming the field's path
(:mod:`kvpools_core.loading`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kvpools_core.dtypes import MODEL_DTYPES, canonical_kv_dtype
from kvpools_core.errors import ConfigError, InvalidValueError, KvpoolsError, PlanFormatError, short_repr
from kvpools_core.loading import load_value, parse_json, wrong
from kvpools_core.options import option

JSONScalar = int | float | str | bool | None


# ---------------------------------------------------------------------------
# validators and converters (errors name the option, the value and the fix)
# ---------------------------------------------------------------------------


def _flag(inst: object, attribute: attrs.Attribute[Any]) -> str:
    """A serving option as the caller typed it (``--tp-size`` / ``tp_size``); any other value's field
    qualified by its class (``CellPart.bytes_per_token``), since a plugin, not the user, built it."""
    if isinstance(inst, Serving):
        return option(attribute.name)
    return f"{type(inst).__name__}.{attribute.name}"


def _invalid(inst: object, message: str) -> ConfigError:
    """A user's serving option is a ``ConfigError``; any other value's field is an ``InvalidValueError``,
    which the registry blames on the plugin that built the value."""
    return ConfigError(message) if isinstance(inst, Serving) else InvalidValueError(message)


def positive(inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if type(value) is int and value >= 1:  # the common case first: every plan builds thousands of these
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a positive integer, got {value!r}.")


def non_negative(inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if type(value) is int and value >= 0:  # the common case first: every plan builds thousands of these
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a non-negative integer, got {value!r}.")


def optional_positive(inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        positive(inst, attribute, value)


def optional_non_negative(inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        non_negative(inst, attribute, value)


def fraction(inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    """A ratio in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a number in (0, 1], got {value!r}.")


def positive_ratio(inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a positive finite number, got {value!r}.")


def one_of(*choices: object) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if value not in choices:
            shown = ", ".join("none" if c is None else str(c) for c in choices)
            raise _invalid(inst, f"{_flag(inst, attribute)} must be one of {shown}; got {value!r}.")

    return check


def frozen_mapping(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """Freeze a JSON-like mapping: lists become tuples, dicts read-only proxies."""
    return MappingProxyType({str(k): _freeze(v) for k, v in (value or {}).items()})


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return frozen_mapping(value)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(_thaw(v) for v in value)
    if attrs.has(type(value)):
        return to_dict(value)
    return value


def to_dict(value: Any) -> dict[str, Any]:
    """Plain-JSON form of any value of this module (tuples become lists)."""
    return {f.name: _thaw(getattr(value, f.name)) for f in attrs.fields(type(value))}


def _str_tuple(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


def _layer_tuple(items: Iterable[LayerSpec]) -> tuple[LayerSpec, ...]:
    return tuple(items)


def _part_tuple(items: Iterable[CellPart]) -> tuple[CellPart, ...]:
    return tuple(items)


def _pool_tuple(items: Iterable[PoolSpec]) -> tuple[PoolSpec, ...]:
    return tuple(items)


def _group_tuple(items: Iterable[GroupCost]) -> tuple[GroupCost, ...]:
    return tuple(items)


def _int_tuple(items: Iterable[int]) -> tuple[int, ...]:
    return tuple(items)


def _workspace_tuple(items: Iterable[Workspace]) -> tuple[Workspace, ...]:
    return tuple(items)


def _int_tuple_or_none(items: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if items is None else tuple(items)


# ---------------------------------------------------------------------------
# model
# ---------------------------------------------------------------------------


@attrs.frozen
class LayerSpec:
    """What one decoder layer stores in the KV cache.

    ``kind`` is owned by the architecture plugin that parsed the model
    (``"attention"`` for full MHA/GQA, ``"sliding_attention"``, ``"mla"``,
    ``"mamba"``, ``"none"`` for layers without cache, ...).  ``params`` carries
    the architecture's own per-layer numbers (latent ranks, state shapes).
    """

    index: int = attrs.field(validator=non_negative)
    kind: str
    num_kv_heads: int = attrs.field(default=0, validator=non_negative)
    head_dim: int = attrs.field(default=0, validator=non_negative)
    v_head_dim: int = attrs.field(default=0, validator=non_negative)
    sliding_window: int | None = attrs.field(default=None, validator=optional_positive)
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerSpec:
        return load_value(cls, data)


@attrs.frozen
class ModelSpec:
    """The KV-relevant description of one model, per layer.

    Built by the architecture plugin that recognised the config
    (``architecture`` names that plugin's family).  ``params`` carries
    model-level numbers only that family needs.
    """

    name: str
    architecture: str
    layers: tuple[LayerSpec, ...] = attrs.field(converter=_layer_tuple)
    context_len: int = attrs.field(validator=positive)
    dtype: str = attrs.field(validator=one_of(*MODEL_DTYPES))
    num_attention_heads: int = attrs.field(default=0, validator=non_negative)
    model_type: str = ""
    hf_architectures: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    source: str = ""
    num_nextn_predict_layers: int = attrs.field(default=0, validator=non_negative)
    is_multimodal: bool = False
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)

    @layers.validator
    def _check_layers(self, _attribute: attrs.Attribute[Any], layers: tuple[LayerSpec, ...]) -> None:
        if not layers:
            raise ConfigError(f"Model {self.name!r} has no layers (num_hidden_layers must be positive).")
        if [layer.index for layer in layers] != list(range(len(layers))):
            raise ConfigError(f"Model {self.name!r}: layer indices must be 0..{len(layers) - 1} in order.")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def dtype_bytes(self) -> int:
        return MODEL_DTYPES[self.dtype]

    def layer_kinds(self) -> dict[str, int]:
        """How many layers of each kind, in first-seen order."""
        counts: dict[str, int] = {}
        for layer in self.layers:
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
        return counts

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# serving options (SGLang's server-arg names; environment knobs made typed)
# ---------------------------------------------------------------------------

SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "NEXTN", "DFLASH", "NGRAM")
ACCOUNTING_MODES = ("exact", "sglang", "vllm")
"""``exact`` and ``sglang`` size SGLang's pools (:func:`kvpools_core.plan`); ``vllm`` plans ``vllm serve``'s KV
cache instead (:func:`kvpools_core.vllm.plan_vllm`, ``docs/vllm.md``), which the SGLang pipeline refuses."""
SGLANG_ACCOUNTING_MODES = ("exact", "sglang")
"""The accounting modes of SGLang's pipeline (``plan``, ``build``, ``fit``, ``sweep``)."""


DEFAULT_HICACHE_RATIO = 2.0
"""SGLang's ``--hicache-ratio`` when neither it nor ``--hicache-size`` is given (cache mode)."""
HICACHE_MEM_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
"""``--hicache-mem-layout`` values kvpools models (SGLang's ``page_first_kv_split`` and ``page_head`` are
NPU / head-sharded layouts it does not)."""
HICACHE_WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
DECODE_RETRACTION_BACKUPS = ("cpu_tensor", "host_pool", "none")
"""``--disaggregation-decode-retraction-backup`` choices (SGLang 0.5.23 ``arg_groups/fields/disagg.py``)."""


def _optional_non_negative_ints(inst: object, attribute: attrs.Attribute[Any], value: tuple[int, ...] | None) -> None:
    if value is not None and not all(type(v) is int and v >= 0 for v in value):
        raise _invalid(inst, f"{_flag(inst, attribute)} must be non-negative integers, got {value!r}.")


def _optional_positive_ratio(inst: object, attribute: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None:
        positive_ratio(inst, attribute, value)


def _canonical_spec_algorithm(value: str | None) -> str | None:
    return None if value is None else value.upper()


def _canonical_kv(value: str) -> str:
    return canonical_kv_dtype(value)


DSV4_COMPRESS_STATE_DTYPES = ("float32", "bfloat16")
"""``SGLANG_DSV4_COMPRESS_STATE_DTYPE``'s values (SGLang also spells them ``fp32`` and ``bf16``)."""
_STATE_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16"}


def _canonical_state_dtype(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    name = value.strip().lower()
    return _STATE_DTYPE_ALIASES.get(name, name)


def parse_hisparse_config(text: str | None) -> dict[str, Any]:
    """SGLang's ``--hisparse-config``: a JSON object (``{}`` when unset).

    Raises ``ValueError`` with the reason when it is not one; the ``Serving``
    validator turns that into an error naming the option.
    """
    if text is None or not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"is not valid JSON ({exc.msg} at character {exc.pos})") from None
    except ValueError:  # an integer of more than 4,300 digits
        raise ValueError("holds an integer too long to read (over 4,300 digits)") from None
    except RecursionError:  # arrays or objects nested thousands deep
        raise ValueError("is nested too deeply to read") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object such as '{{\"host_to_device_ratio\": 4}}', got {short_json(value)}")
    ratio = value.get("host_to_device_ratio", 2)
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1:
        raise ValueError(f"has host_to_device_ratio {short_json(ratio)}; it must be an integer >= 1")
    top_k = value.get("top_k", 2048)
    buffer = value.get("device_buffer_size", None)
    numbers = isinstance(top_k, (int, float)) and not isinstance(top_k, bool)
    if buffer is not None and numbers and isinstance(buffer, (int, float)) and buffer < top_k:
        raise ValueError(
            f"has device_buffer_size {buffer} below top_k {top_k}: device_buffer_size must be no smaller than top_k"
        )
    return value


def short_json(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (ValueError, RecursionError):  # nested too deeply to print, or an integer too long to
        return short_repr(value, 60) if not isinstance(value, (list, dict)) else f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


def _hisparse_json(inst: object, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not isinstance(value, str):
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a JSON string, got {value!r}.")
    try:
        parse_hisparse_config(value)
    except ValueError as exc:
        raise _invalid(
            inst,
            f"{_flag(inst, attribute)} {short_repr(value)} {exc}. Pass a JSON object, "
            f"e.g. '{{\"host_to_device_ratio\": 4}}'.",
        ) from None


# ---------------------------------------------------------------------------
# platform traits and workspaces
# ---------------------------------------------------------------------------


def _positive_ints(inst: object, attribute: attrs.Attribute[Any], value: tuple[int, ...]) -> None:
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise InvalidValueError(f"{_flag(inst, attribute)} must be positive integers, got {value!r}.")


@attrs.frozen(kw_only=True)
class PageSizeRule:
    """A page size a platform's kernels need: for every model, or for the models that use some kernels.

    A page size passes if it is one of ``sizes`` or a multiple of
    ``multiple_of``.  ``kernels`` (empty: every model) names the kernel
    families the rule is about (``"dsa"``: the DSA pool and its sparse
    kernels); an architecture that uses such kernels asks for their rules by
    that name (``serving.traits.page_size_problems(page, kernel="dsa")``), the
    core checks the rules for every model before sizing.  So platforms and
    architectures share a vocabulary of kernels, and neither names the other.
    ``reason`` says why; ``engine_message`` is the engine's own words, when
    its users know them.
    """

    reason: str
    sizes: tuple[int, ...] = attrs.field(default=(), converter=_int_tuple, validator=_positive_ints)
    multiple_of: int | None = attrs.field(default=None, validator=optional_positive)
    kernels: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    engine_message: str | None = None

    def __attrs_post_init__(self) -> None:
        if not self.sizes and self.multiple_of is None:
            raise InvalidValueError("A PageSizeRule needs sizes, multiple_of or both; it allows no page size.")

    def allows(self, page_size: int) -> bool:
        return page_size in self.sizes or (self.multiple_of is not None and page_size % self.multiple_of == 0)

    def describe(self) -> str:
        """``64``, ``1 or a multiple of 16``, ``a multiple of 16``."""
        choices = [" or ".join(str(s) for s in self.sizes)] if self.sizes else []
        if self.multiple_of is not None:
            choices.append(f"a multiple of {self.multiple_of}")
        return " or ".join(choices)

    def problem(self, page_size: int, platform: str) -> str | None:
        """The error message when ``page_size`` breaks the rule, else None."""
        if self.allows(page_size):
            return None
        kinds = "/".join(k.upper() for k in self.kernels)
        subject = f"{kinds} models need" if kinds else "Every model needs"
        quoted = f" (SGLang: {self.engine_message!r})" if self.engine_message else ""
        return (
            f"{subject} {option('page_size')} {self.describe()} on {platform}: {self.reason}{quoted}; "
            f"got {option('page_size')} {page_size}."
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PageSizeRule:
        return load_value(cls, data)


def _non_empty(inst: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if not value:
        raise InvalidValueError(f"{_flag(inst, attribute)} must name at least one value.")


@attrs.frozen(kw_only=True)
class KVDtypeRule:
    """KV cache dtypes a platform's kernels cannot store: for every model, or for those using some kernels.

    ``refused`` names KV dtypes as resolved (``fp8_e4m3``, not ``auto``);
    ``kernels`` (empty: every model, checked by the core before sizing) names
    the kernel families the rule is about (``"mla"``: MLA latent rows; an
    architecture caching them asks ``serving.traits.kv_dtype_problems(kv,
    kernel="mla")``), so the refusal stays the architecture's, in the
    platform's words, and neither names the other.  ``instead`` lists what
    works (the message's fix); ``engine_message`` is the engine's own words.
    """

    reason: str
    refused: tuple[str, ...] = attrs.field(converter=_str_tuple, validator=_non_empty)
    kernels: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    instead: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    engine_message: str | None = None

    def problem(self, kv_cache_dtype: str, platform: str) -> str | None:
        """The error message when the rule refuses ``kv_cache_dtype`` (resolved), else None."""
        if kv_cache_dtype not in self.refused:
            return None
        kinds = "/".join(k.upper() for k in self.kernels)
        subject = f"{kinds} models cannot" if kinds else "No model can"
        quoted = f" (SGLang: {self.engine_message!r})" if self.engine_message else ""
        fix = ""
        if self.instead:
            choices = ", ".join(self.instead[:-1]) + (" or " if len(self.instead) > 1 else "") + self.instead[-1]
            fix = f"; use {option('kv_cache_dtype')} {choices}"
        return f"{subject} store {option('kv_cache_dtype')} {kv_cache_dtype} on {platform}: {self.reason}{quoted}{fix}."

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KVDtypeRule:
        return load_value(cls, data)


def _kv_rule_tuple(items: Iterable[KVDtypeRule]) -> tuple[KVDtypeRule, ...]:
    return tuple(items)


def _frozen_strs(items: Iterable[str]) -> frozenset[str]:
    return frozenset(items)


def _rule_tuple(items: Iterable[PageSizeRule]) -> tuple[PageSizeRule, ...]:
    return tuple(items)


@attrs.frozen(kw_only=True)
class MemoryTier:
    """A platform's own SGLang defaults for a device of up to ``max_mib`` MiB, set before the GPU tiers.

    SGLang's server args give an Ascend NPU of at most 32 GiB ``chunked_prefill_size`` 4096 and decode
    CUDA-graph ``max_bs`` 16 (64 at TP >= 4), of at most 64 GiB 8192 and 64 (256)
    (``set_default_server_args``, ``srt/hardware_backend/npu/utils.py`` lines 103-160 of SGLang 0.5.23);
    larger devices fall through to ``handle_gpu_memory_settings``'s GPU tiers.  A platform plugin states
    such tiers in :attr:`PlatformTraits.memory_tiers`, so the core's memory defaults never name a platform.
    """

    max_mib: int = attrs.field(validator=positive)
    """The largest device total (MiB, as SGLang reads it) the tier covers: SGLang compares ``<=``."""
    chunked_prefill_size: int = attrs.field(validator=positive)
    decode_max_bs: int = attrs.field(validator=positive)
    """The decode CUDA-graph ``max_bs`` below TP 4."""
    decode_max_bs_at_tp4: int = attrs.field(validator=positive)
    """The decode CUDA-graph ``max_bs`` at ``tp_size >= 4`` (SGLang's ``tp_size < 4`` branch)."""

    def decode_max_bs_for(self, tp_size: int) -> int:
        return self.decode_max_bs if tp_size < 4 else self.decode_max_bs_at_tp4

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MemoryTier:
        return load_value(cls, data)


def _boolean(inst: object, attribute: attrs.Attribute[Any], value: bool) -> None:
    if not isinstance(value, bool):
        raise _invalid(inst, f"{_flag(inst, attribute)} must be True or False, got {value!r}.")


def _tier_tuple(items: Iterable[MemoryTier]) -> tuple[MemoryTier, ...]:
    return tuple(items)


def _ascending_tiers(inst: object, attribute: attrs.Attribute[Any], value: tuple[MemoryTier, ...]) -> None:
    bounds = [tier.max_mib for tier in value if isinstance(tier, MemoryTier)]
    if len(bounds) != len(value) or bounds != sorted(set(bounds)):
        raise InvalidValueError(
            f"{_flag(inst, attribute)} must be MemoryTier values with strictly ascending max_mib, got {value!r}."
        )


@attrs.frozen(kw_only=True)
class PlatformTraits:
    """What a platform's kernels decide about the KV cache, answered by its plugin (``platform_traits`` hook).

    The pipeline resolves it once per plan into ``Serving.platform_traits``, so
    every hook reads it from the serving options it already gets, a plan on
    disk records the rules it was made under, and no plugin (nor the core) ever
    branches on a platform's name: an architecture asks the traits.

    * ``page_size_rules``: page sizes its kernels need (:class:`PageSizeRule`;
      the core checks the rules for every model before sizing, an
      architecture the rules about the kernels it uses).
    * ``kv_dtype_rules``: KV dtypes its kernels cannot store
      (:class:`KVDtypeRule`; the core checks the rules for every model, an
      architecture those about the kernels it uses: SGLang's CPU backend has
      no fp8 MLA kernels).
    * ``raw_mla_row_backends``: attention backends of this platform that read
      MLA latent rows raw (``kv_lora_rank + rope`` elements of the KV dtype)
      where others read FlashMLA's packed fp8 row (SGLang's
      ``calculate_mla_kv_cache_dim``; ROCm's tilelang/triton/aiter).
    * ``slot_index_dtype``: the dtype of the slot indices its allocators hand
      out (``int64``; ``int32`` on Ascend NPUs), which engines need to size
      their own index tensors.
    * ``memory_tiers``: the platform's own defaults of ``chunked_prefill_size``
      and decode ``max_bs`` by device memory (:class:`MemoryTier`, ascending),
      which SGLang sets before its GPU tiers (Ascend's NPU tiers); none: the
      GPU tiers alone (:mod:`kvpools_core.gpus`).
    * ``breakable_prefill_graphs``: whether SGLang captures its breakable
      prefill CUDA graph by default here, so the default ``mem_fraction_static``
      reserves memory for it (``default_prefill_backend``,
      ``srt/model_executor/cuda_graph_config.py`` lines 119-123 of SGLang
      0.5.23: ``BREAKABLE if is_cuda() else DISABLED``; CUDA only).
    * ``decode_retraction_host_pool``: whether SGLang backs a PD decode node's
      retracted requests up in a HiCache host pool by default here
      (``resolve_decode_retraction_backup``, ``mem_cache/kv_cache_builder.py``:
      not on HIP, where large restores can fault the GPU process).
    """

    platform: str
    page_size_rules: tuple[PageSizeRule, ...] = attrs.field(default=(), converter=_rule_tuple)
    kv_dtype_rules: tuple[KVDtypeRule, ...] = attrs.field(default=(), converter=_kv_rule_tuple)
    raw_mla_row_backends: frozenset[str] = attrs.field(default=frozenset(), converter=_frozen_strs)
    slot_index_dtype: str = attrs.field(default="int64", validator=one_of("int64", "int32"))
    memory_tiers: tuple[MemoryTier, ...] = attrs.field(default=(), converter=_tier_tuple, validator=_ascending_tiers)
    breakable_prefill_graphs: bool = attrs.field(default=False, validator=_boolean)
    decode_retraction_host_pool: bool = attrs.field(default=True, validator=_boolean)

    def memory_tier(self, gpu_mib: float) -> MemoryTier | None:
        """The platform's own tier for a device of ``gpu_mib`` MiB (the first whose ``max_mib`` covers it)."""
        return next((tier for tier in self.memory_tiers if gpu_mib <= tier.max_mib), None)

    def page_size_problems(self, page_size: int, kernel: str | None = None) -> list[str]:
        """What ``page_size`` breaks: the rules for every model (``kernel=None``), or those about ``kernel``."""
        rules = [r for r in self.page_size_rules if (kernel in r.kernels if kernel else not r.kernels)]
        return [p for rule in rules if (p := rule.problem(page_size, self.platform))]

    def kv_dtype_problems(self, kv_cache_dtype: str, kernel: str | None = None) -> list[str]:
        """What the resolved KV dtype breaks: the rules for every model, or those about ``kernel``."""
        rules = [r for r in self.kv_dtype_rules if (kernel in r.kernels if kernel else not r.kernels)]
        return [p for rule in rules if (p := rule.problem(kv_cache_dtype, self.platform))]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlatformTraits:
        return load_value(cls, data)


WORKSPACE_DTYPES: Mapping[str, int] = MappingProxyType(
    {"uint8": 1, "int32": 4, "int64": 8, "float32": 4, "bfloat16": 2}
)
"""Element types a workspace may be built as, with their size in bytes."""


@attrs.frozen(kw_only=True)
class Workspace:
    """Device memory a platform's kernels keep beside the KV cache, paid per running request and once.

    Declared by the ``workspaces`` hook (a platform's attention backend: ROCm
    AITER MLA's int32 page-index buffer of ``requests x context_len``); every
    sizing plugin charges it through :func:`kvpools_core.sizing.request_pools`
    (a pool of ``requests x bytes_per_request + fixed_bytes``, no padding row),
    so an exact plan leaves room for it, and ``build`` allocates it as one
    ``dtype`` tensor.  SGLang allocates such buffers after sizing the KV cache,
    out of its runtime slack: ``--accounting sglang`` does not charge them.
    """

    name: str
    purpose: str
    bytes_per_request: int = attrs.field(default=0, validator=non_negative)
    fixed_bytes: int = attrs.field(default=0, validator=non_negative)
    dtype: str = attrs.field(default="uint8", validator=one_of(*WORKSPACE_DTYPES))
    owner: str = ""
    """The plugin that declared it (set by the pipeline)."""

    def __attrs_post_init__(self) -> None:
        size = WORKSPACE_DTYPES[self.dtype]
        if self.bytes_per_request % size or self.fixed_bytes % size:
            raise InvalidValueError(
                f"Workspace {self.name!r}: bytes_per_request ({self.bytes_per_request}) and fixed_bytes "
                f"({self.fixed_bytes}) must be whole {self.dtype} elements ({size} B each)."
            )

    def bytes_for(self, requests: int) -> int:
        return requests * self.bytes_per_request + self.fixed_bytes

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Workspace:
        return load_value(cls, data)


class UnsetInt(int):
    """An int option the user left unset: it reads as the engine's generic default (an ``int`` like any other),
    and :func:`is_unset` tells it apart, so the pipeline may replace it with the model's own default
    (``engine_defaults`` hook) while an explicit value, even an equal one, wins."""

    __slots__ = ()


class UnsetFloat(float):
    """A float option the user left unset (:class:`UnsetInt`'s float sibling)."""

    __slots__ = ()


class UnsetStr(str):
    """A string option the user left unset (:class:`UnsetInt`'s string sibling: a backend name)."""

    __slots__ = ()


def is_unset(value: object) -> bool:
    """Whether ``value`` is an option's unset marker (:class:`UnsetInt`, :class:`UnsetFloat`, :class:`UnsetStr`),
    not a given value."""
    return isinstance(value, (UnsetInt, UnsetFloat, UnsetStr))


ENGINE_DEFAULT_OPTIONS = ("page_size", "swa_full_tokens_ratio", "dsa_prefill_backend", "dsa_decode_backend")
"""The :class:`Serving` fields an unset value of which an ``engine_defaults`` answer may replace: the ones SGLang
0.5.23 leaves ``None`` and resolves per model (``arg_groups/model_overrides/``) or per platform.  A new one is a
``Serving`` field whose default is an unset marker (:class:`UnsetInt`, :class:`UnsetFloat`, :class:`UnsetStr`)
listed here."""


@attrs.frozen(kw_only=True)
class EngineDefault:
    """What the engine sets itself for a model when the user leaves an option unset (``engine_defaults`` hook).

    ``option`` is a :data:`ENGINE_DEFAULT_OPTIONS` field of :class:`Serving`,
    ``value`` what SGLang resolves it to, and ``reason`` says why, citing
    SGLang (it becomes the plan's note).  An explicit option always wins.
    """

    option: str = attrs.field(validator=one_of(*ENGINE_DEFAULT_OPTIONS))
    value: int | float | str
    reason: str = attrs.field(validator=attrs.validators.min_len(1))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineDefault:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# accelerators
# ---------------------------------------------------------------------------


def _text(inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a non-empty string, got {value!r}.")


def _texts(inst: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    if not all(isinstance(item, str) and item.strip() for item in value):
        raise _invalid(inst, f"{_flag(inst, attribute)} must be non-empty strings, got {value!r}.")


@attrs.frozen
class GPU:
    """One accelerator model: its total memory as the driver reports it, and the platform it runs on.

    Platform plugins contribute them (``accelerators`` hook); :mod:`kvpools_core.gpus` looks them up by
    ``name`` or one of ``aliases`` (case, spaces, ``-`` and ``_`` ignored).  ``total_bytes`` is the total
    **as SGLang reads it** (``get_device_memory_capacity``, ``srt/utils/common.py`` of SGLang 0.5.23:
    ``nvidia-smi`` MiB on CUDA, ``rocminfo`` "Pool 1" KB / 1024 on ROCm, the platform's own total
    elsewhere), since SGLang's memory defaults compare that figure.  ``platform`` is the kvpools platform
    that plans for it (a plan on this GPU is made for it); ``source`` says where ``total_bytes`` comes from.
    """

    name: str = attrs.field(validator=_text)
    label: str = attrs.field(validator=_text)
    total_bytes: int = attrs.field(validator=positive)
    platform: str = attrs.field(default="cuda", validator=_text)
    aliases: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple, validator=_texts)
    source: str = attrs.field(default="", validator=_text)

    @property
    def total_mib(self) -> float:
        """SGLang's ``gpu_mem``: the total in MiB, the unit ``handle_gpu_memory_settings`` compares."""
        return self.total_bytes / (1 << 20)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GPU:
        return load_value(cls, data)


@attrs.frozen(kw_only=True)
class Serving:
    """Serving options that change sizing, under SGLang's server-arg names.

    What SGLang reads from environment variables is a typed field here
    (``swa_eviction_interval`` is ``SGLANG_SWA_EVICTION_INTERVAL``,
    ``vlm_cache_size_mb`` is ``SGLANG_VLM_CACHE_SIZE_MB``,
    ``pp_layer_partition`` is ``SGLANG_PP_LAYER_PARTITION``,
    ``mamba_skip_decode_lock`` is ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK``,
    ``dsv4_compress_state_dtype`` is ``SGLANG_DSV4_COMPRESS_STATE_DTYPE``,
    ``enable_online_compress`` is ``SGLANG_OPT_USE_ONLINE_COMPRESS``,
    ``enable_online_c128_mtp`` is ``SGLANG_EXPERIMENTAL_ONLINE_C128_MTP``);
    kvpools never reads the environment for sizing.  ``enable_hisparse`` and
    ``hisparse_config`` are SGLang's server args of those names (the config a
    JSON object string such as ``'{"host_to_device_ratio": 4}'``); HiSparse is
    refused on a model whose architecture plugin does not name it (``engine_features``
    hook) and without ``disable_radix_cache``, as SGLang refuses it.
    ``enable_hierarchical_cache``, ``hicache_ratio``, ``hicache_size`` (GB),
    ``hicache_mem_layout``, ``hicache_write_policy`` and ``nnodes`` are SGLang's
    server args; ``hicache_mamba_ratio`` is the Mamba host ratio of SGLang PR
    #39851 (not in 0.5.23; unset it follows ``hicache_ratio``).  They size the
    host tier (:class:`HostTier`, ``docs/host-tier.md``), never the device pools.
    ``page_size``, ``swa_full_tokens_ratio``, ``dsa_prefill_backend`` and ``dsa_decode_backend`` left unset read
    as SGLang's generic defaults (1, 0.8, ``flashmla_sparse``, ``flashmla_kv``) and are marked so
    (:attr:`unset_options`): the pipeline gives them the model's or platform's own default (``engine_defaults``
    hook) and notes it; a value given, even an equal one, is kept.
    """

    kv_cache_dtype: str = attrs.field(default="auto", converter=_canonical_kv)
    page_size: int = attrs.field(default=UnsetInt(1), validator=positive)
    """Unset (``Serving()``, no ``--page-size``), it reads as SGLang's generic default 1 until the pipeline
    applies the model's or platform's own (``engine_defaults``: DeepSeek sparse attention 64, DeepSeek-V4 256,
    Ascend 128); a given value, even 1, wins (:func:`is_unset`)."""
    # parallelism
    tp_size: int = attrs.field(default=1, validator=positive)
    pp_size: int = attrs.field(default=1, validator=positive)
    pp_rank: int = attrs.field(default=0, validator=non_negative)
    pp_layer_partition: tuple[int, ...] | None = attrs.field(
        default=None, converter=_int_tuple_or_none, validator=_optional_non_negative_ints
    )
    dp_size: int = attrs.field(default=1, validator=positive)
    enable_dp_attention: bool = False
    attn_cp_size: int = attrs.field(default=1, validator=positive)
    dcp_size: int = attrs.field(default=1, validator=positive)
    # scheduling limits
    context_length: int | None = attrs.field(default=None, validator=optional_positive)
    max_running_requests: int | None = attrs.field(default=None, validator=optional_positive)
    max_total_tokens: int | None = attrs.field(default=None, validator=optional_positive)
    mem_fraction_static: float | None = attrs.field(default=None, validator=attrs.validators.optional(fraction))
    """``None``: SGLang's default, as the budget resolves it (a GPU's ``handle_gpu_memory_settings`` value with
    ``gpu``, else ``DEFAULT_MEM_FRACTION_STATIC`` 0.9); the fraction used is ``Plan.budget.mem_fraction_static``."""
    chunked_prefill_size: int | None = attrs.field(default=8192, validator=optional_positive)
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    vlm_cache_size_mb: int = attrs.field(default=100, validator=non_negative)
    # speculative decoding
    speculative_algorithm: str | None = attrs.field(
        default=None,
        converter=_canonical_spec_algorithm,
        validator=one_of(None, *SPECULATIVE_ALGORITHMS),
    )
    speculative_num_steps: int | None = attrs.field(default=None, validator=optional_positive)
    speculative_eagle_topk: int | None = attrs.field(default=None, validator=optional_positive)
    speculative_num_draft_tokens: int | None = attrs.field(default=None, validator=optional_positive)
    speculative_draft_num_layers: int | None = attrs.field(default=None, validator=optional_positive)
    # disaggregation
    disaggregation_mode: str = attrs.field(default="null", validator=one_of("null", "prefill", "decode"))
    disaggregation_decode_extra_slots: int | None = attrs.field(default=None, validator=optional_non_negative)
    """Request rows a decode node pre-allocates for transfers; ``None``: SGLang's default
    (:attr:`decode_extra_slots`)."""
    disaggregation_decode_retraction_backup: str | None = attrs.field(
        default=None, validator=one_of(None, *DECODE_RETRACTION_BACKUPS)
    )
    """SGLang's ``--disaggregation-decode-retraction-backup`` (a decode node only): ``host_pool`` backs retracted
    requests' KV up in a HiCache host pool, which kvpools then plans as the host tier; ``cpu_tensor`` /
    ``none`` keep none.  Unset, SGLang infers it (``resolve_decode_retraction_backup``), which kvpools states in
    a note without planning the host memory (see ``docs/host-tier.md``)."""
    # hybrid sliding window / mamba / sparse knobs (read by their plugins)
    swa_full_tokens_ratio: float = attrs.field(default=UnsetFloat(0.8), validator=positive_ratio)
    """Unset, SGLang's fallback 0.8 until the pipeline applies the model's own (``engine_defaults``:
    DeepSeek-V4 0.1); a given value wins."""
    swa_eviction_interval: int = attrs.field(default=128, validator=positive)
    mamba_full_memory_ratio: float = attrs.field(default=0.9, validator=positive_ratio)
    max_mamba_cache_size: int | None = attrs.field(default=None, validator=optional_positive)
    mamba_ssm_dtype: str | None = attrs.field(default=None, validator=one_of(None, *MODEL_DTYPES))
    enable_mamba_extra_buffer: bool = False
    enable_mamba_extra_buffer_lazy: bool = False
    mamba_skip_decode_lock: bool = False
    dsa_prefill_backend: str = UnsetStr("flashmla_sparse")
    """Unset, the backend SGLang 0.5.23 resolves on Hopper until the pipeline applies the model's own
    (``engine_defaults``: DeepSeek sparse attention with ``dcp_size`` > 1 takes ``trtllm``); a given value wins."""
    dsa_decode_backend: str = UnsetStr("flashmla_kv")
    """Unset, as :attr:`dsa_prefill_backend` (``trtllm`` under DSA decode context parallelism)."""
    enable_dsa_cache_layer_split: bool = False
    # DeepSeek-V4 compressed attention (read by the dsv4 plugin)
    enable_hisparse: bool = False
    hisparse_config: str | None = attrs.field(default=None, validator=_hisparse_json)
    dsv4_compress_state_dtype: str = attrs.field(
        default="float32", converter=_canonical_state_dtype, validator=one_of(*DSV4_COMPRESS_STATE_DTYPES)
    )
    enable_online_compress: bool = False
    enable_online_c128_mtp: bool = False
    # hierarchical cache: the host KV tier (SGLang HiCache; read by kvpools_core.host)
    enable_hierarchical_cache: bool = False
    hicache_ratio: float | None = attrs.field(default=None, validator=_optional_positive_ratio)
    """``None``: SGLang's default, 2.0, lowered to what the node holds when ``hicache_size`` is 0 too
    (:attr:`hicache_auto_sized`); the ratio used is ``Plan.host.hicache_ratio``."""
    hicache_size: int = attrs.field(default=0, validator=non_negative)
    hicache_host_memory_fraction: float = attrs.field(default=0.8, validator=fraction)
    """SGLang's ``--hicache-host-memory-fraction``: the share of the node's host memory (after the reserve,
    split over its ranks) that auto-sized host pools may take; read only when :attr:`hicache_auto_sized`."""
    hicache_mamba_ratio: float | None = attrs.field(default=None, validator=_optional_positive_ratio)
    hicache_mem_layout: str = attrs.field(default="page_first", validator=one_of(*HICACHE_MEM_LAYOUTS))
    hicache_write_policy: str = attrs.field(default="write_through", validator=one_of(*HICACHE_WRITE_POLICIES))
    nnodes: int = attrs.field(default=1, validator=positive)
    # kvpools
    accounting: str = attrs.field(default="exact", validator=one_of(*ACCOUNTING_MODES))
    platform: str = "cuda"
    plugin_options: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)
    platform_traits: PlatformTraits | None = None
    """Resolved by the pipeline from the platform's plugin (``platform_traits`` hook), not given by users;
    ``None`` (unresolved) reads as a platform with no page rules and no raw-row backends."""
    workspaces: tuple[Workspace, ...] = attrs.field(default=(), converter=_workspace_tuple)
    """Resolved by the pipeline (``workspaces`` hook): what the platform's kernels keep beside the KV cache."""
    speculative_draft: DraftModel | None = None
    """Resolved by the pipeline from ``--speculative-draft-model-path`` (:class:`DraftModel`): the draft model
    and its own cell, which the speculative plugin composes into the target's; ``None`` without a draft model."""

    def __attrs_post_init__(self) -> None:
        o = option
        if self.pp_rank >= self.pp_size:
            raise ConfigError(f"{o('pp_rank')} must be below {o('pp_size')} ({self.pp_size}), got {self.pp_rank}.")
        attn_dp = self.attn_dp_size
        if self.tp_size % (attn_dp * self.attn_cp_size):
            raise ConfigError(
                f"{o('tp_size')} {self.tp_size} must be divisible by the attention DP size ({attn_dp}) "
                f"times {o('attn_cp_size')} ({self.attn_cp_size})."
            )
        if self.attn_tp_size % self.dcp_size:
            raise ConfigError(
                f"{o('dcp_size')} {self.dcp_size} must divide the attention TP size ({self.attn_tp_size})."
            )
        if self.pp_layer_partition is not None and len(self.pp_layer_partition) != self.pp_size:
            raise ConfigError(
                f"{o('pp_layer_partition')} has {len(self.pp_layer_partition)} entries; "
                f"it needs one per pipeline stage ({o('pp_size')} {self.pp_size})."
            )
        if self.max_running_requests is not None and self.max_running_requests < attn_dp:
            raise ConfigError(
                f"{o('max_running_requests')} {self.max_running_requests} is split over {attn_dp} DP-attention "
                f"workers, so each would run {self.max_running_requests // attn_dp} requests. Allow at least "
                f"{attn_dp} (one per worker), or lower {o('dp_size')}."
            )
        changed = [
            o(name)
            for name, value, default in (
                ("hicache_ratio", self.hicache_ratio, None),
                ("hicache_size", self.hicache_size, 0),
                ("hicache_mamba_ratio", self.hicache_mamba_ratio, None),
                ("hicache_host_memory_fraction", self.hicache_host_memory_fraction, 0.8),
            )
            if value != default
        ]
        if changed and not (self.enable_hierarchical_cache or self.retraction_host_pool):
            raise ConfigError(
                f"The host KV tier that {' and '.join(changed)} sizes exists only with "
                f"{o('enable_hierarchical_cache')} (or a decode node's "
                f"{o('disaggregation_decode_retraction_backup')} host_pool); add it, or drop {' and '.join(changed)}."
            )
        if self.disaggregation_decode_retraction_backup is not None and self.disaggregation_mode != "decode":
            raise ConfigError(
                f"{o('disaggregation_decode_retraction_backup')} applies to a decode node only (only it retracts "
                f"requests whose KV came from a prefill node); add {o('disaggregation_mode')} decode, or drop it."
            )
        if self.launched_ranks % self.nnodes:
            raise ConfigError(
                f"{o('nnodes')} {self.nnodes} must divide the {self.launched_ranks} ranks ({o('tp_size')} x "
                f"{o('pp_size')}, x {o('dp_size')} without DP attention), as SGLang places them evenly."
            )
        if self.enable_mamba_extra_buffer_lazy and not self.enable_mamba_extra_buffer:
            # SGLang's extra_buffer_lazy is a strategy of the extra buffer (mamba_extra_buffer_of); alone the flag
            # would change nothing here
            raise ConfigError(
                f"{o('enable_mamba_extra_buffer_lazy')} is the lazy variant of the mamba extra buffer (SGLang's "
                f"--mamba-radix-cache-strategy extra_buffer_lazy), so alone it changes nothing: add "
                f"{o('enable_mamba_extra_buffer')}, or drop it."
            )
        if self.enable_online_c128_mtp and not self.enable_online_compress:
            # SGLang reads SGLANG_EXPERIMENTAL_ONLINE_C128_MTP only under ONLINE_C128 (deepseek_v4_memory_pool.py
            # lines 50, 72-73, 1078), which SGLANG_OPT_USE_ONLINE_COMPRESS turns on
            raise ConfigError(
                f"{o('enable_online_c128_mtp')} applies to the online c128 compression only, which is off: add "
                f"{o('enable_online_compress')}, or drop {o('enable_online_c128_mtp')} (alone it changes nothing)."
            )
        if self.enable_mamba_extra_buffer_lazy and self.disable_overlap_schedule:
            raise ConfigError(
                f"{o('enable_mamba_extra_buffer_lazy')} requires the overlap schedule; "
                f"drop {o('disable_overlap_schedule')} or the lazy extra buffer."
            )

    @property
    def attn_dp_size(self) -> int:
        """DP width that splits requests: dp_size with DP attention, else 1."""
        return self.dp_size if self.enable_dp_attention else 1

    @property
    def attn_tp_size(self) -> int:
        """Ranks that shard one attention layer's KV heads: tp / attn_dp / cp."""
        return self.tp_size // self.attn_dp_size // self.attn_cp_size

    @property
    def unset_options(self) -> tuple[str, ...]:
        """The :data:`ENGINE_DEFAULT_OPTIONS` left unset (reading as the generic default, :func:`is_unset`)."""
        return tuple(name for name in ENGINE_DEFAULT_OPTIONS if is_unset(getattr(self, name)))

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def decode_extra_slots(self) -> int:
        """Rows a PD decode node pre-allocates beyond ``max_running_requests`` (``pre_alloc_size``); 0 off one.

        Unset, SGLang 0.5.23's default (``handle_pd_disaggregation``, ``arg_groups/pd_disaggregation_hook.py``
        lines 123-143): twice the requests per DP worker (``max(1, max_running_requests // num_dp_ranks)``,
        ``num_dp_ranks`` = ``dp_size``, replicas or DP attention alike) when that is at most 32, else none.
        Only a decode launch computes it (ref-000 lines 1003-1022).
        """
        if self.disaggregation_mode != "decode":
            return 0
        if self.disaggregation_decode_extra_slots is not None:
            return self.disaggregation_decode_extra_slots
        if self.max_running_requests is None:
            return 0
        per_worker = max(1, self.max_running_requests // self.dp_size)
        return 2 * per_worker if per_worker <= 32 else 0

    @property
    def retraction_host_pool(self) -> bool:
        """Whether a decode node backs retractions up in a HiCache host pool (asked for explicitly)."""
        return self.disaggregation_decode_retraction_backup == "host_pool"

    @property
    def host_tier(self) -> bool:
        """Whether SGLang builds host KV pools: ``--enable-hierarchical-cache``, or a decode node's ``host_pool``
        retraction backup (``enabled=enable_hierarchical_cache or retraction_backup == "host_pool"``,
        ``mem_cache/kv_cache_builder.py``)."""
        return self.enable_hierarchical_cache or self.retraction_host_pool

    @property
    def hicache_auto_sized(self) -> bool:
        """Whether SGLang auto-sizes the host tier: host pools built, neither ``--hicache-ratio`` nor
        ``--hicache-size`` given (``handle_hicache_ratio_default`` keeps ``hicache_host_memory_fraction`` only
        then, ``arg_groups/hicache_hook.py``; ``auto_size_hicache``, ``mem_cache/hicache_auto_size.py``)."""
        return self.host_tier and self.hicache_ratio is None and self.hicache_size == 0

    @property
    def hicache_ratio_or_default(self) -> float:
        """``hicache_ratio``, else SGLang's default 2.0 (cache mode), before any auto-sizing."""
        return DEFAULT_HICACHE_RATIO if self.hicache_ratio is None else self.hicache_ratio

    @property
    def radix_cache_disabled(self) -> bool:
        """Whether the server runs without the radix cache: ``--disable-radix-cache``, or a PD decode node.

        SGLang resolves ``disable_radix_cache=True`` on every decode node (``handle_pd_disaggregation``,
        ``arg_groups/pd_disaggregation_hook.py`` lines 98-121) unless the experimental
        ``--disaggregation-decode-enable-radix-cache`` is given, which kvpools does not model.  Sizing that
        depends on the radix cache (the mamba state ratio, the SWA chunk cap) reads this, never the flag.
        """
        return self.disable_radix_cache or self.disaggregation_mode == "decode"

    @property
    def launched_ranks(self) -> int:
        """Every rank the launch starts: ``tp_size x pp_size``, times ``dp_size`` replicas without DP attention."""
        return self.tp_size * self.pp_size * (1 if self.enable_dp_attention else self.dp_size)

    @property
    def ranks_per_node(self) -> int:
        """Ranks that share one node's host memory: :attr:`launched_ranks` ``// nnodes`` (SGLang's
        ``ranks_per_host``: ``launch_world_size // nnodes``, ``pool_host/base.py``, counted over DP replicas too)."""
        return self.launched_ranks // self.nnodes

    @property
    def traits(self) -> PlatformTraits:
        """The platform's traits (``platform_traits``), or the neutral ones before the pipeline resolved them."""
        return self.platform_traits or PlatformTraits(platform=self.platform)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Serving:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# budget
# ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Budget:
    """The bytes the KV cache may use, and the arithmetic that produced them.

    ``explicit`` budgets are taken as given.  Measured budgets follow SGLang's
    ``_profile_available_bytes``: free memory after the weights load, minus
    ``pre_model_load * (1 - mem_fraction_static)`` of runtime slack, minus the
    multimodal reservation.
    """

    budget_bytes: int = attrs.field(validator=non_negative)
    source: str = "explicit"
    device: str | None = None
    free_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    weights_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    pre_model_load_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    mem_fraction_static: float | None = attrs.field(default=None, validator=attrs.validators.optional(fraction))
    slack_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    reserved_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    steps: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    gpu: str | None = None
    """The catalogue GPU (``kvpools_core.gpus``) the budget was planned on, or ``"custom"``; ``None`` otherwise."""
    gpu_total_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    """That GPU's total memory as SGLang reads it (``get_device_memory_capacity``, MiB x 2^20)."""
    runtime_bytes: int | None = attrs.field(default=None, validator=optional_non_negative)
    """What the runtime holds before the weights load (CUDA context, communicators): total - runtime = pre-load."""
    mem_fraction_source: str | None = None
    """Why ``mem_fraction_static`` has its value: ``"given"``, or SGLang's default and the terms behind it."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Budget:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# cell size and pools
# ---------------------------------------------------------------------------


TOKEN = "token"
REQUEST = "request"
STATE_SLOT = "state_slot"
FIXED = "fixed"
COST_UNITS = (TOKEN, REQUEST, STATE_SLOT, FIXED)
"""What a cell part's bytes (and a pool's slots) are paid per: a token, a running request, a state slot, or once."""
FULL_TOKENS = "full"
"""The token space of every token a request holds for its whole context (``max_total_num_tokens``)."""

_LEGACY_REQUEST_POOL = "request_state"
_LEGACY_FIXED_POOL = "fixed"


@attrs.frozen
class CellPart:
    """One named share of the cell's bytes, the pool that stores it, and what it is paid per.

    ``unit`` says what ``bytes_per_token`` is paid per: ``"token"`` (the
    default: bytes every cached token stores), ``"request"`` (state one running
    request holds whatever its length), ``"state_slot"`` (one slot of a state
    cache whose size the sizing plugin decides, e.g. SGLang's
    ``max_mamba_cache_size`` recurrent-state slots, about ratio x requests) or
    ``"fixed"`` (bytes the plan holds once).  The field keeps the name
    ``bytes_per_token`` whatever the unit, as plans on disk spell it;
    :attr:`bytes_per_unit` reads it by its meaning.  The parts of one pool
    share one unit.

    A token pool allocates ``tokens + page_size`` slots (page 0 pads).  A pool
    laid out in whole pages with more slack names it in ``extra_slots``: it
    then allocates ``(tokens + page_size + extra_slots) // page_size`` pages
    (SGLang's DSA indexer: ``extra_slots=1``, two padding slots at page size 1).
    The parts of one pool share one layout (the pool takes their largest value).
    Only token parts have ``extra_slots``.

    A pool whose slots are not the plan's tokens one for one says how many it
    spans per plan token in ``slot_scale``: it then holds ``tokens x
    slot_scale`` slots in pages of ``page_size x slot_scale``, i.e. ``(tokens +
    page_size) x slot_scale`` rows (SGLang's draft worker under decode context
    parallelism: its replicated draft pools address the shared allocator's
    virtual slots ``[0, max_total x dcp)`` untranslated, ``loc_space_scale``,
    ``000_fbd4f47288598fb9.txt`` lines 405-433).  The parts of one pool share
    one ``slot_scale``; only token parts have one other than 1.
    """

    name: str
    bytes_per_token: int = attrs.field(validator=non_negative)
    pool: str = "kv"
    extra_slots: int = attrs.field(default=0, validator=non_negative)
    unit: str = attrs.field(default=TOKEN, validator=one_of(*COST_UNITS))
    slot_scale: int = attrs.field(default=1, validator=positive)

    def __attrs_post_init__(self) -> None:
        for field, value, default in (("extra_slots", self.extra_slots, 0), ("slot_scale", self.slot_scale, 1)):
            if value != default and self.unit != TOKEN:
                raise InvalidValueError(
                    f"CellPart.{field} applies to token parts only; part {self.name!r} is paid per {self.unit} "
                    f"and has {field}={value}."
                )

    @property
    def bytes_per_unit(self) -> int:
        """The bytes paid per one ``unit`` (the ``bytes_per_token`` field, read by its meaning)."""
        return self.bytes_per_token

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellPart:
        return load_value(cls, data)


def _draft_charge_or_none(value: DraftCharge | Mapping[str, Any] | None) -> DraftCharge | None:
    return DraftCharge.from_dict(value) if isinstance(value, Mapping) else value


@attrs.frozen(kw_only=True)
class CellSize:
    """What one token, one request and one state slot cost, and what is fixed.

    ``parts`` are the bytes kvpools really stores, grouped by the pool they
    live in and paid per their ``unit``: ``bytes_per_token``,
    ``bytes_per_request``, ``bytes_per_state_slot`` and ``fixed_bytes`` are the
    sums of the parts of each unit (the last three were constructor fields
    before parts had units; :meth:`from_dict` still reads them from an older
    plan, as parts of pools ``request_state`` and ``fixed``).
    ``sglang_bytes_per_token`` is SGLang's cell size for the
    same model (its configurator's ``cell_size``, a float for hybrid pools),
    which ``--accounting sglang`` divides the budget by.  ``num_layers`` is the
    number of layers the token cost covers on this rank, so wrappers (draft
    scaling) can derive a per-layer cost; ``draft_included`` tells them an
    architecture already charged the draft model itself.  ``draft_layer_parts``
    is what one draft-model layer stores per token, for architectures whose
    draft layer is not the average of the token ``parts`` over ``num_layers`` (mixed
    layer kinds, layer-split storage); empty means that average.
    """

    parts: tuple[CellPart, ...] = attrs.field(converter=_part_tuple)
    sglang_bytes_per_token: float = attrs.field()
    num_layers: int = attrs.field(validator=non_negative)
    draft_included: bool = False
    notes: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    draft_layer_parts: tuple[CellPart, ...] = attrs.field(default=(), converter=_part_tuple)
    draft: DraftCharge | None = attrs.field(default=None, converter=_draft_charge_or_none)
    """Set by the speculative plugin when it composed a draft model of its own (``Serving.speculative_draft``):
    the draft's exact bytes per token beside what SGLang's layer-count scaling charges for it."""

    @sglang_bytes_per_token.validator
    def _check_sglang(self, _attribute: attrs.Attribute[Any], value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
            raise ConfigError(
                f"CellSize.sglang_bytes_per_token (a cell size) must be a positive finite number, got {value!r}."
            )

    @parts.validator
    def _check_units(self, _attribute: attrs.Attribute[Any], parts: tuple[object, ...]) -> None:
        units: dict[str, str] = {}
        scales: dict[str, int] = {}
        for part in parts:
            if not isinstance(part, CellPart):
                return  # not a part at all: the hook contract names the plugin that built it
            seen = units.setdefault(part.pool, part.unit)
            if seen != part.unit:
                raise InvalidValueError(
                    f"CellSize.parts: pool {part.pool!r} mixes parts paid per {seen} and per {part.unit} "
                    f"(part {part.name!r}); give parts of another unit a pool of their own."
                )
            scale = scales.setdefault(part.pool, part.slot_scale)
            if scale != part.slot_scale:
                raise InvalidValueError(
                    f"CellSize.parts: pool {part.pool!r} mixes parts of slot_scale {scale} and {part.slot_scale} "
                    f"(part {part.name!r}); the parts of one pool span one number of slots per token."
                )

    def parts_of(self, unit: str) -> tuple[CellPart, ...]:
        """The parts paid per ``unit`` (``"token"``, ``"request"``, ``"state_slot"`` or ``"fixed"``)."""
        return tuple(part for part in self.parts if part.unit == unit)

    @property
    def bytes_per_token(self) -> int:
        """Bytes per plan token: the sum of the token parts, each times the slots it spans (``slot_scale``)."""
        return sum(part.bytes_per_token * part.slot_scale for part in self.parts_of(TOKEN))

    @property
    def bytes_per_request(self) -> int:
        """Bytes per running request: the sum of the request parts."""
        return sum(part.bytes_per_token for part in self.parts_of(REQUEST))

    @property
    def bytes_per_state_slot(self) -> int:
        """Bytes per state slot: the sum of the state-slot parts (how many slots, the sizing plugin decides)."""
        return sum(part.bytes_per_token for part in self.parts_of(STATE_SLOT))

    @property
    def fixed_bytes(self) -> int:
        """Bytes held once: the sum of the fixed parts."""
        return sum(part.bytes_per_token for part in self.parts_of(FIXED))

    def pool_bytes(self, unit: str) -> dict[str, int]:
        """Bytes per ``unit`` of each pool whose parts are paid per it, in first-seen order."""
        pools: dict[str, int] = {}
        for part in self.parts_of(unit):
            pools[part.pool] = pools.get(part.pool, 0) + part.bytes_per_token
        return pools

    def pool_bytes_per_token(self) -> dict[str, int]:
        """Bytes per token of each token pool, in first-seen order."""
        return self.pool_bytes(TOKEN)

    def pool_extra_slots(self) -> dict[str, int]:
        """Each token pool's ``extra_slots`` (the largest of its parts'), in first-seen order."""
        extra: dict[str, int] = {}
        for part in self.parts_of(TOKEN):
            extra[part.pool] = max(extra.get(part.pool, 0), part.extra_slots)
        return extra

    def pool_slot_scale(self) -> dict[str, int]:
        """Each token pool's slots per plan token (its parts' ``slot_scale``), in first-seen order."""
        return {part.pool: part.slot_scale for part in self.parts_of(TOKEN)}

    @property
    def cost(self) -> CostModel:
        """The cell's own cost, one group per pool of its parts: what the parts store, before any padding.

        A plan's :attr:`Plan.cost` adds what the pools allocate beyond the
        parts (padding pages and rows, the request table, the allocators).
        """
        groups: dict[str, dict[str, int]] = {}
        for part in self.parts:
            paid = groups.setdefault(part.pool, dict.fromkeys(COST_UNITS, 0))
            paid[part.unit] += part.bytes_per_token * part.slot_scale
        return CostModel(
            GroupCost(
                group=pool,
                token_bytes=paid[TOKEN],
                bytes_per_request=paid[REQUEST],
                bytes_per_state_slot=paid[STATE_SLOT],
                fixed_bytes=paid[FIXED],
            )
            for pool, paid in groups.items()
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellSize:
        return load_value(cls, data)

    @classmethod
    def _prepare_loaded(cls, data: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        """A plan written before parts had units records ``bytes_per_request`` and ``fixed_bytes``: read them as
        parts of pools ``request_state`` and ``fixed`` (:func:`kvpools_core.loading.load_value` calls this)."""
        if "bytes_per_request" not in data and "fixed_bytes" not in data:
            return data
        data = dict(data)
        legacy = []
        for field, pool, unit in (
            ("bytes_per_request", _LEGACY_REQUEST_POOL, REQUEST),
            ("fixed_bytes", _LEGACY_FIXED_POOL, FIXED),
        ):
            if field in data:
                value = data.pop(field)
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise wrong(f"{path}.{field}", value, "a non-negative integer (bytes of an older plan's part)")
                if value:
                    legacy.append({"name": pool, "bytes_per_token": value, "pool": pool, "unit": unit})
        parts = data.get("parts", [])
        if legacy and isinstance(parts, (list, tuple)):
            data["parts"] = [*parts, *legacy]
        return data


def _page_tokens(budget_bytes: int, cell_bytes: float, page_size: int) -> int:
    """SGLang's ``budget // cell``, page aligned (``kvpools_core.sizing.sglang_tokens``, which imports this module)."""
    return int(budget_bytes // cell_bytes) // page_size * page_size


@attrs.frozen(kw_only=True)
class DraftCharge:
    """A speculative draft model of its own, composed into a cell: what it stores, and what SGLang charges for it.

    SGLang sizes its token count with the target's cell scaled by the draft's
    layer count (``pool_configurator.py``: ``int(cell * (1 + D / L))`` for the
    EAGLE family, ``ceil(cell * (L + D) / L)`` for DFLASH), "assuming the draft
    shares the target's per-layer KV size"; its draft worker then allocates the
    draft's *own* pools (``KVCacheConfigurator`` with ``is_draft_worker``, the
    draft's model config), of ``exact_bytes_per_token``.  ``sglang_bytes_per_token``
    is the scaled cell SGLang divides its budget by; :meth:`tokens` compares
    the count it gives with the count the draft's own cell would give.
    """

    model: str
    """The draft model's name (``ModelSpec.name``)."""
    architecture: str
    """The draft's architecture family (``ModelSpec.architecture``): the plugin family that sized its pools."""
    num_layers: int = attrs.field(validator=positive)
    """``D``: the draft's layers, SGLang's ``eagle_draft_num_layers`` / ``dflash_draft_num_layers``."""
    exact_bytes_per_token: int = attrs.field(validator=non_negative)
    """What the draft's own pools store per token (its cell's token parts, the ``draft_*`` parts of the cell)."""
    own_sglang_bytes_per_token: float = attrs.field(validator=positive_ratio)
    """The draft's own SGLang cell size (its configurator's ``cell_size`` were it the served model)."""
    target_sglang_bytes_per_token: float = attrs.field(validator=positive_ratio)
    """The target's SGLang cell size before the draft was added."""
    sglang_bytes_per_token: float = attrs.field(validator=positive_ratio)
    """The composed cell SGLang computes from the layer-count scaling (``CellSize.sglang_bytes_per_token``)."""

    @property
    def sglang_draft_bytes_per_token(self) -> float:
        """What SGLang's scaling charges for the draft per token: the scaled cell less the target's."""
        return self.sglang_bytes_per_token - self.target_sglang_bytes_per_token

    def tokens(self, budget_bytes: int, page_size: int) -> tuple[int, int]:
        """(SGLang's token count under its scaling, the count under the draft's own cell), for one budget."""
        own = self.target_sglang_bytes_per_token + self.own_sglang_bytes_per_token
        return (
            _page_tokens(budget_bytes, self.sglang_bytes_per_token, page_size),
            _page_tokens(budget_bytes, own, page_size),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DraftCharge:
        return load_value(cls, data)


@attrs.frozen(kw_only=True)
class DraftModel:
    """A speculative draft model of its own (``--speculative-draft-model-path``), as the pipeline resolved it.

    ``model`` is parsed by the architecture plugin that claims its config
    (``parsed_by``), exactly as a served model is; ``cell`` is that
    architecture's ``estimate_cell_size`` answer under the draft worker's
    serving (:func:`kvpools_core.pipeline.draft_worker_serving`), by
    ``estimated_by``.  The speculative plugin composes its token parts into the
    target's cell as ``draft_*`` pools; ``build`` builds them through the
    draft's own ``build_pool``.
    """

    model: ModelSpec
    cell: CellSize
    parsed_by: str = ""
    estimated_by: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DraftModel:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# cost model
# ---------------------------------------------------------------------------


def _token_space(inst: object, attribute: attrs.Attribute[Any], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidValueError(f"{_flag(inst, attribute)} must name a token space (e.g. 'full'), got {value!r}.")


@attrs.frozen(kw_only=True)
class GroupCost:
    """What one group of a plan (one pool) costs, as an affine function of the counts it scales with::

        bytes = token_bytes * (tokens // token_block) + bytes_per_request * requests
                + bytes_per_state_slot * state_slots + fixed_bytes

    ``tokens`` is the count of the token space ``token_space`` names:
    ``"full"`` (:data:`FULL_TOKENS`) is every token a request holds for its
    whole context (``max_total_num_tokens``); the SWA plugin adds ``"swa"``,
    the tokens inside the sliding window.  A group that grows in whole pages
    says so with ``token_block``: it pays ``token_bytes`` per page of
    ``token_block`` tokens (the allocator's free list: 8 B per page), so
    :attr:`bytes_per_token` may be a fraction.  A pool laid out in whole pages
    with slack (the DSA indexer, ``CellPart.extra_slots``) is charged per page
    too, and its slack pages are in ``fixed_bytes``: exact for page-aligned
    token counts, which every plan's are (a count between pages is charged for
    its whole pages only).  ``requests`` are the running requests of one DP
    worker (``max_running_requests``); ``state_slots`` the slots of a state
    cache (the mamba plugin's ``max_mamba_cache_size``).  The request table's
    row is the context length's, so its bytes per request hold for the plan's
    context length.  A group whose slots are tokens of another space than the
    one it is sized by says so with ``slot_space`` and ``slots_per_token``
    (the dsv4 c4 indexer: ``c4_logical_size = c128 tokens x 32``, so
    ``token_space`` ``"c128"``, ``slot_space`` ``"c4"``, 32), and
    :meth:`describe` prices its slots: ``2,772 B/c4 token``.
    """

    group: str
    token_space: str = attrs.field(default=FULL_TOKENS, validator=_token_space)
    token_bytes: int = attrs.field(default=0, validator=non_negative)
    token_block: int = attrs.field(default=1, validator=positive)
    bytes_per_request: int = attrs.field(default=0, validator=non_negative)
    bytes_per_state_slot: int = attrs.field(default=0, validator=non_negative)
    fixed_bytes: int = attrs.field(default=0, validator=non_negative)
    slot_space: str | None = attrs.field(default=None, validator=attrs.validators.optional(_token_space))
    slots_per_token: int = attrs.field(default=1, validator=positive)

    @property
    def bytes_per_token(self) -> float:
        """Bytes per token: ``token_bytes / token_block`` (an integer unless the group is paged)."""
        per = self.token_bytes / self.token_block
        return int(per) if per.is_integer() else per

    def bytes_for(self, *, tokens: int = 0, requests: int = 0, state_slots: int = 0) -> int:
        """The group's bytes for ``tokens`` of its token space, ``requests`` and ``state_slots``."""
        return (
            self.token_bytes * (tokens // self.token_block)
            + self.bytes_per_request * requests
            + self.bytes_per_state_slot * state_slots
            + self.fixed_bytes
        )

    def __add__(self, other: GroupCost) -> GroupCost:
        """Two costs of one group summed (target + draft parts of the same pool)."""
        if not isinstance(other, GroupCost):
            return NotImplemented
        if (self.group, self.token_space, self.token_block) != (other.group, other.token_space, other.token_block):
            raise InvalidValueError(
                f"GroupCost: cannot add group {other.group!r} ({other.token_space} tokens in blocks of "
                f"{other.token_block}) to {self.group!r} ({self.token_space} tokens in blocks of {self.token_block})."
            )
        return attrs.evolve(
            self,
            token_bytes=self.token_bytes + other.token_bytes,
            bytes_per_request=self.bytes_per_request + other.bytes_per_request,
            bytes_per_state_slot=self.bytes_per_state_slot + other.bytes_per_state_slot,
            fixed_bytes=self.fixed_bytes + other.fixed_bytes,
        )

    def describe(self) -> str:
        """One affine line: ``N B/token + M B/request + S B/state slot + F B fixed`` (zero terms left out).

        A token is one of ``slot_space`` when the group names one (``N B/c4 token (... per c128 token)``), else
        of ``token_space`` (``B/token`` for full tokens, ``B/swa token``, ``B/c128 token``)."""
        space = self.token_space if self.slot_space is None else self.slot_space
        label = "token" if space == FULL_TOKENS else f"{space} token"
        block = self.token_block * self.slots_per_token
        terms = []
        if self.token_bytes:
            per = self.token_bytes / block
            shown = f"{int(per):,}" if per.is_integer() else f"{per:,.4g}"
            paged = f"{self.token_bytes:,} B per {block}-token page" if block > 1 else ""
            if self.slot_space is not None:
                sized = f"{self.slots_per_token} per {self.token_space} token"
                paged = f"{paged}, {sized}" if paged else sized
            terms.append(f"{shown} B/{label}{f' ({paged})' if paged else ''}")
        if self.bytes_per_request:
            terms.append(f"{self.bytes_per_request:,} B/request")
        if self.bytes_per_state_slot:
            terms.append(f"{self.bytes_per_state_slot:,} B/state slot")
        if self.fixed_bytes or not terms:
            terms.append(f"{self.fixed_bytes:,} B fixed")
        return " + ".join(terms)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GroupCost:
        return load_value(cls, data)


@attrs.frozen
class CostModel:
    """What a plan costs as a function of its counts: one :class:`GroupCost` per group (pool).

    ``bytes_for(tokens=..., requests=..., state_slots=...)`` answers "how many
    bytes would these counts take" for any counts, whichever plugin sized the
    plan; ``a + b`` composes two models (target and draft), summing the groups
    they share by name.  Every plan carries one (:attr:`Plan.cost`), derived
    from its pools.
    """

    groups: tuple[GroupCost, ...] = attrs.field(default=(), converter=_group_tuple)

    @groups.validator
    def _check_groups(self, _attribute: attrs.Attribute[Any], groups: tuple[GroupCost, ...]) -> None:
        names = [group.group for group in groups]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise InvalidValueError(f"CostModel.groups names group(s) {repeated} more than once; add them instead.")

    def __add__(self, other: CostModel) -> CostModel:
        if not isinstance(other, CostModel):
            return NotImplemented
        merged = {group.group: group for group in self.groups}
        for group in other.groups:
            merged[group.group] = merged[group.group] + group if group.group in merged else group
        return CostModel(merged.values())

    @property
    def token_spaces(self) -> tuple[str, ...]:
        """The token spaces the groups scale with, in first-seen order."""
        return tuple(dict.fromkeys(g.token_space for g in self.groups if g.token_bytes))

    @property
    def bytes_per_request(self) -> int:
        return sum(g.bytes_per_request for g in self.groups)

    @property
    def bytes_per_state_slot(self) -> int:
        return sum(g.bytes_per_state_slot for g in self.groups)

    @property
    def fixed_bytes(self) -> int:
        return sum(g.fixed_bytes for g in self.groups)

    def group(self, name: str) -> GroupCost:
        for group in self.groups:
            if group.group == name:
                return group
        raise KeyError(f"cost model has no group named {name!r}; groups: {[g.group for g in self.groups]}")

    def bytes_for(self, *, tokens: int | Mapping[str, int] = 0, requests: int = 0, state_slots: int = 0) -> int:
        """Bytes of every group for these counts.

        ``tokens`` is one count for every token space, or a mapping from each
        token space (``{"full": ..., "swa": ...}``) to its count; a space the
        model scales with must be in it.
        """
        counts = tokens if isinstance(tokens, Mapping) else dict.fromkeys(self.token_spaces, tokens)
        missing = [space for space in self.token_spaces if space not in counts]
        if missing:
            raise ConfigError(f"CostModel.bytes_for: no token count for token space(s) {missing}.")
        for what, value in (*((f"tokens[{k!r}]", v) for k, v in counts.items()), ("requests", requests)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"CostModel.bytes_for: {what} must be a non-negative integer, got {value!r}.")
        if isinstance(state_slots, bool) or not isinstance(state_slots, int) or state_slots < 0:
            raise ConfigError(f"CostModel.bytes_for: state_slots must be a non-negative integer, got {state_slots!r}.")
        return sum(
            g.bytes_for(tokens=counts.get(g.token_space, 0), requests=requests, state_slots=state_slots)
            for g in self.groups
        )

    def lines(self) -> tuple[str, ...]:
        """One affine line per group: ``name: N B/token + M B/request + S B/state slot + F B fixed``."""
        return tuple(f"{g.group}: {g.describe()}" for g in self.groups)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        return load_value(cls, data)


def _unit_of_kind(pool: PoolSpec) -> str:
    """What a slot of a pool without a recorded unit is, from its kind (plans written before units)."""
    return {"request": REQUEST, "state": REQUEST, "fixed": FIXED}.get(pool.kind, TOKEN)


def _group_cost_or_none(value: GroupCost | Mapping[str, Any] | None) -> GroupCost | None:
    return GroupCost.from_dict(value) if isinstance(value, Mapping) else value


@attrs.frozen(kw_only=True)
class PoolSpec:
    """One physically separate allocation of the plan.

    ``slots`` are the usable slots (tokens, request rows, pages);
    ``padding_slots`` are allocated but never handed out (SGLang's page 0 and
    request row 0).  ``bytes`` is exactly what ``build`` allocates for it.
    ``sglang_charged`` says whether SGLang's own estimate counts it.

    ``unit`` is what the pool's size scales with (``"token"``, ``"request"``,
    ``"state_slot"`` or ``"fixed"``; unset, it follows ``kind``: request and
    state pools per request, fixed pools fixed, any other per token), and
    ``token_space`` which token count a token pool scales with (``"full"``;
    the SWA plugin's window pool ``"swa"``).  Its cost (:attr:`group_cost`)
    is then ``bytes_per_slot`` per unit plus the rest of ``bytes`` fixed, with
    ``slots`` counting units.  A pool whose bytes do not follow that (an
    allocator paying per page, a pool of whole pages with slack, a request
    table with rows beyond the requests) records its :class:`GroupCost` in
    ``cost``.
    """

    name: str
    kind: str
    slots: int = attrs.field(validator=non_negative)
    bytes_per_slot: int = attrs.field(validator=non_negative)
    bytes: int = attrs.field(validator=non_negative)
    padding_slots: int = attrs.field(default=0, validator=non_negative)
    sglang_charged: bool = True
    owner: str = ""
    unit: str = attrs.field(default=attrs.Factory(_unit_of_kind, takes_self=True), validator=one_of(*COST_UNITS))
    token_space: str = attrs.field(default=FULL_TOKENS, validator=_token_space)
    cost: GroupCost | None = attrs.field(default=None, converter=_group_cost_or_none)

    @cost.validator
    def _check_cost(self, _attribute: attrs.Attribute[Any], cost: GroupCost | None) -> None:
        if cost is None:
            return
        if not isinstance(cost, GroupCost):
            raise InvalidValueError(f"PoolSpec.cost of pool {self.name!r} must be a GroupCost, got {cost!r}.")
        if cost.group != self.name:
            raise InvalidValueError(f"PoolSpec.cost of pool {self.name!r} is named {cost.group!r}.")
        paid = {
            TOKEN: cost.token_bytes,
            REQUEST: cost.bytes_per_request,
            STATE_SLOT: cost.bytes_per_state_slot,
        }
        other = [unit for unit, value in paid.items() if value and unit != self.unit]
        if other or (self.unit == TOKEN and cost.token_space != self.token_space):
            raise InvalidValueError(
                f"PoolSpec.cost of pool {self.name!r} (unit {self.unit}, token space {self.token_space}) "
                f"pays per {', '.join(other) or 'token of space ' + cost.token_space}."
            )

    @property
    def group_cost(self) -> GroupCost:
        """The pool's bytes as a function of its unit's count (see :class:`GroupCost`)."""
        if self.cost is not None:
            return self.cost
        if self.unit == FIXED:
            return GroupCost(group=self.name, fixed_bytes=self.bytes)
        fixed = self.bytes - self.bytes_per_slot * self.slots
        if fixed < 0:
            raise InvalidValueError(
                f"PoolSpec {self.name!r}: {self.bytes} B is less than {self.slots} slots x {self.bytes_per_slot} B; "
                f"record its cost (PoolSpec.cost)."
            )
        slot, unit = self.bytes_per_slot, self.unit
        return GroupCost(
            group=self.name,
            token_space=self.token_space,
            fixed_bytes=fixed,
            token_bytes=slot if unit == TOKEN else 0,
            bytes_per_request=slot if unit == REQUEST else 0,
            bytes_per_state_slot=slot if unit == STATE_SLOT else 0,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolSpec:
        return load_value(cls, data)


def _token_window_or_dict(value: TokenWindow | Mapping[str, Any]) -> TokenWindow:
    return TokenWindow.from_dict(value) if isinstance(value, Mapping) else value


def _window_tuple(items: Iterable[TokenWindow | Mapping[str, Any]]) -> tuple[TokenWindow, ...]:
    return tuple(_token_window_or_dict(item) for item in items)


@attrs.frozen(kw_only=True)
class TokenWindow:
    """The most tokens of one token space a request holds, whatever its length: a sliding window's worst case.

    SGLang frees a request's out-of-window tokens of a sliding-window pool as it
    decodes, so past the window a request costs that pool the same however long
    it grows.  The terms are those of SGLang's ``SWAChunkCapPoolConfigurator``
    (``002_50706b73e02ffb67.txt`` lines 412-458), recorded by the sizing plugin
    that knows the engine (through ``kvpools_core.sizing.sliding_window_terms``:
    the swa plugin for its ``"swa"`` space, the dsv4 plugin for DeepSeek-V4's,
    whose SWA rows SGLang's scheduler evicts alike) so readers of a plan
    (``kvpools capacity``) need not re-derive them::

        per_request = window + eviction_interval x draft_tokens + page_size + decode_alloc   (lines 435, 445)

    Beyond that, ``prefills_in_flight`` requests are being prefilled at once,
    each holding up to ``prefill_chunk`` more (lines 454-458: two chunks with the
    overlap schedule, one without, none on a decode node), and ``reserved``
    tokens stay held whatever the requests (a page; on a decode node
    ``(window + page) x disaggregation_decode_extra_slots``, lines 448-452).
    SGLang's chunk cap sizes the pool as ``per_request x requests +
    prefills_in_flight x prefill_chunk + reserved``.
    """

    token_space: str = attrs.field(validator=_token_space)
    window: int = attrs.field(validator=positive)
    """The sliding window (``mr.sliding_window_size``, line 427)."""
    eviction_interval: int = attrs.field(validator=positive)
    """``max(1, SGLANG_SWA_EVICTION_INTERVAL)`` (line 429): out-of-window tokens wait this many decode steps."""
    draft_tokens: int = attrs.field(validator=positive)
    """``speculative_num_draft_tokens or 1`` (line 428): tokens one decode step writes."""
    page_size: int = attrs.field(validator=positive)
    """The page that keeps the eviction point page aligned (line 435)."""
    decode_alloc: int = attrs.field(validator=positive)
    """The next decode step's outstanding allocation (lines 436-444): a page; spec-v1
    ``spec_decode_alloc_len_per_request``; spec-v2 ``2 x get_alloc_len_per_decode``."""
    prefill_chunk: int | None = attrs.field(validator=optional_positive)
    """``--chunked-prefill-size``; None: a prompt is prefilled whole (one chunk as long as the prompt)."""
    prefills_in_flight: int = attrs.field(validator=non_negative)
    """Requests prefilled at once: 2 with the overlap schedule, 1 without, 0 on a decode node (line 454)."""
    reserved: int = attrs.field(validator=non_negative)
    """Tokens held whatever the requests: a page, or a decode node's pre-allocated slots (lines 448-458)."""

    @property
    def per_request(self) -> int:
        """The most tokens one decoding request holds: ``window + eviction_interval x draft_tokens + page_size +
        decode_alloc`` (SGLang's ``per_request``, lines 435 and 445)."""
        return self.window + self.eviction_interval * self.draft_tokens + self.page_size + self.decode_alloc

    def describe(self) -> str:
        """One line: the worst case per request and its terms, the prefills in flight, the reserve."""
        chunk = f"{self.prefill_chunk:,}" if self.prefill_chunk is not None else "a whole prompt"
        return (
            f"{self.token_space}: at most {self.per_request:,} tokens/request past the window (window {self.window:,} "
            f"+ eviction interval {self.eviction_interval:,} x {self.draft_tokens} draft token(s) + page "
            f"{self.page_size:,} + decode {self.decode_alloc:,}); + up to {chunk} for each of "
            f"{self.prefills_in_flight} prefill(s) in flight; {self.reserved:,} reserved"
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenWindow:
        return load_value(cls, data)


@attrs.frozen(kw_only=True)
class PoolSizing:
    """The answer of ``size_pools``: token and request counts, and every pool.

    ``sglang_config`` holds SGLang's ``MemoryPoolConfig`` fields under their
    SGLang names (only those the model has).  ``token_counts`` are the tokens
    of each token space the pools scale with (unset: ``max_total_num_tokens``
    full tokens; the SWA plugin names ``"full"`` and ``"swa"``) and
    ``state_slots`` the slots of a state cache (the mamba plugin's
    ``max_mamba_cache_size``): with ``max_running_requests`` they are the
    :attr:`counts` the :attr:`cost` model reproduces the pools' bytes from.
    ``state_slots_per_request`` is how many of those slots one running
    request may hold at its peak (SGLang's ``_calculate_mamba_ratio``: 3 with
    the radix cache, 1 without), so capacity answers divide by the sizing
    plugin's own figure instead of re-deriving the engine's rule.
    ``windows`` are the :class:`TokenWindow` terms of each token space a
    request holds only up to a worst case (the swa and dsv4 plugins' ``"swa"``), for
    the same reason: capacity answers read them, no reader re-derives them.
    ``compression`` maps each *compressed* token space to its ratio ``r``:
    the space's slot of full-token slot ``s`` is ``s // r``, so it has no
    allocator of its own and a request holding ``k`` full pages holds
    ``k x page / r`` of its slots (``r`` divides the page; the dsv4 plugin's
    ``"c4"`` 4 and ``"c128"`` 128, SGLang's ``full slot // compress_ratio``).
    A token space other than ``"full"`` that is neither windowed nor
    compressed is one readers cannot say a request's holding of.
    """

    max_total_num_tokens: int = attrs.field(validator=non_negative)
    max_running_requests: int = attrs.field(validator=non_negative)
    pools: tuple[PoolSpec, ...] = attrs.field(converter=_pool_tuple)
    sglang_config: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)
    sglang_estimate_bytes: int = attrs.field(default=0, validator=non_negative)
    notes: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    token_counts: Mapping[str, int] = attrs.field(
        default=attrs.Factory(lambda self: {FULL_TOKENS: self.max_total_num_tokens}, takes_self=True),
        converter=frozen_mapping,
    )
    state_slots: int = attrs.field(default=0, validator=non_negative)
    state_slots_per_request: int = attrs.field(default=0, validator=non_negative)
    windows: tuple[TokenWindow, ...] = attrs.field(default=(), converter=_window_tuple)
    compression: Mapping[str, int] = attrs.field(factory=dict, converter=frozen_mapping)

    @compression.validator
    def _check_compression(self, _attribute: attrs.Attribute[Any], compression: Mapping[str, int]) -> None:
        windowed = {window.token_space for window in self.windows}
        for space, ratio in compression.items():
            if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio < 1:
                raise InvalidValueError(f"PoolSizing.compression[{space!r}] must be a positive integer, got {ratio!r}.")
            if space == FULL_TOKENS or space not in self.token_counts or space in windowed:
                raise InvalidValueError(
                    f"PoolSizing.compression: token space {space!r} must be counted (token_counts has "
                    f"{sorted(self.token_counts)}), not {FULL_TOKENS!r} and not windowed."
                )

    @windows.validator
    def _check_windows(self, _attribute: attrs.Attribute[Any], windows: tuple[TokenWindow, ...]) -> None:
        spaces = [window.token_space for window in windows]
        for space in spaces:
            if space not in self.token_counts or spaces.count(space) > 1:
                raise InvalidValueError(
                    f"PoolSizing.windows: token space {space!r} must be counted (token_counts has "
                    f"{sorted(self.token_counts)}) and given one window, got {spaces}."
                )

    def window(self, token_space: str) -> TokenWindow | None:
        """The worst-case window of ``token_space``, or None when a request holds every token it has there."""
        return next((window for window in self.windows if window.token_space == token_space), None)

    @token_counts.validator
    def _check_token_counts(self, _attribute: attrs.Attribute[Any], counts: Mapping[str, int]) -> None:
        for space, count in counts.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise InvalidValueError(
                    f"PoolSizing.token_counts[{space!r}] must be a non-negative integer, got {count!r}."
                )
        for pool in self.pools:
            if isinstance(pool, PoolSpec) and pool.unit == TOKEN and pool.token_space not in counts:
                raise InvalidValueError(
                    f"PoolSizing.token_counts has no count for token space {pool.token_space!r} of pool "
                    f"{pool.name!r}; it counts {sorted(counts)}."
                )

    @property
    def planned_bytes(self) -> int:
        return sum(pool.bytes for pool in self.pools)

    @property
    def counts(self) -> dict[str, Any]:
        """The counts the pools were sized for, as :meth:`CostModel.bytes_for` takes them."""
        return {
            "tokens": dict(self.token_counts),
            "requests": self.max_running_requests,
            "state_slots": self.state_slots,
        }

    @property
    def cost(self) -> CostModel:
        """The plan's cost model, one group per pool (:attr:`PoolSpec.group_cost`):
        ``cost.bytes_for(**counts) == planned_bytes``, and other counts give other plans' bytes."""
        return CostModel(pool.group_cost for pool in self.pools)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolSizing:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# host tier (SGLang HiCache)
# ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class HostPool:
    """The host (CPU, pinned) mirror of one device pool, as SGLang's HiCache sizes it (``kvpools_core.host``).

    ``slots`` are the host slots allocated (tokens, or state slots for a state
    pool): SGLang's ``size = (requested // page_size + 1) x page_size``, every one
    of them usable (its host allocator hands out all of ``size``);
    ``device_slots`` the device pool's capacity it was sized from
    (``device_capacity_tokens``).  ``bytes`` is what ``build`` allocates:
    ``rows x bytes_per_slot`` with ``rows`` = ``slots``, or, for a pool riding
    on another's slots (``rides_on``: the DSA indexer rides on the latent
    pool), its paged rows with slack.  ``sized_by`` says which rule sized it.
    """

    name: str
    device_pool: str
    unit: str = attrs.field(validator=one_of(TOKEN, STATE_SLOT))
    token_space: str = attrs.field(default=FULL_TOKENS, validator=_token_space)
    device_slots: int = attrs.field(validator=non_negative)
    page_size: int = attrs.field(validator=positive)
    slots: int = attrs.field(validator=non_negative)
    rows: int = attrs.field(validator=non_negative)
    bytes_per_slot: int = attrs.field(validator=non_negative)
    bytes: int = attrs.field(validator=non_negative)
    layout: str = attrs.field(validator=one_of(*HICACHE_MEM_LAYOUTS))
    sized_by: str = ""
    rides_on: str | None = None
    packed: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    """Device pools whose rows SGLang packs into this host pool's rows (MTP draft layers, :class:`PackedInto`):
    ``bytes_per_slot`` is this pool's device row plus theirs."""
    page_bytes: int = attrs.field(default=0, validator=non_negative)
    """Bytes of one host page over all its layers, for a pool SGLang lays out in whole padded pages, not rows
    (DeepSeek-V4's ``DeepSeekV4PagedHostPool`` / ``DeepSeekV4StateHostPool``): then ``bytes = pages x page_bytes``
    and ``bytes_per_slot`` is 0.  0 for a row pool (a page is ``page_size x bytes_per_slot``)."""
    unused_bytes: int = attrs.field(default=0, validator=non_negative)
    """Bytes of ``bytes`` that are pinned but never hold data (a padded page's padding), part of ``bytes``."""

    def __attrs_post_init__(self) -> None:
        if self.page_bytes:
            if self.bytes_per_slot or self.rows % self.page_size or self.bytes != self.pages * self.page_bytes:
                raise InvalidValueError(
                    f"HostPool {self.name!r}: a paged host pool needs bytes_per_slot 0, rows {self.rows} in whole "
                    f"pages of {self.page_size} and bytes {self.bytes} = pages {self.pages} x page_bytes "
                    f"{self.page_bytes}."
                )
        elif self.bytes != self.rows * self.bytes_per_slot:
            raise InvalidValueError(
                f"HostPool {self.name!r}: bytes {self.bytes} != rows {self.rows} x bytes_per_slot "
                f"{self.bytes_per_slot}."
            )
        if self.unused_bytes > self.bytes:
            raise InvalidValueError(f"HostPool {self.name!r}: unused_bytes {self.unused_bytes} > bytes {self.bytes}.")

    @property
    def pages(self) -> int:
        return self.rows // self.page_size

    @property
    def bytes_per_page(self) -> int:
        """One host page's bytes: ``page_bytes``, or ``page_size x bytes_per_slot`` for a row pool."""
        return self.page_bytes or self.page_size * self.bytes_per_slot

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostPool:
        return load_value(cls, data)


@attrs.frozen
class PackedInto:
    """A ``host_mirrors`` answer for a device pool whose rows SGLang packs into another pool's host rows.

    SGLang's packed MTP drafts (``HiCacheDraftMode.PACKED``,
    ``speculative/base_spec_worker.py`` ``_build_hicache_draft_plan``) hand the
    draft worker's one-layer KV pools to the target's host pool as extra layers
    (``draft_buffer_infos``: ``layer_num = target_layer_num + drafts``), so the
    host pool's bytes per token grow by the draft rows and no host pool of the
    draft's own exists.  ``pool`` names the mirrored pool it is packed into.
    """

    pool: str


@attrs.frozen(kw_only=True)
class HostMemory:
    """The node's host memory the host tier was checked against, and how it was known.

    ``available_bytes`` is measured (``psutil.virtual_memory().available``, or
    ``MemAvailable`` of ``/proc/meminfo`` without psutil) or stated
    (``--host-memory``); ``reserve_bytes`` is left to the OS and other processes
    (SGLang's ``HICACHE_HOST_MEMORY_RESERVE_BYTES``, 10 GiB, unless ``--host-reserve``).
    What the ranks of a node may pin is ``available - reserve``, each rank
    ``(available - reserve) // ranks_per_node`` (SGLang's ``host_memory_budget_bytes``).
    """

    available_bytes: int = attrs.field(validator=non_negative)
    reserve_bytes: int = attrs.field(validator=non_negative)
    source: str

    @property
    def usable_bytes(self) -> int:
        return max(self.available_bytes - self.reserve_bytes, 0)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostMemory:
        return load_value(cls, data)


def _host_pool_tuple(items: Iterable[HostPool | Mapping[str, Any]]) -> tuple[HostPool, ...]:
    return tuple(HostPool.from_dict(item) if isinstance(item, Mapping) else item for item in items)


def _host_memory_or_none(value: HostMemory | Mapping[str, Any] | None) -> HostMemory | None:
    return HostMemory.from_dict(value) if isinstance(value, Mapping) else value


@attrs.frozen(kw_only=True)
class HostTier:
    """The plan's host KV tier: every host pool of one rank, what one rank and one node pin, the check.

    Derived from the device plan by :func:`kvpools_core.host.plan_host_tier`
    (SGLang's rules, ``docs/host-tier.md``).  ``ranks_per_node`` is
    :attr:`Serving.ranks_per_node`; ``memory`` the node check (None when the
    tier was sized without one).
    """

    pools: tuple[HostPool, ...] = attrs.field(converter=_host_pool_tuple)
    ranks_per_node: int = attrs.field(validator=positive)
    dcp_size: int = attrs.field(default=1, validator=positive)
    """Decode-context-parallel ranks sharing each token (``--dcp-size``): a host slot is one physical row of
    one rank, ``dcp_size`` logical tokens share it (``HostKVCache.logical_size = size x dcp_size``)."""
    pinned: bool = True
    memory: HostMemory | None = attrs.field(default=None, converter=_host_memory_or_none)
    notes: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    hicache_ratio: float | None = attrs.field(default=None, validator=_optional_positive_ratio)
    """The ratio the host pools were sized by: ``--hicache-ratio``, SGLang's default 2.0, or the auto-sized
    ratio (:attr:`auto_sized`); None under ``--hicache-size``."""
    auto_sized: bool = False
    """Whether SGLang's auto-sizing chose :attr:`hicache_ratio` (:attr:`Serving.hicache_auto_sized`)."""
    retraction_backup: bool = False
    """Whether the pools are a decode node's retraction backup alone (``host_pool`` without HiCache)."""

    @property
    def bytes_per_rank(self) -> int:
        """Host bytes one rank allocates (pins where CUDA is there): the sum of its host pools."""
        return sum(pool.bytes for pool in self.pools)

    @property
    def bytes_per_node(self) -> int:
        """Host bytes the node's ranks allocate together: ``bytes_per_rank x ranks_per_node``."""
        return self.bytes_per_rank * self.ranks_per_node

    @property
    def unused_bytes_per_rank(self) -> int:
        """Bytes one rank pins that never hold data (:attr:`HostPool.unused_bytes`, summed)."""
        return sum(pool.unused_bytes for pool in self.pools)

    @property
    def tokens(self) -> int | None:
        """The full tokens the host tier holds (its first full-token pool's slots x ``dcp_size``: the radix
        tree's logical host tokens, ``HostKVCache.logical_size``), or None."""
        slots = next((p.slots for p in self.pools if p.unit == TOKEN and p.token_space == FULL_TOKENS), None)
        return None if slots is None else slots * self.dcp_size

    def pool(self, name: str) -> HostPool:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"host tier has no pool named {name!r}; pools: {[p.name for p in self.pools]}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HostTier:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# plan
# ---------------------------------------------------------------------------

PLAN_FORMAT = 1


@attrs.frozen(kw_only=True)
class Plan:
    """The complete, frozen pool plan: what to build and why.

    ``provenance`` maps each hook to the plugins that shaped its result (the
    answering plugin first, then wrappers).
    """

    model: ModelSpec
    serving: Serving
    budget: Budget
    cell: CellSize
    sizing: PoolSizing
    provenance: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict, converter=frozen_mapping)
    format: int = PLAN_FORMAT
    host: HostTier | None = None
    """The host KV tier (``--enable-hierarchical-cache``), or None without one."""

    @property
    def host_kv_bytes(self) -> int | None:
        """Host bytes one rank pins for the host tier (:attr:`HostTier.bytes_per_rank`), None without a tier."""
        return None if self.host is None else self.host.bytes_per_rank

    @property
    def host_tokens(self) -> int | None:
        """Full tokens one rank's host tier holds (:attr:`HostTier.tokens`), None without a tier."""
        return None if self.host is None else self.host.tokens

    @property
    def max_total_num_tokens(self) -> int:
        return self.sizing.max_total_num_tokens

    @property
    def max_running_requests(self) -> int:
        return self.sizing.max_running_requests

    @property
    def pools(self) -> tuple[PoolSpec, ...]:
        return self.sizing.pools

    @property
    def planned_bytes(self) -> int:
        return self.sizing.planned_bytes

    @property
    def cost(self) -> CostModel:
        """What the plan costs per token (of each token space), per request, per state slot, and fixed."""
        return self.sizing.cost

    @property
    def counts(self) -> dict[str, Any]:
        """Tokens (per token space), requests and state slots the plan was sized for."""
        return self.sizing.counts

    @property
    def windows(self) -> tuple[TokenWindow, ...]:
        """The worst-case window terms of each windowed token space (:attr:`PoolSizing.windows`)."""
        return self.sizing.windows

    @property
    def compression(self) -> Mapping[str, int]:
        """Full tokens per token of each compressed token space (:attr:`PoolSizing.compression`)."""
        return self.sizing.compression

    def pool(self, name: str) -> PoolSpec:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"plan has no pool named {name!r}; pools: {[p.name for p in self.pools]}")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    def problems(self) -> list[str]:
        """What breaks an invariant every plan kvpools makes keeps, each naming its field (``plan.sizing....``).

        Empty for every plan :func:`kvpools_core.plan` returns; :meth:`from_dict` refuses a plan with any.
        Checked beyond each value's own validators because they relate values: the tokens are whole pages,
        every token space a pool holds has tokens, the pools' bytes are what their cost model gives for the
        plan's counts, an exact plan fits its budget, the host tier exists exactly when the serving options
        build one and mirrors plan pools.
        """
        sizing, page = self.sizing, self.serving.page_size
        found = []
        tokens = sizing.max_total_num_tokens
        if tokens < page or tokens % page:
            found.append(
                f"plan.sizing.max_total_num_tokens must be a positive whole number of pages of {page} "
                f"(serving.page_size), got {tokens}."
            )
        if sizing.max_running_requests < 1:
            found.append(f"plan.sizing.max_running_requests must be at least 1, got {sizing.max_running_requests}.")
        spaces = dict.fromkeys(pool.token_space for pool in sizing.pools if pool.unit == TOKEN)
        found.extend(
            f"plan.sizing.token_counts[{space!r}] must be positive: token pools hold its tokens, got {count}."
            for space in spaces
            if space != FULL_TOKENS and (count := sizing.token_counts.get(space, 0)) < 1
        )
        full = sizing.token_counts.get(FULL_TOKENS, tokens)
        if full != tokens:
            found.append(
                f"plan.sizing.token_counts['{FULL_TOKENS}'] ({full}) must equal "
                f"plan.sizing.max_total_num_tokens ({tokens})."
            )
        try:
            costed = self.cost.bytes_for(**self.counts)
        except KvpoolsError as exc:
            found.append(f"plan.sizing.pools: {exc}")
        else:
            if costed != self.planned_bytes:
                found.append(
                    f"plan.sizing.pools hold {self.planned_bytes:,} B in all, but their costs (PoolSpec.cost) give "
                    f"{costed:,} B for the plan's counts {self.counts}."
                )
        if self.serving.accounting == "exact" and self.planned_bytes > self.budget.budget_bytes:
            found.append(
                f"plan.sizing.pools need {self.planned_bytes:,} B, over plan.budget.budget_bytes "
                f"({self.budget.budget_bytes:,} B): an exact plan fits its budget."
            )
        found.extend(self._host_problems())
        return found

    def _host_problems(self) -> list[str]:
        if (self.host is not None) != self.serving.host_tier:
            has = "has a host tier" if self.host is not None else "has no host tier (plan.host is null)"
            return [
                f"plan.host: the plan {has}, but serving.enable_hierarchical_cache is "
                f"{str(self.serving.enable_hierarchical_cache).lower()} and "
                f"serving.disaggregation_decode_retraction_backup is "
                f"{self.serving.disaggregation_decode_retraction_backup!r}: a host tier exists exactly when they "
                "build one."
            ]
        if self.host is None:
            return []
        names = {pool.name for pool in self.pools}
        return [
            f"plan.host.pools[{i}].device_pool {pool.device_pool!r} names no pool of plan.sizing.pools "
            f"({sorted(names)})."
            for i, pool in enumerate(self.host.pools)
            if pool.device_pool not in names
        ]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Load a plan from its plain-JSON form (or the CLI's ``--json`` summary, which wraps it under ``plan``).

        Every field is checked against its type and its validators, and the plan against :meth:`problems`;
        anything else raises :class:`~kvpools_core.errors.PlanFormatError` naming the field's path.
        """
        if isinstance(data, Mapping) and "plan" in data and "model" not in data:
            data = data["plan"]
        if isinstance(data, Mapping) and "format" in data:
            version = data["format"]
            if isinstance(version, bool) or not isinstance(version, int):
                raise wrong("plan.format", version, f"the integer {PLAN_FORMAT}")
            if version != PLAN_FORMAT:
                raise PlanFormatError(
                    f"plan.format {short_repr(version)} is not supported: this kvpools reads plan format "
                    f"{PLAN_FORMAT}. Load it with the kvpools that wrote it, or plan again.",
                    path="plan.format",
                )
        loaded = load_value(cls, data, "plan")
        found = loaded.problems()
        if found:
            raise PlanFormatError(" ".join(found), path=found[0].split(" ", 1)[0].split(":", 1)[0])
        return loaded

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        """Load a plan from ``to_json``'s text (or the CLI's ``--json`` output); see :meth:`from_dict`."""
        return cls.from_dict(parse_json(text))
