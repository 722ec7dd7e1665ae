"""Whole-GPU accuracy: each tool's KV-cache prediction from the GPU against the collected start-up logs (issue 34).

    python -m benchmarks.whole_gpu_accuracy [--peers-venv /tmp/truth34-peers] [--json out.json]

For every vLLM record of ``benchmarks/data/startup_logs.json`` that logs the KV budget (``Available KV cache
memory``) or its token count, on a catalogue GPU (or one whose total the log prints), with the
``--gpu-memory-utilization`` it ran with, each tool predicts the KV GiB, the KV tokens and the max concurrency at
the run's ``max_model_len``; the errors
(``(predicted - logged) / logged``) are reported per tool, per engine version and per split (calibration /
held out / neither), with every run a tool refuses and why.  The tools:

* ``kvpools-before``: kvpools' whole-GPU budget as it is without a runtime profile: the catalogue's nvidia-smi
  total, and nothing outside the KV cache but the weights;
* ``kvpools-runtime``: the same plus ``kvpools_core.engines.vllm.runtime_memory`` (torch's total, the activation
  peak, the non-torch memory, the CUDA-graph term) from the engine version's calibrated profile, or, for a version
  without one, the nearest (``vllm-0.19`` before 0.21, ``vllm-0.33`` from 0.21 on, when vLLM began subtracting the
  CUDA-graph estimate), which the run's ``profile`` says;
* ``kvpools-sglang``: SGLang records, ``kvpools_core.plan`` under ``--accounting sglang`` on the log's GPU (SGLang
  0.5.23's ``_profile_available_bytes`` with its default or the logged ``--mem-fraction-static``): the
  ``max_total_num_tokens`` against the logged ``#tokens``, and a refusal where SGLang refused to start;
* ``llm-d-planner`` 0.3.3 (``--peers-venv``, run in its own venv): ``allocatable_kv_cache_memory``'s terms
  (``available_gpu_memory`` x utilization, its per-architecture activation constants, its non-torch constants)
  and its per-token ``KVCacheDetail``;
* ``aiconfigurator`` 0.12.0 (``--peers-venv``, ``benchmarks/peers/aiconfigurator_runner.py``): aiconfigurator-core's
  ``estimate_kv_cache`` (``of_total``: its own weights, activation and runtime-overhead model on its system's
  capacity) for vLLM records, and for SGLang records with the logged or SGLang's default fraction, on the
  checkpoint's ``config.json``, with the engine version its database holds (vLLM 0.24.0, SGLang 0.5.14).

Each kvpools tool runs twice: with the weights the log states (isolating the memory outside the weights), and
with kvpools' own weights estimate (the GPU alone).  llm-d-planner reads weights from the Hugging Face hub, which
this benchmark cannot reach, so it is given the logged weights.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import attrs

from benchmarks.startup_logs import StartupLog, load_startup_logs
from kvpools_core.engines.vllm import VllmLimits, plan_kv_cache
from kvpools_core.engines.vllm.budget import available_kv_cache_memory
from kvpools_core.engines.vllm.layouts import layout_for_version
from kvpools_core.engines.vllm.model import worker_kv_cache_specs
from kvpools_core.engines.vllm.planning import mamba_cache_mode_of
from kvpools_core.engines.vllm.runtime_memory import (
    PROFILE_ALIASES,
    PROFILE_VERSIONS,
    GraphShape,
    ModelShape,
    cudagraph_capture_sizes,
    cudagraph_memory,
    estimate_runtime_memory,
    graph_shape_of,
    load_profile,
    model_shape_of,
    version_key,
    vision_shape_of,
    vocab_size_of,
)
from kvpools_core.errors import ConfigError, KvpoolsError
from kvpools_core.models import load_model, served_model
from kvpools_core.pipeline.gpus import custom_gpu, find_gpu, sglang_chunked_prefill_size, sglang_memory_defaults
from kvpools_core.pipeline.sglang_profile import load_sglang_profile
from kvpools_core.registry import Registry, get_registry
from kvpools_core.values import GPU, Serving, is_unset

GiB = 1 << 30
ROOT = Path(__file__).resolve().parent.parent
PEER_RUNNER = Path(__file__).parent / "peers" / "llmd_planner_runner.py"
AIC_RUNNER = Path(__file__).parent / "peers" / "aiconfigurator_runner.py"


@attrs.frozen
class Prediction:
    kv_gib: float
    tokens: int | None
    concurrency: float | None


@attrs.frozen
class Refusal:
    reason: str


def logged_concurrency(log: StartupLog) -> float | None:
    """The logged max concurrency, SGLang's logged ``max_running_requests``, or (vLLM 0.19's one-group token line being
    ``int(concurrency x max_model_len)``) the logged tokens over ``max_model_len``."""
    if log.logged.get("max_concurrency") is not None:
        return float(log.logged["max_concurrency"])
    if log.engine == "sglang":
        running = log.logged.get("max_running_requests")
        return None if running is None else float(running)
    tokens, model_len = log.logged.get("kv_tokens"), log.flag("max_model_len")
    if tokens is not None and model_len:
        return float(tokens) / float(model_len)
    return None


def logged_kv_gib(log: StartupLog) -> float | None:
    """The logged KV budget: vLLM's ``Available KV cache memory``, or SGLang's ``KV Cache is allocated`` K + V
    sizes, or its one combined ``KV size`` where the log states K + V together (SGLang's "GB" are GiB:
    ``k_size / GB`` with ``GB = 1 << 30``)."""
    if log.logged.get("available_kv_gib") is not None:
        return float(log.logged["available_kv_gib"])
    if log.engine != "sglang":
        return None
    k, v = log.logged.get("k_size_gb"), log.logged.get("v_size_gb")
    if k is not None and v is not None:
        return float(k) + float(v)
    if log.logged.get("kv_size_gb") is not None:
        return float(log.logged["kv_size_gb"])
    return None


def profile_for(version: str | None) -> str | None:
    """The runtime profile a vLLM ``version`` is predicted with: the profile file that covers it (``PROFILE_VERSIONS``
    and ``PROFILE_ALIASES``: every release 0.15-0.33; 0.17 ``vllm-0.17.json``, 0.18 ``vllm-0.19.json``), else the
    nearest calibrated one (0.19 before 0.20, 0.33 after: releases outside 0.15-0.33); None when the record's version
    is not a number."""
    if version is None:
        return None
    key = version_key(version)
    if key in PROFILE_VERSIONS:
        return key
    if key in PROFILE_ALIASES:
        return PROFILE_ALIASES[key]
    try:
        major, minor = (int(part) for part in key.split(".")[:2])
    except ValueError:
        return None
    return "0.19" if (major, minor) < (0, 20) else "0.33"


TARGET_FAMILIES = ("vllm >= 0.19", "sglang 0.5.x")
"""The engine versions issue 34's target names (held-out KV GiB and concurrency mean abs <= 2 %)."""


