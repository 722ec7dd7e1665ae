"""The core names no architecture: no ``kvpools_core`` module holds a ``model_type`` string (issue 30).

An AST scan of every ``kvpools_core/**/*.py`` (but ``testing/``, whose strategies draw configs) refuses a string
constant equal to a model type any shipped or tested ``config.json`` carries (``plugins/*/presets``,
``tests/**``, ``tutorials/**``, ``text_config`` included) or any built-in plugin claims for its weights
(``DECODERS`` of each ``plugins/<name>/weights.py``).  Only a whole string counts (a docstring that mentions a
model type is prose); f-string parts are constants too.  The weights estimate and the GPU memory defaults also
name no Hugging Face model class (``...ForCausalLM``): the plugins answer for theirs (``estimate_weights``,
``architecture_traits``).  The scan is tested on synthetic sources, so it cannot pass by seeing nothing.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[2]
CORE = ROOT / "kvpools_core"
EXCLUDED = ("testing",)
"""``kvpools_core.testing`` is the plugin authors' kit: its strategies draw configs of real families."""

ALLOWED = {
    ("kvpools_core/parts/vllm/specs.py", "deepseek_v4"): "vLLM 0.33's own MLAAttentionSpec.model_version value (the "
    "field's only non-None value in vLLM), compared for equality like vLLM does; the spec never dispatches on it.",
    ("kvpools_core/parts/latent.py", "kimi_linear"): "has_mla_latent (the MLA config reader the mla, dsa and swa "
    "plugins share) declines a Kimi-Linear config that lacks linear_attn_config, so the mla plugin never claims "
    "that hybrid; dropping it changes which plugin parses such a config (a parse-dispatch change, not the weights "
    "or the GPU defaults this scan was written for). To go: let the mamba plugin's claim decide.",
}
"""``(file, string)`` → why that file may hold that model type; every entry must still be needed."""

CLASS_FREE = ("kvpools_core/pipeline/gpus.py", "kvpools_core/pipeline/weights.py", "kvpools_core/parts/weights")
"""Where no Hugging Face model class may be named either (the MLA list and the weights table lived there)."""
MODEL_CLASS = re.compile(r"^[A-Z][A-Za-z0-9_]*For(CausalLM|ConditionalGeneration)[A-Za-z0-9_]*$")
BUILT_IN_WEIGHTS = ("mha", "mla", "dsa", "dsv4", "swa", "mamba", "minimax_sparse")


def _model_types_in(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "model_type" and isinstance(item, str) and item:
                yield item
            else:
                yield from _model_types_in(item)
    elif isinstance(value, list):
        for item in value:
            yield from _model_types_in(item)


def known_model_types() -> frozenset[str]:
    """Every model type a config of the repository carries, and every one a built-in plugin's weights claim."""
    found: set[str] = set()
    for folder in ("plugins", "tests", "tutorials"):
        for path in (ROOT / folder).rglob("*.json"):
            if ".venv" in path.parts or "egg-info" in str(path):
                continue
            try:
                found.update(_model_types_in(json.loads(path.read_text())))
            except (UnicodeDecodeError, json.JSONDecodeError):
                continue
    for plugin in BUILT_IN_WEIGHTS:
        found.update(importlib.import_module(f"kvpools_plugins.{plugin}.weights").DECODERS)
    return frozenset(found)


def scan_source(source: str, path: str, model_types: frozenset[str], classes: bool) -> list[str]:
    """The model types (and, with ``classes``, Hugging Face model classes) ``source`` names, as ``path:line``."""
    problems = []
    for node in ast.walk(ast.parse(source, filename=path)):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if node.value in model_types and (path, node.value) not in ALLOWED:
            problems.append(f"{path}:{node.lineno}: names the model_type {node.value!r}")
        elif classes and MODEL_CLASS.match(node.value):
            problems.append(f"{path}:{node.lineno}: names the model class {node.value!r}")
    return problems


def core_files() -> list[Path]:
    return [
        path
        for path in sorted(CORE.rglob("*.py"))
        if path.relative_to(CORE).parts[0] not in EXCLUDED and "__pycache__" not in path.parts
    ]


def test_the_core_names_no_model_type() -> None:
    model_types = known_model_types()
    problems = []
    for path in core_files():
        relative = str(path.relative_to(ROOT))
        classes = any(relative == place or relative.startswith(f"{place}/") for place in CLASS_FREE)
        problems += scan_source(path.read_text(), relative, model_types, classes)
    assert not problems, "the core names architectures (answer them in the plugin):\n" + "\n".join(problems)


def test_every_allowed_entry_is_still_needed() -> None:
    model_types = known_model_types()
    for (relative, value), why in ALLOWED.items():
        assert value in model_types and why
        source = (ROOT / relative).read_text()
        seen = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant) and node.value == value]
        assert seen, f"{relative} no longer names {value!r}: drop it from ALLOWED"


def test_the_scan_sees_the_model_types_and_the_core() -> None:
    """Not vacuous: the configs' model types are read (text_config too), and the core's modules are scanned."""
    model_types = known_model_types()
    assert {"llama", "deepseek_v3", "qwen3_next", "gemma3_text", "cla", "minimax_m3_vl"} <= model_types
    files = {str(path.relative_to(ROOT)) for path in core_files()}
    assert {
        "kvpools_core/pipeline/gpus.py",
        "kvpools_core/pipeline/weights.py",
        "kvpools_core/pipeline/__init__.py",
    } <= files
    assert "kvpools_core/parts/weights/estimate.py" in files
    assert not any(name.startswith("kvpools_core/testing/") for name in files)


def test_the_scan_finds_a_model_type_a_class_and_an_f_string() -> None:
    source = (
        'TABLE = {"deepseek_v3": 1}\n'
        'MLA = frozenset({"DeepseekV3ForCausalLM"})\n'
        'def f(x):\n    """Mentions llama in prose."""\n    return f"{x}" + "llama"\n'
    )
    problems = scan_source(source, "kvpools_core/x.py", frozenset({"deepseek_v3", "llama"}), classes=True)
    assert problems == [
        "kvpools_core/x.py:1: names the model_type 'deepseek_v3'",
        "kvpools_core/x.py:2: names the model class 'DeepseekV3ForCausalLM'",
        "kvpools_core/x.py:5: names the model_type 'llama'",
    ]
    assert scan_source(source, "kvpools_core/x.py", frozenset(), classes=False) == []
