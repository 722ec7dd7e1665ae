"""vLLM's CUDA-graph memory estimate, per model, from llm-d-planner's vLLM 0.19.0 H100 sweep logs (issue 34).

vLLM 0.19 runs ``profile_cudagraph_memory`` with DEBUG logging on and prints, per worker and per capture mode,
``Estimated <mode> CUDA graph memory: <first> MiB first-capture + (<n>-1) x <per-graph> MiB per-graph`` and the
total; it does not subtract the estimate (``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` off), vLLM 0.33 does.  This
script reads the 74 log files of llm-d-planner's sweep at commit :data:`COMMIT` from a local mirror of the
repository (``--mirror``, a bare git directory) and writes :data:`DATA` (``benchmarks/data/cudagraph_estimates.json``):
one record per log that states an estimate, with the source URL of the file at that commit, the model, TP / PP,
dtype, KV-cache dtype, quantization, attention backend, ``max_num_seqs`` / ``max_num_batched_tokens``, and each
worker's per-mode first-capture and per-graph MiB, graph count and largest capture size.  Where kvpools has a config
for the model (a preset, or ``benchmarks/data/configs/``) the record names it and the ``split`` that
:func:`split_of` gives it.  Without the mirror it only re-reads the data file.

    python -m benchmarks.cudagraph_logs --mirror /work/.mirror/llm-d-incubation+llm-d-planner/repo   # rewrite
    python -m benchmarks.cudagraph_logs                                                             # report

The report compares ``runtime_memory.cudagraph_memory`` (vLLM 0.33's profile) with each logged total.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvpools_core.engines.vllm.runtime_memory import GraphShape, cudagraph_memory, graph_shape_of, load_profile

DATA = Path(__file__).parent / "data" / "cudagraph_estimates.json"
REPO = "llm-d-incubation/llm-d-planner"
COMMIT = "d3121e059da88662db39a926a3ead964be97359b"
LOGS = "accuracy/results/v0.19.0/logs"
URL = f"https://github.com/{REPO}/blob/{COMMIT}/{LOGS}/{{file}}"
MiB = 1 << 20

PRESETS: dict[str, str] = {
    "deepseek-ai/DeepSeek-V2-Lite-Chat": "deepseek-v2-lite",
    "RedHatAI/Llama-3.3-70B-Instruct-fp8-dynamic": "llama-3.1-70b",
    "redhatai/Llama-3.3-70B-Instruct-quantized.w8a8": "llama-3.1-70b",
    "RedHatAI/Qwen2.5-7B-Instruct-fp8-dynamic": "qwen2.5-7b-instruct",
    "RedHatAI/Qwen2.5-7B-Instruct-quantized.w8a8": "qwen2.5-7b-instruct",
    "Qwen/Qwen2.5-7B-Instruct": "qwen2.5-7b-instruct",
    "google/gemma-2-9b-it": "gemma-2-9b",
    "google/gemma-3-12b-it": "gemma-3-12b-it",
    "google/gemma-3-27b-it": "gemma-3-27b-it",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w4a16": "llama-3.1-8b",
    "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8": "llama-3.1-8b",
    "microsoft/phi-2": "phi-2",
    "openai/gpt-oss-20b": "gpt-oss-20b",
    "Qwen/Qwen3-30B-A3B": "qwen3-30b-a3b",
    "Qwen/Qwen3-8B": "qwen3-8b",
}
"""The logged models whose shape kvpools has a config for (its presets; Llama-3.3-70B has Llama-3.1-70B's shape,
a quantized checkpoint its base model's): the records :func:`split_of` calibrates on or holds out."""

EXTRA_CONFIGS: dict[str, str] = {
    "ibm-granite/granite-3.3-8b-instruct": "tests/weights/configs/ibm-granite--granite-3.3-8b.json",
    "microsoft/phi-4": "tests/weights/configs/microsoft--phi-4.json",
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": (
        "tests/weights/configs/mistralai--Mistral-Small-3.1-24B-Instruct-2503.json"
    ),
    "RedHatAI/Mistral-Small-3.1-24B-Instruct-2503-quantized.w8a8": (
        "tests/weights/configs/mistralai--Mistral-Small-3.1-24B-Instruct-2503.json"
    ),
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "tests/weights/configs/mistralai--Mixtral-8x7B-v0.1.json",
    "Qwen/Qwen1.5-MoE-A2.7B": "tests/weights/configs/Qwen--Qwen1.5-MoE-A2.7B.json",
}
"""Logged models without a preset whose ``config.json`` the weights tests carry: found after the split was drawn,
so they are held out (``held_out_extra``) and never calibrated on."""

