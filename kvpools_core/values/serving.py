"""How the model is served: ``Serving`` (every option), the engine-default markers and their constants."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import attrs

from kvpools_core.dtypes import MODEL_DTYPES, canonical_kv_dtype
from kvpools_core.errors import ConfigError, short_repr
from kvpools_core.options import option
from kvpools_core.values import _fields
from kvpools_core.values._fields import (
    _flag,
    _int_tuple_or_none,
    _invalid,
    fraction,
    frozen_mapping,
    non_negative,
    one_of,
    optional_non_negative,
    optional_positive,
    positive,
    positive_ratio,
)
from kvpools_core.values.cost import DraftModel
from kvpools_core.values.loading import load_value
from kvpools_core.values.traits import PlatformTraits, Workspace, _workspace_tuple

SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "NEXTN", "DFLASH", "DSPARK", "NGRAM")
ACCOUNTING_MODES = ("exact", "sglang", "vllm", "trtllm")
"""``exact`` and ``sglang`` size SGLang's pools (:func:`kvpools_core.plan`); ``vllm`` plans ``vllm serve``'s KV
cache instead (:func:`kvpools_core.engines.vllm.plan_vllm`, ``docs/vllm.md``) and ``trtllm`` ``trtllm-serve``'s
(:func:`kvpools_core.engines.trtllm.plan_trtllm`, ``docs/trtllm.md``); the SGLang pipeline refuses both.  These
are the accountings of kvpools' own engine plugins; an installed third-party engine plugin adds its own
(``engine_accountings`` hook, ``kvpools_core.engines.accountings()``)."""
SGLANG_ACCOUNTING_MODES = ("exact", "sglang")
"""The accounting modes of SGLang's pipeline (``plan``, ``build``, ``fit``, ``sweep``)."""


DEFAULT_HICACHE_RATIO = 2.0
"""SGLang's ``--hicache-ratio`` when neither it nor ``--hicache-size`` is given (cache mode)."""
HICACHE_MEM_LAYOUTS = ("layer_first", "page_first", "page_first_direct")
"""``--hicache-mem-layout`` values kvpools models (SGLang's ``page_first_kv_split`` and ``page_head`` are
NPU / head-sharded layouts it does not)."""
HICACHE_WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
MM_FEATURE_TRANSPORTS = ("cpu", "cuda_ipc", "cuda_vmm")
"""``--mm-feature-transport`` choices (SGLang 0.5.23 ``arg_groups/fields/mm.py``); ``cuda_ipc`` and ``cuda_vmm`` keep
a GPU feature pool of ``SGLANG_MM_FEATURE_CACHE_MB`` that ``mm_runtime_reservation_gb`` takes out of the KV budget."""
GPU_MM_FEATURE_TRANSPORTS = ("cuda_ipc", "cuda_vmm")
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


SERVED_DTYPES = ("auto", "bfloat16", "float16", "float32")
"""``--dtype``'s values (SGLang's and vLLM's; ``half`` / ``float`` and ``bf16`` / ``fp16`` / ``fp32`` read as
their names here)."""
_SERVED_DTYPE_ALIASES = {
    "half": "float16",
    "float": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp32": "float32",
}
VLLM_QUANTIZATION_METHODS = (
    "fp8",
    "modelopt",
    "modelopt_fp4",
    "modelopt_mixed",
    "compressed-tensors",
    "awq",
    "auto_awq",
    "awq_marlin",
    "gptq",
    "auto_gptq",
    "gptq_marlin",
    "mxfp4",
    "gpt_oss_mxfp4",
    "fp8_per_tensor",
    "fp8_per_channel",
    "fp8_per_block",
)
"""vLLM's ``--quantization`` names kvpools models (vLLM 0.33 ``QuantizationMethods``,
vllm/model_executor/layers/quantization/__init__.py L15-48, whose checkpoints the weights estimate reads), and its
online fp8 shorthands, which quantise an unquantised checkpoint at load (vllm/config/quantization.py L195-209;
:mod:`kvpools_core.parts.weights.methods` says from which release each exists)."""
SGLANG_QUANTIZATION_METHODS = (
    "fp8",
    "modelopt",
    "modelopt_fp8",
    "modelopt_fp4",
    "modelopt_mixed",
    "compressed-tensors",
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "mxfp4",
)
"""SGLang's ``--quantization`` names kvpools models (SGLang 0.5.23 ``QUANTIZATION_CHOICES``,
srt/arg_groups/choices.py L32-66)."""
QUANTIZATION_METHODS = tuple(dict.fromkeys((*SGLANG_QUANTIZATION_METHODS, *VLLM_QUANTIZATION_METHODS)))
"""``--quantization`` values kvpools models: ``fp8`` on an unquantised checkpoint quantises it at load; any of
these on a quantised checkpoint is checked against its ``quantization_config`` with the engine's own rules
(:mod:`kvpools_core.parts.weights.methods`) and serves the checkpoint's storage."""
UNMODELLED_QUANTIZATION_METHODS = (
    "bitsandbytes",
    "gguf",
    "mxfp8",
    "nvfp4_online",
    "petit_nvfp4",
    "w8a8_int8",
    "w8a8_fp8",
    "moe_wna16",
    "w4afp8",
    "auto-round",
    "auto-round-int8",
    "modelslim",
    "mxfp_w4a8",
    "quark",
    "quark_int4fp8_moe",
    "quark_mxfp4",
    "mlx_q4",
    "mlx_q8",
    "unquant",
    "humming",
    "fbgemm_fp8",
    "fp_quant",
    "modelopt_mxfp8",
    "experts_int8",
    "torchao",
    "inc",
    "deepseek_v4_fp8",
    "online",
    "int8_per_channel_weight_only",
    "nvfp4_per_token",
)
"""The rest of SGLang 0.5.23's ``QUANTIZATION_CHOICES`` and vLLM 0.33's ``QuantizationMethods``: refused by name
("kvpools does not model ... yet"), never planned as something else."""


