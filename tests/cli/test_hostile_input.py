"""A hostile user at the command line (issue 29): absurd, huge and malformed input is a kvpools error.

Each case used to end in "internal error, a bug in kvpools" (exit 2), a traceback, an unbounded run or a
silently ignored option.  Now it is one paragraph naming the option and the fix, exit status 1, like every
other mistake a user can fix (tests/cli/test_bad_input.py).  The cases run in process (click's runner) to stay
fast; tests/cli/test_cli_fuzz.py throws random input at the same options.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from kvpools_core.cli import main
from kvpools_core.errors import ConfigError
from kvpools_core.planning.fit import MAX_GPUS
from kvpools_core.planning.replay import MAX_TRACE_BYTES
from kvpools_core.registry import Registry

REPOSITORY = Path(__file__).resolve().parents[2]
MHA_PRESETS = REPOSITORY / "plugins" / "mha" / "presets"


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def refused(result: Result, *phrases: str) -> str:
    """A user error: exit 1, one ``Error:`` paragraph holding ``phrases``, no bug report, no traceback."""
    message = result.stderr
    assert result.exit_code == 1, (result.exit_code, result.stdout, message)
    assert message.startswith("Error: ") and message.count("\n") == 1, message
    assert "internal error" not in message and "Traceback" not in message, message
    for phrase in phrases:
        assert phrase in message, (phrase, message)
    return message


# ------------------------------------------------------------------ defect 1: --speculative-draft


@pytest.mark.parametrize("command", ["plan", "build", "capacity"])
def test_speculative_draft_is_not_an_option(command: str) -> None:
    """Defect 1: ``Serving.speculative_draft`` (resolved from --speculative-draft-model-path since issue 16) was
    turned into an undocumented --speculative-draft option that crashed with a traceback for any value."""
    flags = {flag for param in main.commands[command].params for flag in param.opts}
    assert "--speculative-draft" not in flags
    assert "--speculative-draft-model-path" in flags


def test_speculative_draft_is_a_usage_error_not_a_traceback() -> None:
    result = invoke("plan", "llama-3.1-8b", "--memory", "1GiB", "--speculative-draft", "x")
    assert result.exit_code == 2, result.output
    # click 8.2 writes "No such option: --speculative-draft", later releases "No such option '--speculative-draft'"
    refused = re.search(r"No such option:? '?--speculative-draft\b(?!-)", result.stderr)
    assert refused is not None and "--speculative-draft-model-path" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "internal error" not in result.stderr


@pytest.mark.parametrize("command", ["plan", "build", "capacity"])
def test_every_option_parses_text(command: str) -> None:
    """Defect 1's root: an option generated from a ``Serving`` field whose type click cannot build from text
    (an attrs value such as ``DraftModel``) must never reach the command line."""
    plain = (click.types.StringParamType, click.types.IntParamType, click.types.FloatParamType, click.Choice)
    odd = [
        param.opts
        for param in main.commands[command].params
        if not isinstance(param.type, plain) and not getattr(param, "is_flag", False)
    ]
    assert odd == []


# ------------------------------------------------------------------ defect 2: input that reached "internal error"

DIGITS = "1" + "0" * 5000
DEEP = "[" * 100_000

HOSTILE = {
    "memory-5000-digits": (("plan", "llama-3.1-8b", "--memory", DIGITS), ("--memory", "5,001-digit", "60GiB")),
    "memory-5000-characters-not-a-size": (
        ("plan", "llama-3.1-8b", "--memory", "0" * 5000 + "x"),
        ("--memory", "not a size"),
    ),
    "model-name-256-characters": (
        ("plan", "m" * 256, "--memory", "1GiB"),
        ("Unknown model", "not a path this system can open", "kvpools presets"),
    ),
    "hisparse-config-nested": (
        ("plan", "deepseek-v4-flash", "--memory", "60GiB", "--enable-hisparse", "--hisparse-config", DEEP),
        ("--hisparse-config", "nested too deeply", "host_to_device_ratio"),
    ),
    "hisparse-config-5000-digits": (
        (
            "plan",
            "deepseek-v4-flash",
            "--memory",
            "60GiB",
            "--enable-hisparse",
            "--hisparse-config",
            f'{{"top_k": {DIGITS}}}',
        ),
        ("--hisparse-config", "integer too long"),
    ),
    "context-5000-digits": (
        ("capacity", "llama-3.1-8b", "--memory", "1GiB", "--context", DIGITS),
        ("--context", "5,001-digit", "32k"),
    ),
    "vllm-max-model-len-5000-digits": (
        ("plan", "qwen3-8b", "--accounting", "vllm", "--memory", "10GiB", "--max-model-len", DIGITS),
        ("--max-model-len", "positive integer"),
    ),
    "vllm-kv-offloading-size-inf": (
        ("plan", "qwen3-8b", "--accounting", "vllm", "--gpu", "h100", "--kv-offloading-size", "inf"),
        ("--kv-offloading-size", "finite size in GiB"),
    ),
    "workload-spec-5000-characters": (
        ("capacity", "llama-3.1-8b", "--memory", "1GiB", "--workload", "w" * 5000),
        ("--workload", "not a length in tokens", "JSONL"),
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_option_values_are_user_errors(case: str) -> None:
    """Defect 2: each of these was ``internal error, a bug in kvpools`` (ValueError of Python's int-string
    limit, OSError file name too long, RecursionError) and now names the option."""
    args, phrases = HOSTILE[case]
    message = refused(invoke(*args), *phrases)
    assert len(message) < 1000, "the error quotes the value, not 5,000 characters of it"


def test_leading_zeros_are_a_size_not_a_crash() -> None:
    """Defect 2: ``int()`` of 5,001 characters raised even when they are zeros before a 1."""
    result = invoke("plan", "llama-3.1-8b", "--memory", "0" * 5000 + "1GiB")
    assert result.exit_code == 0, result.stderr
    assert "explicit budget 1073741824 B" in result.stdout


def _workload(tmp_path: Path, name: str, content: bytes) -> Result:
    path = tmp_path / name
    path.write_bytes(content)
    return invoke("capacity", "qwen3-8b", "--memory", "10GiB", "--workload", str(path))


@pytest.mark.parametrize(
    ("line", "phrases"),
    [
        (DEEP.encode(), ("nested too deeply", ":1:")),
        (b'{"input_len": ' + DIGITS.encode() + b', "output_len": 1}', ("integer too long", ":1:")),
        (b'{"input_len": 1' + b"0" * 4000 + b', "output_len": 1}', ("'input_len'", "at most 2,147,483,648 tokens")),
        (b'{"input_len": 100, "output_len": 1, "note": "\xff"}', ("not UTF-8",)),
    ],
    ids=["nested", "5000-digits", "4000-digits", "not-utf8"],
)
def test_hostile_workload_records_are_user_errors(tmp_path: Path, line: bytes, phrases: tuple[str, ...]) -> None:
    """Defect 2: a --workload line nested 100,000 deep or holding a 5,000-digit integer was an internal error;
    a 4,000-digit length (JSON reads it) then failed to print."""
    refused(_workload(tmp_path, "trace.jsonl", b'{"input_len": 100, "output_len": 10}\n' + line + b"\n"), "--workload")
    refused(_workload(tmp_path, "first.jsonl", line + b"\n"), *phrases)


# ------------------------------------------------------------------ defect 3: bounds


def test_fit_max_gpus_is_bounded() -> None:
    """Defect 3: --max-gpus 16,777,216 ran for 100 s and 2.7 GB; above MAX_GPUS it is refused at once."""
    args = ("fit", "llama-3.1-8b", "--requests", "1", "--context", "8k", "--gpu", "h100")
    refused(invoke(*args, "--max-gpus", "16777216"), "--max-gpus 16,777,216", f"at most {MAX_GPUS:,}")
    refused(invoke(*args, "--max-gpus", str(MAX_GPUS + 1)), f"--max-gpus {MAX_GPUS} or fewer")
    assert f"at most {MAX_GPUS}" in invoke("fit", "--help").stdout


def test_a_workload_file_over_the_bound_is_refused_unread(tmp_path: Path) -> None:
    """Defect 3: a 2 GiB --workload was read whole (4.1 GiB RSS); a file over MAX_TRACE_BYTES is refused from
    its size (this one is sparse: reading it would take seconds and gigabytes)."""
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as stream:
        stream.truncate(2 << 30)
    refused(
        invoke("capacity", "qwen3-8b", "--memory", "10GiB", "--workload", str(huge)),
        "--workload",
        f"over {MAX_TRACE_BYTES:,} bytes",
        "Split it",
    )
    just_over = tmp_path / "over.jsonl"
    record = b'{"input_len": 100, "output_len": 10}\n'
    just_over.write_bytes(record * (MAX_TRACE_BYTES // len(record) + 1))
    refused(invoke("capacity", "qwen3-8b", "--memory", "10GiB", "--workload", str(just_over)), "over")


# ------------------------------------------------------------------ defect 4: sweep --output


def test_sweep_output_into_a_missing_directory_names_it(tmp_path: Path) -> None:
    """Defect 4: a FileNotFoundError reported as a bug, after the whole sweep had run."""
    missing = tmp_path / "no" / "such"
    sweep = ("sweep", "--model", "llama-3.1-8b", "--memory", "1GiB", "--format", "csv", "--output")
    refused(invoke(*sweep, str(missing / "out.csv")), f"the directory {missing} does not exist", "mkdir -p")
    a_file = tmp_path / "file"
    a_file.write_text("")
    refused(invoke(*sweep, str(a_file / "out.csv")), f"the directory {a_file} does not exist")
    assert not missing.exists()


# ------------------------------------------------------------------ defect 5: install hints


def test_install_hints_say_how_to_install_from_a_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defect 5: ``pip install kvpools-ascend`` fails where the plugin is not on an index; the hint also gives
    the checkout's path (plugins/<distribution>), which exists."""
    from kvpools_core import Serving, plan

    original = Registry._entry_points

    def without_ascend() -> dict[str, list[Any]]:
        groups = original()
        return {
            name: kept
            for name, group in groups.items()
            if (kept := [ep for ep in group if ep.dist is None or ep.dist.metadata["Name"] != "kvpools-ascend"])
        }

    monkeypatch.setattr(Registry, "_entry_points", staticmethod(without_ascend))
    with pytest.raises(ConfigError) as error:
        plan("llama-3.1-8b", Serving(platform="ascend"), memory="8GiB", registry=Registry())
    assert "pip install kvpools-ascend (not on your package index? from a kvpools checkout: pip install " in str(
        error.value
    )
    assert "./plugins/kvpools-ascend)" in str(error.value)
    assert (REPOSITORY / "plugins" / "kvpools-ascend" / "pyproject.toml").is_file()
    assert "pip install -e '.[plot]'" in invoke("sweep", "--help").stdout


