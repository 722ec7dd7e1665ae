"""Inverse planning: the configurations on the fewest GPUs that hold N concurrent requests of L tokens.

:func:`fit` plans every candidate configuration on one GPU model (each with
SGLang's profile arithmetic, :func:`kvpools_core.plan` with ``gpu=``), asks
:func:`kvpools_core.planning.capacity.concurrency` how many requests of ``L`` tokens
each holds, and keeps those holding ``N``.  A candidate is

* ``tp_size`` and ``pp_size`` (powers of two), one engine on ``tp x pp`` GPUs;
* DP attention (``dp_size = tp_size`` with ``enable_dp_attention``) where
  ``tp_size > 1``: requests split over ``tp`` attention workers;
* ``replicas``: copies of that engine behind SGLang's router (``--dp-size``
  without DP attention), each with its own KV cache, so a configuration holds
  ``replicas x`` one engine's requests on ``replicas x tp x pp`` GPUs;
* the KV dtype (the caller's, else ``auto`` and ``fp8_e4m3``) and the page
  size (the caller's, else the smallest of 1 and the platform's page rules
  that the model and platform accept).

Each engine is planned with ``--context-length L``; when SGLang's default
request cap (at least 2048) is what stops it, it is planned again with
``--max-running-requests`` at ``N`` split over the replicas.  A candidate the
plugins refuse (heads that do not split, a dtype the platform cannot store,
weights that leave no room, a weights estimate that does not model DP
attention) is skipped, and the reason counted.

**Ranking**: fewest GPUs first, then the most headroom (requests held / N),
then the fewest pipeline stages, then the fewest replicas (one engine is
simpler to run than several).  When nothing fits within ``max_gpus``, the
answer says what would: the engine (of up to ``max_gpus`` GPUs) whose
replicas hold N on the fewest GPUs, ``ceil(N / held) x GPUs per engine``
(exact for those replicas, which are identical engines; larger engines may
need fewer), or, when no engine holds even one request of ``L``, the largest
context one request reaches.
"""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter
from typing import Any

import attrs

from kvpools_core.errors import ConfigError, InsufficientMemoryError, KvpoolsError
from kvpools_core.models import launch_model_path as _launch_model_path
from kvpools_core.models import load_model
from kvpools_core.options import option
from kvpools_core.pipeline import plan as make_plan
from kvpools_core.pipeline.gpus import GPU, custom_gpu, find_gpu
from kvpools_core.planning.capacity import Capacity, concurrency, engine_flags, max_context
from kvpools_core.registry import get_registry
from kvpools_core.values import Plan, Serving

DEFAULT_MAX_GPUS = 8
"""One node of eight GPUs: the configurations SGLang serves without multi-node launch flags."""
MAX_GPUS = 1024
"""The largest ``max_gpus`` (``--max-gpus``): 128 nodes of eight, beyond SGLang's largest deployments (about a
hundred GPUs).  The search plans every power-of-two TP x PP shape up to it, and when nothing fits bisects each
one's GPU memory, so a run's time grows with it (about two minutes at 1024 on a 2-core machine when nothing
fits) and an unbounded one never ends in practice."""

DEFAULT_KV_DTYPES = ("auto", "fp8_e4m3")
GiB = 1 << 30
LARGEST_GPU_SEARCHED = 16 << 40
"""The bisection for the memory that would fit gives up above 16 TiB a GPU."""

GPUS_PER_NODE = 8
"""Replicas that fit one node launch as one server with ``--dp-size`` (SGLang's DP controller, a scheduler each
with the whole ``--max-running-requests``: the request cap is divided by DP-attention workers only); more
replicas are separate launches of the one-engine line."""


