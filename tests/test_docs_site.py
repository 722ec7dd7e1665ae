"""The documentation site stays whole without MkDocs installed: every page in the nav, every included snippet there,
every generated reference generating.

``nox -s docs`` (``mkdocs build --strict``) catches the same rot, but only where the docs extra is installed; these
run in the ordinary suite, so a page left out of ``mkdocs.yml`` or a renamed snippet section fails the first test run.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import click
import pytest

from kvpools_core import Registry
from kvpools_core.cli import main as cli_main

ROOT = Path(__file__).parents[1]
DOCS = ROOT / "docs"
MKDOCS_YML = (ROOT / "mkdocs.yml").read_text()
GENERATOR_SCRIPT = ROOT / "docs" / "_hooks" / "reference.py"

# `--8<-- "path"` / `--8<-- "path:section"` (pymdownx.snippets; a leading `;` escapes the line), and the block form:
# a bare `--8<--` line, one path per line, a closing bare `--8<--`.
_SNIPPET_LINE = re.compile(r'^\s*--8<--\s+"(?P<spec>[^"]+)"\s*$', re.MULTILINE)
_SNIPPET_BLOCK = re.compile(r"^\s*--8<--\s*$\n(?P<specs>.*?)^\s*--8<--\s*$", re.MULTILINE | re.DOTALL)


def nav_pages(mkdocs_yml: str) -> list[str]:
    """The page paths of the ``nav:`` block (``- Title: page.md`` or ``- page.md`` entries, nested or not)."""
    lines = mkdocs_yml.splitlines()
    start = lines.index("nav:")
    pages = []
    for line in lines[start + 1 :]:
        if line and not line[0].isspace() and not line.startswith("#"):
            break  # the next top-level key
        entry = re.match(r"^\s*-\s+(?:[^:]+:\s+)?(?P<page>\S+\.md)\s*$", line)
        if entry:
            pages.append(entry["page"])
    return pages


def snippet_references(markdown: str) -> list[str]:
    specs = [match["spec"] for match in _SNIPPET_LINE.finditer(markdown)]
    for block in _SNIPPET_BLOCK.finditer(markdown):
        lines = (line.strip() for line in block["specs"].splitlines())
        specs += [line for line in lines if line and not line.startswith(";")]
    return specs


def snippet_problem(spec: str, base: Path) -> str | None:
    """What is wrong with one snippet reference, resolved as ``base_path: ["."]`` resolves it, or None."""
    path, _, section = spec.partition(":")
    target = base / path
    if not target.is_file():
        return f"{path} does not exist"
    if section and not re.fullmatch(r"[\d:-]+", section):  # a named section, not line numbers
        text = target.read_text()
        for edge in ("start", "end"):
            if f"--8<-- [{edge}:{section}]" not in text:
                return f"{path} has no '--8<-- [{edge}:{section}]' marker"
    return None


def _load_generator_script():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("kvpools_docs_reference", GENERATOR_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PAGES = sorted(str(path.relative_to(DOCS)) for path in DOCS.rglob("*.md"))


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page() -> None:
    nav = nav_pages(MKDOCS_YML)
    assert "index.md" in nav, "the nav reader found no pages"
    assert sorted(set(PAGES) - set(nav)) == [], "pages missing from the nav of mkdocs.yml"
    assert sorted(set(nav) - set(PAGES)) == [], "nav entries of mkdocs.yml with no page under docs/"
    assert len(nav) == len(set(nav)), "a page listed twice in the nav"


@pytest.mark.parametrize("page", PAGES)
def test_every_snippet_the_page_includes_exists(page: str) -> None:
    problems = [
        f"{spec!r}: {problem}"
        for spec in snippet_references((DOCS / page).read_text())
        if (problem := snippet_problem(spec, ROOT))
    ]
    assert problems == [], f"docs/{page} includes snippets that are not there"


def test_snippet_checker_finds_missing_files_and_sections(tmp_path: Path) -> None:
    source = tmp_path / "pkg" / "mod.py"
    source.parent.mkdir()
    source.write_text("# --8<-- [start:parse]\ndef parse(): ...\n# --8<-- [end:parse]\n# --8<-- [start:half]\n")
    page = (
        '```python\n--8<-- "pkg/mod.py:parse"\n```\n'
        ';--8<-- "escaped.py"\n'
        "--8<--\npkg/mod.py:half\npkg/gone.py\n--8<--\n"
    )
    specs = snippet_references(page)
    assert specs == ["pkg/mod.py:parse", "pkg/mod.py:half", "pkg/gone.py"]
    assert [snippet_problem(spec, tmp_path) for spec in specs] == [
        None,
        "pkg/mod.py has no '--8<-- [end:half]' marker",
        "pkg/gone.py does not exist",
    ]
    assert snippet_problem("pkg/mod.py:1:2", tmp_path) is None


def test_the_generated_references_cover_every_hook_and_command() -> None:
    script = _load_generator_script()
    hooks_block = re.search(r"^hooks:\n((?:\s+- .+\n)+)", MKDOCS_YML, re.MULTILINE)
    assert hooks_block is not None and "docs/_hooks/reference.py" in hooks_block[1], "mkdocs.yml does not run it"
    asked = {match["name"] for page in PAGES for match in script.DIRECTIVE.finditer((DOCS / page).read_text())}
    assert asked == set(script.GENERATORS), "every reference is on a page, and every page asks for a known one"

    hooks = script.hooks_reference()
    for hook in Registry(autoload=False).hook_names():
        assert f"## `{hook}` {{#{hook}}}" in hooks
    assert ":class:" not in hooks and ":func:" not in hooks, "reST roles left in the hook reference"

    cli = script.cli_reference()
    context = click.Context(cli_main, info_name="kvpools")
    for name in cli_main.list_commands(context):
        command = cli_main.get_command(context, name)
        assert command is not None
        assert f"## `kvpools {name}`" in cli
        for param in command.params:
            if isinstance(param, click.Option):
                assert f"`{param.opts[0]}`" in cli


def test_the_kit_api_page_renders_every_module_of_the_kit() -> None:
    page = (DOCS / "reference" / "testing.md").read_text()
    rendered = set(re.findall(r"^::: kvpools_core\.testing\.(\w+)$", page, re.MULTILINE))
    modules = {path.stem for path in (ROOT / "kvpools_core" / "testing").glob("*.py") if path.stem != "__init__"}
    assert modules - rendered == set(), "kit modules missing from docs/reference/testing.md"
    assert rendered - modules == set(), "docs/reference/testing.md renders a kit module that is gone"


@pytest.mark.parametrize("page", PAGES)
def test_no_rest_markup_reaches_the_site(page: str) -> None:
    """Docstrings are Sphinx style; a role kind the hook does not convert would show on the page as typed."""
    script = _load_generator_script()
    markdown = (DOCS / page).read_text()
    if script.DIRECTIVE.search(markdown):
        return  # generated pages are checked by test_the_generated_references_cover_every_hook_and_command
    rendered = script.on_page_markdown(markdown, page=None)
    prose = "".join(script._FENCED_BLOCK.split(rendered)[::2])
    assert re.findall(r":[a-z]+:`[^`]*`|\S::$", prose, re.MULTILINE) == []


def _fenced(markdown: str, after: str, language: str) -> str:
    """The first ``language`` fenced block after the text ``after``."""
    block = re.search(rf"```{language}\n(.*?)```", markdown[markdown.index(after) :], re.DOTALL)
    assert block is not None, f"no ```{language} block after {after!r}"
    return block[1]


def test_the_home_page_is_a_getting_started_path() -> None:
    """Issue 29: the home page was a list of file names. It says what kvpools is, how to install it, runs a first
    plan (the README's first command, with the output that command really prints today), and where each role goes
    next, linking pages that exist; the README and the home page show the same output."""
    from click.testing import CliRunner

    home = (DOCS / "index.md").read_text()
    headings = re.findall(r"^## (.+)$", home, re.MULTILINE)
    assert headings[:3] == ["Install", "Your first plan", "Where to go next"]
    assert "kvpools plans and builds the KV-cache memory pools" in home.split("## Install")[0]
    assert "pip install -c constraints.txt -e ." in _fenced(home, "## Install", "bash")

    readme = (ROOT / "README.md").read_text()
    command = "kvpools plan llama-3.1-70b --memory 60GiB --tp-size 4 --kv-cache-dtype fp8_e4m3"
    assert command in _fenced(readme, "## Set up and run", "bash")  # the README's command 1
    assert command in _fenced(home, "## Your first plan", "bash")
    result = CliRunner().invoke(cli_main, command.split()[1:])
    assert result.exit_code == 0, result.output
    printed = [line.rstrip() for line in result.output.strip().splitlines()]
    assert _fenced(home, "## Your first plan", "text").strip().splitlines() == printed
    assert _fenced(readme, "Output of the first command", "text").strip().splitlines() == printed

    roles = home.split("## Where to go next")[1].split("\n## ")[0]
    for role, pages in {
        "Capacity planner": ["capacity.md", "gpus.md", "sweep.md"],
        "Engine developer registering an architecture": ["tutorials/architecture-plugin.md", "plugins.md"],
        "Vendor writing a platform plugin": ["platform-plugins.md", "tutorials/platform-plugin.md"],
        "Plugin author using the conformance kit": ["testing.md", "reference/testing.md"],
    }.items():
        paragraph = roles.split(f"**{role}**")[1].split("\n\n")[0]
        for page in pages:
            assert f"]({page})" in paragraph, f"{role}: no link to {page}"
    for link in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", home):
        assert (DOCS / link).is_file(), f"the home page links {link}, which is not a page"


def test_the_home_page_and_readme_say_how_to_search_the_built_site() -> None:
    """Issue 29: search does not work on the site opened from disk (file://); both say how to serve it."""
    home = (DOCS / "index.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for text in (home, readme):
        assert "python3 -m http.server -d site" in text and "mkdocs serve" in text
    assert "file://" in home
    assert "- offline" not in MKDOCS_YML  # the offline plugin would load its iframe-worker shim from a CDN
