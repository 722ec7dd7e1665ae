"""``kvpools fit``: the configurations on the fewest GPUs that hold N requests of L tokens."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import click

from kvpools_core.cli.common import (
    DRAFT_MODEL_FLAGS,
    EAGLE3_ONE_MODEL_FLAG,
    _console,
    _gpu_defaults,
    _user_facing,
    main,
)
from kvpools_core.dtypes import KV_DTYPE_SPELLINGS
from kvpools_core.values import (
    SGLANG_ACCOUNTING_MODES,
    Serving,
)


def trtllm_draft_options(*, axes: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--tokens_per_block`` and a separate draft model's options for ``fit`` and ``sweep`` (``axes``: sweep's
    ``--tokens_per_block`` and ``--max_draft_len`` take comma lists, each value a point)."""
    only = " Only with --accounting trtllm."
    listed = " (comma separated: each value a point)" if axes else ""
    flags: tuple[tuple[str, Any, str], ...] = (
        (
            "--tokens_per_block",
            str if axes else int,
            f"kv_cache_config.tokens_per_block{listed} [default: 32; DeepSeek-V4 needs 128 or 256, TensorRT-LLM's "
            "examples pass 128].",
        ),
        *DRAFT_MODEL_FLAGS,
        ("--max_draft_len", str if axes else int, f"speculative_config.max_draft_len: draft tokens per step{listed}."),
        EAGLE3_ONE_MODEL_FLAG,
        (
            "--draft_weights_memory",
            str,
            "The draft model's weights on each GPU, added to kvpools' estimate of the target's (kvpools does not "
            "estimate a draft's weights).",
        ),
    )

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for flag, kind, help_text in reversed(flags):
            command = click.option(flag, type=kind, default=None, help=help_text + only)(command)
        return command

    return decorate


TRTLLM_ONLY = (
    "num_nextn_predict_layers",
    "max_batch_size",
    "tokens_per_block",
    "decoding_type",
    "speculative_model_dir",
    "max_draft_len",
    "eagle3_one_model",
    "draft_weights_memory",
)
"""The TensorRT-LLM options of ``fit`` and ``sweep`` (:func:`trtllm_draft_options` and their own), refused with
SGLang's accountings."""


def trtllm_only_given() -> list[str]:
    """The :data:`TRTLLM_ONLY` flags the running command was given (not None), spelled as on the command line."""
    params = click.get_current_context().params
    return [f"--{name}" for name in TRTLLM_ONLY if params.get(name) is not None]


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
    type=click.Choice(KV_DTYPE_SPELLINGS, case_sensitive=False),
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
    type=click.Choice((*SGLANG_ACCOUNTING_MODES, "trtllm"), case_sensitive=False),
    default=None,
    help="exact: charge every byte built; sglang: SGLang's numbers exactly; trtllm: trtllm-serve deployments sized "
    "as TensorRT-LLM 1.2 sizes its KV cache (TP, PP, attention DP, KV dtype, replicas; docs/trtllm.md). vLLM's "
    "accounting is not searched by fit yet.",
)
@click.option(
    "--num_nextn_predict_layers",
    type=int,
    default=None,
    help="TensorRT-LLM's one-model MTP draft layers (speculative_config, decoding_type MTP). Only with --accounting "
    "trtllm.",
)
@click.option(
    "--max_batch_size",
    type=int,
    default=None,
    help="trtllm-serve --max_batch_size for every configuration [default: 2048]. Only with --accounting trtllm.",
)
@trtllm_draft_options(axes=False)
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
    num_nextn_predict_layers: int | None,
    max_batch_size: int | None,
    tokens_per_block: int | None,
    decoding_type: str | None,
    speculative_model_dir: str | None,
    max_draft_len: int | None,
    eagle3_one_model: str | None,
    draft_weights_memory: str | None,
    as_json: bool,
) -> None:
    """The configurations on the fewest GPUs that hold --requests N concurrent requests of --context L tokens.

    Tries TP and PP (powers of two), DP attention, replicas behind SGLang's router, KV dtypes and page sizes on
    one GPU model, each planned with SGLang's profile arithmetic (weights estimated from MODEL's config.json),
    and ranks those holding N by GPUs, then headroom (requests held / N). Exit 1 when nothing fits on
    --max-gpus, saying what would.
    """
    from kvpools_core.cli.fit_report import render_fit
    from kvpools_core.planning.capacity import parse_context_len
    from kvpools_core.planning.fit import fit as find_fits

    if accounting == "trtllm":
        _fit_trtllm(
            model,
            requests,
            context,
            gpu,
            gpu_memory,
            max_gpus,
            kv_cache_dtype,
            as_json,
            sglang={
                "--page-size": page_size,
                "--mem-fraction-static": mem_fraction_static,
                "--chunked-prefill-size": chunked_prefill_size,
                "--runtime-memory": runtime_memory,
            },
            num_nextn_predict_layers=num_nextn_predict_layers,
            max_batch_size=max_batch_size,
            tokens_per_block=tokens_per_block,
            decoding_type=decoding_type,
            speculative_model_dir=speculative_model_dir,
            max_draft_len=max_draft_len,
            eagle3_one_model=None if eagle3_one_model is None else eagle3_one_model.lower() == "true",
            draft_weights_memory=draft_weights_memory,
        )
        return
    trtllm_only = trtllm_only_given()
    if trtllm_only:
        from kvpools_core.errors import ConfigError

        raise ConfigError(
            f"{', '.join(trtllm_only)}: TensorRT-LLM's, only with --accounting trtllm (SGLang's fit searches "
            "--max-running-requests itself)."
        )
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


