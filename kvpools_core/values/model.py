"""What the model is: ``LayerSpec`` and ``ModelSpec``, as an architecture plugin parsed them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from kvpools_core.dtypes import MODEL_DTYPES
from kvpools_core.errors import ConfigError
from kvpools_core.values._fields import (
    _str_tuple,
    frozen_mapping,
    non_negative,
    one_of,
    optional_positive,
    positive,
)
from kvpools_core.values.loading import load_value


def _layer_tuple(items: Iterable[LayerSpec]) -> tuple[LayerSpec, ...]:
    return tuple(items)


@attrs.frozen
class LayerSpec:
    """What one decoder layer stores in the KV cache.

    ``kind`` is owned by the architecture plugin that parsed the model
    (``"attention"`` for full MHA/GQA, ``"sliding_attention"``, ``"mla"``,
    ``"mamba"``, ``"none"`` for layers without cache, ...).  ``params`` carries
    the architecture's own per-layer numbers (latent ranks, state shapes).
    """

    index: int = attrs.field(validator=non_negative)
    kind: str
    num_kv_heads: int = attrs.field(default=0, validator=non_negative)
    head_dim: int = attrs.field(default=0, validator=non_negative)
    v_head_dim: int = attrs.field(default=0, validator=non_negative)
    sliding_window: int | None = attrs.field(default=None, validator=optional_positive)
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LayerSpec:
        return load_value(cls, data)


def _optional_int_pair(value: Any) -> tuple[int, int] | None:
    if value is None:
        return None
    first, second = value
    return int(first), int(second)


@attrs.frozen
class ModelSpec:
    """The KV-relevant description of one model, per layer.

    Built by the architecture plugin that recognised the config
    (``architecture`` names that plugin's family).  ``params`` carries
    model-level numbers only that family needs.
    """

    name: str
    architecture: str
    layers: tuple[LayerSpec, ...] = attrs.field(converter=_layer_tuple)
    context_len: int = attrs.field(validator=positive)
    dtype: str = attrs.field(validator=one_of(*MODEL_DTYPES))
    num_attention_heads: int = attrs.field(default=0, validator=non_negative)
    model_type: str = ""
    hf_architectures: tuple[str, ...] = attrs.field(default=(), converter=_str_tuple)
    source: str = ""
    num_nextn_predict_layers: int = attrs.field(default=0, validator=non_negative)
    is_multimodal: bool = False
    params: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)
    vision_tower: tuple[int, int] | None = attrs.field(default=None, converter=_optional_int_pair)
    """``(num_hidden_layers, hidden_size)`` of the checkpoint's ``vision_config`` as SGLang reads them (defaults 24
    and 1024 where the config omits one), which ``adjust_mem_fraction_for_vlm`` sizes a multimodal model's default
    ``mem_fraction_static`` by; ``None``: no ``vision_config`` known.  Read by the core from the config (an HF key,
    no architecture named), not by the plugin."""

    @layers.validator
    def _check_layers(self, _attribute: attrs.Attribute[Any], layers: tuple[LayerSpec, ...]) -> None:
        if not layers:
            raise ConfigError(f"Model {self.name!r} has no layers (num_hidden_layers must be positive).")
        if [layer.index for layer in layers] != list(range(len(layers))):
            raise ConfigError(f"Model {self.name!r}: layer indices must be 0..{len(layers) - 1} in order.")

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def dtype_bytes(self) -> int:
        return MODEL_DTYPES[self.dtype]

    def layer_kinds(self) -> dict[str, int]:
        """How many layers of each kind, in first-seen order."""
        counts: dict[str, int] = {}
        for layer in self.layers:
            counts[layer.kind] = counts.get(layer.kind, 0) + 1
        return counts

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelSpec:
        return load_value(cls, data)


# ---------------------------------------------------------------------------
# serving options (SGLang's server-arg names; environment knobs made typed)
# ---------------------------------------------------------------------------
