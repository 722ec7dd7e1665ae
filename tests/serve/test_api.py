"""The API against the CLI: the same inputs give the CLI's numbers (its ``--json``), its error text, and a refusal
that names the limit; a request never reaches a path it names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.serve.conftest import cli_error, cli_json

VERSIONS = {"sglang": "0.5.23", "vllm": "0.33.0", "trtllm": "1.2.1"}
"""The engine releases the service says it models: every engine found through the engines registry."""


def ok(response: Any) -> Any:
    body = response.json()
    assert response.status_code == 200, body
    assert body["meta"]["engines"] == VERSIONS
    import kvpools_core

    assert body["meta"]["kvpools_version"] == kvpools_core.__version__
    return body["result"]


def refused(response: Any, status: int = 422) -> dict[str, Any]:
    body = response.json()
    assert response.status_code == status, body
    assert "Traceback" not in response.text
    assert body["meta"]["engines"] == VERSIONS
    return dict(body["error"])


# -- the CLI's numbers ---------------------------------------------------------------------------------------------


def test_capacity_is_the_clis(client: Any, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    """gpt-oss-20b (sliding window) on a whole H100: the ladder, the counts and the flags of `kvpools capacity`."""
    cli = cli_json(
        kvpools_exe, cli_env, "capacity", "gpt-oss-20b", "--gpu", "h100", "--context", "8k,32k,128k", "--json"
    )
    api = ok(
        client.post("/api/v1/capacity", json={"model": "gpt-oss-20b", "gpu": "h100", "contexts": ["8k", "32k", "128k"]})
    )
    for key in ("counts", "ladder", "max_context", "flags", "windows", "context_length"):
        assert api[key] == cli[key], key
    assert api["launch"].startswith("python -m sglang.launch_server --model-path openai/gpt-oss-20b --tp-size 1")
    assert len(api["why"]) == 3


def test_plan_is_the_clis_for_each_accounting(client: Any, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    for accounting in ("exact", "sglang"):
        cli = cli_json(
            kvpools_exe, cli_env, "plan", "qwen3-next-80b-a3b-thinking", "--memory", "40GiB", "--tp-size", "4",
            "--page-size", "16", "--accounting", accounting, "--platform", "cuda", "--json",
        )  # fmt: skip
        api = ok(
            client.post(
                "/api/v1/plan",
                json={
                    "model": "qwen3-next-80b-a3b-thinking",
                    "memory": "40GiB",
                    "serving": {"tp_size": 4, "page_size": 16, "accounting": accounting},
                },
            )
        )
        assert api == cli, accounting
    cli = cli_json(kvpools_exe, cli_env, "plan", "gpt-oss-20b", "--gpu", "h100", "--accounting", "vllm", "--json")
    api = ok(
        client.post("/api/v1/plan", json={"model": "gpt-oss-20b", "gpu": "h100", "serving": {"accounting": "vllm"}})
    )
    assert api == cli


def test_vllm_capacity_is_the_clis(client: Any, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    cli = cli_json(
        kvpools_exe, cli_env, "capacity", "llama-3.1-8b", "--gpu", "h100", "--accounting", "vllm", "--block-size", "32",
        "--context", "8k,32k", "--json",
    )  # fmt: skip
    api = ok(
        client.post(
            "/api/v1/capacity",
            json={
                "model": "llama-3.1-8b",
                "gpu": "h100",
                "serving": {"accounting": "vllm"},
                "vllm": {"block_size": 32},
                "contexts": [8192, "32k"],
            },
        )
    )
    launch = api.pop("launch")
    assert api == cli
    assert launch == cli["serve_command"]


QWEN36 = ("qwen3.6-35b-a3b-nvfp4", "--accounting", "vllm", "--gpu", "rtx-5090")
QWEN36_VLLM = {"max_num_seqs": 1, "max_num_batched_tokens": 8192, "max_model_len": 131072}


def qwen36_body(**vllm: Any) -> dict[str, Any]:
    serving = {"accounting": "vllm", "kv_cache_dtype": "fp8", "quantization": "modelopt"}
    return {"model": "qwen3.6-35b-a3b-nvfp4", "gpu": "rtx-5090", "serving": serving, "vllm": {**QWEN36_VLLM, **vllm}}


def test_vllm_multimodal_limits_and_runtime_profile_are_the_clis(
    client: Any, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    """Issue 34: --limit-mm-per-prompt with --runtime-profile reach plan_vllm from the API as from the CLI: the whole
    answer is the CLI's (the encoder's profile pass and the vision tower's weights are sized from the limits)."""
    common = (
        "--kv-cache-dtype", "fp8", "--quantization", "modelopt", "--max-num-seqs", "1",
        "--max-num-batched-tokens", "8192", "--max-model-len", "131072",
    )  # fmt: skip
    limits = '{"image": 0, "video": 0}'
    cli = cli_json(
        kvpools_exe, cli_env, "plan", *QWEN36, "--runtime-profile", "0.33", *common,
        "--limit-mm-per-prompt", limits, "--json",
    )  # fmt: skip
    api = ok(client.post("/api/v1/plan", json=qwen36_body(runtime_profile="0.33", limit_mm_per_prompt=limits)))
    assert api == cli
    # the same limits as a JSON object, and vLLM's --language-model-only, which limits every modality to 0
    as_object = ok(
        client.post("/api/v1/plan", json=qwen36_body(runtime_profile="0.33", limit_mm_per_prompt=json.loads(limits)))
    )
    assert as_object == cli
    lmo = cli_json(
        kvpools_exe, cli_env, "plan", *QWEN36, "--runtime-profile", "0.33", *common, "--language-model-only", "--json"
    )
    assert ok(client.post("/api/v1/plan", json=qwen36_body(runtime_profile="0.33", language_model_only=True))) == lmo
    # the limits change the answer: without them vLLM profiles the encoder and loads the vision tower
    unlimited = ok(client.post("/api/v1/plan", json=qwen36_body(runtime_profile="0.33")))
    assert unlimited["budget"][0]["weights_memory"] > cli["budget"][0]["weights_memory"]
    # --engine-version vllm==0.33 is --accounting vllm --runtime-profile 0.33 (the serving accounting may be left out)
    body = qwen36_body(engine_version="vllm==0.33", limit_mm_per_prompt=limits)
    body["serving"].pop("accounting")
    assert ok(client.post("/api/v1/plan", json=body)) == cli
    capacity = cli_json(
        kvpools_exe, cli_env, "capacity", *QWEN36, "--engine-version", "vllm==0.33", *common,
        "--limit-mm-per-prompt", limits, "--context", "8k,128k", "--json",
    )  # fmt: skip
    api = ok(client.post("/api/v1/capacity", json={**body, "contexts": ["8k", "128k"]}))
    assert api.pop("launch").endswith('--limit-mm-per-prompt \'{"image": 0, "video": 0}\'')
    assert api == capacity


