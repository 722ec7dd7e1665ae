"""Runs llm-d-planner 0.3.3's vLLM capacity formulas on the runs ``benchmarks/whole_gpu_accuracy.py`` sends it.

Executed by the peer venv's python (``--peers-venv``): reads a JSON list of runs on stdin, writes
``{id: {kv_gib, tokens, concurrency} | {refused}}`` on stdout.  The planner's own functions are called
(``allocatable_kv_cache_memory``, ``total_kv_cache_blocks``, per rank as vLLM logs them); only its weights read,
which needs the Hugging Face hub, is replaced by the weights the log states.  The GPU is its catalogue's 80 GiB H100
(its report: "Planner uses 80 GiB (catalog)").
"""

import json
import sys
from types import SimpleNamespace
from typing import Any

from planner import capacity_planner as cp  # type: ignore[import-not-found]  # the peer venv's

GPU_MEMORY_GIB = 80


def namespace(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{key: namespace(item) for key, item in value.items()})
    return value


def main() -> None:
    answers: dict[str, dict[str, Any]] = {}
    for run in json.load(sys.stdin):
        config = namespace(run["config"])
        tp, pp = run["tp"], run["pp"]
        weights = float(run["weights_gib"])
        cp.model_memory_req = lambda name, cfg, token=None, _w=weights, _n=tp * pp: _w * _n
        name = getattr(config, "_hf_id", "model")
        try:
            context = run["max_model_len"] or cp.max_context_len(config)
            total = cp.allocatable_kv_cache_memory(
                name, config, GPU_MEMORY_GIB, run["gpu_util"], tp, pp, 1, max_model_len=context
            )
            blocks = cp.total_kv_cache_blocks(name, config, context, GPU_MEMORY_GIB, run["gpu_util"], 1, 16, tp, pp, 1)
        except Exception as error:  # the peer's own refusal
            answers[run["id"]] = {"refused": f"{type(error).__name__}: {error}"[:160]}
            continue
        # ``total_kv_cache_blocks`` divides the whole deployment's allocatable memory (every rank's) by one rank's
        # bytes per block (``per_token_memory_bytes / (tp * pp)``): the blocks of all tp x pp ranks.  Every rank holds
        # the same token slots (its share of the heads or layers), so the tokens a vLLM rank logs are those over
        # tp x pp, as the GiB are.
        tokens = blocks // (tp * pp) * 16
        answers[run["id"]] = {"kv_gib": total / (tp * pp), "tokens": tokens, "concurrency": tokens / context}
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
