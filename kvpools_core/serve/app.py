"""The ASGI application: JSON endpoints under ``/api/v1``, the calculator page at ``/``, its assets at ``/static``.

:func:`create_app` builds the plugin registry and the model catalogue once, at start-up; a request never loads a
plugin or opens a path it names.  Every answer is wrapped as ``{"meta": {...versions}, "result": ...}`` and every
refusal as ``{"meta": ..., "error": {"status", "kind", "message", ...}}``: a kvpools error keeps the CLI's text
(422), a limit names itself and the start-up option that sets it (413, 422, 429), nothing is ever a traceback.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import anyio
import attrs
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import kvpools_core
from kvpools_core.errors import KvpoolsError, PluginHookError
from kvpools_core.options import cli_surface
from kvpools_core.registry import Registry, get_registry
from kvpools_core.serve.catalog import Catalog
from kvpools_core.serve.schemas import (
    CapacityRecordRequest,
    CapacityRequest,
    CompareRequest,
    FitRequest,
    PlanRequest,
    SweepRequest,
    problem,
)
from kvpools_core.serve.service import LimitExceeded, Limits, Service, engine_versions

T = TypeVar("T")
STATIC = os.path.join(os.path.dirname(__file__), "static")


def meta() -> dict[str, Any]:
    """What every response carries: the kvpools release and the engine releases it models."""
    return {"kvpools_version": kvpools_core.__version__, "engines": engine_versions()}


def create_app(
    models_dir: str | None = None, limits: Limits | None = None, registry: Registry | None = None
) -> FastAPI:
    """The service: plugins loaded now (``registry`` or the installed ones), models listed now, limits fixed."""
    registry = registry or get_registry()
    registry.plugins()  # load every plugin at start-up: a broken one fails here, never inside a request
    service = Service(registry=registry, catalog=Catalog(registry, models_dir), limits=limits or Limits())
    gate = threading.BoundedSemaphore(service.limits.workers)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            service.catalog.close()

    app = FastAPI(
        title="kvpools",
        version=kvpools_core.__version__,
        summary="KV-cache capacity of LLM serving engines (SGLang, vLLM), exact for hybrid models.",
        lifespan=lifespan,
        docs_url=None,  # FastAPI's Swagger UI loads its script from a CDN: nothing here may need a network
        redoc_url=None,
        openapi_url="/api/v1/openapi.json",
    )
    app.state.service = service
    app.add_middleware(BodyLimit, max_bytes=service.limits.max_body_bytes)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    def answer(status: int, body: dict[str, Any]) -> JSONResponse:
        return ScrubbedJSON({"meta": meta(), **body}, status_code=status, scrub=service.catalog.scrub)

    def refuse(status: int, kind: str, message: str, **extra: Any) -> JSONResponse:
        return answer(status, {"error": {"status": status, "kind": kind, "message": message, **extra}})

    async def compute(work: Callable[[], T]) -> T:
        """``work`` in a worker thread, at most ``workers`` at once, refused past ``time_limit_s``."""

        limit = service.limits.time_limit_s
        deadline = time.monotonic() + limit

        def guarded() -> T:
            wait = min(service.limits.queue_wait_s, max(0.0, deadline - time.monotonic()))
            if not gate.acquire(timeout=wait) if wait > 0 else not gate.acquire(blocking=False):
                raise LimitExceeded(
                    "workers",
                    service.limits.workers,
                    f"All {service.limits.workers} planning workers stayed busy for "
                    f"{service.limits.queue_wait_s:g} s (kvpools serve --workers); retry shortly.",
                    status=429,
                )
            if time.monotonic() >= deadline:  # the caller has been answered already: do not plan for nobody
                gate.release()
                raise LimitExceeded("time_limit_s", limit, "timed out while queued")
            try:
                with cli_surface():  # errors name options as the CLI's flags: the same text as the CLI
                    return work()
            finally:
                gate.release()

        try:
            with anyio.fail_after(limit):
                return await anyio.to_thread.run_sync(guarded, abandon_on_cancel=True)
        except TimeoutError:
            raise LimitExceeded(
                "time_limit_s",
                limit,
                f"The request took longer than this service's limit of {limit:g} s (kvpools serve --time-limit); "
                f"ask for less (fewer contexts, a smaller grid or --max-gpus), or run the CLI, which has none.",
            ) from None

    @app.exception_handler(LimitExceeded)
    async def _limit(_: Request, error: LimitExceeded) -> Response:
        headers = {"Retry-After": "1"} if error.status == 429 else None
        response = refuse(error.status, "limit", str(error), limit=error.limit, value=error.value)
        if headers:
            response.headers.update(headers)
        return response

    @app.exception_handler(PluginHookError)
    async def _plugin_bug(_: Request, error: PluginHookError) -> Response:
        return refuse(500, "plugin_error", f"{error} This is a bug in that plugin: report it to its authors.")

    @app.exception_handler(KvpoolsError)
    async def _kvpools(_: Request, error: KvpoolsError) -> Response:
        return refuse(422, type(error).__name__, str(error))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, error: RequestValidationError) -> Response:
        problems = [
            {"field": ".".join(str(part) for part in item.get("loc", ())[1:]), "problem": problem(item)}
            for item in error.errors()
        ]
        text = "; ".join(f"{p['field'] or 'body'}: {p['problem']}" for p in problems[:5])
        return refuse(
            422, "invalid_request", f"The request does not match the API's schema: {text.rstrip('.')}.", fields=problems
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, error: StarletteHTTPException) -> Response:
        return refuse(error.status_code, "http_error", f"{error.detail} (the API is under /api/v1, the page at /).")

    @app.exception_handler(ValidationError)
    async def _invalid_form(_: Request, error: ValidationError) -> Response:
        text = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {problem(e)}" for e in error.errors()[:5])
        return refuse(422, "invalid_request", f"The form does not make a valid request: {text.rstrip('.')}.")

    @app.exception_handler(Exception)
    async def _bug(_: Request, error: Exception) -> Response:
        return refuse(
            500,
            "internal_error",
            f"internal error, a bug in kvpools: {type(error).__name__}: {error}. Please report it.",
        )

    # -- reference data ------------------------------------------------------------------------------------------

    @app.get("/api/v1/version", tags=["reference"])
    async def version() -> dict[str, Any]:
        """The kvpools release and the engine releases whose accountings it models."""
        return {"meta": meta(), "result": meta()}

    @app.get("/api/v1/presets", tags=["reference"])
    async def presets() -> Response:
        """The models a request may name: the presets and the entries of --models-dir."""
        return answer(200, {"result": service.catalog.names()})

    @app.get("/api/v1/plugins", tags=["reference"])
    async def plugins() -> Response:
        """The plugins loaded at start-up (``kvpools plugins --json``)."""
        return answer(200, {"result": [attrs.asdict(info) for info in registry.plugins()]})

    @app.get("/api/v1/gpus", tags=["reference"])
    async def gpus() -> Response:
        """The GPU catalogue the platform plugins contribute."""
        from kvpools_core.pipeline.gpus import accelerators

        return answer(200, {"result": [gpu.to_dict() for gpu in accelerators(registry)]})

    # -- planning ------------------------------------------------------------------------------------------------

    @app.post("/api/v1/plan", tags=["planning"])
    async def plan(request: PlanRequest) -> Response:
        """``kvpools plan --json``: the pools, the budget arithmetic, the cost per group (any accounting)."""
        return answer(200, {"result": await compute(lambda: service.plan_summary(request))})

    @app.post("/api/v1/build-check", tags=["planning"])
    async def build_check(request: PlanRequest) -> Response:
        """``kvpools build --device meta --json``: the pools built on ``meta``, each pool's bytes against the plan."""
        return answer(200, {"result": await compute(lambda: service.build_check(request))})

    @app.post("/api/v1/capacity", tags=["planning"])
    async def capacity(request: CapacityRequest) -> Response:
        """``kvpools capacity --json``: concurrency per context, what binds and why, the engine's launch line."""
        return answer(200, {"result": await compute(lambda: service.capacity(request))})

    @app.post("/api/v1/capacity-record", tags=["orchestrators"])
    async def capacity_record(request: CapacityRecordRequest) -> Response:
        """The capacity record (``shape`` kvpools), or the fields Dynamo (``dynamo``) or llm-d (``llm-d``) read."""
        return answer(200, {"result": await compute(lambda: service.capacity_record(request))})

    @app.post("/api/v1/compare", tags=["planning"])
    async def compare(request: CompareRequest) -> Response:
        """``kvpools compare --json``: SGLang's and vLLM's accountings of one model and budget."""
        return answer(200, {"result": await compute(lambda: service.compare(request))})

    @app.post("/api/v1/fit", tags=["planning"])
    async def fit(request: FitRequest) -> Response:
        """``kvpools fit --json``: the configurations on the fewest GPUs that hold the requests."""
        return answer(200, {"result": await compute(lambda: service.fit(request))})

    @app.post("/api/v1/sweep", tags=["planning"])
    async def sweep(request: SweepRequest) -> Response:
        """``kvpools sweep --format json``, bounded (--max-grid-points) and paged (``offset``, ``limit``)."""
        return answer(200, {"result": await compute(lambda: service.sweep(request))})

    @app.get("/api/v1/calculator", tags=["page"])
    async def calculator(request: Request) -> Response:
        """The calculator page's answer for its query (the page's fields: model or config, gpu or memory, accounting,
        tp_size, pp_size, dp_size, kv_cache_dtype, page_size, contexts, speculative_*): capacity and plan in one."""
        from kvpools_core.serve.page import calculator as answer_page

        params = dict(request.query_params)
        return answer(200, {"result": await compute(lambda: answer_page(service, params))})

    # -- the page --------------------------------------------------------------------------------------------------

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page(request: Request) -> Response:
        from kvpools_core.serve.page import render_page

        html, status = await render_page(service, dict(request.query_params), compute)
        return HTMLResponse(service.catalog.scrub(html), status_code=status)

    return app


