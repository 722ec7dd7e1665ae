"""MHA / GQA: every layer keeps full-attention K and V for every token.

Recognises dense decoder configs (llama, mistral without a sliding window,
qwen2/3 and their MoE variants, minimax_m2, mimo, ...); declines configs that
have MLA latents, sliding windows, recurrent layers or a sparse-attention
indexer (``sparse_attention_config``), which belong to other plugins.  Cell
size follows SGLang's ``DefaultPoolConfigurator``: KV heads per
rank × (head_dim + v_head_dim) × layers × element size, with the fp4 scale
term; kvpools' exact figure also charges mxfp8 scales and DCP's head layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpools_core import hookimpl
from kvpools_core.config import ConfigReader, context_length, model_dtype
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.parallel import kv_heads_per_rank, rank_layer_range
from kvpools_core.values import CellPart, CellSize, LayerSpec, ModelSpec, Plan, Serving

ARCHITECTURE = "mha"

DENSE_MODEL_TYPES = frozenset(
    {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "minimax_m2",
        "mimo",
        "phi3",
        "gemma",
        "internlm2",
        "granite",
        "granitemoe",
        "olmo2",
        "exaone",
        "glm4",
        "starcoder2",
    }
)
"""Families whose every layer is full attention (unless a sliding window is switched on)."""

_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
_KV_HEAD_KEYS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num", "num_attention_groups")
_FOREIGN_MARKERS = (
    "kv_lora_rank",
    "layer_types",
    "hybrid_layer_pattern",
    "hybrid_override_pattern",
    "layers_block_type",
    "sparse_attention_config",
    "full_attention_interval",  # Qwen3-Next-style linear-attention hybrids (the mamba plugin)
    "attn_layer_period",  # Jamba-style attention/Mamba interleaving (the mamba plugin)
)

PRESET_DIR = Path(__file__).parent / "presets"


@hookimpl
def presets() -> dict[str, str]:
    return {path.stem: str(path) for path in sorted(PRESET_DIR.glob("*.json"))}


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    outer = ConfigReader(config, source)
    reader = outer.text()
    if reader.string("model_type") not in DENSE_MODEL_TYPES and outer.string("model_type") not in DENSE_MODEL_TYPES:
        return None
    if any(reader.has(key) for key in _FOREIGN_MARKERS) or sliding_window_active(reader):
        return None
    num_layers = reader.integer("num_hidden_layers")
    num_heads = reader.integer("num_attention_heads")
    head_dim = reader.optional_integer("head_dim") or derived_head_dim(reader, num_heads)
    v_head_dim = reader.optional_integer("v_head_dim") or head_dim
    kv_heads = next((reader.integer(key) for key in _KV_HEAD_KEYS if reader.has(key)), num_heads)
    layers = [
        LayerSpec(index=i, kind="attention", num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=v_head_dim)
        for i in range(num_layers)
    ]
    return ModelSpec(
        name=source,
        architecture=ARCHITECTURE,
        layers=layers,
        context_len=context_length(reader, _CONTEXT_KEYS),
        dtype=model_dtype(reader),
        num_attention_heads=num_heads,
        model_type=reader.string("model_type") or outer.string("model_type"),
        hf_architectures=outer.string_list("architectures"),
        source=source,
        num_nextn_predict_layers=reader.integer("num_nextn_predict_layers", 0, minimum=0),
        is_multimodal=reader is not outer,
    )


@hookimpl
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    if model.architecture != ARCHITECTURE:
        return None
    start, end = rank_layer_range(model, serving)
    return attention_cell_size(model.layers[start:end], model, serving)


@hookimpl
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    if model.architecture != ARCHITECTURE:
        return None
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    problems = []
    if kv.scale_block is not None:
        dims = {layer.head_dim for layer in model.layers} | {layer.v_head_dim for layer in model.layers}
        bad = sorted(d for d in dims if d % kv.scale_block)
        if bad:
            problems.append(
                f"{option('kv_cache_dtype')} {kv.name} stores one scale per {kv.scale_block} values, but "
                f"{model.name} has "
                f"head dims {bad} that are not multiples of {kv.scale_block}. Use bf16, fp16 or fp8_e4m3."
            )
    return problems


@hookimpl
def build_pool(plan: Plan, device: str) -> Any | None:
    if plan.model.architecture != ARCHITECTURE:
        return None
    from .pool import MHATokenToKVPool

    return MHATokenToKVPool.from_plan(plan, device)


def attention_cell_size(
    layers: tuple[LayerSpec, ...], model: ModelSpec, serving: Serving, pool: str = "kv"
) -> CellSize:
    """Cell size of full-attention layers on this rank (shared with hybrid plugins).

    SGLang charges heads sharded by attention TP only; the pool really stores
    ``kv_heads_per_rank(heads, attn_tp, dcp)`` heads (DCP shards tokens, not heads).
    """
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    e = kv.element_bytes
    sglang = 0
    k_bytes = v_bytes = k_scale = v_scale = 0
    for layer in layers:
        heads = kv_heads_per_rank(layer.num_kv_heads, serving.attn_tp_size)
        stored = kv_heads_per_rank(layer.num_kv_heads, serving.attn_tp_size, serving.dcp_size)
        d, dv = layer.head_dim, layer.v_head_dim
        if kv.is_fp4:
            # Packed data (two values per byte) + one uint8 scale per 16 values.
            k_bytes += stored * d // 2
            v_bytes += stored * dv // 2
            k_scale += stored * d // 16
            v_scale += stored * dv // 16
        else:
            sglang += heads * (d + dv) * e
            k_bytes += stored * d * e
            v_bytes += stored * dv * e
            if kv.scale_block:  # mxfp8: one e8m0 scale per 32 values, which SGLang's estimate omits
                k_scale += stored * (d // kv.scale_block)
                v_scale += stored * (dv // kv.scale_block)
    if kv.is_fp4:
        # SGLang applies the fp4 formula to the whole cell, not layer by layer.
        sglang = _sglang_fp4_cell(layers, serving, e)
    parts = [CellPart("k", k_bytes, pool), CellPart("v", v_bytes, pool)]
    if k_scale or v_scale:
        parts += [CellPart("k_scale", k_scale, pool), CellPart("v_scale", v_scale, pool)]
    return CellSize(parts=parts, sglang_bytes_per_token=max(sglang, 1), num_layers=len(layers))


def _sglang_fp4_cell(layers: tuple[LayerSpec, ...], serving: Serving, e: int) -> int:
    if not layers:
        return 0
    first = layers[0]
    n = kv_heads_per_rank(first.num_kv_heads, serving.attn_tp_size)
    num = len(layers)
    cell = n * (first.head_dim + first.v_head_dim) * num * e
    return cell // 2 + (n * first.head_dim * num * 2 * e) // 16


def sliding_window_active(reader: ConfigReader) -> bool:
    """A ``sliding_window`` counts unless ``use_sliding_window`` is false (Qwen2-style inert field).

    The swa plugin claims exactly the configs this says slide, so it uses this test too.
    """
    return reader.has("sliding_window") and reader.boolean("use_sliding_window", True)


def derived_head_dim(reader: ConfigReader, num_heads: int) -> int:
    """``hidden_size / num_attention_heads`` when a config states no ``head_dim`` (transformers' default)."""
    hidden = reader.integer("hidden_size")
    if hidden % num_heads:
        raise reader.error(
            "head_dim",
            f"is missing and hidden_size {hidden} is not divisible by num_attention_heads {num_heads}",
            "Add head_dim to the config.",
        )
    return hidden // num_heads