def _fit_trtllm(
    model: str,
    requests: int,
    context: str,
    gpu: str | None,
    gpu_memory: str | None,
    max_gpus: int,
    kv_cache_dtype: str | None,
    as_json: bool,
    sglang: dict[str, Any],
    num_nextn_predict_layers: int | None = None,
    max_batch_size: int | None = None,
    **draft: Any,
) -> None:
    """``kvpools fit --accounting trtllm``: the trtllm-serve configurations on the fewest GPUs; ``draft`` is
    ``tokens_per_block`` and a separate draft model's options (:func:`~kvpools_core.planning.trtllm_fit.fit_trtllm`)."""
    from kvpools_core.errors import ConfigError
    from kvpools_core.planning.capacity import parse_context_len
    from kvpools_core.planning.trtllm_fit import fit_trtllm

    given = [flag for flag, value in sglang.items() if value is not None]
    if given:
        raise ConfigError(
            f"{', '.join(given)} {'belongs' if len(given) == 1 else 'belong'} to SGLang's launch, not to fit "
            "--accounting trtllm, which launches trtllm-serve with TensorRT-LLM's defaults (tokens_per_block 32, "
            "free_gpu_memory_fraction 0.9; docs/trtllm.md)."
        )
    result = fit_trtllm(
        model,
        requests,
        parse_context_len(context),
        gpu=gpu,
        gpu_memory=gpu_memory,
        max_gpus=max_gpus,
        kv_cache_dtype=kv_cache_dtype,
        num_nextn_predict_layers=num_nextn_predict_layers,
        max_batch_size=max_batch_size,
        **draft,
    )
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
    else:
        click.echo(
            f"{result.model}: {result.requests} requests of {result.context_len:,} tokens on {result.gpu.label} "
            f"under TensorRT-LLM 1.2's KV cache ({result.tried} configurations tried)"
        )
        for found in result.fits:
            click.echo(
                f"  {found.gpus} GPUs: {found.describe()} -- holds {found.requests_held} "
                f"(headroom {found.headroom:.2f}x)"
            )
            click.echo(f"    {found.result.serve_command()}")
        for reason, count in sorted(result.skipped.items()):
            click.echo(f"  skipped {count}: {reason}")
        if result.needed:
            click.echo(result.needed)
    if not result.fits:
        sys.exit(1)