class ScrubbedJSON(JSONResponse):
    """A JSON response with the service's own paths (uploads, --models-dir) taken out of every string."""

    def __init__(self, content: Any, *, scrub: Callable[[str], str], **kwargs: Any) -> None:
        self._scrub = scrub
        super().__init__(content, **kwargs)

    def render(self, content: Any) -> bytes:
        return self._scrub(json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))).encode()


class BodyLimit:
    """Refuse a request body over ``max_bytes`` (declared or streamed) with 413, before anything parses it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        if declared is None:  # a chunked body: read it whole (bounded), then hand it on
            chunks: list[bytes] = []
            seen, more = 0, True
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away
                chunks.append(message.get("body", b""))
                seen += len(chunks[-1])
                if seen > self.max_bytes:
                    await self._refuse(send)
                    return
                more = message.get("more_body", False)
            body, handed = b"".join(chunks), False

            async def replay() -> Message:
                nonlocal handed
                if handed:
                    return await receive()
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}

            await self.app(scope, replay, send)
            return
        await self.app(scope, receive, send)

    async def _refuse(self, send: Send) -> None:
        message = (
            f"The request body is larger than this service's limit of {self.max_bytes:,} bytes "
            f"(kvpools serve --max-body-bytes); a config.json is kilobytes."
        )
        body = json.dumps(
            {
                "meta": meta(),
                "error": {
                    "status": 413,
                    "kind": "limit",
                    "message": message,
                    "limit": "max_body_bytes",
                    "value": self.max_bytes,
                },
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})
