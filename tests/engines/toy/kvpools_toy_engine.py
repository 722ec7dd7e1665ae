"""A toy engine accounting, shipped as its own distribution: a third party adds ``--accounting toy`` to kvpools
through the ``kvpools`` entry-point group, with no edit of the core or of any architecture plugin.

The arithmetic is LMDeploy-like, not LMDeploy's: the KV cache takes ``cache_max_entry_count`` (0.8) of the memory
it is given, in blocks of ``block_size`` (64) tokens; one token of one layer costs K and V of the rank's KV heads
(``ceil(heads / tp)``) x ``head_dim`` x the KV element size.  The engine asks for its per-layer values through the
core's generic ``engine_layer_specs`` hook under its own name, and this distribution answers it for full-attention
layers (``kind == "attention"``) itself: any architecture plugin may answer ``engine="toy"`` the same way.

It imports only what a plugin may (``kvpools_core.PUBLIC_MODULES``) plus the engine value
(``kvpools_core.values.engine``, public as ``kvpools_core.values.*``); it asks the registry it is handed, or
the default one (``kvpools_core.registry.get_registry``), as the built-in engines do.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from kvpools_core import hookimpl
from kvpools_core.errors import ConfigError, UnsupportedCombinationError
from kvpools_core.units import parse_bytes
from kvpools_core.values import ModelSpec, Serving
from kvpools_core.values.engine import Engine, EngineCapacity

NAME = "toy"
CACHE_MAX_ENTRY_COUNT = 0.8
BLOCK_SIZE = 64
KV_BYTES = {"auto": None, "bf16": 2, "fp16": 2, "fp8_e4m3": 1}


@attrs.frozen(kw_only=True)
class ToyLayer:
    """One cached layer as the toy engine sizes it."""

    index: int
    num_kv_heads: int
    head_dim: int


@attrs.frozen(kw_only=True)
class ToyPlan:
    """The toy engine's answer for one rank."""

    model: str
    memory: int
    budget_bytes: int
    block_size: int
    bytes_per_token: int
    num_blocks: int

    @property
    def max_tokens(self) -> int:
        return self.num_blocks * self.block_size


@hookimpl
def engine_accountings() -> Sequence[Engine]:
    return [ENGINE]


@hookimpl
def engine_layer_specs(engine: str, model: ModelSpec, serving: Serving) -> tuple[ToyLayer, ...] | None:
    """The toy's per-layer values for a model whose every layer is full attention; None otherwise (another plugin
    may answer, or the engine refuses the model)."""
    if engine != NAME or not all(layer.kind == "attention" for layer in model.layers):
        return None
    return tuple(
        ToyLayer(index=layer.index, num_kv_heads=layer.num_kv_heads, head_dim=layer.head_dim) for layer in model.layers
    )


def plan(
    model: ModelSpec,
    serving: Serving | None = None,
    *,
    memory: int | str,
    block_size: int = BLOCK_SIZE,
    registry: Any = None,
) -> ToyPlan:
    """How many ``block_size``-token blocks ``cache_max_entry_count`` of ``memory`` holds for ``model``."""
    if registry is None:
        from kvpools_core.registry import get_registry  # the caller's registry, else the default one

        registry = get_registry()
    serving = serving or Serving(accounting=NAME)
    if not isinstance(model, ModelSpec):
        raise ConfigError(f"the toy engine plans a parsed model (a ModelSpec), got {type(model).__name__}.")
    if serving.kv_cache_dtype not in KV_BYTES:
        raise UnsupportedCombinationError(
            f"kvpools-toy-engine does not model --kv-cache-dtype {serving.kv_cache_dtype} yet: it models "
            f"{', '.join(KV_BYTES)}."
        )
    if block_size <= 0:
        raise ConfigError(f"block_size must be positive, got {block_size}.")
    layers, _ = registry.call("engine_layer_specs", engine=NAME, model=model, serving=serving)
    if layers is None:
        raise UnsupportedCombinationError(
            f"kvpools-toy-engine does not model {model.name} ({model.architecture!r}) yet: it sizes models whose "
            "every layer is full attention."
        )
    width = KV_BYTES[serving.kv_cache_dtype] or (4 if model.dtype == "float32" else 2)
    per_token = sum(2 * math.ceil(layer.num_kv_heads / serving.tp_size) * layer.head_dim * width for layer in layers)
    given = parse_bytes(memory, "--memory")
    budget = int(given * CACHE_MAX_ENTRY_COUNT)
    blocks = budget // (per_token * block_size)
    if blocks < 1:
        raise ConfigError(
            f"--memory {given:,} B holds no {block_size}-token block of {model.name} for the toy engine "
            f"({per_token * block_size:,} B per block at cache_max_entry_count {CACHE_MAX_ENTRY_COUNT}): give it more."
        )
    return ToyPlan(
        model=model.name,
        memory=given,
        budget_bytes=budget,
        block_size=block_size,
        bytes_per_token=per_token,
        num_blocks=blocks,
    )


def capacity(result: ToyPlan) -> EngineCapacity:
    return EngineCapacity(
        engine=NAME,
        accounting=NAME,
        budget_bytes=result.budget_bytes,
        kv_bytes=result.num_blocks * result.block_size * result.bytes_per_token,
        max_tokens=result.max_tokens,
    )


ENGINE = Engine(
    name=NAME,
    version="0.1",
    accountings=(NAME,),
    plan=plan,
    capacity=capacity,
    summary="A toy LMDeploy-like accounting: 64-token blocks over 0.8 of the memory given.",
    docs="tests/engines/toy/kvpools_toy_engine.py",
    distribution="kvpools-toy-engine",
)
