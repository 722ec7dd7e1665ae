"""``kvpools serve``: a capacity service for orchestrators and a calculator page, on loopback by default.

Importing this package imports no web framework: :func:`run` checks that the ``serve`` extra is installed
and says which ``pip install`` brings it when it is not.  ``docs/serve.md`` describes the endpoints.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from kvpools_core.errors import ConfigError

EXTRA_MODULES = ("fastapi", "uvicorn")
"""What the ``serve`` extra installs that the service imports."""
INSTALL_HINT = "pip install 'kvpools[serve]' (or pip install -e '.[serve]' from a kvpools checkout)"
LOOPBACK = "127.0.0.1"


def missing_extra() -> list[str]:
    """The modules of the ``serve`` extra that are not installed."""
    return [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]


def run(
    host: str = LOOPBACK,
    port: int = 8000,
    models_dir: str | None = None,
    *,
    max_body_bytes: int | None = None,
    max_grid_points: int | None = None,
    max_fit_gpus: int | None = None,
    time_limit_s: float | None = None,
    workers: int | None = None,
) -> None:
    """Serve the API and the page with uvicorn until interrupted (``kvpools serve``)."""
    missing = missing_extra()
    if missing:
        raise ConfigError(f"kvpools serve needs {', '.join(missing)}, from the serve extra: {INSTALL_HINT}.")
    import attrs
    import uvicorn

    from kvpools_core.serve.app import create_app
    from kvpools_core.serve.service import Limits

    given: dict[str, Any] = {
        "max_body_bytes": max_body_bytes,
        "max_grid_points": max_grid_points,
        "max_fit_gpus": max_fit_gpus,
        "time_limit_s": time_limit_s,
        "workers": workers,
    }
    limits = attrs.evolve(Limits(), **{k: v for k, v in given.items() if v is not None})
    app = create_app(models_dir=models_dir, limits=limits)
    uvicorn.run(app, host=host, port=port, log_level="info", server_header=False)


__all__ = ["INSTALL_HINT", "LOOPBACK", "missing_extra", "run"]