# ------------------------------------------------------------------ defect 6: silently accepted


def test_mem_fraction_static_beside_memory_is_refused() -> None:
    """Defect 6: --memory is the KV budget itself, so the fraction was ignored without a word."""
    refused(
        invoke("plan", "llama-3.1-8b", "--memory", "10GiB", "--mem-fraction-static", "0.8"),
        "--mem-fraction-static 0.8",
        "--memory is already the KV cache's own budget",
        "Drop one",
    )


def test_not_enough_memory_advice_names_the_options_of_the_budget_given() -> None:
    """Defect 6: under --memory the advice was to raise --mem-fraction-static, which --memory ignores."""
    explicit = refused(invoke("plan", "llama-3.1-8b", "--memory", "1KiB"), "Not enough memory", "Raise --memory")
    assert "--mem-fraction-static" not in explicit
    profiled = refused(
        invoke(
            "plan",
            "llama-3.1-8b",
            "--free-memory",
            "17GiB",
            "--weights-memory",
            "16.828GiB",
            "--mem-fraction-static",
            "0.99",
            "--page-size",
            "64",
        ),
        "Not enough memory",
        "Raise --free-memory or --mem-fraction-static (current value 0.99)",
    )
    assert "Raise --memory" not in profiled


def test_kv_heads_that_do_not_divide_the_query_heads_are_refused(tmp_path: Path) -> None:
    """Defect 6: 5 KV heads for 32 query heads planned; grouped-query attention needs 32 % 5 == 0."""
    config = json.loads((MHA_PRESETS / "llama-3.1-8b.json").read_text())
    config["num_key_value_heads"] = 5
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    refused(
        invoke("plan", str(path), "--memory", "10GiB"),
        "'num_key_value_heads' is 5, which does not divide num_attention_heads 32",
        "such as 4 or 2",
    )


def test_page_size_is_refused_exactly_where_sglang_refuses_it() -> None:
    """Defect 6: SGLang 0.5.23 takes any page size its kernels do, but asserts in ``check_server_args`` that a
    prefill chunk is whole pages: ``chunked_prefill_size % page_size == 0`` (per DP-attention worker, not on a
    disaggregated decode node).  --page-size 3 with the default chunk of 8192 planned."""
    refused(
        invoke("plan", "llama-3.1-8b", "--memory", "10GiB", "--page-size", "3"),
        "--page-size 3 with --chunked-prefill-size 8192",
        "'chunked_prefill_size must be divisible by page_size'",
    )
    for accepted in (("--chunked-prefill-size", "6144"), ("--disaggregation-mode", "decode")):
        result = invoke("plan", "llama-3.1-8b", "--memory", "10GiB", "--page-size", "3", *accepted)
        assert result.exit_code == 0, result.stderr
    dp = ("plan", "llama-3.1-70b", "--memory", "40GiB", "--tp-size", "8", "--dp-size", "8", "--enable-dp-attention")
    refused(invoke(*dp, "--page-size", "2048"), "(8192 over 8 DP-attention workers: 1024 each)")
    assert invoke(*dp, "--page-size", "1024").exit_code == 0