SPLIT_RULE = (
    "decided before fitting: the kvpools presets of the logged models, sorted by name, alternate between "
    "calibration (1st, 3rd, ...) and held-out (2nd, 4th, ...); every log of one model is on the same side, so the "
    "held-out models are models the fit never saw"
)

_ESTIMATE = re.compile(
    r"Estimated (PIECEWISE|FULL) CUDA graph memory: ([\d.]+) MiB first-capture "
    r"\+ \((\d+)-1\) \S+ ([\d.]+) MiB per-graph"
)
_PROFILING = re.compile(r"Profiling CUDA graph memory: (.*)")
_MODE = re.compile(r"(PIECEWISE|FULL)=(\d+) \(largest=(\d+)\)")
_TOTAL = re.compile(r"Estimated CUDA graph memory: ([\d.]+) GiB total")
_WORKER = re.compile(r"^\((\w+) pid=\d+\)")


def split_of(preset: str | None, presets: list[str]) -> str | None:
    """:data:`SPLIT_RULE`: ``calibration`` or ``held_out`` by the preset's place among the sorted presets."""
    if preset is None:
        return None
    return "calibration" if sorted(set(presets)).index(preset) % 2 == 0 else "held_out"


def _first(pattern: str, text: str, default: Any = None) -> Any:
    match = re.search(pattern, text)
    return match.group(1) if match else default


def parse_log(name: str, text: str) -> dict[str, Any] | None:
    """The record of one log, or None when it states no estimate."""
    workers: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        worker_match = _WORKER.match(line)
        worker = worker_match.group(1) if worker_match else "?"
        if found := _PROFILING.search(line):
            entry = workers.setdefault(worker, {"modes": {}})
            for mode, graphs, largest in _MODE.findall(found.group(1)):
                entry["modes"].setdefault(mode, {})
                entry["modes"][mode].update(graphs=int(graphs), largest=int(largest))
        elif found := _ESTIMATE.search(line):
            mode, first, graphs, per_graph = found.groups()
            entry = workers.setdefault(worker, {"modes": {}})
            entry["modes"].setdefault(mode, {})
            entry["modes"][mode].update(
                first_capture_mib=float(first), per_graph_mib=float(per_graph), graphs=int(graphs)
            )
        elif found := _TOTAL.search(line):
            workers.setdefault(worker, {"modes": {}})["total_gib"] = float(found.group(1))
    workers = {key: value for key, value in workers.items() if value.get("total_gib") is not None}
    if not workers:
        return None
    engine = _first(r"Initializing a V1 LLM engine \(v([\d.]+)\) with config: (.*)", text)
    config_line = next(line for line in text.splitlines() if "Initializing a V1 LLM engine" in line)
    seqs = _first(r"Defaulting max_num_seqs to (\d+)", text) or _first(r"'max_num_seqs': (\d+)", text)
    batched = _first(r"Defaulting max_num_batched_tokens to (\d+)", text) or _first(
        r"'max_num_batched_tokens': (\d+)", text
    )
    return {
        "file": name,
        "url": URL.format(file=name),
        "failed_run": name.endswith(".FAILED.log"),
        "engine_version": engine,
        "model": _first(r"model='([^']*)'", config_line),
        "tp": int(_first(r"tensor_parallel_size=(\d+)", config_line)),
        "pp": int(_first(r"pipeline_parallel_size=(\d+)", config_line)),
        "dtype": _first(r"dtype=torch\.(\w+)", config_line),
        "kv_cache_dtype": _first(r"kv_cache_dtype=(\w+)", config_line),
        "quantization": _first(r"quantization=([\w-]+)", config_line),
        "max_model_len": int(_first(r"max_seq_len=(\d+)", config_line)),
        "max_num_seqs": int(seqs) if seqs else None,
        "max_num_batched_tokens": int(batched) if batched else None,
        "attention_backend": _first(r"Using (\w+) attention backend", text),
        "workers": dict(sorted(workers.items())),
    }


