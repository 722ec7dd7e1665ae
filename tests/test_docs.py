"""Docs and hook specifications stay in step: every hook documented, with its dispatch rule, and tested."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvpools_core import Registry, hookspecs

ROOT = Path(__file__).parents[1]
HOOKS_DOC = (ROOT / "docs" / "hooks.md").read_text()
TESTS_TEXT = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py") if p.name != "test_docs.py")
HOOKS = Registry(autoload=False).hook_names()


def test_the_three_card_hooks_keep_their_names() -> None:
    assert {"estimate_cell_size", "build_pool", "build_allocator"} <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented_with_its_signature(hook: str) -> None:
    spec = getattr(hookspecs, hook)
    params = ", ".join(p for p in spec.__code__.co_varnames[: spec.__code__.co_argcount])
    assert f"## {hook}({params})" in HOOKS_DOC


@pytest.mark.parametrize("hook", HOOKS)
def test_hookspec_docstring_states_its_dispatch(hook: str) -> None:
    spec = getattr(hookspecs, hook)
    firstresult = spec.kvpools_spec["firstresult"]
    doc = " ".join(spec.__doc__.split())
    section = HOOKS_DOC.split(f"## {hook}(")[1].split("\n## ")[0]
    if firstresult:
        assert "Stops at the first non-None result; return None to decline." in doc
        assert "Stops at the first non-None result" in " ".join(section.split())
    else:
        assert "Every implementation is called; the results are collected." in doc
        assert "Every implementation is called" in " ".join(section.split())


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_has_a_test(hook: str) -> None:
    assert re.search(rf"\b{hook}\b", TESTS_TEXT), f"no test mentions hook {hook}"
