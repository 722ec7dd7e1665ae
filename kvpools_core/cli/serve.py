"""``kvpools serve``: the capacity API and the calculator page (``kvpools_core.serve``; the ``kvpools[serve]``
extra)."""

from __future__ import annotations

from typing import Any

import click

from kvpools_core.cli.common import _user_facing, main


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=int, default=8000, show_default=True, help="Port to listen on.")
@click.option("--models-dir", default=None, help="Configs a request may name besides the presets (NAME/config.json).")
@click.option("--max-body-bytes", type=int, default=None, help="Largest request body  [default: 262144]")
@click.option("--max-grid-points", type=int, default=None, help="Largest sweep grid  [default: 512]")
@click.option("--max-fit-gpus", type=int, default=None, help="Largest fit --max-gpus  [default: 64]")
@click.option("--time-limit", type=float, default=None, help="Seconds one request may plan  [default: 20]")
@click.option("--workers", type=int, default=None, help="Requests planned at once  [default: 2]")
@_user_facing
def serve(host: str, port: int, models_dir: str | None, **limits: Any) -> None:
    """Serve the capacity API and the calculator page (docs/serve.md; needs pip install 'kvpools[serve]')."""
    from kvpools_core.serve import run

    run(host, port, models_dir, time_limit_s=limits.pop("time_limit"), **limits)
