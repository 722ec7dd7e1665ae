"""The Ascend plugin's layout hooks, kept apart from the layouts so planning never imports torch.

``buffer_layout`` imports :mod:`kvpools_ascend.layouts` (torch) only when a
build asks; ``validate_layouts`` refuses at planning time what the NPU layout
would allocate other bytes for than the plan.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvpools_ascend.names import PLATFORM, on_ascend
from kvpools_core import hookimpl
from kvpools_core.options import option
from kvpools_core.values import ModelSpec, Plan, Serving

if TYPE_CHECKING:
    from kvpools_core.pools.layout import BufferLayout

__all__ = ["buffer_layout", "validate_layouts"]

HYBRID_ARCHITECTURE = "mamba"
"""The architecture whose recurrent conv state the NPU widens under speculative decoding."""


@hookimpl(tryfirst=True)
def buffer_layout(plan: Plan, device: str) -> BufferLayout | None:
    """SGLang's NPU carving for plans made for ``ascend`` and ``npu`` devices; None for every other."""
    if not on_ascend(plan, device):
        return None
    from kvpools_ascend.layouts import ASCEND_LAYOUT

    return ASCEND_LAYOUT


@hookimpl(specname="validate")
def validate_layouts(model: ModelSpec, serving: Serving) -> list[str] | None:
    """Refuse what the NPU layout would allocate other bytes for than the plan: a hybrid's speculative conv window."""
    if serving.platform != PLATFORM or model.architecture != HYBRID_ARCHITECTURE or not serving.speculative:
        return None
    return [
        f"{option('speculative_algorithm')} {serving.speculative_algorithm} on platform {PLATFORM!r} with the "
        f"hybrid model {model.name}: SGLang's NPU widens each recurrent layer's conv state window by "
        f"{option('speculative_num_draft_tokens')} - 1 (_init_npu_conv_state), which kvpools does not model yet, "
        f"so the plan would not charge the bytes the NPU allocates. Serve it without speculative decoding on "
        f"{PLATFORM!r}, or plan it for another platform."
    ]
