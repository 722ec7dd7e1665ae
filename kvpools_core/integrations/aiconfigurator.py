"""aiconfigurator's ``estimate_num_gpu_blocks``, answered by a kvpools plan: a drop-in for Dynamo users.

Dynamo's mocker and replay size their KV cache with
``aiconfigurator.sdk.memory.estimate_num_gpu_blocks`` (an alias of
``aiconfigurator_core.sdk.memory.estimate_num_gpu_blocks``; aiconfigurator-core 0.12.0, and
``aic-core/src/aiconfigurator_core/sdk/memory.py`` at ai-dynamo/aiconfigurator commit
``095f58a51c4ca8e61b66ec108d86f223f8d559ce``).  It returns ``floor(total_kv_size_tokens /
scheduler_block_size)`` for one rank.  :func:`estimate_num_gpu_blocks` here has the same signature and returns
the same quantity from SGLang's own sizing: ``max_total_num_tokens // page_size`` of a plan under SGLang's
accounting (``Serving.accounting="sglang"``: SGLang's numbers exactly), what Dynamo's SGLang worker publishes
as ``total_kv_blocks``.

The arguments map onto SGLang's (``docs/capacity-record.md`` has the table):

* ``model_path`` — what :func:`kvpools_core.plan` takes: a ``config.json``, its directory or a preset; the
  weights are estimated from it (:func:`kvpools_core.pipeline.weights.estimate_weights`), so it must carry the full
  shapes (a real ``config.json``; the bundled presets keep only the KV fields and are refused, naming the field).
* ``gpu_memory_capacity_bytes_override`` — the GPU's memory, needed: kvpools has no catalogue of aiconfigurator's
  ``system`` names, so ``system`` alone is refused, naming both.
* ``memory_fraction_value`` — ``--mem-fraction-static``.  The budget is SGLang's profile
  (``_profile_available_bytes``): free memory after the weights load (``capacity - weights``) minus
  ``capacity x (1 - mem_fraction_static)`` of runtime slack, i.e. ``capacity x mem_fraction_static - weights``,
  aiconfigurator's ``of_total`` formula with SGLang's own non-KV term (the weights; activations are in the slack).
* ``scheduler_block_size`` — ``--page-size``; ``max_num_tokens`` — ``--chunked-prefill-size`` (the most tokens
  one prefill batch runs; it sizes a sliding-window pool's chunk reserve); ``max_batch_size`` —
  ``--max-running-requests`` (it sizes the request table and, on hybrid models, the state or window pools: Dynamo's
  mocker passes 1 because aiconfigurator ignores it, and kvpools then answers for an engine run with 1).
* ``tp_size`` / ``moe_ep_size`` / ``moe_tp_size`` — ``--tp-size`` / ``--ep-size``, with ``moe_tp_size`` (when
  given) ``tp_size / moe_ep_size`` as SGLang derives it; ``kvcache_quant_mode`` — ``--kv-cache-dtype``
  (``bfloat16`` -> ``bfloat16``, ``fp8`` -> ``fp8_e4m3``); ``tolerance_fraction`` — the KV budget cut to
  ``floor(budget x (1 - t))`` bytes, as aiconfigurator cuts its KV bytes.

What kvpools cannot honour is refused with a :class:`~kvpools_core.errors.ConfigError` (a ``ValueError``, as
aiconfigurator raises) naming the argument: another ``backend`` or fraction kind, ``pp_size`` and
``attention_dp_size`` other than 1 (the weights estimate models plain TP/EP sharding of one stage),
``nextn`` (give the speculative options to :func:`kvpools_core.plan`), the gemm/moe/fmha/comm quant modes and
``systems_path`` (the weights follow the config's own ``quantization_config``), ``int8`` KV, a ``backend_version``
outside SGLang 0.5; so is a budget the weights leave empty (aiconfigurator's "no KV budget").
``naive_kv_reservation``, ``allow_naive_fallback`` and ``allow_hf_config_download`` concern
aiconfigurator's fallback for models it cannot build; kvpools plans a model or refuses it, never downloads, and
checks ``naive_kv_reservation``'s range as aiconfigurator does.
"""