def target_family(log: StartupLog) -> str | None:
    """Which of :data:`TARGET_FAMILIES` a record's engine version belongs to (None: neither, or no number)."""
    if log.engine_version is None:
        return None
    version = str(log.engine_version).strip().split()[0].removeprefix(f"{log.engine}==")
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return None
    if log.engine == "vllm" and (major, minor) >= (0, 19):
        return TARGET_FAMILIES[0]
    if log.engine == "sglang" and (major, minor) == (0, 5):
        return TARGET_FAMILIES[1]
    return None


def evaluable(log: StartupLog, registry: Registry) -> str | None:
    """Why a record cannot be predicted by any tool (None: it can)."""
    if log.engine == "sglang":
        return _sglang_evaluable(log, registry)
    if log.logged.get("available_kv_gib") is None and log.logged.get("kv_tokens") is None:
        return "the log states no KV budget or token count"
    try:
        vllm_gpu(log, registry)
    except KvpoolsError as error:
        return str(error).split(". ")[0]
    if log.flag("gpu_memory_utilization") is None:
        return "the log does not state --gpu-memory-utilization"
    if log.kvpools_model is None:
        return "no kvpools model preset for this checkpoint"
    return None


def vllm_gpu(log: StartupLog, registry: Registry) -> GPU:
    """A vLLM record's GPU: its ``gpu_memory`` flag (a GPU the catalogue lacks: the total **as torch reports it**,
    ``torch.cuda.mem_get_info()[1]``, which vLLM budgets from, cited in the record's notes), else the catalogue
    entry the log names, else the total the log itself prints (:func:`logged_torch_total`)."""
    if log.flag("gpu_memory") is not None:
        return custom_gpu(log.flag("gpu_memory"), platform=log.flag("platform", "cuda"))
    if log.gpu is not None:
        try:
            return find_gpu(log.gpu, registry)
        except KvpoolsError:
            if logged_torch_total(log) is None:
                raise ConfigError(f"GPU {log.gpu!r} is not in kvpools' catalogue") from None
    total = logged_torch_total(log)
    if total is None:
        raise ConfigError("the log does not name the GPU")
    return custom_gpu(f"{total}GiB", platform=log.flag("platform", "cuda"))


def logged_torch_total(log: StartupLog) -> float | None:
    """The device total a vLLM log prints, in GiB (``total_gpu_memory (23.58GiB)`` of vLLM V0's profiling line,
    ``total_memory=79.19GiB`` of V1's snapshot): ``torch.cuda.mem_get_info()[1]``, the total vLLM budgets from.  Used
    where the log names no catalogue GPU; None for SGLang records (SGLang prints no device total)."""
    if log.engine != "vllm" or log.logged.get("total_gib") is None:
        return None
    return float(log.logged["total_gib"])


def torch_total_given(log: StartupLog, registry: Registry) -> bool:
    """Whether :func:`vllm_gpu` gives torch's total already (a ``gpu_memory`` flag or the logged total, not a
    catalogue entry's nvidia-smi total), so no nvidia-smi-to-torch gap is to be taken off."""
    if log.flag("gpu_memory") is not None:
        return True
    if log.gpu is not None:
        try:
            find_gpu(log.gpu, registry)
        except KvpoolsError:
            return True
        return False
    return True


def _weights(log: StartupLog, use_logged: bool, serving: Serving) -> int:
    if use_logged:
        if log.logged.get("weights_gib") is None:
            raise KvpoolsError("the log states no weights")
        return round(float(log.logged["weights_gib"]) * GiB)
    from kvpools_core.pipeline.weights import estimate_weights

    assert log.kvpools_model is not None
    return estimate_weights(model_ref(log), serving).bytes_per_rank


def _plan(
    log: StartupLog, available: int, registry: Registry, serving: Serving, profile: str | None = None
) -> Prediction:
    """The plan of ``available`` KV bytes; with a runtime ``profile``, in that vLLM version's layout
    (``engines/vllm/layouts.py``: the Gated DeltaNet checkpoint grid before vLLM 0.33)."""
    assert log.kvpools_model is not None
    model = served_model(load_model(model_ref(log), registry)[0], serving)
    workers = worker_kv_cache_specs(model, serving, registry, block_size=16)
    if profile is not None:
        workers = layout_for_version(workers, load_profile(profile), 16)
    model_len = log.flag("max_model_len") or model.context_len
    limits = VllmLimits(
        max_model_len=model_len,
        max_num_batched_tokens=log.flag("max_num_batched_tokens", 8192),
        max_concurrent_batches=1,
        # vllm serve's prefix caching puts a hybrid in "align" mode (2 Mamba blocks a request), as plan_vllm does
        mamba_cache_mode=mamba_cache_mode_of(workers),
    )
    plan = plan_kv_cache(workers, [available] * len(workers), limits)
    return Prediction(kv_gib=available / GiB, tokens=plan.kv_cache_size_tokens, concurrency=plan.max_concurrency)