def test_vllm_option_refusals_name_the_field_with_the_clis_text(
    client: Any, kvpools_exe: str, cli_env: dict[str, str]
) -> None:
    for bad in ("{image: 0}", '{"image": -1}', "[1]", '{"image": {"width": 64}}'):
        text = cli_error(kvpools_exe, cli_env, "plan", *QWEN36, "--limit-mm-per-prompt", bad)
        error = refused(client.post("/api/v1/plan", json=qwen36_body(limit_mm_per_prompt=bad)))
        assert error["kind"] == "invalid_request"
        assert error["fields"] == [{"field": "vllm.limit_mm_per_prompt", "problem": text}], bad
        assert error["message"] == f"The request does not match the API's schema: vllm.limit_mm_per_prompt: {text}"
    text = cli_error(
        kvpools_exe, cli_env, "plan", *QWEN36, "--engine-version", "vllm==0.19", "--runtime-profile", "0.33"
    )
    error = refused(client.post("/api/v1/plan", json=qwen36_body(engine_version="vllm==0.19", runtime_profile="0.33")))
    assert error["fields"] == [{"field": "vllm.engine_version", "problem": text}]
    error = refused(client.post("/api/v1/plan", json=qwen36_body(runtime_profile="0.9")))
    assert error["fields"][0]["field"] == "vllm.runtime_profile" and "'0.33'" in error["fields"][0]["problem"]
    # under another accounting vLLM's options are refused as the CLI refuses them
    text = cli_error(
        kvpools_exe, cli_env, "plan", "llama-3.1-8b", "--memory", "40GiB", "--language-model-only",
        "--runtime-profile", "0.33",
    )  # fmt: skip
    body = {
        "model": "llama-3.1-8b",
        "memory": "40GiB",
        "vllm": {"language_model_only": True, "runtime_profile": "0.33"},
    }
    assert refused(client.post("/api/v1/plan", json=body))["message"] == text
    text = cli_error(
        kvpools_exe, cli_env, "plan", "llama-3.1-8b", "--memory", "40GiB", "--accounting", "sglang",
        "--engine-version", "vllm==0.33",
    )  # fmt: skip
    body = {"model": "llama-3.1-8b", "memory": "40GiB", "serving": {"accounting": "sglang"}}
    assert (
        refused(client.post("/api/v1/plan", json={**body, "vllm": {"engine_version": "vllm==0.33"}}))["message"] == text
    )


