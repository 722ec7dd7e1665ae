"""SGLang's view of hybrid configs, hypothesis strategies for them, and the token- and slot-exact comparison.

Read independently of kvpools' parser: the layer layout and the state bytes per
request are derived here the way SGLang's config classes derive them
(``Mamba2StateShape.create``, ``Mamba1StateShape``, ``mamba_cache_per_req``),
and handed to the oracle (``../shared/oracle``), which takes the state bytes
as an input.  :func:`compare_hybrid` plans with kvpools in ``--accounting
sglang`` and asserts the same ``max_total_num_tokens``, ``max_running_requests``,
cell size and ``max_mamba_cache_size`` (K) as SGLang's own sizing code, or
that both fail.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import attrs
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kvpools_core.errors import InsufficientMemoryError
from kvpools_core.models import parse_config, resolve_model_source
from kvpools_core.pipeline import plan as kvpools_plan
from kvpools_core.registry import get_registry
from kvpools_core.values import ModelSpec, Plan, Serving
from tests.draft_shape import as_sglang_runs
from tests.oracle.locate import ORACLE_DIR

MODEL_CONFIGS = ORACLE_DIR.parent / "model-configs"
GiB = 1 << 30

# Deterministic in CI: the same examples every run (no example database, no wall-clock deadline).
CHECKS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

PRESETS = (
    "qwen3-next-80b-a3b-thinking",
    "qwen3.5-35b-a3b",
    "qwen3.5-397b-a17b",
    "qwen3.6-35b-a3b-nvfp4",
    "nemotron-h-56b-base-8k",
    "nemotron-3-nano-30b-a3b",
    "jamba-1.5-mini",
    "falcon-h1-0.5b",
    "falcon-h1-7b",
)
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
_SSM_ITEM = {"float32": 4, "bfloat16": 2, "float16": 2}


def parse(config: Mapping[str, Any], source: str = "hypothesis") -> ModelSpec:
    """The config through kvpools' plugins (exactly one must claim it)."""
    return parse_config(config, source, get_registry())[0]


def preset_config(name: str) -> dict[str, Any]:
    return resolve_model_source(name, get_registry())[0]


# ---------------------------------------------------------------------------
# SGLang's reading of a hybrid config (independent of kvpools' parser)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SGLangHybrid:
    """What SGLang's config class says: layer ids, attention geometry, and the state per layer per slot."""

    family: str
    num_layers: int
    full_attention_layer_ids: tuple[int, ...]
    mamba_layer_ids: tuple[int, ...]
    conv_shape: tuple[int, int]
    ssm_shape: tuple[int, ...]
    ssm_dtype: str
    params: Mapping[str, Any] = field(repr=False)

    @property
    def state_bytes_per_layer(self) -> int:
        return math.prod(self.conv_shape) * 2 + math.prod(self.ssm_shape) * _SSM_ITEM[self.ssm_dtype]

    @property
    def mamba_cache_per_req(self) -> int:
        """``BaseLinearStateParams.mamba_cache_per_req``: over every mamba layer of the model."""
        return self.state_bytes_per_layer * len(self.mamba_layer_ids)


