"""SGLang's accounting: the pipeline's pools, sized as SGLang 0.5.23 sizes them (``--accounting sglang``)
or charged for every byte they allocate (``--accounting exact``).

SGLang's sizing semantics are what the architecture plugins answer ``size_pools`` with (from the parts
library's :mod:`kvpools_core.parts.sizing`), so this engine is the pipeline itself, named.
"""

from __future__ import annotations

from kvpools_core.engines.base import Engine
from kvpools_core.pipeline import plan
from kvpools_core.values import SGLANG_ACCOUNTING_MODES

ENGINE = Engine(
    name="sglang",
    version="0.5.23",
    accountings=SGLANG_ACCOUNTING_MODES,
    plan=plan,
    summary="SGLang's pools: --accounting sglang reproduces SGLang's token counts, exact charges every byte built.",
    docs="docs/sizing.md",
)

__all__ = ["ENGINE"]