from __future__ import annotations

import math

import attrs

from kvpools_core.errors import ConfigError, InsufficientMemoryError
from kvpools_core.values import Serving

__all__ = ["estimate_num_gpu_blocks"]

SOURCE = (
    "aiconfigurator_core.sdk.memory.estimate_num_gpu_blocks (aiconfigurator-core 0.12.0; "
    "github.com/ai-dynamo/aiconfigurator/blob/095f58a51c4ca8e61b66ec108d86f223f8d559ce/"
    "aic-core/src/aiconfigurator_core/sdk/memory.py)"
)
"""The function whose signature and meaning :func:`estimate_num_gpu_blocks` reproduces."""
_DEFAULT_NAIVE_KV_RESERVATION = 0.80
"""aiconfigurator's default for ``naive_kv_reservation`` (``memory.py``, ``_DEFAULT_NAIVE_KV_RESERVATION``)."""
_KV_QUANT_MODES = {"bfloat16": "bfloat16", "fp8": "fp8_e4m3"}
"""aiconfigurator's ``KVCacheQuantMode`` names (``sdk/common.py``) and SGLang's ``--kv-cache-dtype`` for each."""
_SGLANG_SERIES = "0.5"
"""The SGLang release series kvpools' sizing follows (exact against 0.5.23, ``docs/sizing.md``)."""


def _refuse(argument: str, value: object, why: str) -> ConfigError:
    return ConfigError(f"estimate_num_gpu_blocks: {argument}={value!r} cannot be honoured by kvpools: {why}")


def _fraction(argument: str, value: float, *, upper_open: bool = False) -> float:
    number = float(value)
    high_ok = number < 1.0 if upper_open else number <= 1.0
    if not (math.isfinite(number) and number >= 0.0 and high_ok):
        interval = "[0, 1)" if upper_open else "[0, 1]"
        raise ConfigError(f"estimate_num_gpu_blocks: {argument} must be finite and in {interval}, got {value!r}.")
    return number


