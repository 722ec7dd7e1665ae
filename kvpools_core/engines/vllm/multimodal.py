"""vLLM's ``--limit-mm-per-prompt`` and ``--language-model-only`` as ``plan_vllm`` reads them (vLLM 0.33).

``--limit-mm-per-prompt`` is a JSON object (``engine/arg_utils.py`` L419-421 parse it with ``json.loads``; the
dotted ``--limit-mm-per-prompt.image 2`` spelling is folded into the same object by ``utils/argparse_utils.py``
L462-498) of item counts per modality, each an integer >= 0 or an object with ``count`` (default 999) and, for
images / videos / audio, the dummy item's ``width`` / ``height`` / ``num_frames`` / ``length``
(``config/multimodal.py`` L210-235, L471-494).  A modality it does not name is allowed 999 items and
``--language-model-only`` makes every limit 0 (``get_limit_per_prompt``, L696-709).  The limits size the encoder's
profile pass (:func:`~kvpools_core.engines.vllm.runtime_memory.mm_encoder_profile`), and a vision tower whose
modalities are all limited to 0 is not built or loaded (``_mark_tower_model``, ``model_executor/models/
interfaces.py`` L346-392: Qwen3-VL / 3.5 / 3.6 mark theirs with image and video, Gemma-3, Mistral-3 and Llama-4
with image).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from kvpools_core.engines.vllm.runtime_memory import DEFAULT_MM_LIMIT as DEFAULT_LIMIT
from kvpools_core.errors import ConfigError, short_repr
from kvpools_core.options import option
from kvpools_core.pipeline.gpus import (
    VLLM_VISION_GEMMA4,
    VLLM_VISION_LLAMA4,
    VLLM_VISION_PIXTRAL,
    VLLM_VISION_QWEN3,
    VLLM_VISION_SIGLIP,
)

__all__ = ["DUMMY_SIZE_KEYS", "MultimodalLimits", "parse_multimodal_limits", "tower_modalities"]

DUMMY_SIZE_KEYS = {"image": ("width", "height"), "video": ("num_frames", "width", "height"), "audio": ("length",)}
"""The dummy-item options vLLM 0.33 accepts beside ``count`` (``ImageDummyOptions`` / ``VideoDummyOptions`` /
``AudioDummyOptions``, ``config/multimodal.py`` L210-235); kvpools does not model them (the profile's item size)."""

_EXAMPLE = """'{"image": 2, "video": 0}'"""


@attrs.frozen(kw_only=True)
class MultimodalLimits:
    """What ``vllm serve`` is told about multimodal inputs: the named modalities' counts, ``--language-model-only``."""

    counts: Mapping[str, int] = attrs.field(factory=dict)
    language_model_only: bool = False
    given: Any = None
    """``--limit-mm-per-prompt`` as given (parsed), echoed on the ``vllm serve`` line; None when not given."""

    def limit(self, modality: str) -> int:
        """``MultiModalConfig.get_limit_per_prompt(modality)``: 0 under ``--language-model-only``, else the named
        count or 999."""
        if self.language_model_only:
            return 0
        return self.counts.get(modality, DEFAULT_LIMIT)

    def runtime_limits(self) -> dict[str, int]:
        """The ``mm_limits`` :func:`~kvpools_core.engines.vllm.runtime_memory.estimate_runtime_memory` takes."""
        if self.language_model_only:
            return {modality: 0 for modality in (*DUMMY_SIZE_KEYS, *self.counts)}
        return dict(self.counts)

    def skips_tower(self, modalities: tuple[str, ...]) -> bool:
        """vLLM builds no tower whose ``modalities`` are all limited to 0."""
        return all(self.limit(modality) == 0 for modality in modalities)

    def flags(self) -> list[str]:
        """The ``vllm serve`` flags that state these limits."""
        import shlex

        parts = []
        if self.given is not None:
            parts.append(f"--limit-mm-per-prompt {shlex.quote(json.dumps(self.given))}")
        if self.language_model_only:
            parts.append("--language-model-only")
        return parts

    def to_dict(self) -> dict[str, Any]:
        return {"limit_mm_per_prompt": self.given, "language_model_only": self.language_model_only}


TOWER_MODALITIES = {
    VLLM_VISION_QWEN3: ("image", "video"),
    VLLM_VISION_PIXTRAL: ("image",),
    VLLM_VISION_SIGLIP: ("image",),
    VLLM_VISION_LLAMA4: ("image",),
    VLLM_VISION_GEMMA4: ("image", "video"),
}
"""The modalities vLLM 0.33 marks each modelled vision tower with (``_mark_tower_model``): image and video for the
Qwen3-VL tower (``qwen3_vl.py`` L2010, ``qwen3_5.py`` L513 / L736), image for the Mistral-3 Pixtral tower
(``mistral3.py`` L478), Gemma-3's SigLIP tower (``gemma3_mm.py`` L552) and Llama-4's (``mllama4.py`` L765); image and
video for Gemma-4's (``gemma4_mm.py`` L1101).  The tower is the one an architecture plugin names for the
checkpoint's class (``architecture_traits``, :func:`~kvpools_core.engines.vllm.runtime_memory.vision_tower_of`): the
core names no architecture."""


def tower_modalities(tower: str | None) -> tuple[str, ...] | None:
    """The modalities a vision tower (:data:`TOWER_MODALITIES`' keys, a ``VisionShape.tower``) is marked with;
    None for no tower or one without a trait (its weights are kept)."""
    return TOWER_MODALITIES.get(tower) if tower is not None else None


def parse_multimodal_limits(
    limit_mm_per_prompt: str | Mapping[str, Any] | None, language_model_only: bool | None
) -> MultimodalLimits | None:
    """``--limit-mm-per-prompt`` (a JSON object, or its mapping from Python) and ``--language-model-only``, checked as
    vLLM 0.33 checks them; None when neither is given.  Dummy item sizes (``width`` ...) are refused: kvpools does
    not model them yet."""
    if language_model_only is not None and not isinstance(language_model_only, bool):
        raise ConfigError(
            f"{option('language_model_only')} is a flag (True or False), got {short_repr(language_model_only)}."
        )
    if limit_mm_per_prompt is None:
        return MultimodalLimits(language_model_only=True) if language_model_only else None
    value: object = limit_mm_per_prompt
    if isinstance(limit_mm_per_prompt, str):
        try:
            value = json.loads(limit_mm_per_prompt)
        except ValueError:
            pairs = "=" in limit_mm_per_prompt and not limit_mm_per_prompt.strip().startswith("{")
            hint = " (vLLM 0.33 does not take KEY=VALUE pairs)" if pairs else ""
            raise ConfigError(
                f"{_flag()} must be a JSON object of items per modality{hint}, as vLLM 0.33 parses it "
                f"(json.loads), got {short_repr(limit_mm_per_prompt)}: write it as {_EXAMPLE}."
            ) from None
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{_flag()} must be a JSON object of items per modality, got {short_repr(limit_mm_per_prompt)}"
            f": write it as {_EXAMPLE}."
        )
    counts = {}
    for modality, item in value.items():
        if not isinstance(modality, str) or not modality:
            raise ConfigError(f"{_flag()}'s modalities are names (image, video, audio), got {modality!r}.")
        counts[modality] = _count(modality, item)
    return MultimodalLimits(counts=counts, language_model_only=bool(language_model_only), given=dict(value))