def kvpools(log: StartupLog, registry: Registry, *, runtime: bool, use_logged_weights: bool) -> Prediction | Refusal:
    gpu = vllm_gpu(log, registry)
    try:
        serving = Serving(
            accounting="vllm",
            tp_size=log.flag("tp", 1),
            pp_size=log.flag("pp", 1),
            kv_cache_dtype=log.flag("kv_cache_dtype", "auto"),
            dtype=log.flag("dtype", "auto"),
            quantization=log.flag("quantization") or log.checkpoint_quantization,
        )
    except KvpoolsError as error:
        return Refusal(f"kvpools does not model these flags: {error}")
    try:
        weights = _weights(log, use_logged_weights, serving)
    except KvpoolsError as error:
        return Refusal(f"weights: {str(error).splitlines()[0][:140]}")
    terms: dict[str, int] = {}
    total = gpu.total_bytes
    if runtime:
        profile = profile_for(log.engine_version)
        if profile is None:
            return Refusal("the log does not name the vLLM version (no profile to apply)")
        vocab_size = log.vocab_size
        if vocab_size is None and log.kvpools_model is not None:
            try:
                vocab_size = vocab_size_of(model_ref(log))  # what `kvpools plan --accounting vllm` reads
            except KvpoolsError:
                vocab_size = None
        if vocab_size is None:
            return Refusal("neither the record nor its kvpools model gives a vocab_size")
        try:
            memory = estimate_runtime_memory(
                gpu=gpu,
                vocab_size=vocab_size,
                tp_size=serving.tp_size,
                pp_size=serving.pp_size,
                max_num_seqs=log.flag("max_num_seqs"),
                max_num_batched_tokens=log.flag("max_num_batched_tokens"),
                engine_version=version_key(str(log.engine_version)),
                profile_version=profile,
                shape=runtime_shape(log, serving.dtype),
                graph=runtime_graph(log, serving.dtype),
                kv_cache_dtype=serving.kv_cache_dtype,
                **runtime_mm_options(log, serving.dtype),
            )
        except KvpoolsError as error:
            return Refusal(str(error).split(". ")[0])
        # a stated gpu_memory or a logged total is torch's total already (no nvidia-smi-to-torch gap to take off)
        total = gpu.total_bytes if torch_total_given(log, registry) else memory.total.bytes
        terms = {term.name: term.bytes for term in memory.terms}
    budget = available_kv_cache_memory(
        total_memory=total,
        gpu_memory_utilization=log.flag("gpu_memory_utilization"),
        weights_memory=weights,
        activation_peak_memory=terms.get("activation peak", 0),
        non_torch_memory=terms.get("non-torch", 0),
        cudagraph_memory_estimate=terms.get("CUDA graphs", 0),
    )
    if budget.available_kv_cache_memory <= 0:
        return Refusal("no memory left for the KV cache")
    return _plan(log, budget.available_kv_cache_memory, registry, serving, profile if runtime else None)


def _sglang_evaluable(log: StartupLog, registry: Registry) -> str | None:
    if log.logged.get("kv_tokens") is None and not log.logged.get("refused"):
        return "the log states no token count and no refusal"
    try:
        sglang_gpu(log, registry)
    except KvpoolsError as error:
        return str(error).split(". ")[0]
    if log.kvpools_model is None:
        return "no kvpools model preset for this checkpoint"
    return None


def sglang_gpu(log: StartupLog, registry: Registry) -> GPU:
    """The record's GPU: its ``gpu_memory`` flag (a GPU the catalogue lacks, on the ``platform`` flag's platform),
    else the catalogue entry the log names."""
    if log.flag("gpu_memory") is not None:
        return custom_gpu(log.flag("gpu_memory"), platform=log.flag("platform", "cuda"))
    if log.gpu is None:
        raise ConfigError("the log does not name the GPU")
    try:
        return find_gpu(log.gpu, registry)
    except KvpoolsError:
        raise ConfigError(f"GPU {log.gpu!r} is not in kvpools' catalogue") from None


def sglang_serving(log: StartupLog, gpu: GPU, registry: Registry, **options: Any) -> Serving:
    """The record's SGLang serving: its flags; a ``chunked_prefill_size`` the log does not state is left unset,
    which ``kvpools_core.plan`` on the GPU resolves to SGLang's default for its memory (the tier
    ``memory_hook.py`` lines 89-178 pick, as ``kvpools plan --gpu`` does), which the default
    ``mem_fraction_static`` reserves activations for."""
    chunk = log.flag("chunked_prefill_size")
    return Serving(
        accounting="sglang",
        platform=gpu.platform,
        tp_size=log.flag("tp", 1),
        mem_fraction_static=log.flag("mem_fraction_static"),
        kv_cache_dtype=log.flag("kv_cache_dtype", "auto"),
        quantization=log.flag("quantization") or log.checkpoint_quantization,
        **({} if chunk is None else {"chunked_prefill_size": chunk}),
        context_length=log.flag("context_length"),
        disable_cuda_graph=bool(log.flag("disable_cuda_graph", False)),
        **options,
    )


def sglang(log: StartupLog, registry: Registry, *, use_logged_weights: bool) -> Prediction | Refusal:
    """kvpools' SGLang plan on the log's GPU; a refusal where kvpools refuses (SGLang's own refusals included)."""
    from kvpools_core import plan

    assert log.kvpools_model is not None
    weights = log.logged.get("weights_gb") if use_logged_weights else None
    if use_logged_weights and weights is None:
        return Refusal("the log states no weights")
    try:
        gpu = sglang_gpu(log, registry)
        result = plan(
            model_ref(log),
            sglang_serving(log, gpu, registry),
            gpu=gpu,
            weights_memory=None if weights is None else f"{weights}GiB",
            registry=registry,
        )
    except KvpoolsError as error:
        return Refusal(f"kvpools refuses: {str(error).splitlines()[0][:160]}")
    # SGLang's concurrency is its max_running_requests (the scheduler's cap the log prints), not tokens over a length
    return Prediction(
        kv_gib=result.budget.budget_bytes / GiB,
        tokens=result.max_total_num_tokens,
        concurrency=float(result.max_running_requests),
    )


