"""Run SGLang 0.5.23's ``DSV4PoolConfigurator`` budget for DeepSeek-V4.1 (the peers venv, CPU).

Usage: ``python sglang_v41_configurator_peer.py`` with a JSON list of cases on stdin; prints one JSON list.

Each case: ``compress_ratios`` (decoder layers, then MTP layers), ``num_layers`` (one stage, ``layer_info``
``[0, num_layers)``), ``kv_source_layer_ids``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``index_head_dim``,
``window``, ``page_size``, ``context_len``, ``max_running_requests``, ``attn_dp_size``, ``chunked_prefill_size``
(the rank's), ``encoder_replay``, ``swa_full_tokens_ratio`` (the operator's; ignored under replay),
``swa_ratio_explicit`` (whether the operator gave it), ``dsv4_attn_backend``, ``kv_layout`` (the ``KVLayout``
value ``select_dsv4_kv_layout`` returns),
``compressed_option`` (the option it hands on, or null), ``disable_overlap_schedule``, ``disable_radix_cache``,
``swa_eviction_interval`` (``SGLANG_SWA_EVICTION_INTERVAL``), ``available_bytes`` and ``final_requests`` (the
request count ``finalize_with_max_running_requests`` gets).

The answer: ``DSV4PoolConfigurator(kvc)`` of ``srt/model_executor/pool_configurator.py`` run as installed, its
``bytes_per_full_token``, ``_get_c128_state_fixed_bytes`` / ``_get_c2_state_fixed_bytes`` /
``_get_swa_fixed_bytes`` at the request count it resolves, ``_get_low_ratio_kv_padding_bytes`` at the full
tokens, and ``calculate_pool_sizes(available_bytes, page)`` then ``finalize_with_max_running_requests``'s
``MemoryPoolConfig``.  As in ``sglang_encoder_replay_peer.py`` (both use ``sglang_peer_stubs.py``), the classes and
functions are taken from the installed files by name and run unchanged, with stand-ins for the server-args
accessors; ``DSV41_INDEX_PAGE_SIZE`` is 64, ``dsv41_index_page_size()``'s answer off SM100 (kvpools plans 64).
This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from sglang_peer_stubs import (
    Env,
    configurator_globals,
    configurator_kvc,
    extract,
    fake_dsv4_imports,
    load_kv_layout,
    sglang_root,
)

DSV41_INDEX_PAGE_SIZE = 64


def main() -> None:
    root = sglang_root()
    kv = load_kv_layout(root)
    layouts = {layout.value: layout for layout in kv.KVLayout}
    envs = NS(
        SGLANG_OPT_USE_ONLINE_COMPRESS=Env(False),
        SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=Env(False),
        SGLANG_DSV4_COMPRESS_STATE_DTYPE=Env("float32"),
        SGLANG_SWA_EVICTION_INTERVAL=Env(128),
    )
    state: dict[str, Any] = {}
    common, mp = configurator_globals(root, kv, envs, state, "sglang_v41_configurator_peer")
    fake_dsv4_imports(
        mp,
        lambda: (state["layout"], state["option"]),
        DSV41_INDEX_PAGE_SIZE=DSV41_INDEX_PAGE_SIZE,
        _num_dsv4_physical_kv_pages=mp["_num_dsv4_physical_kv_pages"],
    )
    pc_names = {
        "MemoryPoolConfig",
        "MemoryPoolConfigurator",
        "_get_dsv4_compress_state_dtype_sizes",
        "check_dsv4_unified_fp8_pd_supported",
        "DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO",
        "_operator_swa_full_tokens_ratio",
        "compute_swa_request_cap",
        "_DSV4PoolSizes",
        "DSV4PoolConfigurator",
    }
    pc = extract(root / "srt/model_executor/pool_configurator.py", pc_names, dict(common))

    answers = []
    for case in json.load(sys.stdin):
        page = case["page_size"]
        replay = case["encoder_replay"]
        envs.SGLANG_SWA_EVICTION_INTERVAL.value = case["swa_eviction_interval"]
        state.update(
            layout=layouts[case["kv_layout"]],
            option=case["compressed_option"],
            exec=NS(
                features=NS(enable_encoder_swa_bounded_replay=replay),
                kernel=NS(dsv4_attn_backend=case["dsv4_attn_backend"], enable_deepseek_v4_fp4_indexer=False),
            ),
            schedule=NS(
                chunked_prefill_size=case["chunked_prefill_size"],
                max_running_requests=case["max_running_requests"],
                swa_prefix_tails=None,
                disable_overlap_schedule=case["disable_overlap_schedule"],
                _swa_full_tokens_ratio_explicitly_set=not replay and case["swa_ratio_explicit"],
                swa_full_tokens_ratio=case["swa_full_tokens_ratio"],
                page_size=page,
            ),
            spec=NS(speculative_algorithm=None, speculative_num_draft_tokens=None),
            memory=NS(enable_hisparse=False, disable_radix_cache=case["disable_radix_cache"]),
            disagg=NS(disaggregation_mode="null", disaggregation_decode_extra_slots=0),
        )
        kvc = configurator_kvc(case)
        cfg = pc["DSV4PoolConfigurator"](kvc)
        available = case["available_bytes"]
        requests = cfg._resolve_max_running_requests_per_worker(available)
        config = cfg.calculate_pool_sizes(available, page)
        config.max_running_requests = case["final_requests"]
        config = cfg.finalize_with_max_running_requests(config)
        answers.append(
            {
                "bytes_per_full_token": cfg.bytes_per_full_token,
                "bytes_per_swa_token": cfg.bytes_per_swa_token,
                "requests": requests,
                "c128_state_fixed_bytes": cfg._get_c128_state_fixed_bytes(requests),
                "c2_state_fixed_bytes": cfg._get_c2_state_fixed_bytes(requests),
                "swa_fixed_bytes": cfg._get_swa_fixed_bytes(),
                "swa_cap_tokens": cfg.swa_cap_tokens,
                "padding_bytes": cfg._get_low_ratio_kv_padding_bytes(config.full_max_total_num_tokens),
                "config": {
                    "full_max_total_num_tokens": config.full_max_total_num_tokens,
                    "swa_max_total_num_tokens": config.swa_max_total_num_tokens,
                    "c4_max_total_num_tokens": config.c4_max_total_num_tokens,
                    "c128_max_total_num_tokens": config.c128_max_total_num_tokens,
                    "c4_state_pool_size": config.c4_state_pool_size,
                    "c128_state_pool_size": config.c128_state_pool_size,
                },
            }
        )
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
