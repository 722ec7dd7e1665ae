"""The capacity record for orchestrators: golden records worked out by hand, the JSON Schema, ranks, the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from click.testing import CliRunner

from kvpools_core import Plan, Serving, plan
from kvpools_core.cli import main
from kvpools_core.errors import ConfigError
from kvpools_core.planning.capacity import concurrency
from kvpools_core.planning.capacity_record import (
    SCHEMA,
    VERSION,
    capacity_document,
    capacity_records,
    rank_ids,
    stage_plans,
)

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "docs" / "capacity-record.schema.json"


# ---------------------------------------------------------------------------
# a structural validator for the subset of JSON Schema the schema file uses (jsonschema is not a dependency)
# ---------------------------------------------------------------------------

_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
    "integer": int,
    "number": (int, float),
}


def _is(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[kind])


def validate(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Every violation of ``schema`` by ``value`` (type, const, enum, minimum, required, properties, items)."""
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, kind) for kind in kinds):
            return [f"{where}: {value!r} is not of type {kinds}"]
    problems = []
    if "const" in schema and value != schema["const"]:
        problems.append(f"{where}: {value!r} is not {schema['const']!r}")
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "minimum" in schema and isinstance(value, int) and value < schema["minimum"]:
        problems.append(f"{where}: {value} < {schema['minimum']}")
    if isinstance(value, dict):
        problems += [f"{where}: no {name!r}" for name in schema.get("required", ()) if name not in value]
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                problems += validate(value[name], sub, f"{where}.{name}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            problems.append(f"{where}: fewer than {schema['minItems']} items")
        for i, item in enumerate(value):
            problems += validate(item, schema.get("items", {}), f"{where}[{i}]")
    return problems


def undeclared(value: Any, schema: dict[str, Any], where: str = "$") -> list[str]:
    """Fields the record has and the schema (so its documentation) does not declare."""
    found = []
    if isinstance(value, dict) and "properties" in schema:
        for name, item in value.items():
            if name not in schema["properties"]:
                found.append(f"{where}.{name}")
            else:
                found += undeclared(item, schema["properties"][name], f"{where}.{name}")
    if isinstance(value, list) and "items" in schema:
        for item in value:
            found += undeclared(item, schema["items"], f"{where}[]")
    return found


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return loaded


def test_the_validator_catches_what_it_checks(schema: dict[str, Any]) -> None:
    bad = {"schema": "other", "version": "1", "context_len": 0, "complete": True, "pp_ranks": [], "records": []}
    problems = validate(bad, schema)
    assert any("'other' is not 'kvpools.capacity-record'" in p for p in problems)
    assert any("'1' is not of type ['integer']" in p for p in problems)
    assert any("0 < 1" in p for p in problems)
    assert any("fewer than 1 items" in p for p in problems)


# ---------------------------------------------------------------------------
# golden records: every number below is derived by hand from the plan's counts (tested elsewhere)
# ---------------------------------------------------------------------------

LLAMA = dict(model="llama-3.1-8b", serving=Serving(page_size=16, accounting="sglang"), memory="4GiB")
GPT_OSS = dict(model="gpt-oss-120b", serving=Serving(page_size=64, tp_size=2), memory="40GiB")
QWEN3_NEXT = dict(model="qwen3-next-80b-a3b-thinking", serving=Serving(), memory="60GiB")
FLASH = dict(
    model="deepseek-v4-flash",
    serving=Serving(page_size=256, tp_size=8, swa_full_tokens_ratio=0.8, max_running_requests=2048),
    memory="60GiB",
)
"""The numbers of tests/capacity/test_capacity_dsv4.py: SGLang's generic ratio 0.8 and 2,048 requests, given (unset:
DeepSeek-V4's 0.1 and 256)."""


_PLANS: dict[str, Plan] = {}


def _plan(case: dict[str, Any]) -> Plan:
    """The case's plan, planned once per module (plans are frozen)."""
    if case["model"] not in _PLANS:
        _PLANS[case["model"]] = plan(case["model"], case["serving"], memory=case["memory"])
    return _PLANS[case["model"]]


def _groups(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {group["name"]: group for group in record["groups"]}


def test_llama_golden_record(schema: dict[str, Any]) -> None:
    """Llama-3.1-8B, page 16, 4 GiB, SGLang's accounting: 32,768 tokens = 2,048 blocks, 2,048 requests
    (tests/capacity/test_capacity_hand.py); a request of 8k holds ceil(8,192 / 16) = 512 blocks, so
    32,768 // 8,192 = 4 run at once."""
    p = _plan(LLAMA)
    document = capacity_document(p, context_len=8_192)
    assert validate(document, schema) == [] and undeclared(document, schema) == []
    assert (document["schema"], document["version"], document["complete"], document["pp_ranks"]) == (
        SCHEMA,
        VERSION,
        True,
        [0],
    )
    [record] = document["records"]
    assert (record["tp_rank"], record["dp_rank"], record["attn_tp_rank"], record["pp_rank"]) == (0, 0, 0, 0)
    assert record["block_size"] == record["tokens_per_block_id"] == 16
    assert record["max_total_num_tokens"] == 32_768
    assert record["total_kv_blocks"] == 2_048
    assert _groups(record) == {
        "full": {
            "name": "full",
            "kind": "full",
            "slots": 32_768,
            "slots_per_block": 16,
            "tokens_per_block": 16,
            "total_blocks": 2_048,
            "slots_per_request": 8_192,
            "blocks_per_request": 512,
            "max_requests": 4,
            "compression_ratio": None,
            "window_tokens": None,
        }
    }
    assert (record["max_concurrency"], record["binding"], record["binding_group"]) == (4, "full tokens", "full")
    assert record["max_running_requests"] == 2_048
    assert record["gpu_kv_bytes"] == sum(pool.bytes for pool in p.pools)
    assert record["budget"]["budget_bytes"] == 4 * 2**30 and record["budget"]["source"] == "explicit"
    assert record["budget"]["gpu_total_bytes"] is None
    assert record["host_kv_bytes"] is None and record["host_tokens"] is None
    assert record["kv_cache_dtype"] == "bf16" and record["engine"] == "sglang" and record["accounting"] == "sglang"


def test_gpt_oss_golden_record(schema: dict[str, Any]) -> None:
    """gpt-oss-120b, TP 2, page 64, 40 GiB: full 1,229,376 and swa 983,488 tokens (19,209 and 15,367 blocks).

    At 8k a request holds 128 full blocks: 1,229,376 // 8,192 = 150.  In the window pool it holds its worst case
    128 + 128 x 1 + 64 + 64 = 384 tokens (6 blocks); two 8k prompts in flight add 8,192 - 384 = 7,808 each:
    (983,488 - 64 reserved - 2 x 8,192) // 384 = 2,518, plus the 2 being prefilled = 2,520 requests.
    """
    p = _plan(GPT_OSS)
    document = capacity_document(p, context_len=8_192)
    assert validate(document, schema) == [] and undeclared(document, schema) == []
    assert [(r["tp_rank"], r["dp_rank"]) for r in document["records"]] == [(0, 0), (1, 0)]
    record = document["records"][0]
    assert document["records"][1] == {**record, "tp_rank": 1, "attn_tp_rank": 1}
    groups = _groups(record)
    assert (record["max_total_num_tokens"], record["total_kv_blocks"]) == (1_229_376, 19_209)
    assert {name: (g["slots"], g["total_blocks"], g["kind"]) for name, g in groups.items()} == {
        "full": (1_229_376, 19_209, "full"),
        "swa": (983_488, 15_367, "window"),
    }
    assert (groups["full"]["blocks_per_request"], groups["full"]["max_requests"]) == (128, 150)
    assert groups["swa"]["window_tokens"] == 128
    assert (groups["swa"]["slots_per_request"], groups["swa"]["blocks_per_request"]) == (384, 6)
    assert groups["swa"]["max_requests"] == 2_520
    assert (record["max_concurrency"], record["binding_group"]) == (150, "full")
    # a request within its worst case holds its own pages: 256 tokens = 4 blocks, 983,488 // 256 = 3,841
    short = _groups(capacity_records(p, context_len=256)[0])
    assert (short["swa"]["slots_per_request"], short["swa"]["blocks_per_request"]) == (256, 4)
    assert short["swa"]["max_requests"] == 3_841


def test_qwen3_next_golden_record(schema: dict[str, Any]) -> None:
    """Qwen3-Next-80B-A3B, 60 GiB, page 1: 1,376,622 full tokens and 393 state slots, 3 per request (SGLang's
    ratio with the radix cache): 393 // 3 = 131 requests, also the request cap SGLang derives; a 4k request
    holds 4,096 blocks of one token, 1,376,622 // 4,096 = 336, so the state slots bind (named before the cap)."""
    p = _plan(QWEN3_NEXT)
    [record] = capacity_records(p, context_len=4_096)
    assert validate(record, schema["properties"]["records"]["items"]) == []
    groups = _groups(record)
    assert groups["full"]["total_blocks"] == record["total_kv_blocks"] == 1_376_622
    assert (groups["full"]["blocks_per_request"], groups["full"]["max_requests"]) == (4_096, 336)
    assert groups["state"] == {
        "name": "state",
        "kind": "state",
        "slots": 393,
        "slots_per_block": 1,
        "tokens_per_block": None,
        "total_blocks": 393,
        "slots_per_request": 3,
        "blocks_per_request": 3,
        "max_requests": 131,
        "compression_ratio": None,
        "window_tokens": None,
    }
    assert (record["max_concurrency"], record["binding"], record["binding_group"]) == (131, "state slots", "state")
    assert record["max_running_requests"] == 131


def test_deepseek_v4_flash_golden_record(schema: dict[str, Any]) -> None:
    """deepseek-v4-flash, TP 8, page 256, 60 GiB: full 986,368, swa 788,992, c4 246,592 = full / 4 and c128
    7,706 = full / 128 (tests/capacity/test_capacity_dsv4.py).  A block id covers 256 tokens: 256 full or swa
    slots, 64 c4 slots, 2 c128 slots, so every compressed space has the full space's 3,853 blocks.  An 8k request
    holds 32 blocks of each: 986,368 // 8,192 = 246,592 // 2,048 = 7,706 // 64 = 120; in the window pool its worst
    case 128 + 128 + 256 + 256 = 768 tokens (3 blocks), (788,992 - 256 - 2 x 8,192) // 768 + 2 = 1,007."""
    p = _plan(FLASH)
    document = capacity_document(p, context_len=8_192)
    assert validate(document, schema) == [] and undeclared(document, schema) == []
    assert len(document["records"]) == 8
    record = document["records"][0]
    groups = _groups(record)
    columns = ("kind", "slots", "slots_per_block", "total_blocks", "blocks_per_request", "max_requests")
    summary = {name: tuple(g[column] for column in columns) for name, g in groups.items()}
    assert summary == {
        "full": ("full", 986_368, 256, 3_853, 32, 120),
        "swa": ("window", 788_992, 256, 3_082, 3, 1_007),
        "c4": ("compressed", 246_592, 64, 3_853, 32, 120),
        "c128": ("compressed", 7_706, 2, 3_853, 32, 120),
    }
    assert {name: g["tokens_per_block"] for name, g in groups.items()} == dict.fromkeys(groups, 256)
    assert (groups["c4"]["compression_ratio"], groups["c128"]["compression_ratio"]) == (4, 128)
    assert (groups["c4"]["slots_per_request"], groups["c128"]["slots_per_request"]) == (2_048, 64)
    # the full tokens are named on the tie with the compressed spaces
    assert (record["max_concurrency"], record["binding_group"], record["total_kv_blocks"]) == (120, "full", 3_853)


@pytest.mark.parametrize("case", [LLAMA, GPT_OSS, QWEN3_NEXT, FLASH], ids=lambda c: c["model"])
@pytest.mark.parametrize("context_len", [1, 1_000, 65_536, 10**9])
def test_the_record_agrees_with_capacity(case: dict[str, Any], context_len: int) -> None:
    """max_concurrency and each group's max_requests are capacity's answers; past the context length none fit."""
    p = _plan(case)
    record = capacity_records(p, context_len=context_len)[0]
    answer = concurrency(p, context_len)
    assert (record["max_concurrency"], record["binding"]) == (answer.concurrent_requests, answer.binding)
    for group in record["groups"]:
        if group["kind"] != "state":
            assert group["slots_per_request"] == answer.tokens_per_request[group["name"]]
            assert group["blocks_per_request"] * group["slots_per_block"] >= group["slots_per_request"]


def test_the_default_context_is_the_models() -> None:
    p = _plan(LLAMA)
    document = capacity_document(p)
    assert document["context_len"] == p.model.context_len == 131_072
    # 131,072 tokens per request exceed the 32,768 planned: none fits, the full tokens bind
    assert (document["records"][0]["max_concurrency"], document["records"][0]["binding"]) == (0, "full tokens")


# ---------------------------------------------------------------------------
# ranks and pipeline stages
# ---------------------------------------------------------------------------


def test_dp_attention_ranks_follow_sglangs_layout() -> None:
    """TP 8 with DP attention 4: attention TP 2, dp_rank = tp_rank // 2, attn_tp_rank = tp_rank % 2."""
    serving = Serving(tp_size=8, dp_size=4, enable_dp_attention=True)
    assert [(r["tp_rank"], r["dp_rank"], r["attn_tp_rank"]) for r in rank_ids(serving)] == [
        (0, 0, 0),
        (1, 0, 1),
        (2, 1, 0),
        (3, 1, 1),
        (4, 2, 0),
        (5, 2, 1),
        (6, 3, 0),
        (7, 3, 1),
    ]


def test_dp_replicas_without_dp_attention() -> None:
    assert [(r["dp_rank"], r["tp_rank"]) for r in rank_ids(Serving(tp_size=2, dp_size=2))] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]


def test_every_pipeline_stage_is_planned() -> None:
    """Llama-3.1-8B over 2 stages of 16 layers at TP 2: 4 records, each stage its own plan; the stages keep the
    same tokens (SGLang's MIN all-reduce)."""
    plans = stage_plans("llama-3.1-8b", Serving(page_size=16, pp_size=2, tp_size=2), memory="4GiB")
    assert [p.serving.pp_rank for p in plans] == [0, 1]
    document = capacity_document(plans, context_len=4_096)
    assert document["complete"] is True and document["pp_ranks"] == [0, 1]
    assert [(r["pp_rank"], r["tp_rank"]) for r in document["records"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for record, stage in zip(document["records"][::2], plans, strict=True):
        assert record["gpu_kv_bytes"] == stage.planned_bytes
        assert record["total_kv_blocks"] == stage.max_total_num_tokens // 16
    assert len({r["total_kv_blocks"] for r in document["records"]}) == 1


def test_one_stage_of_a_pipeline_says_it_is_not_complete() -> None:
    p = plan("llama-3.1-8b", Serving(page_size=16, pp_size=2, pp_rank=1), memory="4GiB")
    document = capacity_document(p)
    assert (document["complete"], document["pp_ranks"]) == (False, [1])
    assert {r["pp_rank"] for r in document["records"]} == {1}


def test_plans_of_different_deployments_are_refused() -> None:
    a = plan("llama-3.1-8b", Serving(page_size=16), memory="4GiB")
    b = plan("llama-3.1-8b", Serving(page_size=32), memory="4GiB")
    with pytest.raises(ConfigError, match="stages of one deployment"):
        capacity_document([a, b])
    with pytest.raises(ConfigError, match="repeat pipeline stage"):
        capacity_document([a, a])
    with pytest.raises(ConfigError, match="at least one plan"):
        capacity_document([])


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_a_bad_context_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigError, match="context_len must be a positive number of tokens"):
        capacity_records(_plan(LLAMA), context_len=bad)


def test_budget_fields_a_later_budget_gains_are_read() -> None:
    """``gpu`` / ``gpu_total_bytes`` are read from the budget when it has them (a GPU catalogue adds them)."""
    p = _plan(LLAMA)

    @attrs.frozen
    class WithGpu:
        budget_bytes: int = p.budget.budget_bytes
        source: str = "catalogue"
        device: None = None
        free_bytes: None = None
        weights_bytes: None = None
        pre_model_load_bytes: None = None
        mem_fraction_static: None = None
        slack_bytes: None = None
        reserved_bytes: None = None
        gpu: str = "H200"
        gpu_total_bytes: int = 150_754_820_096

    record = capacity_records(attrs.evolve(p, budget=WithGpu()), context_len=1)[0]  # type: ignore[arg-type]
    assert (record["budget"]["gpu"], record["budget"]["gpu_total_bytes"]) == ("H200", 150_754_820_096)


# ---------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------

LLAMA_ARGS = ["llama-3.1-8b", "--memory", "4GiB", "--page-size", "16", "--accounting", "sglang"]


def _run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_plan_format_capacity_json(schema: dict[str, Any]) -> None:
    out = _run("plan", *LLAMA_ARGS, "--format", "capacity-json", "--context", "8k")
    assert out.exit_code == 0, out.output
    document = json.loads(out.output)
    assert validate(document, schema) == []
    assert document == capacity_document(_plan(LLAMA), context_len=8_192)


def test_capacity_format_capacity_json() -> None:
    out = _run("capacity", *LLAMA_ARGS, "--format", "capacity-json", "--context", "8k")
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == capacity_document(_plan(LLAMA), context_len=8_192)


def test_plan_capacity_json_plans_every_stage() -> None:
    out = _run("plan", "llama-3.1-8b", "--memory", "4GiB", "--pp-size", "2", "--format", "capacity-json")
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["pp_ranks"] == [0, 1]


def test_json_is_the_alias_of_format_json() -> None:
    alias, spelled = _run("plan", *LLAMA_ARGS, "--json"), _run("plan", *LLAMA_ARGS, "--format", "json")
    assert alias.exit_code == spelled.exit_code == 0
    assert alias.output == spelled.output
    assert json.loads(alias.output)["max_total_num_tokens"] == 32_768
    assert _run("plan", *LLAMA_ARGS, "--json", "--format", "json").exit_code == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", *LLAMA_ARGS, "--json", "--format", "capacity-json"], "--json is --format json"),
        (["plan", *LLAMA_ARGS, "--context", "8k"], "use it with --format capacity-json"),
        (["plan", *LLAMA_ARGS, "--format", "capacity-json", "--compare-platform", "cpu"], "--compare-platform"),
        (["plan", *LLAMA_ARGS, "--format", "capacity-json", "--context", "8q"], "--context takes a context length"),
        (["capacity", *LLAMA_ARGS, "--format", "capacity-json", "--context", "8k,16k"], "states one context"),
        (["capacity", *LLAMA_ARGS, "--format", "capacity-json", "--requests", "2"], "states one context"),
    ],
)
def test_cli_refusals_are_one_line(args: list[str], message: str) -> None:
    out = _run(*args)
    assert out.exit_code == 1
    assert message in out.output and "Traceback" not in out.output


def test_the_host_tier_reaches_the_record() -> None:
    """With --enable-hierarchical-cache the record carries what one rank pins and the host tokens it holds."""
    from kvpools_core import Serving, plan
    from kvpools_core.planning.capacity_record import capacity_records

    serving = Serving(enable_hierarchical_cache=True, hicache_ratio=2.0)
    p = plan("llama-3.1-8b", serving, memory="20GiB", host_memory="1TiB")
    assert p.host is not None
    record = capacity_records(p, context_len=8192)[0]
    assert record["host_kv_bytes"] == p.host.bytes_per_rank > 0
    assert record["host_tokens"] == p.host.tokens >= 2 * p.max_total_num_tokens
    assert capacity_records(plan("llama-3.1-8b", memory="20GiB"), context_len=8192)[0]["host_tokens"] is None
