"""kvpools inputs → SGLang oracle params, and the oracle's answer as a real SGLang deployment sees it.

The oracle (``../shared/oracle``, put on ``sys.path`` by ``locate.require_oracle``) runs
SGLang's own ``pool_configurator.py`` / ``kv_cache_configurator.py`` on CPU.
This module:

* builds the oracle's ``params`` from a kvpools ``ModelSpec`` (or, independently
  of kvpools' parser, from an HF ``config.json`` dict), a ``Serving`` and a
  budget (``memory`` = the KV budget, or ``free_memory`` + ``weights_memory`` =
  SGLang's profiling inputs);
* emulates the pipeline-parallel start-up: the oracle runs one PP rank (its MIN
  all-reduce spans a one-process group), so every rank is run, the MIN taken,
  and the own rank re-solved from that MIN with the oracle's constraint path
  (``calculate_pool_sizes_from_max_tokens`` → ``resolve_max_num_reqs`` →
  ``finalize_with_max_running_requests``), which is what each SGLang rank does
  after ``_apply_token_constraints``' all-reduce;
* compares the oracle with ``kvpools_core.pipeline.plan(..., accounting="sglang")``.

Deliberate handling of the oracle's side effects (so ``-W error`` stays clean
and results stay deterministic):

* SGLang's log records (``logging.warning`` on the root logger in
  ``_apply_token_constraints``; ``logger.warning`` in ``resolve_max_num_reqs``)
  are captured by logger filters while the oracle runs and returned as
  ``OracleAnswer.warnings`` — they are compared with kvpools' notes instead of
  being printed.  No Python ``warnings`` are emitted by the paths used here;
  none are filtered.
* ``_profile_available_bytes`` calls ``gc.collect()`` (≈25 ms with torch
  loaded, 97 % of a run); the seed module's ``gc`` is swapped for a no-op while
  the oracle runs.  It touches no number.
* the one-process gloo group for ``pp_size > 1`` is created here (file store in
  a temporary folder) and destroyed by :func:`shutdown` at session end.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType, SimpleNamespace
from typing import Any

import attrs

from kvpools_core.errors import InsufficientMemoryError, KvpoolsError
from kvpools_core.models import resolve_model_source
from kvpools_core.parts.sizing import DEFAULT_MEM_FRACTION_STATIC
from kvpools_core.pipeline import plan as kvpools_plan
from kvpools_core.pipeline import plan_basis
from kvpools_core.registry import get_registry
from kvpools_core.values import ModelSpec, Plan, Serving

from .locate import require_oracle

GiB = 1 << 30

ORACLE_KV_DTYPES = frozenset(
    {"auto", "bf16", "fp16", "fp32", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "fp4_mx_block16", "nvfp4"}
)
FP4_RECIPES = frozenset({"fp4_mx_block16", "nvfp4"})
"""SGLang 0.5.23's fp4 ``--kv-cache-dtype`` names: both resolve to ``float4_e2m1fn_x2`` (``kv_cache_dtype.py`` lines
76-88), the only thing the two sizing files test (``is_float4_e2m1fn_x2``), which the oracle spells fp4_e2m1."""
EAGLE_FAMILY = frozenset({"EAGLE", "EAGLE3", "STANDALONE", "NEXTN"})
DFLASH_FAMILY = frozenset({"DFLASH", "DSPARK"})

NO_MEMORY_FOR_KV = "no_memory_for_kv"
NOT_ENOUGH_MEMORY = "not_enough_memory"

# ModelConfig.get_context_length's keys, in SGLang's order.
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
# Loggers the seed code and the oracle write to.
_LOGGERS = (
    "",
    "sglang_oracle",
    "sglang.srt.mem_cache.kv_cache_configurator",
    "sglang.srt.model_executor.pool_configurator",
)


class NotComparable(Exception):
    """The oracle cannot express this input (e.g. mxfp8 KV, mixed layer shapes)."""


# ---------------------------------------------------------------------------
# the model as the oracle's ModelConfig sees it
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OracleModel:
    """The oracle's ``model`` dict, plus the MTP layers a NEXTN draft uses."""

    params: Mapping[str, Any]
    num_nextn_predict_layers: int = 0


