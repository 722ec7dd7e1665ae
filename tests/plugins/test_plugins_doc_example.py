"""The parts-library example of ``docs/plugins.md`` runs: plans as the built-ins do, builds to the plan's bytes."""

from __future__ import annotations

import re
import types
from pathlib import Path

import attrs
import pytest

from kvpools_core import ModelSpec, Registry, Serving, build, plan
from kvpools_core.models import load_model

ROOT = Path(__file__).parents[2]
SECTION = "## Composing an architecture from the parts library"


def doc_plugin() -> types.ModuleType:
    text = (ROOT / "docs" / "plugins.md").read_text()
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "the section holds one python block"
    module = types.ModuleType("toy_parts")
    exec(compile(blocks[0], "docs/plugins.md", "exec"), module.__dict__)
    return module


def builtin_model(preset: str, architecture: str) -> ModelSpec:
    """A built-in preset's model, handed to the toy architecture."""
    spec, _ = load_model(preset, Registry(autoload=False, plugins=["mha", "mla"]))
    return attrs.evolve(spec, architecture=architecture)


@pytest.mark.parametrize(
    ("preset", "builtin", "architecture", "serving"),
    [
        ("llama-3.1-8b", "mha", "toy-gqa", Serving(platform="cpu", tp_size=2)),
        ("deepseek-v2-lite", "mla", "toy-mla", Serving(platform="cpu", page_size=16)),
    ],
)
def test_the_doc_example_plans_as_the_builtin_and_builds(
    preset: str, builtin: str, architecture: str, serving: Serving
) -> None:
    toy = Registry(autoload=False, plugins=["cpu"], extra_plugins={"toy_parts": doc_plugin()})
    made = plan(builtin_model(preset, architecture), serving, memory="1GiB", registry=toy)
    assert made.provenance["estimate_cell_size"] == ("toy_parts",)

    reference = plan(preset, serving, memory="1GiB", registry=Registry(autoload=False, plugins=[builtin, "cpu"]))
    assert made.cell == reference.cell
    assert made.sizing == reference.sizing

    pools = build(made, "meta", registry=toy)
    assert pools.provenance["build_pool"] == ("toy_parts",)
    assert pools.allocated_by_pool() == {pool.name: pool.bytes for pool in made.pools}


def test_the_doc_example_imports_only_the_public_core() -> None:
    from tests.plugins.test_boundaries import scan_source

    text = (ROOT / "docs" / "plugins.md").read_text().split(SECTION, 1)[1]
    block = re.findall(r"```python\n(.*?)```", text, re.S)[0]
    assert "kvpools_core.parts" in block
    assert scan_source(block, "docs/plugins.md", None) == []


def test_the_doc_example_declines_other_models() -> None:
    module = doc_plugin()
    other = builtin_model("llama-3.1-8b", "mha")
    assert module.estimate_cell_size(other, Serving()) is None
