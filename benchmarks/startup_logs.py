"""Public vLLM and SGLang start-up logs as data (``benchmarks/data/startup_logs.json``, issue 34).

Each record quotes an engine's memory lines verbatim with the URL they come from, the launch flags it states,
the GPU, the engine version where the log names it, and the numbers read off the lines (``logged``).  Two kinds of
evidence: ``log_lines`` (the lines are the log's) and ``report_table`` (rows of a published report that tabulates
the logs' numbers: llm-d-planner's vLLM 0.19.0 H100 sweep).  ``split`` marks what calibrated a runtime-memory
profile (``calibration``) and what only measures it (``held_out``); ``None`` is neither (another engine version).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

DATA = Path(__file__).parent / "data" / "startup_logs.json"
ENGINES = ("vllm", "sglang")
EVIDENCE = ("log_lines", "report_table")
SPLITS = (None, "calibration", "held_out")
FAMILIES = ("dense", "moe", "mla", "hybrid", "swa", "unknown")
LOGGED_NUMBERS = (
    "total_gib",
    "requested_gib",
    "weights_gib",
    "activation_gib",
    "non_torch_gib",
    "available_kv_gib",
    "kv_tokens",
    "num_gpu_blocks",
    "max_concurrency",
    "cudagraph_gib",
    "cudagraph_piecewise",
    "cudagraph_full",
)


@attrs.frozen(kw_only=True)
class StartupLog:
    id: str
    engine: str
    engine_version: str | None
    gpu: str | None
    model: str
    kvpools_model: str | None
    family: str
    source: str
    evidence: str
    launch: str | None
    flags: dict[str, Any]
    lines: tuple[str, ...]
    logged: dict[str, Any]
    split: str | None
    vocab_size: int | None = None
    intermediate_size: int | None = None
    hidden_size: int | None = None
    checkpoint_quantization: str | None = None
    """The checkpoint's own weight quantisation where the model id states it (``...-FP8``) and no flag does: the
    weights are estimated as kvpools' ``--quantization`` of that method."""
    notes: str | None = None

    def flag(self, name: str, default: Any = None) -> Any:
        return self.flags.get(name, default)


def _check(record: dict[str, Any], index: int) -> StartupLog:
    where = f"startup_logs.json record {index} ({record.get('id', '?')!r})"
    for name, allowed in (("engine", ENGINES), ("evidence", EVIDENCE), ("split", SPLITS), ("family", FAMILIES)):
        if record.get(name) not in allowed:
            raise ValueError(f"{where}: {name} must be one of {allowed}, got {record.get(name)!r}.")
    if not str(record.get("source", "")).startswith("https://github.com/"):
        raise ValueError(f"{where}: source must be a github.com URL (an issue, pull request or file).")
    lines = record.get("lines")
    if not lines or not all(isinstance(line, str) and line.strip() for line in lines):
        raise ValueError(f"{where}: lines must quote at least one non-empty log line.")
    logged = record.get("logged")
    if not isinstance(logged, dict) or not logged:
        raise ValueError(f"{where}: logged must hold the numbers read off the lines.")
    for name in LOGGED_NUMBERS:
        value = logged.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise ValueError(f"{where}: logged.{name} must be a non-negative number, got {value!r}.")
    if record["split"] is not None and record["engine_version"] is None:
        raise ValueError(f"{where}: a calibration or held-out record must name its engine version.")
    known = {field.name for field in attrs.fields(StartupLog)}
    unknown = set(record) - known
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}.")
    return StartupLog(**{**record, "lines": tuple(record["lines"])})


def load_startup_logs(path: Path = DATA) -> tuple[StartupLog, ...]:
    """Every record of ``path``, checked against the schema above; ids are unique."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != 1:
        raise ValueError(f"{path}: unknown schema {data.get('schema')!r} (expected 1).")
    records = tuple(_check(record, index) for index, record in enumerate(data["records"]))
    ids = [record.id for record in records]
    duplicates = sorted({name for name in ids if ids.count(name) > 1})
    if duplicates:
        raise ValueError(f"{path}: duplicate ids {duplicates}.")
    return records
