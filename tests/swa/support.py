"""SGLang's view of sliding-window configs and the differential check, for ``tests/swa``.

The oracle (``<repo>/../shared/oracle``) runs SGLang's own sizing code.  Here:
the oracle's ``model`` dict read from an HF config *independently of the
plugin's parser* (layer sets by SGLang's ``get_hybrid_layer_ids`` rules and
transformers' fixed patterns; geometry as SGLang's ``ModelConfig`` remaps
it, Gemma-4 included), the comparison of every ``MemoryPoolConfig`` field
(full and SWA tokens too), and hypothesis strategies for hybrid configs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kvpools_core.errors import InsufficientMemoryError
from kvpools_core.models import parse_config, resolve_model_source
from kvpools_core.pipeline import plan
from kvpools_core.registry import get_registry
from kvpools_core.values import ModelSpec, Plan, Serving
from tests.draft_shape import as_sglang_runs
from tests.oracle.adapter import server_args_resolved

GiB = 1 << 30
CHECKS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
SWA_FIELDS = ("max_total_num_tokens", "max_running_requests", "full_max_total_num_tokens", "swa_max_total_num_tokens")


def preset_config(name: str) -> dict[str, Any]:
    return resolve_model_source(name, get_registry())[0]


def parse(config: Mapping[str, Any], source: str = "hypothesis") -> ModelSpec:
    """The config through kvpools' plugins (exactly one must claim it)."""
    return parse_config(config, source, get_registry())[0]


