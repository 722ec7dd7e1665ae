"""The request bodies of the service: typed, bounded, strict (no string read as a number), unknown fields refused.

The serving options are generated from the fields of :class:`~kvpools_core.values.Serving`, under the same
names, as the CLI generates its flags from them, so the API cannot drift from the values.  Every number has a
bound: counts a config or a request gives never reach kvpools' arithmetic unbounded.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import attrs
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, create_model, field_validator, model_validator

from kvpools_core.config import TOKENS
from kvpools_core.dtypes import KV_DTYPE_SPELLINGS, MODEL_DTYPES
from kvpools_core.options import cli_surface
from kvpools_core.planning.engine_version import RUNTIME_PROFILES, apply_engine_version
from kvpools_core.values import (
    ACCOUNTING_MODES,
    DECODE_RETRACTION_BACKUPS,
    DSV4_ATTN_BACKENDS,
    DSV4_COMPRESS_STATE_DTYPES,
    DSV4_COMPRESSED_KV_LAYOUTS,
    DSV4_KV_LAYOUTS,
    HICACHE_MEM_LAYOUTS,
    HICACHE_WRITE_POLICIES,
    SGLANG_ACCOUNTING_MODES,
    SPECULATIVE_ALGORITHMS,
    Serving,
)

MAX_PARALLEL = 1024
"""The largest TP, PP, DP, CP or node count a request may ask for (a record lists one entry per rank)."""
MAX_COUNT = TOKENS.maximum
"""The largest token or request count a request may give: kvpools' bound for a token count."""
MAX_CONTEXTS = 32
"""Context lengths one capacity request may ask about."""
MAX_NAME = 200

Size = Annotated[int, Field(ge=0, le=1 << 60)] | Annotated[str, Field(min_length=1, max_length=32)]
"""Bytes, or a size with a unit as the CLI takes it (``"60GiB"``)."""
Context = Annotated[int, Field(ge=1, le=MAX_COUNT)] | Annotated[str, Field(min_length=1, max_length=16)]
"""A context length: tokens, or ``"32k"`` / ``"1M"`` as the CLI takes it."""
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME)]

_STRICT = ConfigDict(strict=True, extra="forbid")

_CHOICES: dict[str, tuple[str, ...]] = {
    "kv_cache_dtype": KV_DTYPE_SPELLINGS,
    "speculative_algorithm": SPECULATIVE_ALGORITHMS,
    "disaggregation_mode": ("null", "prefill", "decode"),
    "accounting": ACCOUNTING_MODES,
    "mamba_ssm_dtype": tuple(MODEL_DTYPES),
    "dsv4_compress_state_dtype": (*DSV4_COMPRESS_STATE_DTYPES, "fp32", "bf16"),
    "dsv4_kv_layout": DSV4_KV_LAYOUTS,
    "dsv4_compressed_kv_layout": DSV4_COMPRESSED_KV_LAYOUTS,
    "dsv4_attn_backend": DSV4_ATTN_BACKENDS,
    "hicache_mem_layout": HICACHE_MEM_LAYOUTS,
    "hicache_write_policy": HICACHE_WRITE_POLICIES,
    "disaggregation_decode_retraction_backup": DECODE_RETRACTION_BACKUPS,
}
_PARALLEL = {"tp_size", "pp_size", "dp_size", "attn_cp_size", "dcp_size", "nnodes"}
_NOT_OPTIONS = {
    "platform",
    "plugin_options",
    "pp_layer_partition",
    "platform_traits",
    "workspaces",
    "speculative_draft",
}
"""Serving fields a request does not set as plain values: resolved by the pipeline, or given apart below."""


def _field_type(name: str, kind: Any) -> Any:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    base = args[0] if args else kind
    if name in _CHOICES:
        return Literal[_CHOICES[name]]
    if base is bool:
        return bool
    if base is int:
        if name in _PARALLEL:
            return Annotated[int, Field(ge=1, le=MAX_PARALLEL)]
        if name == "pp_rank":
            return Annotated[int, Field(ge=0, le=MAX_PARALLEL - 1)]
        return Annotated[int, Field(ge=0, le=MAX_COUNT)]
    if base is float:
        return Annotated[float, Field(ge=0, le=1 << 20, allow_inf_nan=False)]
    return Annotated[str, Field(max_length=1024)]


