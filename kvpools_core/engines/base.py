"""What an engine accounting is: the interface every engine answers through (``engine_accountings`` hook).

The values live in the foundation (:mod:`kvpools_core.values.engine`) so the hook's result contract checks an
answer without importing an engine; they are re-exported here, where engine authors look for them.
"""

from __future__ import annotations

from kvpools_core.values.engine import Engine, EngineCapacity

__all__ = ["Engine", "EngineCapacity"]
