"""``kvpools fit --accounting trtllm``: the ``trtllm-serve`` deployments on the fewest GPUs that hold N concurrent
requests of L tokens, each planned as TensorRT-LLM 1.2 sizes its KV cache (:func:`kvpools_core.engines.trtllm.
plan_trtllm` through the engine registry).

A candidate is ``tp_size`` and ``pp_size`` (powers of two), attention DP (``enable_attention_dp``, where
``tp_size > 1``: each of the ``tp`` ranks keeps every KV head and runs its own batch, so an engine holds ``tp x``
one rank's requests), the KV dtype (the caller's, else ``auto`` and ``fp8_e4m3``) and ``replicas`` (copies of the
engine, each with its own KV cache). Each engine is planned on the GPU (weights estimated by kvpools, TensorRT-LLM's
``free_gpu_memory_fraction`` of what is left, ``--max_seq_len L``); the requests of ``L`` tokens one rank holds are
:meth:`~kvpools_core.engines.trtllm.TrtllmPlanResult.concurrency_at` (at most ``max_batch_size``).  A candidate
TensorRT-LLM or kvpools refuses is skipped and the reason counted; when every one is refused for the model itself
(an architecture kvpools does not model for TensorRT-LLM), that refusal is raised.  Ranking: fewest GPUs, then the
most headroom, then the fewest pipeline stages, then the fewest replicas.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import attrs

from kvpools_core.engines import engine_for
from kvpools_core.errors import ConfigError, KvpoolsError, UnsupportedCombinationError
from kvpools_core.models import load_model
from kvpools_core.options import option
from kvpools_core.pipeline.gpus import GPU, custom_gpu, find_gpu
from kvpools_core.planning.fit import DEFAULT_KV_DTYPES, DEFAULT_MAX_GPUS, MAX_GPUS, _parallel_shapes
from kvpools_core.registry import get_registry
from kvpools_core.values import Serving


@attrs.frozen
class TrtllmFit:
    """One ``trtllm-serve`` configuration that holds the requests."""

    result: Any  # TrtllmPlanResult
    replicas: int
    gpus: int
    requests_held: int
    headroom: float

    @property
    def per_rank(self) -> int:
        return int(self.result.concurrency_at(self.result.max_seq_len_requested) or 0)

    def describe(self) -> str:
        s = self.result.serving
        parts = [f"TP {s.tp_size}"]
        if s.pp_size > 1:
            parts.append(f"PP {s.pp_size}")
        if self.result.enable_attention_dp:
            parts.append("attention DP")
        if self.replicas > 1:
            parts.append(f"{self.replicas} replicas")
        parts.append(f"kv {self.result.kv_cache_dtype}")
        drafting = self.result.drafting
        if drafting is not None:
            parts.append(f"{drafting.decoding_type} draft ({drafting.mode}, max_draft_len {drafting.max_draft_len})")
        elif self.result.num_nextn_predict_layers:
            parts.append(f"MTP {self.result.num_nextn_predict_layers}")
        if self.result.tokens_per_block != 32:
            parts.append(f"tokens_per_block {self.result.tokens_per_block}")
        return " · ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        s = self.result.serving
        return {
            "gpus": self.gpus,
            "tp_size": s.tp_size,
            "pp_size": s.pp_size,
            "enable_attention_dp": self.result.enable_attention_dp,
            "replicas": self.replicas,
            "kv_cache_dtype": self.result.kv_cache_dtype,
            "tokens_per_block": self.result.tokens_per_block,
            "max_kv_tokens": self.result.max_kv_tokens,
            "kv_cache_capacity": self.result.kv_cache_capacity(),
            "requests_held": self.requests_held,
            "headroom": self.headroom,
            "launch": self.result.serve_command(),
            "extra_llm_api_options": self.result.extra_llm_api_options(),
        }


@attrs.frozen
class TrtllmFitResult:
    """What :func:`fit_trtllm` found: the ranked fits on the fewest GPUs, or why nothing fits."""

    model: str
    gpu: GPU
    requests: int
    context_len: int
    max_gpus: int
    fits: tuple[TrtllmFit, ...]
    tried: int
    skipped: dict[str, int]
    needed: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": "trtllm",
            "model": self.model,
            "gpu": {"name": self.gpu.name, "label": self.gpu.label, "total_bytes": self.gpu.total_bytes},
            "requests": self.requests,
            "context_len": self.context_len,
            "max_gpus": self.max_gpus,
            "fits": [f.to_dict() for f in self.fits],
            "tried": self.tried,
            "skipped": dict(self.skipped),
            "needed": self.needed,
        }


NUMBER = re.compile(r"\b[0-9][0-9,.]*")
"""A number in a refusal (bytes, a stage), replaced so one reason counts once whatever the configuration."""


def _reason(error: KvpoolsError) -> str:
    first = re.split(r"(?<=[.:])\s", str(error), maxsplit=1)[0]
    return f"{type(error).__name__}: {NUMBER.sub('N', first)}"


def _refuses_the_model(message: str) -> bool:
    """Whether a refusal holds for every configuration: an architecture (or option) kvpools does not model, or
    TensorRT-LLM's ``tokens_per_block`` assertion (DeepSeek-V4's manager takes 128 or 256), whose message names the
    value to pass and is raised as is when every configuration hits it."""
    return "does not model" in message or "Pass --tokens_per_block" in message


def fit_trtllm(
    model: str,
    requests: int,
    context_len: int,
    *,
    gpu: str | GPU | None = None,
    gpu_memory: int | str | None = None,
    max_gpus: int = DEFAULT_MAX_GPUS,
    kv_cache_dtype: str | None = None,
    num_nextn_predict_layers: int | None = None,
    max_batch_size: int | None = None,
    tokens_per_block: int | None = None,
    decoding_type: str | None = None,
    speculative_model_dir: str | None = None,
    max_draft_len: int | None = None,
    eagle3_one_model: bool | None = None,
    draft_weights_memory: int | str | None = None,
) -> TrtllmFitResult:
    """The ``trtllm-serve`` configurations on the fewest GPUs (up to ``max_gpus``) holding ``requests`` of
    ``context_len`` tokens on ``gpu`` (a catalogue name) or a GPU of ``gpu_memory``; each planned with
    ``num_nextn_predict_layers`` one-model MTP draft layers, ``max_batch_size`` and ``tokens_per_block`` when given
    (a hybrid's recurrent state is paid for every request ``max_batch_size`` allows), and with a separate draft
    model (``decoding_type`` Eagle3 / Eagle / Draft_Target, ``speculative_model_dir``, ``max_draft_len``,
    ``eagle3_one_model``) whose weights on each GPU are ``draft_weights_memory`` (kvpools does not estimate a
    draft's weights; without it every configuration would be refused, so it is asked for up front)."""
    o = option
    if requests < 1:
        raise ConfigError(f"{o('requests')} must be at least 1, got {requests}.")
    if context_len < 1:
        raise ConfigError(f"{o('context')} must be at least one token, got {context_len}.")
    if not 1 <= max_gpus <= MAX_GPUS:
        raise ConfigError(f"{o('max_gpus')} must be between 1 and {MAX_GPUS:,}, got {max_gpus}.")
    if (gpu is None) == (gpu_memory is None):
        raise ConfigError(f"Give one of {o('gpu')} NAME or {o('gpu_memory')} SIZE.")
    if isinstance(gpu, GPU):
        chosen = gpu
    elif gpu is not None:
        chosen = find_gpu(gpu)
    else:
        assert gpu_memory is not None
        chosen = custom_gpu(gpu_memory)
    registry = get_registry()
    spec, _ = load_model(model, registry)
    if context_len > spec.context_len:
        raise ConfigError(
            f"{o('context')} {context_len} is longer than {spec.name}'s context length {spec.context_len}; "
            "TensorRT-LLM refuses a longer --max_seq_len."
        )
    if decoding_type is not None and draft_weights_memory is None:
        raise ConfigError(
            f"kvpools fit --accounting trtllm plans every configuration on a GPU, and kvpools does not estimate a "
            f"draft model's weights: with --decoding_type {decoding_type} pass --draft_weights_memory SIZE (the "
            "draft's weights on each GPU, added to kvpools' estimate of the target's)."
        )
    drafting = {
        "tokens_per_block": tokens_per_block,
        "decoding_type": decoding_type,
        "speculative_model_dir": speculative_model_dir,
        "max_draft_len": max_draft_len,
        "eagle3_one_model": eagle3_one_model,
        "draft_weights_memory": draft_weights_memory,
    }
    engine = engine_for("trtllm", registry)
    dtypes = (kv_cache_dtype,) if kv_cache_dtype else DEFAULT_KV_DTYPES
    skipped: Counter[str] = Counter()
    model_refusals: list[UnsupportedCombinationError] = []
    fits: list[TrtllmFit] = []
    tried = 0
    for tp, pp in _parallel_shapes(max_gpus):
        for attention_dp in (False, True) if tp > 1 else (False,):
            for dtype in dtypes:
                tried += 1
                serving = Serving(accounting="trtllm", tp_size=tp, pp_size=pp, kv_cache_dtype=dtype)
                try:
                    result = engine.plan(
                        model,
                        serving,
                        gpu=chosen,
                        max_seq_len=context_len,
                        enable_attention_dp=attention_dp,
                        num_nextn_predict_layers=num_nextn_predict_layers,
                        max_batch_size=max_batch_size,
                        registry=registry,
                        **{name: value for name, value in drafting.items() if value is not None},
                    )
                except KvpoolsError as exc:
                    skipped[_reason(exc)] += 1
                    if isinstance(exc, UnsupportedCombinationError) and _refuses_the_model(str(exc)):
                        model_refusals.append(exc)
                    continue
                per_rank = result.concurrency_at(context_len) or 0
                per_engine = per_rank * (tp if attention_dp else 1)
                if per_engine < 1:
                    skipped["no request of the context fits one engine's KV cache"] += 1
                    continue
                replicas = math.ceil(requests / per_engine)
                gpus = replicas * tp * pp
                if gpus <= max_gpus:
                    held = replicas * per_engine
                    fits.append(TrtllmFit(result, replicas, gpus, held, held / requests))
    if not fits and model_refusals and len(model_refusals) == tried:
        raise model_refusals[0]
    fits.sort(key=lambda f: (f.gpus, -f.headroom, f.result.serving.pp_size, f.replicas))
    fewest = tuple(f for f in fits if f.gpus == fits[0].gpus) if fits else ()
    needed = None
    if not fewest:
        needed = (
            f"No trtllm-serve configuration of up to {max_gpus} {chosen.label} GPUs holds {requests} requests of "
            f"{context_len} tokens; pass a larger --max-gpus, a larger --gpu, or --kv-cache-dtype fp8_e4m3."
        )
    return TrtllmFitResult(
        model=spec.name,
        gpu=chosen,
        requests=requests,
        context_len=context_len,
        max_gpus=max_gpus,
        fits=fewest,
        tried=tried,
        skipped=dict(skipped),
        needed=needed,
    )


__all__ = ["TrtllmFit", "TrtllmFitResult", "fit_trtllm"]
