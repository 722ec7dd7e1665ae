"""SGLang's accounting: the pipeline's pools, sized as SGLang 0.5.23 sizes them (``--accounting sglang``)
or charged for every byte they allocate (``--accounting exact``).

SGLang's sizing semantics are what the architecture plugins answer ``size_pools`` with (from the parts
library's :mod:`kvpools_core.parts.sizing`), so this engine is the pipeline itself, named.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpools_core.engines.base import Engine, EngineCapacity
from kvpools_core.hookspecs import hookimpl
from kvpools_core.pipeline import plan
from kvpools_core.values import SGLANG_ACCOUNTING_MODES, Plan


def capacity(result: Plan) -> EngineCapacity:
    """The plan's budget, the bytes its pools take, the tokens (``max_total_num_tokens``) and requests
    (``max_running_requests``) it holds."""
    return EngineCapacity(
        engine="sglang",
        accounting=result.serving.accounting,
        budget_bytes=result.budget.budget_bytes,
        kv_bytes=result.planned_bytes,
        max_tokens=result.max_total_num_tokens,
        max_requests=result.max_running_requests,
    )


ENGINE = Engine(
    name="sglang",
    version="0.5.23",
    accountings=SGLANG_ACCOUNTING_MODES,
    plan=plan,
    capacity=capacity,
    summary="SGLang's pools: --accounting sglang reproduces SGLang's token counts, exact charges every byte built.",
    docs="docs/sizing.md",
    over_budget={
        "sglang": "SGLang's token count comes from its own cell size (docs/sizing.md: its layer-count scaling and "
        "rounding), so the pools kvpools builds for it may take more bytes than the budget; exact fits it"
    },
)


@hookimpl
def engine_accountings() -> Sequence[Engine]:
    """SGLang's accountings, found by the registry as any engine plugin's (entry point ``sglang``)."""
    return [ENGINE]


__all__ = ["ENGINE", "capacity", "engine_accountings"]
