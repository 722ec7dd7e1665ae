"""What the platform is: its page-size and KV-dtype rules, memory tiers, workspaces and GPU entries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from kvpools_core.errors import InvalidValueError
from kvpools_core.options import option
from kvpools_core.values._fields import (
    _flag,
    _int_tuple,
    _invalid,
    _positive_ints,
    _str_tuple,
    _text,
    _texts,
    frozen_mapping,
    non_negative,
    one_of,
    optional_positive,
    positive,
    to_dict,
)
from kvpools_core.values.loading import load_value


def _workspace_tuple(items: Iterable[Workspace]) -> tuple[Workspace, ...]:
    return tuple(items)


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


def _scale(inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a number in (0, 1], got {value!r}.")


def _tier_tuple(items: Iterable[MemoryTier]) -> tuple[MemoryTier, ...]:
    return tuple(items)


def _ascending_tiers(inst: object, attribute: attrs.Attribute[Any], value: tuple[MemoryTier, ...]) -> None:
    bounds = [tier.max_mib for tier in value if isinstance(tier, MemoryTier)]
    if len(bounds) != len(value) or bounds != sorted(set(bounds)):
        raise InvalidValueError(
            f"{_flag(inst, attribute)} must be MemoryTier values with strictly ascending max_mib, got {value!r}."
        )


def _str_values(instance: Any, attribute: attrs.Attribute[Any], value: Mapping[str, Any]) -> None:
    bad = {key: item for key, item in value.items() if not isinstance(item, str) or not item}
    if bad:
        raise InvalidValueError(f"{_flag(instance, attribute)} maps keys to layout names (strings), got {bad!r}.")


MARLIN_CHECKPOINTS = ("awq", "gptq")
"""The checkpoint methods SGLang may convert to its Marlin kernels (``awq_marlin``, ``gptq_marlin``)."""


def _marlin_kinds(instance: Any, attribute: attrs.Attribute[Any], value: frozenset[str]) -> None:
    unknown = sorted(value - set(MARLIN_CHECKPOINTS))
    if unknown:
        raise InvalidValueError(
            f"{_flag(instance, attribute)} names {unknown!r}: SGLang converts only {', '.join(MARLIN_CHECKPOINTS)} "
            "checkpoints to Marlin. Drop them."
        )


def _refusals(instance: Any, attribute: attrs.Attribute[Any], value: Mapping[str, str]) -> None:
    bad = {key: item for key, item in value.items() if not isinstance(item, str) or not item}
    if bad:
        raise InvalidValueError(
            f"{_flag(instance, attribute)} maps SGLang --quantization methods to the reason SGLang refuses them on "
            f"the platform (a non-empty string), got {bad!r}."
        )


def _planned_keys(instance: Any, attribute: attrs.Attribute[Any], value: frozenset[str]) -> None:
    missing = sorted(value - set(instance.pool_layouts))
    if missing:
        raise InvalidValueError(
            f"{_flag(instance, attribute)} names {missing!r}, which pool_layouts does not map: a platform plans only "
            f"a layout it selects. Add the key to pool_layouts or drop it."
        )


def _capability(value: Any) -> tuple[int, int] | None:
    """``(major, minor)`` of non-negative ints (a list from JSON too), or ``None``."""
    if value is None:
        return None
    try:
        major, minor = (int(v) for v in value if not isinstance(v, bool))
    except (TypeError, ValueError):
        raise InvalidValueError(f"compute_capability must be (major, minor) integers, got {value!r}.") from None
    if major < 0 or minor < 0:
        raise InvalidValueError(f"compute_capability must be non-negative, got {value!r}.")
    return (major, minor)


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
      GPU tiers alone (:mod:`kvpools_core.pipeline.gpus`).
    * ``breakable_prefill_graphs``: whether SGLang captures its breakable
      prefill CUDA graph by default here, so the default ``mem_fraction_static``
      reserves memory for it (``default_prefill_backend``,
      ``srt/model_executor/cuda_graph_config.py`` lines 119-123 of SGLang
      0.5.23: ``BREAKABLE if is_cuda() else DISABLED``; CUDA only).
    * ``decode_retraction_host_pool``: whether SGLang backs a PD decode node's
      retracted requests up in a HiCache host pool by default here
      (``resolve_decode_retraction_backup``, ``mem_cache/kv_cache_builder.py``:
      not on HIP, where large restores can fault the GPU process).
    * ``pool_layouts``: the layout of an architecture's pool that this platform's kernels select, by a key the
      architecture plugin owning the pool documents and reads (no key: the engine's default layout).  Where an
      engine builds another pool class for the same model on a platform (SGLang's DeepSeek-V4 unified-KV pool on
      ROCm: key ``"dsv4"``, values ``"unified_bf16"`` / ``"unified_fp8"``), the platform plugin says so here,
      from its own options, and the architecture plugin plans that layout or refuses a value it does not know.
    * ``mem_fraction_scale`` / ``mem_fraction_scale_above``: a factor SGLang multiplies ``mem_fraction_static``
      (the default or the given one) by when the served ``context_len`` exceeds ``mem_fraction_scale_above``
      tokens, for an attention backend's workspace it allocates after sizing the KV pool: ROCm's AITER backend,
      ``x 0.85`` above 8192 tokens (``_handle_attention_backend_compatibility``,
      ``srt/arg_groups/attention_hook.py`` lines 243-269 of SGLang 0.5.23).  ``1.0``: no such factor.
    * ``platform_planned_layouts``: the keys of ``pool_layouts`` whose layout the platform plugin plans and builds
      itself (it answers ``size_pools``, ``build_pool`` and ``build_allocator`` for that architecture first,
      ``tryfirst``): the architecture plugin then does not refuse the layout name, nor apply the checks that are
      about its own pools, and refuses to size or build the layout itself (the platform plugin must have
      answered).  Ascend's ``{"dsv4"}``: SGLang's NPU DeepSeek-V4 pools, kvpools-ascend's own.
    * ``marlin_conversions``: the quantised checkpoints (``"awq"``, ``"gptq"``) SGLang converts to its Marlin
      kernels on this platform's devices when ``--quantization`` is unset, ``marlin`` or the Marlin method
      (``awq_marlin`` / ``gptq_marlin``), so it serves them as that method.  SGLang 0.5.23 keys the AWQ conversion
      on ``is_cuda()`` (``srt/layers/quantization/awq/awq.py`` lines 409-410) and both on the device capability
      ``torch.cuda`` reports being 8.0 or more (``marlin_utils.py`` lines 68-79, 104-117: HIP builds of torch
      report one too, an MI300X's 9.4; NPUs and CPUs none).  The core also skips them when ``compute_capability``
      is known and below 8.0.  Empty: no conversion (the comparison of the request with the checkpoint alone).
    * ``refused_quantization``: SGLang ``--quantization`` methods (as SGLang resolves them, after the Marlin and
      ModelOpt overrides) that SGLang refuses to start with on this platform, each mapped to why, in the
      engine's words with its source lines (SGLang 0.5.23's ``_verify_quantization``,
      ``srt/configs/model_config.py`` lines 2150-2160: a method its quantisation registry lacks here, which
      ``srt/layers/quantization/__init__.py`` builds per platform, or one outside ROCm's supported list).
      :func:`kvpools_core.parts.weights.methods.resolve_quantization` refuses them, naming the platform.
    """

    platform: str
    page_size_rules: tuple[PageSizeRule, ...] = attrs.field(default=(), converter=_rule_tuple)
    kv_dtype_rules: tuple[KVDtypeRule, ...] = attrs.field(default=(), converter=_kv_rule_tuple)
    raw_mla_row_backends: frozenset[str] = attrs.field(default=frozenset(), converter=_frozen_strs)
    slot_index_dtype: str = attrs.field(default="int64", validator=one_of("int64", "int32"))
    memory_tiers: tuple[MemoryTier, ...] = attrs.field(default=(), converter=_tier_tuple, validator=_ascending_tiers)
    breakable_prefill_graphs: bool = attrs.field(default=False, validator=_boolean)
    decode_retraction_host_pool: bool = attrs.field(default=True, validator=_boolean)
    pool_layouts: Mapping[str, str] = attrs.field(factory=dict, converter=frozen_mapping, validator=_str_values)
    mem_fraction_scale: float = attrs.field(default=1.0, validator=_scale)
    mem_fraction_scale_above: int = attrs.field(default=8192, validator=positive)
    platform_planned_layouts: frozenset[str] = attrs.field(
        default=frozenset(), converter=_frozen_strs, validator=_planned_keys
    )
    marlin_conversions: frozenset[str] = attrs.field(
        default=frozenset(), converter=_frozen_strs, validator=_marlin_kinds
    )
    refused_quantization: Mapping[str, str] = attrs.field(factory=dict, converter=frozen_mapping, validator=_refusals)
    compute_capability: tuple[int, int] | None = attrs.field(default=None, converter=_capability)
    """The planned device's compute capability, where the plan knows the device (a catalogue ``--gpu`` with one,
    :attr:`GPU.compute_capability`; the pipeline keeps it across the platform plugin's answer); ``None``: unknown
    (a plain budget, a platform without one).  Plugins read it for what the engine picks by the GPU
    (``torch.cuda.get_device_capability``), e.g. DeepSeek-V4's ``auto`` KV layout."""

    def converts_to_marlin(self, checkpoint: str) -> bool:
        """Whether SGLang converts a ``checkpoint`` (``"awq"``, ``"gptq"``) checkpoint to Marlin here: the platform
        declares the conversion and the planned device, where known, has compute capability 8.0 or more
        (``marlin_utils.py`` line 78 of SGLang 0.5.23: ``if device_capability < 80: return []``)."""
        capable = self.compute_capability is None or self.compute_capability >= (8, 0)
        return checkpoint in self.marlin_conversions and capable

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
    sizing plugin charges it through :func:`kvpools_core.parts.sizing.request_pools`
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


@attrs.frozen
class GPU:
    """One accelerator model: its total memory as the driver reports it, and the platform it runs on.

    Platform plugins contribute them (``accelerators`` hook); :mod:`kvpools_core.pipeline.gpus` looks them up by
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
    compute_capability: tuple[int, int] | None = attrs.field(default=None, converter=_capability)
    """``(major, minor)`` as ``torch.cuda.get_device_capability`` reports it on CUDA; ``None``: not catalogued
    (another platform, or a custom total).  A plan on this GPU carries it
    (:attr:`PlatformTraits.compute_capability`)."""
    capability_source: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    """Where :attr:`compute_capability` comes from."""

    @property
    def total_mib(self) -> float:
        """SGLang's ``gpu_mem``: the total in MiB, the unit ``handle_gpu_memory_settings`` compares."""
        return self.total_bytes / (1 << 20)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GPU:
        return load_value(cls, data)
