"""The calculator page without a script: the form is a GET of ``/``, answered below it on the server, with the
numbers of the API; the page loads nothing from outside the service."""

from __future__ import annotations

import re
from typing import Any

QUERY = "model=gpt-oss-20b&gpu=h100&contexts=8k,32k,128k&tp_size=1&pp_size=1&dp_size=1&kv_cache_dtype=auto"


def test_the_empty_page_is_a_form_with_every_asset_local(client: Any) -> None:
    page = client.get("/")
    assert page.status_code == 200
    assert '<form id="calc" method="get" action="/">' in page.text
    assert 'id="answer"' not in page.text
    assets = re.findall(r'(?:src|href)="([^"]*)"', page.text)
    assert "/static/calc.js" in assets and "/static/calc.css" in assets
    assert not [url for url in assets if "//" in url], assets  # no CDN, no other host: works offline
    for asset, kind in (("/static/calc.js", "javascript"), ("/static/calc.css", "css")):
        response = client.get(asset)
        assert response.status_code == 200 and kind in response.headers["content-type"]
    assert '<option value="gpt-oss-20b">gpt-oss-20b</option>' in page.text


def test_the_page_answers_without_a_script_with_the_apis_numbers(client: Any) -> None:
    api = client.post(
        "/api/v1/capacity", json={"model": "gpt-oss-20b", "gpu": "h100", "contexts": ["8k", "32k", "128k"]}
    ).json()["result"]
    page = client.get("/?" + QUERY)
    assert page.status_code == 200
    rows = re.findall(r"<tr><td>([\d,]+)</td><td>([\d,]+)</td><td>([^<]+)</td>", page.text)
    assert rows == [
        (f"{row['context_len']:,}", f"{row['concurrent_requests']:,}", row["binding"]) for row in api["ladder"]
    ]
    assert api["launch"] in page.text
    assert '<option value="gpt-oss-20b" selected>' in page.text  # the form keeps its state
    assert 'value="8k,32k,128k"' in page.text


def test_the_calculator_json_is_the_capacity_answer(client: Any) -> None:
    api = client.post(
        "/api/v1/capacity", json={"model": "gpt-oss-20b", "gpu": "h100", "contexts": ["8k", "32k", "128k"]}
    ).json()["result"]
    answer = client.get("/api/v1/calculator?" + QUERY).json()["result"]
    assert answer["capacity"] == api
    assert answer["request"] == {
        "model": "gpt-oss-20b",
        "gpu": "h100",
        "contexts": ["8k", "32k", "128k"],
        "serving": {"tp_size": 1, "pp_size": 1, "dp_size": 1, "kv_cache_dtype": "auto"},
    }
    assert answer["plan"]["budget"]["gpu_total_bytes"] == 85_520_809_984  # the H100's total as SGLang reads it


def test_vllm_fields_are_vllms_flags_on_the_page(client: Any) -> None:
    answer = client.get("/api/v1/calculator?model=llama-3.1-8b&gpu=h100&accounting=vllm&page_size=32").json()
    assert answer["result"]["request"]["vllm"] == {"block_size": 32}
    assert answer["result"]["plan"]["block_size"] == 32
    page = client.get("/?model=llama-3.1-8b&gpu=h100&accounting=vllm&page_size=32&contexts=8k")
    assert page.status_code == 200 and "vllm serve meta-llama/Meta-Llama-3.1-8B" in page.text


def test_a_bad_form_is_an_error_on_the_page(client: Any) -> None:
    page = client.get("/?model=llama-3.1-8b&memory=1MiB")
    assert page.status_code == 422
    assert '<div class="error" role="alert"><strong>Error:</strong> ' in page.text and "Raise --memory" in page.text
    page = client.get("/?model=llama-3.1-8b&tp_size=two")
    assert page.status_code == 422 and "tp_size must be a whole number, got &#x27;two&#x27;" in page.text
    page = client.get("/?config=%7Bnot%20json")
    assert page.status_code == 422 and "not valid JSON" in page.text
    error = client.get("/api/v1/calculator?model=llama-3.1-8b&device=cuda").json()["error"]
    assert error["message"].startswith("Unknown page field(s) device")


