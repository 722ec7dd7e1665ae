"""The ``kvpools`` command line: ``plan``, ``capacity``, ``compare``, ``build``, ``fit``, ``sweep``, ``plugins``,
``presets``.

Serving options are generated from the fields of :class:`Serving`, under
SGLang's server-arg names, so the CLI can never drift from the values.
Errors a user can fix print one paragraph and exit 1, never a traceback.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import traceback
import typing
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import attrs
import click
from rich.console import Console

from kvpools_core.dtypes import KV_DTYPE_CHOICES
from kvpools_core.errors import ConfigError, KvpoolsError, PluginError, PluginHookError, short_repr
from kvpools_core.options import cli_surface, env_flag, option
from kvpools_core.registry import get_registry
from kvpools_core.values import (
    ACCOUNTING_MODES,
    DECODE_RETRACTION_BACKUPS,
    DSV4_COMPRESS_STATE_DTYPES,
    HICACHE_MEM_LAYOUTS,
    HICACHE_WRITE_POLICIES,
    SGLANG_ACCOUNTING_MODES,
    SPECULATIVE_ALGORITHMS,
    Serving,
    is_unset,
)

_HELP = {
    "kv_cache_dtype": "KV element type (auto follows the model dtype).",
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
    "chunked_prefill_size": "Chunked prefill size.",
    "disable_radix_cache": "Radix (prefix) cache off.",
    "disable_overlap_schedule": "Overlap schedule off.",
    "vlm_cache_size_mb": "Multimodal embedding cache reserved from a profiled budget (SGLANG_VLM_CACHE_SIZE_MB).",
    "speculative_algorithm": "Speculative decoding algorithm.",
    "speculative_num_steps": "Draft steps.",
    "speculative_eagle_topk": "Draft top-k.",
    "speculative_num_draft_tokens": "Draft tokens verified per step.",
    "speculative_draft_num_layers": "Draft model layers (instead of --speculative-draft-model-path).",
    "disaggregation_mode": "Prefill/decode disaggregation role.",
    "disaggregation_decode_retraction_backup": "Where a decode node keeps retracted requests' KV (SGLang's flag); "
    "host_pool plans its HiCache host pool. Unset: SGLang infers it, stated in a note.",
    "disaggregation_decode_extra_slots": (
        "Request rows a decode node pre-allocates for transfers (unset: SGLang's default, twice the requests per "
        "DP worker when --max-running-requests leaves at most 32 per worker, else 0)."
    ),
    "swa_full_tokens_ratio": "Sliding-window tokens per full-attention token [default: SGLang's own for the model "
    "(a plan note says which), else 0.8].",
    "swa_eviction_interval": "Decode steps between sliding-window evictions (SGLANG_SWA_EVICTION_INTERVAL).",
    "mamba_full_memory_ratio": "Mamba state memory / KV memory.",
    "max_mamba_cache_size": "Mamba state slots.",
    "mamba_ssm_dtype": "Mamba SSM state dtype.",
    "enable_mamba_extra_buffer": "Mamba ping-pong extra buffer.",
    "enable_mamba_extra_buffer_lazy": "Lazy mamba extra buffer.",
    "mamba_skip_decode_lock": "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK.",
    "dsa_prefill_backend": "DSA prefill attention backend.",
    "dsa_decode_backend": "DSA decode attention backend.",
    "enable_dsa_cache_layer_split": "Split the GLM DSA cache layers over context-parallel ranks.",
    "enable_hisparse": (
        "HiSparse: keep 1/host_to_device_ratio of the sparse-attention KV on the device (DSA latent rows, "
        "DeepSeek-V4 c4, MiniMax-M3 sparse layers; needs --disable-radix-cache)."
    ),
    "hisparse_config": "HiSparse config, a JSON object (SGLang's), e.g. '{\"host_to_device_ratio\": 4}'.",
    "dsv4_compress_state_dtype": "DeepSeek-V4 compressor state dtype (SGLANG_DSV4_COMPRESS_STATE_DTYPE).",
    "enable_online_compress": "DeepSeek-V4 online c128 compression: one (max, sum, kv) state row "
    "(SGLANG_OPT_USE_ONLINE_COMPRESS).",
    "enable_online_c128_mtp": "Allow online c128 with EAGLE top-k 1 MTP (SGLANG_EXPERIMENTAL_ONLINE_C128_MTP).",
    "accounting": "exact: charge every byte built; sglang: SGLang's numbers exactly; vllm: vLLM 0.33's KV cache "
    "(plan and capacity only, with vLLM's flags; docs/vllm.md).",
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
    "nnodes": "Nodes the ranks (tp x pp) are spread over: ranks per node share its host memory.",
}
_CHOICES: dict[str, tuple[str, ...]] = {
    "kv_cache_dtype": KV_DTYPE_CHOICES,
    "speculative_algorithm": SPECULATIVE_ALGORITHMS,
    "disaggregation_mode": ("null", "prefill", "decode"),
    "accounting": ACCOUNTING_MODES,
    "mamba_ssm_dtype": ("bfloat16", "float16", "float32"),
    "dsv4_compress_state_dtype": (*DSV4_COMPRESS_STATE_DTYPES, "fp32", "bf16"),
    "hicache_mem_layout": HICACHE_MEM_LAYOUTS,
    "hicache_write_policy": HICACHE_WRITE_POLICIES,
    "disaggregation_decode_retraction_backup": DECODE_RETRACTION_BACKUPS,
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
        if (
            field.default is not None
            and field.default is not attrs.NOTHING
            and not hasattr(field.default, "factory")
            and not is_unset(field.default)  # its help says which default applies
        ):
            help_text += f"  [default: {field.default}]"
        command = click.option(flag, field.name, type=click_type, default=None, help=help_text)(command)
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
    from kvpools_core.gpus import custom_gpu, find_gpu, sglang_chunked_prefill_size

    chosen = find_gpu(gpu) if gpu is not None else custom_gpu(gpu_memory or 0, options.get("platform") or "cuda")
    if gpu is not None and options.get("platform") is None:
        options["platform"] = chosen.platform
    if options.get("chunked_prefill_size") is None:
        options["chunked_prefill_size"] = sglang_chunked_prefill_size(chosen.total_mib, chosen.platform)


def _make_serving(options: dict[str, Any], device: str | None) -> Serving:
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


_VLLM_OPTIONS = (
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "block_size",
    "num_gpu_blocks_override",
    "kv_offloading_size",
    "kv_offloading_backend",
)
"""vLLM's own option names, accepted by ``plan`` and ``capacity`` under ``--accounting vllm`` only."""


