"""Where a sweep runs: an executor named by a URL (``dask://HOST:PORT``), opened for one run and closed after.

The Python API takes any :class:`concurrent.futures.Executor` (:func:`kvpools_core.planning.sweep.run_sweep`);
the command line names a cluster by URL instead, so it needs to open the client itself. Dask's
``distributed`` is an optional extra (``kvpools[dask]``), imported only when a ``dask://`` URL is given.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from concurrent.futures import Executor
from urllib.parse import urlsplit

from kvpools_core.errors import ConfigError
from kvpools_core.options import option

SCHEMES = ("dask",)
"""The executor URLs :func:`open_executor` understands."""

CONNECT_TIMEOUT_S = 10
"""How long the command line waits for a Dask scheduler before it says it cannot reach it."""


def parse_executor_url(url: str) -> tuple[str, str]:
    """``(scheme, address)`` of ``dask://HOST:PORT``; anything else is refused, naming the option."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise ConfigError(
            f"{option('executor')} {url!r} is not an executor kvpools can open: give dask://HOST:PORT "
            f"(a Dask scheduler, e.g. dask://127.0.0.1:8786)."
        )
    return parts.scheme, f"tcp://{parts.hostname}:{parts.port}"


@contextlib.contextmanager
def open_executor(url: str) -> Iterator[Executor]:
    """The executor ``url`` names, connected for the ``with`` block and closed after it."""
    _, address = parse_executor_url(url)
    if importlib.util.find_spec("distributed") is None:
        raise ConfigError(
            f"{option('executor')} {url} needs Dask's distributed: pip install 'kvpools[dask]' "
            "(or pip install -e '.[dask]' from a kvpools checkout)."
        )
    from distributed import Client

    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S)
    except OSError as error:
        raise ConfigError(
            f"{option('executor')} {url}: no Dask scheduler answered at {address} within {CONNECT_TIMEOUT_S} s "
            f"({error}). Start one (dask scheduler --port PORT, then dask worker {address}) or fix the address."
        ) from None
    try:
        yield client.get_executor()
    finally:
        client.close()