def _flag() -> str:
    return option("limit_mm_per_prompt")


def _count(modality: str, item: object) -> int:
    """One modality's count: an integer >= 0, or ``{"count": N}`` (999 without one)."""
    count: object = item
    if isinstance(item, Mapping):
        known = ("count", *DUMMY_SIZE_KEYS.get(modality, ()))
        unknown = [key for key in item if key not in known and modality in DUMMY_SIZE_KEYS]
        if unknown:
            raise ConfigError(
                f"{_flag()}'s {modality} takes {', '.join(known)}, got {', '.join(map(repr, unknown))} "
                f"(vLLM 0.33 refuses it too): drop it."
            )
        # another modality's options are a BaseDummyOptions, which ignores keys it does not know
        sizes = [key for key in item if key in DUMMY_SIZE_KEYS.get(modality, ())]
        if sizes:
            raise ConfigError(
                f"{_flag()}'s {modality} sets the profiled dummy item's {', '.join(sizes)}: kvpools does "
                f"not model the dummy item sizes yet (it profiles the largest item). Drop {', '.join(sizes)} and "
                f'keep the count: {{"{modality}": {item.get("count", DEFAULT_LIMIT)}}}.'
            )
        count = item.get("count", DEFAULT_LIMIT)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ConfigError(
            f'{_flag()}\'s {modality} must be a count >= 0 (or {{"count": N}}), got {short_repr(item)}: '
            f"e.g. {_EXAMPLE}."
        )
    return count