def sglang_model_dtype(config_dtype: str | None) -> str:
    """SGLang's ``--dtype auto``: a float32 (or missing) config dtype is served in float16.

    ``ModelConfig._get_and_verify_dtype``: "Following the common practice, we
    use float16 for float32 models" (gemma: bfloat16).  The KV cache follows
    this dtype under ``--kv-cache-dtype auto``.
    """
    name = (config_dtype or "float32").removeprefix("torch.")
    name = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "float": "float32", "fp32": "float32"}.get(
        name, name
    )
    return "float16" if name == "float32" else name


def model_from_spec(spec: ModelSpec) -> OracleModel:
    """The oracle model of a uniform dense MHA/GQA ``ModelSpec``."""
    first = spec.layers[0]
    shape = (first.kind, first.num_kv_heads, first.head_dim, first.v_head_dim)
    if first.kind != "attention" or any(
        (layer.kind, layer.num_kv_heads, layer.head_dim, layer.v_head_dim) != shape for layer in spec.layers
    ):
        raise NotComparable(f"{spec.name}: the oracle's ModelConfig holds one attention geometry for all layers")
    return OracleModel(
        params={
            "architecture": spec.hf_architectures[0] if spec.hf_architectures else "LlamaForCausalLM",
            "model_type": spec.model_type or "llama",
            "num_hidden_layers": spec.num_layers,
            "num_attention_heads": spec.num_attention_heads or first.num_kv_heads,
            "num_key_value_heads": first.num_kv_heads,
            "head_dim": first.head_dim,
            "v_head_dim": first.v_head_dim,
            "context_len": spec.context_len,
            # A ModelSpec carries the dtype the model is served in (kvpools' parser already applies
            # SGLang's float32 -> float16 rule); see oracle_params for float32.
            "dtype": spec.dtype,
            "is_multimodal": spec.is_multimodal,
        },
        num_nextn_predict_layers=spec.num_nextn_predict_layers,
    )


