"""One registry, many threads: every hook call keeps its own record of who answered (a sweep on a thread pool,
a Dask worker's threads). The call stack was one list per registry, so two threads' calls interleaved their
records: answers were attributed to the wrong call and ``call_collect`` failed with ``zip() argument 2 is
longer than argument 1``."""

from __future__ import annotations

import contextlib
import threading
from concurrent.futures import ThreadPoolExecutor

from kvpools_core import Serving, plan
from kvpools_core.models import registry_presets
from kvpools_core.registry import Registry

MODELS = ("llama-3.1-8b", "gemma-3-12b-it", "deepseek-v3", "qwen3-next-80b-a3b-thinking", "gpt-oss-20b")


def test_plans_made_on_many_threads_at_once_equal_the_serial_ones() -> None:
    registry = Registry()
    jobs = [(model, tp) for model in MODELS for tp in (1, 2, 4, 8)] * 3
    serial = {job: plan(job[0], Serving(tp_size=job[1]), memory="80GiB", registry=registry) for job in set(jobs)}
    start = threading.Barrier(8)

    def planned(job: tuple[str, int]) -> tuple[tuple[str, int], object]:
        with contextlib.suppress(threading.BrokenBarrierError):
            start.wait(timeout=0.5)  # eight calls at a time start together
        return job, plan(job[0], Serving(tp_size=job[1]), memory="80GiB", registry=registry)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(planned, jobs))
    for job, result in results:
        assert result == serial[job]
        assert result.provenance == serial[job].provenance  # who answered each hook, per call


def test_collecting_hooks_on_many_threads_keep_their_answerers() -> None:
    registry = Registry()
    expected = registry_presets(registry)
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda _: registry_presets(registry), range(200)))
    assert all(answer == expected for answer in answers)
