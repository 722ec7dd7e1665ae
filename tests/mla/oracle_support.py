"""SGLang's view of MLA, DSA and MiniMax-sparse configs, for the differential tests of those plugins.

The oracle (``<repo>/../shared/oracle``) runs SGLang's own sizing code; the
comparison itself is ``tests.oracle.adapter.compare``.  Here: the oracle's
``model`` dict read from an HF config *independently of kvpools' parsers*
(SGLang's ``ModelConfig`` rules), hypothesis strategies for latent and
MiniMax-sparse configs, and the session fixture that tears down the
one-process gloo group pipeline-parallel oracle runs create.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from kvpools_core.models import parse_config
from kvpools_core.registry import get_registry
from kvpools_core.values import ModelSpec

# Deterministic in CI: the same examples every run (no example database, no wall-clock deadline).
CHECKS = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

MLA_ARCHITECTURES = (
    "DeepseekV2ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV32ForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "MistralLarge3ForCausalLM",
)
"""SGLang MLA architectures; without ``index_topk`` none of them is DSA."""
DSA_ARCHITECTURES = (
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV3ForCausalLMNextN",
    "GlmMoeDsaForCausalLM",
    "MistralLarge3ForCausalLM",
)
"""``is_deepseek_dsa`` architectures that SGLang also serves with its MLA backend."""
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")


def parse(config: Mapping[str, Any], source: str = "hypothesis") -> ModelSpec:
    """The config through kvpools' plugins (exactly one must claim it)."""
    return parse_config(config, source, get_registry())[0]


def oracle_model(config: Mapping[str, Any]) -> Any:
    """The oracle's ``model`` of an MLA / DSA / MiniMax-sparse config, read as SGLang's ``ModelConfig`` reads it."""
    from tests.oracle.adapter import OracleModel, sglang_model_dtype

    text = config["text_config"] if isinstance(config.get("text_config"), Mapping) else config
    heads = text["num_attention_heads"]
    params: dict[str, Any] = {
        "architecture": config["architectures"][0],
        "model_type": config.get("model_type", "oracle"),
        "num_hidden_layers": text["num_hidden_layers"],
        "num_attention_heads": heads,
        "context_len": next(int(text[key]) for key in _CONTEXT_KEYS if text.get(key) is not None),
        "dtype": sglang_model_dtype(text.get("torch_dtype") or config.get("torch_dtype")),
        "is_multimodal": text is not config,
    }
    if text.get("num_key_value_heads") is not None:
        params["num_key_value_heads"] = text["num_key_value_heads"]
    params["head_dim"] = text.get("head_dim") or text.get("hidden_size", heads * 128) // heads
    for key in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "index_topk", "index_head_dim"):
        if text.get(key) is not None:
            params[key] = text[key]
    sparse = text.get("sparse_attention_config") or config.get("sparse_attention_config")
    if sparse is not None:
        params["sparse_attention_config"] = dict(sparse)
    return OracleModel(params=params, num_nextn_predict_layers=int(text.get("num_nextn_predict_layers") or 0))


@st.composite
def latent_configs(draw: st.DrawFn, *, dsa: bool, max_layers: int = 96) -> dict[str, Any]:
    """An MLA (or DSA) ``config.json``: latent ranks and rope dims a real checkpoint could have."""
    rank = draw(st.sampled_from((128, 256, 384, 512, 1024) if dsa else (64, 128, 256, 320, 512, 1024)))
    config: dict[str, Any] = {
        "architectures": [draw(st.sampled_from(DSA_ARCHITECTURES if dsa else MLA_ARCHITECTURES))],
        "model_type": "deepseek_v32" if dsa else "deepseek_v3",
        "num_hidden_layers": draw(st.integers(1, max_layers)),
        "num_attention_heads": draw(st.sampled_from((16, 32, 64, 128))),
        "kv_lora_rank": rank,
        "qk_rope_head_dim": draw(st.sampled_from((16, 32, 64, 128))),
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "max_position_embeddings": draw(
            st.one_of(st.sampled_from((4096, 32768, 131072, 163840)), st.integers(16, 1 << 20))
        ),
        "torch_dtype": draw(st.sampled_from(("bfloat16", "float16"))),
        "num_nextn_predict_layers": draw(st.integers(0, 2)),
    }
    if dsa:
        config.update(index_topk=2048, index_head_dim=128, index_n_heads=64)
    return config


@st.composite
def minimax_sparse_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A MiniMax-M3-style config: dense and sparse layers, key-only or key+value indexers, text_config or flat."""
    layers = draw(st.integers(1, 64))
    freq = draw(st.lists(st.integers(0, 1), min_size=layers, max_size=layers))
    k_only = draw(st.lists(st.integers(0, 1), min_size=layers, max_size=layers))
    kv_heads = draw(st.sampled_from((1, 2, 4, 8)))
    text: dict[str, Any] = {
        "architectures": ["MiniMaxM3SparseForCausalLM"],
        "num_hidden_layers": layers,
        "num_attention_heads": max(8, kv_heads * draw(st.sampled_from((1, 4, 16)))),  # TP up to 8 splits them
        "num_key_value_heads": kv_heads,
        "head_dim": draw(st.sampled_from((64, 128, 256))),
        "max_position_embeddings": draw(st.sampled_from((8192, 131072, 1048576))),
        "num_nextn_predict_layers": draw(st.integers(0, 1)),
        "sparse_attention_config": {
            "sparse_attention_freq": freq,
            "sparse_disable_index_value": k_only,
            "sparse_index_dim": draw(st.sampled_from((64, 128))),
        },
    }
    if draw(st.booleans()):  # the VL wrapper of the real checkpoint
        return {
            "architectures": ["MiniMaxM3SparseForConditionalGeneration"],
            "model_type": "minimax_m3_vl",
            "torch_dtype": "bfloat16",
            "text_config": text,
        }
    return {**text, "model_type": "minimax_m3", "torch_dtype": draw(st.sampled_from(("bfloat16", "float16")))}