def _vllm_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's flags (``vllm serve``'s names), meaningful with ``--accounting vllm`` only."""
    only = " Only with --accounting vllm."
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
        )
    ):
        command = click.option(flag, type=kind, default=None, help=help_text + only)(command)
    return command


def _vllm_args(options: dict[str, Any]) -> dict[str, Any]:
    """Take vLLM's flags out of ``options``: refused unless ``--accounting vllm``, which refuses SGLang's."""
    args = {name: options.pop(name, None) for name in _VLLM_OPTIONS}
    if (options.get("accounting") or "").lower() != "vllm":
        given = [f"--{name.replace('_', '-')}" for name, value in args.items() if value is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} vLLM's: only with --accounting vllm "
                "(SGLang's names are --mem-fraction-static, --context-length, --max-running-requests, --page-size)."
            )
        return args
    from kvpools_core.vllm.deployment import VLLM_READ_FIELDS, sglang_option_refused

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


def _vllm_plan(
    model: str,
    serving: Serving,
    memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    weights_memory: str | None,
    args: dict[str, Any],
) -> Any:
    from kvpools_core.vllm.deployment import plan_vllm

    return plan_vllm(
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
    from kvpools_core.report import comparison_summary

    platform, other, error = comparison
    return comparison_summary(result, other, error, platform)


def _render_comparison(result: Any, comparison: tuple[str, Any, str | None] | None) -> None:
    if comparison is None:
        return
    from kvpools_core.report import render_comparison

    platform, other, error = comparison
    render_comparison(result, other, error, platform, _console())


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
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
    from kvpools_core.capacity_record import capacity_document, stage_plans

    click.echo(json.dumps(capacity_document(stage_plans(model, serving, **budget), context_len=context_len), indent=2))


@main.command()
@click.argument("model")
@_budget_options
@_serving_options
@_format_option("Print one JSON object (loads back with Plan.from_json).")
@click.option(
    "--context",
    "context",
    default=None,
    metavar="L",
    help="The context length the capacity record states its concurrency at (32768, 32k, 1M); only with "
    "--format capacity-json.  [default: the model's context length]",
)
@_compare_option
@_vllm_options
@click.option(
    "--all-ranks",
    is_flag=True,
    help="Plan every (PP, TP) rank and show what they agree on; --memory, --free-memory and --weights-memory "
    "then take one value or one per pipeline stage (comma separated).",
)
@_user_facing
def plan(
    model: str,
    memory: str | None,
    device: str | None,
    free_memory: str | None,
    weights_memory: str | None,
    reserved_memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    runtime_memory: str | None,
    draft_model: str | None,
    output_format: str | None,
    as_json: bool,
    context: str | None,
    compare_platform: str | None,
    all_ranks: bool,
    **options: Any,
) -> None:
    """Plan the KV-cache pools of MODEL (a preset, a config.json or a directory holding one)."""
    from kvpools_core.capacity import parse_context_len
    from kvpools_core.pipeline import plan as make_plan
    from kvpools_core.report import plan_summary, render_plan

    fmt = _output_format(output_format, as_json)
    vllm_args = _vllm_args(options)
    if options["accounting"] == "vllm":
        _refuse_with_vllm(
            device=device,
            free_memory=free_memory,
            reserved_memory=reserved_memory,
            runtime_memory=runtime_memory,
            speculative_draft_model_path=draft_model,
            context=context,
            compare_platform=compare_platform,
            all_ranks=all_ranks,
            format_capacity_json=fmt == "capacity-json",
        )
        result = _vllm_plan(model, _make_serving(options, None), memory, gpu, gpu_memory, weights_memory, vllm_args)
        if fmt == "json":
            click.echo(json.dumps(result.to_dict(), indent=2))
        else:
            from kvpools_core.vllm.report import render_vllm_plan

            render_vllm_plan(result, _console())
        return
    if context is not None and fmt != "capacity-json":
        raise ConfigError("--context states the context of the capacity record: use it with --format capacity-json.")
    if compare_platform is not None and fmt == "capacity-json":
        raise ConfigError("--compare-platform reports on the plan: use it with --format table or json.")
    _gpu_defaults(options, gpu, gpu_memory)
    host = _host_args(options)
    serving = _make_serving(options, device)
    if all_ranks:
        _plan_all_ranks(
            model,
            serving,
            memory,
            device,
            free_memory,
            weights_memory,
            reserved_memory,
            draft_model,
            fmt,
            parse_context_len(context) if context is not None else None,
            compare_platform,
            gpu=gpu,
            gpu_memory=gpu_memory,
            runtime_memory=runtime_memory,
        )
        return
    budget: dict[str, Any] = dict(
        memory=memory,
        device=device,
        free_memory=free_memory,
        weights_memory=weights_memory,
        reserved_memory=reserved_memory,
        draft_model=draft_model,
        gpu=gpu,
        gpu_memory=gpu_memory,
        runtime_memory=runtime_memory,
    )
    if fmt == "capacity-json":
        _capacity_json(model, serving, {**budget, **host}, parse_context_len(context) if context is not None else None)
        return
    as_json = fmt == "json"
    result = make_plan(model, serving, **budget, **host)
    comparison = _compare(model, serving, {**budget, **host}, compare_platform)
    if as_json:
        summary = plan_summary(result)
        if comparison is not None:
            summary["comparison"] = _comparison_json(result, comparison)
        click.echo(json.dumps(summary, indent=2))
    else:
        render_plan(result, _console())
        _render_comparison(result, comparison)


def _per_stage(value: str | None) -> str | list[str] | None:
    """``--all-ranks`` sizes: one value for every rank, or a comma-separated list with one per stage."""
    if value is None or "," not in value:
        return value
    return [item.strip() for item in value.split(",")]


def _plan_all_ranks(
    model: str,
    serving: Serving,
    memory: str | None,
    device: str | None,
    free_memory: str | None,
    weights_memory: str | None,
    reserved_memory: str | None,
    draft_model: str | None,
    fmt: str,
    context_len: int | None,
    compare_platform: str | None,
    *,
    gpu: str | None,
    gpu_memory: str | None,
    runtime_memory: str | None,
) -> None:
    """``--all-ranks``: the rank table, its JSON, or the capacity record of the agreed stage plans."""
    from kvpools_core.distributed import plan_all_ranks
    from kvpools_core.ranks_report import ranks_summary, render_ranks

    if device is not None or compare_platform is not None:
        flag = "--device" if device is not None else "--compare-platform"
        raise ConfigError(
            f"{flag} does not combine with --all-ranks: state each stage's memory with --memory or --free-memory "
            f"(one value, or one per stage); a process group measures its own (kvpools_core.distributed.plan_on_group)."
        )
    result = plan_all_ranks(
        model,
        serving,
        memory=_per_stage(memory),
        free_memory=_per_stage(free_memory),
        weights_memory=_per_stage(weights_memory),
        reserved_memory=_per_stage(reserved_memory),
        draft_model=draft_model,
        gpu=gpu,
        gpu_memory=gpu_memory,
        runtime_memory=runtime_memory,
    )
    if fmt == "capacity-json":
        from kvpools_core.capacity_record import capacity_document

        stages = {p.serving.pp_rank: p for p in result.plans}
        click.echo(json.dumps(capacity_document(list(stages.values()), context_len=context_len), indent=2))
    elif fmt == "json":
        click.echo(json.dumps(ranks_summary(result), indent=2))
    else:
        render_ranks(result, _console())


@main.command()
@click.argument("model")
@_budget_options
@_serving_options
@click.option(
    "--context",
    "contexts",
    multiple=True,
    metavar="L",
    help="Context lengths to ask about (repeatable or comma separated; 32768, 32k, 1M) instead of the default "
    "ladder 1k ... 1M.",
)
@click.option(
    "--requests",
    "requests",
    type=int,
    default=None,
    help="Also print the largest context this many concurrent requests all reach.",
)
@click.option(
    "--headroom",
    type=float,
    default=0.1,
    show_default=True,
    help="Fraction of the binding pool the recommended SGLang flags leave free.",
)
@click.option(
    "--workload",
    default=None,
    metavar="SPEC",
    help="Also choose the split of the budget that runs the most requests of this workload at once: a context "
    "length (8k), 'lognormal:median=4096,p99=32768', 'uniform:1k..32k', or a JSONL trace of "
    '{"input_len": ..., "output_len": ...} records.',
)
@_format_option("Print one JSON object.")
@_vllm_options
@_user_facing
def capacity(
    model: str,
    memory: str | None,
    device: str | None,
    free_memory: str | None,
    weights_memory: str | None,
    reserved_memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    runtime_memory: str | None,
    draft_model: str | None,
    contexts: tuple[str, ...],
    requests: int | None,
    headroom: float,
    workload: str | None,
    output_format: str | None,
    as_json: bool,
    **options: Any,
) -> None:
    """How many concurrent requests of each context length fit MODEL's planned pools, and what binds.

    Also the largest context N requests all reach (--requests N), the largest single-request context, and
    --max-running-requests / --context-length flags for SGLang with --headroom of the binding pool free.
    With --workload, the split of the budget (SWA ratio, mamba state slots) that runs the most requests of
    that workload at once, against SGLang's default split, and the flags that realise it.
    """
    from kvpools_core.capacity import CONTEXT_LADDER, concurrency, engine_flags, limits_of, max_context
    from kvpools_core.capacity import parse_context_len as parse
    from kvpools_core.capacity_report import CapacityReport, capacity_summary, render_capacity
    from kvpools_core.pipeline import plan as make_plan
    from kvpools_core.split import choose_split, parse_workload

    asked = [parse(item) for text in contexts for item in text.split(",")]
    fmt = _output_format(output_format, as_json)
    if fmt == "capacity-json" and (len(asked) > 1 or requests is not None or workload is not None):
        raise ConfigError(
            "--format capacity-json states one context (--context L, default the model's context length); "
            "--requests and --workload belong to the table and --json."
        )
    as_json = fmt == "json"
    if requests is not None and requests < 1:
        raise ConfigError(f"--requests must be at least 1, got {requests}.")
    if not 0 <= headroom < 1:
        raise ConfigError(f"--headroom must be a fraction in [0, 1), e.g. 0.1 for 10%; got {headroom}.")
    vllm_args = _vllm_args(options)
    if options["accounting"] == "vllm":
        _refuse_with_vllm(
            device=device,
            free_memory=free_memory,
            reserved_memory=reserved_memory,
            runtime_memory=runtime_memory,
            speculative_draft_model_path=draft_model,
            requests=requests,
            workload=workload,
            format_capacity_json=fmt == "capacity-json",
        )
        _vllm_capacity(
            model, _make_serving(options, None), memory, gpu, gpu_memory, weights_memory, vllm_args, asked, as_json
        )
        return
    parsed_workload = parse_workload(workload) if workload is not None else None
    _gpu_defaults(options, gpu, gpu_memory)
    host = _host_args(options)
    serving = _make_serving(options, device)
    budget: dict[str, Any] = {
        "memory": memory,
        "device": device,
        "free_memory": free_memory,
        "weights_memory": weights_memory,
        "reserved_memory": reserved_memory,
        "draft_model": draft_model,
        "gpu": gpu,
        "gpu_memory": gpu_memory,
        "runtime_memory": runtime_memory,
    }
    if fmt == "capacity-json":
        _capacity_json(model, serving, {**budget, **host}, asked[0] if asked else None)
        return
    result = make_plan(model, serving, **budget, **host)
    limits = limits_of(result)
    flags_context = max([c for c in asked if c <= limits.context_len], default=limits.context_len)
    try:
        flags, flags_error = engine_flags(result, flags_context, headroom), None
    except KvpoolsError as error:
        flags, flags_error = None, str(error)
    report = CapacityReport(
        plan=result,
        limits=limits,
        ladder=tuple(concurrency(result, length) for length in (asked or CONTEXT_LADDER)),
        single_request=max_context(result, 1),
        concurrent=max_context(result, requests) if requests is not None else None,
        flags=flags,
        flags_error=flags_error,
        split=choose_split(model, serving, budget, parsed_workload) if parsed_workload is not None else None,
    )
    if as_json:
        click.echo(json.dumps(capacity_summary(report), indent=2))
    else:
        render_capacity(report, _console())


def _vllm_capacity(
    model: str,
    serving: Serving,
    memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    weights_memory: str | None,
    args: dict[str, Any],
    asked: list[int],
    as_json: bool,
) -> None:
    """``kvpools capacity --accounting vllm``: vLLM's ``max_concurrency`` at each context length."""
    from kvpools_core.capacity import CONTEXT_LADDER
    from kvpools_core.vllm.deployment import capacity_dict
    from kvpools_core.vllm.report import render_vllm_capacity

    result = _vllm_plan(model, serving, memory, gpu, gpu_memory, weights_memory, args)
    contexts = asked or [length for length in CONTEXT_LADDER if length <= result.max_model_len]
    if as_json:
        click.echo(json.dumps(capacity_dict(result, contexts), indent=2))
    else:
        render_vllm_capacity(result, contexts, _console())


