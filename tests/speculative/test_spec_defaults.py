"""SGLang 0.5.23's speculative-decoding defaults and refusals, as kvpools plans them (issue 32).

* DeepSeek-V4 runs EAGLE (top-k 1) and DSPARK only: ``apply_deepseek_v4_defaults``
  (``arg_groups/deepseek_v4_hook.py`` lines 148-159) asserts it on the algorithm as given, so NEXTN, EAGLE3,
  STANDALONE, NGRAM and DFLASH are refused with SGLang's message, and EAGLE without ``--speculative-eagle-topk 1``.
* ``--max-running-requests`` unset is 48 under speculative decoding (every algorithm's handler in
  ``arg_groups/speculative_hook.py``: ``_handle_dflash`` lines 439-447, ``_handle_dspark`` 853-861,
  ``_handle_eagle_family`` 1087-1095, ``_handle_ngram`` 1295-1303), 256 on DeepSeek-V4 whatever the algorithm
  (``apply_deepseek_v4_defaults`` lines 137-146, which runs first); an explicit value wins.

The differential half runs SGLang's own hook functions in the peers venv
(``tests/oracle/sglang_spec_defaults_peer.py``).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kvpools_core import Serving, plan
from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.values import LateDefaultInt

GiB = 1 << 30
V4 = "deepseek-v4-flash"
LLAMA = "llama-3.1-8b"
PEER = Path(__file__).parents[1] / "oracle" / "sglang_spec_defaults_peer.py"
V4_EAGLE = {
    "speculative_algorithm": "EAGLE",
    "speculative_num_steps": 3,
    "speculative_eagle_topk": 1,
    "speculative_num_draft_tokens": 4,
}


def _v4(**options: Any) -> Serving:
    return Serving(tp_size=4, page_size=256, **options)


@pytest.mark.parametrize("algorithm", ("NEXTN", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH"))
def test_deepseek_v4_refuses_the_algorithms_sglang_asserts_away(algorithm: str) -> None:
    """deepseek_v4_hook.py lines 148-154: ``assert cfg.speculative_algorithm in ("EAGLE", "DSPARK")``; before
    issue 32 kvpools planned all five (NGRAM as a draft-less plan, the others with MTP-layer draft pools)."""
    with pytest.raises(UnsupportedCombinationError, match="Only EAGLE and DSPARK speculative algorithms are supported"):
        plan(V4, _v4(speculative_algorithm=algorithm, speculative_draft_num_layers=1), memory=60 * GiB)


@pytest.mark.parametrize("topk", (None, 2))
def test_deepseek_v4_eagle_needs_topk_one(topk: int | None) -> None:
    """deepseek_v4_hook.py lines 155-158: ``assert cfg.speculative_eagle_topk == 1``, before the speculative hook
    would choose a top-k (an unset one is ``None`` there)."""
    serving = _v4(speculative_algorithm="EAGLE", speculative_num_steps=3, speculative_eagle_topk=topk)
    with pytest.raises(UnsupportedCombinationError, match="Only EAGLE speculative algorithm with topk == 1"):
        plan(V4, serving, memory=60 * GiB)


def test_speculative_decoding_runs_48_requests_unless_told() -> None:
    """NGRAM on Llama-3.1-8B, 20 GiB: SGLang's ``_handle_ngram`` sets 48 (before: kvpools kept
    ``resolve_max_num_reqs``' estimate, ``clamp(tokens / context x 512, 2048, 4096)`` = 2048, and a request table
    of 2,048 rows); the note says so and an explicit ``--max-running-requests`` wins."""
    got = plan(LLAMA, Serving(speculative_algorithm="NGRAM"), memory=20 * GiB)
    assert got.sizing.sglang_config["max_running_requests"] == 48
    assert got.pool("req_to_token").slots == 48
    assert any(note.startswith("max_running_requests 48") and "speculative" in note for note in got.sizing.notes)
    told = plan(LLAMA, Serving(speculative_algorithm="NGRAM", max_running_requests=100), memory=20 * GiB)
    assert told.sizing.sglang_config["max_running_requests"] == 100
    plain = plan(LLAMA, Serving(), memory=20 * GiB)
    assert plain.sizing.sglang_config["max_running_requests"] == 2048


def test_deepseek_v4_default_of_256_precedes_the_speculative_48() -> None:
    """``apply_deepseek_v4_defaults`` (``handle_model_specific_adjustments``) sets 256 before
    ``handle_speculative_decoding`` runs, whose 48 applies only to an unset option."""
    got = plan(V4, _v4(**V4_EAGLE, speculative_draft_num_layers=1), memory=60 * GiB)
    assert got.sizing.sglang_config["max_running_requests"] == 256
    assert any(note.startswith("max_running_requests 256") for note in got.sizing.notes)


def test_a_late_default_is_unset_for_the_pd_decode_extra_slots() -> None:
    """``handle_pd_disaggregation`` (``pd_disaggregation_hook.py`` lines 133-143) reads ``max_running_requests``
    before the speculative hook sets it: 48 over 2 DP workers (24 each, at most 32) reserves no 2 x 24 extra rows."""
    decode = {"disaggregation_mode": "decode", "dp_size": 2, "enable_dp_attention": True, "tp_size": 2}
    assert Serving(**decode, max_running_requests=LateDefaultInt(48)).decode_extra_slots == 0
    assert Serving(**decode, max_running_requests=48).decode_extra_slots == 48


# -- differential: SGLang's own hook functions ----------------------------------------------------------------


def _peer(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from tests.oracle import locate

    python, bench = locate.require_sglang_peer()
    out = subprocess.run(
        [str(python), str(PEER), str(bench)],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return list(json.loads(out.stdout))


V4_CASES: list[dict[str, Any]] = [
    {"speculative_algorithm": algorithm} for algorithm in ("NEXTN", "EAGLE3", "STANDALONE", "NGRAM", "DFLASH")
] + [
    {"speculative_algorithm": "EAGLE"},
    {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 2, "speculative_num_steps": 3},
    V4_EAGLE,
    {},
    {**V4_EAGLE, "max_running_requests": 64},
]


def test_deepseek_v4_against_sglangs_hook() -> None:
    """Each case through SGLang's ``apply_deepseek_v4_defaults``: kvpools refuses with its message, or plans the
    request limit it declares."""
    answers = _peer([{"hook": "dsv4", "architecture": "DeepseekV4ForCausalLM", "server_args": c} for c in V4_CASES])
    for case, answer in zip(V4_CASES, answers, strict=True):
        serving = _v4(**case, speculative_draft_num_layers=1) if case.get("speculative_algorithm") else _v4(**case)
        if "error" in answer:
            with pytest.raises(UnsupportedCombinationError) as caught:
                plan(V4, serving, memory=60 * GiB)
            assert answer["error"] in str(caught.value), case
        else:
            got = plan(V4, serving, memory=60 * GiB)
            assert got.sizing.sglang_config["max_running_requests"] == answer["declared"]["max_running_requests"], case


SPEC_CASES: list[tuple[str, dict[str, Any]]] = [
    ("ngram", {"speculative_algorithm": "NGRAM"}),
    ("ngram", {"speculative_algorithm": "NGRAM", "max_running_requests": 100}),
    (
        "eagle",
        {
            "speculative_algorithm": "STANDALONE",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4,
        },
    ),
    (
        "eagle",
        {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 4,
            "max_running_requests": 7,
        },
    ),
    ("dflash", {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 16}),
]


def test_speculative_request_limit_against_sglangs_hooks() -> None:
    """``_handle_ngram``, ``_handle_eagle_family`` and ``_handle_dflash`` on Llama-3.1-8B: the request limit
    kvpools plans is the one SGLang's handler declares."""
    answers = _peer(
        [
            {
                "hook": hook,
                "architecture": "LlamaForCausalLM",
                "server_args": {"speculative_draft_model_path": "d", **c},
            }
            for hook, c in SPEC_CASES
        ]
    )
    for (_, case), answer in zip(SPEC_CASES, answers, strict=True):
        draft = {} if case["speculative_algorithm"] == "NGRAM" else {"speculative_draft_num_layers": 1}
        got = plan(LLAMA, Serving(**case, **draft), memory=20 * GiB)
        assert got.sizing.sglang_config["max_running_requests"] == answer["declared"]["max_running_requests"], case


