"""One registry called from several threads at once (``kvpools serve`` plans each request in a worker thread):
each thread's hook calls keep their own record of who answered.

Before the fix the records were one stack shared by every thread: a call that started in one thread while
another was inside a hook took the other's record, and ``call_collect`` raised ``ValueError: zip() argument 2 is
longer than argument 1`` (seen as HTTP 500s under ``benchmarks/serve_load.py``).
"""

from __future__ import annotations

import threading
import types
from typing import Any

from kvpools_core import Registry, hookimpl


def test_concurrent_hook_calls_keep_their_own_answers() -> None:
    a_inside, b_inside, a_done = threading.Event(), threading.Event(), threading.Event()

    @hookimpl
    def presets() -> dict[str, Any]:
        """Holds both threads inside the hook at once: A waits until B is inside too, B until A has finished."""
        if threading.current_thread().name == "A":
            a_inside.set()
            assert b_inside.wait(10)
            return {"from-a": "/a.json"}
        assert a_inside.wait(10)
        b_inside.set()
        assert a_done.wait(10)
        return {"from-b": "/b.json"}

    registry = Registry(extra_plugins={"slow": types.SimpleNamespace(presets=presets)})
    answers: dict[str, Any] = {}

    def call(name: str) -> None:
        try:
            answers[name] = registry.call_collect("presets")
        except BaseException as error:  # the thread's failure, reported by the assertion below
            answers[name] = error
        finally:
            if name == "A":
                a_done.set()

    threads = [threading.Thread(target=call, args=(name,), name=name) for name in ("A", "B")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    alone = [plugin for plugin, _ in registry.call_collect("presets")]
    for name, mine in (("A", "from-a"), ("B", "from-b")):
        assert isinstance(answers[name], list), answers[name]
        assert [plugin for plugin, _ in answers[name]] == alone
        assert dict(answers[name])["slow"] == {mine: f"/{mine[-1]}.json"}
