"""``kvpools capacity``: the ladder table, --context, --requests, the flags line and --json, through click."""

from __future__ import annotations

import json

from click.testing import CliRunner, Result

from kvpools_core import Serving, plan
from kvpools_core.cli import main
from kvpools_core.planning.capacity import concurrency, engine_flags, max_context

LLAMA = ("llama-3.1-8b", "--memory", "4GiB", "--page-size", "16", "--accounting", "sglang")
"""32,768 tokens, 2,048 requests (tests/capacity/test_capacity_hand.py)."""


def run(*args: str) -> Result:
    return CliRunner().invoke(main, ["capacity", *args])


def rows(output: str) -> dict[str, list[str]]:
    """The table's rows by their context cell: [concurrent requests, binding limit]."""
    found = {}
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.split("│")]
        if len(cells) == 3:
            found[cells[0]] = cells[1:]
    return found


def test_the_default_ladder() -> None:
    out = run(*LLAMA)
    assert out.exit_code == 0, out.output
    table = rows(out.output)
    assert list(table) == ["1k", "2k", "4k", "8k", "16k", "32k", "64k", "128k", "256k", "512k", "1M"]
    assert table["1k"] == ["32", "full tokens"]  # 32,768 // 1,024
    assert table["32k"] == ["1", "full tokens"]
    assert table["64k"] == ["0", "full tokens"]
    # beyond the model's 131,072 the rows stay, saying why
    assert table["256k"] == ["0", "exceeds the context length (131,072)"]
    assert table["1M"] == ["0", "exceeds the context length (131,072)"]
    assert "full tokens 32,768 · request cap 2,048 · context length 131,072" in out.output
    assert "largest single-request context: 32,768 tokens (binding: full tokens)" in out.output


def test_context_lengths_as_people_write_them() -> None:
    out = run(*LLAMA, "--context", "3000", "--context", "2k,16k")
    assert out.exit_code == 0, out.output
    assert rows(out.output) == {
        "3,000": ["10", "full tokens"],
        "2k": ["16", "full tokens"],
        "16k": ["2", "full tokens"],
    }
    # the flags are for the longest context asked: 90% of 32,768 = 29,488 tokens // 16,384 = 1
    assert "SGLang flags (10% headroom, binding: full tokens): --max-running-requests 1 --context-length 16384" in (
        out.output
    )


def test_requests_prints_both_largest_contexts() -> None:
    out = run(*LLAMA, "--requests", "3")
    assert out.exit_code == 0, out.output
    assert "largest context 3 concurrent requests all reach: 10,912 tokens (binding: full tokens)" in out.output
    assert "largest single-request context: 32,768 tokens (binding: full tokens)" in out.output


def test_json_matches_the_library() -> None:
    out = run(*LLAMA, "--requests", "10", "--context", "1k,200k", "--headroom", "0.2", "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    p = plan("llama-3.1-8b", Serving(page_size=16, accounting="sglang"), memory="4GiB")
    assert (data["model"], data["accounting"]) == ("llama-3.1-8b", "sglang")
    assert [(row["context_len"], row["concurrent_requests"], row["binding"]) for row in data["ladder"]] == [
        (1_024, 32, "full tokens"),
        (204_800, 0, "context length"),
    ]
    assert data["ladder"][0] == concurrency(p, 1_024).to_dict()
    assert data["max_context"]["concurrent"] == max_context(p, 10).to_dict()
    assert data["max_context"]["single_request"] == max_context(p, 1).to_dict()
    assert data["flags"] == engine_flags(p, 1_024, 0.2).to_dict()
    assert data["flags"]["args"] == "--max-running-requests 25 --context-length 1024"  # 26,208 // 1,024


def test_hybrid_tables_name_their_limits() -> None:
    swa = run("gemma-2-9b", "--memory", "8GiB", "--page-size", "16", "--context", "2k")
    assert swa.exit_code == 0, swa.output
    assert rows(swa.output)["2k"][1] == "swa tokens"
    assert (
        "(window 4,096: at most 4,256 per request, + up to 8,192 for each of 2 prefill(s) in flight, 16 reserved)"
        in (swa.output)
    )
    mamba = run("qwen3-next-80b-a3b-thinking", "--memory", "60GiB", "--context", "4k", "--json")
    assert mamba.exit_code == 0, mamba.output
    row = json.loads(mamba.output)["ladder"][0]
    assert (row["concurrent_requests"], row["binding"]) == (131, "state slots")


def test_bad_context_is_one_line_naming_the_option() -> None:
    out = run(*LLAMA, "--context", "abc")
    assert out.exit_code == 1
    assert out.stderr.startswith("Error: --context takes a context length")
    assert "'abc'" in out.stderr
    assert out.stderr.count("\n") == 1
    assert isinstance(out.exception, SystemExit)
    assert "Traceback" not in out.output


def test_bad_requests_and_headroom_are_errors() -> None:
    for args, flag in ((("--requests", "0"), "--requests"), (("--headroom", "1.5"), "--headroom")):
        out = run(*LLAMA, *args)
        assert out.exit_code == 1, out.output
        assert out.stderr.startswith(f"Error: {flag}")


def test_an_unmodelled_token_space_is_refused_cleanly() -> None:
    """DeepSeek-V4 under HiSparse: its c4 device pool has an allocator of its own, no ratio is recorded."""
    out = run(
        "deepseek-v4-flash",
        "--memory",
        "60GiB",
        "--page-size",
        "256",
        "--enable-hisparse",
        "--disable-radix-cache",
        "--accounting",
        "sglang",
    )
    assert out.exit_code == 1
    assert "c4" in out.stderr and "not modelled yet" in out.stderr
    assert isinstance(out.exception, SystemExit)


def test_the_window_terms_capacity_reads_are_on_the_plan() -> None:
    """``kvpools plan`` prints the worst case beside the cost lines and ``--json`` carries it; ``kvpools capacity
    --json`` carries the same terms (gpt-oss-20b, page 16: 128 + 128 x 1 + 16 + 16 = 288 per request)."""
    args = ("gpt-oss-20b", "--memory", "4GiB", "--page-size", "16")
    shown = CliRunner().invoke(main, ["plan", *args])
    assert shown.exit_code == 0, shown.output
    assert "worst case  swa: at most 288 tokens/request past the window (window 128 + eviction interval 128" in (
        shown.output
    )
    expected = {
        "token_space": "swa",
        "window": 128,
        "eviction_interval": 128,
        "draft_tokens": 1,
        "page_size": 16,
        "decode_alloc": 16,
        "prefill_chunk": 8_192,
        "prefills_in_flight": 2,
        "reserved": 16,
    }
    planned = json.loads(CliRunner().invoke(main, ["plan", *args, "--json"]).output)
    assert planned["windows"] == [{**expected, "per_request": 288}]
    assert planned["plan"]["sizing"]["windows"] == [expected]
    answered = json.loads(run(*args, "--context", "1k", "--json").output)
    assert answered["windows"] == planned["windows"]
    assert answered["ladder"][0]["tokens_per_request"] == {"full": 1_024, "swa": 288}
