"""SGLang 0.5.23's post-capture KV sizing (``SGLANG_ENABLE_POST_CAPTURE_KV_SIZING``; ``post_capture_kv_sizing``).

With the switch on, SGLang sizes the KV pool twice: once before capturing the CUDA graphs (the pool kvpools plans)
and again after, from the memory the capture left free, capped at the first size (``compute_post_capture_kv_resize``,
``model_executor/model_runner_components/kv_pool_runtime.py`` L53-150).  The second size depends on what the capture
really took, which only the engine measures, so kvpools plans the pre-capture pool, an upper bound of the final one,
and says so.  What the switch changes in the pre-capture plan, each a formula of the installed SGLang 0.5.23:

* whether SGLang plans it at all (``post_capture_kv_sizing_planned``, ``srt/arg_groups/overrides.py`` L1791-1862):
  :func:`post_capture_planned`; where it does not, SGLang runs as without the switch and so does the plan;
* the default ``mem_fraction_static`` reserves no graph or activation memory, only
  ``1536 + tp x pp / 8 x 1024`` MiB and no 10 GiB floor (``memory_hook.py`` L291-295), and a multimodal model
  loses a fixed ``8 x 1024 / G`` (``adjust_mem_fraction_for_vlm``, L423-430): :func:`post_capture_reserved_mb`;
* a Mamba-state model's slack is at least the pre-capture activation reserve, since its state pool is allocated
  before the capture (``KVCacheConfigurator._profile_available_bytes``, ``mem_cache/kv_cache_configurator.py``
  L3006-3030; ledger row 000-130): :func:`pre_capture_activation_reserve_mb` and :func:`mamba_slack_floor_bytes`.
"""

from __future__ import annotations

import attrs

from kvpools_core.pipeline.gpus import (
    MAMBAISH_STATE,
    MAX_PREFILL_TOKENS,
    MLA_BACKEND,
    NO_POST_CAPTURE_KV_SIZING,
    model_traits,
    prefill_graph_enabled,
)
from kvpools_core.registry import Registry
from kvpools_core.values import ModelSpec, Serving

GiB = 1 << 30

POST_CAPTURE_BASE_RESERVE_MB = 1536
"""``reserved_mem = 1536`` before the parallel term when post-capture sizing is planned (``memory_hook.py`` L294)."""

POST_CAPTURE_VLM_RESERVE_MB = 8 * 1024
"""A multimodal model's fixed image-encoder headroom under post-capture sizing (``memory_hook.py`` L423-430)."""

_PREFILL_CAPTURE_STEPS = ((4, 33, 4), (48, 257, 16), (288, 513, 32), (576, 1025, 64), (1280, 4097, 256))


def largest_prefill_capture_size(max_bs: int) -> int:
    """``max(generate_prefill_cuda_graph_batch_sizes(max_bs))`` (``cuda_graph_hook.py`` L480-497), 0 when empty."""
    sizes = [size for start, stop, step in _PREFILL_CAPTURE_STEPS for size in range(start, stop, step)]
    sizes += list(range(4608, max_bs + 1, 512))
    return max((size for size in sizes if size <= max_bs), default=0)


@attrs.frozen
class PostCapture:
    """Whether SGLang plans post-capture KV sizing for this model and serving, and why not when it does not."""

    planned: bool
    why_not: str = ""
    mambaish: bool = False


