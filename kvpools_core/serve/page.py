"""The calculator page: one form whose fields are the URL's query, answered as JSON (for ``calc.js``) or as HTML.

The form's fields map to a :class:`~kvpools_core.serve.schemas.CapacityRequest` here, once, for both paths: the
page's script fetches ``/api/v1/calculator?<the same query>`` and draws the answer; without a script the form is a
plain GET of ``/`` and the answer is rendered below it on the server.  Either way the URL holds the whole state,
so a link reproduces the page.
"""

from __future__ import annotations

import html
import json
import string
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import attrs
from pydantic import ValidationError

from kvpools_core.errors import ConfigError, KvpoolsError
from kvpools_core.serve.schemas import CapacityRequest, problem
from kvpools_core.serve.service import LimitExceeded, Service

T = TypeVar("T")
Compute = Callable[[Callable[[], T]], Awaitable[T]]

TEMPLATE = Path(__file__).with_name("static") / "page.html"
INT_FIELDS = (
    "tp_size",
    "pp_size",
    "dp_size",
    "page_size",
    "context_length",
    "max_running_requests",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_num_layers",
)
FLOAT_FIELDS = ("mem_fraction_static",)
CHOICE_FIELDS = ("kv_cache_dtype", "speculative_algorithm", "accounting")
BOOL_FIELDS = ("enable_dp_attention",)
BUDGET_FIELDS = ("gpu", "memory", "gpu_memory", "weights_memory")
VLLM_NAMES = {
    "page_size": "block_size",
    "context_length": "max_model_len",
    "max_running_requests": "max_num_seqs",
    "mem_fraction_static": "gpu_memory_utilization",
}
"""Under ``accounting=vllm`` the page's fields are vLLM's flags of the same meaning."""
VLLM_FIELDS = ("runtime_profile", "max_num_batched_tokens", "limit_mm_per_prompt", "language_model_only")
"""vLLM's own flags with no SGLang field of the same meaning: sent as ``vllm`` (refused, as the CLI refuses them,
under another accounting); their values are checked by the schema (the CLI's checks)."""
FORM_FIELDS = (
    "model",
    "config",
    *BUDGET_FIELDS,
    "contexts",
    *INT_FIELDS,
    *FLOAT_FIELDS,
    *CHOICE_FIELDS,
    *BOOL_FIELDS,
    *VLLM_FIELDS,
)


def form_request(params: Mapping[str, str]) -> dict[str, Any]:
    """The capacity request body the page's fields (the URL's query) stand for."""
    unknown = sorted(set(params) - set(FORM_FIELDS))
    if unknown:
        raise ConfigError(f"Unknown page field(s) {', '.join(unknown)}; the page takes {', '.join(FORM_FIELDS)}.")
    given = {k: v.strip() for k, v in params.items() if v.strip()}
    body: dict[str, Any] = {}
    if "config" in given:
        try:
            body["config"] = json.loads(given["config"])
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"The pasted config.json is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})."
            ) from None
        if not isinstance(body["config"], dict):
            raise ConfigError("The pasted config.json must be a JSON object.")
    elif "model" in given:
        body["model"] = given["model"]
    for name in BUDGET_FIELDS:
        if name in given:
            body[name] = given[name]
    if "contexts" in given:
        body["contexts"] = [item.strip() for item in given["contexts"].split(",") if item.strip()]
    serving: dict[str, Any] = {}
    for name in INT_FIELDS:
        if name in given:
            try:
                serving[name] = int(given[name])
            except ValueError:
                raise ConfigError(f"{name} must be a whole number, got {given[name]!r}.") from None
    for name in FLOAT_FIELDS:
        if name in given:
            try:
                serving[name] = float(given[name])
            except ValueError:
                raise ConfigError(f"{name} must be a number, got {given[name]!r}.") from None
    for name in CHOICE_FIELDS:
        if name in given:
            serving[name] = given[name]
    for name in BOOL_FIELDS:
        if given.get(name) in ("on", "true", "1"):
            serving[name] = True
    vllm: dict[str, Any] = {}
    if serving.get("accounting") == "vllm":
        vllm = {VLLM_NAMES[name]: serving.pop(name) for name in list(serving) if name in VLLM_NAMES}
    for name in ("runtime_profile", "limit_mm_per_prompt"):
        if name in given:
            vllm[name] = given[name]
    if "max_num_batched_tokens" in given:
        try:
            vllm["max_num_batched_tokens"] = int(given["max_num_batched_tokens"])
        except ValueError:
            raise ConfigError(
                f"max_num_batched_tokens must be a whole number, got {given['max_num_batched_tokens']!r}."
            ) from None
    if given.get("language_model_only") in ("on", "true", "1"):
        vllm["language_model_only"] = True
    if vllm:
        body["vllm"] = vllm
    if serving:
        body["serving"] = serving
    return body