# -- the draft parameters SGLang chooses when they are unset (issue 32) ------------------------------------------


def test_unset_eagle_parameters_are_sglangs_auto_choice_on_llama() -> None:
    """EAGLE on Llama-3.1-8B with steps, top-k and draft tokens unset: ``_auto_choose_speculative_params``
    (``arg_groups/speculative_hook.py`` lines 1430-1461) picks (5, 4, 8) for LlamaForCausalLM.  The request-table
    row is context 131,072 + ``get_req_to_token_extra_context_len`` = 4 + 8 draft tokens = 131,084 int32
    columns, 524,336 B (before the fix kvpools read them as 1, 1, 0: 131,076 columns, 524,304 B)."""
    got = plan(LLAMA, Serving(speculative_algorithm="EAGLE", speculative_draft_num_layers=1), memory=20 * GiB)
    served = got.serving
    assert (served.speculative_num_steps, served.speculative_eagle_topk, served.speculative_num_draft_tokens) == (
        5,
        4,
        8,
    )
    assert got.pool("req_to_token").bytes_per_slot == (131_072 + 4 + 8) * 4 == 524_336
    assert any(note.startswith("speculative_num_steps 5") and "_auto_choose" in note for note in got.sizing.notes)


def test_standalone_and_other_targets_get_3_1_4() -> None:
    """STANDALONE is (3, 1, 4) whatever the target; Qwen3 (not in the auto table) too: 40,960 + 4 + 4 columns."""
    for algorithm, model in (("STANDALONE", LLAMA), ("EAGLE", "qwen3-8b")):
        got = plan(model, Serving(speculative_algorithm=algorithm, speculative_draft_num_layers=1), memory=20 * GiB)
        served = got.serving
        assert (served.speculative_num_steps, served.speculative_eagle_topk, served.speculative_num_draft_tokens) == (
            3,
            1,
            4,
        )
    assert got.pool("req_to_token").bytes_per_slot == (40_960 + 4 + 4) * 4


