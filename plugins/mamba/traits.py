"""What SGLang decides from the class of the hybrid models this plugin parses (``architecture_traits`` hook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpools_core import hookimpl

MLA_BACKEND_ARCHITECTURES = ("KimiLinearForCausalLM", "KimiK3LinearForCausalLM")
"""Kimi-Linear's classes: their full-attention layers are MLA, and SGLang 0.5.23 runs them with
``AttentionArch.MLA`` (``srt/configs/model_config.py`` lines 1366-1397 and after: ``use_mla_backend``)."""


@hookimpl
def architecture_traits() -> Mapping[str, Sequence[str]]:
    return dict.fromkeys(MLA_BACKEND_ARCHITECTURES, ("mla_backend",))
