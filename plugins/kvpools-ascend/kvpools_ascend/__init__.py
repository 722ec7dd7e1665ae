"""The Ascend platform: Huawei Ascend NPUs through ``torch_npu``.

A separate distribution (``kvpools-ascend``), installed as a vendor ships it;
the core and the built-in plugins import nothing from it.  Devices are
``npu`` / ``npu:N`` (torch_npu's device type), which is also the platform's
alias: ``--device npu:0`` or ``--platform npu`` select ``ascend``, as SGLang's
``is_npu()`` does.
"""

from __future__ import annotations

import importlib.util
import sys

# Hooks of the plugin's other modules are attributes of this module, which is what the entry point registers.
from kvpools_ascend.allocator import *  # noqa: F403
from kvpools_ascend.dsa import *  # noqa: F403
from kvpools_ascend.dsv4_build import *  # noqa: F403
from kvpools_ascend.dsv4_checks import dsv4_plugin_options, estimate_dsv4_cell, validate_dsv4  # noqa: F401
from kvpools_ascend.dsv4_sizing import size_dsv4_npu_pools  # noqa: F401
from kvpools_ascend.layout_hooks import *  # noqa: F403
from kvpools_ascend.names import DEVICE_TYPE, PLATFORM, RUNTIME
from kvpools_core import hookimpl
from kvpools_core.errors import ConfigError
from kvpools_core.options import option
from kvpools_core.values import GPU, EngineDefault, MemoryTier, PageSizeRule, PlatformTraits, Serving

__version__ = "0.2.0"  # the one place it is written: pyproject.toml reads this literal

ALIASES = {DEVICE_TYPE: PLATFORM}
ASCEND_PAGE_SIZE = 128
DSV4_KEY = "dsv4"
DSV4_NPU_LAYOUT = "npu_pa_nd"
"""SGLang's DeepSeek-V4 pools on an NPU: ``DSV4NPUTokenToKVPool`` (PA_ND buffers at the kernels' page sizes and a
``c128_page_size`` of their own), ``DSV4NPUTokenToKVPoolAllocator`` and ``DSV4NPUReqToTokenPool`` /
``DSV4NPUDecodeReqToTokenPool`` (``hardware_backend/npu/dsv4/``; ref-000 lines 1112-1118, 1194-1200, 1365-1375,
2066-2071).  This plugin plans and builds them itself (``platform_planned_layouts``, :mod:`kvpools_ascend.dsv4`):
the ``dsv4`` plugin's configurator counts, over the NPU buffers."""

TRAITS = PlatformTraits(
    platform=PLATFORM,
    page_size_rules=(
        PageSizeRule(
            sizes=(ASCEND_PAGE_SIZE,),
            reason="SGLang's Ascend attention backend pages its KV cache by 128 tokens",
            engine_message="At this moment Ascend attention backend only supports a page_size of 128, "
            "change page_size to 128.",
        ),
    ),
    slot_index_dtype="int32",
    pool_layouts={DSV4_KEY: DSV4_NPU_LAYOUT},
    platform_planned_layouts=frozenset({DSV4_KEY}),
    memory_tiers=(
        MemoryTier(max_mib=32 * 1024, chunked_prefill_size=4096, decode_max_bs=16, decode_max_bs_at_tp4=64),
        MemoryTier(max_mib=64 * 1024, chunked_prefill_size=8192, decode_max_bs=64, decode_max_bs_at_tp4=256),
    ),
)
"""What Ascend's kernels decide: page size 128 for every model (SGLang's server args force it for the ``ascend``
attention backend, with that warning), and int32 slot indices (``NPUPagedTokenToKVPoolAllocator`` returns
``out.int()``; ``_npu_reshape_and_cache`` takes int32 slots).  SGLang's NPU memory settings come before the GPU
tiers (``set_default_server_args``, ``srt/hardware_backend/npu/utils.py`` lines 103-160 of SGLang 0.5.23):
at most 32 GiB ``chunked_prefill_size`` 4096 and decode ``max_bs`` 16 (64 at TP >= 4), at most 64 GiB 8192 and
64 (256); larger NPUs take the GPU tiers.  No breakable prefill graph (CUDA only).  DeepSeek-V4's pools are
SGLang's NPU classes (:data:`DSV4_NPU_LAYOUT`, ``pool_layouts``), which this plugin plans and builds
(``platform_planned_layouts``)."""

