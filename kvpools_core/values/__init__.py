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
(:mod:`kvpools_core.values.loading`).
"""

from __future__ import annotations

from kvpools_core.values._fields import (
    USER_OPTION_VALUES as USER_OPTION_VALUES,
)
from kvpools_core.values._fields import (
    JSONScalar as JSONScalar,
)
from kvpools_core.values._fields import (
    _flag as _flag,
)
from kvpools_core.values._fields import (
    _freeze as _freeze,
)
from kvpools_core.values._fields import (
    _int_tuple as _int_tuple,
)
from kvpools_core.values._fields import (
    _int_tuple_or_none as _int_tuple_or_none,
)
from kvpools_core.values._fields import (
    _invalid as _invalid,
)
from kvpools_core.values._fields import (
    _positive_ints as _positive_ints,
)
from kvpools_core.values._fields import (
    _str_tuple as _str_tuple,
)
from kvpools_core.values._fields import (
    _text as _text,
)
from kvpools_core.values._fields import (
    _texts as _texts,
)
from kvpools_core.values._fields import (
    _thaw as _thaw,
)
from kvpools_core.values._fields import (
    fraction as fraction,
)
from kvpools_core.values._fields import (
    frozen_mapping as frozen_mapping,
)
from kvpools_core.values._fields import (
    non_negative as non_negative,
)
from kvpools_core.values._fields import (
    one_of as one_of,
)
from kvpools_core.values._fields import (
    optional_non_negative as optional_non_negative,
)
from kvpools_core.values._fields import (
    optional_positive as optional_positive,
)
from kvpools_core.values._fields import (
    positive as positive,
)
from kvpools_core.values._fields import (
    positive_ratio as positive_ratio,
)
from kvpools_core.values._fields import (
    to_dict as to_dict,
)
from kvpools_core.values.cost import (
    _LEGACY_FIXED_POOL as _LEGACY_FIXED_POOL,
)
from kvpools_core.values.cost import (
    _LEGACY_REQUEST_POOL as _LEGACY_REQUEST_POOL,
)
from kvpools_core.values.cost import (
    COST_UNITS as COST_UNITS,
)
from kvpools_core.values.cost import (
    FIXED as FIXED,
)
from kvpools_core.values.cost import (
    FULL_TOKENS as FULL_TOKENS,
)
from kvpools_core.values.cost import (
    REQUEST as REQUEST,
)
from kvpools_core.values.cost import (
    STATE_SLOT as STATE_SLOT,
)
from kvpools_core.values.cost import (
    TOKEN as TOKEN,
)
from kvpools_core.values.cost import (
    CellPart as CellPart,
)
from kvpools_core.values.cost import (
    CellSize as CellSize,
)
from kvpools_core.values.cost import (
    CostModel as CostModel,
)
from kvpools_core.values.cost import (
    DraftCharge as DraftCharge,
)
from kvpools_core.values.cost import (
    DraftModel as DraftModel,
)
from kvpools_core.values.cost import (
    GroupCost as GroupCost,
)
from kvpools_core.values.cost import (
    _draft_charge_or_none as _draft_charge_or_none,
)
from kvpools_core.values.cost import (
    _group_tuple as _group_tuple,
)
from kvpools_core.values.cost import (
    _page_tokens as _page_tokens,
)
from kvpools_core.values.cost import (
    _part_tuple as _part_tuple,
)
from kvpools_core.values.cost import (
    _token_space as _token_space,
)
from kvpools_core.values.model import (
    LayerSpec as LayerSpec,
)
from kvpools_core.values.model import (
    ModelSpec as ModelSpec,
)
from kvpools_core.values.model import (
    _layer_tuple as _layer_tuple,
)
from kvpools_core.values.plan import (
    ARENA_GROWTH as ARENA_GROWTH,
)
from kvpools_core.values.plan import (
    ARENA_ROW_ORDERS as ARENA_ROW_ORDERS,
)
from kvpools_core.values.plan import (
    PLAN_FORMAT as PLAN_FORMAT,
)
from kvpools_core.values.plan import (
    Arena as Arena,
)
from kvpools_core.values.plan import (
    ArenaSubPool as ArenaSubPool,
)
from kvpools_core.values.plan import (
    Budget as Budget,
)
from kvpools_core.values.plan import (
    HostMemory as HostMemory,
)
from kvpools_core.values.plan import (
    HostPool as HostPool,
)
from kvpools_core.values.plan import (
    HostTier as HostTier,
)
from kvpools_core.values.plan import (
    PackedInto as PackedInto,
)
from kvpools_core.values.plan import (
    Plan as Plan,
)
from kvpools_core.values.plan import (
    PoolSizing as PoolSizing,
)
from kvpools_core.values.plan import (
    PoolSpec as PoolSpec,
)
from kvpools_core.values.plan import (
    TokenWindow as TokenWindow,
)
from kvpools_core.values.plan import (
    _group_cost_or_none as _group_cost_or_none,
)
from kvpools_core.values.plan import (
    _host_memory_or_none as _host_memory_or_none,
)
from kvpools_core.values.plan import (
    _host_pool_tuple as _host_pool_tuple,
)
from kvpools_core.values.plan import (
    _pool_tuple as _pool_tuple,
)
from kvpools_core.values.plan import (
    _token_window_or_dict as _token_window_or_dict,
)
from kvpools_core.values.plan import (
    _unit_of_kind as _unit_of_kind,
)
from kvpools_core.values.plan import (
    _window_tuple as _window_tuple,
)
from kvpools_core.values.serving import (
    _STATE_DTYPE_ALIASES as _STATE_DTYPE_ALIASES,
)
from kvpools_core.values.serving import (
    ACCOUNTING_MODES as ACCOUNTING_MODES,
)
from kvpools_core.values.serving import (
    DECODE_RETRACTION_BACKUPS as DECODE_RETRACTION_BACKUPS,
)
from kvpools_core.values.serving import (
    DEFAULT_HICACHE_RATIO as DEFAULT_HICACHE_RATIO,
)
from kvpools_core.values.serving import (
    DSV4_ATTN_BACKENDS as DSV4_ATTN_BACKENDS,
)
from kvpools_core.values.serving import (
    DSV4_COMPRESS_STATE_DTYPES as DSV4_COMPRESS_STATE_DTYPES,
)
from kvpools_core.values.serving import (
    DSV4_COMPRESSED_KV_LAYOUTS as DSV4_COMPRESSED_KV_LAYOUTS,
)
from kvpools_core.values.serving import (
    DSV4_KV_LAYOUTS as DSV4_KV_LAYOUTS,
)
from kvpools_core.values.serving import (
    ENGINE_DEFAULT_OPTIONS as ENGINE_DEFAULT_OPTIONS,
)
from kvpools_core.values.serving import (
    HICACHE_MEM_LAYOUTS as HICACHE_MEM_LAYOUTS,
)
from kvpools_core.values.serving import (
    HICACHE_WRITE_POLICIES as HICACHE_WRITE_POLICIES,
)
from kvpools_core.values.serving import (
    LATE_DEFAULT_OPTIONS as LATE_DEFAULT_OPTIONS,
)
from kvpools_core.values.serving import (
    MM_FEATURE_TRANSPORTS as MM_FEATURE_TRANSPORTS,
)
from kvpools_core.values.serving import (
    NONE_IS_UNSET as NONE_IS_UNSET,
)
from kvpools_core.values.serving import (
    QUANTIZATION_METHODS as QUANTIZATION_METHODS,
)
from kvpools_core.values.serving import (
    SERVED_DTYPES as SERVED_DTYPES,
)
from kvpools_core.values.serving import (
    SGLANG_ACCOUNTING_MODES as SGLANG_ACCOUNTING_MODES,
)
from kvpools_core.values.serving import (
    SGLANG_QUANTIZATION_METHODS as SGLANG_QUANTIZATION_METHODS,
)
from kvpools_core.values.serving import (
    SPECULATIVE_ALGORITHMS as SPECULATIVE_ALGORITHMS,
)
from kvpools_core.values.serving import (
    UNMODELLED_QUANTIZATION_METHODS as UNMODELLED_QUANTIZATION_METHODS,
)
from kvpools_core.values.serving import (
    VLLM_QUANTIZATION_METHODS as VLLM_QUANTIZATION_METHODS,
)
from kvpools_core.values.serving import (
    EngineDefault as EngineDefault,
)
from kvpools_core.values.serving import (
    LateDefaultInt as LateDefaultInt,
)
from kvpools_core.values.serving import (
    Serving as Serving,
)
from kvpools_core.values.serving import (
    UnsetFloat as UnsetFloat,
)
from kvpools_core.values.serving import (
    UnsetInt as UnsetInt,
)
from kvpools_core.values.serving import (
    UnsetStr as UnsetStr,
)
from kvpools_core.values.serving import (
    _canonical_kv as _canonical_kv,
)
from kvpools_core.values.serving import (
    _canonical_spec_algorithm as _canonical_spec_algorithm,
)
from kvpools_core.values.serving import (
    _canonical_state_dtype as _canonical_state_dtype,
)
from kvpools_core.values.serving import (
    _hisparse_json as _hisparse_json,
)
from kvpools_core.values.serving import (
    _optional_non_negative_ints as _optional_non_negative_ints,
)
from kvpools_core.values.serving import (
    _optional_positive_ratio as _optional_positive_ratio,
)
from kvpools_core.values.serving import (
    is_unset as is_unset,
)
from kvpools_core.values.serving import (
    parse_hisparse_config as parse_hisparse_config,
)
from kvpools_core.values.serving import (
    short_json as short_json,
)
from kvpools_core.values.traits import (
    GPU as GPU,
)
from kvpools_core.values.traits import (
    WORKSPACE_DTYPES as WORKSPACE_DTYPES,
)
from kvpools_core.values.traits import (
    KVDtypeRule as KVDtypeRule,
)
from kvpools_core.values.traits import (
    MemoryTier as MemoryTier,
)
from kvpools_core.values.traits import (
    PageSizeRule as PageSizeRule,
)
from kvpools_core.values.traits import (
    PlatformTraits as PlatformTraits,
)
from kvpools_core.values.traits import (
    Workspace as Workspace,
)
from kvpools_core.values.traits import (
    _ascending_tiers as _ascending_tiers,
)
from kvpools_core.values.traits import (
    _boolean as _boolean,
)
from kvpools_core.values.traits import (
    _frozen_strs as _frozen_strs,
)
from kvpools_core.values.traits import (
    _kv_rule_tuple as _kv_rule_tuple,
)
from kvpools_core.values.traits import (
    _non_empty as _non_empty,
)
from kvpools_core.values.traits import (
    _rule_tuple as _rule_tuple,
)
from kvpools_core.values.traits import (
    _tier_tuple as _tier_tuple,
)
from kvpools_core.values.traits import (
    _workspace_tuple as _workspace_tuple,
)
