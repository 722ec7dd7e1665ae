"""``kvpools sweep``: plan a grid of models x options x budgets to a table, CSV, JSON or plots."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click
from rich.console import Console

from kvpools_core.cli.common import (
    _console,
    _user_facing,
    main,
)
from kvpools_core.cli.fit import trtllm_draft_options, trtllm_only_given
from kvpools_core.dtypes import KV_DTYPE_CHOICES
from kvpools_core.errors import ConfigError
from kvpools_core.registry import get_registry


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
    "--executor",
    default=None,
    metavar="URL",
    help="Run the sweep on a cluster instead of this machine's cores: dask://HOST:PORT (a Dask scheduler; "
    "needs pip install 'kvpools[dask]' here and kvpools on its workers). --jobs is then the workers to cut it for.",
)
@click.option(
    "--accounting",
    default=None,
    callback=lambda ctx, param, value: None if value is None else value.strip().lower(),
    help="exact (the default) or sglang: SGLang's pools; trtllm: each point planned as TensorRT-LLM 1.2 sizes its "
    "KV cache (--model, --tp-size, --kv-cache-dtype, --memory / --gpu, --context; docs/trtllm.md).",
)
@click.option(
    "--num_nextn_predict_layers",
    type=int,
    default=None,
    help="TensorRT-LLM's one-model MTP draft layers at every point. Only with --accounting trtllm.",
)
@click.option(
    "--max_batch_size",
    type=int,
    default=None,
    help="trtllm-serve --max_batch_size at every point [default: 2048]. Only with --accounting trtllm.",
)
@trtllm_draft_options(axes=True)
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
    executor: str | None,
    accounting: str | None,
    num_nextn_predict_layers: int | None,
    max_batch_size: int | None,
    tokens_per_block: str | None,
    decoding_type: str | None,
    speculative_model_dir: str | None,
    max_draft_len: str | None,
    eagle3_one_model: str | None,
    draft_weights_memory: str | None,
    progress: bool | None,
) -> None:
    """Plan every combination of models, serving options and budgets; one row per point.

    Each row holds the tokens of each token space, the running requests, the bytes per token of each group and
    the concurrent requests at each --context. A point that does not plan is a row with its error.
    """
    from kvpools_core.models import load_model
    from kvpools_core.pipeline import select_platform
    from kvpools_core.planning.sweep import SweepGrid, rows_to_csv, rows_to_json, run_sweep

    if accounting == "trtllm":
        _sweep_trtllm(
            models, tp_sizes, kv_cache_dtypes, memories, gpus, contexts, platform, output_format, output,
            refused={"--page-size": page_sizes, "--axis": axes, "--plot": plots, "--jobs": jobs,
                     "--executor": executor},
            num_nextn_predict_layers=num_nextn_predict_layers, max_batch_size=max_batch_size,
            tokens_per_block=tokens_per_block, max_draft_len=max_draft_len,
            draft={"decoding_type": decoding_type, "speculative_model_dir": speculative_model_dir,
                   "eagle3_one_model": None if eagle3_one_model is None else eagle3_one_model.lower() == "true",
                   "draft_weights_memory": draft_weights_memory},
        )  # fmt: skip
        return
    trtllm_only = trtllm_only_given()
    if trtllm_only:
        raise ConfigError(f"{', '.join(trtllm_only)}: TensorRT-LLM's, only with --accounting trtllm.")
    if accounting not in (None, "exact", "sglang"):
        raise ConfigError(
            f"kvpools sweep plans SGLang's pools (--accounting exact or sglang) and TensorRT-LLM's (--accounting "
            f"trtllm); kvpools does not sweep --accounting {accounting} yet: plan each point with kvpools plan "
            f"--accounting {accounting}."
        )
    if executor is not None:
        from kvpools_core.planning.executors import parse_executor_url

        parse_executor_url(executor)  # a misspelt URL is refused before any model is read
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
        from kvpools_core.cli.plots import require_matplotlib

        require_matplotlib()
    registry = get_registry()
    grid = SweepGrid(
        models=_listed(models),
        axes=sweep_axes,
        budgets=[{"memory": size} for size in _listed(memories)] + [{"gpu": name} for name in _listed(gpus)],
        contexts=_listed(contexts) or list(SWEEP_CONTEXTS),
        serving={
            "platform": select_platform(platform, None, registry),
            **({"accounting": accounting} if accounting else {}),
        },
    )
    for model in grid.models:  # a misspelt model is the user's to fix now, not a row of errors per point
        load_model(model, registry)
    if output is not None:
        _check_output_dir(output)
    with contextlib.ExitStack() as stack:
        pool = None
        if executor is not None:
            from kvpools_core.planning.executors import open_executor

            pool = stack.enter_context(open_executor(executor))
        advance = stack.enter_context(_sweep_progress(len(grid), progress))
        rows = run_sweep(grid, jobs=jobs, advance=advance, executor=pool)
    if output_format == "table":
        from kvpools_core.cli.sweep_report import render_sweep

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
        from kvpools_core.cli.plots import write_plots

        with _writing("--plot-dir", plot_dir):
            written = write_plots(rows, plot_kinds, plot_dir, plot_format)
        for path in written:
            click.echo(f"wrote {path}", err=True)


def _sweep_trtllm(
    models: tuple[str, ...],
    tp_sizes: tuple[str, ...],
    kv_cache_dtypes: tuple[str, ...],
    memories: tuple[str, ...],
    gpus: tuple[str, ...],
    contexts: tuple[str, ...],
    platform: str | None,
    output_format: str,
    output: str | None,
    refused: dict[str, Any],
    num_nextn_predict_layers: int | None = None,
    max_batch_size: int | None = None,
    tokens_per_block: str | None = None,
    max_draft_len: str | None = None,
    draft: dict[str, Any] | None = None,
) -> None:
    """``kvpools sweep --accounting trtllm``: the grid planned by the trtllm engine (no pool, plots or cluster);
    ``--tokens_per_block`` and ``--max_draft_len`` are axes (comma lists), ``draft`` a separate draft model's
    fixed options."""
    from kvpools_core.models import load_model
    from kvpools_core.pipeline import select_platform
    from kvpools_core.planning.trtllm_sweep import rows_to_csv, rows_to_json, rows_to_table, sweep_trtllm

    given = [flag for flag, value in refused.items() if value]
    if given:
        raise ConfigError(
            f"{', '.join(given)}: kvpools does not model {'it' if len(given) == 1 else 'them'} for sweep "
            "--accounting trtllm yet; it sweeps --model, --tp-size, --kv-cache-dtype, --memory (the memory free "
            "after warm-up) or --gpu, and --context."
        )
    if not memories and not gpus:
        raise ConfigError("kvpools sweep --accounting trtllm needs budgets: --memory SIZE,... or --gpu NAME,....")
    registry = get_registry()
    listed = _listed(models)
    for model in listed:
        load_model(model, registry)
    try:
        tps = [int(tp) for tp in _listed(tp_sizes)] or [1]
    except ValueError as exc:
        raise ConfigError(f"--tp-size takes integers, got {', '.join(tp_sizes)}.") from exc
    axes = {name: _int_axis(name, text) for name, text in (("--tokens_per_block", tokens_per_block),
                                                           ("--max_draft_len", max_draft_len))}  # fmt: skip
    rows = sweep_trtllm(
        listed,
        tp_sizes=tps,
        kv_cache_dtypes=_listed(kv_cache_dtypes) or ["auto"],
        budgets=[{"memory": size} for size in _listed(memories)] + [{"gpu": name} for name in _listed(gpus)],
        contexts=_listed(contexts) or list(SWEEP_CONTEXTS),
        platform=select_platform(platform, None, registry),
        num_nextn_predict_layers=num_nextn_predict_layers,
        max_batch_size=max_batch_size,
        tokens_per_blocks=axes["--tokens_per_block"],
        max_draft_lens=axes["--max_draft_len"],
        draft=draft,
    )
    text = {"csv": rows_to_csv, "json": rows_to_json, "table": rows_to_table}[output_format](rows)
    if output is None:
        click.echo(text, nl=False)
        return
    _check_output_dir(output)
    with _writing("--output", output), open(output, "w", encoding="utf-8", newline="") as stream:
        stream.write(text)


def _int_axis(flag: str, text: str | None) -> list[int | None]:
    """A comma list of integers (one point each), or ``[None]`` (TensorRT-LLM's default) when not given."""
    if text is None:
        return [None]
    try:
        values: list[int | None] = [int(item) for item in _listed((text,))]
    except ValueError as exc:
        raise ConfigError(f"{flag} takes integers (comma separated), got {text!r}.") from exc
    return values or [None]


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