def model_from_config(config: Mapping[str, Any]) -> OracleModel:
    """The oracle model of an HF ``config.json``, read the way SGLang's ModelConfig reads it.

    Independent of kvpools' parser, so preset tests also check the parsing.
    """
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    if text.get("rope_scaling"):
        raise NotComparable("rope_scaling changes SGLang's context length; not modelled here")
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    context_len = next((int(text[key]) for key in _CONTEXT_KEYS if text.get(key) is not None), 2048)
    return OracleModel(
        params={
            "architecture": (config.get("architectures") or ["LlamaForCausalLM"])[0],
            "model_type": text.get("model_type") or config.get("model_type") or "llama",
            "num_hidden_layers": text["num_hidden_layers"],
            "num_attention_heads": heads,
            "num_key_value_heads": text.get("num_key_value_heads") or heads,
            "head_dim": head_dim,
            "v_head_dim": text.get("v_head_dim") or head_dim,
            "context_len": context_len,
            "dtype": sglang_model_dtype(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype")),
            "is_multimodal": text is not config,
        },
        num_nextn_predict_layers=int(text.get("num_nextn_predict_layers") or 0),
    )


def preset_model(name: str) -> OracleModel:
    """The oracle model of a kvpools preset, read from its config.json (not through kvpools' parser)."""
    config, _source, _name = resolve_model_source(name, get_registry())
    return model_from_config(config)


# ---------------------------------------------------------------------------
# params
# ---------------------------------------------------------------------------


def oracle_params(
    model: OracleModel,
    serving: Serving,
    *,
    memory: int | None = None,
    free_memory: int | None = None,
    weights_memory: int = 0,
    pp_rank: int | None = None,
    max_tokens: int | None = None,
) -> dict[str, Any]:
    """The oracle's params for one rank.

    ``memory`` is the KV budget (``available_bytes``).  ``free_memory`` is
    kvpools' free memory *before* the weights load: SGLang's
    ``pre_model_load_memory``; SGLang's profiled ``available_gpu_memory`` is
    what is left *after* the weights, ``free_memory - weights_memory``.
    ``max_tokens`` selects the constraint path.
    """
    if serving.kv_cache_dtype not in ORACLE_KV_DTYPES:
        raise NotComparable(f"the oracle has no kv_cache_dtype {serving.kv_cache_dtype!r}")
    if (memory is None) == (free_memory is None):
        raise ValueError("pass exactly one of memory= or free_memory=")
    m = dict(model.params)
    kv_cache_dtype = "fp4_e2m1" if serving.kv_cache_dtype in FP4_RECIPES else serving.kv_cache_dtype
    if m.get("dtype") == "float32":
        # The oracle serves bfloat16/float16 models only; a model served in float32 (SGLang
        # --dtype float32) caches float32 under --kv-cache-dtype auto.
        m["dtype"] = "bfloat16"
        if kv_cache_dtype == "auto":
            kv_cache_dtype = "fp32"
    if serving.context_length is not None:
        m["context_len"] = serving.context_length  # --context-length overrides ModelConfig.context_len
    algorithm = serving.speculative_algorithm
    draft_layers = serving.speculative_draft_num_layers
    if algorithm == "NEXTN" and draft_layers is None:
        draft_layers = model.num_nextn_predict_layers or None  # the MTP module is the draft model
    env: dict[str, Any] = {
        "SGLANG_SWA_EVICTION_INTERVAL": serving.swa_eviction_interval,
        "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": int(serving.mamba_skip_decode_lock),
        "SGLANG_VLM_CACHE_SIZE_MB": serving.vlm_cache_size_mb,
        "SGLANG_MM_FEATURE_CACHE_MB": serving.mm_feature_cache_mb,
    }
    if serving.pp_layer_partition is not None:
        env["SGLANG_PP_LAYER_PARTITION"] = ",".join(str(n) for n in serving.pp_layer_partition)
    params: dict[str, Any] = {
        "model": m,
        "kv_cache_dtype": kv_cache_dtype,
        "page_size": serving.page_size,
        "parallel": {
            "tp_size": serving.tp_size,
            "dp_size": serving.dp_size,
            "enable_dp_attention": serving.enable_dp_attention,
            "attn_cp_size": serving.attn_cp_size,
            "dcp_size": serving.dcp_size,
            "pp_size": serving.pp_size,
            "pp_rank": serving.pp_rank if pp_rank is None else pp_rank,
        },
        "server_args": {
            "max_running_requests": serving.max_running_requests,
            "max_total_tokens": serving.max_total_tokens,
            # unset: the 0.9 a stated or measured kvpools budget uses
            "mem_fraction_static": serving.mem_fraction_static or DEFAULT_MEM_FRACTION_STATIC,
            "chunked_prefill_size": serving.chunked_prefill_size,
            # SGLang's server args as handle_pd_disaggregation resolves them on a decode node
            "disable_radix_cache": serving.radix_cache_disabled,
            "disable_overlap_schedule": serving.disable_overlap_schedule,
            "speculative_algorithm": algorithm,
            "speculative_num_steps": serving.speculative_num_steps,
            "speculative_eagle_topk": serving.speculative_eagle_topk,
            "speculative_num_draft_tokens": serving.speculative_num_draft_tokens,
            "disaggregation_mode": serving.disaggregation_mode,
            "disaggregation_decode_extra_slots": serving.decode_extra_slots,
            "enable_pd_role_switch": serving.enable_pd_role_switch,
            "swa_full_tokens_ratio": serving.swa_full_tokens_ratio,
            "mamba_full_memory_ratio": serving.mamba_full_memory_ratio,
            "max_mamba_cache_size": serving.max_mamba_cache_size,
            "enable_mamba_extra_buffer": serving.enable_mamba_extra_buffer,
            "enable_mamba_extra_buffer_lazy": serving.enable_mamba_extra_buffer_lazy,
            "dsa_prefill_backend": serving.dsa_prefill_backend,
            "dsa_decode_backend": serving.dsa_decode_backend,
            "enable_dsa_cache_layer_split": serving.enable_dsa_cache_layer_split,
            "mm_feature_transport": serving.mm_feature_transport,
        },
        "eagle_draft_num_layers": draft_layers if algorithm in EAGLE_FAMILY else None,
        "dflash_draft_num_layers": draft_layers if algorithm in DFLASH_FAMILY else None,
        "env": env,
    }
    if memory is not None:
        # kvpools' --memory is the KV budget after every reservation; SGLang's profiling would
        # take the multimodal reservation out of `available_bytes` once more.
        m["is_multimodal"] = False
        params["available_bytes"] = int(memory)
    else:
        assert free_memory is not None
        params["available_gpu_memory_gb"] = (free_memory - weights_memory) / GiB
        params["pre_model_load_memory_gb"] = free_memory / GiB
    if max_tokens is not None:
        params["max_tokens"] = int(max_tokens)
    return params


# ---------------------------------------------------------------------------
# running the oracle
# ---------------------------------------------------------------------------

_PG_DIR: str | None = None


def _oracle() -> ModuleType:
    require_oracle()  # skips (a user's clone) or fails (CI) when ../shared is missing
    from sglang_oracle import oracle

    return oracle


def _ensure_process_group() -> None:
    """The seed's PP all-reduce needs a process group; a one-process gloo one, owned here."""
    global _PG_DIR
    import torch.distributed as dist

    if dist.is_initialized():
        return
    _PG_DIR = tempfile.mkdtemp(prefix="kvpools_oracle_pg_")
    dist.init_process_group(backend="gloo", init_method=f"file://{_PG_DIR}/store", world_size=1, rank=0)


def shutdown() -> None:
    """Destroy the process group created by :func:`_ensure_process_group` (session teardown)."""
    global _PG_DIR
    if _PG_DIR is None:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    shutil.rmtree(_PG_DIR, ignore_errors=True)
    _PG_DIR = None


class _Capture(logging.Filter):
    """Keeps WARNING+ records for the caller and stops every record from reaching a handler."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            self.messages.append(record.getMessage())
        return False


@contextlib.contextmanager
def _captured_logs() -> Iterator[list[str]]:
    capture = _Capture()
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    root = logging.getLogger()
    # `logging.warning()` calls basicConfig() when the root logger has no handler.
    guard = logging.NullHandler() if not root.handlers else None
    if guard is not None:
        root.addHandler(guard)
    for logger in loggers:
        logger.addFilter(capture)
    try:
        yield capture.messages
    finally:
        for logger in loggers:
            logger.removeFilter(capture)
        if guard is not None:
            root.removeHandler(guard)


@contextlib.contextmanager
def _no_gc_collect(kvc_module: ModuleType) -> Iterator[None]:
    saved = kvc_module.__dict__.get("gc")
    kvc_module.__dict__["gc"] = SimpleNamespace(collect=lambda *args, **kwargs: 0)
    try:
        yield
    finally:
        kvc_module.__dict__["gc"] = saved


def run_oracle(params: Mapping[str, Any]) -> dict[str, Any]:
    """One oracle run; fails loudly if the params were rejected or a dummy was reached."""
    oracle = _oracle()
    _pool, kvc_module = oracle.load_seeds()
    if int(params.get("parallel", {}).get("pp_size", 1)) > 1:
        _ensure_process_group()
    with _no_gc_collect(kvc_module), _captured_logs() as messages:
        out = oracle.run(dict(params))
    out["warnings"] = list(messages)
    error = out.get("error") or {}
    if error.get("stage") == "params":
        raise AssertionError(f"the oracle rejected the adapter's params: {error['message']}\n{params}")
    if out.get("dummy_calls") or out.get("unknown_env_reads"):
        raise AssertionError(
            f"the oracle reached a fabricated function (dummy_calls={out.get('dummy_calls')}, "
            f"unknown_env_reads={out.get('unknown_env_reads')}); its numbers cannot be trusted\n{params}"
        )
    return out


@dataclass(frozen=True)
class OracleAnswer:
    """What SGLang's start-up decides for the requested rank (or how it fails)."""

    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    cell_size: int | None = None
    error: str | None = None
    message: str = ""
    warnings: tuple[str, ...] = ()
    stage_tokens: tuple[int, ...] = ()
    raw: tuple[Mapping[str, Any], ...] = field(default=(), repr=False)


def _failure(out: Mapping[str, Any], params: Mapping[str, Any]) -> OracleAnswer:
    error = out["error"]
    message = error["message"]
    if error["type"] == "ValueError" and message.startswith("Loaded weights leave no GPU memory"):
        kind = NO_MEMORY_FOR_KV
    elif error["type"] == "RuntimeError" and message.startswith("Not enough memory"):
        kind = NOT_ENOUGH_MEMORY
    elif error["type"] == "ZeroDivisionError" and params.get("available_bytes") == 0:
        # An explicit budget of 0 B: `_profile_available_bytes` takes its `rest_memory <= 0`
        # branch and its suggested fraction divides by the pre-load memory, 0 on this path.
        kind = NOT_ENOUGH_MEMORY
    else:
        raise AssertionError(f"SGLang's sizing failed in an unexpected way at {error.get('where')}: {error}")
    return OracleAnswer(error=kind, message=message, cell_size=out.get("cell_size"), raw=(out,))


def oracle_plan(
    model: OracleModel,
    serving: Serving,
    *,
    memory: int | None = None,
    free_memory: int | None = None,
    weights_memory: int = 0,
) -> OracleAnswer:
    """SGLang's answer for ``serving.pp_rank``, every pipeline stage started together."""
    budget = {"memory": memory, "free_memory": free_memory, "weights_memory": weights_memory}
    if serving.pp_size == 1:
        params = oracle_params(model, serving, **budget)
        out = run_oracle(params)
        if "error" in out:
            return _failure(out, params)
        config = out["memory_pool_config"]
        return OracleAnswer(
            max_total_num_tokens=config["max_total_num_tokens"],
            max_running_requests=config["max_running_requests"],
            cell_size=out["cell_size"],
            warnings=tuple(out["warnings"]),
            stage_tokens=(config["max_total_num_tokens"],),
            raw=(out,),
        )
    # Every rank profiles, caps and page-aligns on its own (its all-reduce here is over itself)...
    stage_params = [oracle_params(model, serving, pp_rank=rank, **budget) for rank in range(serving.pp_size)]
    stages = [run_oracle(params) for params in stage_params]
    for params, out in zip(stage_params, stages, strict=True):
        if "error" in out:  # that rank's start-up fails, and with it the server
            return _failure(out, params)
    stage_tokens = tuple(out["memory_pool_config"]["max_total_num_tokens"] for out in stages)
    # ...then `_apply_token_constraints` all-reduces MIN over the PP group and every rank
    # re-derives its pools from it (`calculate_pool_sizes_from_max_tokens`) before
    # `resolve_max_num_reqs` / `finalize_with_max_running_requests`: the constraint path.
    synced = min(stage_tokens)
    params = oracle_params(model, serving, max_tokens=synced, **budget)
    out = run_oracle(params)
    if "error" in out:
        return _failure(out, params)
    config = out["memory_pool_config"]
    return OracleAnswer(
        max_total_num_tokens=config["max_total_num_tokens"],
        max_running_requests=config["max_running_requests"],
        cell_size=stages[serving.pp_rank]["cell_size"],
        warnings=tuple(stages[serving.pp_rank]["warnings"]) + tuple(out["warnings"]),
        stage_tokens=stage_tokens,
        raw=(*stages, out),
    )


# ---------------------------------------------------------------------------
# the differential check
# ---------------------------------------------------------------------------


def describe(model: ModelSpec | str, serving: Serving, budget: Mapping[str, Any]) -> str:
    """A compact repro line: the model, the non-default serving options, the budget."""
    if isinstance(model, ModelSpec):
        first = model.layers[0]
        shown = (
            f"ModelSpec(layers={model.num_layers}, heads={model.num_attention_heads}, kv_heads={first.num_kv_heads}, "
            f"head_dim={first.head_dim}, v_head_dim={first.v_head_dim}, dtype={model.dtype!r}, "
            f"context_len={model.context_len}, nextn={model.num_nextn_predict_layers}, "
            f"multimodal={model.is_multimodal})"
        )
    else:
        shown = repr(model)
    defaults = Serving()
    changed = {
        f.name: getattr(serving, f.name)
        for f in attrs.fields(Serving)
        if getattr(serving, f.name) != getattr(defaults, f.name)
    }
    args = ", ".join(f"{k}={v!r}" for k, v in changed.items())
    spent = {k: v for k, v in budget.items() if v is not None and not (k == "weights_memory" and v == 0)}
    return f"model={shown}\nserving=Serving({args})\nbudget={spent}"


_SUGGESTED = re.compile(r"above (\d+\.\d{3})")
_MINIMUM = re.compile(r"minimum viable = 1 - available/pre = (-?\d+\.\d{4})")


def suggested_fraction(message: str) -> tuple[str, str]:
    """(suggested, minimum) --mem-fraction-static figures of a 'no memory for the KV cache' message."""
    suggested, minimum = _SUGGESTED.search(message), _MINIMUM.search(message)
    assert suggested and minimum, f"no suggested --mem-fraction-static in: {message}"
    return suggested.group(1), minimum.group(1)


def _check_fraction_advice(
    model: ModelSpec | str, serving: Serving, budget: Mapping[str, Any], ours: str, sglang: str, case: str
) -> None:
    """kvpools' advice for "weights leave no memory" is SGLang's, except where SGLang's cannot be followed.

    SGLang's minimum ignores reservations (the VLM cache) and may exceed 1; kvpools counts them and
    says when no fraction helps. Each kvpools claim is checked by planning with what it advises.
    """

    def profiled_with(fraction: float) -> str | None:
        """None when ``fraction`` leaves memory for the KV cache (however little), else kvpools' error."""
        try:
            kvpools_plan(model, attrs.evolve(serving, mem_fraction_static=fraction), **budget)
        except InsufficientMemoryError as exc:
            no_room = "leave no memory for the KV cache" in str(exc) or "can leave room" in str(exc)
            return str(exc) if no_room else None
        return None

    if "can leave room for the KV cache" in ours:  # kvpools: no fraction helps; not even 1.0
        assert profiled_with(1.0) is not None, f"kvpools says no fraction helps, but 1.0 does\n{ours}\n{case}"
        return
    advised = 1.0 if "to 1.0 (minimum viable" in ours else float(suggested_fraction(ours)[0])
    assert profiled_with(advised) is None, f"kvpools' advice {advised} does not help\n{ours}\n{case}"
    if advised < 1 and "and the reservations" not in ours:  # then it is SGLang's figure exactly
        assert suggested_fraction(ours) == suggested_fraction(sglang), (
            f"suggested --mem-fraction-static differs\nkvpools: {ours}\nSGLang:  {sglang}\n{case}"
        )


def server_args_resolved(model: ModelSpec | str, serving: Serving, draft_model: str | ModelSpec | None) -> Serving:
    """``serving`` as SGLang's server-argument hooks leave it before its configurator runs.

    The oracle runs the specification's configurator; the hooks that fill unset options first (the per-model
    overrides, the speculative handlers' 48 requests: ``arg_groups/``) are not in those files, and kvpools
    applies them as engine defaults (:func:`kvpools_core.pipeline.engine_defaults.apply_engine_defaults`).  So
    the oracle is asked with kvpools' resolved options; a serving kvpools refuses is passed on as given."""
    try:
        return plan_basis(model, serving, draft_model=draft_model).serving
    except KvpoolsError:
        return serving


def compare(
    model: ModelSpec | str,
    oracle_model: OracleModel,
    serving: Serving,
    *,
    memory: int | None = None,
    free_memory: int | None = None,
    weights_memory: int = 0,
    draft_model: str | ModelSpec | None = None,
) -> tuple[OracleAnswer, Plan | InsufficientMemoryError]:
    """Plan with kvpools (``accounting="sglang"``) and ask the oracle; assert they agree.

    ``draft_model`` is kvpools' ``--speculative-draft-model-path``; the oracle is
    asked with ``serving.speculative_draft_num_layers`` (SGLang's
    ``eagle_draft_num_layers``: the draft's layer count, all it reads of the draft).

    Agreement: the same ``max_total_num_tokens``, ``max_running_requests`` and
    cell size; SGLang's capacity warnings among kvpools' notes (single stage);
    kvpools raises ``InsufficientMemoryError`` where SGLang fails, with the same
    suggested ``--mem-fraction-static`` for the profiling error.
    """
    serving = attrs.evolve(serving, accounting="sglang")
    budget = {"memory": memory, "free_memory": free_memory, "weights_memory": weights_memory}
    want = oracle_plan(oracle_model, server_args_resolved(model, serving, draft_model), **budget)
    got: Plan | InsufficientMemoryError
    try:
        got = kvpools_plan(model, serving, **budget, draft_model=draft_model)
    except InsufficientMemoryError as exc:
        got = exc
    case = describe(got.model if isinstance(got, Plan) else model, serving, budget)

    if want.error == NO_MEMORY_FOR_KV:
        assert isinstance(got, InsufficientMemoryError), (
            f"SGLang fails ({want.message}) but kvpools plans {_summary(got)}\n{case}"
        )
        _check_fraction_advice(model, serving, budget, str(got), want.message, case)
    elif want.error == NOT_ENOUGH_MEMORY:
        assert isinstance(got, InsufficientMemoryError), (
            f"SGLang fails ({want.message}) but kvpools plans {_summary(got)}\n{case}"
        )
        if serving.pp_size == 1:  # with PP, kvpools may first meet its own stage's "no request" error
            assert "Not enough memory" in str(got), f"kvpools: {got}\n{case}"
    elif want.max_running_requests == 0:
        # Known, reported divergence: SGLang starts with max_running_requests=0 (a
        # server that can never admit a request); kvpools refuses the plan.
        assert isinstance(got, InsufficientMemoryError), (
            f"SGLang gives max_running_requests=0; kvpools plans {_summary(got)}\n{case}"
        )
    else:
        assert isinstance(got, Plan), (
            f"kvpools raised {type(got).__name__}: {got}\nSGLang gives tokens={want.max_total_num_tokens} "
            f"requests={want.max_running_requests} cell={want.cell_size}\n{case}"
        )
        ours = (got.max_total_num_tokens, got.max_running_requests, got.cell.sglang_bytes_per_token)
        theirs = (want.max_total_num_tokens, want.max_running_requests, want.cell_size)
        assert ours == theirs, (
            f"(max_total_num_tokens, max_running_requests, cell size) kvpools {ours} != SGLang {theirs} "
            f"(SGLang stage tokens {want.stage_tokens})\n{case}"
        )
        if serving.pp_size == 1:
            missing = [w for w in want.warnings if w not in got.sizing.notes]
            assert not missing, f"SGLang warns {missing}; kvpools notes {list(got.sizing.notes)}\n{case}"
    return want, got


def _summary(got: Plan | InsufficientMemoryError) -> str:
    if isinstance(got, Plan):
        return (
            f"tokens={got.max_total_num_tokens} requests={got.max_running_requests} "
            f"cell={got.cell.sglang_bytes_per_token}"
        )
    return f"{type(got).__name__}: {got}"
