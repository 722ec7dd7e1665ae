"""Draft parameters as SGLang 0.5.23 runs them, for tests that draw or list speculative options (issue 32).

kvpools refuses the draft parameters SGLang's speculative handlers assert on, crash on or override with a warning
(``plugins/speculative``: ``speculative_parameter_problems``); a test whose purpose is something else passes them
through :func:`as_sglang_runs` first, which makes the rewrite SGLang would make itself
(``arg_groups/speculative_hook.py``: ``_handle_eagle_family``, ``_handle_ngram``, ``_handle_dflash``).
"""

from __future__ import annotations

from typing import Any

EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE", "NEXTN")
STEPS, TOPK, DRAFT = "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens"


def as_sglang_runs(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with steps / top-k / draft tokens as SGLang would run them (a new dict)."""
    out = dict(options)
    algorithm = out.get("speculative_algorithm")
    steps, topk, draft = out.get(STEPS), out.get(TOPK), out.get(DRAFT)
    if algorithm in EAGLE_FAMILY:
        if steps is None:  # SGLang asserts top-k and draft tokens unset, then chooses all three
            out.pop(TOPK, None)
            out.pop(DRAFT, None)
            return out
        if topk is None:
            out[TOPK] = topk = 1
        if topk == 1:
            out[DRAFT] = steps + 1
    elif algorithm == "NGRAM":
        out.pop(TOPK, None)  # SGLang's BFS breadth, 10
        if steps is None and draft is not None and draft < 10:
            out[STEPS] = 1
    elif algorithm == "DFLASH":
        out[STEPS] = 1
        out[TOPK] = 1
        if draft is None:
            out[DRAFT] = 16
    return out