def test_capacity_record_and_build_check_are_the_clis(client: Any, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    args = ("llama-3.1-8b", "--memory", "40GiB", "--page-size", "16", "--tp-size", "2", "--platform", "cuda")
    cli = cli_json(kvpools_exe, cli_env, "plan", *args, "--format", "capacity-json", "--context", "32k")
    body = {"model": "llama-3.1-8b", "memory": "40GiB", "serving": {"page_size": 16, "tp_size": 2}, "context": "32k"}
    assert ok(client.post("/api/v1/capacity-record", json=body)) == cli
    built = cli_json(kvpools_exe, cli_env, "build", *args, "--device", "meta", "--json")
    body.pop("context")
    assert ok(client.post("/api/v1/build-check", json=body)) == built


def test_compare_fit_and_sweep_are_the_clis(client: Any, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    cli = cli_json(kvpools_exe, cli_env, "compare", "gpt-oss-20b", "--memory", "40GiB", "--context", "8k,64k", "--json")
    api = ok(
        client.post("/api/v1/compare", json={"model": "gpt-oss-20b", "memory": "40GiB", "contexts": ["8k", "64k"]})
    )
    assert api == cli
    cli = cli_json(
        kvpools_exe, cli_env, "fit", "llama-3.1-70b", "--requests", "64", "--context", "32k", "--gpu", "h100", "--json"
    )
    api = ok(
        client.post("/api/v1/fit", json={"model": "llama-3.1-70b", "requests": 64, "context": "32k", "gpu": "h100"})
    )
    assert api == cli
    cli = cli_json(
        kvpools_exe, cli_env, "sweep", "--model", "llama-3.1-8b,gpt-oss-20b", "--tp-size", "1,2",
        "--memory", "20GiB,40GiB", "--context", "8k,32k", "--platform", "cuda", "--format", "json",
    )  # fmt: skip
    body = {
        "models": ["llama-3.1-8b", "gpt-oss-20b"],
        "axes": {"tp_size": [1, 2]},
        "memory": ["20GiB", "40GiB"],
        "contexts": ["8k", "32k"],
        "limit": 5,
    }
    first = ok(client.post("/api/v1/sweep", json=body))
    rest = ok(client.post("/api/v1/sweep", json={**body, "offset": 5}))
    assert (first["total"], first["next_offset"], rest["next_offset"]) == (8, 5, None)
    assert first["rows"] + rest["rows"] == cli


def test_reference_lists_are_the_clis(client: Any, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    presets = cli_json(kvpools_exe, cli_env, "presets", "--json")
    assert ok(client.get("/api/v1/presets")) == dict.fromkeys(sorted(presets), "preset")
    plugins = cli_json(kvpools_exe, cli_env, "plugins", "--json")
    assert [p["name"] for p in ok(client.get("/api/v1/plugins"))] == [p["name"] for p in plugins]
    assert "h100" in [gpu["name"] for gpu in ok(client.get("/api/v1/gpus"))]
    assert ok(client.get("/api/v1/version")) == {
        "kvpools_version": ok(client.get("/api/v1/version"))["kvpools_version"],
        "engines": VERSIONS,
    }


# -- the orchestrators' shapes ---------------------------------------------------------------------------------------


def test_dynamo_and_llm_d_shapes_read_the_record(client: Any) -> None:
    """Hand-checked against the record: Dynamo's total_kv_blocks = ceil(max_total_num_tokens / page) (its
    tokens_to_kv_blocks), max_num_seqs = the per-DP-worker request cap; llm-d's lruCapacityPerServer = the blocks
    of every DP worker of one server."""
    body = {
        "model": "llama-3.1-8b",
        "memory": "40GiB",
        "serving": {"page_size": 16, "tp_size": 2, "dp_size": 2, "enable_dp_attention": True},
        "context": "32k",
    }
    record = ok(client.post("/api/v1/capacity-record", json=body))["records"][0]
    tokens = record["max_total_num_tokens"]
    dynamo = ok(client.post("/api/v1/capacity-record", json={**body, "shape": "dynamo"}))
    capacity = dynamo["workers"][0]["runtime_capacity"]
    assert capacity["total_kv_blocks"] == -(-tokens // 16) == record["total_kv_blocks"]
    assert capacity["max_num_seqs"] == record["max_running_requests"]
    assert (capacity["data_parallel_start_rank"], capacity["data_parallel_size"]) == (0, 2)
    llm_d = ok(client.post("/api/v1/capacity-record", json={**body, "shape": "llm-d"}))
    assert llm_d["parameters"] == {"autoTune": False, "blockSizeTokens": 16, "lruCapacityPerServer": 2 * (tokens // 16)}


# -- errors and limits -------------------------------------------------------------------------------------------------


def test_kvpools_errors_carry_the_clis_text(client: Any, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    text = cli_error(kvpools_exe, cli_env, "plan", "llama-3.1-8b", "--memory", "1MiB", "--platform", "cuda")
    error = refused(client.post("/api/v1/plan", json={"model": "llama-3.1-8b", "memory": "1MiB"}))
    assert error["message"] == text
    assert error["kind"] == "InsufficientMemoryError"
    text = cli_error(
        kvpools_exe, cli_env, "plan", "llama-3.1-8b", "--memory", "40GiB", "--page-size", "16", "--block-size", "32"
    )
    error = refused(
        client.post(
            "/api/v1/plan",
            json={"model": "llama-3.1-8b", "memory": "40GiB", "serving": {"page_size": 16}, "vllm": {"block_size": 32}},
        )
    )
    assert error["message"] == text


def test_schema_violations_are_structured_422s(client: Any) -> None:
    error = refused(client.post("/api/v1/plan", json={"model": "llama-3.1-8b", "serving": {"tp_size": "2"}}))
    assert error["kind"] == "invalid_request" and error["fields"][0]["field"] == "serving.tp_size"
    error = refused(client.post("/api/v1/plan", json={"model": "llama-3.1-8b", "serving": {"tp_siz": 2}}))
    assert "serving.tp_siz" in error["message"]
    error = refused(client.post("/api/v1/plan", json={"model": "llama-3.1-8b", "config": {}}))
    assert "exactly one" in error["message"]
    error = refused(client.post("/api/v1/plan", content=b"{not json", headers={"content-type": "application/json"}))
    assert error["kind"] == "invalid_request"


@pytest.mark.parametrize("name", ["/etc/passwd", "../../etc", "/proc/self/environ", "config.json", "~"])
def test_a_request_never_names_a_path(client: Any, name: str) -> None:
    for field in ("model", "draft_model"):
        body = {"model": "llama-3.1-8b", "memory": "40GiB", field: name}
        error = refused(client.post("/api/v1/plan", json=body))
        assert error["message"].startswith(f"Unknown model {name!r}: the service plans a preset"), error
    error = refused(client.post("/api/v1/sweep", json={"models": [name], "memory": ["40GiB"]}))
    assert "opens no path" in error["message"]
    error = refused(
        client.post("/api/v1/capacity", json={"model": "llama-3.1-8b", "memory": "1GiB", "workload": "/etc/passwd"})
    )
    assert "reads no trace file" in error["message"]


def test_an_uploaded_config_plans_as_its_preset_and_hides_the_servers_paths(client: Any, app: Any) -> None:
    from kvpools_core.models import registry_presets
    from kvpools_core.registry import get_registry

    config = json.loads(Path(registry_presets(get_registry())["llama-3.1-8b"][1]).read_text())
    preset = ok(client.post("/api/v1/plan", json={"model": "llama-3.1-8b", "memory": "40GiB"}))
    uploaded = client.post("/api/v1/plan", json={"config": config, "memory": "40GiB"})
    assert app.state.service.catalog.upload_dir not in uploaded.text
    result = ok(uploaded)
    assert result["max_total_num_tokens"] == preset["max_total_num_tokens"] == 319_463
    source = result["plan"]["model"]["source"]
    assert source.startswith("uploaded-") and source.endswith("/config.json")
    name = source.split("/")[0]
    again = ok(client.post("/api/v1/plan", json={"model": name, "memory": "40GiB"}))  # an upload is named after
    assert again["max_total_num_tokens"] == 319_463


def test_an_uploaded_config_meets_the_clis_bounds(
    client: Any, kvpools_exe: str, cli_env: dict[str, str], tmp_path: Path
) -> None:
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 10**9}
    (tmp_path / "config.json").write_text(json.dumps(config))
    text = cli_error(kvpools_exe, cli_env, "plan", str(tmp_path / "config.json"), "--memory", "1GiB")
    error = refused(client.post("/api/v1/plan", json={"config": config, "memory": "1GiB"}))
    assert error["message"].startswith("uploaded config.json (uploaded-")
    assert error["message"].split(": field ", 1)[1] == text.split(": field ", 1)[1]
    assert "'num_hidden_layers' is 1000000000, above 10,000, kvpools' bound for a layer count" in error["message"]


def test_a_models_dir_entry_is_planned_by_name(kvpools_exe: str, cli_env: dict[str, str], tmp_path: Path) -> None:
    from tests.serve.conftest import need_extra

    need_extra()
    from fastapi.testclient import TestClient

    from kvpools_core.models import registry_presets
    from kvpools_core.registry import get_registry
    from kvpools_core.serve.app import create_app

    (tmp_path / "my-llama").mkdir()
    config = Path(registry_presets(get_registry())["llama-3.1-8b"][1]).read_text()
    (tmp_path / "my-llama" / "config.json").write_text(config)
    cli = cli_json(
        kvpools_exe, cli_env, "plan", str(tmp_path / "my-llama"), "--memory", "40GiB", "--platform", "cuda", "--json"
    )
    with TestClient(create_app(models_dir=str(tmp_path))) as local:
        assert ok(local.get("/api/v1/presets"))["my-llama"] == "models-dir"
        response = local.post("/api/v1/plan", json={"model": "my-llama", "memory": "40GiB"})
        assert str(tmp_path) not in response.text
        assert ok(response)["max_total_num_tokens"] == cli["max_total_num_tokens"]


def limited(**limits: Any) -> Any:
    from fastapi.testclient import TestClient

    from kvpools_core.serve.app import create_app
    from kvpools_core.serve.service import Limits

    return TestClient(create_app(limits=Limits(**limits)), raise_server_exceptions=False)


def test_limits_are_4xx_naming_the_limit(app: Any) -> None:
    with limited(max_body_bytes=1000) as small:
        error = refused(small.post("/api/v1/plan", json={"config": {"pad": "x" * 2000}}), 413)
        assert (error["limit"], error["value"]) == ("max_body_bytes", 1000)
        assert "--max-body-bytes" in error["message"]
        chunks = iter([b'{"config": {"pad": "', b"x" * 2000, b'"}}'])
        error = refused(small.post("/api/v1/plan", content=chunks, headers={"content-type": "application/json"}), 413)
        assert error["limit"] == "max_body_bytes"
    with limited(max_grid_points=4) as small:
        body = {"models": ["llama-3.1-8b"], "axes": {"tp_size": [1, 2, 4]}, "memory": ["20GiB", "40GiB"]}
        error = refused(small.post("/api/v1/sweep", json=body))
        assert (error["limit"], error["value"]) == ("max_grid_points", 4)
        assert "The sweep has 6 points, above this service's limit of 4" in error["message"]
    with limited(max_fit_gpus=8) as small:
        body = {"model": "llama-3.1-8b", "requests": 1, "context": "8k", "gpu": "h100", "max_gpus": 16}
        assert refused(small.post("/api/v1/fit", json=body))["limit"] == "max_fit_gpus"
    with limited(time_limit_s=0.0) as small:  # a deadline already passed: refused before any planning is awaited
        error = refused(small.post("/api/v1/plan", json={"model": "llama-3.1-8b", "memory": "40GiB"}))
        assert (error["limit"], error["value"]) == ("time_limit_s", 0.0)
    with limited(workers=0, queue_wait_s=0.0) as small:  # no worker free, no wait: 429 with Retry-After
        response = small.post("/api/v1/plan", json={"model": "llama-3.1-8b", "memory": "40GiB"})
        assert refused(response, 429)["limit"] == "workers"
        assert response.headers["retry-after"] == "1"


def test_the_service_never_measures_its_own_host(client: Any) -> None:
    error = refused(
        client.post(
            "/api/v1/plan",
            json={"model": "llama-3.1-8b", "memory": "40GiB", "serving": {"enable_hierarchical_cache": True}},
        )
    )
    assert 'state it as "host_memory"' in error["message"]
    result = ok(
        client.post(
            "/api/v1/plan",
            json={
                "model": "llama-3.1-8b",
                "memory": "40GiB",
                "host_memory": "512GiB",
                "serving": {"enable_hierarchical_cache": True},
            },
        )
    )
    assert result["host"] is not None
    assert "device" not in PLAN_FIELDS()


def PLAN_FIELDS() -> set[str]:
    from kvpools_core.serve.schemas import PlanRequest

    return set(PlanRequest.model_fields)


def test_unexpected_errors_are_one_line_500s(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvpools_core.serve.service import Service

    def broken(self: Any, request: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(Service, "plan_summary", broken)
    error = refused(client.post("/api/v1/plan", json={"model": "llama-3.1-8b", "memory": "40GiB"}), 500)
    assert error["message"] == "internal error, a bug in kvpools: RuntimeError: boom. Please report it."


def test_the_workload_split_is_the_clis(client: Any, kvpools_exe: str, cli_env: dict[str, str]) -> None:
    """gpt-oss-20b's SWA / full split chosen for a log-normal workload, as `kvpools capacity --workload` chooses it."""
    workload = "lognormal:median=4096,p99=32768"
    cli = cli_json(
        kvpools_exe, cli_env, "capacity", "gpt-oss-20b", "--memory", "40GiB", "--platform", "cuda",
        "--workload", workload, "--context", "8k", "--json",
    )  # fmt: skip
    body = {"model": "gpt-oss-20b", "memory": "40GiB", "workload": workload, "contexts": ["8k"]}
    api = ok(client.post("/api/v1/capacity", json=body))
    assert api["split"] == cli["split"]


def test_vllm_online_fp8_names_reach_the_service(client: Any) -> None:
    """Issue 34 (fp8q34): the service takes vLLM's online shorthands under ``accounting`` vllm and echoes them on
    the ``vllm serve`` line; ``fp8`` on the unquantised Llama is planned as vLLM 0.33 serves it (``fp8_per_tensor``,
    the same weights) with its deprecation warning (model_loader/weight_utils.py L351-361); ``fp8_per_channel`` is
    refused with ``engine_version`` vllm==0.19, which predates it."""

    def body(quantization: str, **vllm: Any) -> dict[str, Any]:
        serving = {"accounting": "vllm", "quantization": quantization}
        return {"model": "llama-3.1-8b", "gpu": "h100", "serving": serving, **({"vllm": vllm} if vllm else {})}

    answers = {}
    for method in ("fp8", "fp8_per_tensor", "fp8_per_channel", "fp8_per_block"):
        answers[method] = ok(client.post("/api/v1/plan", json=body(method)))
        assert f"--quantization {method} " in json.dumps(answers[method])
    assert "is deprecated for online quantization" in json.dumps(answers["fp8"])
    assert answers["fp8"]["budget"] == answers["fp8_per_tensor"]["budget"]
    error = refused(client.post("/api/v1/plan", json=body("fp8_per_channel", engine_version="vllm==0.19")))
    assert "vLLM 0.19 has no such method (vLLM added it in 0.24)" in json.dumps(error)