def calculator(service: Service, params: Mapping[str, str]) -> dict[str, Any]:
    """Everything the page shows for one query: the capacity answer and the plan's pools and budget terms."""
    from kvpools_core.cli.plan_report import plan_summary

    body = form_request(params)
    request = CapacityRequest.model_validate(body)
    capacity, plan = service.capacity_and_plan(request)
    if request.serving.accounting == "vllm":  # type: ignore[attr-defined]
        details = plan.to_dict()
        return {"request": body, "accounting": "vllm", "capacity": capacity, "plan": details}
    summary = plan_summary(plan)
    summary.pop("plan")
    summary["budget"] = attrs.asdict(plan.budget)
    summary["model"] = {
        "name": service.model_name(request, service.catalog.scrub(plan.model.source)),
        "source": plan.model.source,
    }
    return {"request": body, "accounting": plan.serving.accounting, "capacity": capacity, "plan": summary}


async def render_page(service: Service, params: dict[str, str], compute: Compute[Any]) -> tuple[str, int]:
    """The page with the form filled from ``params``, and, when a model is given, the answer rendered below it."""
    results, status = "", 200
    if params.get("model") or params.get("config"):
        try:
            answer = await compute(lambda: calculator(service, params))
            results = _results_html(answer)
        except (KvpoolsError, LimitExceeded) as error:
            results, status = _error_html(str(error)), (error.status if isinstance(error, LimitExceeded) else 422)
        except ValidationError as error:
            text = "; ".join(f"{'.'.join(map(str, e['loc']))}: {problem(e)}" for e in error.errors()[:5])
            results, status = _error_html(f"The form does not make a valid request: {text.rstrip('.')}."), 422
    template = string.Template(TEMPLATE.read_text(encoding="utf-8"))
    return template.safe_substitute(_slots(service, params, results)), status


def _slots(service: Service, params: Mapping[str, str], results: str) -> dict[str, str]:
    from kvpools_core import __version__
    from kvpools_core.pipeline.gpus import accelerators
    from kvpools_core.serve.service import engine_versions

    chosen = params.get("model", "")
    models = "".join(
        f'<option value="{html.escape(name)}"{" selected" if name == chosen else ""}>{html.escape(name)}'
        f"{' (models-dir)' if kind == 'models-dir' else ''}</option>"
        for name, kind in service.catalog.names().items()
    )
    gpu_chosen = params.get("gpu", "h100" if not params else "")
    gpus = '<option value="">(none: give the memory)</option>' + "".join(
        f'<option value="{html.escape(g.name)}"{" selected" if g.name == gpu_chosen else ""}>'
        f"{html.escape(g.label)}</option>"
        for g in accelerators(service.registry)
    )

    def value(name: str, default: str = "") -> str:
        return html.escape(params.get(name, default if not params else ""), quote=True)

    def select(name: str, options: tuple[str, ...], default: str = "") -> str:
        current = params.get(name, default)
        return "".join(
            f'<option value="{html.escape(o)}"{" selected" if o == current else ""}>'
            f"{html.escape(o or '(default)')}</option>"
            for o in options
        )

    from kvpools_core.dtypes import KV_DTYPE_CHOICES
    from kvpools_core.planning.engine_version import RUNTIME_PROFILES
    from kvpools_core.values import ACCOUNTING_MODES, SPECULATIVE_ALGORITHMS

    versions = engine_versions()
    slots = {
        "version": html.escape(__version__),
        "sglang": versions["sglang"],
        "vllm": versions["vllm"],
        "models": models,
        "gpus": gpus,
        "kv_dtypes": select("kv_cache_dtype", KV_DTYPE_CHOICES, "auto"),
        "accountings": select("accounting", ACCOUNTING_MODES, "exact"),
        "spec_algorithms": select("speculative_algorithm", ("", *SPECULATIVE_ALGORITHMS)),
        "config": html.escape(params.get("config", "")),
        "dp_attention": " checked" if params.get("enable_dp_attention") in ("on", "true", "1") else "",
        "runtime_profiles": select("runtime_profile", ("", *RUNTIME_PROFILES)),
        "language_model_only": " checked" if params.get("language_model_only") in ("on", "true", "1") else "",
        "results": results,
    }
    for name in ("memory", "gpu_memory", "weights_memory", "page_size", "context_length", "max_running_requests"):
        slots[name] = value(name)
    slots["contexts"] = value("contexts", "4k,8k,32k,128k")
    for name in ("tp_size", "pp_size", "dp_size"):
        slots[name] = value(name, "1")
    for name in (
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "speculative_draft_num_layers",
        "mem_fraction_static",
        "max_num_batched_tokens",
        "limit_mm_per_prompt",
    ):
        slots[name] = value(name)
    return slots


