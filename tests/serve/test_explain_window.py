"""The service's "why" sentence for a sliding-window pool that binds (``kvpools_core.serve.service.explain``) says
what sized that pool: ``--swa-full-tokens-ratio`` only where the ratio sized it.

DeepSeek-V4.1 with the ratio unset is sized by SGLang 0.5.23's cap mode (the request cap,
``_resolve_swa_cap_tokens``) or, without chunked prefill, by the configurator's own 0.1: the sentence used to tell
the user to "Raise --swa-full-tokens-ratio (now 0.8)", a ratio no pool was sized by.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from kvpools_core import Serving, plan
from kvpools_core.planning.capacity import concurrency, concurrency_within, limits_of

V41 = Path(__file__).parents[1] / "dsv4" / "configs" / "dsv41_synthetic.json"
"""8 layers of DeepSeek-V4-Flash's dims, compress ratios [0, 1, 2, 1, 4, 128, 2, 0] (tests/dsv4)."""


def explain(answer: Any, p: Any) -> str:
    pytest.importorskip("pydantic", reason="the serve extra is not installed (pip install -e '.[serve]')")
    from kvpools_core.serve.service import explain as service_explain

    return str(service_explain(answer, p))


def test_cap_mode_names_the_request_cap() -> None:
    """The cap-mode plan (606,464 SWA tokens for 256 requests' worst case, 768 each: the request cap binds first)
    with the request cap lifted: at 4,096 tokens the SWA pool binds at (606,464 - 2 prefills x the 3,328 tokens of
    a prompt past its 768 - a page of 256) // 768 = 780 requests (``capacity.prefill_extra``; full tokens:
    15,704,832 // 4,096 = 3,834)."""
    p = plan(str(V41), Serving(accounting="sglang"), memory="20GiB")
    assert concurrency(p, 4096).binding == "request cap"
    answer = concurrency_within(attrs.evolve(limits_of(p), request_cap=10_000), 4096)
    assert (answer.binding, answer.concurrent_requests) == ("swa tokens", (606_464 - 2 * (4096 - 768) - 256) // 768)
    why = explain(answer, p)
    assert why.startswith("The swa pool binds at 780: 606,464 tokens / 768 per request")
    assert "the dsv4 plugin sized it: SWA pool: SGLang 0.5.23's cap mode" in why
    assert "Raise --swa-full-tokens-ratio" not in why


def test_unset_ratio_without_chunked_prefill_names_the_configurators_ratio() -> None:
    """2 GiB, no chunked prefill: the configurator's 0.1 (not the unset 0.8) splits 1,206,272 full tokens:
    int(1,206,272 x 0.1) = 120,627, page aligned 120,576 SWA tokens; at 4,096 tokens they bind (148 requests of 768
    each beside 294 of full tokens)."""
    p = plan(str(V41), Serving(accounting="sglang", chunked_prefill_size=None), memory="2GiB")
    full, swa = p.sizing.token_counts["full"], p.sizing.token_counts["swa"]
    assert (full, swa) == (1_206_272, int(1_206_272 * 0.1) // 256 * 256) == (1_206_272, 120_576)
    answer = concurrency(p, 4096)
    assert (answer.binding, answer.concurrent_requests) == ("swa tokens", 148)
    why = explain(answer, p)
    assert f"x swa_full_tokens_ratio 0.1) page aligned = {swa:,} tokens" in why
    assert "(now 0.8)" not in why


def test_a_given_ratio_is_still_the_knob() -> None:
    """V4.1 with --swa-full-tokens-ratio 0.02 given, 2 GiB: the ratio sized the SWA pool (int(1,587,456 x 0.02) =
    31,749, page aligned 31,744), so it is what to raise."""
    p = plan(str(V41), Serving(accounting="sglang", swa_full_tokens_ratio=0.02), memory="2GiB")
    assert dict(p.sizing.token_counts)["swa"] == int(1_587_456 * 0.02) // 256 * 256 == 31_744
    answer = concurrency(p, 4096)
    assert answer.binding == "swa tokens"
    assert "Raise --swa-full-tokens-ratio (now 0.02) to give the sliding-window pool" in explain(answer, p)


def test_the_service_never_offers_the_unused_ratio(client: Any) -> None:
    """The cap-mode V4.1 config uploaded to /api/v1/capacity: no sentence offers the ratio it was not sized by."""
    config = json.loads(V41.read_text())
    body = client.post(
        "/api/v1/capacity",
        json={"config": config, "memory": "20GiB", "serving": {"accounting": "sglang"}, "contexts": ["4k", "64k"]},
    ).json()
    assert "result" in body, body
    why = body["result"]["why"]
    assert len(why) == 2
    assert not any("swa-full-tokens-ratio" in line for line in why), why