def _quantization_method(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None or value in QUANTIZATION_METHODS:
        return
    if value in UNMODELLED_QUANTIZATION_METHODS:
        raise _invalid(
            instance,
            f"{_flag(instance, attribute)} {value}: kvpools does not model {value} weights yet (it models "
            f"{', '.join(QUANTIZATION_METHODS)}). Drop {_flag(instance, attribute)} and pass the served weights "
            "with --weights-memory.",
        )
    shown = ", ".join(("none", *QUANTIZATION_METHODS))
    raise _invalid(instance, f"{_flag(instance, attribute)} must be one of {shown}; got {value!r}.")


def _canonical_served_dtype(value: Any) -> Any:
    if isinstance(value, str):
        lowered = value.lower().removeprefix("torch.")
        return _SERVED_DTYPE_ALIASES.get(lowered, lowered)
    return value


DSV4_COMPRESS_STATE_DTYPES = ("float32", "bfloat16")
DSV4_KV_LAYOUTS = ("auto", "v4", "v41", "v41_new")
"""``SGLANG_DSV4_KV_LAYOUT`` (``select_dsv4_kv_layout``): DeepSeek-V4's main KV cache layout."""
DSV4_COMPRESSED_KV_LAYOUTS = ("auto", "fp8", "fp4")
"""``SGLANG_DSV4_COMPRESSED_KV_LAYOUT`` (``resolve_compressed_kv_layout``): its compressed caches' encoding."""
DSV4_ATTN_BACKENDS = ("auto", "flashmla", "flashmla_mega", "trtllm")
"""SGLang's ``--dsv4-attn-backend`` (``arg_groups/fields/exec_.py``): DeepSeek-V4's attention backend."""
"""``SGLANG_DSV4_COMPRESS_STATE_DTYPE``'s values (SGLang also spells them ``fp32`` and ``bf16``)."""
_STATE_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16"}


def _lower_name(value: Any) -> Any:
    """A name as SGLang reads its environment switches (``.lower()``); anything else is left for the validator."""
    return value.strip().lower() if isinstance(value, str) else value


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


DEFAULT_ADAPTIVE_CANDIDATE_STEPS = (0, 1, 3, 5, 7)
"""The union of SGLang 0.5.23's ``DEFAULT_ADAPTIVE_CONFIG`` tiers' ``candidate_steps``
(``speculative/adaptive_spec_params.py`` lines 28-53)."""


@functools.lru_cache(maxsize=32)
def adaptive_candidate_steps(path: str | None) -> tuple[int, ...]:
    """``resolve_candidate_steps_from_config``: the sorted union of every batch-size tier's ``candidate_steps``
    of the adaptive config at ``path`` (SGLang's default without one); a ConfigError names what is wrong."""
    if path is None:
        return DEFAULT_ADAPTIVE_CANDIDATE_STEPS
    flag = option("speculative_adaptive_config")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{flag} {path!r} cannot be read as JSON ({exc}). Pass SGLang's adaptive config file."
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"{flag} {path!r} must hold a JSON object of batch-size tiers, e.g. "
            '{"1": {"candidate_steps": [1, 3, 7]}}.'
        )
    steps: set[int] = set()
    tiers = 0
    for key, entry in config.items():
        if not str(key).isdigit():
            continue
        tiers += 1
        candidates = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if not isinstance(candidates, list) or not candidates or not all(type(v) is int and v >= 0 for v in candidates):
            raise ConfigError(
                f"{flag} {path!r}: tier {key} needs candidate_steps, a list of non-negative ints, got "
                f"{short_json(candidates)} (SGLang's _load_adaptive_config)."
            )
        steps.update(candidates)
    if not tiers:
        raise ConfigError(
            f'{flag} {path!r} has no integer batch-size tier, e.g. {{"1": {{"candidate_steps": [1, 3, 7]}}}} '
            f"(SGLang's _load_adaptive_config)."
        )
    return tuple(sorted(steps))


