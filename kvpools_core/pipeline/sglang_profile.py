"""SGLang's runtime-memory profile per engine version (``profiles/sglang-<version>.json``, issue 34).

SGLang sizes the KV pool from what is free after the weights load, less a slack of
``pre_model_load x (1 - mem_fraction_static)`` (``KVCacheConfigurator._profile_available_bytes``): its activations
and CUDA graphs are captured after the pool is sized and live in that slack, whose default is a formula of the GPU
(:func:`kvpools_core.pipeline.gpus.sglang_memory_defaults`).  The one term no formula gives is what a rank holds
before the weights (the CUDA context, torch, NCCL): it is calibrated per SGLang version in the profile file, which
cites the logs it rests on and lists every term with its source lines.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import attrs

from kvpools_core.errors import ConfigError

GiB = 1 << 30

SGLANG_PROFILE_VERSIONS = ("0.5.23",)
"""The SGLang versions that have a runtime profile."""


@attrs.frozen(kw_only=True)
class SglangRuntimeProfile:
    """One SGLang version's runtime profile."""

    version: str
    single_rank_runtime_bytes: int
    group_runtime_bytes: int
    evidence: tuple[dict[str, Any], ...]
    terms: tuple[dict[str, str], ...]
    file: str
    source_single_rank_bytes: int | None = None
    """``runtime_before_weights_from_source.single_rank_gib``: one rank's driver reservation and CUDA context read
    off a cited log (no communicator: SGLang creates none for a single rank); None when the profile has none."""
    source_distributed_init_bytes: int | None = None
    """``runtime_before_weights_from_source.torch_distributed_init_gib``: what a TP/PP group's ``torch.distributed``
    init adds on the rank SGLang sizes with (the group's minimum free memory)."""

    @property
    def source_group_runtime_bytes(self) -> int | None:
        """A group rank's runtime before the weights from the source's two parts, None without them."""
        if self.source_single_rank_bytes is None or self.source_distributed_init_bytes is None:
            return None
        return self.source_single_rank_bytes + self.source_distributed_init_bytes


@cache
def load_sglang_profile(version: str = "0.5.23") -> SglangRuntimeProfile:
    """The runtime profile of SGLang ``version`` (``0.5.23`` or ``sglang==0.5.23``); refuses a version without one."""
    key = str(version).strip().removeprefix("sglang==")
    if key not in SGLANG_PROFILE_VERSIONS:
        raise ConfigError(
            f"kvpools has no runtime-memory profile for SGLang {version!r} (profiles: "
            f"{', '.join(SGLANG_PROFILE_VERSIONS)}); pass --runtime-memory with what a rank holds before the weights."
        )
    file = f"sglang-{key}.json"
    data = json.loads(resources.files(__package__).joinpath("profiles").joinpath(file).read_text(encoding="utf-8"))
    runtime = data["runtime_before_weights_gib"]
    for name in ("single_rank", "tp_or_pp_group"):
        value = runtime.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise ConfigError(f"{file}: runtime_before_weights_gib.{name} must be a positive number of GiB.")
    derived = data.get("runtime_before_weights_from_source") or {}
    parts: dict[str, int | None] = {}
    for name in ("single_rank_gib", "torch_distributed_init_gib"):
        value = derived.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise ConfigError(f"{file}: runtime_before_weights_from_source.{name} must be a number of GiB >= 0.")
        parts[name] = None if value is None else round(value * GiB)
    return SglangRuntimeProfile(
        source_single_rank_bytes=parts["single_rank_gib"],
        source_distributed_init_bytes=parts["torch_distributed_init_gib"],
        version=key,
        single_rank_runtime_bytes=round(runtime["single_rank"] * GiB),
        group_runtime_bytes=round(runtime["tp_or_pp_group"] * GiB),
        evidence=tuple(data["evidence"]),
        terms=tuple(data["terms"]),
        file=file,
    )


__all__ = ["SGLANG_PROFILE_VERSIONS", "SglangRuntimeProfile", "load_sglang_profile"]
