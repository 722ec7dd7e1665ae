"""Runs aiconfigurator-core 0.12.0's KV-cache estimate on the runs ``benchmarks/whole_gpu_accuracy.py`` sends it.

Executed by the peer venv's python (``--peers-venv``): reads a JSON list of runs on stdin, writes
``{id: {kv_gib, tokens, concurrency, version} | {refused}}`` on stdout.  The peer's own function is called,
``aiconfigurator_core.sdk.memory.estimate_kv_cache`` (``memory_fraction_kind="of_total"``, the vLLM / SGLang
budget: its own weights, activation and runtime-overhead model on its system's capacity, 80 GiB for ``h100_sxm``),
on the record's ``config.json`` written to a temporary directory, with the newest engine version its bundled
performance database holds for that system (it has no data for the version the log ran; the answer names the one
used).  A run it cannot model is refused with its own error.
"""

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from aiconfigurator_core.sdk.memory import estimate_kv_cache  # type: ignore[import-not-found]  # the peer venv's

SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "a100-80gb": "a100_sxm", "b200": "b200_sxm", "l40s": "l40s"}
"""kvpools' catalogue names -> aiconfigurator's system names (``aiconfigurator_core/systems/*.yaml``)."""

VERSIONS = {"vllm": "0.24.0", "sglang": "0.5.14"}
"""The engine versions aiconfigurator-core 0.12.0's database holds for ``h100_sxm`` (``systems/data/h100_sxm/gemm``);
without one it answers "No database version available"."""

KV_QUANT = {"auto": None, "fp8": "fp8", "fp8_e4m3": "fp8"}

QUANT: dict[tuple[str | None, str | None], tuple[str | None]] = {
    (None, None): (None,),
    ("fp8", None): ("fp8",),  # vLLM's runtime --quantization fp8: per-tensor dynamic fp8 GEMMs
    (None, "fp8"): ("fp8_block",),  # an FP8 checkpoint (Qwen3-*-FP8: 128 x 128 block scales)
}
"""(runtime ``--quantization``, the checkpoint's own quantisation) -> aiconfigurator's gemm / MoE quant mode."""


def answer(run: dict[str, Any]) -> dict[str, Any]:
    system = SYSTEMS.get(str(run["gpu"]))
    if system is None:
        return {"refused": f"aiconfigurator has no system for GPU {run['gpu']!r}"}
    if run.get("dtype", "auto") not in ("auto", "bfloat16"):
        return {"refused": f"no --dtype {run['dtype']} in aiconfigurator's quant modes (checkpoint dtype or fp8 only)"}
    quant = QUANT.get((run.get("quantization"), run.get("checkpoint_quantization")))
    if quant is None:
        method = run.get("quantization") or run.get("checkpoint_quantization")
        return {"refused": f"no aiconfigurator quant mode for {method}"}
    if run["kv_cache_dtype"] not in KV_QUANT:
        return {"refused": f"KV dtype {run['kv_cache_dtype']!r} not mapped to aiconfigurator's kvcache_quant_mode"}
    backend = run["backend"]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(run["config"]), encoding="utf-8")
        try:
            result = estimate_kv_cache(
                folder,
                system,
                backend,
                backend_version=VERSIONS[backend],
                max_num_tokens=run["max_num_tokens"],
                max_batch_size=run["max_batch_size"],
                memory_fraction_kind="of_total",
                memory_fraction_value=run["fraction"],
                tp_size=run["tp"],
                pp_size=run["pp"],
                moe_tp_size=run["tp"],
                moe_ep_size=1,
                gemm_quant_mode=quant[0],
                moe_quant_mode=quant[0],
                kvcache_quant_mode=KV_QUANT[run["kv_cache_dtype"]],
            )
        except Exception as error:  # the peer's own refusal
            return {"refused": f"{type(error).__name__}: {error}"[:160]}
    tokens = int(result["total_kv_size_tokens"])
    context = run["max_model_len"]
    return {
        "kv_gib": result["total_kv_size_bytes"] / (1 << 30),
        "tokens": tokens,
        "concurrency": tokens / context if context else None,
        "version": f"{backend} {VERSIONS[backend]}",
    }


def main() -> None:
    json.dump({run["id"]: answer(run) for run in json.load(sys.stdin)}, sys.stdout)


if __name__ == "__main__":
    main()