def llmd_planner(logs: list[StartupLog], peers_venv: Path | None) -> dict[str, Prediction | Refusal]:
    """llm-d-planner 0.3.3 in its own venv (``benchmarks/peers/llmd_planner_runner.py``)."""
    if peers_venv is None:
        return {log.id: Refusal("not run: pass --peers-venv with llm-d-planner==0.3.3 installed") for log in logs}
    requests = []
    for log in logs:
        config = _full_config(log)
        if config is None or log.logged.get("weights_gib") is None or log.gpu != "h100" or log.flag("gpu_memory"):
            continue  # the runner plans its catalogue's 80 GiB H100: no other GPU
        requests.append(
            {
                "id": log.id,
                "config": config,
                "tp": log.flag("tp", 1),
                "pp": log.flag("pp", 1),
                "gpu_util": log.flag("gpu_memory_utilization"),
                "weights_gib": log.logged["weights_gib"],
                "max_model_len": log.flag("max_model_len"),
                "kv_cache_dtype": log.flag("kv_cache_dtype", "auto"),
            }
        )
    python = peers_venv / "bin" / "python"
    done = subprocess.run(
        [str(python), str(PEER_RUNNER)], input=json.dumps(requests), capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        reason = (
            f"llm-d-planner failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}"
        )
        return {log.id: Refusal(reason) for log in logs}
    answers = json.loads(done.stdout)
    results: dict[str, Prediction | Refusal] = {}
    for log in logs:
        answer = answers.get(log.id)
        if answer is None:
            results[log.id] = Refusal(
                "no full HF config.json for this checkpoint in kvpools' presets, no logged weights, or a GPU "
                "other than its 80 GiB H100"
            )
        elif "refused" in answer:
            results[log.id] = Refusal(answer["refused"])
        else:
            results[log.id] = Prediction(answer["kv_gib"], answer["tokens"], answer["concurrency"])
    return results


def runtime_shape(log: StartupLog, serving_dtype: str = "auto") -> ModelShape | None:
    """The sizes the vLLM activation peak needs: the kvpools model's config, else the record's own
    ``hidden_size`` / ``intermediate_size``, else None (the hidden-state, forward and MoE terms left out)."""
    dtype_bytes = 4 if serving_dtype == "float32" else 2
    if log.kvpools_model is not None:
        try:
            return model_shape_of(model_ref(log), dtype_bytes=dtype_bytes)
        except KvpoolsError:
            pass
    if log.hidden_size:
        return ModelShape(
            hidden_size=log.hidden_size, dense_intermediate_size=log.intermediate_size or 0, dtype_bytes=dtype_bytes
        )
    return None


def runtime_graph(log: StartupLog, serving_dtype: str = "auto") -> GraphShape | None:
    """The sizes vLLM's CUDA-graph estimate needs (:func:`graph_shape_of` of the kvpools model), or None."""
    if log.kvpools_model is None:
        return None
    try:
        return graph_shape_of(model_ref(log), dtype_bytes=4 if serving_dtype == "float32" else 2)
    except KvpoolsError:
        return None


def runtime_mm_options(log: StartupLog, serving_dtype: str = "auto") -> dict[str, Any]:
    """The multimodal encoder's part of the profile run: the kvpools model's vision tower (Qwen3-VL, Pixtral or SigLIP;
    none for others), the record's ``max_model_len`` and its ``limit_mm_per_prompt`` flag (vLLM's 999 per modality
    where the log names none)."""
    if log.kvpools_model is None:
        return {}
    try:
        vision = vision_shape_of(model_ref(log), dtype_bytes=4 if serving_dtype == "float32" else 2)
    except KvpoolsError:
        return {}
    if vision is None:
        return {}
    return {
        "vision": vision,
        "max_model_len": log.flag("max_model_len"),
        "mm_limits": dict(log.flag("limit_mm_per_prompt") or {}),
    }


def model_ref(log: StartupLog) -> str:
    """The record's kvpools model: a preset name, or a ``config.json`` path relative to the repository root."""
    assert log.kvpools_model is not None
    if log.kvpools_model.endswith(".json"):
        return str(ROOT / log.kvpools_model)
    return log.kvpools_model


def aiconfigurator(
    logs: list[StartupLog], peers_venv: Path | None, registry: Registry
) -> dict[str, Prediction | Refusal]:
    """aiconfigurator 0.12.0 in the peers venv (``benchmarks/peers/aiconfigurator_runner.py``)."""
    if peers_venv is None:
        return {log.id: Refusal("not run: pass --peers-venv with aiconfigurator==0.12.0 installed") for log in logs}
    requests: list[dict[str, Any]] = []
    results: dict[str, Prediction | Refusal] = {}
    for log in logs:
        config = _full_config(log)
        if config is None:
            results[log.id] = Refusal("no full HF config.json for this checkpoint in kvpools' presets")
            continue
        fraction = log.flag("gpu_memory_utilization") if log.engine == "vllm" else log.flag("mem_fraction_static")
        if fraction is None and log.engine == "sglang":
            fraction = _sglang_default_fraction(log, registry)
        if fraction is None:
            results[log.id] = Refusal("no memory fraction to give it")
            continue
        requests.append(
            {
                "id": log.id,
                "config": config,
                "gpu": log.gpu,
                "backend": log.engine,
                "fraction": fraction,
                "tp": log.flag("tp", 1),
                "pp": log.flag("pp", 1),
                "max_num_tokens": log.flag("max_num_batched_tokens") or log.flag("chunked_prefill_size") or 8192,
                "max_batch_size": log.flag("max_num_seqs") or log.flag("max_running_requests") or 1024,
                "max_model_len": log.flag("max_model_len"),
                "kv_cache_dtype": log.flag("kv_cache_dtype", "auto"),
                "dtype": log.flag("dtype", "auto"),
                "quantization": log.flag("quantization"),
                "checkpoint_quantization": log.checkpoint_quantization,
            }
        )
    done = subprocess.run(
        [str(peers_venv / "bin" / "python"), str(AIC_RUNNER)],
        input=json.dumps(requests),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else str(done.returncode)
        return {log.id: Refusal(f"aiconfigurator failed: {tail}") for log in logs}
    for run_id, answer in json.loads(done.stdout).items():
        if "refused" in answer:
            results[run_id] = Refusal(answer["refused"])
        else:
            results[run_id] = Prediction(answer["kv_gib"], answer["tokens"], answer["concurrency"])
    return results


def _sglang_default_fraction(log: StartupLog, registry: Registry) -> float | None:
    """SGLang 0.5.23's default ``mem_fraction_static`` on the log's GPU (what kvpools plans with)."""
    from kvpools_core import plan

    try:
        gpu = sglang_gpu(log, registry)
        result = plan(model_ref(log), sglang_serving(log, gpu, registry), gpu=gpu, registry=registry)
    except KvpoolsError:
        return None
    return result.budget.mem_fraction_static


def _full_config(log: StartupLog) -> dict[str, Any] | None:
    if log.kvpools_model is None:
        return None
    if log.kvpools_model.endswith(".json"):
        loaded: dict[str, Any] = json.loads((ROOT / log.kvpools_model).read_text(encoding="utf-8"))
        return loaded
    for path in (ROOT / "plugins").glob(f"*/presets/full/{log.kvpools_model}.json"):
        config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return config
    # a KV-only preset, completed with the sizes the record carries from the checkpoint's config.json
    for path in (ROOT / "plugins").glob(f"*/presets/{log.kvpools_model}.json"):
        config = json.loads(path.read_text(encoding="utf-8"))
        sizes = {
            "vocab_size": log.vocab_size,
            "intermediate_size": log.intermediate_size,
            "hidden_size": log.hidden_size,
        }
        config.update({key: value for key, value in sizes.items() if value is not None})
        return config
    return None


def _error(predicted: float | None, logged: float | None) -> float | None:
    if predicted is None or logged is None or logged == 0:
        return None
    return (predicted - logged) / logged * 100


def summarize(errors: list[float]) -> str:
    if not errors:
        return "n=0"
    worst = max(errors, key=abs)
    mean, mean_abs = statistics.fmean(errors), statistics.fmean(abs(error) for error in errors)
    return f"n={len(errors)} mean {mean:+.2f} %, mean abs {mean_abs:.2f} %, worst {worst:+.2f} %"


def run(peers_venv: Path | None) -> dict[str, Any]:
    registry = get_registry()
    logs = list(load_startup_logs())
    skipped = {log.id: reason for log in logs if (reason := evaluable(log, registry))}
    sglang_runs = [log for log in logs if log.id not in skipped and log.engine == "sglang"]
    runs = [log for log in logs if log.id not in skipped and log.engine == "vllm"]
    tools: dict[str, dict[str, Prediction | Refusal]] = {}
    for name, runtime, logged_weights in (
        ("kvpools-before (logged weights)", False, True),
        ("kvpools-runtime (logged weights)", True, True),
        ("kvpools-before (estimated weights)", False, False),
        ("kvpools-runtime (estimated weights)", True, False),
    ):
        tools[name] = {
            log.id: kvpools(log, registry, runtime=runtime, use_logged_weights=logged_weights) for log in runs
        }
    tools["llm-d-planner 0.3.3 (logged weights)"] = llmd_planner(runs, peers_venv)
    tools["aiconfigurator 0.12.0"] = aiconfigurator([*runs, *sglang_runs], peers_venv, registry)
    tools["kvpools-sglang (logged weights)"] = {
        log.id: sglang(log, registry, use_logged_weights=True) for log in sglang_runs
    }
    tools["kvpools-sglang (estimated weights)"] = {
        log.id: sglang(log, registry, use_logged_weights=False) for log in sglang_runs
    }
    report: dict[str, Any] = {"skipped": skipped, "tools": {}, "terms": runtime_terms(logs, registry)}
    report["terms"]["CUDA graphs"] = cudagraph_terms(logs)
    report["sglang_terms"] = sglang_terms(logs, registry)
    report["sglang_term_rows"] = sglang_term_rows(logs, registry)
    for name, results in tools.items():
        groups: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        target: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        refused: dict[str, str] = {}
        missed: list[str] = []
        rows = {}
        scope = sglang_runs if name.startswith("kvpools-sglang") else runs
        if name.startswith("aiconfigurator"):
            scope = [*runs, *sglang_runs]
        for log in scope:
            result = results[log.id]
            if isinstance(result, Refusal):
                refused[log.id] = result.reason
                continue
            key = (f"{log.engine} {log.engine_version or 'unknown'}", log.split or "neither")
            if log.logged.get("refused"):
                rows[log.id] = {"predicted": attrs.asdict(result), "errors_pct": {}, "engine_refused": True}
                missed.append(log.id)
                continue
            errors = {
                "kv_gib": _error(result.kv_gib, logged_kv_gib(log)),
                "kv_tokens": _error(result.tokens, log.logged.get("kv_tokens")),
                "max_concurrency": _error(result.concurrency, logged_concurrency(log)),
            }
            rows[log.id] = {"predicted": attrs.asdict(result), "errors_pct": errors}
            family = target_family(log)
            for metric, value in errors.items():
                if value is not None and math.isfinite(value):
                    groups[key][metric].append(value)
                    if family is not None and log.split == "held_out":
                        target[family][metric].append(value)
        report["tools"][name] = {
            "groups": {
                f"{version} / {split}": {metric: summarize(values) for metric, values in metrics.items()}
                for (version, split), metrics in sorted(groups.items())
            },
            "held_out": {
                version: {metric: summarize(values) for metric, values in metrics.items()}
                for (version, split), metrics in sorted(groups.items())
                if split == "held_out"
            },
            "target": {
                family: {metric: summarize(values) for metric, values in metrics.items()}
                for family, metrics in sorted(target.items())
            },
            "refused": refused,
            "missed_engine_refusals": missed,
            "runs": rows,
        }
    return report


def cudagraph_terms(logs: list[StartupLog]) -> dict[str, str]:
    """vllm-0.33.json's CUDA-graph estimate (``runtime_memory.cudagraph_memory``, the kvpools model's shape) against
    the logged ``Estimated CUDA graph memory``, per split, where the record names a kvpools model and states the
    graph counts.  A record without ``max_num_seqs`` takes the decode ceiling its logged FULL count names (35 FULL
    graphs: sizes up to 256, the default ``max_num_seqs`` of a < 70 GiB GPU)."""
    profile = load_profile("0.33")
    errors: dict[str, list[float]] = defaultdict(list)
    ladder = cudagraph_capture_sizes(max_num_seqs=1024, max_num_batched_tokens=8192)
    for log in logs:
        logged, piecewise = log.logged.get("cudagraph_gib"), log.logged.get("cudagraph_piecewise")
        graph = runtime_graph(log)
        if logged is None or piecewise is None or graph is None:
            continue
        full = int(log.logged.get("cudagraph_full") or 0)
        seqs = log.flag("max_num_seqs") or (ladder[full - 1] if 0 < full <= len(ladder) else None)
        term = cudagraph_memory(
            profile=profile,
            max_num_seqs=seqs,
            max_num_batched_tokens=log.flag("max_num_batched_tokens"),
            graph=graph,
            tp_size=log.flag("tp", 1),
            pp_size=log.flag("pp", 1),
        )
        error = _error(term.bytes / GiB, logged)
        if error is not None:
            errors[log.split or "neither"].append(error)
    return {split: summarize(values) for split, values in sorted(errors.items())}


SGLANG_TERM_WHY: dict[tuple[str, str], str] = {
    ("sglang-pr11716-h200-tp8-runtime", "runtime before the weights"): (
        "SGLang sizes with the group's MIN free memory (bootstrap.py L207-212, utils/common.py L571-572): 137.29 GB "
        "on six ranks, 3.11 GiB below the total (TP0's 3.06 was read before sgl34); the profile's 3 GiB was rounded "
        "from two readings; from the source: 1.10 GiB of driver reservation and CUDA context (every rank had 139.30 GB "
        "free before torch.distributed's init) + 2.01 GB of NCCL and custom all-reduce buffers"
    ),
    ("sglang-inferencex-2128-dsv4-pro-h200-tp8", "runtime before the weights"): (
        "an unnumbered deepseek-v4-hopper image, one rank's 'Load weight end' line (not the group's MIN): 0.61 GiB "
        "less than the 11716 log's 3.11, a smaller NCCL footprint that SGLang 0.5.23's code does not explain"
    ),
    ("sglang-18262-qwen3-30b-a3b-5layers-mi355x-v0.5.7", "runtime before the weights"): (
        "ROCm, TP 1 (no communicator: parallel_state.py L463-531 builds none for world_size 1): the HIP runtime's "
        "context and reservation are 0.80 GiB below the record's 288 GiB; kvpools' 1 GiB is an estimate and the "
        "1.10 GiB read off the H200 log a CUDA figure (nvidia-smi's total includes the driver's reservation): "
        "neither is a ROCm reading, and the two ROCm runs are held out"
    ),
    ("sglang-18263-qwen3-30b-a3b-mi355x-patched", "runtime before the weights"): (
        "as the 0.5.7 MI355X run: 0.82 GiB of HIP context and reservation at TP 1, against a CUDA figure"
    ),
    ("sglang-18262-qwen3-30b-a3b-5layers-mi355x-v0.5.7", "weights"): (
        "not a kvpools under-count: 5 layers of Qwen3-30B-A3B are 6.96 GiB, and SGLang 0.5.7 held the 5 layers' "
        "experts twice: its Qwen3MoE load_weights kept dict(self.named_parameters()) on the model "
        "(_cached_params_dict, sglang PR 8751) and its AITER path on ROCm rebound the shuffled experts as new "
        "Parameters (layer.w13_weight = Parameter(shuffle_weight(...))), so the loaded ones stayed referenced: 5 x "
        "128 x 3 x 2048 x 768 x 2 B = 5.625 GiB more, 12.59 GiB (-1.6 %; a RoPE cache of 0.06-0.13 GiB and AITER's "
        "own buffers are the rest); SGLang 0.5.23 keeps no such dict (models/qwen3_moe.py L1157-1177: a local "
        "params_dict) and copies the shuffled experts in place (copy_or_rebind_param, layers/utils/common.py L58-71; "
        "quantization/unquant.py L852-869), so it holds them once, as kvpools counts"
    ),
    ("sglang-18263-qwen3-30b-a3b-mi355x-patched", "weights"): (
        "0.11 GiB below the log: the RoPE cos/sin cache SGLang builds at model init in float32 on CUDA and HIP "
        "(layers/rotary_embedding/base.py L115-120, L154: max_position x rotary_dim x 4 B, 262144 x 128 x 4 B = "
        "0.125 GiB for the 2507 checkpoint), counted in 'Load weight end ... mem usage', not in kvpools' weights"
    ),
    ("sglang-inferencex-2128-dsv4-pro-h200-tp8", "weights"): (
        "an unnumbered deepseek-v4-hopper image: kvpools' 101.93 GiB is SGLang 0.5.23's flashinfer_mxfp4 layout on "
        "sm90 (E8M0 scales kept native); the generic Fp8MoEMethod's float32 FP4 scales would add 16.89 GiB (118.82, "
        "-5.4 %); the remaining 6.8 GiB is that image's, not 0.5.23's (the record's notes)"
    ),
    ("sglang-lmcache-2400-qwen3-14b-weights", "weights"): (
        "0.18 GiB below the log, with --enable-lmcache: 0.02 GiB is the float32 RoPE cache (40960 x 128 x 4 B); the "
        "xinference 3481 log of the same checkpoint (no LMCache) states 27.57 GB, 0.06 GiB above kvpools"
    ),
    ("sglang-rosario-llmd-qwen3-32b-h100-v0.5.19", "runtime before the weights"): (
        "CUDA, TP 1 on an H100 80GB (no communicator: parallel_state.py L463-531): 78.47 GB free before the weights, "
        "1.18 GiB below nvidia-smi's 81559 MiB; the OTel reranker and vllm_hybrid runs on two other H100 hosts read "
        "78.47 and 78.48, so it is the card's driver reservation + CUDA context, not this pod's (gVisor) overhead; "
        "the profile's one-rank "
        "1 GiB is an estimate and the 1.10 GiB from the source was read on an H200: an H100 holds 0.08 GiB more. "
        "The KV budget misses by 0.9 x 0.18 = 0.16 GiB of the +0.17 GiB (+1.8 %; SGLang 0.5.23's own formula on the "
        "logged terms, kv_cache_configurator.py L2990-3060: 17.40 - 78.47 x 0.1 = 9.55 GiB, 39,130 tokens, -0.13 %)"
    ),
    ("sglang-otel-qwen3-reranker-0.6b-h100-v0.5.18", "runtime before the weights"): (
        "as the RyanRosario Qwen3-32B run: 78.47 GB free before the weights on an H100 80GB at TP 1, 1.18 GiB below "
        "its total; the budget misses by 0.3 x 0.18 = 0.05 GiB (+0.24 %)"
    ),
    ("sglang-vllmhybrid-qwen3-30b-a3b-fp8-h100-v0.5.18", "runtime before the weights"): (
        "as the two other H100 80GB runs at TP 1: 78.48 GB free before the weights on GPU 0 (GPUs 1-7 idle at 4 MiB), "
        "1.17 GiB below the total; the budget misses by 0.83 x 0.17 = 0.14 GiB (+0.39 %)"
    ),
    ("sglang-vllmhybrid-qwen3-30b-a3b-fp8-h100-v0.5.18", "weights"): (
        "0.12 GiB below the log: 0.02 GiB is the float32 RoPE cache (40960 x 128 x 4 B, base.py L115-120, L154); "
        "the other 0.10 GiB of the FP8 block-quantised checkpoint is not traced"
    ),
    ("sglang-skill-clean-startup-log-qwen3-8b-b200", "runtime before the weights"): (
        "CUDA, TP 1 on the inferred B200 (the record's notes): 177.57 GB free before the weights, 1.49 GiB below the "
        "catalogue's 183359 MiB, where the profile plans 1 GiB (the H200's 1.10 and the H100s' 1.17-1.18 are smaller); "
        "the budget misses by 0.854 x 0.49 = 0.42 GiB (+0.31 %)"
    ),
    ("sglang-skill-clean-startup-log-qwen3-8b-b200", "weights"): (
        "0.02 GiB below the log: the float32 RoPE cache (40960 x 128 x 4 B, base.py L115-120, L154)"
    ),
    ("sglang-rosario-llmd-qwen3-32b-h100-v0.5.19", "weights"): (
        "0.05 GiB below the log: 0.02 GiB is the float32 RoPE cos/sin cache SGLang builds at model init "
        "(layers/rotary_embedding/base.py L115-120, L154: max_position_embeddings 40960 x 128 x 4 B), counted in "
        "'Load weight end ... mem usage', not in kvpools' weights; 0.03 GiB is not traced (the log's two figures are "
        "rounded to 0.01)"
    ),
    ("sglang-otel-qwen3-reranker-0.6b-h100-v0.5.18", "weights"): (
        "0.07 GiB below the log: 0.02 GiB is the float32 RoPE cache (40960 x 128 x 4 B, base.py L115-120, L154); the "
        "other 0.05 GiB is not traced: kvpools estimates Qwen3-0.6B's config.json (tied embeddings, 0.596 B "
        "parameters), the reranker's own config.json is not stored here"
    ),
}
"""Why each SGLang record's term differs from kvpools', read from SGLang 0.5.23's source (``--verbose``, ``--json``)."""


def sglang_terms(logs: list[StartupLog], registry: Registry) -> dict[str, dict[str, str]]:
    """SGLang's whole-GPU terms against the ones its logs state, per split (:func:`sglang_term_rows` summarised)."""
    errors: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in sglang_term_rows(logs, registry):
        errors[row["term"]][row["group"]].append(row["error_pct"])
    return {
        name: {group: summarize(values) for group, values in sorted(groups.items())} for name, groups in errors.items()
    }


def sglang_term_rows(logs: list[StartupLog], registry: Registry) -> list[dict[str, Any]]:
    """Each SGLang record's terms against the logged ones: the default ``mem_fraction_static``
    (``handle_gpu_memory_settings``, before any attention-backend factor); the runtime before the weights (the GPU's
    total less the group's minimum ``Load weight begin. avail mem`` where the log quotes every rank, else the one
    quoted, else ``Load weight end`` avail + mem usage) against the 0.5.23 profile; and the weights (``Load weight
    end ... mem usage``) against kvpools' estimate.  A row: record, term, split group, kvpools', logged, error (%),
    and why they differ (:data:`SGLANG_TERM_WHY`)."""
    from kvpools_core.pipeline.weights import estimate_weights

    profile = load_sglang_profile("0.5.23")
    rows: list[dict[str, Any]] = []

    def add(log: StartupLog, term: str, group: str, predicted: float, logged_value: float, unit: str) -> None:
        error = _error(predicted, logged_value)
        if error is None:
            return
        rows.append(
            {
                "id": log.id,
                "term": term,
                "group": group,
                "kvpools": round(predicted, 4),
                "logged": round(logged_value, 4),
                "unit": unit,
                "error_pct": error,
                "why": SGLANG_TERM_WHY.get((log.id, term.replace(", from the source", " before the weights")), ""),
            }
        )

    for log in logs:
        if log.engine != "sglang":
            continue
        split = log.split or "neither"
        try:
            gpu = sglang_gpu(log, registry)
        except KvpoolsError:
            gpu = None
        logged = log.logged
        if gpu is not None and log.kvpools_model is not None and logged.get("default_mem_fraction_static"):
            serving = sglang_serving(log, gpu, registry)
            if is_unset(serving.chunked_prefill_size):  # as kvpools_core.plan resolves it on the GPU
                chunk = sglang_chunked_prefill_size(gpu.total_mib, gpu.platform, registry=registry)
                serving = attrs.evolve(serving, chunked_prefill_size=chunk)
            spec = served_model(load_model(model_ref(log), registry)[0], serving)
            fraction = sglang_memory_defaults(gpu.total_mib, spec, serving, registry=registry).mem_fraction_static
            add(log, "default mem_fraction_static", split, fraction, logged["default_mem_fraction_static"], "")
        before = logged.get("avail_before_weights_min_gb", logged.get("avail_before_weights_gb"))
        if before is None and logged.get("avail_after_weights_gb") is not None and logged.get("weights_gb") is not None:
            before = logged["avail_after_weights_gb"] + logged["weights_gb"]
        if gpu is not None and before is not None:
            ranks = log.flag("tp", 1) * log.flag("pp", 1)
            group = f"{split} ({'group' if ranks > 1 else 'one rank'})"
            logged_runtime = gpu.total_bytes / GiB - before
            predicted = profile.group_runtime_bytes if ranks > 1 else profile.single_rank_runtime_bytes
            add(log, "runtime before the weights", group, predicted / GiB, logged_runtime, "GiB")
            derived = profile.source_group_runtime_bytes if ranks > 1 else profile.source_single_rank_bytes
            if derived is not None:
                add(log, "runtime, from the source", group, derived / GiB, logged_runtime, "GiB")
        if log.kvpools_model is not None and logged.get("weights_gb") is not None:
            serving = Serving(
                tp_size=log.flag("tp", 1),
                quantization=log.flag("quantization") or log.checkpoint_quantization,
            )
            try:
                weights = estimate_weights(model_ref(log), serving).bytes_per_rank / GiB
            except KvpoolsError:
                continue
            add(log, "weights", split, weights, logged["weights_gb"], "GiB")
    return rows


def runtime_terms(logs: list[StartupLog], registry: Registry) -> dict[str, dict[str, str]]:
    """The activation-peak and non-torch terms against the ones the logs state, per split (vLLM 0.19 profile)."""
    errors: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for log in logs:
        if log.engine != "vllm" or log.split is None or log.vocab_size is None:
            continue
        if log.logged.get("activation_gib") is None and log.logged.get("non_torch_gib") is None:
            continue
        profile = profile_for(log.engine_version)
        if profile is None:
            continue
        memory = estimate_runtime_memory(
            gpu=find_gpu("h100", registry),
            vocab_size=log.vocab_size,
            tp_size=log.flag("tp", 1),
            pp_size=log.flag("pp", 1),
            max_num_seqs=log.flag("max_num_seqs"),
            max_num_batched_tokens=log.flag("max_num_batched_tokens"),
            engine_version=version_key(str(log.engine_version)),
            profile_version=profile,
            shape=runtime_shape(log, log.flag("dtype", "auto")),
            # the report's pipeline rows are a stage that does not sample (its activation is below the sampler's)
            pp_stage="first" if log.flag("pp", 1) > 1 else "last",
            # the multimodal encoder's profile pass (Qwen3-VL, Pixtral and SigLIP towers)
            **runtime_mm_options(log, log.flag("dtype", "auto")),
        )
        for name, key in (("activation peak", "activation_gib"), ("non-torch", "non_torch_gib")):
            error = _error(memory.term(name).bytes / GiB, log.logged.get(key))
            if error is not None:
                stage = ", pp stage" if log.flag("pp", 1) > 1 else ""
                errors[name][f"{log.split} ({log.family}{stage})"].append(error)
    return {
        name: {group: summarize(values) for group, values in sorted(groups.items())} for name, groups in errors.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peers-venv", type=Path, help="a venv with llm-d-planner==0.3.3 installed")
    parser.add_argument("--json", type=Path, help="write the whole report (every run's prediction) here")
    parser.add_argument(
        "--verbose", action="store_true", help="print each SGLang record's terms against the logged ones, and why"
    )
    args = parser.parse_args(argv)
    report = run(args.peers_venv)
    versions = {log.id: f"{log.engine} {log.engine_version or 'unknown'}" for log in load_startup_logs()}
    print(f"{len(report['skipped'])} records not predictable by any tool (reasons in --json)")
    print("\n## kvpools runtime terms against the logged terms (vLLM 0.19 profile; CUDA graphs: vLLM 0.33 profile)")
    for term, groups in report["terms"].items():
        for group, text in groups.items():
            print(f"  {term:16} {group:22} {text}")
    print("\n## kvpools' SGLang terms against the logged terms (SGLang 0.5.23 formulas and profile)")
    for term, groups in report["sglang_terms"].items():
        for group, text in groups.items():
            print(f"  {term:28} {group:22} {text}")
    if args.verbose:
        print("\n## per SGLang record: kvpools' term against the logged term")
        for row in report["sglang_term_rows"]:
            print(
                f"  {row['id']:50} {row['term']:28} kvpools {row['kvpools']:g} {row['unit']:3} logged "
                f"{row['logged']:g} {row['unit']:3} {row['error_pct']:+.2f} % ({row['group']})"
            )
            if row["why"]:
                print(f"      why: {row['why']}")
    print("\n## held out, per tool and engine version (target: mean abs <= 2 %)")
    for name, tool in report["tools"].items():
        for version, metrics in tool["held_out"].items():
            print(f"  {name:40} {version:18} " + "; ".join(f"{m} {t}" for m, t in metrics.items()))
        by_version: dict[str, int] = defaultdict(int)
        for run_id in tool["refused"]:
            by_version[versions[run_id]] += 1
        if by_version:
            print(f"  {name:40} refused: " + ", ".join(f"{v} {n}" for v, n in sorted(by_version.items())))
        if tool["missed_engine_refusals"]:
            print(f"  {name:40} planned a pool where the engine refused to start: {tool['missed_engine_refusals']}")
    print("\n## issue 34's target: held out, vLLM >= 0.19 and SGLang 0.5.x pooled (mean abs <= 2 %)")
    for name, tool in report["tools"].items():
        for family, metrics in tool["target"].items():
            print(f"  {name:40} {family:14} " + "; ".join(f"{m} {t}" for m, t in metrics.items()))
    for name, tool in report["tools"].items():
        print(f"\n## {name}")
        for group, metrics in tool["groups"].items():
            print(f"  {group}")
            for metric, text in metrics.items():
                print(f"    {metric:16} {text}")
        if tool["refused"]:
            print(f"  refused {len(tool['refused'])}:")
            for run_id, reason in tool["refused"].items():
                print(f"    {run_id}: {reason}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
