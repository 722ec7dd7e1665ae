"""A toy platform plugin for the kit's own tests; each ``defect`` breaks one platform invariant.

A module of its own (and free of torch at import) so that the torch-import
check can load the toys in a fresh interpreter by path
(``tests.testing.toy_platforms:SOUND``).
"""

from __future__ import annotations

from typing import Any

from kvpools_core import hookimpl
from kvpools_core.values import GPU, MemoryTier, PageSizeRule, PlatformTraits, Serving, Workspace

PLATFORM = "toyhw"
ALIAS = "toy-accelerator"
TOY_TIER = MemoryTier(max_mib=32 * 1024, chunked_prefill_size=2048, decode_max_bs=8, decode_max_bs_at_tp4=32)
"""The toy's own SGLang memory tier (as Ascend's NPU tiers): devices of up to 32 GiB take it, larger the GPU tiers."""


class ToyPlatform:
    """An accelerator ``toyhw`` (devices ``toyhw:N``): pages of 16 or 64, int32 slots, a small workspace, two
    catalogue devices (``toy-24g`` under its own memory tier, ``toy-48g`` under the GPU tiers)."""

    def __init__(self, defect: str | None = None) -> None:
        self.defect = defect

    def _mine(self, platform: str) -> bool:
        return platform == PLATFORM or self.defect == "answers_everywhere"

    @hookimpl
    def platforms(self) -> dict[str, str]:
        return {PLATFORM: "" if self.defect == "undescribed" else "a toy accelerator (kvpools' kit tests)"}

    @hookimpl
    def platform_aliases(self) -> dict[str, str]:
        return {ALIAS: PLATFORM}

    @hookimpl
    def accelerators(self) -> Any:
        if self.defect == "accelerator_not_a_gpu":
            return ["toy-24g"]
        source = "" if self.defect == "accelerator_without_source" else "kvpools' kit tests: a made-up device"
        platform = "nowhere" if self.defect == "accelerator_elsewhere" else PLATFORM
        second_alias = "toy24" if self.defect == "accelerator_twice" else "toy48"
        return [
            GPU("toy-24g", "Toy accelerator 24GB", 24 << 30, platform=platform, aliases=("toy24",), source=source),
            GPU("toy-48g", "Toy accelerator 48GB", 48 << 30, platform=PLATFORM, aliases=(second_alias,), source="kit"),
        ]

    @hookimpl
    def detect_platform(self, device: str | None) -> str | None:
        if device is not None and (device.split(":")[0] == PLATFORM or self.defect == "detects_every_device"):
            return PLATFORM
        return None

    @hookimpl(tryfirst=True)
    def platform_traits(self, serving: Serving) -> PlatformTraits | None:
        if self.defect == "imports_torch":
            import torch  # noqa: F401  (the defect: planning pulls in torch)
        if not self._mine(serving.platform):
            return None
        if self.defect == "no_page":
            rules = (PageSizeRule(reason="toy kernels", sizes=(3,)), PageSizeRule(reason="toy tiles", multiple_of=2))
        elif self.defect == "no_page_for_kernel":
            rules = (
                PageSizeRule(reason="toy kernels", sizes=(16, 64)),
                PageSizeRule(reason="toy sparse kernels", sizes=(32,), kernels=("dsa",)),
            )
        else:
            rules = (
                PageSizeRule(reason="toy kernels", sizes=(16, 64)),
                PageSizeRule(reason="toy sparse kernels", sizes=(64,), kernels=("dsa",)),
            )
        refused = {"gptq": "toy kernels have no GPTQ"}
        if self.defect == "refuses_an_unknown_method":
            refused["gptq_v9"] = "a method SGLang does not have"
        return PlatformTraits(
            platform=serving.platform,
            page_size_rules=rules,
            slot_index_dtype="int32",
            memory_tiers=(TOY_TIER,),
            refused_quantization=refused,
        )

    @hookimpl
    def workspaces(self, model: Any, serving: Serving) -> list[Workspace] | None:
        if serving.platform != PLATFORM and self.defect != "workspace_everywhere":
            return None
        return [Workspace(name="toy-scratch", purpose="toy kernel scratch", bytes_per_request=64, fixed_bytes=4096)]

    @hookimpl(tryfirst=True)
    def available_memory(self, device: str, serving: Serving) -> dict[str, int] | None:
        if device.split(":")[0] != PLATFORM and self.defect != "probes_every_device":
            return None
        return {"free_bytes": 64 << 30, "total_bytes": 80 << 30}

    @hookimpl(tryfirst=True)
    def buffer_layout(self, plan: Any, device: str) -> Any:
        if plan.serving.platform != PLATFORM and self.defect != "layout_everywhere":
            return None
        from kvpools_core.pools.layout import PerLayerLayout

        defect = self.defect

        class ToyLayout(PerLayerLayout):
            name = "toy"

            def nbytes(self, request: Any) -> int:  # the defect pads every buffer by an uncharged page
                return request.nbytes + (4096 if defect == "pads_buffers" else 0)

        return ToyLayout()

    @hookimpl(tryfirst=True)
    def build_allocator(self, plan: Any, pool: Any, device: str, checked: bool) -> Any:
        if plan.serving.platform != PLATFORM or self.defect != "int64_slots" or plan.serving.page_size == 1:
            return None
        import torch

        from kvpools_core.allocators import PagedAllocator

        return PagedAllocator(
            plan.max_total_num_tokens, plan.serving.page_size, device=device, checked=checked, index_dtype=torch.int64
        )


SOUND = ToyPlatform()
IMPORTS_TORCH = ToyPlatform("imports_torch")
