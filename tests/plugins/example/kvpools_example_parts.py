"""A toy hybrid architecture and a toy platform, composed from kvpools' public parts library alone.

``toy-hybrid`` models interleave full-attention layers, which keep K and V
for every token, with recurrent layers, which keep a fixed-size state per
running request.  Nothing here computes a byte of K/V: the attention layers'
cost is :func:`~kvpools_core.parts.attention_cell_size` (KV dtype scales, TP
and DCP head sharding included), the state is a cell part paid per request
(``unit="request"``, which the core's default sizing gives one pool of
``requests + 1`` rows), and the pool is the core's ``MHATokenToKVPool`` for
the attention layers plus one state buffer allocated through the same
platform layout.

``toy-npu`` is a platform that carves every store's buffers layer-major (one
tensor per role, per-layer views: SGLang's Ascend pools' memory), by answering
the ``buffer_layout`` hook for its own plans and declining the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpools_core import CellPart, CellSize, LayerSpec, ModelSpec, Plan, Serving, for_architecture, hookimpl
from kvpools_core.config import ConfigReader, context_length, model_dtype
from kvpools_core.dtypes import resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.parallel import rank_layer_range
from kvpools_core.parts import attention_cell_size, scale_block_problems

ARCHITECTURE = "toy-hybrid"
ATTENTION = "attention"
RECURRENT = "recurrent"
STATE_POOL = "toy_state"
PLATFORM = "toy-npu"


@hookimpl
def platforms() -> dict[str, str]:
    return {PLATFORM: "a toy accelerator whose pools are carved layer-major (the example distribution)"}


@hookimpl(tryfirst=True)
def buffer_layout(plan: Plan, device: str) -> Any | None:
    if plan.serving.platform != PLATFORM:
        return None  # not ours: the next platform, or the core's per-layer default, answers
    from kvpools_core.pools.layout import LAYER_MAJOR

    return LAYER_MAJOR


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    reader = ConfigReader(config, source)
    if reader.string("model_type") != ARCHITECTURE:
        return None
    every = reader.integer("attention_every")  # layer i is attention when (i + 1) % every == 0
    heads = reader.integer("num_attention_heads")
    attention = {
        "num_kv_heads": reader.integer("num_key_value_heads", heads),
        "head_dim": reader.integer("head_dim"),
        "v_head_dim": reader.integer("head_dim"),
    }
    state = {"state_bytes": reader.integer("state_bytes")}
    layers = [
        LayerSpec(index=i, kind=ATTENTION, **attention)
        if (i + 1) % every == 0
        else LayerSpec(index=i, kind=RECURRENT, params=state)
        for i in range(reader.integer("num_hidden_layers"))
    ]
    return ModelSpec(
        name=source,
        architecture=ARCHITECTURE,
        layers=layers,
        context_len=context_length(reader, ("max_position_embeddings",)),
        dtype=model_dtype(reader),
        num_attention_heads=heads,
        source=source,
    )


@hookimpl
@for_architecture(ARCHITECTURE)
def validate(model: ModelSpec, serving: Serving) -> list[str]:
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    head_dims = [layer.head_dim for layer in model.layers if layer.kind == ATTENTION]
    problems = scale_block_problems(head_dims, kv, model.name)
    if serving.speculative:
        problems.append(f"{model.name} has no draft model: drop {option('speculative_algorithm')}.")
    return problems


@hookimpl
@for_architecture(ARCHITECTURE)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize:
    start, end = rank_layer_range(model, serving)
    stage = model.layers[start:end]
    attention = attention_cell_size(tuple(layer for layer in stage if layer.kind == ATTENTION), model, serving)
    state = sum(layer.params["state_bytes"] for layer in stage if layer.kind == RECURRENT)
    return CellSize(
        parts=[*attention.parts, CellPart("state", state, STATE_POOL, unit="request")],
        sglang_bytes_per_token=attention.sglang_bytes_per_token,
        num_layers=attention.num_layers,
    )


@hookimpl
@for_architecture(ARCHITECTURE)
def build_pool(plan: Plan, device: str, layout: Any) -> Any:
    return ToyHybridPool.from_plan(plan, device, layout)


class ToyHybridPool:
    """K/V of this stage's attention layers (the core's store) and the recurrent layers' per-request state."""

    def __init__(self, kv: Any, attention_ids: list[int], state: Mapping[int, Any]) -> None:
        self.kv = kv  # the core's MHATokenToKVPool over the attention layers, by local index 0..n-1
        self._local = {layer_id: i for i, layer_id in enumerate(attention_ids)}
        self.state = dict(state)  # recurrent layer id → its (requests + 1, state_bytes) uint8 buffer

    @classmethod
    def from_plan(cls, plan: Plan, device: str, layout: Any) -> ToyHybridPool:
        import torch

        from kvpools_core.pools import MHATokenToKVPool, check_planned_bytes
        from kvpools_core.pools.layout import PER_LAYER, BufferRequest, allocate_by_layer

        start, end = rank_layer_range(plan.model, plan.serving)
        attention = [layer for layer in plan.model.layers[start:end] if layer.kind == ATTENTION]
        recurrent = [layer for layer in plan.model.layers[start:end] if layer.kind == RECURRENT]
        layout = layout or PER_LAYER
        kv = MHATokenToKVPool.from_layers(plan, attention, device, start_layer=0, layout=layout)
        state: Mapping[int, Any] = {}
        if recurrent:
            pool = plan.pool(STATE_POOL)
            request = BufferRequest(
                pool=STATE_POOL,
                role="state",
                rows=pool.slots + pool.padding_slots,
                page_size=1,
                layers=[layer.index for layer in recurrent],
                row_shape=(recurrent[0].params["state_bytes"],),
                dtype=torch.uint8,
                device=device,
            )
            check_planned_bytes(STATE_POOL, request.nbytes, pool.bytes, request.describe())
            state = allocate_by_layer(layout, [request])["state"]  # the platform's carving, checked
        return cls(kv, [layer.index for layer in attention], state)

    def nbytes_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name: the attention K/V (``kv``) and the state (``toy_state``)."""
        measured = dict(self.kv.nbytes_by_pool())
        if self.state:
            measured[STATE_POOL] = sum(t.numel() * t.element_size() for t in self.state.values())
        return measured

    @property
    def nbytes(self) -> int:
        return sum(self.nbytes_by_pool().values())

    def get_kv_buffer(self, layer_id: int) -> Any:
        """K and V of an attention layer (global id)."""
        return self.kv.get_kv_buffer(self._local[layer_id])

    def get_state(self, layer_id: int) -> Any:
        """The ``(requests + 1, state_bytes)`` state of a recurrent layer (global id); row 0 pads."""
        return self.state[layer_id]
