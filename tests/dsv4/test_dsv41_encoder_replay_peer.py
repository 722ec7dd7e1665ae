"""Encoder SWA bounded replay against SGLang 0.5.23's own code (issue 33, ledger 000-119).

``sglang_encoder_replay_peer.py`` runs, in the peers venv, the installed ``DSV4PoolConfigurator.__init__``
(``model_executor/pool_configurator.py``) with ``--enable-encoder-swa-bounded-replay`` on, and the installed
``RequestWindow`` (``mem_cache/dsv41_request_window.py``) with the pool's arguments; kvpools' plan must agree on
``request_window_bytes``, the SWA ratio, SWA cap and SWA fixed bytes, the SWA / c4-state sizes, and the bytes of
the window's state, tags and replay workspace.  Skips without the peers venv (fails under
``KVPOOLS_REQUIRE_SHARED=1``), as every peer test.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import attrs
from kvpools_plugins.dsv4.buffers import DSV4Sizes, dsv4_buffers
from kvpools_plugins.dsv4.encoder_replay import (
    REPLAY_WORKSPACE_POOL,
    REQUEST_WINDOW_POOL,
    REQUEST_WINDOW_TAGS_POOL,
)
from kvpools_plugins.dsv4.layouts import main_layout

from kvpools_core import Serving
from kvpools_core.pipeline import plan
from kvpools_core.values import Plan
from tests.dsv4.peers import configurator_case, run_peer
from tests.oracle import locate

PYTHON, _BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_encoder_replay_peer.py")
V41 = str(Path(__file__).with_name("configs") / "dsv41_synthetic.json")
REQUESTS = (1, 7, 64, 256, 1000)
CHUNKS = (512, 8192, 65536)
SERVINGS = [
    Serving(enable_encoder_swa_bounded_replay=True, accounting="sglang", max_running_requests=r, chunked_prefill_size=c)
    for r, c in itertools.product(REQUESTS, CHUNKS)
] + [
    Serving(
        enable_encoder_swa_bounded_replay=True,
        accounting="sglang",
        tp_size=4,
        dp_size=4,
        enable_dp_attention=True,
        max_running_requests=512,
        chunked_prefill_size=16384,
    ),
    Serving(enable_encoder_swa_bounded_replay=True, accounting="exact", dsv4_kv_layout="v41"),
]


def _case(p: Plan) -> dict[str, Any]:
    sizes = DSV4Sizes.from_config(p.sizing.sglang_config)
    b = dsv4_buffers(p.model, p.serving, sizes, max_running_requests=p.max_running_requests)
    return {
        **configurator_case(p),
        "full_tokens": p.max_total_num_tokens,
        "num_req_slots": b.num_req_slots,
        "kv_layout": main_layout(p.serving).name,
    }


def test_plans_agree_with_sglangs_configurator_and_request_window() -> None:
    plans = [plan(V41, serving, memory="40GiB") for serving in SERVINGS]
    answers = run_peer(PYTHON, PEER, [_case(p) for p in plans])
    for p, answer in zip(plans, answers, strict=True):
        config, sglang = p.sizing.sglang_config, answer["configurator"]
        label = (p.serving.max_running_requests, p.serving.chunked_prefill_size, p.serving.accounting)
        # the configurator's budget (what the sglang accounting sets aside; the exact one reports it)
        assert config["request_window_bytes"] == sglang["request_window_bytes"] == sglang["swa_fixed_bytes"], label
        assert (sglang["swa_ratio"], sglang["swa_cap_tokens"], sglang["paged_draft_layers"]) == (0, 0, 0), label
        assert sglang["bytes_per_swa_token"] == 0 and sglang["spec_infl"] == 1.0, label
        assert config["swa_max_total_num_tokens"] == sglang["swa_max_total_num_tokens"] == 0, label
        assert config["c4_state_pool_size"] == sglang["c4_state_pool_size"] == 0, label
        window = answer["window"]
        assert p.pool(REQUEST_WINDOW_POOL).bytes == window["state_bytes"], label
        assert p.pool(REQUEST_WINDOW_TAGS_POOL).bytes == window["tags_bytes"], label
        assert p.pool(REPLAY_WORKSPACE_POOL).bytes == window["workspace_bytes"], label


def test_the_exact_accounting_keeps_sglangs_window_budget_in_the_notes() -> None:
    """Under ``--accounting exact`` the budget charges the buffers built; SGLang's request_window_bytes is still
    reported (notes), and is larger than the window's buffers (it budgets the replay's activations too)."""
    p = plan(V41, attrs.evolve(SERVINGS[0], accounting="exact"), memory="40GiB")
    built = sum(p.pool(name).bytes for name in (REQUEST_WINDOW_POOL, REQUEST_WINDOW_TAGS_POOL, REPLAY_WORKSPACE_POOL))
    [answer] = run_peer(PYTHON, PEER, [_case(p)])
    assert answer["configurator"]["request_window_bytes"] > built
    assert any(f"{answer['configurator']['request_window_bytes']:,} B" in note for note in p.sizing.notes)