def read_mirror(mirror: Path) -> list[dict[str, Any]]:
    def git(*args: str) -> str:
        return subprocess.run(["git", f"--git-dir={mirror}", *args], check=True, capture_output=True, text=True).stdout

    records = []
    for path in git("ls-tree", "--name-only", COMMIT, f"{LOGS}/").split():
        record = parse_log(path.rsplit("/", 1)[-1], git("show", f"{COMMIT}:{path}"))
        if record is not None:
            records.append(record)
    presets = [PRESETS[record["model"]] for record in records if record["model"] in PRESETS]
    for record in records:
        record["kvpools_model"] = PRESETS.get(record["model"])
        record["split"] = split_of(record["kvpools_model"], presets)
        if record["kvpools_model"] is None and record["model"] in EXTRA_CONFIGS:
            record["kvpools_model"], record["split"] = EXTRA_CONFIGS[record["model"]], "held_out_extra"
    return records


def write(records: list[dict[str, Any]], path: Path = DATA) -> None:
    data = {
        "source": f"https://github.com/{REPO}/tree/{COMMIT}/{LOGS}",
        "about": (
            "vLLM 0.19.0's profile_cudagraph_memory DEBUG lines (H100 80GB, llm-d-planner's accuracy sweep), per "
            "worker and mode: first_capture_mib and per_graph_mib as logged (the free-memory drop of capturing the "
            "largest and the second-largest size, per_graph at least 1 MiB), graphs, largest capture size; "
            "total_gib = max over modes(first) + sum over modes((graphs - 1) x per_graph), logged to 0.01 GiB. "
            "Written by benchmarks/cudagraph_logs.py."
        ),
        "split_rule": SPLIT_RULE,
        "records": records,
    }
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def load(path: Path = DATA) -> dict[str, Any]:
    return dict(json.loads(path.read_text(encoding="utf-8")))


def worst_worker(record: dict[str, Any]) -> dict[str, Any]:
    """The worker with the largest logged total (vLLM sizes every rank alike; the largest estimate binds)."""
    return max(record["workers"].values(), key=lambda worker: worker["total_gib"])


def logged_mib(worker: dict[str, Any]) -> float:
    """The worker's estimate from its per-mode MiB lines (the total line is rounded to 0.01 GiB):
    ``max(first captures) + sum((graphs - 1) x per_graph)``."""
    modes = worker["modes"].values()
    first = max(float(mode["first_capture_mib"]) for mode in modes)
    graphs: float = sum((int(mode["graphs"]) - 1) * float(mode["per_graph_mib"]) for mode in modes)
    return first + graphs


def graph_of(record: dict[str, Any]) -> GraphShape | None:
    if record.get("kvpools_model") is None:
        return None
    model = record["kvpools_model"]
    if model.endswith(".json"):
        model = str(Path(__file__).resolve().parents[1] / model)
    return graph_shape_of(model, dtype_bytes=4 if record["dtype"] == "float32" else 2)


