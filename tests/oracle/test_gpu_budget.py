"""A whole-GPU plan against SGLang's own profiling code: the same tokens and requests.

SGLang profiles ``pre_model_load_memory`` as the weights start loading: on a GPU, total - runtime footprint.
kvpools' GPU budget (``kvpools_core.parts.sizing.gpu_budget``) must equal SGLang's ``_profile_available_bytes``
run with that pre-load memory, the weights and the fraction the GPU plan resolved.
"""

from __future__ import annotations

import attrs
import pytest

from kvpools_core.pipeline import plan as kvpools_plan
from kvpools_core.values import Serving

from .adapter import oracle_plan, preset_model
from .locate import require_oracle

require_oracle()

GiB = 1 << 30


@pytest.mark.parametrize(
    ("gpu", "serving", "weights"),
    [
        ("h100", Serving(), 15 * GiB),
        ("h200", Serving(tp_size=8), 2 * GiB),
        ("l40s", Serving(tp_size=2, mem_fraction_static=0.85), 8 * GiB),
    ],
)
def test_gpu_budget_matches_sglang_profiling(gpu: str, serving: Serving, weights: int) -> None:
    serving = attrs.evolve(serving, accounting="sglang")
    ours = kvpools_plan("llama-3.1-8b", serving, gpu=gpu, weights_memory=weights)
    budget = ours.budget
    assert budget.pre_model_load_bytes is not None and budget.mem_fraction_static is not None
    theirs = oracle_plan(
        preset_model("llama-3.1-8b"),
        attrs.evolve(serving, mem_fraction_static=budget.mem_fraction_static),
        free_memory=budget.pre_model_load_bytes,
        weights_memory=weights,
    )
    assert (ours.max_total_num_tokens, ours.max_running_requests) == (
        theirs.max_total_num_tokens,
        theirs.max_running_requests,
    )