@main.command()
@click.argument("model")
@click.option(
    "--memory",
    default=None,
    help="The KV cache's bytes for both engines (SGLang's budget, vLLM's --kv-cache-memory-bytes), e.g. 40GiB.",
)
@click.option(
    "--gpu",
    default=None,
    metavar="NAME",
    help="A catalogue GPU: each engine's own budget on it "
    "(SGLang's default --mem-fraction-static, vLLM's --gpu-memory-utilization 0.92), both shown.",
)
@click.option("--gpu-memory", default=None, help="A GPU of this total memory, like --gpu.")
@click.option("--weights-memory", default=None, help="With --gpu: one rank's weights [default: kvpools' estimate].")
@click.option(
    "--context",
    "contexts",
    multiple=True,
    metavar="L",
    help="Context lengths to compare concurrency at (repeatable or comma separated; 32768, 32k) "
    "[default: the context length].",
)
@click.option("--tp-size", type=int, default=None, help="Tensor-parallel size (both engines).")
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(KV_DTYPE_CHOICES, case_sensitive=False),
    default=None,
    help="KV element type (both engines; auto follows the model dtype).",
)
@click.option(
    "--context-length",
    type=int,
    default=None,
    help="SGLang's --context-length and vLLM's --max-model-len [default: the model's].",
)
@click.option(
    "--page-size", type=int, default=None, help="SGLang's tokens per page [default: SGLang's own for the model]."
)
@click.option("--block-size", type=int, default=None, help="vLLM's tokens per block [default: 16].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_user_facing
def compare(
    model: str,
    memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    weights_memory: str | None,
    contexts: tuple[str, ...],
    tp_size: int | None,
    kv_cache_dtype: str | None,
    context_length: int | None,
    page_size: int | None,
    block_size: int | None,
    as_json: bool,
) -> None:
    """MODEL through SGLang's accounting and vLLM's, side by side, from the same budget.

    Per layer group (full attention / MLA, sliding window, state): bytes per token, tokens, vLLM's blocks, and
    where the engines differ; then the concurrent requests of each --context L in both (docs/compare.md).
    """
    from kvpools_core.capacity import parse_context_len
    from kvpools_core.compare import compare_engines
    from kvpools_core.compare_report import render_engine_comparison

    fields: dict[str, Any] = {}
    if tp_size is not None:
        fields["tp_size"] = tp_size
    if kv_cache_dtype is not None:
        fields["kv_cache_dtype"] = kv_cache_dtype.lower()
    comparison = compare_engines(
        model,
        Serving(**fields),
        contexts=[parse_context_len(item) for text in contexts for item in text.split(",")],
        memory=memory,
        gpu=gpu,
        gpu_memory=gpu_memory,
        weights_memory=weights_memory,
        context_length=context_length,
        page_size=page_size,
        block_size=block_size,
    )
    if as_json:
        click.echo(json.dumps(comparison.to_dict(), indent=2))
    else:
        render_engine_comparison(comparison, _console())


_BUILD_DEVICE_HELP = (
    "Build the pools on this device: cpu, cuda, cuda:N, or meta (shapes and exact bytes, nothing allocated). "
    "Without --memory/--free-memory/--gpu the budget is measured on it too; meta needs one of them (with --gpu NAME "
    "it is planned as on that GPU)."
)


def _build_device(command: Callable[..., Any]) -> Callable[..., Any]:
    """Make ``--device`` of the budget options the (required) build device."""
    for param in getattr(command, "__click_params__", []):
        if param.name == "device":
            param.help, param.required = _BUILD_DEVICE_HELP, True
    return command


@main.command()
@click.argument("model")
@_build_device
@_budget_options
@_serving_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: planned vs allocated bytes, the plan.")
@click.option(
    "--checked-allocators",
    is_flag=True,
    help="Allocators that also refuse double frees and frees of never-allocated slots (for tests and debugging; "
    "their maps are reported apart from the plan).",
)
@_compare_option
@_user_facing
def build(
    model: str,
    memory: str | None,
    device: str | None,
    free_memory: str | None,
    weights_memory: str | None,
    reserved_memory: str | None,
    gpu: str | None,
    gpu_memory: str | None,
    runtime_memory: str | None,
    draft_model: str | None,
    as_json: bool,
    checked_allocators: bool,
    compare_platform: str | None,
    **options: Any,
) -> None:
    """Plan MODEL, then allocate its pools on --device and compare every pool's bytes with the plan."""
    from kvpools_core.build_report import build_summary, render_build
    from kvpools_core.building import build as build_pools
    from kvpools_core.pipeline import plan as make_plan

    if device is None:  # click does not enforce `required` on an option declared with default=None
        raise ConfigError("kvpools build needs --device: cpu, cuda, cuda:N or meta (nothing allocated).")
    on_gpu = gpu is not None or gpu_memory is not None
    if device == "meta" and memory is None and free_memory is None and not on_gpu:
        raise ConfigError(
            "--device meta measures no memory: pass the budget as --memory, --free-memory SIZE, or --gpu NAME."
        )
    _gpu_defaults(options, gpu, gpu_memory)
    host = _host_args(options)
    serving = _make_serving(options, None if on_gpu else device)
    budget: dict[str, Any] = dict(
        memory=memory,
        device=None if device == "meta" or on_gpu else device,
        free_memory=free_memory,
        weights_memory=weights_memory,
        reserved_memory=reserved_memory,
        draft_model=draft_model,
        gpu=gpu,
        gpu_memory=gpu_memory,
        runtime_memory=runtime_memory,
    )
    result = make_plan(model, serving, **budget, **host)
    pools = build_pools(result, device, checked=checked_allocators)
    comparison = _compare(model, serving, {**budget, **host}, compare_platform)
    if as_json:
        summary = build_summary(pools)
        if comparison is not None:
            summary["comparison"] = _comparison_json(result, comparison)
        click.echo(json.dumps(summary, indent=2))
    else:
        render_build(pools, _console())
        _render_comparison(result, comparison)


@main.command()
@click.argument("model")
@click.option("--requests", "requests", type=int, required=True, help="Concurrent requests to hold.")
@click.option("--context", "context", required=True, metavar="L", help="Their context length (32768, 32k, 1M).")
@click.option("--gpu", default=None, metavar="NAME", help="The GPU model from the catalogue (h100, h200, mi300x, ...).")
@click.option("--gpu-memory", default=None, help="Or a GPU known by its total memory (e.g. 96GiB).")
@click.option(
    "--max-gpus",
    type=int,
    default=8,
    show_default=True,
    help="The most GPUs a configuration may use (8: one node; at most 1024, 128 nodes).",
)
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(KV_DTYPE_CHOICES, case_sensitive=False),
    default=None,
    help="Only this KV dtype [default: try auto and fp8_e4m3].",
)
@click.option(
    "--page-size",
    type=int,
    default=None,
    help="Only this page size [default: SGLang's own for the model, else the smallest that plans].",
)
@click.option(
    "--mem-fraction-static",
    type=float,
    default=None,
    help="Launch with this fraction [default: SGLang's own default for the GPU and configuration].",
)
@click.option(
    "--chunked-prefill-size",
    type=int,
    default=None,
    help="Launch with this chunk [default: SGLang's default for the GPU's memory].",
)
@click.option(
    "--runtime-memory",
    default=None,
    help="What the runtime holds before the weights (default: 1GiB on one GPU, 3GiB with TP/PP).",
)
@click.option(
    "--accounting",
    type=click.Choice(SGLANG_ACCOUNTING_MODES, case_sensitive=False),
    default=None,
    help=_HELP["accounting"],
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_user_facing
def fit(
    model: str,
    requests: int,
    context: str,
    gpu: str | None,
    gpu_memory: str | None,
    max_gpus: int,
    kv_cache_dtype: str | None,
    page_size: int | None,
    mem_fraction_static: float | None,
    chunked_prefill_size: int | None,
    runtime_memory: str | None,
    accounting: str | None,
    as_json: bool,
) -> None:
    """The configurations on the fewest GPUs that hold --requests N concurrent requests of --context L tokens.

    Tries TP and PP (powers of two), DP attention, replicas behind SGLang's router, KV dtypes and page sizes on
    one GPU model, each planned with SGLang's profile arithmetic (weights estimated from MODEL's config.json),
    and ranks those holding N by GPUs, then headroom (requests held / N). Exit 1 when nothing fits on
    --max-gpus, saying what would.
    """
    from kvpools_core.capacity import parse_context_len
    from kvpools_core.fit import fit as find_fits
    from kvpools_core.fit_report import render_fit

    options: dict[str, Any] = {
        "mem_fraction_static": mem_fraction_static,
        "chunked_prefill_size": chunked_prefill_size,
        "accounting": accounting,
        "platform": None,
    }
    _gpu_defaults(options, gpu, gpu_memory)
    serving = Serving(**{k: v for k, v in options.items() if v is not None})
    result = find_fits(
        model,
        requests,
        parse_context_len(context),
        gpu=gpu,
        gpu_memory=gpu_memory,
        max_gpus=max_gpus,
        kv_cache_dtype=kv_cache_dtype,
        page_size=page_size,
        serving=serving,
        runtime_memory=runtime_memory,
    )
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        render_fit(result, _console())
    if not result.fits:
        sys.exit(1)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list.")
@_user_facing
def plugins(as_json: bool) -> None:
    """List plugins: name, distribution, version, hooks, status."""
    from rich.table import Table

    infos = get_registry().plugins()
    if as_json:
        click.echo(json.dumps([attrs.asdict(info) for info in infos], indent=2))
        return
    table = Table(show_edge=False, pad_edge=False)
    for column in ("name", "distribution", "version", "status", "hooks"):
        table.add_column(column)
    for info in infos:
        detail = ", ".join(info.hooks) if info.status == "loaded" else (info.error or "")
        table.add_row(info.name, info.distribution, info.version, info.status, detail)
    _console().print(table)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object name -> {plugin, path}.")
@_user_facing
def presets(as_json: bool) -> None:
    """List the bundled model presets and the plugin that ships each."""
    from kvpools_core.config import registry_presets

    found = registry_presets(get_registry())
    if as_json:
        click.echo(
            json.dumps({name: {"plugin": p, "path": path} for name, (p, path) in sorted(found.items())}, indent=2)
        )
        return
    for name, (plugin, _path) in sorted(found.items()):
        click.echo(f"{name:32} {plugin}")


def _listed(values: tuple[str, ...]) -> list[str]:
    """Values of a repeatable option that also takes comma lists (``--tp-size 1,2 --tp-size 4``)."""
    return [item.strip() for value in values for item in value.split(",") if item.strip()]


SWEEP_CONTEXTS = ("8k", "32k", "128k")
"""The context lengths ``kvpools sweep`` asks concurrency at when no --context is given."""
PLOT_KINDS = ("concurrency", "tokens", "bytes-per-token")


@main.command()
@click.option(
    "--model",
    "models",
    multiple=True,
    required=True,
    metavar="MODEL",
    help="A preset, a config.json or a directory (repeatable or comma separated).",
)
@click.option("--tp-size", "tp_sizes", multiple=True, metavar="N,...", help="Tensor-parallel sizes to sweep.")
@click.option(
    "--kv-cache-dtype",
    "kv_cache_dtypes",
    multiple=True,
    metavar="DTYPE,...",
    help=f"KV element types to sweep ({', '.join(KV_DTYPE_CHOICES)}).",
)
@click.option("--page-size", "page_sizes", multiple=True, metavar="N,...", help="Page sizes to sweep.")
@click.option(
    "--axis",
    "axes",
    multiple=True,
    metavar="NAME=V1,V2",
    help="Any other Serving field to sweep, under its name (e.g. dp_size=1,2 or enable_dp_attention=true); "
    "one value fixes it for every point.",
)
@click.option(
    "--memory",
    "memories",
    multiple=True,
    metavar="SIZE,...",
    help="KV cache budgets to sweep (e.g. 40GiB,80GiB).",
)
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="NAME,...",
    help="Whole GPUs to sweep as budgets (catalogue names, e.g. h100,h200): each point profiles the GPU with "
    "SGLang's default fraction and the weights estimated from the model's config.",
)
@click.option(
    "--context",
    "contexts",
    multiple=True,
    metavar="L,...",
    help=f"Context lengths to ask concurrency at (32768, 32k, 1M)  [default: {','.join(SWEEP_CONTEXTS)}]",
)
@click.option("--platform", default=None, help="Target platform (default: the detected one, else cuda).")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["table", "csv", "json"]),
    default="table",
    show_default=True,
    help="Output: a table, CSV (one row per point) or a JSON list of records.",
)
@click.option("--output", type=click.Path(dir_okay=False), default=None, help="Write the output to this file.")
@click.option(
    "--plot",
    "plots",
    multiple=True,
    metavar="KIND,...",
    help=f"Also write these plots: {', '.join(PLOT_KINDS)} (repeatable or comma separated; needs matplotlib: "
    "pip install 'kvpools[plot]', or pip install -e '.[plot]' from a kvpools checkout).",
)
@click.option(
    "--plot-dir", type=click.Path(file_okay=False), default=".", show_default=True, help="Where plots are written."
)
@click.option(
    "--plot-format", type=click.Choice(["png", "svg"]), default="png", show_default=True, help="The plots' file format."
)
@click.option(
    "--jobs", type=int, default=None, help="Worker processes for large sweeps  [default: the cores of this machine]"
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="A progress bar on stderr for runs over a second  [default: when stderr is a terminal]",
)
@_user_facing
def sweep(
    models: tuple[str, ...],
    tp_sizes: tuple[str, ...],
    kv_cache_dtypes: tuple[str, ...],
    page_sizes: tuple[str, ...],
    axes: tuple[str, ...],
    memories: tuple[str, ...],
    gpus: tuple[str, ...],
    contexts: tuple[str, ...],
    platform: str | None,
    output_format: str,
    output: str | None,
    plots: tuple[str, ...],
    plot_dir: str,
    plot_format: str,
    jobs: int | None,
    progress: bool | None,
) -> None:
    """Plan every combination of models, serving options and budgets; one row per point.

    Each row holds the tokens of each token space, the running requests, the bytes per token of each group and
    the concurrent requests at each --context. A point that does not plan is a row with its error.
    """
    from kvpools_core.config import load_model
    from kvpools_core.pipeline import select_platform
    from kvpools_core.sweep import SweepGrid, rows_to_csv, rows_to_json, run_sweep

    named = [("tp_size", tp_sizes), ("kv_cache_dtype", kv_cache_dtypes), ("page_size", page_sizes)]
    sweep_axes: list[tuple[str, list[str]]] = [(name, _listed(values)) for name, values in named if values]
    for item in axes:
        name, sep, values = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"--axis must look like NAME=V1,V2 (e.g. dp_size=1,2), got {item!r}.")
        sweep_axes.append((name.strip(), _listed((values,))))
    if not memories and not gpus:
        raise ConfigError(
            "kvpools sweep needs budgets: --memory SIZE,... (KV cache budgets, e.g. 40GiB,80GiB) or --gpu NAME,... "
            "(whole GPUs, e.g. h100,h200)."
        )
    plot_kinds = _listed(plots)
    unknown = [kind for kind in plot_kinds if kind not in PLOT_KINDS]
    if unknown:
        raise ConfigError(f"--plot takes {', '.join(PLOT_KINDS)}; got {', '.join(map(repr, unknown))}.")
    if plot_kinds:
        from kvpools_core.plots import require_matplotlib

        require_matplotlib()
    registry = get_registry()
    grid = SweepGrid(
        models=_listed(models),
        axes=sweep_axes,
        budgets=[{"memory": size} for size in _listed(memories)] + [{"gpu": name} for name in _listed(gpus)],
        contexts=_listed(contexts) or list(SWEEP_CONTEXTS),
        serving={"platform": select_platform(platform, None, registry)},
    )
    for model in grid.models:  # a misspelt model is the user's to fix now, not a row of errors per point
        load_model(model, registry)
    if output is not None:
        _check_output_dir(output)
    with _sweep_progress(len(grid), progress) as advance:
        rows = run_sweep(grid, jobs=jobs, advance=advance)
    if output_format == "table":
        from kvpools_core.sweep_report import render_sweep

        if output is None:
            render_sweep(rows, _console())
        else:
            with _writing("--output", output), open(output, "w", encoding="utf-8") as stream:
                render_sweep(rows, Console(file=stream, width=200, no_color=True, highlight=False))
    else:
        text = rows_to_csv(rows) if output_format == "csv" else rows_to_json(rows) + "\n"
        if output is None:
            click.echo(text, nl=False)
        else:
            with _writing("--output", output), open(output, "w", encoding="utf-8", newline="") as stream:
                stream.write(text)
    if plot_kinds:
        from kvpools_core.plots import write_plots

        with _writing("--plot-dir", plot_dir):
            written = write_plots(rows, plot_kinds, plot_dir, plot_format)
        for path in written:
            click.echo(f"wrote {path}", err=True)


