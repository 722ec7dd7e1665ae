"""Run SGLang 0.5.23's own encoder-replay arithmetic (the peers venv, CPU): the configurator and the request window.

Usage: ``python sglang_encoder_replay_peer.py`` with a JSON list of cases on stdin; prints one JSON list.

Each case: ``compress_ratios`` (decoder layers, then MTP layers), ``num_layers`` (the decoder layers: one
stage, ``layer_info`` ``[0, num_layers)``), ``kv_source_layer_ids``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
``index_head_dim``, ``window``, ``page_size``, ``context_len``, ``max_running_requests``, ``attn_dp_size``,
``chunked_prefill_size`` (the rank's, after DP attention divided it), ``full_tokens`` (for
``_compute_dsv4_sizes``), ``num_req_slots`` (the request table's rows, for the pool side), ``kv_layout`` (a
``KVLayout`` value: ``v4``, ``v41``, ...).

* ``configurator``: ``DSV4PoolConfigurator.__init__`` of ``srt/model_executor/pool_configurator.py`` run as
  installed with ``--enable-encoder-swa-bounded-replay`` on, then its ``request_window_bytes``, ``swa_ratio``,
  ``swa_cap_tokens``, ``paged_draft_layers``, ``bytes_per_swa_token``, ``_get_swa_fixed_bytes()``,
  ``_spec_infl`` and ``_compute_dsv4_sizes(full_tokens, page)``'s SWA and c4-state sizes;
* ``window``: ``RequestWindow`` of ``srt/mem_cache/dsv41_request_window.py`` constructed as installed, with
  ``DeepSeekV4TokenToKVPool``'s arguments (lines 1168-1180: ``num_slots = num_req_slots``, ``capacity = window +
  draft tokens``, ``workspace_rows = (num_req_slots + 1) x window + max(chunk, graph rows, (num_req_slots + 1) x
  (1 + draft tokens))``, no draft, graph rows 0) and a pool factory that builds what ``_make_kv_pool`` does: per
  layer one ``(_num_dsv4_physical_kv_pages(size, page, page), KVLayout.page_bytes(page))`` uint8 buffer, on
  ``meta``; the bytes of its state, tags and workspace.

The classes and functions are taken from the installed files by name (``ast``) and run unchanged; their module
globals (``get_exec``, ``get_schedule``, ``get_spec``, ``get_memory``, ``get_disagg``, ``envs``, the platform
flags) are stand-ins holding the case's server args, because the modules' own imports need SGLang's whole
dependency tree.  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import torch

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


def main() -> None:
    root = sglang_root()
    kv = load_kv_layout(root)
    layouts = {layout.value: layout for layout in kv.KVLayout}
    envs = NS(
        SGLANG_OPT_USE_ONLINE_COMPRESS=Env(False),
        SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=Env(False),
        SGLANG_DSV4_COMPRESS_STATE_DTYPE=Env("float32"),
        SGLANG_DSV4_KV_LAYOUT=Env("auto"),
        SGLANG_DSV4_COMPRESSED_KV_LAYOUT=Env("auto"),
    )
    state: dict[str, Any] = {}
    common, mp = configurator_globals(root, kv, envs, state, "sglang_encoder_replay_peer")
    fake_dsv4_imports(mp, lambda: (state["layout"], None))
    pc_names = {
        "MemoryPoolConfigurator",
        "_get_dsv4_compress_state_dtype_sizes",
        "check_dsv4_unified_fp8_pd_supported",
        "DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO",
        "_operator_swa_full_tokens_ratio",
        "_DSV4PoolSizes",
        "DSV4PoolConfigurator",
    }
    pc = extract(root / "srt/model_executor/pool_configurator.py", pc_names, dict(common))
    rw = extract(root / "srt/mem_cache/dsv41_request_window.py", {"_capturing", "RequestWindow"}, dict(common))

    answers = []
    for case in json.load(sys.stdin):
        page = case["page_size"]
        layout = layouts[case["kv_layout"]]
        state.update(
            layout=layout,
            exec=NS(
                features=NS(enable_encoder_swa_bounded_replay=True),
                kernel=NS(dsv4_attn_backend="auto", enable_deepseek_v4_fp4_indexer=False),
            ),
            schedule=NS(
                chunked_prefill_size=case["chunked_prefill_size"],
                max_running_requests=case["max_running_requests"],
                swa_prefix_tails=None,
                _swa_full_tokens_ratio_explicitly_set=False,
                swa_full_tokens_ratio=0.8,
                page_size=page,
            ),
            spec=NS(speculative_algorithm=None, speculative_num_draft_tokens=None),
            memory=NS(enable_hisparse=False, disable_radix_cache=False),
            disagg=NS(disaggregation_mode="null", disaggregation_decode_extra_slots=0),
        )
        kvc = configurator_kvc(case)
        cfg = pc["DSV4PoolConfigurator"](kvc)
        sizes = cfg._compute_dsv4_sizes(case["full_tokens"], page)
        configurator = {
            "request_window_bytes": cfg.request_window_bytes,
            "swa_ratio": cfg.swa_ratio,
            "swa_cap_tokens": cfg.swa_cap_tokens,
            "paged_draft_layers": cfg.paged_draft_layers,
            "bytes_per_swa_token": cfg.bytes_per_swa_token,
            "swa_fixed_bytes": cfg._get_swa_fixed_bytes(),
            "spec_infl": cfg._spec_infl,
            "swa_max_total_num_tokens": sizes.swa_max_total_num_tokens,
            "c4_state_pool_size": sizes.c4_state_pool_size,
        }

        def make_window_pool(size: int, layers: int, _layout: Any = layout, _page: int = page) -> Any:
            # _make_kv_pool(size, page_size=swa_page_size, global_page_size=swa_page_size, kv_layout=...)
            pages = mp["_num_dsv4_physical_kv_pages"](size, _page, _page)
            buffers = [torch.empty((pages, _layout.page_bytes(_page)), dtype=torch.uint8, device="meta")]
            buffers *= layers
            return NS(size=size, kv_buffer=buffers, kv_layout=_layout)

        slots, window = case["num_req_slots"], case["window"]
        draft = 0
        graph_rows = 0
        chunk = case["chunked_prefill_size"] or 0
        window_obj = rw["RequestWindow"](
            make_window_pool,
            num_slots=slots,
            layers=case["num_layers"],
            page_size=page,
            capacity=window + draft,
            workspace_rows=(slots + 1) * window + max(chunk, graph_rows, (slots + 1) * (1 + draft)),
        )

        def nbytes(pool: Any) -> int:
            return sum(b.numel() * b.element_size() for b in pool.kv_buffer)

        answers.append(
            {
                "configurator": configurator,
                "window": {
                    "capacity": window_obj.capacity,
                    "rows": window_obj.rows,
                    "state_bytes": nbytes(window_obj.state),
                    "tags_bytes": window_obj.tags.numel() * window_obj.tags.element_size(),
                    "workspace_size": window_obj.workspace.size,
                    "workspace_bytes": nbytes(window_obj.workspace),
                },
            }
        )
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
