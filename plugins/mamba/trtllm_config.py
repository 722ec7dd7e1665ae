"""The config fields TensorRT-LLM reads from a hybrid's config that SGLang does not (``plugins/mamba/trtllm.py``
answers ``engine_layer_specs`` with them); read while the config is parsed (``config.py``), kept in
``ModelSpec.params["trtllm"]``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvpools_core.config import ConfigReader


def trtllm_ssm_dtype(outer: ConfigReader, reader: ConfigReader) -> str | None:
    """``resolve_ssm_cache_dtype`` (``config_utils.py``@00679c66): the config's ``mamba_ssm_cache_dtype``, top level
    first, then the text config; None when it is absent or "auto" (TensorRT-LLM then keeps the SSM state in the
    checkpoint's dtype).  A checkpoint's ``mamba_ssm_dtype`` (Qwen3.5's ``float32``) is not read: "it expresses
    the SSM *compute* dtype intent, not the cache dtype"."""
    for candidate in (outer, reader):
        value = candidate.get("mamba_ssm_cache_dtype")
        if isinstance(value, str) and value != "auto":
            return value
    return None


def trtllm_readings(config: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The config fields TensorRT-LLM reads differently from SGLang: its SSM cache dtype and whether the config
    carries Nemotron-H's ``hybrid_override_pattern`` (``is_nemotron_hybrid``)."""
    outer = ConfigReader(config, source)
    reader = outer.text()
    pattern = reader.get("hybrid_override_pattern") or outer.get("hybrid_override_pattern")
    return {"ssm_dtype": trtllm_ssm_dtype(outer, reader), "nemotron_pattern": bool(pattern)}


__all__ = ["trtllm_readings", "trtllm_ssm_dtype"]
