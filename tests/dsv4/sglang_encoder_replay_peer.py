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
import __future__

import ast
import dataclasses
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any, Optional

import torch


def _root() -> Path:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations, "sglang is not installed"
    return Path(next(iter(spec.submodule_search_locations)))


def _load_kv_layout(root: Path) -> types.ModuleType:
    name = "sglang.kernels.ops.attention.dsv4.kv_layout"
    spec = importlib.util.spec_from_file_location(name, root / "kernels/ops/attention/dsv4/kv_layout.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _extract(path: Path, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """Exec the top-level functions, classes and assignments ``names`` of ``path`` in ``namespace``."""
    tree = ast.parse(path.read_text())
    nodes = []
    for node in tree.body:
        named = isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names
        assigned = isinstance(node, ast.Assign) and any(getattr(t, "id", None) in names for t in node.targets)
        if named or assigned:
            nodes.append(node)
    found = {getattr(n, "name", None) for n in nodes} | {
        t.id for n in nodes if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    }
    missing = names - found
    assert not missing, f"{path.name} has no {sorted(missing)}"
    code = compile(
        ast.Module(body=nodes, type_ignores=[]), str(path), "exec", flags=__future__.annotations.compiler_flag
    )
    exec(code, namespace)  # SGLang's own source, as installed
    return namespace


class _Env:
    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value


class _Spec:
    """``SpeculativeAlgorithm.NONE``: no draft (speculative decoding is refused on V4.1 but for DSpark)."""

    def is_dspark(self) -> bool:
        return False

    def is_eagle(self) -> bool:
        return False

    def is_none(self) -> bool:
        return True


def _fake_module(name: str, **attrs: Any) -> None:
    parts = name.split(".")
    for i in range(1, len(parts)):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


def main() -> None:
    root = _root()
    kv = _load_kv_layout(root)
    layouts = {layout.value: layout for layout in kv.KVLayout}
    envs = NS(
        SGLANG_OPT_USE_ONLINE_COMPRESS=_Env(False),
        SGLANG_EXPERIMENTAL_ONLINE_C128_MTP=_Env(False),
        SGLANG_DSV4_COMPRESS_STATE_DTYPE=_Env("float32"),
        SGLANG_DSV4_KV_LAYOUT=_Env("auto"),
        SGLANG_DSV4_COMPRESSED_KV_LAYOUT=_Env("auto"),
    )
    state: dict[str, Any] = {}
    common: dict[str, Any] = {
        "torch": torch,
        "Optional": Optional,
        "dataclass": dataclasses.dataclass,
        "logger": logging.getLogger("sglang_encoder_replay_peer"),
        "envs": envs,
        "KVLayout": kv.KVLayout,
        "_is_hip": False,
        "_is_npu": False,
        "get_exec": lambda: state["exec"],
        "get_schedule": lambda: state["schedule"],
        "get_spec": lambda: state["spec"],
        "get_memory": lambda: state["memory"],
        "get_disagg": lambda: state["disagg"],
        "max_speculative_num_draft_tokens": lambda: None,
    }
    utils = _extract(root / "srt/utils/common.py", {"ceil_align", "ceil_div"}, dict(common))
    common.update(ceil_align=utils["ceil_align"], ceil_div=utils["ceil_div"])
    pool_names = {
        "ONLINE_C128",
        "get_dsv4_indexer_bytes_per_token",
        "get_compress_state_ring_size",
        "resolve_compress_state_ring_size",
        "collect_sources_by_ratio",
        "get_compress_state_write_pad",
        "uses_draft_swa_ring",
        "get_draft_swa_ring_size",
        "get_swa_ring_size",
        "_num_dsv4_physical_kv_pages",
        "resolve_compressed_kv_layout",
    }
    mp = _extract(root / "srt/mem_cache/deepseek_v4_memory_pool.py", pool_names, dict(common))
    common.update({name: mp[name] for name in pool_names})

    def select_dsv4_kv_layout() -> tuple[Any, None]:
        return state["layout"], None

    _fake_module(
        "sglang.srt.mem_cache.deepseek_v4_memory_pool",
        select_dsv4_kv_layout=select_dsv4_kv_layout,
        resolve_compressed_kv_layout=mp["resolve_compressed_kv_layout"],
        dsv4_unified_row_bytes=lambda nope, rope, fp8: 0,
    )
    _fake_module(
        "sglang.srt.layers.attention.dsv4.unified_kv_gate",
        is_unified_kv_fp8=lambda: False,
        is_unified_kv_triton=lambda: False,
    )
    pc_names = {
        "MemoryPoolConfigurator",
        "_get_dsv4_compress_state_dtype_sizes",
        "check_dsv4_unified_fp8_pd_supported",
        "DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO",
        "_operator_swa_full_tokens_ratio",
        "_DSV4PoolSizes",
        "DSV4PoolConfigurator",
    }
    pc = _extract(root / "srt/model_executor/pool_configurator.py", pc_names, dict(common))
    rw = _extract(root / "srt/mem_cache/dsv41_request_window.py", {"_capturing", "RequestWindow"}, dict(common))

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
        ratios = case["compress_ratios"]
        kvc = NS(
            kv_cache_dtype_str="auto",
            model_config=NS(
                qk_nope_head_dim=case["qk_nope_head_dim"],
                qk_rope_head_dim=case["qk_rope_head_dim"],
                index_head_dim=case["index_head_dim"],
                context_len=case["context_len"],
                compress_ratios=ratios,
                window_size=case["window"],
                hf_config=NS(kv_source_layer_ids=case["kv_source_layer_ids"]),
            ),
            layer_info=NS(start_layer=0, end_layer=case["num_layers"]),
            pp_size=1,
            spec_algorithm=_Spec(),
            spec_aux_config=NS(dspark_num_stages=None, dflash_draft_num_layers=None),
            sliding_window_size=case["window"],
            page_size=page,
            attn_dp_size=case["attn_dp_size"],
        )
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