def test_speculative_decoding_reaches_the_plan_and_the_launch_line(client: Any) -> None:
    query = (
        "model=llama-3.1-8b&gpu=h100&contexts=8k&speculative_algorithm=EAGLE&speculative_num_steps=3"
        "&speculative_eagle_topk=1&speculative_num_draft_tokens=4&speculative_draft_num_layers=1"
    )
    answer = client.get("/api/v1/calculator?" + query).json()["result"]
    plain = client.get("/api/v1/calculator?model=llama-3.1-8b&gpu=h100&contexts=8k").json()["result"]
    draft = [pool["name"] for pool in answer["plan"]["pools"] if pool["name"].startswith("draft")]
    assert draft, answer["plan"]["pools"]  # the draft layer's KV pool is planned beside the target's
    assert answer["capacity"]["counts"]["tokens"]["full"] < plain["capacity"]["counts"]["tokens"]["full"]
    assert answer["capacity"]["launch"].endswith(
        "--speculative-algorithm EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 4"
    )


def test_no_page_of_the_service_loads_a_script_from_elsewhere(client: Any) -> None:
    """FastAPI's Swagger UI and ReDoc pages fetch their scripts from a CDN: they are not served."""
    missing = client.get("/api/docs")
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "Not Found (the API is under /api/v1, the page at /)."
    assert client.get("/api/v1/plan").json()["error"]["status"] == 405
    assert client.get("/docs").status_code == 404
    assert client.get("/redoc").status_code == 404
    assert client.get("/api/v1/openapi.json").status_code == 200


def test_every_slot_of_the_page_is_filled(client: Any) -> None:
    """No ``$name`` of the template is left in the page (the draft-layers field showed its slot's name)."""
    for query in ("", "?" + QUERY):
        page = client.get("/" + query)
        assert re.findall(r"\$[a-z_]+", page.text) == [], query


def test_vllm_only_fields_reach_vllm_on_the_page(client: Any) -> None:
    """Issue 34: the runtime profile, the batched tokens, the multimodal limits and --language-model-only are the
    page's fields too; the answer is the API's for the same options, and a bad JSON is the CLI's text on the page."""
    query = (
        "model=qwen3.6-35b-a3b-nvfp4&gpu=rtx-5090&accounting=vllm&kv_cache_dtype=fp8&runtime_profile=0.33"
        "&max_running_requests=1&max_num_batched_tokens=8192&context_length=131072&contexts=8k"
        "&limit_mm_per_prompt=%7B%22image%22%3A%200%2C%20%22video%22%3A%200%7D"
    )
    answer = client.get("/api/v1/calculator?" + query).json()["result"]
    vllm = {
        "runtime_profile": "0.33",
        "max_num_seqs": 1,
        "max_num_batched_tokens": 8192,
        "max_model_len": 131072,
        "limit_mm_per_prompt": '{"image": 0, "video": 0}',
    }
    assert answer["request"]["vllm"] == vllm
    api = client.post(
        "/api/v1/capacity",
        json={
            "model": "qwen3.6-35b-a3b-nvfp4",
            "gpu": "rtx-5090",
            "contexts": ["8k"],
            "serving": {"accounting": "vllm", "kv_cache_dtype": "fp8"},
            "vllm": vllm,
        },
    ).json()["result"]
    assert answer["capacity"] == api
    page = client.get("/?" + query)
    assert page.status_code == 200 and "--limit-mm-per-prompt" in page.text
    assert '<option value="0.33" selected>' in page.text
    lmo = client.get(
        "/api/v1/calculator?model=qwen3.6-35b-a3b-nvfp4&gpu=rtx-5090&accounting=vllm&language_model_only=on&contexts=8k"
    ).json()["result"]
    assert lmo["request"]["vllm"] == {"language_model_only": True}
    assert lmo["capacity"]["launch"].endswith("--language-model-only")
    page = client.get("/?model=qwen3.6-35b-a3b-nvfp4&gpu=rtx-5090&accounting=vllm&limit_mm_per_prompt=image%3D0")
    assert page.status_code == 422
    assert "vllm.limit_mm_per_prompt: --limit-mm-per-prompt must be a JSON object" in page.text
    assert "(vLLM 0.33 does not take KEY=VALUE pairs)" in page.text
