"""DeepSeek-V4 compressed attention (V4-Flash, V4-Pro): SWA, c4 + indexer, c128 and compressor-state pools.

Claims exactly the configs SGLang's ``is_deepseek_v4`` recognises (the mla,
dsa and swa plugins decline them) and reads each layer's kind from
``compress_ratios`` (:mod:`.config`).  Sizing is SGLang's
``DSV4PoolConfigurator`` (``--accounting sglang``, token-exact) or kvpools'
exact solve over every buffer the pool allocates (:mod:`.sizing`,
:mod:`.buffers`).  SGLang's DeepSeek-V4 environment switches are typed
``Serving`` options here (``dsv4_compress_state_dtype``,
``enable_online_compress``, ``enable_online_c128_mtp``), beside its HiSparse
server args (``enable_hisparse``, ``hisparse_config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvpools_core import for_architecture, hookimpl
from kvpools_core.values import Budget, CellSize, EngineDefault, HostPool, ModelSpec, Plan, PoolSizing, Serving

from .building import build_allocator, build_pool
from .config import ARCHITECTURE, parse_dsv4_config
from .host import dsv4_host_pools
from .layouts import layout_problems
from .low_ratio import low_ratio_problems, v41_problems
from .sizing import dsv4_cell_size, dsv4_problems, size_dsv4_pools
from .speculative import ring_problems, speculative_problems
from .traits import architecture_traits as architecture_traits
from .trtllm import backend_problems
from .weights import estimate_weights as estimate_weights

__all__ = ["ARCHITECTURE", "build_allocator", "build_pool"]

PRESET_DIR = Path(__file__).parent / "presets"
DSV4_PAGE_SIZE = 256
"""The page SGLang's CUDA DeepSeek-V4 pool takes (and sets when ``--page-size`` is unset)."""
DSV4_SWA_FULL_TOKENS_RATIO = 0.1
V41_MODEL_TYPE = "deepseek_v41"
"""DeepSeek-V4.1 checkpoints keep SGLang's generic ratio (its override skips them)."""


@hookimpl
def presets() -> dict[str, str]:
    return {path.stem: str(path) for path in sorted(PRESET_DIR.glob("*.json"))}


@hookimpl
def engine_features() -> dict[str, list[str]]:
    """SGLang 0.5.23 runs HiSparse on DeepSeek-V4 (``is_deepseek_v4`` in ``validate_hisparse``), and encoder SWA
    replay on its V4.1 checkpoints (:mod:`.encoder_replay`, which refuses the others)."""
    return {ARCHITECTURE: ["hisparse", "encoder_swa_bounded_replay"]}


@hookimpl
def parse_model_config(config: Mapping[str, Any], source: str) -> ModelSpec | None:
    return parse_dsv4_config(config, source)


@hookimpl
@for_architecture(ARCHITECTURE)
def validate(model: ModelSpec, serving: Serving) -> list[str] | None:
    problems = [
        *dsv4_problems(model, serving),
        *layout_problems(model, serving),
        *backend_problems(model, serving),
        *low_ratio_problems(model, serving),
        *v41_problems(model, serving),
        *speculative_problems(serving),
        *ring_problems(model, serving),
    ]
    return problems