def _serving_model() -> type[BaseModel]:
    hints = typing.get_type_hints(Serving)
    fields: dict[str, Any] = {
        field.name: (_field_type(field.name, hints[field.name]) | None, Field(None, description=_doc(field)))
        for field in attrs.fields(Serving)
        if field.name not in _NOT_OPTIONS
    }
    fields["pp_layer_partition"] = (
        list[Annotated[int, Field(ge=0, le=10_000)]] | None,
        Field(None, max_length=MAX_PARALLEL, description="Layers per pipeline stage (SGLANG_PP_LAYER_PARTITION)."),
    )
    fields["plugin_options"] = (
        dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=256)]] | None,
        Field(None, max_length=16, description="Plugin-specific options (the CLI's --plugin-option KEY=VALUE)."),
    )
    fields["platform"] = (
        Annotated[str, Field(max_length=64)] | None,
        Field(None, description="Target platform or an alias of one [default: the GPU's, else cuda; never probed]."),
    )
    return create_model("ServingOptions", __config__=_STRICT, **fields)


def _doc(field: attrs.Attribute[Any]) -> str:
    return f"Serving.{field.name}, the CLI's --{field.name.replace('_', '-')}; unset: kvpools' default."


ServingOptions = _serving_model()


def problem(error: Mapping[str, Any]) -> str:
    """One schema error's text: a kvpools error raised by a field's check (the CLI's or the engine's own, e.g.
    ``vllm.limit_mm_per_prompt``) as the CLI words it, else pydantic's message."""
    from kvpools_core.errors import KvpoolsError

    raised = (error.get("ctx") or {}).get("error")
    return str(raised) if isinstance(raised, KvpoolsError) else str(error.get("msg", ""))


class Strict(BaseModel):
    model_config = _STRICT


class ModelChoice(Strict):
    """A model by name (a preset, an entry of --models-dir, or an earlier upload's name), or a config.json."""

    model: Name | None = Field(None, description="A preset, an entry of --models-dir, or an uploaded config's name.")
    config: dict[str, Any] | None = Field(None, description="A config.json object (the Hugging Face model config).")

    @model_validator(mode="after")
    def _one_model(self) -> ModelChoice:
        if (self.model is None) == (self.config is None):
            raise ValueError('give exactly one of "model" (a name) and "config" (a config.json object)')
        return self


_RUNTIME_PROFILE_CHOICES = (*RUNTIME_PROFILES, *(f"vllm=={version}" for version in RUNTIME_PROFILES))
"""``--runtime-profile``'s choices, as the CLI spells them (a version, or ``vllm==`` and a version)."""


class VllmOptions(Strict):
    """vLLM's own flags (``vllm serve``'s names) and ``engine_version``, with ``serving.accounting`` ``vllm`` only:
    every vLLM option of the CLI's ``plan`` / ``capacity`` (``_VLLM_OPTIONS``), checked by the CLI's and the
    engine's own code, so a refusal is the CLI's text with the field named."""

    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] | None = None
    max_model_len: Annotated[int, Field(ge=-1, le=MAX_COUNT)] | Annotated[str, Field(max_length=16)] | None = None
    max_num_seqs: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None
    max_num_batched_tokens: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None
    block_size: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    num_gpu_blocks_override: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None
    kv_offloading_size: Annotated[float, Field(gt=0, le=1 << 20, allow_inf_nan=False)] | None = None
    kv_offloading_backend: Literal["native", "lmcache"] | None = None
    runtime_profile: Literal[_RUNTIME_PROFILE_CHOICES] | None = Field(  # type: ignore[valid-type]
        None,
        description="The vLLM version whose calibrated runtime-memory profile estimates the activation peak, "
        "non-torch memory and CUDA graphs of a gpu / gpu_memory budget (the CLI's --runtime-profile).",
    )
    engine_version: Annotated[str, Field(max_length=64)] | None = Field(
        None,
        description="vllm==X.Y: --accounting vllm with that version's runtime profile (the CLI's --engine-version).",
    )
    limit_mm_per_prompt: (
        Annotated[str, Field(max_length=1024)]
        | Annotated[dict[Annotated[str, Field(max_length=64)], Any], Field(max_length=16)]
        | None
    ) = Field(
        None,
        description='Items per prompt per modality, vLLM\'s JSON object as text or as an object: {"image": 2, '
        '"video": 0} (the CLI\'s --limit-mm-per-prompt).',
    )
    language_model_only: bool | None = Field(
        None, description="Every multimodal limit 0: no encoder profile pass, no vision tower (--language-model-only)."
    )

    @field_validator("limit_mm_per_prompt")
    @classmethod
    def _limits(cls, value: Any) -> Any:
        """Checked by the engine's own parser, with the CLI's message (naming --limit-mm-per-prompt)."""
        from kvpools_core.engines.vllm.multimodal import parse_multimodal_limits

        if value is not None:
            with cli_surface():
                parse_multimodal_limits(value, None)  # a ConfigError is a ValueError: this field's 422
        return value

    @field_validator("engine_version")
    @classmethod
    def _engine_version(cls, value: str | None, info: ValidationInfo) -> str | None:
        """The CLI's check of --engine-version (its form, a version with a profile, the same version as
        --runtime-profile), under --accounting vllm: this block is vLLM's."""
        if value is not None:
            with cli_surface():
                apply_engine_version(
                    {"accounting": "vllm", "engine_version": value, "runtime_profile": info.data.get("runtime_profile")}
                )
        return value


