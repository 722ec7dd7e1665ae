"""Griffe extension: the reST inline markup of the project's docstrings, as Markdown, for mkdocstrings.

The docstrings are Sphinx style (``:param x:`` fields, which mkdocstrings' ``sphinx`` parser reads); their roles
(``:class:`Plan```) and literal-block markers (``example::``) would otherwise show as typed. The conversion is the
one the MkDocs hook applies to the pages (``reference.py``, loaded by path: neither file is an importable module).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import griffe

_spec = importlib.util.spec_from_file_location("kvpools_docs_reference", Path(__file__).with_name("reference.py"))
assert _spec is not None and _spec.loader is not None
_reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_reference)


class RestInlineMarkup(griffe.Extension):
    """Rewrites every loaded object's docstring once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _reference.rest_inline_to_markdown(obj.docstring.value)
