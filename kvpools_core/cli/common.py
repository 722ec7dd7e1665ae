"""What every ``kvpools`` command shares: the serving and budget options generated from ``Serving``, the
output formats, the comparison block, and the error boundary (one paragraph, never a traceback)."""

from __future__ import annotations

import functools
import json
import sys
import traceback
import typing
from collections.abc import Callable
from typing import Any, NoReturn

import attrs
import click
from rich.console import Console

from kvpools_core.dtypes import KV_DTYPE_SPELLINGS
from kvpools_core.errors import ConfigError, KvpoolsError, PluginError, PluginHookError, short_repr
from kvpools_core.options import cli_surface, env_flag, option
from kvpools_core.planning.engine_version import RUNTIME_PROFILES, apply_engine_version
from kvpools_core.values import (
    DECODE_RETRACTION_BACKUPS,
    DSV4_ATTN_BACKENDS,
    DSV4_COMPRESS_STATE_DTYPES,
    DSV4_COMPRESSED_KV_LAYOUTS,
    DSV4_KV_LAYOUTS,
    HICACHE_MEM_LAYOUTS,
    HICACHE_WRITE_POLICIES,
    MM_FEATURE_TRANSPORTS,
    QUANTIZATION_METHODS,
    SERVED_DTYPES,
    SPECULATIVE_ALGORITHMS,
    UNMODELLED_QUANTIZATION_METHODS,
    Serving,
    is_unset,
)

