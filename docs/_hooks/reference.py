"""MkDocs hook: the hook-specification and command-line references, generated from the definitions at build time.

A page asks for a reference with a directive line of its own, ``<!-- kvpools-reference: hooks -->`` or
``<!-- kvpools-reference: cli -->``; this hook replaces it with Markdown written from
``kvpools_core.hookspecs`` (every pluggy hook specification: signature, dispatch, answer contract, docstring)
or from the click group ``kvpools_core.cli.main`` (every command: usage, help, arguments, options with their
type, choices, default and help). Nothing is committed that could drift from the code.

The docstrings are Sphinx style, and pages generated from them (``docs/values.md``) carry their reST inline markup:
every page's roles (``:class:`Plan```) become code spans and its literal-block markers (``example::``) colons,
outside fenced code; ``griffe_rest.py`` does the same for the docstrings mkdocstrings renders.

Imports nothing from MkDocs, so ``tests/test_docs_site.py`` can import it without the docs extra installed.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

DIRECTIVE = re.compile(r"^<!-- kvpools-reference: (?P<name>[a-z]+) -->$", re.MULTILINE)

_ROLE = re.compile(r":(?P<role>class|func|mod|meth|attr|data|exc|obj):`~?(?P<target>[^`]+)`")
_LITERAL_MARKER = re.compile(r"(?<=\S)::$", re.MULTILINE)
_LONE_LITERAL_MARKER = re.compile(r"^[ \t]*::[ \t]*$\n?", re.MULTILINE)
_FENCED_BLOCK = re.compile(r"(^[ \t]*```.*?^[ \t]*```[ \t]*$)", re.MULTILINE | re.DOTALL)
_STATED_DEFAULT = re.compile(r"(?P<help>.*?)\s*\[default: (?P<default>[^\]]+)\]", re.DOTALL)
_FIELD = re.compile(r"^:(?:param (?P<name>\w+)|returns?):\s*(?P<text>.*)$")


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Replace each reference directive of a page with the generated reference."""

    def expand(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in GENERATORS:
            raise ValueError(f"{page.file.src_uri}: unknown reference {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    pieces = _FENCED_BLOCK.split(DIRECTIVE.sub(expand, markdown))
    return "".join(piece if index % 2 else rest_inline_to_markdown(piece) for index, piece in enumerate(pieces))


def rest_inline_to_markdown(text: str) -> str:
    """reST inline markup as Markdown: roles as code spans (``~`` dropped), literal-block markers as colons."""
    text = _ROLE.sub(lambda match: f"`{match['target']}`", text)
    return _LITERAL_MARKER.sub(":", _LONE_LITERAL_MARKER.sub("", text))


# --- hook specifications ---------------------------------------------------------------------------------------


def hook_specs() -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every hook specification of ``kvpools_core.hookspecs``, in source order (pluggy's marker finds them)."""
    from kvpools_core import hookspecs

    marker = f"{hookspecs.PROJECT}_spec"
    for name, value in vars(hookspecs).items():
        if callable(value) and hasattr(value, marker):
            yield name, value


def hooks_reference() -> str:
    from kvpools_core import hookspecs

    hook_names = {name for name, _ in hook_specs()}
    sections = []
    for name, spec in hook_specs():
        options = getattr(spec, f"{hookspecs.PROJECT}_spec")
        signature = inspect.signature(spec)
        params = [f"{p.name}: {p.annotation}" for p in signature.parameters.values()]
        description, fields = _split_fields(inspect.getdoc(spec) or "")
        dispatch = (
            "**first result**: implementations are called in [dispatch order](../dispatch.md) until one returns "
            "a non-`None` answer"
            if options["firstresult"]
            else "**collecting**: every implementation is called; the non-`None` answers are collected"
        )
        if options["historic"]:
            dispatch += "; historic (replayed to plugins registered later)"
        lines = [
            f"## `{name}` {{#{name}}}",
            "",
            "```python",
            f"def {name}({', '.join(params)}) -> {signature.return_annotation}",
            "```",
            "",
            f"- Dispatch: {dispatch}.",
            f"- Answer (checked, `hookspecs.RESULTS`): {_markdown(hookspecs.RESULTS[name].expected, hook_names)}.",
            f"- Who answers it, and how: [{name} in the hooks guide](../hooks.md#{_guide_anchor(name, signature)}).",
            "",
            _markdown(description, hook_names),
        ]
        parameters = [(field, text) for field, text in fields if field != "returns"]
        if parameters:
            lines += ["", "| Parameter | Type | Description |", "|---|---|---|"]
            for field, text in parameters:
                annotation = signature.parameters[field].annotation
                lines.append(f"| `{field}` | `{annotation}` | {_cell(_markdown(text, hook_names))} |")
        for field, text in fields:
            if field == "returns":
                lines += ["", f"**Returns** `{signature.return_annotation}`: {_markdown(text, hook_names)}"]
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


def _split_fields(doc: str) -> tuple[str, list[tuple[str, str]]]:
    """A Sphinx-style docstring's prose, and its ``:param NAME:`` / ``:returns:`` fields (continuations joined)."""
    prose: list[str] = []
    fields: list[tuple[str, str]] = []
    for line in doc.splitlines():
        match = _FIELD.match(line)
        if match:
            fields.append((match["name"] or "returns", match["text"]))
        elif fields and line.strip():
            fields[-1] = (fields[-1][0], f"{fields[-1][1]} {line.strip()}")
        elif not fields:
            prose.append(line)
    return "\n".join(prose).strip(), fields


def _markdown(text: str, hook_names: set[str]) -> str:
    """A hook docstring's reST as Markdown: a role naming a hook links to its section, ``code`` is `code`."""

    def hook_link(match: re.Match[str]) -> str:
        short = match["target"].rsplit(".", 1)[-1]
        return f"[`{short}`](#{short})" if match["role"] == "func" and short in hook_names else match[0]

    return re.sub(r"``(.+?)``", r"`\1`", rest_inline_to_markdown(_ROLE.sub(hook_link, text)))


def _guide_anchor(name: str, signature: inspect.Signature) -> str:
    """The anchor of the hook's section in docs/hooks.md (``## name(arg, ...)``), slugified as Python-Markdown's toc
    does (its ``slugify``, repeated so the generator runs without it; a wrong anchor fails the --strict build)."""
    heading = f"{name}({', '.join(signature.parameters)})"
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower())


# --- command line ----------------------------------------------------------------------------------------------


def cli_reference() -> str:
    import click

    from kvpools_core.cli import main

    root = click.Context(main, info_name="kvpools")
    sections = [_command_section(main, root)]
    for name in main.list_commands(root):
        command = main.get_command(root, name)
        assert command is not None
        sections.append(_command_section(command, click.Context(command, info_name=name, parent=root)))
    return "\n\n".join(sections) + "\n"


def _command_section(command: Any, ctx: Any) -> str:
    import click

    path = ctx.command_path
    lines = [f"## `{path}` {{#{path.replace(' ', '-')}}}", "", "```text", command.get_usage(ctx), "```"]
    if command.help:
        lines += ["", inspect.cleandoc(command.help).replace("\b\n", "")]
    arguments = [p for p in command.params if isinstance(p, click.Argument)]
    if arguments:
        lines += ["", "| Argument | Type | Required |", "|---|---|---|"]
        for argument in arguments:
            lines.append(f"| `{argument.human_readable_name}` | {_type(argument)} | {_yes(argument.required)} |")
    options = [p for p in command.params if isinstance(p, click.Option)]
    help_option = command.get_help_option(ctx)
    if help_option is not None:
        options.append(help_option)
    lines += ["", "| Option | Type | Default | Help |", "|---|---|---|---|"]
    for opt in options:
        names = ", ".join(f"`{name}`" for name in (*opt.opts, *opt.secondary_opts))
        if opt.required:
            names += " (required)"
        if opt.multiple:
            names += " (repeatable)"
        # The serving options default to None (unset: Serving's default applies) and state Serving's default in
        # their help; that is the default a user gets.
        stated = _STATED_DEFAULT.fullmatch(opt.help or "")
        help_text, default = (stated["help"], f"`{stated['default']}`") if stated else (opt.help or "", "")
        lines.append(f"| {names} | {_type(opt)} | {_default(opt, ctx) or default} | {_cell(help_text)} |")
    return "\n".join(lines)


def _type(param: Any) -> str:
    import click

    if isinstance(param, click.Option) and param.is_flag:
        return "flag"
    if isinstance(param.type, click.Choice):
        return "one of " + ", ".join(f"`{choice}`" for choice in param.type.choices)
    if getattr(param, "metavar", None):
        return f"`{param.metavar}`"
    return param.type.name


def _default(opt: Any, ctx: Any) -> str:
    """The value an absent option takes: a literal (click's sentinels and ``None`` mean none)."""
    default = opt.get_default(ctx, call=False)
    if default is False or default in ((), []) or not isinstance(default, (str, int, float, list, tuple)):
        return ""
    return f"`{default}`"


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


GENERATORS: dict[str, Callable[[], str]] = {"hooks": hooks_reference, "cli": cli_reference}
"""Directive name → the generator of its reference."""
