"""MLA latent rows: how one MLA layer stores one token, and what SGLang charges for it.

An MLA layer caches one row per token shared by every attention head (so TP
never shards it): the ``kv_lora_rank`` latent and the ``qk_rope_head_dim``
rope key.  The row's bytes depend on the KV dtype:

* bf16 / fp16 / fp32, fp8 (raw): ``(R + r) × element`` — SGLang's
  ``MLATokenToKVPool``;
* fp4: ``(R + r) / 2`` packed bytes plus one scale byte per 16 values —
  ``MLATokenToKVPoolFP4``;
* DSA's packed fp8 row (FlashMLA's layout, ``calculate_mla_kv_cache_dim``):
  the latent in fp8, one fp32 scale per 128 latent values, the rope in bf16 —
  ``R + R/128 × 4 + r × 2`` bytes (656 for DeepSeek-V3.2).

SGLang's configurator (``DefaultPoolConfigurator._compute_cell_size``) always
charges ``(R + r) × element`` per layer (fp4: halved plus the scale term),
even for the packed row: :func:`sglang_latent_cell` keeps that figure beside
the bytes really stored.  Every architecture whose layers cache a latent (MLA,
DSA, hybrid MLA-SWA, MLA-based linear hybrids, DeepSeek-V4) composes these;
the store that allocates them is :class:`kvpools_core.pools.mla.MLATokenToKVPool`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from kvpools_core.config import ConfigReader, context_length, model_dtype
from kvpools_core.dtypes import KVDtype, resolve_kv_dtype
from kvpools_core.options import option
from kvpools_core.values import CellPart, CellSize, LayerSpec, ModelSpec, Serving

__all__ = [
    "FP4_BLOCK",
    "FP8_BLOCK",
    "MLA_KERNEL",
    "LatentRow",
    "MLADims",
    "has_mla_latent",
    "latent_cell_size",
    "latent_dtype_problems",
    "latent_model_spec",
    "mla_problems",
    "model_dims",
    "platform_problems",
    "sglang_latent_cell",
]


@attrs.frozen
class MLADims:
    """The latent one MLA layer caches per token: ``kv_lora_rank`` values plus ``qk_rope_head_dim`` rope values."""

    kv_lora_rank: int
    qk_rope_head_dim: int

    @property
    def kv_cache_dim(self) -> int:
        """SGLang's default MLA row: ``kv_lora_rank + qk_rope_head_dim`` elements."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @classmethod
    def of(cls, layer: LayerSpec) -> MLADims:
        """The dims a latent layer carries in its ``params`` (as :func:`latent_model_spec` writes them)."""
        return cls(layer.params["kv_lora_rank"], layer.params["qk_rope_head_dim"])


FP8_BLOCK = 128
"""Latent values sharing one fp32 scale in DSA's packed fp8 row (``DSATokenToKVPool.quant_block_size``)."""
FP4_BLOCK = 16
"""Values sharing one scale byte in the fp4 row."""
SCALE_BYTES = 4  # fp32 scales of the packed fp8 row
ROPE_BYTES = 2  # the packed row keeps the rope in bf16 (DSATokenToKVPool.rope_storage_dtype)