def fit(records: list[dict[str, Any]]) -> dict[str, float]:
    """The four constants of ``cudagraph_memory`` from the calibration records (the worker with the largest total
    of each): ordinary least squares of the PIECEWISE first capture (MiB) on the MLP output
    ``x = S_P x 2 x mlp_width / tp x dtype`` (MiB; records whose config gives no MLP width are left out), and
    zero-intercept least squares of each mode's per-graph MiB on the stage's layers ``ceil(layers / pp)``."""
    xs, firsts, layers, piecewise, full = [], [], [], [], []
    for record in records:
        graph = graph_of(record)
        if record.get("split") != "calibration" or graph is None:
            continue
        modes = worst_worker(record)["modes"]
        stage = -(-graph.layers // record["pp"])
        layers.append(stage)
        piecewise.append(modes["PIECEWISE"]["per_graph_mib"])
        full.append(modes["FULL"]["per_graph_mib"] if "FULL" in modes else 0.0)
        if graph.mlp_width:
            size = modes["PIECEWISE"]["largest"]
            xs.append(size * 2 * (graph.mlp_width // record["tp"]) * graph.dtype_bytes / MiB)
            firsts.append(modes["PIECEWISE"]["first_capture_mib"])
    n, mean_x, mean_y = len(xs), sum(xs) / len(xs), sum(firsts) / len(firsts)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, firsts, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    squares = sum(stage * stage for stage in layers)
    return {
        "records": float(len(layers)),
        "records_with_mlp_width": float(n),
        "cudagraph_piecewise_first_mib": mean_y - slope * mean_x,
        "cudagraph_piecewise_first_per_mlp_output": slope,
        "cudagraph_piecewise_per_graph_mib_per_layer": sum(
            stage * y for stage, y in zip(layers, piecewise, strict=True)
        )
        / squares,
        "cudagraph_full_per_graph_mib_per_layer": sum(stage * y for stage, y in zip(layers, full, strict=True))
        / squares,
    }


def predictions(data: dict[str, Any], profile_version: str = "0.33") -> list[dict[str, Any]]:
    """``runtime_memory.cudagraph_memory`` of vLLM ``profile_version``'s profile for each record kvpools has a
    config for, against the logged MiB of its largest worker, and the former two-constant profile's figure (first
    capture 0.0433 GiB + 0.0211 GiB a graph) on the same record."""
    profile = load_profile(profile_version)
    rows = []
    for record in data["records"]:
        graph = graph_of(record)
        if graph is None:
            continue
        worker = worst_worker(record)
        term = cudagraph_memory(
            profile=profile,
            max_num_seqs=record["max_num_seqs"],
            max_num_batched_tokens=record["max_num_batched_tokens"],
            graph=graph,
            tp_size=record["tp"],
            pp_size=record["pp"],
        )
        graphs = sum(mode["graphs"] - 1 for mode in worker["modes"].values())
        former = (round(0.0433 * (1 << 30)) + graphs * round(0.0211 * (1 << 30))) / MiB
        logged = logged_mib(worker)
        rows.append(
            {
                "file": record["file"],
                "split": record["split"],
                "logged_mib": logged,
                "predicted_mib": term.bytes / MiB,
                "former_mib": former,
            }
        )
    return rows


def summary(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Mean, mean absolute and worst error of ``key`` against the logged MiB, in MiB and in % of the logged."""
    errors = [row[key] - row["logged_mib"] for row in rows]
    percents = [100 * error / row["logged_mib"] for error, row in zip(errors, rows, strict=True)]
    return {
        "n": float(len(rows)),
        "mean_mib": sum(errors) / len(errors),
        "mean_abs_mib": sum(abs(error) for error in errors) / len(errors),
        "worst_mib": max(errors, key=abs),
        "mean_abs_pct": sum(abs(percent) for percent in percents) / len(percents),
        "worst_pct": max(percents, key=abs),
    }


def report(data: dict[str, Any]) -> str:
    rows = predictions(data)
    lines = [f"split rule: {data['split_rule']}", "", "fit (calibration records):"]
    lines += [f"  {name} = {value:.4g}" for name, value in fit(data["records"]).items()]
    lines += ["", f"{'log':62} {'split':14} {'logged':>7} {'kvpools':>8} {'former':>7}  (MiB)"]
    lines += [
        f"{row['file'][:62]:62} {row['split']:14} {row['logged_mib']:7.0f} {row['predicted_mib']:8.0f} "
        f"{row['former_mib']:7.0f}"
        for row in rows
    ]
    lines.append("")
    for split in ("calibration", "held_out", "held_out_extra"):
        chosen = [row for row in rows if row["split"] == split]
        for key, name in (("predicted_mib", "per-model formula"), ("former_mib", "former two constants")):
            s = summary(chosen, key)
            lines.append(
                f"{split:14} {name:21} n={s['n']:.0f}: mean {s['mean_mib']:+.0f} MiB, mean abs {s['mean_abs_mib']:.0f} "
                f"MiB ({s['mean_abs_pct']:.1f} %), worst {s['worst_mib']:+.0f} MiB ({s['worst_pct']:+.1f} %)"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, help="a bare git directory of llm-d-planner holding the commit")
    args = parser.parse_args(argv)
    if args.mirror is not None:
        records = read_mirror(args.mirror)
        write(records)
        print(f"wrote {len(records)} records to {DATA}")
    print(report(load()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