def test_ngram_unset_is_topk_10_and_12_draft_tokens() -> None:
    """``_handle_ngram`` lines 1306-1326: top-k 10 (``--speculative-ngram-max-bfs-breadth``), 12 draft tokens,
    steps 12 // 10 = 1: the row is 131,072 + 4 + 12 columns = 524,352 B (before: 524,304 B)."""
    got = plan(LLAMA, Serving(speculative_algorithm="NGRAM"), memory=20 * GiB)
    served = got.serving
    assert (served.speculative_num_steps, served.speculative_eagle_topk, served.speculative_num_draft_tokens) == (
        1,
        10,
        12,
    )
    assert got.pool("req_to_token").bytes_per_slot == (131_072 + 4 + 12) * 4 == 524_352


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1}, "asserts that top-k and draft tokens"),
        ({"speculative_algorithm": "EAGLE", "speculative_num_steps": 3}, "compares the unset top-k"),
        (
            {
                "speculative_algorithm": "EAGLE",
                "speculative_num_steps": 3,
                "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": 8,
            },
            "adjusts it to speculative_num_steps \\+ 1 = 4",
        ),
        ({"speculative_algorithm": "NGRAM", "speculative_eagle_topk": 2}, "ngram-max-bfs-breadth"),
        ({"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 5}, "5 // 10 = 0"),
        ({"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8, "speculative_eagle_topk": 2}, "1"),
        ({"speculative_algorithm": "DFLASH"}, "block_size"),
    ],
)
def test_what_sglang_refuses_or_overrides_is_refused(options: dict[str, Any], message: str) -> None:
    """Given values SGLang asserts on, crashes on (``None > 1``) or replaces with a warning are refused, naming
    the value SGLang would use (before the fix all seven planned as given)."""
    draft = {} if options["speculative_algorithm"] == "NGRAM" else {"speculative_draft_num_layers": 1}
    with pytest.raises(UnsupportedCombinationError, match=message):
        plan(LLAMA, Serving(**options, **draft), memory=20 * GiB)


def test_explicit_parameters_win() -> None:
    """An explicit (steps, top-k, draft tokens) SGLang keeps is planned as given, with no default note."""
    given = {"speculative_num_steps": 2, "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 6}
    got = plan(LLAMA, Serving(speculative_algorithm="EAGLE", speculative_draft_num_layers=1, **given), memory=20 * GiB)
    assert {name: getattr(got.serving, name) for name in given} == given
    assert not any(note.startswith("speculative_num") for note in got.sizing.notes)


PARAMETER_CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    ("eagle", "LlamaForCausalLM", LLAMA, {"speculative_algorithm": "EAGLE"}),
    ("eagle", "LlamaForCausalLM", LLAMA, {"speculative_algorithm": "EAGLE3"}),
    ("eagle", "LlamaForCausalLM", LLAMA, {"speculative_algorithm": "STANDALONE"}),
    ("eagle", "Qwen3ForCausalLM", "qwen3-8b", {"speculative_algorithm": "EAGLE"}),
    (
        "eagle",
        "LlamaForCausalLM",
        LLAMA,
        {"speculative_algorithm": "EAGLE", "speculative_num_steps": 2, "speculative_eagle_topk": 1},
    ),
    ("eagle", "LlamaForCausalLM", LLAMA, {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1}),
    ("eagle", "LlamaForCausalLM", LLAMA, {"speculative_algorithm": "EAGLE", "speculative_num_steps": 3}),
    (
        "eagle",
        "LlamaForCausalLM",
        LLAMA,
        {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 3,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": 8,
        },
    ),
    (
        "eagle",
        "LlamaForCausalLM",
        LLAMA,
        {
            "speculative_algorithm": "EAGLE",
            "speculative_num_steps": 2,
            "speculative_eagle_topk": 2,
            "speculative_num_draft_tokens": 6,
        },
    ),
    ("ngram", "LlamaForCausalLM", LLAMA, {"speculative_algorithm": "NGRAM"}),
    ("ngram", "LlamaForCausalLM", LLAMA, {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": 30}),
    (
        "ngram",
        "LlamaForCausalLM",
        LLAMA,
        {"speculative_algorithm": "NGRAM", "speculative_eagle_topk": 10, "speculative_num_steps": 2},
    ),
    ("dflash", "LlamaForCausalLM", LLAMA, {"speculative_algorithm": "DFLASH", "speculative_num_draft_tokens": 8}),
    (
        "dflash",
        "LlamaForCausalLM",
        LLAMA,
        {
            "speculative_algorithm": "DFLASH",
            "speculative_num_draft_tokens": 8,
            "speculative_num_steps": 1,
            "speculative_eagle_topk": 1,
        },
    ),
]
"""Cases whose SGLang answer kvpools plans (same values) or refuses (SGLang raises, or would override)."""


def test_draft_parameters_against_sglangs_hooks() -> None:
    """Each case through SGLang's own handler on CPU: where SGLang resolves it without overriding a given value,
    kvpools plans exactly the (steps, top-k, draft tokens) it declares; where SGLang asserts or crashes, kvpools
    refuses."""
    answers = _peer(
        [
            {"hook": hook, "architecture": arch, "server_args": {"speculative_draft_model_path": "d", **case}}
            for hook, arch, _, case in PARAMETER_CASES
        ]
    )
    names = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    for (_, _, model, case), answer in zip(PARAMETER_CASES, answers, strict=True):
        draft = {} if case["speculative_algorithm"] == "NGRAM" else {"speculative_draft_num_layers": 1}
        serving = Serving(**case, **draft)
        if "error" in answer:
            with pytest.raises(UnsupportedCombinationError):
                plan(model, serving, memory=20 * GiB)
            continue
        declared = answer["declared"]
        overridden = any(case.get(name) is not None and case[name] != declared[name] for name in names)
        if overridden:  # SGLang replaced a given value: kvpools refuses rather than plan what was not asked
            with pytest.raises(UnsupportedCombinationError, match=r"SGLang 0\.5\.23"):
                plan(model, serving, memory=20 * GiB)
            continue
        got = plan(model, serving, memory=20 * GiB).serving
        assert {name: getattr(got, name) for name in names} == {name: declared[name] for name in names}, case