@attrs.frozen
class Fit:
    """One configuration that holds the requests: its engine plan, replicas, capacity and launch line."""

    plan: Plan
    replicas: int
    gpus: int
    requests_held: int
    headroom: float
    capacity: Capacity
    launch: tuple[str, ...]

    @property
    def launch_line(self) -> str:
        return shlex.join(self.launch)

    def describe(self, *, replicas: bool = True) -> str:
        """The configuration in SGLang's words: TP, PP, DP attention, replicas, KV dtype and page."""
        s = self.plan.serving
        parts = [f"TP {s.tp_size}"]
        if s.pp_size > 1:
            parts.append(f"PP {s.pp_size}")
        if s.enable_dp_attention:
            parts.append(f"DP attention {s.dp_size}")
        if replicas and self.replicas > 1:
            parts.append(f"{self.replicas} replicas")
        parts.append(f"kv {s.kv_cache_dtype}")
        parts.append(f"page {s.page_size}")
        return " · ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        s = self.plan.serving
        return {
            "gpus": self.gpus,
            "tp_size": s.tp_size,
            "pp_size": s.pp_size,
            "dp_size": s.dp_size,
            "enable_dp_attention": s.enable_dp_attention,
            "replicas": self.replicas,
            "kv_cache_dtype": s.kv_cache_dtype,
            "page_size": s.page_size,
            "mem_fraction_static": self.plan.budget.mem_fraction_static,
            "budget_bytes": self.plan.budget.budget_bytes,
            "max_total_num_tokens": self.plan.sizing.max_total_num_tokens,
            "requests_held": self.requests_held,
            "headroom": self.headroom,
            "binding": self.capacity.binding,
            "launch": self.launch_line,
        }


@attrs.frozen
class FitResult:
    """What :func:`fit` found: the ranked fits on the fewest GPUs, or why nothing fits and what would."""

    model: str
    gpu: GPU
    requests: int
    context_len: int
    max_gpus: int
    fits: tuple[Fit, ...]
    tried: int
    skipped: dict[str, int]
    needed: str | None = None
    best: Fit | None = None
    memory_needed_bytes: int | None = None
    """When nothing fits: the smallest whole-GiB GPU total on which ``max_gpus`` GPUs would hold the requests
    (the engine shape that holds the most requests per GPU, replicated), found by bisection and checked."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "gpu": {"name": self.gpu.name, "label": self.gpu.label, "total_bytes": self.gpu.total_bytes},
            "requests": self.requests,
            "context_len": self.context_len,
            "max_gpus": self.max_gpus,
            "fits": [f.to_dict() for f in self.fits],
            "tried": self.tried,
            "skipped": dict(self.skipped),
            "needed": self.needed,
            "best": self.best.to_dict() if self.best is not None else None,
            "memory_needed_bytes": self.memory_needed_bytes,
        }


def fit(
    model: str,
    requests: int,
    context_len: int,
    *,
    gpu: str | GPU | None = None,
    gpu_memory: int | str | None = None,
    max_gpus: int = DEFAULT_MAX_GPUS,
    kv_cache_dtype: str | None = None,
    page_size: int | None = None,
    serving: Serving | None = None,
    runtime_memory: int | str | None = None,
) -> FitResult:
    """The configurations on the fewest GPUs (up to ``max_gpus``) that hold ``requests`` of ``context_len``.

    ``serving`` carries every other option (accounting, chunked prefill, ...);
    its parallelism, KV dtype, page size, context length and request cap are
    what this search chooses.  ``model`` must be a full config (a path), since
    each configuration's weights are estimated from it.
    """
    o = option
    if requests < 1:
        raise ConfigError(f"{o('requests')} must be at least 1, got {requests}.")
    if context_len < 1:
        raise ConfigError(f"{o('context')} must be at least one token, got {context_len}.")
    if max_gpus < 1:
        raise ConfigError(f"{o('max_gpus')} must be at least 1, got {max_gpus}.")
    if max_gpus > MAX_GPUS:
        raise ConfigError(
            f"{o('max_gpus')} {max_gpus:,} is more than kvpools fit searches: at most {MAX_GPUS:,} "
            f"(128 nodes of 8 GPUs; the search plans every TP x PP shape up to it). Pass {o('max_gpus')} {MAX_GPUS} "
            f"or fewer."
        )
    base = serving or Serving()
    chosen = _gpu(gpu, gpu_memory, base)
    spec, _ = load_model(model, get_registry())
    if context_len > spec.context_len:
        raise ConfigError(
            f"{o('context')} {context_len} is longer than {spec.name}'s context length {spec.context_len}; "
            f"SGLang refuses a longer --context-length."
        )
    _check_weights(model, spec.name)
    base = attrs.evolve(
        base, context_length=context_len, max_running_requests=None, platform=chosen.platform, platform_traits=None
    )
    dtypes = (kv_cache_dtype,) if kv_cache_dtype else DEFAULT_KV_DTYPES
    skipped: Counter[str] = Counter()
    engines: list[tuple[Plan, Capacity]] = []
    shapes: list[Serving] = []
    tried = 0
    for tp, pp in _parallel_shapes(max_gpus):
        for dp_attention in (False, True) if tp > 1 else (False,):
            for dtype in dtypes:
                shape = attrs.evolve(
                    base,
                    tp_size=tp,
                    pp_size=pp,
                    dp_size=tp if dp_attention else 1,
                    enable_dp_attention=dp_attention,
                    kv_cache_dtype=dtype,
                )
                tried += 1
                shapes.append(shape)
                planned = _plan_engine(model, shape, chosen, page_size, requests, runtime_memory, skipped)
                if planned is not None:
                    engines.append(planned)
    fits = []
    for engine, held in engines:
        gpus_per_engine = engine.serving.tp_size * engine.serving.pp_size
        per_engine = held.concurrent_requests * engine.serving.attn_dp_size
        if per_engine < 1:
            continue
        replicas = math.ceil(requests / per_engine)
        if replicas * gpus_per_engine <= max_gpus:
            fits.append(_fit(model, engine, held, replicas, requests, context_len))
    fits.sort(key=_rank)
    fewest = [f for f in fits if f.gpus == fits[0].gpus] if fits else []
    result = FitResult(
        model=spec.name,
        gpu=chosen,
        requests=requests,
        context_len=context_len,
        max_gpus=max_gpus,
        fits=tuple(fewest),
        tried=tried,
        skipped=dict(skipped),
    )
    if fewest:
        return result
    needed, best = _what_would_fit(model, engines, requests, context_len, max_gpus)
    larger = _larger_gpu(model, shapes, requests, chosen, max_gpus, page_size, runtime_memory)
    if larger is not None:
        engine, replicas, total = larger
        needed += (
            f" Or, on {max_gpus} GPUs: {replicas} x ({_shape(engine.serving)}) on GPUs of at least "
            f"{total // GiB} GiB total memory each (as SGLang reads it; same flags, SGLang's default fraction for "
            f"that memory)."
        )
    return attrs.evolve(result, needed=needed, best=best, memory_needed_bytes=larger[2] if larger else None)


def _check_weights(model: str, name: str) -> None:
    """Every configuration's weights are estimated from the config: refuse one that carries no shapes, once."""
    from kvpools_core.pipeline.weights import estimate_weights

    try:
        estimate_weights(model)
    except KvpoolsError as error:
        raise ConfigError(
            f"kvpools fit estimates each configuration's weights from the model's config, and cannot for {name}: "
            f"{error} Pass a full config.json (or its directory)."
        ) from error