def _check_output_dir(output: str) -> None:
    """Refuse ``--output`` into a directory that does not exist before the sweep runs, not after."""
    parent = os.path.dirname(output) or "."
    if not os.path.isdir(parent):
        raise ConfigError(
            f"--output {output}: the directory {parent} does not exist. Create it first (mkdir -p {parent}) "
            f"or write the output elsewhere."
        )


@contextlib.contextmanager
def _writing(flag: str, path: str) -> Iterator[None]:
    """A file the user named that cannot be written is theirs to fix: name it and why."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(
            f"{flag} {path}: cannot write there ({exc.strerror or exc}). Choose a writable path."
        ) from exc


class _LazyProgress:
    """A rich progress bar on stderr that appears only once the run has taken a second (short runs stay quiet)."""

    DELAY_S = 1.0

    def __init__(self, total: int) -> None:
        import time

        self.total, self.done, self.started = total, 0, time.monotonic()
        self.bar: Any = None
        self.task: Any = None

    def __call__(self, count: int) -> None:
        import time

        self.done += count
        if self.bar is None and time.monotonic() - self.started >= self.DELAY_S and self.done < self.total:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("sweep"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=Console(file=sys.stderr),
                transient=True,
                auto_refresh=False,  # no refresh thread: the sweep may fork its workers after the bar appears
            )
            self.bar.start()
            self.task = self.bar.add_task("sweep", total=self.total)
        if self.bar is not None:
            self.bar.update(self.task, completed=self.done, refresh=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


@contextlib.contextmanager
def _sweep_progress(total: int, forced: bool | None) -> Iterator[Callable[[int], None] | None]:
    """The ``advance`` callback of a sweep: a progress bar when stderr is a terminal or ``--progress`` asks."""
    if not (sys.stderr.isatty() if forced is None else forced):
        yield None
        return
    bar = _LazyProgress(total)
    try:
        yield bar
    finally:
        bar.close()
