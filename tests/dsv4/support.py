"""SGLang's view of DeepSeek-V4 configs and the differential check, for ``tests/dsv4``.

The oracle's ``model`` dict is read from the HF config *independently of the
plugin's parser* (SGLang's ``ModelConfig`` view: ``compress_ratios`` as listed,
the SWA page from ``sliding_window``, ``qk_nope_head_dim`` derived by the
oracle from ``head_dim``); the DeepSeek-V4 environment switches and HiSparse
server args are added to the adapter's params; every ``MemoryPoolConfig``
field is compared.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import attrs
from hypothesis import HealthCheck, settings

from kvpools_core.errors import InsufficientMemoryError
from kvpools_core.models import resolve_model_source
from kvpools_core.pipeline import plan, plan_basis
from kvpools_core.registry import get_registry
from kvpools_core.values import ModelSpec, Plan, Serving

GiB = 1 << 30
CHECKS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DSV4_FIELDS = (
    "max_total_num_tokens",
    "max_running_requests",
    "full_max_total_num_tokens",
    "swa_max_total_num_tokens",
    "c4_max_total_num_tokens",
    "c128_max_total_num_tokens",
    "c4_state_pool_size",
    "c128_state_pool_size",
)
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


def preset_config(name: str) -> dict[str, Any]:
    return resolve_model_source(name, get_registry())[0]


def oracle_model(config: Mapping[str, Any]) -> Any:
    """The oracle's ``model`` of a DeepSeek-V4 config, as SGLang's ``ModelConfig`` reads it."""
    from tests.oracle.adapter import OracleModel

    text = config.get("text_config") or config
    model = {
        "architecture": config["architectures"][0],
        "model_type": text.get("model_type", "deepseek_v4"),
        "num_hidden_layers": text["num_hidden_layers"],
        "num_attention_heads": text.get("num_attention_heads", 1),
        "num_key_value_heads": text.get("num_key_value_heads", 1),
        "head_dim": text["head_dim"],
        "qk_rope_head_dim": text["qk_rope_head_dim"],
        "index_head_dim": text.get("index_head_dim"),
        "compress_ratios": list(text["compress_ratios"]),
        "window_size": text.get("window_size", text.get("sliding_window")),
        "context_len": next(int(text[key]) for key in _CONTEXT_KEYS if text.get(key) is not None),
        "dtype": "bfloat16",
    }
    if text.get("qk_nope_head_dim") is not None:
        model["qk_nope_head_dim"] = text["qk_nope_head_dim"]
    return OracleModel(params=model, num_nextn_predict_layers=int(text.get("num_nextn_predict_layers") or 0))


def dsv4_params(
    model: Any, serving: Serving, memory: int, *, pp_rank: int | None = None, max_tokens: int | None = None
) -> dict[str, Any]:
    """The adapter's params plus the DeepSeek-V4 environment switches and HiSparse server args."""
    from tests.oracle.adapter import oracle_params

    params = oracle_params(model, serving, memory=memory, pp_rank=pp_rank, max_tokens=max_tokens)
    params["server_args"]["enable_hisparse"] = serving.enable_hisparse
    params["server_args"]["hisparse_config"] = serving.hisparse_config
    params["env"].update(
        {
            "SGLANG_DSV4_COMPRESS_STATE_DTYPE": serving.dsv4_compress_state_dtype,
            "SGLANG_OPT_USE_ONLINE_COMPRESS": int(serving.enable_online_compress),
            "SGLANG_EXPERIMENTAL_ONLINE_C128_MTP": int(serving.enable_online_c128_mtp),
        }
    )
    return params


@dataclass(frozen=True)
class Outcome:
    """SGLang's answer: every MemoryPoolConfig field and the cell, or the failure (type, message)."""

    fields: tuple[int, ...] | None = None
    cell: float | None = None
    error: tuple[str, str] | None = None
    warnings: tuple[str, ...] = ()


def _fields(out: Mapping[str, Any]) -> tuple[int, ...]:
    config = out["memory_pool_config"]
    return tuple(int(config[key]) for key in DSV4_FIELDS)


