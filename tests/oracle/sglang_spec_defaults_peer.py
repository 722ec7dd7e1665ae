"""Run SGLang 0.5.23's own speculative-decoding resolution on CPU (the peers venv): DeepSeek-V4's
``apply_deepseek_v4_defaults`` (``arg_groups/deepseek_v4_hook.py``) and the speculative hook's ``_handle_eagle_family``,
``_handle_ngram`` and ``_handle_dflash`` (``arg_groups/speculative_hook.py``).

Usage: ``python sglang_spec_defaults_peer.py BENCH_DIR`` with a JSON list of cases on stdin, each
``{"hook": "dsv4" | "eagle" | "ngram" | "dflash", "architecture": ..., "server_args": {...}}``; prints one JSON
list: per case ``{"declared": {field: value}}`` (the memory-relevant fields, :data:`FIELDS`, as resolved) or
``{"error": message}`` (what SGLang raises or asserts).

The hook functions are compiled from the installed files as they are (``functions_from_installed_module``); only
the runtime they call (the resolution record, the platform, the environment, the draft config reader) is answered
here: the record is the server-args namespace itself (``declare_resolution`` sets the field, the views read it).
This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from typing import Any, Optional

FIELDS = ("max_running_requests", "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
ARG_DEFAULTS: dict[str, Any] = {
    # SGLang 0.5.23's defaults for the server args these hooks read (arg_groups/fields/*.py)
    "device": "cuda",
    "max_running_requests": None,
    "speculative_algorithm": None,
    "speculative_num_steps": None,
    "speculative_eagle_topk": None,
    "speculative_num_draft_tokens": None,
    "speculative_draft_model_path": None,
    "speculative_draft_model_revision": None,
    "speculative_adaptive": False,
    "speculative_token_map": None,
    "speculative_use_rejection_sampling": False,
    "speculative_accept_threshold_single": 1.0,
    "speculative_accept_threshold_acc": 1.0,
    "speculative_ngram_max_bfs_breadth": 10,
    "speculative_ngram_external_corpus_path": None,
    "speculative_dflash_block_size": None,
    "speculative_draft_window_size": None,
    "enable_deterministic_inference": False,
    "enable_mixed_chunk": False,
    "enable_multi_layer_eagle": False,
    "disable_overlap_schedule": False,
    "dsv4_attn_backend": "flashmla",  # not "auto": its resolution reads the GPU generation
    "json_model_override_args": "{}",
    "trust_remote_code": False,
    "model_path": "model",
    "revision": None,
    "page_size": 1,
    "attention_backend": "fa3",
    "prefill_attention_backend": None,
    "decode_attention_backend": None,
    "pp_size": 1,
}


class _Variable:
    def __init__(self, value: Any = False) -> None:
        self.value = value

    def get(self) -> Any:
        return self.value

    def is_set(self) -> bool:
        return False

    def set(self, value: Any) -> None:
        pass


class _Environment:
    """``sglang.srt.environ.envs`` with nothing set (``SGLANG_SIMULATE_ACC_LEN`` at its -1)."""

    def __getattr__(self, name: str) -> _Variable:
        return _Variable(-1.0 if name == "SGLANG_SIMULATE_ACC_LEN" else False)


class _Platform:
    is_hip = False

    def is_out_of_tree(self) -> bool:
        return False


class _Algorithm:
    def __init__(self, name: str) -> None:
        self.name = name

    def supports_mixed_chunk(self) -> bool:
        return False


def _declare(server_args: Any, _source: str, **fields: Any) -> None:
    for name, value in fields.items():
        setattr(server_args, name, value)


def _no_dflash_config(*_args: Any, **_kwargs: Any) -> Any:
    raise OSError("no draft checkpoint on the CPU peer")


def _namespace(architecture: str) -> dict[str, Any]:
    config = types.SimpleNamespace(hf_config=types.SimpleNamespace(architectures=[architecture]))
    return {
        "Optional": Optional,
        "ServerArgs": object,
        "json": json,
        "logger": logging.getLogger("peer"),
        "envs": _Environment(),
        "current_platform": _Platform(),
        "get_platform": _Platform,
        "declare_resolution": _declare,
        "resolving_view": lambda args: args,
        "resolved_view": lambda args: args,
        "model_config_of": lambda _args: config,
        "attn_dp_enabled_of": lambda _args: False,
        "attention_backends_of": lambda args: (args.attention_backend, args.attention_backend),
        "run_post_process_pass": lambda *_args: None,
        "_deepseek_v4_kv_cache_dtype": None,
        "_handle_iquest_q1_mtp_draft": lambda _args: False,
        "_resolve_dflash_draft_attention_backend": lambda _args: None,
    }


def _compile(bench: str, architecture: str) -> dict[str, Any]:
    sys.path.insert(0, bench)
    import peer_imports as peers  # type: ignore[import-not-found]  # the shared bench folder's import machinery

    peers.install()
    for package in ("sglang", "sglang.srt", "sglang.srt.arg_groups", "sglang.srt.speculative"):
        peers._BARE.add(package)
    peers._STUB.add(
        "sglang.srt.speculative.spec_info", SpeculativeAlgorithm=types.SimpleNamespace(from_string=_Algorithm)
    )
    peers._STUB.add("sglang.srt.speculative.dflash_utils", parse_dflash_draft_config=_no_dflash_config)
    peers._STUB.add("sglang.srt.utils")
    peers._STUB.add("sglang.srt.utils.hf_transformers_utils", get_config=_no_dflash_config)
    namespace = _namespace(architecture)
    functions = peers.functions_from_installed_module(
        "sglang.srt.arg_groups.speculative_hook",
        [
            "_handle_eagle_family",
            "_handle_ngram",
            "_handle_dflash",
            "_auto_choose_speculative_params",
            "_check_oot_speculative_algorithm",
            "_disable_overlap_schedule_for_cpu",
            "_should_auto_enable_hip_rejection_sampling",
        ],
        namespace,
    )
    namespace.update(functions)
    for function in functions.values():
        function.__globals__.update(functions)
    dsv4 = peers.functions_from_installed_module(
        "sglang.srt.arg_groups.deepseek_v4_hook", ["apply_deepseek_v4_defaults"], namespace
    )
    return {
        "dsv4": lambda args: dsv4["apply_deepseek_v4_defaults"](args, architecture),
        "eagle": functions["_handle_eagle_family"],
        "ngram": functions["_handle_ngram"],
        "dflash": functions["_handle_dflash"],
    }


def main() -> None:
    results = []
    for case in json.load(sys.stdin):
        hooks = _compile(sys.argv[1], case["architecture"])
        args = types.SimpleNamespace(**{**ARG_DEFAULTS, **case.get("server_args", {})})
        try:
            hooks[case["hook"]](args)
        except (AssertionError, ValueError, NotImplementedError, TypeError) as exc:  # TypeError: SGLang crashes
            results.append({"error": str(exc)})
            continue
        results.append({"declared": {name: getattr(args, name) for name in FIELDS}})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