ACCELERATORS: tuple[GPU, ...] = (
    GPU(
        "ascend-910b",
        "Huawei Ascend 910B 64GB",
        64 << 30,
        platform=PLATFORM,
        aliases=("910b", "ascend910b", "ascend-910b3", "910b3", "atlas-800t-a2"),
        source="Ascend 910B (Atlas 800T A2) specification: 64 GB HBM, npu-smi HBM capacity 65536 MB",
    ),
)
"""Ascend NPUs, each with the total SGLang reads on NPUs (``get_npu_memory_capacity``, the platform's total)."""


@hookimpl
def platforms() -> dict[str, str]:
    return {PLATFORM: "Huawei Ascend NPUs through torch_npu (device npu, npu:N)"}


@hookimpl
def platform_aliases() -> dict[str, str]:
    return dict(ALIASES)


@hookimpl
def accelerators() -> list[GPU]:
    return list(ACCELERATORS)


@hookimpl
def detect_platform(device: str | None) -> str | None:
    """``npu`` devices; with no device, a host where ``torch_npu`` is importable."""
    if device is None:
        return PLATFORM if runtime_importable() else None
    return PLATFORM if device.split(":", 1)[0] == DEVICE_TYPE else None


@hookimpl(tryfirst=True)
def platform_traits(serving: Serving) -> PlatformTraits | None:
    return TRAITS if serving.platform == PLATFORM else None


@hookimpl(tryfirst=True)
def engine_defaults(serving: Serving) -> list[EngineDefault] | None:
    """SGLang's NPU page when ``--page-size`` is unset: 128 for every model (``set_default_server_args``,
    ``srt/hardware_backend/npu/utils.py`` lines 96-101 of SGLang 0.5.23; DeepSeek-V4's NPU override,
    ``model_overrides/deepseek_v4.py``, takes 128 too).  Answered first, so it wins over an architecture's page."""
    if serving.platform != PLATFORM:
        return None
    reason = "SGLang 0.5.23's default on Ascend NPUs (set_default_server_args in srt/hardware_backend/npu/utils.py)"
    return [EngineDefault(option="page_size", value=ASCEND_PAGE_SIZE, reason=reason)]


@hookimpl(tryfirst=True)
def available_memory(device: str, serving: Serving) -> dict[str, int] | None:
    kind, _, index_text = device.partition(":")
    if kind != DEVICE_TYPE:
        return None
    try:
        import torch_npu
    except ImportError as exc:
        raise ConfigError(
            f"{option('device')} {device}: {RUNTIME} is not importable here ({exc}), so no NPU can be measured. "
            f"Install Ascend's torch_npu, or plan without an NPU by passing {option('memory')} or "
            f"{option('free_memory')} (and build on 'meta')."
        ) from exc
    npu = torch_npu.npu  # what ``torch.npu`` is once torch_npu is imported
    if not npu.is_available():
        raise ConfigError(f"{option('device')} {device}: torch_npu sees no NPU here.")
    index = int(index_text) if index_text else int(npu.current_device())
    if index >= npu.device_count():
        raise ConfigError(f"{option('device')} {device}: only {npu.device_count()} NPU(s) are visible.")
    free, total = npu.mem_get_info(index)
    return {"free_bytes": int(free), "total_bytes": int(total)}


def runtime_importable() -> bool:
    """Whether ``torch_npu`` can be imported here (found without importing it)."""
    if RUNTIME in sys.modules:  # imported already (or blocked: None)
        return sys.modules[RUNTIME] is not None
    try:
        return importlib.util.find_spec(RUNTIME) is not None
    except (ImportError, ValueError):
        return False
