"""Run in the peers venv: SGLang 0.5.23's own Inkling config class and pool configurator, on CPU.

* ``configs/inkling.py`` is imported for real (``transformers``' ``PretrainedConfig`` / ``CONFIG_MAPPING`` and
  the runtime context are stand-ins: attention TP from the case, scattered sconv off), so
  ``InklingModelConfig(**config).mamba2_cache_params`` gives the short-conv state shape, layers and
  ``mamba_cache_per_req``;
* ``get_hybrid_layer_ids`` is compiled from the installed ``configs/model_config.py`` (its module imports far
  too much), and gives the full / SWA layer split;
* ``HybridSWAPoolConfigurator`` (and ``MemoryPoolConfig``) are compiled from the installed
  ``model_executor/pool_configurator.py`` and run on a stand-in ``ModelRunner`` whose model config answers as
  SGLang's ``ModelConfig`` does for Inkling (``get_num_kv_heads``, ``get_swa_num_kv_heads``, the head dims).

argv: the shared ``bench`` folder, then a JSON list of ``{"config": {...}, "tp": t, "available": bytes,
"page": p, "ratio": r, "unified": bool, "draft": {"layers": n, "mtp_local_layer_ids": [...]}}`` (``unified``:
``--enable-unified-memory``, whose boot labels come from ``_max_unified_full_tokens``; ``draft``, optional: an
EAGLE target whose ``spec_aux_config.eagle_draft_num_layers`` is ``n`` and whose text config lists the banded MTP
depths, Inkling's MTP heads); prints one answer per case.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path
from typing import Any


def _compiled(path: Path, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    tree = ast.parse(path.read_text())
    picked = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    assert {n.name for n in picked} == names, f"SGLang's {path.name} changed: {names}"
    exec(compile(ast.Module(body=picked, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def main() -> None:
    bench, cases = sys.argv[1], json.loads(sys.argv[2])
    sys.path.insert(0, bench)
    import peer_imports as p
    import torch

    p.install()
    for package in ("sglang", "sglang.srt", "sglang.srt.configs"):
        p._BARE.add(package)

    class PretrainedConfig:
        def __init__(self, **kwargs: Any) -> None:
            for key, value in kwargs.items():
                setattr(self, key, value)

    registered: dict[str, Any] = {}
    mapping = types.SimpleNamespace(register=lambda name, cls: registered.setdefault(name, cls), _extra_content={})
    p._STUB.add("transformers", CONFIG_MAPPING=mapping)
    p._STUB.add("transformers.configuration_utils", PretrainedConfig=PretrainedConfig)
    tp_box = {"tp": 1}
    # mamba_utils' imports that only its other state classes use (the TP divide, the env registry)
    p._STUB.add("sglang.srt.distributed")
    p._STUB.add("sglang.srt.distributed.utils", divide=lambda a, b: a // b)
    p._STUB.add("sglang.srt.environ")
    p._STUB.add(
        "sglang.srt.runtime_context",
        get_parallel=lambda: types.SimpleNamespace(attn_tp_size=tp_box["tp"]),
        get_exec=lambda: types.SimpleNamespace(comm=types.SimpleNamespace(enable_scattered_sconv=False)),
    )
    inkling = importlib.import_module("sglang.srt.configs.inkling")
    root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0], "srt")
    hybrid = _compiled(
        root / "configs/model_config.py",
        {"get_hybrid_layer_ids"},
        {"List": list, "SWA_SINK_ARCHS": (), "MIMO_V2_MODEL_ARCHS": ()},
    )
    configurator = _compiled(
        root / "model_executor/pool_configurator.py",
        {"MemoryPoolConfig", "MemoryPoolConfigurator", "HybridSWAPoolConfigurator"},
        {
            "torch": torch,
            "logger": logging.getLogger("peer"),
            "get_parallel": lambda: types.SimpleNamespace(attn_tp_size=tp_box["tp"]),
            "get_schedule": lambda: types.SimpleNamespace(swa_full_tokens_ratio=tp_box["ratio"]),
            "get_memory": lambda: types.SimpleNamespace(enable_unified_memory=tp_box["unified"]),
            "ceil_align": lambda x, a: -(-x // a) * a,
            "AttentionArch": types.SimpleNamespace(MLA="mla"),
            "_dflash_draft_cell_size": lambda kvc: 0,  # no speculative draft
            "bisect_right": __import__("bisect").bisect_right,
            "dataclass": __import__("dataclasses").dataclass,
            "field": __import__("dataclasses").field,
            "Optional": Any,
            "ModelRunner": Any,
            "annotations": None,
        },
    )
    answers = []
    for case in cases:
        tp_box.update(tp=case["tp"], ratio=case["ratio"], unified=case.get("unified", False))
        config = inkling.InklingModelConfig(**case["config"])
        params = config.mamba2_cache_params
        swa_ids, full_ids = hybrid["get_hybrid_layer_ids"](["InklingForConditionalGeneration"], config)

        class ModelConfig:  # what SGLang's ModelConfig answers for Inkling (configs/model_config.py)
            attention_arch = "mha"
            head_dim, v_head_dim = config.head_dim, config.v_head_dim
            swa_head_dim, swa_v_head_dim = config.swa_head_dim, config.swa_v_head_dim
            full_attention_layer_ids, swa_attention_layer_ids = full_ids, swa_ids

            @staticmethod
            def get_num_kv_heads(tp: int, heads: int = config.num_key_value_heads) -> int:
                return max(1, heads // tp)

            @staticmethod
            def get_swa_num_kv_heads(tp: int, heads: int = config.swa_num_key_value_heads) -> int:
                return max(1, heads // tp)

        draft = case.get("draft")
        ModelConfig.hf_text_config = types.SimpleNamespace(
            mtp_local_layer_ids=None if draft is None else draft["mtp_local_layer_ids"]
        )
        runner = types.SimpleNamespace(  # the KVCacheConfigurator fields HybridSWAPoolConfigurator reads
            kv_cache_dtype_str="auto",
            model_config=ModelConfig,
            kv_cache_dtype=torch.bfloat16,
            layer_info=types.SimpleNamespace(full_attention_layer_ids=full_ids, swa_attention_layer_ids=swa_ids),
            sliding_window_size=config.sliding_window_size,
            page_size=case["page"],
            spec_algorithm=types.SimpleNamespace(
                is_eagle=lambda eagle=draft is not None: eagle, is_standalone=lambda: False
            ),
            spec_aux_config=types.SimpleNamespace(
                eagle_draft_num_layers=None if draft is None else draft["layers"], eagle_draft_swa_num_layers=None
            ),
            is_draft_worker=False,
            fused_entry_bytes=lambda name: None,
        )
        pool_configurator = configurator["HybridSWAPoolConfigurator"](runner)
        try:
            sizes = pool_configurator.calculate_pool_sizes(case["available"], case["page"])
            full_tokens, swa_tokens, error = sizes.full_max_total_num_tokens, sizes.swa_max_total_num_tokens, None
        except ValueError as exc:  # validate_swa_pool_size
            full_tokens = swa_tokens = None
            error = str(exc)
        answers.append(
            {
                "conv": [list(s) for s in params.shape.conv],
                "temporal": list(params.shape.temporal),
                "layers": list(params.layers),
                "mamba_cache_per_req": int(params.mamba_cache_per_req),
                "swa_ids": swa_ids,
                "full_ids": full_ids,
                "full_tokens": full_tokens,
                "swa_tokens": swa_tokens,
                "error": error,
                "cell_size": pool_configurator._cell_size,
                "draft_full_layers": pool_configurator._draft_full_layers_num,
                "draft_swa_full_layers": pool_configurator._draft_swa_full_layers_num,
            }
        )
    print(json.dumps(answers))


if __name__ == "__main__":
    main()
