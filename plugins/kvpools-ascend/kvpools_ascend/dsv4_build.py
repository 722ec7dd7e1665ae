"""DeepSeek-V4's NPU build hooks, kept apart from the plan so planning never imports torch (and no module cycle).

Each imports :mod:`kvpools_ascend.dsv4_pool` (torch) only when a build asks.
"""

from __future__ import annotations

from typing import Any

from kvpools_ascend.dsv4 import SGLANG_ACCOUNTINGS, on_npu_dsv4
from kvpools_core import hookimpl
from kvpools_core.values import Plan

__all__ = ["build_dsv4_npu_allocator", "build_dsv4_npu_pool", "build_dsv4_npu_req_pool"]


def _plan_on_npu_dsv4(plan: Plan) -> bool:
    return on_npu_dsv4(plan.model, plan.serving) and plan.serving.accounting in SGLANG_ACCOUNTINGS


@hookimpl(specname="build_pool", tryfirst=True)
def build_dsv4_npu_pool(plan: Plan, device: str, layout: Any) -> Any | None:
    """``DSV4NPUTokenToKVPool`` for a DeepSeek-V4 plan made for ``ascend`` (:mod:`kvpools_ascend.dsv4_pool`)."""
    if not _plan_on_npu_dsv4(plan):
        return None
    from kvpools_ascend.dsv4_pool import NPUDSV4TokenToKVPool

    return NPUDSV4TokenToKVPool.from_plan(plan, device)


@hookimpl(specname="build_req_to_token_pool", tryfirst=True)
def build_dsv4_npu_req_pool(plan: Plan, device: str, checked: bool, layout: Any) -> Any | None:
    """``DSV4NPUReqToTokenPool`` (``DSV4NPUDecodeReqToTokenPool`` on a decode node): the table and its sidecar."""
    if not _plan_on_npu_dsv4(plan):
        return None
    from kvpools_ascend.dsv4_pool import NPUDSV4ReqToTokenPool

    return NPUDSV4ReqToTokenPool.from_plan(plan, device)


@hookimpl(specname="build_allocator", tryfirst=True)
def build_dsv4_npu_allocator(plan: Plan, pool: Any, device: str, checked: bool) -> Any | None:
    """``DSV4NPUTokenToKVPoolAllocator``: the SWA allocator, the c128 page allocator and its refcount."""
    if not _plan_on_npu_dsv4(plan):
        return None
    from kvpools_ascend.dsv4_pool import build_npu_allocator

    return build_npu_allocator(plan, pool, device, checked)
