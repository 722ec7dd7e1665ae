"""Every paged allocator hands out slots in the platform's ``slot_index_dtype`` (int32 on Ascend NPUs).

The core paged allocator, the SWA dual allocator (swa and dsv4 plugins) and the
NPU allocator read ``PlatformTraits.slot_index_dtype`` from the plan; the planned
bytes do not change (the free lists stay int64).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvpools_core import Serving, build, hookimpl, plan
from kvpools_core.testing.registries import isolated_registry
from kvpools_core.values import PlatformTraits

INT32 = PlatformTraits(platform="int32-toy", slot_index_dtype="int32")


class Int32Platform:
    @hookimpl
    def platforms(self) -> dict[str, str]:
        return {"int32-toy": "a platform whose kernels take int32 slot ids"}

    @hookimpl(tryfirst=True)
    def platform_traits(self, serving: Serving) -> PlatformTraits | None:
        return INT32 if serving.platform == "int32-toy" else None


def registry() -> Any:
    return isolated_registry(["mha", "swa", "dsv4", "speculative"], objects={"int32": Int32Platform()})


@pytest.mark.parametrize(
    ("model", "page", "allocator"),
    [
        ("llama-3.1-8b", 16, "PagedAllocator"),
        ("gpt-oss-20b", 16, "SWATokenToKVPoolAllocator"),
        ("deepseek-v4-flash", 256, "SWATokenToKVPoolAllocator"),
    ],
)
@pytest.mark.parametrize("platform", ["int32-toy", "cpu"])
def test_slots_come_in_the_platforms_dtype(model: str, page: int, allocator: str, platform: str) -> None:
    reg = registry()
    planned = plan(
        model, Serving(platform=platform, page_size=page, max_running_requests=4), memory="1GiB", registry=reg
    )
    pools = build(planned, "meta" if model.startswith("deepseek") else "cpu", registry=reg)
    assert pools.allocated_bytes == planned.planned_bytes  # the free lists' bytes do not depend on it
    assert type(pools.allocator).__name__ == allocator
    if pools.device == "meta":
        return
    want = torch.int32 if platform == "int32-toy" else torch.int64
    slots = pools.allocator.alloc(2 * page)
    assert slots is not None and slots.dtype == want
    pools.allocator.free(slots)


@pytest.mark.usefixtures("rocm_platform")
def test_ascend_swa_plans_hand_out_int32() -> None:
    planned = plan("gpt-oss-20b", Serving(platform="ascend", page_size=128), memory="1GiB")
    pools = build(planned, "cpu")
    slots = pools.allocator.alloc(256)
    assert slots is not None and slots.dtype == torch.int32
