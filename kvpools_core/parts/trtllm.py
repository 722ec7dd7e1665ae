"""TensorRT-LLM's per-layer value, and how an attention layer becomes one: what an architecture plugin answers
the ``engine_layer_specs`` hook with for ``engine="trtllm"`` (``--accounting trtllm``).

TensorRT-LLM 1.2's ``KVCacheManager`` (``tensorrt_llm/_torch/pyexecutor/resource_manager.py``) sizes each
attention layer from its KV heads, one ``head_dim`` and whether it keeps K and V (``CacheTypeCpp.SELF``) or K
only (``SELFKONLY``, MLA's latent row); :class:`TrtllmLayer` is that. :func:`trtllm_layer` turns a parsed layer of
the kinds the manager sizes (full and sliding attention, MLA) into one and refuses the rest with the reason, so an
architecture plugin (built-in or third-party) answers the hook in one line.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs

from kvpools_core.errors import UnsupportedCombinationError
from kvpools_core.values import LayerSpec, ModelSpec

ENGINE = "trtllm"
"""The engine name the ``engine_layer_specs`` hook is asked with for these values."""


@attrs.frozen(kw_only=True)
class TrtllmLayer:
    """One attention layer as ``KVCacheManager`` sizes it: KV heads (before TP), head size, K-and-V or K only,
    and the model's own sliding window (None: full attention)."""

    index: int
    num_kv_heads: int
    head_dim: int
    kv_factor: int
    sliding_window: int | None = None


def trtllm_layer(model: ModelSpec, layer: LayerSpec) -> TrtllmLayer:
    """``layer`` as TensorRT-LLM's manager sizes it.

    MHA/GQA (``attention``, ``sliding_attention``) layers keep K and V (``kv_factor`` 2, ``head_dim``, the
    sliding window of a sliding layer); MLA layers keep the latent row only (``kv_factor`` 1, one head of
    ``kv_lora_rank + qk_rope_head_dim``).  Refused, with the reason: other kinds, and K and V of different head
    sizes (the manager takes one ``head_dim``).
    """
    if layer.kind == "mla":
        rank = int(layer.params["kv_lora_rank"])
        rope = int(layer.params["qk_rope_head_dim"])
        return TrtllmLayer(index=layer.index, num_kv_heads=1, head_dim=rank + rope, kv_factor=1)
    if layer.kind not in ("attention", "sliding_attention"):
        raise UnsupportedCombinationError(
            f"kvpools does not model {model.name}'s layer {layer.index} of kind {layer.kind!r} for "
            "--accounting trtllm yet."
        )
    if layer.v_head_dim not in (0, layer.head_dim):
        raise UnsupportedCombinationError(
            f"kvpools does not model {model.name}'s different K and V head sizes ({layer.head_dim} and "
            f"{layer.v_head_dim}) for --accounting trtllm yet: TensorRT-LLM's manager takes one head_dim."
        )
    return TrtllmLayer(
        index=layer.index,
        num_kv_heads=layer.num_kv_heads,
        head_dim=layer.head_dim,
        kv_factor=2,
        sliding_window=layer.sliding_window if layer.kind == "sliding_attention" else None,
    )


def trtllm_layers_of(model: ModelSpec, kinds: Collection[str]) -> tuple[TrtllmLayer, ...]:
    """Every layer of ``model`` as :func:`trtllm_layer` makes it, refusing a layer whose kind is not one of
    ``kinds`` (the kinds the answering plugin's models have and TensorRT-LLM's manager sizes)."""
    layers: list[TrtllmLayer] = []
    for layer in model.layers:
        if layer.kind not in kinds:
            raise UnsupportedCombinationError(
                f"kvpools does not model {model.name}'s layer {layer.index} of kind {layer.kind!r} for "
                "--accounting trtllm yet."
            )
        layers.append(trtllm_layer(model, layer))
    return tuple(layers)


def trtllm_refusal(model: ModelSpec, what: str) -> UnsupportedCombinationError:
    """The refusal an architecture plugin raises from ``engine_layer_specs`` for models TensorRT-LLM serves with
    a cache manager kvpools does not reproduce (``what`` names it)."""
    return UnsupportedCombinationError(
        f"kvpools does not model {what} for --accounting trtllm yet ({model.name}, parsed by the "
        f"{model.architecture!r} plugin); use --accounting sglang or vllm."
    )


def layer_values(answer: Sequence[object]) -> tuple[TrtllmLayer, ...]:
    """``answer`` checked to hold only :class:`TrtllmLayer` values (a TypeError naming the first that is not)."""
    for index, item in enumerate(answer):
        if not isinstance(item, TrtllmLayer):
            raise TypeError(f"item {index} is a {type(item).__name__}, not a TrtllmLayer")
    return tuple(answer)  # type: ignore[arg-type]


__all__ = ["ENGINE", "TrtllmLayer", "layer_values", "trtllm_layer", "trtllm_layers_of", "trtllm_refusal"]
