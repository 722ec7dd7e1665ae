"""What each endpoint computes, with no web framework: a request body in, the CLI's JSON object out.

Every answer comes from the functions the CLI calls (:func:`kvpools_core.plan`, :mod:`kvpools_core.planning.capacity`,
:func:`~kvpools_core.planning.capacity_record.capacity_document`,
:func:`~kvpools_core.planning.compare.compare_engines`,
:func:`~kvpools_core.planning.fit.fit`, :func:`~kvpools_core.planning.sweep.run_sweep`, vLLM's
:func:`~kvpools_core.engines.vllm.deployment.plan_vllm`), fed as the CLI feeds them, so the service's numbers are the
CLI's for the same inputs (``tests/serve/test_api.py`` compares them).  Two things differ on purpose: the
platform defaults to the GPU's, else ``cuda`` (a service never probes its own host), and a host tier needs the
node's host memory stated (it is never measured here).
"""

from __future__ import annotations

import re
from typing import Any

import attrs

from kvpools_core.errors import ConfigError, KvpoolsError
from kvpools_core.registry import Registry
from kvpools_core.serve.catalog import Catalog
from kvpools_core.serve.schemas import (
    CapacityRecordRequest,
    CapacityRequest,
    CompareRequest,
    FitRequest,
    ModelChoice,
    PlanRequest,
    SweepRequest,
)
from kvpools_core.values import Plan, Serving

SGLANG_VERSION = "0.5.23"
"""The SGLang release whose sizing kvpools reproduces (the ``sglang`` and ``exact`` accountings)."""

_BUDGET = ("memory", "free_memory", "gpu", "gpu_memory", "weights_memory", "reserved_memory", "runtime_memory")
_HOST = ("host_memory", "host_reserve")
_WORKLOAD = re.compile(r"\s*(lognormal:|uniform:|\d+(\.\d+)?\s*[kKmM]?\s*$)")


def engine_versions() -> dict[str, str]:
    """The engine releases whose accountings this kvpools models (every engine of :mod:`kvpools_core.engines`)."""
    from kvpools_core.engines import engines

    return {name: engine.version for name, engine in engines().items()}


@attrs.frozen
class Limits:
    """What one request may ask for; each refusal names its limit and the start-up option that sets it."""

    max_body_bytes: int = 256 * 1024
    max_grid_points: int = 512
    max_fit_gpus: int = 64
    time_limit_s: float = 20.0
    workers: int = 2
    queue_wait_s: float = 5.0
    """How long a request waits for a free worker before it is refused (429)."""


