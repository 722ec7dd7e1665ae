"""From a parsed model to vLLM's per-worker layer specs: the ``vllm_kv_cache_specs`` hook, split over PP stages.

The architecture plugins know what vLLM's model classes build per layer and answer the hook; this module only
asks, places each layer on its pipeline stage (``get_pp_indices``) and supplies the shared vLLM arithmetic the
answers need lives in the public :mod:`kvpools_core.parts.vllm.layers`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.parts.vllm.layers import (
    DEFAULT_BLOCK_SIZE,
    INDEXER_QUANT_BLOCK,
    backend_block_size,
    indexer_kv_cache_spec,
    kv_element_bytes,
    kv_heads_per_rank,
    latent_kv_cache_spec,
    layer_index,
    pp_layer_ranges,
)
from kvpools_core.parts.vllm.specs import KVCacheSpec

if TYPE_CHECKING:
    from kvpools_core.registry import Registry
    from kvpools_core.values import ModelSpec, Serving


def worker_kv_cache_specs(
    model: ModelSpec, serving: Serving, registry: Registry, block_size: int = DEFAULT_BLOCK_SIZE
) -> list[dict[str, KVCacheSpec]]:
    """Each pipeline stage's layer specs (one TP rank each), as ``get_kv_cache_configs`` receives them."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ConfigError(f"--block-size must be a positive integer, got {block_size!r}.")
    specs, _ = registry.call_first(
        "vllm_kv_cache_specs", "the vLLM layer specs", model=model, serving=serving, block_size=block_size
    )
    ranges = pp_layer_ranges(model.num_layers, serving.pp_size, serving.pp_layer_partition)
    workers: list[dict[str, KVCacheSpec]] = [{} for _ in ranges]
    for name, spec in specs.items():
        index = layer_index(name)
        if index is not None and index >= model.num_layers:
            # a decoder layer's second cache, named num_layers + i (Falcon-H1's SSM branch, falcon_h1.py L343-345)
            index -= model.num_layers
        stage = next((rank for rank, layers in enumerate(ranges) if index in layers), None)
        if stage is None:
            raise UnsupportedCombinationError(f"vLLM layer {name!r} is outside the model's {model.num_layers} layers.")
        workers[stage][name] = spec
    return workers


__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "INDEXER_QUANT_BLOCK",
    "backend_block_size",
    "indexer_kv_cache_spec",
    "kv_element_bytes",
    "kv_heads_per_rank",
    "latent_kv_cache_spec",
    "layer_index",
    "worker_kv_cache_specs",
]
