"""The frozen values that flow through the pipeline, one direction only.

``ModelSpec`` + ``Serving`` + ``Budget`` → ``CellSize`` → ``PoolSizing`` →
``Plan``.  Every value is an ``attrs.frozen`` class with validators, so no
plugin can mutate what another plugin sees; change one with ``attrs.evolve``.
Every value converts to plain JSON (``to_dict``) and back (``from_dict``) so a
plan computed on one rank can be broadcast and loaded into an equal plan.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import attrs

from kvpools_core.dtypes import MODEL_DTYPES, canonical_kv_dtype
from kvpools_core.errors import ConfigError, InvalidValueError
from kvpools_core.options import option

T = TypeVar("T")

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
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a positive integer, got {value!r}.")


def non_negative(inst: object, attribute: attrs.Attribute[Any], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _invalid(inst, f"{_flag(inst, attribute)} must be a non-negative integer, got {value!r}.")


def optional_positive(inst: object, attribute: attrs.Attribute[Any], value: int | None) -> None:
    if value is not None:
        positive(inst, attribute, value)


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
    if attrs.has(type(value)):
        return to_dict(value)
    return value


def to_dict(value: Any) -> dict[str, Any]:
    """Plain-JSON form of any value of this module (tuples become lists)."""
    return {f.name: _thaw(getattr(value, f.name)) for f in attrs.fields(type(value))}


def _from_dict(cls: type[T], data: Mapping[str, Any], nested: Mapping[str, Callable[[Any], Any]] | None = None) -> T:
    names = {f.name for f in attrs.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"Unknown field(s) {sorted(unknown)} for {cls.__name__}.")
    kwargs = dict(data)
    for key, load in (nested or {}).items():
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = load(kwargs[key])
    return cls(**kwargs)


def _str_tuple(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


def _layer_tuple(items: Iterable[LayerSpec]) -> tuple[LayerSpec, ...]:
    return tuple(items)


def _part_tuple(items: Iterable[CellPart]) -> tuple[CellPart, ...]:
    return tuple(items)


def _pool_tuple(items: Iterable[PoolSpec]) -> tuple[PoolSpec, ...]:
    return tuple(items)


def _int_tuple_or_none(items: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if items is None else tuple(items)


def _tuple_of(load: Callable[[Any], T]) -> Callable[[Iterable[Any]], tuple[T, ...]]:
    return lambda items: tuple(load(i) for i in items)


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
        return _from_dict(cls, data)


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
        return _from_dict(cls, data, {"layers": _tuple_of(LayerSpec.from_dict)})


# ---------------------------------------------------------------------------
# serving options (SGLang's server-arg names; environment knobs made typed)
# ---------------------------------------------------------------------------

SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "NEXTN", "DFLASH", "NGRAM")
ACCOUNTING_MODES = ("exact", "sglang")


def _canonical_spec_algorithm(value: str | None) -> str | None:
    return None if value is None else value.upper()


def _canonical_kv(value: str) -> str:
    return canonical_kv_dtype(value)


@attrs.frozen(kw_only=True)
class Serving:
    """Serving options that change sizing, under SGLang's server-arg names.

    What SGLang reads from environment variables is a typed field here
    (``swa_eviction_interval`` is ``SGLANG_SWA_EVICTION_INTERVAL``,
    ``vlm_cache_size_mb`` is ``SGLANG_VLM_CACHE_SIZE_MB``,
    ``pp_layer_partition`` is ``SGLANG_PP_LAYER_PARTITION``,
    ``mamba_skip_decode_lock`` is ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK``);
    kvpools never reads the environment for sizing.
    """

    kv_cache_dtype: str = attrs.field(default="auto", converter=_canonical_kv)
    page_size: int = attrs.field(default=1, validator=positive)
    # parallelism
    tp_size: int = attrs.field(default=1, validator=positive)
    pp_size: int = attrs.field(default=1, validator=positive)
    pp_rank: int = attrs.field(default=0, validator=non_negative)
    pp_layer_partition: tuple[int, ...] | None = attrs.field(default=None, converter=_int_tuple_or_none)
    dp_size: int = attrs.field(default=1, validator=positive)
    enable_dp_attention: bool = False
    attn_cp_size: int = attrs.field(default=1, validator=positive)
    dcp_size: int = attrs.field(default=1, validator=positive)
    # scheduling limits
    context_length: int | None = attrs.field(default=None, validator=optional_positive)
    max_running_requests: int | None = attrs.field(default=None, validator=optional_positive)
    max_total_tokens: int | None = attrs.field(default=None, validator=optional_positive)
    mem_fraction_static: float = attrs.field(default=0.9, validator=fraction)
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
    disaggregation_decode_extra_slots: int = attrs.field(default=0, validator=non_negative)
    # hybrid sliding window / mamba / sparse knobs (read by their plugins)
    swa_full_tokens_ratio: float = attrs.field(default=0.8, validator=positive_ratio)
    swa_eviction_interval: int = attrs.field(default=128, validator=positive)
    mamba_full_memory_ratio: float = attrs.field(default=0.9, validator=positive_ratio)
    max_mamba_cache_size: int | None = attrs.field(default=None, validator=optional_positive)
    mamba_ssm_dtype: str | None = attrs.field(default=None, validator=one_of(None, *MODEL_DTYPES))
    enable_mamba_extra_buffer: bool = False
    enable_mamba_extra_buffer_lazy: bool = False
    mamba_skip_decode_lock: bool = False
    dsa_prefill_backend: str = "flashmla_sparse"
    dsa_decode_backend: str = "flashmla_kv"
    enable_dsa_cache_layer_split: bool = False
    # kvpools
    accounting: str = attrs.field(default="exact", validator=one_of(*ACCOUNTING_MODES))
    platform: str = "cuda"
    plugin_options: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)

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
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Serving:
        return _from_dict(cls, data)


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
    free_bytes: int | None = None
    weights_bytes: int | None = None
    pre_model_load_bytes: int | None = None
    mem_fraction_static: float | None = None
    slack_bytes: int | None = None
    reserved_bytes: int | None = None
    steps: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Budget:
        return _from_dict(cls, data)


# ---------------------------------------------------------------------------
# cell size and pools
# ---------------------------------------------------------------------------


@attrs.frozen
class CellPart:
    """One named share of the bytes per token, and the pool that stores it.

    A token pool allocates ``tokens + page_size`` slots (page 0 pads).  A pool
    laid out in whole pages with more slack names it in ``extra_slots``: it
    then allocates ``(tokens + page_size + extra_slots) // page_size`` pages
    (SGLang's DSA indexer: ``extra_slots=1``, two padding slots at page size 1).
    The parts of one pool share one layout (the pool takes their largest value).
    """

    name: str
    bytes_per_token: int = attrs.field(validator=non_negative)
    pool: str = "kv"
    extra_slots: int = attrs.field(default=0, validator=non_negative)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellPart:
        return _from_dict(cls, data)


@attrs.frozen(kw_only=True)
class CellSize:
    """What one token (and one request) costs.

    ``parts`` are the bytes kvpools really stores per token, grouped by the
    pool they live in; ``sglang_bytes_per_token`` is SGLang's cell size for the
    same model (its configurator's ``cell_size``, a float for hybrid pools),
    which ``--accounting sglang`` divides the budget by.  ``num_layers`` is the
    number of layers the token cost covers on this rank, so wrappers (draft
    scaling) can derive a per-layer cost; ``draft_included`` tells them an
    architecture already charged the draft model itself.  ``draft_layer_parts``
    is what one draft-model layer stores per token, for architectures whose
    draft layer is not the average of ``parts`` over ``num_layers`` (mixed
    layer kinds, layer-split storage); empty means that average.
    """

    parts: tuple[CellPart, ...] = attrs.field(converter=_part_tuple)
    sglang_bytes_per_token: float = attrs.field()
    num_layers: int = attrs.field(validator=non_negative)
    bytes_per_request: int = attrs.field(default=0, validator=non_negative)
    fixed_bytes: int = attrs.field(default=0, validator=non_negative)
    draft_included: bool = False
    notes: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    draft_layer_parts: tuple[CellPart, ...] = attrs.field(default=(), converter=_part_tuple)

    @sglang_bytes_per_token.validator
    def _check_sglang(self, _attribute: attrs.Attribute[Any], value: float) -> None:
        if not value > 0:
            raise ConfigError(f"A cell size must be positive, got {value!r} bytes per token.")

    @property
    def bytes_per_token(self) -> int:
        return sum(part.bytes_per_token for part in self.parts)

    def pool_bytes_per_token(self) -> dict[str, int]:
        """Bytes per token of each pool, in first-seen order."""
        pools: dict[str, int] = {}
        for part in self.parts:
            pools[part.pool] = pools.get(part.pool, 0) + part.bytes_per_token
        return pools

    def pool_extra_slots(self) -> dict[str, int]:
        """Each pool's ``extra_slots`` (the largest of its parts'), in first-seen order."""
        extra: dict[str, int] = {}
        for part in self.parts:
            extra[part.pool] = max(extra.get(part.pool, 0), part.extra_slots)
        return extra

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CellSize:
        parts = _tuple_of(CellPart.from_dict)
        return _from_dict(cls, data, {"parts": parts, "draft_layer_parts": parts})


@attrs.frozen(kw_only=True)
class PoolSpec:
    """One physically separate allocation of the plan.

    ``slots`` are the usable slots (tokens, request rows, pages);
    ``padding_slots`` are allocated but never handed out (SGLang's page 0 and
    request row 0).  ``bytes`` is exactly what ``build`` allocates for it.
    ``sglang_charged`` says whether SGLang's own estimate counts it.
    """

    name: str
    kind: str
    slots: int = attrs.field(validator=non_negative)
    bytes_per_slot: int = attrs.field(validator=non_negative)
    bytes: int = attrs.field(validator=non_negative)
    padding_slots: int = attrs.field(default=0, validator=non_negative)
    sglang_charged: bool = True
    owner: str = ""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolSpec:
        return _from_dict(cls, data)


@attrs.frozen(kw_only=True)
class PoolSizing:
    """The answer of ``size_pools``: token and request counts, and every pool.

    ``sglang_config`` holds SGLang's ``MemoryPoolConfig`` fields under their
    SGLang names (only those the model has).
    """

    max_total_num_tokens: int = attrs.field(validator=non_negative)
    max_running_requests: int = attrs.field(validator=non_negative)
    pools: tuple[PoolSpec, ...] = attrs.field(converter=_pool_tuple)
    sglang_config: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)
    sglang_estimate_bytes: int = attrs.field(default=0, validator=non_negative)
    notes: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)

    @property
    def planned_bytes(self) -> int:
        return sum(pool.bytes for pool in self.pools)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PoolSizing:
        return _from_dict(cls, data, {"pools": _tuple_of(PoolSpec.from_dict)})


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

    def pool(self, name: str) -> PoolSpec:
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(f"plan has no pool named {name!r}; pools: {[p.name for p in self.pools]}")

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), **kwargs)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        if "plan" in data and "model" not in data:  # the CLI's --json summary wraps the plan
            data = data["plan"]
        if data.get("format", PLAN_FORMAT) != PLAN_FORMAT:
            raise ConfigError(f"Plan format {data.get('format')!r} is not supported (expected {PLAN_FORMAT}).")
        return _from_dict(
            cls,
            data,
            {
                "model": ModelSpec.from_dict,
                "serving": Serving.from_dict,
                "budget": Budget.from_dict,
                "cell": CellSize.from_dict,
                "sizing": PoolSizing.from_dict,
                "provenance": lambda p: {k: tuple(v) for k, v in p.items()},
            },
        )

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))
