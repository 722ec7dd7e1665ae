"""Building a plan: request table, KV pool and allocator, each through its hook.

``build(plan, device)`` allocates real tensors on ``cpu``, ``cuda[:N]``,
``npu`` or ``meta`` (shapes and bytes without memory, so any plan can be
measured exactly on a laptop).  Every built object reports ``nbytes``
measured from its tensors; ``allocated_bytes`` is their sum, which the exact
accounting promises equals ``plan.planned_bytes``.
"""

from __future__ import annotations

from typing import Any

import attrs

from kvpools_core.registry import Registry, get_registry
from kvpools_core.values import Plan


@attrs.define
class Pools:
    """What ``build`` returns: the three objects an engine needs, and who built them."""

    plan: Plan
    device: str
    req_to_token_pool: Any
    kv_pool: Any
    allocator: Any
    provenance: dict[str, tuple[str, ...]]

    @property
    def allocated_bytes(self) -> int:
        """Bytes of every tensor built, measured from the tensors themselves."""
        return int(self.req_to_token_pool.nbytes) + int(self.kv_pool.nbytes) + int(self.allocator.nbytes)

    def allocated_by_pool(self) -> dict[str, int]:
        """Measured bytes per plan pool name.

        The KV pool reports its own sub-pools; so does an allocator made of
        several free lists (``nbytes_by_pool``), else it is the ``allocator`` pool,
        and a request table that owns per-request state (SGLang's
        ``HybridReqToTokenPool`` owns the mamba state pool), else it is ``req_to_token``.
        """
        measured: dict[str, int] = dict(self.kv_pool.nbytes_by_pool())
        req_by_pool = getattr(self.req_to_token_pool, "nbytes_by_pool", None)
        measured.update(
            req_by_pool() if req_by_pool is not None else {"req_to_token": int(self.req_to_token_pool.nbytes)}
        )
        by_pool = getattr(self.allocator, "nbytes_by_pool", None)
        measured.update(by_pool() if by_pool is not None else {"allocator": int(self.allocator.nbytes)})
        return measured


def build(plan: Plan, device: str = "cpu", *, registry: Registry | None = None) -> Pools:
    """Allocate the pools and allocator a plan describes on ``device``."""
    registry = registry or get_registry()
    name = plan.model.name
    req_pool, req_by = registry.call_first(
        "build_req_to_token_pool", f"no plugin builds the request table of {name}.", plan=plan, device=device
    )
    kv_pool, pool_by = registry.call_first(
        "build_pool",
        f"no plugin builds the KV pool of {name} (architecture {plan.model.architecture!r}) on {device}.",
        plan=plan,
        device=device,
    )
    allocator, alloc_by = registry.call_first(
        "build_allocator",
        f"no plugin builds an allocator for {name} on {device}.",
        plan=plan,
        pool=kv_pool,
        device=device,
    )
    provenance = {"build_req_to_token_pool": req_by, "build_pool": pool_by, "build_allocator": alloc_by}
    return Pools(plan, device, req_pool, kv_pool, allocator, provenance)