_HELP = {
    "kv_cache_dtype": "KV element type (auto follows the model dtype).",
    "dtype": "Dtype the weights are served in (SGLang's/vLLM's --dtype; auto: the checkpoint's, a float32 one as "
    "float16, Gemma's as bfloat16); --kv-cache-dtype auto follows it.",
    "quantization": "fp8 on an unquantised checkpoint: quantise its Linear weights when they load (SGLang's "
    "per-channel fp8 Linears and per-expert fp8 MoE; vLLM's per tensor, deprecated from 0.31). vLLM's "
    "fp8_per_tensor / fp8_per_channel / fp8_per_block (--accounting vllm): its online fp8 from 0.20 (per_channel "
    "0.24). A quantised checkpoint's own method (modelopt, modelopt_fp4, "
    "compressed-tensors, awq, gptq_marlin, mxfp4, fp8, ...): checked against its quantization_config with the "
    "--accounting engine's rules; its storage is planned. Other engine methods are refused by name.",
    "page_size": "Tokens per page [default: SGLang's own for the model and platform (a plan note says which), else 1].",
    "tp_size": "Tensor-parallel size.",
    "pp_size": "Pipeline-parallel size.",
    "pp_rank": "Pipeline stage to plan.",
    "pp_layer_partition": "Layers per stage, comma separated (SGLang's SGLANG_PP_LAYER_PARTITION).",
    "dp_size": "Data-parallel size.",
    "enable_dp_attention": "DP attention: attention TP = tp / dp, requests split over DP workers.",
    "attn_cp_size": "Attention context-parallel size.",
    "dcp_size": "Decode context-parallel size.",
    "context_length": "Override the model's context length.",
    "max_running_requests": "Cap on concurrent requests (split over DP-attention workers).",
    "max_total_tokens": "Cap on KV tokens.",
    "mem_fraction_static": "Static memory fraction (runtime slack = pre-load memory x (1 - this)).",
    "chunked_prefill_size": "Chunked prefill size.  [default: SGLang's for the --gpu's memory, else 8192]",
    "post_capture_kv_sizing": "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=1 (--gpu/--gpu-memory only): where SGLang plans "
    "it, the default fraction reserves no graph/activation memory and a Mamba model's slack is at least the "
    "pre-capture activation reserve; the pre-capture pool is planned (an upper bound).",
    "disable_radix_cache": "Radix (prefix) cache off.",
    "disable_overlap_schedule": "Overlap schedule off.",
    "disable_cuda_graph": "SGLang's --disable-cuda-graph (no decode/prefill graph: its default fraction reserves no "
    "graph memory).",
    "prefill_only_disable_kv_cache": "Embedding prefill server without a KV cache (SGLang's flag): the no-op MHA pool "
    "keeps SGLang's token count but allocates one placeholder page per layer (plain MHA on CUDA; needs "
    "--disable-radix-cache).",
    "vlm_cache_size_mb": "Multimodal embedding cache reserved from a profiled budget (SGLANG_VLM_CACHE_SIZE_MB).",
    "mm_feature_transport": "Multimodal feature transport (SGLang's --mm-feature-transport; unset: cpu). cuda_ipc and "
    "cuda_vmm keep a GPU feature pool of --mm-feature-cache-mb, reserved from a multimodal model's profiled budget.",
    "mm_feature_cache_mb": "GPU feature pool of a cuda_ipc / cuda_vmm transport (SGLANG_MM_FEATURE_CACHE_MB).",
    "speculative_algorithm": "Speculative decoding algorithm.",
    "speculative_num_steps": "Draft steps.",
    "speculative_eagle_topk": "Draft top-k.",
    "speculative_num_draft_tokens": "Draft tokens verified per step.",
    "speculative_adaptive": "Adaptive speculative decoding (EAGLE/EAGLE3, top-k 1): pools sized for the largest "
    "candidate step + 1 draft tokens; SGLang falls back to static parameters elsewhere.",
    "speculative_adaptive_config": "SGLang's adaptive config JSON file (unset: its default tiers, steps 0-7).",
    "speculative_draft_num_layers": "Draft model layers (instead of --speculative-draft-model-path).",
    "enable_multi_layer_eagle": "EAGLE / EAGLE3 / NEXTN with one draft runner per draft step (SGLang's "
    "MultiLayerEagleWorkerV2): Inkling-class MTP heads only.",
    "disaggregation_mode": "Prefill/decode disaggregation role.",
    "enable_pd_role_switch": "Runtime prefill<->decode role switch (SGLang's flag): the node builds the decode request "
    "pools, with --disaggregation-decode-extra-slots pre-allocated rows (unset: none).",
    "disaggregation_decode_retraction_backup": "Where a decode node keeps retracted requests' KV (SGLang's flag); "
    "host_pool plans its HiCache host pool. Unset: SGLang infers it, stated in a note.",
    "disaggregation_decode_extra_slots": (
        "Request rows a decode node pre-allocates for transfers (unset: SGLang's default, twice the requests per "
        "DP worker when --max-running-requests leaves at most 32 per worker, else 0)."
    ),
    "swa_full_tokens_ratio": "Sliding-window tokens per full-attention token [default: SGLang's own for the model "
    "(a plan note says which), else 0.8].",
    "swa_eviction_interval": "Decode steps between sliding-window evictions (SGLANG_SWA_EVICTION_INTERVAL).",
    "mamba_full_memory_ratio": "Mamba state memory / KV memory [default: SGLang's own for the model (a plan note says "
    "which), else 0.9].",
    "max_mamba_cache_size": "Mamba state slots.",
    "mamba_ssm_dtype": "Mamba SSM state dtype.",
    "enable_mamba_extra_buffer": "Mamba ping-pong extra buffer.",
    "enable_mamba_extra_buffer_lazy": "Lazy mamba extra buffer.",
    "mamba_skip_decode_lock": "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK.",
    "enable_linear_replayssm": "ReplaySSM decode ring: L records per recurrent layer per state slot (GDN, KDA).",
    "enable_linear_replayssm_spec": "ReplaySSM spec-verify ring instead of the speculative intermediate SSM state "
    "(GDN, KDA).",
    "linear_replayssm_cache_len": "ReplaySSM ring length L [default: 16].",
    "dsa_prefill_backend": "DSA prefill attention backend (unset: flashmla_sparse, or SGLang's trtllm under "
    "--dcp-size above 1).",
    "dsa_decode_backend": "DSA decode attention backend (unset: flashmla_kv, or SGLang's trtllm under --dcp-size "
    "above 1).",
    "enable_dsa_cache_layer_split": "Split the GLM DSA cache layers over context-parallel ranks.",
    "m3_fp8_attn_gemm": "MiniMax-M3's fp8 attention GEMMs (SGLang turns them on with fp8_e4m3 KV, --attention-backend "
    "trtllm_mha on SM100): the indexer cache is fp8 too. Needs --kv-cache-dtype fp8_e4m3.",
    "qsa_indexer_dtype": "QSA models: the compressed index keys' dtype (SGLang's --qsa-indexer-dtype; auto: bfloat16).",
    "nvfp4_sm": "The Blackwell GPU (100: SM100, 120: SM120) --kv-cache-dtype nvfp4 runs on: it decides the MHA pool's "
    "scale layouts (SGLang reads it from the device).",
    "prefill_kv_cache_dequant_dtype": "nvfp4 prefill input (SGLang's --prefill-kv-cache-dequant-dtype): fp8_e4m3 keeps "
    "an fp8 dequant workspace (flashinfer), nvfp4 reads native NVFP4 (trtllm_mha, SM100); auto picks by the GPU.",
    "enable_hisparse": (
        "HiSparse: keep 1/host_to_device_ratio of the sparse-attention KV on the device (DSA latent rows, "
        "DeepSeek-V4 c4, MiniMax-M3 sparse layers; needs --disable-radix-cache)."
    ),
    "hisparse_config": "HiSparse config, a JSON object (SGLang's), e.g. '{\"host_to_device_ratio\": 4}'.",
    "dsv4_compress_state_dtype": "DeepSeek-V4 compressor state dtype (SGLANG_DSV4_COMPRESS_STATE_DTYPE).",
    "enable_online_compress": "DeepSeek-V4 online c128 compression: one (max, sum, kv) state row "
    "(SGLANG_OPT_USE_ONLINE_COMPRESS).",
    "enable_online_c128_mtp": "Allow online c128 with EAGLE top-k 1 MTP (SGLANG_EXPERIMENTAL_ONLINE_C128_MTP).",
    "dsv4_kv_layout": "DeepSeek-V4 main KV cache layout (SGLANG_DSV4_KV_LAYOUT); auto plans v4, SGLang's answer off "
    "SM100/SM103 (state v41 for a Blackwell server).",
    "dsv4_compressed_kv_layout": "DeepSeek-V4 compressed KV encoding next to a V4.1 main cache "
    "(SGLANG_DSV4_COMPRESSED_KV_LAYOUT).",
    "dsv4_attn_backend": "DeepSeek-V4 attention backend (SGLang's --dsv4-attn-backend): trtllm stores the pools as "
    "uniform 512 B fp8 rows (V4 layout, SM100/SM103); flashmla_mega forces the v41 layout.",
    "enable_encoder_swa_bounded_replay": "DeepSeek-V4.1's encoder SWA bounded replay (SGLang's "
    "--enable-encoder-swa-bounded-replay): SWA rows in per-request windows plus a replay workspace, no paged SWA "
    "pool, the full-only paged allocator.",
    "accounting": "exact: charge every byte built; sglang: SGLang's numbers exactly; vllm: vLLM 0.33's KV cache "
    "(plan and capacity only, with vLLM's flags; docs/vllm.md); trtllm: TensorRT-LLM 1.2's KV cache (plan and "
    "capacity only, with TensorRT-LLM's flags; docs/trtllm.md); or the accounting of another installed engine "
    "plugin (kvpools plugins; plan only, budget --memory).",
    "enable_hierarchical_cache": "HiCache: plan the host KV tier (pinned CPU mirrors of the device pools).",
    "hicache_ratio": "Host pool slots per device pool slot (SGLang's --hicache-ratio); unset with no --hicache-size: "
    "2.0, lowered to what the node holds (SGLang's auto-sizing).",
    "hicache_host_memory_fraction": "Share of the node's host memory (after --host-reserve, per rank) that auto-sized "
    "host pools may take (SGLang's --hicache-host-memory-fraction).",
    "hicache_size": "Host tier size per rank in GB (1e9 B), split over the host pools by device bytes; "
    "0 uses --hicache-ratio.",
    "hicache_mamba_ratio": "Mamba host state slots per device state slot (SGLang PR #39851); unset: --hicache-ratio, "
    "or a share of --hicache-size.",
    "hicache_mem_layout": "Host pool layout (SGLang's --hicache-mem-layout).",
    "hicache_write_policy": "HiCache write policy (SGLang's --hicache-write-policy).",
    "enable_unified_memory": "SGLang's unified memory pool: full KV, SWA KV and Mamba state in one arena whose "
    "split moves at run time (hybrid Mamba / SWA models; docs/unified-memory.md).",
    "disable_lazy_compaction": "Unified memory: compact eagerly on every free (SGLANG_DISABLE_LAZY_COMPACTION).",
    "enable_page_major_kv_layout": "One page-granular entry per slot holding every layer (SGLang's flag): implied by "
    "--enable-unified-memory, refused without it.",
    "nnodes": "Nodes the ranks (tp x pp) are spread over: ranks per node share its host memory.",
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "kv_cache_dtype": KV_DTYPE_SPELLINGS,
    "dtype": SERVED_DTYPES,
    "quantization": (*QUANTIZATION_METHODS, *UNMODELLED_QUANTIZATION_METHODS),
    "speculative_algorithm": SPECULATIVE_ALGORITHMS,
    "disaggregation_mode": ("null", "prefill", "decode"),
    "mamba_ssm_dtype": ("bfloat16", "float16", "float32"),
    "dsv4_compress_state_dtype": (*DSV4_COMPRESS_STATE_DTYPES, "fp32", "bf16"),
    "dsv4_kv_layout": DSV4_KV_LAYOUTS,
    "dsv4_compressed_kv_layout": DSV4_COMPRESSED_KV_LAYOUTS,
    "dsv4_attn_backend": DSV4_ATTN_BACKENDS,
    "hicache_mem_layout": HICACHE_MEM_LAYOUTS,
    "hicache_write_policy": HICACHE_WRITE_POLICIES,
    "disaggregation_decode_retraction_backup": DECODE_RETRACTION_BACKUPS,
    "mm_feature_transport": MM_FEATURE_TRANSPORTS,
    "prefill_kv_cache_dequant_dtype": ("auto", "fp8_e4m3", "nvfp4"),
    "qsa_indexer_dtype": ("auto", "bfloat16", "fp8_e4m3"),
}
_SPECIAL = {"platform", "plugin_options", "pp_layer_partition"}
_RESOLVED = {"platform_traits", "workspaces", "speculative_draft"}
"""Serving fields the pipeline resolves (from the plugins, from ``--speculative-draft-model-path``): never
command-line options."""