def oracle_outcome(model: Any, serving: Serving, memory: int) -> Outcome:
    """SGLang's start-up for ``serving.pp_rank`` (every PP stage profiled, MIN synced, re-solved)."""
    from tests.oracle.adapter import run_oracle

    if serving.pp_size == 1:
        out = run_oracle(dsv4_params(model, serving, memory))
        if "error" in out:
            return Outcome(error=(out["error"]["type"], out["error"]["message"]), cell=out.get("cell_size"))
        return Outcome(fields=_fields(out), cell=out["cell_size"], warnings=tuple(out["warnings"]))
    stages = [run_oracle(dsv4_params(model, serving, memory, pp_rank=rank)) for rank in range(serving.pp_size)]
    for out in stages:
        if "error" in out:
            return Outcome(error=(out["error"]["type"], out["error"]["message"]))
    synced = min(out["memory_pool_config"]["max_total_num_tokens"] for out in stages)
    own = stages[serving.pp_rank]
    if synced < own["memory_pool_config"]["max_total_num_tokens"]:
        out = run_oracle(dsv4_params(model, serving, memory, max_tokens=synced))
        if "error" in out:
            return Outcome(error=(out["error"]["type"], out["error"]["message"]))
        return Outcome(fields=_fields(out), cell=own["cell_size"])
    return Outcome(fields=_fields(own), cell=own["cell_size"])


def sglang_resolved(model: str | ModelSpec, serving: Serving) -> Serving:
    """``serving`` with the options it leaves unset as SGLang's start-up resolves them before its configurator
    runs (the model overrides, which the oracle does not execute: ``engine_defaults``, page 256 and ratio 0.1)."""
    resolved = plan_basis(model, serving).serving
    return attrs.evolve(serving, **{name: getattr(resolved, name) for name in serving.unset_options})


def compare_dsv4(model: str | ModelSpec, oracle: Any, serving: Serving, memory: int) -> Outcome:
    """Plan with ``--accounting sglang`` and ask the oracle; assert they agree on every pool size and the cell.

    Where SGLang fails ("Not enough memory"), kvpools raises ``InsufficientMemoryError``; where SGLang
    would start a server that cannot serve (no request, an SWA pool under one page), kvpools refuses.
    """
    serving = attrs.evolve(serving, accounting="sglang")
    engine = sglang_resolved(model, serving)
    want = oracle_outcome(oracle, engine, memory)
    got: Plan | InsufficientMemoryError
    try:
        got = plan(model, serving, memory=memory)
    except InsufficientMemoryError as exc:
        got = exc
    case = f"model={getattr(model, 'name', model)} serving={serving} memory={memory}"
    if want.error is not None:
        # An explicit budget of 0 B divides by the pre-load memory in SGLang's "no memory" branch (the adapter's note).
        expected = (want.error[0] == "RuntimeError" and "Not enough memory" in want.error[1]) or (
            want.error[0] == "ZeroDivisionError" and memory == 0
        )
        assert expected, f"{want.error}\n{case}"
        assert isinstance(got, InsufficientMemoryError), f"SGLang fails ({want.error}); kvpools plans\n{case}"
        return want
    assert want.fields is not None
    requests, swa = want.fields[1], want.fields[3]
    if requests == 0 or swa < engine.page_size:
        assert isinstance(got, InsufficientMemoryError), (
            f"SGLang starts with {dict(zip(DSV4_FIELDS, want.fields, strict=True))}, a server that cannot serve; "
            f"kvpools should refuse\n{case}"
        )
        return want
    assert isinstance(got, Plan), f"kvpools raised {got!r}; SGLang gives {want}\n{case}"
    ours = (tuple(int(got.sizing.sglang_config[k]) for k in DSV4_FIELDS), got.cell.sglang_bytes_per_token)
    assert ours == (want.fields, want.cell), f"kvpools {ours} != SGLang {(want.fields, want.cell)}\n{case}"
    missing = [w for w in want.warnings if w not in got.sizing.notes]
    assert not missing, f"SGLang warns {missing}; kvpools notes {list(got.sizing.notes)}\n{case}"
    return want


def write_config(tmp_path: Any, config: Mapping[str, Any], name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)