class PlanRequest(ModelChoice):
    """``kvpools plan``: a model, serving options and a budget (the KV bytes, or a whole GPU)."""

    memory: Size | None = Field(None, description="The KV cache budget (the CLI's --memory).")
    free_memory: Size | None = Field(None, description="A device's free memory, stated (never measured here).")
    gpu: Name | None = Field(None, description="A catalogue GPU (h100, h200, mi300x, ...).")
    gpu_memory: Size | None = Field(None, description="A GPU of this total memory.")
    weights_memory: Size | None = None
    reserved_memory: Size | None = None
    runtime_memory: Size | None = None
    host_memory: Size | None = Field(
        None, description="The node's host memory (needed by a host tier: never measured)."
    )
    host_reserve: Size | None = None
    draft_model: Name | None = Field(None, description="The draft model, by name (--speculative-draft-model-path).")
    serving: ServingOptions = Field(default_factory=ServingOptions)  # type: ignore[valid-type]
    vllm: VllmOptions | None = Field(None, description="vLLM's flags, with serving.accounting vllm.")


class CapacityRequest(PlanRequest):
    """``kvpools capacity``: concurrency per context length, the largest contexts, SGLang's flags, a split."""

    contexts: list[Context] = Field(default_factory=list, max_length=MAX_CONTEXTS)
    requests: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None
    headroom: Annotated[float, Field(ge=0, lt=1)] = 0.1
    workload: Annotated[str, Field(max_length=200)] | None = Field(
        None, description="8k, 'lognormal:median=4096,p99=32768' or 'uniform:1k..32k' (no trace files)."
    )


class CapacityRecordRequest(PlanRequest):
    """The capacity record (``--format capacity-json``), or the fields Dynamo or llm-d read from it."""

    context: Context | None = None
    shape: Literal["kvpools", "dynamo", "llm-d"] = "kvpools"


class CompareRequest(ModelChoice):
    """``kvpools compare``: SGLang's and vLLM's accountings side by side."""

    memory: Size | None = None
    gpu: Name | None = None
    gpu_memory: Size | None = None
    weights_memory: Size | None = None
    contexts: list[Context] = Field(default_factory=list, max_length=MAX_CONTEXTS)
    tp_size: Annotated[int, Field(ge=1, le=MAX_PARALLEL)] | None = None
    kv_cache_dtype: Literal[KV_DTYPE_SPELLINGS] | None = None  # type: ignore[valid-type]
    context_length: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None
    page_size: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    block_size: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    enable_unified_memory: bool = Field(
        False, description="Also SGLang's unified memory arena beside its static split and vLLM (the CLI's flag)."
    )


class FitRequest(ModelChoice):
    """``kvpools fit``: the configurations on the fewest GPUs that hold N requests of L tokens."""

    requests: Annotated[int, Field(ge=1, le=MAX_COUNT)]
    context: Context
    gpu: Name | None = None
    gpu_memory: Size | None = None
    max_gpus: Annotated[int, Field(ge=1)] = 8
    kv_cache_dtype: Literal[KV_DTYPE_SPELLINGS] | None = None  # type: ignore[valid-type]
    page_size: Annotated[int, Field(ge=1, le=1 << 16)] | None = None
    mem_fraction_static: Annotated[float, Field(gt=0, le=1)] | None = None
    chunked_prefill_size: Annotated[int, Field(ge=1, le=MAX_COUNT)] | None = None
    runtime_memory: Size | None = None
    accounting: Literal[SGLANG_ACCOUNTING_MODES] | None = None  # type: ignore[valid-type]


Scalar = Annotated[int, Field(ge=-(1 << 31), le=1 << 31)] | float | bool | Annotated[str, Field(max_length=64)]


class SweepRequest(Strict):
    """``kvpools sweep``: models x serving axes x budgets, one row per point, paged by ``offset`` / ``limit``."""

    models: list[Name] = Field(min_length=1, max_length=8)
    axes: dict[Annotated[str, Field(max_length=64)], list[Scalar]] = Field(default_factory=dict, max_length=8)
    memory: list[Size] = Field(default_factory=list, max_length=16)
    gpu: list[Name] = Field(default_factory=list, max_length=16)
    contexts: list[Context] = Field(default_factory=list, max_length=MAX_CONTEXTS)
    platform: Annotated[str, Field(max_length=64)] | None = None
    offset: Annotated[int, Field(ge=0, le=1 << 20)] = 0
    limit: Annotated[int, Field(ge=1, le=1000)] = 100