def _serving_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add one option per Serving field (defaults None, so unset fields keep Serving's defaults)."""
    hints = typing.get_type_hints(Serving)
    for field in reversed(attrs.fields(Serving)):
        if field.name in _SPECIAL or field.name in _RESOLVED:
            continue
        flag = "--" + field.name.replace("_", "-")
        kind = hints[field.name]
        help_text = _HELP.get(field.name, "")
        if kind is bool:
            command = click.option(flag, field.name, is_flag=True, default=None, help=help_text)(command)
            continue
        base = _base_type(kind)
        click_type: Any = base
        if field.name in _CHOICES:
            click_type = click.Choice(_CHOICES[field.name], case_sensitive=False)
        callback = None
        if field.name == "accounting":  # the installed engines' accountings: checked where the engine is resolved
            click_type, callback = click.STRING, _lower
        if (
            field.default is not None
            and field.default is not attrs.NOTHING
            and not hasattr(field.default, "factory")
            and not is_unset(field.default)  # its help says which default applies
        ):
            help_text += f"  [default: {field.default}]"
        command = click.option(
            flag, field.name, type=click_type, default=None, help=help_text, callback=callback, metavar=None
        )(command)
    command = click.option(
        "--pp-layer-partition", "pp_layer_partition", default=None, help=_HELP["pp_layer_partition"]
    )(command)
    command = click.option(
        "--plugin-option",
        "plugin_options",
        multiple=True,
        metavar="KEY=VALUE",
        help="A plugin-specific option (repeatable).",
    )(command)
    command = click.option(
        "--platform",
        "platform",
        default=None,
        help="Target platform, or an alias of one (default: the one a platform plugin detects, "
        "else the --device's type, else cuda).",
    )(command)
    command = click.option(
        "--speculative-draft-model-path",
        "draft_model",
        default=None,
        help="Draft model (preset, config.json or directory): its own architecture plugin sizes its draft_* pools "
        "(--accounting sglang keeps SGLang's layer-count scaling for the token count).",
    )(command)
    return command


def _base_type(kind: Any) -> Any:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if args else kind


_HOST_OPTIONS = ("host_memory", "host_reserve")
"""``plan()`` arguments that check the host tier against a node (``--enable-hierarchical-cache``)."""


def _host_args(options: dict[str, Any]) -> dict[str, Any]:
    return {name: options.pop(name, None) for name in _HOST_OPTIONS}


def _budget_options(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option(
        "--host-reserve",
        default=None,
        help="Host memory the host tier leaves to the OS and others (default: SGLang's 10 GiB; 0 for vLLM's "
        "--kv-offloading-size, which reserves none).",
    )(command)
    command = click.option(
        "--host-memory",
        default=None,
        help="The node's available host memory the host tier must fit (default: measured here, "
        "/proc/meminfo MemAvailable).",
    )(command)
    command = click.option(
        "--runtime-memory",
        default=None,
        help="With --gpu/--gpu-memory: what the runtime holds before the weights load (CUDA context, NCCL) "
        "[default: 1GiB on one GPU, 3GiB with TP/PP].",
    )(command)
    command = click.option(
        "--gpu-memory",
        default=None,
        help="Plan on a whole GPU of this total memory (e.g. 96GiB), like --gpu for one not in the catalogue.",
    )(command)
    command = click.option(
        "--gpu",
        default=None,
        metavar="NAME",
        help="Plan on a whole GPU from the catalogue (h100, h200, b200, mi300x, ...): total - runtime - weights - "
        "slack, with SGLang's default --mem-fraction-static and --chunked-prefill-size for it unless given.",
    )(command)
    command = click.option(
        "--reserved-memory",
        default=None,
        help="Memory reserved out of a profiled budget (multimodal caches). Not with --memory.",
    )(command)
    command = click.option(
        "--weights-memory",
        default=None,
        help="Memory the weights will take on the device, out of a profiled budget. Not with --memory.",
    )(command)
    command = click.option("--free-memory", default=None, help="State a device's free memory instead of measuring it.")(
        command
    )
    command = click.option("--device", default=None, help="Measure the budget on this device: cpu, cuda, cuda:N.")(
        command
    )
    command = click.option("--memory", default=None, help="The KV cache budget: bytes or e.g. 60GiB.")(command)
    return command


def _gpu_defaults(options: dict[str, Any], gpu: str | None, gpu_memory: str | None) -> None:
    """On a GPU, what SGLang resolves from its memory and the user did not give: the platform and the chunk.

    ``mem_fraction_static`` stays unset (``None``) so the plan computes SGLang's default;
    ``chunked_prefill_size`` takes SGLang's GPU tier (``sglang_chunked_prefill_size``).
    """
    if gpu is None and gpu_memory is None:
        return
    from kvpools_core.pipeline.gpus import custom_gpu, find_gpu, sglang_chunked_prefill_size

    chosen = find_gpu(gpu) if gpu is not None else custom_gpu(gpu_memory or 0, options.get("platform") or "cuda")
    if gpu is not None and options.get("platform") is None:
        options["platform"] = chosen.platform
    if options.get("chunked_prefill_size") is None:
        options["chunked_prefill_size"] = sglang_chunked_prefill_size(chosen.total_mib, chosen.platform)


def _make_serving(options: dict[str, Any], device: str | None) -> Serving:
    if options.get("accounting"):
        options["accounting"] = options["accounting"].strip().lower()
        resolve_accounting(options["accounting"])  # an accounting no installed engine answers: a ConfigError
    kwargs = {k: v for k, v in options.items() if v is not None and k not in _SPECIAL and k not in _RESOLVED}
    if options.get("pp_layer_partition"):
        try:
            kwargs["pp_layer_partition"] = tuple(int(x) for x in options["pp_layer_partition"].split(","))
        except ValueError as exc:
            raise ConfigError(
                f"--pp-layer-partition must be integers separated by commas, "
                f"got {short_repr(options['pp_layer_partition'])}."
            ) from exc
    plugin_options = {}
    for item in options.get("plugin_options") or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--plugin-option must look like KEY=VALUE, got {item!r}.")
        plugin_options[key] = value
    kwargs["plugin_options"] = plugin_options
    from kvpools_core.pipeline import select_platform
    from kvpools_core.registry import get_registry

    kwargs["platform"] = select_platform(options.get("platform"), device, get_registry())
    return Serving(**kwargs)


def _lower(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    return None if value is None else value.strip().lower()


def resolve_accounting(accounting: str) -> Any:
    """``--accounting``, checked against the installed engines (any case): the engine that answers it; an
    accounting no loaded engine answers is the ``ConfigError`` of :func:`kvpools_core.engines.engine_for`."""
    from kvpools_core.engines import engine_for

    return engine_for(accounting.strip().lower())


_VLLM_OPTIONS = (
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "num_gpu_blocks_override",
    "kv_offloading_size",
    "kv_offloading_backend",
    "runtime_profile",
    "limit_mm_per_prompt",
    "language_model_only",
)
"""vLLM's own option names, accepted by ``plan`` and ``capacity`` under ``--accounting vllm`` only."""


def _vllm_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's flags (``vllm serve``'s names), meaningful with ``--accounting vllm`` only; and ``--engine-version``,
    which picks the accounting and the runtime profile of either engine."""
    command = click.option(
        "--engine-version",
        default=None,
        metavar="ENGINE==X.Y",
        help="The engine and version to plan for, with its runtime-memory profile: vllm==0.15|0.16|0.19|0.20 ... 0.33 "
        "(--accounting vllm --runtime-profile X.Y: the profile applies to a --gpu / --gpu-memory budget; with "
        "--memory the plan is the exact one, in that release's KV layout and batch defaults) or sglang==0.5.23 "
        "(--accounting sglang). "
        "A plan made with a vLLM profile older or newer than the vLLM installed beside kvpools says so (docs/gpus.md).",
    )(command)
    only = " Only with --accounting vllm."
    command = click.option(
        "--language-model-only",
        is_flag=True,
        default=None,
        help="vLLM's --language-model-only: every multimodal limit 0, so no encoder profile pass and no vision tower "
        "weights (vLLM 0.33)." + only,
    )(command)
    command = click.option(
        "--limit-mm-per-prompt",
        default=None,
        metavar="JSON",
        help="vLLM's items per prompt per modality, a JSON object as vLLM 0.33 takes it: '{\"image\": 2, "
        '"video": 0}\' (999 for a modality not named; 0 for every modality of a vision tower drops its '
        "weights). With --runtime-profile it sizes the encoder's profile pass (docs/vllm.md)." + only,
    )(command)
    for flag, kind, help_text in reversed(
        (
            (
                "--gpu-memory-utilization",
                float,
                "vLLM's fraction of the GPU's TOTAL memory for the instance [default: 0.92].",
            ),
            (
                "--max-model-len",
                str,
                "vLLM's maximum tokens per request, or auto (-1): the largest the KV cache fits, at most the "
                "model's [default: the model's context length].",
            ),
            ("--max-num-seqs", int, "vLLM's cap on running requests [default: vllm serve's for the GPU]."),
            ("--max-num-batched-tokens", int, "vLLM's tokens per step [default: vllm serve's for the GPU]."),
            ("--block-size", int, "vLLM's tokens per KV block [default: 16]."),
            ("--num-gpu-blocks-override", int, "vLLM's fixed block count instead of the memory's."),
            (
                "--kv-offloading-size",
                float,
                "vLLM's CPU KV offload in GiB, for the whole engine (all TP x PP workers together); checked "
                "against --host-memory (default: measured) less --host-reserve (default 0).",
            ),
            (
                "--kv-offloading-backend",
                click.Choice(["native", "lmcache"]),
                "vLLM's offload backend with --kv-offloading-size [default: native].",
            ),
            (
                "--runtime-profile",
                click.Choice([*RUNTIME_PROFILES, *(f"vllm=={version}" for version in RUNTIME_PROFILES)]),
                "With --gpu / --gpu-memory: estimate vLLM's activation peak, non-torch memory and CUDA graphs, and "
                "take the GPU's total as torch reports it, from this vLLM version's calibrated profile "
                "(0.15, 0.16, or 0.19 to 0.33, also spelt vllm==0.33; docs/vllm.md) [default: off: those "
                "terms are 0, an upper bound].",
            ),
        )
    ):
        command = click.option(flag, type=kind, default=None, help=help_text + only)(command)
    return command


def _vllm_args(options: dict[str, Any]) -> dict[str, Any]:
    """Take vLLM's flags (and ``--engine-version``) out of ``options``: refused unless ``--accounting vllm``,
    which refuses SGLang's."""
    from_engine_version = apply_engine_version(options)
    args = {name: options.pop(name, None) for name in _VLLM_OPTIONS}
    if from_engine_version is not None:
        args["engine_version_profile"] = from_engine_version
    if (options.get("accounting") or "").lower() != "vllm":
        given = [f"--{name.replace('_', '-')}" for name, value in args.items() if value is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} vLLM's: only with --accounting vllm "
                "(SGLang's names are --mem-fraction-static, --context-length, --max-running-requests, --page-size)."
            )
        return args
    from kvpools_core.engines.vllm.deployment import VLLM_READ_FIELDS, sglang_option_refused

    options["accounting"] = "vllm"
    args.update(_host_args(options))  # the node vLLM's CPU offload (--kv-offloading-size) is checked against
    for name, value in options.items():
        if value is None or value == () or name in VLLM_READ_FIELDS:
            continue
        raise ConfigError(sglang_option_refused(name))
    return args


def _refuse_with_vllm(**given: Any) -> None:
    """Budget and report flags of SGLang's pipeline that ``--accounting vllm`` has no counterpart for."""
    named = [f"--{name.replace('_', '-')}" for name, value in given.items() if value]
    if named:
        raise ConfigError(
            f"{', '.join(named)} {'belongs' if len(named) == 1 else 'belong'} to SGLang's planning, not to "
            "--accounting vllm, whose budget is --memory SIZE (vLLM's --kv-cache-memory-bytes) or --gpu NAME / "
            "--gpu-memory SIZE with --gpu-memory-utilization and --weights-memory (docs/vllm.md)."
        )


_TRTLLM_OPTIONS = (
    "kv_cache_free_gpu_memory_fraction",
    "max_batch_size",
    "max_num_tokens",
    "tokens_per_block",
    "max_seq_len",
    "max_tokens",
    "max_gpu_total_bytes",
    "max_attention_window",
    "window_size_shares",
    "host_cache_size",
    "num_nextn_predict_layers",
    "decoding_type",
    "speculative_model_dir",
    "max_draft_len",
    "eagle3_one_model",
    "draft_weights_memory",
    "enable_attention_dp",
    "context_parallel_size",
    "cp_type",
)
"""TensorRT-LLM's own option names (``trtllm-serve``'s and ``KvCacheConfig``'s, with their underscores), accepted
by ``plan`` and ``capacity`` under ``--accounting trtllm`` only."""


DRAFT_MODEL_FLAGS: tuple[tuple[str, Any, str], ...] = (
    (
        "--decoding_type",
        str,
        "speculative_config.decoding_type of a separate draft model: Eagle3 (or Eagle), Draft_Target.",
    ),
    (
        "--speculative_model_dir",
        str,
        "speculative_config.speculative_model_dir: the draft model (preset, config.json or directory).",
    ),
)
"""A separate draft model's TensorRT-LLM flags as plan, build, capacity, fit and sweep take them."""
EAGLE3_ONE_MODEL_FLAG: tuple[str, Any, str] = (
    "--eagle3_one_model",
    click.Choice(["true", "false"], case_sensitive=False),
    "speculative_config.eagle3_one_model (true: the draft inside the target's engine, TensorRT-LLM's default; "
    "false: a second engine).",
)


def _trtllm_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """TensorRT-LLM's flags, spelled as ``trtllm-serve`` / ``KvCacheConfig`` spell them; ``--accounting trtllm``
    only."""
    only = " Only with --accounting trtllm."
    for flag, kind, help_text in reversed(
        (
            (
                "--kv_cache_free_gpu_memory_fraction",
                float,
                "TensorRT-LLM's fraction of the memory FREE AFTER its warm-up run for the KV cache [default: 0.9].",
            ),
            ("--max_batch_size", int, "TensorRT-LLM's cap on running requests [default: 2048]."),
            ("--max_num_tokens", int, "TensorRT-LLM's tokens per step [default: 8192]."),
            ("--tokens_per_block", int, "kv_cache_config.tokens_per_block [default: 32]."),
            ("--max_seq_len", int, "TensorRT-LLM's longest request [default: the model's context length]."),
            ("--max_tokens", int, "kv_cache_config.max_tokens: a cap on the KV cache's tokens."),
            ("--max_gpu_total_bytes", str, "kv_cache_config.max_gpu_total_bytes: a cap on the KV cache's bytes."),
            (
                "--max_attention_window",
                str,
                "kv_cache_config.max_attention_window, comma separated (a per-layer pattern; several sizes: VSWA).",
            ),
            (
                "--window_size_shares",
                str,
                "TRTLLM_WINDOW_SIZE_SHARES: each window size's share of the VSWA memory, smallest window first.",
            ),
            ("--host_cache_size", str, "kv_cache_config.host_cache_size: the host (secondary) pool's bytes."),
            (
                "--num_nextn_predict_layers",
                int,
                "speculative_config (decoding_type MTP): one-model MTP draft layers, with their own KV cache.",
            ),
            *DRAFT_MODEL_FLAGS,
            ("--max_draft_len", int, "speculative_config.max_draft_len: draft tokens per step."),
            EAGLE3_ONE_MODEL_FLAG,
            (
                "--draft_weights_memory",
                str,
                "With --gpu: the draft model's weights on each GPU, added to kvpools' estimate of the target's.",
            ),
        )
    ):
        command = click.option(flag, type=kind, default=None, help=help_text + only)(command)
    command = click.option(
        "--enable_attention_dp", is_flag=True, default=None, help="TensorRT-LLM's attention DP." + only
    )(command)
    command = click.option(
        "--context_parallel_size",
        "--cp_size",
        type=int,
        default=None,
        help="trtllm-serve --context_parallel_size: helix context parallelism's CP ranks (cp_config cp_type HELIX, "
        "an MLA model's decode split over the ranks by blocks)." + only,
    )(command)
    return click.option(
        "--cp_type",
        type=str,
        default=None,
        help="cp_config.cp_type [default: HELIX with --context_parallel_size > 1]; kvpools plans HELIX." + only,
    )(command)


def _trtllm_args(options: dict[str, Any]) -> dict[str, Any]:
    """Take TensorRT-LLM's flags out of ``options``: refused unless ``--accounting trtllm``, which refuses
    SGLang's."""
    args = {name: options.pop(name, None) for name in _TRTLLM_OPTIONS}
    if (options.get("accounting") or "").lower() != "trtllm":
        given = [f"--{name}" for name, value in args.items() if value not in (None, False)]
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} TensorRT-LLM's: only with --accounting "
                "trtllm (SGLang's names are --mem-fraction-static, --context-length, --max-running-requests, "
                "--page-size)."
            )
        return args
    from kvpools_core.engines.trtllm.deployment import TRTLLM_READ_FIELDS, sglang_option_refused

    options["accounting"] = "trtllm"
    host = {name: value for name, value in _host_args(options).items() if value is not None}
    if host:
        raise ConfigError(
            f"{', '.join('--' + name.replace('_', '-') for name in host)} size SGLang's and vLLM's host tiers; "
            "TensorRT-LLM's is --host_cache_size."
        )
    for name, value in options.items():
        if value is None or value == () or name in TRTLLM_READ_FIELDS or name in _VLLM_OPTIONS:
            continue  # vLLM's flags are refused by _vllm_args, naming them as vLLM's
        raise ConfigError(sglang_option_refused(name))
    args["enable_attention_dp"] = bool(args["enable_attention_dp"])
    if args["eagle3_one_model"] is not None:
        args["eagle3_one_model"] = args["eagle3_one_model"].lower() == "true"
    return args


