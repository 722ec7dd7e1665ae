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
from kvpools_core.parts.indexer import SKIPS_TOPK
from kvpools_core.parts.trtllm_v2 import TrtllmBuffer, TrtllmV2Layer
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
    indexer_bytes: int = 0
    """Bytes per token of a DeepSeek sparse attention layer's indexer K cache (``DSACacheManager``): raw uint8,
    ``index_head_dim + index_head_dim // 128 * 4`` (fp8 keys and one fp32 scale per 128), neither scaled by the KV
    dtype nor sharded by TP; 0 for a layer without one."""
    state: TrtllmMambaState | None = None
    """A Mamba / linear-attention layer's recurrent state (``CppMambaHybridCacheManager``'s unified pool): such a
    layer has no KV (``num_kv_heads``, ``head_dim`` and ``kv_factor`` 0).  A layer with neither KV nor state (a
    hybrid's MLP / MoE block) is outside TensorRT-LLM's ``layer_mask`` and caches nothing."""
    v2: TrtllmV2Layer | None = None
    """The layer's buffers in a ``KVCacheManagerV2`` subclass (:mod:`kvpools_core.parts.trtllm_v2`), for models
    TensorRT-LLM serves with one (DeepSeek-V4's ``DeepseekV4CacheManager``); None for the V1 managers.  When set,
    the engine plans the model with the V2 runtime's pool-ratio solve and ignores ``num_kv_heads``, ``head_dim`` and
    ``kv_factor`` (kept as the manager's constructor takes them)."""

    @property
    def has_kv(self) -> bool:
        """Whether the layer keeps K (and V) per token."""
        return self.kv_factor > 0


@attrs.frozen(kw_only=True)
class TrtllmMambaState:
    """One recurrent layer's state geometry as TensorRT-LLM normalises it (``MambaKVCacheParams``,
    ``_torch/pyexecutor/config_utils.py``): Nemotron-H's ``ssm_state_size``, ``conv_kernel``, ``mamba_num_heads``,
    ``n_groups``, ``mamba_head_dim``; Qwen3-Next's / Qwen3.5's ``linear_key_head_dim``, ``linear_conv_kernel_dim``,
    ``linear_num_value_heads``, ``linear_num_key_heads``, ``linear_value_head_dim`` in the same places.  The
    conv state is kept in the checkpoint's dtype, the SSM state in ``ssm_dtype_bytes``."""

    state_size: int
    conv_kernel: int
    num_heads: int
    n_groups: int
    head_dim: int
    conv_dtype_bytes: int
    ssm_dtype_bytes: int

    def bytes_per_rank(self, tp_size: int) -> int:
        """``MambaKVCacheParams.get_states_bytes_per_layer`` (equal to the manager's ``ssm_bytes + conv_bytes``):
        conv ``(head_dim x num_heads + 2 x n_groups x state_size) // tp`` rows of ``conv_kernel - 1`` in the conv
        dtype, plus SSM ``num_heads // tp x head_dim x state_size`` in the SSM dtype; ``tp`` is 1 with attention
        DP.  Refused, as ``CppMambaHybridCacheManager.__init__`` asserts: heads or conv rows TP does not
        divide."""
        conv_dim = self.head_dim * self.num_heads + 2 * self.n_groups * self.state_size
        if self.num_heads % tp_size or conv_dim % tp_size:
            raise UnsupportedCombinationError(
                f"TensorRT-LLM refuses this TP size: CppMambaHybridCacheManager asserts 'mamba_num_heads must be "
                f"divisible by tp_size' and 'conv_dim must be divisible by tp_size' ({self.num_heads} heads, "
                f"conv_dim {conv_dim}, tp {tp_size}). Choose a --tp-size that divides both."
            )
        conv = conv_dim // tp_size * (self.conv_kernel - 1) * self.conv_dtype_bytes
        ssm = self.num_heads // tp_size * self.head_dim * self.state_size * self.ssm_dtype_bytes
        return conv + ssm


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


INDEXER_QUANT_BLOCK = 128
"""``DSACacheManager``'s ``quant_block_size``: one 4-byte scale per 128 indexer-key elements."""


def indexer_k_bytes(index_head_dim: int) -> int:
    """``_get_indexer_k_cache_bytes_per_token(index_head_dim, 128, use_fp4=False)``
    (``_torch/attention_backend/sparse/dsa/cache_manager.py``): ``index_head_dim`` fp8 bytes plus
    ``index_head_dim // 128 x 4`` scale bytes (132 B for DeepSeek-V3.2's 128)."""
    return index_head_dim + index_head_dim // INDEXER_QUANT_BLOCK * 4


def trtllm_dsa_layers(model: ModelSpec, kind: str) -> tuple[TrtllmLayer, ...]:
    """Every layer of a DeepSeek sparse attention model as ``DSACacheManager`` (a ``KVCacheManager`` with
    ``enable_indexer_k_cache``) sizes it: the MLA latent row (:func:`trtllm_layer` of an MLA layer) plus the
    indexer K cache (:func:`indexer_k_bytes` of the layer's ``index_head_dim``).  ``kind`` is the answering
    plugin's layer kind.  Refused, with the reason: shared-indexer layers (IndexShare: TensorRT-LLM's
    ``is_full_indexer_layer`` is read from its own ``DSAParams``, which kvpools has not reproduced)."""
    layers: list[TrtllmLayer] = []
    for layer in model.layers:
        if layer.kind != kind:
            raise UnsupportedCombinationError(
                f"kvpools does not model {model.name}'s layer {layer.index} of kind {layer.kind!r} for "
                "--accounting trtllm yet."
            )
        if layer.params.get(SKIPS_TOPK) or model.params.get("index_kpool"):
            raise UnsupportedCombinationError(
                f"kvpools does not model {model.name}'s shared-indexer layers (IndexShare / index_kpool) for "
                "--accounting trtllm yet: DSACacheManager gives a layer no indexer K cache when TensorRT-LLM's "
                "DSAParams says it is not a full indexer layer, which kvpools has not reproduced."
            )
        rank = int(layer.params["kv_lora_rank"])
        rope = int(layer.params["qk_rope_head_dim"])
        layers.append(
            TrtllmLayer(
                index=layer.index,
                num_kv_heads=1,
                head_dim=rank + rope,
                kv_factor=1,
                indexer_bytes=indexer_k_bytes(int(layer.params["index_head_dim"])),
            )
        )
    return tuple(layers)


def trtllm_state_layer(index: int, state: TrtllmMambaState) -> TrtllmLayer:
    """A recurrent layer of a hybrid model: no KV, one state slot per request (``state``)."""
    return TrtllmLayer(index=index, num_kv_heads=0, head_dim=0, kv_factor=0, state=state)


def trtllm_uncached_layer(index: int) -> TrtllmLayer:
    """A hybrid's layer that caches nothing (an MLP / MoE block): outside TensorRT-LLM's ``layer_mask``."""
    return TrtllmLayer(index=index, num_kv_heads=0, head_dim=0, kv_factor=0)


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


__all__ = [
    "ENGINE",
    "INDEXER_QUANT_BLOCK",
    "TrtllmBuffer",
    "TrtllmLayer",
    "TrtllmMambaState",
    "TrtllmV2Layer",
    "indexer_k_bytes",
    "layer_values",
    "trtllm_dsa_layers",
    "trtllm_layer",
    "trtllm_layers_of",
    "trtllm_refusal",
    "trtllm_state_layer",
    "trtllm_uncached_layer",
]