class LimitExceeded(Exception):
    """A request beyond one of :class:`Limits`: 413 for the body, 422 for the rest, naming the limit."""

    def __init__(self, limit: str, value: Any, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.limit, self.value, self.status = limit, value, status


@attrs.define
class Service:
    """The registry (built at start-up, plugins loaded then and never on request), the models, the limits."""

    registry: Registry
    catalog: Catalog
    limits: Limits = attrs.field(factory=Limits)

    # -- models ---------------------------------------------------------------------------------------------

    def model_of(self, request: ModelChoice) -> str:
        """The model argument for kvpools' functions: a preset's name or a file the service owns."""
        if request.config is not None:
            return self.catalog.upload(request.config)
        assert request.model is not None  # ModelChoice checks that one of the two is given
        return self.catalog.resolve(request.model)

    def model_name(self, request: ModelChoice, model: str) -> str:
        """What a client calls the model in the next request: its name, or an upload's ``uploaded-<hash>``."""
        if request.model is not None:
            return request.model
        return self.catalog.scrub(model).split("/", 1)[0]

    # -- serving --------------------------------------------------------------------------------------------

    def serving_options(self, request: PlanRequest) -> dict[str, Any]:
        """The request's Serving fields (unset ones left out, as the CLI leaves unset flags out)."""
        options = {k: v for k, v in request.serving.model_dump().items() if v is not None}  # type: ignore[attr-defined]
        if "pp_layer_partition" in options:
            options["pp_layer_partition"] = tuple(options["pp_layer_partition"])
        return options

    def make_serving(self, options: dict[str, Any], gpu: str | None, gpu_memory: Any) -> Serving:
        """The CLI's ``_gpu_defaults`` and ``_make_serving``, with the platform never probed on this host."""
        from kvpools_core.pipeline import select_platform
        from kvpools_core.pipeline.gpus import custom_gpu, find_gpu, sglang_chunked_prefill_size

        options = dict(options)
        if gpu is not None or gpu_memory is not None:
            chosen = (
                find_gpu(gpu, self.registry)
                if gpu is not None
                else custom_gpu(gpu_memory, options.get("platform") or "cuda")
            )
            if gpu is not None and options.get("platform") is None:
                options["platform"] = chosen.platform
            if options.get("chunked_prefill_size") is None:
                options["chunked_prefill_size"] = sglang_chunked_prefill_size(chosen.total_mib, chosen.platform)
        options["platform"] = select_platform(options.get("platform") or "cuda", None, self.registry)
        return Serving(**options)

    def budget(self, request: PlanRequest, *, host: bool = True) -> dict[str, Any]:
        budget = {name: getattr(request, name) for name in _BUDGET}
        if request.draft_model is not None:
            budget["draft_model"] = self.catalog.resolve(request.draft_model)
        if host:
            budget.update({name: getattr(request, name) for name in _HOST})
        return budget

    def _check_host(self, request: PlanRequest, serving: Serving) -> None:
        if serving.enable_hierarchical_cache and request.host_memory is None:
            raise ConfigError(
                "--enable-hierarchical-cache plans a host tier against the node's host memory, which the service "
                'does not measure on its own host: state it as "host_memory" (e.g. "512GiB").'
            )

    # -- plan -----------------------------------------------------------------------------------------------

    def plan(self, request: PlanRequest) -> Plan:
        """The SGLang-semantics plan of a request (accounting ``exact`` or ``sglang``)."""
        from kvpools_core.pipeline import plan as make_plan

        model = self.model_of(request)
        serving = self.make_serving(self.serving_options(request), request.gpu, request.gpu_memory)
        self._check_host(request, serving)
        return make_plan(model, serving, **self.budget(request))

    def plan_summary(self, request: PlanRequest) -> dict[str, Any]:
        """``kvpools plan --json`` (or ``--accounting vllm --json``)."""
        from kvpools_core.cli.plan_report import plan_summary

        if self._is_vllm(request):
            return dict(self.vllm_plan(request).to_dict())
        self._refuse_vllm_options(request)
        return plan_summary(self.plan(request))

    def build_check(self, request: PlanRequest) -> dict[str, Any]:
        """``kvpools build --device meta --json``: the pools built on the meta device, every byte against the plan."""
        from kvpools_core.building import build as build_pools
        from kvpools_core.cli.build_report import build_summary

        if self._is_vllm(request):
            raise ConfigError(
                "kvpools build plans with SGLang's semantics: --accounting vllm is plan and capacity only."
            )
        self._refuse_vllm_options(request)
        if all(getattr(request, name) is None for name in ("memory", "free_memory", "gpu", "gpu_memory")):
            raise ConfigError(
                "--device meta measures no memory: pass the budget as --memory, --free-memory SIZE, or --gpu NAME."
            )
        return build_summary(build_pools(self.plan(request), "meta"))

    # -- capacity -------------------------------------------------------------------------------------------

    def capacity(self, request: CapacityRequest) -> dict[str, Any]:
        """``kvpools capacity --json`` (or vLLM's), with the launch line and why each limit binds."""
        return self.capacity_and_plan(request)[0]

    def capacity_and_plan(self, request: CapacityRequest) -> tuple[dict[str, Any], Any]:
        """The capacity answer and the plan it was read from (a :class:`Plan`, or vLLM's result)."""
        from kvpools_core.cli.capacity_report import CapacityReport, capacity_summary
        from kvpools_core.planning.capacity import CONTEXT_LADDER, concurrency, engine_flags, limits_of, max_context
        from kvpools_core.planning.capacity import parse_context_len as parse
        from kvpools_core.planning.split import choose_split, parse_workload

        asked = [parse(item) for item in request.contexts]
        if self._is_vllm(request):
            return self.vllm_capacity(request, asked)
        self._refuse_vllm_options(request)
        workload = None
        if request.workload is not None:
            if not _WORKLOAD.match(request.workload):
                raise ConfigError(
                    f"--workload {request.workload!r}: the service takes a context length (8k), "
                    "'lognormal:median=4096,p99=32768' or 'uniform:1k..32k'; it reads no trace file."
                )
            workload = parse_workload(request.workload)
        model = self.model_of(request)
        serving = self.make_serving(self.serving_options(request), request.gpu, request.gpu_memory)
        self._check_host(request, serving)
        budget = self.budget(request)
        if serving.enable_unified_memory:
            return self._unified_capacity(request, model, serving, budget, asked, workload)
        from kvpools_core.pipeline import plan as make_plan

        result = make_plan(model, serving, **budget)
        limits = limits_of(result)
        flags_context = max([c for c in asked if c <= limits.context_len], default=limits.context_len)
        try:
            flags, flags_error = engine_flags(result, flags_context, request.headroom), None
        except KvpoolsError as error:
            flags, flags_error = None, str(error)
        split_budget = {k: v for k, v in budget.items() if k not in _HOST}
        report = CapacityReport(
            plan=result,
            limits=limits,
            ladder=tuple(concurrency(result, length) for length in (asked or CONTEXT_LADDER)),
            single_request=max_context(result, 1),
            concurrent=max_context(result, request.requests) if request.requests is not None else None,
            flags=flags,
            flags_error=flags_error,
            split=choose_split(model, serving, split_budget, workload) if workload is not None else None,
        )
        summary = capacity_summary(report)
        summary["why"] = [explain(answer, result) for answer in report.ladder]
        summary["launch"] = self._launch(model, result, flags_context)
        return summary, result

    def _unified_capacity(
        self,
        request: CapacityRequest,
        model: str,
        serving: Serving,
        budget: dict[str, Any],
        asked: list[int],
        workload: Any,
    ) -> tuple[dict[str, Any], Any]:
        """``kvpools capacity --enable-unified-memory --json``: the arena, each length's requests, the three modes
        (the host budget is left out, as the CLI leaves it: a host tier is refused under unified memory)."""
        from kvpools_core.cli.unified_report import unified_summary

        if request.requests is not None:
            raise ConfigError(
                "--enable-unified-memory answers requests per context length in the arena and the three-mode "
                "comparison; --requests (the longest context N requests reach) is not modelled for it yet."
            )
        budget = {k: v for k, v in budget.items() if k not in _HOST}
        return unified_summary(model, serving, budget, asked or [8192, 32768], workload)

    def _launch(self, model: str, plan: Plan, context_len: int) -> str | None:
        from kvpools_core.planning.fit import launch_command

        try:
            line = list(launch_command(model, plan, 1, context_len))
        except KvpoolsError:
            return None  # no request of that length fits: there is no line to launch
        serving = plan.serving
        if serving.speculative_algorithm is not None:  # launch_command (fit's) plans no speculative decoding
            line += ["--speculative-algorithm", serving.speculative_algorithm]
            for name in ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"):
                value = getattr(serving, name)
                if value is not None:
                    line += [f"--{name.replace('_', '-')}", str(value)]
        return " ".join(line)

    def capacity_record(self, request: CapacityRecordRequest) -> dict[str, Any]:
        """The capacity document (``--format capacity-json``), or the Dynamo / llm-d shape of it."""
        from kvpools_core.planning.capacity import parse_context_len
        from kvpools_core.planning.capacity_record import capacity_document, stage_plans
        from kvpools_core.serve.shapes import dynamo_shape, llm_d_shape

        if self._is_vllm(request):
            raise ConfigError(
                "--format capacity-json follows SGLang's semantics; it is not offered for --accounting vllm."
            )
        self._refuse_vllm_options(request)
        model = self.model_of(request)
        serving = self.make_serving(self.serving_options(request), request.gpu, request.gpu_memory)
        self._check_host(request, serving)
        context = parse_context_len(request.context) if request.context is not None else None
        document = capacity_document(stage_plans(model, serving, **self.budget(request)), context_len=context)
        if request.shape == "dynamo":
            return dynamo_shape(document)
        if request.shape == "llm-d":
            return llm_d_shape(document)
        return document

    # -- vLLM -----------------------------------------------------------------------------------------------

    def _is_vllm(self, request: PlanRequest) -> bool:
        """``serving.accounting`` vllm, or ``vllm.engine_version`` (vllm==X.Y, as the CLI's --engine-version sets the
        accounting); an accounting that names another engine beside it is the CLI's refusal."""
        accounting = request.serving.accounting  # type: ignore[attr-defined]
        version = request.vllm.engine_version if request.vllm is not None else None
        if version is None:
            return bool(accounting == "vllm")
        from kvpools_core.planning.engine_version import apply_engine_version

        options = {"accounting": accounting, "engine_version": version}
        apply_engine_version(options)  # the schema checked that it names vllm
        return bool(options["accounting"] == "vllm")

    def _refuse_vllm_options(self, request: PlanRequest) -> None:
        if request.vllm is not None:
            given = [f"--{k.replace('_', '-')}" for k, v in request.vllm.model_dump().items() if v is not None]
            if given:
                raise ConfigError(
                    f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} vLLM's: only with --accounting vllm "
                    "(SGLang's names are --mem-fraction-static, --context-length, --max-running-requests, "
                    "--page-size)."
                )

    def vllm_plan(self, request: PlanRequest) -> Any:
        """The CLI's ``--accounting vllm`` path: vLLM's flags taken, SGLang's budget flags refused."""
        from kvpools_core.engines.vllm.deployment import VLLM_READ_FIELDS, sglang_option_refused
        from kvpools_core.planning.engine_version import apply_engine_version, plan_vllm

        named = [
            f"--{name.replace('_', '-')}"
            for name in ("free_memory", "reserved_memory", "runtime_memory", "draft_model")
            if getattr(request, name) is not None
        ]
        if named:
            raise ConfigError(
                f"{', '.join(named)} {'belongs' if len(named) == 1 else 'belong'} to SGLang's planning, not to "
                "--accounting vllm, whose budget is --memory SIZE (vLLM's --kv-cache-memory-bytes) or --gpu NAME / "
                "--gpu-memory SIZE with --gpu-memory-utilization and --weights-memory (docs/vllm.md)."
            )
        options = self.serving_options(request)
        for name, value in options.items():
            if name in VLLM_READ_FIELDS or value == ():
                continue
            raise ConfigError(sglang_option_refused(name))
        args = request.vllm.model_dump() if request.vllm is not None else {}
        if args.get("kv_offloading_size") is not None and request.host_memory is None:
            raise ConfigError(
                "--kv-offloading-size is checked against the node's host memory, which the service does not measure "
                'on its own host: state it as "host_memory".'
            )
        version = args.pop("engine_version", None)
        if version is not None:  # the CLI's --engine-version: the runtime profile, dropped with a --memory budget
            given = {"accounting": "vllm", "engine_version": version, "runtime_profile": args.get("runtime_profile")}
            profile = apply_engine_version(given)
            args.update(runtime_profile=given["runtime_profile"], engine_version_profile=profile)
        serving = Serving(**{**options, "platform": "cuda"})
        host = {"host_memory": request.host_memory, "host_reserve": request.host_reserve, "registry": self.registry}
        return plan_vllm(
            self.model_of(request),
            serving,
            request.memory,
            request.gpu,
            request.gpu_memory,
            request.weights_memory,
            {**args, **host},
        )

    def vllm_capacity(self, request: CapacityRequest, asked: list[int]) -> tuple[dict[str, Any], Any]:
        from kvpools_core.engines.vllm.deployment import capacity_dict
        from kvpools_core.planning.capacity import CONTEXT_LADDER

        if request.requests is not None or request.workload is not None:
            raise ConfigError(
                "--requests, --workload belong to SGLang's planning, not to --accounting vllm, whose budget is "
                "--memory SIZE (vLLM's --kv-cache-memory-bytes) or --gpu NAME / --gpu-memory SIZE with "
                "--gpu-memory-utilization and --weights-memory (docs/vllm.md)."
            )
        result = self.vllm_plan(request)
        contexts = asked or [length for length in CONTEXT_LADDER if length <= result.max_model_len]
        summary = capacity_dict(result, contexts)
        summary["launch"] = result.serve_command()
        return summary, result

    # -- compare, fit, sweep ----------------------------------------------------------------------------------

    def compare(self, request: CompareRequest) -> dict[str, Any]:
        """``kvpools compare --json``."""
        from kvpools_core.planning.capacity import parse_context_len
        from kvpools_core.planning.compare import compare_engines

        fields: dict[str, Any] = {}
        if request.tp_size is not None:
            fields["tp_size"] = request.tp_size
        if request.kv_cache_dtype is not None:
            fields["kv_cache_dtype"] = request.kv_cache_dtype
        model = self.model_of(request)
        comparison = compare_engines(
            model,
            Serving(**fields),
            contexts=[parse_context_len(item) for item in request.contexts],
            memory=request.memory,
            gpu=request.gpu,
            gpu_memory=request.gpu_memory,
            weights_memory=request.weights_memory,
            context_length=request.context_length,
            page_size=request.page_size,
            block_size=request.block_size,
            registry=self.registry,
        )
        data = comparison.to_dict()
        if request.enable_unified_memory:
            from kvpools_core.planning.compare_unified import compare_unified, unified_comparison_dict

            budget = {name: getattr(request, name) for name in ("memory", "gpu", "gpu_memory", "weights_memory")}
            data["unified"] = unified_comparison_dict(
                *compare_unified(model, comparison, registry=self.registry, **budget)
            )
        return data

    def fit(self, request: FitRequest) -> dict[str, Any]:
        """``kvpools fit --json`` (``fits: []`` where the CLI exits 1: nothing fits)."""
        from kvpools_core.planning.capacity import parse_context_len
        from kvpools_core.planning.fit import fit as find_fits

        if request.max_gpus > self.limits.max_fit_gpus:
            raise LimitExceeded(
                "max_fit_gpus",
                self.limits.max_fit_gpus,
                f"max_gpus {request.max_gpus} is above this service's limit of {self.limits.max_fit_gpus} GPUs per "
                f"fit (kvpools serve --max-fit-gpus); the CLI (kvpools fit --max-gpus) searches up to 1024.",
            )
        options: dict[str, Any] = {
            "mem_fraction_static": request.mem_fraction_static,
            "chunked_prefill_size": request.chunked_prefill_size,
            "accounting": request.accounting,
        }
        serving = self.make_serving(
            {k: v for k, v in options.items() if v is not None}, request.gpu, request.gpu_memory
        )
        result = find_fits(
            self.model_of(request),
            request.requests,
            parse_context_len(request.context),
            gpu=request.gpu,
            gpu_memory=request.gpu_memory,
            max_gpus=request.max_gpus,
            kv_cache_dtype=request.kv_cache_dtype,
            page_size=request.page_size,
            serving=serving,
            runtime_memory=request.runtime_memory,
        )
        return result.to_dict()

    def sweep(self, request: SweepRequest) -> dict[str, Any]:
        """``kvpools sweep --format json``, bounded by ``max_grid_points`` and paged by ``offset`` / ``limit``."""
        from kvpools_core.models import load_model
        from kvpools_core.pipeline import select_platform
        from kvpools_core.planning.sweep import SweepGrid, run_sweep

        if not request.memory and not request.gpu:
            raise ConfigError(
                "kvpools sweep needs budgets: --memory SIZE,... (KV cache budgets, e.g. 40GiB,80GiB) or --gpu NAME,... "
                "(whole GPUs, e.g. h100,h200)."
            )
        axes = [(name, [_text(value) for value in values]) for name, values in request.axes.items()]
        grid = SweepGrid(
            models=[self.catalog.resolve(name) for name in request.models],
            axes=axes,
            budgets=[{"memory": size} for size in request.memory] + [{"gpu": name} for name in request.gpu],
            contexts=list(request.contexts) or ["8k", "32k", "128k"],
            serving={"platform": select_platform(request.platform or "cuda", None, self.registry)},
        )
        if len(grid) > self.limits.max_grid_points:
            raise LimitExceeded(
                "max_grid_points",
                self.limits.max_grid_points,
                f"The sweep has {len(grid):,} points, above this service's limit of {self.limits.max_grid_points:,} "
                f"(kvpools serve --max-grid-points); split it, or run kvpools sweep, which has none.",
            )
        for model in grid.models:
            load_model(model, self.registry)
        rows = run_sweep(grid, jobs=1, registry=self.registry)
        page = rows[request.offset : request.offset + request.limit]
        return {
            "total": len(rows),
            "offset": request.offset,
            "limit": request.limit,
            "next_offset": request.offset + len(page) if request.offset + len(page) < len(rows) else None,
            "rows": [row.to_dict() for row in page],
        }