def _error_html(message: str) -> str:
    return f'<div class="error" role="alert"><strong>Error:</strong> {html.escape(message)}</div>'


def _num(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else html.escape(str(value))


def _gib(value: Any) -> str:
    return f"{value / (1 << 30):,.2f} GiB" if isinstance(value, int | float) else "-"


def _results_html(answer: Mapping[str, Any]) -> str:
    """The answer as plain HTML tables: what a browser without scripts shows."""
    capacity, plan = answer["capacity"], answer["plan"]
    out = ['<section id="answer" class="answer">']
    if answer["accounting"] == "vllm":
        rows = "".join(
            f"<tr><td>{_num(row['context_len'])}</td><td>{_num(row['max_concurrency'])}</td></tr>"
            for row in capacity["capacity"]
        )
        out.append(
            f"<h2>vLLM {html.escape(str(plan.get('vllm_version')))}: {_num(plan.get('num_gpu_blocks'))} blocks</h2>"
            f'<table class="ladder"><thead><tr><th>context</th><th>max concurrency</th></tr></thead>'
            f"<tbody>{rows}</tbody></table>"
        )
    else:
        tokens = " · ".join(
            f"{html.escape(space)} tokens {_num(n)}" for space, n in capacity["counts"]["tokens"].items()
        )
        out.append(
            f"<h2>{html.escape(str(capacity['model']))}: {tokens}, max running requests "
            f"{_num(plan['max_running_requests'])}</h2>"
        )
        rows = "".join(
            f"<tr><td>{_num(row['context_len'])}</td><td>{_num(row['concurrent_requests'])}</td>"
            f"<td>{html.escape(row['binding'])}</td><td>{html.escape(why)}</td></tr>"
            for row, why in zip(capacity["ladder"], capacity["why"], strict=True)
        )
        out.append(
            '<table class="ladder"><thead><tr><th>context</th><th>concurrent requests</th><th>binds</th>'
            f"<th>why</th></tr></thead><tbody>{rows}</tbody></table>"
        )
        pools = "".join(
            f"<tr><td>{html.escape(p['name'])}</td><td>{html.escape(p['kind'])}</td><td>{_num(p['slots'])}</td>"
            f"<td>{_num(p['bytes_per_slot'])}</td><td>{_gib(p['bytes'])}</td></tr>"
            for p in plan["pools"]
        )
        out.append(
            '<h3>Pools</h3><table class="pools"><thead><tr><th>pool</th><th>kind</th><th>slots</th>'
            f"<th>bytes per slot</th><th>size</th></tr></thead><tbody>{pools}</tbody></table>"
        )
        steps = "".join(f"<li>{html.escape(step)}</li>" for step in plan["budget"].get("steps", ()))
        out.append(f'<h3>Budget</h3><ol class="steps">{steps}</ol>')
    if capacity.get("launch"):
        out.append(f'<h3>Launch</h3><pre class="launch">{html.escape(capacity["launch"])}</pre>')
    out.append("</section>")
    return "".join(out)