def _gpu(gpu: str | GPU | None, gpu_memory: int | str | None, serving: Serving) -> GPU:
    if (gpu is None) == (gpu_memory is None):
        raise ConfigError(f"kvpools fit plans on one GPU model: pass {option('gpu')} or {option('gpu_memory')}.")
    if isinstance(gpu, GPU):
        return gpu
    if gpu is not None:
        return find_gpu(gpu)
    assert gpu_memory is not None
    return custom_gpu(gpu_memory, serving.platform)


def _parallel_shapes(max_gpus: int) -> list[tuple[int, int]]:
    """``(tp, pp)`` powers of two with ``tp x pp <= max_gpus``, fewest GPUs first."""
    powers = [2**i for i in range(max_gpus.bit_length()) if 2**i <= max_gpus]
    return sorted(((tp, pp) for tp in powers for pp in powers if tp * pp <= max_gpus), key=lambda s: (s[0] * s[1], s))


def _plan_engine(
    model: str,
    serving: Serving,
    gpu: GPU,
    page_size: int | None,
    requests: int,
    runtime_memory: int | str | None,
    skipped: Counter[str],
) -> tuple[Plan, Capacity] | None:
    """One engine planned on ``gpu`` at the first page size that plans, and how many requests it holds."""
    first_error = ""
    for page in _page_candidates(serving, page_size):
        candidate = serving if page is None else attrs.evolve(serving, page_size=page)
        try:
            engine = make_plan(model, candidate, gpu=gpu, runtime_memory=runtime_memory)
            held = concurrency(engine, serving.context_length or 1)
            if held.binding == "request cap" and held.concurrent_requests * serving.attn_dp_size < requests:
                # SGLang's default cap (2048 to 4096) binds: ask for the requests themselves.
                capped = attrs.evolve(candidate, max_running_requests=max(requests, serving.attn_dp_size))
                engine = make_plan(model, capped, gpu=gpu, runtime_memory=runtime_memory)
                held = concurrency(engine, serving.context_length or 1)
        except KvpoolsError as error:
            # The reason SGLang's own page (the first candidate) fails, not why the other pages fail after it.
            first_error = first_error or _reason(error)
            continue
        return engine, held
    skipped[first_error] += 1
    return None