def resolve_adaptive_speculation(serving: Serving) -> Serving:
    """SGLang's ``_init_adaptive_speculative_params`` (``arg_groups/speculative_hook.py`` lines 1395-1427): top-k
    1 when unset, the middle candidate step when ``speculative_num_steps`` is unset (a given one must be a
    candidate), and ``speculative_num_draft_tokens = steps + 1`` whatever was given."""
    if not serving.adaptive_speculation:
        return serving
    candidates = adaptive_candidate_steps(serving.speculative_adaptive_config)
    steps = serving.speculative_num_steps
    if steps is None:
        steps = candidates[len(candidates) // 2]
    if steps not in candidates:
        raise ConfigError(
            f"{option('speculative_num_steps')} {steps} is not in the adaptive config's candidate_steps "
            f"{list(candidates)} (SGLang refuses it); pass one of those values."
        )
    if steps == 0:
        raise ConfigError(
            f"adaptive speculation starts at {option('speculative_num_steps')} 0, which kvpools does not model; "
            f"pass one of {[c for c in candidates if c > 0]}."
        )
    return attrs.evolve(
        serving, speculative_eagle_topk=1, speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1
    )


# ---------------------------------------------------------------------------
# platform traits and workspaces
# ---------------------------------------------------------------------------


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


class LateDefaultInt(int):
    """An engine default SGLang declares only after its memory settings and PD hooks have read the option unset
    (``--max-running-requests``: DeepSeek-V4's 256 and the speculative hooks' 48 come after
    ``handle_gpu_memory_settings`` and ``handle_pd_disaggregation``); it sizes the pools like a given value, and
    :attr:`Serving.given_max_running_requests` reads it as unset for those earlier steps."""

    __slots__ = ()


ENGINE_DEFAULT_OPTIONS = (
    "page_size",
    "swa_full_tokens_ratio",
    "dsa_prefill_backend",
    "dsa_decode_backend",
    "mamba_full_memory_ratio",
    "max_running_requests",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)
"""The :class:`Serving` fields an unset value of which an ``engine_defaults`` answer may replace: the ones SGLang
0.5.23 leaves ``None`` and resolves per model (``arg_groups/model_overrides/``, the model hooks such as
``arg_groups/deepseek_v4_hook.py``) or per platform.  A new one is a ``Serving`` field whose default is an unset
marker (:class:`UnsetInt`, :class:`UnsetFloat`, :class:`UnsetStr`) listed here, or whose ``None`` means unset
(:data:`NONE_IS_UNSET`)."""

NONE_IS_UNSET = (
    "max_running_requests",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)
""":data:`ENGINE_DEFAULT_OPTIONS` whose unset value is ``None`` (SGLang's own ``None``: its default is resolved
later, the speculative parameters by the speculative hook's handlers), not an unset marker."""

LATE_DEFAULT_OPTIONS = ("max_running_requests",)
""":data:`NONE_IS_UNSET` options an ``engine_defaults`` answer for which is applied as a :class:`LateDefaultInt`
(SGLang declares it after its memory settings and PD hooks have read the option unset)."""


def _accounting_name(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value or value != value.strip().lower() or " " in value:
        raise ConfigError(
            f"Serving.accounting must be a lower-case accounting name ({', '.join(ACCOUNTING_MODES)} or an installed "
            f"engine plugin's), got {value!r}."
        )


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


@attrs.frozen(kw_only=True)
class Serving:
    """Serving options that change sizing, under SGLang's server-arg names.

    What SGLang reads from environment variables is a typed field here
    (``swa_eviction_interval`` is ``SGLANG_SWA_EVICTION_INTERVAL``,
    ``vlm_cache_size_mb`` is ``SGLANG_VLM_CACHE_SIZE_MB``,
    ``mm_feature_cache_mb`` is ``SGLANG_MM_FEATURE_CACHE_MB``,
    ``pp_layer_partition`` is ``SGLANG_PP_LAYER_PARTITION``,
    ``mamba_skip_decode_lock`` is ``SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK``,
    ``dsv4_compress_state_dtype`` is ``SGLANG_DSV4_COMPRESS_STATE_DTYPE``,
    ``enable_online_compress`` is ``SGLANG_OPT_USE_ONLINE_COMPRESS``,
    ``enable_online_c128_mtp`` is ``SGLANG_EXPERIMENTAL_ONLINE_C128_MTP``,
    ``dsv4_kv_layout`` is ``SGLANG_DSV4_KV_LAYOUT``,
    ``dsv4_compressed_kv_layout`` is ``SGLANG_DSV4_COMPRESSED_KV_LAYOUT``);
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
    ``page_size``, ``swa_full_tokens_ratio``, ``dsa_prefill_backend``, ``dsa_decode_backend`` and
    ``mamba_full_memory_ratio`` left unset read as SGLang's generic defaults (1, 0.8, ``flashmla_sparse``,
    ``flashmla_kv``, 0.9) and are marked so
    (:attr:`unset_options`): the pipeline gives them the model's or platform's own default (``engine_defaults``
    hook) and notes it; a value given, even an equal one, is kept.
    """

    kv_cache_dtype: str = attrs.field(default="auto", converter=_canonical_kv)
    dtype: str = attrs.field(default="auto", converter=_canonical_served_dtype, validator=one_of(*SERVED_DTYPES))
    """``--dtype``: the dtype the weights are served in; ``auto`` is the checkpoint's (SGLang serves a float32
    checkpoint as float16, Gemma's as bfloat16). ``--kv-cache-dtype auto`` follows it."""
    quantization: str | None = attrs.field(default=None, validator=_quantization_method)
    """``--quantization``: on an unquantised checkpoint, quantise the Linear weights and experts to fp8 when they
    load, as the ``accounting`` engine and release do: SGLang's ``fp8`` (``Fp8LinearMethod`` / ``Fp8MoEMethod``, a
    scale per output row and per expert); vLLM's ``fp8_per_tensor`` / ``fp8_per_channel`` / ``fp8_per_block``
    (from 0.20, ``fp8_per_channel`` from 0.24), and its ``fp8`` (per tensor; from 0.31 deprecated and served as
    ``fp8_per_tensor``, which the plan notes); the weights estimate counts them so.
    A checkpoint's own method (``modelopt``, ``modelopt_fp4``, ``compressed-tensors``, ``awq``, ``gptq_marlin``,
    ``mxfp4``, ``fp8`` on an fp8 checkpoint, ...) is checked against its ``quantization_config`` with the rules of
    the engine ``accounting`` names (vLLM's for ``vllm``, SGLang's otherwise) and the checkpoint's storage is
    planned; methods kvpools does not model are refused by name."""
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
    chunked_prefill_size: int | None = attrs.field(default=UnsetInt(8192), validator=optional_positive)
    """``None``: chunked prefill off (SGLang's ``-1``).  Unset (``Serving()``, no ``--chunked-prefill-size``), it
    reads as 8192 until a GPU budget resolves SGLang's default for the GPU's memory (``handle_gpu_memory_settings``,
    ``arg_groups/memory_hook.py`` lines 89-178 of SGLang 0.5.23: 2048 under 20 GiB, 4096 under 60 GiB, 8192 under
    160 GiB, else 16384; a platform's own memory tiers first), which also moves the default
    ``mem_fraction_static``; a given value, even 8192, wins (:func:`is_unset`)."""
    post_capture_kv_sizing: bool = False
    """``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1`` (SGLang 0.5.23, off by default): where SGLang plans it
    (``post_capture_kv_sizing_planned``), a GPU budget's default fraction skips the graph and activation reserve
    and a Mamba model's slack is at least the pre-capture activation reserve
    (:mod:`kvpools_core.pipeline.post_capture`); elsewhere SGLang ignores it and so does the plan (a step says so)."""
    disable_cuda_graph: bool = False
    """SGLang's ``--disable-cuda-graph`` (0.5.23: deprecated for ``--cuda-graph-backend-{decode,prefill}=disabled``,
    which ``resolve_cuda_graph_config`` sets, ``arg_groups/cuda_graph_hook.py`` lines 54-57): no decode and no
    prefill graph, so a GPU budget's default ``mem_fraction_static`` reserves neither graph term
    (``reserve_for_graph_mb``, ``memory_hook.py`` lines 357-399: DP attention's padding term stays) and
    post-capture KV sizing is never planned (``post_capture_kv_sizing_planned``, ``overrides.py`` lines 1838-1852)."""
    disable_radix_cache: bool = False
    disable_overlap_schedule: bool = False
    prefill_only_disable_kv_cache: bool = False
    """SGLang's ``--prefill-only-disable-kv-cache`` (embedding prefill servers): the KV pool is
    ``NoOpMHATokenToKVPool``, which keeps SGLang's token count for admission but allocates one page of
    placeholder rows per layer (ref-000 lines 2006-2010; ``mem_cache/memory_pool.py`` ``NoOpMHATokenToKVPool``).
    Plain MHA models only (every other pool family is refused as SGLang refuses it, ref-000 lines 963-1001)."""
    vlm_cache_size_mb: int = attrs.field(default=100, validator=non_negative)
    mm_feature_transport: str | None = attrs.field(default=None, validator=one_of(None, *MM_FEATURE_TRANSPORTS))
    """SGLang's ``--mm-feature-transport``; unset reads as ``cpu``, SGLang's resolution on one node
    (``handle_multimodal_feature_transport``, ``arg_groups/serving_hook.py`` lines 800-870; its multi-node GB200/GB300
    auto-selection of ``cuda_vmm`` is not modelled: pass it)."""
    mm_feature_cache_mb: int = attrs.field(default=1024, validator=non_negative)
    """``SGLANG_MM_FEATURE_CACHE_MB`` (SGLang 0.5.23 default 1,024, ``environ.py`` line 1622): the GPU feature pool
    a ``cuda_ipc`` / ``cuda_vmm`` transport keeps, reserved out of a multimodal model's profiled budget."""
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
    speculative_adaptive: bool = False
    """SGLang's ``--speculative-adaptive``: EAGLE/EAGLE3 switch their step count at run time among the adaptive
    config's ``candidate_steps``, so the pools are sized for the largest, ``max(candidate_steps) + 1`` draft tokens
    (:attr:`max_speculative_num_draft_tokens`).  Where SGLang cannot run it (another algorithm, top-k above 1, DP
    attention) it falls back to the static parameters, and so does kvpools (:attr:`adaptive_speculation`)."""
    enable_multi_layer_eagle: bool = False
    """SGLang's ``--enable-multi-layer-eagle``: EAGLE / EAGLE3 / NEXTN run one draft runner per draft step
    (``MultiLayerEagleWorkerV2``, ``draft_model_idx`` 0 .. steps - 1).  kvpools models it for Inkling-class MTP heads
    only (read by the mamba plugin) and refuses it elsewhere."""
    speculative_adaptive_config: str | None = None
    """SGLang's ``--speculative-adaptive-config``: the JSON file of the adaptive tiers (``{"1": {"candidate_steps":
    [1, 3, 7]}, ...}``); unset, SGLang's ``DEFAULT_ADAPTIVE_CONFIG`` (candidate steps 0, 1, 3, 5, 7)."""
    # disaggregation
    disaggregation_mode: str = attrs.field(default="null", validator=one_of("null", "prefill", "decode"))
    disaggregation_decode_extra_slots: int | None = attrs.field(default=None, validator=optional_non_negative)
    """Request rows a decode node pre-allocates for transfers; ``None``: SGLang's default
    (:attr:`decode_extra_slots`)."""
    enable_pd_role_switch: bool = False
    """SGLang's ``--enable-pd-role-switch``: a node that may flip between prefill and decode builds the decode
    request pools (``DecodeReqToTokenPool`` / ``HybridMambaDecodeReqToTokenPool``) whatever its launch role, with
    ``disaggregation_decode_extra_slots`` pre-allocated rows when given, else none (ref-000 lines 1003-1022)."""
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
    mamba_full_memory_ratio: float = attrs.field(default=UnsetFloat(0.9), validator=positive_ratio)
    """Unset, SGLang's fallback 0.9 until the pipeline applies the model's own (``engine_defaults``: Inkling
    0.1); a given value wins."""
    max_mamba_cache_size: int | None = attrs.field(default=None, validator=optional_positive)
    mamba_ssm_dtype: str | None = attrs.field(default=None, validator=one_of(None, *MODEL_DTYPES))
    enable_mamba_extra_buffer: bool = False
    enable_mamba_extra_buffer_lazy: bool = False
    mamba_skip_decode_lock: bool = False
    enable_linear_replayssm: bool = False
    """SGLang's ReplaySSM decode ring: per state slot, ``linear_replayssm_cache_len`` records per recurrent layer
    (read by the mamba plugin)."""
    enable_linear_replayssm_spec: bool = False
    """SGLang's ReplaySSM spec-verify ring: replaces the speculative intermediate SSM state of a GDN or KDA hybrid
    (read by the mamba plugin)."""
    linear_replayssm_cache_len: int = attrs.field(default=16, validator=positive)
    """The ReplaySSM ring length L (SGLang's ``--linear-replayssm-cache-len``, default 16)."""
    dsa_prefill_backend: str = UnsetStr("flashmla_sparse")
    """Unset, the backend SGLang 0.5.23 resolves on Hopper until the pipeline applies the model's own
    (``engine_defaults``: DeepSeek sparse attention with ``dcp_size`` > 1 takes ``trtllm``); a given value wins."""
    dsa_decode_backend: str = UnsetStr("flashmla_kv")
    """Unset, as :attr:`dsa_prefill_backend` (``trtllm`` under DSA decode context parallelism)."""
    enable_dsa_cache_layer_split: bool = False
    m3_fp8_attn_gemm: bool = False
    """SGLang's ``m3_fp8_attn_gemm_enabled`` (``server_args.py`` lines 592-610), which it turns on by itself for
    MiniMax-M3 with ``--kv-cache-dtype fp8_e4m3``, ``--attention-backend trtllm_mha`` on an SM100 GPU (unless
    ``SGLANG_DISABLE_M3_FP8_ATTN_GEMM``): the lightning-indexer cache is then fp8 too (ref-000 lines 1857-1861).
    kvpools sees neither the GPU nor the attention backend, so it is an explicit option; without it the indexer
    keeps the model dtype.  Models whose plugin does not name the feature (``engine_features``) refuse it."""
    nvfp4_sm: int | None = attrs.field(default=None, validator=one_of(None, 100, 120))
    """The Blackwell GPU SGLang's ``--kv-cache-dtype nvfp4`` runs on (``get_platform().is_sm100`` / ``is_sm120``),
    which decides its MHA pool's scale layouts (:mod:`kvpools_core.parts.nvfp4`); kvpools cannot see the GPU, so
    nvfp4 on MHA layers needs it."""
    qsa_indexer_dtype: str = attrs.field(default="auto", validator=one_of("auto", "bfloat16", "fp8_e4m3"))
    """SGLang's ``--qsa-indexer-dtype``: the dtype of a QSA model's compressed index keys (``auto`` = bfloat16;
    ``resolve_qsa_indexer_dtype``, ``mem_cache/qsa_kv_pool.py``); the pending key ring stays bf16."""
    prefill_kv_cache_dequant_dtype: str = attrs.field(default="auto", validator=one_of("auto", "fp8_e4m3", "nvfp4"))
    """SGLang's ``--prefill-kv-cache-dequant-dtype`` (nvfp4 only): ``fp8_e4m3`` prefills with flashinfer from an fp8
    dequant workspace, ``nvfp4`` natively with trtllm_mha (SM100); ``auto`` is ``nvfp4`` on SM100, else fp8_e4m3."""
    # DeepSeek-V4 compressed attention (read by the dsv4 plugin)
    enable_hisparse: bool = False
    hisparse_config: str | None = attrs.field(default=None, validator=_hisparse_json)
    dsv4_compress_state_dtype: str = attrs.field(
        default="float32", converter=_canonical_state_dtype, validator=one_of(*DSV4_COMPRESS_STATE_DTYPES)
    )
    enable_online_compress: bool = False
    enable_online_c128_mtp: bool = False
    dsv4_kv_layout: str = attrs.field(default="auto", converter=_lower_name, validator=one_of(*DSV4_KV_LAYOUTS))
    """``auto`` is SGLang's answer off an SM100 / SM103 GPU (V4); kvpools sees no GPU (plugins/dsv4/layouts.py)."""
    dsv4_compressed_kv_layout: str = attrs.field(
        default="auto", converter=_lower_name, validator=one_of(*DSV4_COMPRESSED_KV_LAYOUTS)
    )
    dsv4_attn_backend: str = attrs.field(default="auto", converter=_lower_name, validator=one_of(*DSV4_ATTN_BACKENDS))
    """``trtllm`` forces the V4 layout and stores the pools as uniform 512 B fp8 rows; ``flashmla_mega`` forces v41
    (``select_dsv4_kv_layout``; plugins/dsv4/trtllm.py)."""
    enable_encoder_swa_bounded_replay: bool = False
    """SGLang's ``--enable-encoder-swa-bounded-replay`` (DeepSeek-V4.1 only): the target's SWA rows in a per-request
    window with a replay workspace, the full-only paged allocator (the dsv4 plugin's ``encoder_replay``)."""
    # hierarchical cache: the host KV tier (SGLang HiCache; read by kvpools_core.pipeline.host)
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
    # the unified memory pool (SGLang --enable-unified-memory; parts.unified, docs/unified-memory.md)
    enable_unified_memory: bool = False
    """SGLang's ``--enable-unified-memory``: a hybrid model's full KV, SWA KV and Mamba state share one arena
    (``PoolSizing.arenas``) whose split moves at run time; models SGLang does not build it for are refused."""
    disable_lazy_compaction: bool = False
    """``SGLANG_DISABLE_LAZY_COMPACTION``: the unified allocators compact eagerly on every free instead of
    recording holes (lazy compaction, SGLang's default); only with :attr:`enable_unified_memory`."""
    enable_page_major_kv_layout: bool = False
    """SGLang's ``--enable-page-major-kv-layout``: every layer of one slot in one page-granular entry.  SGLang
    0.5.23 implies it under :attr:`enable_unified_memory` (whose arena is that layout) and refuses it without."""
    # kvpools
    accounting: str = attrs.field(default="exact", validator=_accounting_name)
    """``--accounting``: an accounting of an installed engine plugin (``engine_accountings`` hook). Any lower-case
    name is a valid value here (the foundation cannot see the registry); the command line and the planners check
    it against the installed engines where they resolve the engine (``kvpools_core.engines.engine_for``)."""
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
        if self.enable_encoder_swa_bounded_replay and self.accounting not in SGLANG_ACCOUNTING_MODES:
            # SGLang's DeepSeek-V4.1 switch; the DeepSeek-V4 plugin models it (plugins/dsv4/encoder_replay.py)
            raise ConfigError(
                f"{o('enable_encoder_swa_bounded_replay')} is SGLang's DeepSeek-V4.1 encoder SWA replay; "
                f"{o('accounting')} {self.accounting} plans another engine's KV cache. Use {o('accounting')} exact "
                f"or sglang, or drop {o('enable_encoder_swa_bounded_replay')}."
            )
        if self.enable_online_c128_mtp and not self.enable_online_compress:
            # SGLang reads SGLANG_EXPERIMENTAL_ONLINE_C128_MTP only under ONLINE_C128 (deepseek_v4_memory_pool.py
            # lines 50, 72-73, 1078), which SGLANG_OPT_USE_ONLINE_COMPRESS turns on
            raise ConfigError(
                f"{o('enable_online_c128_mtp')} applies to the online c128 compression only, which is off: add "
                f"{o('enable_online_compress')}, or drop {o('enable_online_c128_mtp')} (alone it changes nothing)."
            )
        if self.disable_lazy_compaction and not self.enable_unified_memory:
            raise ConfigError(
                f"{o('disable_lazy_compaction')} (SGLANG_DISABLE_LAZY_COMPACTION) applies to the unified memory "
                f"pool's allocators only, which are off: add {o('enable_unified_memory')}, or drop "
                f"{o('disable_lazy_compaction')} (alone it changes nothing)."
            )
        if self.enable_page_major_kv_layout and not self.enable_unified_memory:
            # SGLang 0.5.23 arg_groups/kv_cache_hook.py handle_page_major_kv_layout: the static page-major pool
            # (PageMajorMHATokenToKVPool) is non-constructible
            raise ConfigError(
                f"{o('enable_page_major_kv_layout')} without {o('enable_unified_memory')} is temporarily unsupported "
                "in SGLang 0.5.23: the strided MHA K/V views were removed and the static-pool page-major layout "
                f"awaits its per-layer-view reimplementation. Add {o('enable_unified_memory')} (which implies it), "
                f"or drop {o('enable_page_major_kv_layout')}."
            )
        engine_methods = {"vllm": VLLM_QUANTIZATION_METHODS}.get(
            self.accounting, SGLANG_QUANTIZATION_METHODS if self.accounting in SGLANG_ACCOUNTING_MODES else None
        )
        if self.quantization is not None and engine_methods is not None and self.quantization not in engine_methods:
            # the engines' own --quantization choices: vLLM's QuantizationMethods, SGLang's QUANTIZATION_CHOICES
            engine = "vLLM" if self.accounting == "vllm" else "SGLang"
            raise ConfigError(
                f"{o('quantization')} {self.quantization} is not one of {engine}'s {o('quantization')} methods "
                f"kvpools models under {o('accounting')} {self.accounting} ({', '.join(engine_methods)}). Pass "
                f"the name {engine} uses for the checkpoint's method"
                + (" (modelopt: vLLM resolves the algorithm itself)." if self.quantization == "modelopt_fp8" else ".")
            )
        if self.enable_unified_memory and self.accounting not in SGLANG_ACCOUNTING_MODES:
            raise ConfigError(
                f"{o('enable_unified_memory')} is SGLang's unified memory pool; {o('accounting')} "
                f"{self.accounting} plans another engine's KV cache. Use {o('accounting')} exact or sglang, or drop "
                f"{o('enable_unified_memory')}."
            )
        if self.enable_pd_role_switch and self.disaggregation_mode in ("prefill", "decode"):
            # SGLang 0.5.23 handle_pd_disaggregation (arg_groups/pd_disaggregation_hook.py lines 164-194) rejects the
            # features whose role-specific state a flip does not rebuild; the MoE ones change no KV byte
            unsupported = [
                f"{o(name)} {value}"
                for name, value, bad in (
                    ("pp_size", self.pp_size, self.pp_size > 1),
                    ("dcp_size", self.dcp_size, self.dcp_size > 1),
                    ("speculative_algorithm", self.speculative_algorithm, self.speculative),
                )
                if bad
            ]
            if unsupported:
                raise ConfigError(
                    f"{o('enable_pd_role_switch')} does not rebuild role-specific state for "
                    f"{', '.join(unsupported)} (SGLang refuses them together); remove them or drop "
                    f"{o('enable_pd_role_switch')}."
                )
        if self.prefill_only_disable_kv_cache:
            self._check_prefill_only()
        if self.speculative_adaptive_config is not None:
            if not self.speculative_adaptive:
                raise ConfigError(
                    f"{o('speculative_adaptive_config')} configures adaptive speculative decoding, which is off: "
                    f"add {o('speculative_adaptive')}, or drop {o('speculative_adaptive_config')}."
                )
            adaptive_candidate_steps(self.speculative_adaptive_config)  # readable and valid, or a ConfigError
        if self.m3_fp8_attn_gemm and self.kv_cache_dtype != "fp8_e4m3":
            raise ConfigError(
                f"{o('m3_fp8_attn_gemm')} is SGLang's MiniMax-M3 fp8 attention-GEMM mode, which needs "
                f"{o('kv_cache_dtype')} fp8_e4m3 (m3_fp8_attn_gemm_enabled, server_args.py); got "
                f"{self.kv_cache_dtype}. Add {o('kv_cache_dtype')} fp8_e4m3, or drop {o('m3_fp8_attn_gemm')}."
            )
        if self.kv_cache_dtype != "nvfp4" and self.prefill_kv_cache_dequant_dtype != "auto":
            # SGLang 0.5.23 handle_nvfp4_prefill_kv_dequant_dtype (arg_groups/kv_cache_hook.py lines 39-44)
            raise ConfigError(
                f"{o('prefill_kv_cache_dequant_dtype')} applies only with {o('kv_cache_dtype')} nvfp4 (SGLang: "
                f"'--prefill-kv-cache-dequant-dtype applies only with --kv-cache-dtype=nvfp4.'); got "
                f"{self.kv_cache_dtype}. Drop it or use nvfp4."
            )
        if self.kv_cache_dtype != "nvfp4" and self.nvfp4_sm is not None:
            raise ConfigError(
                f"{o('nvfp4_sm')} says which Blackwell GPU runs {o('kv_cache_dtype')} nvfp4, and the KV dtype is "
                f"{self.kv_cache_dtype}: alone it changes nothing. Drop it or use nvfp4."
            )
        if self.mm_feature_cache_mb != 1024 and self.mm_feature_transport not in GPU_MM_FEATURE_TRANSPORTS:
            # SGLang reads SGLANG_MM_FEATURE_CACHE_MB only for a GPU feature transport (ref-000 lines 165-166)
            raise ConfigError(
                f"{o('mm_feature_cache_mb')} {self.mm_feature_cache_mb} sizes the GPU feature pool of "
                f"{o('mm_feature_transport')} cuda_ipc or cuda_vmm, and the transport is "
                f"{self.mm_feature_transport or 'cpu (unset)'}: add {o('mm_feature_transport')} cuda_ipc (or "
                f"cuda_vmm), or drop {o('mm_feature_cache_mb')} (alone it changes nothing)."
            )
        if self.enable_mamba_extra_buffer_lazy and self.disable_overlap_schedule:
            raise ConfigError(
                f"{o('enable_mamba_extra_buffer_lazy')} requires the overlap schedule; "
                f"drop {o('disable_overlap_schedule')} or the lazy extra buffer."
            )

    def _check_prefill_only(self) -> None:
        """SGLang 0.5.23's ``validate_prefill_only_disable_kv_cache_args`` (``arg_groups/kv_cache_hook.py`` lines
        865-960) on the options kvpools has; a draft worker beside the no-op pool is not modelled."""
        o = option
        flag = o("prefill_only_disable_kv_cache")
        kv = self.kv_cache_dtype
        problems = [
            (
                kv in ("fp4_e2m1", "fp4_mx_block16", "nvfp4"),
                f"{o('kv_cache_dtype')} {kv}: the FP4 pool uses a separate allocation path",
            ),
            (kv == "mxfp8", f"{o('kv_cache_dtype')} mxfp8: the MXFP8 pool stores separate scale-factor buffers"),
            (
                not self.disable_radix_cache,
                f"it needs {o('disable_radix_cache')}: the radix cache indexes KV pool slots that hold no data",
            ),
            (
                self.attn_cp_size > 1,
                f"{o('attn_cp_size')} {self.attn_cp_size}: context-parallel attention writes K/V to the pool",
            ),
            (self.enable_hisparse, f"{o('enable_hisparse')}: HiSparse uses a pool family of its own"),
            (
                self.speculative,
                f"{o('speculative_algorithm')} {self.speculative_algorithm}: kvpools does not model a draft worker "
                "beside the no-op pool",
            ),
        ]
        reasons = [reason for bad, reason in problems if bad]
        if reasons:
            raise ConfigError(f"{flag} is refused with {'; '.join(reasons)}. Drop {flag} or change the options.")

    @property
    def adaptive_speculation(self) -> bool:
        """Whether SGLang runs adaptive speculative decoding: asked for, and not refused by
        ``adaptive_unsupported_reason`` (``speculative/adaptive_spec_params.py``), which keeps EAGLE and EAGLE3 with
        top-k 1 (or unset), no DP attention and no ``--enable-multi-layer-eagle`` ("MultiLayerEagleWorkerV2 does not
        implement adaptive"); otherwise SGLang warns and uses the static parameters."""
        return (
            self.speculative_adaptive
            and self.speculative_algorithm in ("EAGLE", "EAGLE3")
            and self.speculative_eagle_topk in (None, 1)
            and not (self.enable_dp_attention and self.dp_size > 1)
            and not self.enable_multi_layer_eagle
        )

    @property
    def max_speculative_num_draft_tokens(self) -> int | None:
        """SGLang 0.5.23's ``max_speculative_num_draft_tokens()``: the largest draft-token count speculative decoding
        may use, ``max(candidate_steps) + 1`` under adaptive speculation (``resolve_max_speculative_num_draft_tokens``,
        ``speculative/spec_info.py`` lines 268-289; 8 with the default config), else ``speculative_num_draft_tokens``.
        The request rows and the decode allocation length are sized by it (``mem_cache/allocation_sizing.py``)."""
        if self.adaptive_speculation and self.speculative_num_draft_tokens is not None:
            return max(
                max(adaptive_candidate_steps(self.speculative_adaptive_config)) + 1, self.speculative_num_draft_tokens
            )
        return self.speculative_num_draft_tokens

    @property
    def mm_reserved_bytes(self) -> int:
        """What a multimodal model's profiled budget reserves for allocations made after the KV pool is sized:
        SGLang 0.5.23's ``mm_runtime_reservation_gb`` (ref-000 lines 156-173): ``SGLANG_VLM_CACHE_SIZE_MB``, plus
        ``SGLANG_MM_FEATURE_CACHE_MB`` when ``mm_feature_transport`` is ``cuda_ipc`` or ``cuda_vmm``, in MiB."""
        mib = self.vlm_cache_size_mb
        if self.mm_feature_transport in GPU_MM_FEATURE_TRANSPORTS:
            mib += self.mm_feature_cache_mb
        return mib << 20

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
        return tuple(
            name
            for name in ENGINE_DEFAULT_OPTIONS
            if is_unset(value := getattr(self, name)) or (value is None and name in NONE_IS_UNSET)
        )

    @property
    def given_max_running_requests(self) -> int | None:
        """``max_running_requests`` as SGLang's memory settings and PD hooks read it: ``None`` when unset or set
        only by a later engine default (:class:`LateDefaultInt`)."""
        value = self.max_running_requests
        return None if isinstance(value, LateDefaultInt) else value

    @property
    def lazy_compaction(self) -> bool:
        """Whether the unified allocators compact lazily (SGLang's default; ``SGLANG_DISABLE_LAZY_COMPACTION``)."""
        return not self.disable_lazy_compaction

    @property
    def speculative(self) -> bool:
        return self.speculative_algorithm is not None

    @property
    def decode_extra_slots(self) -> int:
        """Rows a PD decode node pre-allocates beyond ``max_running_requests`` (``pre_alloc_size``); 0 off one.

        Unset, SGLang 0.5.23's default (``handle_pd_disaggregation``, ``arg_groups/pd_disaggregation_hook.py``
        lines 123-143): twice the requests per DP worker (``max(1, max_running_requests // num_dp_ranks)``,
        ``num_dp_ranks`` = ``dp_size``, replicas or DP attention alike) when that is at most 32, else none.
        Only a decode launch computes it (ref-000 lines 1003-1022); a node with ``enable_pd_role_switch`` that
        is not a decode launch pre-allocates the given ``disaggregation_decode_extra_slots``, else 0
        (``pre_alloc_size or 0``, ref-000 lines 1010-1011).
        """
        if self.disaggregation_mode != "decode":
            return (self.disaggregation_decode_extra_slots or 0) if self.enable_pd_role_switch else 0
        if self.disaggregation_decode_extra_slots is not None:
            return self.disaggregation_decode_extra_slots
        given = self.given_max_running_requests  # the PD hook runs before the later defaults
        if given is None:
            return 0
        per_worker = max(1, given // self.dp_size)
        return 2 * per_worker if per_worker <= 32 else 0

    @property
    def decode_request_pools(self) -> bool:
        """Whether SGLang builds the decode request pools (``DecodeReqToTokenPool``,
        ``HybridMambaDecodeReqToTokenPool``): on a PD decode node, or with ``enable_pd_role_switch`` (ref-000
        line 1007: "A flip-capable prefill needs the decode pool shape")."""
        return self.disaggregation_mode == "decode" or self.enable_pd_role_switch

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


_fields.USER_OPTION_VALUES = (*_fields.USER_OPTION_VALUES, Serving)