def _refuse_with_trtllm(**given: Any) -> None:
    """Budget and report flags of SGLang's pipeline that ``--accounting trtllm`` has no counterpart for."""
    if given.get("speculative_draft_model_path"):
        raise ConfigError(
            "--speculative-draft-model-path is SGLang's; under --accounting trtllm the draft model is "
            "--speculative_model_dir, with --decoding_type Eagle3 (or Draft_Target) and --max_draft_len "
            "(TensorRT-LLM's speculative_config)."
        )
    named = [f"--{name.replace('_', '-')}" for name, value in given.items() if value]
    if named:
        raise ConfigError(
            f"{', '.join(named)} {'belongs' if len(named) == 1 else 'belong'} to SGLang's planning, not to "
            "--accounting trtllm, whose budget is --memory SIZE (the memory free after TensorRT-LLM's warm-up) or "
            "--gpu NAME / --gpu-memory SIZE with --weights-memory, and --kv_cache_free_gpu_memory_fraction "
            "(docs/trtllm.md)."
        )


def _trtllm_plan(
    model: str,
    serving: Serving,
    memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    weights_memory: str | None,
    args: dict[str, Any],
) -> Any:
    from kvpools_core.engines import engine_for

    return engine_for("trtllm").plan(
        model, serving, memory=memory, gpu=gpu, gpu_memory=gpu_memory, weights_memory=weights_memory, **args
    )


