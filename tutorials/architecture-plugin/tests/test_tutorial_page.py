"""The tutorial page's command lines print what the page says they print.

``docs/tutorials/architecture-plugin.md`` shows code only through snippet
includes of this distribution's files, and the output of every ``$ kvpools ...``
line of its ``console`` blocks as pasted text: this test runs each of those
commands (from the repository root, as the page does) and compares.  A block
is the whole output, line for line, unless it holds a ``...`` line: then the
lines shown must appear in that order (an excerpt).  Runs of spaces compare as
one: a table's column widths follow whatever else is installed.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvpools_core.cli import main

REPOSITORY = Path(__file__).parents[3]
PAGE = REPOSITORY / "docs" / "tutorials" / "architecture-plugin.md"
ELIDED = "..."


def console_commands(text: str) -> list[tuple[str, list[str]]]:
    """Every ``$ kvpools ...`` line of the page's console blocks, with the output lines shown under it."""
    commands: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```console\n(.*?)^```", text, flags=re.S | re.M):
        current: list[str] | None = None
        for line in block.splitlines():
            if line.startswith("$ "):
                current = [] if line.startswith("$ kvpools ") else None
                if current is not None:
                    commands.append((line[2:], current))
            elif current is not None:
                current.append(_plain(line))
    return [(command, _trim(lines)) for command, lines in commands]


def _plain(line: str) -> str:
    return " ".join(line.split())


def _trim(lines: list[str]) -> list[str]:
    while lines and not lines[-1]:
        lines.pop()
    return lines


COMMANDS = console_commands(PAGE.read_text())


def test_the_page_shows_kvpools_commands() -> None:
    assert {shlex.split(command)[1] for command, _ in COMMANDS} >= {"plan", "build", "plugins"}


@pytest.mark.parametrize(("command", "shown"), COMMANDS, ids=[command for command, _ in COMMANDS])
def test_a_command_prints_what_the_page_shows(command: str, shown: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPOSITORY)  # the page's paths are relative to the repository root
    result = CliRunner().invoke(main, shlex.split(command)[1:])
    printed = _trim([_plain(line) for line in result.output.splitlines()])
    if ELIDED not in shown:
        assert printed == shown, f"{command} prints:\n" + "\n".join(printed)
        return
    remaining = iter(printed)
    missing = [line for line in shown if line != ELIDED and not any(line == seen for seen in remaining)]
    assert not missing, f"{command} does not print {missing} in this order; it prints:\n" + "\n".join(printed)