def _positive(argument: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value <= 0:
        raise ConfigError(f"estimate_num_gpu_blocks: {argument} must be a positive integer, got {value!r}.")
    return int(value)


def estimate_num_gpu_blocks(
    model_path: str,
    system: str,
    backend: str,
    backend_version: str | None = None,
    *,
    scheduler_block_size: int,
    max_num_tokens: int,
    max_batch_size: int,
    memory_fraction_kind: str,
    memory_fraction_value: float,
    tp_size: int = 1,
    pp_size: int = 1,
    attention_dp_size: int = 1,
    moe_tp_size: int | None = None,
    moe_ep_size: int | None = None,
    gemm_quant_mode: str | None = None,
    moe_quant_mode: str | None = None,
    kvcache_quant_mode: str | None = None,
    fmha_quant_mode: str | None = None,
    comm_quant_mode: str | None = None,
    nextn: int = 0,
    systems_path: str | None = None,
    gpu_memory_capacity_bytes_override: int | None = None,
    tolerance_fraction: float | None = None,
    naive_kv_reservation: float = _DEFAULT_NAIVE_KV_RESERVATION,
    allow_naive_fallback: bool = False,
    allow_hf_config_download: bool = False,
) -> int:
    """KV blocks of ``scheduler_block_size`` tokens one rank holds: SGLang's ``max_total_num_tokens // page``.

    Same signature and meaning as aiconfigurator's (:data:`SOURCE`); the module docstring maps every argument.
    """
    del allow_naive_fallback, allow_hf_config_download  # kvpools never falls back nor downloads (module docstring)
    from kvpools_core.pipeline import plan
    from kvpools_core.pipeline.weights import estimate_weights

    if backend != "sglang":
        raise _refuse("backend", backend, "kvpools sizes SGLang's pools only; pass backend='sglang'.")
    if memory_fraction_kind != "of_total":
        raise _refuse("memory_fraction_kind", memory_fraction_kind, "SGLang's fraction is 'of_total'.")
    if backend_version is not None and not str(backend_version).startswith(f"{_SGLANG_SERIES}."):
        raise _refuse(
            "backend_version", backend_version, f"kvpools follows SGLang {_SGLANG_SERIES}.x; pass None or 0.5.N."
        )
    fraction = _fraction("memory_fraction_value", memory_fraction_value)
    _fraction("naive_kv_reservation", naive_kv_reservation)
    tolerance = (
        None if tolerance_fraction is None else _fraction("tolerance_fraction", tolerance_fraction, upper_open=True)
    )
    page = _positive("scheduler_block_size", scheduler_block_size)
    for argument, value in (("pp_size", pp_size), ("attention_dp_size", attention_dp_size)):
        if value != 1:
            raise _refuse(
                argument, value, "the weights estimate models plain TP/EP sharding of one pipeline stage; pass 1."
            )
    if nextn:
        raise _refuse("nextn", nextn, "pass the speculative options (NEXTN draft layers) to kvpools_core.plan.")
    for argument, mode in (
        ("gemm_quant_mode", gemm_quant_mode),
        ("moe_quant_mode", moe_quant_mode),
        ("fmha_quant_mode", fmha_quant_mode),
        ("comm_quant_mode", comm_quant_mode),
        ("systems_path", systems_path),
    ):
        if mode is not None:
            raise _refuse(argument, mode, "the weights follow the config's own quantization_config; pass None.")
    kv_dtype = "auto"
    if kvcache_quant_mode is not None:
        if kvcache_quant_mode not in _KV_QUANT_MODES:
            raise _refuse(
                "kvcache_quant_mode", kvcache_quant_mode, f"SGLang's KV dtypes map from {sorted(_KV_QUANT_MODES)}."
            )
        kv_dtype = _KV_QUANT_MODES[kvcache_quant_mode]
    if gpu_memory_capacity_bytes_override is None:
        raise _refuse(
            "system",
            system,
            "kvpools has no catalogue of aiconfigurator's systems; pass gpu_memory_capacity_bytes_override "
            "(the GPU's memory in bytes).",
        )
    capacity = _positive("gpu_memory_capacity_bytes_override", gpu_memory_capacity_bytes_override)
    tp = _positive("tp_size", tp_size)
    ep = 1 if moe_ep_size is None else _positive("moe_ep_size", moe_ep_size)
    if tp % ep:
        raise _refuse("moe_ep_size", moe_ep_size, f"SGLang's --ep-size divides --tp-size ({tp}).")
    if moe_tp_size is not None and moe_tp_size != tp // ep:
        raise _refuse("moe_tp_size", moe_tp_size, f"SGLang's MoE TP is tp_size / moe_ep_size = {tp // ep}.")
    if fraction == 0.0:
        raise ConfigError("estimate_num_gpu_blocks: memory_fraction_value 0 leaves no KV budget.")

    serving = Serving(
        tp_size=tp,
        page_size=page,
        kv_cache_dtype=kv_dtype,
        mem_fraction_static=fraction,
        chunked_prefill_size=_positive("max_num_tokens", max_num_tokens),
        max_running_requests=_positive("max_batch_size", max_batch_size),
        accounting="sglang",
    )
    weights = estimate_weights(model_path, serving, ep_size=ep).bytes_per_rank
    try:
        sized = plan(model_path, serving, free_memory=capacity, weights_memory=weights)
        if tolerance is not None:
            cut = math.floor(sized.budget.budget_bytes * (1.0 - tolerance))  # the KV budget itself: no fraction
            sized = plan(model_path, attrs.evolve(serving, mem_fraction_static=None), memory=cut)
    except InsufficientMemoryError as error:  # aiconfigurator raises ValueError("no KV budget: ...") here
        raise ConfigError(
            f"estimate_num_gpu_blocks: no KV budget (memory_fraction_value is SGLang's mem_fraction_static, "
            f"gpu_memory_capacity_bytes_override its free memory): {error}"
        ) from error
    return sized.max_total_num_tokens // page