def _text(value: Any) -> str:
    """An axis value as the CLI's ``--axis NAME=V`` spells it."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def explain(answer: Any, plan: Plan) -> str:
    """Why ``answer``'s limit binds, and the option that moves it, in one sentence."""
    from kvpools_core.planning.capacity import (
        CONTEXT_LIMIT,
        REQUEST_CAP,
        STATE_SLOTS,
        limits_of,
        why_none,
        window_pool_sizing,
    )

    length, held = answer.context_len, answer.concurrent_requests
    serving = plan.serving
    if not held:
        limits = limits_of(plan)
        return f"None fit: {why_none(limits, answer, budget_bytes=plan.budget.budget_bytes)}."
    binding = answer.binding
    if binding == CONTEXT_LIMIT:
        return f"{length:,} tokens exceed the context length."
    if binding == REQUEST_CAP:
        return (
            f"The request cap binds at {held:,} (max_running_requests {plan.max_running_requests:,} per DP worker): "
            f"raise --max-running-requests; the pools hold more."
        )
    if binding == STATE_SLOTS:
        return (
            f"The state cache binds at {held:,}: every running request holds its recurrent state whatever its length; "
            f"raise --mamba-full-memory-ratio (now {serving.mamba_full_memory_ratio}) or --max-mamba-cache-size to "
            f"give state more of the budget."
        )
    space = binding.removesuffix(" tokens")
    per = answer.tokens_per_request.get(space)
    count = plan.counts["tokens"].get(space)
    if space == "full":
        return (
            f"Full-attention KV binds at {held:,}: {count:,} tokens / {per:,} per request. More memory, a smaller "
            f"--kv-cache-dtype (fp8_e4m3) or a larger --tp-size raise it."
        )
    if any(window.token_space == space for window in plan.windows):
        binds = f"The {space} pool binds at {held:,}: {count:,} tokens / {per:,} per request (its window's worst case)"
        sized = window_pool_sizing(plan, space)
        if sized is not None:
            return f"{binds}; {sized}."
        return (
            f"{binds}. Raise --swa-full-tokens-ratio (now {serving.swa_full_tokens_ratio}) to give the sliding-window "
            f"pool more of the budget, or capacity --workload to choose the split."
        )
    return f"The {space} token space binds at {held:,}: {count:,} tokens / {per:,} per request."
