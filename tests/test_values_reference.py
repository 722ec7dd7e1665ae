"""``docs/values.md``, the field-by-field reference of the values plugins build and read, is the code's.

The page is generated from the classes (fields, types, defaults, docstrings);
this test fails when they drift.  Regenerate it with
``KVPOOLS_WRITE_DOCS=1 pytest tests/test_values_reference.py``.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

import attrs

from kvpools_core import values

DOC = Path(__file__).parents[1] / "docs" / "values.md"
CLASSES = (
    "ModelSpec",
    "LayerSpec",
    "Serving",
    "PlatformTraits",
    "PageSizeRule",
    "KVDtypeRule",
    "MemoryTier",
    "Workspace",
    "EngineDefault",
    "GPU",
    "Budget",
    "CellSize",
    "CellPart",
    "DraftModel",
    "DraftCharge",
    "PoolSizing",
    "PoolSpec",
    "TokenWindow",
    "Arena",
    "ArenaSubPool",
    "GroupCost",
    "CostModel",
    "HostPool",
    "PackedInto",
    "HostMemory",
    "HostTier",
    "Plan",
)
HEADER = """# Values: the field reference

Every value that flows through the pipeline is a frozen `attrs` class in `kvpools_core.values`
(also exported from `kvpools_core`): plugins build `ModelSpec`/`LayerSpec` (`parse_model_config`),
`CellSize`/`CellPart` (`estimate_cell_size`), `PoolSizing`/`PoolSpec` (`size_pools`; pools that share one
allocation whose split moves at run time, SGLang's unified memory, as an `Arena` of `ArenaSubPool`s),
`PlatformTraits`/`PageSizeRule`/`MemoryTier` (`platform_traits`), `GPU` (`accelerators`) and `Workspace`
(`workspaces`); they read
`Serving`, `Budget` and `Plan`. Each converts to plain JSON (`to_dict`) and back (`from_dict`).
A field given a wrong value raises the project's error naming the field (`ConfigError` for a
user's serving option, `InvalidValueError` for a value a plugin built). Loading JSON checks every
field's type first and raises `PlanFormatError` naming its path (`plan.sizing.pools[2].slots`); see
[Plan JSON](architecture.md#plan-json).

This page is generated from the classes (`tests/test_values_reference.py` keeps it true).
"""


def _default(field: Any) -> str:
    default = field.default
    if default is attrs.NOTHING:
        return "required"
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return f"`{default.factory.__name__}()`"
    if values.is_unset(default):
        # an engine_defaults option, or one a GPU budget resolves (chunked_prefill_size: SGLang's GPU tier)
        by = "`engine_defaults`" if field.name in values.ENGINE_DEFAULT_OPTIONS else "a GPU budget's"
        return f"unset (reads `{default!r}`; {by})"
    return f"`{default!r}`"


def _doc(cls: type) -> str:
    text = inspect.getdoc(cls) or ""
    return text.strip()


def render() -> str:
    parts = [HEADER]
    for name in CLASSES:
        cls = getattr(values, name)
        parts.append(f"\n## {name}\n\n{_doc(cls)}\n\n| field | type | default |\n|---|---|---|")
        for field in attrs.fields(cls):
            kind = str(field.type).replace("|", "\\|")
            parts.append(f"| `{field.name}` | `{kind}` | {_default(field)} |")
        extras = [
            member for member, value in vars(cls).items() if isinstance(value, property) and not member.startswith("_")
        ]
        if extras:
            parts.append(f"\nDerived: {', '.join(f'`{member}`' for member in extras)}.")
    return "\n".join(parts) + "\n"


def test_the_reference_is_the_code() -> None:
    text = render()
    if os.environ.get("KVPOOLS_WRITE_DOCS"):
        DOC.write_text(text)
    assert DOC.read_text() == text, (
        "docs/values.md drifted from kvpools_core.values: regenerate it with "
        "KVPOOLS_WRITE_DOCS=1 pytest tests/test_values_reference.py"
    )


def test_every_public_value_is_in_the_reference() -> None:
    public = {
        name
        for name, obj in vars(values).items()
        if inspect.isclass(obj) and attrs.has(obj) and obj.__module__ == values.__name__ and not name.startswith("_")
    }
    assert public <= set(CLASSES), f"add {sorted(public - set(CLASSES))} to the reference"