DSV4_MAX_RUNNING_REQUESTS = 256
"""``apply_deepseek_v4_defaults`` (``arg_groups/deepseek_v4_hook.py``): ``max_running_requests`` 256 when unset."""
SGLANG_ACCOUNTINGS = ("exact", "sglang")
"""The accountings that plan SGLang's server (the vLLM and TensorRT-LLM ones keep their engines' own limits)."""


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_defaults(model: ModelSpec, serving: Serving) -> list[EngineDefault] | None:
    """SGLang 0.5.23's DeepSeek-V4 defaults for unset options (``arg_groups/model_overrides/deepseek_v4.py``,
    ``_deepseek_v4_overrides``): ``--page-size`` 256 (the NPU branch's 128 comes from the Ascend platform, which
    answers first), and ``--swa-full-tokens-ratio`` 0.1 except for DeepSeek-V4.1 checkpoints
    (``model_type`` ``deepseek_v41``); under SGLang's accountings ``--max-running-requests`` 256
    (``apply_deepseek_v4_defaults``, ``arg_groups/deepseek_v4_hook.py``), which also fixes the c128 state's
    reservation (ref-002 ``requested_max_running_requests_per_worker``) instead of the configurator's estimate."""
    defaults = [PAGE_SIZE_DEFAULT]
    if model.model_type != V41_MODEL_TYPE:
        defaults.append(SWA_RATIO_DEFAULT)
    if serving.accounting in SGLANG_ACCOUNTINGS:
        defaults.append(MAX_RUNNING_REQUESTS_DEFAULT)
    return defaults


_SOURCE = "_deepseek_v4_overrides in arg_groups/model_overrides/deepseek_v4.py"
# frozen values: built once, answered to every plan
PAGE_SIZE_DEFAULT = EngineDefault(
    option="page_size",
    value=DSV4_PAGE_SIZE,
    reason=f"SGLang 0.5.23's default for DeepSeek-V4's compressed attention ({_SOURCE})",
)
SWA_RATIO_DEFAULT = EngineDefault(
    option="swa_full_tokens_ratio",
    value=DSV4_SWA_FULL_TOKENS_RATIO,
    reason=f"SGLang 0.5.23's default for DeepSeek-V4 ({_SOURCE})",
)
MAX_RUNNING_REQUESTS_DEFAULT = EngineDefault(
    option="max_running_requests",
    value=DSV4_MAX_RUNNING_REQUESTS,
    reason=(
        "SGLang 0.5.23's default for DeepSeek-V4 (apply_deepseek_v4_defaults in "
        "arg_groups/deepseek_v4_hook.py, which arg_groups/model_hook.py runs: 'Setting "
        "max_running_requests to 256')"
    ),
)


@hookimpl
@for_architecture(ARCHITECTURE)
def engine_layer_specs(engine: str, model: ModelSpec, serving: Serving) -> tuple[Any, ...] | None:
    """``--accounting trtllm``: each layer's buffers as TensorRT-LLM's ``DeepseekV4CacheManager`` (a
    ``KVCacheManagerV2``) declares them (:mod:`.trtllm_manager`); None for other engines."""
    from kvpools_core.parts.trtllm import ENGINE

    from .trtllm_manager import dsv4_trtllm_layers

    if engine == ENGINE:
        return dsv4_trtllm_layers(model, serving)
    return None


@hookimpl
@for_architecture(ARCHITECTURE)
def vllm_kv_cache_specs(model: ModelSpec, serving: Serving, block_size: int) -> dict[str, Any] | None:
    """vLLM 0.33's DeepSeek-V4 caches (:mod:`.vllm`): the compressed MLA latents and indexer keys
    (``tokens_per_state`` = compress ratio), the SWA cache and the compressors' states, padded to 576 bytes."""
    from .vllm import dsv4_vllm_specs

    return dsv4_vllm_specs(model, serving, block_size)


@hookimpl
@for_architecture(ARCHITECTURE)
def estimate_cell_size(model: ModelSpec, serving: Serving) -> CellSize | None:
    return dsv4_cell_size(model, serving)


@hookimpl
@for_architecture(ARCHITECTURE)
def size_pools(model: ModelSpec, serving: Serving, cell: CellSize, budget: Budget) -> PoolSizing | None:
    return size_dsv4_pools(model, serving, cell, budget)


@hookimpl
@for_architecture(ARCHITECTURE)
def host_pools(plan: Plan) -> list[HostPool] | None:
    """DeepSeek-V4's paged host mirrors (:mod:`.host`): SGLang's ``build_deepseek_v4_hicache_stack``."""
    return dsv4_host_pools(plan)
