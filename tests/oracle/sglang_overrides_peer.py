"""Run SGLang 0.5.23's own per-model override providers for DeepSeek DSA, DeepSeek-V4 and MiniMax-M3 (the peers
venv, CPU).

Usage: ``python sglang_overrides_peer.py BENCH_DIR`` with a JSON list of cases on stdin, each
``{"architecture": ..., "hf_config": {...}, "device": "cuda" | "npu", "server_args": {...}, "gpu": "sm90"}``
(``gpu``: the CUDA generation the platform reports, none by default; ``device`` ``"hip"`` is ROCm, where
``"preshuffle"`` says what ``aiter_can_use_preshuffle_paged_mqa()`` answers, true by default); prints one JSON list:
per case, the memory-relevant fields (:data:`FIELDS`) its providers declare (absent when they declare none).
With ``"resolve_backends": true`` the installed ``_dsa_split_backend_resolution`` (``arg_groups/overrides.py``,
compiled from the installed file with ``_check_dsa_backend_constraints``) then runs on the server args the
providers' declarations were applied to, and its DSA backends are added (SGLang resolves them after the model
overrides).

The installed ``sglang.srt.arg_groups.model_overrides.deepseek_v2`` / ``deepseek_v4`` / ``minimax_m3`` modules and
``model_override_base`` run as they are; only their imports of the runtime (platform, environment, flashinfer,
the config helpers) are answered by the shared ``bench/peer_imports.py`` machinery, the config helpers the
overrides call (``is_deepseek_dsa``, ``get_dsa_index_kpool``) compiled from the installed
``configs/model_config.py``.  This file runs in the peers venv, never under pytest.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Optional

FIELDS = ("page_size", "swa_full_tokens_ratio", "dsa_prefill_backend", "dsa_decode_backend", "kv_cache_dtype")
ARG_DEFAULTS: dict[str, Any] = {
    # the server args these providers read, at SGLang 0.5.23's defaults (None: unset)
    "page_size": None,
    "swa_full_tokens_ratio": None,
    "attention_backend": None,
    "prefill_attention_backend": None,
    "decode_attention_backend": None,
    "dcp_size": 1,
    "enable_prefill_cp": False,
    "enable_hisparse": False,
    "enable_hierarchical_cache": False,
    "disaggregation_mode": "null",
    "speculative_eagle_topk": None,
    "moe_runner_backend": "triton",  # not "auto": the MoE branch needs a ModelConfig the peer does not build
    "fp8_gemm_runner_backend": "auto",
    "moe_dense_tp_size": None,
    "kv_cache_dtype": "auto",
    "dsa_prefill_backend": None,
    "dsa_decode_backend": None,
    "dcp_comm_backend": None,
    "dcp_replicate_q_proj": None,
    "quantization": None,
    "_quantization_explicitly_unset": False,
    "speculative_algorithm": None,
    "pp_size": 1,
    "ep_size": 1,
    "moe_a2a_backend": "none",
}


PRESHUFFLE = {"value": True}
"""What the stubbed ``aiter_can_use_preshuffle_paged_mqa()`` answers (read on HIP only)."""


class _Platform:
    """``get_platform()`` for a device: CUDA (no HIP, no SM100), or an NPU."""

    def __init__(self, device: str, gpu: str | None = None) -> None:
        self.is_npu = device == "npu"
        self.is_cuda = device == "cuda"
        self.is_hip = device == "hip"
        self.is_sm90 = gpu == "sm90"
        self.is_sm100 = gpu == "sm100"
        self.is_blackwell = gpu == "sm100"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("is_") or name.startswith("has_"):
            return False
        raise AttributeError(name)


class _Variable:
    """An environment variable left unset: ``get()`` is false, ``is_set()`` too."""

    def get(self) -> bool:
        return False

    def is_set(self) -> bool:
        return False

    def set(self, value: Any) -> None:
        pass


class _Environment:
    """``sglang.srt.environ.envs`` with nothing set."""

    def __getattr__(self, name: str) -> _Variable:
        return _Variable()


def _import(bench: str) -> tuple[Any, Any, Any, Any]:
    sys.path.insert(0, bench)
    import peer_imports as peers  # type: ignore[import-not-found]  # the shared bench folder's import machinery

    peers.install()
    packages = (
        "sglang",
        "sglang.srt",
        "sglang.srt.configs",
        "sglang.srt.arg_groups",
        "sglang.srt.arg_groups.model_overrides",
    )
    for package in packages:
        peers._BARE.add(package)
    platform = {"value": _Platform("cuda")}
    peers._STUB.add("sglang.srt.platforms", current_platform=_Platform("cuda"))
    peers._STUB.add("sglang.srt.runtime_context", get_platform=lambda: platform["value"])
    peers._STUB.add("sglang.srt.utils", is_flashinfer_available=lambda: False)
    peers._STUB.add(
        "sglang.srt.utils.common",
        is_mps=lambda: False,
        is_no_spec_infer_or_topk_one=lambda _: True,
        get_quantization_config=lambda cfg: (getattr(cfg, "quantization_config", None) or {}).get("quant_method"),
    )
    peers._STUB.add("sglang.srt.environ", envs=_Environment())
    # imported by the DSA branch on every GPU, read on HIP only (the peer's platform is CUDA or an NPU)
    peers._STUB.add("sglang.srt.layers")
    peers._STUB.add(
        "sglang.srt.layers.attention.dsa.utils", aiter_can_use_preshuffle_paged_mqa=lambda: PRESHUFFLE["value"]
    )
    helpers = peers.functions_from_installed_module(
        "sglang.srt.configs.model_config",
        ["_hf_arch", "_hf_attr", "is_deepseek_dsa", "get_dsa_index_kpool"],
        {"PretrainedConfig": object, "Optional": Optional},
    )
    peers._STUB.add(
        "sglang.srt.configs.model_config",
        unwrap_modelopt_quantization_config=lambda cfg: cfg,
        **helpers,
    )
    import importlib

    v2 = importlib.import_module("sglang.srt.arg_groups.model_overrides.deepseek_v2")
    v4 = importlib.import_module("sglang.srt.arg_groups.model_overrides.deepseek_v4")
    m3 = importlib.import_module("sglang.srt.arg_groups.model_overrides.minimax_m3")
    return v2, v4, m3, platform


def _backend_resolution(peers: Any, platform: dict[str, Any], config_box: dict[str, Any]) -> Any:
    """The installed ``_dsa_split_backend_resolution``, its constraint check and its architecture set."""
    import ast
    import importlib.util
    import logging
    import os

    spec = importlib.util.find_spec("sglang.srt.arg_groups")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "overrides.py")
    with open(path) as fh:
        tree = ast.parse(fh.read(), path)
    (archs,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_DEEPSEEK_FAMILY_ARCHS" for t in node.targets)
    ]
    families = eval(compile(ast.Expression(archs), path, "eval"), {"frozenset": frozenset})  # a set literal
    # hisparse_hook imports these from overrides (whose module body needs the whole server-args stack)
    peers._STUB.add("sglang.srt.arg_groups.overrides", model_config_of=None, resolved_view=None, resolving_view=None)
    import torch

    torch.cuda.get_device_capability = lambda *_: (9, 0)  # a Hopper; read before the HIP branch, unused on HIP
    namespace: dict[str, Any] = {
        "Any": Any,
        "Dict": dict,
        "Optional": Optional,
        "logger": logging.getLogger("peer"),
        "get_platform": lambda: platform["value"],
        "model_config_of": lambda _view: types.SimpleNamespace(hf_config=config_box["value"]),
        "_DEEPSEEK_FAMILY_ARCHS": families,
        "register_post_process": lambda fn: fn,  # the pipeline's registry: the peer calls it directly
    }
    compiled = peers.functions_from_installed_module(
        "sglang.srt.arg_groups.overrides",
        ["_dsa_split_backend_resolution", "_check_dsa_backend_constraints"],
        namespace,
    )
    return compiled["_dsa_split_backend_resolution"]


def main() -> None:
    v2, v4, m3, platform = _import(sys.argv[1])
    import peer_imports as peers  # type: ignore[import-not-found]

    config_box: dict[str, Any] = {"value": None}
    resolve = None
    results = []
    for case in json.load(sys.stdin):
        platform["value"] = _Platform(case["device"], case.get("gpu"))
        PRESHUFFLE["value"] = case.get("preshuffle", True)
        args = types.SimpleNamespace(**{**ARG_DEFAULTS, "device": case["device"], **case.get("server_args", {})})
        config = types.SimpleNamespace(**case["hf_config"])
        provider = {
            "DeepseekV4ForCausalLM": v4._deepseek_v4_overrides,
            "MiniMaxM3SparseForCausalLM": m3._minimax_m3_overrides,
            "MiniMaxM3SparseForConditionalGeneration": m3._minimax_m3_overrides,
        }.get(case["architecture"], v2._deepseek_family_overrides)
        declared = provider(args, config)
        if case.get("resolve_backends"):
            resolve = resolve or _backend_resolution(peers, platform, config_box)
            config.architectures = case["hf_config"]["architectures"]
            config_box["value"] = config
            view = types.SimpleNamespace(**{**vars(args), **declared})
            declared = {**declared, **resolve(view)}
        results.append({name: declared[name] for name in FIELDS if name in declared})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
