"""Cross-Layer Attention (CLA) for kvpools: the plugin the "write an architecture plugin" tutorial builds.

CLA (Brandon et al. 2024, "Reducing Transformer Key-Value Cache Size with
Cross-Layer Attention") lets groups of ``cla_share_factor`` consecutive layers
share one K/V cache: only the first layer of each group projects K and V, the
others attend to its cache.  A token therefore stores the K/V rows of
``ceil(num_hidden_layers / cla_share_factor)`` layers instead of every layer's.

Everything a token costs is the core's parts library
(:func:`kvpools_core.parts.attention_cell_size`: KV dtype, attention TP and
DCP head sharding), so the core sizes the pools and builds them and their
allocator: this plugin has no ``build_pool``.  Its weights come from the parts
library too (:mod:`kvpools_core.parts.weights`), so ``--gpu``, ``kvpools fit``
and sweeps over GPUs plan CLA models with their own weights.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

# --8<-- [start:names]
from kvpools_core import CellSize, LayerSpec, ModelSpec, Serving, for_architecture, hookimpl
from kvpools_core.config import LAYERS, ConfigReader, context_length, derived_head_dim, model_dtype
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.parallel import pp_layer_range, rank_layer_range
from kvpools_core.parts import attention_cell_size, scale_block_problems
from kvpools_core.parts.weights import Builder, WeightsConfig, WeightsEstimate, estimate

ARCHITECTURE = "cla"
HF_ARCHITECTURE = "CLAForCausalLM"
KV_LAYER = "attention"
"""The first layer of a share group: it projects K and V and stores them for the whole group."""
SHARING_LAYER = "cla_shared"
"""Any other layer of a group: it attends to the K/V its group's first layer stored, and stores nothing."""
# --8<-- [end:names]

PRESET_DIR = Path(__file__).parent / "presets"


# --8<-- [start:presets]
@hookimpl
def presets() -> dict[str, str]:
    """``kvpools plan cla-1b``: the configs shipped as package data (``pyproject.toml`` declares them)."""
    return {path.stem: str(path) for path in sorted(PRESET_DIR.glob("*.json"))}


# --8<-- [end:presets]


# --8<-- [start:parse]
@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    reader = ConfigReader(config, source)
    if HF_ARCHITECTURE not in reader.string_list("architectures"):
        return None  # not ours: another plugin (or none) claims it
    num_layers = reader.integer("num_hidden_layers")
    num_heads = reader.integer("num_attention_heads")
    kv_heads = reader.integer("num_key_value_heads", num_heads)
    head_dim = reader.optional_integer("head_dim") or derived_head_dim(reader, num_heads)
    factor = reader.integer("cla_share_factor", limit=LAYERS)  # an integer >= 1, or a ConfigError naming it
    if factor > num_layers:
        raise reader.error(
            "cla_share_factor",
            f"is {factor}, more than the {num_layers} layers (num_hidden_layers) it groups",
            f"Use a share factor from 1 to {num_layers}.",
        )
    layers = [
        LayerSpec(index=i, kind=KV_LAYER, num_kv_heads=kv_heads, head_dim=head_dim, v_head_dim=head_dim)
        if i % factor == 0
        else LayerSpec(index=i, kind=SHARING_LAYER, params={"kv_layer": i - i % factor})
        for i in range(num_layers)
    ]
    return ModelSpec(
        name=source,
        architecture=ARCHITECTURE,
        layers=layers,
        context_len=context_length(reader, ("max_position_embeddings",)),
        dtype=model_dtype(reader),
        num_attention_heads=num_heads,
        model_type=reader.string("model_type"),
        hf_architectures=reader.string_list("architectures"),
        source=source,
        params={"cla_share_factor": factor},
    )


# --8<-- [end:parse]


# --8<-- [start:cell]
@hookimpl
@for_architecture(ARCHITECTURE)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize:
    start, end = rank_layer_range(model, serving)  # this pipeline stage's layers
    kv_layers = tuple(layer for layer in model.layers[start:end] if layer.kind == KV_LAYER)
    return attention_cell_size(kv_layers, model, serving)  # K and V of this rank's KV heads, in the kv dtype


# --8<-- [end:cell]


# --8<-- [start:validate]
@hookimpl
@for_architecture(ARCHITECTURE)
def validate(model: ModelSpec, serving: Serving) -> list[str]:
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    head_dims = [layer.head_dim for layer in model.layers if layer.kind == KV_LAYER]
    problems = scale_block_problems(head_dims, kv, model.name)
    factor = model.params["cla_share_factor"]
    starts = [
        pp_layer_range(model.num_layers, rank, serving.pp_size, serving.pp_layer_partition)[0]
        for rank in range(serving.pp_size)
    ]
    split = [start for start in starts if start % factor]
    if split:
        problems.append(
            f"{option('pp_size')} {serving.pp_size} starts pipeline stages at layers {split} of {model.name}, inside "
            f"groups of {factor} layers that share one K/V cache: a stage cannot read another stage's cache. Choose "
            f"{option('pp_layer_partition')} with every stage a multiple of {factor} layers, or a smaller "
            f"{option('pp_size')}."
        )
    return problems


# --8<-- [end:validate]


# --8<-- [start:weights]
@hookimpl
def estimate_weights(config: WeightsConfig, serving: Serving, ep_size: int) -> WeightsEstimate | None:
    """The weights of a CLA model: a Llama-shaped decoder whose sharing layers have no K/V projections."""
    if HF_ARCHITECTURE not in config.outer.string_list("architectures"):
        return None  # not ours
    return estimate(config, serving, _cla_decoder, ep_size=ep_size)


def _cla_decoder(builder: Builder) -> list[str]:
    reader = builder.reader
    heads = reader.integer("num_attention_heads")
    head_dim = reader.optional_integer("head_dim") or derived_head_dim(reader, heads)
    factor = reader.integer("cla_share_factor", limit=LAYERS)
    for layer in range(reader.integer("num_hidden_layers")):
        attention = f"model.layers.{layer}.self_attn"
        if layer % factor == 0:  # the group's first layer projects K and V (q/k/v column-, o row-parallel)
            builder.gqa_attention(attention, layer, head_dim, bias=False, out_bias=False)
        else:  # a sharing layer projects queries and the output only
            builder.column("attention", f"{attention}.q_proj", heads * head_dim, builder.hidden, layer)
            builder.row("attention", f"{attention}.o_proj", builder.hidden, heads * head_dim, layer)
        builder.norm(f"model.layers.{layer}.input_layernorm", layer)
        builder.norm(f"model.layers.{layer}.post_attention_layernorm", layer)
        builder.dense_mlp(f"model.layers.{layer}.mlp", layer, reader.integer("intermediate_size"))
    builder.embeddings(tied=reader.boolean("tie_word_embeddings", False))
    return []  # notes: what the estimate leaves out (nothing here)


# --8<-- [end:weights]