def sglang_hybrid(config: Mapping[str, Any], serving: Serving) -> SGLangHybrid:
    """Read a hybrid config as SGLang's ``ModelConfig`` and config class do, for ``serving``'s TP."""
    text = config["text_config"] if isinstance(config.get("text_config"), Mapping) else config
    model_type = str(text.get("model_type") or config.get("model_type"))
    family = {
        "qwen3_next": "gdn",
        "qwen3_5_moe_text": "gdn",
        "qwen3_5_text": "gdn",
        "nemotron_h": "nemotron_h",
        "jamba": "jamba",
        "falcon_h1": "falcon_h1",
        "granitemoehybrid": "granite",
        "kimi_linear": "kda",
    }[model_type]
    if family == "kda":  # KimiLinearConfig.is_kda_layer: 1-based kda_layers, every other layer full (MLA)
        n = text["num_hidden_layers"]
        mamba = [i for i in range(n) if i + 1 in text["linear_attn_config"]["kda_layers"]]
        full = [i for i in range(n) if i not in mamba]
    elif family == "nemotron_h":
        pattern = text["hybrid_override_pattern"]
        n = len(pattern)
        full = [i for i, c in enumerate(pattern) if c == "*"]
        mamba = [i for i, c in enumerate(pattern) if c == "M"]
    elif family == "falcon_h1":
        n = text["num_hidden_layers"]
        full = mamba = list(range(n))
    elif family == "jamba":
        n = text["num_hidden_layers"]
        full = [i for i in range(n) if (i - text["attn_layer_offset"]) % text["attn_layer_period"] == 0]
        mamba = [i for i in range(n) if i not in full]
    elif "layer_types" in text:
        n = text["num_hidden_layers"]
        full = [i for i, t in enumerate(text["layer_types"]) if t in ("full_attention", "attention")]
        mamba = [i for i, t in enumerate(text["layer_types"]) if t in ("linear_attention", "mamba")]
    else:  # Qwen3-Next's layers_block_type property
        n = text["num_hidden_layers"]
        full = [i for i in range(n) if (i + 1) % text["full_attention_interval"] == 0]
        mamba = [i for i in range(n) if i not in full]
    tp = serving.tp_size if family == "falcon_h1" else serving.attn_tp_size
    if family == "kda":
        conv, ssm = _kda_shape(tp, **text["linear_attn_config"])
    elif family == "gdn":
        conv, ssm = _mamba2_shape(
            tp,
            intermediate=text["linear_value_head_dim"] * text["linear_num_value_heads"],
            n_groups=text["linear_num_key_heads"],
            heads=text["linear_num_value_heads"],
            head_dim=text["linear_value_head_dim"],
            state=text["linear_key_head_dim"],
            kernel=text["linear_conv_kernel_dim"],
        )
    elif family == "jamba":
        inner = text["hidden_size"] * text["mamba_expand"] // tp
        conv, ssm = (inner, text["mamba_d_conv"] - 1), (inner, text["mamba_d_state"])
    elif family == "nemotron_h":
        conv, ssm = _mamba2_shape(
            tp,
            intermediate=text["mamba_num_heads"] * text["mamba_head_dim"],
            n_groups=text["n_groups"],
            heads=text["mamba_num_heads"],
            head_dim=text["mamba_head_dim"],
            state=text["ssm_state_size"],
            kernel=text["conv_kernel"],
        )
    else:
        inner = (
            text.get("mamba_d_ssm") or text["mamba_n_heads"] * text["mamba_d_head"]
            if family == "falcon_h1"
            else text["mamba_expand"] * text["hidden_size"]
        )
        conv, ssm = _mamba2_shape(
            tp,
            intermediate=inner,
            n_groups=text["mamba_n_groups"],
            heads=text["mamba_n_heads"],
            head_dim=text["mamba_d_head"],
            state=text["mamba_d_state"],
            kernel=text["mamba_d_conv"],
        )
    config_ssm = text.get("mamba_ssm_dtype") if family in ("gdn", "nemotron_h", "jamba") else None
    heads = text["num_attention_heads"]
    head_dim = text.get("head_dim") or text.get("attention_head_dim") or text["hidden_size"] // heads
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    from tests.oracle.adapter import sglang_model_dtype

    params = {
        "architecture": (config.get("architectures") or text.get("architectures") or ["HybridForCausalLM"])[0],
        "model_type": model_type,
        "num_hidden_layers": n,
        "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_key_value_heads") or heads,
        "head_dim": head_dim,
        "context_len": next(int(text[key]) for key in _CONTEXT_KEYS if text.get(key) is not None),
        "dtype": sglang_model_dtype(dtype),  # a config without a dtype is float32: served in float16
        "is_multimodal": text is not config,
    }
    if family == "kda":  # ModelConfig: KimiLinearForCausalLM is MLA; the oracle's MLA list lacks it
        params.update(
            kv_lora_rank=text["kv_lora_rank"], qk_rope_head_dim=text["qk_rope_head_dim"], use_mla_backend=True
        )
    return SGLangHybrid(
        family=family,
        num_layers=n,
        full_attention_layer_ids=tuple(full),
        mamba_layer_ids=tuple(mamba),
        conv_shape=conv,
        ssm_shape=ssm,
        ssm_dtype=serving.mamba_ssm_dtype or config_ssm or "float32",
        params=params,
    )


