"""Random text into the CLI's string inputs (issue 29): whatever comes in, kvpools answers, never a bug report.

Every run must end in a plan (exit 0), a kvpools error (exit 1, one ``Error:`` paragraph) or click's usage
error (exit 2, ``Usage:``), with no "internal error" and no traceback.  The strategies mix arbitrary text
with what breaks parsers: numbers of thousands of digits (Python's int-string limit), JSON nested thousands
deep (RecursionError), units, signs, paths that are too long.  Examples stay few so the module runs in
seconds; a failure prints the argv to replay with ``kvpools``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvpools_core.cli import main

FUZZ = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# What argv can carry: no NUL, no lone surrogates.
ARGV_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=300)
HUGE_DIGITS = st.integers(300, 6000).map(lambda n: "9" * n)
NESTED = st.integers(1, 50_000).map(lambda n: "[" * n + "]" * n)
NUMBERS = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    HUGE_DIGITS,
    st.integers(0, 6000).map(lambda n: "0" * n + "1"),
)
UNITS = st.sampled_from(["", "B", "k", "K", "M", "GiB", "TB", "e9", "e999", ".", "..", " ", "-", "GiBGiB"])
SIZES = st.one_of(ARGV_TEXT, NUMBERS, st.tuples(NUMBERS, UNITS).map("".join))
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**40), 10**40), st.floats(allow_nan=False), st.text()),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(), children, max_size=4)),
    max_leaves=12,
)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def assert_kvpools_answer(result: Result) -> None:
    """A plan, a kvpools error or a usage error; never the bug path nor a traceback."""
    shown = f"argv ends {result.exit_code=} {result.stderr[:400]!r}"
    assert result.exception is None or isinstance(result.exception, SystemExit), (repr(result.exception), shown)
    assert "internal error" not in result.stderr and "Traceback" not in result.output, shown
    assert result.exit_code in (0, 1, 2), shown
    if result.exit_code == 1:
        assert result.stderr.startswith("Error: "), shown
    if result.exit_code == 2:
        assert "Usage:" in result.stderr, shown


@FUZZ
@given(memory=SIZES)
@example(memory="1" + "0" * 5000)
def test_memory(memory: str) -> None:
    assert_kvpools_answer(invoke("plan", "qwen3-8b", "--memory", memory))


@FUZZ
@given(size=SIZES)
def test_free_and_weights_memory(size: str) -> None:
    assert_kvpools_answer(invoke("plan", "qwen3-8b", "--free-memory", size, "--weights-memory", size))


@FUZZ
@given(model=st.one_of(ARGV_TEXT, st.integers(200, 5000).map(lambda n: "m" * n), st.just("/" * 300)))
@example(model="a" * 256)
@example(model="~no-such-user-of-kvpools")  # expanduser raises RuntimeError: a kvpools error, not a bug
def test_model_name(model: str) -> None:
    assert_kvpools_answer(invoke("plan", model, "--memory", "10GiB"))


@FUZZ
@given(config=st.one_of(ARGV_TEXT, NESTED, JSON_VALUES.map(json.dumps), HUGE_DIGITS.map(lambda d: f'{{"top_k": {d}}}')))
@example(config="[" * 100_000)
def test_hisparse_config(config: str) -> None:
    args = (
        "plan",
        "deepseek-v4-flash",
        "--memory",
        "60GiB",
        "--enable-hisparse",
        "--disable-radix-cache",
        "--hisparse-config",
        config,
    )
    assert_kvpools_answer(invoke(*args))


@FUZZ
@given(
    context=st.one_of(ARGV_TEXT, NUMBERS, st.tuples(NUMBERS, st.sampled_from(["k", "M", "m", "G", ""])).map("".join))
)
def test_context(context: str) -> None:
    assert_kvpools_answer(invoke("capacity", "qwen3-8b", "--memory", "10GiB", "--context", context))


@FUZZ
@given(
    spec=st.one_of(ARGV_TEXT, NUMBERS, st.tuples(st.sampled_from(["lognormal:", "uniform:"]), ARGV_TEXT).map("".join))
)
@example(spec="w" * 5000)
def test_workload_spec(spec: str) -> None:
    assert_kvpools_answer(invoke("capacity", "qwen3-8b", "--memory", "10GiB", "--workload", spec))


RECORDS = st.dictionaries(
    st.sampled_from(["input_len", "output_len", "other"]),
    st.one_of(st.integers(-5, 300_000), st.integers(10**9, 10**40), JSON_VALUES),
    max_size=3,
)
LINES = st.one_of(RECORDS.map(json.dumps), JSON_VALUES.map(json.dumps), NESTED, HUGE_DIGITS, ARGV_TEXT)
CONTENTS = st.one_of(
    st.lists(LINES, max_size=5).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass")),
    st.binary(max_size=300),
)


@FUZZ
@given(content=CONTENTS)
@example(content=b"[" * 100_000)
@example(content=b'{"input_len": 1' + b"0" * 5000 + b', "output_len": 1}')
def test_workload_file(tmp_path: Path, content: bytes) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(content)
    assert_kvpools_answer(invoke("capacity", "qwen3-8b", "--memory", "10GiB", "--workload", str(trace)))


@FUZZ
@given(partition=ARGV_TEXT, option=ARGV_TEXT)
def test_pp_layer_partition_and_plugin_option(partition: str, option: str) -> None:
    args: Any = ("plan", "qwen3-8b", "--memory", "10GiB", "--pp-size", "2", "--pp-layer-partition", partition)
    assert_kvpools_answer(invoke(*args))
    assert_kvpools_answer(invoke("plan", "qwen3-8b", "--memory", "10GiB", "--plugin-option", option))


@FUZZ
@given(memory=SIZES, axis=ARGV_TEXT)
def test_sweep_inputs(memory: str, axis: str) -> None:
    assert_kvpools_answer(invoke("sweep", "--model", "qwen3-8b", "--memory", memory, "--format", "csv"))
    assert_kvpools_answer(
        invoke("sweep", "--model", "qwen3-8b", "--memory", "10GiB", "--axis", axis, "--format", "csv")
    )


@FUZZ
@given(gpu=ARGV_TEXT, length=st.one_of(ARGV_TEXT, NUMBERS), offload=NUMBERS)
@example(gpu="g" * 3000, length="1" + "0" * 5000, offload="inf")
@example(gpu="", length="0" * 4300 + "1", offload="0")  # int() counts leading zeros against its digit limit
@example(gpu="", length="--5", offload="-0")
@example(gpu="", length="\u00b9", offload="0")  # "¹".isdigit() is True, int("¹") raises
def test_gpu_name_and_vllm_flags(gpu: str, length: str, offload: str) -> None:
    assert_kvpools_answer(invoke("plan", "qwen3-8b", "--gpu", gpu))
    vllm = ("plan", "qwen3-8b", "--accounting", "vllm")
    assert_kvpools_answer(invoke(*vllm, "--memory", "10GiB", "--max-model-len", length))
    assert_kvpools_answer(invoke(*vllm, "--gpu", "h100", "--kv-offloading-size", offload))