def _page_candidates(serving: Serving, page_size: int | None) -> list[int | None]:
    """The caller's page, else SGLang's own for the model (``None``: left unset, the ``engine_defaults`` the
    plan applies, e.g. DeepSeek-V4's 256), then 1 and every page the platform's rules name, smallest first."""
    if page_size is not None:
        return [page_size]
    try:
        from kvpools_core.pipeline import resolve_platform, resolve_platform_traits

        traits = resolve_platform_traits(resolve_platform(serving, get_registry()), get_registry()).traits
    except KvpoolsError:
        return [None, 1]
    return [None, *sorted({1} | {size for rule in traits.page_size_rules for size in rule.sizes})]


def _reason(error: KvpoolsError) -> str:
    """A skip reason to count, without the numbers that vary from one configuration to the next."""
    text = str(error)
    if isinstance(error, InsufficientMemoryError):
        if text.startswith("The weights"):
            return "the weights do not fit on the GPU"
        if text.startswith("Loaded weights"):
            return "the weights leave no room for the KV cache under SGLang's mem_fraction_static"
        return "not one page of KV cache fits"
    cause = error.__cause__ if isinstance(error.__cause__, KvpoolsError) else error
    first = re.split(r"(?<=\.)\s", str(cause), maxsplit=1)[0]
    return f"{type(cause).__name__}: {first}"


def _fit(model: str, engine: Plan, held: Capacity, replicas: int, requests: int, context_len: int) -> Fit:
    per_engine = held.concurrent_requests * engine.serving.attn_dp_size
    total = per_engine * replicas
    return Fit(
        plan=engine,
        replicas=replicas,
        gpus=replicas * engine.serving.tp_size * engine.serving.pp_size,
        requests_held=total,
        headroom=total / requests,
        capacity=held,
        launch=launch_command(model, engine, replicas, context_len),
    )


def _rank(f: Fit) -> tuple[int, float, int, int]:
    return (f.gpus, -f.headroom, f.plan.serving.pp_size, f.replicas)


def launch_command(model: str, engine: Plan, replicas: int, context_len: int) -> tuple[str, ...]:
    """``python -m sglang.launch_server`` with the flags that make SGLang size this plan.

    ``--model-path`` is :func:`launch_model_path` of ``model``. Replicas that fit one node are ``--dp-size``;
    more are that many launches of the line without it.

    The request cap comes from :func:`kvpools_core.planning.capacity.engine_flags` with no headroom
    (the requests the plan holds at ``context_len``, over the DP-attention workers);
    ``--mem-fraction-static`` is written when the plan's fraction is not SGLang's default.
    """
    s = engine.serving
    flags = engine_flags(engine, context_len, 0.0)
    line = ["python", "-m", "sglang.launch_server", "--model-path", launch_model_path(model)]
    line += ["--tp-size", str(s.tp_size)]
    if s.pp_size > 1:
        line += ["--pp-size", str(s.pp_size)]
    if s.enable_dp_attention:
        line += ["--dp-size", str(s.dp_size), "--enable-dp-attention"]
    elif replicas > 1 and replicas * s.tp_size * s.pp_size <= GPUS_PER_NODE:
        line += ["--dp-size", str(replicas)]
    if s.kv_cache_dtype != "auto":
        line += ["--kv-cache-dtype", s.kv_cache_dtype]
    if s.page_size != 1:
        line += ["--page-size", str(s.page_size)]
    if s.mem_fraction_static is not None:
        line += ["--mem-fraction-static", str(s.mem_fraction_static)]
    line += [*flags.args()]
    return tuple(line)


def launch_model_path(model: str) -> str:
    """What SGLang's ``--model-path`` takes for ``model``: :func:`kvpools_core.models.launch_model_path`."""
    return _launch_model_path(model, get_registry())


