"""Sweeps on any ``concurrent.futures.Executor`` and, from the command line, on a Dask cluster (issue 37).

The rows must be the very rows a sweep in this process gives, in the grid's order, whatever runs the chunks;
a chunk that fails stops the sweep with its error; what is not an executor, and a URL that is not one kvpools
can open, are refused naming the option. The Dask tests start a cluster on loopback and skip, naming the
extra, without ``distributed`` (``nox -s dask`` runs them).
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main
from kvpools_core.errors import ConfigError
from kvpools_core.planning import executors
from kvpools_core.planning.sweep import SweepGrid, run_sweep

GRID = SweepGrid(
    models=["llama-3.1-8b", "gemma-3-12b-it"],
    axes=[("tp_size", [1, 2, 4]), ("page_size", [1, 16, 64])],
    budgets=[{"memory": "20GiB"}, {"memory": "40GiB"}],
    contexts=["8k"],
)
"""18 configurations x 2 budgets: enough chunks (min_points_per_job=1) that order could go wrong."""


@pytest.fixture(scope="module")
def serial_rows() -> list[Any]:
    return run_sweep(GRID, jobs=1)


def test_a_thread_pool_gives_the_serial_rows_in_order(serial_rows: list[Any]) -> None:
    with ThreadPoolExecutor(max_workers=3) as pool:
        rows = run_sweep(GRID, jobs=3, executor=pool, min_points_per_job=1)
    assert rows == serial_rows
    assert [row.point for row in rows] == [row.point for row in serial_rows]


def test_the_callers_process_pool_is_used_and_left_open(serial_rows: list[Any]) -> None:
    with ProcessPoolExecutor(max_workers=2) as pool:
        submitted: list[int] = []
        original: Callable[..., Future[Any]] = pool.submit

        def counting_submit(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
            submitted.append(1)
            return original(fn, *args, **kwargs)

        pool.submit = counting_submit  # type: ignore[method-assign]
        rows = run_sweep(GRID, jobs=2, executor=pool, min_points_per_job=1)
        assert rows == serial_rows
        assert len(submitted) == 6  # 18 configurations in chunks of ceil(18 / (2 workers x 4)) = 3
        assert pool.submit(sum, [1, 2]).result() == 3  # the sweep did not shut the caller's executor down


def test_an_executor_runs_even_a_sweep_too_small_for_workers(serial_rows: list[Any]) -> None:
    """With an executor the caller chose where to plan: a one-worker sweep still runs there, not here."""
    used: list[int] = []

    class Recording(ThreadPoolExecutor):
        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
            used.append(1)
            return super().submit(fn, *args, **kwargs)

    with Recording(max_workers=1) as pool:
        assert run_sweep(GRID, jobs=1, executor=pool) == serial_rows
    assert len(used) == 4  # 18 configurations in chunks of ceil(18 / (1 worker x 4)) = 5


class FailingExecutor(Executor):
    """Runs chunks inline; the second one fails as a worker that lost its plugins would."""

    def __init__(self) -> None:
        self.futures: list[Future[Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        if len(self.futures) == 1:
            future.set_exception(RuntimeError("worker 7 has no kvpools_plugins"))
        elif len(self.futures) == 0:
            future.set_result(fn(*args, **kwargs))
        self.futures.append(future)  # later chunks stay pending: they must be cancelled, not waited for
        return future


def test_a_failing_chunk_stops_the_sweep_and_cancels_the_rest() -> None:
    pool = FailingExecutor()
    with pytest.raises(RuntimeError, match="worker 7"):
        run_sweep(GRID, jobs=2, executor=pool, min_points_per_job=1)
    assert len(pool.futures) == 6
    assert all(future.cancelled() for future in pool.futures[2:])


def test_what_is_not_an_executor_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"executor must be a concurrent.futures.Executor .* got list"):
        run_sweep(GRID, executor=[])  # type: ignore[arg-type]


def test_a_custom_registry_with_an_executor_is_refused() -> None:
    from kvpools_core.registry import get_registry

    with ThreadPoolExecutor(max_workers=1) as pool, pytest.raises(ConfigError, match="on the executor's workers"):
        run_sweep(GRID, executor=pool, registry=get_registry())


@pytest.mark.parametrize(
    "url",
    ["ray://127.0.0.1:10001", "dask://127.0.0.1", "dask://:8786", "127.0.0.1:8786", "dask://h:8786/path", "dask://"],
)
def test_executor_urls_kvpools_cannot_open_are_refused_before_any_work(url: str) -> None:
    result = CliRunner().invoke(main, ["sweep", "--model", "llama-3.1-8b", "--memory", "20GiB", "--executor", url])
    assert result.exit_code == 1
    assert f"Error: --executor {url!r} is not an executor kvpools can open: give dask://HOST:PORT" in result.output
    assert "Traceback" not in result.output


def test_without_distributed_the_fix_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        executors.importlib.util, "find_spec", lambda name, *a: None if name == "distributed" else real(name, *a)
    )
    result = CliRunner().invoke(
        main, ["sweep", "--model", "llama-3.1-8b", "--memory", "20GiB", "--executor", "dask://127.0.0.1:8786"]
    )
    assert result.exit_code == 1
    assert "needs Dask's distributed: pip install 'kvpools[dask]'" in result.output


# --- a real Dask cluster on loopback ----------------------------------------------------------------------

needs_dask = pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None,
    reason="Dask's distributed is not installed: the kvpools[dask] extra (nox -s dask) runs these",
)


@pytest.fixture(scope="module")
def dask_address() -> Iterator[str]:
    from distributed import LocalCluster

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cluster's own start-up chatter, not kvpools'
        cluster = LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=False,
            protocol="tcp",
            host="127.0.0.1",
            dashboard_address=None,
        )
    try:
        yield cluster.scheduler_address
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cluster.close()


@needs_dask
def test_a_dask_client_executor_gives_the_serial_rows(dask_address: str, serial_rows: list[Any]) -> None:
    from distributed import Client

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = Client(dask_address)
    try:
        rows = run_sweep(GRID, jobs=2, executor=client.get_executor(), min_points_per_job=1)
    finally:
        client.close()
    assert rows == serial_rows


@needs_dask
def test_the_cli_sweeps_on_a_dask_scheduler(dask_address: str) -> None:
    args = ["sweep", "--model", "llama-3.1-8b,gemma-3-12b-it", "--tp-size", "1,2", "--memory", "20GiB,40GiB"]
    args += ["--format", "csv", "--jobs", "2", "--no-progress"]
    here = CliRunner().invoke(main, args)
    port = dask_address.rpartition(":")[2]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        there = CliRunner().invoke(main, [*args, "--executor", f"dask://127.0.0.1:{port}"])
    assert there.exit_code == 0, there.output
    assert there.stdout == here.stdout
    assert len(there.stdout.splitlines()) == 1 + 8


@needs_dask
def test_an_unreachable_scheduler_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr(executors, "CONNECT_TIMEOUT_S", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = CliRunner().invoke(
            main, ["sweep", "--model", "llama-3.1-8b", "--memory", "20GiB", "--executor", f"dask://127.0.0.1:{port}"]
        )
    assert result.exit_code == 1, result.output
    assert f"no Dask scheduler answered at tcp://127.0.0.1:{port} within 1 s" in result.output
    assert "Traceback" not in result.output
