"""``Plan.from_json`` validates what it loads (issue 29).

Before, it handed the JSON to the constructors unchecked: 11 of 16 hostile
texts and thousands of mutated plans raised a raw ``AttributeError`` /
``TypeError`` / ``JSONDecodeError``, and broken plans (a null budget, no
tokens, more planned bytes than the budget) loaded.  Now every failure is a
:class:`PlanFormatError` naming the field's path, and a loaded plan keeps the
invariants of the plans kvpools makes (``Plan.problems``).
"""

from __future__ import annotations

import copy
import functools
import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvpools_core import ConfigError, InvalidValueError, KvpoolsError, Plan, PlanFormatError, Serving, plan
from kvpools_core.models import registry_presets
from kvpools_core.registry import get_registry
from kvpools_core.values import Budget, CellSize, DraftCharge, HostTier, PoolSpec

GiB = 1 << 30


@functools.cache
def llama() -> Plan:
    return plan("llama-3.1-8b", Serving(), memory="20GiB")


def llama_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(llama().to_json())
    return doc


def with_(doc: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


def without(doc: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return doc


def refused(text: str | bytes | dict[str, Any]) -> PlanFormatError:
    """The error loading ``text`` raises (a dict is dumped first); fails if it loads or raises anything else."""
    if isinstance(text, dict):
        text = json.dumps(text)
    with pytest.raises(PlanFormatError) as info:
        Plan.from_json(text)
    return info.value


# -- (a) hostile texts: each refused with a PlanFormatError naming the field ------------------------------------

HOSTILE_TEXTS = [
    pytest.param("", "plan", "not valid JSON", id="empty"),
    pytest.param("{'model': 1}", "plan", "not valid JSON", id="not-json"),
    pytest.param(b'{"model": "caf\xe9"}', "plan", "cannot be read", id="not-utf8"),
    pytest.param("[]", "plan", "must be a JSON object (a Plan), got [] (an array)", id="top-level-array"),
    pytest.param("null", "plan", "must be a JSON object (a Plan), got null", id="top-level-null"),
    pytest.param('"plan"', "plan", 'got "plan" (a string)', id="top-level-string"),
    pytest.param("3", "plan", "got 3 (a number)", id="top-level-number"),
    pytest.param("NaN", "plan", "got NaN", id="top-level-nan"),
    pytest.param('{"plan": []}', "plan", "got [] (an array)", id="wrapped-array"),
    pytest.param(
        "{}",
        "plan.model",
        "plan.model (and plan.serving, plan.budget, plan.cell, plan.sizing) is missing",
        id="empty-object",
    ),
    pytest.param("[" * 100_000 + "]" * 100_000, "plan", "nests too deep", id="deep-nesting"),
    pytest.param("1" * 5000, "plan", "integer of", id="huge-int-literal"),
    pytest.param('{"format": 2}', "plan.format", "plan.format 2 is not supported", id="future-format"),
    pytest.param('{"format": "1"}', "plan.format", 'must be the integer 1, got "1" (a string)', id="format-string"),
    pytest.param('{"format": true}', "plan.format", "got true (a boolean)", id="format-bool"),
    pytest.param('{"format": 1.0}', "plan.format", "got 1.0 (a number)", id="format-float"),
]


@pytest.mark.parametrize(("text", "path", "message"), HOSTILE_TEXTS)
def test_a_hostile_text_is_refused_naming_the_field(text: str | bytes, path: str, message: str) -> None:
    error = refused(text)
    assert error.path == path
    assert message in str(error)


def test_a_non_text_argument_is_refused() -> None:
    with pytest.raises(PlanFormatError, match=r"must be text \(str or bytes\), got dict"):
        Plan.from_json({"model": {}})  # type: ignore[arg-type]


FIELD_CASES = [
    # (path into the plan's JSON, value put there, the path the error names, what the message says)
    (("budget",), None, "plan.budget", "must be a JSON object (a Budget), got null"),
    (("model",), [], "plan.model", "must be a JSON object (a ModelSpec), got [] (an array)"),
    (("model", "layers"), {}, "plan.model.layers", "must be a JSON array, got {} (an object)"),
    (("model", "layers", 3, "num_kv_heads"), "8", "plan.model.layers[3].num_kv_heads", 'must be an integer, got "8"'),
    (("model", "layers", 3, "num_kv_heads"), -8, "plan.model.layers[3].num_kv_heads", "non-negative integer, got -8"),
    (("model", "layers", 0, "kind"), None, "plan.model.layers[0].kind", "must be a string, got null"),
    (("model", "context_len"), 0, "plan.model.context_len", "must be a positive integer, got 0"),
    (("model", "params"), [1], "plan.model.params", "must be a JSON object, got [1] (an array)"),
    (("model", "params"), {"x": math.nan}, "plan.model.params['x']", "must be a finite number, got NaN"),
    (("model", "is_multimodal"), 0, "plan.model.is_multimodal", "must be true or false, got 0 (a number)"),
    (("serving", "page_size"), 0, "plan.serving.page_size", "must be a positive integer, got 0"),
    (("serving", "tp_size"), 1.5, "plan.serving.tp_size", "must be an integer, got 1.5"),
    (("serving", "tp_size"), True, "plan.serving.tp_size", "must be an integer, got true (a boolean)"),
    (("serving", "mem_fraction_static"), math.inf, "plan.serving.mem_fraction_static", "finite number, got Infinity"),
    (("serving", "pp_layer_partition"), [-1], "plan.serving.pp_layer_partition", "non-negative integers"),
    (
        ("serving", "platform_traits", "slot_index_dtype"),
        "int8",
        "plan.serving.platform_traits.slot_index_dtype",
        "must be one of int64, int32; got 'int8'",
    ),
    (("budget", "budget_bytes"), -1, "plan.budget.budget_bytes", "non-negative integer, got -1"),
    (("budget", "budget_bytes"), 10**30, "plan.budget.budget_bytes", "at most 64 bits (below 2**63)"),
    (("budget", "budget_bytes"), 2**63, "plan.budget.budget_bytes", "at most 64 bits"),
    (("budget", "free_bytes"), -5, "plan.budget.free_bytes", "non-negative integer, got -5"),
    (("budget", "steps"), "one step", "plan.budget.steps", 'must be a JSON array, got "one step" (a string)'),
    (("cell", "sglang_bytes_per_token"), "4096", "plan.cell.sglang_bytes_per_token", 'must be a number, got "4096"'),
    (("cell", "sglang_bytes_per_token"), 0, "plan.cell.sglang_bytes_per_token", "positive finite number, got 0"),
    (("cell", "parts", 0, "unit"), "page", "plan.cell.parts[0].unit", "one of token, request, state_slot, fixed"),
    (("sizing", "pools", 0, "slots"), -1, "plan.sizing.pools[0].slots", "non-negative integer, got -1"),
    (("sizing", "pools", 0, "cost"), "free", "plan.sizing.pools[0].cost", 'JSON object (a GroupCost), got "free"'),
    (("sizing", "token_counts", "full"), 1.5, "plan.sizing.token_counts['full']", "must be an integer, got 1.5"),
    (("sizing", "notes"), [None], "plan.sizing.notes[0]", "must be a string, got null"),
    (("provenance", "size_pools"), "core", "plan.provenance['size_pools']", "must be a JSON array"),
    (("host",), [], "plan.host", "must be a JSON object (a HostTier), got [] (an array)"),
]


@pytest.mark.parametrize(("path", "value", "where", "message"), FIELD_CASES, ids=lambda v: None)
def test_a_wrong_field_is_refused_at_its_path(path: tuple[Any, ...], value: Any, where: str, message: str) -> None:
    error = refused(with_(llama_doc(), path, value))
    assert error.path == where
    assert str(error).startswith(where)
    assert message in str(error)


@pytest.mark.parametrize(
    ("path", "where"),
    [
        (("model", "layers", 0, "index"), "plan.model.layers[0].index"),
        (("budget", "budget_bytes"), "plan.budget.budget_bytes"),
        (("sizing", "pools", 1, "bytes"), "plan.sizing.pools[1].bytes"),
        (("cell", "sglang_bytes_per_token"), "plan.cell.sglang_bytes_per_token"),
    ],
)
def test_a_missing_required_field_is_named(path: tuple[Any, ...], where: str) -> None:
    error = refused(without(llama_doc(), path))
    assert error.path == where
    assert str(error).startswith(f"{where} is missing: a ")


def test_an_unknown_field_is_refused() -> None:
    """The format is strict: a field no kvpools writes is a typo or another version's, not something to drop."""
    error = refused(with_(llama_doc(), ("sizing", "pools", 2, "bytez"), 1))
    assert error.path == "plan.sizing.pools[2]"
    assert "unknown field(s) 'bytez': a PoolSpec has none such" in str(error)


# -- (c) broken plans that used to load -------------------------------------------------------------------------


def test_a_plan_of_no_tokens_is_refused() -> None:
    for tokens in (0, -1):
        doc = with_(llama_doc(), ("sizing", "max_total_num_tokens"), tokens)
        doc["sizing"]["token_counts"]["full"] = tokens
        error = refused(doc)
        assert error.path == "plan.sizing.max_total_num_tokens"
        assert f"got {tokens}" in str(error)


def test_a_token_space_of_no_tokens_is_refused() -> None:
    """The pipeline refuses a window pool of no tokens (less than one page); a loaded plan may not have one."""
    swa = plan("gpt-oss-20b", Serving(), memory="20GiB")
    doc = json.loads(swa.to_json())
    doc["sizing"]["token_counts"]["swa"] = 0
    error = refused(doc)
    assert error.path == "plan.sizing.token_counts['swa']"
    assert "must be positive: token pools hold its tokens, got 0" in str(error)


def test_tokens_that_are_not_whole_pages_are_refused() -> None:
    paged = plan("llama-3.1-8b", Serving(page_size=64), memory="20GiB")
    doc = json.loads(paged.to_json())
    doc["sizing"]["max_total_num_tokens"] -= 1
    doc["sizing"]["token_counts"]["full"] -= 1
    error = refused(doc)
    assert error.path == "plan.sizing.max_total_num_tokens"
    assert "whole number of pages of 64" in str(error)


def test_planned_bytes_over_the_budget_are_refused() -> None:
    doc = llama_doc()
    doc["budget"]["budget_bytes"] = llama().planned_bytes - 1
    error = refused(doc)
    assert error.path == "plan.sizing.pools"
    assert f"need {llama().planned_bytes:,} B, over plan.budget.budget_bytes ({llama().planned_bytes - 1:,} B)" in str(
        error
    )


def test_an_sglang_plan_may_exceed_its_budget() -> None:
    """``--accounting sglang`` keeps SGLang's count, whose pools may overrun the budget: only exact plans fit it."""
    doc = llama_doc()
    doc["serving"]["accounting"] = "sglang"
    doc["budget"]["budget_bytes"] = llama().planned_bytes - 1
    assert Plan.from_json(json.dumps(doc)).budget.budget_bytes == llama().planned_bytes - 1


def test_pool_bytes_that_disagree_with_their_cost_are_refused() -> None:
    doc = llama_doc()
    kv = next(i for i, p in enumerate(doc["sizing"]["pools"]) if p["name"] == "kv")
    doc["sizing"]["pools"][kv]["cost"] = {"group": "kv", "token_bytes": 1}
    error = refused(doc)
    assert error.path == "plan.sizing.pools"
    assert "but their costs (PoolSpec.cost) give" in str(error)


def test_no_running_requests_is_refused() -> None:
    error = refused(with_(llama_doc(), ("sizing", "max_running_requests"), 0))
    assert error.path == "plan.sizing.max_running_requests"


def test_full_token_count_must_match_the_plan_tokens() -> None:
    error = refused(with_(llama_doc(), ("sizing", "token_counts", "full"), llama().max_total_num_tokens - 1))
    assert error.path == "plan.sizing.token_counts['full']"


def test_a_host_tier_without_the_options_that_build_one_is_refused() -> None:
    hicache = plan("llama-3.1-8b", Serving(enable_hierarchical_cache=True), memory="20GiB", host_memory="1TiB")
    doc = json.loads(hicache.to_json())
    doc["serving"]["enable_hierarchical_cache"] = False
    assert refused(doc).path == "plan.host"
    doc = json.loads(hicache.to_json())
    doc["host"] = None
    assert refused(doc).path == "plan.host"
    doc = json.loads(hicache.to_json())
    doc["host"]["pools"][0]["device_pool"] = "nowhere"
    error = refused(doc)
    assert error.path == "plan.host.pools[0].device_pool"
    assert "'nowhere' names no pool of plan.sizing.pools" in str(error)


def test_a_validator_error_inside_a_value_names_its_path() -> None:
    """A class's own invariant (not one field) is reported at the value's path, with the class's words."""
    doc = llama_doc()
    doc["model"]["layers"][0], doc["model"]["layers"][1] = doc["model"]["layers"][1], doc["model"]["layers"][0]
    error = refused(doc)
    assert error.path == "plan.model"
    assert "layer indices must be 0..31 in order" in str(error)


def test_a_plan_from_before_units_with_a_bad_legacy_field_is_refused() -> None:
    doc = with_(llama_doc(), ("cell", "bytes_per_request"), "16")
    error = refused(doc)
    assert error.path == "plan.cell.bytes_per_request"


# -- the validators guard construction too ------------------------------------------------------------------------


def test_budget_sizes_are_checked_on_construction() -> None:
    with pytest.raises(InvalidValueError, match=r"Budget.free_bytes must be a non-negative integer, got -1"):
        Budget(budget_bytes=1, free_bytes=-1)
    with pytest.raises(InvalidValueError, match=r"Budget.mem_fraction_static must be a number in \(0, 1\]"):
        Budget(budget_bytes=1, mem_fraction_static=1.5)


def test_cell_and_draft_sizes_must_be_finite_numbers() -> None:
    for bad in (math.nan, math.inf, "64"):
        with pytest.raises(ConfigError, match=r"sglang_bytes_per_token \(a cell size\) must be a positive finite"):
            CellSize(parts=(), sglang_bytes_per_token=bad, num_layers=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidValueError, match=r"DraftCharge\.sglang_bytes_per_token must be a positive finite"):
        DraftCharge(
            model="d",
            architecture="mha",
            num_layers=1,
            exact_bytes_per_token=1,
            own_sglang_bytes_per_token=1.0,
            target_sglang_bytes_per_token=1.0,
            sglang_bytes_per_token=math.inf,
        )
    with pytest.raises(InvalidValueError, match=r"HostTier\.hicache_ratio must be a positive finite"):
        HostTier(pools=(), ranks_per_node=1, hicache_ratio=-2.0)


def test_a_pp_layer_partition_of_negative_stages_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"pp_layer_partition must be non-negative integers, got \(-1, 33\)"):
        Serving(pp_size=2, pp_layer_partition=(-1, 33))


def test_other_values_load_at_their_own_name() -> None:
    with pytest.raises(PlanFormatError, match=r"^PoolSpec.slots must be an integer, got null\.$"):
        PoolSpec.from_dict({"name": "kv", "kind": "kv", "slots": None, "bytes_per_slot": 1, "bytes": 1})


# -- round trips: every preset still loads into an equal plan, to the same JSON ---------------------------------


def _first_plan(preset: str, **options: Any) -> Plan | None:
    """The preset's plan at the first page size its rules accept (None when every one is refused)."""
    host: dict[str, Any] = {"host_memory": "1TiB"} if options.get("enable_hierarchical_cache") else {}
    for page in (1, 64, 256):
        try:
            return plan(preset, Serving(page_size=page, **options), memory="40GiB", **host)
        except KvpoolsError:
            continue
    return None


@pytest.mark.parametrize("preset", sorted(registry_presets(get_registry())))
def test_every_preset_round_trips(preset: str) -> None:
    made = (_first_plan(preset), _first_plan(preset, enable_hierarchical_cache=True, kv_cache_dtype="fp8_e4m3"))
    plans = [p for p in made if p is not None]
    assert plans, f"{preset} plans at no page size"
    for planned in plans:
        assert planned.problems() == []
        again = Plan.from_json(planned.to_json())
        assert again == planned
        assert again.to_json() == planned.to_json()


# -- (b) the fuzz: mutated real plans load into a valid plan, or are refused with PlanFormatError ---------------


@functools.cache
def fuzz_plans() -> tuple[str, ...]:
    """Real plans of several architectures and options (built once): dense, MLA + MTP, SWA + host tier, hybrid
    mamba, DeepSeek-V4, a draft model of its own, a whole GPU's budget, an sglang-accounted PD decode node."""
    made = [
        plan("llama-3.1-8b", Serving(), memory="20GiB"),
        plan("deepseek-v3", Serving(page_size=64, speculative_algorithm="NEXTN", tp_size=8), memory="40GiB"),
        plan("gpt-oss-20b", Serving(page_size=64, enable_hierarchical_cache=True), memory="20GiB", host_memory="1TiB"),
        plan("qwen3-next-80b-a3b-thinking", Serving(page_size=64), memory="20GiB"),
        plan("deepseek-v4-flash", Serving(page_size=256), memory="60GiB"),
        plan(
            "llama-3.1-70b",
            Serving(tp_size=4, speculative_algorithm="STANDALONE"),
            memory="40GiB",
            draft_model="llama-3.1-8b",
        ),
        plan("qwen3-8b", Serving(), gpu="H100"),
        plan(
            "qwen3-8b",
            Serving(accounting="sglang", disaggregation_mode="decode", max_running_requests=64),
            memory="20GiB",
        ),
    ]
    return tuple(p.to_json() for p in made)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield from _paths(child, (*prefix, key))


MUTATIONS = (
    "drop",
    "null",
    "string",
    "list",
    "object",
    "bool",
    "zero",
    "minus",
    "huge",
    "int64",
    "float",
    "nan",
    "infinity",
    "swap",
    "repeat",
    "extra",
)


def mutate(doc: Any, path: tuple[Any, ...], how: str) -> Any:
    if not path:
        return {"null": None, "string": "plan", "list": [doc], "bool": True, "zero": 0, "nan": math.nan}.get(how, doc)
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    key, value = path[-1], parent[path[-1]]
    if how == "drop":
        del parent[key]
    elif how == "swap":
        if isinstance(value, list) and len(value) > 1:
            value[0], value[-1] = value[-1], value[0]
        elif isinstance(parent, list) and len(parent) > 1:
            parent[0], parent[key] = parent[key], parent[0]
    elif how == "repeat":
        if isinstance(value, list) and value:
            value.append(copy.deepcopy(value[0]))
    elif how == "extra":
        if isinstance(value, dict):
            value["unexpected"] = 1
    else:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        parent[key] = {
            "null": None,
            "string": str(value),
            "list": [value],
            "object": {"value": value},
            "bool": not value if isinstance(value, bool) else True,
            "zero": 0,
            "minus": -1,
            "huge": 10**30,
            "int64": 2**63,
            "float": value + 0.5 if number else 0.5,
            "nan": math.nan,
            "infinity": -math.inf,
        }[how]
    return doc


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_mutated_plan_loads_valid_or_is_refused_cleanly(data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(fuzz_plans()) - 1), label="plan")
    doc = json.loads(fuzz_plans()[index])
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        paths = tuple(_paths(doc))
        path = data.draw(st.sampled_from(paths), label="path")
        doc = mutate(doc, path, data.draw(st.sampled_from(MUTATIONS), label="how"))
    try:
        loaded = Plan.from_json(json.dumps(doc))
    except PlanFormatError as error:
        assert error.path.startswith("plan"), error.path
        assert error.path in str(error) or str(error).startswith("The plan")
        return
    assert loaded.problems() == []
    text = loaded.to_json()
    again = Plan.from_json(text)
    assert again == loaded
    assert again.to_json() == text