def write_config(tmp_path: Path, config: Mapping[str, Any], name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def sliding_layer_ids(config: Mapping[str, Any]) -> list[int]:
    """Which layers slide, read as SGLang (``get_hybrid_layer_ids``) and transformers do."""
    text = config.get("text_config") or config
    n = text["num_hidden_layers"]
    model_type = text.get("model_type") or config.get("model_type")
    if "Llama4ForConditionalGeneration" in (config.get("architectures") or []):
        # get_hybrid_layer_ids, sglang/srt/configs/model_config.py L2705-2708: fixed, whatever the config lists
        return [i for i in range(n) if (i + 1) % 4 != 0]
    if "layer_types" in text:
        return [i for i, kind in enumerate(text["layer_types"]) if kind == "sliding_attention"]
    if "hybrid_layer_pattern" in text:
        return [i for i, flag in enumerate(text["hybrid_layer_pattern"]) if flag == 1]
    if model_type == "gemma2":
        return [i for i in range(n) if i % 2 == 0]
    if model_type in ("gemma3", "gemma3_text") or "sliding_window_pattern" in text:
        every = text.get("sliding_window_pattern", 6)
        return [i for i in range(n) if (i + 1) % every]
    return list(range(n))  # a window on every layer: all-SWA


def oracle_model(config: Mapping[str, Any], dtype: str | None = None) -> Any:
    """The oracle's ``model`` of a sliding-window config (SGLang's ``ModelConfig`` view, Gemma-4 remapped)."""
    from tests.oracle.adapter import OracleModel, sglang_model_dtype

    text = config.get("text_config") or config
    heads = text["num_attention_heads"]
    kv = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or text["hidden_size"] // heads
    v_head_dim = text.get("v_head_dim") or head_dim
    full_kv, full_dim, full_v_dim = kv, head_dim, v_head_dim
    if text.get("global_head_dim"):  # SGLang's Gemma-4 config: base = full (global), swa = sliding
        full_dim = full_v_dim = text["global_head_dim"]
        if text.get("attention_k_eq_v") and text.get("num_global_key_value_heads"):
            full_kv = text["num_global_key_value_heads"]
    swa = sliding_layer_ids(config)
    n = text["num_hidden_layers"]
    served = dtype or sglang_model_dtype(
        text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    )
    params: dict[str, Any] = {
        "architecture": (config.get("architectures") or ["MistralForCausalLM"])[0],
        "model_type": text.get("model_type", "oracle"),
        "num_hidden_layers": n,
        "num_attention_heads": heads,
        "num_key_value_heads": full_kv,
        "head_dim": full_dim,
        "v_head_dim": full_v_dim,
        "swa_attention_layer_ids": swa,
        "full_attention_layer_ids": [i for i in range(n) if i not in set(swa)],
        "swa_num_key_value_heads": text.get("swa_num_key_value_heads") or kv,
        "swa_head_dim": text.get("swa_head_dim") or head_dim,
        "swa_v_head_dim": text.get("swa_v_head_dim") or v_head_dim,
        "sliding_window_size": text.get("sliding_window")
        or text.get("sliding_window_size")
        or text.get("attention_chunk_size"),  # Llama-4: load_model_utils.py L152-153
        "context_len": next((int(text[k]) for k in _CONTEXT_KEYS if text.get(k) is not None), 131072),
        "dtype": served,
        "is_hybrid_swa": sglang_hybrid_swa(config),
    }
    return OracleModel(params=params, num_nextn_predict_layers=int(text.get("num_nextn_predict_layers") or 0))


SGLANG_0_5_23_HYBRID_SWA = frozenset(
    {"GptOssForCausalLM", "MiMoV2FlashForCausalLM", "Llama4ForConditionalGeneration", "Step3p5ForCausalLM"}
    | {"Gemma4ForCausalLM", "Gemma4ForConditionalGeneration", "BeamForCausalLM", "MiMoV2ForCausalLM"}
)
"""Part of ``is_hybrid_swa_model``'s list (SGLang 0.5.23 ``configs/model_config.py`` lines 2655-2679), read there."""
SGLANG_0_5_23_DISABLED = frozenset(
    {"Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration", "Olmo2ForCausalLM"}
)
"""``disable_hybrid_swa_memory`` declared unconditionally (``model_overrides/gemma2_gemma3.py`` line 26,
``olmo2.py`` line 23)."""


def sglang_hybrid_swa(config: Mapping[str, Any]) -> bool:
    """SGLang 0.5.23's ``ModelConfig.is_hybrid_swa`` for a config (lines 1215-1218 and 2651-2696 of
    ``configs/model_config.py``): listed or opted in (``is_hybrid_swa: true``), and not disabled by an override."""
    archs = set(config.get("architectures") or ())
    text = config.get("text_config") or config
    if archs & SGLANG_0_5_23_DISABLED:
        return False
    return bool(archs & SGLANG_0_5_23_HYBRID_SWA) or bool(text.get("is_hybrid_swa"))


@attrs.frozen
class Outcome:
    """What one side decided: the four ``MemoryPoolConfig`` numbers and the cell size, or a failure."""

    fields: tuple[int, ...] | None = None
    cell: float | None = None
    error: str | None = None
    warnings: tuple[str, ...] = ()


def oracle_outcome(model: Any, serving: Serving, memory: int) -> Outcome:
    """SGLang's answer for one rank (SWA sizing ignores the pipeline stage, so one run is every stage's)."""
    from tests.oracle.adapter import oracle_params, run_oracle

    out = run_oracle(oracle_params(model, serving, memory=memory))
    if "error" in out:
        error = out["error"]
        message = error["message"]
        if error["type"] == "RuntimeError" and message.startswith("Not enough memory"):
            return Outcome(error="not_enough_memory")
        if error["type"] == "RuntimeError" and message.startswith("SWA pool cap"):
            return Outcome(error="swa_cap")
        if error["type"] == "ZeroDivisionError" and memory == 0:
            return Outcome(error="not_enough_memory")
        raise AssertionError(f"SGLang's sizing failed in an unexpected way: {error}")
    config = out["memory_pool_config"]
    return Outcome(
        fields=tuple(int(config[k] or 0) for k in SWA_FIELDS),
        cell=out["cell_size"],
        warnings=tuple(out["warnings"]),
    )


def compare_swa(model: str | ModelSpec, oracle: Any, serving: Serving, memory: int) -> Outcome:
    """Plan with ``--accounting sglang`` and ask the oracle; assert they agree on every pool size and the cell.

    Where SGLang fails, kvpools raises ``InsufficientMemoryError`` (the SWA cap's
    error names the cap).  Where SGLang starts a server that cannot work — no
    request fits, or the SWA pool rounds to zero tokens — kvpools refuses the plan.
    """
    serving = attrs.evolve(serving, accounting="sglang")
    want = oracle_outcome(oracle, server_args_resolved(model, serving, None), memory)
    got: Plan | InsufficientMemoryError
    try:
        got = plan(model, serving, memory=memory)
    except InsufficientMemoryError as exc:
        got = exc
    case = f"model={getattr(model, 'name', model)} serving={serving} memory={memory}"
    if want.error is not None:
        assert isinstance(got, InsufficientMemoryError), f"SGLang fails ({want.error}); kvpools plans\n{case}"
        if want.error == "swa_cap":
            assert "SWA pool cap" in str(got), f"{got}\n{case}"
        return want
    assert want.fields is not None
    _total, requests, _full, swa = want.fields
    if requests == 0 or (oracle.params["is_hybrid_swa"] and swa < serving.page_size):
        assert isinstance(got, InsufficientMemoryError), (
            f"SGLang starts with {dict(zip(SWA_FIELDS, want.fields, strict=True))}, a server that cannot serve; "
            f"kvpools should refuse\n{case}"
        )
        return want
    assert isinstance(got, Plan), f"kvpools raised {got!r}; SGLang gives {want}\n{case}"
    ours = (tuple(int(got.sizing.sglang_config.get(k) or 0) for k in SWA_FIELDS), got.cell.sglang_bytes_per_token)
    assert ours == (want.fields, want.cell), f"kvpools {ours} != SGLang {(want.fields, want.cell)}\n{case}"
    missing = [w for w in want.warnings if w not in got.sizing.notes]
    assert not missing, f"SGLang warns {missing}; kvpools notes {list(got.sizing.notes)}\n{case}"
    return want


# ---------------------------------------------------------------------------
# hypothesis: hybrid sliding-window configs and the serving options SGLang sizes them under
# ---------------------------------------------------------------------------

HEAD_DIMS = (64, 96, 128, 192, 256)


@st.composite
def hybrid_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A gpt-oss-style (``layer_types``), MiMo-style (``hybrid_layer_pattern`` + asymmetric SWA geometry),
    Gemma-3-style (``sliding_window_pattern``) or all-SWA Mistral-style config."""
    form = draw(st.sampled_from(("layer_types", "hybrid_layer_pattern", "pattern", "all_swa")))
    n = draw(st.integers(1, 64))
    kv = draw(st.sampled_from((1, 2, 4, 8, 16)))
    head_dim = draw(st.sampled_from(HEAD_DIMS))
    config: dict[str, Any] = {
        "num_hidden_layers": n,
        "num_attention_heads": max(8, kv * draw(st.sampled_from((1, 2, 8)))),  # TP up to 8 splits them
        "num_key_value_heads": kv,
        "head_dim": head_dim,
        "sliding_window": draw(st.sampled_from((128, 512, 1024, 4096))),
        "max_position_embeddings": draw(st.sampled_from((4096, 32768, 131072, 262144))),
        "torch_dtype": draw(st.sampled_from(("bfloat16", "float16"))),
    }
    if form == "all_swa":
        config.update(architectures=["MistralForCausalLM"], model_type="mistral")
        if draw(st.booleans()):
            config["is_hybrid_swa"] = True  # SGLang's opt-in: hybrid pools; else one dense pool
        return config
    slides = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    slides[draw(st.integers(0, n - 1))] = True  # at least one sliding layer
    if form == "layer_types":
        config.update(
            architectures=["GptOssForCausalLM"],
            model_type="gpt_oss",
            layer_types=["sliding_attention" if s else "full_attention" for s in slides],
        )
    elif form == "hybrid_layer_pattern":
        config.update(
            architectures=["MiMoV2FlashForCausalLM"],
            model_type="mimo_v2_flash",
            hybrid_layer_pattern=[int(s) for s in slides],
            v_head_dim=draw(st.sampled_from(HEAD_DIMS)),
            swa_num_key_value_heads=draw(st.sampled_from((1, 2, 4, 8, 16))),
            swa_head_dim=draw(st.sampled_from(HEAD_DIMS)),
            swa_v_head_dim=draw(st.sampled_from(HEAD_DIMS)),
        )
    else:
        config.update(
            architectures=["Gemma3ForCausalLM"],
            model_type="gemma3_text",
            sliding_window_pattern=draw(st.integers(2, 8)),
        )
    return config


@st.composite
def swa_servings(draw: st.DrawFn) -> Serving:
    """Serving options that reach every branch of SGLang's SWA sizing (ratio, caps, chunk cap, drafts, PD)."""
    page = draw(st.sampled_from((1, 16, 64, 128)))
    tp = draw(st.sampled_from((1, 2, 4, 8)))
    dp_attention = tp > 1 and draw(st.booleans())
    spec = draw(st.sampled_from((None, None, "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "DFLASH", "NGRAM")))
    chunk_cap = draw(st.integers(0, 2)) == 0
    spec_args: dict[str, Any] = {}
    if spec is not None:
        spec_args = {
            "speculative_algorithm": spec,
            "speculative_num_steps": draw(st.integers(1, 5)),
            "speculative_eagle_topk": draw(st.sampled_from((1, 1, 2, 4))),
            "speculative_num_draft_tokens": draw(st.integers(1, 16)),
            "speculative_draft_num_layers": draw(st.integers(1, 3)),
        }
        spec_args = as_sglang_runs(spec_args)
    decode = draw(st.sampled_from(("null", "null", "prefill", "decode")))
    return Serving(
        kv_cache_dtype=draw(st.sampled_from(("auto", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1"))),
        page_size=page,
        tp_size=tp,
        dp_size=tp if dp_attention else 1,
        enable_dp_attention=dp_attention,
        swa_full_tokens_ratio=draw(st.sampled_from((0.8, 0.25, 0.5, 1.0, 0.1, 0.333, 1.5, 4.0))),
        swa_eviction_interval=draw(st.sampled_from((128, 1, 16, 512))),
        # at least one request per DP-attention worker (fewer is refused)
        max_running_requests=draw(st.one_of(st.none(), st.integers(tp if dp_attention else 1, 4096)))
        if not chunk_cap
        else draw(st.integers(tp if dp_attention else 1, 512)),
        disable_radix_cache=chunk_cap or draw(st.booleans()),
        disable_overlap_schedule=draw(st.booleans()),
        # whole pages per DP-attention worker: SGLang refuses any other chunk (check_server_args)
        chunked_prefill_size=draw(
            st.sampled_from([c for c in (8192, 2048, 16384, 512) if (c // (tp if dp_attention else 1)) % page == 0])
        ),
        max_total_tokens=draw(st.one_of(st.none(), st.none(), st.integers(1, 4_000_000), st.integers(1, 2000))),
        disaggregation_mode=decode,
        disaggregation_decode_extra_slots=draw(st.integers(0, 64)) if decode == "decode" else 0,
        **spec_args,
    )


def aimed_budgets(config: Mapping[str, Any]) -> st.SearchStrategy[int]:
    """Budgets aimed at the model (1 to 4M tokens of its unsharded bf16 KV, ± a few bytes), or a few fixed ones."""
    text = config.get("text_config") or config
    per_token = text["num_hidden_layers"] * text["num_key_value_heads"] * text["head_dim"] * 4
    tokens = st.sampled_from(range(8, 23)).flatmap(lambda e: st.integers(1 << e, (2 << e) - 1))
    aimed = st.tuples(tokens, st.integers(-64, 64)).map(lambda t: min(200 * GiB, max(0, t[0] * per_token + t[1])))
    return st.one_of(aimed, aimed, st.sampled_from((0, 1, 4096, 60 * GiB, 200 * GiB)))