def _fail(error: KvpoolsError) -> None:
    click.echo(f"Error: {error}", err=True)
    sys.exit(1)


TRACEBACK_ENV = "KVPOOLS_TRACEBACK"
INTERRUPTED_STATUS = 130
"""The exit status of a command stopped by Ctrl-C (128 + SIGINT, as a shell reports it)."""


def _user_facing(command: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command with options named as flags; errors become one paragraph, never a traceback.

    A ``KvpoolsError`` is the user's to fix (exit 1; a plugin that failed to
    load shows its import's traceback under ``KVPOOLS_TRACEBACK=1``).  A plugin's failure
    (``PluginHookError``: a hook raised or answered against its contract,
    naming the plugin, its distribution and version, and the hook) and
    anything else (a bug in kvpools) are reported in one line (exit 2), with
    the traceback only under ``KVPOOLS_TRACEBACK=1``.  Ctrl-C (including in a
    plugin that hangs) is one line, exit 130.
    """

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        with cli_surface():
            show_traceback = False
            try:
                show_traceback = env_flag(TRACEBACK_ENV)
                return command(*args, **kwargs)
            except PluginHookError as error:
                _bug(
                    error,
                    f"Error: {error}",
                    "This is a bug in that plugin: report it to its authors with the output of the same command "
                    f"run with {TRACEBACK_ENV}=1, or disable the plugin with KVPOOLS_DISABLED_PLUGINS.",
                    show_traceback,
                )
            except KvpoolsError as error:
                if show_traceback and isinstance(error, PluginError) and error.__cause__ is not None:
                    traceback.print_exception(error, file=sys.stderr)  # a plugin's import failure, say
                _fail(error)
            except KeyboardInterrupt:
                click.echo("Error: interrupted (Ctrl-C).", err=True)
                sys.exit(INTERRUPTED_STATUS)
            except (click.exceptions.Exit, click.ClickException):
                raise
            except Exception as error:
                _bug(
                    error,
                    f"Error: internal error, a bug in kvpools: {type(error).__name__}: {error}.",
                    f"Please report it with the output of the same command run with {TRACEBACK_ENV}=1.",
                    show_traceback,
                )

    return run


def _bug(error: BaseException, message: str, report: str, show_traceback: bool) -> NoReturn:
    """A plugin's or kvpools' bug: one line (after the traceback under KVPOOLS_TRACEBACK=1); exit 2."""
    if show_traceback:
        traceback.print_exception(error, file=sys.stderr)
        click.echo(message, err=True)
    else:
        click.echo(f"{message} {report}", err=True)
    sys.exit(2)


def _console() -> Console:
    tty = sys.stdout.isatty()
    return Console(file=sys.stdout, width=None if tty else 120, no_color=not tty, highlight=False, soft_wrap=not tty)


def _compare_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--compare-platform",
        default=None,
        metavar="PLATFORM",
        help="Also plan the same request on PLATFORM (e.g. cuda) and report where the plans differ, and why.",
    )(command)


def _compare(
    model: str, serving: Serving, budget: dict[str, Any], platform: str | None
) -> tuple[str, Any, str | None] | None:
    """``(platform, its plan or None, why)``: the same request under another platform's rules.

    When that platform's page-size rules refuse this page size, the request is
    compared at the nearest page size its rules accept, and ``why`` says so.
    """
    if platform is None:
        return None
    from kvpools_core.errors import UnsupportedCombinationError
    from kvpools_core.pipeline import plan as make_plan
    from kvpools_core.pipeline import resolve_platform, resolve_platform_traits
    from kvpools_core.registry import get_registry

    other = attrs.evolve(serving, platform=platform, platform_traits=None, workspaces=())
    try:
        return platform, make_plan(model, other, **budget), None
    except UnsupportedCombinationError as error:
        refusal = str(error)
        try:
            traits = resolve_platform_traits(resolve_platform(other, get_registry()), get_registry()).traits
        except KvpoolsError:
            return platform, None, refusal
        pages = sorted({1, 16, 32, 64, 128, 256} | {size for rule in traits.page_size_rules for size in rule.sizes})
        for page in sorted(pages, key=lambda p: abs(p - serving.page_size)):
            if page == serving.page_size or not all(rule.allows(page) for rule in traits.page_size_rules):
                continue
            try:
                again = make_plan(model, attrs.evolve(other, page_size=page), **budget)
            except KvpoolsError:
                continue
            return platform, again, f"{refusal} Compared at {option('page_size')} {page}, which {platform} accepts."
        return platform, None, refusal
    except KvpoolsError as error:
        return platform, None, str(error)


def _comparison_json(result: Any, comparison: tuple[str, Any, str | None]) -> dict[str, Any]:
    from kvpools_core.cli.plan_report import comparison_summary

    platform, other, error = comparison
    return comparison_summary(result, other, error, platform)


def _render_comparison(result: Any, comparison: tuple[str, Any, str | None] | None) -> None:
    if comparison is None:
        return
    from kvpools_core.cli.plan_report import render_comparison

    platform, other, error = comparison
    render_comparison(result, other, error, platform, _console())


class _Main(click.Group):
    """The ``kvpools`` group: an unknown option's suggestions start with the options whose name it begins
    (``--speculative-draft`` -> ``--speculative-draft-model-path``), which click's three closest matches can miss
    among many similar flags."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.NoSuchOption as exc:
            command = exc.ctx.command if exc.ctx is not None else None
            if command is not None and exc.option_name.startswith("--"):
                names = sorted({o for param in command.params for o in getattr(param, "opts", ())})
                begun = [name for name in names if name.startswith(exc.option_name) and name != exc.option_name]
                if begun:
                    rest = [name for name in exc.possibilities or () if name not in begun]
                    setattr(exc, "possibilities", [*begun, *rest][:3])  # noqa: B010 (click types it Final)
            raise


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="kvpools")
def main() -> None:
    """Plan and build the KV-cache memory pools of an LLM serving engine."""


