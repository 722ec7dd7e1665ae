"""DeepSeek-V4.1's ``--accounting sglang`` budget against SGLang 0.5.23's own ``DSV4PoolConfigurator`` (issue 33).

``sglang_v41_configurator_peer.py`` runs, in the peers venv, the installed configurator
(``model_executor/pool_configurator.py``: ``_get_bytes_per_full_token`` with the ratio-1/2 terms,
``_get_c2_state_fixed_bytes``, ``_get_low_ratio_kv_padding_bytes``, ``calculate_pool_sizes`` and
``finalize_with_max_running_requests``) for several V4.1 topologies, with and without encoder SWA bounded
replay, V4 / V4.1 / V4.1-new layouts and the trtllm uniform fp8 pool; kvpools' sglang plan must give the same
coefficient (float-exact), the same fixed bytes and the same ``MemoryPoolConfig``.  Skips without the peers venv
(fails under ``KVPOOLS_REQUIRE_SHARED=1``), as every peer test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvpools_plugins.dsv4.layouts import _compressed_option, main_layout
from kvpools_plugins.dsv4.sizing import dsv4_shape, swa_cap_bytes

from kvpools_core import Serving
from kvpools_core.pipeline import plan
from kvpools_core.values import Plan, is_unset
from tests.dsv4.peers import configurator_case, run_peer
from tests.oracle import locate

PYTHON, _BENCH = locate.require_sglang_peer()
PEER = Path(__file__).with_name("sglang_v41_configurator_peer.py")
SYNTHETIC = Path(__file__).with_name("configs") / "dsv41_synthetic.json"
TOPOLOGIES = {
    # decoder ratios + one MTP layer's 0; kv_source_layer_ids: the first layer of each ratio-1/2 run
    "synthetic": ([0, 1, 2, 1, 4, 128, 2, 0], [1, 2]),
    "two-sources-each": ([0, 1, 2, 1, 2, 4, 128, 1, 2, 4], [1, 2, 7, 8]),
    "ratio-1-only": ([0, 1, 1, 4, 128, 0, 1, 128], [1, 6]),
    "ratio-2-only-no-c4": ([0, 2, 2, 128, 0, 2, 128, 0], [1, 5]),
}
SERVINGS = {
    "replay": Serving(enable_encoder_swa_bounded_replay=True),
    "replay-64-v41": Serving(enable_encoder_swa_bounded_replay=True, max_running_requests=64, dsv4_kv_layout="v41"),
    "ratio-0.1": Serving(swa_full_tokens_ratio=0.1),
    "ratio-0.5-v41-new-fp8": Serving(
        swa_full_tokens_ratio=0.5, dsv4_kv_layout="v41_new", dsv4_compressed_kv_layout="fp8"
    ),
    "ratio-0.8-trtllm": Serving(swa_full_tokens_ratio=0.8, dsv4_attn_backend="trtllm", max_running_requests=32),
    # the ratio unset, no chunked prefill: cap mode unusable, so the configurator's own 0.1 (not the generic 0.8)
    "unset-no-chunk": Serving(chunked_prefill_size=None),
    # the ratio unset with chunked prefill: 0.5.23's SWA cap mode (request cap + radix prefix tails)
    "unset-cap": Serving(),
    "unset-cap-64-no-radix-one-chunk": Serving(
        max_running_requests=64, disable_radix_cache=True, disable_overlap_schedule=True, chunked_prefill_size=4096
    ),
    "unset-cap-eviction-32-dp": Serving(
        swa_eviction_interval=32, tp_size=2, dp_size=2, enable_dp_attention=True, chunked_prefill_size=16384
    ),
}  # fmt: skip
MEMORY = ("7GiB", "40GiB")


def _config(tmp: Path, name: str) -> str:
    ratios, sources = TOPOLOGIES[name]
    config = json.loads(SYNTHETIC.read_text())
    config.update(num_hidden_layers=len(ratios), compress_ratios=[*ratios, 0], kv_source_layer_ids=sources)
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


def _case(p: Plan) -> dict[str, Any]:
    return {
        **configurator_case(p),
        "encoder_replay": p.serving.enable_encoder_swa_bounded_replay,
        "swa_full_tokens_ratio": float(p.serving.swa_full_tokens_ratio),
        "swa_ratio_explicit": not is_unset(p.serving.swa_full_tokens_ratio),
        "dsv4_attn_backend": p.serving.dsv4_attn_backend,
        "kv_layout": main_layout(p.serving).name if p.serving.dsv4_attn_backend != "trtllm" else "v4",
        "compressed_option": _compressed_option(p.serving),
        "available_bytes": p.budget.budget_bytes,
        "disable_overlap_schedule": p.serving.disable_overlap_schedule,
        "disable_radix_cache": p.serving.radix_cache_disabled,
        "swa_eviction_interval": p.serving.swa_eviction_interval,
        "final_requests": p.max_running_requests,
    }


def test_the_sglang_plans_are_sglang_0_5_23s_configurator(tmp_path: Path) -> None:
    labels, plans = [], []
    for topology in TOPOLOGIES:
        model = _config(tmp_path, topology)
        for name, serving in SERVINGS.items():
            for memory in MEMORY:
                p = plan(model, Serving(**{**_given(serving), "accounting": "sglang"}), memory=memory)
                labels.append((topology, name, memory))
                plans.append(p)
    answers = run_peer(PYTHON, PEER, [_case(p) for p in plans])
    for label, p, answer in zip(labels, plans, answers, strict=True):
        shape = dsv4_shape(p.model, p.serving)
        requests = shape.requested_per_worker
        assert requests is not None, label
        assert p.cell.sglang_bytes_per_token == answer["bytes_per_full_token"], label
        assert shape.c128_state_fixed_bytes(requests) == answer["c128_state_fixed_bytes"], label
        assert shape.c2_state_fixed_bytes(requests) == answer["c2_state_fixed_bytes"], label
        cap_bytes = swa_cap_bytes(shape)
        assert p.sizing.sglang_config.get("request_window_bytes", 0) + cap_bytes == answer["swa_fixed_bytes"], label
        # None: ratio sizing; 0: encoder replay's (no SWA pool); else cap mode's slots
        assert (shape.swa_cap or 0) == (answer["swa_cap_tokens"] or 0), label
        assert shape.v41 is not None
        full = p.max_total_num_tokens
        assert shape.v41.padding_bytes(full) == answer["padding_bytes"], label
        config = {key: p.sizing.sglang_config[key] for key in answer["config"]}
        assert config == answer["config"], label


def _given(serving: Serving) -> dict[str, Any]:
    """The options a case sets (its unset ones stay unset, so the engine defaults apply)."""
    names = ("enable_encoder_swa_bounded_replay", "max_running_requests", "dsv4_kv_layout",
             "dsv4_compressed_kv_layout", "swa_full_tokens_ratio", "dsv4_attn_backend",
             "chunked_prefill_size", "disable_radix_cache", "disable_overlap_schedule", "swa_eviction_interval",
             "tp_size", "dp_size", "enable_dp_attention")  # fmt: skip
    return {name: getattr(serving, name) for name in names if not is_unset(getattr(serving, name))}