def _what_would_fit(
    model: str, engines: list[tuple[Plan, Capacity]], requests: int, context_len: int, max_gpus: int
) -> tuple[str, Fit | None]:
    """What it would take: the fewest GPUs with uncapped replicas, else the context one request reaches."""
    holding = [(engine, held) for engine, held in engines if held.concurrent_requests > 0]
    if holding:
        candidates = [
            _fit(
                model,
                engine,
                held,
                math.ceil(requests / (held.concurrent_requests * engine.serving.attn_dp_size)),
                requests,
                context_len,
            )
            for engine, held in holding
        ]
        best = min(candidates, key=_rank)
        per_engine = best.requests_held // best.replicas
        return (
            f"does not fit on up to {max_gpus} GPUs: the best engine ({best.describe(replicas=False)}, "
            f"{best.gpus // best.replicas} GPUs) holds {per_engine} requests of {context_len} tokens, so "
            f"{requests} need {best.replicas} of them: {best.gpus} GPUs. Allow them ({option('max_gpus')} "
            f"{best.gpus}; larger engines, allowed then, may need fewer) or use a GPU with more memory."
        ), best
    if not engines:
        return (
            f"does not fit on up to {max_gpus} GPUs: no configuration plans (the weights leave no room for the "
            f"KV cache or the plugins refuse them; see the skipped reasons). Use a larger GPU or more GPUs."
        ), None
    widest = max(engines, key=lambda e: max_context(e[0], 1).context_len)
    reach = max_context(widest[0], 1).context_len
    s = widest[0].serving
    return (
        f"does not fit on up to {max_gpus} GPUs: no engine holds one request of {context_len} tokens; the "
        f"largest (TP {s.tp_size}, PP {s.pp_size}, kv {s.kv_cache_dtype}) reaches {reach} tokens for one request. "
        f"Allow more GPUs per engine ({option('max_gpus')}) or a GPU with more memory."
    ), None


def _shape(s: Serving) -> str:
    dp = f", DP attention {s.dp_size}" if s.enable_dp_attention else ""
    return f"TP {s.tp_size}, PP {s.pp_size}{dp}, kv {s.kv_cache_dtype}, page {s.page_size}"


def _larger_gpu(
    model: str,
    shapes: list[Serving],
    requests: int,
    gpu: GPU,
    max_gpus: int,
    page_size: int | None,
    runtime_memory: int | str | None,
) -> tuple[Plan, int, int] | None:
    """The smallest whole-GiB GPU total on which ``max_gpus`` GPUs hold the requests, over every shape tried.

    Each shape is replicated ``max_gpus // its GPUs`` times; its total memory is bisected over whole GiB
    between the GPU's (too small) and the first doubling that holds them, and the answer is checked at
    1 GiB less (the bisection assumes more memory never holds fewer requests; a shape where it does is left
    out). A shape that does not hold them even at 16 TiB is left out.
    """
    found: tuple[Plan, int, int] | None = None
    for shape in shapes:
        replicas = max_gpus // (shape.tp_size * shape.pp_size)
        need = math.ceil(requests / replicas)

        def planned(total_gib: int, shape: Serving = shape, need: int = need) -> Plan | None:
            """The engine on a GPU of ``total_gib``, if it holds ``need`` requests there."""
            skipped: Counter[str] = Counter()
            engine = _plan_engine(
                model, shape, custom_gpu(total_gib * GiB, gpu.platform), page_size, need, runtime_memory, skipped
            )
            if engine is None:
                return None
            held = engine[1].concurrent_requests * shape.attn_dp_size
            return engine[0] if held >= need else None

        ceiling = LARGEST_GPU_SEARCHED // GiB
        if found is not None:
            ceiling = found[2] // GiB - 1  # only a smaller GPU is news
        if ceiling <= gpu.total_bytes // GiB or planned(ceiling) is None:
            continue
        low, high = gpu.total_bytes // GiB, max(gpu.total_bytes // GiB, 1) * 2
        while high < ceiling and planned(high) is None:
            low, high = high, high * 2
        high = min(high, ceiling)
        while high - low > 1:
            middle = (low + high) // 2
            if planned(middle) is not None:
                high = middle
            else:
                low = middle
        engine = planned(high)
        if engine is None or planned(high - 1) is not None:
            continue
        found = (engine, replicas, high * GiB)
    return found