@attrs.frozen
class LatentRow:
    """The bytes one token takes in one MLA layer, by part, for one KV dtype and layout."""

    dims: MLADims
    kv: KVDtype
    packed_fp8: bool = False

    def __attrs_post_init__(self) -> None:
        if self.packed_fp8 and self.kv.name != "fp8_e4m3":
            raise ValueError(f"the packed fp8 MLA row stores fp8_e4m3, not {self.kv.name}")

    @property
    def kv_cache_dim(self) -> int:
        """SGLang's ``kv_cache_dim``: the row length in KV-dtype elements (bytes for the packed row)."""
        if self.packed_fp8:
            return self.dims.kv_lora_rank + self.num_scales * SCALE_BYTES + self.dims.qk_rope_head_dim * ROPE_BYTES
        return self.dims.kv_cache_dim

    @property
    def num_scales(self) -> int:
        """Scales per row: fp32 per 128 latent values (packed fp8), bytes per 16 values (fp4), else 0."""
        if self.packed_fp8:
            return self.dims.kv_lora_rank // FP8_BLOCK
        if self.kv.is_fp4:
            return self.dims.kv_cache_dim // FP4_BLOCK
        return 0

    def parts(self) -> tuple[tuple[str, int], ...]:
        """``(name, bytes)`` of one row: the latent, its scales (if any) and the rope key."""
        rank, rope = self.dims.kv_lora_rank, self.dims.qk_rope_head_dim
        if self.packed_fp8:
            return ("latent", rank), ("latent_scale", self.num_scales * SCALE_BYTES), ("rope", rope * ROPE_BYTES)
        if self.kv.is_fp4:  # one packed row of (R + r) / 2 bytes, then its scales
            packed = self.dims.kv_cache_dim // 2
            return ("latent", packed - rope // 2), ("rope", rope // 2), ("scale", self.num_scales)
        e = self.kv.element_bytes
        return ("latent", rank * e), ("rope", rope * e)

    @property
    def row_bytes(self) -> int:
        return sum(size for _name, size in self.parts())

    def cell_parts(self, num_layers: int, pool: str = "kv", extra_slots: int = 0) -> list[CellPart]:
        """The row's parts over ``num_layers`` layers, as cell parts of ``pool``."""
        return [CellPart(name, size * num_layers, pool, extra_slots) for name, size in self.parts()]


def sglang_latent_cell(dims: MLADims, kv: KVDtype, num_layers: int) -> int:
    """SGLang's MLA cell over ``num_layers`` layers: ``(R + r) × L × e``; fp4 halves it and adds the scale term."""
    cell = dims.kv_cache_dim * num_layers * kv.element_bytes
    if kv.is_fp4:
        cell = cell // 2 + dims.kv_cache_dim // FP4_BLOCK * num_layers * kv.element_bytes
    return cell


def latent_dtype_problems(dims: MLADims, kv: KVDtype, model_name: str) -> list[str]:
    """KV dtypes an MLA row cannot hold for these dims, with the supported alternatives."""
    if kv.name == "mxfp8":
        return [
            f"{option('kv_cache_dtype')} mxfp8 is not supported for MLA models ({model_name}): SGLang's MLA pools "
            f"have no "
            f"mxfp8 layout. Use auto, bf16, fp16, fp8_e4m3, fp8_e5m2 or fp4_mx_block16."
        ]
    if kv.is_fp4 and dims.kv_cache_dim % FP4_BLOCK:
        return [
            f"{option('kv_cache_dtype')} {kv.name} stores one scale per {FP4_BLOCK} values, but {model_name}'s MLA row "
            f"(kv_lora_rank + qk_rope_head_dim = {dims.kv_cache_dim}) is not a multiple of {FP4_BLOCK}. "
            f"Use bf16, fp16 or fp8_e4m3."
        ]
    return []


MLA_KERNEL = "mla"
"""The kernel family of MLA latent rows, as platforms' :class:`~kvpools_core.values.KVDtypeRule` name it."""


def platform_problems(kv: KVDtype, serving: Serving, model_name: str) -> list[str]:
    """What the platform's kernels refuse to store in an MLA latent row (``serving.traits``' KV dtype rules).

    SGLang's CPU backend rejects fp8 MLA (and DSA) KV before allocating
    anything; the ``cpu`` plugin states it as a rule about ``"mla"`` kernels.
    """
    return [
        f"{model_name} caches an MLA latent. {problem}"
        for problem in serving.traits.kv_dtype_problems(kv.name, kernel=MLA_KERNEL)
    ]


def model_dims(model: ModelSpec) -> MLADims:
    """The latent dims of an MLA-family model (one per model, as SGLang's ``ModelConfig``): its first latent
    layer's (a linear-attention hybrid's first layers may keep no latent)."""
    return MLADims.of(next((layer for layer in model.layers if "kv_lora_rank" in layer.params), model.layers[0]))


def latent_cell_size(row: LatentRow, num_layers: int, pool: str = "kv") -> CellSize:
    """One latent row per layer over ``num_layers`` layers on this rank (TP never shards it), and SGLang's charge."""
    sglang = sglang_latent_cell(row.dims, row.kv, num_layers)
    return CellSize(
        parts=row.cell_parts(num_layers, pool), sglang_bytes_per_token=max(sglang, 1), num_layers=num_layers
    )


def mla_problems(model: ModelSpec, serving: Serving) -> list[str]:
    """What SGLang's MLA pools cannot hold for this model's latent dims under these serving options."""
    kv = resolve_kv_dtype(serving.kv_cache_dtype, model.dtype)
    return latent_dtype_problems(model_dims(model), kv, model.name) + platform_problems(kv, serving, model.name)


# ---------------------------------------------------------------------------
# reading MLA-family configs
# ---------------------------------------------------------------------------

# SGLang's ModelConfig.get_context_length order.
_CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length", "max_position_embeddings")
# Hybrid layouts (sliding-window or recurrent layers beside MLA) belong to hybrid plugins
# (Kimi-Linear's ``linear_attn_config`` names its KDA layers).
_HYBRID_MARKERS = (
    "swa_kv_lora_rank",
    "hybrid_layer_pattern",
    "hybrid_override_pattern",
    "layers_block_type",
    "linear_attn_config",
)
_HYBRID_MODEL_TYPES = frozenset({"kimi_linear"})


def has_mla_latent(reader: ConfigReader) -> bool:
    """An MLA latent (``kv_lora_rank`` and ``qk_rope_head_dim``) and no hybrid layout: every layer caches a latent."""
    if not (reader.has("kv_lora_rank") and reader.has("qk_rope_head_dim")):
        return False
    if any(reader.has(key) for key in _HYBRID_MARKERS) or reader.string("model_type") in _HYBRID_MODEL_TYPES:
        return False
    return all(kind == "full_attention" for kind in reader.string_list("layer_types"))


def latent_model_spec(
    config: Mapping[str, Any],
    source: str,
    *,
    architecture: str,
    kind: str,
    layer_params: Mapping[str, Any] | None = None,
) -> ModelSpec:
    """The ``ModelSpec`` of an MLA-family config: every layer caches one latent row of ``kind``.

    ``LayerSpec.head_dim`` is the key row (latent + rope) and ``v_head_dim``
    the value view (latent), as SGLang's ``get_key_buffer`` /
    ``get_value_buffer``; the latent dims are in ``params``.
    """
    outer = ConfigReader(config, source)
    reader = outer.text()
    dims = MLADims(reader.integer("kv_lora_rank"), reader.integer("qk_rope_head_dim"))
    num_layers = reader.integer("num_hidden_layers")
    params = {"kv_lora_rank": dims.kv_lora_rank, "qk_rope_head_dim": dims.qk_rope_head_dim, **(layer_params or {})}
    layers = [
        LayerSpec(
            index=i, kind=kind, num_kv_heads=1, head_dim=dims.kv_cache_dim, v_head_dim=dims.kv_lora_rank, params=params
        )
        for i in range(num_layers)
    ]
    # Attention dims the pools do not store but reports show (absent ones are left out).
    attention = {
        key: value
        for key in ("qk_nope_head_dim", "v_head_dim", "q_lora_rank")
        if (value := reader.optional_integer(key)) is not None
    }
    return ModelSpec(
        name=source,
        architecture=architecture,
        layers=layers,
        context_len=context_length(reader, _CONTEXT_KEYS),
        dtype=model_dtype(reader),
        num_attention_heads=reader.integer("num_attention_heads", 0, minimum=0),
        model_type=reader.string("model_type") or outer.string("model_type"),
        hf_architectures=outer.string_list("architectures"),
        source=source,
        num_nextn_predict_layers=reader.integer("num_nextn_predict_layers", 0, minimum=0),
        is_multimodal=reader is not outer,
        params=attention,
    )