FORMATS = ("table", "json", "capacity-json")
"""Output formats: the human report, the command's JSON object, the capacity record for orchestrators."""


def _format_option(json_help: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--format table|json|capacity-json`` and ``--json``, its alias for ``--format json``."""

    def add(command: Callable[..., Any]) -> Callable[..., Any]:
        command = click.option("--json", "as_json", is_flag=True, help=f"{json_help} Same as --format json.")(command)
        return click.option(
            "--format",
            "output_format",
            type=click.Choice(FORMATS, case_sensitive=False),
            default=None,
            help="table: the report; json: one JSON object; capacity-json: the capacity record for orchestrators "
            "(one record per GPU rank, every pipeline stage planned; docs/capacity-record.md).  [default: table]",
        )(command)

    return add


def _output_format(output_format: str | None, as_json: bool) -> str:
    """The format asked for; ``--json`` beside another ``--format`` is a contradiction."""
    if as_json and output_format not in (None, "json"):
        raise ConfigError(f"--json is --format json; it cannot be combined with --format {output_format}. Drop one.")
    return "json" if as_json else (output_format or "table").lower()


def _capacity_json(model: str, serving: Serving, budget: dict[str, Any], context_len: int | None) -> None:
    """Print the capacity document of every pipeline stage of the deployment (``--format capacity-json``)."""
    from kvpools_core.planning.capacity_record import capacity_document, stage_plans

    click.echo(json.dumps(capacity_document(stage_plans(model, serving, **budget), context_len=context_len), indent=2))
