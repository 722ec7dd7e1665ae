"""What SGLang decides from DeepSeek-V4's class (``architecture_traits`` hook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kvpools_core import hookimpl

NO_PREFILL_GRAPH_ARCHITECTURES = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark")
"""The classes whose breakable prefill CUDA graph SGLang 0.5.23 turns off before sizing
(``disable_breakable_cudagraph_if_incompatible``, ``cuda_graph_hook.py`` lines 170-240)."""


@hookimpl
def architecture_traits() -> Mapping[str, Sequence[str]]:
    return dict.fromkeys(NO_PREFILL_GRAPH_ARCHITECTURES, ("no_breakable_prefill_graph",))
