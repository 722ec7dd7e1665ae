"""``kvpools plugins`` and ``kvpools presets``: what is installed, and the models it knows."""

from __future__ import annotations

import json

import attrs
import click

from kvpools_core.cli.common import (
    _console,
    _user_facing,
    main,
)
from kvpools_core.registry import get_registry


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
    from kvpools_core.models import registry_presets

    found = registry_presets(get_registry())
    if as_json:
        click.echo(
            json.dumps({name: {"plugin": p, "path": path} for name, (p, path) in sorted(found.items())}, indent=2)
        )
        return
    for name, (plugin, _path) in sorted(found.items()):
        click.echo(f"{name:32} {plugin}")
