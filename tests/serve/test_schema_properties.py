"""Property tests from the service's own OpenAPI schema: any body the schema admits gets a 200 or a structured 4xx
(never a 500, never a traceback), and a 200 is what the endpoint promises.

Bodies are drawn from each endpoint's request schema by :func:`from_schema` below, a strategy for the JSON Schema
subset pydantic writes ($ref, anyOf, objects, arrays, bounded numbers and strings, enums, const). schemathesis and
hypothesis-jsonschema do this in general, but hypothesis-jsonschema 0.23.1 fails on the hypothesis this project
pins (``AttributeError: 'many' object has no attribute 'more'``). Half the bodies are steered (:func:`steered`) to a
preset, a real budget and real context lengths, so that drawn serving options reach the planners and not only the
schema's refusals.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serve.conftest import EXTRA

pytest.importorskip("fastapi", reason=EXTRA)
pytest.importorskip("httpx2", reason=EXTRA)

ENDPOINTS = ("plan", "build-check", "capacity", "capacity-record", "compare", "fit", "sweep")
LIMITS = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["image", "video", "audio"]), st.integers(0, 999), max_size=3),
    st.dictionaries(st.sampled_from(["image", "video"]), st.integers(0, 4), max_size=2).map(json.dumps),
)
"""vLLM's --limit-mm-per-prompt as the CLI takes it (a JSON object's text) or as a JSON object: a steered body's
limits, so that they reach plan_vllm (the schema's own draws are mostly strings the engine's parser refuses)."""
PRESETS = ("llama-3.1-8b", "gpt-oss-20b", "qwen3-next-80b-a3b-thinking", "deepseek-v2-lite", "gemma-2-9b")


def from_schema(node: dict[str, Any], root: dict[str, Any] | None = None) -> st.SearchStrategy[Any]:
    """Values valid under ``node`` (the subset of JSON Schema pydantic writes); ``root`` resolves ``$ref``."""
    root = root if root is not None else node
    if "$ref" in node:
        target: Any = root
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        return st.deferred(lambda: from_schema(target, root))
    if "anyOf" in node:
        return st.one_of([from_schema(option, root) for option in node["anyOf"]])
    if "const" in node:
        return st.just(node["const"])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        low = node.get("minimum", node.get("exclusiveMinimum", -(1 << 40) - 1) + 1)
        high = node.get("maximum", node.get("exclusiveMaximum", (1 << 40) + 1) - 1)
        return st.integers(low, high)
    if kind == "number":
        return st.floats(
            node.get("minimum", node.get("exclusiveMinimum")),
            node.get("maximum", node.get("exclusiveMaximum")),
            exclude_min="exclusiveMinimum" in node,
            exclude_max="exclusiveMaximum" in node,
            allow_nan=False,
            allow_infinity=False,
        )
    if kind == "string":
        return st.text(min_size=node.get("minLength", 0), max_size=min(node.get("maxLength", 24), 24))
    if kind == "array":
        items = from_schema(node.get("items", {"type": "integer"}), root)
        return st.lists(items, min_size=node.get("minItems", 0), max_size=min(node.get("maxItems", 4), 4))
    if kind == "object":
        properties = node.get("properties", {})
        required = set(node.get("required", ()))
        fixed = st.fixed_dictionaries(
            {name: from_schema(properties[name], root) for name in sorted(required)},
            optional={name: from_schema(sub, root) for name, sub in properties.items() if name not in required},
        )
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            keys = from_schema(node.get("propertyNames", {"type": "string", "maxLength": 16}), root)
            more = st.dictionaries(keys, from_schema(extra, root), max_size=min(node.get("maxProperties", 3), 3))
            return st.tuples(fixed, more).map(lambda pair: {**pair[1], **pair[0]})
        return fixed
    return st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))  # {}: anything JSON


@pytest.fixture(scope="module")
def schema(client: Any) -> dict[str, Any]:
    response = client.get("/api/v1/openapi.json")
    assert response.status_code == 200
    return dict(response.json())


def body_schema(schema: dict[str, Any], endpoint: str) -> dict[str, Any]:
    """The request body's schema with the document's components beside it, so that its $refs resolve."""
    operation = schema["paths"][f"/api/v1/{endpoint}"]["post"]
    body = dict(operation["requestBody"]["content"]["application/json"]["schema"])
    return {**body, "components": schema["components"]}


def steered(body: dict[str, Any], name: str, size: Any, contexts: list[int], limits: Any = None) -> dict[str, Any]:
    """A drawn body aimed at the planners: a preset, a budget that exists, real context lengths; the drawn serving
    options stay (their combinations are what the planners must refuse cleanly or answer)."""
    body = {k: v for k, v in body.items() if k not in ("config", "gpu", "gpu_memory", "free_memory", "draft_model")}
    if "models" in body:
        return {**body, "models": [name], "memory": [size], "gpu": [], "contexts": contexts, "axes": {}}
    body.update(model=name, memory=size)
    for key in ("weights_memory", "reserved_memory", "runtime_memory", "host_memory", "host_reserve", "workload"):
        body.pop(key, None)
    if "contexts" in body:
        body["contexts"] = contexts
    if "context" in body:
        body["context"] = contexts[0] if contexts else 8192
    if "max_gpus" in body or ("requests" in body and "headroom" not in body):  # fit: a GPU, a few requests
        body.update(requests=min(body.get("requests") or 1, 64), gpu="h100", max_gpus=8)
        body.pop("memory")
    elif body.get("requests") is not None:
        body["requests"] = min(body["requests"], 1 << 20)
    if isinstance(body.get("serving"), dict) and body["serving"].get("accounting") != "vllm":
        body.pop("vllm", None)
    if isinstance(body.get("vllm"), dict):  # vLLM's multimodal limits and engine version as the CLI takes them
        body["vllm"].update(limit_mm_per_prompt=limits, engine_version=None)
    return body


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_every_schema_valid_body_is_answered_or_refused_cleanly(
    client: Any, schema: dict[str, Any], endpoint: str
) -> None:
    strategy = from_schema(body_schema(schema, endpoint))

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(
        body=strategy,
        steer=st.booleans(),
        name=st.sampled_from(PRESETS),
        size=st.sampled_from(["4GiB", "40GiB", 80 << 30]),
        contexts=st.lists(st.sampled_from([1024, 8192, 32768, 131072, 1 << 20]), max_size=3),
        limits=LIMITS,
    )
    def check(body: dict[str, Any], steer: bool, name: str, size: Any, contexts: list[int], limits: Any) -> None:
        if steer:
            body = steered(body, name, size, contexts, limits)
        response = client.post(f"/api/v1/{endpoint}", json=body)
        assert response.status_code in (200, 413, 422, 429), (body, response.text)
        assert "Traceback" not in response.text
        answer = response.json()
        assert set(answer["meta"]) == {"kvpools_version", "engines"}
        if response.status_code == 200:
            assert isinstance(answer["result"], dict)
        else:
            error = answer["error"]
            assert error["status"] == response.status_code and error["message"].strip()

    check()


def test_the_schema_names_every_endpoint_and_the_serving_fields(schema: dict[str, Any]) -> None:
    import attrs

    from kvpools_core.values import Serving

    assert {f"/api/v1/{endpoint}" for endpoint in ENDPOINTS} <= set(schema["paths"])
    serving = schema["components"]["schemas"]["ServingOptions"]["properties"]
    resolved = {"platform_traits", "workspaces", "speculative_draft"}
    assert set(serving) == {field.name for field in attrs.fields(Serving)} - resolved
    assert schema["components"]["schemas"]["ServingOptions"]["additionalProperties"] is False


def test_the_schema_takes_every_vllm_option_of_the_cli(schema: dict[str, Any]) -> None:
    """Issue 34: the API's ``vllm`` block is the CLI's ``--accounting vllm`` options (``_VLLM_OPTIONS``, plan and
    capacity) and ``--engine-version``, by the same names; --runtime-profile's choices are the CLI's."""
    from kvpools_core.cli.common import _VLLM_OPTIONS, RUNTIME_PROFILES

    vllm = schema["components"]["schemas"]["VllmOptions"]
    assert set(vllm["properties"]) == {*_VLLM_OPTIONS, "engine_version"}
    assert vllm["additionalProperties"] is False
    profiles = {v for option in vllm["properties"]["runtime_profile"]["anyOf"] for v in option.get("enum", ())}
    assert profiles == {*RUNTIME_PROFILES, *(f"vllm=={version}" for version in RUNTIME_PROFILES)}
