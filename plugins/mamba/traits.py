"""What SGLang decides from the class of the hybrid models this plugin parses (``architecture_traits`` hook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpools_core import hookimpl

MLA_BACKEND_ARCHITECTURES = ("KimiLinearForCausalLM", "KimiK3LinearForCausalLM")
"""Kimi-Linear's classes: their full-attention layers are MLA, and SGLang 0.5.23 runs them with
``AttentionArch.MLA`` (``srt/configs/model_config.py`` lines 1366-1397 and after: ``use_mla_backend``)."""


@hookimpl
def architecture_traits() -> Mapping[str, Sequence[str]]:
    """Every class this plugin parses has a recurrent state (SGLang's ``mambaish_config``); Kimi-Linear's also run
    the MLA backend."""
    from .config import _FAMILY_BY_ARCHITECTURE

    traits: dict[str, tuple[str, ...]] = dict.fromkeys(_FAMILY_BY_ARCHITECTURE, ("mambaish_state",))
    for architecture in MLA_BACKEND_ARCHITECTURES:
        traits[architecture] = (*traits.get(architecture, ()), "mla_backend")
    return traits