def _mamba2_shape(
    tp: int, *, intermediate: int, n_groups: int, heads: int, head_dim: int, state: int, kernel: int
) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """``Mamba2StateShape.create`` (``divide`` asserts exact division)."""
    if n_groups % tp:
        n_groups += tp - n_groups
    conv_dim = intermediate + 2 * n_groups * state
    assert conv_dim % tp == 0 and heads % tp == 0, (conv_dim, heads, tp)
    return (conv_dim // tp, kernel - 1), (heads // tp, head_dim, state)


def _kda_shape(
    tp: int, *, num_heads: int, head_dim: int, short_conv_kernel_size: int, **_: Any
) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """``KimiLinearStateShape.create`` (K heads and dims default to V's): conv ``(K - 1, q + k + v)`` per TP rank."""
    proj = num_heads * head_dim
    assert proj % tp == 0 and num_heads % tp == 0, (num_heads, head_dim, tp)
    return (short_conv_kernel_size - 1, proj // tp + 2 * (proj // tp)), (num_heads // tp, head_dim, head_dim)


def oracle_model(config: Mapping[str, Any], serving: Serving) -> Any:
    """The oracle's ``model`` for ``serving`` (the state bytes depend on TP)."""
    from tests.oracle.adapter import OracleModel

    hybrid = sglang_hybrid(config, serving)
    text = config["text_config"] if isinstance(config.get("text_config"), Mapping) else config
    params = dict(hybrid.params)
    params["mamba"] = {
        "kind": hybrid.family if hybrid.family in ("gdn", "kda") else "mamba2",
        "layer_ids": list(hybrid.mamba_layer_ids),
        "full_attention_layer_ids": list(hybrid.full_attention_layer_ids),
        "cache_per_req_bytes": hybrid.mamba_cache_per_req,
    }
    nextn = int(text.get("num_nextn_predict_layers") or text.get("mtp_num_hidden_layers") or 0)
    return OracleModel(params=params, num_nextn_predict_layers=nextn)


# ---------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------

_FAILURES = (
    ("ValueError", "Loaded weights leave no GPU memory"),
    ("RuntimeError", "Not enough memory"),
    ("RuntimeError", "Not enough GPU memory for hybrid"),
    ("RuntimeError", "Hybrid (mamba/linear-attention) state cache is too small"),
    # An explicit budget (no pre-load memory) that the state cache exhausts: SGLang's suggested
    # --mem-fraction-static divides by the pre-load memory, 0 on this path.
    ("ZeroDivisionError", ""),
)


@dataclass(frozen=True)
class HybridAnswer:
    """SGLang's start-up for the requested rank: tokens, requests, cell size, K — or how it fails."""

    max_total_num_tokens: int | None = None
    max_running_requests: int | None = None
    cell_size: int | None = None
    max_mamba_cache_size: int | None = None
    error: str | None = None
    warnings: tuple[str, ...] = ()
    stage_tokens: tuple[int, ...] = ()


def _failure(out: Mapping[str, Any]) -> HybridAnswer | None:
    error = out.get("error")
    if not error:
        return None
    for kind, prefix in _FAILURES:
        if error["type"] == kind and error["message"].startswith(prefix):
            return HybridAnswer(error=f"{kind}: {error['message']}")
    raise AssertionError(f"SGLang's sizing failed in an unexpected way at {error.get('where')}: {error}")


def hybrid_oracle(
    model: Any, serving: Serving, *, memory: int | None = None, free_memory: int | None = None, weights_memory: int = 0
) -> HybridAnswer:
    """SGLang's answer for ``serving.pp_rank``, every pipeline stage started together (as ``adapter.oracle_plan``)."""
    from tests.oracle.adapter import oracle_params, run_oracle

    budget = {"memory": memory, "free_memory": free_memory, "weights_memory": weights_memory}
    ranks = range(serving.pp_size) if serving.pp_size > 1 else (serving.pp_rank,)
    stages = [run_oracle(oracle_params(model, serving, pp_rank=rank, **budget)) for rank in ranks]
    for out in stages:
        failed = _failure(out)
        if failed:
            return failed
    tokens = tuple(out["memory_pool_config"]["max_total_num_tokens"] for out in stages)
    own = stages[serving.pp_rank] if serving.pp_size > 1 else stages[0]
    final = own
    if serving.pp_size > 1:  # the MIN all-reduce, then the constraint path on this rank
        params = oracle_params(model, serving, max_tokens=min(tokens), **budget)
        # SGLang sets K once, in this rank's profiling (``_handle_max_mamba_cache`` inside
        # ``_profile_available_bytes``), before the all-reduce; the oracle's constraint path would
        # re-derive it from the free memory *without* the runtime slack. Hand it the profiled K.
        params["server_args"]["max_mamba_cache_size"] = own["mamba"]["max_mamba_cache_size"]
        final = run_oracle(params)
        failed = _failure(final)
        if failed:
            return failed
    config = final["memory_pool_config"]
    return HybridAnswer(
        max_total_num_tokens=config["max_total_num_tokens"],
        max_running_requests=config["max_running_requests"],
        cell_size=own["cell_size"],
        max_mamba_cache_size=final["mamba"]["max_mamba_cache_size"],
        warnings=tuple(own["warnings"]),
        stage_tokens=tokens,
    )


def compare_hybrid(
    model: ModelSpec | str,
    config: Mapping[str, Any],
    serving: Serving,
    *,
    memory: int | None = None,
    free_memory: int | None = None,
    weights_memory: int = 0,
) -> tuple[HybridAnswer, Plan | InsufficientMemoryError]:
    """kvpools (``--accounting sglang``) against SGLang: the same tokens, requests, cell size and K, or both fail."""
    from tests.oracle.adapter import suggested_fraction

    serving = attrs.evolve(serving, accounting="sglang")
    budget = {"memory": memory, "free_memory": free_memory, "weights_memory": weights_memory}
    want = hybrid_oracle(oracle_model(config, serving), serving, **budget)
    got: Plan | InsufficientMemoryError
    try:
        got = kvpools_plan(model, serving, **budget)
    except InsufficientMemoryError as exc:
        got = exc
    case = f"model={model if isinstance(model, str) else model.name} serving={_changed(serving)} budget={budget}"
    if want.error:
        assert isinstance(got, InsufficientMemoryError), f"SGLang fails ({want.error}) but kvpools plans {got}\n{case}"
        if want.error.startswith("ValueError") and "above" in str(got) and "and the reservations" not in str(got):
            # (kvpools' figure counts the multimodal reservation SGLang's leaves out: tests/oracle/adapter.py)
            assert suggested_fraction(str(got)) == suggested_fraction(want.error), f"{got}\n{want.error}\n{case}"
        return want, got
    assert isinstance(got, Plan), f"kvpools raised {got}; SGLang gives {want}\n{case}"
    ours = (
        got.max_total_num_tokens,
        got.max_running_requests,
        got.cell.sglang_bytes_per_token,
        got.sizing.sglang_config["max_mamba_cache_size"],
    )
    theirs = (want.max_total_num_tokens, want.max_running_requests, want.cell_size, want.max_mamba_cache_size)
    assert ours == theirs, f"(tokens, requests, cell, K) kvpools {ours} != SGLang {theirs}\n{case}"
    state = got.pool("mamba_state")
    assert (state.slots, state.padding_slots) == (decode_pool_slots(want.max_mamba_cache_size, got), 1)
    if serving.pp_size == 1:
        missing = [w for w in want.warnings if w not in got.sizing.notes]
        assert not missing, f"SGLang warns {missing}; kvpools notes {list(got.sizing.notes)}\n{case}"
    return want, got


def decode_pool_slots(k: int, got: Plan) -> int:
    """The slots SGLang's request table gives the state pool: K, or on a PD decode node
    ``max(K, (max_running_requests + pre_alloc_size) x 1)`` (``HybridMambaDecodeReqToTokenPool.__init__``,
    ``disaggregation/decode.py``; one slot per request: a decode node has no radix cache, so no extra buffer)."""
    serving = got.serving
    if serving.disaggregation_mode != "decode":
        return k
    return max(k, got.max_running_requests + serving.decode_extra_slots)


def _changed(serving: Serving) -> dict[str, Any]:
    defaults = Serving()
    return {
        f.name: getattr(serving, f.name)
        for f in attrs.fields(Serving)
        if getattr(serving, f.name) != getattr(defaults, f.name)
    }


# ---------------------------------------------------------------------------
# hypothesis: hybrid configs and the serving options SGLang sizes them under
# ---------------------------------------------------------------------------


def _layout(draw: st.DrawFn, n: int, state: str, full: str) -> list[str]:
    """A layer list with at least one state and one full-attention layer."""
    kinds = draw(st.lists(st.sampled_from((state, state, state, full)), min_size=n, max_size=n))
    if state not in kinds:
        kinds[0] = state
    if full not in kinds:
        kinds[-1] = full
    return kinds


@st.composite
def hybrid_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A Qwen3-Next / Qwen3.5 / Nemotron-H / Jamba / Falcon-H1 / Granite-4.0-H ``config.json``."""
    family = draw(st.sampled_from(("qwen3_next", "qwen3_5", "nemotron_h", "jamba", "falcon_h1", "granite")))
    kv_heads = draw(st.sampled_from((1, 2, 4, 8)))
    attention = {
        "num_attention_heads": max(8, kv_heads * draw(st.sampled_from((1, 2, 4, 8)))),  # TP up to 8 splits them
        "num_key_value_heads": kv_heads,
        "head_dim": draw(st.sampled_from((64, 128, 256))),
        "max_position_embeddings": draw(st.sampled_from((4096, 8192, 32768, 131072, 262144))),
        "torch_dtype": draw(st.sampled_from(("bfloat16", "float16"))),
    }
    if family in ("qwen3_next", "qwen3_5"):
        k_heads = draw(st.sampled_from((1, 2, 4, 8, 16)))
        gdn = {
            "linear_num_key_heads": k_heads,
            "linear_num_value_heads": k_heads * draw(st.sampled_from((1, 2, 4))),
            "linear_key_head_dim": draw(st.sampled_from((64, 128))),
            "linear_value_head_dim": draw(st.sampled_from((64, 128, 256))),
            "linear_conv_kernel_dim": draw(st.sampled_from((2, 4))),
        }
        if draw(st.booleans()):
            gdn["mamba_ssm_dtype"] = draw(st.sampled_from(("float32", "bfloat16")))
        if family == "qwen3_next":
            interval = draw(st.integers(2, 6))
            return {
                "architectures": ["Qwen3NextForCausalLM"],
                "model_type": "qwen3_next",
                "num_hidden_layers": draw(st.integers(interval, 64)),
                "full_attention_interval": interval,
                "num_nextn_predict_layers": draw(st.integers(0, 1)),
                **attention,
                **gdn,
            }
        n = draw(st.integers(2, 64))
        kinds = _layout(draw, n, "linear_attention", "full_attention")
        return {
            "architectures": ["Qwen3_5MoeForConditionalGeneration"],
            "model_type": "qwen3_5_moe",
            "text_config": {
                "model_type": "qwen3_5_moe_text",
                "num_hidden_layers": n,
                "layer_types": kinds,
                "mtp_num_hidden_layers": 1,
                **attention,
                **gdn,
            },
        }
    if family == "nemotron_h":
        n = draw(st.integers(2, 96))
        kinds = _layout(draw, n, "M", "*")
        pattern = "".join(
            draw(st.sampled_from(("-", "E"))) if k == "M" and draw(st.integers(0, 3)) == 0 else k for k in kinds
        )
        if "M" not in pattern:
            pattern = "M" + pattern[1:]
        groups = draw(st.sampled_from((1, 2, 4, 8)))
        return {
            "architectures": ["NemotronHForCausalLM"],
            "model_type": "nemotron_h",
            "num_hidden_layers": n,
            "hybrid_override_pattern": pattern,
            "mamba_num_heads": groups * draw(st.sampled_from((4, 8, 16, 32))),
            "mamba_head_dim": draw(st.sampled_from((32, 64))),
            "n_groups": groups,
            "ssm_state_size": draw(st.sampled_from((64, 128, 256))),
            "conv_kernel": 4,
            **attention,
        }
    if family == "jamba":
        period = draw(st.integers(2, 8))
        return {
            "architectures": ["JambaForCausalLM"],
            "model_type": "jamba",
            "num_hidden_layers": draw(st.integers(period, 40)),
            "attn_layer_period": period,
            "attn_layer_offset": draw(st.integers(0, period - 1)),
            "hidden_size": draw(st.sampled_from((1024, 2048, 4096))),
            "mamba_expand": 2,
            "mamba_d_state": draw(st.sampled_from((16, 32))),
            "mamba_d_conv": 4,
            **attention,
        }
    heads = draw(st.sampled_from((8, 16, 24, 32, 64)))
    d_head = draw(st.sampled_from((32, 64, 128)))
    mamba = {
        "mamba_n_heads": heads,
        "mamba_d_head": d_head,
        "mamba_n_groups": draw(st.sampled_from((1, 2, 4, 8))),
        "mamba_d_state": draw(st.sampled_from((64, 128, 256))),
        "mamba_d_conv": 4,
    }
    if family == "falcon_h1":
        if draw(st.booleans()):
            mamba["mamba_d_ssm"] = heads * d_head
        return {
            "architectures": ["FalconH1ForCausalLM"],
            "model_type": "falcon_h1",
            "num_hidden_layers": draw(st.integers(1, 48)),
            "hidden_size": 1024,
            **attention,
            **mamba,
        }
    n = draw(st.integers(2, 48))
    return {
        "architectures": ["GraniteMoeHybridForCausalLM"],
        "model_type": "granitemoehybrid",
        "num_hidden_layers": n,
        "layer_types": _layout(draw, n, "mamba", "attention"),
        "hidden_size": heads * d_head // 2,
        "mamba_expand": 2,
        **attention,
        **mamba,
    }


@st.composite
def hybrid_serving(draw: st.DrawFn, spec: ModelSpec, *, pp: bool = False) -> Serving:
    """Serving for a hybrid: parallelism, page, KV dtype, the mamba knobs, caps and speculation."""
    options: dict[str, Any] = {
        "kv_cache_dtype": draw(st.sampled_from(("auto", "bf16", "fp8_e4m3", "fp8_e5m2", "fp4_e2m1", "fp32"))),
        "page_size": draw(st.sampled_from((1, 16, 64))),
        "mamba_full_memory_ratio": draw(st.sampled_from((0.1, 0.5, 0.9, 1.0, 2.5))),
        "disable_radix_cache": draw(st.integers(0, 3)) == 0,
        "mamba_skip_decode_lock": draw(st.integers(0, 3)) == 0,
    }
    if draw(st.booleans()):
        dp = draw(st.sampled_from((2, 4)))
        options.update(dp_size=dp, enable_dp_attention=True, tp_size=dp * draw(st.sampled_from((1, 2))))
    else:
        options["tp_size"] = draw(st.sampled_from((1, 1, 2, 4, 8)))
    if draw(st.integers(0, 2)) == 0:
        options["enable_mamba_extra_buffer"] = True
        options["disable_overlap_schedule"] = draw(st.booleans())
        options["enable_mamba_extra_buffer_lazy"] = not options["disable_overlap_schedule"] and draw(st.booleans())
    elif draw(st.integers(0, 3)) == 0:
        options["disable_overlap_schedule"] = True
    if draw(st.integers(0, 3)) == 0:
        options["max_mamba_cache_size"] = draw(st.integers(1, 2048))
    width = options.get("dp_size", 1) if options.get("enable_dp_attention") else 1  # >= one per DP-attention worker
    options["max_running_requests"] = draw(st.one_of(st.none(), st.integers(width, 4096)))
    if draw(st.integers(0, 4)) == 0:
        options["max_total_tokens"] = draw(st.integers(1, 1 << 22))
    if draw(st.integers(0, 4)) == 0:
        options["mamba_ssm_dtype"] = draw(st.sampled_from(("bfloat16", "float32", "float16")))
    role = draw(st.sampled_from(("null",) * 6 + ("prefill", "decode")))
    if role == "prefill":
        options["disaggregation_mode"] = "prefill"  # no verification on a prefill node: no speculative state pool
        options["enable_mamba_extra_buffer_lazy"] = False  # SGLang refuses the lazy buffer under PD
    elif role == "decode":  # no radix cache; pre-allocated rows (unset: SGLang's default) raise the state pool
        options["disaggregation_mode"] = "decode"
        options["disaggregation_decode_extra_slots"] = draw(st.one_of(st.none(), st.integers(0, 64)))
    if draw(st.integers(0, 5)) == 0:
        options["context_length"] = draw(st.integers(1024, 1 << 20))
    if draw(st.integers(0, 2)) == 0:
        algorithm = draw(st.sampled_from(("EAGLE", "NEXTN", "NGRAM", "DFLASH", "EAGLE3")))
        options.update(
            speculative_algorithm=algorithm,
            speculative_num_draft_tokens=draw(st.integers(1, 8)),
            speculative_num_steps=draw(st.integers(1, 4)),
            speculative_eagle_topk=1,
            max_running_requests=options["max_running_requests"] or draw(st.integers(width, 512)),
        )
        if algorithm != "NGRAM" and not (algorithm == "NEXTN" and spec.num_nextn_predict_layers):
            options["speculative_draft_num_layers"] = draw(st.integers(1, 2))
        options = as_sglang_runs(options)
    if pp and spec.num_layers > 1:
        options["pp_size"] = draw(st.integers(2, min(3, spec.num_layers)))
        options["pp_rank"] = draw(st.integers(0, options["pp_size"] - 1))
    return Serving(accounting="sglang", **options)


def hybrid_budgets(spec: ModelSpec) -> st.SearchStrategy[int]:
    """Budgets from a few MiB to 200 GiB, log-uniform, and some aimed near one state slot."""
    exponents = st.integers(22, 37).flatmap(lambda e: st.integers(1 << e, (2 << e) - 1))
    return st.one_of(exponents, st.just(200 * GiB))