def post_capture_planned(model: ModelSpec, serving: Serving, *, registry: Registry | None = None) -> PostCapture:
    """``post_capture_kv_sizing_planned`` (``overrides.py`` L1791-1862) for what kvpools models.

    Not modelled, so never a reason here: ``--enable-kv-cache-sharding``, ``--enable-memory-saver``, Mooncake's
    custom pool or EFA (all off by default).  ``--disable-cuda-graph`` disables the decode graph (L1838-1842) and the
    prefill graph (L1849).
    """
    traits = model_traits(model, registry)
    mambaish = MAMBAISH_STATE in traits
    if not serving.post_capture_kv_sizing:
        return PostCapture(False, "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING is off", mambaish)
    reasons: list[tuple[bool, str]] = [
        (serving.platform != "cuda", f"platform {serving.platform} (SGLang plans it on CUDA only, L1805)"),
        (serving.dcp_size != 1, "decode context parallelism (L1807)"),
        (MLA_BACKEND in traits, "an MLA-backend model (L1809)"),
        (serving.prefill_only_disable_kv_cache, "--prefill-only-disable-kv-cache (L1811)"),
    ]
    if serving.enable_unified_memory:
        hybrid_swa = any(layer.sliding_window is not None for layer in model.layers)
        spec = (serving.speculative_algorithm or "").upper()
        reasons += [
            (not hybrid_swa or mambaish, "unified memory on a model not hybrid-SWA or with a Mamba state (L1831)"),
            (spec in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "DFLASH"), f"unified memory with {spec} (L1835)"),
        ]
    reasons.append(
        (
            serving.disable_cuda_graph and serving.disaggregation_mode != "prefill",
            "the decode CUDA graph is disabled: --disable-cuda-graph (L1838-1842)",
        )
    )
    if serving.disaggregation_mode != "decode":
        on, off_why = prefill_graph_enabled(model, serving, registry=registry)
        chunk = serving.chunked_prefill_size or 0
        capture = chunk if serving.max_total_tokens is None else min(chunk, serving.max_total_tokens)
        reasons += [
            (not on, f"no prefill CUDA graph: {off_why} (L1849)"),
            (chunk <= 0, "chunked prefill off (L1851)"),
            (
                on and chunk > 0 and chunk > largest_prefill_capture_size(capture),
                f"the largest prefill chunk {chunk} is not a captured prefill size (L1852)",
            ),
        ]
    reasons.append((NO_POST_CAPTURE_KV_SIZING in traits, "a DeepSeek-V4 or MiniMax-M3 sparse model (L1859-1860)"))
    for off, why in reasons:
        if off:
            return PostCapture(False, why, mambaish)
    return PostCapture(True, "", mambaish)


def post_capture_reserved_mb(tp_size: int, pp_size: int) -> float:
    """The default fraction's reserve when post-capture sizing is planned: ``1536 + tp x pp / 8 x 1024`` MiB
    (``memory_hook.py`` L291-295; no graph or activation term, no 10 GiB floor)."""
    return POST_CAPTURE_BASE_RESERVE_MB + tp_size * pp_size / 8 * 1024


def pre_capture_activation_reserve_mb(gpu_mib: float, serving: Serving, decode_max_bs: int) -> float:
    """``pre_capture_activation_reserve_mb`` (``srt/runtime_context.py`` L1797-1817), MiB.

    ``512 + 1.5 x activation tokens + tp x pp / 8 x 1024``, at least 10240 on a GPU over 60 GiB; the activation
    tokens are ``max(chunked_prefill_size, 2048)`` (``max(max_prefill_tokens 16384, 2048)`` with chunked prefill
    off) and on a PD decode node ``max(running x draft tokens, 2048)`` with running ``--max-running-requests`` or
    the decode graph's ``max_bs``.
    """
    chunk = serving.chunked_prefill_size or 0
    if serving.disaggregation_mode == "decode":
        running = serving.max_running_requests or decode_max_bs or 1
        tokens = max(running * (serving.speculative_num_draft_tokens or 1), 2048)
    elif chunk > 0:
        tokens = max(chunk, 2048)
    else:
        tokens = max(MAX_PREFILL_TOKENS, 2048)
    reserved = 512 + tokens * 1.5 + serving.tp_size * serving.pp_size / 8 * 1024
    if gpu_mib > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    return reserved


def mamba_slack_floor_bytes(
    *, pre_model_load_bytes: int, mem_fraction_static: float, reserve_mb: float
) -> tuple[int, str]:
    """What a Mamba-state model's pre-capture budget loses beyond SGLang's usual slack:
    ``slack = max(pre_load x (1 - fraction), reserve / 1024)`` GiB (``kv_cache_configurator.py`` L3006-3030), so the
    extra is ``max(0, reserve / 1024 - pre_load x (1 - fraction))`` GiB; returns it (bytes) and the step line."""
    slack_gb = pre_model_load_bytes / GiB * (1 - mem_fraction_static)
    floor_gb = reserve_mb / 1024
    extra_gb = max(0.0, floor_gb - slack_gb)
    line = (
        f"- post-capture KV sizing, Mamba state: slack at least the pre-capture activation reserve "
        f"{reserve_mb:g} MiB = {floor_gb:.4f} GiB; {extra_gb:.4f} GiB more than the {slack_gb:.4f} GiB slack"
    )
    return int(extra_gb * GiB), line


__all__ = [
    "POST_CAPTURE_BASE_RESERVE_MB",
    "POST_CAPTURE_VLM_RESERVE_MB",
    "PostCapture",
    "largest_prefill_capture_size",
    "mamba_slack_floor_bytes",
    "post_capture_planned",
    "post_capture_reserved_mb",
    "pre_capture_activation_reserve_mb",
]
