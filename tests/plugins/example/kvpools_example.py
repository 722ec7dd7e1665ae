"""A toy architecture: one latent vector of ``latent_dim`` bytes per token per layer.

It shows the whole contract of an out-of-tree architecture plugin: claim the
configs you recognise (``model_type: toy-latent``), describe their layers,
and answer ``estimate_cell_size`` for them; the core sizes the pools.  It also
declares one ``--plugin-option`` (``toy.latent_bytes``), as a plugin with knobs
of its own does: undeclared keys are refused by the core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpools_core import CellPart, CellSize, LayerSpec, ModelSpec, Serving, hookimpl
from kvpools_core.config import ConfigReader
from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range

MODEL_TYPE = "toy-latent"
LATENT_BYTES = "toy.latent_bytes"


@hookimpl
def plugin_options() -> dict[str, str]:
    return {LATENT_BYTES: "bytes per latent element of toy-latent models (a positive integer; default 1)"}


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    reader = ConfigReader(config, source)
    if reader.string("model_type") != MODEL_TYPE:
        return None
    latent = reader.integer("latent_dim")
    layers = [
        LayerSpec(index=i, kind="toy-latent", params={"latent_dim": latent})
        for i in range(reader.integer("num_hidden_layers"))
    ]
    return ModelSpec(
        name=source,
        architecture="toy",
        layers=layers,
        context_len=reader.integer("max_position_embeddings"),
        dtype="bfloat16",
    )


@hookimpl
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    if model.architecture != "toy":
        return None
    start, end = rank_layer_range(model, serving)
    element = str(serving.plugin_options.get(LATENT_BYTES, "1"))
    if not element.isdigit() or int(element) < 1:
        raise ConfigError(f"{option('plugin_options')} {LATENT_BYTES}={element}: must be a positive integer.")
    per_token = int(element) * sum(layer.params["latent_dim"] for layer in model.layers[start:end])
    notes = []
    if serving.kv_cache_dtype != "auto":  # say so, not ignore it silently (the conformance suite checks)
        notes.append(
            f"{option('kv_cache_dtype')} {serving.kv_cache_dtype} does not apply to toy-latent models: "
            f"{option('plugin_options')} {LATENT_BYTES} sets their element size ({element} B)"
        )
    return CellSize(
        parts=[CellPart("latent", per_token)], sglang_bytes_per_token=per_token, num_layers=end - start, notes=notes
    )
