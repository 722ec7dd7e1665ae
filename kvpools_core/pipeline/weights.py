"""Estimate a model's weights (parameters and bytes per rank) from its ``config.json`` alone.

The KV planner's :class:`~kvpools_core.values.ModelSpec` keeps only what the cache needs, so the weights
estimate reads the complete config again.  The core names no architecture: :func:`estimate_weights` loads the
config (a preset names its complete one, :data:`WEIGHTS_CONFIG_KEY`) and asks the ``estimate_weights`` hook; the
architecture plugin that claims the config's ``model_type`` rebuilds its decoder's tensors from the parts library
(:mod:`kvpools_core.parts.weights`: sharding, building blocks, quantisation, the sum).  A ``model_type`` that no
plugin claims is refused, naming the field and the plugins asked, rather than guessed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import attrs

from kvpools_core.config import WEIGHTS_CONFIG_KEY, ConfigReader, describe, read_config_file
from kvpools_core.models import registry_presets, resolve_model_source
from kvpools_core.parts.weights import (
    DTYPE_BYTES,
    FAMILIES,
    WeightsConfig,
    WeightsEstimate,
    exact_weights,
    find_safetensors,
    read_headers,
    vocab_rows_per_rank,
)
from kvpools_core.values import Serving

if TYPE_CHECKING:
    from kvpools_core.registry import Registry

__all__ = [
    "FAMILIES",
    "WEIGHTS_CONFIG_KEY",
    "WeightsEstimate",
    "estimate_weights",
    "vocab_rows_per_rank",
]


def estimate_weights(
    model: str | os.PathLike[str] | Mapping[str, Any],
    serving: Serving | None = None,
    *,
    ep_size: int = 1,
    registry: Registry | None = None,
) -> WeightsEstimate:
    """Parameters and bytes of ``model``'s weights, and what one rank of ``serving`` holds.

    ``model`` is what :func:`kvpools_core.plan` takes by name or path (a preset, a
    ``config.json`` or its directory) or the config mapping itself; the config must
    carry the full shapes (``intermediate_size``, ``vocab_size``, expert counts).
    A preset keeps only the KV fields and names the complete config it came from
    (``_weights_config``); a preset without one is refused naming the first
    missing field.  ``ep_size`` is SGLang's ``--ep-size``.  The architecture plugin
    of ``registry`` (the default registry when None) that claims the config's
    ``model_type`` answers (``estimate_weights`` hook), with ``serving``'s platform
    traits resolved (``platform_traits``) where they are not yet: the engines'
    quantisation rules read them (SGLang's Marlin conversions, the methods a
    platform refuses).
    """
    from kvpools_core.pipeline.platforms import platform_aliases, resolve_platform_traits
    from kvpools_core.registry import get_registry

    registry = registry or get_registry()
    serving = serving or Serving()
    if serving.platform_traits is None:
        canonical = platform_aliases(registry).get(serving.platform, serving.platform)
        serving = resolve_platform_traits(attrs.evolve(serving, platform=canonical), registry)
    config, source = _load_config(model, registry)
    outer = ConfigReader(config, source)
    reader = outer.text()
    model_type = reader.string("model_type", "") or outer.string("model_type", "")
    request = WeightsConfig(reader=reader, outer=outer, source=source, model_type=model_type)
    estimate, _ = registry.call("estimate_weights", config=request, serving=serving, ep_size=ep_size)
    if estimate is None:
        asked = ", ".join(registry.implementers("estimate_weights")) or "none"
        raise reader.error(
            "model_type",
            f"is {describe(model_type or None)}",
            f"No installed architecture plugin estimates its weights (asked: {asked}); other architectures are "
            "not guessed. Give the weights' size yourself (--weights-memory), or install the plugin that claims it.",
        )
    estimate = cast(WeightsEstimate, estimate)  # the registry checked the answer against the hook's contract
    files = _checkpoint_files(model)
    return estimate if files is None else _from_headers(estimate, files)


def _checkpoint_files(model: str | os.PathLike[str] | Mapping[str, Any]) -> list[Path] | None:
    """The safetensors files of ``model`` when it is a local checkpoint directory that holds them."""
    if isinstance(model, Mapping):
        return None
    try:
        path = Path(os.fspath(model)).expanduser()
        if not path.is_dir():
            return None
    except (OSError, ValueError):
        return None
    return find_safetensors(path)


def _from_headers(estimate: WeightsEstimate, files: list[Path]) -> WeightsEstimate:
    """``estimate`` with the checkpoint's own bytes (its safetensors headers), sharded by the estimate's layout."""
    served = DTYPE_BYTES[estimate.served_dtype]
    exact = exact_weights(read_headers(files), estimate.shares, served)
    # Copies the engine makes that the checkpoint stores once (a tied LM head on the last pipeline stage).
    copies = sum(share.rank for share in estimate.shares.values() if share.total == 0) * served
    where = files[0].parent
    notes = [
        f"weights: exact, from the safetensors headers of {where} ({len(files)} file(s), {exact.tensors} tensors, "
        f"{exact.bytes_total:,} B served as {estimate.served_dtype} where unquantised), each tensor sharded as the "
        f"estimate shards it; the config-only estimate was {estimate.bytes_per_rank:,} B a rank",
    ]
    if exact.unmatched:
        shown = ", ".join(exact.unmatched[:3]) + (", ..." if len(exact.unmatched) > 3 else "")
        notes.append(
            f"{len(exact.unmatched)} checkpoint tensor(s) ({exact.unmatched_bytes:,} B) are not in the "
            f"architecture's layout ({shown}): counted whole on every rank"
        )
    return attrs.evolve(
        estimate,
        parameters=exact.parameters,
        bytes_total=exact.bytes_total,
        bytes_per_rank=exact.bytes_per_rank + copies,
        notes=(*estimate.notes, *notes),
        method="safetensors",
    )


def _load_config(
    model: str | os.PathLike[str] | Mapping[str, Any], registry: Registry
) -> tuple[Mapping[str, Any], str]:
    if isinstance(model, Mapping):
        return model, "config"
    config, source, name = resolve_model_source(os.fspath(model), registry)
    pointer = config.get(WEIGHTS_CONFIG_KEY)
    if source.startswith("preset:") and pointer:
        full = Path(registry_presets(registry)[name][1]).parent / str(pointer)
        return read_config_file(full), f"{source} ({WEIGHTS_CONFIG_KEY} {pointer})"
    return config, source
